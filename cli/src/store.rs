//! Where `sim`'s and the proxy's streams live while they run and for their grace
//! (`--resume-store`): a replay log per stream, in this process or in Redis Streams, and the
//! explicit stop of each stream running here; with the answers both give when a resume or a
//! stop finds no stream to serve.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_core::Stream;
use streamgate::resume::{
    AttachError, RedisRegistry, RegisterError, Registry, RegistryStats, ResumeOptions,
};
use streamgate::sse::{SseEvent, SseFrame};
use streamgate::{Chunk, Consumer, GateExt};
use tokio_util::sync::CancellationToken;

use crate::flags::ResumeStore;
use crate::serving;

/// A stream's encoded frames, from either store.
pub type Frames = Pin<Box<dyn Stream<Item = SseFrame> + Send>>;

/// Every resumable stream by name, with chunks of type `C`: several readers at once, and an
/// explicit stop.
pub struct Store<C> {
    logs: Logs<C>,
    stops: Arc<Stops>,
}

/// The replay logs.
enum Logs<C> {
    /// In this process.
    Memory(Registry<C>),
    /// In Redis Streams: another instance can serve the resume, and stop the stream.
    Redis(RedisRegistry),
}

/// The explicit stop of every stream running here, by name, with the generation that holds it
/// (a generation refused the name must not remove the holder's).
#[derive(Default)]
struct Stops {
    held: Mutex<HashMap<String, (u64, CancellationToken)>>,
    next_generation: AtomicU64,
}

impl Stops {
    /// Cancels the stream `name` if it runs here: whether it did.
    fn cancel(&self, name: &str) -> bool {
        let stop = self
            .held
            .lock()
            .unwrap()
            .get(name)
            .map(|(_, stop)| stop.clone());
        match stop {
            Some(stop) => {
                stop.cancel();
                true
            }
            None => false,
        }
    }
}

/// A generation's claim on its stream's name, from [`Store::claim`] until [`Store::release`]:
/// its explicit stop, which `POST .../cancel` finds by the name.
///
/// Dropping a claim gives it back too (a request whose client left while it waited for its
/// upstream must not keep the name).
#[must_use = "a claim is given back with `Store::release`, or when dropped"]
pub struct Claim {
    name: String,
    generation: u64,
    stop: CancellationToken,
    stops: Arc<Stops>,
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim")
            .field("name", &self.name)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut held = self.stops.held.lock().unwrap();
        if held
            .get(&self.name)
            .is_some_and(|(holder, _)| *holder == self.generation)
        {
            held.remove(&self.name);
        }
    }
}

/// Why [`Store::try_claim`] refused a name.
#[derive(Debug)]
pub enum ClaimError {
    /// A stream of this name runs here.
    Running,
    /// A stream of this name finished here and is retained for its grace.
    Finished,
    /// The Redis store holds a stream of this name (running or retained, on any instance).
    Exists,
    /// Redis failed.
    Unavailable(String),
}

impl Claim {
    /// Cancelled when the stream is stopped (here, or through another instance): the
    /// generation ends on its own terms, with a final chunk.
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }
}

