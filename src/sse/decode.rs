//! Decoding a stream of byte chunks (an upstream HTTP body) into SSE events.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::BytesMut;
use futures_core::{FusedStream, Stream};
use pin_project_lite::pin_project;
use tokio_util::codec::Decoder;

use super::decoder::{DecodeError, SseDecoder};
use super::event::SseEvent;
use crate::chunk::Chunk;
use crate::end::EndReason;
use crate::gate::BoxError;
use crate::probe::{Observation, Observed, Seen};

pin_project! {
    /// Decodes a stream of byte chunks as SSE; built by
    /// [`GateExt::sse_events`](crate::GateExt::sse_events).
    ///
    /// A limit error is yielded and decoding goes on with the next event; an error of the
    /// underlying stream is yielded as [`DecodeError::Upstream`] and ends the stream.
    ///
    /// # Examples
    ///
    /// An upstream body, however its chunks split the events:
    ///
    /// ```
    /// use bytes::Bytes;
    /// use futures_util::StreamExt;
    /// use streamgate::sse::SseDecoder;
    /// use streamgate::{Chunk, GateExt, Kind};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), streamgate::sse::DecodeError> {
    /// let chunks = [&b"id: 0\ndata: Hel"[..], b"lo\n\n:hidden\nid: 1\ndata: hm", b"m\n\n"];
    /// let body = futures_util::stream::iter(chunks.map(|chunk| Ok::<_, std::io::Error>(chunk)));
    /// let mut events = body.sse_events();
    /// let first = events.next().await.expect("an event")?;
    /// assert_eq!((first.id(), first.data_str()), (Some("0"), Some("Hello")));
    /// assert_eq!(first.kind(), Kind::Visible);
    /// let second = events.next().await.expect("an event")?;
    /// assert_eq!((second.data_str(), second.kind()), (Some("hmm"), Kind::Hidden));
    /// assert!(events.next().await.is_none());
    /// assert_eq!(events.decoder().last_event_id(), Some("1"));
    ///
    /// // With limits of one's own.
    /// let chunk = Bytes::from_static(b"data: long\n\n");
    /// let body = futures_util::stream::iter([Ok::<_, std::io::Error>(chunk)]);
    /// let mut events = body.sse_events_with(SseDecoder::new().max_event(3));
    /// assert!(events.next().await.expect("an error").is_err());
    /// # Ok(())
    /// # }
    /// ```
    #[must_use = "streams do nothing unless polled"]
    pub struct DecodeSse<S> {
        #[pin]
        bytes: S,
        decoder: SseDecoder,
        buffer: BytesMut,
        state: State,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Reading,
    /// The bytes ended (or failed): what is left in the buffer is decoded, then nothing.
    Draining,
    Done,
}

impl<S> DecodeSse<S> {
    pub(crate) fn new(bytes: S, decoder: SseDecoder) -> Self {
        DecodeSse {
            bytes,
            decoder,
            buffer: BytesMut::new(),
            state: State::Reading,
        }
    }

    /// The parser, for its last event id.
    ///
    /// See [`DecodeSse`] for an example.
    pub fn decoder(&self) -> &SseDecoder {
        &self.decoder
    }
}

impl<S, B, E> Stream for DecodeSse<S>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
    E: Into<BoxError>,
{
    type Item = Result<SseEvent, DecodeError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        loop {
            match *this.state {
                State::Done => return Poll::Ready(None),
                State::Draining => {
                    *this.state = State::Done;
                    return Poll::Ready(this.decoder.decode_eof(this.buffer).transpose());
                }
                State::Reading => {}
            }
            if let Some(item) = this.decoder.decode(this.buffer).transpose() {
                return Poll::Ready(Some(item));
            }
            match ready!(this.bytes.as_mut().poll_next(cx)) {
                Some(Ok(bytes)) => this.buffer.extend_from_slice(bytes.as_ref()),
                Some(Err(error)) => {
                    *this.state = State::Done;
                    return Poll::Ready(Some(Err(DecodeError::Upstream(error.into()))));
                }
                None => *this.state = State::Draining,
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        // Any number of events can hide in one chunk, and none in many.
        match self.state {
            State::Done => (0, Some(0)),
            _ => (0, None),
        }
    }
}

impl<S, B, E> FusedStream for DecodeSse<S>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
    E: Into<BoxError>,
{
    fn is_terminated(&self) -> bool {
        self.state == State::Done
    }
}

impl Observed for Result<SseEvent, DecodeError> {
    /// A decoded event is observed with the upstream's seq when its id is a number (as this
    /// crate's `.sse()` writes it), and with the kind the upstream marked (see
    /// [`SseDecoder`](super::SseDecoder)), so a gateway's `recv` hop lines up with the
    /// upstream's hops. An `event: error` frame is the
    /// stream's last event, ending it `upstream_error`, as does a failed upstream; a limit
    /// error does not end it.
    fn observed(&self) -> Seen {
        match self {
            Ok(event) if event.event() == Some("error") => {
                // An end frame carries no event id of its own (one it shows is inherited).
                let seen = Observation::new(None, event.byte_len() as u64, event.kind());
                Seen::Last(seen, EndReason::UpstreamError)
            }
            Ok(event) => {
                let seq = event.id().and_then(|id| id.parse().ok());
                Seen::Event(Observation::new(seq, event.byte_len() as u64, event.kind()))
            }
            Err(DecodeError::Upstream(_) | DecodeError::Io(_)) => {
                Seen::End(EndReason::UpstreamError)
            }
            Err(_) => Seen::Nothing,
        }
    }
}
