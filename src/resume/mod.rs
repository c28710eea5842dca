//! Resumable streams: a registry of streams keyed by request id, detached from connections.
//!
//! A disconnect is not a stop. A [`Registry`] takes a gated stream's consumer and keeps its
//! events, as SSE frames with their event ids, in a bounded replay log; [`Subscriber`]s read
//! it from a position (an SSE `Last-Event-ID`), several at once, each at its own pace. When
//! the last one leaves, the stream goes on for a grace period, waiting for a resume; only an
//! explicit [`stop`](Registry::stop), the grace running out, or the gate's own end (completion,
//! policy, error) ends the generator. A position the log no longer holds, or an unknown id, is
//! a typed [`AttachError`], never a silent skip.
//!
//! ```text
//! claim(id) -> generator -> gate -> register(claim, consumer) -> [replay log, bounded]
//!                                      -> subscriber 1 (SSE frames) -> transport
//!                                      -> subscriber 2 ...   (attach(id, Last-Event-ID))
//! ```
//!
//! The logs live in this process ([`Registry::memory`]) or, with the `redis` feature, in
//! Redis Streams (`Registry::redis`), so that a client can resume through any instance of a
//! horizontally scaled server. Both stores take the same [`ResumeOptions`], give the same
//! subscriber and answer with the same errors.

#[cfg(feature = "redis")]
mod adoption;
mod aliases;
mod claim;
mod error;
mod memory;
mod options;
#[cfg(feature = "redis")]
mod redis;
mod registry;
mod stats;
mod subscriber;

#[cfg(feature = "redis")]
pub use self::adoption::Adoption;
pub use self::aliases::MAX_ALIASES;
pub use self::claim::Claim;
pub use self::error::{AdoptError, AttachError, ClaimError, RegisterError, StoreError};
pub use self::options::{
    DEFAULT_GRACE, DEFAULT_LOG_BYTES, DEFAULT_LOG_EVENTS, DEFAULT_OUTAGE, DEFAULT_RETAIN,
    ResumeOptions,
};
pub use self::registry::Registry;
pub use self::stats::RegistryStats;
pub use self::subscriber::Subscriber;
