//! A reader of a stream in Redis, on any instance: its lease, its position, and its task that
//! reads the log (or, on the pump's instance, the pump's tail in memory) into a channel.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use futures_core::Stream;
use redis::RedisResult;
use redis::aio::MultiplexedConnection;
use tokio::sync::mpsc;

use super::keys::{
    Entries, EntryId, Keys, LogEntry, format_id, millis, now_ms, parse_entry, parse_id,
};
use super::outage::Outage;
use super::shared::{Position, Pumped, Shared};
use super::tail::Found;
use super::timing::{BATCH, BLOCK, LEASE, LEASE_RENEWAL, RUNNING_TTL, TICK};
use crate::end::EndReason;
use crate::gate::GateError;
use crate::resume::error::{AttachError, StoreError};
use crate::sse::{ErrorShape, SseFrame, end_frame};
use crate::sync::Arc;

/// One reader of a stream kept in Redis: the frames after its position, from the log then
/// live, then the stream's end. It holds a lease in Redis while it lives (the stream is
/// attached while any reader's lease is valid), and its position counts for the stream's
/// read-ahead: in memory when this instance pumps the stream, in Redis otherwise.
pub(crate) struct RedisReader {
    frames: mpsc::Receiver<SseFrame>,
    position: Arc<Position>,
    /// The stream, when this instance pumps it.
    local: Option<Arc<Pumped>>,
    /// How far a reader on another instance moves before it writes its position at once.
    eager: u64,
    done: bool,
}

impl RedisReader {
    /// Takes a lease on the stream `id` and starts reading it after `after`. On another
    /// instance than the pump's, it returns once the pump has looked at the readers since the
    /// lease was taken, so that from then on it holds this reader to the read-ahead as it holds
    /// one of its own instance; a position the log gave up meanwhile is
    /// [`AttachError::Gone`]. Its own ends (cut off, the store failing) are in `shape`.
    pub(crate) async fn attach(
        shared: Arc<Shared>,
        id: &str,
        after: Option<u64>,
        shape: ErrorShape,
    ) -> Result<Self, AttachError> {
        let unavailable = |error| AttachError::Unavailable(StoreError::new(error));
        let keys = Keys::new(id);
        let next = after.map_or(0, |after| after.saturating_add(1));
        let position = Arc::new(Position::new(shared.name(), next));
        let local = shared.pumped(id);
        // A reader on another instance says where it is in Redis, for the stream's pump.
        let looks = lease(&shared, &keys, &position, local.is_none())
            .await
            .map_err(unavailable)?;
        if let Some(local) = &local {
            local.add(position.clone());
        }
        let (tx, frames) = mpsc::channel(BATCH);
        // The entry of event `after`: the reader goes on after it.
        let last = after.map(|after| (after, 1));
        let shared_read_ahead = shared.options.read_ahead as u64;
        tokio::spawn(run(
            shared.clone(),
            keys.clone(),
            position.clone(),
            local.clone(),
            (last, shape),
            tx,
        ));
        let reader = RedisReader {
            frames,
            position,
            local,
            eager: (shared_read_ahead / 2).max(1),
            done: false,
        };
        if reader.local.is_none() {
            // Dropping the reader on the way out gives its lease up.
            seen(&shared, &keys, looks, next).await?;
        }
        Ok(reader)
    }
}

/// Takes or renews the lease of `reader` (with `positioned`, its position too); returns how
/// many times the stream's pump has looked at its readers so far.
async fn lease(
    shared: &Shared,
    keys: &Keys,
    reader: &Position,
    positioned: bool,
) -> RedisResult<u64> {
    let expiry = now_ms().saturating_add(millis(LEASE));
    let ttl = millis(RUNNING_TTL) as i64;
    // One instant: the lease and the count of looks that did not see it (see `seen`).
    let mut pipe = redis::pipe();
    pipe.atomic()
        .zadd(&keys.readers, &reader.name, expiry)
        .ignore()
        .pexpire(&keys.readers, ttl)
        .ignore();
    if positioned {
        let next = reader.next.load(Ordering::Relaxed);
        pipe.hset(&keys.positions, &reader.name, next)
            .ignore()
            .pexpire(&keys.positions, ttl)
            .ignore();
    }
    let (looks,): (Option<u64>,) = shared.redis.query(pipe.hget(&keys.meta, "looks")).await?;
    Ok(looks.unwrap_or(0))
}

/// Waits until the pump of the stream has looked at its readers after `looks` (so it knows
/// the reader who saw that count at `next`), at most [`SEEN_WAIT`]: a pump that does not look
/// (its instance died) is not waited for. [`AttachError::Gone`] if the log gave up `next`
/// meanwhile.
async fn seen(shared: &Shared, keys: &Keys, looks: u64, next: u64) -> Result<(), AttachError> {
    let deadline = tokio::time::Instant::now() + SEEN_WAIT;
    loop {
        let ((state, now, start),): ((Option<String>, Option<u64>, Option<u64>),) = shared
            .redis
            .query(redis::pipe().hmget(&keys.meta, &["state", "looks", "start"]))
            .await
            .map_err(|error| AttachError::Unavailable(StoreError::new(error)))?;
        if let Some(oldest) = start.filter(|&oldest| next < oldest) {
            return Err(AttachError::Gone { oldest });
        }
        let pumped = state.as_deref() == Some("running");
        if !pumped || now.unwrap_or(0) > looks || tokio::time::Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(SEEN_POLL).await;
    }
}

