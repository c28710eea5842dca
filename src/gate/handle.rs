//! A handle to one stream's end reason and counters, independent of the chunk type.

use std::fmt;
use std::future::poll_fn;
use std::task::{Context, Poll};

use tokio_util::sync::CancellationToken;

use super::buffer::Buffer;
use super::end::EndReason;
use super::stats::GateStats;
use crate::chunk::Chunk;
use crate::sync::Arc;

/// The parts of a stream's shared state a handle reads, erased of the chunk type.
trait Status: Send + Sync {
    fn stats(&self) -> GateStats;
    fn end_reason(&self) -> Option<EndReason>;
    fn cancel(&self) -> EndReason;
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

    fn cancel(&self) -> EndReason {
        self.end(EndReason::Cancelled, None)
    }

    fn poll_released(&self, cx: &mut Context<'_>) -> Poll<()> {
        Buffer::poll_released(self, cx)
    }
}

/// A cloneable handle to one gated stream, from [`Consumer::handle`](crate::Consumer::handle).
///
/// It outlives the consumer, so a server can hand the consumer to its transport and still read
/// why the stream ended and what it cost.
#[derive(Clone)]
pub struct GateHandle {
    status: std::sync::Arc<dyn Status>,
    token: CancellationToken,
}

impl GateHandle {
    pub(crate) fn new<T: Chunk + Send + 'static>(
        buffer: Arc<Buffer<T>>,
        token: CancellationToken,
    ) -> Self {
        GateHandle {
            status: std::sync::Arc::new(buffer),
            token,
        }
    }

    /// A snapshot of the stream's counters.
    pub fn stats(&self) -> GateStats {
        self.status.stats()
    }

    /// Why the stream ended, or `None` while it runs.
    pub fn end_reason(&self) -> Option<EndReason> {
        self.status.end_reason()
    }

    /// Ends the stream as [`EndReason::Cancelled`] (unless it has already ended) and stops the
    /// generator. The consumer still receives the events that were waiting, then the error.
    pub fn cancel(&self) {
        self.status.cancel();
        self.token.cancel();
    }

    /// Whether the release hook has run (the generator is gone and its resources freed).
    pub fn is_released(&self) -> bool {
        self.status.stats().released
    }

    /// Waits until the release hook has run.
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
