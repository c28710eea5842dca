//! The pump: moves a gated stream's frames into its log in Redis as the log's bounds, the
//! readers' read-ahead and lag limits, the stop and the grace allow, and keeps its keys' TTL.

use std::collections::{HashMap, HashSet, VecDeque};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};

use futures_core::Stream;
use redis::{ErrorKind, RedisError, RedisResult};
use tokio::time::{Instant, MissedTickBehavior};

use super::batcher::{Append, Look, Looked, Standing};
use super::keys::{END, EntryId, Keys, format_id, millis};
use super::outage::Outage;
use super::shared::{Position, Pumped, Shared};
use super::timing::{BATCH, MIN_RETAIN, PUMP_LEASE, RENEWAL, RUNNING_TTL, TICK};
use crate::end::EndReason;
use crate::resume::claim::Claim;
use crate::sse::{ErrorShape, SseFrame};
use crate::sync::{Arc, lock};

/// What the pump appended and its log still holds, oldest first, within the registry's bounds.
struct Log {
    /// Each entry's id and size.
    entries: VecDeque<(EntryId, usize)>,
    bytes: usize,
    /// The last entry appended.
    last: EntryId,
    /// The id after the last event appended.
    end: u64,
    /// The event of the last entry evicted since the last append: Redis still has it.
    evicted: Option<u64>,
    max_events: usize,
    max_bytes: usize,
    /// Nothing appended yet: the log's key may not exist, and the first append gives it its
    /// TTL (the renewals keep it).
    fresh: bool,
}

impl Log {
    /// Whether `frame` can be appended without evicting (one frame larger than the byte bound
    /// is held alone).
    fn fits(&self, frame: &SseFrame) -> bool {
        self.entries.is_empty()
            || (self.entries.len() < self.max_events
                && self.bytes.saturating_add(frame.bytes().len()) <= self.max_bytes)
    }

    /// The entry id of the next entry: its event's, or the one after the last.
    fn next_id(&self, event: Option<u64>) -> EntryId {
        event.map_or((self.last.0, self.last.1 + 1), |event| (event, 1))
    }

    /// The id after the oldest entry's event, once it would be evicted.
    fn oldest_end(&self) -> Option<u64> {
        self.entries
            .front()
            .map(|((event, _), _)| event.saturating_add(1))
    }
}

/// What a stream's log held when its pump started: nothing for a new stream, the entries an
/// adopted one had logged (each id and size, oldest first) for one carried on.
#[derive(Debug, Default)]
pub(crate) struct Logged {
    pub(crate) entries: Vec<(EntryId, usize)>,
}

impl Log {
    fn new(options: &crate::resume::options::ResumeOptions, logged: Logged) -> Self {
        let last = logged.entries.last().map_or((0, 0), |(id, _)| *id);
        // The id after the last event: entries after it (a terminal frame) follow it as
        // `n-2`, `n-3`, with `n` the last event.
        let end = logged
            .entries
            .iter()
            .rev()
            .find(|((_, seq), _)| *seq == 1)
            .map_or(0, |((event, _), _)| event.saturating_add(1));
        Log {
            bytes: logged.entries.iter().map(|(_, bytes)| bytes).sum(),
            entries: logged.entries.into(),
            last,
            end,
            evicted: None,
            max_events: options.log_events.max(1),
            max_bytes: options.log_bytes.max(1),
            fresh: true,
        }
    }
}

/// What the pump knows of the stream's readers, from its last look at Redis and from the
/// readers here.
#[derive(Default)]
struct Readers {
    /// The names of the readers with a live lease, on any instance.
    leased: HashSet<String>,
    /// The positions readers on other instances wrote.
    remote: HashMap<String, u64>,
    /// The readers this pump cut off (they no longer count).
    cut: HashSet<String>,
}

impl Readers {
    /// Whether a reader is attached that was not cut off: one with a lease, or one here (whose
    /// lease a Redis back from a restart has not seen yet).
    fn attached(&self, pumped: &Pumped) -> bool {
        let here = lock(&pumped.readers).iter().any(|reader| self.live(reader));
        here || self.leased.iter().any(|name| !self.cut.contains(name))
    }

    /// Whether `reader`, here, was not cut off (a cut reader still here is on its way out: its
    /// lease may lapse before it is gone).
    fn live(&self, reader: &Position) -> bool {
        !self.cut.contains(&reader.name) && !reader.cut.load(Ordering::Relaxed)
    }

