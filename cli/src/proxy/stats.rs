//! The proxy's counters: its streams' ends, the upstream's failures by cause, the requests
//! passed through.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};
use streamgate::EndReason;

use super::upstream::FailureCause;
use crate::serving;

/// The proxy's counters.
#[derive(Debug, Default)]
pub(super) struct Stats {
    streams: serving::StreamCounts,
    /// Requests the upstream gave no response to, by [`FailureCause::index`].
    upstream_failures: [AtomicU64; FailureCause::ALL.len()],
    passed_through: AtomicU64,
}

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
    pub(super) fn upstream_failed(&self, cause: FailureCause) {
        self.upstream_failures[cause.index()].fetch_add(1, Ordering::SeqCst);
        metrics::counter!("streamgate_proxy_upstream_failures_total", "cause" => cause.as_str())
            .increment(1);
    }

    /// A request answered with the upstream's response as it is (not streamed by the proxy).
    pub(super) fn passed_through(&self) {
        self.passed_through.fetch_add(1, Ordering::SeqCst);
        metrics::counter!("streamgate_proxy_requests_total", "kind" => "passthrough").increment(1);
    }
}

impl Stats {
    /// The counts as `/stats` fields: the streams' as both servers give them
    /// ([`StreamCounts::fields`](serving::StreamCounts::fields), running as `streams_running`),
    /// `streams_upstream_error`, `upstream_errors` (requests the upstream gave no response to)
    /// and `upstream_failures` (by cause), `requests_passed_through`.
    pub(super) fn fields(&self) -> Map<String, Value> {
        let load = |n: &AtomicU64| n.load(Ordering::SeqCst);
        let failures: Map<String, Value> = FailureCause::ALL
            .iter()
            .map(|cause| {
                (
                    cause.as_str().to_owned(),
                    load(&self.upstream_failures[cause.index()]).into(),
                )
            })
            .collect();
        let upstream_error = self.streams.ended()[EndReason::UpstreamError];
        let mut fields = self.streams.fields("streams_running");
        let more: [(&str, Value); 4] = [
            ("streams_upstream_error", upstream_error.into()),
            (
                "upstream_errors",
                self.upstream_failures.iter().map(load).sum::<u64>().into(),
            ),
            ("upstream_failures", Value::Object(failures)),
            ("requests_passed_through", load(&self.passed_through).into()),
        ];
        fields.extend(more.map(|(name, value)| (name.to_owned(), value)));
        fields
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
