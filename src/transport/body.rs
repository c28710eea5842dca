//! An `http_body::Body` of SSE frames.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures_core::Stream;
use pin_project_lite::pin_project;

use crate::sse::SseFrame;

pin_project! {
    /// An [`http_body::Body`] that yields exactly one data frame per SSE [`SseFrame`], each as soon
    /// as the stream yields it, and declares no length (so hyper streams it with chunked
    /// encoding).
    ///
    /// hyper drops the body when the client goes away; that drops the stream and, through it,
    /// cancels the gate.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::transport::SseBody;
    /// use streamgate::{Gate, GateExt, sse::SseEvent};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let consumer = Gate::new().spawn(|_, mut tx| async move {
    ///     tx.send(SseEvent::data("hi")).await?;
    ///     Ok::<_, streamgate::SendError<SseEvent>>(())
    /// });
    /// let body = SseBody::new(consumer.sse().heartbeat(Duration::from_secs(15)));
    /// let response = http::Response::builder()
    ///     .header("content-type", "text/event-stream")
    ///     .body(body)
    ///     .unwrap();
    /// # drop(response);
    /// # }
    /// ```
    #[must_use = "bodies do nothing unless polled"]
    pub struct SseBody<S> {
        #[pin]
        frames: S,
        done: bool,
    }
}

impl<S> SseBody<S> {
    /// A body of the frames of `frames`.
    pub fn new(frames: S) -> Self {
        SseBody {
            frames,
            done: false,
        }
    }
}

impl<S: Stream<Item = SseFrame>> http_body::Body for SseBody<S> {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        let this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        match ready!(this.frames.poll_next(cx)) {
            Some(frame) => Poll::Ready(Some(Ok(http_body::Frame::data(frame.into_bytes())))),
            None => {
                *this.done = true;
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    // `size_hint` keeps the default: the length is unknown, so no `Content-Length` is sent.
}

impl<S> std::fmt::Debug for SseBody<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SseBody")
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}
