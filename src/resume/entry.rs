//! One registered stream: its replay log, its subscribers' positions, the pump that fills the
//! log from the gate, and the grace that runs while nobody is attached.
//!
//! The pump is driven by whoever waits for it: a subscriber that has read everything in the log
//! moves the gate's next events in itself, in its own task, so an event reaches a reader that
//! keeps up with one wake-up (its own), not two. The stream's keeper task drives the pump when
//! nobody waits: while the stream is detached, while its readers are busy writing what they
//! read (a slow client), at a subscriber's lag limit, and to its end.

use std::collections::HashMap;
use std::pin::Pin;
use std::task::Wake;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_core::Stream;
use tokio::time::{Instant, Sleep};

use super::log::{Lookup, ReplayLog};
use super::registry::{AttachError, Shared};
use crate::chunk::Chunk;
use crate::gate::{Consumer, EndReason, Event, GateError, GateHandle};
use crate::sync::{Arc, Mutex, lock};

/// What became of an event offered to the log.
enum Offer {
    /// Taken, or (with `cut_last`) not yet: the last attached subscriber was just cut off, and
    /// the stream is now as if nobody were attached.
    Taken { cut_last: bool },
    /// Not yet; look again when woken, or at the instant given (a subscriber's lag limit).
    Wait(Option<Instant>),
    /// Not yet: nobody is attached and the log is full; look again when woken (an attach, the
    /// grace's expiry, a stop).
    Detached,
}

/// A registered stream, shared by its keeper, its subscribers and the registry.
pub(crate) struct Entry<C> {
    pub(crate) id: Arc<str>,
    pub(crate) state: Mutex<State<C>>,
    pub(crate) handle: GateHandle,
    /// The pump, driven by whoever holds this lock (`None` once the stream has ended).
    pump: Mutex<Option<Pump<C>>>,
    /// Who to wake when the pump can move (the gate has an event, a lag limit ran out, the log
    /// has room again): the waker the pump polls with.
    drivers: Arc<Drivers>,
    /// [`drivers`](Entry::drivers) as a waker.
    waker: Waker,
}

/// Whoever waits for the pump to move: subscribers that have read everything (any of them
/// moves the next events in), else the keeper.
#[derive(Default)]
struct Drivers {
    waiting: Mutex<Vec<Waker>>,
    keeper: Mutex<Option<Waker>>,
}

impl Drivers {
    /// `waker` waits for the pump's next move.
    fn wait(&self, waker: &Waker) {
        let mut waiting = lock(&self.waiting);
        if !waiting.iter().any(|waiting| waiting.will_wake(waker)) {
            waiting.push(waker.clone());
        }
    }

    /// The keeper's task, woken when no subscriber waits.
    fn keep(&self, waker: &Waker) {
        let mut keeper = lock(&self.keeper);
        if !keeper
            .as_ref()
            .is_some_and(|keeper| keeper.will_wake(waker))
        {
            *keeper = Some(waker.clone());
        }
    }

    /// `waker` no longer waits (its subscriber has an event to handle).
    fn forget(&self, waker: &Waker) {
        lock(&self.waiting).retain(|waiting| !waiting.will_wake(waker));
    }

    fn wake_keeper(&self) {
        if let Some(keeper) = lock(&self.keeper).as_ref() {
            keeper.wake_by_ref();
        }
    }
}

impl Wake for Drivers {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    /// Wakes every waiting subscriber (the first to run moves the events in, and the log wakes
    /// the others), or the keeper when none waits. A subscriber waits only while it has read
    /// everything, so it is polled again when woken: a transport stops polling its body only
    /// with bytes of its own to write, which a waiting subscriber did not give it.
    fn wake_by_ref(self: &Arc<Self>) {
        let waiting = std::mem::take(&mut *lock(&self.waiting));
        if waiting.is_empty() {
            self.wake_keeper();
        }
        for waker in waiting {
            waker.wake();
        }
    }
}

/// The gate's consumer and what the pump holds between two moves.
pub(crate) struct Pump<C> {
    /// The gate's consumer (boxed: a registry holds any chunk type, a consumer only a
    /// [`Chunk`]'s).
    consumer: Pin<Box<dyn Stream<Item = Result<Event<C>, GateError>> + Send>>,
    /// An event the log has not taken yet.
    slot: Option<Event<C>>,
    /// A subscriber's lag limit, while one holds the log.
    lag: Option<Pin<Box<Sleep>>>,
    /// The gate was released while a full log held a detached stream.
    gate_released: bool,
}

