//! The registry: streams keyed by request id, detached from connections, in memory or in Redis.

use std::fmt;
use std::sync::Arc;

use super::claim::{Claim, Claims};
#[cfg(feature = "redis")]
use super::error::AdoptError;
use super::error::{AttachError, ClaimError, RegisterError, StoreError};
use super::memory::Memory;
use super::options::ResumeOptions;
use super::stats::RegistryStats;
use super::subscriber::Subscriber;
use crate::chunk::Chunk;
use crate::gate::Consumer;
use crate::sse::SseEvent;

/// Streams keyed by request id, detached from connections: a disconnect is not a stop.
///
/// A stream first [claims](Registry::claim) its id, before any work starts for it; then
/// [`register`](Registry::register) takes its gate's [`Consumer`] and moves its events, encoded
/// as SSE frames with their event ids, into a replay log bounded by events and bytes, from
/// which [`Subscriber`]s read, each at its own position: the first one returned by
/// `register`, more through [`attach`](Registry::attach) at a position (an SSE
/// `Last-Event-ID`), several at once.
///
/// The log lives in one of two stores, which differ in what they cost, not in what they
/// promise:
///
/// - [`Registry::memory`]: in this process;
/// - `Registry::redis` (feature `redis`): in Redis Streams, so that a client can resume, and
///   stop, a stream through any instance sharing the Redis.
///
/// What both keep:
///
/// - While subscribers are attached the log runs at most
///   [`read_ahead`](ResumeOptions::read_ahead) events ahead of the slowest, and evicts what all
///   of them have read; past that the gate fills and pauses the generator, as for a plain gated
///   stream. A subscriber that holds the log back longer than the
///   [`max_lag`](ResumeOptions::max_lag) is cut off: it no longer counts, and ends as
///   [`SlowConsumer`](crate::EndReason::SlowConsumer) with a "behind" message. It never holds
///   the others back longer than that; when it was the last one attached, the stream is
///   detached.
/// - When the last subscriber leaves, the stream goes on for the [grace](ResumeOptions::grace):
///   the log keeps what that subscriber had not read, and a full log pauses the generator
///   (through the gate's backpressure: give the gate a pause limit of at least the grace, or
///   none). An attach ends the grace; its expiry cancels the generator and frees the log.
/// - [`stop`](Registry::stop) is the explicit stop (a user pressing Stop): the stream's
///   [stop signal](Claim::stop_signal) is cancelled (or, if it was never taken, its gate), its
///   last events wait for nobody, and every subscriber sees its end.
/// - A stream that ended stays replayable for the [retention](ResumeOptions::retain), then is
///   removed; until then its id cannot be claimed again.
///
/// Needs a tokio runtime with time enabled.
///
/// # Examples
///
/// ```
/// use futures_util::StreamExt;
/// use streamgate::Gate;
/// use streamgate::resume::{Registry, ResumeOptions};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let registry = Registry::memory(ResumeOptions::default());
/// let claim = registry.claim("req-1").await?;
/// let consumer = Gate::new().spawn(|_, mut tx| async move {
///     for token in ["a", "b", "c"] {
///         tx.send(token.to_owned()).await?;
///     }
///     Ok::<_, streamgate::SendError<String>>(())
/// });
/// let mut first = registry.register(claim, consumer).await?;
/// let frame = first.next().await.unwrap();
/// assert_eq!(&frame.bytes()[..], b"id: 0\ndata: a\n\n");
/// drop(first); // the client went away: the stream goes on, waiting for a resume
///
/// let resumed = registry.attach("req-1", Some(0)).await?;
/// let rest: Vec<_> = resumed.map(|frame| frame.into_bytes()).collect().await;
/// assert_eq!(rest, ["id: 1\ndata: b\n\n", "id: 2\ndata: c\n\n"]);
/// # Ok(())
/// # }
/// ```
pub struct Registry<C> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    claims: Arc<Claims>,
    store: Store<C>,
}

/// Where the logs live.
enum Store<C> {
    Memory(Memory<C>),
    #[cfg(feature = "redis")]
    Redis(super::redis::RedisLogs),
}

impl<C> Clone for Registry<C> {
    fn clone(&self) -> Self {
        Registry {
            inner: self.inner.clone(),
        }
    }
}

