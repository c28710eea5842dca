//! The reference server: an OpenAI-compatible streaming endpoint backed by a simulated inference
//! worker, wrapped in the crate's combinators. Its interface (flags, endpoints, `/stats`) is
//! described in `examples/README.md`, under "The reference server".
//!
//! `cargo run --release --example serve --features axum,metrics -- --addr 127.0.0.1:0 [flags]`
//!
//! The worker decodes one token every `--step-ms` (token i's text is `"t{i} "`), optionally
//! stalls before token `--stall-at` for `--stall-ms`, and holds one KV block per 16 tokens from a
//! pool of `--kv-blocks`, freed by the gate's release hook on every end. Events cross a gate
//! (`--buffer-events`, `--buffer-bytes`, `--policy`, `--slow-deadline-ms`), are encoded as SSE
//! with heartbeats (`--heartbeat-ms`) and written one HTTP chunk per event on sockets with
//! `TCP_NODELAY`, a backlog of 1024, the listener's default `TCP_NOTSENT_LOWAT` and
//! `TCP_USER_TIMEOUT` (`--notsent-lowat`, `--user-timeout-ms`; 0 leaves the system's) and an
//! optional `--sndbuf`. Probes: `worker.decode`, `worker.publish`, `worker.write` and, over
//! HTTP/1.1, `worker.sent` (when each event's bytes left the kernel); `--hop-records FILE`
//! writes their hop records.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, Version, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde_json::{Value, json};
use streamgate::probe::{HopProbe, Observation, RecordSink};
use streamgate::sse::SseEvent;
use streamgate::transport::{
    DEFAULT_NOTSENT_LOWAT, DEFAULT_USER_TIMEOUT, Departures, ListenOptions, SendQueue, SseResponse,
    TunedListener,
};
use streamgate::{Chunk, Consumer, EndReason, GateExt, GateStats, Group, Kind};

#[allow(dead_code)] // each example uses a part
#[path = "common/mod.rs"]
pub(crate) mod common;

use common::server;

/// Tokens per KV block.
const BLOCK_TOKENS: u64 = 16;
/// `max_tokens` when a request gives none.
const DEFAULT_MAX_TOKENS: u64 = 16;
const MAX_TOKENS_LIMIT: u64 = 1_000_000;

#[derive(Debug, Clone)]
pub(crate) struct Config {
    addr: SocketAddr,
    step: Duration,
    stall_at: Option<u64>,
    stall: Duration,
    gate: common::GateFlags,
    kv_blocks: u64,
    sndbuf: Option<u32>,
    notsent_lowat: Option<u32>,
    user_timeout: Option<Duration>,
    hop_records: Option<String>,
}

pub(crate) fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Config, String> {
    let mut config = Config {
        addr: ([127, 0, 0, 1], 8000).into(),
        step: Duration::from_millis(5),
        stall_at: None,
        stall: Duration::ZERO,
        gate: common::GateFlags::default(),
        kv_blocks: 4096,
        sndbuf: None,
        notsent_lowat: Some(DEFAULT_NOTSENT_LOWAT),
        user_timeout: Some(DEFAULT_USER_TIMEOUT),
        hop_records: None,
    };
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag}: `{value}` is not a number"))
        };
        let positive = || {
            number().and_then(|n| {
                if n > 0 {
                    Ok(n)
                } else {
                    Err(format!("{flag} must be at least 1"))
                }
            })
        };
        if let Some(parsed) = config.gate.parse(&flag, &value) {
            parsed?;
            continue;
        }
        match flag.as_str() {
            "--addr" => {
                config.addr = value
                    .parse()
                    .map_err(|_| format!("--addr: `{value}` is not an address"))?
            }
            "--step-ms" => config.step = Duration::from_millis(number()?),
            "--stall-at" => config.stall_at = Some(number()?),
            "--stall-ms" => config.stall = Duration::from_millis(number()?),
            "--kv-blocks" => config.kv_blocks = number()?,
            "--sndbuf" => {
                config.sndbuf =
                    Some(u32::try_from(positive()?).map_err(|_| "--sndbuf is too large")?)
            }
            // 0 leaves the system's setting.
            "--notsent-lowat" => {
                let bytes = u32::try_from(number()?).map_err(|_| "--notsent-lowat is too large")?;
                config.notsent_lowat = (bytes > 0).then_some(bytes);
            }
            "--user-timeout-ms" => {
                let ms = number()?;
                config.user_timeout = (ms > 0).then(|| Duration::from_millis(ms));
            }
            "--hop-records" => config.hop_records = Some(value.clone()),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(config)
}

