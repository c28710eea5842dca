//! A gateway hop in front of any OpenAI-compatible streaming server (this crate's `serve`, or a
//! vLLM, TGI or llama.cpp server).
//!
//! `cargo run --release --example gateway --features axum,metrics -- --upstream http://127.0.0.1:8000 --addr 127.0.0.1:8080 [flags]`
//!
//! It forwards `POST /v1/chat/completions`, decodes the upstream SSE with the crate's decoder
//! (WHATWG rules, bounded memory), gates it again with its own bounds, policy and heartbeats
//! (`--buffer-events`, `--buffer-bytes`, `--policy`, `--slow-deadline-ms`, `--heartbeat-ms`),
//! and probes `gateway.recv` and `gateway.write`. When its client goes, it drops the upstream
//! request, so cancellation crosses the hop. `--stall-at N --stall-ms MS` injects a stall
//! before forwarding event N (a gateway-side freeze, for diagnosis drills); `--hop-records FILE`
//! writes hop records. `/stats` and `/metrics` describe the gateway itself.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use metrics_exporter_prometheus::PrometheusHandle;
use streamgate::GateExt;
use streamgate::probe::{HopProbe, RecordSink};
use streamgate::transport::{ListenOptions, SseResponse, TunedListener};

use crate::client as common;
use crate::serving as server;

/// `streamgate proxy`: the proxy's flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// The OpenAI-compatible server to put the proxy in front of (`http://IP:PORT`).
    #[arg(long, value_name = "URL", value_parser = upstream)]
    pub upstream: SocketAddr,
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    #[command(flatten)]
    pub gate: crate::flags::GateFlags,
    /// Inject a stall before forwarding event N (for diagnosis drills).
    #[arg(long, value_name = "N")]
    pub stall_at: Option<u64>,
    /// How long the injected stall lasts, in ms.
    #[arg(long = "stall-ms", value_name = "MS", default_value = "0", value_parser = crate::flags::millis_or_zero)]
    pub stall: Duration,
    /// Write hop records to FILE.
    #[arg(long, value_name = "FILE")]
    pub hop_records: Option<String>,
}

fn upstream(value: &str) -> Result<SocketAddr, String> {
    value
        .strip_prefix("http://")
        .unwrap_or(value)
        .trim_end_matches('/')
        .parse()
        .map_err(|_| format!("`{value}` is not http://IP:PORT"))
}

pub struct Gateway {
    config: Config,
    streams: Arc<server::StreamCounts>,
    /// Every stream: shut down together on SIGINT/SIGTERM.
    pub group: streamgate::Group,
    recv: HopProbe,
    write: HopProbe,
    next_id: AtomicU64,
    prometheus: PrometheusHandle,
    records: Option<RecordSink>,
}

/// `POST /v1/chat/completions`, forwarded.
async fn chat_completions(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let config = &gateway.config;
    let body = String::from_utf8_lossy(&body).into_owned();
    // One request id along the whole path, so every hop's records line up.
    let request = headers
        .get("x-request-id")
        .and_then(|value| value.to_str().ok())
        .map_or_else(
            || format!("gw-{}", gateway.next_id.fetch_add(1, Ordering::Relaxed)),
            str::to_owned,
        );
    #[allow(unused_mut)]
    let mut forwarded = vec![("x-request-id", request.as_str())];
    // With `otel`: the client's trace (its `traceparent`) goes on in `gateway.recv` and in the
    // upstream request, so the worker's spans join it. (To make them children of the gateway's
    // span instead, make the recorder before the request and inject its `otel_context()`.)
    let (parent, mut traced) = (streamgate::otel::extract(&headers), HeaderMap::new());
    streamgate::otel::inject(&parent, &mut traced);
    for (name, value) in &traced {
        forwarded.push((name.as_str(), value.to_str().unwrap_or_default()));
    }
    let path = "/v1/chat/completions";
    let upstream = match common::request(config.upstream, "POST", path, &forwarded, body).await {
        Ok(response) => response,
        Err(failure) => {
            return server::json_error(
                StatusCode::BAD_GATEWAY,
                &format!("upstream: {failure}"),
                "upstream_error",
            );
        }
    };
    let is_sse = upstream
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"text/event-stream"));
    if !is_sse {
        // Errors and non-streaming answers pass through as they are.
        let status = upstream.status();
        let content_type = upstream.headers().get(header::CONTENT_TYPE).cloned();
        let text = common::body_text(upstream).await.unwrap_or_default();
        let mut response = (status, text).into_response();
        if let Some(content_type) = content_type {
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, content_type);
        }
        return response;
    }
    let streams = gateway.streams.clone();
    streams.start();
    let events = common::body_stream(upstream).sse_events();
    let events = gateway.recv.recorder_in(&*request, &parent).probe(events);
    let (stall_at, stall) = (config.stall_at, config.stall);
    let gated = config
        .gate
        .gate()
        .group(&gateway.group)
        .on_release(move |reason, _| streams.end(reason))
        // The generator owns the upstream body: dropping it (when this client goes) closes
        // the upstream connection, and the upstream server cancels its own generator.
        .spawn(move |_, mut tx| async move {
            let mut events = std::pin::pin!(events);
            for n in 0.. {
                if stall_at == Some(n) {
                    // An injected freeze before reading event n from upstream.
                    tokio::time::sleep(stall).await;
                }
                let Some(event) = events.next().await else {
                    break;
                };
                if tx.send(event?).await.is_err() {
                    break;
                }
            }
            Ok::<(), streamgate::sse::DecodeError>(())
        });
    let frames = gated
        .sse()
        .heartbeat(config.gate.heartbeat)
        .probe(&gateway.write, request);
    SseResponse::new(frames).into_response()
}

async fn stats(State(gateway): State<Arc<Gateway>>) -> Response {
    let fields = gateway
        .streams
        .fields("streams_running", Some("streams_upstream_failed"));
    server::json_response(StatusCode::OK, serde_json::Value::Object(fields))
}

async fn metrics(State(gateway): State<Arc<Gateway>>) -> Response {
    server::metrics_response(&gateway.prometheus)
}

/// Binds the listener and builds the app for `config`; the caller serves it.
pub fn app(
    config: Config,
    prometheus: PrometheusHandle,
) -> Result<(TunedListener, Router, Arc<Gateway>), String> {
    let records = server::record_sink(config.hop_records.as_deref())?;
    let listener = TunedListener::bind(config.addr, ListenOptions::default())
        .map_err(|error| format!("binding {}: {error}", config.addr))?;
    let gateway = Arc::new(Gateway {
        recv: server::hop(&records, "gateway.recv"),
        write: server::hop(&records, "gateway.write"),
        streams: Arc::default(),
        group: streamgate::Group::new(),
        next_id: AtomicU64::new(0),
        prometheus,
        records,
        config,
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/stats", get(stats))
        .route("/metrics", get(metrics))
        .with_state(gateway.clone());
    Ok((listener, app, gateway))
}

/// Runs the proxy until SIGINT or SIGTERM.
pub async fn run(config: Config) -> ExitCode {
    match server::prometheus().and_then(|prometheus| app(config, prometheus)) {
        Ok((listener, app, gateway)) => {
            let records = gateway.records.clone();
            let group = gateway.group.clone();
            server::serve_until_signal("proxy", listener, app, records, group).await
        }
        Err(error) => {
            eprintln!("proxy: {error}");
            ExitCode::from(2)
        }
    }
}
