//! The generator's half: sends chunks into the gate's buffer, waiting or not.

use std::fmt;
use std::future::poll_fn;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use tokio::task::coop;
use tokio_util::sync::{WaitForCancellationFuture, WaitForCancellationFutureOwned};

use super::buffer::{Buffer, Refused};
use super::error::BoxError;
use super::handle::GateHandle;
use crate::chunk::Chunk;
use crate::end::EndReason;
use crate::sync::Arc;

/// The generator's half of a gate: given to the generator closure of
/// [`Gate::spawn`](crate::Gate::spawn), or returned by [`Gate::channel`](crate::Gate::channel)
/// to an engine loop that feeds many streams.
///
/// - [`send`](Sender::send) waits for room as the gate's [`Policy`](crate::Policy) says;
/// - [`try_send`](Sender::try_send) never waits: the chunk comes back when the buffer is full or
///   the stream has ended;
/// - [`ready`](Sender::ready) / [`poll_ready`](Sender::poll_ready) wait for room without a
///   chunk in hand, and [`closed`](Sender::closed) for the end;
/// - [`finish`](Sender::finish) and [`abort`](Sender::abort) end the stream with the reason the
///   engine chooses.
///
/// The slow-consumer clock runs in the gate, so the policy holds whichever of these is used.
///
/// Every id is the chunk's position in the stream: the first accepted chunk has the gate's
/// first id (0 unless [`Gate::first_id`](crate::Gate::first_id) says otherwise), the next one
/// the next number, whether it becomes an event of its own or is merged into one.
pub struct Sender<T: Chunk> {
    buffer: Arc<Buffer<T>>,
    stamp: bool,
    /// Whether the gate's own task runs the generator that owns this sender: then the
    /// generator's outcome, not the sender, says how the stream ends.
    in_task: bool,
    /// `finish` or `abort` has been called.
    done: bool,
    /// A `send` or `ready` has already failed: a spawned generator that waits to send again
    /// ignored it, and is parked (see [`send`](Sender::send)).
    failed: bool,
    /// A spawned generator with no stop grace: it is dropped at the end, so a send that meets
    /// the end (racing it on another thread) parks at once rather than failing.
    park_at_end: bool,
}

impl<T: Chunk> Sender<T> {
    pub(crate) fn new(buffer: Arc<Buffer<T>>, stamp: bool, in_task: bool) -> Self {
        Sender {
            buffer,
            stamp,
            in_task,
            done: false,
            failed: false,
            park_at_end: false,
        }
    }

    /// Makes a send that meets the end park at once (see `park_at_end`).
    pub(crate) fn parking_at_end(mut self) -> Self {
        self.park_at_end = true;
        self
    }

