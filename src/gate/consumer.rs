//! The consumer's half: a `Stream` of events, and what dropping it means.

use std::fmt;
use std::ops::RangeInclusive;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use futures_core::{FusedStream, Stream};
use tokio::task::coop;

use super::buffer::{Batch, Buffer};
use super::error::GateError;
use super::handle::GateHandle;
use crate::chunk::Chunk;
use crate::probe::{Observation, Observed, Seen};
use crate::sync::Arc;

/// A chunk and its place in the stream.
///
/// An event's ids are positions in the generator's output, counted at `send`: the first chunk
/// is 0 (or the gate's [`first_id`](crate::Gate::first_id)), the next 1, and so on, whatever
/// the consumer does. They never depend on the connection, so they can be sent as the SSE
/// `id:` to resume from and used to line up the same event at every hop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event<T> {
    first: u64,
    last: u64,
    chunk: T,
    enqueued_at: Option<Instant>,
    waiting: usize,
}

impl<T> Event<T> {
    /// The event's id: the position of its (last) chunk in the generator's output. Ids a
    /// consumer receives strictly increase; this is the SSE `id:` of the event.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::Gate;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut tx, mut consumer) = Gate::new().channel::<String>();
    /// tx.try_send("a".to_owned()).unwrap();
    /// tx.try_send("b".to_owned()).unwrap();
    /// assert_eq!(consumer.next().await.unwrap().unwrap().id(), 0);
    /// assert_eq!(consumer.next().await.unwrap().unwrap().id(), 1);
    /// # }
    /// ```
    pub fn id(&self) -> u64 {
        self.last
    }

    /// The ids of every chunk in this event: one id, or under
    /// [`Coalesce`](crate::Policy::Coalesce) the run of chunks merged into it. The ranges of
    /// consecutive events tile the ids with no gap and no overlap.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::{Gate, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut tx, mut consumer) = Gate::new()
    ///     .max_events(1)
    ///     .policy(Policy::coalesce())
    ///     .channel::<String>();
    /// for token in ["a", "b", "c"] {
    ///     tx.try_send(token.to_owned()).unwrap(); // "b" and "c" merge into "a"
    /// }
    /// let event = consumer.next().await.unwrap().unwrap();
    /// assert_eq!((event.ids(), event.id()), (0..=2, 2));
    /// # }
    /// ```
    pub fn ids(&self) -> RangeInclusive<u64> {
        self.first..=self.last
    }

    /// The chunk (after `Coalesce`, possibly several of the generator's chunks merged).
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::Gate;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut tx, mut consumer) = Gate::new().channel::<String>();
    /// tx.try_send("Hello".to_owned()).unwrap();
    /// let event = consumer.next().await.unwrap().unwrap();
    /// assert_eq!(event.chunk(), "Hello");
    /// # }
    /// ```
    pub fn chunk(&self) -> &T {
        &self.chunk
    }

    /// Takes the chunk out.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::Gate;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut tx, mut consumer) = Gate::new().channel::<String>();
    /// tx.try_send("Hello".to_owned()).unwrap();
    /// let text: String = consumer.next().await.unwrap().unwrap().into_chunk();
    /// assert_eq!(text, "Hello");
    /// # }
    /// ```
    pub fn into_chunk(self) -> T {
        self.chunk
    }

    /// When the event entered the gate's buffer, if the gate stamps its events
    /// ([`Gate::stamp_events`](crate::Gate::stamp_events)).
    pub fn enqueued_at(&self) -> Option<Instant> {
        self.enqueued_at
    }

    /// How many events the consumer had already taken from the buffer behind this one: a lower
    /// bound on how many were waiting when it left.
    pub fn waiting(&self) -> usize {
        self.waiting
    }
}

impl<T: Chunk> Observed for Result<Event<T>, GateError> {
    fn observed(&self) -> Seen {
        match self {
            Ok(event) => {
                let mut seen = Observation::new(
                    Some(event.id()),
                    event.chunk.byte_len() as u64,
                    event.chunk.kind(),
                )
                .waiting(event.waiting as u64);
                if let Some(at) = event.enqueued_at {
                    seen = seen.enqueued_at(at);
                }
                Seen::Event(seen)
            }
            Err(error) => Seen::End(error.reason()),
        }
    }
}

/// The consumer's half of a gate: a [`Stream`] of [`Event`]s, built by
/// [`Gate::spawn`](crate::Gate::spawn) and its siblings.
///
/// It yields every chunk the generator sent, in order, each as soon as it is in the buffer. A
/// stream that completed then yields `None`; a stream that ended any other way yields one
/// `Err(GateError)` saying why, then `None`.
///
/// Dropping it (as hyper drops a response body when the client disconnects) ends the stream:
/// as [`Completed`](crate::EndReason::Completed) if the generator had finished and every event
/// was taken, as [`ConsumerGone`](crate::EndReason::ConsumerGone) otherwise. The generator is
/// stopped and the release hook runs.
///
/// It takes part in tokio's cooperative budget: a task that drains a fast stream still yields
/// to the other tasks of its runtime.
#[must_use = "streams do nothing unless polled"]
pub struct Consumer<T: Chunk> {
    buffer: Arc<Buffer<T>>,
    batch: Batch<T>,
}

impl<T: Chunk + Send + 'static> Consumer<T> {
    pub(crate) fn new(buffer: Arc<Buffer<T>>) -> Self {
        Consumer {
            buffer,
            batch: Batch::new(),
        }
    }

    /// A handle to this stream's end reason and counters that outlives the consumer.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::{EndReason, Gate};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (_tx, consumer) = Gate::new().channel::<String>();
    /// let handle = consumer.handle();
    /// drop(consumer); // given to the transport, whose client left
    /// assert_eq!(handle.end_reason(), Some(EndReason::ConsumerGone));
    /// # }
    /// ```
    pub fn handle(&self) -> GateHandle {
        GateHandle::new(self.buffer.clone())
    }
}

// Chunks are moved, never pinned, so the consumer is `Unpin` whatever the chunk type.
impl<T: Chunk> Unpin for Consumer<T> {}

impl<T: Chunk> Stream for Consumer<T> {
    type Item = Result<Event<T>, GateError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let budget = ready!(coop::poll_proceed(cx));
        let item = ready!(this.buffer.poll_recv(cx, &mut this.batch));
        budget.made_progress();
        Poll::Ready(item.map(|result| {
            result.map(|queued| Event {
                first: queued.first,
                last: queued.last,
                chunk: queued.chunk,
                enqueued_at: queued.enqueued_at,
                waiting: this.batch.len(),
            })
        }))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        // The batch in hand will be yielded; how many more the generator makes is unknown.
        (self.batch.len(), None)
    }
}

impl<T: Chunk> FusedStream for Consumer<T> {
    fn is_terminated(&self) -> bool {
        self.batch.is_empty() && self.buffer.is_terminated()
    }
}

impl<T: Chunk> Drop for Consumer<T> {
    fn drop(&mut self) {
        // Ends the stream (and cancels its token) under the lock that empties the queue.
        self.buffer.close_consumer(std::mem::take(&mut self.batch));
    }
}

impl<T: Chunk> fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("batch", &self.batch.len())
            .field("end_reason", &self.buffer.end_reason())
            .finish()
    }
}
