//! Streaming LLM output without mid-response freezes.
//!
//! An LLM response is a long stream of small events crossing several hops (model worker,
//! gateway, edge, client), and a user sees a freeze whenever any hop holds an event back, while
//! averages such as tokens per second stay healthy. `streamgate` is the layer between a token
//! generator and the transport that prevents and explains those freezes:
//!
//! - a **gate** ([`Gate`]) owns the generator and hands the transport a [`Consumer`] stream
//!   through a buffer bounded by events *and* bytes, delivering each event the moment it exists
//!   (flush per event);
//! - a **slow-consumer policy** ([`Policy`]) decides what happens when the consumer does not
//!   drain: pause the generator, coalesce waiting text deltas losslessly, or end the stream with
//!   a visible reason after a deadline;
//! - **cancellation reaches the generator**: dropping the consumer (hyper drops the body when
//!   the client disconnects) stops the generator (at once, or after a grace in which it may
//!   finish its step) and then runs a release hook (where an engine frees KV blocks) exactly
//!   once, on every end, panics included, with the end reason and the stream's counters; the
//!   chunks produced after the end are counted as wasted (at most one per stream with the
//!   default stop, and never a runaway loop even from a generator that ignores errors);
//! - **event ids** are positions in the generator's output, counted at `send`: the same event
//!   has the same id at every hop and on every reconnect, and a coalesced event names the run
//!   of ids it covers;
//! - **engine loops** that feed many streams from one task use [`Gate::channel`]: `try_send`
//!   never waits, and the gate still keeps the policy's clock and the release;
//! - a [`Group`] shuts all its streams down with a visible reason and bounds the bytes their
//!   buffers hold together.
//!
//! # Quick start
//!
//! ```
//! use futures_util::StreamExt;
//! use streamgate::{EndReason, Gate};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // A generator: here a decode loop producing three token deltas.
//! let mut consumer = Gate::new()
//!     .max_events(64)
//!     .on_release(|reason, stats| {
//!         // Free the stream's KV blocks here: runs once, however the stream ended, after
//!         // the generator has stopped.
//!         assert_eq!(reason, EndReason::Completed);
//!         assert_eq!(stats.events_delivered, 3);
//!     })
//!     .spawn(|_cancel, mut tx| async move {
//!         for i in 0..3 {
//!             if tx.send(format!("t{i} ")).await.is_err() {
//!                 break; // the consumer is gone
//!             }
//!         }
//!         Ok::<(), std::io::Error>(())
//!     });
//! let handle = consumer.handle();
//!
//! let mut text = String::new();
//! while let Some(event) = consumer.next().await {
//!     // An `Err` would say why the stream ended early; everything before it is intact.
//!     let event = event.expect("the generator completes");
//!     assert_eq!(event.id() as usize, text.len() / 3); // its position in the output
//!     text.push_str(event.chunk());
//! }
//! assert_eq!(text, "t0 t1 t2 ");
//! handle.released().await;
//! assert_eq!(handle.end_reason(), Some(EndReason::Completed));
//! # }
//! ```
//!
//! The rest of the path:
//!
//! - [`sse`]: an injection-safe encoder, an incremental WHATWG decoder with bounded memory, and
//!   heartbeats ([`GateExt::sse`], [`GateExt::heartbeat`], [`GateExt::sse_events`]);
//! - [`transport`]: an `http_body::Body` with one frame per event, an axum response with the
//!   headers proxies need, a writer that reports write completion, and a listener with
//!   `TCP_NODELAY`, a large backlog and a bounded send buffer;
//! - [`probe`]: per-hop gap counters (histogram, stalls, gaps by output position, buffer age)
//!   and hop records ([`GateExt::probe`]);
//! - [`resume`]: resumable streams, a disconnect not being a stop: a registry of replay logs
//!   (in memory, or in Redis with feature `redis`) that subscribers attach to at an event id;
//! - `timeline` (feature `timeline`): from the hop records of several processes, the hop where
//!   each stall began.
//!
//! Every end is named by one [`EndReason`], wherever it is recorded (the gate, the probes, hop
//! records, the timeline), and [`EndCounters`] counts ends by it.
//!
//! # Feature flags
//!
//! The core (gate, SSE, probes, resumable streams in memory) needs only tokio, tokio-util,
//! futures-core, pin-project-lite and bytes.
//!
//! - `hyper`: `transport::SseBody`.
//! - `axum`: `transport::SseResponse` and `axum::serve` support for
//!   `transport::TunedListener` (implies `server`).
//! - `server`: `transport::Server`, HTTP/1.1 and h2c on one port with h2's send buffer bounded
//!   (implies `hyper` and `net`).
//! - `io`: `transport::FrameWriter`.
//! - `net`: `transport::TunedListener` (kernel-aware socket defaults), `transport::SendQueue`
//!   and `transport::Departures`.
//! - `metrics`: hop counters through the `metrics` facade.
//! - `otel`: OpenTelemetry: a span per probed stream per hop, the GenAI streaming histograms,
//!   W3C `traceparent` extraction and injection (`otel::OtelHop`, `otel::extract`,
//!   `otel::inject`). The API crate only: the application brings its SDK and exporter.
//! - `tracing`: a span per probed stream; events for stalls and ends.
//! - `serde`: `Serialize` for the probe snapshots.
//! - `browser`: the user's screen as a hop: `browser::SCRIPT`, a script for the page that
//!   records `client.recv` and `client.render` per event (and long frames), and
//!   `browser::BrowserProbe`, which tags a stream's response with its token and takes the
//!   page's records into a `RecordSink` (axum routes).
//! - `redis`: `resume::Registry::redis`, the replay logs, claims and stops in Redis Streams,
//!   so a client resumes (and stops) a stream through any instance.
//! - `openai`: `openai::ChatCompletionChunk`, OpenAI chunks that parse, encode and coalesce
//!   losslessly; `[DONE]`, usage and error frames; `openai::ChunkTemplate`, a stream's chunks
//!   written straight into a frame's buffer (what a server sends per token);
//!   `openai::ChatCompletion`, the non-streamed answer.
//! - `anthropic`: `anthropic::MessagesEvent`, the events of an Anthropic Messages stream
//!   (`/v1/messages`) that parse, encode and coalesce losslessly (a block's deltas concatenate,
//!   `ping`s are absorbed, the last `message_delta` stands), with its `message_stop` and `error`
//!   frames; event types it does not know pass as they came.
//! - `responses`: `responses::ResponsesEvent`, the events of an OpenAI Responses stream
//!   (`/v1/responses`) that parse, encode and coalesce losslessly (a merged delta keeps the last
//!   `sequence_number` it covers), with its `response.completed`, `incomplete`, `failed` and
//!   `error` frames; event types it does not know pass as they came.
//!
//! # Cancel safety
//!
//! [`Consumer`] is a plain [`Stream`](futures_core::Stream): dropping a pending `next()` loses
//! nothing, and the next poll yields the same event. Dropping the consumer itself ends the
//! stream. [`Sender::send`] drops its chunk if its future is dropped before completing;
//! [`Sender::ready`] and [`Sender::closed`] lose nothing when dropped.
//!
//! Both halves take part in tokio's cooperative budget (`tokio::task::coop`): a generator with
//! no other await point, or a consumer draining a fast stream, still lets the other tasks of
//! its runtime run.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]