impl<C> Store<C>
where
    C: Chunk + Clone + Into<SseEvent> + Send + Sync + 'static,
{
    /// The store `store` names, keeping its streams as `options` says.
    ///
    /// # Errors
    ///
    /// When the Redis URL is malformed, with Redis's error.
    pub fn open(store: &ResumeStore, options: ResumeOptions) -> Result<Self, String> {
        let stops = Arc::new(Stops::default());
        let logs = match store {
            ResumeStore::Memory => Logs::Memory(Registry::new(options)),
            ResumeStore::Redis(url) => {
                // A stop asked through another instance ends a stream running here as its own
                // stop does: with a final chunk.
                let stops = stops.clone();
                let registry = RedisRegistry::new(url, options)
                    .map_err(|error| error.to_string())?
                    .on_stop(move |name| {
                        stops.cancel(name);
                    });
                Logs::Redis(registry)
            }
        };
        Ok(Store { logs, stops })
    }

    /// Whether a stream is registered under `name` here (a Redis store answers at
    /// registration).
    pub fn contains(&self, name: &str) -> bool {
        match &self.logs {
            Logs::Memory(registry) => registry.contains(name),
            Logs::Redis(_) => false,
        }
    }

    /// A new generation's claim on `name`, unless another generation holds it (then
    /// registering under `name` is refused, and this claim's stop stops nothing else).
    pub fn claim(&self, name: &str) -> Claim {
        let generation = self.stops.next_generation.fetch_add(1, Ordering::Relaxed);
        let stop = CancellationToken::new();
        self.stops
            .held
            .lock()
            .unwrap()
            .entry(name.to_owned())
            .or_insert_with(|| (generation, stop.clone()));
        Claim {
            name: name.to_owned(),
            generation,
            stop,
            stops: self.stops.clone(),
        }
    }

    /// Claims `name` for a new stream before any work starts for it, or says why not: the
    /// name is held here (atomically: of two concurrent claims one wins), retained here, or
    /// (Redis) known to the store. With Redis, two instances claiming the same new name at
    /// once may both pass this check; registration then refuses the later one.
    ///
    /// # Errors
    ///
    /// As [`ClaimError`] says.
    pub async fn try_claim(&self, name: &str) -> Result<Claim, ClaimError> {
        let claim = {
            let mut held = self.stops.held.lock().unwrap();
            if held.contains_key(name) {
                return Err(ClaimError::Running);
            }
            if let Logs::Memory(registry) = &self.logs {
                if registry.contains(name) {
                    return Err(ClaimError::Finished);
                }
            }
            let generation = self.stops.next_generation.fetch_add(1, Ordering::Relaxed);
            let stop = CancellationToken::new();
            held.insert(name.to_owned(), (generation, stop.clone()));
            Claim {
                name: name.to_owned(),
                generation,
                stop,
                stops: self.stops.clone(),
            }
        };
        if let Logs::Redis(registry) = &self.logs {
            // Dropping `claim` on the way out gives the name back.
            match registry.attach(name, None).await {
                Err(AttachError::Unknown) => {}
                Err(AttachError::Unavailable(why)) => return Err(ClaimError::Unavailable(why)),
                Ok(_) | Err(_) => return Err(ClaimError::Exists),
            }
        }
        Ok(claim)
    }

    /// Whether the store answers (a memory store always does): the reason when it does not.
    pub async fn check(&self) -> Result<(), String> {
        match &self.logs {
            Logs::Memory(_) => Ok(()),
            Logs::Redis(registry) => match registry.attach("streamgate-health-check", None).await {
                Err(AttachError::Unavailable(why)) => Err(why),
                _ => Ok(()),
            },
        }
    }

    /// Gives back `claim` as its generation ends (from its gate's release hook); dropping it
    /// does the same.
    pub fn release(&self, claim: Claim) {
        drop(claim);
    }

    /// Registers a stream under `name`; its first reader's frames.
    ///
    /// # Errors
    ///
    /// [`RegisterError::Duplicate`] when the name is taken (here, or on another instance),
    /// [`RegisterError::Unavailable`] when Redis failed.
    pub async fn register(&self, name: &str, events: Consumer<C>) -> Result<Frames, RegisterError> {
        match &self.logs {
            Logs::Memory(registry) => match registry.register(name, events) {
                Ok(subscriber) => Ok(Box::pin(subscriber.sse())),
                Err(_duplicate) => Err(RegisterError::Duplicate),
            },
            Logs::Redis(registry) => Ok(Box::pin(registry.register(name, events).await?)),
        }
    }

    /// A new reader of the stream `name`, after the event `after`.
    ///
    /// # Errors
    ///
    /// As [`attach_error`] answers them.
    pub async fn attach(&self, name: &str, after: Option<u64>) -> Result<Frames, AttachError> {
        match &self.logs {
            Logs::Memory(registry) => {
                let subscriber = registry.attach(name, after)?;
                Ok(Box::pin(subscriber.sse()))
            }
            Logs::Redis(registry) => Ok(Box::pin(registry.attach(name, after).await?)),
        }
    }

    /// Stops the stream `name`, here or on another instance (which ends it as its own stop
    /// does): whether it was running (`false`: it had ended, and is still retained).
    ///
    /// # Errors
    ///
    /// As [`attach_error`] answers them.
    pub async fn cancel(&self, name: &str) -> Result<bool, AttachError> {
        if self.stops.cancel(name) {
            // Its last events (a final chunk, `[DONE]`) wait for no slow reader or resume (a
            // Redis pump waits for nobody attached).
            if let Logs::Memory(registry) = &self.logs {
                registry.stop_waiting(name);
            }
            return Ok(true);
        }
        match &self.logs {
            Logs::Memory(registry) if registry.contains(name) => Ok(false),
            Logs::Memory(_) => Err(AttachError::Unknown),
            Logs::Redis(registry) => registry.stop(name).await,
        }
    }

    /// What the store holds now, and what happened so far.
    pub fn stats(&self) -> RegistryStats {
        match &self.logs {
            Logs::Memory(registry) => registry.stats(),
            Logs::Redis(registry) => registry.stats(),
        }
    }
}

