//! Two `streamgate proxy` instances on one real `redis-server` (started here on a free port;
//! the tests say SKIPPED and pass when it is not installed), in front of one `streamgate sim`:
//! a client resumes through the other instance and gets the same generation, a stop asked
//! through the other instance ends the stream where it runs with a final chunk, and Redis away
//! past the outage window is named `resume_store_error` at both of the proxy's hops.

#[path = "../../tests/common/raw.rs"]
mod client;
#[allow(dead_code)] // restarting Redis is for the reference server's tests
#[path = "../../tests/common/redis_server.rs"]
mod redis_server;
#[path = "common/proxy_setup.rs"]
mod setup;

use client::{
    HANG, RawResponse, content, data, id, is_heartbeat, stats, wait_for_end_metric, wait_for_within,
};
use redis_server::RedisServer;
use setup::{start_proxy, start_sim, stream};

/// Reads a stream's events to its end (heartbeats left out).
async fn rest(response: &mut RawResponse) -> Vec<String> {
    let frames = response.rest().await;
    frames
        .into_iter()
        .filter(|frame| !is_heartbeat(frame))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_resumes_through_another_proxy_instance() {
    let Some(redis) = RedisServer::start("resume") else {
        return;
    };
    let (sim, _) = start_sim(&["--step-ms", "2", "--token-salt"]);
    let upstream = format!("http://{sim}");
    let url = redis.url();
    let flags = ["--resume-store", url.as_str(), "--resume-grace-ms", "10000"];
    let (a, b) = (
        start_proxy(&upstream, &flags),
        start_proxy(&upstream, &flags),
    );

    let mut first = stream(a, "x-request-id: shared-1\r\n", 200).await;
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let frame = first.expect_event().await;
        seen.push(frame);
    }
    assert_eq!(id(&seen[4]), Some(4));
    // The id is taken on every instance: a duplicate through the other one is refused before
    // its upstream is asked (the sim's count below stays 1).
    let mut duplicate = stream(b, "x-request-id: shared-1\r\n", 5).await;
    assert_eq!(duplicate.status(), 409);
    let text = duplicate.text().await;
    assert!(text.contains("x-request-id shared-1 is running"), "{text}");
    drop(first);
    let mut resumed = RawResponse::get(
        b,
        "/v1/chat/completions/shared-1/stream",
        "Last-Event-ID: 4\r\n",
    )
    .await;
    assert_eq!(resumed.status(), 200);
    let rest = rest(&mut resumed).await;
    assert_eq!(id(&rest[0]), Some(5), "{}", rest[0]);
    assert_eq!(data(rest.last().unwrap()), Some("[DONE]"));
    seen.extend(rest);
    let tokens: Vec<String> = seen.iter().filter_map(|frame| content(frame)).collect();
    assert_eq!(tokens.len(), 200);
    let salt = tokens[0].trim().split_once('.').unwrap().1.to_owned();
    for (i, token) in tokens.iter().enumerate() {
        assert_eq!(token, &format!("t{i}.{salt} "), "token {i}");
    }
    assert_eq!(stats(sim).await["streams_started"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_through_another_instance_ends_the_stream_with_a_final_chunk() {
    let Some(redis) = RedisServer::start("stop") else {
        return;
    };
    let (sim, _) = start_sim(&["--step-ms", "2"]);
    let upstream = format!("http://{sim}");
    let url = redis.url();
    let flags = ["--resume-store", url.as_str(), "--resume-grace-ms", "10000"];
    let (a, b) = (
        start_proxy(&upstream, &flags),
        start_proxy(&upstream, &flags),
    );
    let mut running = stream(a, "x-request-id: shared-2\r\n", 50_000).await;
    for _ in 0..3 {
        running.expect_event().await;
    }
    let mut cancel = RawResponse::post(b, "/v1/chat/completions/shared-2/cancel", "", "").await;
    assert_eq!(cancel.status(), 200);
    let answer: serde_json::Value = serde_json::from_str(&cancel.text().await).unwrap();
    assert_eq!(answer["cancelled"], true);
    let rest = tokio::time::timeout(HANG, rest(&mut running))
        .await
        .unwrap();
    let finish = &rest[rest.len() - 2];
    assert!(finish.contains(r#""finish_reason":"stop""#), "{finish}");
    assert_eq!(data(rest.last().unwrap()), Some("[DONE]"));
    wait_for_within(sim, "the upstream's generator stops", HANG, |s| {
        s["generators_running"] == 0
    })
    .await;
}

/// Redis away past the outage window under a proxy: its client ends with a
/// `resume_store_error` frame, and the proxy's `/metrics` name that end at `proxy.recv` (the
/// upstream side, whose reading the gate stopped) as at `proxy.write` (the client's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_away_past_the_window_is_named_at_both_of_the_proxy_s_hops() {
    let Some(mut redis) = RedisServer::start("proxy-outage") else {
        return;
    };
    let (sim, _) = start_sim(&["--step-ms", "5"]);
    let upstream = format!("http://{sim}");
    let url = redis.url();
    let flags = [
        "--resume-store",
        url.as_str(),
        "--resume-grace-ms",
        "10000",
        "--resume-store-outage-ms",
        "300",
    ];
    let proxy = start_proxy(&upstream, &flags);
    let mut client = stream(proxy, "", 100_000).await;
    client.expect_event().await;
    redis.kill();
    let tail = rest(&mut client).await;
    let last = tail.last().expect("a terminal frame");
    assert!(last.contains("resume_store_error"), "{last:?}");
    for hop in ["proxy.recv", "proxy.write"] {
        wait_for_end_metric(proxy, hop, "resume_store_error").await;
    }
}
