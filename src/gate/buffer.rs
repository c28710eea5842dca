//! The bounded buffer between a generator and its consumer.
//!
//! A single-producer, single-consumer queue bounded by events *and* bytes, with in-place merging
//! for the `Coalesce` policy, event ids counted at `send`, a set-once end, and the state of the
//! slow-consumer clock that the gate's task keeps.
//!
//! One mutex guards the queue, the wakers, the end and the per-stream counters: a send takes it
//! once. The consumer takes it only when its own batch is empty, and then swaps *every* waiting
//! chunk into its batch at once, so a consumer that is behind drains a run of events per lock.
//! The batch stays counted against the bounds until the consumer has yielded it, so what the
//! gate holds never exceeds them; the consumer publishes its progress through two counters it
//! alone writes, which keeps the stats exact per event and lets it wake a sender that waits for
//! room the moment it yields an event.
//!
//! No foreign code runs under the lock except [`Chunk::merge`]. Built on [`crate::sync`] so the
//! same code is model-checked under loom.

use std::collections::VecDeque;
use std::mem;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use tokio::time::Instant as Clock;
use tokio_util::sync::CancellationToken;

use super::budget::ByteBudget;
use super::error::{BoxError, GateError};
use super::policy::Policy;
use super::stats::GateStats;
use crate::chunk::Chunk;
use crate::end::EndReason;
use crate::sync::{AtomicBool, AtomicU64, Mutex, Ordering, lock};

/// Why [`Buffer::try_push`] handed a chunk back.
pub(crate) enum Refused<T> {
    /// No room: the consumer is behind.
    Full(T),
    /// The stream has ended (or its producer has finished); nothing more will be delivered.
    Ended(T),
}

/// A waiting chunk and the ids it covers.
pub(crate) struct Entry<T> {
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

/// Waiting chunks: the queue, and the consumer's batch.
pub(crate) type Batch<T> = VecDeque<Entry<T>>;

/// How the buffer is set up: bounds, policy, group budget.
pub(crate) struct Config {
    pub(crate) max_events: usize,
    pub(crate) max_bytes: usize,
    pub(crate) policy: Policy,
    pub(crate) first_id: u64,
    pub(crate) budget: Option<std::sync::Arc<ByteBudget>>,
}

/// Shared by the generator's sender, the consumer, the gate's task and every handle.
pub(crate) struct Buffer<T> {
    config: Config,
    /// Cancelled at every end, right after it is recorded: the generator's stop signal.
    token: CancellationToken,
    state: Mutex<State<T>>,
    delivered: Delivered,
}

/// What the consumer has yielded, in total. Written only by the consumer, read by anyone: an
/// out-of-date read sees less delivered, which only makes the bounds stricter.
#[derive(Default)]
struct Delivered {
    events: AtomicU64,
    bytes: AtomicU64,
    /// A sender waits for room: the consumer wakes it when it yields an event.
    sender_waits: AtomicBool,
}

/// The slow-consumer clock: armed when a chunk finds the buffer full (or a finished generator
/// leaves events waiting), disarmed when a chunk is admitted.
///
/// Times here are tokio's (`Clock`), so the gate's timers agree with them when a test pauses
/// time.
#[derive(Clone, Copy)]
struct Stall {
    since: Clock,
    /// The consumer's take count when the clock started.
    takes: u64,
}

struct State<T> {
    /// Chunks waiting for the consumer.
    queue: Batch<T>,
    /// Sum of the lengths in `queue`.
    bytes: usize,
    /// The `delivered` totals once the consumer has yielded its current batch: what is lent to
    /// the consumer and still counts against the bounds is the difference.
    lent_until: (u64, u64),
    /// The id the next accepted chunk gets.
    next_id: u64,
    /// The producer has finished: once the consumer has taken everything, the stream completed.
    finished: bool,
    /// The first end, set once.
    end: Option<(EndReason, Option<GateError>)>,
    /// The consumer has been given the end (or was dropped): the stream yields nothing more.
    end_seen: bool,
    stall: Option<Stall>,
    /// When the consumer last took an event while a sender waited for room.
    last_take: Option<Clock>,
    /// The byte length of the chunk last refused as full (0 once one is admitted): what
    /// "room" means for `poll_room` and the stall clock.
    wanted: usize,
    /// The gate's task holds a timer for the stall clock: a re-armed clock needs no wake-up.
    stall_watched: bool,
    /// The producer's work has stopped: the engine dropped its sender.
    producer_stopped: bool,
    /// A spawned generator returned `Ok` ...
    generator_returned: bool,
    /// ... and its sender is still alive (moved to another task): not finished until it goes.
    task_sender_alive: bool,
    rx_waker: Option<Waker>,
    tx_waker: Option<Waker>,
    task_waker: Option<Waker>,
    release_wakers: Vec<Waker>,
    stats: GateStats,
    ended_at: Option<Clock>,
}

/// What the gate's task must do next, from [`Buffer::poll_task`].
pub(crate) struct TaskView {
    /// When the stream ended, if it has.
    pub(crate) ended_at: Option<Clock>,
    /// When the slow-consumer clock runs out, if it runs.
    pub(crate) stall_deadline: Option<Clock>,
    /// Whether the producer's work has stopped (see [`Buffer::producer_stopped`]).
    pub(crate) producer_stopped: bool,
}

impl<T: Chunk> Buffer<T> {
    /// A buffer as `config` says. Both bounds are at least 1.
    pub(crate) fn new(config: Config, token: CancellationToken) -> Self {
        debug_assert!(config.max_events > 0 && config.max_bytes > 0);
        let first_id = config.first_id;
        let stats = GateStats {
            next_id: first_id,
            ..GateStats::default()
        };
        Buffer {
            state: Mutex::new(State {
                // Grown on demand: a queue preallocated to `max_events` cost every stream
                // max_events x size_of::<Entry<T>>() (5.6 KB for sim's chunks) for room that
                // only a stream whose consumer falls behind ever uses.
                queue: VecDeque::new(),
                bytes: 0,
                lent_until: (0, 0),
                next_id: first_id,
                finished: false,
                end: None,
                end_seen: false,
                stall: None,
                last_take: None,
                wanted: 0,
                stall_watched: false,
                producer_stopped: false,
                generator_returned: false,
                task_sender_alive: true,
                rx_waker: None,
                tx_waker: None,
                task_waker: None,
                release_wakers: Vec::new(),
                stats,
                ended_at: None,
            }),
            config,
            token,
            delivered: Delivered::default(),
        }
    }

