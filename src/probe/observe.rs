//! What a probe learns from an item: an event's seq, size, kind and wait, or a stream's end.

use std::time::Instant;

use crate::chunk::Kind;
use crate::end::EndReason;

/// One event as a probe sees it. No payload: only its number, size, kind and how long it
/// waited in a gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub(crate) seq: Option<u64>,
    pub(crate) bytes: u64,
    pub(crate) kind: Kind,
    pub(crate) enqueued_at: Option<Instant>,
    pub(crate) waiting: u64,
}

impl Observation {
    /// An event of `bytes` bytes and `kind`; `seq` is its number in the stream, or `None` to
    /// let the recorder number events itself (0, 1, 2, … in the order it sees them). A control
    /// event without a seq (a heartbeat) is counted but not numbered, and writes no hop record.
    pub fn new(seq: Option<u64>, bytes: u64, kind: Kind) -> Self {
        Observation {
            seq,
            bytes,
            kind,
            enqueued_at: None,
            waiting: 0,
        }
    }

    /// When the event entered a gate's buffer, to measure how long it waited there.
    pub fn enqueued_at(mut self, at: Instant) -> Self {
        self.enqueued_at = Some(at);
        self
    }

    /// How many events were still waiting in the gate when this one left it.
    pub fn waiting(mut self, waiting: u64) -> Self {
        self.waiting = waiting;
        self
    }
}

/// What an item of an observed stream means to a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// An event.
    Event(Observation),
    /// The stream's last event (a terminal error frame), and why the stream ended.
    Last(Observation, EndReason),
    /// The stream ended early, for this reason.
    End(EndReason),
    /// Nothing to record (an error the stream continues after).
    Nothing,
}

/// Items a probe can observe: implemented for the gate's events, SSE frames and decoded SSE
/// events, and for your own item types.
pub trait Observed {
    /// What this item means to a probe.
    fn observed(&self) -> Seen;
}
