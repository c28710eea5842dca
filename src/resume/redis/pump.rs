//! The pump: moves a gated stream's frames into its log in Redis, and keeps its grace, its stop
//! and its keys' TTL.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::Ordering;

use futures_core::Stream;
use redis::RedisResult;
use tokio::time::{Instant, MissedTickBehavior};

use super::keys::{END, EntryId, Keys, format_id, millis};
use super::registry::Store;
use super::{MIN_RETAIN, RUNNING_TTL, TICK};
use crate::end::EndReason;
use crate::gate::GateHandle;
use crate::sse::SseFrame;
use crate::sync::{Arc, lock};

/// What the pump appended and its log still holds, oldest first, within the registry's bounds.
struct Log {
    entries: VecDeque<(EntryId, usize)>,
    bytes: usize,
    /// The last entry appended.
    last: EntryId,
    max_events: usize,
    max_bytes: usize,
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
}

/// Pumps `frames` (a gated stream, encoded) into the log of the stream `id` until it ends, the
/// grace runs out or Redis fails (which cancels the gate as `ConsumerGone`).
pub(crate) async fn pump<S>(store: Arc<Store>, id: Arc<str>, handle: GateHandle, mut frames: S)
where
    S: Stream<Item = SseFrame> + Unpin,
{
    let keys = Keys::new(&id);
    if run(&store, &id, &keys, &handle, &mut frames).await.is_err() {
        let _ = handle.cancel_with(EndReason::ConsumerGone);
    }
    lock(&store.pumped).remove(&id);
}

async fn run<S>(
    store: &Store,
    id: &str,
    keys: &Keys,
    handle: &GateHandle,
    frames: &mut S,
) -> RedisResult<()>
where
    S: Stream<Item = SseFrame> + Unpin,
{
    let options = store.options;
    let mut log = Log {
        entries: VecDeque::new(),
        bytes: 0,
        last: (0, 0),
        max_events: options.log_events.max(1),
        max_bytes: options.log_bytes.max(1),
    };
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // The first subscriber took its lease before the pump started.
    let mut attached = true;
    let mut alone_since = None::<Instant>;
    let mut stopped = false;
    // A frame taken from the gate and not yet appended: with nobody attached, it waits for
    // room (and the gate behind it fills, pausing the generator).
    let mut pending = None::<SseFrame>;
    loop {
        tokio::select! {
            biased;
            _ = tick.tick() => {
                let (readers, stop) = watch(store, keys).await?;
                if stop && !stopped {
                    stopped = true;
                    match store.on_stop.get() {
                        Some(hook) => hook(id),
                        None => handle.cancel(),
                    }
                }
                attached = readers > 0;
                if attached {
                    alone_since = None;
                } else if alone_since.get_or_insert_with(Instant::now).elapsed() >= options.grace {
                    // Nobody came back in time.
                    let _ = handle.cancel_with(EndReason::ConsumerGone);
                    store.expired.fetch_add(1, Ordering::Relaxed);
                    return store.query(redis::pipe().del(&keys.all()).ignore()).await;
                }
                if let Some(pumped) = lock(&store.pumped).get_mut(id) {
                    pumped.detached = !attached;
                    pumped.bytes = log.bytes;
                }
            }
            frame = next(frames), if pending.is_none() => match frame {
                Some(frame) => pending = Some(frame),
                None => return finish(store, keys, &log).await,
            },
        }
        if let Some(frame) = pending.take_if(|frame| attached || log.fits(frame)) {
            append(store, keys, &mut log, frame).await?;
        }
    }
}

async fn next<S: Stream<Item = SseFrame> + Unpin>(frames: &mut S) -> Option<SseFrame> {
    std::future::poll_fn(|cx| Pin::new(&mut *frames).poll_next(cx)).await
}

/// Drops lapsed leases and renews the keys' TTL; returns how many subscribers are attached and
/// whether a stop was asked for.
async fn watch(store: &Store, keys: &Keys) -> RedisResult<(u64, bool)> {
    let ttl = millis(RUNNING_TTL) as i64;
    let (readers, stop): (u64, Option<String>) = store
        .query(
            redis::pipe()
                .cmd("ZREMRANGEBYSCORE")
                .arg(&keys.readers)
                .arg("-inf")
                .arg(super::keys::now_ms())
                .ignore()
                .zcard(&keys.readers)
                .hget(&keys.meta, "stop")
                .pexpire(&keys.log, ttl)
                .ignore()
                .pexpire(&keys.meta, ttl)
                .ignore()
                .pexpire(&keys.readers, ttl)
                .ignore(),
        )
        .await?;
    Ok((readers, stop.is_some()))
}

/// Appends `frame`, evicting the oldest entries it does not fit beside.
async fn append(store: &Store, keys: &Keys, log: &mut Log, frame: SseFrame) -> RedisResult<()> {
    let id = log.next_id(frame.id());
    let mut evicted = None;
    while !log.fits(&frame) {
        let Some(((event, _), bytes)) = log.entries.pop_front() else {
            break;
        };
        log.bytes -= bytes;
        evicted = Some(event);
    }
    let mut pipe = redis::pipe();
    let add = pipe
        .cmd("XADD")
        .arg(&keys.log)
        .arg(format_id(id))
        .arg("k")
        .arg(frame.kind().as_str())
        .arg("f")
        .arg(&frame.bytes()[..]);
    // A terminal frame keeps its end reason, for the probes of a reader on any instance.
    if let Some(reason) = frame.end_reason() {
        add.arg("e").arg(reason.as_str());
    }
    add.ignore();
    if let Some(event) = evicted {
        let oldest = log.entries.front().map_or(id, |(oldest, _)| *oldest);
        pipe.cmd("XTRIM")
            .arg(&keys.log)
            .arg("MINID")
            .arg(format_id(oldest))
            .ignore()
            .hset(&keys.meta, "start", event.saturating_add(1))
            .ignore();
    }
    store
        .query::<()>(pipe.pexpire(&keys.log, millis(RUNNING_TTL) as i64).ignore())
        .await?;
    log.entries.push_back((id, frame.bytes().len()));
    log.bytes += frame.bytes().len();
    log.last = id;
    Ok(())
}

/// Appends the end marker and keeps the stream for the retention.
async fn finish(store: &Store, keys: &Keys, log: &Log) -> RedisResult<()> {
    let retain = millis(store.options.retain.max(MIN_RETAIN)) as i64;
    let mut pipe = redis::pipe();
    pipe.cmd("XADD")
        .arg(&keys.log)
        .arg(format_id(log.next_id(None)))
        .arg("k")
        .arg(END)
        .ignore()
        .hset(&keys.meta, "state", "ended")
        .ignore();
    for key in keys.all() {
        pipe.pexpire(key, retain).ignore();
    }
    store.query(&pipe).await
}
