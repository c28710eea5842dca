//! Fleets of upstreams, for a gateway: pools of replicas balanced for streams, health kept per
//! replica and per deployment, and the attempts of one request before its first event
//! (retries on another replica or the same one after a backoff, `Retry-After`, fallback
//! models), bounded in number and time.
//!
//! ```text
//! request --Attempts::model/avoid--> Pool::pick --Lease (a stream in flight)--> upstream
//!    ^                                                |
//!    +--- Attempts::failed(failure) -> Retry | Fallback | GiveUp <-- Lease::failed(failure)
//! ```
//!
//! Nothing here speaks a wire format or makes a connection: a gateway classifies what an
//! attempt met as a [`Failure`] (a connection refused, a reset, a silence, an error status
//! with its `Retry-After` and body code), reports it on the attempt's [`Lease`], and asks its
//! [`Attempts`] what next. Once a stream's first event has reached its client, no attempt is
//! invisible any more: that is for continuation, not for this module.

mod attempts;
mod circuit;
mod failure;
mod lease;
mod pool;
mod random;

pub use self::attempts::{AttemptOptions, Attempts, Next};
pub use self::circuit::CircuitOptions;
pub use self::failure::{Cause, ErrorCode, Failure, Retry, Scope};
pub use self::lease::Lease;
pub use self::pool::{Pool, ReplicaStats};
