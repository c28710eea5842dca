//! The same contract built the way people do today, without this crate: axum's `Sse` with
//! `KeepAlive`, a tokio mpsc channel between the decode loop and the response, and a
//! `CancellationToken` whose `DropGuard` lives in the response stream. Short and honest: what a
//! careful hand-rolled server looks like, for the benchmarks to compare against.
//!
//! ```text
//! cargo run --release --example baseline_serve -- --addr 127.0.0.1:0 [--step-ms MS]
//!     [--stall-at N --stall-ms MS] [--buffer-events N] [--heartbeat-ms MS] [--kv-blocks N]
//! ```
//!
//! `POST /v1/chat/completions` (streaming only) writes the same events as `streamgate sim`: the
//! same chunk JSON (`id`, `created`, `model`, the assistant role in the first delta, token i's
//! text `"t{i} "`), `id: i` lines, the final chunk (`finish_reason` `length`) and `[DONE]`; only
//! the `:control` line sim marks its final chunk with (the crate's kind mark, a comment) is
//! missing. The worker decodes one token every `--step-ms`, stalls before token `--stall-at` for
//! `--stall-ms`, and holds one KV block per 16 tokens from a pool of `--kv-blocks`, freed when
//! it stops: a `max_tokens` past what the pool holds is served as many tokens as it holds, a
//! full pool is a 503, and a pool that runs out mid-stream an error event. `GET /stats` has sim's stream and KV fields. It serves
//! with `axum::serve` on a `tokio::net::TcpListener` with sim's backlog (1024), setting
//! `TCP_NODELAY` on every connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use serde::Serialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Stats {
    streams_started: AtomicU64,
    streams_completed: AtomicU64,
    streams_cancelled: AtomicU64,
    streams_failed: AtomicU64,
    generators_running: AtomicU64,
    kv_blocks_in_use: AtomicU64,
    tokens_generated: AtomicU64,
    tokens_after_cancel: AtomicU64,
}

struct Config {
    step: Duration,
    stall_at: Option<u64>,
    stall: Duration,
    buffer: usize,
    heartbeat: Duration,
    kv_blocks: u64,
}

struct App {
    config: Config,
    stats: Stats,
    next_id: AtomicU64,
}

impl App {
    /// One block from the KV pool, unless every block is held.
    fn take_block(&self) -> Result<(), u64> {
        let total = self.config.kv_blocks;
        let take = |n| (n < total).then_some(n + 1);
        self.stats
            .kv_blocks_in_use
            .fetch_update(SeqCst, SeqCst, take)
            .map(|_| ())
    }
}

/// An OpenAI chat completion chunk, as `streamgate sim` writes it (the fields in the order of
/// the OpenAI API reference, `logprobs` always `null`).
#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [Choice<'a>; 1],
}

#[derive(Serialize)]
struct Choice<'a> {
    index: u32,
    delta: Delta<'a>,
    /// `null`.
    logprobs: (),
    finish_reason: Option<&'static str>,
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

fn error(status: StatusCode, message: &str, kind: &str) -> Response {
    let body = json!({"error": {"message": message, "type": kind}});
    (status, axum::Json(body)).into_response()
}

