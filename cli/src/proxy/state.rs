//! The proxy's state: its configuration, fleet, upstream client, resume registry, probes and
//! counters, and what every handler asks of it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::header::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::PrometheusHandle;
use streamgate::GateExt;
use streamgate::probe::{HopProbe, RecordSink};
use streamgate::resume::Registry;
use streamgate::sse::SseFrame;
use streamgate::transport::SseResponse;

use super::chunk::Relayed;
use super::config::Config;
use super::error;
use super::fleet::Fleet;
use super::stats::Stats;
use super::upstream::{REQUEST_ID, Upstream, UpstreamError, client_request_id};
use super::url::UpstreamUrl;

/// The proxy's state: its fleet of upstreams, streams, probes and counters.
pub struct Proxy {
    /// Every stream: shut down together on SIGINT/SIGTERM (give it to
    /// [`serving::serve_until`](crate::serving::serve_until)).
    pub group: streamgate::Group,
    /// Where hop records go (`--hop-records`), if anywhere: sync it before exiting.
    pub records: Option<RecordSink>,
    pub(super) config: Config,
    /// The client of every upstream.
    pub(super) upstream: Upstream,
    /// The pools, their replicas' health and counts, the fallbacks.
    pub(super) fleet: Arc<Fleet>,
    pub(super) stats: Stats,
    /// Every streamed completion by its request id: resumable, several readers at once.
    pub(super) store: Registry<Relayed>,
    pub(super) recv: HopProbe,
    pub(super) write: HopProbe,
    pub(super) prometheus: PrometheusHandle,
    /// Generated request ids: a counter under a keyed hash whose key is random per process,
    /// so ids are unique across instances sharing a store and cannot be guessed (an id is
    /// what a resume asks for).
    pub(super) ids: std::hash::RandomState,
    pub(super) next_id: AtomicU64,
    /// The bytes of request bodies being read or waiting to go upstream, process-wide
    /// (`--max-buffered-bytes`): a permit per byte.
    pub(super) buffered: Arc<tokio::sync::Semaphore>,
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxy")
            .field("fleet", &self.fleet)
            .field("stats", &self.stats)
            .field("streams", &self.group.stats())
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// Whether streams are registered for resumes and stops (`--resume-grace-ms` above 0).
    pub(super) fn resumable(&self) -> bool {
        !self.config.resume.grace.is_zero()
    }

    /// The request's id: the client's `x-request-id`, or a new one.
    pub(super) fn request_id(&self, headers: &HeaderMap) -> String {
        use std::hash::BuildHasher;
        match client_request_id(headers) {
            Some(id) => id.to_owned(),
            None => {
                let n = self.next_id.fetch_add(1, Ordering::Relaxed);
                let (high, low) = (self.ids.hash_one((n, 0)), self.ids.hash_one((n, 1)));
                format!("sg-{high:016x}{low:016x}")
            }
        }
    }

    /// The answer when the upstream at `url` gave no response, counted.
    pub(super) fn upstream_failed(&self, url: &UpstreamUrl, failure: &UpstreamError) -> Response {
        self.stats.upstream_failed(failure.cause());
        error::upstream(url, failure)
    }

    /// A stream's frames as the client's response: heartbeats, the `proxy.write` probe, the
    /// streaming headers and `x-request-id`.
    pub(super) fn sse_response(
        &self,
        frames: impl futures_core::Stream<Item = SseFrame> + Send + 'static,
        id: &str,
    ) -> Response {
        let frames = frames
            .heartbeat(self.config.gate.heartbeat)
            .probe(&self.write, id);
        let mut response = SseResponse::new(frames).into_response();
        if let Ok(id) = HeaderValue::from_str(id) {
            response.headers_mut().insert(REQUEST_ID, id);
        }
        response
    }
}
