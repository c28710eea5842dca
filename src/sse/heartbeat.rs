//! Heartbeats: a comment whenever a stream has been silent for an interval.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::{FusedStream, Stream};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep, sleep_until};

use super::frame::SseFrame;

pin_project! {
    /// Inserts a heartbeat [`SseFrame`] (an SSE comment) whenever no frame has passed for the
    /// interval, before the first one too; built by
    /// [`GateExt::heartbeat`](crate::GateExt::heartbeat).
    ///
    /// Prefill and hidden reasoning phases can be silent for longer than a proxy's idle timeout
    /// (often 60 s); a heartbeat keeps the connection open, and its write is how a server learns
    /// that a client vanished while the generator was silent. Heartbeats are control frames:
    /// no user-visible progress.
    ///
    /// # Examples
    ///
    /// A generator silent for 20 s (a long prefill), behind a proxy that drops connections
    /// idle for 30 s:
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::StreamExt;
    /// use streamgate::sse::{SseEvent, SseFrame};
    /// use streamgate::{Gate, GateExt, Kind};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let start = tokio::time::Instant::now();
    /// let consumer = Gate::new().spawn(|_, mut tx| async move {
    ///     tokio::time::sleep(Duration::from_secs(20)).await;
    ///     tx.send(SseEvent::data("hello")).await?;
    ///     Ok::<_, streamgate::SendError<SseEvent>>(())
    /// });
    /// let mut frames = consumer.sse().heartbeat(Duration::from_secs(15));
    ///
    /// let beat = frames.next().await.unwrap();
    /// assert_eq!((beat.kind(), start.elapsed()), (Kind::Control, Duration::from_secs(15)));
    /// assert_eq!(beat, SseFrame::heartbeat());
    /// let event = frames.next().await.unwrap();
    /// assert_eq!(&event.bytes()[..], b"id: 0\ndata: hello\n\n");
    /// assert_eq!(start.elapsed(), Duration::from_secs(20));
    /// assert!(frames.next().await.is_none());
    /// # }
    /// ```
    #[must_use = "streams do nothing unless polled"]
    pub struct Heartbeat<S> {
        #[pin]
        frames: S,
        // Boxed so that `Heartbeat` is `Unpin` whenever the inner stream is: one allocation
        // per stream, and `.next()` works without pinning.
        timer: Pin<Box<Sleep>>,
        interval: Duration,
        // When the stream last went quiet. The clock is read once per quiet spell (when the
        // inner stream pends after yielding frames), not once per frame, and the timer is
        // moved only when it fires: a burst of frames costs neither clock reads nor timer-wheel
        // updates.
        quiet_since: Instant,
        // Frames passed since `quiet_since` was read.
        active: bool,
        done: bool,
    }
}

impl<S> Heartbeat<S> {
    pub(crate) fn new(frames: S, interval: Duration) -> Self {
        assert!(!interval.is_zero(), "a heartbeat interval must not be zero");
        let now = Instant::now();
        Heartbeat {
            frames,
            timer: Box::pin(sleep_until(now + interval)),
            interval,
            quiet_since: now,
            active: false,
            done: false,
        }
    }
}

impl<S: Stream<Item = SseFrame>> Stream for Heartbeat<S> {
    type Item = SseFrame;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<SseFrame>> {
        let this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = this.frames.poll_next(cx) {
            match frame {
                Some(_) => *this.active = true,
                None => *this.done = true,
            }
            return Poll::Ready(frame);
        }
        if std::mem::take(this.active) {
            *this.quiet_since = Instant::now();
        }
        loop {
            if this.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let due = *this.quiet_since + *this.interval;
            if due > this.timer.deadline() {
                // Frames passed since the timer was set: silence is counted from the last.
                this.timer.as_mut().reset(due);
                continue;
            }
            let now = Instant::now();
            *this.quiet_since = now;
            this.timer.as_mut().reset(now + *this.interval);
            return Poll::Ready(Some(SseFrame::heartbeat()));
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        // Heartbeats add any number of frames.
        (self.frames.size_hint().0, None)
    }
}

impl<S: Stream<Item = SseFrame>> FusedStream for Heartbeat<S> {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;
    use tokio::sync::mpsc;

    use super::*;
    use crate::Kind;

    /// A stream of frames the test pushes by hand.
    fn frames() -> (
        mpsc::UnboundedSender<SseFrame>,
        impl Stream<Item = SseFrame> + Unpin,
    ) {
        let (tx, mut rx) = mpsc::unbounded_channel();
        (
            tx,
            Box::pin(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn heartbeats_fill_silence_and_every_frame_resets_the_timer() {
        let (tx, frames) = frames();
        let start = Instant::now();
        let mut stream = Heartbeat::new(frames, Duration::from_secs(10));
        // Before the first event.
        let beat = stream.next().await.unwrap();
        assert_eq!(
            (beat.kind(), start.elapsed()),
            (Kind::Control, Duration::from_secs(10))
        );
        // An event at 15 s moves the next heartbeat to 25 s.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let event = SseFrame::new(
            bytes::Bytes::from_static(b"data: x\n\n"),
            Kind::Visible,
            Some(0),
        );
        tx.send(event.clone()).unwrap();
        assert_eq!(stream.next().await.unwrap(), event);
        let beat = stream.next().await.unwrap();
        assert_eq!(
            (beat.kind(), start.elapsed()),
            (Kind::Control, Duration::from_secs(25))
        );
        drop(tx);
        assert!(stream.next().await.is_none());
    }
}
