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

mod buffer;
mod builder;
mod consumer;
mod end;
mod handle;
mod policy;
mod release;
mod run;
mod sender;
mod stats;

#[cfg(all(test, loom))]
mod tests;

pub use self::builder::{DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS, Gate};
pub use self::consumer::{Consumer, Event};
pub use self::end::{BoxError, EndReason, GateError};
pub use self::handle::GateHandle;
pub use self::policy::Policy;
pub use self::sender::{SendError, Sender};
pub use self::stats::GateStats;