/// The process's counters, as `GET /stats` reports them.
#[derive(Default)]
struct Stats {
    streams: server::StreamCounts,
    kv_blocks_in_use: AtomicU64,
    tokens_generated: AtomicU64,
    tokens_after_cancel: AtomicU64,
}

pub(crate) struct Server {
    config: Config,
    stats: Stats,
    next_id: AtomicU64,
    decode: HopProbe,
    publish: HopProbe,
    write: HopProbe,
    sent: HopProbe,
    prometheus: PrometheusHandle,
    /// Where hop records go, if anywhere.
    records: Option<RecordSink>,
    /// Every stream: shut down together on SIGINT/SIGTERM.
    pub(crate) streams: Group,
}

/// What a stream is about: shared by all its chunks, so each chunk can encode itself.
struct Meta {
    id: String,
    model: String,
    created: u64,
    /// Whether events carry their token index as the SSE `id` (for `Last-Event-ID` resume).
    ids: bool,
    /// The id the probes record: the client's `x-request-id`, so every hop of the path records
    /// the same request, or else the completion id.
    request: String,
}

/// What the worker hands the gate: a run of token text (merged under `Coalesce`), the final
/// chunk, or the `[DONE]` marker.
enum Delta {
    /// Tokens up to and including `last`.
    Text {
        meta: Arc<Meta>,
        first: bool,
        last: u64,
        text: String,
    },
    Finish {
        meta: Arc<Meta>,
    },
    Done,
}

impl Chunk for Delta {
    /// What the event will hold once encoded: the text, and the stream's metadata that every
    /// chunk repeats (a long `model` name is paid for per event, so the byte bound counts it).
    fn byte_len(&self) -> usize {
        match self {
            Delta::Text { meta, text, .. } => meta.chunk_overhead() + text.len(),
            Delta::Finish { meta } => meta.chunk_overhead(),
            Delta::Done => "[DONE]".len(),
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Delta::Text { .. } => Kind::Visible,
            Delta::Finish { .. } | Delta::Done => Kind::Control,
        }
    }

    /// Text deltas concatenate before they are encoded as JSON: lossless for the client.
    fn merge(&mut self, next: Self) -> Result<(), Self> {
        match (self, next) {
            (
                Delta::Text { text, last, .. },
                Delta::Text {
                    text: more,
                    first: false,
                    last: next,
                    ..
                },
            ) => {
                text.push_str(&more);
                *last = next;
                Ok(())
            }
            (_, next) => Err(next),
        }
    }
}

impl From<Delta> for SseEvent {
    fn from(delta: Delta) -> SseEvent {
        let (meta, delta, finish, last) = match delta {
            Delta::Done => return SseEvent::data("[DONE]"),
            Delta::Text {
                meta,
                first: true,
                last,
                text,
            } => (
                meta,
                json!({"role": "assistant", "content": text}),
                Value::Null,
                Some(last),
            ),
            Delta::Text {
                meta,
                first: false,
                last,
                text,
            } => (meta, json!({"content": text}), Value::Null, Some(last)),
            Delta::Finish { meta } => (meta, json!({}), json!("length"), None),
        };
        let event = SseEvent::data(
            json!({
                "id": meta.id, "object": "chat.completion.chunk", "created": meta.created, "model": meta.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            })
            .to_string(),
        );
        match last.filter(|_| meta.ids) {
            Some(last) => event
                .with_id(last.to_string())
                .expect("a number is a valid id"),
            None => event,
        }
    }
}

impl Meta {
    /// The bytes every chunk of this stream carries besides its text: the metadata and the
    /// JSON around it.
    fn chunk_overhead(&self) -> usize {
        const ENVELOPE: usize = 128;
        ENVELOPE + self.id.len() + self.model.len()
    }
}

