//! Resumable streams in Redis, through two reference-server (`streamgate sim`) instances on one
//! real `redis-server` (started here on a free port; the tests say SKIPPED and pass when it is
//! not installed): a client resumes through the other instance, its reading there keeps the
//! first instance's grace from expiring, a stop through either reaches both, Redis dying ends
//! every subscriber with an error (never a hang) and a restarted one serves again, and keys
//! expire after the TTL.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use common::reference::start;
use common::resume_client::{
    self, a_stop_reaches_both_clients, events, post_stream, rest, resume_path, salts,
};
use common::{LONG, RawResponse, stats, wait_for, wait_for_end_metric};

/// A connection to `redis`, to look at the keys the instances share.
async fn connection(redis: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("a connection to redis-server")
}

/// Two instances on `redis` with `flags`.
fn instances(redis: &RedisServer, flags: &[&str]) -> (SocketAddr, SocketAddr) {
    let url = redis.url();
    let mut flags = flags.to_vec();
    flags.extend(["--resume-store", &url]);
    (start(&flags), start(&flags))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_resumes_through_the_other_instance() {
    let Some(redis) = RedisServer::start("resume") else {
        return;
    };
    let flags = [
        "--step-ms",
        "3",
        "--resume-grace-ms",
        "5000",
        "--token-salt",
    ];
    let (a, b) = instances(&redis, &flags);
    for cut in [1, 17] {
        let (mut first, name) = post_stream(a, 40).await;
        let mut seen = events(&mut first, cut).await;
        drop(first);
        let last = seen.last().unwrap().0;
        let header = format!("Last-Event-ID: {last}\r\n");
        let mut resumed = RawResponse::get(b, &resume_path(&name), &header).await;
        assert_eq!(resumed.status(), 200);
        assert_eq!(resumed.header("x-request-id"), Some(name));
        seen.extend(rest(&mut resumed).await);
        let ids: Vec<u64> = seen.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, (0..42).collect::<Vec<_>>(), "cut at {cut}");
        assert_eq!(salts(&seen), 1, "one generation: {seen:?}");
        assert_eq!(seen[40].1, "finish:length");
        assert_eq!(seen[41].1, "[DONE]");
    }
    let on_a = wait_for(a, "both streams complete", |s| s["streams_completed"] == 2).await;
    assert_eq!(on_a["tokens_generated"], 80, "nothing generated twice");
    let on_b = stats(b).await;
    assert_eq!(
        (
            on_b["streams_started"].as_u64(),
            on_b["streams_resumed"].as_u64()
        ),
        (Some(0), Some(2))
    );
    let unknown = RawResponse::get(b, &resume_path("nope"), "").await;
    assert_eq!(unknown.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_through_the_other_instance_keeps_the_grace_from_expiring() {
    let Some(redis) = RedisServer::start("grace") else {
        return;
    };
    let (a, b) = instances(&redis, &["--step-ms", "5", "--resume-grace-ms", "300"]);
    let (mut first, name) = post_stream(a, LONG).await;
    events(&mut first, 2).await;
    let mut second = RawResponse::get(b, &resume_path(&name), "Last-Event-ID: 1\r\n").await;
    drop(first);
    // Several graces (and leases) long: B's reader keeps the stream attached.
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut read = 0;
    while Instant::now() < deadline {
        events(&mut second, 1).await;
        read += 1;
    }
    assert!(read > 100, "{read} events");
    let on_a = stats(a).await;
    assert_eq!(on_a["streams_expired"], 0, "{on_a}");
    assert_eq!(on_a["streams_detached"], 0, "{on_a}");
    assert_eq!(on_a["generators_running"], 1, "{on_a}");
    drop(second);
    let on_a = wait_for(a, "the grace expires", |s| {
        s["streams_expired"] == 1 && s["generators_running"] == 0
    })
    .await;
    assert_eq!(on_a["kv_blocks_in_use"], 0);
    let expired = RawResponse::get(b, &resume_path(&name), "Last-Event-ID: 2\r\n").await;
    assert_eq!(expired.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_through_the_other_instance_reaches_every_client() {
    let Some(redis) = RedisServer::start("stop") else {
        return;
    };
    let (a, b) = instances(&redis, &["--step-ms", "5", "--resume-grace-ms", "5000"]);
    a_stop_reaches_both_clients(a, b).await;
}

/// Redis restarted (an empty one: no persistence) while streams run, within the outage
/// window: the client of the instance that runs the stream pauses and then gets every event,
/// once, in order, the same as a stream that saw no outage; the generator is not cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_within_the_outage_window_loses_no_live_stream_and_no_event() {
    let Some(mut redis) = RedisServer::start("restart-window") else {
        return;
    };
    let flags = ["--step-ms", "5", "--resume-grace-ms", "5000"];
    let (a, b) = instances(&redis, &flags);
    let tokens = 200;
    let (mut client, _) = post_stream(a, tokens).await;
    let mut seen = events(&mut client, 10).await;
    redis.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.restart();
    seen.extend(rest(&mut client).await);
    // The same request through the other instance, with no outage.
    let (mut reference, _) = post_stream(b, tokens).await;
    let expected = rest(&mut reference).await;
    let ids: Vec<u64> = seen.iter().map(|(id, _)| *id).collect();
    let want: Vec<u64> = expected.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, want, "every event once, in order");
    assert_eq!(seen, expected, "the same text");
    assert_eq!(seen.last().map(|(_, text)| text.as_str()), Some("[DONE]"));
    let on_a = wait_for(a, "the generator stops", |s| s["generators_running"] == 0).await;
    assert_eq!(on_a["streams_cancelled"], 0, "{on_a}");
}

/// Redis away past the outage window: every subscriber ends with an error (after the window,
/// never a hang), the generator is cancelled, and a restarted Redis serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_dying_mid_stream_ends_every_subscriber_with_an_error() {
    let Some(mut redis) = RedisServer::start("kill") else {
        return;
    };
    let window = Duration::from_millis(500);
    let flags = [
        "--step-ms",
        "5",
        "--resume-grace-ms",
        "5000",
        "--resume-store-outage-ms",
        "500",
    ];
    let (a, b) = instances(&redis, &flags);
    let (mut first, name) = post_stream(a, LONG).await;
    events(&mut first, 2).await;
    let mut second = RawResponse::get(b, &resume_path(&name), "").await;
    events(&mut second, 2).await;
    redis.kill();
    let killed = Instant::now();
    for client in [&mut first, &mut second] {
        let tail = tokio::time::timeout(Duration::from_secs(5), client.rest())
            .await
            .expect("an end, not a hang");
        let last = tail.last().expect("a terminal frame");
        assert!(
            last.starts_with("event: error\n") && last.contains("resume_store_error"),
            "{last:?}"
        );
    }
    let ended = killed.elapsed();
    assert!(
        window <= ended && ended < window + Duration::from_secs(5),
        "{ended:?}"
    );
    let on_a = wait_for(a, "the generator stops", |s| s["generators_running"] == 0).await;
    // Named for what ended it, in `/stats` as in the frame...
    assert_eq!(on_a["streams_ended"]["resume_store_error"], 1, "{on_a}");
    assert_eq!(on_a["streams_failed"], 1, "{on_a}");
    assert_eq!(on_a["streams_cancelled"], 0, "{on_a}");
    // ...and in `/metrics`, at the generator's hops as at the client's (the recorder is the
    // test process's: other tests' streams end there too, but none for this reason).
    for hop in ["worker.decode", "worker.publish", "worker.write"] {
        wait_for_end_metric(a, hop, "resume_store_error").await;
    }
    // Without Redis a new stream is refused, with a reason.
    let refused = RawResponse::post_json(a, "/v1/chat/completions", &resume_client::chat(5)).await;
    assert_eq!(refused.status(), 503);
    // A restarted Redis serves again, through new connections.
    redis.restart();
    let (mut again, name) = post_stream(a, 5).await;
    events(&mut again, 1).await;
    let mut resumed = RawResponse::get(b, &resume_path(&name), "Last-Event-ID: 0\r\n").await;
    let tail = rest(&mut resumed).await;
    assert_eq!(
        tail.iter().map(|e| e.0).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_expire_after_the_ttl() {
    let Some(redis) = RedisServer::start("ttl") else {
        return;
    };
    let (a, _) = instances(&redis, &["--step-ms", "1", "--resume-grace-ms", "100"]);
    let mut redis_connection = connection(&redis).await;
    let (mut first, name) = post_stream(a, 20).await;
    let keys: Vec<String> = ["log", "meta"]
        .iter()
        .map(|key| format!("streamgate:{{{name}}}:{key}"))
        .collect();
    events(&mut first, 1).await;
    // Running: its keys have a TTL the pump renews.
    for key in &keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut redis_connection)
            .await
            .unwrap();
        assert!((1..=10_000).contains(&ttl), "{key}: {ttl}");
    }
    assert_eq!(rest(&mut first).await.len(), 21);
    let ended = Instant::now();
    let exists = |connection: &mut redis::aio::MultiplexedConnection| {
        let keys = keys.clone();
        let mut connection = connection.clone();
        async move {
            redis::cmd("EXISTS")
                .arg(&keys)
                .query_async::<u64>(&mut connection)
                .await
                .unwrap()
        }
    };
    assert_eq!(exists(&mut redis_connection).await, 2, "retained");
    while exists(&mut redis_connection).await > 0 {
        assert!(
            ended.elapsed() < Duration::from_secs(10),
            "the keys never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Kept at least 3 s after the end, so attached subscribers read it.
    assert!(
        ended.elapsed() >= Duration::from_millis(2500),
        "{:?}",
        ended.elapsed()
    );
    let gone = RawResponse::get(a, &resume_path(&name), "Last-Event-ID: 3\r\n").await;
    assert_eq!(gone.status(), 404);
}
