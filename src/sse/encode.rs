//! Encoding a gated stream as SSE frames, with a visible frame for an early end.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures_core::{FusedStream, Stream};
use pin_project_lite::pin_project;

use super::error_shape::ErrorShape;
use super::event::SseEvent;
use super::frame::SseFrame;
use crate::chunk::Chunk;
use crate::end::EndReason;
use crate::gate::{Event, GateError};

/// A gate's item as [`GateExt::sse`](crate::GateExt::sse) encodes it:
/// `Result<Event<T>, GateError>` whose chunk `T` converts into an [`SseEvent`].
///
/// A [`Consumer`](crate::Consumer) of such chunks yields it, and so does every stream that
/// passes a gate's items on (a [`probe`](crate::GateExt::probe)d consumer). Only that type
/// implements it (the trait is sealed); it exists so that `.sse()` on any other stream is
/// refused where it is written.
#[diagnostic::on_unimplemented(
    message = "`.sse()` encodes a gated stream, whose items are `Result<Event<T>, GateError>`, not `{Self}`",
    label = "this stream's items are `{Self}`",
    note = "`.sse()` takes a `Consumer<T>` (or a stream that passes its items on, such as `.probe(..)`) whose chunk `T` converts into an `SseEvent`; a resume `Subscriber` already yields frames"
)]
pub trait GateItem: Into<Result<Event<Self::Chunk>, GateError>> + sealed::Sealed {
    /// The gate's chunk type.
    type Chunk: Into<SseEvent> + Chunk;
}

impl<T: Into<SseEvent> + Chunk> GateItem for Result<Event<T>, GateError> {
    type Chunk = T;
}

mod sealed {
    use crate::gate::{Event, GateError};

    pub trait Sealed {}

    impl<T> Sealed for Result<Event<T>, GateError> {}
}

pin_project! {
    /// Encodes each event of a gated stream as one SSE [`SseFrame`], and an early end as a
    /// terminal `event: error` frame; built by [`GateExt::sse`](crate::GateExt::sse).
    ///
    /// Every event without an id of its own is written with its event id ([`Event::id`]) as
    /// its SSE `id:`, so a client reconnecting with `Last-Event-ID` names where it stopped, and
    /// hops that decode the stream see each event under the same id;
    /// [`without_ids`](EncodeSse::without_ids) leaves them out.
    ///
    /// The terminal frame is `event: error` with data
    /// `{"error":{"type":"<end reason>","message":"<why>"}}` (the shape OpenAI-compatible
    /// clients read; [`error_shape`](EncodeSse::error_shape) writes another API's), so a
    /// client can tell a cut-off stream from a finished one. An event of
    /// type `error` among the events (a gateway passing an upstream's end frame on) is taken
    /// the same way: probes end the stream there, as `upstream_error`, and record nothing
    /// after it. Send notifications that do not end the stream under another type.
    #[must_use = "streams do nothing unless polled"]
    pub struct EncodeSse<S> {
        #[pin]
        events: S,
        ids: bool,
        shape: ErrorShape,
        // The id after the last event's, for a Responses error's `sequence_number`.
        next: Option<u64>,
        done: bool,
    }
}

impl<S> EncodeSse<S>
where
    S: Stream,
    S::Item: GateItem,
{
    pub(crate) fn new(events: S) -> Self {
        EncodeSse {
            events,
            ids: true,
            shape: ErrorShape::OpenAi,
            next: None,
            done: false,
        }
    }

    /// Writes an early end's terminal frame in `shape`, the error shape of the API the stream
    /// speaks (an Anthropic Messages or OpenAI Responses stream's clients read their own).
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::sse::{ErrorShape, SseEvent};
    /// use streamgate::{Gate, GateExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let consumer = Gate::new().spawn(|_, mut tx| async move {
    ///     tx.send(SseEvent::data("{}")).await.ok();
    ///     Err(std::io::Error::other("boom"))
    /// });
    /// let frames: Vec<_> = consumer.sse().error_shape(ErrorShape::Responses).collect().await;
    /// let end = std::str::from_utf8(frames[1].bytes()).unwrap();
    /// assert!(end.starts_with(r#"event: error
    /// data: {"type":"error","code":"generator_error","#));
    /// assert!(end.ends_with(r#""param":null,"sequence_number":1}
    ///
    /// "#));
    /// # }
    /// ```
    pub fn error_shape(mut self, shape: ErrorShape) -> Self {
        self.shape = shape;
        self
    }

    /// The events start at `next` (a subscriber attached there): an end before the first
    /// comes at `next`.
    pub(crate) fn starting_at(mut self, next: u64) -> Self {
        self.next = Some(next);
        self
    }

    /// Writes no `id:` for the events that have none of their own. The frames still carry
    /// their ids ([`SseFrame::id`]) for probes; only the wire loses them, and with them a
    /// client's resume position (`Last-Event-ID`): for a client that never resumes and counts
    /// every byte.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::sse::SseEvent;
    /// use streamgate::{Gate, GateExt, SendError};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let consumer = Gate::new().spawn(|_, mut tx| async move {
    ///     tx.send(SseEvent::data("hello")).await?;
    ///     Ok::<_, SendError<SseEvent>>(())
    /// });
    /// let frames: Vec<_> = consumer.sse().without_ids().collect().await;
    /// assert_eq!(&frames[0].bytes()[..], b"data: hello\n\n");
    /// assert_eq!(frames[0].id(), Some(0));
    /// # }
    /// ```
    pub fn without_ids(mut self) -> Self {
        self.ids = false;
        self
    }
}

