//! The reference server: an OpenAI-compatible streaming endpoint backed by a simulated inference
//! worker, wrapped in the crate's combinators. Its interface (flags, endpoints, `/stats`) is
//! described in `examples/README.md`, under "The reference server", and kept exactly: acceptance
//! checks drive it with real clients.
//!
//! ```text
//! streamgate sim --addr 127.0.0.1:0 [flags]
//! cargo run --release --example serve -- --addr 127.0.0.1:0 [flags]    # the same, from the repo
//! ```
//!
//! The worker decodes one token every `--step-ms` (token i's text is `"t{i} "`), optionally
//! stalls before token `--stall-at` for `--stall-ms`, and holds one KV block per 16 tokens from a
//! pool of `--kv-blocks`, freed by the gate's release hook on every end. A request whose
//! `max_tokens` needs more blocks than the whole pool is served as many tokens as the pool
//! holds, ending with `finish_reason` `length` (as a real server's context fills); one that
//! finds every block held by other streams is refused with 503 ("KV cache full"); a stream that runs out of blocks mid-generation gets an OpenAI-style error event
//! naming the exhausted pool, then the gate's terminal frame, and is counted in
//! `streams_failed` and `streams_kv_exhausted`, not `streams_cancelled`. Events cross a gate
//! (`--buffer-events`, `--buffer-bytes`, `--policy`, `--slow-deadline-ms`) into a
//! `resume::Registry` (`--resume-grace-ms`, `--replay-bytes`), or with `--resume-store
//! redis://HOST:PORT` a `resume::RedisRegistry` that other instances serve resumes from; each
//! client reads at its own position, and an explicit stop (`POST .../cancel`) ends the
//! generation with a final chunk. They are encoded as SSE with heartbeats (`--heartbeat-ms`) and
//! written one HTTP chunk per event on sockets with `TCP_NODELAY`, a backlog of 1024, the
//! listener's default `TCP_NOTSENT_LOWAT` and `TCP_USER_TIMEOUT` (`--notsent-lowat`,
//! `--user-timeout-ms`; 0 leaves the system's) and an optional `--sndbuf`, behind the
//! listener's protections (`--header-timeout-ms`, `--idle-timeout-ms`, `--max-connections`,
//! as the proxy's). Probes: `worker.decode`, `worker.publish`, `worker.write` and, over
//! HTTP/1.1, `worker.sent` (when each event's bytes left the kernel); `--hop-records FILE`
//! writes their hop records.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, Version, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{Value, json};
use streamgate::probe::{HopProbe, Observation, RecordSink};
use streamgate::resume::{AttachError, RegisterError};
use streamgate::sse::SseEvent;
use streamgate::transport::{Departures, SendQueue, SseResponse, TunedListener};
use streamgate::{Chunk, Consumer, EndReason, GateExt, GateStats, Group, Kind};

use crate::flags::{self, ResumeStore};
use crate::serving as server;
use crate::store::{self, Frames, ResumeAfter, Store};

/// Tokens per KV block.
const BLOCK_TOKENS: u64 = 16;
/// `max_tokens` when a request gives none.
const DEFAULT_MAX_TOKENS: u64 = 16;
const MAX_TOKENS_LIMIT: u64 = 1_000_000;

/// `streamgate sim`: the reference server's flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// Where to listen (`127.0.0.1:0` picks a free port; the real one is printed).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub addr: SocketAddr,
    /// Simulated decode step: one token every MS ms.
    #[arg(long = "step-ms", value_name = "MS", default_value = "5", value_parser = flags::millis_or_zero)]
    pub step: Duration,
    /// Before token N (0-based) the worker stalls (for `--stall-ms`).
    #[arg(long, value_name = "N")]
    pub stall_at: Option<u64>,
    /// How long the stall at `--stall-at` lasts, in ms (a decode-side stall).
    #[arg(long = "stall-ms", value_name = "MS", default_value = "0", value_parser = flags::millis_or_zero)]
    pub stall: Duration,
    #[command(flatten)]
    pub gate: flags::GateFlags,
    /// Size of the simulated KV pool (one block per 16 tokens held by a live generator).
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub kv_blocks: u64,
    #[command(flatten)]
    pub listen: flags::ListenFlags,
    #[command(flatten)]
    pub resume: flags::ResumeFlags,
    /// Token text becomes `t{i}.{salt} ` with a random salt per stream, so a regenerated
    /// stream can be told from a resumed one.
    #[arg(long)]
    pub token_salt: bool,
    /// Write a hop record (a JSON line) for every event of every request at the hops
    /// `worker.decode`, `worker.publish`, `worker.write`, `worker.sent`, and one of kind `end`
    /// per stream; flushed at exit.
    #[arg(long, value_name = "FILE")]
    pub hop_records: Option<String>,
    #[command(flatten)]
    pub hop_records_sample: flags::RecordSample,
}

