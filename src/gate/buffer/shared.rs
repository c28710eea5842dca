//! The buffer shared by the generator's sender, the consumer, the gate's task and every
//! handle: one lock over the queue, the end, the slow-consumer clock, the wakers and the
//! counters, and what each side does under it.

use std::mem;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use tokio::time::Instant as Clock;
use tokio_util::sync::CancellationToken;

use super::end_state::EndState;
use super::progress::Progress;
use super::queue::{Batch, Queue, Queued};
use super::stall::StallClock;
use crate::chunk::Chunk;
use crate::end::EndReason;
use crate::gate::budget::ByteBudget;
use crate::gate::error::{BoxError, GateError};
use crate::gate::policy::Policy;
use crate::gate::stats::GateStats;
use crate::sync::{Mutex, lock};

/// Why [`Buffer::try_push`] handed a chunk back.
pub(crate) enum Refused<T> {
    /// No room: the consumer is behind.
    Full(T),
    /// The stream has ended (or its producer has finished); nothing more will be delivered.
    Ended(T),
}

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
    progress: Progress,
}

struct State<T> {
    queue: Queue<T>,
    end: EndState,
    stall: StallClock,
    /// The byte length of the chunk last refused as full (0 once one is admitted): what
    /// "room" means for `poll_room` and the stall clock.
    wanted: usize,
    rx_waker: Option<Waker>,
    tx_waker: Option<Waker>,
    task_waker: Option<Waker>,
    release_wakers: Vec<Waker>,
    stats: GateStats,
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
        let stats = GateStats {
            next_id: config.first_id,
            ..GateStats::default()
        };
        Buffer {
            state: Mutex::new(State {
                queue: Queue::new(config.first_id),
                end: EndState::new(),
                stall: StallClock::new(config.policy.deadline()),
                wanted: 0,
                rx_waker: None,
                tx_waker: None,
                task_waker: None,
                release_wakers: Vec::new(),
                stats,
            }),
            config,
            token,
            progress: Progress::default(),
        }
    }

    /// The stream's stop signal, cancelled at every end.
    pub(crate) fn token(&self) -> &CancellationToken {
        &self.token
    }

    // The sender's side.

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
        if state.end.is_closed() {
            state.stats.chunks_after_end += 1;
            return Err(Refused::Ended(chunk));
        }
        let refused = match self.admit(&mut state, chunk, len, enqueued_at) {
            Ok(()) => {
                state.stall.stop();
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
            self.progress.sender_waiting();
            let (events, bytes) = state.queue.held(self.progress.fresh_totals());
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
    /// hands it back otherwise. The bytes are reserved in the budget before the chunk goes in,
    /// in one atomic step, so gates racing for the group's last room cannot all take it.
    fn admit(
        &self,
        state: &mut State<T>,
        chunk: T,
        len: usize,
        enqueued_at: Option<Instant>,
    ) -> Result<(), T> {
        let (events, bytes) = self.held(state);
        let new_event = events < self.config.max_events;
        let wanted = bytes.saturating_add(len) <= self.config.max_bytes
            && (new_event || self.config.policy.coalesces());
        let budget = self.config.budget.as_deref();
        let reserved = wanted && budget.is_none_or(|budget| budget.reserve(bytes, len));
        // What the budget already counts for this chunk.
        let taken = if reserved && budget.is_some() { len } else { 0 };
        // A gate that holds nothing admits one chunk whatever the bounds: no stream deadlocks.
        if events == 0 || (new_event && reserved) {
            state.queue.push(chunk, len, enqueued_at);
            state.stats.chunks_sent += 1;
            state.stats.peak_buffered_events = state.stats.peak_buffered_events.max(events + 1);
            state.stats.peak_buffered_bytes = state.stats.peak_buffered_bytes.max(bytes + len);
            self.accepted(state, len, (0, len), taken);
            return Ok(());
        }
        if !reserved {
            return Err(chunk);
        }
        match state.queue.merge(chunk) {
            Ok(held) => {
                state.stats.chunks_merged += 1;
                self.accepted(state, len, held, taken);
                Ok(())
            }
            Err(chunk) => {
                if let Some(budget) = budget {
                    budget.sub(taken);
                }
                Err(chunk)
            }
        }
    }

    /// Counts an accepted chunk of `len` bytes that changed what the buffer holds from
    /// `held.0` to `held.1` bytes (a new event: from 0 to `len`), of which the group's budget
    /// already counts `taken` more.
    fn accepted(&self, state: &mut State<T>, len: usize, held: (usize, usize), taken: usize) {
        state.stats.next_id = state.queue.next_id();
        state.stats.bytes_sent += len as u64;
        if let Some(budget) = &self.config.budget {
            // One step, up or down: no passing over-count for another gate to be refused by.
            let counted = held.0 + taken;
            if held.1 >= counted {
                budget.add(held.1 - counted);
            } else {
                budget.sub(counted - held.1);
            }
        }
    }

    /// Starts the slow-consumer clock unless it runs or the policy has none; returns the
    /// gate's task to wake when it holds no timer for it yet.
    fn start_stall(&self, state: &mut State<T>) -> Option<Waker> {
        if state.stall.start(&self.progress) {
            state.task_waker.take()
        } else {
            None
        }
    }

    /// Ready when a chunk would be admitted as an event of its own (or the stream has ended);
    /// otherwise starts the slow-consumer clock and registers `cx` for room.
    pub(crate) fn poll_room(&self, cx: &mut Context<'_>) -> Poll<bool> {
        let mut state = lock(&self.state);
        if state.end.is_closed() {
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
        self.progress.sender_waiting();
        let (events, bytes) = state.queue.held(self.progress.fresh_totals());
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

    /// Whether a chunk of `len` bytes would be admitted as an event of its own while the gate
    /// holds `events` and `bytes`, as [`admit`](Buffer::admit) would decide now (another gate
    /// of the group may take the budget's room first).
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
        state.queue.held(self.progress.totals())
    }

    // The consumer's side.

    /// Hands the consumer its next chunk: from `batch` without a lock while it lasts, otherwise
    /// by swapping every waiting chunk into `batch` under the lock. Once nothing is left, the
    /// end (as an error unless the stream completed) once, then `None` for ever.
    pub(crate) fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        batch: &mut Batch<T>,
    ) -> Poll<Option<Result<Queued<T>, GateError>>> {
        if let Some(chunk) = self.yield_from(batch) {
            return Poll::Ready(Some(Ok(chunk)));
        }
        let mut state = lock(&self.state);
        // The previous batch is all yielded: the room it held is free, and the generator may
        // be waiting for it.
        let tx = state.tx_waker.take();
        state.queue.lend(batch, self.progress.totals());
        let mut wakers = [tx, None];
        let mut completed = false;
        // What to yield, decided under the lock; the chunk itself is popped after it.
        let end = if !batch.is_empty() {
            None
        } else if state.end.is_seen() {
            Some(Poll::Ready(None))
        } else if let Some((reason, error)) = state.end.standing() {
            debug_assert!(error.is_some() || reason == EndReason::Completed);
            let error = error.cloned();
            state.end.mark_seen();
            Some(Poll::Ready(error.map(Err)))
        } else if state.end.is_finished() {
            // The producer finished and the consumer has everything: this is completion.
            let (_, mut woken) = self.end_locked(&mut state, EndReason::Completed, None);
            wakers[1] = woken[2].take();
            state.end.mark_seen();
            completed = true;
            Some(Poll::Ready(None))
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
    fn yield_from(&self, batch: &mut Batch<T>) -> Option<Queued<T>> {
        let queued = batch.pop_front()?;
        let len = queued.byte_len();
        self.progress.publish(len);
        if let Some(budget) = &self.config.budget {
            budget.sub(len);
        }
        if self.progress.sender_waits() {
            self.wake_sender();
        }
        Some(queued)
    }

    #[cold]
    fn wake_sender(&self) {
        let mut state = lock(&self.state);
        // The sender waits, so the slow-consumer clock runs: it restarts from this take.
        state.stall.took(Clock::now());
        self.progress.sender_woken();
        let tx = state.tx_waker.take();
        drop(state);
        if let Some(tx) = tx {
            tx.wake();
        }
    }

    /// The consumer is gone, leaving `batch` unread: drops what it will never read and ends the
    /// stream, as completed if the producer had finished and nothing was left unread, as
    /// consumer-gone otherwise (unless it had already ended). Returns the reason that stands.
    pub(crate) fn close_consumer(&self, batch: Batch<T>) -> EndReason {
        let mut state = lock(&self.state);
        state.end.mark_seen();
        let unread = state.queue.waiting() + batch.len();
        let reason = if state.end.is_finished() && unread == 0 {
            EndReason::Completed
        } else {
            EndReason::ConsumerGone
        };
        // Ended under the same lock that empties the queue, so no chunk can slip in between.
        let (reason, wakers) = self.end_locked(&mut state, reason, None);
        state.stats.events_undelivered += unread as u64;
        let (undelivered, held_bytes) = state.queue.clear(self.progress.totals());
        if let Some(budget) = &self.config.budget {
            budget.sub(held_bytes);
        }
        drop(state);
        // Dropping chunks runs their destructors: never under the lock.
        drop((undelivered, batch));
        wakers.into_iter().flatten().for_each(Waker::wake);
        self.token.cancel();
        reason
    }

    /// Whether the consumer has seen the end (or is gone): it will yield nothing more once its
    /// batch is empty.
    pub(crate) fn is_terminated(&self) -> bool {
        lock(&self.state).end.is_seen()
    }

    // The end.

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
        self.finish_when(|_| true);
    }

    /// A spawned generator returned `Ok`: the stream finishes once its sender is gone too (a
    /// generator may hand its sender to another task and return).
    pub(crate) fn generator_returned(&self) {
        self.finish_when(EndState::generator_returned);
    }

    /// A spawned generator's sender was dropped: if the generator has returned, the stream
    /// finishes.
    pub(crate) fn task_sender_dropped(&self) {
        self.finish_when(EndState::task_sender_dropped);
    }

    /// Records what happened (`mark`), and finishes the stream if it says the producer is done.
    fn finish_when(&self, mark: impl FnOnce(&mut EndState) -> bool) {
        let mut state = lock(&self.state);
        let wakers = if mark(&mut state.end) {
            self.finish_locked(&mut state)
        } else {
            [None, None]
        };
        drop(state);
        wakers.into_iter().flatten().for_each(Waker::wake);
    }

    /// Marks the stream finished (unless it has ended); returns the wakers to wake.
    fn finish_locked(&self, state: &mut State<T>) -> [Option<Waker>; 2] {
        if !state.end.finish() {
            return [None, None];
        }
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
        let (reason, set) = state.end.set(reason, source);
        if !set {
            return (reason, [None, None, None]);
        }
        state.stall.stop();
        (
            reason,
            [
                state.rx_waker.take(),
                state.tx_waker.take(),
                state.task_waker.take(),
            ],
        )
    }

    /// The reason the stream ended, once it has.
    pub(crate) fn end_reason(&self) -> Option<EndReason> {
        lock(&self.state).end.reason()
    }

    /// Whether a chunk sent now would be refused as ended.
    pub(crate) fn is_closed(&self) -> bool {
        lock(&self.state).end.is_closed()
    }

    /// The producer's work has stopped: the engine let go of a channel gate's sender.
    pub(crate) fn producer_stopped(&self) {
        let mut state = lock(&self.state);
        state.end.mark_producer_stopped();
        let task = state.task_waker.take();
        drop(state);
        if let Some(task) = task {
            task.wake();
        }
    }

    // The gate's task.

    /// For the gate's task: registers `cx` for everything it must act on (the end, the
    /// slow-consumer clock) and says what stands.
    pub(crate) fn poll_task(&self, cx: &mut Context<'_>) -> TaskView {
        let mut state = lock(&self.state);
        register(&mut state.task_waker, cx.waker());
        TaskView {
            ended_at: state.end.ended_at(),
            stall_deadline: state.stall.watch(),
            producer_stopped: state.end.is_producer_stopped(),
        }
    }

    /// For the gate's task, when the slow-consumer clock may have run out at `now`: ends the
    /// stream as [`EndReason::SlowConsumer`] if it has, restarts the clock if the policy
    /// forgives a consumer that took something meanwhile.
    pub(crate) fn check_stall(&self, now: Clock) {
        let mut state = lock(&self.state);
        if !state.stall.is_due(now) {
            return;
        }
        let (events, bytes) = self.held(&state);
        let finished = state.end.is_finished();
        let caught_up = if finished {
            // The consumer has every event; only the end is still to be taken.
            events == 0
        } else {
            // The consumer made room and the producer has not used it (an engine that was
            // refused and has not sent since).
            self.fits(events, bytes, state.wanted.max(1))
        };
        if !state.stall.expire(now, caught_up, finished, &self.progress) {
            return;
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
        state.stats.end_to_release = state
            .end
            .ended_at()
            .map(|at| now.saturating_duration_since(at));
        let wakers = mem::take(&mut state.release_wakers);
        drop(state);
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Records when (and how) the generator's work stopped after the end.
    pub(crate) fn mark_stopped(&self, forced: bool) {
        let mut state = lock(&self.state);
        let now = Clock::now();
        state.stats.stop_forced = forced;
        state.stats.end_to_stop = state
            .end
            .ended_at()
            .map(|at| now.saturating_duration_since(at));
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

    // Anyone.

    /// A snapshot of the counters, with `end_to_release` measured to now if the stream has
    /// ended and is not released yet (what the release hook sees).
    pub(crate) fn stats(&self) -> GateStats {
        let state = lock(&self.state);
        // One reading of the consumer's totals for both, so the snapshot adds up while the
        // consumer yields on another thread.
        let (events_delivered, bytes_delivered) = self.progress.totals();
        let (buffered_events, buffered_bytes) =
            state.queue.held((events_delivered, bytes_delivered));
        let end_reason = state.end.reason();
        // After an early end, what still waits is not going to reach the consumer as the
        // stream was meant to.
        let undelivered_now = match end_reason {
            Some(EndReason::Completed) | None => 0,
            Some(_) => buffered_events as u64,
        };
        let end_to_release = match state.stats.end_to_release {
            Some(measured) => Some(measured),
            None => state
                .end
                .ended_at()
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
}

/// Stores `waker` in `slot` unless the stored one would already wake the same task.
fn register(slot: &mut Option<Waker>, waker: &Waker) {
    match slot {
        Some(stored) if stored.will_wake(waker) => {}
        _ => *slot = Some(waker.clone()),
    }
}
