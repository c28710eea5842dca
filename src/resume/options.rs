//! How a registry keeps its streams: the grace, the readers' lag and read-ahead, the replay
//! log's bounds, the retention.

use std::time::Duration;

/// The default grace: how long a stream whose last subscriber left goes on generating,
/// waiting for a resume.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// The default bound of a stream's replay log, in bytes (as an event's encoded frame counts
/// them in Redis, as [`Chunk::byte_len`](crate::Chunk::byte_len) counts them in memory).
pub const DEFAULT_LOG_BYTES: usize = 1024 * 1024;

/// The default bound of a stream's replay log, in events.
pub const DEFAULT_LOG_EVENTS: usize = 16 * 1024;

/// The default retention: how long the log of a finished stream can still be replayed.
pub const DEFAULT_RETAIN: Duration = Duration::from_secs(60);

/// The default outage window: how long the Redis store rides out Redis being away.
pub const DEFAULT_OUTAGE: Duration = Duration::from_secs(10);

/// How a [`Registry`](super::Registry) keeps its streams, whichever store holds them.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamgate::resume::ResumeOptions;
///
/// let options = ResumeOptions::default()
///     .grace(Duration::from_secs(30))        // a disconnect waits this long for a resume
///     .retain(Duration::from_secs(30))       // a finished stream stays replayable this long
///     .read_ahead(64)                        // a reader may fall this many events behind...
///     .max_lag(Duration::from_secs(10))      // ...holding the others back at most this long
///     .log_bounds(16 * 1024, 1024 * 1024)    // the replay log's events and bytes
///     .outage(Duration::from_secs(10));      // Redis may be away this long (a restart)
/// assert_eq!(options, options.clone());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeOptions {
    pub(crate) grace: Duration,
    pub(crate) max_lag: Duration,
    pub(crate) read_ahead: usize,
    pub(crate) log_bytes: usize,
    pub(crate) log_events: usize,
    pub(crate) retain: Duration,
    pub(crate) outage: Duration,
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

    /// How long the slowest attached subscriber may keep the log from taking the next event
    /// (and, through the gate, the generator from making it): past its
    /// [`read_ahead`](ResumeOptions::read_ahead), or when the log is full of events it has not
    /// read. Then it is cut off: it no longer holds anyone back, and it ends as
    /// [`SlowConsumer`](crate::EndReason::SlowConsumer) ("behind"). Default
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

    /// How long the Redis store rides out Redis being away (a restart, a failover, a dropped
    /// connection): its pumps and readers try again, waiting longer each time, and their
    /// streams pause meanwhile (nothing reaches a subscriber before Redis acknowledged it), then
    /// go on where they were. Past the window, the streams end with a `resume_store_error`
    /// frame and as [`ResumeStoreError`](crate::EndReason::ResumeStoreError). A Redis that
    /// comes back empty (restarted without persistence) gets each running stream back from its
    /// pump, its log starting where the pump was: a resume from further back is
    /// [`Gone`](super::AttachError::Gone). The memory store has nothing to ride out. Default
    /// [`DEFAULT_OUTAGE`].
    pub fn outage(mut self, window: Duration) -> Self {
        self.outage = window;
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
            outage: DEFAULT_OUTAGE,
        }
    }
}