impl Config {
    /// The reference server's defaults, listening on `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        let mut config = Self::parse_from::<_, &str>([]).expect("the defaults parse");
        config.addr = addr;
        config
    }

    /// Parses the contract's flags (`["--step-ms", "5", "--policy", "coalesce"]`, without a
    /// program name).
    pub fn parse_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        flags::parse_from("sim", args)
    }
}

/// The process's counters, as `GET /stats` reports them.
#[derive(Default)]
struct Stats {
    streams: server::StreamCounts,
    kv_blocks_in_use: AtomicU64,
    tokens_generated: AtomicU64,
    tokens_after_cancel: AtomicU64,
    /// The longest a stream took from its end (a disconnect, a stop) to its release, in µs:
    /// the gate's own measure (`GateStats::end_to_release`), inside the server.
    end_to_release_max_us: AtomicU64,
    /// Streams stopped mid-generation because the KV pool ran out (also `streams_failed`).
    kv_exhausted: AtomicU64,
    /// Requests refused with 503 because every KV block was held by other streams.
    refused_kv_full: AtomicU64,
}

/// Every KV block is held: `in_use` of `total`.
#[derive(Debug, Clone, Copy)]
struct KvFull {
    in_use: u64,
    total: u64,
}

impl std::fmt::Display for KvFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KV cache full: {} of {} blocks in use",
            self.in_use, self.total
        )
    }
}

impl KvFull {
    /// 503 with an OpenAI-style error body: the pool is busy, a retry may find room.
    fn response(&self) -> Response {
        let body = json!({"error": {
            "message": format!("{self}; retry when other streams have ended"),
            "type": "server_error",
            "code": "kv_cache_full",
        }});
        let mut response = server::json_response(StatusCode::SERVICE_UNAVAILABLE, body);
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        response
    }
}

/// The reference server's state: its configuration, counters, probes and streams.
pub struct Server {
    config: Config,
    stats: Stats,
    /// Completion ids are this and a counter: with a shared store, it names the instance too.
    id_prefix: String,
    next_id: AtomicU64,
    decode: HopProbe,
    publish: HopProbe,
    write: HopProbe,
    sent: HopProbe,
    prometheus: PrometheusHandle,
    /// Where hop records go (`--hop-records`), if anywhere: sync it before exiting.
    pub records: Option<RecordSink>,
    /// Every stream: shut down together on SIGINT/SIGTERM (give it to
    /// [`server::serve_until`]).
    pub streams: Group,
    /// Every streamed generation by its request id: resumable, several readers at once, and
    /// the explicit stop of every generation running here.
    store: Store<Delta>,
}

/// What a stream is about: shared by all its chunks, so each chunk can encode itself.
struct Meta {
    id: String,
    model: String,
    created: u64,
    /// The stream's name in the registry (the response's `x-request-id`).
    stream: String,
    /// With `--token-salt`, this generation's salt, so a regenerated stream shows.
    salt: Option<u64>,
    /// The id the probes record: the client's `x-request-id`, so every hop of the path records
    /// the same request, or else the completion id.
    request: String,
}

/// What the worker hands the gate: a run of tokens (merged under `Coalesce`), the final chunk,
/// or the `[DONE]` marker.
#[derive(Clone)]
enum Delta {
    /// Tokens `from..=to`, whose text (`len` bytes) is written out only when the chunk is
    /// encoded: the worker allocates nothing per token.
    Text {
        meta: Arc<Meta>,
        from: u64,
        to: u64,
        len: usize,
    },
    /// The final chunk: `finish_reason` `length`, or `stop` after an explicit stop.
    Finish {
        meta: Arc<Meta>,
        reason: &'static str,
    },
    Done,
    /// The generation failed: an OpenAI-style error event (`data: {"error":{..}}`, which the
    /// OpenAI SDKs raise as an API error), before the gate's terminal frame.
    Error {
        message: String,
        code: &'static str,
    },
}

