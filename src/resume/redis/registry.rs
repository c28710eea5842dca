//! The Redis registry: streams keyed by request id in Redis, reachable from every instance.

use std::collections::HashMap;
use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, FromRedisValue, Pipeline, RedisError, RedisResult};

use super::keys::{Keys, millis, now_ms};
use super::pump::pump;
use super::subscriber::RedisSubscriber;
use super::{BLOCK, LEASE, RUNNING_TTL};
use crate::chunk::Chunk;
use crate::ext::GateExt;
use crate::gate::Consumer;
use crate::resume::{AttachError, RegistryStats, ResumeOptions};
use crate::sse::SseEvent;
use crate::sync::{Arc, Mutex, lock};

/// Why a stream could not be registered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegisterError {
    /// A stream with this id is registered, on this instance or another (HTTP 409).
    Duplicate,
    /// Redis failed, with its error (503).
    Unavailable(String),
}

impl fmt::Display for RegisterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegisterError::Duplicate => f.write_str("a stream with this id is already registered"),
            RegisterError::Unavailable(error) => write!(f, "the resume store failed: {error}"),
        }
    }
}

impl std::error::Error for RegisterError {}

/// Resumable streams in Redis Streams: like a [`Registry`](crate::resume::Registry), but a
/// client can resume through any instance sharing the Redis.
///
/// [`register`](RedisRegistry::register) takes a gated stream's [`Consumer`], encodes it as SSE
/// with ids (as `.sse()` writes them: frames must cross processes) and spawns a pump on this
/// instance that appends each frame to the stream's log in Redis; [`RedisSubscriber`]s on any
/// instance read the log from a position, then live (`XREAD BLOCK` on a connection of their
/// own), as frames ready for the transport.
///
/// - **Attachment.** Every subscriber holds a lease in Redis, renewed every second while it
///   lives and removed when it is dropped (a crashed instance's leases run out in 3 s). The pump
///   polls the leases: when none is left, on any instance, the [grace](ResumeOptions::grace)
///   starts; an attach anywhere ends it; its expiry cancels the generator (as
///   [`ConsumerGone`](crate::EndReason::ConsumerGone)) and deletes the stream's keys.
/// - **The log** keeps [`log_bounds`](ResumeOptions::log_bounds) (events and bytes). With
///   subscribers attached it evicts its oldest frames as new ones come: a subscriber that falls
///   behind what it evicted ends with a `slow_consumer` ("behind") error frame, and holds no
///   one back ([`read_ahead`](ResumeOptions::read_ahead) and
///   [`max_lag`](ResumeOptions::max_lag) do not apply). With nobody attached it evicts nothing:
///   a full log pauses the pump (and, through the gate, the generator) until an attach or the
///   grace's end.
/// - **Stop.** [`stop`](RedisRegistry::stop) from any instance sets a flag the pump sees within
///   100 ms: it cancels the gate, or calls the [`on_stop`](RedisRegistry::on_stop) hook.
/// - **TTLs.** A running stream's keys live 10 s and the pump renews them every 100 ms, so the
///   keys of a dead instance go away; a finished stream's live the
///   [retention](ResumeOptions::retain) (at least 3 s, so attached subscribers read its end).
/// - **Failures.** Redis failing under a subscriber ends it with an `event: error` frame of type
///   `resume_store_error` at once (a blocked read waits at most 2 s for an answer), never a
///   hang; under the pump, it cancels the generator as `ConsumerGone` (nobody can read what it
///   makes). The shared connection reconnects at the next use.
///
/// Needs Redis 7 or later. Instances' wall clocks must agree within a second (leases carry expiry
/// times). Needs a tokio runtime with time enabled.
///
/// # Examples
///
/// ```no_run
/// use futures_util::StreamExt;
/// use streamgate::Gate;
/// use streamgate::resume::{RedisRegistry, ResumeOptions};
/// use streamgate::sse::SseEvent;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let options = ResumeOptions::default();
/// let instance_a = RedisRegistry::new("redis://127.0.0.1:6379", options)?;
/// let instance_b = RedisRegistry::new("redis://127.0.0.1:6379", options)?;
/// let consumer = Gate::new().spawn(|_, mut tx| async move {
///     for token in ["a", "b", "c"] {
///         tx.send(SseEvent::data(token)).await?;
///     }
///     Ok::<_, streamgate::SendError<SseEvent>>(())
/// });
/// let mut first = instance_a.register("req-1", consumer).await?;
/// let frame = first.next().await.unwrap();
/// assert_eq!(&frame.bytes()[..], b"id: 0\ndata: a\n\n");
/// drop(first); // the client went away
///
/// // It comes back through the other instance.
/// let resumed = instance_b.attach("req-1", Some(0)).await?;
/// let rest: Vec<_> = resumed.map(|frame| frame.into_bytes()).collect().await;
/// assert_eq!(rest, ["id: 1\ndata: b\n\n", "id: 2\ndata: c\n\n"]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisRegistry {
    store: Arc<Store>,
}

/// What an explicit stop calls instead of cancelling the gate.
type StopHook = Box<dyn Fn(&str) + Send + Sync>;

