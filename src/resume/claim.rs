//! Claims: the ids of the streams that run here, each from its claim to its gate's release,
//! with the explicit stop of each.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio_util::sync::CancellationToken;

use super::error::ClaimError;
use crate::sse::ErrorShape;

/// A new stream's hold on its id, from [`Registry::claim`](super::Registry::claim): no other
/// stream can take the id (here or, in Redis, on any instance) while it is held, and
/// [`Registry::register`](super::Registry::register) registers the stream under it.
///
/// Claim before any work starts for the stream (before asking an upstream, before taking KV
/// blocks), so that a duplicate id costs nothing. Dropping a claim that was never registered
/// gives the id back; a registered stream keeps it until its gate is released, and its
/// retained log keeps it taken for the retention.
///
/// # Examples
///
/// ```
/// use streamgate::resume::{ClaimError, Registry, ResumeOptions};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let registry = Registry::<String>::memory(ResumeOptions::default());
/// let claim = registry.claim("req-1").await.unwrap();
/// assert!(matches!(registry.claim("req-1").await, Err(ClaimError::Running)));
/// drop(claim); // never registered: the id is free again
/// assert!(registry.claim("req-1").await.is_ok());
/// # }
/// ```
#[must_use = "a claim holds its id until it is registered or dropped"]
pub struct Claim {
    id: Arc<str>,
    generation: u64,
    stop: CancellationToken,
    claims: Arc<Claims>,
    /// What the store holds for the id while it is claimed (none in memory), given back with
    /// the claim.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) reserved: Option<Box<dyn Reservation>>,
    /// What another instance needs to carry the stream on ([`Claim::keep_request`]).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) request: Option<bytes::Bytes>,
    /// The error shape of every early end of the stream ([`Claim::error_shape`]).
    pub(crate) shape: ErrorShape,
}

/// What a store keeps of a claim besides this process's table: a Redis claim, renewed while it
/// is held and given back when dropped unregistered.
pub(crate) trait Reservation: Send + Sync {
    /// The name the store knows the claim by.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    fn name(&self) -> &str;

    /// The stream is registered: the store keeps its id from now on.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    fn registered(self: Box<Self>);
}

impl Claim {
    /// The id claimed.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The stream's stop signal: cancelled by an explicit stop
    /// ([`Registry::stop`](super::Registry::stop), through any instance sharing the store).
    ///
    /// Taking it means the generator ends the stream itself when it is cancelled, with a last
    /// word of its own (a final chunk with `finish_reason: "stop"` and `[DONE]`, as OpenAI
    /// clients expect): the registry then lets the stream's last events reach every
    /// subscriber without waiting for a slow reader or a resume. A stream whose claim's signal
    /// was never taken is stopped by cancelling its gate (it ends
    /// [`Cancelled`](crate::EndReason::Cancelled)).
    ///
    /// ```
    /// use streamgate::resume::{Registry, ResumeOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let registry = Registry::<String>::memory(ResumeOptions::default());
    /// let mut claim = registry.claim("req-1").await.unwrap();
    /// let stop = claim.stop_signal();
    /// assert!(registry.stop("req-1").await.unwrap(), "it runs here");
    /// assert!(stop.is_cancelled());
    /// # }
    /// ```
    pub fn stop_signal(&mut self) -> CancellationToken {
        if let Some(held) = self.claims.lock().get_mut(&self.id) {
            if held.generation == self.generation {
                held.graceful = true;
            }
        }
        self.stop.clone()
    }

    /// Keeps `request` with the stream, for as long as it runs: what another instance sharing
    /// a Redis store needs to carry the stream on if this one dies (its
    /// [`Adoption::request`](super::Adoption::request), see `Registry::adopt`). Opaque to the
    /// registry; a memory store keeps nothing (no other process can adopt its streams).
    ///
    /// Whatever it holds (a request's headers, credentials among them) is as safe as the
    /// Redis the logs are in.
    ///
    /// ```
    /// use streamgate::resume::{Registry, ResumeOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let registry = Registry::<String>::memory(ResumeOptions::default());
    /// let mut claim = registry.claim("req-1").await.unwrap();
    /// claim.keep_request(r#"{"model":"m","messages":[]}"#);
    /// # }
    /// ```
    pub fn keep_request(&mut self, request: impl Into<bytes::Bytes>) {
        self.request = Some(request.into());
    }