impl Chunk for Delta {
    /// What the event will hold once encoded: the text, and the stream's metadata that every
    /// chunk repeats (a long `model` name is paid for per event, so the byte bound counts it).
    fn byte_len(&self) -> usize {
        match self {
            Delta::Text { meta, len, .. } => meta.chunk_overhead() + len,
            Delta::Finish { meta, .. } => meta.chunk_overhead(),
            Delta::Done => "[DONE]".len(),
            Delta::Error { message, code } => 64 + message.len() + code.len(),
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Delta::Text { .. } => Kind::Visible,
            Delta::Finish { .. } | Delta::Done | Delta::Error { .. } => Kind::Control,
        }
    }

    /// Runs of tokens join before they are encoded as JSON: lossless for the client.
    fn merge(&mut self, next: Self) -> Result<(), Self> {
        match (self, next) {
            (
                Delta::Text { to, len, .. },
                Delta::Text {
                    from,
                    to: next,
                    len: more,
                    ..
                },
            ) if from == *to + 1 => {
                *to = next;
                *len += more;
                Ok(())
            }
            (_, next) => Err(next),
        }
    }
}

impl From<Delta> for SseEvent {
    /// The chunk's JSON, written straight into the buffer the frame is made in (with room for
    /// the SSE fields around it).
    fn from(delta: Delta) -> SseEvent {
        let (meta, content, finish_reason) = match delta {
            Delta::Done => return SseEvent::data("[DONE]"),
            Delta::Error { message, code } => {
                let error =
                    json!({"error": {"message": message, "type": "server_error", "code": code}});
                return SseEvent::data(error.to_string());
            }
            Delta::Text {
                meta,
                from,
                to,
                len,
            } => (meta, Some((from, to, len)), None),
            Delta::Finish { meta, reason } => (meta, None, Some(reason)),
        };
        let text_len = content.map_or(0, |(.., len)| len);
        let mut json = Vec::with_capacity(FRAME_ROOM + meta.chunk_overhead() + text_len);
        let chunk = ChunkJson {
            choices: [ChoiceJson {
                delta: DeltaJson {
                    content: content.map(|(from, to, _)| Tokens {
                        meta: &meta,
                        from,
                        to,
                    }),
                    role: content
                        .is_some_and(|(from, ..)| from == 0)
                        .then_some("assistant"),
                },
                finish_reason,
                index: 0,
            }],
            created: meta.created,
            id: &meta.id,
            model: &meta.model,
            object: "chat.completion.chunk",
        };
        serde_json::to_writer(&mut json, &chunk).expect("a chunk serializes");
        SseEvent::data(String::from_utf8(json).expect("serde_json writes UTF-8"))
    }
}

/// Room for the SSE fields around a chunk's JSON (`id: N`, `data: `, the blank line) besides
/// what [`Meta::chunk_overhead`] counts.
const FRAME_ROOM: usize = 64;

/// A `chat.completion.chunk`, as the contract spells it (keys in this order).
#[derive(serde::Serialize)]
struct ChunkJson<'a> {
    choices: [ChoiceJson<'a>; 1],
    created: u64,
    id: &'a str,
    model: &'a str,
    object: &'static str,
}

#[derive(serde::Serialize)]
struct ChoiceJson<'a> {
    delta: DeltaJson<'a>,
    finish_reason: Option<&'static str>,
    index: u32,
}

#[derive(serde::Serialize)]
struct DeltaJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<Tokens<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
}

/// The text of tokens `from..=to`, written as a JSON string without being collected first.
struct Tokens<'a> {
    meta: &'a Meta,
    from: u64,
    to: u64,
}

impl std::fmt::Display for Tokens<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (self.from..=self.to).try_for_each(|i| self.meta.write_token(i, f))
    }
}

impl serde::Serialize for Tokens<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl Meta {
    /// The bytes every chunk of this stream carries besides its text: the metadata and the
    /// JSON around it.
    fn chunk_overhead(&self) -> usize {
        const ENVELOPE: usize = 128;
        ENVELOPE + self.id.len() + self.model.len()
    }

