//! The consumer's half: a `Stream` of events, and what dropping it means.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::{FusedStream, Stream};
use tokio_util::sync::CancellationToken;

use super::buffer::{Batch, Buffer};
use super::end::GateError;
use super::handle::GateHandle;
use crate::chunk::Chunk;
use crate::sync::Arc;

/// A chunk and its place in the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event<T> {
    seq: u64,
    chunk: T,
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
                result.map(|chunk| {
                    let seq = this.next_seq;
                    this.next_seq += 1;
                    Event { seq, chunk }
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