/// What the registry's pumps and subscribers share.
pub(crate) struct Store {
    client: Client,
    /// The connection for short commands, made at first use and again after an error.
    connection: Mutex<Option<MultiplexedConnection>>,
    pub(crate) options: ResumeOptions,
    pub(crate) on_stop: OnceLock<StopHook>,
    /// The streams this instance pumps.
    pub(crate) pumped: Mutex<HashMap<Arc<str>, Pumped>>,
    resumed: AtomicU64,
    pub(crate) expired: AtomicU64,
    /// Names this instance's subscribers in the readers' sets.
    instance: u64,
    next_reader: AtomicU64,
}

/// A stream this instance pumps, as its stats count it.
#[derive(Debug, Default)]
pub(crate) struct Pumped {
    pub(crate) detached: bool,
    pub(crate) bytes: usize,
}

impl Store {
    async fn connection(&self) -> RedisResult<MultiplexedConnection> {
        if let Some(connection) = lock(&self.connection).clone() {
            return Ok(connection);
        }
        let connection = self.client.get_multiplexed_async_connection().await?;
        *lock(&self.connection) = Some(connection.clone());
        Ok(connection)
    }

    /// Runs `pipe` on the shared connection; an error drops it, so the next use reconnects.
    pub(crate) async fn query<T: FromRedisValue>(&self, pipe: &Pipeline) -> RedisResult<T> {
        let mut connection = self.connection().await?;
        let result = pipe.query_async(&mut connection).await;
        if result.is_err() {
            *lock(&self.connection) = None;
        }
        result
    }

    /// A connection of its own for a subscriber, whose `XREAD BLOCK` waits for an answer.
    pub(crate) async fn dedicated(&self) -> RedisResult<MultiplexedConnection> {
        let config = AsyncConnectionConfig::new().set_response_timeout(Some(BLOCK * 2));
        self.client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// A name for a new subscriber, unique across instances.
    pub(crate) fn reader(&self) -> String {
        let n = self.next_reader.fetch_add(1, Ordering::Relaxed);
        format!("{:x}-{n}", self.instance)
    }

    /// Takes or renews the lease of `reader`.
    pub(crate) async fn lease(&self, keys: &Keys, reader: &str) -> RedisResult<()> {
        let expiry = now_ms().saturating_add(millis(LEASE));
        self.query(
            redis::pipe()
                .zadd(&keys.readers, reader, expiry)
                .ignore()
                .pexpire(&keys.readers, millis(RUNNING_TTL) as i64)
                .ignore(),
        )
        .await
    }

    /// Gives the lease of `reader` up.
    pub(crate) async fn release(&self, keys: &Keys, reader: &str) -> RedisResult<()> {
        self.query(redis::pipe().zrem(&keys.readers, reader).ignore())
            .await
    }
}

impl RedisRegistry {
    /// A registry keeping its streams in the Redis at `url` (`redis://HOST:PORT`) as `options`
    /// says; it connects at its first use.
    ///
    /// # Errors
    ///
    /// If `url` is not a Redis URL.
    pub fn new(url: &str, options: ResumeOptions) -> Result<Self, RedisError> {
        use std::hash::{BuildHasher, RandomState};
        Ok(RedisRegistry {
            store: Arc::new(Store {
                client: Client::open(url)?,
                connection: Mutex::new(None),
                options,
                on_stop: OnceLock::new(),
                pumped: Mutex::new(HashMap::new()),
                resumed: AtomicU64::new(0),
                expired: AtomicU64::new(0),
                instance: RandomState::new().hash_one(now_ms()),
                next_reader: AtomicU64::new(0),
            }),
        })
    }

    /// Instead of cancelling the gate, an explicit stop of a stream this instance pumps calls
    /// `hook` with the stream's id: so the generator can end on its own terms (a final chunk,
    /// say). The first hook set stands.
    ///
    /// ```
    /// use streamgate::resume::{RedisRegistry, ResumeOptions};
    ///
    /// let registry = RedisRegistry::new("redis://127.0.0.1:6379", ResumeOptions::default())?
    ///     .on_stop(|id| println!("stop {id}"));
    /// # Ok::<(), redis::RedisError>(())
    /// ```
    pub fn on_stop(self, hook: impl Fn(&str) + Send + Sync + 'static) -> Self {
        // A second hook is ignored, as documented.
        let _ = self.store.on_stop.set(Box::new(hook));
        self
    }

