//! The proxy's state: its configuration, fleet, upstream client, resume registry, probes and
//! counters, and what every handler asks of it.

use std::fmt;
use std::sync::Arc;

use axum::http::header::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::PrometheusHandle;
use streamgate::GateExt;
use streamgate::browser::BrowserProbe;
use streamgate::probe::{HopProbe, RecordSink};
use streamgate::resume::Registry;
use streamgate::sse::SseFrame;
use streamgate::transport::SseResponse;

use super::chunk::Relayed;
use super::config::Config;
use super::error;
use super::fleet::Fleet;
use super::stats::Stats;
use super::upstream::{REQUEST_ID, Upstream, UpstreamError};
use super::url::UpstreamUrl;
use crate::request_id::{self, RequestIds};

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
    /// The page's hops (`client.recv`, `client.render`): tokens for the streams it records,
    /// and the intake of its records, with `--hop-records`.
    pub(super) browser: Option<BrowserProbe>,
    pub(super) prometheus: PrometheusHandle,
    /// Generated request ids (`sg-` and 32 hex digits): unique across instances sharing a
    /// store, and not to be guessed (an id is what a resume asks for).
    pub(super) ids: RequestIds,
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

    /// The request's id: the client's `x-request-id` when it is
    /// [valid](crate::request_id::is_valid), or a new one.
    pub(super) fn request_id(&self, headers: &HeaderMap) -> String {
        match request_id::from_client(headers) {
            Some(id) => id.to_owned(),
            None => self.ids.next_id(),
        }
    }

    /// Names the stream `id` also by `response`, the upstream's own response id its
    /// `response.created` gave, which a client resumes and stops it by through any instance
    /// sharing the store: when that is a valid id (as an `x-request-id` is) other than `id`. The
    /// stream's events do not wait on the store for it.
    pub(super) fn name_response(&self, response: &str, id: &str) {
        if response == id || !request_id::is_valid(response) {
            return;
        }
        let (store, response, id) = (self.store.clone(), response.to_owned(), id.to_owned());
        tokio::spawn(async move {
            if let Err(failure) = store.alias(&response, &id).await {
                eprintln!("proxy: naming stream {id} by its response id {response}: {failure}");
            }
        });
    }

    /// The answer when the upstream at `url` gave no response, counted.
    pub(super) fn upstream_failed(&self, url: &UpstreamUrl, failure: &UpstreamError) -> Response {
        self.stats.upstream_failed(failure.cause());
        error::upstream(url, failure)
    }

    /// A stream's frames as the client's response: heartbeats, the `proxy.write` probe, the
    /// streaming headers, `x-request-id` and, when the id names this stream only (`unique`: it
    /// was claimed in the store, or the proxy made it) and the request is in the sample of hop
    /// records, the page's probe token: a client that sent another client's id gets no token
    /// to write records under it.
    pub(super) fn sse_response(
        &self,
        frames: impl futures_core::Stream<Item = SseFrame> + Send + 'static,
        id: &str,
        unique: bool,
    ) -> Response {
        let frames = frames
            .heartbeat(self.config.gate.heartbeat)
            .probe(&self.write, id);
        let mut response = SseResponse::new(frames).into_response();
        if let Ok(id) = HeaderValue::from_str(id) {
            response.headers_mut().insert(REQUEST_ID, id);
        }
        if let (Some(browser), true) = (&self.browser, unique) {
            browser.tag(id, response.headers_mut());
        }
        response
    }
}
