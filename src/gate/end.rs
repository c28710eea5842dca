//! Why a stream ended, and the error a consumer sees when it did not complete.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// A boxed error, as a generator may return it.
pub type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// Why a gated stream ended.
///
/// Exactly one end reason is recorded per stream: the first thing that ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EndReason {
    /// The generator finished and the consumer took every event it sent.
    Completed,
    /// The consumer went away (dropped: the client disconnected) before it had taken every
    /// event; [`GateStats::events_undelivered`](crate::GateStats::events_undelivered) says how
    /// many it missed.
    ConsumerGone,
    /// The stream was stopped on purpose through its [`GateHandle`](crate::GateHandle) (a user
    /// pressing Stop).
    Cancelled,
    /// The slow-consumer policy ended the stream: the consumer did not drain it in time.
    SlowConsumer,
    /// The generator returned an error.
    GeneratorError,
    /// The generator panicked; the panic was caught and did not reach the consumer.
    GeneratorPanic,
    /// The process is shutting down: its [`Group`](crate::Group) was shut down, or the runtime
    /// shut down (dropping the gate's task) before the generator finished.
    Shutdown,
}

impl EndReason {
    /// A short snake-case name for labels and wire frames: `completed`, `consumer_gone`,
    /// `cancelled`, `slow_consumer`, `generator_error`, `generator_panic`, `shutdown`.
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Completed => "completed",
            EndReason::ConsumerGone => "consumer_gone",
            EndReason::Cancelled => "cancelled",
            EndReason::SlowConsumer => "slow_consumer",
            EndReason::GeneratorError => "generator_error",
            EndReason::GeneratorPanic => "generator_panic",
            EndReason::Shutdown => "shutdown",
        }
    }
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The last item of a stream that did not complete: why it ended, and the generator's error or
/// panic message where there was one.
///
/// Every event delivered before it is intact; a consumer that sees `GateError` knows the output
/// it has is a prefix, not the whole.
#[derive(Clone)]
pub struct GateError {
    reason: EndReason,
    source: Option<Arc<dyn Error + Send + Sync + 'static>>,
}

impl GateError {
    pub(crate) fn new(reason: EndReason, source: Option<BoxError>) -> Self {
        GateError {
            reason,
            source: source.map(Arc::from),
        }
    }

    /// Why the stream ended. Never [`EndReason::Completed`].
    pub fn reason(&self) -> EndReason {
        self.reason
    }
}

impl fmt::Debug for GateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateError")
            .field("reason", &self.reason)
            .field("source", &self.source.as_ref().map(|e| e.to_string()))
            .finish()
    }
}

impl fmt::Display for GateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The generator's error or panic message is the `source()`, not part of this text, so
        // error reporters that walk the chain print it once.
        f.write_str(match self.reason {
            EndReason::Completed => "stream completed",
            EndReason::ConsumerGone => "stream ended: consumer gone",
            EndReason::Cancelled => "stream cancelled",
            EndReason::SlowConsumer => "stream ended: consumer too slow",
            EndReason::GeneratorError => "stream ended: generator failed",
            EndReason::GeneratorPanic => "stream ended: generator panicked",
            EndReason::Shutdown => "stream ended: shutting down",
        })
    }
}

impl Error for GateError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}
