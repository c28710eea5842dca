//! Per-stream counters, read through a [`GateHandle`](crate::GateHandle).

use std::time::Duration;

use super::end::EndReason;

/// A snapshot of one gated stream's counters.
///
/// "Wasted tokens" in the sense of the release measures are
/// [`chunks_after_end`](GateStats::chunks_after_end): chunks the generator produced after the
/// stream had ended (the consumer gone, or ended by the slow-consumer policy).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GateStats {
    /// Chunks the generator sent that became events of their own.
    pub chunks_sent: u64,
    /// Chunks the generator sent that were merged into a waiting event (`Coalesce`).
    pub chunks_merged: u64,
    /// Bytes of every accepted chunk, merged or not.
    pub bytes_sent: u64,
    /// Events the consumer has taken.
    pub events_delivered: u64,
    /// Bytes of the events the consumer has taken.
    pub bytes_delivered: u64,
    /// Chunks offered after the stream had ended: generator work nobody could read.
    pub chunks_after_end: u64,
    /// Events that were waiting in the buffer when the consumer went away.
    pub events_undelivered: u64,
    /// Events waiting in the buffer now.
    pub buffered_events: usize,
    /// Bytes waiting in the buffer now.
    pub buffered_bytes: usize,
    /// The most events ever waiting at once.
    pub peak_buffered_events: usize,
    /// The most bytes ever waiting at once.
    pub peak_buffered_bytes: usize,
    /// Why the stream ended, once it has.
    pub end_reason: Option<EndReason>,
    /// Whether the release hook has run.
    pub released: bool,
    /// Time from the end (for a cancelled stream: the cancel) until the release hook had run.
    pub end_to_release: Option<Duration>,
}
