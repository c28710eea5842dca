//! W3C `traceparent` in and out of `http` headers, through the global propagator.

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};
use opentelemetry::Context;
use opentelemetry::global;
use opentelemetry::propagation::{Extractor, Injector};

/// The trace context an incoming request carries (its `traceparent` and `tracestate`
/// headers), through the globally installed text-map propagator.
///
/// Install the W3C propagator once at startup,
/// `opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new())` (from
/// `opentelemetry_sdk::propagation`); without it (the default is a no-op propagator) this
/// returns an empty context and every hop starts its own trace.
///
/// Give the context to the hop's streams
/// ([`HopProbe::recorder_in`](crate::probe::HopProbe::recorder_in)) so their spans continue
/// the caller's trace.
///
/// # Examples
///
/// ```
/// use http::HeaderMap;
/// use opentelemetry::trace::TraceContextExt;
/// use opentelemetry_sdk::propagation::TraceContextPropagator;
///
/// opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
/// let mut headers = HeaderMap::new();
/// headers.insert(
///     "traceparent",
///     "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".parse().unwrap(),
/// );
/// let parent = streamgate::otel::extract(&headers);
/// let span = parent.span();
/// assert_eq!(
///     span.span_context().trace_id().to_string(),
///     "0af7651916cd43dd8448eb211c80319c"
/// );
/// assert!(span.span_context().is_remote());
/// ```
pub fn extract(headers: &HeaderMap) -> Context {
    global::get_text_map_propagator(|propagator| propagator.extract(&HeaderExtractor(headers)))
}

/// Writes `cx`'s trace context into an outgoing request's headers (`traceparent`, and
/// `tracestate` if it has one), through the globally installed text-map propagator (see
/// [`extract`]).
///
/// A gateway injects the context of its stream's span
/// ([`Recorder::otel_context`](crate::probe::Recorder::otel_context)) into its upstream
/// request, so the upstream's spans are children of the gateway's.
///
/// # Examples
///
/// ```
/// use http::HeaderMap;
/// use opentelemetry_sdk::propagation::TraceContextPropagator;
///
/// opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
/// let mut incoming = HeaderMap::new();
/// incoming.insert(
///     "traceparent",
///     "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".parse().unwrap(),
/// );
/// let mut upstream = HeaderMap::new();
/// streamgate::otel::inject(&streamgate::otel::extract(&incoming), &mut upstream);
/// assert_eq!(upstream["traceparent"], incoming["traceparent"]);
/// assert!(!upstream.contains_key("tracestate")); // it had none
/// ```
pub fn inject(cx: &Context, headers: &mut HeaderMap) {
    global::get_text_map_propagator(|propagator| {
        propagator.inject_context(cx, &mut HeaderInjector(headers));
    });
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }

    fn get_all(&self, key: &str) -> Option<Vec<&str>> {
        let values: Vec<&str> = self
            .0
            .get_all(key)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .collect();
        (!values.is_empty()).then_some(values)
    }
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    /// Sets a header, replacing any value it had. An empty value (the W3C propagator's
    /// `tracestate` when there is none) is left out, as is a name or value that is not a valid
    /// header (a propagator never makes one).
    fn set(&mut self, key: &str, value: String) {
        if value.is_empty() {
            return;
        }
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::try_from(value),
        ) {
            self.0.insert(name, value);
        }
    }
}
