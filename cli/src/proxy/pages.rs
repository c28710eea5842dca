//! The proxy's own pages: `GET /stats` (its counters, its upstreams' and its resume
//! registry's) and `GET /metrics` (the process's Prometheus page and its upstreams' series).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::Value;

use super::Proxy;
use crate::{page, resume, serving};

/// `GET /stats`: the proxy's counters ([`Stats::fields`](super::stats::Stats::fields)), its
/// resume registry's `streams_detached`, `streams_resumed`, `streams_expired`,
/// `streams_adopted`, `replay_bytes`, the page probe's `browser_*` counters
/// ([`page::stats_fields`]), and `upstreams`, each upstream's figures
/// ([`Fleet::stats`](super::fleet::Fleet::stats)).
pub(super) async fn stats(State(proxy): State<Arc<Proxy>>) -> Response {
    let mut fields = proxy.stats.fields();
    resume::stats_fields(&proxy.store.stats(), &mut fields);
    page::stats_fields(proxy.browser.as_ref(), &mut fields);
    fields.insert("upstreams".to_owned(), proxy.fleet.stats());
    serving::json_response(StatusCode::OK, Value::Object(fields))
}

/// `GET /metrics`: the process's Prometheus page, with the hops `proxy.recv` and `proxy.write`,
/// and each upstream's series ([`Fleet::metrics`](super::fleet::Fleet::metrics)).
pub(super) async fn metrics(State(proxy): State<Arc<Proxy>>) -> Response {
    let mut text = proxy.prometheus.render();
    text.push_str(&proxy.fleet.metrics());
    serving::metrics_text(text)
}
