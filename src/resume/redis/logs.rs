//! The Redis store: claims, registration, attaches and stops of streams kept in Redis.

use redis::{Client, RedisError};

use super::adopt::{Adopted, adopt};
use super::claim::Reservation;
use super::keys::{Keys, alias_field, alias_key, millis};
use super::pump::{Logged, Pumping, pump};
use super::reader::RedisReader;
use super::shared::{Pumped, Shared, StopHook};
use super::timing::{ALIAS_TTL, BLOCK, PUMP_LEASE, RUNNING_TTL};
use crate::chunk::Chunk;
use crate::ext::GateExt;
use crate::gate::Consumer;
use crate::resume::adoption::Adoption;
use crate::resume::claim::{Claim, Claims};
use crate::resume::error::{AdoptError, AttachError, ClaimError, StoreError};
use crate::resume::options::ResumeOptions;
use crate::resume::stats::RegistryStats;
use crate::resume::subscriber::Subscriber;
use crate::sse::{ErrorShape, SseEvent};
use crate::sync::{Arc, lock};

/// Registers the stream of the claim `ARGV[1]` as running, unless another claim has its id
/// (this one's lease lapsed and it was taken over): the pump's lease of `ARGV[2]` ms (on
/// Redis's clock), a TTL of `ARGV[3]` ms, the request kept for an adopter `ARGV[4]` and the
/// error shape `ARGV[5]` (empty: none, and OpenAI's). Answers whether it registered.
const REGISTER: &str = r"
local claim = redis.call('HGET', KEYS[1], 'claim')
if claim and claim ~= ARGV[1] then return 0 end
local now = redis.call('TIME')
local lease = now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'state', 'running', 'start', '0', 'claim', ARGV[1],
    'pump', string.format('%d', lease))
redis.call('HDEL', KEYS[1], 'held')
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'request', ARGV[4]) end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'shape', ARGV[5]) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1";

/// Sets the `stop` flag of a stream that has not ended, in one atomic step (the key keeps its
/// TTL), and answers its state (`nil` for an unknown stream).
const STOP: &str = r"
local state = redis.call('HGET', KEYS[1], 'state')
if state and state ~= 'ended' then
    redis.call('HSET', KEYS[1], 'stop', 1)
end
return state";

/// Gives the stream whose meta key is KEYS[1] the name field ARGV[1], if it exists: whether
/// it did.
const ALIAS: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then
    redis.call('HSET', KEYS[1], ARGV[1], 1)
    return 1
end
return 0";

/// Streams kept in Redis, reachable from every instance sharing it.
pub(crate) struct RedisLogs {
    shared: Arc<Shared>,
}

fn unavailable(error: RedisError) -> StoreError {
    StoreError::new(error)
}

impl RedisLogs {
    /// The store at `url`; `on_stop` is what a stop asked through any instance does to a
    /// stream pumped here.
    pub(crate) fn new(
        url: &str,
        options: ResumeOptions,
        on_stop: StopHook,
    ) -> Result<Self, StoreError> {
        let client = Client::open(url).map_err(unavailable)?;
        Ok(RedisLogs {
            shared: Arc::new(Shared::new(client, options, on_stop)),
        })
    }

    /// Claims `id` in Redis.
    pub(crate) async fn claim(&self, id: &str) -> Result<Reservation, ClaimError> {
        Reservation::claim(&self.shared, id).await
    }

    /// Registers the stream of `consumer` under its claim's id, with its pump on this
    /// instance; its first subscriber reads from the stream's first frame.
    pub(crate) async fn register<C>(
        &self,
        mut claim: Claim,
        consumer: Consumer<C>,
    ) -> Result<Subscriber, StoreError>
    where
        C: Chunk + Into<SseEvent> + Send + 'static,
    {
        let id: Arc<str> = claim.id().into();
        let keys = Keys::new(&id);
        let name = self.name(&claim);
        let request = claim.request.take();
        let shape = match claim.shape {
            ErrorShape::OpenAi => "",
            // For every reader's own ends, on any instance.
            other => other.as_str(),
        };
        let mut register = redis::pipe();
        register
            .cmd("EVAL")
            .arg(REGISTER)
            .arg(1)
            .arg(&keys.meta)
            .arg(&name)
            .arg(millis(PUMP_LEASE))
            .arg(millis(RUNNING_TTL))
            .arg(request.as_deref().unwrap_or_default())
            .arg(shape);
        let (registered,): (bool,) = self
            .shared
            .redis
            .query(&register)
            .await
            .map_err(unavailable)?;
        if !registered {
            return Err(StoreError::new(std::io::Error::other(
                "the stream's id was claimed again by another instance: this claim's lease lapsed",
            )));
        }
        if let Some(reservation) = claim.reserved.take() {
            reservation.registered();
        }
        let pumped = Arc::new(Pumped::new(consumer.handle(), None));
        lock(&self.shared.pumped).insert(id.clone(), pumped.clone());
        // Attached before the pump looks, so a zero grace does not expire it at once.
        let first = match RedisReader::attach(self.shared.clone(), &id, None, claim.shape).await {
            Ok(first) => first,
            Err(error) => {
                lock(&self.shared.pumped).remove(&id);
                return Err(match error {
                    AttachError::Unavailable(failure) => failure,
                    // A first reader of a stream pumped here waits for nothing.
                    other => StoreError::new(other),
                });
            }
        };
        let pumping = Pumping {
            id: id.clone(),
            name,
            logged: Logged::default(),
        };
        self.spawn_pump(pumping, pumped, claim, consumer);
        Ok(Subscriber::new(id, first))
    }

