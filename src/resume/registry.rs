//! The registry: streams keyed by request id, detached from connections.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::entry::{Entry, pump};
use super::subscriber::Subscriber;
use crate::chunk::Chunk;
use crate::gate::Consumer;
use crate::sync::{Arc, Mutex, lock};

/// The default grace: how long a stream whose last subscriber left goes on generating,
/// waiting for a resume.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// The default bound of a stream's replay log, in bytes (as [`Chunk::byte_len`] counts them).
pub const DEFAULT_LOG_BYTES: usize = 1024 * 1024;

/// The default bound of a stream's replay log, in events.
pub const DEFAULT_LOG_EVENTS: usize = 16 * 1024;

/// The default retention: how long the log of a finished stream can still be replayed.
pub const DEFAULT_RETAIN: Duration = Duration::from_secs(60);

/// How a [`Registry`] keeps its streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeOptions {
    pub(crate) grace: Duration,
    pub(crate) max_lag: Duration,
    pub(crate) read_ahead: usize,
    pub(crate) log_bytes: usize,
    pub(crate) log_events: usize,
    pub(crate) retain: Duration,
}

impl ResumeOptions {
    /// How long a stream goes on once its last subscriber left, waiting for one to attach
    /// again; then its generator is cancelled (ending as
    /// [`ConsumerGone`](crate::EndReason::ConsumerGone)) and its log is freed. Zero cancels at
    /// once, as a plain gated stream does when its client goes. Default [`DEFAULT_GRACE`].
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// How long a subscriber that has not read the log's oldest event may keep a full log from
    /// taking the next one (and, through the gate, the generator from making it); then it is
    /// cut off, the log evicts past it, and it ends as
    /// [`SlowConsumer`](crate::EndReason::SlowConsumer) ("behind") once it reaches the gap.
    /// One subscriber can set its own with [`Subscriber::with_max_lag`]. Default
    /// [`DEFAULT_MAX_PAUSE`](crate::DEFAULT_MAX_PAUSE).
    pub fn max_lag(mut self, max_lag: Duration) -> Self {
        self.max_lag = max_lag;
        self
    }

    /// How many events the log may hold that the slowest attached subscriber has not read
    /// (zero counts as one): past that the log takes nothing more, the gate fills and the
    /// generator pauses, as with a plain gated stream. Default
    /// [`DEFAULT_MAX_EVENTS`](crate::DEFAULT_MAX_EVENTS).
    pub fn read_ahead(mut self, events: usize) -> Self {
        self.read_ahead = events;
        self
    }

    /// The replay log's bounds (zero counts as one). Default [`DEFAULT_LOG_EVENTS`] and
    /// [`DEFAULT_LOG_BYTES`].
    pub fn log_bounds(mut self, events: usize, bytes: usize) -> Self {
        self.log_events = events;
        self.log_bytes = bytes;
        self
    }

    /// How long a finished stream's log can still be replayed, then it is removed. Default
    /// [`DEFAULT_RETAIN`].
    pub fn retain(mut self, retain: Duration) -> Self {
        self.retain = retain;
        self
    }
}

impl Default for ResumeOptions {
    fn default() -> Self {
        ResumeOptions {
            grace: DEFAULT_GRACE,
            max_lag: crate::DEFAULT_MAX_PAUSE,
            read_ahead: crate::DEFAULT_MAX_EVENTS,
            log_bytes: DEFAULT_LOG_BYTES,
            log_events: DEFAULT_LOG_EVENTS,
            retain: DEFAULT_RETAIN,
        }
    }
}

/// Why a subscriber could not attach.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttachError {
    /// No stream has this id: it never existed, or it ended and its retention ran out (an HTTP
    /// server answers 404).
    Unknown,
    /// The log no longer holds the position asked for: it starts at `oldest` (409).
    Gone {
        /// The first event id the log can still replay.
        oldest: u64,
    },
    /// The stream has ended and has nothing after the position asked for: the client had
    /// everything (an HTTP server answers 204, which also stops an `EventSource` from
    /// reconnecting).
    Finished,
    /// The store the logs live in failed (the Redis of a `RedisRegistry` did not answer), with
    /// its error (503).
    Unavailable(String),
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachError::Unknown => f.write_str("no stream has this id"),
            AttachError::Gone { oldest } => {
                write!(
                    f,
                    "the replay log no longer holds that position; it starts at event {oldest}"
                )
            }
            AttachError::Finished => {
                f.write_str("the stream has ended; nothing follows that position")
            }
            AttachError::Unavailable(error) => write!(f, "the resume store failed: {error}"),
        }
    }
}

impl std::error::Error for AttachError {}

/// A stream with this id is already registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicateId;

impl fmt::Display for DuplicateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a stream with this id is already registered")
    }
}