impl<C> Pump<C> {
    pub(crate) fn new(consumer: Consumer<C>) -> Self
    where
        C: Chunk + Send + 'static,
    {
        Pump {
            consumer: Box::pin(consumer),
            slot: None,
            lag: None,
            gate_released: false,
        }
    }
}

/// What a drive of the pump did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Moved {
    /// Nothing: the gate had no event, the log could not take one, or another task drives.
    Nothing,
    /// Events went into the log.
    Events,
    /// The stream's end went into the log: the pump is done.
    End,
}

/// An attached subscriber, as the log sees it.
struct Reader {
    /// The id of the next event it needs.
    next: u64,
    /// How long it may keep a full log from taking the next event.
    max_lag: Duration,
    /// It held the log back past its `max_lag`: it no longer counts, and its next read ends
    /// it as behind.
    cut: bool,
    /// Its task, while it waits for an event.
    waker: Option<Waker>,
}

pub(crate) struct State<C> {
    pub(crate) log: ReplayLog<C>,
    /// How the stream ended, once the pump saw it: `None` inside for a completed stream.
    pub(crate) end: Option<Option<GateError>>,
    readers: HashMap<u64, Reader>,
    next_reader: u64,
    /// While nobody is attached, events from here on were never taken by a subscriber that
    /// left: they are kept for a resume, and a full log pauses the generator instead.
    resume_floor: u64,
    /// How far the log may run ahead of the slowest attached subscriber, in events.
    read_ahead: u64,
    /// Since when the slowest attached subscriber has held the log back.
    full_since: Option<Instant>,
    /// Changes at every attach, so a grace timer started before it knows it is stale.
    epoch: u64,
    /// The grace ran out (or was zero): the generator was cancelled and the log is freed.
    pub(crate) expired: bool,
    /// Stopped on purpose: the log takes every event without waiting for anyone.
    stopped: bool,
    /// Whether events every subscriber has read stay in the log for a resume (a grace is set);
    /// without, the log holds only what someone has still to read.
    keep_read: bool,
    pump: Option<Waker>,
}

impl<C> State<C> {
    /// Subscribers attached and not cut off.
    pub(crate) fn attached(&self) -> usize {
        self.readers.values().filter(|reader| !reader.cut).count()
    }
}

