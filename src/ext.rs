//! `GateExt`: the crate's stream combinators as methods.

use std::time::Duration;

use futures_core::Stream;

use std::sync::Arc;

use crate::gate::BoxError;
use crate::probe::{HopProbe, Observed, Probed};
use crate::sse::{DecodeSse, EncodeSse, GateItem, Heartbeat, SseDecoder, SseFrame};

/// Combinators for the streams along the data path, as methods on any [`Stream`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use futures_util::StreamExt;
/// use streamgate::sse::SseEvent;
/// use streamgate::{Gate, GateExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let consumer = Gate::new().spawn(|_, mut tx| async move {
///     tx.send(SseEvent::data("hello")).await?;
///     Ok::<_, streamgate::SendError<SseEvent>>(())
/// });
/// let frames: Vec<_> = consumer.sse().heartbeat(Duration::from_secs(15)).collect().await;
/// assert_eq!(&frames[0].bytes()[..], b"id: 0\ndata: hello\n\n");
/// # }
/// ```
pub trait GateExt: Stream {
    /// Encodes a gated stream (a [`Consumer`](crate::Consumer) of chunks that convert into
    /// [`SseEvent`](crate::sse::SseEvent)s, or a stream that passes its items on: see
    /// [`GateItem`]) as SSE frames, one per event, each with its event id as its `id:`
    /// unless it has one of its own ([`without_ids`](EncodeSse::without_ids) leaves them out),
    /// ending an early end with a terminal `event: error` frame.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::{Gate, GateExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut tx, consumer) = Gate::new().channel::<String>();
    /// tx.try_send("Hello".to_owned()).unwrap();
    /// tx.abort(std::io::Error::other("out of KV blocks"));
    /// let frames: Vec<_> = consumer.sse().collect().await;
    /// assert_eq!(&frames[0].bytes()[..], b"id: 0\ndata: Hello\n\n");
    /// // The early end, visible to the client.
    /// assert!(frames[1].bytes().starts_with(b"event: error\n"));
    /// # }
    /// ```
    ///
    /// Only a gated stream has `.sse()`; any other is refused where it is written:
    ///
    /// ```compile_fail,E0277
    /// use streamgate::GateExt;
    ///
    /// let frames = futures_util::stream::iter(["not", "gated"]).sse();
    /// ```
    fn sse(self) -> EncodeSse<Self>
    where
        Self: Sized,
        Self::Item: GateItem,
    {
        EncodeSse::new(self)
    }

    /// Records every item at `hop` as one stream of request `request`: gaps, stalls, positions,
    /// buffer ages, hop records. Items pass unchanged.
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::probe::HopProbe;
    /// use streamgate::{EndReason, Gate, GateExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let hop = HopProbe::new("worker.publish");
    /// let consumer = Gate::new().spawn(|_, mut tx| async move {
    ///     tx.send("t0 ".to_owned()).await?;
    ///     Ok::<_, streamgate::SendError<String>>(())
    /// });
    /// let events: Vec<_> = consumer.probe(&hop, "req-1").collect().await;
    /// assert_eq!(events.len(), 1);
    /// let snapshot = hop.snapshot();
    /// assert_eq!(snapshot.counters.visible_events(), 1);
    /// assert_eq!(snapshot.streams_ended[EndReason::Completed], 1);
    /// # }
    /// ```
    fn probe(self, hop: &HopProbe, request: impl Into<Arc<str>>) -> Probed<Self>
    where
        Self: Sized,
        Self::Item: Observed,
    {
        Probed::new(self, hop.recorder(request))
    }

    /// Inserts a heartbeat comment whenever no frame has passed for `interval`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::StreamExt;
    /// use streamgate::sse::SseFrame;
    /// use streamgate::{Gate, GateExt};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let consumer = Gate::new().spawn(|_, mut tx| async move {
    ///     tokio::time::sleep(Duration::from_secs(20)).await; // a long prefill
    ///     tx.send("t0 ".to_owned()).await?;
    ///     Ok::<_, streamgate::SendError<String>>(())
    /// });
    /// let frames: Vec<_> = consumer.sse().heartbeat(Duration::from_secs(15)).collect().await;
    /// assert_eq!(frames[0], SseFrame::heartbeat());
    /// assert_eq!(&frames[1].bytes()[..], b"id: 0\ndata: t0 \n\n");
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// If `interval` is zero.
    fn heartbeat(self, interval: Duration) -> Heartbeat<Self>
    where
        Self: Stream<Item = SseFrame> + Sized,
    {
        Heartbeat::new(self, interval)
    }

    /// Decodes a stream of byte chunks (an upstream SSE body) into events, with the default
    /// limits.
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::GateExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// // An upstream body, cut wherever the network cut it.
    /// let body = futures_util::stream::iter(["id: 7\nda", "ta: hel", "lo\n\n"])
    ///     .map(Ok::<_, std::io::Error>);
    /// let events: Vec<_> = body.sse_events().collect().await;
    /// let event = events[0].as_ref().unwrap();
    /// assert_eq!((event.id(), event.data_str()), (Some("7"), Some("hello")));
    /// # }
    /// ```
    fn sse_events<B, E>(self) -> DecodeSse<Self>
    where
        Self: Stream<Item = Result<B, E>> + Sized,
        B: AsRef<[u8]>,
        E: Into<BoxError>,
    {
        DecodeSse::new(self, SseDecoder::new())
    }

    /// Like [`sse_events`](GateExt::sse_events), with a decoder configured by the caller.
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::GateExt;
    /// use streamgate::sse::{DecodeError, SseDecoder};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let body = futures_util::stream::iter([Ok::<_, std::io::Error>("data: far too long\n\n")]);
    /// let mut events = body.sse_events_with(SseDecoder::new().max_line(8));
    /// assert!(matches!(events.next().await, Some(Err(DecodeError::LineTooLong { .. }))));
    /// # }
    /// ```
    fn sse_events_with<B, E>(self, decoder: SseDecoder) -> DecodeSse<Self>
    where
        Self: Stream<Item = Result<B, E>> + Sized,
        B: AsRef<[u8]>,
        E: Into<BoxError>,
    {
        DecodeSse::new(self, decoder)
    }
}

impl<S: Stream> GateExt for S {}
