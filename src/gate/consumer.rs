//! The consumer's half: a `Stream` of events, and what dropping it means.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use futures_core::{FusedStream, Stream};
use tokio_util::sync::CancellationToken;

use super::buffer::{Batch, Buffer};
use super::end::GateError;
use super::handle::GateHandle;
use crate::chunk::Chunk;
use crate::probe::{Observation, Observed, Seen};
use crate::sync::Arc;

/// A chunk and its place in the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event<T> {
    seq: u64,
    chunk: T,
    enqueued_at: Option<Instant>,
    waiting: usize,
}

impl<T> Event<T> {
    /// The event's number in this stream: 0, 1, 2, … in the order the consumer receives them,
    /// never repeated and never going back.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The chunk (after `Coalesce`, possibly several of the generator's chunks merged).
    pub fn chunk(&self) -> &T {
        &self.chunk
    }

    /// Takes the chunk out.
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
                    Some(event.seq),
                    event.chunk.byte_len() as u64,
                    event.chunk.kind(),
                )
                .waiting(event.waiting as u64);
                if let Some(at) = event.enqueued_at {
                    seen = seen.enqueued_at(at);
                }
                Seen::Event(seen)
            }
            Err(error) => Seen::End(error.reason().as_str()),
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
/// Dropping it (as hyper drops a response body when the client disconnects) cancels the stream:
/// the generator is dropped at its next await point and the release hook runs.
#[must_use = "streams do nothing unless polled"]
pub struct Consumer<T: Chunk> {
    buffer: Arc<Buffer<T>>,
    token: CancellationToken,
    batch: Batch<T>,
    next_seq: u64,
}

impl<T: Chunk + Send + 'static> Consumer<T> {
    pub(crate) fn new(buffer: Arc<Buffer<T>>, token: CancellationToken) -> Self {
        Consumer {
            buffer,
            token,
            batch: Batch::new(),
            next_seq: 0,
        }
    }

    /// A handle to this stream's end reason and counters that outlives the consumer.
    pub fn handle(&self) -> GateHandle {
        GateHandle::new(self.buffer.clone(), self.token.clone())
    }
}

// Chunks are moved, never pinned, so the consumer is `Unpin` whatever the chunk type.
impl<T: Chunk> Unpin for Consumer<T> {}

impl<T: Chunk> Stream for Consumer<T> {
    type Item = Result<Event<T>, GateError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        this.buffer.poll_recv(cx, &mut this.batch).map(|item| {
            item.map(|result| {
                result.map(|entry| {
                    let seq = this.next_seq;
                    this.next_seq += 1;
                    Event {
                        seq,
                        chunk: entry.chunk,
                        enqueued_at: entry.enqueued_at,
                        waiting: this.batch.len(),
                    }
                })
            })
        })
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
        // Record the end first, so the generator's task reports the cancel rather than a
        // completion it could race to.
        self.buffer.close_consumer(std::mem::take(&mut self.batch));
        self.token.cancel();
    }
}

impl<T: Chunk> fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("next_seq", &self.next_seq)
            .field("batch", &self.batch.len())
            .field("end_reason", &self.buffer.end_reason())
            .finish()
    }
}
