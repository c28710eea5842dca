//! The gate: a bounded, cancellable, policy-driven buffer between a generator and its consumer.
//!
//! ```text
//! generator --(spawned, owned by the gate)--> [buffer: events + bytes, policy] --> Consumer (a Stream)
//!     ^  CancellationToken / drop                                                    |
//!     +------------------------ Consumer dropped ---------------------------------------+
//! ```
//!
//! [`Gate`] configures a stream and spawns its generator; the [`Consumer`] yields
//! [`Event`]s; a [`GateHandle`] reads the [`EndReason`] and [`GateStats`]. The gate knows no wire
//! format and no transport.

mod budget;
mod buffer;
mod builder;
mod consumer;
mod error;
mod group;
mod handle;
mod policy;
mod release;
mod run;
mod sender;
mod stats;

#[cfg(all(test, loom))]
mod tests;

pub use self::builder::{DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS, DEFAULT_RELEASE_TIMEOUT, Gate};
pub use self::consumer::{Consumer, Event};
pub use self::error::{BoxError, CancelError, GateError};
pub use self::group::{Group, GroupStats, ShutdownReport};
pub use self::handle::GateHandle;
pub use self::policy::{DEFAULT_MAX_PAUSE, Policy};
pub use self::sender::{Closed, SendError, Sender, TrySendError};
pub use self::stats::GateStats;
