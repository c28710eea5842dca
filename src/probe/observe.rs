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
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::probe::{HopProbe, Observation};
    /// use streamgate::{EndReason, Kind};
    ///
    /// let hop = HopProbe::new("worker.publish");
    /// let mut recorder = hop.recorder("req-1");
    /// recorder.observe(Observation::new(Some(0), 5, Kind::Visible)); // event 0
    /// recorder.observe(Observation::new(None, 2, Kind::Control)); // a heartbeat: no number
    /// recorder.observe(Observation::new(None, 5, Kind::Visible)); // numbered 1
    /// recorder.end(EndReason::Completed);
    /// let counters = hop.snapshot().counters;
    /// assert_eq!((counters.visible_events(), counters.control_events()), (2, 1));
    /// assert_eq!((counters.visible_bytes(), counters.control_bytes()), (10, 2));
    /// ```
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
    ///
    /// # Examples
    ///
    /// An event that waited 5 ms in a buffer, behind which 3 more were waiting:
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use streamgate::probe::{HopProbe, Observation};
    /// use streamgate::{EndReason, Kind};
    ///
    /// let hop = HopProbe::new("gateway.write");
    /// let mut recorder = hop.recorder("req-1");
    /// let queued = Instant::now();
    /// let event = Observation::new(Some(0), 4, Kind::Visible)
    ///     .enqueued_at(queued)
    ///     .waiting(3);
    /// recorder.observe_at(event, queued + Duration::from_millis(5));
    /// recorder.end(EndReason::Completed);
    ///
    /// let counters = hop.snapshot().counters;
    /// assert_eq!(counters.max_buffer_age(), Duration::from_millis(5));
    /// assert_eq!(counters.buffer_age().count(), 1);
    /// assert_eq!(counters.peak_waiting(), 3);
    /// ```
    pub fn enqueued_at(mut self, at: Instant) -> Self {
        self.enqueued_at = Some(at);
        self
    }

    /// How many events were still waiting in the gate when this one left it.
    ///
    /// See [`enqueued_at`](Observation::enqueued_at) for an example.
    pub fn waiting(mut self, waiting: u64) -> Self {
        self.waiting = waiting;
        self
    }
}

/// What an item of an observed stream means to a probe.
///
/// # Examples
///
/// What the crate's SSE frames mean:
///
/// ```
/// use bytes::Bytes;
/// use streamgate::probe::{Observation, Observed, Seen};
/// use streamgate::sse::SseFrame;
/// use streamgate::{EndReason, Kind};
///
/// // A heartbeat (`:` and a newline) is a control event without a number.
/// let beat = SseFrame::heartbeat();
/// assert_eq!(beat.observed(), Seen::Event(Observation::new(None, 2, Kind::Control)));
///
/// // A terminal error frame is the stream's last event, and says why it ended.
/// let error = Bytes::from_static(b"event: error\ndata: {}\n\n");
/// let last = SseFrame::new(error, Kind::Control, None).ending(EndReason::SlowConsumer);
/// assert!(matches!(last.observed(), Seen::Last(_, EndReason::SlowConsumer)));
/// ```
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
///
/// # Examples
///
/// An engine's own output type, probed as it leaves the decode loop:
///
/// ```
/// use futures_util::StreamExt;
/// use streamgate::probe::{HopProbe, Observation, Observed, Seen};
/// use streamgate::{EndReason, GateExt, Kind};
///
/// enum Output {
///     Reasoning(String),
///     Text(String),
///     // The request was aborted (out of KV memory, say).
///     Aborted,
/// }
///
/// impl Observed for Output {
///     fn observed(&self) -> Seen {
///         match self {
///             // No seq: the recorder numbers them in order.
///             Output::Reasoning(text) => {
///                 Seen::Event(Observation::new(None, text.len() as u64, Kind::Hidden))
///             }
///             Output::Text(text) => {
///                 Seen::Event(Observation::new(None, text.len() as u64, Kind::Visible))
///             }
///             Output::Aborted => Seen::End(EndReason::GeneratorError),
///         }
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let hop = HopProbe::new("worker.decode");
/// let outputs = futures_util::stream::iter([
///     Output::Reasoning("hmm".into()),
///     Output::Text("Hel".into()),
///     Output::Aborted,
/// ]);
/// let seen: Vec<Output> = outputs.probe(&hop, "req-1").collect().await;
/// assert_eq!(seen.len(), 3); // items pass unchanged
///
/// let snapshot = hop.snapshot();
/// assert_eq!(snapshot.counters.hidden_events(), 1);
/// assert_eq!(snapshot.counters.visible_events(), 1);
/// assert_eq!(snapshot.streams_ended.occurred(), [(EndReason::GeneratorError, 1)]);
/// # }
/// ```
pub trait Observed {
    /// What this item means to a probe.
    fn observed(&self) -> Seen;
}
