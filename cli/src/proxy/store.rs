//! Where the proxy's streams live while they run and for their grace: a replay log per stream,
//! in this process or in Redis Streams (`--resume-store`).
//!
//! The same shape as `sim`'s store, over the proxy's chunk type (the two should share one
//! generic store).

use std::pin::Pin;

use axum::http::StatusCode;
use axum::response::Response;
use futures_core::Stream;
use streamgate::resume::{AttachError, RedisRegistry, Registry, RegistryStats};
use streamgate::sse::Frame;
use streamgate::{Consumer, GateExt};

use super::chunk::Relayed;
use super::error;

/// A stream's encoded frames, from either store.
pub(super) type Frames = Pin<Box<dyn Stream<Item = Frame> + Send>>;

/// The replay logs (`--resume-store`).
pub(super) enum Store {
    /// In this process.
    Memory(Registry<Relayed>),
    /// In Redis Streams: another instance can serve the resume, and stop the stream.
    Redis(RedisRegistry),
}

impl Store {
    /// Whether a stream is registered under `id` here (a Redis store answers at registration).
    pub(super) fn contains(&self, id: &str) -> bool {
        match self {
            Store::Memory(registry) => registry.contains(id),
            Store::Redis(_) => false,
        }
    }

    /// Registers a stream under `id`; its first reader's frames, or the error response (409
    /// when the id is taken, 503 when Redis failed).
    pub(super) async fn register(
        &self,
        id: &str,
        events: Consumer<Relayed>,
    ) -> Result<Frames, Response> {
        let conflict = || {
            error::openai(
                StatusCode::CONFLICT,
                "a stream with this x-request-id is running: resume it at \
                 /v1/chat/completions/{id}/stream, or send another id",
                "conflict_error",
            )
        };
        match self {
            Store::Memory(registry) => match registry.register(id, events) {
                Ok(subscriber) => Ok(Box::pin(subscriber.sse().with_ids())),
                Err(_) => Err(conflict()),
            },
            Store::Redis(registry) => match registry.register(id, events).await {
                Ok(subscriber) => Ok(Box::pin(subscriber)),
                Err(streamgate::resume::RegisterError::Duplicate) => Err(conflict()),
                Err(failure) => Err(error::openai(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &failure.to_string(),
                    "server_error",
                )),
            },
        }
    }

    /// A new reader of the stream `id`, after the event `after`.
    pub(super) async fn attach(&self, id: &str, after: Option<u64>) -> Result<Frames, AttachError> {
        match self {
            Store::Memory(registry) => {
                let subscriber = registry.attach(id, after)?;
                Ok(Box::pin(subscriber.sse().with_ids()))
            }
            Store::Redis(registry) => Ok(Box::pin(registry.attach(id, after).await?)),
        }
    }

    /// Stops the stream `id`, not running in this process: whether it was running (in another
    /// instance, which ends it as its own stop does).
    pub(super) async fn stop(&self, id: &str) -> Result<bool, AttachError> {
        match self {
            // Finished, and still retained: nothing left to stop.
            Store::Memory(registry) if registry.contains(id) => Ok(false),
            Store::Memory(_) => Err(AttachError::Unknown),
            Store::Redis(registry) => registry.stop(id).await,
        }
    }

    /// Lets the stream `id` end without waiting for slow readers or a resume (its final chunk
    /// after a stop).
    pub(super) fn stop_waiting(&self, id: &str) {
        if let Store::Memory(registry) = self {
            registry.stop_waiting(id);
        }
    }

    /// What the store holds now, and what happened so far.
    pub(super) fn stats(&self) -> RegistryStats {
        match self {
            Store::Memory(registry) => registry.stats(),
            Store::Redis(registry) => registry.stats(),
        }
    }
}
