//! Starting `streamgate sim` and `streamgate proxy` in process for the proxy's tests, and the
//! requests they send.

#![allow(dead_code)] // each test uses a part

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use metrics_exporter_prometheus::PrometheusHandle;
use streamgate_cli::{proxy, serve, serving, sim};
use tokio::sync::oneshot;

use crate::client::RawResponse;

/// The chat completions path.
pub const CHAT: &str = "/v1/chat/completions";

/// The test process's Prometheus recorder (installed once per process).
pub fn prometheus() -> PrometheusHandle {
    static PROMETHEUS: OnceLock<PrometheusHandle> = OnceLock::new();
    PROMETHEUS
        .get_or_init(|| serving::prometheus().expect("the test process's recorder"))
        .clone()
}

/// `--addr 127.0.0.1:0` and `flags`.
pub fn args<'a>(flags: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--addr", "127.0.0.1:0"];
    args.extend_from_slice(flags);
    args
}

/// `streamgate sim` with `flags`, served in process; its address and state.
pub fn start_sim(flags: &[&str]) -> (SocketAddr, Arc<serve::Server>) {
    let config = sim::Config::parse_from(args(flags)).unwrap();
    let (listener, app, server) = sim::app(config, prometheus()).expect("sim starts");
    let addr = listener.local_addr().unwrap();
    let group = server.streams().clone();
    tokio::spawn(serving::serve_until(
        listener,
        app,
        group,
        std::future::pending(),
    ));
    (addr, server)
}

/// The proxy's configuration in front of `upstream` with `flags`.
pub fn proxy_config(upstream: &str, flags: &[&str]) -> proxy::Config {
    let mut all = vec!["--upstream", upstream];
    all.extend_from_slice(flags);
    proxy::Config::parse_from(args(&all)).unwrap()
}

/// A proxy in front of `upstream` with `flags`, served in process until `stop` is sent (or for
/// ever); its address and the task serving it.
pub fn proxy_until(
    upstream: &str,
    flags: &[&str],
    stop: Option<oneshot::Receiver<()>>,
) -> (SocketAddr, Arc<proxy::Proxy>, tokio::task::JoinHandle<()>) {
    serve_proxy(proxy_config(upstream, flags), stop)
}

/// A proxy with `config`, served in process until `stop` is sent (or for ever); its address
/// and the task serving it.
pub fn serve_proxy(
    config: proxy::Config,
    stop: Option<oneshot::Receiver<()>>,
) -> (SocketAddr, Arc<proxy::Proxy>, tokio::task::JoinHandle<()>) {
    let (listener, app, state) = proxy::app(config, prometheus()).expect("the proxy starts");
    let addr = listener.local_addr().unwrap();
    let group = state.group.clone();
    let served = tokio::spawn(async move {
        let stop = async move {
            match stop {
                Some(stop) => {
                    let _ = stop.await;
                }
                None => std::future::pending().await,
            }
        };
        serving::serve_until(listener, app, group, stop)
            .await
            .unwrap();
    });
    (addr, state, served)
}

/// A proxy in front of `upstream` with `flags`, served in process; its address.
pub fn start_proxy(upstream: &str, flags: &[&str]) -> SocketAddr {
    proxy_until(upstream, flags, None).0
}

/// A streamed chat completion body for `max_tokens` tokens.
pub fn chat(max_tokens: u64) -> String {
    format!(
        r#"{{"model":"sim","messages":[{{"role":"user","content":"hi"}}],"stream":true,"max_tokens":{max_tokens}}}"#
    )
}

/// `POST /v1/chat/completions` streamed, with extra header lines.
pub async fn stream(addr: SocketAddr, headers: &str, max_tokens: u64) -> RawResponse {
    RawResponse::post(addr, CHAT, headers, &chat(max_tokens)).await
}