    /// Sends one chunk to the consumer, waiting for room as the gate's
    /// [`Policy`](crate::Policy) says.
    ///
    /// Returns as soon as the chunk is in the buffer (or merged into a waiting event): a
    /// consumer that keeps up has it at once, without waiting for another chunk. It takes part
    /// in tokio's cooperative budget, so a generator with no other await point still lets the
    /// other tasks of its runtime run.
    ///
    /// # Errors
    ///
    /// Hands the chunk back when the stream has ended; the chunk is counted in
    /// [`GateStats::chunks_after_end`](crate::GateStats::chunks_after_end). A generator should
    /// stop then (`tx.send(chunk).await?` returns from it, which is also how a spawned
    /// generator finishes its step within the stop grace).
    ///
    /// The sender of a spawned generator ([`Gate::spawn`](crate::Gate::spawn)) never completes
    /// a send after one that already failed: a generator that ignores the error is parked
    /// there, making at most one more chunk, rather than left to spin making chunks nobody
    /// reads, and it is dropped when its stop grace runs out. With the default stop grace of
    /// zero, a spawned generator is not polled again after the end at all.
    ///
    /// The sender of a [`Gate::channel`](crate::Gate::channel) belongs to an engine loop that
    /// serves many streams, which must never be parked by one of them: there every send after
    /// the end fails at once, again, handing its chunk back (and counting it in
    /// `chunks_after_end`).
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::{Gate, SendError};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let mut consumer = Gate::new().spawn(|_, mut tx| async move {
    ///     for token in ["Hel", "lo"] {
    ///         tx.send(token.to_owned()).await?; // waits while the buffer is full
    ///     }
    ///     Ok::<_, SendError<String>>(())
    /// });
    /// assert_eq!(consumer.next().await.unwrap().unwrap().chunk(), "Hel");
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future before it completes drops the chunk, which was never sent.
    /// So an engine loop must not poll it once and drop it (`now_or_never()`): a full buffer
    /// would silently lose the token. Use [`try_send`](Sender::try_send), which hands it back.
    pub async fn send(&mut self, chunk: T) -> Result<(), SendError<T>> {
        if self.failed && self.in_task {
            // A spawned generator ignored the error: count what was made, and stop it here.
            drop(self.try_send(chunk));
            return std::future::pending().await;
        }
        let at = self.stamp.then(Instant::now);
        let park_at_end = self.park_at_end;
        let mut held = Some(chunk);
        poll_fn(|cx| {
            let budget = ready!(coop::poll_proceed(cx));
            let chunk = held.take().expect("polled after completion");
            match self.buffer.try_push(chunk, at, Some(cx.waker())) {
                Ok(()) => {
                    budget.made_progress();
                    Poll::Ready(Ok(()))
                }
                Err(Refused::Full(chunk)) => {
                    held = Some(chunk);
                    Poll::Pending
                }
                Err(Refused::Ended(chunk)) => {
                    budget.made_progress();
                    if park_at_end {
                        // Counted; the gate's task drops the generator here.
                        drop(chunk);
                        return Poll::Pending;
                    }
                    Poll::Ready(Err(SendError(chunk)))
                }
            }
        })
        .await
        .inspect_err(|_| self.failed = true)
    }

    /// Sends one chunk if the buffer has room for it now (or, under `Coalesce`, a waiting event
    /// absorbs it); never waits.
    ///
    /// A chunk refused as [`TrySendError::Full`] starts the slow-consumer clock, so a stream
    /// whose consumer stopped reading is ended by its policy even if the engine never sends to
    /// it again; [`ready`](Sender::ready) says when to try again.
    ///
    /// # Errors
    ///
    /// [`TrySendError::Full`] or [`TrySendError::Ended`], with the chunk. An ended stream counts
    /// the chunk in [`GateStats::chunks_after_end`](crate::GateStats::chunks_after_end).
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::{Gate, TrySendError};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut tx, consumer) = Gate::new().max_events(1).channel::<String>();
    /// tx.try_send("a".to_owned()).unwrap();
    /// // Full: the engine keeps the token for the next step.
    /// let held = match tx.try_send("b".to_owned()) {
    ///     Err(TrySendError::Full(token)) => token,
    ///     other => panic!("{other:?}"),
    /// };
    /// drop(consumer); // the client left
    /// assert!(tx.try_send(held).unwrap_err().is_ended());
    /// # }
    /// ```
    pub fn try_send(&mut self, chunk: T) -> Result<(), TrySendError<T>> {
        let at = self.stamp.then(Instant::now);
        self.buffer
            .try_push(chunk, at, None)
            .map_err(|refused| match refused {
                Refused::Full(chunk) => TrySendError::Full(chunk),
                Refused::Ended(chunk) => TrySendError::Ended(chunk),
            })
    }

    /// Polls for room for one more event: `Ready(Ok(()))` when a [`try_send`](Sender::try_send)
    /// of a chunk as large as the last one refused would not find the buffer full,
    /// `Ready(Err(Closed))` once the stream has ended. While it is pending, the slow-consumer
    /// clock runs. Under `Coalesce` it waits for room for an event of its own even when a
    /// `try_send` would merge: try first, wait when refused.
    ///
    /// For a spawned generator's sender, once it (or a `send`) has failed, it never completes
    /// again: a generator that ignores the end is parked rather than left to spin. A
    /// [`Gate::channel`](crate::Gate::channel) sender's engine loop is never parked: there it
    /// returns `Ready(Err(Closed))` again at once.
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Closed>> {
        if self.failed && self.in_task {
            return Poll::Pending;
        }
        let budget = ready!(coop::poll_proceed(cx));
        let room = ready!(self.buffer.poll_room(cx));
        budget.made_progress();
        if room {
            Poll::Ready(Ok(()))
        } else {
            self.failed = true;
            Poll::Ready(Err(Closed(())))
        }
    }

    /// Waits for room for one more event; see [`poll_ready`](Sender::poll_ready).
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::Gate;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut tx, mut consumer) = Gate::new().max_events(1).channel::<String>();
    /// tx.try_send("a".to_owned()).unwrap();
    /// let held = tx.try_send("b".to_owned()).unwrap_err().into_inner();
    /// let reader = tokio::spawn(async move {
    ///     let first = consumer.next().await;
    ///     (first, consumer)
    /// });
    /// tx.ready().await.expect("room, once the consumer took \"a\"");
    /// tx.try_send(held).unwrap();
    /// # let (first, _consumer) = reader.await.unwrap();
    /// # assert_eq!(first.unwrap().unwrap().chunk(), "a");
    /// # }
    /// ```
    pub async fn ready(&mut self) -> Result<(), Closed> {
        poll_fn(|cx| self.poll_ready(cx)).await
    }

