//! A subscriber: one connection reading a registered stream at its own position, as SSE frames.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures_core::{FusedStream, Stream};

use crate::sse::SseFrame;

/// One reader of a registered stream, from [`Registry::register`](super::Registry::register)
/// or [`Registry::attach`](super::Registry::attach): the SSE frames of the events after its
/// position (each with its event id as `id:`, so a client that reconnects names where it
/// stopped), from the replay log then live, then the stream's end, ready for the transport
/// (`.heartbeat()`, `.probe()` and the transports take it).
///
/// A stream that did not complete ends with its terminal `event: error` frame, as
/// [`EncodeSse`](crate::sse::EncodeSse) writes it; so does a subscriber that fell behind what
/// the log evicted, or was cut off for holding the others back past its lag limit
/// (`slow_consumer`, "behind"), or (in Redis) whose store failed or lost the stream
/// (`resume_store_error`).
///
/// Dropping it detaches it: the stream goes on; when nobody is attached (on any instance),
/// its grace starts.
///
/// # Examples
///
/// ```
/// use futures_util::StreamExt;
/// use streamgate::Gate;
/// use streamgate::resume::{Registry, ResumeOptions};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let registry = Registry::memory(ResumeOptions::default());
/// let consumer = Gate::new().spawn(|_, mut tx| async move {
///     tx.send("hello".to_owned()).await?;
///     Ok::<_, streamgate::SendError<String>>(())
/// });
/// let claim = registry.claim("req-1").await?;
/// let subscriber = registry.register(claim, consumer).await?;
/// assert_eq!(subscriber.id(), "req-1");
/// let frames: Vec<_> = subscriber.map(|frame| frame.into_bytes()).collect().await;
/// assert_eq!(frames, ["id: 0\ndata: hello\n\n"]);
/// # Ok(())
/// # }
/// ```
#[must_use = "streams do nothing unless polled"]
pub struct Subscriber {
    id: Arc<str>,
    frames: Pin<Box<dyn Stream<Item = SseFrame> + Send + Sync>>,
    done: bool,
}

impl Subscriber {
    pub(crate) fn new(
        id: Arc<str>,
        frames: impl Stream<Item = SseFrame> + Send + Sync + 'static,
    ) -> Self {
        Subscriber {
            id,
            frames: Box::pin(frames),
            done: false,
        }
    }

    /// The stream's id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Stream for Subscriber {
    type Item = SseFrame;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<SseFrame>> {
        if self.done {
            return Poll::Ready(None);
        }
        let frame = ready!(self.frames.as_mut().poll_next(cx));
        self.done = frame.is_none();
        Poll::Ready(frame)
    }
}

impl FusedStream for Subscriber {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

impl fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscriber")
            .field("id", &self.id)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}
