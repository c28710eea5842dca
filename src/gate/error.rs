//! The error a consumer sees when its stream did not complete.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use crate::end::EndReason;

/// A boxed error, as a generator may return it.
pub type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// The last item of a stream that did not complete: why it ended, and the generator's error or
/// panic message where there was one.
///
/// Every event delivered before it is intact; a consumer that sees `GateError` knows the output
/// it has is a prefix, not the whole.
///
/// # Examples
///
/// ```
/// use futures_util::StreamExt;
/// use streamgate::{EndReason, Gate};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (mut tx, mut consumer) = Gate::new().channel::<String>();
/// tx.try_send("partial".to_owned()).unwrap();
/// tx.abort(std::io::Error::other("out of KV blocks"));
/// let mut output = String::new();
/// while let Some(item) = consumer.next().await {
///     match item {
///         Ok(event) => output.push_str(event.chunk()),
///         Err(error) => {
///             // The output is a prefix: say why it stopped.
///             assert_eq!(error.reason(), EndReason::GeneratorError);
///             assert_eq!(error.to_string(), "stream ended: generator failed");
///             let source = std::error::Error::source(&error).unwrap();
///             assert_eq!(source.to_string(), "out of KV blocks");
///         }
///     }
/// }
/// assert_eq!(output, "partial");
/// # }
/// ```
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
            EndReason::UpstreamError => "stream ended: upstream failed",
            EndReason::ResumeStoreError => "stream ended: the resume store failed",
        })
    }
}

impl Error for GateError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

/// The error of [`GateHandle::cancel_with`](crate::GateHandle::cancel_with): it was given
/// [`EndReason::Completed`], which is not a reason to end a stream early. The stream was left
/// as it was.
///
/// # Examples
///
/// ```
/// use streamgate::{EndReason, Gate};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (_tx, consumer) = Gate::new().channel::<String>();
/// let handle = consumer.handle();
/// let refused = handle.cancel_with(EndReason::Completed).unwrap_err();
/// assert_eq!(refused.to_string(), "`completed` is not a reason to end a stream early");
/// assert_eq!(handle.end_reason(), None, "the stream goes on");
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelError(());

impl CancelError {
    pub(crate) fn completed() -> Self {
        CancelError(())
    }
}

impl fmt::Display for CancelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("`completed` is not a reason to end a stream early")
    }
}

impl Error for CancelError {}
