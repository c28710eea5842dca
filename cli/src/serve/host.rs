//! What a worker's generations get from the server that hosts them: their gates (bounds,
//! policy, the server's group), their hops at the worker, and their counts in `/stats`.

use std::sync::Arc;

use streamgate::probe::HopProbe;
use streamgate::{EndReason, GateHandle, GateStats, Group};

use super::hops::Hops;
use super::meta::Meta;
use super::stats::Stats;
use crate::flags::{GateFlags, ResumeFlags};

/// The server's side of its worker's generations (see [`Worker`](super::Worker)).
#[derive(Debug)]
pub struct Host {
    gate: GateFlags,
    resume: ResumeFlags,
    pub(super) stats: Stats,
    decode: HopProbe,
    publish: HopProbe,
    /// Every stream: shut down together on SIGINT/SIGTERM.
    pub(super) streams: Group,
}

impl Host {
    /// A host whose gates are as `gate` and `resume` configure them, whose hops are `decode`
    /// and `publish`.
    pub(super) fn new(
        gate: GateFlags,
        resume: ResumeFlags,
        decode: HopProbe,
        publish: HopProbe,
    ) -> Self {
        Host {
            gate,
            resume,
            stats: Stats::default(),
            decode,
            publish,
            streams: Group::new(),
        }
    }

    /// The gate of a generation that starts now, as the flags configure it (bounds, policy,
    /// stamps), in the server's group, from event `first_id`: the stream counts as started,
    /// and its release counts its end in `/stats` after `on_release` (the worker's own hook:
    /// its KV memory freed, say) has run. The worker spawns the gate (or makes it a channel);
    /// a generation it refuses gets no gate.
    pub fn gate<F>(self: &Arc<Self>, first_id: u64, on_release: F) -> streamgate::Gate
    where
        F: FnOnce(EndReason, &GateStats) + Send + 'static,
    {
        self.stats.streams.start();
        let host = self.clone();
        self.gate
            .gate(&self.resume)
            .first_id(first_id)
            .group(&self.streams)
            .on_release(move |reason, gate| {
                on_release(reason, &gate);
                host.stats.released(reason, &gate);
            })
    }

    /// A worker made `tokens` tokens.
    pub fn generated(&self, tokens: u64) {
        self.stats.generated(tokens);
    }

    /// The recorders of `meta`'s generation at `worker.decode` and `worker.publish`,
    /// following `gate` (its sender's handle).
    pub fn hops(&self, meta: &Meta, gate: GateHandle) -> Hops {
        Hops::new(&self.decode, &self.publish, meta, gate)
    }
}