impl<C: Chunk + Clone + Send + 'static> Entry<C> {
    pub(crate) fn new(
        id: Arc<str>,
        consumer: Consumer<C>,
        max_events: usize,
        max_bytes: usize,
        read_ahead: usize,
        keep_read: bool,
    ) -> Self {
        let drivers = Arc::new(Drivers::default());
        Entry {
            id,
            handle: consumer.handle(),
            pump: Mutex::new(Some(Pump::new(consumer))),
            waker: Waker::from(drivers.clone()),
            drivers,
            state: Mutex::new(State {
                log: ReplayLog::new(max_events, max_bytes),
                end: None,
                readers: HashMap::new(),
                next_reader: 0,
                resume_floor: u64::MAX,
                read_ahead: read_ahead.max(1) as u64,
                full_since: None,
                epoch: 0,
                expired: false,
                stopped: false,
                keep_read,
                pump: None,
            }),
        }
    }

    /// Appends `event` once the log may take it.
    ///
    /// With subscribers attached, the log runs at most `read_ahead` events ahead of the slowest
    /// one and evicts only what all of them have read; a subscriber that holds the log back for
    /// longer than its `max_lag` is cut (it no longer counts, and falls behind). With none
    /// attached (or all cut), the log takes events until it is full, evicting only what lies
    /// below the resume floor, then waits: the grace bounds that wait. Waiting, the gate behind
    /// fills and pauses the generator.
    fn offer(
        &self,
        event: &mut Option<Event<C>>,
        cx: &mut Context<'_>,
        driver: Option<u64>,
    ) -> Offer {
        let mut state = lock(&self.state);
        let state = &mut *state;
        let Some(next) = event.take() else {
            return Offer::Taken { cut_last: false };
        };
        if state.expired {
            // Nobody will read it: the pump goes on to the gate's end.
            return Offer::Taken { cut_last: false };
        }
        loop {
            let readers = state.readers.values().filter(|reader| !reader.cut);
            let slowest = readers.map(|reader| reader.next).min();
            let oldest_end = state.log.oldest_end();
            // Without a grace nobody can come back for what every subscriber has read.
            if let (false, Some(slowest), Some(end)) = (state.keep_read, slowest, oldest_end) {
                if end <= slowest {
                    state.log.evict();
                    continue;
                }
            }
            let room = state.log.fits(&next);
            if state.stopped {
                // A stopped stream's last events wait for nobody: laggards fall behind.
                if !room {
                    state.log.evict();
                    continue;
                }
                break;
            }
            let Some(slowest) = slowest else {
                if room {
                    break;
                }
                if oldest_end.is_some_and(|end| end <= state.resume_floor) {
                    state.log.evict();
                    continue;
                }
                // Detached: the grace bounds the wait.
                state.pump = Some(cx.waker().clone());
                *event = Some(next);
                return Offer::Detached;
            };
            let ahead = state.log.end().saturating_sub(slowest);
            if ahead < state.read_ahead {
                if room {
                    break;
                }
                if oldest_end.is_some_and(|end| end <= slowest) {
                    state.log.evict();
                    continue;
                }
            }
            // The slowest subscribers hold the log: for at most their lag limit.
            let now = Instant::now();
            let since = *state.full_since.get_or_insert(now);
            let mut deadline = None::<Instant>;
            let mut cut = false;
            for reader in state.readers.values_mut() {
                if reader.cut || reader.next != slowest {
                    continue;
                }
                // A limit too far to express never runs out.
                let Some(limit) = since.checked_add(reader.max_lag) else {
                    continue;
                };
                if limit <= now {
                    reader.cut = true;
                    cut = true;
                    // It learns at its next read (its task may be waiting for an event).
                    if let Some(waker) = reader.waker.take() {
                        waker.wake();
                    }
                } else {
                    deadline = Some(deadline.map_or(limit, |d| d.min(limit)));
                }
            }
            if cut {
                // Someone else may be the slowest now, on a fresh clock.
                state.full_since = None;
                if state.readers.values().all(|reader| reader.cut) {
                    *event = Some(next);
                    return Offer::Taken { cut_last: true };
                }
                continue;
            }
            state.pump = Some(cx.waker().clone());
            *event = Some(next);
            return Offer::Wait(deadline);
        }
        state.log.push(next);
        state.full_since = None;
        // The subscriber driving the pump reads on when the move is done.
        for (key, reader) in &mut state.readers {
            if Some(*key) != driver {
                if let Some(waker) = reader.waker.take() {
                    waker.wake();
                }
            }
        }
        Offer::Taken { cut_last: false }
    }

    /// From now on the log takes every event at once (see [`Registry::stop`]).
    ///
    /// [`Registry::stop`]: super::Registry::stop
    pub(crate) fn stop_waiting(&self) {
        let mut state = lock(&self.state);
        state.stopped = true;
        if let Some(pump) = state.pump.take() {
            pump.wake();
        }
    }

    /// The pump saw the stream's end.
    fn finish(&self, end: Option<GateError>) {
        let mut state = lock(&self.state);
        state.end = Some(end);
        wake_readers(&mut state);
    }

    /// A subscriber attaches at `next` (`check`: unless the stream expired or its log no longer
    /// holds `next`); returns its key.
    pub(crate) fn attach(
        &self,
        next: u64,
        max_lag: Duration,
        check: bool,
    ) -> Result<u64, AttachError> {
        let mut state = lock(&self.state);
        if check {
            // An expired stream's log is freed and its entry about to go.
            if state.expired {
                return Err(AttachError::Unknown);
            }
            let oldest = state.log.start();
            if next < oldest {
                return Err(AttachError::Gone { oldest });
            }
            if state.end.is_some() && next >= state.log.end() {
                return Err(AttachError::Finished);
            }
        }
        let key = state.next_reader;
        state.next_reader += 1;
        state.readers.insert(
            key,
            Reader {
                next,
                max_lag,
                cut: false,
                waker: None,
            },
        );
        state.epoch += 1;
        // Attached, the floor of an earlier detach no longer holds events back.
        state.resume_floor = u64::MAX;
        // The log may evict what the subscribers have read: a waiting pump looks again.
        if let Some(pump) = state.pump.take() {
            pump.wake();
        }
        Ok(key)
    }

    /// The subscriber `key` left; the last one starts the grace.
    pub(crate) fn detach(self: &Arc<Self>, key: u64, shared: &Arc<Shared<C>>)
    where
        C: Send + Sync + 'static,
    {
        let mut state = lock(&self.state);
        let Some(reader) = state.readers.remove(&key) else {
            return;
        };
        state.resume_floor = state.resume_floor.min(reader.next);
        if let Some(pump) = state.pump.take() {
            pump.wake();
        }
        // It may have been the one to drive the pump next: now the others or the keeper do.
        self.drivers.wake_keeper();
        if !reader.cut && state.readers.values().all(|reader| reader.cut) {
            self.nobody_reads(state, shared, EndReason::ConsumerGone);
        }
    }

    /// The last attached subscriber left (or was cut off, for `reason`): the grace starts, or
    /// with a zero grace the stream expires now.
    fn nobody_reads(
        self: &Arc<Self>,
        mut state: crate::sync::MutexGuard<'_, State<C>>,
        shared: &Arc<Shared<C>>,
        reason: EndReason,
    ) where
        C: Send + Sync + 'static,
    {
        // Someone may have attached since (the caller let go of the lock), or it is over.
        if state.attached() > 0 || state.end.is_some() || state.expired {
            return;
        }
        let grace = shared.options.grace;
        let runtime = tokio::runtime::Handle::try_current();
        let (true, Ok(runtime)) = (!grace.is_zero(), runtime) else {
            // A zero grace, or no runtime to time it on (the process is ending).
            self.expire(&mut state, shared, reason);
            return;
        };
        let (entry, shared, epoch) = (self.clone(), shared.clone(), state.epoch);
        drop(state);
        runtime.spawn(async move {
            tokio::time::sleep(grace).await;
            let mut state = lock(&entry.state);
            let nobody = state.readers.values().all(|reader| reader.cut);
            if state.epoch == epoch && nobody && state.end.is_none() {
                entry.expire(&mut state, &shared, reason);
            }
        });
    }

    /// Nobody came back in time: the generator is cancelled for `reason` (its two-phase stop
    /// and release are the gate's) and the log is freed.
    fn expire(&self, state: &mut State<C>, shared: &Shared<C>, reason: EndReason) {
        if state.expired {
            return;
        }
        state.expired = true;
        state.log.clear();
        if let Some(pump) = state.pump.take() {
            pump.wake();
        }
        shared.expired();
        self.handle.cancel_with(reason);
    }

    /// What the subscriber `key` reads next: an event, its end, or nothing yet (its waker is
    /// kept).
    pub(crate) fn read(
        &self,
        key: u64,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Event<C>, GateError>>> {
        let mut state = lock(&self.state);
        let state = &mut *state;
        let Some(reader) = state.readers.get_mut(&key) else {
            return Poll::Ready(None);
        };
        let next = reader.next;
        if reader.cut {
            let why = format!(
                "behind: cut off at event {next} after holding the replay log back for {:?}",
                reader.max_lag
            );
            return Poll::Ready(Some(Err(GateError::new(
                EndReason::SlowConsumer,
                Some(why.into()),
            ))));
        }
        match state.log.lookup(next) {
            Lookup::Event(event) => {
                reader.next = event.id().saturating_add(1);
                reader.waker = None;
                // The log may now evict what this subscriber held.
                if let Some(pump) = state.pump.take() {
                    pump.wake();
                }
                Poll::Ready(Some(Ok(event)))
            }
            Lookup::Behind(start) => {
                let why = format!(
                    "behind: the replay log starts at event {start}, this subscriber was at {next}"
                );
                Poll::Ready(Some(Err(GateError::new(
                    EndReason::SlowConsumer,
                    Some(why.into()),
                ))))
            }
            Lookup::Nothing => match &state.end {
                Some(None) => Poll::Ready(None),
                Some(Some(error)) => Poll::Ready(Some(Err(error.clone()))),
                None => {
                    if let Some(reader) = state.readers.get_mut(&key) {
                        reader.waker = Some(cx.waker().clone());
                    }
                    Poll::Pending
                }
            },
        }
    }

    /// Where the subscriber `key` is.
    pub(crate) fn position(&self, key: u64) -> Option<u64> {
        lock(&self.state)
            .readers
            .get(&key)
            .map(|reader| reader.next)
    }

    /// Sets how long the subscriber `key` may hold a full log.
    pub(crate) fn set_max_lag(&self, key: u64, max_lag: Duration) {
        let mut state = lock(&self.state);
        if let Some(reader) = state.readers.get_mut(&key) {
            reader.max_lag = max_lag;
        }
        if let Some(pump) = state.pump.take() {
            pump.wake();
        }
    }
}

