//! The bounded buffer between a generator and its consumer.
//!
//! A single-producer, single-consumer queue bounded by events *and* bytes, with in-place merging
//! for the `Coalesce` policy and a set-once end.
//!
//! One mutex guards the queue, the wakers, the end and the per-stream counters: a send takes it
//! once. The consumer takes it only when its own batch is empty, and then swaps *every* waiting
//! chunk into its batch at once, so a consumer that is behind drains a run of events per lock.
//! The batch stays counted against the bounds until the consumer has yielded it, so what the
//! gate holds never exceeds them; the consumer publishes its progress through two counters it
//! alone writes, which keeps the stats and the slow-consumer clock exact per event.
//!
//! No foreign code runs under the lock except [`Chunk::merge`]. Built on [`crate::sync`] so the
//! same code is model-checked under loom.

use std::collections::VecDeque;
use std::mem;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use super::end::{BoxError, EndReason, GateError};
use super::stats::GateStats;
use crate::chunk::Chunk;
use crate::sync::{AtomicU64, Mutex, Ordering, lock};

/// Why [`Buffer::try_push`] handed a chunk back.
pub(crate) enum Refused<T> {
    /// No room: the consumer is behind. `takes` is how many events the consumer had taken when
    /// the buffer was found full (a slow-consumer deadline restarts when it moves).
    Full { chunk: T, takes: u64 },
    /// The stream has ended; nothing more will be delivered.
    Ended(T),
}

/// A waiting chunk.
pub(crate) struct Entry<T> {
    pub(crate) chunk: T,
    /// The byte length it was counted at.
    len: usize,
    /// When it entered the buffer, if the gate stamps its events.
    pub(crate) enqueued_at: Option<Instant>,
}

/// Waiting chunks: the queue, and the consumer's batch.
pub(crate) type Batch<T> = VecDeque<Entry<T>>;

/// Shared by the generator's sender, the consumer, the gate's task and every handle.
pub(crate) struct Buffer<T> {
    max_events: usize,
    max_bytes: usize,
    state: Mutex<State<T>>,
    delivered: Delivered,
}

/// What the consumer has yielded, in total. Written only by the consumer, read by anyone: an
/// out-of-date read sees less delivered, which only makes the bounds stricter.
#[derive(Default)]
struct Delivered {
    events: AtomicU64,
    bytes: AtomicU64,
}

struct State<T> {
    /// Chunks waiting for the consumer.
    queue: Batch<T>,
    /// Sum of the lengths in `queue`.
    bytes: usize,
    /// The `delivered` totals once the consumer has yielded its current batch: what is lent to
    /// the consumer and still counts against the bounds is the difference.
    lent_until: (u64, u64),
    /// The first end, set once.
    end: Option<(EndReason, Option<GateError>)>,
    /// The consumer has been given the end (or was dropped): the stream yields nothing more.
    end_seen: bool,
    consumer_gone: bool,
    rx_waker: Option<Waker>,
    tx_waker: Option<Waker>,
    release_wakers: Vec<Waker>,
    stats: GateStats,
    ended_at: Option<Instant>,
}

impl<T: Chunk> Buffer<T> {
    /// A buffer holding at most `max_events` events and `max_bytes` bytes (one larger chunk is
    /// admitted into an empty buffer). Both bounds are at least 1.
    pub(crate) fn new(max_events: usize, max_bytes: usize) -> Self {
        debug_assert!(max_events > 0 && max_bytes > 0);
        Buffer {
            max_events,
            max_bytes,
            state: Mutex::new(State {
                queue: VecDeque::with_capacity(max_events.min(1024)),
                bytes: 0,
                lent_until: (0, 0),
                end: None,
                end_seen: false,
                consumer_gone: false,
                rx_waker: None,
                tx_waker: None,
                release_wakers: Vec::new(),
                stats: GateStats::default(),
                ended_at: None,
            }),
            delivered: Delivered::default(),
        }
    }

