//! When each event's bytes left the kernel: a hop between the write and the client.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use pin_project_lite::pin_project;
use tokio::time::Sleep;

use super::stream::SendQueue;
use crate::end::EndReason;
use crate::probe::{Observation, Observed, Recorder, Seen};

/// How soon [`Departures`] asks the kernel again while bytes it waits for are still unsent and
/// nothing is being written; each check that finds no progress doubles the wait, up to
/// [`DEPARTURE_CHECK_MAX`].
pub const DEPARTURE_CHECK: Duration = Duration::from_millis(10);

/// The longest wait between two checks of a [`Departures`] whose bytes do not leave (a client
/// that stopped reading).
pub const DEPARTURE_CHECK_MAX: Duration = Duration::from_secs(1);

pin_project! {
    /// Passes a connection's frames through unchanged, and records at a hop (say
    /// `worker.sent`, after `worker.write`) when each one's bytes left the kernel's send queue.
    ///
    /// A write completes when the bytes reach the kernel; a client that stopped reading, or a
    /// path that stopped carrying, leaves them there. With a probe where frames are handed to
    /// the transport and this one where they leave the kernel, a diagnosis tells a slow
    /// transport from a slow server: the gap grows at the `sent` hop first.
    ///
    /// How it knows: a frame handed over when `n` bytes had been written to the connection has
    /// left once `n` plus its own size have been sent. The transport's own bytes are not
    /// counted (an HTTP/1.1 response head, a few bytes of chunk framing per event), so a frame
    /// can be seen leaving up to that many bytes early. The connection's
    /// [`TunedStream`](super::TunedStream) asks the kernel after each write, which times most
    /// departures exactly; while bytes stay unsent after a write, this asks again after
    /// [`DEPARTURE_CHECK`], backing off to [`DEPARTURE_CHECK_MAX`] (a client that keeps up
    /// costs no timer). One connection carries one stream at a time for the offsets to hold:
    /// HTTP/1.1, or a raw socket written to as below or through `transport::FrameWriter`
    /// (feature `io`). Over HTTP/2 (check the request's version) the connection interleaves
    /// streams: do not use it there.
    ///
    /// When the frames end, this stream ends once their bytes have left the kernel (or the
    /// kernel holds none of the connection's bytes), or once the connection can no longer send
    /// them (reset, or failed by the user timeout); the hop then records the end as
    /// `consumer_gone`. A client that stopped reading keeps the end of a finished stream
    /// waiting with the rest of its bytes. Frames still unsent when it is dropped are not
    /// recorded.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::pin::pin;
    ///
    /// use futures_util::StreamExt;
    /// use streamgate::probe::HopProbe;
    /// use streamgate::transport::{Departures, ListenOptions, TunedListener};
    /// use streamgate::{EndReason, Gate, GateExt, sse::SseEvent};
    /// use tokio::io::AsyncWriteExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let addr = "127.0.0.1:0".parse().unwrap();
    /// let listener = TunedListener::bind(addr, ListenOptions::default())?;
    /// let _client = tokio::net::TcpStream::connect(listener.local_addr()?).await?;
    /// let (mut socket, _) = listener.accept().await?;
    /// let (written, sent) = (HopProbe::new("worker.write"), HopProbe::new("worker.sent"));
    /// let consumer = Gate::new().spawn(|_, mut tx| async move {
    ///     tx.send(SseEvent::data("hi")).await?;
    ///     Ok::<_, streamgate::SendError<SseEvent>>(())
    /// });
    /// let frames = consumer.sse().probe(&written, "req-1");
    /// let frames = Departures::new(frames, socket.send_queue(), sent.recorder("req-1"));
    /// let mut frames = pin!(frames);
    /// // Each frame is written as it comes; the stream ends once the last one's bytes left.
    /// while let Some(frame) = frames.next().await {
    ///     socket.write_all(frame.bytes()).await?;
    /// }
    /// // Where the kernel tells what it has sent (Linux):
    /// if cfg!(target_os = "linux") {
    ///     let snapshot = sent.snapshot();
    ///     assert_eq!(snapshot.counters.visible_events(), 1);
    ///     assert_eq!(snapshot.streams_ended[EndReason::Completed], 1);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[must_use = "streams do nothing unless polled"]
    pub struct Departures<S> {
        #[pin]
        frames: S,
        queue: SendQueue,
        recorder: Recorder,
        // Frames handed over whose bytes have not been seen sent, oldest first.
        unsent: VecDeque<(u64, Observation)>,
        // The connection offset where the newest handed frame ends.
        end: u64,
        // Why the stream ended early, as an item said (for items other than frames).
        ended: Option<EndReason>,
        // The frames have ended; the stream ends once their bytes left.
        finishing: bool,
        // The wait before the next check.
        delay: Duration,
        #[pin]
        check: Option<Sleep>,
    }

    impl<S> PinnedDrop for Departures<S> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            settle(this.queue, this.recorder, this.unsent, true);
            this.queue.unwatch();
        }
    }
}

