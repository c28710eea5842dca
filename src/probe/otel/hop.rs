//! `OtelHop`: the tracer and the instruments a hop exports through.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use opentelemetry::global::{self, BoxedSpan, BoxedTracer};
use opentelemetry::metrics::{Counter, Histogram, Meter};
use opentelemetry::trace::{SpanBuilder, SpanKind, Tracer};
use opentelemetry::{KeyValue, Value};

use crate::end::EndReason;

/// `gen_ai.server.time_to_first_token`: seconds from a stream's start at a hop to its first
/// visible event; one measurement per stream that had one.
pub const TIME_TO_FIRST_TOKEN: &str = "gen_ai.server.time_to_first_token";

/// The explicit bucket boundaries (seconds) the GenAI semantic conventions recommend for
/// [`TIME_TO_FIRST_TOKEN`].
pub const TIME_TO_FIRST_TOKEN_BUCKETS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// `gen_ai.client.operation.time_per_output_chunk`: seconds between two consecutive visible
/// events of a stream at a hop (the crate's *gap*); one measurement per gap.
pub const TIME_PER_OUTPUT_CHUNK: &str = "gen_ai.client.operation.time_per_output_chunk";

/// The explicit bucket boundaries (seconds) the GenAI semantic conventions recommend for
/// [`TIME_PER_OUTPUT_CHUNK`].
pub const TIME_PER_OUTPUT_CHUNK_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

/// `streamgate.streams.ended`: streams that ended at a hop, by `streamgate.end_reason`
/// (unit `{stream}`).
pub const STREAMS_ENDED: &str = "streamgate.streams.ended";

/// The OpenTelemetry tracer and instruments of a hop: give it to
/// [`HopProbe::otel`](crate::probe::HopProbe::otel).
///
/// Made from a tracer and a meter of the application's SDK ([`new`](OtelHop::new)) or from the
/// global providers ([`global`](OtelHop::global)). Creating it registers the histograms
/// [`TIME_TO_FIRST_TOKEN`] and [`TIME_PER_OUTPUT_CHUNK`] (unit `s`, with the conventions'
/// bucket boundaries) and the counter [`STREAMS_ENDED`]; clones share them, so one `OtelHop`
/// may serve every hop of a process (each hop adds its own `streamgate.hop` attribute).
///
/// # Examples
///
/// ```
/// use opentelemetry::KeyValue;
/// use opentelemetry::metrics::MeterProvider as _;
/// use opentelemetry::trace::TracerProvider as _;
/// use opentelemetry_sdk::metrics::SdkMeterProvider;
/// use opentelemetry_sdk::trace::SdkTracerProvider;
/// use streamgate::otel::OtelHop;
/// use streamgate::probe::HopProbe;
///
/// let tracers = SdkTracerProvider::builder().build();
/// let meters = SdkMeterProvider::builder().build();
/// let otel = OtelHop::new(tracers.tracer("streamgate"), &meters.meter("streamgate"))
///     .attribute(KeyValue::new("gen_ai.provider.name", "openai"));
/// let recv = HopProbe::new("gateway.recv").otel(otel.clone());
/// let write = HopProbe::new("gateway.write").otel(otel);
/// # drop((recv, write));
/// ```
#[derive(Clone)]
pub struct OtelHop {
    instruments: Arc<Instruments>,
    attributes: Vec<KeyValue>,
}

struct Instruments {
    tracer: BoxedTracer,
    first_token: Histogram<f64>,
    chunk_gap: Histogram<f64>,
    ended: Counter<u64>,
}

impl OtelHop {
    /// Spans from `tracer`, measurements through `meter`.
    ///
    /// See [`OtelHop`] for an example.
    pub fn new<T>(tracer: T, meter: &Meter) -> Self
    where
        T: Tracer + Send + Sync + 'static,
        T::Span: Send + Sync + 'static,
    {
        OtelHop::with_boxed(BoxedTracer::new(Box::new(tracer)), meter)
    }

    /// A tracer and a meter named `streamgate` from the global providers
    /// ([`opentelemetry::global`]), as they are *now*: install the SDK's providers first,
    /// since a hop made before that exports nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use opentelemetry_sdk::trace::SdkTracerProvider;
    /// use streamgate::otel::OtelHop;
    ///
    /// opentelemetry::global::set_tracer_provider(SdkTracerProvider::builder().build());
    /// let otel = OtelHop::global();
    /// # drop(otel);
    /// ```
    pub fn global() -> Self {
        OtelHop::with_boxed(global::tracer("streamgate"), &global::meter("streamgate"))
    }

