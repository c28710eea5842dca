//! A server's counters, as `GET /stats` reports them (its worker adds its own).

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};
use streamgate::{EndReason, GateStats};

use crate::serving;

/// The process's counters (the worker counts its own KV memory, the store its streams).
#[derive(Debug, Default)]
pub(super) struct Stats {
    pub(super) streams: serving::StreamCounts,
    tokens_generated: AtomicU64,
    tokens_after_cancel: AtomicU64,
    /// The longest a stream took from its end (a disconnect, a stop) to its release, in µs:
    /// the gate's own measure (`GateStats::end_to_release`), inside the server.
    end_to_release_max_us: AtomicU64,
}

impl Stats {
    /// `tokens` tokens were generated.
    pub(super) fn generated(&self, tokens: u64) {
        self.tokens_generated.fetch_add(tokens, Ordering::Relaxed);
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

    /// The counters as `/stats` fields (the worker's and the store's are the caller's to
    /// add).
    pub(super) fn fields(&self) -> Map<String, Value> {
        let load = |n: &AtomicU64| n.load(Ordering::SeqCst);
        let mut fields = self.streams.fields("generators_running");
        let more: [(&str, u64); 3] = [
            ("tokens_generated", load(&self.tokens_generated)),
            ("tokens_after_cancel", load(&self.tokens_after_cancel)),
            ("end_to_release_max_us", load(&self.end_to_release_max_us)),
        ];
        fields.extend(more.map(|(name, n)| (name.to_owned(), n.into())));
        fields
    }
}