/// How often an attach on another instance asks whether the pump has seen it, and for how long.
const SEEN_POLL: std::time::Duration = std::time::Duration::from_millis(10);
const SEEN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The reader's task: renews its lease (and, for a reader on another instance than the pump,
/// writes its position every tick it moved) while it reads the log into `tx` (from the pump's
/// tail in memory while `local`, the stream pumped here, holds what it needs), until the end,
/// the reader's drop or its cut; then gives the lease up.
async fn run(
    shared: Arc<Shared>,
    keys: Keys,
    position: Arc<Position>,
    local: Option<Arc<Pumped>>,
    (last, shape): (Option<EntryId>, ErrorShape),
    tx: mpsc::Sender<SseFrame>,
) {
    let remote = local.is_none();
    let keep = async {
        // A reader on another instance than the pump's writes its position every tick it
        // moved; one on the pump's only renews its lease.
        let every = if remote { TICK } else { LEASE_RENEWAL };
        let renewals = (LEASE_RENEWAL.as_millis() / every.as_millis()).max(1) as u64;
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n = 0u64;
        loop {
            // Every tick, or at once when the reader moved by half the read-ahead.
            let due = tokio::select! {
                _ = tick.tick() => {
                    n += 1;
                    n % renewals == 0
                }
                () = position.moved.notified() => false,
            };
            let next = position.next.load(Ordering::Relaxed);
            let moved = next != position.written.load(Ordering::Relaxed);
            if remote && (moved || due) {
                // A failing Redis ends the read too, which says so.
                let _ = lease(&shared, &keys, &position, true).await;
                position.written.store(next, Ordering::Relaxed);
            } else if due {
                let _ = lease(&shared, &keys, &position, false).await;
            }
        }
    };
    // Cut off here by the pump of this instance (one on another learns it at its next read).
    let cut = position.cut_notify.notified();
    // The id after the last frame sent into `tx`: where a terminal frame comes.
    let queued = AtomicU64::new(last.map_or(0, |(event, _)| event.saturating_add(1)));
    let reading = Reading {
        position: &position,
        shape,
        queued: &queued,
    };
    let end = tokio::select! {
        () = tx.closed() => None,
        () = keep => None,
        () = cut => Some(behind(&reading, shared.options.max_lag)),
        end = read(&shared, &keys, local.as_deref(), &reading, last, &tx) => end,
    };
    if let Some(frame) = end {
        // Nobody may read it any more: then there is nothing to say.
        let _ = tx.send(frame).await;
    }
    let _: RedisResult<()> = shared
        .redis
        .query(
            redis::pipe()
                .zrem(&keys.readers, &position.name)
                .ignore()
                .hdel(&keys.positions, &position.name)
                .ignore()
                .srem(&keys.cut, &position.name)
                .ignore(),
        )
        .await;
}

/// A reader's read: its position, the shape of its ends, and the id after the last frame it
/// queued for its consumer (where its terminal frame comes).
struct Reading<'a> {
    position: &'a Position,
    shape: ErrorShape,
    queued: &'a AtomicU64,
}

impl Reading<'_> {
    /// Its terminal frame of type `kind` saying `message`, after the frames it queued.
    fn end(&self, kind: &str, message: &str) -> SseFrame {
        let next = self.queued.load(Ordering::Relaxed);
        self.shape.frame(kind, message, Some(next))
    }

    /// Queues `frame` for the consumer; whether it is still there to read it.
    async fn queue(&self, tx: &mpsc::Sender<SseFrame>, frame: SseFrame) -> bool {
        let after = frame.id().map(|id| id.saturating_add(1));
        if tx.send(frame).await.is_err() {
            return false;
        }
        if let Some(after) = after {
            self.queued.store(after, Ordering::Relaxed);
        }
        true
    }
}

/// The terminal frame of a reader cut off for holding the log back.
fn behind(reading: &Reading<'_>, max_lag: std::time::Duration) -> SseFrame {
    let at = reading.position.next.load(Ordering::Relaxed);
    let why =
        format!("behind: cut off at event {at} after holding the replay log back for {max_lag:?}");
    let error = GateError::new(EndReason::SlowConsumer, Some(why.into()));
    let next = reading.queued.load(Ordering::Relaxed);
    end_frame(&error, reading.shape, Some(next))
}