    /// Queues `chunk`, or with `coalesce` merges it into the newest waiting chunk when the
    /// buffer is full by events and the merged bytes still fit. When it is refused as
    /// [`Refused::Full`] and `waker` is given, the waker is woken once room may have appeared.
    pub(crate) fn try_push(
        &self,
        chunk: T,
        enqueued_at: Option<Instant>,
        coalesce: bool,
        waker: Option<&Waker>,
    ) -> Result<(), Refused<T>> {
        let len = chunk.byte_len();
        let mut state = lock(&self.state);
        if state.end.is_some() {
            state.stats.chunks_after_end += 1;
            return Err(Refused::Ended(chunk));
        }
        let (events, bytes) = self.held(&state);
        let fits_bytes = bytes.saturating_add(len) <= self.max_bytes;
        let refused = if events == 0 || (events < self.max_events && fits_bytes) {
            state.queue.push_back(Entry {
                chunk,
                len,
                enqueued_at,
            });
            state.bytes += len;
            state.stats.chunks_sent += 1;
            state.stats.bytes_sent += len as u64;
            state.stats.peak_buffered_events = state.stats.peak_buffered_events.max(events + 1);
            state.stats.peak_buffered_bytes = state.stats.peak_buffered_bytes.max(bytes + len);
            None
        } else if let Some(newest) = state.queue.back_mut().filter(|_| coalesce && fits_bytes) {
            // Only a chunk still in the queue can absorb more: the consumer's batch is already
            // on its way out. The merged event keeps the older stamp: it has waited since then.
            match newest.chunk.merge(chunk) {
                Ok(()) => {
                    let merged_len = newest.chunk.byte_len();
                    let old_len = mem::replace(&mut newest.len, merged_len);
                    state.bytes = state.bytes - old_len + merged_len;
                    state.stats.chunks_merged += 1;
                    state.stats.bytes_sent += len as u64;
                    None
                }
                Err(chunk) => Some(chunk),
            }
        } else {
            Some(chunk)
        };
        match refused {
            None => {
                let rx = state.rx_waker.take();
                drop(state);
                if let Some(rx) = rx {
                    rx.wake();
                }
                Ok(())
            }
            Some(chunk) => {
                if let Some(waker) = waker {
                    register(&mut state.tx_waker, waker);
                }
                Err(Refused::Full {
                    chunk,
                    takes: self.delivered.events.load(Ordering::Relaxed),
                })
            }
        }
    }

