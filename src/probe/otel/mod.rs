//! OpenTelemetry export (feature `otel`): a span per stream per hop, the GenAI streaming
//! histograms, and W3C `traceparent` across hops.
//!
//! The crate uses only the OpenTelemetry *API*: the application installs its own SDK and
//! exporter (OTLP to a collector, Jaeger, Tempo, …) and hands the crate a tracer and a meter in
//! an [`OtelHop`], attached to a [`HopProbe`](crate::probe::HopProbe) with
//! [`HopProbe::otel`](crate::probe::HopProbe::otel). Every stream recorded at that hop then has:
//!
//! - **a span** named after the hop, opened when the stream's recorder is created and ended when
//!   the stream ends (its body's end, the consumer leaving, an error), so its duration is the
//!   stream's life at that hop. It carries the request id and, at the end, the stream's gap
//!   summary and end reason (see [`attributes`](self#span-attributes) below); an end other than
//!   `completed` sets the span's status to error. Each stall adds a `stall` span event.
//! - **two histograms** under the GenAI semantic-convention names, with the buckets the
//!   conventions recommend: [`TIME_TO_FIRST_TOKEN`] (once per stream) and
//!   [`TIME_PER_OUTPUT_CHUNK`] (once per gap between two visible events; unlike the crate's
//!   `streamgate_gap_seconds`, not the last one to the stream's end, which is on the span as
//!   `streamgate.idle.trailing`), and a counter of
//!   ended streams by reason, [`STREAMS_ENDED`]. Every measurement carries the hop's
//!   attributes: `streamgate.hop` and any added with [`OtelHop::attribute`] (the conventions
//!   require `gen_ai.operation.name` and `gen_ai.provider.name`: add them there).
//!
//! Across processes, a gateway carries the trace from its incoming request into its upstream
//! request with [`extract`] and [`inject`] (W3C `traceparent` through the globally installed
//! propagator), so a tracing backend assembles one trace from every hop of every service.
//!
//! # Span attributes
//!
//! | attribute | type | when | meaning |
//! |---|---|---|---|
//! | `streamgate.hop` | string | start | the hop's name |
//! | `streamgate.request_id` | string | start | the request id (at most [`MAX_RECORD_REQUEST`](crate::probe::MAX_RECORD_REQUEST) bytes of it) |
//! | `streamgate.end_reason` | string | end | `completed`, `consumer_gone`, `slow_consumer`, … |
//! | `streamgate.events.visible` | int | end | visible events seen at this hop |
//! | `streamgate.events.hidden` | int | end | hidden events (reasoning, tool-call plumbing) |
//! | `streamgate.time_to_first_event` | double, s | end | from the span's start to the first visible event, if there was one |
//! | `streamgate.gap.max` | double, s | end | the longest gap between two visible events, or from the last one to the end |
//! | `streamgate.stalls` | int | end | quiet spells (no visible or hidden event) at or above the hop's stall threshold, the one at the end included |
//! | `streamgate.idle.trailing` | double, s | end | how long the stream had been quiet when it ended: a freeze that ended the stream |
//! | `error.type` | string | end | the end reason, when it is not `completed` |
//!
//! Each stall is also a `stall` span event, at the time it ended, with `streamgate.quiet`
//! (double, s: how long it lasted), `streamgate.position` (the output position where it
//! happened) and `streamgate.at_end` (bool: the stream ended in it, the event is at the end).
//!
//! # Examples
//!
//! An application installs its SDK (here with no exporter, for brevity), then gives the hop
//! its tracer and meter:
//!
//! ```
//! use opentelemetry::KeyValue;
//! use opentelemetry::metrics::MeterProvider as _;
//! use opentelemetry::trace::TracerProvider as _;
//! use opentelemetry_sdk::metrics::SdkMeterProvider;
//! use opentelemetry_sdk::propagation::TraceContextPropagator;
//! use opentelemetry_sdk::trace::SdkTracerProvider;
//! use streamgate::otel::OtelHop;
//! use streamgate::probe::HopProbe;
//!
//! // W3C `traceparent` for `extract` and `inject`.
//! opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
//! let tracers = SdkTracerProvider::builder().build();
//! let meters = SdkMeterProvider::builder().build();
//!
//! let otel = OtelHop::new(tracers.tracer("streamgate"), &meters.meter("streamgate"))
//!     .attribute(KeyValue::new("gen_ai.operation.name", "chat"))
//!     .attribute(KeyValue::new("gen_ai.provider.name", "openai"));
//! let hop = HopProbe::new("gateway.recv").otel(otel);
//! # drop(hop);
//! ```

mod hop;
mod propagation;
mod span;

pub(crate) use self::hop::HopOtel;
pub use self::hop::{
    OtelHop, STREAMS_ENDED, TIME_PER_OUTPUT_CHUNK, TIME_PER_OUTPUT_CHUNK_BUCKETS,
    TIME_TO_FIRST_TOKEN, TIME_TO_FIRST_TOKEN_BUCKETS,
};
pub use self::propagation::{extract, inject};
pub(crate) use self::span::StreamSpan;
