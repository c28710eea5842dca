//! The chunks the gate holds, and the ids they get: the queue of waiting chunks, and the batch
//! lent to the consumer until it has yielded it.

use std::collections::VecDeque;
use std::mem;
use std::time::Instant;

use crate::chunk::Chunk;

/// A chunk waiting for the consumer, and the ids it covers.
pub(crate) struct Queued<T> {
    pub(crate) chunk: T,
    /// The id of the first chunk merged into this one.
    pub(crate) first: u64,
    /// The id of the last chunk merged into this one.
    pub(crate) last: u64,
    /// The byte length it was counted at.
    len: usize,
    /// When it entered the buffer, if the gate stamps its events.
    pub(crate) enqueued_at: Option<Instant>,
}

impl<T> Queued<T> {
    /// The byte length it is counted at against the bounds.
    pub(crate) fn byte_len(&self) -> usize {
        self.len
    }
}

/// Waiting chunks: the queue, and the consumer's batch.
pub(crate) type Batch<T> = VecDeque<Queued<T>>;

/// What the gate holds: the chunks waiting in the queue, plus the batch lent to the consumer
/// and not yet yielded; and the id the next accepted chunk gets.
pub(crate) struct Queue<T> {
    /// Chunks waiting for the consumer.
    waiting: Batch<T>,
    /// Sum of the lengths in `waiting`.
    bytes: usize,
    /// The consumer's totals once it has yielded its current batch: what is lent to the
    /// consumer and still counts against the bounds is the difference.
    lent_until: (u64, u64),
    /// The id the next accepted chunk gets.
    next_id: u64,
}

impl<T: Chunk> Queue<T> {
    /// An empty queue whose first chunk gets `first_id`.
    pub(crate) fn new(first_id: u64) -> Self {
        Queue {
            // Grown on demand: a queue preallocated to `max_events` cost every stream
            // max_events x size_of::<Queued<T>>() (5.6 KB for sim's chunks) for room that
            // only a stream whose consumer falls behind ever uses.
            waiting: VecDeque::new(),
            bytes: 0,
            lent_until: (0, 0),
            next_id: first_id,
        }
    }

    /// The id the next accepted chunk gets.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id
    }

    /// How many events wait in the queue (not counting the consumer's batch).
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Events and bytes the gate holds, given the consumer's totals (`delivered`) read once:
    /// waiting, plus lent to the consumer and not yet yielded.
    pub(crate) fn held(&self, (events, bytes): (u64, u64)) -> (usize, usize) {
        let (lent_events, lent_bytes) = self.lent_until;
        (
            self.waiting.len() + lent_events.saturating_sub(events) as usize,
            self.bytes + lent_bytes.saturating_sub(bytes) as usize,
        )
    }

    /// Queues `chunk`, counted at `len` bytes, as an event of its own with the next id.
    pub(crate) fn push(&mut self, chunk: T, len: usize, enqueued_at: Option<Instant>) {
        let id = self.next_id;
        self.waiting.push_back(Queued {
            chunk,
            first: id,
            last: id,
            len,
            enqueued_at,
        });
        self.bytes += len;
        self.advance();
    }

    /// Merges `chunk` into the newest waiting event, which then covers its id too; returns the
    /// event's byte length before and after. Hands `chunk` back when nothing waits (the
    /// consumer's batch is already on its way out) or the merge refuses. The merged event keeps
    /// the older stamp: it has waited since then.
    pub(crate) fn merge(&mut self, chunk: T) -> Result<(usize, usize), T> {
        let id = self.next_id;
        let Some(newest) = self.waiting.back_mut() else {
            return Err(chunk);
        };
        newest.chunk.merge(chunk)?;
        newest.last = id;
        let merged_len = newest.chunk.byte_len();
        let old_len = mem::replace(&mut newest.len, merged_len);
        self.bytes = self.bytes - old_len + merged_len;
        self.advance();
        Ok((old_len, merged_len))
    }

    /// The next chunk's id. Saturates rather than overflow (a panic under the lock) from an
    /// absurd first id.
    fn advance(&mut self) {
        self.next_id = self.next_id.saturating_add(1);
    }

    /// Lends every waiting chunk to the consumer, whose `batch` is empty and whose totals are
    /// `delivered`: they count against the bounds until it has yielded them.
    pub(crate) fn lend(&mut self, batch: &mut Batch<T>, (events, bytes): (u64, u64)) {
        debug_assert!(batch.is_empty());
        mem::swap(&mut self.waiting, batch);
        self.lent_until = (
            events + batch.len() as u64,
            bytes + mem::take(&mut self.bytes) as u64,
        );
    }

    /// The consumer is gone (its totals are `delivered`): takes every waiting chunk and stops
    /// counting what was lent. Returns the chunks, to drop outside the lock, and the bytes the
    /// gate held until now.
    pub(crate) fn clear(&mut self, delivered: (u64, u64)) -> (Batch<T>, usize) {
        let (_, held_bytes) = self.held(delivered);
        let waiting = mem::take(&mut self.waiting);
        self.bytes = 0;
        self.lent_until = delivered;
        (waiting, held_bytes)
    }
}