impl std::error::Error for DuplicateId {}

/// What a [`Registry`] holds now, and what happened so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegistryStats {
    /// Streams registered and not yet removed (running, or retained after their end).
    pub streams: usize,
    /// Running streams nobody is attached to: their grace is running.
    pub detached: usize,
    /// Attaches to a registered stream so far (every [`Registry::attach`]).
    pub resumed: u64,
    /// Streams whose grace ran out so far.
    pub expired: u64,
    /// Bytes held in every replay log now.
    pub log_bytes: usize,
}

/// Streams keyed by request id, detached from connections: a disconnect is not a stop.
///
/// [`register`](Registry::register) takes a gated stream's [`Consumer`] and moves its events
/// into a replay log, bounded by events and bytes, from which [`Subscriber`]s read, each at its
/// own position: the first one returned by `register`, more through
/// [`attach`](Registry::attach) at a position (an SSE `Last-Event-ID`), several at once.
///
/// - While subscribers are attached the log runs at most
///   [`read_ahead`](ResumeOptions::read_ahead) events ahead of the slowest, and evicts what all
///   of them have read; past that the gate fills and pauses the generator, as for a plain gated
///   stream. A subscriber that holds the log back longer than its
///   [`max_lag`](ResumeOptions::max_lag) is cut off: it no longer counts, and ends as
///   [`SlowConsumer`](crate::EndReason::SlowConsumer) with a "behind" message when it reaches
///   what the log evicted. It never holds the others back longer than that; when it was the
///   last one attached, the stream is detached (its grace starts; a zero grace ends it as
///   `SlowConsumer`).
/// - When the last subscriber leaves, the stream goes on for the [grace](ResumeOptions::grace):
///   the log keeps every event that subscriber had not read, and a full log pauses the
///   generator (through the gate's backpressure: give the gate a pause limit of at least the
///   grace, or none). An attach ends the grace; its expiry cancels the generator and frees the
///   log.
/// - [`stop`](Registry::stop) is the explicit stop (a user pressing Stop): the generator is
///   cancelled at once, the log stops waiting for anyone, and every subscriber sees the end
///   after the events before it.
/// - A stream that ended stays replayable for the [retention](ResumeOptions::retain), then is
///   removed.
/// - To stop a stream with a last word of its own (a final chunk with `finish_reason: "stop"`
///   and `[DONE]`, as OpenAI clients expect) instead of `Cancelled`: signal your generator
///   yourself (a `CancellationToken` it watches, say), and call
///   [`stop_waiting`](Registry::stop_waiting) so its last events reach every subscriber
///   without waiting for a slow one or a resume.
/// - Without a grace (zero: nobody can come back), the log keeps only what some subscriber has
///   still to read.
///
/// Needs a tokio runtime with time enabled.
///
/// # Examples
///
/// ```
/// use futures_util::StreamExt;
/// use streamgate::resume::{Registry, ResumeOptions};
/// use streamgate::Gate;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let registry = Registry::new(ResumeOptions::default());
/// let consumer = Gate::new().spawn(|_, mut tx| async move {
///     for token in ["a", "b", "c"] {
///         tx.send(token.to_owned()).await?;
///     }
///     Ok::<_, streamgate::SendError<String>>(())
/// });
/// let mut first = registry.register("req-1", consumer).unwrap();
/// let event = first.next().await.unwrap().unwrap();
/// assert_eq!((event.id(), event.chunk().as_str()), (0, "a"));
/// drop(first); // the client went away: the stream goes on, waiting for a resume
///
/// let resumed = registry.attach("req-1", Some(0)).unwrap();
/// let rest: Vec<_> = resumed.map(|event| event.unwrap().into_chunk()).collect().await;
/// assert_eq!(rest, ["b", "c"]);
/// # }
/// ```
pub struct Registry<C> {
    shared: Arc<Shared<C>>,
}

pub(crate) struct Shared<C> {
    pub(crate) options: ResumeOptions,
    streams: Mutex<HashMap<Arc<str>, Arc<Entry<C>>>>,
    resumed: AtomicU64,
    expired: AtomicU64,
}

impl<C> Shared<C> {
    pub(crate) fn expired(&self) {
        self.expired.fetch_add(1, Ordering::Relaxed);
    }

    /// Removes `entry`, if it is still the one registered under its id.
    pub(crate) fn remove(&self, entry: &Arc<Entry<C>>) {
        let mut streams = lock(&self.streams);
        if streams
            .get(&entry.id)
            .is_some_and(|held| Arc::ptr_eq(held, entry))
        {
            streams.remove(&entry.id);
        }
    }
}

impl<C> Clone for Registry<C> {
    fn clone(&self) -> Self {
        Registry {
            shared: self.shared.clone(),
        }
    }
}