/// Sends the frames of the entries after `last` until the end marker (`None`), or returns the
/// terminal frame of a read that cannot go on. While the stream is pumped here (`local`) and
/// its tail holds what follows, from memory; otherwise from the log in Redis.
async fn read(
    shared: &Shared,
    keys: &Keys,
    local: Option<&Pumped>,
    reading: &Reading<'_>,
    mut last: Option<EntryId>,
    tx: &mpsc::Sender<SseFrame>,
) -> Option<SseFrame> {
    let reader = reading.position;
    let max_lag = shared.options.max_lag;
    let store_error = |message: &str| {
        let frame = reading.end(EndReason::ResumeStoreError.as_str(), message);
        Some(frame.ending(EndReason::ResumeStoreError))
    };
    let failed = || store_error("the resume store failed");
    // For `XREAD BLOCK`, which would hold up every other command on a shared connection: made
    // when first needed (a reader fed from memory never needs it).
    let mut blocking = None::<MultiplexedConnection>;
    // Redis away: the read is tried again for the outage window (the reader pauses).
    let mut outage = Outage::new(shared.options.outage);
    loop {
        if let Some(local) = local {
            let appended = local.appended.notified();
            tokio::pin!(appended);
            appended.as_mut().enable();
            match local.after(last, BATCH) {
                Found::Frames(frames) => {
                    for (id, frame) in frames {
                        if !reading.queue(tx, frame).await {
                            return None;
                        }
                        last = Some(id);
                    }
                    continue;
                }
                Found::Nothing => {
                    appended.await;
                    continue;
                }
                Found::Elsewhere => {}
                Found::Failed => return failed(),
            }
        }
        let from = last.map_or_else(|| "-".to_owned(), |id| format!("({}", format_id(id)));
        // The log's start, whether the pump cut this reader off, and the next entries, at one
        // instant.
        let mut snapshot = redis::pipe();
        snapshot
            .atomic()
            .hget(&keys.meta, "start")
            .sismember(&keys.cut, &reader.name)
            .cmd("XRANGE")
            .arg(&keys.log)
            .arg(from)
            .arg("+")
            .arg("COUNT")
            .arg(BATCH);
        let snapshot: RedisResult<(Option<u64>, bool, Entries)> =
            outage.ride(|| shared.redis.query(&snapshot)).await;
        let Ok((start, cut, entries)) = snapshot else {
            return failed();
        };
        if cut {
            return Some(behind(reading, max_lag));
        }
        let Some(start) = start else {
            // Right after an outage, Redis may have come back empty: the stream's pump gives
            // it back at its next call (within the window).
            if let Some(wait) = outage.retry_missing(shared.redis.made()) {
                tokio::time::sleep(wait).await;
                continue;
            }
            return store_error("the stream is no longer in the resume store");
        };
        outage.found();
        outage.went_through(shared.redis.made());
        let next = last.map_or(0, |(event, _)| event.saturating_add(1));
        if next < start {
            let why = format!(
                "behind: the replay log starts at event {start}, this subscriber was at {next}"
            );
            let error = GateError::new(EndReason::SlowConsumer, Some(why.into()));
            return Some(end_frame(&error, reading.shape, Some(next)));
        }
        if entries.is_empty() {
            let connection = match blocking.as_mut() {
                Some(connection) => connection,
                None => match shared.redis.dedicated().await {
                    Ok(connection) => blocking.insert(connection),
                    Err(error) => match outage.retry(&error) {
                        Some(wait) => {
                            tokio::time::sleep(wait).await;
                            continue;
                        }
                        None => return failed(),
                    },
                },
            };
            // Until something comes (or a while, to look at the stream again).
            let wait = redis::cmd("XREAD")
                .arg("BLOCK")
                .arg(millis(BLOCK))
                .arg("COUNT")
                .arg(1)
                .arg("STREAMS")
                .arg(&keys.log)
                .arg(format_id(last.unwrap_or((0, 0))))
                .query_async::<redis::Value>(connection)
                .await;
            if let Err(error) = wait {
                // A new connection for the next wait.
                blocking = None;
                match outage.retry(&error) {
                    Some(wait) => tokio::time::sleep(wait).await,
                    None => return failed(),
                }
            }
            continue;
        }
        for (id, fields) in entries {
            let id = parse_id(&id);
            match id.and_then(|id| parse_entry(id, &fields)) {
                Some(LogEntry::Frame(frame)) => {
                    if !reading.queue(tx, frame).await {
                        return None;
                    }
                }
                Some(LogEntry::End) => return None,
                None => return failed(),
            }
            last = id;
        }
    }
}

impl Stream for RedisReader {
    type Item = SseFrame;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<SseFrame>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let frame = ready!(this.frames.poll_recv(cx));
        match &frame {
            Some(frame) => {
                if let Some(id) = frame.id() {
                    let next = id.saturating_add(1);
                    let position = &this.position;
                    position.next.store(next, Ordering::Relaxed);
                    match &this.local {
                        Some(local) => local.moved.notify_one(),
                        None => {
                            let written = position.written.load(Ordering::Relaxed);
                            if next.saturating_sub(written) >= this.eager {
                                position.moved.notify_one();
                            }
                        }
                    }
                }
            }
            None => this.done = true,
        }
        Poll::Ready(frame)
    }
}

impl Drop for RedisReader {
    fn drop(&mut self) {
        if let Some(local) = &self.local {
            local.remove(&self.position.name);
        }
    }
}
