//! The reference server (`examples/serve.rs`), built from its flags and served as its `main`
//! serves (HTTP/1.1 and h2c on one port). Included with `#[path]` by the tests that need it,
//! since it brings the whole example along.

#![allow(dead_code)] // each test binary uses a part

#[allow(dead_code)] // the example's `main` is not called here
#[path = "../../examples/serve.rs"]
pub mod serve;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use metrics_exporter_prometheus::PrometheusHandle;
use streamgate::transport::TunedListener;

/// Builds a server with `flags` on a free port of 127.0.0.1, not yet serving.
pub fn build(flags: &[&str]) -> (TunedListener, axum::Router, Arc<serve::Server>) {
    static PROMETHEUS: OnceLock<PrometheusHandle> = OnceLock::new();
    let prometheus = PROMETHEUS
        .get_or_init(|| serve::prometheus().expect("the test process's recorder"))
        .clone();
    let args = ["--addr", "127.0.0.1:0"]
        .iter()
        .chain(flags)
        .map(|s| s.to_string());
    let config = serve::parse_args(args).expect("valid flags");
    serve::app(config, prometheus).expect("the server starts")
}

/// Serves a server with `flags` as its `main` does, until `stop` completes (the signal
/// handler's part); the task returns what `serve_until` returned.
pub fn serve_until(
    flags: &[&str],
    stop: impl Future<Output = ()> + Send + 'static,
) -> (
    SocketAddr,
    Arc<serve::Server>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let (listener, app, server) = build(flags);
    let addr = listener.local_addr().unwrap();
    let streams = server.streams.clone();
    let served = tokio::spawn(serve::common::server::serve_until(
        listener, app, streams, stop,
    ));
    (addr, server, served)
}

/// Starts a server with `flags` as its `main` serves it, until the test ends.
pub fn start(flags: &[&str]) -> SocketAddr {
    serve_until(flags, std::future::pending()).0
}