impl<C> fmt::Debug for Registry<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("options", &self.shared.options)
            .field("streams", &lock(&self.shared.streams).len())
            .finish()
    }
}

impl<C> Registry<C>
where
    C: Chunk + Clone + Send + Sync + 'static,
{
    /// An empty registry keeping its streams as `options` says.
    pub fn new(options: ResumeOptions) -> Self {
        Registry {
            shared: Arc::new(Shared {
                options,
                streams: Mutex::new(HashMap::new()),
                resumed: AtomicU64::new(0),
                expired: AtomicU64::new(0),
            }),
        }
    }

    /// Registers the stream of `consumer` under `id` and returns its first subscriber, reading
    /// from the stream's first event.
    ///
    /// # Errors
    ///
    /// [`DuplicateId`] if a stream is registered under `id` (then `consumer` is dropped, which
    /// ends its gate).
    ///
    /// # Panics
    ///
    /// If called outside a tokio runtime.
    pub fn register(
        &self,
        id: impl Into<Arc<str>>,
        consumer: Consumer<C>,
    ) -> Result<Subscriber<C>, DuplicateId> {
        let id = id.into();
        let options = self.shared.options;
        let entry = Arc::new(Entry::new(
            id.clone(),
            consumer.handle(),
            options.log_events,
            options.log_bytes,
            options.read_ahead,
            !options.grace.is_zero(),
        ));
        {
            let mut streams = lock(&self.shared.streams);
            if streams.contains_key(&id) {
                return Err(DuplicateId);
            }
            streams.insert(id, entry.clone());
        }
        let subscriber = Subscriber::attached(entry.clone(), 0, self.shared.clone(), false);
        tokio::spawn(pump(entry, consumer, self.shared.clone()));
        subscriber.map_err(|_| DuplicateId)
    }

    /// Attaches a subscriber to the stream `id`, reading the events after `after` (an SSE
    /// `Last-Event-ID`; `None`: from the stream's first event) from the log, then the live
    /// ones, then the stream's end. Ends the grace if it was running.
    ///
    /// # Errors
    ///
    /// [`AttachError::Unknown`] if no stream has this id (or its grace ran out),
    /// [`AttachError::Gone`] if the log no longer holds the position,
    /// [`AttachError::Finished`] if the stream has ended and nothing follows the position.
    pub fn attach(&self, id: &str, after: Option<u64>) -> Result<Subscriber<C>, AttachError> {
        let entry = lock(&self.shared.streams)
            .get(id)
            .cloned()
            .ok_or(AttachError::Unknown)?;
        let next = after.map_or(0, |after| after.saturating_add(1));
        let subscriber = Subscriber::attached(entry, next, self.shared.clone(), true)?;
        self.shared.resumed.fetch_add(1, Ordering::Relaxed);
        Ok(subscriber)
    }

    /// Stops the stream `id` on purpose: its generator is cancelled at once (ending as
    /// [`Cancelled`](crate::EndReason::Cancelled)) and every subscriber, attached now or later
    /// within the retention, sees that end. Returns whether a stream had this id.
    pub fn stop(&self, id: &str) -> bool {
        let entry = lock(&self.shared.streams).get(id).cloned();
        entry.is_some_and(|entry| {
            entry.stop_waiting();
            entry.handle.cancel();
            true
        })
    }

    /// Lets the stream `id` end without waiting: from now on its log takes every event at once
    /// instead of waiting for a slow subscriber or a resume (those fall behind), so a generator
    /// being stopped on purpose can still send its last events (a final chunk) and finish.
    /// [`stop`](Registry::stop) does this too. Returns whether a stream had this id.
    pub fn stop_waiting(&self, id: &str) -> bool {
        let entry = lock(&self.shared.streams).get(id).cloned();
        entry.is_some_and(|entry| {
            entry.stop_waiting();
            true
        })
    }

    /// Whether a stream is registered under `id` (running, or retained after its end).
    pub fn contains(&self, id: &str) -> bool {
        lock(&self.shared.streams).contains_key(id)
    }

    /// What the registry holds now, and what happened so far.
    pub fn stats(&self) -> RegistryStats {
        let streams = lock(&self.shared.streams);
        let mut stats = RegistryStats {
            streams: streams.len(),
            resumed: self.shared.resumed.load(Ordering::Relaxed),
            expired: self.shared.expired.load(Ordering::Relaxed),
            ..RegistryStats::default()
        };
        for entry in streams.values() {
            let state = lock(&entry.state);
            stats.log_bytes += state.log.bytes();
            if state.attached() == 0 && state.end.is_none() && !state.expired {
                stats.detached += 1;
            }
        }
        stats
    }
}
