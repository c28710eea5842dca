//! The probe combinator: records every item of any stream at a hop.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures_core::{FusedStream, Stream};
use pin_project_lite::pin_project;

use super::observe::{Observed, Seen};
use super::recorder::Recorder;
use crate::end::EndReason;

pin_project! {
    /// Records each item of a stream at a hop as it passes, unchanged; built by
    /// [`GateExt::probe`](crate::GateExt::probe).
    ///
    /// The end of the inner stream is recorded as `completed` unless an item said otherwise
    /// (a terminal error frame, a gate error); dropping it before its end (a response body
    /// dropped because the client left) records `consumer_gone`.
    ///
    /// # Examples
    ///
    /// A gate's events, probed where the transport takes them:
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::probe::HopProbe;
    /// use streamgate::{EndReason, Gate, GateExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let hop = HopProbe::new("worker.publish");
    /// let generate = |_, mut tx: streamgate::Sender<String>| async move {
    ///     for i in 0..3 {
    ///         tx.send(format!("t{i} ")).await?;
    ///     }
    ///     Ok::<_, streamgate::SendError<String>>(())
    /// };
    ///
    /// let mut events = Gate::new().spawn(generate).probe(&hop, "req-1");
    /// while let Some(event) = events.next().await {
    ///     event.expect("the generator completes");
    /// }
    /// assert_eq!(events.recorder().summary().visible_events, 3);
    ///
    /// // A client that leaves after the first event.
    /// let mut events = Gate::new().spawn(generate).probe(&hop, "req-2");
    /// events.next().await;
    /// drop(events);
    ///
    /// let ended = hop.snapshot().streams_ended;
    /// assert_eq!(ended.occurred(), [(EndReason::Completed, 1), (EndReason::ConsumerGone, 1)]);
    /// # }
    /// ```
    #[must_use = "streams do nothing unless polled"]
    pub struct Probed<S> {
        #[pin]
        inner: S,
        recorder: Recorder,
    }
}

impl<S> Probed<S> {
    pub(crate) fn new(inner: S, recorder: Recorder) -> Self {
        Probed { inner, recorder }
    }

    /// The stream's recorder, with its counters so far.
    ///
    /// See [`Probed`] for an example.
    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }
}

impl<S> Stream for Probed<S>
where
    S: Stream,
    S::Item: Observed,
{
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = self.project();
        let item = ready!(this.inner.poll_next(cx));
        match &item {
            Some(item) => match item.observed() {
                Seen::Event(event) => this.recorder.observe(event),
                Seen::Last(event, reason) => {
                    this.recorder.observe(event);
                    this.recorder.end(reason);
                }
                Seen::End(reason) => this.recorder.end(reason),
                Seen::Nothing => {}
            },
            None => this.recorder.end(EndReason::Completed),
        }
        Poll::Ready(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl<S> FusedStream for Probed<S>
where
    S: FusedStream,
    S::Item: Observed,
{
    fn is_terminated(&self) -> bool {
        self.inner.is_terminated()
    }
}

// The recorder's own way in, here so that `recorder.rs` does not import the combinator that
// imports it.
impl Recorder {
    /// Records every item of `stream` with this recorder, as
    /// [`GateExt::probe`](crate::GateExt::probe) does with a new one: for a recorder made
    /// before its stream (to carry its context upstream first, say).
    ///
    /// # Examples
    ///
    /// ```
    /// use bytes::Bytes;
    /// use futures_util::StreamExt;
    /// use streamgate::probe::HopProbe;
    /// use streamgate::sse::SseFrame;
    /// use streamgate::{EndReason, Kind};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let hop = HopProbe::new("gateway.recv");
    /// let recorder = hop.recorder("req-1");
    /// // ... the upstream request is sent, and its frames come back:
    /// let frame = SseFrame::new(Bytes::from_static(b"data: hi\n\n"), Kind::Visible, Some(0));
    /// let frames = futures_util::stream::iter([frame]);
    /// let mut probed = recorder.probe(frames);
    /// while probed.next().await.is_some() {}
    /// assert_eq!(probed.recorder().summary().visible_events, 1);
    /// assert_eq!(hop.snapshot().streams_ended[EndReason::Completed], 1);
    /// # }
    /// ```
    pub fn probe<S>(self, stream: S) -> Probed<S>
    where
        S: futures_core::Stream,
        S::Item: Observed,
    {
        Probed::new(stream, self)
    }
}