    /// Writes token `i`'s text: `t{i} `, or `t{i}.{salt} ` with `--token-salt`.
    fn write_token(&self, i: u64, out: &mut impl std::fmt::Write) -> std::fmt::Result {
        match self.salt {
            Some(salt) => write!(out, "t{i}.{salt:x} "),
            None => write!(out, "t{i} "),
        }
    }

    /// The length of token `i`'s text.
    fn token_len(&self, i: u64) -> usize {
        let digits = |n: u64, base: u64| n.checked_ilog(base).map_or(1, |log| log as usize + 1);
        let salt = self.salt.map_or(0, |salt| 1 + digits(salt, 16));
        2 + digits(i, 10) + salt
    }
}

impl Server {
    /// Starts one generation of tokens `from..max_tokens` for `request`, gated as configured,
    /// that an explicit stop under the stream's name ends with a final chunk and `[DONE]`. Its
    /// first KV block is taken here: when every block is held by other streams, nothing
    /// starts.
    fn generate(
        self: &Arc<Self>,
        meta: Arc<Meta>,
        from: u64,
        max_tokens: u64,
    ) -> Result<Consumer<Delta>, KvFull> {
        let first_block = from < max_tokens;
        if first_block {
            self.take_block().inspect_err(|_| {
                self.stats.refused_kv_full.fetch_add(1, Ordering::Relaxed);
            })?;
        }
        let server = self.clone();
        let claim = server.store.claim(&meta.stream);
        let stop = claim.stop().clone();
        server.stats.streams.start();
        let held = Arc::new(AtomicU64::new(u64::from(first_block)));
        let on_release = {
            let (server, held) = (server.clone(), held.clone());
            move |reason: EndReason, gate: GateStats| {
                server.store.release(claim);
                let stats = &server.stats;
                stats
                    .kv_blocks_in_use
                    .fetch_sub(held.swap(0, Ordering::SeqCst), Ordering::SeqCst);
                stats
                    .tokens_after_cancel
                    .fetch_add(gate.chunks_after_end, Ordering::Relaxed);
                if let Some(took) = gate.end_to_release {
                    let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
                    stats
                        .end_to_release_max_us
                        .fetch_max(micros, Ordering::Relaxed);
                }
                stats.streams.end(reason);
            }
        };
        let worker = server.clone();
        let config = &server.config;
        Ok(config
            .gate
            .gate(&config.resume)
            // Token i is event i, whether the generation starts at 0 or resumes later.
            .first_id(from)
            .group(&server.streams)
            .on_release(on_release)
            .spawn(move |_, mut tx| async move {
                let config = &worker.config;
                let mut decode = worker.decode.recorder(meta.request.as_str());
                let mut publish = worker.publish.recorder(meta.request.as_str());
                let pause = |duration: Duration| {
                    let stop = stop.clone();
                    async move {
                        tokio::select! {
                            () = tokio::time::sleep(duration) => {}
                            () = stop.cancelled() => {}
                        }
                    }
                };
                let mut finish = "length";
                for i in from..max_tokens {
                    if config.stall_at == Some(i) {
                        pause(config.stall).await;
                    }
                    if !config.step.is_zero() {
                        pause(config.step).await;
                    }
                    if stop.is_cancelled() {
                        finish = "stop";
                        break;
                    }
                    // The first block was taken before the generation started.
                    if i > from && (i - from) % BLOCK_TOKENS == 0 {
                        if let Err(full) = worker.take_block() {
                            decode.end(EndReason::GeneratorError);
                            publish.end(EndReason::GeneratorError);
                            // Other streams hold the rest of the pool: this one stops, gives
                            // its blocks back at once, and says why before the gate's end.
                            let blocks = held.swap(0, Ordering::SeqCst);
                            worker
                                .stats
                                .kv_blocks_in_use
                                .fetch_sub(blocks, Ordering::SeqCst);
                            worker.stats.kv_exhausted.fetch_add(1, Ordering::Relaxed);
                            let message = format!(
                                "{full}: the generation stopped after {} tokens and gave back the \
                                 blocks it held ({blocks})",
                                i - from
                            );
                            let error = Delta::Error {
                                message: message.clone(),
                                code: "kv_cache_exhausted",
                            };
                            let _ = tx.send(error).await;
                            return Err(message.into());
                        }
                        held.fetch_add(1, Ordering::SeqCst);
                    }
                    worker
                        .stats
                        .tokens_generated
                        .fetch_add(1, Ordering::Relaxed);
                    let len = meta.token_len(i);
                    let observed = Observation::new(Some(i), len as u64, Kind::Visible);
                    decode.observe(observed);
                    tx.send(Delta::Text {
                        meta: meta.clone(),
                        from: i,
                        to: i,
                        len,
                    })
                    .await
                    .map_err(|_| "the stream ended")?;
                    publish.observe(observed);
                }
                // A stop asked for is the stream cancelled; a recorder dropped on the way out
                // (the gate ended first) is its consumer gone.
                let ended = if finish == "stop" {
                    EndReason::Cancelled
                } else {
                    EndReason::Completed
                };
                decode.end(ended);
                publish.end(ended);
                tx.send(Delta::Finish {
                    meta,
                    reason: finish,
                })
                .await
                .map_err(|_| "the stream ended")?;
                tx.send(Delta::Done).await.map_err(|_| "the stream ended")?;
                Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
            }))
    }