    /// The stream's stop signal, cancelled at every end.
    pub(crate) fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Queues `chunk`, or with `Coalesce` merges it into the newest waiting chunk when the
    /// buffer is full by events and the merged bytes still fit. A chunk refused as
    /// [`Refused::Full`] starts the slow-consumer clock; with `waker`, the sender is woken as
    /// soon as the consumer makes room (or the stream ends). A chunk refused as
    /// [`Refused::Ended`] is counted as wasted.
    pub(crate) fn try_push(
        &self,
        chunk: T,
        enqueued_at: Option<Instant>,
        waker: Option<&Waker>,
    ) -> Result<(), Refused<T>> {
        let len = chunk.byte_len();
        let mut state = lock(&self.state);
        if state.end.is_some() || state.finished {
            state.stats.chunks_after_end += 1;
            return Err(Refused::Ended(chunk));
        }
        let refused = match self.admit(&mut state, chunk, len, enqueued_at) {
            Ok(()) => {
                state.stall = None;
                state.wanted = 0;
                let rx = state.rx_waker.take();
                drop(state);
                if let Some(rx) = rx {
                    rx.wake();
                }
                return Ok(());
            }
            Err(chunk) => chunk,
        };
        state.wanted = len;
        let task = self.start_stall(&mut state);
        if let Some(waker) = waker {
            register(&mut state.tx_waker, waker);
            self.delivered.sender_waits.store(true, Ordering::Relaxed);
            let (events, bytes) = self.held_fresh(&state);
            // The same test as `admit` (the group's budget included): a chunk refused by the
            // budget alone must wait for its consumer, not wake itself at once for ever.
            if self.fits(events, bytes, len) {
                // Room appeared while the flag was being raised: try again at once.
                waker.wake_by_ref();
            }
        }
        drop(state);
        if let Some(task) = task {
            task.wake();
        }
        Err(Refused::Full(refused))
    }

