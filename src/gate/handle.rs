//! A handle to one stream's end reason and counters, independent of the chunk type.

use std::fmt;
use std::future::poll_fn;
use std::task::{Context, Poll};

use super::buffer::Buffer;
use super::error::CancelError;
use super::stats::GateStats;
use crate::chunk::Chunk;
use crate::end::EndReason;
use crate::sync::Arc;

/// The parts of a stream's shared state a handle reads, erased of the chunk type.
trait Status: Send + Sync {
    fn stats(&self) -> GateStats;
    fn end_reason(&self) -> Option<EndReason>;
    fn end(&self, reason: EndReason) -> EndReason;
    fn poll_released(&self, cx: &mut Context<'_>) -> Poll<()>;
}

// Implemented on the (possibly loom) `Arc` rather than on `Buffer`, because loom's `Arc` cannot
// be coerced to a trait object: the handle boxes it in a std `Arc` instead.
impl<T: Chunk + Send> Status for Arc<Buffer<T>> {
    fn stats(&self) -> GateStats {
        Buffer::stats(self)
    }

    fn end_reason(&self) -> Option<EndReason> {
        Buffer::end_reason(self)
    }

    fn end(&self, reason: EndReason) -> EndReason {
        Buffer::end(self, reason, None)
    }

    fn poll_released(&self, cx: &mut Context<'_>) -> Poll<()> {
        Buffer::poll_released(self, cx)
    }
}

/// A cloneable handle to one gated stream, from [`Consumer::handle`](crate::Consumer::handle).
///
/// It outlives the consumer, so a server can hand the consumer to its transport and still read
/// why the stream ended and what it cost, or stop it.
#[derive(Clone)]
pub struct GateHandle {
    status: std::sync::Arc<dyn Status>,
}

impl GateHandle {
    pub(crate) fn new<T: Chunk + Send + 'static>(buffer: Arc<Buffer<T>>) -> Self {
        GateHandle {
            status: std::sync::Arc::new(buffer),
        }
    }

    /// A snapshot of the stream's counters.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::Gate;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut tx, consumer) = Gate::new().channel::<String>();
    /// tx.try_send("Hello".to_owned()).unwrap();
    /// let stats = consumer.handle().stats();
    /// assert_eq!((stats.chunks_sent, stats.bytes_sent, stats.buffered_events), (1, 5, 1));
    /// # }
    /// ```
    pub fn stats(&self) -> GateStats {
        self.status.stats()
    }

    /// Why the stream ended, or `None` while it runs.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::{EndReason, Gate};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, mut consumer) = Gate::new().channel::<String>();
    /// let handle = consumer.handle();
    /// assert_eq!(handle.end_reason(), None, "running");
    /// tx.finish();
    /// assert!(consumer.next().await.is_none());
    /// assert_eq!(handle.end_reason(), Some(EndReason::Completed));
    /// # }
    /// ```
    pub fn end_reason(&self) -> Option<EndReason> {
        self.status.end_reason()
    }

    /// Stops the stream on purpose (a user pressing Stop): it ends as
    /// [`EndReason::Cancelled`] unless it has already ended, and the generator is stopped. The
    /// consumer still receives the events that were waiting, then the error.
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
    /// tx.try_send("a".to_owned()).unwrap();
    /// consumer.handle().cancel();
    /// assert!(tx.is_closed(), "the engine is told");
    /// // What waited, then the reason.
    /// assert_eq!(consumer.next().await.unwrap().unwrap().chunk(), "a");
    /// let error = consumer.next().await.unwrap().unwrap_err();
    /// assert_eq!(error.reason(), EndReason::Cancelled);
    /// # }
    /// ```
    pub fn cancel(&self) {
        self.status.end(EndReason::Cancelled);
    }

    /// Like [`cancel`](GateHandle::cancel), with the reason to report (e.g.
    /// [`EndReason::Shutdown`], so a shutdown is not counted as a user's stop). Returns the
    /// reason that stands (the first end wins).
    ///
    /// # Errors
    ///
    /// [`CancelError`] for [`EndReason::Completed`], which is not a reason to cut a stream
    /// short (a stream completes when its consumer has every event): the stream is left as it
    /// was.
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
    /// // A server draining for a deploy: not counted as a user's stop.
    /// assert_eq!(handle.cancel_with(EndReason::Shutdown), Ok(EndReason::Shutdown));
    /// // The first end stands.
    /// assert_eq!(handle.cancel_with(EndReason::Cancelled), Ok(EndReason::Shutdown));
    /// assert!(handle.cancel_with(EndReason::Completed).is_err());
    /// # }
    /// ```
    pub fn cancel_with(&self, reason: EndReason) -> Result<EndReason, CancelError> {
        if reason == EndReason::Completed {
            return Err(CancelError::completed());
        }
        Ok(self.status.end(reason))
    }

    /// Whether the stream has been released (the generator's work stopped and the release hook
    /// ran).
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::Gate;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, consumer) = Gate::new().channel::<String>();
    /// let handle = consumer.handle();
    /// drop(consumer);
    /// assert!(!handle.is_released(), "the engine still holds the sender");
    /// drop(tx);
    /// handle.released().await;
    /// assert!(handle.is_released());
    /// # }
    /// ```
    pub fn is_released(&self) -> bool {
        self.status.stats().released
    }

    /// Waits until the stream has been released.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use streamgate::Gate;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let freed = Arc::new(AtomicBool::new(false));
    /// let flag = freed.clone();
    /// let (tx, consumer) = Gate::new()
    ///     .on_release(move |_, _| flag.store(true, Ordering::SeqCst))
    ///     .channel::<String>();
    /// let handle = consumer.handle();
    /// tx.finish();
    /// drop(consumer);
    /// handle.released().await;
    /// assert!(freed.load(Ordering::SeqCst), "after the hook ran");
    /// # }
    /// ```
    pub async fn released(&self) {
        poll_fn(|cx| self.status.poll_released(cx)).await;
    }
}

impl fmt::Debug for GateHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateHandle")
            .field("end_reason", &self.end_reason())
            .field("released", &self.is_released())
            .finish()
    }
}
