//! How a stream ends: the producer's finish, the first end (set once), and the consumer having
//! been given it.

use tokio::time::Instant as Clock;

use crate::end::EndReason;
use crate::gate::error::{BoxError, GateError};

/// The end of one stream, as the buffer's lock guards it.
pub(crate) struct EndState {
    /// The producer has finished: once the consumer has taken everything, the stream completed.
    finished: bool,
    /// The first end, set once, and the error the consumer is given for it.
    end: Option<(EndReason, Option<GateError>)>,
    /// When the end was set (on tokio's clock).
    ended_at: Option<Clock>,
    /// The consumer has been given the end (or was dropped): the stream yields nothing more.
    seen: bool,
    /// The producer's work has stopped: the engine dropped its sender.
    producer_stopped: bool,
    /// A spawned generator returned `Ok` ...
    generator_returned: bool,
    /// ... and its sender is still alive (moved to another task): not finished until it goes.
    task_sender_alive: bool,
}

impl EndState {
    /// A stream that runs.
    pub(crate) fn new() -> Self {
        EndState {
            finished: false,
            end: None,
            ended_at: None,
            seen: false,
            producer_stopped: false,
            generator_returned: false,
            task_sender_alive: true,
        }
    }

    /// Whether a chunk sent now is refused: the stream has ended, or its producer finished.
    pub(crate) fn is_closed(&self) -> bool {
        self.end.is_some() || self.finished
    }

    /// Whether the producer has finished (the stream may not have ended yet).
    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    /// The reason that stands, once the stream has ended.
    pub(crate) fn reason(&self) -> Option<EndReason> {
        self.end.as_ref().map(|(reason, _)| *reason)
    }

    /// The end that stands and the consumer's error for it (none for a completion).
    pub(crate) fn standing(&self) -> Option<(EndReason, Option<&GateError>)> {
        self.end
            .as_ref()
            .map(|(reason, error)| (*reason, error.as_ref()))
    }

    /// When the stream ended, if it has.
    pub(crate) fn ended_at(&self) -> Option<Clock> {
        self.ended_at
    }

    /// Ends the stream for `reason` now unless it has ended; returns the reason that stands and
    /// whether it is this one.
    pub(crate) fn set(&mut self, reason: EndReason, source: Option<BoxError>) -> (EndReason, bool) {
        if let Some((first, _)) = &self.end {
            return (*first, false);
        }
        let error = (reason != EndReason::Completed).then(|| GateError::new(reason, source));
        self.end = Some((reason, error));
        self.ended_at = Some(Clock::now());
        (reason, true)
    }

    /// Marks the producer finished unless the stream is closed; returns whether it did.
    pub(crate) fn finish(&mut self) -> bool {
        if self.is_closed() {
            return false;
        }
        self.finished = true;
        true
    }

    /// A spawned generator returned `Ok`; returns whether its sender is gone too, so the
    /// stream finishes.
    pub(crate) fn generator_returned(&mut self) -> bool {
        self.generator_returned = true;
        !self.task_sender_alive
    }

    /// A spawned generator's sender was dropped; returns whether the generator has returned
    /// too, so the stream finishes.
    pub(crate) fn task_sender_dropped(&mut self) -> bool {
        self.task_sender_alive = false;
        self.generator_returned
    }

    /// Whether the consumer has been given the end (or is gone).
    pub(crate) fn is_seen(&self) -> bool {
        self.seen
    }

    /// The consumer has been given the end (or is gone).
    pub(crate) fn mark_seen(&mut self) {
        self.seen = true;
    }

    /// Whether the producer's work has stopped (a channel gate's engine let go of the sender).
    pub(crate) fn is_producer_stopped(&self) -> bool {
        self.producer_stopped
    }

    /// The producer's work has stopped.
    pub(crate) fn mark_producer_stopped(&mut self) {
        self.producer_stopped = true;
    }
}
