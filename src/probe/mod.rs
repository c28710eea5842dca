//! Probes: per-hop gap counters and hop records, to tell *where* a stream froze.
//!
//! A [`HopProbe`] names a boundary (`worker.publish`, `gateway.recv`, `client.recv`, …) and
//! aggregates every stream seen there; a [`Recorder`] records one stream's events at it, by hand
//! or through the [`Probed`] combinator ([`GateExt::probe`](crate::GateExt::probe)). Gaps are
//! measured between visible events on the hop's own monotonic clock; hidden events keep a
//! stream alive without counting as progress, so a reasoning phase is never a stall. A
//! stream's end is recorded too, with how long it had been quiet: a freeze that ends with the
//! user leaving is a stall of the hop where it began. Nothing of the payload is ever recorded.
//!
//! Hop records ([`HopRecord`], JSON lines through a [`RecordSink`]) carry request id + seq +
//! local time per event, and the end, for a sampled share of requests; the `timeline` module
//! (feature `timeline`) reads them from several hops and processes and names the hop where
//! each stall began. Seqs are the gate's event ids ([`Event::id`](crate::Event::id)), which the
//! SSE encoder writes as `id:` ([`EncodeSse`](crate::sse::EncodeSse)), and
//! kinds travel as a `:hidden` or `:control` comment line that the decoder reads back, so
//! every hop sees the same event under the same id and kind.
//!
//! A stream's end is an [`EndReason`](crate::EndReason): the one its items said (a gate's
//! error, a terminal frame), `completed` when the stream simply ran out, `consumer_gone` when
//! its recorder was dropped first. Hop counters count ends by it ([`HopSnapshot::streams_ended`]),
//! and an end's hop record carries it ([`RecordKind::End`]).
//!
//! With feature `tracing`, each stream is a span with an event per stall and per end; with
//! feature `otel`, an OpenTelemetry span and the GenAI streaming histograms (module `otel`).
//!
//! # Examples
//!
//! A gate's events probed where the transport takes them, and what the hop saw:
//!
//! ```
//! use futures_util::StreamExt;
//! use streamgate::probe::HopProbe;
//! use streamgate::{EndReason, Gate, GateExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let hop = HopProbe::new("worker.publish");
//! let consumer = Gate::new().spawn(|_, mut tx| async move {
//!     for i in 0..3 {
//!         tx.send(format!("t{i} ")).await?;
//!     }
//!     Ok::<_, streamgate::SendError<String>>(())
//! });
//! let events: Vec<_> = consumer.probe(&hop, "req-1").collect().await;
//! assert_eq!(events.len(), 3);
//!
//! let snapshot = hop.snapshot();
//! assert_eq!(snapshot.counters.visible_events(), 3);
//! assert_eq!(snapshot.counters.stalls(), 0);
//! assert_eq!(snapshot.streams_ended[EndReason::Completed], 1);
//! # }
//! ```
//!
//! # Metrics (feature `metrics`)
//!
//! Every hop exports through the `metrics` facade (`describe_metrics` gives an exporter the
//! units and help texts):
//!
//! | name | type | unit | labels | what |
//! |---|---|---|---|---|
//! | `streamgate_gap_seconds` | histogram | seconds | `hop` | visible gaps, each stream's last one (to its end, unless hidden events came after it) included |
//! | `streamgate_buffer_age_seconds` | histogram | seconds | `hop` | how long events waited in a gate (a probe on a stamped gate's `Consumer`; frames do not carry it) |
//! | `streamgate_time_to_first_event_seconds` | histogram | seconds | `hop` | from a stream's start at the hop to its first visible event |
//! | `streamgate_events_total` | counter | events | `hop`, `kind` | events by kind: `visible`, `hidden`, `control` |
//! | `streamgate_bytes_total` | counter | bytes | `hop`, `kind` | their bytes |
//! | `streamgate_stalls_total` | counter | stalls | `hop` | quiet spells at or above the hop's stall threshold, the ones streams ended in included |
//! | `streamgate_streams_ended_total` | counter | streams | `hop`, `reason`, `stalled` | streams ended, by [end reason](crate::EndReason), and whether they ended in a stall (`true`/`false`); all 16 series of a hop are registered by the time its first stream starts |
//! | `streamgate_hop_records_total` | counter | records | `outcome` | hop records `written`, `dropped` (the writer's queue was full) or `failed` (the write failed) |
//!
//! Histogram values are reported as measured, each when it is measured (a stream's last gap at
//! its end). A Prometheus exporter summarizes histograms over a short window
//! unless it is given buckets: give it `METRIC_BUCKETS`, which reach from 100 µs to 10
//! minutes, so that a 5 s stall shows as one.
//!
//! Handles are looked up against the recorder in effect when each stream starts, not once per
//! hop: a [`HopProbe`] made before the recorder was installed exports every metric of the
//! streams that start after it. The recorder is told apart by its address, so a local recorder
//! (`metrics::with_local_recorder`) made where an earlier one was, as a test's loop can, keeps
//! the earlier one's handles: make a hop per local recorder. The record writer's
//! `streamgate_hop_records_total` goes to the global recorder only (it runs on a thread of its
//! own).
//!
//! The probe knows nothing of the gate: it attaches to any stream whose items are
//! [`Observed`].

mod counters;
#[cfg(feature = "metrics")]
mod export;
mod histogram;
mod hop;
mod observe;
#[cfg(feature = "otel")]
#[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
pub mod otel;
mod probed;
mod record;
mod recorder;
#[cfg(feature = "serde")]
mod serialize;
mod sink;

pub use self::counters::{GapCounters, POSITION_CLASSES, PositionGaps};
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use self::export::{METRIC_BUCKETS, describe_metrics};
pub use self::histogram::Histogram;
#[cfg(feature = "timeline")]
pub(crate) use self::histogram::bucket;
pub use self::hop::{DEFAULT_STALL, HopProbe, HopSnapshot};
#[cfg(feature = "browser")]
pub(crate) use self::hop::{in_sample, sample_threshold};
pub use self::observe::{Observation, Observed, Seen};
pub use self::probed::Probed;
#[cfg(any(feature = "timeline", feature = "browser"))]
pub(crate) use self::record::cut;
pub(crate) use self::record::json_string;
pub use self::record::{
    HopRecord, MAX_ATTR_KEY, MAX_ATTR_VALUE, MAX_RECORD_ATTRS, MAX_RECORD_REQUEST, RecordKind,
};
pub use self::recorder::{Recorder, StreamEnd, StreamSummary};
#[cfg(feature = "browser")]
pub(crate) use self::sink::Pending;
pub use self::sink::{DEFAULT_RECORD_QUEUE, RecordSink};