    fn with_boxed(tracer: BoxedTracer, meter: &Meter) -> Self {
        let first_token = meter
            .f64_histogram(TIME_TO_FIRST_TOKEN)
            .with_unit("s")
            .with_description("Time from a stream's start at a hop to its first visible event.")
            .with_boundaries(TIME_TO_FIRST_TOKEN_BUCKETS.to_vec())
            .build();
        let chunk_gap = meter
            .f64_histogram(TIME_PER_OUTPUT_CHUNK)
            .with_unit("s")
            .with_description("Time between two consecutive visible events of a stream at a hop.")
            .with_boundaries(TIME_PER_OUTPUT_CHUNK_BUCKETS.to_vec())
            .build();
        let ended = meter
            .u64_counter(STREAMS_ENDED)
            .with_unit("{stream}")
            .with_description("Streams that ended at a hop, by end reason.")
            .build();
        OtelHop {
            instruments: Arc::new(Instruments {
                tracer,
                first_token,
                chunk_gap,
                ended,
            }),
            attributes: Vec::new(),
        }
    }

    /// Adds an attribute to every span and measurement of the hops this is given to, such as
    /// `gen_ai.operation.name`, `gen_ai.provider.name` or `gen_ai.request.model`.
    ///
    /// Keep it low in cardinality: each distinct set of attributes is a separate series.
    ///
    /// See [`OtelHop`] for an example.
    pub fn attribute(mut self, attribute: KeyValue) -> Self {
        self.attributes.push(attribute);
        self
    }

    /// The hop-specific half: the span name and the attribute set every measurement of hop
    /// `hop` carries, built once.
    pub(crate) fn bind(&self, hop: &Arc<str>) -> HopOtel {
        let mut attributes = Vec::with_capacity(self.attributes.len() + 1);
        attributes.push(KeyValue::new("streamgate.hop", Value::from(hop.clone())));
        attributes.extend(self.attributes.iter().cloned());
        HopOtel(Arc::new(Bound {
            instruments: self.instruments.clone(),
            span_name: hop.to_string(),
            attributes: attributes.into(),
        }))
    }
}

impl fmt::Debug for OtelHop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtelHop")
            .field("attributes", &self.attributes)
            .finish_non_exhaustive()
    }
}

/// An [`OtelHop`] bound to one hop: what its streams' spans and measurements use. Cloned once
/// per stream (one reference count).
#[derive(Clone)]
pub(crate) struct HopOtel(Arc<Bound>);

struct Bound {
    instruments: Arc<Instruments>,
    span_name: String,
    /// `streamgate.hop` first, then the attributes the application added.
    attributes: Box<[KeyValue]>,
}

impl HopOtel {
    /// Starts a stream's span, a child of `parent`, with the hop's attributes and `extra`.
    pub(crate) fn start_span(&self, extra: KeyValue, parent: &opentelemetry::Context) -> BoxedSpan {
        let bound = &self.0;
        let attributes = bound.attributes.iter().cloned().chain([extra]);
        let builder = SpanBuilder::from_name(Cow::Owned(bound.span_name.clone()))
            .with_kind(SpanKind::Internal)
            .with_attributes(attributes);
        bound.instruments.tracer.build_with_context(builder, parent)
    }

    /// Records a time to first token, in seconds.
    pub(crate) fn first_event(&self, seconds: f64) {
        let bound = &self.0;
        bound
            .instruments
            .first_token
            .record(seconds, &bound.attributes);
    }

    /// Records a gap between two visible events, in seconds.
    pub(crate) fn gap(&self, seconds: f64) {
        let bound = &self.0;
        bound
            .instruments
            .chunk_gap
            .record(seconds, &bound.attributes);
    }

    /// Counts a stream's end.
    pub(crate) fn ended(&self, reason: EndReason) {
        let bound = &self.0;
        // Once per stream: a small allocation here is fine.
        let mut attributes = Vec::with_capacity(bound.attributes.len() + 1);
        attributes.extend(bound.attributes.iter().cloned());
        attributes.push(KeyValue::new("streamgate.end_reason", reason.as_str()));
        bound.instruments.ended.add(1, &attributes);
    }
}

impl fmt::Debug for HopOtel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HopOtel")
            .field("span_name", &self.0.span_name)
            .field("attributes", &self.0.attributes)
            .finish_non_exhaustive()
    }
}