    /// Puts `chunk` in the queue (or merges it) if the bounds and the group's budget allow;
    /// hands it back otherwise.
    fn admit(
        &self,
        state: &mut State<T>,
        chunk: T,
        len: usize,
        enqueued_at: Option<Instant>,
    ) -> Result<(), T> {
        let (events, bytes) = self.held(state);
        let fits_bytes = bytes.saturating_add(len) <= self.config.max_bytes
            && self
                .config
                .budget
                .as_ref()
                .is_none_or(|budget| budget.admits(bytes, len));
        let id = state.next_id;
        if events == 0 || (events < self.config.max_events && fits_bytes) {
            state.queue.push_back(Entry {
                chunk,
                first: id,
                last: id,
                len,
                enqueued_at,
            });
            state.bytes += len;
            state.stats.chunks_sent += 1;
            state.stats.peak_buffered_events = state.stats.peak_buffered_events.max(events + 1);
            state.stats.peak_buffered_bytes = state.stats.peak_buffered_bytes.max(bytes + len);
            self.accepted(state, len, (0, len));
            return Ok(());
        }
        if !(self.config.policy.coalesces() && fits_bytes) {
            return Err(chunk);
        }
        // Only a chunk still in the queue can absorb more: the consumer's batch is already on
        // its way out. The merged event keeps the older stamp: it has waited since then.
        let Some(newest) = state.queue.back_mut() else {
            return Err(chunk);
        };
        newest.chunk.merge(chunk)?;
        newest.last = id;
        let merged_len = newest.chunk.byte_len();
        let old_len = mem::replace(&mut newest.len, merged_len);
        state.bytes = state.bytes - old_len + merged_len;
        state.stats.chunks_merged += 1;
        self.accepted(state, len, (old_len, merged_len));
        Ok(())
    }

    /// Counts an accepted chunk of `len` bytes that changed what the buffer holds from
    /// `held.0` to `held.1` bytes (a new event: from 0 to `len`).
    fn accepted(&self, state: &mut State<T>, len: usize, held: (usize, usize)) {
        // Saturates rather than overflow (a panic under the lock) from an absurd first id.
        state.next_id = state.next_id.saturating_add(1);
        state.stats.next_id = state.next_id;
        state.stats.bytes_sent += len as u64;
        if let Some(budget) = &self.config.budget {
            budget.add(held.1);
            budget.sub(held.0);
        }
    }

    /// Starts the slow-consumer clock unless it runs or the policy has none; returns the
    /// gate's task to wake when it holds no timer for it yet.
    fn start_stall(&self, state: &mut State<T>) -> Option<Waker> {
        if state.stall.is_some() || self.config.policy.deadline().is_none() {
            return None;
        }
        state.stall = Some(Stall {
            since: Clock::now(),
            takes: self.delivered.events.load(Ordering::Relaxed),
        });
        if state.stall_watched {
            None
        } else {
            state.task_waker.take()
        }
    }