    /// Calls `each` with the name, position and place (`true`: another instance) of every
    /// reader not cut off.
    fn each(&self, pumped: &Pumped, mut each: impl FnMut(&str, u64, bool)) {
        let local = lock(&pumped.readers);
        for reader in local.iter().filter(|reader| self.live(reader)) {
            each(&reader.name, reader.next.load(Ordering::Relaxed), false);
        }
        for (name, next) in &self.remote {
            let live = self.leased.contains(name) && !self.cut.contains(name);
            if live && !local.iter().any(|reader| reader.name == *name) {
                each(name, *next, true);
            }
        }
    }

    /// The position of the slowest reader not cut off, and whether one there reads through
    /// another instance.
    fn slowest(&self, pumped: &Pumped) -> Option<(u64, bool)> {
        let mut slowest: Option<(u64, bool)> = None;
        self.each(pumped, |_, next, remote| match &mut slowest {
            Some((at, far)) if *at == next => *far |= remote,
            Some((at, _)) if *at < next => {}
            _ => slowest = Some((next, remote)),
        });
        slowest
    }

    /// The names of the readers at `position`.
    fn at(&self, pumped: &Pumped, position: u64) -> Vec<String> {
        let mut names = Vec::new();
        self.each(pumped, |name, next, _| {
            if next == position {
                names.push(name.to_owned());
            }
        });
        names
    }
}

/// The first wait before the pump looks again at the positions of readers on other instances
/// that hold it; it doubles each look that finds them where they were, up to [`TICK`].
const REPOLL: std::time::Duration = std::time::Duration::from_millis(5);

/// How many looks go by between renewals of the pump's lease and the keys' TTL.
const RENEWALS: u32 = {
    let every = RENEWAL.as_millis() / TICK.as_millis();
    if every > 1 { every as u32 } else { 1 }
};

/// What to do with the frame the pump holds.
enum Step {
    Append,
    /// Evict the oldest entry, then look again.
    Evict,
    /// Wait: a reader to move, the next look at Redis, or the lag limit.
    Wait,
}

/// The stream a pump pumps: its id, the name its claim has in Redis (its pump lease is held
/// under it), and what its log held when it started.
pub(crate) struct Pumping {
    pub(crate) id: Arc<str>,
    pub(crate) name: String,
    pub(crate) logged: Logged,
}

/// Pumps `frames` (a gated stream, encoded) into the log of the stream until it ends, the
/// grace runs out, Redis fails it (past the outage window: the gate is cancelled as
/// `ResumeStoreError`) or another instance adopted it (as `ConsumerGone`: its readers read on
/// from the adopter); gives the claim back once the gate is released.
pub(crate) async fn pump<S>(
    shared: Arc<Shared>,
    pumping: Pumping,
    pumped: Arc<Pumped>,
    mut frames: S,
    claim: Claim,
) where
    S: Stream<Item = SseFrame> + Unpin,
{
    let Pumping { id, name, logged } = pumping;
    let keys = Arc::new(Keys::new(&id));
    let log = Log::new(&shared.options, logged);
    let stream = (&*id, &*name, claim.shape);
    let ran = run(&shared, stream, &keys, &pumped, &mut frames, log).await;
    // Readers here read the rest (the end marker, or what an adopter appends) from Redis, or
    // end at once if it failed the pump.
    pumped.stopped(ran.is_err());
    if ran.is_err() {
        let _ = pumped.handle.cancel_with(EndReason::ResumeStoreError);
    }
    drop(frames);
    pumped.handle.released().await;
    drop(claim);
    lock(&shared.pumped).remove(&id);
}