async fn chat(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid JSON",
            "invalid_request_error",
        );
    };
    let max_tokens = match request.get("max_tokens").and_then(Value::as_u64) {
        None => 16,
        // As sim: no more tokens than the whole pool holds.
        Some(n @ 1..=1_000_000) => n.min(app.config.kv_blocks.saturating_mul(16)),
        Some(_) => {
            let message = "`max_tokens` must be an integer from 1 to 1000000";
            return error(StatusCode::BAD_REQUEST, message, "invalid_request_error");
        }
    };
    if app.take_block().is_err() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "KV cache full",
            "server_error",
        );
    }
    let model = request["model"]
        .as_str()
        .unwrap_or("streamgate-sim")
        .to_owned();
    let id = format!("chatcmpl-{}", app.next_id.fetch_add(1, SeqCst));
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Event>(app.config.buffer);
    let token = CancellationToken::new();
    let cancelled = token.clone();
    app.stats.streams_started.fetch_add(1, SeqCst);
    app.stats.generators_running.fetch_add(1, SeqCst);
    let worker = app.clone();
    tokio::spawn(async move {
        let (config, stats) = (&worker.config, &worker.stats);
        let chunk = |i: u64, content: Option<&str>, finish_reason| {
            let role = (i == 0 && content.is_some()).then_some("assistant");
            let choices = [Choice {
                index: 0,
                delta: Delta { role, content },
                logprobs: (),
                finish_reason,
            }];
            let chunk = Chunk {
                id: &id,
                object: "chat.completion.chunk",
                created,
                model: &model,
                choices,
            };
            Event::default()
                .id(i.to_string())
                .json_data(chunk)
                .expect("a chunk serializes")
        };
        let cancelled = &cancelled;
        let pause = |duration| async move {
            // A client gone is checked first: no token is made for it.
            tokio::select! {
                biased;
                () = cancelled.cancelled() => false,
                () = tokio::time::sleep(duration) => true,
            }
        };
        let (mut held, mut ended) = (1, &stats.streams_completed);
        'generate: {
            for i in 0..max_tokens {
                if (config.stall_at == Some(i) && !pause(config.stall).await)
                    || (!config.step.is_zero() && !pause(config.step).await)
                {
                    ended = &stats.streams_cancelled;
                    break 'generate;
                }
                if i > 0 && i % 16 == 0 {
                    if let Err(in_use) = worker.take_block() {
                        let message = format!(
                            "KV cache full: {in_use} of {} blocks in use: the generation stopped \
                             after {i} tokens and gave back the blocks it held ({held})",
                            config.kv_blocks
                        );
                        let body = json!({"error": {"message": message, "type": "server_error", "code": "kv_cache_exhausted"}});
                        let _ = tx
                            .send(Event::default().id(i.to_string()).data(body.to_string()))
                            .await;
                        ended = &stats.streams_failed;
                        break 'generate;
                    }
                    held += 1;
                }
                stats.tokens_generated.fetch_add(1, SeqCst);
                let text = format!("t{i} ");
                let sent = tokio::select! {
                    biased;
                    () = cancelled.cancelled() => false,
                    sent = tx.send(chunk(i, Some(&text), None)) => sent.is_ok(),
                };
                if !sent {
                    stats.tokens_after_cancel.fetch_add(1, SeqCst);
                    ended = &stats.streams_cancelled;
                    break 'generate;
                }
            }
            let finish = chunk(max_tokens, None, Some("length"));
            let done = Event::default()
                .id((max_tokens + 1).to_string())
                .data("[DONE]");
            if tx.send(finish).await.is_err() || tx.send(done).await.is_err() {
                ended = &stats.streams_cancelled;
            }
        }
        stats.kv_blocks_in_use.fetch_sub(held, SeqCst);
        ended.fetch_add(1, SeqCst);
        stats.generators_running.fetch_sub(1, SeqCst);
    });
    // The guard cancels the worker when axum drops the response stream (client gone).
    let guard = token.drop_guard();
    let events = futures_util::stream::poll_fn(move |cx| {
        let _keep = &guard;
        rx.poll_recv(cx)
            .map(|event| event.map(Ok::<_, std::convert::Infallible>))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(app.config.heartbeat))
        .into_response()
}

async fn stats(State(app): State<Arc<App>>) -> Response {
    let load = |n: &AtomicU64| n.load(SeqCst);
    let stats = &app.stats;
    axum::Json(json!({
        "streams_started": load(&stats.streams_started),
        "streams_completed": load(&stats.streams_completed),
        "streams_cancelled": load(&stats.streams_cancelled),
        "streams_failed": load(&stats.streams_failed),
        "streams_ended_slow_consumer": 0,
        "generators_running": load(&stats.generators_running),
        "kv_blocks_in_use": load(&stats.kv_blocks_in_use),
        "tokens_generated": load(&stats.tokens_generated),
        "tokens_after_cancel": load(&stats.tokens_after_cancel),
    }))
    .into_response()
}

#[tokio::main]
async fn main() {
    let mut addr = "127.0.0.1:8001".to_owned();
    let mut config = Config {
        step: Duration::from_millis(5),
        stall_at: None,
        stall: Duration::ZERO,
        buffer: 64,
        heartbeat: Duration::from_secs(15),
        kv_blocks: 4096,
    };
    let mut args = std::env::args().skip(1);
    while let (Some(flag), Some(value)) = (args.next(), args.next()) {
        let number = || {
            value
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{flag}: `{value}` is not a number"))
        };
        match flag.as_str() {
            "--addr" => addr = value.clone(),
            "--step-ms" => config.step = Duration::from_millis(number()),
            "--stall-at" => config.stall_at = Some(number()),
            "--stall-ms" => config.stall = Duration::from_millis(number()),
            "--buffer-events" => config.buffer = number().max(1) as usize,
            "--heartbeat-ms" => config.heartbeat = Duration::from_millis(number().max(1)),
            "--kv-blocks" => config.kv_blocks = number(),
            _ => panic!("unknown flag {flag}"),
        }
    }
    let app = Arc::new(App {
        config,
        stats: Stats::default(),
        next_id: AtomicU64::new(0),
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/stats", get(stats))
        .with_state(app);
    // `TcpListener::bind` listens with a backlog of 128: a burst of connects overflows it and
    // waits for a SYN retransmit (1 s). A careful user raises it, to sim's 1024.
    let addr: std::net::SocketAddr = addr.parse().expect("--addr IP:PORT");
    let socket = match addr {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .expect("socket");
    socket.set_reuseaddr(true).expect("SO_REUSEADDR");
    socket.bind(addr).expect("bind");
    let listener = socket.listen(1024).expect("listen");
    println!("listening on http://{}", listener.local_addr().unwrap());
    let listener = listener.tap_io(|tcp| {
        if let Err(error) = tcp.set_nodelay(true) {
            eprintln!("TCP_NODELAY: {error}");
        }
    });
    axum::serve(listener, app).await.unwrap();
}
