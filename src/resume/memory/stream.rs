//! One registered stream in memory: its replay log, its readers' positions, what the log takes
//! from the gate (read-ahead, lag limits, the stop), and the grace that runs while nobody is
//! attached.

use std::collections::{BTreeMap, HashMap};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

use super::log::{Lookup, ReplayLog};
use crate::chunk::Chunk;
use crate::end::EndReason;
use crate::gate::{Event, GateError, GateHandle};
use crate::resume::error::AttachError;
use crate::resume::stats::Counters;
use crate::sse::ErrorShape;
use crate::sync::{Arc, Mutex, lock};

/// Every stream of a memory registry, by id.
pub(crate) type Streams<C> = Mutex<HashMap<Arc<str>, Arc<Registered<C>>>>;

/// What became of an event offered to the log.
pub(crate) enum Offer {
    /// Taken, or (with `cut_last`) not yet: the last attached subscriber was just cut off, and
    /// the stream is now as if nobody were attached.
    Taken { cut_last: bool },
    /// Not yet; look again when woken, or at the instant given (a subscriber's lag limit).
    Wait(Option<Instant>),
    /// Not yet: nobody is attached and the log is full; look again when woken (an attach, the
    /// grace's expiry, a stop).
    Detached,
}

/// A registered stream, shared by its pump, its readers and the registry.
pub(crate) struct Registered<C> {
    pub(crate) id: Arc<str>,
    pub(crate) state: Mutex<State<C>>,
    pub(crate) handle: GateHandle,
    /// The error shape of its readers' ends (`Claim::error_shape`).
    pub(crate) shape: ErrorShape,
    /// Its claim's generation: tells it from an earlier or later stream of the same id.
    pub(crate) generation: u64,
    /// How long it goes on with nobody attached.
    grace: Duration,
    /// The registry's: an expiry is counted there.
    counters: Arc<Counters>,
}

/// An attached subscriber, as the log sees it.
struct Attached {
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
    /// Ordered by key (the order they attached): a map without hashing, since a stream has
    /// few and every read looks one up.
    readers: BTreeMap<u64, Attached>,
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

impl<C: Chunk + Clone> Registered<C> {
    /// The stream `id` of the gate `handle`, kept as `options` says.
    pub(crate) fn new(
        id: Arc<str>,
        (handle, shape, generation): (GateHandle, ErrorShape, u64),
        options: &crate::resume::ResumeOptions,
        counters: Arc<Counters>,
    ) -> Self {
        Registered {
            id,
            handle,
            shape,
            generation,
            grace: options.grace,
            counters,
            state: Mutex::new(State {
                log: ReplayLog::new(options.log_events, options.log_bytes),
                end: None,
                readers: BTreeMap::new(),
                next_reader: 0,
                resume_floor: u64::MAX,
                read_ahead: options.read_ahead.max(1) as u64,
                full_since: None,
                epoch: 0,
                expired: false,
                stopped: false,
                keep_read: !options.grace.is_zero(),
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
    pub(crate) fn offer(&self, event: &mut Option<Event<C>>, cx: &mut Context<'_>) -> Offer {
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
        wake_readers(state);
        Offer::Taken { cut_last: false }
    }

    /// From now on the log takes every event at once: a stopped stream's last events wait for
    /// no slow reader and no resume.
    pub(crate) fn stop_waiting(&self) {
        let mut state = lock(&self.state);
        state.stopped = true;
        if let Some(pump) = state.pump.take() {
            pump.wake();
        }
    }

    /// The pump saw the stream's end.
    pub(crate) fn finish(&self, end: Option<GateError>) {
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
            Attached {
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
    pub(crate) fn detach(self: &Arc<Self>, key: u64)
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
        if !reader.cut && state.readers.values().all(|reader| reader.cut) {
            self.nobody_reads(state, EndReason::ConsumerGone);
        }
    }

    /// The last attached subscriber left (or was cut off, for `reason`): the grace starts, or
    /// with a zero grace the stream expires now.
    pub(crate) fn nobody_reads(
        self: &Arc<Self>,
        mut state: crate::sync::MutexGuard<'_, State<C>>,
        reason: EndReason,
    ) where
        C: Send + Sync + 'static,
    {
        // Someone may have attached since (the caller let go of the lock), or it is over.
        if state.attached() > 0 || state.end.is_some() || state.expired {
            return;
        }
        let grace = self.grace;
        let runtime = tokio::runtime::Handle::try_current();
        let (true, Ok(runtime)) = (!grace.is_zero(), runtime) else {
            // A zero grace, or no runtime to time it on (the process is ending).
            self.expire(&mut state, reason);
            return;
        };
        let (entry, epoch) = (self.clone(), state.epoch);
        drop(state);
        runtime.spawn(async move {
            tokio::time::sleep(grace).await;
            let mut state = lock(&entry.state);
            let nobody = state.readers.values().all(|reader| reader.cut);
            if state.epoch == epoch && nobody && state.end.is_none() {
                entry.expire(&mut state, reason);
            }
        });
    }

    /// Nobody came back in time: the generator is cancelled for `reason` (its two-phase stop
    /// and release are the gate's) and the log is freed.
    fn expire(&self, state: &mut State<C>, reason: EndReason) {
        if state.expired {
            return;
        }
        state.expired = true;
        state.log.clear();
        if let Some(pump) = state.pump.take() {
            pump.wake();
        }
        self.counters.expired();
        let _ = self.handle.cancel_with(reason);
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
                    reader.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            },
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
