//! The bounded buffer between a generator and its consumer.
//!
//! A single-producer, single-consumer queue bounded by events *and* bytes, with in-place merging
//! for the `Coalesce` policy and a set-once end. One mutex guards the queue, the wakers, the end
//! and the per-stream counters, so every send and every receive takes the lock exactly once and
//! a counter costs an add, not an atomic. No foreign code runs under the lock except
//! [`Chunk::merge`]. Built on [`crate::sync`] so the same code is model-checked under loom.

use std::collections::VecDeque;
use std::mem;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use super::end::{BoxError, EndReason, GateError};
use super::stats::GateStats;
use crate::chunk::Chunk;
use crate::sync::{Mutex, lock};

/// Why [`Buffer::try_push`] handed a chunk back.
pub(crate) enum Refused<T> {
    /// No room: the consumer is behind. `takes` is how many events the consumer had taken when
    /// the buffer was found full (a slow-consumer deadline restarts when it moves).
    Full { chunk: T, takes: u64 },
    /// The stream has ended; nothing more will be delivered.
    Ended(T),
}

/// Shared by the generator's sender, the consumer, the gate's task and every handle.
pub(crate) struct Buffer<T> {
    max_events: usize,
    max_bytes: usize,
    state: Mutex<State<T>>,
}

struct State<T> {
    /// Waiting chunks with the byte length each was counted at.
    queue: VecDeque<(T, usize)>,
    /// Sum of the lengths in `queue`.
    bytes: usize,
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
                end: None,
                end_seen: false,
                consumer_gone: false,
                rx_waker: None,
                tx_waker: None,
                release_wakers: Vec::new(),
                stats: GateStats::default(),
                ended_at: None,
            }),
        }
    }

    /// Queues `chunk`, or with `coalesce` merges it into the newest waiting chunk when the
    /// buffer is full by events and the merged bytes still fit. When it is refused as
    /// [`Refused::Full`] and `waker` is given, the waker is woken once room may have appeared.
    pub(crate) fn try_push(
        &self,
        chunk: T,
        coalesce: bool,
        waker: Option<&Waker>,
    ) -> Result<(), Refused<T>> {
        let len = chunk.byte_len();
        let mut state = lock(&self.state);
        if state.end.is_some() {
            state.stats.chunks_after_end += 1;
            return Err(Refused::Ended(chunk));
        }
        let fits_bytes = state.bytes.saturating_add(len) <= self.max_bytes;
        let chunk = if state.queue.is_empty() || (state.queue.len() < self.max_events && fits_bytes)
        {
            state.queue.push_back((chunk, len));
            state.stats.chunks_sent += 1;
            chunk_admitted(&mut state, len);
            None
        } else if coalesce && fits_bytes {
            let (newest, newest_len) = state.queue.back_mut().expect("a full buffer is not empty");
            match newest.merge(chunk) {
                Ok(()) => {
                    let merged_len = newest.byte_len();
                    let old_len = mem::replace(newest_len, merged_len);
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
        match chunk {
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
                    takes: state.stats.events_delivered,
                })
            }
        }
    }

    /// Takes the oldest waiting chunk; at the end, the end (as an error unless the stream
    /// completed) once, then `None` for ever.
    pub(crate) fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Option<Result<T, GateError>>> {
        let mut state = lock(&self.state);
        if let Some((chunk, len)) = state.queue.pop_front() {
            state.bytes -= len;
            state.stats.events_delivered += 1;
            state.stats.bytes_delivered += len as u64;
            let tx = state.tx_waker.take();
            drop(state);
            if let Some(tx) = tx {
                tx.wake();
            }
            return Poll::Ready(Some(Ok(chunk)));
        }
        if state.end_seen {
            return Poll::Ready(None);
        }
        match &state.end {
            Some((reason, error)) => {
                let item = match error {
                    Some(error) => Some(Err(error.clone())),
                    None => {
                        debug_assert_eq!(*reason, EndReason::Completed);
                        None
                    }
                };
                state.end_seen = true;
                Poll::Ready(item)
            }
            None => {
                register(&mut state.rx_waker, cx.waker());
                Poll::Pending
            }
        }
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

    /// The consumer is gone: drops what it will never read and ends the stream as cancelled
    /// (unless it had already ended). Returns the reason that stands.
    pub(crate) fn close_consumer(&self) -> EndReason {
        let mut state = lock(&self.state);
        state.consumer_gone = true;
        state.end_seen = true;
        // Ended under the same lock that empties the queue, so no chunk can slip in between.
        let (reason, wakers) = state.end(EndReason::Cancelled, None);
        state.stats.events_undelivered += state.queue.len() as u64;
        let undelivered = mem::take(&mut state.queue);
        state.bytes = 0;
        drop(state);
        // Dropping chunks runs their destructors: never under the lock.
        drop(undelivered);
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

    /// How many events are waiting.
    pub(crate) fn buffered_events(&self) -> usize {
        lock(&self.state).queue.len()
    }

    /// Whether the consumer has seen the end (or is gone): it will yield nothing more.
    pub(crate) fn is_terminated(&self) -> bool {
        let state = lock(&self.state);
        state.end_seen && state.queue.is_empty()
    }

    /// The reason the stream ended, once it has.
    pub(crate) fn end_reason(&self) -> Option<EndReason> {
        lock(&self.state).end.as_ref().map(|(reason, _)| *reason)
    }

    /// A snapshot of the counters.
    pub(crate) fn stats(&self) -> GateStats {
        let state = lock(&self.state);
        GateStats {
            buffered_events: state.queue.len(),
            buffered_bytes: state.bytes,
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

/// Counts `len` admitted bytes and the buffer's new high-water marks.
fn chunk_admitted<T>(state: &mut State<T>, len: usize) {
    state.bytes += len;
    state.stats.bytes_sent += len as u64;
    state.stats.peak_buffered_events = state.stats.peak_buffered_events.max(state.queue.len());
    state.stats.peak_buffered_bytes = state.stats.peak_buffered_bytes.max(state.bytes);
}

/// Stores `waker` in `slot` unless the stored one would already wake the same task.
fn register(slot: &mut Option<Waker>, waker: &Waker) {
    match slot {
        Some(stored) if stored.will_wake(waker) => {}
        _ => *slot = Some(waker.clone()),
    }
}