async fn run<S>(
    shared: &Shared,
    (id, name, shape): (&str, &str, ErrorShape),
    keys: &Arc<Keys>,
    pumped: &Pumped,
    frames: &mut S,
    mut log: Log,
) -> RedisResult<()>
where
    S: Stream<Item = SseFrame> + Unpin,
{
    let options = shared.options;
    let read_ahead = options.read_ahead.max(1) as u64;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut readers = Readers::default();
    // The first reader took its lease before the pump started.
    let mut attached = true;
    let mut alone_since = None::<Instant>;
    // Why the grace's expiry ends the stream: the last reader left, or was cut off.
    let mut expiry = EndReason::ConsumerGone;
    let mut stopped = false;
    // Since when the slowest readers have held the frame back.
    let mut held_since = None::<Instant>;
    let lag = tokio::time::sleep(options.max_lag);
    tokio::pin!(lag);
    // Held by a reader on another instance: a look at the positions again, after `backoff`.
    let repoll = tokio::time::sleep(REPOLL);
    tokio::pin!(repoll);
    let mut repoll_armed = false;
    let mut backoff = REPOLL;
    // A frame taken from the gate and not yet appended: while it waits, the gate behind it
    // fills and pauses the generator.
    let mut pending = None::<SseFrame>;
    let mut looks = 0u32;
    // Redis away: every call is tried again for the outage window (the stream pauses).
    let mut outage = Outage::new(options.outage);
    loop {
        let waiting = pending.is_some();
        // Whether to look at Redis now: the tick, or a reader elsewhere holding the pump.
        let look = tokio::select! {
            biased;
            _ = tick.tick() => true,
            () = &mut repoll, if waiting && repoll_armed => {
                repoll_armed = false;
                backoff = (backoff * 2).min(TICK);
                true
            }
            () = pumped.moved.notified(), if waiting => false,
            () = &mut lag, if waiting && held_since.is_some() => {
                // The slowest readers held the log back past their lag limit: cut them off.
                if let Some((slowest, _)) = readers.slowest(pumped) {
                    let names = readers.at(pumped, slowest);
                    cut(shared, keys, pumped, &mut readers, names).await?;
                }
                held_since = None;
                attached = readers.attached(pumped);
                if !attached {
                    // The grace starts at the next look.
                    expiry = EndReason::SlowConsumer;
                }
                false
            }
            frame = next(frames), if !waiting => match frame {
                Some(frame) => {
                    pending = Some(frame);
                    false
                }
                None => {
                    if !end(shared, (keys, name, shape), &mut log, &mut outage).await? {
                        return lost(pumped);
                    }
                    return Ok(());
                }
            },
        };
        if look {
            let (stop, standing);
            // The lease and the keys' TTL, every few looks.
            let renew = looks % RENEWALS == 0;
            looks += 1;
            let looked = outage.ride(|| look_at(shared, keys, name, renew)).await?;
            (readers, stop, standing) = seen(looked, readers.cut);
            let again_from = log.end;
            let give_back = || Append::again(keys, name, shape, again_from);
            match stands(shared, &mut outage, standing, give_back).await? {
                Kept::Still => {}
                Kept::GivenBack => log.given_back(again_from),
                Kept::Gone => return lost(pumped),
            }
            if stop && !stopped {
                stopped = true;
                (shared.on_stop)(id);
            }
            attached = readers.attached(pumped);
            if attached {
                alone_since = None;
                expiry = EndReason::ConsumerGone;
            } else if alone_since.get_or_insert_with(Instant::now).elapsed() >= options.grace {
                // Nobody came back in time.
                let _ = pumped.handle.cancel_with(expiry);
                shared.counters.expired();
                return shared
                    .redis
                    .query(redis::pipe().del(&keys.all()).ignore())
                    .await;
            }
            pumped.detached.store(!attached, Ordering::Relaxed);
            pumped.bytes.store(log.bytes as u64, Ordering::Relaxed);
        }
        stopped |= pumped.stop_waiting.load(Ordering::Relaxed);
        // The frames the log admits now, appended in one round trip.
        let mut batch = Vec::new();
        let mut ended = false;
        while let Some(frame) = pending.take() {
            let step = if stopped {
                if log.fits(&frame) {
                    Step::Append
                } else {
                    Step::Evict
                }
            } else if !attached {
                // Detached: the grace bounds the wait for room.
                if log.fits(&frame) {
                    Step::Append
                } else {
                    Step::Wait
                }
            } else {
                match readers.slowest(pumped) {
                    // Attached, but no position known yet: as before it was known.
                    None if log.fits(&frame) => Step::Append,
                    None => Step::Evict,
                    Some((slowest, _)) => {
                        let ahead = log.end.saturating_sub(slowest);
                        if ahead >= read_ahead {
                            Step::Wait
                        } else if log.fits(&frame) {
                            Step::Append
                        } else if log.oldest_end().is_some_and(|end| end <= slowest) {
                            Step::Evict
                        } else {
                            Step::Wait
                        }
                    }
                }
            };
            match step {
                Step::Append => {
                    let Some(id) = log.add(&frame) else {
                        // An upstream's own id (kept by a gateway) that went back: the log,
                        // ordered by id, cannot keep it. The upstream failed the stream; its
                        // terminal frame comes next.
                        let _ = pumped.handle.cancel_with(EndReason::UpstreamError);
                        continue;
                    };
                    batch.push((id, frame));
                    held_since = None;
                    backoff = REPOLL;
                    // The frames the gate has ready go with it.
                    if batch.len() < BATCH {
                        match ready(frames) {
                            Poll::Ready(Some(frame)) => pending = Some(frame),
                            Poll::Ready(None) => ended = true,
                            Poll::Pending => {}
                        }
                    }
                }
                Step::Evict => {
                    evict(&mut log);
                    pending = Some(frame);
                }
                Step::Wait => {
                    if attached && readers.slowest(pumped).is_some_and(|(_, far)| far) {
                        repoll_armed = true;
                        repoll.as_mut().reset(Instant::now() + backoff);
                    }
                    if attached && held_since.is_none() {
                        let now = Instant::now();
                        held_since = Some(now);
                        if let Some(limit) = now.checked_add(options.max_lag) {
                            lag.as_mut().reset(limit);
                        }
                    }
                    pending = Some(frame);
                    break;
                }
            }
        }
        if !batch.is_empty() {
            let append = Arc::new(prepare((keys, name, shape), &log, &batch));
            let standing = outage
                .ride(|| shared.batcher.append(append.clone()))
                .await?;
            // The same frames again, into the stream made again from the first event among
            // them (or, with none, from the next).
            let again_from = batch
                .iter()
                .find_map(|(_, frame)| frame.id())
                .unwrap_or(log.end);
            let give_back = || append.made_again_from(again_from);
            match stands(shared, &mut outage, standing, give_back).await? {
                Kept::Still => {}
                Kept::GivenBack => log.given_back(again_from),
                Kept::Gone => return lost(pumped),
            }
            log.evicted = None;
            log.fresh = false;
            pumped.appended(batch);
        }
        if ended {
            if !end(shared, (keys, name, shape), &mut log, &mut outage).await? {
                return lost(pumped);
            }
            return Ok(());
        }
    }
}