impl<C> fmt::Debug for Registry<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let store = match &self.inner.store {
            Store::Memory(_) => "memory",
            #[cfg(feature = "redis")]
            Store::Redis(_) => "redis",
        };
        f.debug_struct("Registry")
            .field("store", &store)
            .finish_non_exhaustive()
    }
}

impl<C> Registry<C>
where
    C: Chunk + Clone + Into<SseEvent> + Send + Sync + 'static,
{
    /// A registry keeping its streams' logs in this process, as `options` says.
    pub fn memory(options: ResumeOptions) -> Self {
        Registry::with(Arc::default(), Store::Memory(Memory::new(options)))
    }

    /// A registry keeping its streams in the Redis at `url` (`redis://HOST:PORT`) as
    /// `options` says, so that every instance sharing it can attach to and stop every stream;
    /// it connects at its first use. Needs Redis 7 or later, and instances whose wall clocks
    /// agree within a second (subscribers' leases carry expiry times).
    ///
    /// # Errors
    ///
    /// If `url` is not a Redis URL.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::resume::{Registry, ResumeOptions};
    ///
    /// let registry = Registry::<String>::redis("redis://127.0.0.1:6379", ResumeOptions::default())?;
    /// assert!(Registry::<String>::redis("http://127.0.0.1", ResumeOptions::default()).is_err());
    /// # Ok::<(), streamgate::resume::StoreError>(())
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn redis(url: &str, options: ResumeOptions) -> Result<Self, StoreError> {
        let claims: Arc<Claims> = Arc::default();
        // A stop asked through any instance reaches a stream pumped here through its claim.
        let stops = Arc::downgrade(&claims);
        let on_stop = move |id: &str| {
            if let Some(claims) = stops.upgrade() {
                claims.stop(id);
            }
        };
        let logs = super::redis::RedisLogs::new(url, options, Box::new(on_stop))?;
        Ok(Registry::with(claims, Store::Redis(logs)))
    }

    fn with(claims: Arc<Claims>, store: Store<C>) -> Self {
        Registry {
            inner: Arc::new(Inner { claims, store }),
        }
    }

    /// Claims `id` for a new stream, before any work starts for it: of two claims of one id,
    /// here or (in Redis) on two instances at once, one wins. The claim is held until the
    /// stream it registers is released, or until it is dropped unregistered.
    ///
    /// # Errors
    ///
    /// [`ClaimError::Running`] if a stream runs (or is being started) under `id`,
    /// [`ClaimError::Retained`] if one finished and is retained,
    /// [`ClaimError::Unavailable`] if the store fails.
    ///
    /// # Examples
    ///
    /// See [`Claim`].
    pub async fn claim(&self, id: &str) -> Result<Claim, ClaimError> {
        let claims = &self.inner.claims;
        match &self.inner.store {
            // Decided under the table's lock: a stream's entry is in the store before its claim
            // is given back, and leaves it after.
            Store::Memory(memory) => claims.try_claim(id, None, || memory.contains(id)),
            #[cfg(feature = "redis")]
            Store::Redis(redis) => {
                if claims.is_held(id) {
                    return Err(ClaimError::Running);
                }
                let reserved = redis.claim(id).await?;
                claims.try_claim(id, Some(Box::new(reserved)), || false)
            }
        }
    }

    /// Registers the stream of `consumer` under `claim`'s id and returns its first subscriber,
    /// reading from the stream's first event.
    ///
    /// # Errors
    ///
    /// [`RegisterError::ForeignClaim`] if `claim` was made by another registry,
    /// [`RegisterError::Unavailable`] if the store fails; either way `consumer` is dropped,
    /// which ends its gate.
    ///
    /// # Panics
    ///
    /// If called outside a tokio runtime.
    pub async fn register(
        &self,
        claim: Claim,
        consumer: Consumer<C>,
    ) -> Result<Subscriber, RegisterError> {
        if !claim.is_from(&self.inner.claims) {
            return Err(RegisterError::ForeignClaim);
        }
        match &self.inner.store {
            Store::Memory(memory) => Ok(memory.register(claim, consumer)),
            #[cfg(feature = "redis")]
            Store::Redis(redis) => redis
                .register(claim, consumer)
                .await
                .map_err(RegisterError::Unavailable),
        }
    }

    /// Attaches a subscriber to the stream `id` (in Redis, on whichever instance it runs),
    /// reading the events after `after` (an SSE `Last-Event-ID`; `None`: from the stream's
    /// first event) from the log, then the live ones, then the stream's end. Ends the grace if
    /// it was running.
    ///
    /// # Errors
    ///
    /// [`AttachError::Unknown`] if no stream has this id (or its grace or retention ran out),
    /// [`AttachError::Gone`] if the log no longer holds the position,
    /// [`AttachError::Finished`] if the stream has ended and nothing follows the position,
    /// [`AttachError::Unavailable`] if the store fails.
    ///
    /// # Panics
    ///
    /// If called outside a tokio runtime.
    pub async fn attach(&self, id: &str, after: Option<u64>) -> Result<Subscriber, AttachError> {
        match &self.inner.store {
            Store::Memory(memory) => memory.attach(id, after),
            #[cfg(feature = "redis")]
            Store::Redis(redis) => redis.attach(id, after).await,
        }
    }

    /// Stops the stream `id` on purpose (in Redis, on whichever instance runs it: within
    /// 100 ms there): its [stop signal](Claim::stop_signal) is cancelled, or its gate (ending
    /// it as [`Cancelled`](crate::EndReason::Cancelled)), and its last events wait for nobody.
    /// Returns whether it was running (`false`: it has ended, and is retained).
    ///
    /// # Errors
    ///
    /// [`AttachError::Unknown`] if no stream has this id, [`AttachError::Unavailable`] if the
    /// store fails.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::Gate;
    /// use streamgate::resume::{AttachError, Registry, ResumeOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = Registry::<String>::memory(ResumeOptions::default());
    /// let claim = registry.claim("req-1").await?;
    /// let consumer = Gate::new().spawn(|_, tx| async move {
    ///     let _tx = tx;
    ///     std::future::pending::<()>().await; // a generation that never ends by itself
    ///     Ok::<_, std::io::Error>(())
    /// });
    /// let subscriber = registry.register(claim, consumer).await?;
    /// assert!(registry.stop("req-1").await?);
    /// assert!(matches!(registry.stop("req-2").await, Err(AttachError::Unknown)));
    /// # drop(subscriber);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn stop(&self, id: &str) -> Result<bool, AttachError> {
        if self.inner.claims.stop(id) {
            // Its last events (a final chunk, `[DONE]`) wait for no slow reader or resume.
            match &self.inner.store {
                Store::Memory(memory) => memory.stop_waiting(id),
                #[cfg(feature = "redis")]
                Store::Redis(redis) => redis.stop_waiting(id),
            }
            return Ok(true);
        }
        match &self.inner.store {
            Store::Memory(memory) if memory.contains(id) => Ok(false),
            Store::Memory(_) => Err(AttachError::Unknown),
            #[cfg(feature = "redis")]
            Store::Redis(redis) => redis.stop(id).await,
        }
    }

    /// Names the stream that holds `id` now also `alias`, for [`resolve`](Registry::resolve): a
    /// client that was told another name for its stream (an upstream's own response id, which
    /// the `openai` SDK resumes a Responses stream by) finds the stream by it. The stream may
    /// be claimed and not yet registered (a name its first event gives), running, or retained;
    /// naming an id no stream has does nothing. A name resolves only to the stream it was given
    /// to, while that stream is kept, never to one claimed later under the same id; a stream
    /// may have several names, and a name given again names the later stream. A memory store
    /// keeps the last [`MAX_ALIASES`](super::MAX_ALIASES) names (the caller bounds their
    /// length); Redis keeps each, for every instance sharing it, for the retention and an hour
    /// more from when it was given (a stream running longer is then found by its id only).
    ///
    /// # Errors
    ///
    /// If the store fails (Redis).
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::Gate;
    /// use streamgate::resume::{Registry, ResumeOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = Registry::memory(ResumeOptions::default());
    /// let claim = registry.claim("req-1").await?;
    /// let consumer = Gate::new().spawn(|_, mut tx| async move {
    ///     tx.send("a".to_owned()).await?;
    ///     Ok::<_, streamgate::SendError<String>>(())
    /// });
    /// let subscriber = registry.register(claim, consumer).await?;
    /// registry.alias("resp_68a1", "req-1").await?;
    /// assert_eq!(registry.resolve("resp_68a1").await?.as_deref(), Some("req-1"));
    /// assert_eq!(registry.resolve("resp_other").await?, None);
    /// # drop(subscriber);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn alias(&self, alias: &str, id: &str) -> Result<(), StoreError> {
        match &self.inner.store {
            Store::Memory(memory) => {
                memory.alias(&self.inner.claims, alias, id);
                Ok(())
            }
            #[cfg(feature = "redis")]
            Store::Redis(redis) => redis.alias(alias, id).await,
        }
    }

    /// The id of the stream `alias` names (see [`alias`](Registry::alias)), if it names one.
    ///
    /// # Errors
    ///
    /// If the store fails (Redis).
    pub async fn resolve(&self, alias: &str) -> Result<Option<String>, StoreError> {
        match &self.inner.store {
            Store::Memory(memory) => Ok(memory.resolve(&self.inner.claims, alias)),
            #[cfg(feature = "redis")]
            Store::Redis(redis) => redis.resolve(alias).await,
        }
    }

    /// Takes over the running stream `id` when the instance that pumped it died (in Redis:
    /// its pump's lease, renewed every 100 ms, lapsed two seconds ago): of two instances
    /// adopting it at once, one wins, and the old pump, were it only stalled, appends nothing
    /// more (each append is checked against the stream's owner in Redis) and stops at its next
    /// look. The lease is on Redis's clock: the instances' clocks need not agree. The
    /// [`Adoption`](super::Adoption) holds the request the stream [kept](Claim::keep_request)
    /// and the frames its log holds; [`carry_on`](Registry::carry_on) goes on with it. A reader
    /// attached meanwhile (through any instance) simply reads on.
    ///
    /// # Errors
    ///
    /// [`AdoptError::Pumped`] while a pump holds the stream (always, in a memory store, for a
    /// running stream: it runs in this process), [`AdoptError::Finished`] once it has ended,
    /// [`AdoptError::Unknown`] for no such stream, [`AdoptError::Unavailable`] if the store
    /// fails.
    ///
    /// # Examples
    ///
    /// See [`Adoption`](super::Adoption).
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub async fn adopt(&self, id: &str) -> Result<super::Adoption, AdoptError> {
        match &self.inner.store {
            Store::Memory(memory) => Err(if self.inner.claims.is_held(id) {
                AdoptError::Pumped
            } else if memory.contains(id) {
                AdoptError::Finished
            } else {
                AdoptError::Unknown
            }),
            Store::Redis(redis) => redis.adopt(id, &self.inner.claims).await,
        }
    }

    /// Carries an adopted stream on with `consumer`, pumped here from now on: its events
    /// should go on from [`Adoption::next_event`](super::Adoption::next_event) (give its gate
    /// that [`first_id`](crate::Gate::first_id)), so that its readers' positions stay true.
    ///
    /// # Errors
    ///
    /// [`RegisterError::ForeignClaim`] if `adoption` was made by another registry (`consumer`
    /// is dropped, which ends its gate).
    ///
    /// # Panics
    ///
    /// If called outside a tokio runtime.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub async fn carry_on(
        &self,
        adoption: super::Adoption,
        consumer: Consumer<C>,
    ) -> Result<(), RegisterError> {
        match &self.inner.store {
            Store::Redis(redis) if adoption.claim.is_from(&self.inner.claims) => {
                redis.carry_on(adoption, consumer);
                Ok(())
            }
            _ => Err(RegisterError::ForeignClaim),
        }
    }

    /// Whether the store answers (a memory store always does).
    ///
    /// # Errors
    ///
    /// The store's failure.
    pub async fn check(&self) -> Result<(), StoreError> {
        match &self.inner.store {
            Store::Memory(_) => Ok(()),
            #[cfg(feature = "redis")]
            Store::Redis(redis) => redis.check().await,
        }
    }

    /// What the registry holds now, and what happened so far (in Redis: this instance's part,
    /// see [`RegistryStats`]).
    pub fn stats(&self) -> RegistryStats {
        match &self.inner.store {
            Store::Memory(memory) => memory.stats(),
            #[cfg(feature = "redis")]
            Store::Redis(redis) => redis.stats(),
        }
    }
}
