//! The reference server (`streamgate sim`) against its contract, over real sockets: a raw
//! HTTP client on 127.0.0.1, one that disconnects, one that stops reading; and its KV pool's
//! limits, which it names when it refuses or ends a stream.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::reference::{self, start, until_paused};
use common::{HANG, LONG, RawResponse, stats, wait_for, wait_for_within};
use serde_json::Value;
use streamgate_cli::{serve, serving};
use tokio::time::{Instant, sleep, timeout};

fn chat(max_tokens: u64, stream: bool) -> String {
    format!(
        r#"{{"model":"sim","messages":[{{"role":"user","content":"hi"}}],"stream":{stream},"max_tokens":{max_tokens}}}"#
    )
}

/// The data of an SSE frame (after its `id:` line), parsed as JSON.
fn chunk(frame: &str) -> Value {
    let data = frame
        .lines()
        .find_map(|line| line.strip_prefix("data: "))
        .expect("a data frame");
    serde_json::from_str(data).expect("JSON data")
}

/// The `id:` of an SSE frame.
fn frame_id(frame: &str) -> Option<u64> {
    frame
        .lines()
        .find_map(|line| line.strip_prefix("id: "))
        .and_then(|id| id.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_one_event_per_token_in_order() {
    let addr = start(&["--step-ms", "1"]);
    let mut response = RawResponse::post_json(addr, "/v1/chat/completions", &chat(20, true)).await;
    assert_eq!(response.status(), 200);
    common::assert_sse_headers(&response);
    for i in 0..20 {
        // One HTTP chunk per event.
        let frame = String::from_utf8(response.next_chunk().await.expect("a chunk")).unwrap();
        assert_eq!(frame_id(&frame), Some(i), "token i is event i");
        let chunk = chunk(&frame);
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["choices"][0]["delta"]["content"], format!("t{i} "));
        assert_eq!(chunk["choices"][0]["finish_reason"], Value::Null);
        if i == 0 {
            assert_eq!(chunk["choices"][0]["delta"]["role"], "assistant");
        }
    }
    let last = response.expect_frame().await;
    assert_eq!(frame_id(&last), Some(20));
    assert_eq!(chunk(&last)["choices"][0]["finish_reason"], "length");
    // The final chunk is marked control for a hop that decodes the stream (`[DONE]` needs no
    // mark: any decoder knows it).
    assert!(last.starts_with(":control\nid: 20\n"), "{last}");
    assert_eq!(response.expect_frame().await, "id: 21\ndata: [DONE]\n\n");
    assert!(response.rest().await.is_empty());
    let stats = wait_for(addr, "the stream completes", |s| {
        s["streams_completed"] == 1
    })
    .await;
    assert_eq!(stats["tokens_generated"], 20);
    assert_eq!(stats["kv_blocks_in_use"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_without_streaming_and_refuses_bad_requests() {
    let addr = start(&["--step-ms", "0"]);
    let mut response = RawResponse::post_json(addr, "/v1/chat/completions", &chat(3, false)).await;
    assert_eq!(response.status(), 200);
    let body: Value = serde_json::from_str(&response.text().await).unwrap();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["content"], "t0 t1 t2 ");
    let mut health = RawResponse::get(addr, "/health", "").await;
    assert_eq!(
        (health.status(), health.text().await),
        (200, r#"{"status":"ok"}"#.into())
    );
    let mut models = RawResponse::get(addr, "/v1/models", "").await;
    assert_eq!(models.status(), 200);
    let models: Value = serde_json::from_str(&models.text().await).unwrap();
    assert_eq!(models["data"][0]["id"], "streamgate-sim", "{models}");
    for bad in [
        "{not json",
        r#"{"model":"sim","stream":true}"#,
        r#"{"messages":[],"max_tokens":0}"#,
        r#"{"messages":[],"max_tokens":1000001}"#,
        r#"{"messages":[],"max_tokens":"ten"}"#,
    ] {
        let mut response = RawResponse::post_json(addr, "/v1/chat/completions", bad).await;
        assert_eq!(response.status(), 400, "{bad}");
        let body: Value = serde_json::from_str(&response.text().await).unwrap();
        assert_eq!(body["error"]["type"], "invalid_request_error", "{bad}");
        assert!(body["error"]["message"].is_string());
    }
}

/// The JSON body of a response with a length.
async fn json_body(response: &mut RawResponse) -> Value {
    serde_json::from_str(&response.text().await).expect("a JSON body")
}

/// A `max_tokens` whose blocks the whole KV pool could never hold (one block per 16 tokens) is
/// served as many tokens as the pool holds, ending with `finish_reason` `length`; the contract's
/// own limits (1 to 1,000,000) are refused with a 400 that says them, before anything is
/// generated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_max_tokens_past_the_kv_pool_is_served_up_to_what_the_pool_holds() {
    // 4 blocks of 16 tokens: a request for 65 tokens gets 64 and `finish_reason: length`.
    let addr = start(&["--step-ms", "0", "--kv-blocks", "4"]);
    let mut response = RawResponse::post_json(addr, "/v1/chat/completions", &chat(65, true)).await;
    assert_eq!(response.status(), 200);
    let events = response.rest().await;
    assert_eq!(events.last().unwrap(), "id: 65\ndata: [DONE]\n\n");
    let last_chunk = &events[events.len() - 2];
    assert!(last_chunk.contains("id: 64\n"), "{last_chunk}");
    assert!(
        last_chunk.contains(r#""finish_reason":"length""#),
        "{last_chunk}"
    );
    assert!(
        !events.iter().any(|e| e.contains("t64 ")),
        "a token past the pool"
    );
    let mut response = RawResponse::post_json(addr, "/v1/chat/completions", &chat(65, false)).await;
    assert_eq!(response.status(), 200);
    let body = json_body(&mut response).await;
    assert_eq!(body["usage"]["completion_tokens"], 64, "{body}");
    let mut response = RawResponse::get(addr, "/v1/stream?max_tokens=65", "").await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.rest().await.last().unwrap(),
        "id: 65\ndata: [DONE]\n\n"
    );
    let done = wait_for(addr, "the streams complete", |s| {
        s["streams_completed"] == 3
    })
    .await;
    assert_eq!(done["streams_failed"], 0, "{done}");
    assert_eq!(done["tokens_generated"], 3 * 64, "{done}");

    // The contract's limits stand: 0 and over 1,000,000 are refused.
    let addr = start(&["--step-ms", "0"]);
    for max_tokens in [0, 1_000_001] {
        let mut response =
            RawResponse::post_json(addr, "/v1/chat/completions", &chat(max_tokens, true)).await;
        assert_eq!(response.status(), 400);
        let error = &json_body(&mut response).await["error"];
        assert!(
            error["message"].as_str().unwrap().contains("1 to 1000000"),
            "{error}"
        );
    }
    assert_eq!(stats(addr).await["streams_started"], 0);
}

/// A pool whose every block other streams hold refuses a new request with 503, saying how full
/// it is (the OpenAI SDKs retry a 503); a block given back serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_kv_pool_refuses_with_503_saying_how_full_it_is() {
    // A stream of 32 tokens takes its second block at token 16, then stalls at 20.
    let flags = [
        "--step-ms",
        "1",
        "--kv-blocks",
        "2",
        "--stall-at",
        "20",
        "--stall-ms",
        "60000",
    ];
    let addr = start(&flags);
    let mut holder = RawResponse::post_json(addr, "/v1/chat/completions", &chat(32, true)).await;
    for _ in 0..20 {
        holder.expect_frame().await;
    }
    wait_for(addr, "the pool is taken", |s| s["kv_blocks_in_use"] == 2).await;
    for stream in [true, false] {
        let mut response =
            RawResponse::post_json(addr, "/v1/chat/completions", &chat(16, stream)).await;
        assert_eq!(response.status(), 503, "stream: {stream}");
        assert_eq!(response.header("retry-after").as_deref(), Some("1"));
        let error = &json_body(&mut response).await["error"];
        assert_eq!(error["type"], "server_error");
        assert_eq!(error["code"], "kv_cache_full");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.starts_with("KV cache full: 2 of 2 blocks in use"),
            "{message}"
        );
    }
    let refused = RawResponse::get(addr, "/v1/stream?max_tokens=16", "").await;
    assert_eq!(refused.status(), 503);
    let stats = stats(addr).await;
    assert_eq!(stats["requests_refused_kv_full"], 3, "{stats}");
    assert_eq!(stats["streams_started"], 1, "{stats}");

    drop(holder);
    wait_for(addr, "the holder's blocks are back", |s| {
        s["kv_blocks_in_use"] == 0 && s["generators_running"] == 0
    })
    .await;
    let mut served = RawResponse::post_json(addr, "/v1/chat/completions", &chat(16, false)).await;
    assert_eq!(served.status(), 200);
    assert_eq!(
        json_body(&mut served).await["choices"][0]["finish_reason"],
        "length"
    );
}

/// A stream that needs a block while other streams hold the rest of the pool stops: its client
/// gets an OpenAI-style error event naming the exhausted KV cache, then the terminal frame; its
/// blocks are given back, and `/stats` counts it as failed, not cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_runs_out_of_kv_blocks_mid_generation_says_so() {
    // Each stream of 48 tokens fits the pool alone; the first takes two blocks and stalls at 20.
    let flags = common::STARVED_KV;
    let addr = start(&flags);
    let holder = common::hold_two_kv_blocks(addr).await;

    // The third block is this stream's first; it needs a fourth at token 16.
    let mut starved = RawResponse::post_json(addr, "/v1/chat/completions", &chat(48, true)).await;
    assert_eq!(starved.status(), 200);
    let frames = starved.rest().await;
    let n = frames.len();
    assert_eq!(
        n, 18,
        "16 tokens, the error event, the terminal frame: {frames:?}"
    );
    assert!(frames[15].contains(r#""t15 ""#), "{frames:?}");
    let error = frames[16]
        .lines()
        .find_map(|line| line.strip_prefix("data: "))
        .expect("a data line");
    assert!(
        frames[16].starts_with(":control\nid: 16\n"),
        "{}",
        frames[16]
    );
    let error: Value = serde_json::from_str(error).unwrap();
    assert_eq!(error["error"]["type"], "server_error");
    assert_eq!(error["error"]["code"], "kv_cache_exhausted");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "KV cache full: 3 of 3 blocks in use: the generation stopped after 16 tokens"
        ),
        "{message}"
    );
    assert!(frames[17].starts_with("event: error\n"), "{}", frames[17]);
    assert!(
        frames[17].contains(r#""type":"generator_error""#),
        "{}",
        frames[17]
    );

    // Without streaming: 503 with the same error.
    let mut answer = RawResponse::post_json(addr, "/v1/chat/completions", &chat(48, false)).await;
    assert_eq!(answer.status(), 503);
    let error = &json_body(&mut answer).await["error"];
    assert_eq!(error["code"], "kv_cache_exhausted", "{error}");

    let stats = wait_for(addr, "both starved streams are released", |s| {
        s["streams_failed"] == 2 && s["generators_running"] == 1
    })
    .await;
    assert_eq!(stats["streams_kv_exhausted"], 2, "{stats}");
    assert_eq!(stats["streams_cancelled"], 0, "{stats}");
    assert_eq!(stats["kv_blocks_in_use"], 2, "only the holder's: {stats}");
    drop(holder);
    let stats = wait_for(addr, "the holder is released", |s| {
        s["generators_running"] == 0 && s["kv_blocks_in_use"] == 0
    })
    .await;
    assert_eq!(stats["streams_cancelled"], 1, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_flow_during_a_decode_stall() {
    let addr = start(&[
        "--step-ms",
        "1",
        "--stall-at",
        "2",
        "--stall-ms",
        "400",
        "--heartbeat-ms",
        "50",
    ]);
    let mut response = RawResponse::post_json(addr, "/v1/chat/completions", &chat(4, true)).await;
    let frames = response.rest().await;
    let contents: Vec<&str> = frames.iter().map(String::as_str).collect();
    let stall = contents.iter().position(|f| f.contains("\"t1 \"")).unwrap();
    let resume = contents.iter().position(|f| f.contains("\"t2 \"")).unwrap();
    let beats = contents[stall + 1..resume]
        .iter()
        .filter(|f| **f == ":\n")
        .count();
    assert!(
        beats >= 2,
        "heartbeats during the 400 ms stall: {contents:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnect_stops_the_generator_and_frees_its_kv_blocks() {
    let addr = start(&["--step-ms", "1"]);
    let mut response =
        RawResponse::post_json(addr, "/v1/chat/completions", &chat(LONG, true)).await;
    for _ in 0..40 {
        response.expect_frame().await;
    }
    assert_eq!(stats(addr).await["generators_running"], 1);
    assert!(stats(addr).await["kv_blocks_in_use"].as_u64().unwrap() >= 3);
    drop(response);
    let stats = wait_for(addr, "the generator stops", |s| {
        s["generators_running"] == 0 && s["kv_blocks_in_use"] == 0
    })
    .await;
    assert_eq!(stats["streams_cancelled"], 1);
    assert!(
        stats["tokens_after_cancel"].as_u64().unwrap() <= 1,
        "{stats}"
    );
    // The gate measured this stream's end to its release (set before the release hook lowers
    // `generators_running`, so it is in by now).
    assert!(stats["end_to_release_max_us"].as_u64() > Some(0), "{stats}");
}

/// Starts a stream whose client reads the first event and then stops reading; returns the
/// server's address and the open response.
async fn stopped_reader(flags: &[&str]) -> (SocketAddr, RawResponse) {
    let addr = start(flags);
    let mut response =
        RawResponse::post_json(addr, "/v1/chat/completions", &chat(LONG, true)).await;
    response.expect_frame().await;
    (addr, response)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_reader_pauses_the_generator_under_backpressure() {
    let (addr, _response) = stopped_reader(&["--step-ms", "0", "--sndbuf", "16384"]).await;
    let stats = until_paused(addr).await;
    assert_eq!(stats["generators_running"], 1, "paused, not ended");
    // The gate holds 64 events; the kernel, a bounded send buffer and the client's window.
    let tokens = stats["tokens_generated"].as_u64().unwrap();
    assert!(tokens < 3_000, "bounded run ahead: {tokens} tokens");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_reader_is_coalesced_within_the_byte_bound() {
    let flags = [
        "--step-ms",
        "0",
        "--sndbuf",
        "16384",
        "--policy",
        "coalesce",
        "--buffer-bytes",
        "4096",
    ];
    let (addr, _response) = stopped_reader(&flags).await;
    let stats = until_paused(addr).await;
    assert_eq!(stats["generators_running"], 1);
    // Paused, not running to the 65,536 tokens asked for. Merged events carry many tokens per
    // byte, so the bound is in bytes: 4 KiB in the gate plus the kernel's buffers (a 32 KiB
    // send buffer and the client's receive window, ~200 KiB), at 5 or more bytes per token.
    let tokens = stats["tokens_generated"].as_u64().unwrap();
    assert!(
        tokens < 45_000,
        "bounded by the byte bounds: {tokens} tokens"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_reader_is_disconnected_after_the_deadline() {
    let flags = [
        "--step-ms",
        "0",
        "--sndbuf",
        "16384",
        "--policy",
        "disconnect",
        "--slow-deadline-ms",
        "300",
    ];
    let (addr, _response) = stopped_reader(&flags).await;
    let stopped = Instant::now();
    // The reader stopped after its first event: the buffer is full within milliseconds, and the
    // 300 ms deadline ends the stream then, not before and not long after.
    let limit = Duration::from_secs(2);
    let stats = wait_for_within(addr, "the policy ends the stream", limit, |s| {
        s["streams_ended_slow_consumer"] == 1 && s["generators_running"] == 0
    })
    .await;
    let ended_after = stopped.elapsed();
    assert!(
        ended_after >= Duration::from_millis(300),
        "ended {ended_after:?} after the reader stopped"
    );
    assert_eq!(stats["kv_blocks_in_use"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_after_last_event_id() {
    let addr = start(&["--step-ms", "0"]);
    let mut response = RawResponse::get(addr, "/v1/stream?max_tokens=6", "").await;
    assert_eq!(
        response.header("access-control-allow-origin").as_deref(),
        Some("*")
    );
    let first = response.expect_frame().await;
    assert!(first.starts_with("id: 0\n"), "{first}");
    drop(response);
    let mut resumed =
        RawResponse::get(addr, "/v1/stream?max_tokens=6", "Last-Event-ID: 3\r\n").await;
    let frames = resumed.rest().await;
    assert!(
        frames[0].starts_with("id: 4\n") && frames[0].contains("\"t4 \""),
        "{frames:?}"
    );
    assert!(frames[1].starts_with("id: 5\n") && frames[1].contains("\"t5 \""));
    assert!(
        frames[2].starts_with(":control\nid: 6\n")
            && frames[2].contains("\"finish_reason\":\"length\"")
    );
    assert_eq!(frames[3], "id: 7\ndata: [DONE]\n\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_gap_histograms_and_hop_records() {
    let records = std::env::temp_dir().join(format!("serve-records-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&records);
    let addr = start(&["--step-ms", "1", "--hop-records", records.to_str().unwrap()]);
    let mut response = RawResponse::post_json(addr, "/v1/chat/completions", &chat(10, true)).await;
    response.rest().await;
    wait_for(addr, "the stream completes", |s| {
        s["generators_running"] == 0
    })
    .await;
    let mut metrics = RawResponse::get(addr, "/metrics", "").await;
    let page = metrics.text().await;
    for hop in ["worker.decode", "worker.publish", "worker.write"] {
        let series = format!("streamgate_gap_seconds_count{{hop=\"{hop}\"}}");
        assert!(page.contains(&series), "{series} in\n{page}");
    }
    // Hop records reach the file as soon as the writer is idle.
    let deadline = Instant::now() + HANG;
    loop {
        let text = std::fs::read_to_string(&records).unwrap_or_default();
        let hops = ["worker.decode", "worker.publish", "worker.write"];
        let counts: Vec<usize> = hops
            .iter()
            .map(|hop| {
                text.lines()
                    .filter(|l| l.contains(&format!("\"hop\":\"{hop}\"")))
                    .count()
            })
            .collect();
        if counts[0] >= 10 && counts[1] >= 10 && counts[2] >= 12 {
            break;
        }
        assert!(Instant::now() < deadline, "hop records: {counts:?}");
        sleep(Duration::from_millis(20)).await;
    }
    let _ = std::fs::remove_file(&records);
}

/// Serves a server with `flags` as its `main` does, until the returned sender fires (the
/// signal handler's part); the task returns what `serve_until` returned.
fn serve_until_stopped(
    flags: &[&str],
) -> (
    SocketAddr,
    Arc<serve::Server>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (addr, server, served) = reference::serve_until(flags, async move {
        stopped.await.ok();
    });
    (addr, server, stop, served)
}

/// SIGINT/SIGTERM (here: the stop future the signal handler completes): every open stream,
/// even one kept alive by heartbeats during a decode stall, gets its terminal frame, every
/// generator is released, and the server returns well within its grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_ends_every_open_stream_visibly() {
    let (addr, server, stop, served) = serve_until_stopped(&[
        "--step-ms",
        "1",
        "--stall-at",
        "3",
        "--stall-ms",
        "600000",
        "--heartbeat-ms",
        "50",
    ]);
    let streams = server.streams().clone();
    let mut responses = Vec::new();
    for _ in 0..3 {
        let mut response =
            RawResponse::post_json(addr, "/v1/chat/completions", &chat(100, true)).await;
        for _ in 0..3 {
            chunk(&response.expect_frame().await);
        }
        // The worker stalls; heartbeats keep the stream open.
        assert_eq!(response.expect_frame().await, ":\n");
        responses.push(response);
    }
    assert_eq!(streams.stats().gates, 3);
    let asked = Instant::now();
    stop.send(()).unwrap();
    for mut response in responses {
        let rest = response.rest().await;
        let last = rest.last().expect("a terminal frame");
        assert!(
            last.starts_with("event: error\ndata: ") && last.contains(r#""type":"shutdown""#),
            "{rest:?}"
        );
    }
    timeout(HANG, served)
        .await
        .expect("the server returns")
        .unwrap()
        .expect("served");
    assert!(asked.elapsed() < serving::SHUTDOWN_GRACE);
    assert_eq!(streams.stats().gates, 0, "every stream was released");
}

/// A client that stopped reading holds its connection's last bytes in the kernel for ever; the
/// shutdown ends its stream, gives the connection a short drain, and returns anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_is_not_held_by_a_reader_that_stopped() {
    let (addr, server, stop, served) =
        serve_until_stopped(&["--step-ms", "0", "--sndbuf", "16384"]);
    let streams = server.streams().clone();
    let mut reader = RawResponse::post_json(addr, "/v1/chat/completions", &chat(LONG, true)).await;
    chunk(&reader.expect_frame().await);
    // The reader stops: the kernel's buffers fill, then the gate's, and the generator waits.
    let paused = until_paused(addr).await;
    assert_eq!(paused["generators_running"], 1, "{paused}");
    let asked = Instant::now();
    stop.send(()).unwrap();
    timeout(HANG, served)
        .await
        .expect("the server returns")
        .unwrap()
        .expect("served");
    let limit = serving::SHUTDOWN_GRACE + serving::DRAIN_LIMIT;
    assert!(asked.elapsed() < limit, "{:?}", asked.elapsed());
    assert_eq!(streams.stats().gates, 0, "the stream was released");
    drop(reader);
}
