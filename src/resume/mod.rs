//! Resumable streams: a registry of streams keyed by request id, detached from connections.
//!
//! A disconnect is not a stop. A [`Registry`] takes a gated stream's consumer and keeps its
//! events in a bounded replay log; [`Subscriber`]s read it from a position (an SSE
//! `Last-Event-ID`), several at once, each at its own pace. When the last one leaves, the stream
//! goes on for a grace period, waiting for a resume; only an explicit
//! [`stop`](Registry::stop), the grace running out, or the gate's own end (completion, policy,
//! error) ends the generator. A position the log no longer holds, or an unknown id, is a typed
//! [`AttachError`], never a silent skip.
//!
//! ```text
//! generator -> gate -> pump -> [replay log, bounded] -> subscriber 1 -> sse -> transport
//!                                                    -> subscriber 2 ...
//! ```
//!
//! With the `redis` feature, a `RedisRegistry` keeps the logs (as encoded SSE frames), the
//! attachment and the stop in Redis Streams, so a client can resume through any instance of a
//! horizontally scaled server.

mod entry;
mod log;
#[cfg(feature = "redis")]
mod redis;
mod registry;
mod subscriber;

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::redis::{RedisRegistry, RedisSubscriber, RegisterError};
pub use self::registry::{
    AttachError, DEFAULT_GRACE, DEFAULT_LOG_BYTES, DEFAULT_LOG_EVENTS, DEFAULT_RETAIN, DuplicateId,
    Registry, RegistryStats, ResumeOptions,
};
pub use self::subscriber::Subscriber;