    /// Adopts the stream `id`, whose pump's lease lapsed, with what its log holds.
    pub(crate) async fn adopt(
        &self,
        id: &str,
        claims: &Arc<Claims>,
    ) -> Result<Adoption, AdoptError> {
        if claims.is_held(id) {
            // Its pump runs here.
            return Err(AdoptError::Pumped);
        }
        let Adopted {
            reservation,
            request,
            start,
            shape,
            frames,
        } = adopt(&self.shared, id).await?;
        // Its pump here stopped just now, and its claim has not been given back yet.
        let mut claim = claims
            .try_claim(id, Some(Box::new(reservation)), || false)
            .map_err(|_| AdoptError::Pumped)?;
        claim.error_shape(shape);
        let next = frames
            .iter()
            .rev()
            .find_map(|(_, frame)| frame.id())
            .map_or(start, |last| last.saturating_add(1));
        let logged = Logged {
            entries: frames
                .iter()
                .map(|(entry, frame)| (*entry, frame.bytes().len()))
                .collect(),
        };
        self.shared.counters.adopted();
        Ok(Adoption {
            claim,
            request,
            frames: frames.into_iter().map(|(_, frame)| frame).collect(),
            start,
            next,
            logged,
        })
    }

    /// Carries the adopted stream on with `consumer`, its pump on this instance; its readers,
    /// on any instance, read on from the log.
    pub(crate) fn carry_on<C>(&self, adoption: Adoption, consumer: Consumer<C>)
    where
        C: Chunk + Into<SseEvent> + Send + 'static,
    {
        let Adoption {
            mut claim, logged, ..
        } = adoption;
        let id: Arc<str> = claim.id().into();
        let name = self.name(&claim);
        if let Some(reservation) = claim.reserved.take() {
            reservation.registered();
        }
        let last = logged.entries.last().map(|(entry, _)| *entry);
        let pumped = Arc::new(Pumped::new(consumer.handle(), last));
        lock(&self.shared.pumped).insert(id.clone(), pumped.clone());
        let pumping = Pumping { id, name, logged };
        self.spawn_pump(pumping, pumped, claim, consumer);
    }

    /// The name `claim` has in Redis.
    fn name(&self, claim: &Claim) -> String {
        claim
            .reserved
            .as_ref()
            .map_or_else(|| self.shared.name(), |reserved| reserved.name().to_owned())
    }

    /// Starts the pump of `consumer`'s stream here.
    fn spawn_pump<C>(
        &self,
        pumping: Pumping,
        pumped: Arc<Pumped>,
        claim: Claim,
        consumer: Consumer<C>,
    ) where
        C: Chunk + Into<SseEvent> + Send + 'static,
    {
        claim.registered(consumer.handle());
        tokio::spawn(pump(
            self.shared.clone(),
            pumping,
            pumped,
            consumer.sse().error_shape(claim.shape),
            claim,
        ));
    }