    /// Ready when a chunk would be admitted as an event of its own (or the stream has ended);
    /// otherwise starts the slow-consumer clock and registers `cx` for room.
    pub(crate) fn poll_room(&self, cx: &mut Context<'_>) -> Poll<bool> {
        let mut state = lock(&self.state);
        if state.end.is_some() || state.finished {
            return Poll::Ready(false);
        }
        let (events, bytes) = self.held(&state);
        // Room for the chunk last refused (at least one byte), so that a `try_send` of it
        // after `ready` does not find the buffer full again.
        let need = state.wanted.max(1);
        let has_room = |events: usize, bytes: usize| self.fits(events, bytes, need);
        if has_room(events, bytes) {
            return Poll::Ready(true);
        }
        let task = self.start_stall(&mut state);
        register(&mut state.tx_waker, cx.waker());
        self.delivered.sender_waits.store(true, Ordering::Relaxed);
        let (events, bytes) = self.held_fresh(&state);
        let ready = has_room(events, bytes);
        drop(state);
        if let Some(task) = task {
            task.wake();
        }
        if ready {
            Poll::Ready(true)
        } else {
            Poll::Pending
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
        let mut wakers = [tx, None];
        let mut completed = false;
        // What to yield, decided under the lock; the chunk itself is popped after it.
        let end = if !batch.is_empty() {
            None
        } else if state.end_seen {
            Some(Poll::Ready(None))
        } else if state.end.is_none() && state.finished {
            // The producer finished and the consumer has everything: this is completion.
            let (_, mut woken) = self.end_locked(&mut state, EndReason::Completed, None);
            wakers[1] = woken[2].take();
            state.end_seen = true;
            completed = true;
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
        // Almost always empty: tested inline rather than iterated.
        let [tx, task] = wakers;
        if let Some(tx) = tx {
            tx.wake();
        }
        if let Some(task) = task {
            task.wake();
        }
        if completed {
            // Every end cancels the token, completion too: a generator still running
            // (finished through `Sender::finish`) is told.
            self.token.cancel();
        }
        end.unwrap_or_else(|| Poll::Ready(self.yield_from(batch).map(Ok)))
    }

    /// Pops the batch's next chunk, publishes the consumer's progress, and wakes a sender that
    /// waits for the room this makes.
    fn yield_from(&self, batch: &mut Batch<T>) -> Option<Entry<T>> {
        let entry = batch.pop_front()?;
        let len = entry.len;
        // Only the consumer writes these, so a load and a store would do for the bytes. The
        // event count is a read-modify-write: the consumer's half of the handshake with a
        // sender that waits for room, which raises its flag and then reads this count with a
        // read-modify-write too (`held_fresh`). The two read-modify-writes are ordered: if the
        // sender's came first, this one acquires its flag; if this one came first, the sender
        // reads this take (and the bytes stored before it). So either the sender sees the room
        // or the consumer sees the flag and wakes it.
        let delivered = &self.delivered;
        let bytes = delivered.bytes.load(Ordering::Relaxed);
        delivered.bytes.store(bytes + len as u64, Ordering::Relaxed);
        delivered.events.fetch_add(1, Ordering::AcqRel);
        if let Some(budget) = &self.config.budget {
            budget.sub(len);
        }
        if delivered.sender_waits.load(Ordering::Relaxed) {
            self.wake_sender();
        }
        Some(entry)
    }

    #[cold]
    fn wake_sender(&self) {
        let mut state = lock(&self.state);
        // The sender waits, so the slow-consumer clock runs: it restarts from this take.
        state.last_take = Some(Clock::now());
        self.delivered.sender_waits.store(false, Ordering::Relaxed);
        let tx = state.tx_waker.take();
        drop(state);
        if let Some(tx) = tx {
            tx.wake();
        }
    }

    /// The consumer's totals: events and bytes yielded.
    fn delivered(&self) -> (u64, u64) {
        (
            self.delivered.events.load(Ordering::Relaxed),
            self.delivered.bytes.load(Ordering::Relaxed),
        )
    }

    /// Whether a chunk of `len` bytes would be admitted as an event of its own while the gate
    /// holds `events` and `bytes` (as [`admit`](Buffer::admit) decides).
    fn fits(&self, events: usize, bytes: usize, len: usize) -> bool {
        events == 0
            || (events < self.config.max_events
                && bytes.saturating_add(len) <= self.config.max_bytes
                && self
                    .config
                    .budget
                    .as_ref()
                    .is_none_or(|budget| budget.admits(bytes, len)))
    }

    /// Events and bytes the gate holds: waiting, plus lent to the consumer and not yet yielded.
    fn held(&self, state: &State<T>) -> (usize, usize) {
        Self::held_after(state, self.delivered())
    }

    /// What the gate holds, read after raising the sender's flag: the consumer's count through
    /// a read-modify-write, which sees its latest take (see `yield_from`).
    fn held_fresh(&self, state: &State<T>) -> (usize, usize) {
        let events = self.delivered.events.fetch_add(0, Ordering::AcqRel);
        let bytes = self.delivered.bytes.load(Ordering::Relaxed);
        Self::held_after(state, (events, bytes))
    }

    /// What the gate holds, given the consumer's totals (`delivered`) read once.
    fn held_after(state: &State<T>, (events, bytes): (u64, u64)) -> (usize, usize) {
        let (lent_events, lent_bytes) = state.lent_until;
        (
            state.queue.len() + lent_events.saturating_sub(events) as usize,
            state.bytes + lent_bytes.saturating_sub(bytes) as usize,
        )
    }

    /// Ends the stream for `reason` unless it has already ended, cancels the token, and returns
    /// the reason that stands. The consumer still receives every waiting chunk before the end.
    pub(crate) fn end(&self, reason: EndReason, source: Option<BoxError>) -> EndReason {
        let mut state = lock(&self.state);
        let (reason, wakers) = self.end_locked(&mut state, reason, source);
        drop(state);
        wakers.into_iter().flatten().for_each(Waker::wake);
        self.token.cancel();
        reason
    }

    /// The producer has finished: the stream completes once the consumer has taken every
    /// event. Until then the slow-consumer clock watches the consumer.
    pub(crate) fn finish(&self) {
        let mut state = lock(&self.state);
        let wakers = self.finish_locked(&mut state);
        drop(state);
        wakers.into_iter().flatten().for_each(Waker::wake);
    }

    /// A spawned generator returned `Ok`: the stream finishes once its sender is gone too (a
    /// generator may hand its sender to another task and return).
    pub(crate) fn generator_returned(&self) {
        self.finish_when_both(|state| state.generator_returned = true);
    }

    /// A spawned generator's sender was dropped: if the generator has returned, the stream
    /// finishes.
    pub(crate) fn task_sender_dropped(&self) {
        self.finish_when_both(|state| state.task_sender_alive = false);
    }

    /// Records one of the two (`mark`), and finishes the stream once both have happened.
    fn finish_when_both(&self, mark: impl FnOnce(&mut State<T>)) {
        let mut state = lock(&self.state);
        mark(&mut state);
        let wakers = if state.generator_returned && !state.task_sender_alive {
            self.finish_locked(&mut state)
        } else {
            [None, None]
        };
        drop(state);
        wakers.into_iter().flatten().for_each(Waker::wake);
    }

    /// Marks the stream finished (unless it has ended); returns the wakers to wake.
    fn finish_locked(&self, state: &mut State<T>) -> [Option<Waker>; 2] {
        if state.end.is_some() || state.finished {
            return [None, None];
        }
        state.finished = true;
        let (events, _) = self.held(state);
        let task = if events > 0 {
            self.start_stall(state)
        } else {
            None
        };
        [state.rx_waker.take(), task]
    }

    /// Sets the end unless one stands; returns the reason that stands and the wakers to wake
    /// once the lock is released (consumer, sender, the gate's task).
    fn end_locked(
        &self,
        state: &mut State<T>,
        reason: EndReason,
        source: Option<BoxError>,
    ) -> (EndReason, [Option<Waker>; 3]) {
        if let Some((first, _)) = &state.end {
            return (*first, [None, None, None]);
        }
        let error = (reason != EndReason::Completed).then(|| GateError::new(reason, source));
        state.end = Some((reason, error));
        state.ended_at = Some(Clock::now());
        state.stall = None;
        (
            reason,
            [
                state.rx_waker.take(),
                state.tx_waker.take(),
                state.task_waker.take(),
            ],
        )
    }

    /// The consumer is gone, leaving `batch` unread: drops what it will never read and ends the
    /// stream, as completed if the producer had finished and nothing was left unread, as
    /// consumer-gone otherwise (unless it had already ended). Returns the reason that stands.
    pub(crate) fn close_consumer(&self, batch: Batch<T>) -> EndReason {
        let mut state = lock(&self.state);
        state.end_seen = true;
        let unread = state.queue.len() + batch.len();
        let reason = if state.finished && unread == 0 {
            EndReason::Completed
        } else {
            EndReason::ConsumerGone
        };
        // Ended under the same lock that empties the queue, so no chunk can slip in between.
        let (reason, wakers) = self.end_locked(&mut state, reason, None);
        state.stats.events_undelivered += unread as u64;
        let undelivered = mem::take(&mut state.queue);
        let (_, held_bytes) = self.held(&state);
        if let Some(budget) = &self.config.budget {
            budget.sub(held_bytes);
        }
        state.bytes = 0;
        state.lent_until = self.delivered();
        drop(state);
        // Dropping chunks runs their destructors: never under the lock.
        drop((undelivered, batch));
        wakers.into_iter().flatten().for_each(Waker::wake);
        self.token.cancel();
        reason
    }

    /// For the gate's task: registers `cx` for everything it must act on (the end, the
    /// slow-consumer clock) and says what stands.
    pub(crate) fn poll_task(&self, cx: &mut Context<'_>) -> TaskView {
        let mut state = lock(&self.state);
        register(&mut state.task_waker, cx.waker());
        let stall_deadline = match (state.stall, self.config.policy.deadline()) {
            (Some(stall), Some(deadline)) => Some(stall.since.checked_add(deadline.limit)),
            _ => None,
        };
        // A deadline too far away to represent is no deadline at all.
        let stall_deadline = stall_deadline.flatten();
        state.stall_watched = stall_deadline.is_some();
        TaskView {
            ended_at: state.ended_at,
            stall_deadline,
            producer_stopped: state.producer_stopped,
        }
    }

    /// For the gate's task, when the slow-consumer clock may have run out at `now`: ends the
    /// stream as [`EndReason::SlowConsumer`] if it has, restarts the clock if the policy
    /// forgives a consumer that took something meanwhile.
    pub(crate) fn check_stall(&self, now: Clock) {
        let mut state = lock(&self.state);
        let (Some(stall), Some(deadline)) = (state.stall, self.config.policy.deadline()) else {
            return;
        };
        if stall
            .since
            .checked_add(deadline.limit)
            .is_none_or(|at| now < at)
        {
            return;
        }
        let (events, bytes) = self.held(&state);
        let caught_up = if state.finished {
            // The consumer has every event; only the end is still to be taken.
            events == 0
        } else {
            // The consumer made room and the producer has not used it (an engine that was
            // refused and has not sent since).
            self.fits(events, bytes, state.wanted.max(1))
        };
        if caught_up {
            // The consumer is not the slow one.
            state.stall = None;
            return;
        }
        let takes = self.delivered.events.load(Ordering::Relaxed);
        // A generator that finished waits for its consumer on every policy's terms: the
        // consumer must take something within the limit.
        if (deadline.restarts_on_take || state.finished) && takes != stall.takes {
            // The clock restarts at the last take, when it is known (a sender was waiting),
            // so a reader that took one event and stopped is ended on time.
            let since = state
                .last_take
                .filter(|&at| at > stall.since)
                .unwrap_or(now);
            state.stall = Some(Stall { since, takes });
            if since.checked_add(deadline.limit).is_none_or(|at| now < at) {
                return;
            }
        }
        let (_, wakers) = self.end_locked(&mut state, EndReason::SlowConsumer, None);
        drop(state);
        wakers.into_iter().flatten().for_each(Waker::wake);
        self.token.cancel();
    }

    /// Records that the release hook has run (or timed out) and wakes everyone waiting for it.
    pub(crate) fn mark_released(&self, timed_out: bool) {
        let mut state = lock(&self.state);
        let now = Clock::now();
        state.stats.released = true;
        state.stats.release_timed_out = timed_out;
        state.stats.end_to_release = state.ended_at.map(|at| now.saturating_duration_since(at));
        let wakers = mem::take(&mut state.release_wakers);
        drop(state);
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Records when (and how) the generator's work stopped after the end.
    pub(crate) fn mark_stopped(&self, forced: bool) {
        let mut state = lock(&self.state);
        let now = Clock::now();
        state.stats.stop_forced = forced;
        state.stats.end_to_stop = state.ended_at.map(|at| now.saturating_duration_since(at));
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

    /// Whether a chunk sent now would be refused as ended.
    pub(crate) fn is_closed(&self) -> bool {
        let state = lock(&self.state);
        state.end.is_some() || state.finished
    }

    /// A snapshot of the counters, with `end_to_release` measured to now if the stream has
    /// ended and is not released yet (what the release hook sees).
    pub(crate) fn stats(&self) -> GateStats {
        let state = lock(&self.state);
        // One reading of the consumer's totals for both, so the snapshot adds up while the
        // consumer yields on another thread.
        let (events_delivered, bytes_delivered) = self.delivered();
        let (buffered_events, buffered_bytes) =
            Self::held_after(&state, (events_delivered, bytes_delivered));
        let end_reason = state.end.as_ref().map(|(reason, _)| *reason);
        // After an early end, what still waits is not going to reach the consumer as the
        // stream was meant to.
        let undelivered_now = match end_reason {
            Some(EndReason::Completed) | None => 0,
            Some(_) => buffered_events as u64,
        };
        let end_to_release = match state.stats.end_to_release {
            Some(measured) => Some(measured),
            None => state
                .ended_at
                .map(|at| Clock::now().saturating_duration_since(at)),
        };
        GateStats {
            events_delivered,
            bytes_delivered,
            buffered_events,
            buffered_bytes,
            end_reason,
            events_undelivered: state.stats.events_undelivered + undelivered_now,
            end_to_release,
            ..state.stats.clone()
        }
    }

    /// The producer's work has stopped: the engine let go of a channel gate's sender.
    pub(crate) fn producer_stopped(&self) {
        let mut state = lock(&self.state);
        state.producer_stopped = true;
        let task = state.task_waker.take();
        drop(state);
        if let Some(task) = task {
            task.wake();
        }
    }
}

/// Stores `waker` in `slot` unless the stored one would already wake the same task.
fn register(slot: &mut Option<Waker>, waker: &Waker) {
    match slot {
        Some(stored) if stored.will_wake(waker) => {}
        _ => *slot = Some(waker.clone()),
    }
}