/// Wakes every subscriber waiting for an event.
fn wake_readers<C>(state: &mut State<C>) {
    for reader in state.readers.values_mut() {
        if let Some(waker) = reader.waker.take() {
            waker.wake();
        }
    }
}

impl<C> Entry<C>
where
    C: Chunk + Clone + Send + Sync + 'static,
{
    /// Moves the gate's events into the log, as far as they can go now, for the subscriber
    /// `driver` (whose own waker the log then leaves alone), or for the keeper (`None`). Does
    /// nothing while another task drives: that one wakes the readers of what it moves.
    pub(crate) fn drive(self: &Arc<Self>, driver: Option<u64>, shared: &Arc<Shared<C>>) -> Moved {
        let mut pump = match self.pump.try_lock() {
            Ok(pump) => pump,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Moved::Nothing,
        };
        let Some(running) = pump.as_mut() else {
            return Moved::Nothing;
        };
        let mut cx = Context::from_waker(&self.waker);
        let (moved, end) = self.pump_into_log(running, &mut cx, driver, shared);
        let Poll::Ready(end) = end else {
            return if moved { Moved::Events } else { Moved::Nothing };
        };
        self.finish(end);
        // The gate's end and release are the consumer's drop away.
        let done = pump.take();
        drop(pump);
        drop(done);
        // The keeper keeps the finished log for its retention, then removes it.
        self.drivers.wake_keeper();
        Moved::End
    }

    /// The subscriber of `waker` has read everything and waits: it is woken to drive the pump
    /// when the pump can move.
    pub(crate) fn wait_for_pump(&self, waker: &Waker) {
        self.drivers.wait(waker);
    }

    /// The subscriber of `waker` has an event to handle and no longer waits.
    pub(crate) fn stop_waiting_for_pump(&self, waker: &Waker) {
        self.drivers.forget(waker);
    }

    /// Moves events until the gate has none, the log can take none, or the stream ends (with
    /// its end: `None` for a completed stream); whether any moved.
    fn pump_into_log(
        self: &Arc<Self>,
        pump: &mut Pump<C>,
        cx: &mut Context<'_>,
        driver: Option<u64>,
        shared: &Arc<Shared<C>>,
    ) -> (bool, Poll<Option<GateError>>) {
        let mut moved = false;
        loop {
            if pump.slot.is_none() {
                match pump.consumer.as_mut().poll_next(cx) {
                    Poll::Ready(Some(Ok(event))) => pump.slot = Some(event),
                    Poll::Ready(Some(Err(error))) => return (moved, Poll::Ready(Some(error))),
                    Poll::Ready(None) => return (moved, Poll::Ready(None)),
                    Poll::Pending => return (moved, Poll::Pending),
                }
            }
            // Until the log takes it; a subscriber's lag limit running out is a reason to look
            // again.
            match self.offer(&mut pump.slot, cx, driver) {
                Offer::Taken { cut_last: false } => moved = true,
                Offer::Taken { cut_last: true } => {
                    let state = lock(&self.state);
                    self.nobody_reads(state, shared, EndReason::SlowConsumer);
                }
                // Only a detached stream's wait can outlive its gate (an attached one's is
                // bounded by its readers' lag limits): watching the gate there costs the hot
                // path nothing.
                Offer::Detached => {
                    if pump.gate_released || self.handle.poll_released(cx).is_pending() {
                        return (moved, Poll::Pending);
                    }
                    pump.gate_released = true;
                    self.stop_waiting();
                }
                Offer::Wait(None) => return (moved, Poll::Pending),
                Offer::Wait(Some(deadline)) => {
                    let lag = match &mut pump.lag {
                        Some(lag) => {
                            lag.as_mut().reset(deadline);
                            lag
                        }
                        None => pump
                            .lag
                            .insert(Box::pin(tokio::time::sleep_until(deadline))),
                    };
                    if lag.as_mut().poll(cx).is_pending() {
                        return (moved, Poll::Pending);
                    }
                }
            }
        }
    }
}

/// The stream's keeper: drives the pump whenever no subscriber waits to (see [`Drivers`]), then
/// keeps the finished log for the registry's retention (none after an expiry) and removes the
/// entry.
pub(crate) async fn keep<C>(entry: Arc<Entry<C>>, shared: Arc<Shared<C>>)
where
    C: Chunk + Clone + Send + Sync + 'static,
{
    std::future::poll_fn(|cx| {
        entry.drivers.keep(cx.waker());
        entry.drive(None, &shared);
        if lock(&entry.pump).is_none() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    let retain = if lock(&entry.state).expired {
        Duration::ZERO
    } else {
        shared.options.retain
    };
    // A zero sleep would still wait for the timer's next millisecond tick.
    if !retain.is_zero() {
        tokio::time::sleep(retain).await;
    }
    shared.remove(&entry);
}
