//! The reference server (`streamgate sim`), built from its flags and served as the command
//! serves it (HTTP/1.1 and h2c on one port), in the test's process; and waiting until its
//! generator pauses.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use streamgate::transport::TunedListener;
use streamgate_cli::{serve, serving, sim};

/// The test process's Prometheus recorder (one per process).
pub fn prometheus() -> PrometheusHandle {
    static PROMETHEUS: OnceLock<PrometheusHandle> = OnceLock::new();
    PROMETHEUS
        .get_or_init(|| serving::prometheus().expect("the test process's recorder"))
        .clone()
}

/// Builds a server with `flags` on a free port of 127.0.0.1, not yet serving.
pub fn build(flags: &[&str]) -> (TunedListener, axum::Router, Arc<serve::Server>) {
    let args = ["--addr", "127.0.0.1:0"].iter().chain(flags);
    let config = sim::Config::parse_from(args).expect("valid flags");
    sim::app(config, prometheus()).expect("the server starts")
}

/// Serves a server with `flags` as `streamgate sim` does, until `stop` completes (the signal
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
    let streams = server.streams().clone();
    let served = tokio::spawn(serving::serve_until(listener, app, streams, stop));
    (addr, server, served)
}

/// Starts a server with `flags` as `streamgate sim` serves it, until the test ends.
pub fn start(flags: &[&str]) -> SocketAddr {
    serve_until(flags, std::future::pending()).0
}

/// Waits until the server's generators have made no token for half a second (a stopped reader's
/// generator paused at a full gate or replay log); returns the stats then.
pub async fn until_paused(addr: SocketAddr) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + super::HANG;
    let mut last = super::stats(addr).await;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = super::stats(addr).await;
        if now["tokens_generated"] == last["tokens_generated"] {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the generator never paused: {now}"
        );
        last = now;
    }
}
