//! Slow-consumer policies: what the gate does when its consumer does not drain it.

use std::time::Duration;

/// How long a generator may be paused by a consumer that takes nothing, under the default
/// policy ([`Policy::backpressure`]): 30 seconds.
///
/// A reader that stopped must not hold a stream's resources (its KV blocks) for ever, so the
/// default is never unbounded; [`Policy::max_pause`]`(None)` opts out, in so many words.
pub const DEFAULT_MAX_PAUSE: Duration = Duration::from_secs(30);

/// What the gate does when the consumer falls behind and the buffer is full.
///
/// Every policy keeps the buffer within its bounds; they differ in what the generator does
/// meanwhile and in when the stream is given up. The clock is the gate's own: it runs on the
/// gate's task, whichever way chunks arrive ([`Sender::send`](crate::Sender::send),
/// [`Sender::try_send`](crate::Sender::try_send)), and also while a generator that has finished
/// waits for the consumer to take its last events (there the limit is "nothing taken for that
/// long", for every policy).
///
/// The deadlines are measured with tokio's timer, so a runtime with time enabled is needed when
/// one is set. A zero limit ends the stream as soon as the buffer is found full.
///
/// A policy is built with its constructors ([`backpressure`](Policy::backpressure),
/// [`coalesce`](Policy::coalesce), [`disconnect`](Policy::disconnect)) and
/// [`max_pause`](Policy::max_pause), so a stream that may wait for ever is always one that says
/// so; its variants can be matched on to read it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamgate::{DEFAULT_MAX_PAUSE, Gate, Policy};
///
/// // The default: the generator waits for room, at most 30 s per chunk.
/// assert_eq!(Policy::default(), Policy::backpressure());
/// // Merge text deltas for a slow reader; give up after 5 s without room.
/// let coalesce = Policy::coalesce().max_pause(Some(Duration::from_secs(5)));
/// // Wait as long as the consumer lives: a visible choice.
/// let patient = Policy::backpressure().max_pause(None);
/// // End a reader that took nothing for 10 s while the buffer was full.
/// let strict = Policy::disconnect(Duration::from_secs(10));
///
/// match Policy::backpressure() {
///     Policy::Backpressure { max_pause, .. } => assert_eq!(max_pause, Some(DEFAULT_MAX_PAUSE)),
///     _ => unreachable!(),
/// }
/// # let _ = (Gate::new().policy(coalesce), patient, strict);
/// ```
///
/// A policy cannot be written as a literal, which would make its pause limit easy to drop:
///
/// ```compile_fail,E0639
/// let never_ends = streamgate::Policy::Backpressure { max_pause: None };
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Policy {
    /// The generator waits for room: it produces nothing while the consumer is stalled. With
    /// `max_pause`, a chunk that has waited that long for room ends the stream as
    /// [`SlowConsumer`](crate::EndReason::SlowConsumer).
    #[non_exhaustive]
    Backpressure {
        /// How long one chunk may wait for room; `None` waits as long as the consumer lives.
        /// Over a `TunedListener` on Linux 5.11 or later, the kernel's user timeout (default
        /// 20 s) also fails a connection whose client stopped reading that long.
        max_pause: Option<Duration>,
    },
    /// When the buffer is full by events, the new chunk is merged into the newest waiting one
    /// with [`Chunk::merge`](crate::Chunk::merge), as long as the merged bytes fit: a slow
    /// reader gets fewer, larger events and loses nothing. A chunk that cannot merge (or would
    /// exceed the byte bound) waits as under `Backpressure`, with the same optional `max_pause`.
    #[non_exhaustive]
    Coalesce {
        /// How long one chunk may wait for room; `None` waits as long as the consumer lives.
        max_pause: Option<Duration>,
    },
    /// The generator waits for room, and once the consumer has taken nothing for `after` while
    /// the buffer was full, the stream ends as [`SlowConsumer`](crate::EndReason::SlowConsumer)
    /// and the generator is stopped. Unlike `max_pause`, the clock restarts whenever the
    /// consumer takes an event, so a reader that trickles along is not cut off.
    #[non_exhaustive]
    Disconnect {
        /// How long the consumer may take nothing while the buffer is full.
        after: Duration,
    },
}

impl Policy {
    /// `Backpressure` with a pause of at most [`DEFAULT_MAX_PAUSE`]: the default.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::{Gate, Policy};
    ///
    /// let policy = Policy::backpressure().max_pause(Some(Duration::from_secs(5)));
    /// let gate = Gate::new().policy(policy);
    /// # drop(gate);
    /// ```
    pub const fn backpressure() -> Self {
        Policy::Backpressure {
            max_pause: Some(DEFAULT_MAX_PAUSE),
        }
    }

    /// `Coalesce` with a pause of at most [`DEFAULT_MAX_PAUSE`].
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::{Gate, Policy};
    ///
    /// // Text deltas (`String`, `Bytes`, `SseEvent` data) concatenate for a slow reader.
    /// let gate = Gate::new().policy(Policy::coalesce());
    /// # drop(gate);
    /// ```
    pub const fn coalesce() -> Self {
        Policy::Coalesce {
            max_pause: Some(DEFAULT_MAX_PAUSE),
        }
    }

    /// `Disconnect` after the consumer took nothing from a full buffer for `after`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::{Gate, Policy};
    ///
    /// let gate = Gate::new().policy(Policy::disconnect(Duration::from_secs(10)));
    /// # drop(gate);
    /// ```
    pub const fn disconnect(after: Duration) -> Self {
        Policy::Disconnect { after }
    }

    /// The same policy with another pause limit: how long one chunk of `Backpressure` or
    /// `Coalesce` may wait for room before the stream ends as
    /// [`SlowConsumer`](crate::EndReason::SlowConsumer); `None` waits as long as the consumer
    /// lives.
    ///
    /// `Disconnect` has no pause limit (its `after` bounds how long the consumer may take
    /// nothing, and restarts at every take): it is returned as it is.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::Policy;
    ///
    /// let short = Policy::backpressure().max_pause(Some(Duration::from_secs(1)));
    /// let second = Some(Duration::from_secs(1));
    /// assert!(matches!(short, Policy::Backpressure { max_pause, .. } if max_pause == second));
    /// // A runtime built without tokio's timer needs a policy without a limit.
    /// let untimed = Policy::coalesce().max_pause(None);
    /// assert!(matches!(untimed, Policy::Coalesce { max_pause: None, .. }));
    /// ```
    pub const fn max_pause(self, max_pause: Option<Duration>) -> Self {
        match self {
            Policy::Backpressure { .. } => Policy::Backpressure { max_pause },
            Policy::Coalesce { .. } => Policy::Coalesce { max_pause },
            Policy::Disconnect { .. } => self,
        }
    }

    /// Whether a chunk that finds the buffer full is merged into the newest waiting one.
    pub(crate) fn coalesces(&self) -> bool {
        matches!(self, Policy::Coalesce { .. })
    }

    /// How long the generator may be held up by a full buffer before the stream ends, and
    /// whether that clock restarts when the consumer takes an event.
    pub(crate) fn deadline(&self) -> Option<Deadline> {
        match *self {
            Policy::Backpressure { max_pause } | Policy::Coalesce { max_pause } => {
                max_pause.map(|limit| Deadline {
                    limit,
                    restarts_on_take: false,
                })
            }
            Policy::Disconnect { after } => Some(Deadline {
                limit: after,
                restarts_on_take: true,
            }),
        }
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy::backpressure()
    }
}

/// When a full buffer ends the stream.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    pub(crate) limit: Duration,
    pub(crate) restarts_on_take: bool,
}
