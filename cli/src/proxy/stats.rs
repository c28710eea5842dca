//! The proxy's counters: its streams' ends, requests that got no usable answer (by cause),
//! the requests passed through, retries, fallbacks and invalid upstream events.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};
use streamgate::EndReason;
use streamgate::fleet::Cause;

use crate::serving;

/// The proxy's counters.
#[derive(Debug, Default)]
pub(super) struct Stats {
    streams: serving::StreamCounts,
    /// Requests no attempt got a usable answer for, by [`Cause::index`].
    upstream_failures: [AtomicU64; Cause::ALL.len()],
    passed_through: AtomicU64,
    /// Attempts after a request's first (another replica, the same one again, a fallback).
    retries: AtomicU64,
    /// Requests a fallback model answered.
    fallbacks: AtomicU64,
    /// Upstream events dropped at `proxy.recv` for not being JSON.
    invalid_events: AtomicU64,
}

/// What the generator saw, which the gate's end reason cannot tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// As the gate says.
    Gate,
    /// The upstream failed; the client got a terminal error frame.
    UpstreamError,
    /// Stopped through `/cancel`; the client got a final chunk and `[DONE]`.
    Stopped,
}

impl Verdict {
    /// How a stream whose gate ended for `gate` ended: the gate's reason, unless the stream
    /// completed only because the generator ended it with a frame of its own.
    pub(super) fn end_reason(self, gate: EndReason) -> EndReason {
        match (self, gate) {
            (Verdict::UpstreamError, EndReason::Completed) => EndReason::UpstreamError,
            (Verdict::Stopped, EndReason::Completed) => EndReason::Cancelled,
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
    pub(super) fn upstream_failed(&self, cause: Cause) {
        self.upstream_failures[cause.index()].fetch_add(1, Ordering::SeqCst);
        metrics::counter!("streamgate_proxy_upstream_failures_total", "cause" => cause.as_str())
            .increment(1);
    }

    /// A request that got no usable answer: counted by its last failure's cause (a model no
    /// pool serves is none).
    pub(super) fn gave_up(&self, cause: Option<Cause>) {
        if let Some(cause) = cause {
            self.upstream_failed(cause);
        }
    }

    /// An attempt after a request's first.
    pub(super) fn retried(&self) {
        self.retries.fetch_add(1, Ordering::SeqCst);
        metrics::counter!("streamgate_proxy_retries_total").increment(1);
    }

    /// A request a fallback model answered.
    pub(super) fn fell_back(&self) {
        self.fallbacks.fetch_add(1, Ordering::SeqCst);
        metrics::counter!("streamgate_proxy_fallbacks_total").increment(1);
    }

    /// An upstream event that was no JSON object, dropped.
    pub(super) fn invalid_event(&self) {
        self.invalid_events.fetch_add(1, Ordering::SeqCst);
        metrics::counter!("streamgate_proxy_invalid_events_total", "hop" => "proxy.recv")
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
    /// `streams_upstream_error`, `upstream_errors` (requests that got no usable answer from
    /// any attempt) and `upstream_failures` (by their last attempt's cause),
    /// `requests_passed_through`, `attempts_retried` (attempts after a request's first),
    /// `fallbacks_answered` (requests a fallback model answered) and `events_dropped_invalid`
    /// (upstream events that were no JSON object).
    pub(super) fn fields(&self) -> Map<String, Value> {
        let load = |n: &AtomicU64| n.load(Ordering::SeqCst);
        let failures: Map<String, Value> = Cause::ALL
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
        let more: [(&str, Value); 7] = [
            ("streams_upstream_error", upstream_error.into()),
            (
                "upstream_errors",
                self.upstream_failures.iter().map(load).sum::<u64>().into(),
            ),
            ("upstream_failures", Value::Object(failures)),
            ("requests_passed_through", load(&self.passed_through).into()),
            ("attempts_retried", load(&self.retries).into()),
            ("fallbacks_answered", load(&self.fallbacks).into()),
            ("events_dropped_invalid", load(&self.invalid_events).into()),
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
        "Requests no attempt got a usable answer for, by the last attempt's cause"
    );
    metrics::describe_counter!(
        "streamgate_proxy_retries_total",
        "Attempts after a request's first: another replica, the same one again, a fallback"
    );
    metrics::describe_counter!(
        "streamgate_proxy_fallbacks_total",
        "Requests a fallback model answered"
    );
    metrics::describe_counter!(
        "streamgate_proxy_invalid_events_total",
        "Upstream events dropped for not being JSON objects, by hop"
    );
}