/// The next frame if the gate has one ready now, without waiting for one.
fn ready<S: Stream<Item = SseFrame> + Unpin>(frames: &mut S) -> Poll<Option<SseFrame>> {
    let mut cx = Context::from_waker(Waker::noop());
    Pin::new(frames).poll_next(&mut cx)
}

/// The stream is no longer this pump's: its lease lapsed (this instance stalled past it) and
/// another instance adopted it, which pumps it now (and Redis refuses this one's appends).
/// Its gate ends; the pump, without an error.
fn lost(pumped: &Pumped) -> RedisResult<()> {
    let _ = pumped.handle.cancel_with(EndReason::ConsumerGone);
    Ok(())
}

async fn next<S: Stream<Item = SseFrame> + Unpin>(frames: &mut S) -> Option<SseFrame> {
    std::future::poll_fn(|cx| Pin::new(&mut *frames).poll_next(cx)).await
}

/// Renews the pump lease of the claim `ARGV[1]` for `ARGV[2]` ms if the stream is still its
/// own; whether it is. The lease's expiry is on Redis's clock (Unix ms), as the adoption
/// compares it: the instances' clocks need not agree.
const HOLD: &str = r"
if redis.call('HGET', KEYS[1], 'claim') == ARGV[1] then
    local now = redis.call('TIME')
    local expiry = now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ARGV[2])
    redis.call('HSET', KEYS[1], 'pump', string.format('%d', expiry))
    return 1
end
return 0";

/// Adds to `pipe` the renewal of `name`'s pump lease (answering whether the stream is still
/// its own) and of the keys' TTL.
fn renew<'a>(pipe: &'a mut redis::Pipeline, keys: &Keys, name: &str) -> &'a mut redis::Pipeline {
    pipe.cmd("EVAL")
        .arg(HOLD)
        .arg(1)
        .arg(&keys.meta)
        .arg(name)
        .arg(millis(PUMP_LEASE));
    let ttl = millis(RUNNING_TTL) as i64;
    for key in keys.all() {
        pipe.pexpire(key, ttl).ignore();
    }
    pipe
}

