//! `streamgate proxy` in process, over real sockets on 127.0.0.1, in front of `streamgate sim`
//! (in process) and of a hostile upstream (`common/hostile.rs`): what a client sees, what
//! reaches the upstream, and the proxy's memory where an upstream sends too much.

mod common;
#[path = "common/hostile.rs"]
mod hostile;
#[path = "common/proxy_setup.rs"]
mod setup;

use std::path::PathBuf;
use std::time::Duration;

// `setup` names the raw client `crate::client`.
use common as client;

use client::{
    BodyEnd, HANG, RawResponse, STARVED_KV, assert_sse_headers, content, data, id, is_heartbeat,
    rss, stats, wait_for_within,
};
use hostile::{Case, Hostile};
use serde_json::Value;
use setup::{CHAT, chat, proxy_config, proxy_until, serve_proxy, start_proxy, start_sim, stream};
use streamgate::probe::{HopProbe, Observation, RecordSink};
use streamgate::timeline::Timeline;
use streamgate::{EndReason, Kind};
use streamgate_cli::proxy::InjectedStall;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep};

/// How far a proxy's memory may grow while an upstream sends far more (a hang would be its
/// whole body).
const MEMORY_BOUND: u64 = 64 * 1024 * 1024;

/// Memory measurements take turns: one test's big transfer must not count in another's.
static MEMORY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The visible text of `frames` (chat chunks' content, concatenated).
fn text(frames: &[String]) -> String {
    frames.iter().filter_map(|frame| content(frame)).collect()
}

fn sim_text(tokens: u64) -> String {
    (0..tokens).map(|i| format!("t{i} ")).collect()
}

/// The frame is the proxy's terminal upstream error frame, saying `why`.
fn assert_upstream_error(frame: &str, why: &str) {
    assert!(frame.starts_with("event: error\n"), "{frame}");
    let error: Value = serde_json::from_str(data(frame).unwrap()).unwrap();
    assert_eq!(error["error"]["type"], "upstream_error", "{frame}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains(why), "{message:?} should say {why:?}");
}

/// Reads a streamed response to its end: the frames that are not heartbeats, and how many
/// heartbeats came.
async fn events(response: &mut RawResponse) -> (Vec<String>, usize) {
    let frames = response.rest().await;
    let heartbeats = frames.iter().filter(|frame| is_heartbeat(frame)).count();
    let events = frames
        .into_iter()
        .filter(|frame| !is_heartbeat(frame))
        .collect();
    (events, heartbeats)
}

// ---------------------------------------------------------------- in front of `streamgate sim`

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_pass_through_in_order_with_the_streaming_headers() {
    let (sim, _) = start_sim(&["--step-ms", "1"]);
    let proxy = start_proxy(&format!("http://{sim}"), &[]);
    let mut response = stream(proxy, "x-request-id: in-order\r\n", 10).await;
    assert_eq!(response.status(), 200);
    assert_sse_headers(&response);
    assert_eq!(response.header("x-request-id").as_deref(), Some("in-order"));
    let (frames, _) = events(&mut response).await;
    assert_eq!(response.ended(), Some(BodyEnd::Complete));
    assert_eq!(frames.len(), 12, "{frames:?}");
    for (i, frame) in frames[..10].iter().enumerate() {
        assert_eq!(
            content(frame).as_deref(),
            Some(format!("t{i} ").as_str()),
            "{frame}"
        );
    }
    // Every event carries the proxy's id, its position in the stream.
    let ids: Vec<_> = frames.iter().map(|frame| id(frame)).collect();
    assert_eq!(ids, (0..12).map(Some).collect::<Vec<_>>());
    assert!(
        frames[10].contains(r#""finish_reason":"length""#),
        "{}",
        frames[10]
    );
    assert_eq!(data(&frames[11]), Some("[DONE]"));

    // The upstream's refusals pass through as they are.
    let mut refused = RawResponse::post(
        proxy,
        CHAT,
        "",
        r#"{"messages":[],"stream":true,"max_tokens":0}"#,
    )
    .await;
    assert_eq!(refused.status(), 400);
    assert!(refused.text().await.contains("invalid_request_error"));

    let stats = stats(proxy).await;
    assert_eq!(stats["streams_completed"], 1, "{stats}");
    assert_eq!(stats["streams_running"], 0, "{stats}");
    // The refusal is the request's own upstream failure, not an answer passed through.
    assert_eq!(stats["requests_passed_through"], 0, "{stats}");
    assert_eq!(stats["upstream_failures"]["request_error"], 1, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_frees_the_upstreams_generator_and_kv() {
    let (sim, _) = start_sim(&["--step-ms", "1"]);
    let proxy = start_proxy(&format!("http://{sim}"), &[]);
    let mut response = stream(proxy, "x-request-id: leaver\r\n", 50_000).await;
    for _ in 0..30 {
        response.expect_event().await;
    }
    let running = stats(sim).await;
    assert_eq!(running["generators_running"], 1, "{running}");
    assert!(
        running["kv_blocks_in_use"].as_u64().unwrap() > 0,
        "{running}"
    );
    let left = Instant::now();
    drop(response);
    // Within a second (it takes milliseconds): the generator would otherwise run for 50 s more.
    let freed = wait_for_within(sim, "sim's generator stops", Duration::from_secs(1), |s| {
        s["generators_running"] == 0 && s["kv_blocks_in_use"] == 0
    })
    .await;
    eprintln!(
        "sim freed its KV {:?} after the client left",
        left.elapsed()
    );
    assert_eq!(freed["streams_cancelled"], 1, "{freed}");
    assert!(
        freed["tokens_after_cancel"].as_u64().unwrap() <= 1,
        "{freed}"
    );
    let proxy_stats = wait_for_within(proxy, "the proxy's stream ends", HANG, |s| {
        s["streams_running"] == 0
    })
    .await;
    assert_eq!(
        proxy_stats["streams_ended"]["consumer_gone"], 1,
        "{proxy_stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_before_the_first_token_of_a_stalled_upstream() {
    let (sim, _) = start_sim(&["--step-ms", "1", "--stall-at", "0", "--stall-ms", "700"]);
    let proxy = start_proxy(&format!("http://{sim}"), &["--heartbeat-ms", "100"]);
    let mut response = stream(proxy, "", 3).await;
    let mut heartbeats = 0;
    let first = loop {
        let frame = response.expect_frame().await;
        if is_heartbeat(&frame) {
            heartbeats += 1;
        } else {
            break frame;
        }
    };
    assert_eq!(content(&first).as_deref(), Some("t0 "), "{first}");
    assert!(
        heartbeats >= 2,
        "{heartbeats} heartbeats during a 700 ms stall"
    );
    let (rest, _) = events(&mut response).await;
    assert_eq!(data(rest.last().unwrap()), Some("[DONE]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_stream_continues_the_same_generation() {
    let (sim, _) = start_sim(&["--step-ms", "2", "--token-salt"]);
    let proxy = start_proxy(&format!("http://{sim}"), &["--resume-grace-ms", "10000"]);
    let mut first = stream(proxy, "x-request-id: resumable\r\n", 200).await;
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(first.expect_event().await);
    }
    assert_eq!(id(&seen[4]), Some(4));
    drop(first);
    wait_for_within(proxy, "the stream detaches", HANG, |s| {
        s["streams_detached"] == 1
    })
    .await;
    let mut resumed = RawResponse::get(
        proxy,
        "/v1/chat/completions/resumable/stream",
        "Last-Event-ID: 4\r\n",
    )
    .await;
    assert_eq!(resumed.status(), 200);
    assert_eq!(resumed.header("x-request-id").as_deref(), Some("resumable"));
    let (rest, _) = events(&mut resumed).await;
    assert_eq!(id(&rest[0]), Some(5), "{}", rest[0]);
    assert_eq!(data(rest.last().unwrap()), Some("[DONE]"));
    seen.extend(rest);
    // One generation: token i is `t{i}.{salt} ` with one salt throughout, none missing.
    let tokens: Vec<String> = seen.iter().filter_map(|frame| content(frame)).collect();
    assert_eq!(tokens.len(), 200);
    let salt = tokens[0].trim().split_once('.').unwrap().1.to_owned();
    for (i, token) in tokens.iter().enumerate() {
        assert_eq!(token, &format!("t{i}.{salt} "), "token {i}");
    }
    let sim_stats = stats(sim).await;
    assert_eq!(
        sim_stats["streams_started"], 1,
        "the upstream was asked once: {sim_stats}"
    );
    // The finished stream stays replayable for the grace, from any position (`?after=n` too).
    let path = "/v1/chat/completions/resumable/stream?after=195";
    let mut replayed = RawResponse::get(proxy, path, "").await;
    let (again, _) = events(&mut replayed).await;
    assert_eq!(id(&again[0]), Some(196), "{}", again[0]);
    assert_eq!(content(&again[0]), content(&seen[196]));
    // An unknown stream is a 404 with an OpenAI error body.
    let mut unknown = RawResponse::get(proxy, "/v1/chat/completions/nope/stream", "").await;
    assert_eq!(unknown.status(), 404);
    assert!(unknown.text().await.contains("not_found_error"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grace_keeps_the_upstream_then_running_out_drops_it() {
    let (sim, _) = start_sim(&["--step-ms", "2"]);
    let proxy = start_proxy(&format!("http://{sim}"), &["--resume-grace-ms", "2000"]);
    let mut response = stream(proxy, "x-request-id: graced\r\n", 50_000).await;
    for _ in 0..5 {
        response.expect_event().await;
    }
    drop(response);
    // Detached, not cancelled: the upstream goes on into the replay log.
    let detached = wait_for_within(proxy, "the stream detaches", HANG, |s| {
        s["streams_detached"] == 1
    })
    .await;
    let detached_at = Instant::now();
    assert_eq!(detached["streams_running"], 1, "{detached}");
    assert_eq!(stats(sim).await["generators_running"], 1);
    // Then the 2 s grace runs out, in time, and the upstream is dropped.
    let limit = Duration::from_secs(4);
    let expired = wait_for_within(proxy, "the grace runs out", limit, |s| {
        s["streams_expired"] == 1
    })
    .await;
    let expired_after = detached_at.elapsed();
    assert!(
        expired_after >= Duration::from_millis(1800),
        "expired {expired_after:?} after the detach"
    );
    assert_eq!(expired["streams_detached"], 0, "{expired}");
    wait_for_within(sim, "sim's generator stops", HANG, |s| {
        s["generators_running"] == 0 && s["kv_blocks_in_use"] == 0
    })
    .await;
    let ended = wait_for_within(proxy, "the stream ends", HANG, |s| {
        s["streams_running"] == 0
    })
    .await;
    assert_eq!(ended["streams_ended"]["consumer_gone"], 1, "{ended}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_the_upstream_and_ends_with_a_final_chunk() {
    let (sim, _) = start_sim(&["--step-ms", "2"]);
    let proxy = start_proxy(&format!("http://{sim}"), &["--resume-grace-ms", "10000"]);
    let mut response = stream(proxy, "x-request-id: stop-me\r\n", 50_000).await;
    for _ in 0..5 {
        response.expect_event().await;
    }
    let mut cancel = RawResponse::post(proxy, "/v1/chat/completions/stop-me/cancel", "", "").await;
    assert_eq!(cancel.status(), 200);
    let answer: Value = serde_json::from_str(&cancel.text().await).unwrap();
    assert_eq!(answer["cancelled"], true);
    let (rest, _) = events(&mut response).await;
    let finish = &rest[rest.len() - 2];
    assert!(finish.contains(r#""finish_reason":"stop""#), "{finish}");
    assert!(finish.contains(r#""model":"sim""#), "{finish}");
    assert_eq!(data(rest.last().unwrap()), Some("[DONE]"));
    wait_for_within(sim, "sim's generator stops", HANG, |s| {
        s["generators_running"] == 0 && s["kv_blocks_in_use"] == 0
    })
    .await;
    let stats = wait_for_within(proxy, "the stream ends", HANG, |s| {
        s["streams_running"] == 0
    })
    .await;
    assert_eq!(stats["streams_ended"]["cancelled"], 1, "{stats}");
    let mut again = RawResponse::post(proxy, "/v1/chat/completions/unknown/cancel", "", "").await;
    assert_eq!(again.status(), 404);
    let _ = again.text().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_for_a_slow_client_loses_no_token() {
    let tokens = 3000;
    let (sim, _) = start_sim(&["--step-ms", "0"]);
    let proxy = start_proxy(
        &format!("http://{sim}"),
        &[
            "--policy",
            "coalesce",
            "--buffer-events",
            "4",
            "--sndbuf",
            "4096",
        ],
    );
    let request = client::post_request(proxy, CHAT, "", &chat(tokens));
    let mut response = RawResponse::send_small(proxy, &request, 4096).await;
    let first = response.expect_event().await;
    // The client stops reading while the upstream sends everything: what it has not read
    // merges in the proxy's small buffer instead of holding the upstream back.
    wait_for_within(sim, "the upstream sends everything", HANG, |s| {
        s["streams_completed"] == 1
    })
    .await;
    let (rest, _) = events(&mut response).await;
    let mut frames = vec![first];
    frames.extend(rest);
    assert_eq!(text(&frames), sim_text(tokens));
    assert!(
        frames.len() < tokens as usize,
        "{} frames: nothing was merged",
        frames.len()
    );
    assert_eq!(data(frames.last().unwrap()), Some("[DONE]"));
    assert!(frames[frames.len() - 2].contains(r#""finish_reason":"length""#));
    // Ids still say where each event ends: the last token's, then the final chunk's and [DONE]'s.
    let ids: Vec<u64> = frames.iter().filter_map(|frame| id(frame)).collect();
    assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "{ids:?}");
    assert_eq!(ids.last(), Some(&(tokens + 1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_is_no_idle_upstream() {
    let tokens = 2000;
    let (sim, _) = start_sim(&["--step-ms", "0"]);
    let flags = [
        "--upstream-idle-ms",
        "300",
        "--buffer-events",
        "4",
        "--sndbuf",
        "4096",
    ];
    let proxy = start_proxy(&format!("http://{sim}"), &flags);
    let request = client::post_request(proxy, CHAT, "", &chat(tokens));
    let mut response = RawResponse::send_small(proxy, &request, 4096).await;
    let first = response.expect_event().await;
    // The proxy waits for its client far longer than the upstream may keep it waiting.
    sleep(Duration::from_millis(1000)).await;
    let (rest, _) = events(&mut response).await;
    let mut frames = vec![first];
    frames.extend(rest);
    assert_eq!(
        data(frames.last().unwrap()),
        Some("[DONE]"),
        "{}",
        frames.last().unwrap()
    );
    assert_eq!(text(&frames), sim_text(tokens));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_streamed_completion_passes_through() {
    let (sim, _) = start_sim(&["--step-ms", "0"]);
    let proxy = start_proxy(&format!("http://{sim}"), &[]);
    let body = r#"{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":5}"#;
    let mut response = RawResponse::post(proxy, CHAT, "x-request-id: plain\r\n", body).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(response.header("x-request-id").as_deref(), Some("plain"));
    let completion: Value = serde_json::from_str(&response.text().await).unwrap();
    assert_eq!(completion["choices"][0]["message"]["content"], sim_text(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_gives_every_stream_a_terminal_frame() {
    let (sim, _) = start_sim(&["--step-ms", "2"]);
    let (stop, stopped) = oneshot::channel();
    let (proxy, _, served) = proxy_until(&format!("http://{sim}"), &[], Some(stopped));
    let mut responses = Vec::new();
    for n in 0..3 {
        let mut response = stream(proxy, &format!("x-request-id: shut-{n}\r\n"), 50_000).await;
        response.expect_event().await;
        responses.push(response);
    }
    stop.send(()).unwrap();
    for response in &mut responses {
        let (frames, _) = events(response).await;
        let last = frames.last().unwrap();
        assert!(last.starts_with("event: error\n"), "{last}");
        assert!(last.contains(r#""type":"shutdown""#), "{last}");
        assert_eq!(response.ended(), Some(BodyEnd::Complete));
    }
    tokio::time::timeout(HANG, served)
        .await
        .expect("the proxy stops")
        .unwrap();
    wait_for_within(sim, "the upstream's generators stop", HANG, |s| {
        s["generators_running"] == 0
    })
    .await;
}

/// The sum of the samples on a Prometheus `page` of the series `name` whose labels include
/// `labels` (0 when there is none yet).
fn metric(page: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .filter(|(series, _)| {
            let (series_name, series_labels) = series.split_once('{').unwrap_or((series, ""));
            series_name == name
                && labels
                    .iter()
                    .all(|(key, value)| series_labels.contains(&format!("{key}=\"{value}\"")))
        })
        .filter_map(|(_, value)| value.parse::<f64>().ok())
        .sum()
}

async fn metrics_page(addr: std::net::SocketAddr) -> String {
    RawResponse::get(addr, "/metrics", "").await.text().await
}

/// Known traffic through one proxy: two streams that complete, one whose client leaves, one
/// whose upstream fails mid-stream (sim's KV pool runs out), one request passed through. The
/// proxy's `/stats` counts exactly these; its `/metrics` (the process's recorder, which the
/// other tests share) grows by at least them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_stats_describe_the_proxy() {
    // The streams here that reach token 20 and stall are the leaver and the block holder.
    let (sim, _) = start_sim(&STARVED_KV);
    let proxy = start_proxy(&format!("http://{sim}"), &[]);
    let before = metrics_page(proxy).await;

    for n in 0..2 {
        let mut response = stream(proxy, &format!("x-request-id: measured-{n}\r\n"), 5).await;
        let (frames, _) = events(&mut response).await;
        assert_eq!(
            frames.len(),
            7,
            "5 tokens, the final chunk, [DONE]: {frames:?}"
        );
    }
    let mut embeddings = RawResponse::get(proxy, "/v1/embeddings", "").await;
    assert_eq!(
        embeddings.status(),
        404,
        "sim has no /v1/embeddings: passed through as it is"
    );
    let _ = embeddings.text().await;
    let mut leaver = stream(proxy, "x-request-id: leaver\r\n", 100).await;
    for _ in 0..3 {
        leaver.expect_event().await;
    }
    drop(leaver);
    wait_for_within(sim, "sim's streams end", HANG, |s| {
        s["generators_running"] == 0 && s["kv_blocks_in_use"] == 0
    })
    .await;
    // A stream on sim itself holds two of the three blocks; the next one through the proxy
    // takes the third and runs out at token 16.
    let holder = client::hold_two_kv_blocks(sim).await;
    let mut starved = stream(proxy, "x-request-id: starved\r\n", 48).await;
    let (frames, _) = events(&mut starved).await;
    assert_eq!(text(&frames), sim_text(16), "{frames:?}");
    assert!(
        frames.last().unwrap().starts_with("event: error\n"),
        "{frames:?}"
    );

    let stats = wait_for_within(proxy, "every stream ends", HANG, |s| {
        s["streams_running"] == 0
    })
    .await;
    let expect = |field: &str, n: u64| assert_eq!(stats[field], n, "{field}: {stats}");
    expect("streams_started", 4);
    expect("streams_completed", 2);
    expect("streams_cancelled", 1);
    expect("streams_ended_slow_consumer", 0);
    expect("streams_failed", 1);
    expect("streams_upstream_error", 1);
    expect("upstream_errors", 0);
    expect("requests_passed_through", 1);
    for field in [
        "streams_detached",
        "streams_resumed",
        "streams_expired",
        "replay_bytes",
    ] {
        expect(field, 0);
    }
    for (cause, n) in stats["upstream_failures"].as_object().unwrap() {
        assert_eq!(n, 0, "{cause}: {stats}");
    }
    for reason in EndReason::ALL {
        let n = match reason {
            EndReason::Completed => 2,
            EndReason::ConsumerGone | EndReason::UpstreamError => 1,
            _ => 0,
        };
        let name = reason.as_str();
        assert_eq!(stats["streams_ended"][name], n, "{name}: {stats}");
    }

    let after = metrics_page(proxy).await;
    let grew = |name: &str, labels: &[(&str, &str)]| {
        metric(&after, name, labels) - metric(&before, name, labels)
    };
    let requests = "streamgate_proxy_requests_total";
    assert!(grew(requests, &[("kind", "stream")]) >= 4.0, "{after}");
    assert!(grew(requests, &[("kind", "passthrough")]) >= 1.0, "{after}");
    let ended = "streamgate_streams_ended_total";
    let write = ("hop", "proxy.write");
    assert!(
        grew(ended, &[write, ("reason", "completed")]) >= 2.0,
        "{after}"
    );
    assert!(
        grew(ended, &[write, ("reason", "consumer_gone")]) >= 1.0,
        "{after}"
    );
    let recv = ("hop", "proxy.recv");
    assert!(
        grew(ended, &[recv, ("reason", "upstream_error")]) >= 1.0,
        "{after}"
    );
    // Every stream's first event, and one gap per visible event at each hop (between two, and
    // from the last to the stream's end): 5 + 5 completed, 3 read before leaving, 16 starved.
    let first = "streamgate_time_to_first_event_seconds_count";
    assert!(grew(first, &[write]) >= 4.0, "{after}");
    let visible = (5 + 5 + 3 + 16) as f64;
    let gaps = "streamgate_gap_seconds_count";
    assert!(grew(gaps, &[write]) >= visible, "{after}");
    assert!(grew(gaps, &[recv]) >= visible, "{after}");
    drop(holder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_past_the_limit_is_refused() {
    let hostile = Hostile::start(Case::Json).await;
    let proxy = start_proxy(&hostile.url(), &["--max-request-bytes", "1024"]);
    let body = format!(
        r#"{{"stream":true,"messages":[],"pad":"{}"}}"#,
        "x".repeat(2000)
    );
    let mut response = RawResponse::post(proxy, CHAT, "", &body).await;
    assert_eq!(response.status(), 413);
    assert!(response.text().await.contains("invalid_request_error"));
    assert!(hostile.requests().is_empty());
    // Other paths stream their bodies through unread, whatever their size.
    let mut other = RawResponse::post(proxy, "/v1/embeddings", "", &body).await;
    assert_eq!(other.status(), 200);
    let _ = other.text().await;
    assert_eq!(hostile.requests()[0].1, body.as_bytes());
}

// ------------------------------------------------------------------- pass-through, request ids

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_requests_pass_through_byte_for_byte() {
    let hostile = Hostile::start(Case::Json).await;
    let proxy = start_proxy(&hostile.url(), &[]);
    // A GET with a query, a hop-by-hop header the upstream must not see.
    let mut models = RawResponse::get(
        proxy,
        "/v1/models?limit=2&x=%20",
        "Connection: x-private\r\nx-private: 1\r\nAuthorization: Bearer k\r\n",
    )
    .await;
    assert_eq!(models.status(), 200);
    assert_eq!(models.header("x-upstream-thing").as_deref(), Some("kept"));
    assert_eq!(models.text().await, hostile::JSON_BODY);
    let (head, _) = &hostile.requests()[0];
    assert!(
        head.starts_with("GET /v1/models?limit=2&x=%20 HTTP/1.1\r\n"),
        "{head}"
    );
    assert_eq!(
        hostile.header(0, "authorization").as_deref(),
        Some("Bearer k")
    );
    assert_eq!(hostile.header(0, "x-private"), None);
    assert_eq!(hostile.header(0, "host"), Some(hostile.addr.to_string()));
    // A non-streamed chat completion: the body reaches the upstream as sent, and comes back so.
    let body = r#"{"model":"m", "messages":[{"role":"user","content":"hi"}],  "stream":false}"#;
    let mut chat = RawResponse::post(proxy, CHAT, "", body).await;
    assert_eq!(chat.text().await, hostile::JSON_BODY);
    assert_eq!(hostile.requests()[1].1, body.as_bytes());
    // Any method.
    let request =
        format!("DELETE /v1/files/f1 HTTP/1.1\r\nHost: {proxy}\r\nContent-Length: 0\r\n\r\n");
    let mut deleted = RawResponse::send(proxy, request.as_bytes()).await;
    assert_eq!(deleted.status(), 200);
    let _ = deleted.text().await;
    assert!(hostile.requests()[2].0.starts_with("DELETE /v1/files/f1 "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_go_both_ways_and_traceparent_goes_upstream() {
    let hostile = Hostile::start(Case::Stream {
        chunks: 2,
        content_type: "text/event-stream",
    })
    .await;
    let proxy = start_proxy(&hostile.url(), &[]);
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let headers =
        format!("x-request-id: abc-1\r\ntraceparent: {traceparent}\r\ntracestate: k=v\r\n");
    let mut given = stream(proxy, &headers, 2).await;
    assert_eq!(given.header("x-request-id").as_deref(), Some("abc-1"));
    events(&mut given).await;
    assert_eq!(hostile.header(0, "x-request-id").as_deref(), Some("abc-1"));
    assert_eq!(
        hostile.header(0, "traceparent").as_deref(),
        Some(traceparent)
    );
    assert_eq!(hostile.header(0, "tracestate").as_deref(), Some("k=v"));
    // None given: one is made, sent upstream and echoed.
    let mut made = stream(proxy, "", 2).await;
    let id = made.header("x-request-id").expect("an x-request-id");
    assert!(id.starts_with("sg-") && id.len() == 35, "{id}");
    events(&mut made).await;
    assert_eq!(hostile.header(1, "x-request-id"), Some(id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_grace_a_taken_request_id_is_a_conflict_that_never_reaches_the_upstream() {
    let (sim, _) = start_sim(&["--step-ms", "5"]);
    let proxy = start_proxy(&format!("http://{sim}"), &["--resume-grace-ms", "10000"]);
    let mut running = stream(proxy, "x-request-id: twice\r\n", 1000).await;
    running.expect_event().await;
    let mut second = stream(proxy, "x-request-id: twice\r\n", 10).await;
    assert_eq!(second.status(), 409);
    let text = second.text().await;
    assert!(text.contains("conflict_error"), "{text}");
    assert!(text.contains("x-request-id twice is running"), "{text}");
    assert!(text.contains("/v1/chat/completions/twice/stream"), "{text}");
    // Finished, and retained for the grace: still taken, and said so.
    let mut short = stream(proxy, "x-request-id: short\r\n", 2).await;
    events(&mut short).await;
    let mut again = stream(proxy, "x-request-id: short\r\n", 2).await;
    assert_eq!(again.status(), 409);
    let text = again.text().await;
    assert!(
        text.contains("x-request-id short recently finished"),
        "{text}"
    );
    // The refused `"stream": true` duplicates never started upstream work.
    let sim_stats = stats(sim).await;
    assert_eq!(sim_stats["streams_started"], 2, "{sim_stats}");
    drop(running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_grace_requests_sharing_an_id_are_both_served() {
    let hostile = Hostile::start(Case::Stream {
        chunks: 3,
        content_type: "text/event-stream",
    })
    .await;
    let proxy = start_proxy(&hostile.url(), &[]);
    // Two at once under one id, as an Envoy retry keeps it.
    let (mut first, mut second) = tokio::join!(
        stream(proxy, "x-request-id: retried\r\n", 3),
        stream(proxy, "x-request-id: retried\r\n", 3),
    );
    assert_eq!((first.status(), second.status()), (200, 200));
    let ((a, _), (b, _)) = tokio::join!(events(&mut first), events(&mut second));
    assert_eq!(data(a.last().unwrap()), Some("[DONE]"));
    assert_eq!(data(b.last().unwrap()), Some("[DONE]"));
    assert_eq!(hostile.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_grace_resume_and_cancel_pass_through_to_the_upstream() {
    let hostile = Hostile::start(Case::Json).await;
    let proxy = start_proxy(&hostile.url(), &[]);
    let mut resume = RawResponse::get(proxy, "/v1/chat/completions/x1/stream", "").await;
    assert_eq!(resume.status(), 200);
    assert_eq!(resume.text().await, hostile::JSON_BODY);
    let mut cancel = RawResponse::post(proxy, "/v1/chat/completions/x1/cancel", "", "").await;
    assert_eq!(cancel.status(), 200);
    assert_eq!(cancel.text().await, hostile::JSON_BODY);
    let requests = hostile.requests();
    assert!(
        requests[0]
            .0
            .starts_with("GET /v1/chat/completions/x1/stream ")
    );
    assert!(
        requests[1]
            .0
            .starts_with("POST /v1/chat/completions/x1/cancel ")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_resume_store_is_a_503_before_the_upstream() {
    let hostile = Hostile::start(Case::Stream {
        chunks: 3,
        content_type: "text/event-stream",
    })
    .await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store = format!("redis://127.0.0.1:{port}");
    let flags = [
        "--resume-grace-ms",
        "10000",
        "--resume-store",
        store.as_str(),
    ];
    let proxy = start_proxy(&hostile.url(), &flags);
    let mut response = tokio::time::timeout(HANG, stream(proxy, "", 3))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let _ = response.text().await;
    assert!(hostile.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_body_did_not_ask_for_is_gated_when_the_upstream_streams() {
    let hostile = Hostile::start(Case::Stream {
        chunks: 3,
        content_type: "text/event-stream",
    })
    .await;
    let proxy = start_proxy(&hostile.url(), &[]);
    for body in [
        r#"{"model":"m","messages":[],"stream":"true"}"#,
        r#"{"model":"m","messages":[],"stream":1}"#,
        r#"{"model":"m","messages":[],"stream":false,"stream":true}"#,
    ] {
        let mut response = RawResponse::post(proxy, CHAT, "", body).await;
        assert_eq!(response.status(), 200, "{body}");
        assert_eq!(
            response.header("x-accel-buffering").as_deref(),
            Some("no"),
            "{body}: gated"
        );
        let (frames, _) = events(&mut response).await;
        assert_eq!(id(&frames[0]), Some(0), "{body}: the proxy's ids");
        assert_eq!(data(frames.last().unwrap()), Some("[DONE]"), "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_before_the_first_chunk_still_sends_a_final_chunk() {
    let (sim, _) = start_sim(&["--step-ms", "1", "--stall-at", "0", "--stall-ms", "5000"]);
    // The stream is committed (200) one heartbeat interval in, its upstream's first event
    // still to come.
    let flags = ["--resume-grace-ms", "10000", "--heartbeat-ms", "200"];
    let proxy = start_proxy(&format!("http://{sim}"), &flags);
    let mut response = stream(proxy, "x-request-id: early\r\n", 5).await;
    assert_eq!(response.status(), 200);
    let mut cancel = RawResponse::post(proxy, "/v1/chat/completions/early/cancel", "", "").await;
    assert_eq!(cancel.status(), 200);
    let _ = cancel.text().await;
    let (frames, _) = tokio::time::timeout(HANG, events(&mut response))
        .await
        .unwrap();
    assert_eq!(frames.len(), 2, "{frames:?}");
    let finish: Value = serde_json::from_str(data(&frames[0]).unwrap()).unwrap();
    assert_eq!(finish["id"], "early");
    assert_eq!(finish["object"], "chat.completion.chunk");
    assert_eq!(finish["model"], "sim");
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    assert_eq!(data(&frames[1]), Some("[DONE]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_request_body_gets_a_408_in_time() {
    let hostile = Hostile::start(Case::Json).await;
    let proxy = start_proxy(&hostile.url(), &["--body-timeout-ms", "300"]);
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: {proxy}\r\nContent-Type: application/json\r\n\
         Content-Length: 1000\r\n\r\n{{\"stream\":"
    );
    let started = Instant::now();
    let mut response = RawResponse::send(proxy, head.as_bytes()).await;
    let waited = started.elapsed();
    assert_eq!(response.status(), 408);
    assert!(response.text().await.contains("invalid_request_error"));
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert!(hostile.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_large_request_bodies_stay_within_the_buffer_budget() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _turn = MEMORY.lock().await;
    const CLIENTS: usize = 40;
    const BODY: usize = 8 * 1024 * 1024;
    const BUDGET: usize = 32 * 1024 * 1024;
    // A refused upstream: a body read whole is answered at once (502) and let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let budget = BUDGET.to_string();
    let proxy = start_proxy(
        &format!("http://127.0.0.1:{port}"),
        &["--max-buffered-bytes", &budget],
    );
    let pad: &'static [u8] = Box::leak(vec![b' '; BODY].into_boxed_slice());
    let before = rss();
    let (go, ready) = tokio::sync::watch::channel(false);
    let written = std::sync::Arc::new(tokio::sync::Barrier::new(CLIENTS + 1));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (mut ready, written) = (ready.clone(), written.clone());
            tokio::spawn(async move {
                let mut socket = tokio::net::TcpStream::connect(proxy).await.unwrap();
                let head =
                    format!("POST {CHAT} HTTP/1.1\r\nHost: p\r\nContent-Length: {BODY}\r\n\r\n");
                let sent = async {
                    socket.write_all(head.as_bytes()).await?;
                    socket.write_all(&pad[..BODY - 1]).await
                };
                // Refused ones may find their connection closed under them.
                let _ = tokio::time::timeout(Duration::from_secs(5), sent).await;
                written.wait().await;
                let _ = ready.wait_for(|go| *go).await;
                let _ = socket.write_all(&pad[BODY - 1..]).await;
                let mut answer = Vec::new();
                let _ = tokio::time::timeout(HANG, socket.read_to_end(&mut answer)).await;
                String::from_utf8_lossy(&answer)
                    .get(9..12)
                    .unwrap_or("")
                    .to_owned()
            })
        })
        .collect();
    written.wait().await;
    // Every body is either held by the proxy (all but its last byte) or refused.
    sleep(Duration::from_millis(300)).await;
    let grown = rss().saturating_sub(before);
    go.send(true).unwrap();
    let mut statuses = Vec::new();
    for client in clients {
        statuses.push(client.await.unwrap());
    }
    let refused = statuses.iter().filter(|status| *status == "503").count();
    let read = statuses.iter().filter(|status| *status == "502").count();
    assert!(refused > 0 && read > 0, "{statuses:?}");
    assert!(read <= BUDGET / BODY, "{statuses:?}");
    // Unbounded, it would be 40 x 8 MiB = 320 MiB.
    assert!(
        grown < 2 * BUDGET as u64 + 32 * 1024 * 1024,
        "the proxy grew by {grown} bytes holding {CLIENTS} bodies of {BODY} bytes"
    );
}

// ----------------------------------------------------------------------- hostile upstreams

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_50_mb_line_ends_the_stream_with_an_error_frame_in_bounded_memory() {
    let _turn = MEMORY.lock().await;
    let hostile = Hostile::start(Case::LongLine).await;
    let proxy = start_proxy(&hostile.url(), &[]);
    let before = rss();
    // More tokens than come before the line: a stream cut after all it asked for is whole.
    let mut response = stream(proxy, "", 4).await;
    assert_eq!(response.status(), 200);
    let (frames, _) = events(&mut response).await;
    let grown = rss().saturating_sub(before);
    assert_eq!(content(&frames[0]).as_deref(), Some("c0 "));
    assert_upstream_error(frames.last().unwrap(), "sse line longer than");
    assert!(grown < MEMORY_BOUND, "the proxy grew by {grown} bytes");
    // The upstream is dropped: its writes fail.
    let deadline = Instant::now() + HANG;
    while hostile.closed() == 0 {
        assert!(
            Instant::now() < deadline,
            "the upstream connection stays open"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_is_replaced_as_eventsource_clients_do() {
    let hostile = Hostile::start(Case::InvalidUtf8).await;
    let proxy = start_proxy(&hostile.url(), &[]);
    let mut response = stream(proxy, "", 2).await;
    let (frames, _) = events(&mut response).await;
    assert_eq!(frames.len(), 3, "{frames:?}");
    assert_eq!(content(&frames[1]).as_deref(), Some("bad\u{FFFD}\u{FFFD}"));
    assert_eq!(data(&frames[2]), Some("[DONE]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_comments_get_heartbeats_then_an_upstream_stalled_frame() {
    let hostile = Hostile::start(Case::EndlessComments).await;
    let proxy = start_proxy(
        &hostile.url(),
        &["--upstream-idle-ms", "600", "--heartbeat-ms", "100"],
    );
    let mut response = stream(proxy, "", 2).await;
    let (frames, heartbeats) = events(&mut response).await;
    assert_eq!(content(&frames[0]).as_deref(), Some("c0 "));
    assert!(
        heartbeats >= 2,
        "{heartbeats} heartbeats before the idle deadline"
    );
    assert_upstream_error(frames.last().unwrap(), "upstream stalled");
    let deadline = Instant::now() + HANG;
    while hostile.closed() == 0 {
        assert!(
            Instant::now() < deadline,
            "the stalled upstream is not dropped"
        );
        sleep(Duration::from_millis(20)).await;
    }
    let stats = wait_for_within(proxy, "the stream ends", HANG, |s| {
        s["streams_running"] == 0
    })
    .await;
    assert_eq!(stats["streams_upstream_error"], 1, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_before_done_is_not_a_clean_end() {
    for case in [Case::AbruptClose, Case::ShortSse] {
        let hostile = Hostile::start(case).await;
        let proxy = start_proxy(&hostile.url(), &[]);
        // More tokens than the three that come: cut after all it asked for, it would be whole.
        let mut response = stream(proxy, "", 10).await;
        assert_eq!(response.status(), 200);
        let (frames, _) = events(&mut response).await;
        assert_eq!(text(&frames), "c0 c1 c2 ", "{case:?}");
        let why = match case {
            Case::AbruptClose => "before data: [DONE]",
            _ => "failed mid-stream",
        };
        assert_upstream_error(frames.last().unwrap(), why);
        assert!(frames.iter().all(|frame| data(frame) != Some("[DONE]")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_through_body_cut_short_cuts_the_client() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let hostile = Hostile::start(Case::ShortPlain).await;
    let proxy = start_proxy(&hostile.url(), &[]);
    for _ in 0..5 {
        // Raw: the connection may even be cut before the head (hyper sends it with the body's
        // first bytes); never may it end cleanly.
        let mut socket = tokio::net::TcpStream::connect(proxy).await.unwrap();
        let request = format!("GET /download HTTP/1.1\r\nHost: {proxy}\r\n\r\n");
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut received = Vec::new();
        // A reset is as good as a close here.
        let _ = tokio::time::timeout(HANG, socket.read_to_end(&mut received))
            .await
            .expect("the connection ends in time");
        let text = String::from_utf8_lossy(&received);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            assert!(
                head.to_ascii_lowercase().contains("content-length: 1000"),
                "{head}"
            );
            assert!(body.len() < 1000, "a clean end of a short body");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_errors_keep_their_status_and_body() {
    let hostile = Hostile::start(Case::Error500Sse).await;
    let proxy = start_proxy(&hostile.url(), &[]);
    let mut response = stream(proxy, "x-request-id: e1\r\n", 3).await;
    assert_eq!(response.status(), 500);
    assert_eq!(
        response.header("content-type").as_deref(),
        Some("text/event-stream")
    );
    assert_eq!(response.header("x-request-id").as_deref(), Some("e1"));
    assert_eq!(response.text().await, hostile::ERROR_SSE_BODY);

    let hostile = Hostile::start(Case::Error500Json).await;
    let proxy = start_proxy(&hostile.url(), &[]);
    let mut response = stream(proxy, "", 3).await;
    assert_eq!(response.status(), 500);
    assert_eq!(response.text().await, hostile::ERROR_JSON_BODY);
    // Non-streamed too.
    let mut response = RawResponse::get(proxy, "/v1/models", "").await;
    assert_eq!(response.status(), 500);
    assert_eq!(response.text().await, hostile::ERROR_JSON_BODY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_types_match_in_any_case_and_a_non_sse_answer_passes() {
    let odd = Case::Stream {
        chunks: 3,
        content_type: "Text/Event-Stream; Charset=UTF-8",
    };
    let hostile = Hostile::start(odd).await;
    let proxy = start_proxy(&hostile.url(), &[]);
    let mut response = stream(proxy, "", 3).await;
    assert_eq!(
        response.header("content-type").as_deref(),
        Some("text/event-stream")
    );
    let (frames, _) = events(&mut response).await;
    assert_eq!(text(&frames), "c0 c1 c2 ");
    // The proxy gated it: its own ids.
    assert_eq!(id(&frames[0]), Some(0));
    assert_eq!(data(&frames[3]), Some("[DONE]"));

    let hostile = Hostile::start(Case::Json).await;
    let proxy = start_proxy(&hostile.url(), &[]);
    let mut response = stream(proxy, "", 3).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(response.text().await, hostile::JSON_BODY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_without_headers_is_a_504_and_slow_headers_are_waited_for() {
    let hostile = Hostile::start(Case::NoHeaders).await;
    let proxy = start_proxy(&hostile.url(), &["--upstream-headers-ms", "300"]);
    let asked = Instant::now();
    let mut response = stream(proxy, "", 3).await;
    assert_eq!(response.status(), 504);
    // At the deadline: not before it, and not long after.
    let waited = asked.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    let error: Value = serde_json::from_str(&response.text().await).unwrap();
    assert_eq!(error["error"]["type"], "upstream_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no response headers")
    );
    let stats = stats(proxy).await;
    assert_eq!(stats["upstream_failures"]["headers_timeout"], 1, "{stats}");

    let hostile = Hostile::start(Case::SlowHeaders(200)).await;
    let proxy = start_proxy(&hostile.url(), &["--upstream-headers-ms", "5000"]);
    let mut response = stream(proxy, "", 3).await;
    assert_eq!(response.status(), 200);
    let (frames, _) = events(&mut response).await;
    assert_eq!(text(&frames), "c0 c1 c2 ");
}

/// A server that queues the request (llama.cpp with every slot busy) sends its headers only
/// when it starts on it: past one heartbeat interval the proxy commits the stream, and its
/// client hears heartbeats while the proxy waits; a late error ends the stream with a frame
/// that says it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_queues_the_request_gets_heartbeats_downstream_meanwhile() {
    let flags = ["--heartbeat-ms", "100", "--upstream-headers-ms", "5000"];
    let hostile = Hostile::start(Case::SlowHeaders(700)).await;
    let proxy = start_proxy(&hostile.url(), &flags);
    let mut response = stream(proxy, "", 3).await;
    assert_eq!(
        response.status(),
        200,
        "committed before the upstream answered"
    );
    let (frames, heartbeats) = events(&mut response).await;
    assert!(
        heartbeats >= 2,
        "{heartbeats} heartbeats while the upstream queued"
    );
    assert_eq!(text(&frames), "c0 c1 c2 ");

    let hostile = Hostile::start(Case::SlowError500(700)).await;
    let proxy = start_proxy(&hostile.url(), &flags);
    let mut response = stream(proxy, "", 3).await;
    assert_eq!(response.status(), 200);
    let (frames, heartbeats) = events(&mut response).await;
    assert!(
        heartbeats >= 2,
        "{heartbeats} heartbeats while the upstream queued"
    );
    let last = frames.last().expect("a terminal frame");
    assert_upstream_error(last, "500 Internal Server Error");
    assert_upstream_error(last, "overloaded");

    let hostile = Hostile::start(Case::NoHeaders).await;
    let flags = ["--heartbeat-ms", "100", "--upstream-headers-ms", "600"];
    let proxy = start_proxy(&hostile.url(), &flags);
    let mut response = stream(proxy, "", 3).await;
    assert_eq!(response.status(), 200);
    let (frames, heartbeats) = events(&mut response).await;
    assert!(heartbeats >= 2, "{heartbeats} heartbeats");
    assert_upstream_error(frames.last().unwrap(), "no response headers within 600 ms");
    let stats = stats(proxy).await;
    assert_eq!(stats["upstream_failures"]["headers_timeout"], 1, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_a_502() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let proxy = start_proxy(&format!("http://{addr}"), &[]);
    let models = RawResponse::get(proxy, "/v1/models", "").await;
    let streamed = stream(proxy, "", 3).await;
    for mut response in [models, streamed] {
        assert_eq!(response.status(), 502);
        let error: Value = serde_json::from_str(&response.text().await).unwrap();
        assert_eq!(error["error"]["type"], "upstream_error");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("unreachable"),
            "{error}"
        );
    }
    let stats = stats(proxy).await;
    assert_eq!(stats["upstream_failures"]["connect"], 2, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_head_over_the_read_buffer_is_a_502_that_says_so() {
    let hostile = Hostile::start(Case::HugeHead).await;
    let proxy = start_proxy(&hostile.url(), &[]);
    let mut response = RawResponse::get(proxy, "/v1/models", "").await;
    assert_eq!(response.status(), 502);
    let error: Value = serde_json::from_str(&response.text().await).unwrap();
    assert_eq!(error["error"]["type"], "upstream_error");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("response head is larger than the proxy takes (16384 bytes)"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_timeout_is_a_504() {
    // A listener that never accepts, its backlog full: further connects hang in SYN retries.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        fillers.push(tokio::spawn(tokio::time::timeout(
            HANG,
            tokio::net::TcpStream::connect(addr),
        )));
    }
    sleep(Duration::from_millis(200)).await;
    let proxy = start_proxy(&format!("http://{addr}"), &["--connect-timeout-ms", "300"]);
    let mut response = RawResponse::get(proxy, "/v1/models", "").await;
    assert_eq!(response.status(), 504);
    let error: Value = serde_json::from_str(&response.text().await).unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("connecting timed out"),
        "{error}"
    );
    for filler in fillers {
        filler.abort();
    }
    drop(listener);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_text_completion_is_gated_too() {
    let hostile = Hostile::start(Case::Stream {
        chunks: 2,
        content_type: "text/event-stream",
    })
    .await;
    let proxy = start_proxy(&hostile.url(), &["--policy", "coalesce"]);
    let body = r#"{"model":"m","prompt":"hi","stream":true}"#;
    let mut response = RawResponse::post(proxy, "/v1/completions", "", body).await;
    assert_eq!(response.header("x-accel-buffering").as_deref(), Some("no"));
    let (frames, _) = events(&mut response).await;
    assert_eq!(
        frames.iter().map(|frame| id(frame)).collect::<Vec<_>>(),
        [Some(0), Some(1), Some(2)]
    );
    assert_eq!(data(&frames[2]), Some("[DONE]"));
    assert!(hostile.requests()[0].0.starts_with("POST /v1/completions "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_gib_body_streams_through_in_bounded_memory() {
    let _turn = MEMORY.lock().await;
    const GIB: u64 = 1024 * 1024 * 1024;
    let hostile = Hostile::start(Case::Plain(GIB)).await;
    let proxy = start_proxy(&hostile.url(), &[]);
    let before = rss();
    let mut response = RawResponse::get(proxy, "/big", "").await;
    assert_eq!(response.header("content-length"), Some(GIB.to_string()));
    // Read in pieces, watching the memory as it goes.
    let (mut read, mut peak) = (0, 0);
    while read < GIB {
        let n = response.drain((GIB - read).min(64 * 1024 * 1024)).await;
        assert!(n > 0, "the body ended after {read} bytes");
        read += n;
        peak = peak.max(rss().saturating_sub(before));
    }
    assert_eq!(read, GIB);
    assert!(
        peak < MEMORY_BOUND,
        "the proxy grew by {peak} bytes for a 1 GiB body"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_body_is_dropped_upstream_when_the_client_goes() {
    let hostile = Hostile::start(Case::Endless).await;
    let proxy = start_proxy(&hostile.url(), &[]);
    let mut response = RawResponse::get(proxy, "/forever", "").await;
    assert!(response.drain(16 * 1024 * 1024).await >= 16 * 1024 * 1024);
    drop(response);
    let deadline = Instant::now() + HANG;
    while hostile.closed() == 0 {
        assert!(
            Instant::now() < deadline,
            "the upstream connection stays open"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

// ------------------------------------------------------------------------------ diagnosis

const PATH: [&str; 7] = [
    "worker.decode",
    "worker.publish",
    "worker.write",
    "worker.sent",
    "proxy.recv",
    "proxy.write",
    "client.recv",
];

/// Streams one request through sim and a proxy that injects `proxy_stall` (a test-only
/// switch, no flag), with hop records at every hop (the client's written here), and names the
/// stalls.
async fn diagnose(
    sim_flags: &[&str],
    proxy_stall: Option<InjectedStall>,
    tag: &str,
) -> Vec<(String, Option<u64>)> {
    let dir = std::env::temp_dir();
    let file = |hop: &str| -> PathBuf {
        dir.join(format!("proxy-{tag}-{hop}-{}.jsonl", std::process::id()))
    };
    let files = [file("sim"), file("proxy"), file("client")];
    for f in &files {
        let _ = std::fs::remove_file(f);
    }
    let mut sim_flags = sim_flags.to_vec();
    sim_flags.extend(["--hop-records", files[0].to_str().unwrap()]);
    let proxy_flags = ["--hop-records", files[1].to_str().unwrap()];
    let (sim, _) = start_sim(&sim_flags);
    let mut config = proxy_config(&format!("http://{sim}"), &proxy_flags);
    config.stall = proxy_stall;
    let (proxy, _, _) = serve_proxy(config, None);

    let sink = RecordSink::to_file(&files[2]).unwrap();
    let hop = HopProbe::new("client.recv").records(sink.clone(), 1.0);
    let mut recorder = hop.recorder(tag);
    let mut response = stream(proxy, &format!("x-request-id: {tag}\r\n"), 60).await;
    while let Some(frame) = response.next_frame().await {
        let Some(data) = data(&frame) else { continue };
        let kind = if frame.starts_with(":control\n") || data == "[DONE]" {
            Kind::Control
        } else {
            Kind::Visible
        };
        recorder.observe(Observation::new(id(&frame), frame.len() as u64, kind));
    }
    recorder.end(EndReason::Completed);
    sink.sync();
    // The servers' writers flush as soon as they are idle: wait for every hop's records.
    let deadline = Instant::now() + HANG;
    let mut timeline;
    loop {
        timeline = Timeline::new(PATH, Duration::from_millis(500));
        for f in &files {
            timeline.add_lines(
                f.to_str().unwrap(),
                &std::fs::read_to_string(f).unwrap_or_default(),
            );
        }
        let hops = timeline.diagnose().hops;
        if hops.iter().all(|hop| hop.gaps >= 59) {
            break;
        }
        assert!(Instant::now() < deadline, "records of every hop: {hops:?}");
        sleep(Duration::from_millis(20)).await;
    }
    for f in &files {
        let _ = std::fs::remove_file(f);
    }
    timeline
        .diagnose()
        .stalls
        .into_iter()
        .map(|stall| (stall.hop, stall.seq))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_records_name_the_hop_where_a_stall_began() {
    let stalls = diagnose(
        &["--step-ms", "2", "--stall-at", "20", "--stall-ms", "800"],
        None,
        "sim-stall",
    )
    .await;
    assert_eq!(stalls, [("worker.decode".to_owned(), Some(20))]);
    let injected = InjectedStall {
        at: 30,
        duration: Duration::from_millis(800),
    };
    let stalls = diagnose(&["--step-ms", "2"], Some(injected), "proxy-stall").await;
    assert_eq!(stalls, [("proxy.recv".to_owned(), Some(30))]);
}