impl Server {
    /// Starts one generation of tokens `from..max_tokens` for `request`, gated as configured.
    fn generate(self: &Arc<Self>, meta: Arc<Meta>, from: u64, max_tokens: u64) -> Consumer<Delta> {
        let server = self.clone();
        server.stats.streams.start();
        let held = Arc::new(AtomicU64::new(0));
        let on_release = {
            let (server, held) = (server.clone(), held.clone());
            move |reason: EndReason, gate: GateStats| {
                let stats = &server.stats;
                stats
                    .kv_blocks_in_use
                    .fetch_sub(held.swap(0, Ordering::SeqCst), Ordering::SeqCst);
                stats
                    .tokens_after_cancel
                    .fetch_add(gate.chunks_after_end, Ordering::Relaxed);
                stats.streams.end(reason);
            }
        };
        let worker = server.clone();
        server
            .config
            .gate
            .gate()
            // Token i is event i, whether the generation starts at 0 or resumes later.
            .first_id(from)
            .group(&server.streams)
            .on_release(on_release)
            .spawn(move |_, mut tx| async move {
                let config = &worker.config;
                let mut decode = worker.decode.recorder(meta.request.as_str());
                let mut publish = worker.publish.recorder(meta.request.as_str());
                for i in from..max_tokens {
                    if config.stall_at == Some(i) {
                        tokio::time::sleep(config.stall).await;
                    }
                    if !config.step.is_zero() {
                        tokio::time::sleep(config.step).await;
                    }
                    if (i - from) % BLOCK_TOKENS == 0 {
                        worker.take_block()?;
                        held.fetch_add(1, Ordering::SeqCst);
                    }
                    worker
                        .stats
                        .tokens_generated
                        .fetch_add(1, Ordering::Relaxed);
                    let text = format!("t{i} ");
                    let observed = Observation::new(Some(i), text.len() as u64, Kind::Visible);
                    decode.observe(observed);
                    tx.send(Delta::Text {
                        meta: meta.clone(),
                        first: i == 0,
                        last: i,
                        text,
                    })
                    .await
                    .map_err(|_| "the stream ended")?;
                    publish.observe(observed);
                }
                decode.end("completed");
                publish.end("completed");
                tx.send(Delta::Finish { meta })
                    .await
                    .map_err(|_| "the stream ended")?;
                tx.send(Delta::Done).await.map_err(|_| "the stream ended")?;
                Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
            })
    }

    /// Takes one block from the KV pool, or fails the generation when the pool is exhausted.
    fn take_block(&self) -> Result<(), &'static str> {
        let in_use = &self.stats.kv_blocks_in_use;
        in_use
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.config.kv_blocks).then_some(n + 1)
            })
            .map(|_| ())
            .map_err(|_| "the KV pool is exhausted")
    }

    /// The SSE response for a generation, probed at `worker.write` and, over HTTP/1.1, at
    /// `worker.sent` when each event's bytes left the kernel.
    fn stream(&self, events: Consumer<Delta>, request: &str, connection: Connection) -> Response {
        let frames = events
            .sse()
            .heartbeat(self.config.gate.heartbeat)
            .probe(&self.write, request);
        match connection.send_queue() {
            Some(queue) => {
                let frames = Departures::new(frames, queue, self.sent.recorder(request));
                SseResponse::new(frames).into_response()
            }
            None => SseResponse::new(frames).into_response(),
        }
    }

    fn meta(&self, model: String, ids: bool, headers: &HeaderMap) -> Arc<Meta> {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let id = format!("chatcmpl-{n}");
        let request = headers
            .get("x-request-id")
            .and_then(|value| value.to_str().ok())
            .map_or_else(|| id.clone(), str::to_owned);
        Arc::new(Meta {
            id,
            model,
            created,
            ids,
            request,
        })
    }
}

fn bad_request(message: &str) -> Response {
    server::json_error(StatusCode::BAD_REQUEST, message, "invalid_request_error")
}

/// What a handler knows of its connection: its HTTP version and, when served by
/// `transport::Server`, its kernel send queue.
struct Connection {
    version: Version,
    queue: Option<SendQueue>,
}

impl Connection {
    /// The send queue, when the connection carries only this stream (HTTP/1.1).
    fn send_queue(self) -> Option<SendQueue> {
        self.queue.filter(|_| self.version <= Version::HTTP_11)
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Connection {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Connection {
            version: parts.version,
            queue: parts.extensions.get::<SendQueue>().cloned(),
        })
    }
}