/// Renews `name`'s pump lease on the stream of `keys` and the keys' TTL; whether the stream
/// is still its own.
pub(crate) async fn hold(shared: &Shared, keys: &Keys, name: &str) -> RedisResult<bool> {
    let (held,): (bool,) = shared
        .redis
        .query(renew(redis::pipe().atomic(), keys, name))
        .await?;
    Ok(held)
}

/// Looks at the stream (see `batcher.rs`), renewing the pump's lease and the keys' TTL if
/// `renew`.
async fn look_at(
    shared: &Shared,
    keys: &Arc<Keys>,
    name: &str,
    renew: bool,
) -> RedisResult<Looked> {
    let look = Look {
        keys: keys.clone(),
        name: name.to_owned(),
        now_ms: super::keys::now_ms(),
        renew: renew.then(|| (millis(PUMP_LEASE), millis(RUNNING_TTL))),
    };
    shared.batcher.look(look).await
}

/// What a look saw: the readers attached (and their positions, `cut` kept), whether a stop was
/// asked for, and whose the stream is.
fn seen(looked: Looked, mut cut: HashSet<String>) -> (Readers, bool, Standing) {
    let Looked {
        leased,
        positions,
        stop,
        standing,
    } = looked;
    let leased: HashSet<String> = leased.into_iter().collect();
    // A reader that left is no longer cut off: its name will not come back.
    cut.retain(|name| leased.contains(name));
    let readers = Readers {
        leased,
        remote: positions,
        cut,
    };
    (readers, stop, standing)
}

/// What became of the stream after a call.
enum Kept {
    /// It is still this pump's.
    Still,
    /// Redis had lost it (it came back empty) and the pump gave it back: its log starts anew.
    GivenBack,
    /// Another instance adopted it: it is not this pump's any more (its readers read on from
    /// the adopter).
    Gone,
}

/// What became of the stream, as a call found it `standing`: a stream that Redis lost, found
/// so right after an outage (this pump's, or its instance's connection's: it came back empty),
/// is given back at once (`give_back`: an append that makes it again); another claim's is gone;
/// one found lost otherwise (its keys expired: this instance stalled past their TTL) is an
/// error, which ends it as the store's failure.
async fn stands(
    shared: &Shared,
    outage: &mut Outage,
    standing: Standing,
    give_back: impl FnOnce() -> Append,
) -> RedisResult<Kept> {
    let kept = match standing {
        Standing::Ours => Kept::Still,
        Standing::Adopted => Kept::Gone,
        Standing::Lost if !outage.recovered(shared.redis.made()) => {
            return Err(RedisError::from((
                ErrorKind::Client,
                "the stream is no longer in the resume store",
            )));
        }
        Standing::Lost => {
            let again = Arc::new(give_back());
            match outage.ride(|| shared.batcher.append(again.clone())).await? {
                Standing::Ours => Kept::GivenBack,
                _ => Kept::Gone,
            }
        }
    };
    if !matches!(kept, Kept::Gone) {
        outage.went_through(shared.redis.made());
    }
    Ok(kept)
}

/// Ends the stream in Redis (see [`finish`]), giving it back first if Redis lost it (see
/// [`stands`]); whether it was still this pump's.
async fn end(
    shared: &Shared,
    (keys, name, shape): (&Arc<Keys>, &str, ErrorShape),
    log: &mut Log,
    outage: &mut Outage,
) -> RedisResult<bool> {
    let standing = outage.ride(|| finish(shared, (keys, name), log)).await?;
    let again_from = log.end;
    let give_back = || Append::again(keys, name, shape, again_from);
    match stands(shared, outage, standing, give_back).await? {
        Kept::Still => Ok(true),
        Kept::GivenBack => {
            log.given_back(again_from);
            let standing = outage.ride(|| finish(shared, (keys, name), log)).await?;
            Ok(standing == Standing::Ours)
        }
        Kept::Gone => Ok(false),
    }
}