    /// A subscriber of the stream `id`, on whichever instance it runs, after the event
    /// `after`.
    pub(crate) async fn attach(
        &self,
        id: &str,
        after: Option<u64>,
    ) -> Result<Subscriber, AttachError> {
        let keys = Keys::new(id);
        let unavailable = |error| AttachError::Unavailable(unavailable(error));
        type Meta = (Option<String>, Option<u64>, Option<u64>, Option<String>);
        let ((state, start, end, shape),): (Meta,) = self
            .shared
            .redis
            .query(redis::pipe().hmget(&keys.meta, &["state", "start", "end", "shape"]))
            .await
            .map_err(unavailable)?;
        // A claimed stream has nothing to read yet.
        let (Some(state), Some(oldest)) = (state, start) else {
            return Err(AttachError::Unknown);
        };
        let next = after.map_or(0, |after| after.saturating_add(1));
        if next < oldest {
            return Err(AttachError::Gone { oldest });
        }
        if state == "ended" && end.is_some_and(|end| next >= end) {
            return Err(AttachError::Finished);
        }
        let shape = ErrorShape::from_name(shape.as_deref());
        let reader = RedisReader::attach(self.shared.clone(), id, after, shape).await?;
        self.shared.counters.resumed();
        Ok(Subscriber::new(id.into(), reader))
    }

    /// Stops the stream `id` on whichever instance runs it: within 100 ms its pump calls the
    /// stop hook. Whether it was running.
    pub(crate) async fn stop(&self, id: &str) -> Result<bool, AttachError> {
        let keys = Keys::new(id);
        let mut stop = redis::pipe();
        stop.cmd("EVAL").arg(STOP).arg(1).arg(&keys.meta);
        let (state,): (Option<String>,) = self
            .shared
            .redis
            .query(&stop)
            .await
            .map_err(|error| AttachError::Unavailable(unavailable(error)))?;
        match state.as_deref() {
            None => Err(AttachError::Unknown),
            Some("ended") => Ok(false),
            Some(_) => Ok(true),
        }
    }

    /// From now on the stream `id`, pumped here, appends every frame at once.
    pub(crate) fn stop_waiting(&self, id: &str) {
        if let Some(pumped) = self.shared.pumped(id) {
            pumped
                .stop_waiting
                .store(true, std::sync::atomic::Ordering::Relaxed);
            pumped.moved.notify_one();
        }
    }

    /// `alias` names the stream `id` on every instance, in its meta key (which goes with the
    /// stream) and in a key of the name's own (kept for the retention and an hour), if the
    /// stream exists (claimed, running or retained).
    pub(crate) async fn alias(&self, alias: &str, id: &str) -> Result<(), StoreError> {
        let mut name = redis::pipe();
        name.cmd("EVAL")
            .arg(ALIAS)
            .arg(1)
            .arg(Keys::new(id).meta)
            .arg(alias_field(alias));
        let (named,): (bool,) = self.shared.redis.query(&name).await.map_err(unavailable)?;
        if !named {
            return Ok(());
        }
        let mut set = redis::pipe();
        set.cmd("SET")
            .arg(alias_key(alias))
            .arg(id)
            .arg("PX")
            .arg(millis(self.shared.options.retain + ALIAS_TTL))
            .ignore();
        self.shared
            .redis
            .query::<()>(&set)
            .await
            .map_err(unavailable)
    }

    /// The id of the stream `alias` names: one whose meta key still has that name.
    pub(crate) async fn resolve(&self, alias: &str) -> Result<Option<String>, StoreError> {
        let (id,): (Option<String>,) = self
            .shared
            .redis
            .query(redis::pipe().get(alias_key(alias)))
            .await
            .map_err(unavailable)?;
        let Some(id) = id else {
            return Ok(None);
        };
        let (named,): (bool,) = self
            .shared
            .redis
            .query(redis::pipe().hexists(Keys::new(&id).meta, alias_field(alias)))
            .await
            .map_err(unavailable)?;
        Ok(named.then_some(id))
    }

    /// Whether Redis answers.
    pub(crate) async fn check(&self) -> Result<(), StoreError> {
        let ping = tokio::time::timeout(
            BLOCK * 2,
            self.shared
                .redis
                .query::<()>(redis::pipe().cmd("PING").ignore()),
        )
        .await;
        match ping {
            Ok(answer) => answer.map_err(unavailable),
            Err(elapsed) => Err(StoreError::new(elapsed)),
        }
    }

    /// This instance's part: the streams it pumps (`detached`: nobody attached on any
    /// instance, the grace running; `log_bytes`: their logs' bytes), the attaches made through
    /// it and the graces that ran out in its pumps.
    pub(crate) fn stats(&self) -> RegistryStats {
        use std::sync::atomic::Ordering::Relaxed;
        let pumped = lock(&self.shared.pumped);
        let detached = pumped.values().filter(|s| s.detached.load(Relaxed)).count();
        let bytes = pumped
            .values()
            .map(|s| s.bytes.load(Relaxed) as usize)
            .sum();
        self.shared.counters.stats(pumped.len(), detached, bytes)
    }
}