impl<C> std::fmt::Debug for Store<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.logs {
            Logs::Memory(_) => "memory",
            Logs::Redis(_) => "redis",
        };
        f.debug_struct("Store")
            .field("logs", &kind)
            .field("running", &self.stops.held.lock().unwrap().len())
            .finish()
    }
}

/// The position a resume asks for, an extractor: `?after=n`, else `Last-Event-ID: n` (`None`:
/// from the start); rejected with 400 when `after` is no event id.
#[derive(Debug, Clone, Copy)]
pub struct ResumeAfter(pub Option<u64>);

impl<S: Send + Sync> FromRequestParts<S> for ResumeAfter {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Response> {
        let mut after = last_event_id(&parts.headers);
        for pair in parts.uri.query().unwrap_or("").split('&') {
            if let Some(value) = pair.strip_prefix("after=") {
                match value.parse::<u64>() {
                    Ok(n) => after = Some(n),
                    Err(_) => {
                        return Err(serving::json_error(
                            StatusCode::BAD_REQUEST,
                            "`after` must be an event id",
                            "invalid_request_error",
                        ));
                    }
                }
            }
        }
        Ok(ResumeAfter(after))
    }
}

/// The `Last-Event-ID` header as an event id, if it is one.
pub fn last_event_id(headers: &HeaderMap) -> Option<u64> {
    headers
        .get("last-event-id")
        .and_then(|id| id.to_str().ok())
        .and_then(|id| id.trim().parse::<u64>().ok())
}

/// 404 for an unknown (or expired) stream, 409 for a position its log no longer holds, 204 when
/// nothing follows the position of a finished stream (which stops an `EventSource` from
/// reconnecting after `[DONE]`), 503 when the store failed.
pub fn attach_error(error: &AttachError) -> Response {
    match error {
        AttachError::Finished => StatusCode::NO_CONTENT.into_response(),
        AttachError::Gone { .. } => {
            serving::json_error(StatusCode::CONFLICT, &error.to_string(), "conflict_error")
        }
        AttachError::Unavailable(_) => unavailable(&error.to_string()),
        _ => serving::json_error(StatusCode::NOT_FOUND, &error.to_string(), "not_found_error"),
    }
}

/// 503: the resume store failed.
pub fn unavailable(message: &str) -> Response {
    serving::json_error(StatusCode::SERVICE_UNAVAILABLE, message, "server_error")
}
