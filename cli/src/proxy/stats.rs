//! The proxy's counters (`GET /stats`) and its Prometheus page (`GET /metrics`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Map, Value};
use streamgate::EndReason;

use super::Proxy;
use crate::serving;

/// The proxy's counters.
#[derive(Debug, Default)]
pub(super) struct Stats {
    streams: serving::StreamCounts,
    /// Requests the upstream gave no response to, by cause.
    upstream_failures: [AtomicU64; 4],
    passed_through: AtomicU64,
}

/// The causes of `upstream_failures`, as
/// [`UpstreamError::cause`](super::upstream::UpstreamError::cause) names them.
const FAILURES: [&str; 4] = ["connect", "connect_timeout", "headers_timeout", "failed"];

/// What the generator saw, which the gate's end reason cannot tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// As the gate says.
    Gate,
    /// The upstream failed; the client got a terminal error frame.
    UpstreamError,
    /// Stopped through `/cancel`; the client got a final chunk and `[DONE]`.
    Stopped,
}

impl Outcome {
    /// How a stream whose gate ended for `gate` ended: the gate's reason, unless the stream
    /// completed only because the generator ended it with a frame of its own.
    pub(super) fn end_reason(self, gate: EndReason) -> EndReason {
        match (self, gate) {
            (Outcome::UpstreamError, EndReason::Completed) => EndReason::UpstreamError,
            (Outcome::Stopped, EndReason::Completed) => EndReason::Cancelled,
            (_, reason) => reason,
        }
    }
}

impl Stats {
    /// A stream started.
    pub(super) fn start(&self) {
        self.streams.start();
        metrics::counter!("streamgate_proxy_requests_total", "kind" => "stream").increment(1);
    }

    /// A stream ended (its gate's release hook).
    pub(super) fn end(&self, reason: EndReason) {
        self.streams.end(reason);
    }

    /// A request the upstream gave no response to.
    pub(super) fn upstream_failed(&self, cause: &'static str) {
        if let Some(at) = FAILURES.iter().position(|known| *known == cause) {
            self.upstream_failures[at].fetch_add(1, Ordering::SeqCst);
        }
        metrics::counter!("streamgate_proxy_upstream_failures_total", "cause" => cause)
            .increment(1);
    }

    /// A request answered with the upstream's response as it is (not streamed by the proxy).
    pub(super) fn passed_through(&self) {
        self.passed_through.fetch_add(1, Ordering::SeqCst);
        metrics::counter!("streamgate_proxy_requests_total", "kind" => "passthrough").increment(1);
    }
}

/// Gives the proxy's own counters their help texts on `/metrics`.
pub(super) fn describe() {
    metrics::describe_counter!(
        "streamgate_proxy_requests_total",
        "Requests the proxy served, by kind: stream (a gated stream) or passthrough"
    );
    metrics::describe_counter!(
        "streamgate_proxy_upstream_failures_total",
        "Requests the upstream gave no usable response to, by cause"
    );
}

/// `GET /stats`: the streams' counts as both servers give them
/// ([`StreamCounts::fields`](serving::StreamCounts::fields), running as `streams_running`),
/// `streams_upstream_error`, `upstream_errors` (requests the upstream gave no response to) and
/// `upstream_failures` (by cause), `requests_passed_through`, and the resume store's
/// `streams_detached`, `streams_resumed`, `streams_expired`, `replay_bytes`.
pub(super) async fn stats(State(proxy): State<Arc<Proxy>>) -> Response {
    let stats = &proxy.stats;
    let load = |n: &AtomicU64| n.load(Ordering::SeqCst);
    let failures: Map<String, Value> = FAILURES
        .iter()
        .zip(&stats.upstream_failures)
        .map(|(cause, n)| ((*cause).to_owned(), load(n).into()))
        .collect();
    let resumable = proxy.store.stats();
    let upstream_error = stats.streams.ended()[EndReason::UpstreamError];
    let mut fields = stats.streams.fields("streams_running");
    let more: [(&str, Value); 8] = [
        ("streams_upstream_error", upstream_error.into()),
        (
            "upstream_errors",
            stats.upstream_failures.iter().map(load).sum::<u64>().into(),
        ),
        ("upstream_failures", Value::Object(failures)),
        (
            "requests_passed_through",
            load(&stats.passed_through).into(),
        ),
        ("streams_detached", resumable.detached.into()),
        ("streams_resumed", resumable.resumed.into()),
        ("streams_expired", resumable.expired.into()),
        ("replay_bytes", resumable.log_bytes.into()),
    ];
    fields.extend(more.map(|(name, value)| (name.to_owned(), value)));
    serving::json_response(StatusCode::OK, Value::Object(fields))
}

/// `GET /metrics`: the process's Prometheus page, with the hops `proxy.recv` and `proxy.write`.
pub(super) async fn metrics(State(proxy): State<Arc<Proxy>>) -> Response {
    serving::metrics_response(&proxy.prometheus)
}
