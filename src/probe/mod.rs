//! Probes: per-hop gap counters and hop records, to tell *where* a stream froze.
//!
//! A [`HopProbe`] names a boundary (`worker.publish`, `gateway.recv`, `client.recv`, …) and
//! aggregates every stream seen there; a [`Recorder`] records one stream's events at it, by hand
//! or through the [`Probed`] combinator ([`GateExt::probe`](crate::GateExt::probe)). Gaps are
//! measured between visible events on the hop's own monotonic clock; hidden events keep a
//! stream alive without counting as progress. Nothing of the payload is ever recorded.
//!
//! Hop records ([`HopRecord`], JSON lines through a [`RecordSink`]) carry request id + seq +
//! local time per event for a sampled share of requests; [`timeline`](crate::timeline) reads
//! them from several hops and processes and names the hop where each stall began.
//!
//! The probe knows nothing of the gate: it attaches to any stream whose items are
//! [`Observed`].

mod counters;
#[cfg(feature = "metrics")]
mod export;
mod histogram;
mod hop;
mod observe;
mod probed;
mod record;
mod recorder;
#[cfg(feature = "serde")]
mod serialize;

pub use self::counters::{GapCounters, POSITION_CLASSES, PositionGaps};
pub use self::histogram::Histogram;
pub use self::hop::{DEFAULT_STALL, HopProbe, HopSnapshot};
pub use self::observe::{Observation, Observed, Seen};
pub use self::probed::Probed;
pub(crate) use self::record::json_string;
pub use self::record::{DEFAULT_RECORD_QUEUE, HopRecord, RecordError, RecordSink};
pub use self::recorder::Recorder;
