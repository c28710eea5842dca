//! Per-stream counters, read through a [`GateHandle`](crate::GateHandle) and given to the
//! release hook.

use std::time::Duration;

use crate::end::EndReason;

/// A snapshot of one gated stream's counters.
///
/// "Wasted tokens" in the sense of the release measures are
/// [`chunks_after_end`](GateStats::chunks_after_end): chunks the generator produced that nobody
/// could read because the stream had ended. The release hook receives the final snapshot.
///
/// # Examples
///
/// ```
/// use streamgate::{EndReason, Gate};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (mut tx, consumer) = Gate::new().channel::<String>();
/// let handle = consumer.handle();
/// tx.try_send("Hel".to_owned()).unwrap();
/// drop(consumer); // the client left with an event unread
/// assert!(tx.try_send("lo".to_owned()).is_err());
/// let stats = handle.stats();
/// assert_eq!(stats.end_reason, Some(EndReason::ConsumerGone));
/// assert_eq!((stats.chunks_sent, stats.events_delivered), (1, 0));
/// assert_eq!((stats.events_undelivered, stats.chunks_after_end), (1, 1));
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GateStats {
    /// Chunks the generator sent that became events of their own.
    pub chunks_sent: u64,
    /// Chunks the generator sent that were merged into a waiting event (`Coalesce`).
    pub chunks_merged: u64,
    /// Bytes of every accepted chunk, merged or not.
    pub bytes_sent: u64,
    /// The id the next accepted chunk gets: the first id plus every chunk accepted so far.
    pub next_id: u64,
    /// Events the consumer has taken.
    pub events_delivered: u64,
    /// Bytes of the events the consumer has taken.
    pub bytes_delivered: u64,
    /// Chunks offered after the stream had ended (including a send that was waiting for room
    /// and polled again after the end): generator work nobody could read.
    pub chunks_after_end: u64,
    /// Events not taken by the consumer as the stream was meant to deliver them: dropped with a
    /// consumer that went away, plus, after an early end, those still waiting at the time of
    /// the snapshot (a consumer that is still there may yet read them, before the error).
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
    /// Time from an early end until the generator's work had stopped (it returned, or was
    /// dropped when the stop grace ran out); zero when it had already stopped.
    pub end_to_stop: Option<Duration>,
    /// Whether the stop grace ran out, so the generator was dropped in the middle of its work
    /// (or an engine still held the sender).
    pub stop_forced: bool,
    /// Whether the release hook has run (the generator is gone and its resources freed).
    pub released: bool,
    /// Whether an async release hook was cut off by its time limit.
    pub release_timed_out: bool,
    /// Time from the end until the release hook had run (in the hook's own snapshot: until it
    /// was called).
    pub end_to_release: Option<Duration>,
}
