//! The generator's half: sends chunks into the gate's buffer under the slow-consumer policy.

use std::fmt;
use std::future::poll_fn;
use std::pin::Pin;
use std::task::Poll;
use std::time::Instant;

use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;

use super::buffer::{Buffer, Refused};
use super::end::EndReason;
use super::policy::Policy;
use crate::chunk::Chunk;
use crate::sync::Arc;

/// The generator's half of a gate, handed to the generator closure given to
/// [`Gate::spawn`](crate::Gate::spawn).
///
/// `send` fails once the stream has ended (the consumer went away, the slow-consumer policy ended
/// it, or it was cancelled): a generator should stop then. It will be dropped at its next await
/// point in any case.
pub struct Sender<T> {
    buffer: Arc<Buffer<T>>,
    token: CancellationToken,
    policy: Policy,
    stamp: bool,
}

impl<T: Chunk> Sender<T> {
    pub(crate) fn new(
        buffer: Arc<Buffer<T>>,
        token: CancellationToken,
        policy: Policy,
        stamp: bool,
    ) -> Self {
        Sender {
            buffer,
            token,
            policy,
            stamp,
        }
    }

    /// Sends one chunk to the consumer, waiting for room as the gate's [`Policy`] says.
    ///
    /// Returns as soon as the chunk is in the buffer (or merged into a waiting event): a
    /// consumer that keeps up has it at once, without waiting for another chunk.
    ///
    /// # Errors
    ///
    /// Hands the chunk back when the stream has ended; the chunk is counted in
    /// [`GateStats::chunks_after_end`](crate::GateStats::chunks_after_end). Inside the gate's
    /// own task the generator is dropped at this point instead, so the error is only seen by a
    /// `Sender` moved elsewhere.
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future before it completes drops the chunk, which was never sent.
    pub async fn send(&mut self, chunk: T) -> Result<(), SendError<T>> {
        let coalesce = self.policy.coalesces();
        let at = self.stamp.then(Instant::now);
        // The fast path: room, or an ended stream, found with one lock and no waker.
        let result = match self.buffer.try_push(chunk, at, coalesce, None) {
            Ok(()) => return Ok(()),
            Err(Refused::Ended(chunk)) => Err(SendError(chunk)),
            Err(Refused::Full { chunk, .. }) => self.wait_for_room(chunk, at).await,
        };
        if result.is_err() {
            // Every end cancels the token right after it is recorded. Waiting for that here
            // means the gate's task, which polls the token first, drops the generator inside
            // this send: even a generator that ignores the error produces nothing more.
            self.token.cancelled().await;
        }
        result
    }

    /// Whether the stream has ended, so that every send would fail.
    pub fn is_closed(&self) -> bool {
        self.buffer.end_reason().is_some()
    }

    /// The slow path of [`send`](Sender::send): the buffer is full.
    async fn wait_for_room(&mut self, chunk: T, at: Option<Instant>) -> Result<(), SendError<T>> {
        let coalesce = self.policy.coalesces();
        let deadline = self.policy.deadline();
        let mut held = Some(chunk);
        // The consumer's take count when the current stall began, and the timer for it.
        let mut stall: Option<(u64, Pin<Box<Sleep>>)> = None;
        poll_fn(|cx| {
            let chunk = held.take().expect("polled after completion");
            let (chunk, takes) = match self.buffer.try_push(chunk, at, coalesce, Some(cx.waker())) {
                Ok(()) => return Poll::Ready(Ok(())),
                Err(Refused::Ended(chunk)) => return Poll::Ready(Err(SendError(chunk))),
                Err(Refused::Full { chunk, takes }) => (chunk, takes),
            };
            let Some(deadline) = deadline else {
                held = Some(chunk);
                return Poll::Pending;
            };
            let restart = match &stall {
                None => true,
                Some((since, _)) => deadline.restarts_on_take && *since != takes,
            };
            if restart {
                stall = Some((takes, Box::pin(tokio::time::sleep(deadline.limit))));
            }
            let (_, timer) = stall.as_mut().expect("set above");
            if timer.as_mut().poll(cx).is_ready() {
                self.buffer.end(EndReason::SlowConsumer, None);
                self.token.cancel();
                return Poll::Ready(Err(SendError(chunk)));
            }
            held = Some(chunk);
            Poll::Pending
        })
        .await
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender")
            .field("policy", &self.policy)
            .field("cancelled", &self.token.is_cancelled())
            .finish_non_exhaustive()
    }
}

/// The error of [`Sender::send`]: the stream has ended. Holds the chunk that was not sent.
pub struct SendError<T>(T);

impl<T> SendError<T> {
    /// The chunk that was not sent.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendError").finish_non_exhaustive()
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stream ended")
    }
}

impl<T> std::error::Error for SendError<T> {}