impl<S> Departures<S> {
    /// Records the departures of `frames`, written to the connection of `queue`, at the hop of
    /// `recorder`.
    pub fn new(frames: S, queue: SendQueue, recorder: Recorder) -> Self {
        queue.watch();
        Departures {
            frames,
            queue,
            recorder,
            unsent: VecDeque::new(),
            end: 0,
            ended: None,
            finishing: false,
            delay: DEPARTURE_CHECK,
            check: None,
        }
    }

    /// The recorder of the `sent` hop, with its counters so far.
    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }
}

/// Records every frame whose bytes have been sent: at the time a write saw them go, or (when
/// `ask` and they were not seen yet) now, if the kernel says they went. Whether any was.
fn settle(
    queue: &SendQueue,
    recorder: &mut Recorder,
    unsent: &mut VecDeque<(u64, Observation)>,
    ask: bool,
) -> bool {
    let before = unsent.len();
    let mut reading = queue.last_sent();
    for fresh in [false, true] {
        if fresh {
            if !ask || unsent.is_empty() {
                break;
            }
            reading = queue.refresh().ok();
        }
        let Some((sent, at)) = reading else { continue };
        while let Some(&(end, event)) = unsent.front() {
            if end > sent {
                break;
            }
            recorder.observe_at(event, at.into_std());
            unsent.pop_front();
        }
    }
    unsent.len() < before
}

impl<S> Stream for Departures<S>
where
    S: Stream,
    S::Item: Observed,
{
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let mut this = self.project();
        settle(this.queue, this.recorder, this.unsent, false);
        if !*this.finishing {
            match this.frames.as_mut().poll_next(cx) {
                Poll::Ready(Some(frame)) => {
                    let (event, end) = match frame.observed() {
                        Seen::Event(event) => (Some(event), None),
                        Seen::Last(event, reason) => (Some(event), Some(reason)),
                        Seen::End(reason) => (None, Some(reason)),
                        Seen::Nothing => (None, None),
                    };
                    if let Some(event) = event {
                        let start = this.queue.written().max(*this.end);
                        *this.end = start.saturating_add(event.bytes);
                        // The time it waited in a gate is the write hop's to record.
                        let event = Observation::new(event.seq, event.bytes, event.kind);
                        this.unsent.push_back((*this.end, event));
                        *this.delay = DEPARTURE_CHECK;
                    }
                    if end.is_some() {
                        *this.ended = end;
                    }
                    return Poll::Ready(Some(frame));
                }
                Poll::Ready(None) => *this.finishing = true,
                Poll::Pending => {}
            }
        }
        // Nothing to hand over: while some bytes are unsent, ask the kernel again after a
        // while (a frame just handed over is written after this poll, and that write notes its
        // own departure). Once the frames have ended, the stream ends when their bytes have
        // left (the transport writes the last ones after this poll, and wakes it), or when the
        // connection can no longer send them.
        loop {
            if *this.finishing {
                settle(this.queue, this.recorder, this.unsent, true);
                if !this.unsent.is_empty() && this.queue.unsent().is_ok_and(|bytes| bytes == 0) {
                    // The kernel holds nothing: what is left was sent (or shrunk on the way).
                    let now = std::time::Instant::now();
                    for (_, event) in this.unsent.drain(..) {
                        this.recorder.observe_at(event, now);
                    }
                }
                if this.unsent.is_empty() {
                    this.recorder
                        .end(this.ended.unwrap_or(EndReason::Completed));
                    return Poll::Ready(None);
                }
                if !this.queue.can_send() {
                    this.recorder.end(EndReason::ConsumerGone);
                    return Poll::Ready(None);
                }
                this.queue.wake_after_write(cx.waker(), false);
            }
            if this.unsent.is_empty() {
                this.check.set(None);
                *this.delay = DEPARTURE_CHECK;
                return Poll::Pending;
            }
            if !*this.finishing && this.check.is_none() {
                // The transport writes these frames after this poll, and its write notes their
                // departure: the check is needed only if that write leaves bytes unsent. (No
                // timer per event while the client keeps up.) Registered before looking, so a
                // write from another task in between still wakes this one.
                let unwritten = |queue: &SendQueue, unsent: &VecDeque<(u64, Observation)>| {
                    unsent
                        .front()
                        .is_some_and(|&(end, _)| end > queue.written())
                };
                if unwritten(this.queue, this.unsent) {
                    this.queue.wake_after_write(cx.waker(), true);
                    if unwritten(this.queue, this.unsent) {
                        return Poll::Pending;
                    }
                }
            }
            if this.check.is_none() {
                this.check.set(Some(tokio::time::sleep(*this.delay)));
            }
            let Some(check) = this.check.as_mut().as_pin_mut() else {
                return Poll::Pending;
            };
            if check.poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.check.set(None);
            *this.delay = if settle(this.queue, this.recorder, this.unsent, true) {
                DEPARTURE_CHECK
            } else {
                (*this.delay * 2).min(DEPARTURE_CHECK_MAX)
            };
        }
    }
}

impl<S> std::fmt::Debug for Departures<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Departures")
            .field("unsent", &self.unsent.len())
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}
