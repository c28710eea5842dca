//! What a Redis store's pumps, readers and claims share: the connection, the batcher, the
//! options, the streams this instance pumps and the positions of their readers here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis::Client;
use tokio::sync::{Notify, watch};

use super::batcher::Batcher;
use super::connection::Connection;
use super::keys::EntryId;
use super::tail::{Found, Tail};
use crate::gate::GateHandle;
use crate::resume::options::ResumeOptions;
use crate::resume::stats::Counters;
use crate::sse::SseFrame;
use crate::sync::{Arc, Mutex, lock};

/// What an explicit stop asked through any instance calls for a stream pumped here.
pub(crate) type StopHook = Box<dyn Fn(&str) + Send + Sync>;

/// Shared by a Redis store's pumps, readers and claims.
pub(crate) struct Shared {
    /// The connection for short commands.
    pub(crate) redis: Arc<Connection>,
    /// Groups the pumps' appends and looks into one round trip.
    pub(crate) batcher: Batcher,
    pub(crate) options: ResumeOptions,
    pub(crate) on_stop: StopHook,
    /// The streams this instance pumps.
    pub(crate) pumped: Mutex<HashMap<Arc<str>, Arc<Pumped>>>,
    pub(crate) counters: Counters,
    /// The ids whose claims, dropped unregistered here, are being given back in Redis: a
    /// claim here waits for that first, so an id dropped is free at once on this instance.
    pub(crate) releasing: Mutex<HashMap<String, watch::Receiver<bool>>>,
    /// Names this instance's readers and claims in Redis.
    pub(crate) instance: u64,
    next_name: AtomicU64,
}

/// A stream this instance pumps: its gate, its readers here, what it appended that they may
/// still need, and what its stats count.
pub(crate) struct Pumped {
    pub(crate) handle: GateHandle,
    /// The readers attached through this instance, whose positions the pump reads here.
    pub(crate) readers: Mutex<Vec<Arc<Position>>>,
    tail: Mutex<Tail>,
    /// The pump appended to the tail, or stopped.
    pub(crate) appended: Notify,
    /// A reader here moved (or was added), or the stream was told to stop waiting.
    pub(crate) moved: Notify,
    /// An explicit stop reached it: its last events wait for nobody.
    pub(crate) stop_waiting: AtomicBool,
    pub(crate) detached: AtomicBool,
    pub(crate) bytes: AtomicU64,
}

/// One reader's position: the id of the next event it needs, moved as it yields frames, and
/// whether the pump cut it off.
#[derive(Debug)]
pub(crate) struct Position {
    /// Its name in the stream's readers, positions and cut set.
    pub(crate) name: String,
    pub(crate) next: AtomicU64,
    /// The position last written to Redis (a reader on another instance than the pump's).
    pub(crate) written: AtomicU64,
    /// Wakes the reader's task to write its position now: it moved by half the read-ahead.
    pub(crate) moved: Notify,
    pub(crate) cut: AtomicBool,
    /// Wakes the reader's task when it is cut off.
    pub(crate) cut_notify: Notify,
}

impl Position {
    pub(crate) fn new(name: String, next: u64) -> Self {
        Position {
            name,
            next: AtomicU64::new(next),
            written: AtomicU64::new(next),
            moved: Notify::new(),
            cut: AtomicBool::new(false),
            cut_notify: Notify::new(),
        }
    }

    /// Cuts the reader off: it ends as behind at once.
    pub(crate) fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
        self.cut_notify.notify_one();
    }
}

impl Pumped {
    /// A stream this instance is to pump, whose log's last entry is `last` (`None`: a new
    /// stream).
    pub(crate) fn new(handle: GateHandle, last: Option<EntryId>) -> Self {
        Pumped {
            handle,
            readers: Mutex::new(Vec::new()),
            tail: Mutex::new(Tail::new(last)),
            appended: Notify::new(),
            moved: Notify::new(),
            stop_waiting: AtomicBool::new(false),
            detached: AtomicBool::new(false),
            bytes: AtomicU64::new(0),
        }
    }

    /// Adds a reader here.
    pub(crate) fn add(&self, position: Arc<Position>) {
        lock(&self.readers).push(position);
        self.moved.notify_one();
    }

    /// Removes the reader `name`.
    pub(crate) fn remove(&self, name: &str) {
        lock(&self.readers).retain(|reader| reader.name != name);
        self.moved.notify_one();
    }

    /// Redis has the entries `appended`: readers here are fed them from memory, and what no
    /// reader here needs any more is forgotten.
    pub(crate) fn appended(&self, appended: impl IntoIterator<Item = (EntryId, SseFrame)>) {
        let slowest = lock(&self.readers)
            .iter()
            .filter(|reader| !reader.cut.load(Ordering::Relaxed))
            .map(|reader| reader.next.load(Ordering::Relaxed))
            .min();
        let mut tail = lock(&self.tail);
        for (id, frame) in appended {
            tail.push(id, frame);
        }
        tail.trim(slowest);
        drop(tail);
        self.appended.notify_waiters();
    }

    /// At most `max` of the entries after `last` (`None`: from the log's start), if the tail
    /// holds them.
    pub(crate) fn after(&self, last: Option<EntryId>, max: usize) -> Found {
        lock(&self.tail).after(last, max)
    }

    /// The pump stopped: readers here read on from Redis, or end at once if Redis `failed` it.
    pub(crate) fn stopped(&self, failed: bool) {
        lock(&self.tail).close(failed);
        self.appended.notify_waiters();
    }
}

impl Shared {
    pub(crate) fn new(client: Client, options: ResumeOptions, on_stop: StopHook) -> Self {
        use std::hash::{BuildHasher, RandomState};
        let redis = Arc::new(Connection::new(client));
        Shared {
            batcher: Batcher::new(redis.clone()),
            redis,
            options,
            on_stop,
            pumped: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            releasing: Mutex::new(HashMap::new()),
            instance: RandomState::new().hash_one(super::keys::now_ms()),
            next_name: AtomicU64::new(0),
        }
    }

    /// A name for a new reader or claim, unique across instances.
    pub(crate) fn name(&self) -> String {
        let n = self.next_name.fetch_add(1, Ordering::Relaxed);
        format!("{:x}-{n}", self.instance)
    }

    /// The stream `id`, if this instance pumps it.
    pub(crate) fn pumped(&self, id: &str) -> Option<Arc<Pumped>> {
        lock(&self.pumped).get(id).cloned()
    }
}