/// The README's examples, compiled and run as doc tests (they use the `axum` feature).
#[cfg(all(doctest, feature = "axum"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(feature = "anthropic")]
#[cfg_attr(docsrs, doc(cfg(feature = "anthropic")))]
pub mod anthropic;
#[cfg(feature = "browser")]
#[cfg_attr(docsrs, doc(cfg(feature = "browser")))]
pub mod browser;
mod chunk;
mod end;
mod ext;
pub mod fleet;
mod gate;
#[cfg(feature = "openai")]
#[cfg_attr(docsrs, doc(cfg(feature = "openai")))]
pub mod openai;
pub mod probe;
#[cfg(feature = "responses")]
#[cfg_attr(docsrs, doc(cfg(feature = "responses")))]
pub mod responses;
// The registry's races are checked by a model test under tokio's clock (tests/resume.rs), not
// by loom: its tasks and timers are tokio's.
#[cfg(not(loom))]
pub mod resume;
pub mod sse;
mod sync;
#[cfg(feature = "timeline")]
#[cfg_attr(docsrs, doc(cfg(feature = "timeline")))]
pub mod timeline;
pub mod transport;
#[cfg(any(feature = "openai", feature = "anthropic", feature = "responses"))]
mod wire;

pub use chunk::{Chunk, Kind};
pub use end::{EndCounters, EndCounts, EndReason, UnknownEndReason};
pub use ext::GateExt;
pub use gate::{
    BoxError, CancelError, Closed, Consumer, DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS,
    DEFAULT_MAX_PAUSE, DEFAULT_RELEASE_TIMEOUT, Event, Gate, GateError, GateHandle, GateStats,
    Group, GroupStats, Policy, SendError, Sender, ShutdownReport, TrySendError,
};
#[cfg(feature = "otel")]
#[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
pub use probe::otel;