    /// Hands the consumer its next chunk: from `batch` without a lock while it lasts, otherwise
    /// by swapping every waiting chunk into `batch` under one lock. At the end it yields the
    /// end (as an error unless the stream completed) once, then `None` for ever.
    pub(crate) fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        batch: &mut Batch<T>,
    ) -> Poll<Option<Result<Entry<T>, GateError>>> {
        if let Some(chunk) = self.yield_from(batch) {
            return Poll::Ready(Some(Ok(chunk)));
        }
        let mut state = lock(&self.state);
        // The previous batch is all yielded: the room it held is free, and the generator may
        // be waiting for it.
        let tx = state.tx_waker.take();
        mem::swap(&mut state.queue, batch);
        let (events, bytes) = self.delivered();
        state.lent_until = (
            events + batch.len() as u64,
            bytes + mem::take(&mut state.bytes) as u64,
        );
        // What to yield, decided under the lock; the chunk itself is popped after it.
        let end = if !batch.is_empty() {
            None
        } else if state.end_seen {
            Some(Poll::Ready(None))
        } else if let Some((reason, error)) = &state.end {
            debug_assert!(error.is_some() || *reason == EndReason::Completed);
            let error = error.clone();
            state.end_seen = true;
            Some(Poll::Ready(error.map(Err)))
        } else {
            register(&mut state.rx_waker, cx.waker());
            Some(Poll::Pending)
        };
        drop(state);
        if let Some(tx) = tx {
            tx.wake();
        }
        end.unwrap_or_else(|| Poll::Ready(self.yield_from(batch).map(Ok)))
    }

    /// Pops the batch's next chunk and publishes the consumer's progress.
    fn yield_from(&self, batch: &mut Batch<T>) -> Option<Entry<T>> {
        let entry = batch.pop_front()?;
        let len = entry.len;
        // Only the consumer writes these, so a load and a store (not a read-modify-write) will
        // do; `Relaxed`, because they order no other memory.
        let delivered = &self.delivered;
        let events = delivered.events.load(Ordering::Relaxed);
        delivered.events.store(events + 1, Ordering::Relaxed);
        let bytes = delivered.bytes.load(Ordering::Relaxed);
        delivered.bytes.store(bytes + len as u64, Ordering::Relaxed);
        Some(entry)
    }

    /// The consumer's totals: events and bytes yielded.
    fn delivered(&self) -> (u64, u64) {
        (
            self.delivered.events.load(Ordering::Relaxed),
            self.delivered.bytes.load(Ordering::Relaxed),
        )
    }

    /// Events and bytes the gate holds: waiting, plus lent to the consumer and not yet yielded.
    fn held(&self, state: &State<T>) -> (usize, usize) {
        let (events, bytes) = self.delivered();
        let (lent_events, lent_bytes) = state.lent_until;
        (
            state.queue.len() + lent_events.saturating_sub(events) as usize,
            state.bytes + lent_bytes.saturating_sub(bytes) as usize,
        )
    }

    /// Ends the stream for `reason` unless it has already ended, and returns the reason that
    /// stands. The consumer still receives every waiting chunk before the end.
    pub(crate) fn end(&self, reason: EndReason, source: Option<BoxError>) -> EndReason {
        let mut state = lock(&self.state);
        let (reason, wakers) = state.end(reason, source);
        drop(state);
        wakers.into_iter().flatten().for_each(Waker::wake);
        reason
    }

    /// The consumer is gone, leaving `batch` unread: drops what it will never read and ends the
    /// stream as cancelled (unless it had already ended). Returns the reason that stands.
    pub(crate) fn close_consumer(&self, batch: Batch<T>) -> EndReason {
        let mut state = lock(&self.state);
        state.consumer_gone = true;
        state.end_seen = true;
        // Ended under the same lock that empties the queue, so no chunk can slip in between.
        let (reason, wakers) = state.end(EndReason::Cancelled, None);
        state.stats.events_undelivered += (state.queue.len() + batch.len()) as u64;
        let undelivered = mem::take(&mut state.queue);
        state.bytes = 0;
        state.lent_until = self.delivered();
        drop(state);
        // Dropping chunks runs their destructors: never under the lock.
        drop((undelivered, batch));
        wakers.into_iter().flatten().for_each(Waker::wake);
        reason
    }

    /// Records that the release hook has run and wakes everyone waiting for it.
    pub(crate) fn mark_released(&self) {
        let mut state = lock(&self.state);
        let now = Instant::now();
        state.stats.released = true;
        state.stats.end_to_release = state.ended_at.map(|at| now.saturating_duration_since(at));
        let wakers = mem::take(&mut state.release_wakers);
        drop(state);
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Ready once the release hook has run.
    pub(crate) fn poll_released(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = lock(&self.state);
        if state.stats.released {
            return Poll::Ready(());
        }
        if !state.release_wakers.iter().any(|w| w.will_wake(cx.waker())) {
            state.release_wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Whether the consumer has seen the end (or is gone): it will yield nothing more once its
    /// batch is empty.
    pub(crate) fn is_terminated(&self) -> bool {
        lock(&self.state).end_seen
    }

    /// The reason the stream ended, once it has.
    pub(crate) fn end_reason(&self) -> Option<EndReason> {
        lock(&self.state).end.as_ref().map(|(reason, _)| *reason)
    }

    /// A snapshot of the counters.
    pub(crate) fn stats(&self) -> GateStats {
        let state = lock(&self.state);
        let (buffered_events, buffered_bytes) = self.held(&state);
        let (events_delivered, bytes_delivered) = self.delivered();
        GateStats {
            events_delivered,
            bytes_delivered,
            buffered_events,
            buffered_bytes,
            end_reason: state.end.as_ref().map(|(reason, _)| *reason),
            ..state.stats.clone()
        }
    }
}

impl<T> State<T> {
    /// Sets the end unless one stands; returns the reason that stands and the wakers to wake
    /// once the lock is released.
    fn end(
        &mut self,
        reason: EndReason,
        source: Option<BoxError>,
    ) -> (EndReason, [Option<Waker>; 2]) {
        if let Some((first, _)) = &self.end {
            return (*first, [None, None]);
        }
        // A consumer that is gone cannot be told the generator completed: that stream was
        // cancelled, whatever the generator did next.
        let reason = if self.consumer_gone && reason == EndReason::Completed {
            EndReason::Cancelled
        } else {
            reason
        };
        let error = (reason != EndReason::Completed).then(|| GateError::new(reason, source));
        self.end = Some((reason, error));
        self.ended_at = Some(Instant::now());
        (reason, [self.rx_waker.take(), self.tx_waker.take()])
    }
}

/// Stores `waker` in `slot` unless the stored one would already wake the same task.
fn register(slot: &mut Option<Waker>, waker: &Waker) {
    match slot {
        Some(stored) if stored.will_wake(waker) => {}
        _ => *slot = Some(waker.clone()),
    }
}