/// `POST /v1/chat/completions`.
async fn chat_completions(
    State(server): State<Arc<Server>>,
    connection: Connection,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return bad_request("the body is not valid JSON");
    };
    if !request.get("messages").is_some_and(Value::is_array) {
        return bad_request("`messages` is required and must be an array");
    }
    let max_tokens = match request.get("max_tokens") {
        None | Some(Value::Null) => DEFAULT_MAX_TOKENS,
        Some(value) => match value.as_u64() {
            Some(n) if (1..=MAX_TOKENS_LIMIT).contains(&n) => n,
            _ => return bad_request("`max_tokens` must be an integer from 1 to 1000000"),
        },
    };
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("streamgate-sim")
        .to_owned();
    let meta = server.meta(model, false, &headers);
    let events = server.generate(meta.clone(), 0, max_tokens);
    if request.get("stream").and_then(Value::as_bool) == Some(true) {
        return server.stream(events, &meta.request, connection);
    }
    let mut text = String::new();
    let mut events = std::pin::pin!(events);
    while let Some(item) =
        std::future::poll_fn(|cx| futures_core::Stream::poll_next(events.as_mut(), cx)).await
    {
        match item {
            Ok(event) => {
                if let Delta::Text { text: more, .. } = event.into_chunk() {
                    text.push_str(&more);
                }
            }
            Err(error) => {
                let body = json!({"error": {"message": error.to_string(), "type": "server_error"}});
                return (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    [(header::CONTENT_TYPE, "application/json")],
                    body.to_string(),
                )
                    .into_response();
            }
        }
    }
    let body = json!({
        "id": meta.id, "object": "chat.completion", "created": meta.created, "model": meta.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": max_tokens, "total_tokens": max_tokens},
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// `GET /v1/stream?max_tokens=N`: the same token events with `id: <seq>` for EventSource
/// clients. A `Last-Event-ID` of k resumes at token k+1: token text is deterministic, so the
/// whole generation is the replay window (an id past the end, or not a number, starts over).
async fn stream_get(
    State(server): State<Arc<Server>>,
    RawQuery(query): RawQuery,
    connection: Connection,
    headers: HeaderMap,
) -> Response {
    let mut max_tokens = DEFAULT_MAX_TOKENS;
    for pair in query.as_deref().unwrap_or("").split('&') {
        if let Some(value) = pair.strip_prefix("max_tokens=") {
            match value.parse::<u64>() {
                Ok(n) if (1..=MAX_TOKENS_LIMIT).contains(&n) => max_tokens = n,
                _ => return bad_request("`max_tokens` must be an integer from 1 to 1000000"),
            }
        }
    }
    let from = headers
        .get("last-event-id")
        .and_then(|id| id.to_str().ok())
        .and_then(|id| id.trim().parse::<u64>().ok())
        .map(|last| last + 1)
        .filter(|&from| from <= max_tokens)
        .unwrap_or(0);
    let meta = server.meta("streamgate-sim".into(), true, &headers);
    let events = server.generate(meta.clone(), from, max_tokens);
    let mut response = server.stream(events, &meta.request, connection);
    // A page on another origin may open this with `EventSource`.
    response.headers_mut().insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        header::HeaderValue::from_static("*"),
    );
    response
}

/// `GET /stats`.
async fn stats(State(server): State<Arc<Server>>) -> Response {
    let s = &server.stats;
    let load = |n: &AtomicU64| n.load(Ordering::SeqCst);
    server::json_response(
        StatusCode::OK,
        Value::Object(
            s.streams
                .fields("generators_running", None)
                .into_iter()
                .chain([
                    ("kv_blocks_in_use".into(), load(&s.kv_blocks_in_use).into()),
                    ("tokens_generated".into(), load(&s.tokens_generated).into()),
                    (
                        "tokens_after_cancel".into(),
                        load(&s.tokens_after_cancel).into(),
                    ),
                ])
                .collect(),
        ),
    )
}

/// `GET /metrics`: Prometheus text, with the per-hop gap histograms and stall counters.
async fn metrics(State(server): State<Arc<Server>>) -> Response {
    server::metrics_response(&server.prometheus)
}

/// Installs the process's Prometheus recorder (once per process: probes register their metrics
/// with it when they are created).
pub(crate) fn prometheus() -> Result<PrometheusHandle, String> {
    let buckets = [
        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ];
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|error| format!("metrics: {error}"))
}

/// Binds the listener and builds the app for `config`; the caller serves it.
pub(crate) fn app(
    config: Config,
    prometheus: PrometheusHandle,
) -> Result<(TunedListener, Router, Arc<Server>), String> {
    let sink = server::record_sink(config.hop_records.as_deref())?;
    let options = ListenOptions::default()
        .send_buffer(config.sndbuf)
        .notsent_lowat(config.notsent_lowat)
        .user_timeout(config.user_timeout);
    let listener = TunedListener::bind(config.addr, options)
        .map_err(|error| format!("binding {}: {error}", config.addr))?;
    let server = Arc::new(Server {
        stats: Stats::default(),
        next_id: AtomicU64::new(0),
        decode: server::hop(&sink, "worker.decode"),
        publish: server::hop(&sink, "worker.publish"),
        write: server::hop(&sink, "worker.write"),
        sent: server::hop(&sink, "worker.sent"),
        prometheus,
        config,
        records: sink,
        streams: Group::new(),
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/stream", get(stream_get))
        .route("/stats", get(stats))
        .route("/metrics", get(metrics))
        .with_state(server.clone());
    Ok((listener, app, server))
}

#[tokio::main]
async fn main() -> ExitCode {
    let started =
        parse_args(std::env::args().skip(1)).and_then(|config| app(config, prometheus()?));
    match started {
        Ok((listener, app, state)) => {
            let records = state.records.clone();
            let streams = state.streams.clone();
            server::serve_until_signal("serve", listener, app, records, streams).await
        }
        Err(error) => {
            eprintln!("serve: {error}");
            ExitCode::from(2)
        }
    }
}
