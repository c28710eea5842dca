//! A claim in Redis: a new stream's id reserved across instances, its lease renewed while it
//! is held, given back if the stream is never registered, free for another claim once its
//! lease lapsed.

use std::time::Duration;

use redis::RedisResult;
use tokio::sync::watch;

use super::keys::{Keys, millis};
use super::shared::Shared;
use super::timing::{PUMP_LEASE, RENEWAL, RUNNING_TTL, TICK};
use crate::resume::error::{ClaimError, StoreError};
use crate::sync::{Arc, lock};

/// An id claimed in Redis: its meta key, created by this claim (`state` is `claimed`), which
/// holds the claim's name.
pub(crate) struct Reservation {
    shared: Arc<Shared>,
    id: String,
    meta: String,
    name: String,
    /// Renews the key's TTL while the claim is held.
    renewal: tokio::task::JoinHandle<()>,
    /// Given back when dropped: the stream was never registered.
    armed: bool,
}

/// Claims an id: creates its meta key as `claimed` by `ARGV[1]` with a TTL of `ARGV[2]` ms and
/// a claim lease (`held`, Unix ms on Redis's clock) of `ARGV[3]` ms, or answers the state of
/// the stream that has it. A claim whose lease lapsed (its instance died, or answered its
/// request without it) is taken over. Run again by the same claim (its answer was lost with
/// its connection), it wins again.
const CLAIM: &str = r"
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
local held = string.format('%d', ms + tonumber(ARGV[3]))
if redis.call('HSETNX', KEYS[1], 'state', 'claimed') == 1 then
    redis.call('HSET', KEYS[1], 'claim', ARGV[1], 'held', held)
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 'won'
end
if redis.call('HGET', KEYS[1], 'claim') == ARGV[1] then return 'won' end
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'claimed' and tonumber(redis.call('HGET', KEYS[1], 'held') or '0') < ms then
    redis.call('HSET', KEYS[1], 'claim', ARGV[1], 'held', held)
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 'won'
end
return state";

/// Renews the claim `ARGV[1]`'s lease (`ARGV[2]` ms) and its key's TTL (`ARGV[3]` ms) while
/// the id is still claimed by it.
const RENEW: &str = r"
if redis.call('HGET', KEYS[1], 'claim') == ARGV[1]
    and redis.call('HGET', KEYS[1], 'state') == 'claimed' then
    local now = redis.call('TIME')
    local held = now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ARGV[2])
    redis.call('HSET', KEYS[1], 'held', string.format('%d', held))
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 0";

/// The longest a claim waits for an earlier one of its id to be given back, and a release for
/// Redis to answer.
const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// Gives a claim back: deletes the meta key if it is still this claim's and not registered.
const RELEASE: &str = r"
if redis.call('HGET', KEYS[1], 'claim') == ARGV[1]
    and redis.call('HGET', KEYS[1], 'state') == 'claimed' then
    return redis.call('DEL', KEYS[1])
end
return 0";

impl Reservation {
    /// Claims `id` in Redis, in one round trip: of two instances claiming it at once, one
    /// wins. A key that exists keeps its TTL, so a retained stream is not kept longer for being
    /// asked about.
    pub(crate) async fn claim(shared: &Arc<Shared>, id: &str) -> Result<Self, ClaimError> {
        let releasing = lock(&shared.releasing).get(id).cloned();
        if let Some(mut released) = releasing {
            // An earlier claim of this instance is being given back: after it.
            let _ = tokio::time::timeout(RELEASE_WAIT, released.wait_for(|done| *done)).await;
        }
        let keys = Keys::new(id);
        let name = shared.name();
        let mut claim = redis::pipe();
        claim
            .cmd("EVAL")
            .arg(CLAIM)
            .arg(1)
            .arg(&keys.meta)
            .arg(&name)
            .arg(millis(RUNNING_TTL))
            .arg(millis(PUMP_LEASE));
        let (answer,): (Option<String>,) = shared
            .redis
            .query(&claim)
            .await
            .map_err(|error| ClaimError::Unavailable(StoreError::new(error)))?;
        match answer.as_deref() {
            Some("won") => {}
            Some("ended") => return Err(ClaimError::Retained),
            _ => return Err(ClaimError::Running),
        }
        let renewal = tokio::spawn(renew(shared.clone(), keys.meta.clone(), name.clone()));
        Ok(Reservation {
            shared: shared.clone(),
            id: id.to_owned(),
            meta: keys.meta,
            name,
            renewal,
            armed: true,
        })
    }

    /// The hold of an instance that adopted the stream `id` as `name` (see `adopt.rs`): renews
    /// its pump lease and its keys' TTL until its pump starts. Dropped unregistered, it leaves
    /// the lease to lapse, and another instance can adopt the stream then.
    pub(crate) fn adopted(shared: &Arc<Shared>, id: &str, name: String) -> Self {
        let keys = Keys::new(id);
        let renewal = tokio::spawn(renew_lease(shared.clone(), keys.clone(), name.clone()));
        Reservation {
            shared: shared.clone(),
            id: id.to_owned(),
            meta: keys.meta,
            name,
            renewal,
            armed: false,
        }
    }
}

impl crate::resume::claim::Reservation for Reservation {
    fn name(&self) -> &str {
        &self.name
    }

    fn registered(mut self: Box<Self>) {
        // Its pump keeps the keys from now on.
        self.armed = false;
    }
}

/// Renews the claim `name`'s lease and its key's TTL a few times per lease, until aborted.
async fn renew(shared: Arc<Shared>, meta: String, name: String) {
    let mut renewal = redis::pipe();
    renewal
        .cmd("EVAL")
        .arg(RENEW)
        .arg(1)
        .arg(&meta)
        .arg(&name)
        .arg(millis(PUMP_LEASE))
        .arg(millis(RUNNING_TTL))
        .ignore();
    loop {
        tokio::time::sleep(RENEWAL).await;
        // A failure is seen by whoever uses the claim next.
        let _: RedisResult<()> = shared.redis.query(&renewal).await;
    }
}

/// Renews an adopted stream's pump lease (while it is still `name`'s) and its keys' TTL, every
/// tick, until aborted.
async fn renew_lease(shared: Arc<Shared>, keys: Keys, name: String) {
    loop {
        // A failure is seen by whoever uses the adoption next.
        let _ = super::pump::hold(&shared, &keys, &name).await;
        tokio::time::sleep(TICK).await;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.renewal.abort();
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to give it back on (the process is ending): its TTL does.
            return;
        };
        let (shared, id) = (self.shared.clone(), self.id.clone());
        let (meta, name) = (self.meta.clone(), self.name.clone());
        let (done, released) = watch::channel(false);
        lock(&shared.releasing).insert(id.clone(), released);
        runtime.spawn(async move {
            let mut release = redis::pipe();
            release
                .cmd("EVAL")
                .arg(RELEASE)
                .arg(1)
                .arg(&meta)
                .arg(&name)
                .ignore();
            // Left to its TTL if Redis does not answer.
            let _ = tokio::time::timeout(RELEASE_WAIT, shared.redis.query::<()>(&release)).await;
            lock(&shared.releasing).remove(&id);
            let _ = done.send(true);
        });
    }
}