    /// Completes when the stream has ended, for whatever reason (including completion): an
    /// engine learns that a stream is over without sending to it.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::Gate;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, consumer) = Gate::new().channel::<String>();
    /// consumer.handle().cancel(); // a user pressed Stop
    /// tx.closed().await;
    /// assert!(tx.is_closed());
    /// # drop(consumer);
    /// # }
    /// ```
    pub fn closed(&self) -> WaitForCancellationFuture<'_> {
        self.buffer.token().cancelled()
    }

    /// Like [`closed`](Sender::closed), a future that does not borrow the sender, so an
    /// engine can wait on many streams' ends while it goes on sending.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::Gate;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut tx, consumer) = Gate::new().channel::<String>();
    /// let ended = tokio::spawn(tx.closed_owned());
    /// tx.try_send("a".to_owned()).unwrap(); // the sender is still the engine's
    /// drop(consumer);
    /// ended.await.unwrap();
    /// assert!(tx.is_closed());
    /// # }
    /// ```
    pub fn closed_owned(&self) -> WaitForCancellationFutureOwned {
        self.buffer.token().clone().cancelled_owned()
    }

    /// Whether the stream has ended (or [`finish`](Sender::finish) was called), so that every
    /// send would fail.
    pub fn is_closed(&self) -> bool {
        self.buffer.is_closed()
    }

    /// The producer is done: the stream completes once the consumer has taken every event
    /// already sent. Returning `Ok` from a spawned generator does the same.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::{EndReason, Gate};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut tx, mut consumer) = Gate::new().channel::<String>();
    /// tx.try_send("last".to_owned()).unwrap();
    /// tx.finish();
    /// assert_eq!(consumer.next().await.unwrap().unwrap().chunk(), "last");
    /// assert!(consumer.next().await.is_none());
    /// assert_eq!(consumer.handle().end_reason(), Some(EndReason::Completed));
    /// # }
    /// ```
    pub fn finish(mut self) {
        self.done = true;
        self.stop_producing();
        self.buffer.finish();
    }

    /// Ends the stream as [`GeneratorError`](EndReason::GeneratorError) with `error` as its
    /// source: the consumer receives the events already sent, then the error.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::{EndReason, Gate};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut tx, mut consumer) = Gate::new().channel::<String>();
    /// tx.try_send("partial".to_owned()).unwrap();
    /// tx.abort(std::io::Error::other("device lost"));
    /// assert_eq!(consumer.next().await.unwrap().unwrap().chunk(), "partial");
    /// let error = consumer.next().await.unwrap().unwrap_err();
    /// assert_eq!(error.reason(), EndReason::GeneratorError);
    /// assert_eq!(std::error::Error::source(&error).unwrap().to_string(), "device lost");
    /// # }
    /// ```
    pub fn abort(mut self, error: impl Into<BoxError>) {
        self.done = true;
        self.stop_producing();
        self.buffer
            .end(EndReason::GeneratorError, Some(error.into()));
    }

    /// Outside the gate's task, letting go of the sender is the producer's work stopping: said
    /// before the end it causes, so the release never waits for it (or counts it forced).
    fn stop_producing(&self) {
        if !self.in_task {
            self.buffer.producer_stopped();
        }
    }
}

impl<T: Chunk> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.in_task {
            // The generator's outcome says how the stream ends, once its sender is gone too.
            self.buffer.task_sender_dropped();
            return;
        }
        if self.done {
            // `finish` and `abort` have said how the stream ends.
            return;
        }
        self.stop_producing();
        // Output cut short must not look complete.
        self.buffer.end(
            EndReason::GeneratorError,
            Some("the sender was dropped before `finish`".into()),
        );
    }
}

impl<T: Chunk> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender")
            .field("closed", &self.is_closed())
            .field("in_task", &self.in_task)
            .finish_non_exhaustive()
    }
}

impl<T: Chunk + Send + 'static> Sender<T> {
    /// A handle on the gate this sender feeds: what a generator asks why its stream ended
    /// (its consumer gone, a stop, a slow consumer, a failed resume store), to record that as
    /// its own end, also where it is dropped rather than failing a send.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::{EndReason, Gate};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut tx, consumer) = Gate::new().channel::<String>();
    /// let gate = tx.handle();
    /// assert_eq!(gate.end_reason(), None);
    /// drop(consumer); // the client left
    /// assert!(tx.try_send("late".to_owned()).is_err());
    /// assert_eq!(gate.end_reason(), Some(EndReason::ConsumerGone));
    /// # }
    /// ```
    pub fn handle(&self) -> GateHandle {
        GateHandle::new(self.buffer.clone())
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

/// The error of [`Sender::try_send`], holding the chunk that was not sent.
pub enum TrySendError<T> {
    /// The buffer is full: the consumer is behind. Try again once
    /// [`Sender::ready`] completes.
    Full(T),
    /// The stream has ended; nothing more will be delivered.
    Ended(T),
}

impl<T> TrySendError<T> {
    /// The chunk that was not sent.
    pub fn into_inner(self) -> T {
        match self {
            TrySendError::Full(chunk) | TrySendError::Ended(chunk) => chunk,
        }
    }

    /// Whether the stream has ended (rather than being full).
    pub fn is_ended(&self) -> bool {
        matches!(self, TrySendError::Ended(_))
    }
}

impl<T> fmt::Debug for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TrySendError::Full(_) => "Full(..)",
            TrySendError::Ended(_) => "Ended(..)",
        })
    }
}

impl<T> fmt::Display for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TrySendError::Full(_) => "buffer full",
            TrySendError::Ended(_) => "stream ended",
        })
    }
}

impl<T> std::error::Error for TrySendError<T> {}

/// The error of [`Sender::ready`]: the stream has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed(());

impl fmt::Display for Closed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stream ended")
    }
}

impl std::error::Error for Closed {}
