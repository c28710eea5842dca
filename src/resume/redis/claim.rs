//! A claim in Redis: a new stream's id reserved across instances, renewed while it is held,
//! given back if the stream is never registered.

use std::time::Duration;

use redis::RedisResult;

use super::RUNNING_TTL;
use super::keys::{Keys, millis};
use super::shared::Shared;
use crate::resume::error::{ClaimError, StoreError};
use crate::sync::Arc;

/// An id claimed in Redis: its meta key, created by this claim (`state` is `claimed`), which
/// holds the claim's name.
pub(crate) struct Reservation {
    shared: Arc<Shared>,
    meta: String,
    name: String,
    /// Renews the key's TTL while the claim is held.
    renewal: tokio::task::JoinHandle<()>,
    /// Given back when dropped: the stream was never registered.
    armed: bool,
}

/// Gives a claim back: deletes the meta key if it is still this claim's and not registered.
const RELEASE: &str = r"
if redis.call('HGET', KEYS[1], 'claim') == ARGV[1]
    and redis.call('HGET', KEYS[1], 'state') == 'claimed' then
    return redis.call('DEL', KEYS[1])
end
return 0";

impl Reservation {
    /// Claims `id` in Redis: of two instances claiming it at once, one wins.
    pub(crate) async fn claim(shared: &Arc<Shared>, id: &str) -> Result<Self, ClaimError> {
        let keys = Keys::new(id);
        let unavailable = |error| ClaimError::Unavailable(StoreError::new(error));
        let ttl = millis(RUNNING_TTL);
        // The first to create the key wins; a key that exists keeps its TTL (`NX`), so a
        // retained stream is not kept longer for being asked about.
        let (created, state): (bool, Option<String>) = shared
            .query(
                redis::pipe()
                    .atomic()
                    .hset_nx(&keys.meta, "state", "claimed")
                    .cmd("PEXPIRE")
                    .arg(&keys.meta)
                    .arg(ttl)
                    .arg("NX")
                    .ignore()
                    .hget(&keys.meta, "state"),
            )
            .await
            .map_err(unavailable)?;
        if !created {
            return Err(match state.as_deref() {
                Some("ended") => ClaimError::Retained,
                _ => ClaimError::Running,
            });
        }
        let name = shared.name();
        shared
            .query::<()>(redis::pipe().hset(&keys.meta, "claim", &name).ignore())
            .await
            .map_err(unavailable)?;
        let renewal = tokio::spawn(renew(shared.clone(), keys.meta.clone()));
        Ok(Reservation {
            shared: shared.clone(),
            meta: keys.meta,
            name,
            renewal,
            armed: true,
        })
    }

    /// The stream is registered: its pump keeps its keys from now on.
    pub(crate) fn registered(mut self) {
        self.armed = false;
    }
}

/// Renews the claimed key's TTL a few times per TTL, until aborted.
async fn renew(shared: Arc<Shared>, meta: String) {
    let every = RUNNING_TTL / 3;
    loop {
        tokio::time::sleep(every).await;
        // A failure is seen by whoever uses the claim next.
        let _: RedisResult<()> = shared
            .query(
                redis::pipe()
                    .pexpire(&meta, millis(RUNNING_TTL) as i64)
                    .ignore(),
            )
            .await;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.renewal.abort();
        if !self.armed {
            return;
        }
        let (shared, meta, name) = (self.shared.clone(), self.meta.clone(), self.name.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
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
                let _ = tokio::time::timeout(Duration::from_secs(2), shared.query::<()>(&release))
                    .await;
            });
        }
    }
}