impl<S> Stream for EncodeSse<S>
where
    S: Stream,
    S::Item: GateItem,
{
    type Item = SseFrame;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<SseFrame>> {
        let this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        let frame = match ready!(this.events.poll_next(cx)).map(Into::into) {
            Some(Ok(event)) => {
                // The gated chunk's kind stands: a control chunk stays control once encoded,
                // and says so on the wire (see `SseEvent::encode`).
                let (gate_id, kind) = (event.id(), event.chunk().kind());
                *this.next = Some(gate_id.saturating_add(1));
                let mut sse: SseEvent = event.into_chunk().into();
                if sse.kind() != kind {
                    sse = sse.marked(kind);
                }
                // An event that carries an id of its own (an upstream's, kept by a gateway) is
                // known by it, so every hop numbers it the same way.
                if sse.event() == Some("error") {
                    // An upstream's end frame, passed on (by a gateway): the end of this
                    // stream, not an event with an id (one it shows is inherited).
                    let frame = SseFrame::new(sse.encode(), kind, None);
                    return Poll::Ready(Some(frame.ending(EndReason::UpstreamError)));
                }
                let id = sse
                    .id()
                    .and_then(|id| id.parse::<u64>().ok())
                    .unwrap_or(gate_id);
                let numbered = *this.ids && sse.id().is_none();
                SseFrame::new(sse.into_frame(numbered.then_some(id)), kind, Some(id))
            }
            Some(Err(error)) => {
                *this.done = true;
                end_frame(&error, *this.shape, *this.next)
            }
            None => {
                *this.done = true;
                return Poll::Ready(None);
            }
        };
        Poll::Ready(Some(frame))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done {
            return (0, Some(0));
        }
        // One frame per event, plus at most one end frame for an error.
        let (lower, upper) = self.events.size_hint();
        (lower, upper.and_then(|upper| upper.checked_add(1)))
    }
}

impl<S> FusedStream for EncodeSse<S>
where
    S: Stream,
    S::Item: GateItem,
{
    fn is_terminated(&self) -> bool {
        self.done
    }
}

/// The terminal frame, in `shape`, of a stream that did not complete, coming at the id
/// `next` when known. A slow consumer's end says why when the crate knows more (a subscriber
/// that fell behind a replay log: "behind: ..."); a generator's own error text never reaches
/// the client.
pub(crate) fn end_frame(error: &GateError, shape: ErrorShape, next: Option<u64>) -> SseFrame {
    let reason = error.reason();
    debug_assert_ne!(reason, EndReason::Completed);
    let detail = std::error::Error::source(error)
        .filter(|_| reason == EndReason::SlowConsumer)
        .map(ToString::to_string);
    let frame = match detail {
        Some(detail) => shape.frame(reason.as_str(), &format!("{error}: {detail}"), next),
        None => shape.frame(reason.as_str(), &error.to_string(), next),
    };
    frame.ending(reason)
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;
    use crate::{Gate, GateExt, Kind};

    #[tokio::test]
    async fn events_then_a_terminal_error_frame() {
        let consumer = Gate::new().spawn(|_, mut tx| async move {
            tx.send(SseEvent::data("a")).await.ok();
            Err(std::io::Error::other("boom"))
        });
        let frames: Vec<SseFrame> = consumer.sse().collect().await;
        assert_eq!(frames.len(), 2);
        assert_eq!(&frames[0].bytes()[..], b"id: 0\ndata: a\n\n");
        assert_eq!((frames[0].kind(), frames[0].id()), (Kind::Visible, Some(0)));
        assert_eq!(
            &frames[1].bytes()[..],
            &b"event: error\ndata: {\"error\":{\"type\":\"generator_error\",\"message\":\"stream ended: generator failed\"}}\n\n"[..]
        );
        assert_eq!(frames[1].kind(), Kind::Control);
    }

    /// Resume needs every event's id on the wire: `.sse()` writes it unless the event has one
    /// of its own, and only `without_ids` leaves it out.
    #[tokio::test]
    async fn ids_are_written_by_default_and_left_out_only_on_request() {
        let gate = || {
            Gate::new().first_id(7).spawn(|_, mut tx| async move {
                tx.send(SseEvent::data("a")).await?;
                tx.send(SseEvent::data("b").with_id("upstream-3").unwrap())
                    .await?;
                Ok::<_, crate::SendError<SseEvent>>(())
            })
        };
        let frames: Vec<SseFrame> = gate().sse().collect().await;
        let bytes: Vec<&[u8]> = frames.iter().map(|f| &f.bytes()[..]).collect();
        assert_eq!(
            bytes,
            [&b"id: 7\ndata: a\n\n"[..], b"id: upstream-3\ndata: b\n\n"]
        );
        let frames: Vec<SseFrame> = gate().sse().without_ids().collect().await;
        let bytes: Vec<&[u8]> = frames.iter().map(|f| &f.bytes()[..]).collect();
        assert_eq!(bytes, [&b"data: a\n\n"[..], b"id: upstream-3\ndata: b\n\n"]);
        // The frames know their ids either way (probes line events up by them).
        assert_eq!(
            frames.iter().map(SseFrame::id).collect::<Vec<_>>(),
            [Some(7), Some(8)]
        );
    }
}