    /// Takes one block from the KV pool, or says how full it is.
    fn take_block(&self) -> Result<(), KvFull> {
        let total = self.config.kv_blocks;
        self.stats
            .kv_blocks_in_use
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < total).then_some(n + 1)
            })
            .map(|_| ())
            .map_err(|in_use| KvFull { in_use, total })
    }

    /// The most tokens a request is served: its `max_tokens`, or what the whole KV pool holds
    /// (a stream holds one block per 16 tokens until it ends), where a request asks for more.
    /// Such a stream ends there with `finish_reason` `length`, as a real server's generation
    /// ends when its context is full, instead of running the pool dry and failing.
    fn servable(&self, max_tokens: u64) -> u64 {
        max_tokens.min(self.config.kv_blocks.saturating_mul(BLOCK_TOKENS))
    }

    /// The SSE response for a generation, probed at `worker.write` and, over HTTP/1.1, at
    /// `worker.sent` when each event's bytes left the kernel.
    fn stream(
        &self,
        frames: Frames,
        name: &str,
        request: &str,
        connection: Connection,
    ) -> Response {
        let name = header::HeaderValue::from_str(name).ok();
        let frames = frames
            .heartbeat(self.config.gate.heartbeat)
            .probe(&self.write, request);
        let mut response = match connection.send_queue() {
            Some(queue) => {
                let frames = Departures::new(frames, queue, self.sent.recorder(request));
                SseResponse::new(frames).into_response()
            }
            None => SseResponse::new(frames).into_response(),
        };
        if let Some(name) = name {
            response.headers_mut().insert("x-request-id", name);
        }
        response
    }

    /// Registers a new generation under its stream name and streams it to this client.
    async fn start_stream(
        self: &Arc<Self>,
        meta: &Arc<Meta>,
        from: u64,
        max_tokens: u64,
        connection: Connection,
    ) -> Response {
        let events = match self.generate(meta.clone(), from, max_tokens) {
            Ok(events) => events,
            Err(full) => return full.response(),
        };
        // Only `GET /v1/stream?id=` names streams from outside; a name taken between its
        // lookup and here is a conflict like any other.
        match self.store.register(&meta.stream, events).await {
            Ok(frames) => self.stream(frames, &meta.stream, &meta.request, connection),
            Err(error @ RegisterError::Duplicate) => {
                server::json_error(StatusCode::CONFLICT, &error.to_string(), "conflict_error")
            }
            Err(error) => store::unavailable(&error.to_string()),
        }
    }

    /// A new generation's metadata; its stream is named `stream`, or by its completion id.
    fn meta(&self, model: String, stream: Option<String>, headers: &HeaderMap) -> Arc<Meta> {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let id = format!("{}{n}", self.id_prefix);
        let request = headers
            .get("x-request-id")
            .and_then(|value| value.to_str().ok())
            .map_or_else(|| id.clone(), str::to_owned);
        let salt = self.config.token_salt.then(|| {
            use std::hash::{BuildHasher, RandomState};
            RandomState::new().hash_one(n)
        });
        Arc::new(Meta {
            stream: stream.unwrap_or_else(|| id.clone()),
            id,
            model,
            created,
            salt,
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
    let max_tokens = server.servable(max_tokens);
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("streamgate-sim")
        .to_owned();
    let meta = server.meta(model, None, &headers);
    if request.get("stream").and_then(Value::as_bool) == Some(true) {
        return server.start_stream(&meta, 0, max_tokens, connection).await;
    }
    let events = match server.generate(meta.clone(), 0, max_tokens) {
        Ok(events) => events,
        Err(full) => return full.response(),
    };
    let mut text = String::new();
    let mut failed = None;
    let mut events = std::pin::pin!(events);
    while let Some(item) =
        std::future::poll_fn(|cx| futures_core::Stream::poll_next(events.as_mut(), cx)).await
    {
        match item {
            Ok(event) => match event.into_chunk() {
                Delta::Text { meta, from, to, .. } => {
                    let tokens = Tokens {
                        meta: &meta,
                        from,
                        to,
                    };
                    text.push_str(&tokens.to_string());
                }
                Delta::Error { message, code } => failed = Some((message, code)),
                _ => {}
            },
            Err(error) => {
                // The KV pool ran out mid-generation: busy, not broken (a retry may find room).
                let (status, body) = match failed {
                    Some((message, code)) => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        json!({"error": {"message": message, "type": "server_error", "code": code}}),
                    ),
                    None => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        json!({"error": {"message": error.to_string(), "type": "server_error"}}),
                    ),
                };
                return server::json_response(status, body);
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

/// `GET /v1/stream?max_tokens=N[&id=NAME]`: the same token events for EventSource clients.
/// With `id`, the stream is resumable under that name: the first request starts it, and a
/// reconnect with `Last-Event-ID` (or another client) attaches to the running stream. Without
/// `id`, a `Last-Event-ID` of k starts a new generation at token k+1 (token text is
/// deterministic; an id past the end, or not a number, starts over).
async fn stream_get(
    State(server): State<Arc<Server>>,
    RawQuery(query): RawQuery,
    connection: Connection,
    headers: HeaderMap,
) -> Response {
    let mut max_tokens = DEFAULT_MAX_TOKENS;
    let mut name = None;
    for pair in query.as_deref().unwrap_or("").split('&') {
        if let Some(value) = pair.strip_prefix("max_tokens=") {
            match value.parse::<u64>() {
                Ok(n) if (1..=MAX_TOKENS_LIMIT).contains(&n) => max_tokens = server.servable(n),
                _ => return bad_request("`max_tokens` must be an integer from 1 to 1000000"),
            }
        } else if let Some(value) = pair.strip_prefix("id=") {
            name = Some(value.to_owned());
        }
    }
    let last = store::last_event_id(&headers);
    let mut response = match name {
        Some(name) => match server.store.attach(&name, last).await {
            Ok(frames) => server.stream(frames, &name, &name, connection),
            // A first request starts the stream; a reconnect never regenerates it.
            Err(AttachError::Unknown) if last.is_none() => {
                let meta = server.meta("streamgate-sim".into(), Some(name), &headers);
                server.start_stream(&meta, 0, max_tokens, connection).await
            }
            Err(error) => store::attach_error(&error),
        },
        None => {
            let from = last
                .map(|last| last + 1)
                .filter(|&from| from <= max_tokens)
                .unwrap_or(0);
            let meta = server.meta("streamgate-sim".into(), None, &headers);
            server
                .start_stream(&meta, from, max_tokens, connection)
                .await
        }
    };
    // A page on another origin may open this with `EventSource`.
    response.headers_mut().insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        header::HeaderValue::from_static("*"),
    );
    response
}

/// `GET /v1/chat/completions/{id}/stream` with `Last-Event-ID: n` or `?after=n`: the events
/// after n of a running (or retained) stream, from its replay log, then live.
async fn resume(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    ResumeAfter(after): ResumeAfter,
    connection: Connection,
) -> Response {
    match server.store.attach(&id, after).await {
        Ok(frames) => server.stream(frames, &id, &id, connection),
        Err(error) => store::attach_error(&error),
    }
}

/// `POST /v1/chat/completions/{id}/cancel`: an explicit stop. The generator ends with a final
/// chunk (`finish_reason` `stop`) and `[DONE]`, which every attached client gets.
async fn cancel(State(server): State<Arc<Server>>, Path(id): Path<String>) -> Response {
    match server.store.cancel(&id).await {
        Ok(cancelled) => {
            server::json_response(StatusCode::OK, json!({"id": id, "cancelled": cancelled}))
        }
        Err(error) => store::attach_error(&error),
    }
}

/// `GET /stats`.
async fn stats(State(server): State<Arc<Server>>) -> Response {
    let s = &server.stats;
    let load = |n: &AtomicU64| n.load(Ordering::SeqCst);
    let resumable = server.store.stats();
    server::json_response(
        StatusCode::OK,
        Value::Object(
            s.streams
                .fields("generators_running")
                .into_iter()
                .chain([
                    ("streams_kv_exhausted".into(), load(&s.kv_exhausted).into()),
                    (
                        "requests_refused_kv_full".into(),
                        load(&s.refused_kv_full).into(),
                    ),
                    ("kv_blocks_in_use".into(), load(&s.kv_blocks_in_use).into()),
                    ("tokens_generated".into(), load(&s.tokens_generated).into()),
                    (
                        "tokens_after_cancel".into(),
                        load(&s.tokens_after_cancel).into(),
                    ),
                    (
                        "end_to_release_max_us".into(),
                        load(&s.end_to_release_max_us).into(),
                    ),
                    ("streams_detached".into(), resumable.detached.into()),
                    ("streams_resumed".into(), resumable.resumed.into()),
                    ("streams_expired".into(), resumable.expired.into()),
                    ("replay_bytes".into(), resumable.log_bytes.into()),
                ])
                .collect(),
        ),
    )
}

/// `GET /metrics`: Prometheus text, with the per-hop gap histograms and stall counters.
async fn metrics(State(server): State<Arc<Server>>) -> Response {
    server::metrics_response(&server.prometheus)
}

/// Binds the listener and builds the app for `config`; the caller serves it.
pub fn app(
    config: Config,
    prometheus: PrometheusHandle,
) -> Result<(TunedListener, Router, Arc<Server>), String> {
    let sink = server::record_sink(config.hop_records.as_deref())?;
    let sample = config.hop_records_sample;
    let listener = TunedListener::bind(config.addr, config.listen.options())
        .map_err(|error| format!("binding {}: {error}", config.addr))?;
    let store = config.resume.open(&config.gate)?;
    let id_prefix = match &config.resume.store {
        ResumeStore::Memory => "chatcmpl-".to_owned(),
        // Other instances name streams in the same Redis.
        ResumeStore::Redis(_) => {
            use std::hash::{BuildHasher, RandomState};
            format!("chatcmpl-{:x}-", RandomState::new().hash_one(0))
        }
    };
    let server = Arc::new(Server {
        stats: Stats::default(),
        id_prefix,
        next_id: AtomicU64::new(0),
        decode: server::hop(&sink, sample, "worker.decode"),
        publish: server::hop(&sink, sample, "worker.publish"),
        write: server::hop(&sink, sample, "worker.write"),
        sent: server::hop(&sink, sample, "worker.sent"),
        prometheus,
        config,
        records: sink,
        streams: Group::new(),
        store,
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/chat/completions/{id}/stream", get(resume))
        .route("/v1/chat/completions/{id}/cancel", post(cancel))
        .route("/v1/stream", get(stream_get))
        .route("/stats", get(stats))
        .route("/metrics", get(metrics))
        .with_state(server.clone());
    Ok((listener, app, server))
}

/// Runs the reference server until SIGINT or SIGTERM: exit status 0 after a clean
/// shutdown, 2 when it could not start.
pub async fn run(config: Config) -> ExitCode {
    let protections = config.listen.server();
    match server::prometheus().and_then(|prometheus| app(config, prometheus)) {
        Ok((listener, app, state)) => {
            let (records, streams) = (state.records.clone(), state.streams.clone());
            server::serve_until_signal("sim", protections, listener, app, records, streams).await
        }
        Err(error) => {
            eprintln!("sim: {error}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tokens_length_is_the_length_of_its_text() {
        for salt in [None, Some(0), Some(0xf), Some(0x10), Some(u64::MAX)] {
            let meta = Meta {
                id: "chatcmpl-0".into(),
                model: "m".into(),
                created: 0,
                stream: "chatcmpl-0".into(),
                salt,
                request: "chatcmpl-0".into(),
            };
            for i in [0, 1, 9, 10, 99, 100, 12_345, u64::MAX] {
                let mut text = String::new();
                meta.write_token(i, &mut text).unwrap();
                assert_eq!(meta.token_len(i), text.len(), "token {i}, salt {salt:?}");
            }
        }
    }
}