    /// Writes every early end of the stream in `shape`, the error shape of the API it speaks:
    /// the stream's own terminal frame, and each subscriber's (one cut off for holding the log
    /// back, or whose store failed), on every instance sharing a Redis store. OpenAI's shape
    /// by default.
    ///
    /// ```
    /// use streamgate::resume::{Registry, ResumeOptions};
    /// use streamgate::sse::ErrorShape;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let registry = Registry::<String>::memory(ResumeOptions::default());
    /// let mut claim = registry.claim("msg-1").await.unwrap();
    /// claim.error_shape(ErrorShape::Anthropic);
    /// # }
    /// ```
    pub fn error_shape(&mut self, shape: ErrorShape) {
        self.shape = shape;
    }

    /// Tells this claim from an earlier or later one of the same id.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// The table this claim is held in.
    pub(crate) fn is_from(&self, claims: &Arc<Claims>) -> bool {
        Arc::ptr_eq(&self.claims, claims)
    }

    /// Where the stream is once registered: its gate is what a plain stop cancels.
    pub(crate) fn registered(&self, handle: crate::GateHandle) {
        let stopped = {
            let mut held = self.claims.lock();
            match held.get_mut(&self.id) {
                Some(held) if held.generation == self.generation => {
                    held.gate = Some(handle.clone());
                    held.stopped && !held.graceful
                }
                _ => false,
            }
        };
        if stopped {
            // A stop came between the claim and the registration.
            handle.cancel();
        }
    }
}

impl fmt::Debug for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("id", &self.id)
            .field("stopped", &self.stop.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut held = self.claims.lock();
        if held
            .get(&self.id)
            .is_some_and(|held| held.generation == self.generation)
        {
            held.remove(&self.id);
        }
    }
}

/// The claims of one registry, by id.
#[derive(Default)]
pub(crate) struct Claims {
    held: Mutex<HashMap<Arc<str>, Held>>,
    next_generation: AtomicU64,
}

/// One claim, as the table keeps it.
struct Held {
    /// Tells this claim from an earlier or later one of the same id.
    generation: u64,
    stop: CancellationToken,
    /// The stop signal was taken: the generator ends the stream itself.
    graceful: bool,
    /// A stop was asked for.
    stopped: bool,
    /// The stream's gate, once registered.
    gate: Option<crate::GateHandle>,
}

impl Claims {
    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A claim on `id`, unless one is held ([`ClaimError::Running`]) or, asked while no claim
    /// can be taken or given back, `retained` says the store still keeps a finished stream
    /// under it ([`ClaimError::Retained`]); `reserved` is what the store keeps of it.
    pub(crate) fn try_claim(
        self: &Arc<Self>,
        id: &str,
        reserved: Option<Box<dyn Reservation>>,
        retained: impl FnOnce() -> bool,
    ) -> Result<Claim, ClaimError> {
        let mut held = self.lock();
        if held.contains_key(id) {
            return Err(ClaimError::Running);
        }
        if retained() {
            return Err(ClaimError::Retained);
        }
        let id: Arc<str> = id.into();
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let stop = CancellationToken::new();
        held.insert(
            id.clone(),
            Held {
                generation,
                stop: stop.clone(),
                graceful: false,
                stopped: false,
                gate: None,
            },
        );
        Ok(Claim {
            id,
            generation,
            stop,
            claims: self.clone(),
            reserved,
            request: None,
            shape: ErrorShape::OpenAi,
        })
    }

    /// The generation of the claim held on `id`, if one is.
    pub(crate) fn generation(&self, id: &str) -> Option<u64> {
        self.lock().get(id).map(|held| held.generation)
    }

    /// Whether a claim on `id` is held.
    #[cfg(feature = "redis")]
    pub(crate) fn is_held(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    /// Stops the stream claimed as `id`, if it runs here: cancels its stop signal if it was
    /// taken, its gate otherwise (at once, or as soon as it is registered). Whether it runs
    /// here.
    pub(crate) fn stop(&self, id: &str) -> bool {
        let (graceful, stop, gate) = {
            let mut held = self.lock();
            let Some(held) = held.get_mut(id) else {
                return false;
            };
            held.stopped = true;
            (held.graceful, held.stop.clone(), held.gate.clone())
        };
        if graceful {
            stop.cancel();
        } else if let Some(gate) = gate {
            gate.cancel();
        }
        true
    }
}