    /// Registers the stream of `consumer` under `id` and returns its first subscriber, reading
    /// from the stream's first frame. The pump runs on this instance.
    ///
    /// # Errors
    ///
    /// [`RegisterError::Duplicate`] if a stream is registered under `id` on any instance,
    /// [`RegisterError::Unavailable`] if Redis fails; either way `consumer` is dropped, which
    /// ends its gate.
    ///
    /// # Panics
    ///
    /// If called outside a tokio runtime.
    pub async fn register<C>(
        &self,
        id: impl Into<Arc<str>>,
        consumer: Consumer<C>,
    ) -> Result<RedisSubscriber, RegisterError>
    where
        C: Chunk + Into<SseEvent> + Send + 'static,
    {
        let id = id.into();
        let keys = Keys::new(&id);
        let unavailable = |error: RedisError| RegisterError::Unavailable(error.to_string());
        // A registered stream's keys always have a TTL: `NX` gives one only to a new stream.
        let (created,): (bool,) = self
            .store
            .query(
                redis::pipe()
                    .atomic()
                    .hset_nx(&keys.meta, "state", "running")
                    .hset_nx(&keys.meta, "start", 0)
                    .ignore()
                    .cmd("PEXPIRE")
                    .arg(&keys.meta)
                    .arg(millis(RUNNING_TTL))
                    .arg("NX")
                    .ignore(),
            )
            .await
            .map_err(unavailable)?;
        if !created {
            return Err(RegisterError::Duplicate);
        }
        // Attached before the pump looks, so a zero grace does not expire it at once.
        let subscriber = RedisSubscriber::attach(self.store.clone(), id.clone(), None)
            .await
            .map_err(unavailable)?;
        lock(&self.store.pumped).insert(id.clone(), Pumped::default());
        let handle = consumer.handle();
        tokio::spawn(pump(self.store.clone(), id, handle, consumer.sse()));
        Ok(subscriber)
    }

    /// Attaches a subscriber to the stream `id`, on whichever instance it runs: the frames of the
    /// events after `after` (an SSE `Last-Event-ID`; `None`: from the first), then the live
    /// ones, then the stream's end. Ends the grace if it was running.
    ///
    /// # Errors
    ///
    /// [`AttachError::Unknown`] if no stream has this id (or it expired),
    /// [`AttachError::Gone`] if the log no longer holds the position,
    /// [`AttachError::Unavailable`] if Redis fails.
    ///
    /// # Panics
    ///
    /// If called outside a tokio runtime.
    pub async fn attach(
        &self,
        id: &str,
        after: Option<u64>,
    ) -> Result<RedisSubscriber, AttachError> {
        let keys = Keys::new(id);
        let unavailable = |error: RedisError| AttachError::Unavailable(error.to_string());
        let ((state, start),): ((Option<String>, Option<u64>),) = self
            .store
            .query(redis::pipe().hmget(&keys.meta, &["state", "start"]))
            .await
            .map_err(unavailable)?;
        if state.is_none() {
            return Err(AttachError::Unknown);
        }
        let oldest = start.unwrap_or(0);
        if after.map_or(0, |after| after.saturating_add(1)) < oldest {
            return Err(AttachError::Gone { oldest });
        }
        let subscriber = RedisSubscriber::attach(self.store.clone(), id.into(), after)
            .await
            .map_err(unavailable)?;
        self.store.resumed.fetch_add(1, Ordering::Relaxed);
        Ok(subscriber)
    }

    /// Stops the stream `id` on purpose, on whichever instance runs it: within 100 ms its pump
    /// cancels its gate (ending as [`Cancelled`](crate::EndReason::Cancelled)) or calls the
    /// [`on_stop`](RedisRegistry::on_stop) hook. Returns whether it was running (`false`: it
    /// ended, and is retained).
    ///
    /// # Errors
    ///
    /// [`AttachError::Unknown`] if no stream has this id, [`AttachError::Unavailable`] if
    /// Redis fails.
    pub async fn stop(&self, id: &str) -> Result<bool, AttachError> {
        let keys = Keys::new(id);
        let unavailable = |error: RedisError| AttachError::Unavailable(error.to_string());
        let (state,): (Option<String>,) = self
            .store
            .query(redis::pipe().hget(&keys.meta, "state"))
            .await
            .map_err(unavailable)?;
        match state.as_deref() {
            None => Err(AttachError::Unknown),
            Some("running") => {
                self.store
                    .query::<()>(
                        redis::pipe()
                            .hset(&keys.meta, "stop", 1)
                            .ignore()
                            .pexpire(&keys.meta, millis(RUNNING_TTL) as i64)
                            .ignore(),
                    )
                    .await
                    .map_err(unavailable)?;
                Ok(true)
            }
            Some(_) => Ok(false),
        }
    }

    /// This instance's part: the streams it pumps (`streams`; `detached`: nobody attached on
    /// any instance, the grace running; `log_bytes`: their logs' bytes), the attaches made
    /// through it (`resumed`) and the graces that ran out in its pumps (`expired`).
    pub fn stats(&self) -> RegistryStats {
        let pumped = lock(&self.store.pumped);
        RegistryStats {
            streams: pumped.len(),
            detached: pumped.values().filter(|stream| stream.detached).count(),
            resumed: self.store.resumed.load(Ordering::Relaxed),
            expired: self.store.expired.load(Ordering::Relaxed),
            log_bytes: pumped.values().map(|stream| stream.bytes).sum(),
        }
    }
}

impl fmt::Debug for RedisRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRegistry")
            .field("options", &self.store.options)
            .field("pumped", &lock(&self.store.pumped).len())
            .finish()
    }
}
