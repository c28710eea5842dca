//! The same contract built the way people do today, without this crate: axum's `Sse` with
//! `KeepAlive`, a tokio mpsc channel between the decode loop and the response, and a
//! `CancellationToken` whose `DropGuard` lives in the response stream. Short and honest: what a
//! careful hand-rolled server looks like, for the benchmarks to compare against.
//!
//! `cargo run --release --example baseline_serve -- --addr 127.0.0.1:0 [--step-ms MS] [--buffer-events N] [--heartbeat-ms MS] [--kv-blocks N]`
//!
//! `POST /v1/chat/completions` (streaming only) and `GET /stats` with the same fields as
//! `streamgate sim`. It binds with `tokio::net::TcpListener` and `axum::serve`, as most servers
//! do.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Stats {
    streams_started: AtomicU64,
    streams_completed: AtomicU64,
    streams_cancelled: AtomicU64,
    generators_running: AtomicU64,
    kv_blocks_in_use: AtomicU64,
    tokens_generated: AtomicU64,
    tokens_after_cancel: AtomicU64,
}

struct Config {
    step: Duration,
    buffer: usize,
    heartbeat: Duration,
    kv_blocks: u64,
}

async fn chat(State((config, stats)): State<(Arc<Config>, Arc<Stats>)>, body: Bytes) -> Response {
    let request: Value = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(_) => return (StatusCode::BAD_REQUEST, "invalid JSON").into_response(),
    };
    let max_tokens = request["max_tokens"]
        .as_u64()
        .unwrap_or(16)
        .clamp(1, 1_000_000);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(config.buffer);
    let token = CancellationToken::new();
    let cancelled = token.clone();
    stats.streams_started.fetch_add(1, Ordering::Relaxed);
    stats.generators_running.fetch_add(1, Ordering::Relaxed);
    let worker_stats = stats.clone();
    let step = config.step;
    let kv_blocks = config.kv_blocks;
    tokio::spawn(async move {
        let stats = worker_stats;
        let mut held = 0;
        let mut completed = true;
        for i in 0..max_tokens {
            if !step.is_zero() {
                tokio::select! {
                    _ = cancelled.cancelled() => { completed = false; break; }
                    _ = tokio::time::sleep(step) => {}
                }
            }
            if i % 16 == 0 && stats.kv_blocks_in_use.load(Ordering::SeqCst) < kv_blocks {
                stats.kv_blocks_in_use.fetch_add(1, Ordering::SeqCst);
                held += 1;
            }
            stats.tokens_generated.fetch_add(1, Ordering::Relaxed);
            let chunk = json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": format!("t{i} ")}, "finish_reason": null}]});
            tokio::select! {
                _ = cancelled.cancelled() => {
                    stats.tokens_after_cancel.fetch_add(1, Ordering::Relaxed);
                    completed = false;
                    break;
                }
                sent = tx.send(chunk.to_string()) => if sent.is_err() {
                    stats.tokens_after_cancel.fetch_add(1, Ordering::Relaxed);
                    completed = false;
                    break;
                }
            }
        }
        if completed {
            let last = json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]});
            let _ = tx.send(last.to_string()).await;
            let _ = tx.send("[DONE]".to_owned()).await;
        }
        stats.kv_blocks_in_use.fetch_sub(held, Ordering::SeqCst);
        let ended = if completed {
            &stats.streams_completed
        } else {
            &stats.streams_cancelled
        };
        ended.fetch_add(1, Ordering::Relaxed);
        stats.generators_running.fetch_sub(1, Ordering::SeqCst);
    });
    // The guard cancels the worker when axum drops the response stream (client gone).
    let guard = token.drop_guard();
    let events = futures_util::stream::poll_fn(move |cx| {
        let _keep = &guard;
        rx.poll_recv(cx)
            .map(|data| data.map(|data| Ok::<_, Infallible>(Event::default().data(data))))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(config.heartbeat))
        .into_response()
}

async fn stats(State((_, stats)): State<(Arc<Config>, Arc<Stats>)>) -> Response {
    let load = |n: &AtomicU64| n.load(Ordering::SeqCst);
    let body = json!({
        "streams_started": load(&stats.streams_started),
        "streams_completed": load(&stats.streams_completed),
        "streams_cancelled": load(&stats.streams_cancelled),
        "streams_ended_slow_consumer": 0,
        "generators_running": load(&stats.generators_running),
        "kv_blocks_in_use": load(&stats.kv_blocks_in_use),
        "tokens_generated": load(&stats.tokens_generated),
        "tokens_after_cancel": load(&stats.tokens_after_cancel),
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

#[tokio::main]
async fn main() {
    let mut addr = "127.0.0.1:8001".to_owned();
    let mut config = Config {
        step: Duration::from_millis(5),
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
            "--buffer-events" => config.buffer = number().max(1) as usize,
            "--heartbeat-ms" => config.heartbeat = Duration::from_millis(number().max(1)),
            "--kv-blocks" => config.kv_blocks = number(),
            _ => panic!("unknown flag {flag}"),
        }
    }
    let state = (Arc::new(config), Arc::new(Stats::default()));
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/stats", get(stats))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
    println!("listening on http://{}", listener.local_addr().unwrap());
    axum::serve(listener, app).await.unwrap();
}