/// Cuts off the readers `names`: here, at once; on other instances, through the stream's cut
/// set, which they look at every second.
async fn cut(
    shared: &Shared,
    keys: &Keys,
    pumped: &Pumped,
    readers: &mut Readers,
    names: Vec<String>,
) -> RedisResult<()> {
    let mut remote = Vec::new();
    {
        let local = lock(&pumped.readers);
        for name in names {
            match local.iter().find(|reader| reader.name == name) {
                Some(reader) => reader.cut(),
                None => remote.push(name.clone()),
            }
            readers.cut.insert(name);
        }
    }
    if remote.is_empty() {
        return Ok(());
    }
    let ttl = millis(RUNNING_TTL) as i64;
    shared
        .redis
        .query(
            redis::pipe()
                .sadd(&keys.cut, remote)
                .ignore()
                .pexpire(&keys.cut, ttl)
                .ignore(),
        )
        .await
}

/// Forgets the log's oldest entry (trimmed from Redis with the next append).
fn evict(log: &mut Log) {
    if let Some(((event, _), bytes)) = log.entries.pop_front() {
        log.bytes -= bytes;
        log.evicted = Some(event);
    }
}

/// Ends the stream for the claim `ARGV[1]`, if it is still its own: the end marker (the entry
/// `ARGV[2]`, whose `k` is `ARGV[5]`), the state `ended` with its `end` (`ARGV[3]`), the
/// request kept for an adopter gone, and every key kept for the retention (`ARGV[4]` ms).
/// Answers 1 if it ended it (run again by the same claim, its answer lost, it answers the
/// same), 0 if the stream is another claim's, 2 if it is not in Redis.
const FINISH: &str = r"
local claim = redis.call('HGET', KEYS[1], 'claim')
if claim == false then return 2 end
if claim ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'state') == 'ended' then return 1 end
redis.call('XADD', KEYS[2], ARGV[2], 'k', ARGV[5])
redis.call('HSET', KEYS[1], 'state', 'ended', 'end', ARGV[3])
redis.call('HDEL', KEYS[1], 'request')
for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[4]) end
return 1";

impl Log {
    /// Counts `frame` in as the next entry (its append follows, or the stream ends); returns
    /// its entry id, or `None` (and counts nothing) if that id does not follow the last one.
    fn add(&mut self, frame: &SseFrame) -> Option<EntryId> {
        let id = self.next_id(frame.id());
        if id <= self.last {
            return None;
        }
        self.entries.push_back((id, frame.bytes().len()));
        self.bytes += frame.bytes().len();
        self.last = id;
        if let Some(event) = frame.id() {
            self.end = event.saturating_add(1);
        }
        Some(id)
    }

    /// Redis lost the stream and the pump gave it back, its log starting at event `start`:
    /// what the log held before it is gone, and the log is new (its next append gives it its
    /// TTL).
    fn given_back(&mut self, start: u64) {
        while let Some(&((event, _), bytes)) = self.entries.front() {
            if event >= start {
                break;
            }
            self.entries.pop_front();
            self.bytes -= bytes;
        }
        self.evicted = None;
        self.fresh = true;
    }
}

/// The append of `batch` (counted in `log` already, each with its entry id) as `name`'s,
/// trimming what the log no longer holds (see `batcher.rs`).
fn prepare(
    (keys, name, shape): (&Arc<Keys>, &str, ErrorShape),
    log: &Log,
    batch: &[(EntryId, SseFrame)],
) -> Append {
    // What was evicted goes from Redis too, and the log's start moves past it.
    let evicted = log.evicted.map(|event| {
        let oldest = log.entries.front().map_or(log.last, |(oldest, _)| *oldest);
        (oldest, event.saturating_add(1))
    });
    Append {
        keys: keys.clone(),
        name: name.to_owned(),
        evicted,
        fresh: log.fresh,
        shape,
        again_from: None,
        frames: batch.to_vec(),
    }
}

/// Appends the end marker as `name`'s and keeps the stream for the retention; `end` (the id
/// after the last event) lets an attach past it answer that the stream finished. Whether the
/// stream was still its own.
async fn finish(shared: &Shared, (keys, name): (&Keys, &str), log: &Log) -> RedisResult<Standing> {
    let retain = millis(shared.options.retain.max(MIN_RETAIN));
    let mut pipe = redis::pipe();
    pipe.cmd("EVAL").arg(FINISH).arg(keys.all().len());
    for key in keys.all() {
        pipe.arg(key);
    }
    pipe.arg(name)
        .arg(format_id(log.next_id(None)))
        .arg(log.end)
        .arg(retain)
        .arg(END);
    let (answer,): (i64,) = shared.redis.query(&pipe).await?;
    Standing::from_answer(answer)
}
