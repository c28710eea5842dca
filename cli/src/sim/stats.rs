//! The reference server's counters, as `GET /stats` reports them.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};
use streamgate::{EndReason, GateStats};

use crate::serving;

/// The process's counters (the KV pool counts its own blocks, the store its streams).
#[derive(Debug, Default)]
pub(super) struct Stats {
    pub(super) streams: serving::StreamCounts,
    tokens_generated: AtomicU64,
    tokens_after_cancel: AtomicU64,
    /// The longest a stream took from its end (a disconnect, a stop) to its release, in µs:
    /// the gate's own measure (`GateStats::end_to_release`), inside the server.
    end_to_release_max_us: AtomicU64,
    /// Streams stopped mid-generation because the KV pool ran out (also `streams_failed`).
    kv_exhausted: AtomicU64,
    /// Requests refused with 503 because every KV block was held by other streams.
    refused_kv_full: AtomicU64,
}

impl Stats {
    /// A token was generated.
    pub(super) fn generated(&self) {
        self.tokens_generated.fetch_add(1, Ordering::Relaxed);
    }

    /// A generation stopped because the KV pool ran out.
    pub(super) fn kv_exhausted(&self) {
        self.kv_exhausted.fetch_add(1, Ordering::Relaxed);
    }

    /// A request was refused: every KV block was held.
    pub(super) fn refused_kv_full(&self) {
        self.refused_kv_full.fetch_add(1, Ordering::Relaxed);
    }

    /// A stream was released (its gate's release hook): its end `reason` and what the gate
    /// measured.
    pub(super) fn released(&self, reason: EndReason, gate: &GateStats) {
        self.tokens_after_cancel
            .fetch_add(gate.chunks_after_end, Ordering::Relaxed);
        if let Some(took) = gate.end_to_release {
            let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
            self.end_to_release_max_us
                .fetch_max(micros, Ordering::Relaxed);
        }
        self.streams.end(reason);
    }

    /// The counters as `/stats` fields, with the KV pool's `kv_blocks_in_use` (the store's
    /// are the caller's to add).
    pub(super) fn fields(&self, kv_blocks_in_use: u64) -> Map<String, Value> {
        let load = |n: &AtomicU64| n.load(Ordering::SeqCst);
        let mut fields = self.streams.fields("generators_running");
        let more: [(&str, u64); 6] = [
            ("streams_kv_exhausted", load(&self.kv_exhausted)),
            ("requests_refused_kv_full", load(&self.refused_kv_full)),
            ("kv_blocks_in_use", kv_blocks_in_use),
            ("tokens_generated", load(&self.tokens_generated)),
            ("tokens_after_cancel", load(&self.tokens_after_cancel)),
            ("end_to_release_max_us", load(&self.end_to_release_max_us)),
        ];
        fields.extend(more.map(|(name, n)| (name.to_owned(), n.into())));
        fields
    }
}
