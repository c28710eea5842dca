//! The reference server's resumable streams over real sockets: a client that disconnects and
//! resumes gets the same generation, nothing lost or repeated; the grace expires; an explicit
//! stop reaches every client; several clients read one stream; positions the log no longer holds
//! and unknown ids are refused.

mod common;

use common::reference::{start, until_paused};
use common::resume_client::{
    a_stop_reaches_both_clients, events, post_stream, rest, resume_path, salts,
};
use std::time::Duration;

use common::{LONG, RawResponse, stats, wait_for, wait_for_within};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_stream_continues_the_same_generation() {
    let addr = start(&[
        "--step-ms",
        "2",
        "--resume-grace-ms",
        "5000",
        "--token-salt",
    ]);
    for cut in [1, 7, 20] {
        let (mut first, name) = post_stream(addr, 30).await;
        let mut seen = events(&mut first, cut).await;
        drop(first);
        let last = seen.last().unwrap().0;
        let mut resumed = RawResponse::get(
            addr,
            &resume_path(&name),
            &format!("Last-Event-ID: {last}\r\n"),
        )
        .await;
        assert_eq!(resumed.status(), 200);
        seen.extend(rest(&mut resumed).await);
        let ids: Vec<u64> = seen.iter().map(|(id, _)| *id).collect();
        assert_eq!(
            ids,
            (0..32).collect::<Vec<_>>(),
            "cut after {cut}: every id once, in order"
        );
        // One salt: the same generation, not a regenerated one.
        assert_eq!(salts(&seen), 1, "{seen:?}");
        assert_eq!(seen[30].1, "finish:length");
        assert_eq!(seen[31].1, "[DONE]");
    }
    let stats = wait_for(addr, "every stream completes", |s| {
        s["streams_completed"] == 3
    })
    .await;
    assert_eq!(stats["streams_resumed"], 3);
    assert_eq!(stats["tokens_generated"], 90, "nothing generated twice");
    assert_eq!(stats["kv_blocks_in_use"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grace_expiry_frees_the_generator_and_its_kv_blocks() {
    let addr = start(&["--step-ms", "5", "--resume-grace-ms", "300"]);
    let (mut first, name) = post_stream(addr, LONG).await;
    events(&mut first, 3).await;
    drop(first);
    let detached = wait_for(addr, "the stream detaches", |s| s["streams_detached"] == 1).await;
    let detached_at = Instant::now();
    assert_eq!(
        detached["generators_running"], 1,
        "generating through the grace"
    );
    // The 300 ms grace runs out in time: not before it, and well within a second after it.
    let stats = wait_for_within(addr, "the grace expires", Duration::from_secs(2), |s| {
        s["streams_expired"] == 1 && s["generators_running"] == 0
    })
    .await;
    let expired_after = detached_at.elapsed();
    assert!(
        expired_after >= Duration::from_millis(250),
        "expired {expired_after:?} after the detach"
    );
    assert_eq!(stats["kv_blocks_in_use"], 0);
    assert_eq!(stats["replay_bytes"], 0);
    assert_eq!(stats["streams_detached"], 0);
    let refused = RawResponse::get(addr, &resume_path(&name), "Last-Event-ID: 2\r\n").await;
    assert_eq!(refused.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_stop_reaches_every_client() {
    let addr = start(&["--step-ms", "5", "--resume-grace-ms", "5000"]);
    a_stop_reaches_both_clients(addr, addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_of_one_stream_get_identical_events() {
    let addr = start(&["--step-ms", "1", "--resume-grace-ms", "1000"]);
    let (mut first, name) = post_stream(addr, 200).await;
    let mut second = RawResponse::get(addr, &resume_path(&name), "").await;
    let (a, b) = tokio::join!(rest(&mut first), rest(&mut second));
    assert_eq!(a.len(), 202);
    assert_eq!(a, b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_the_log_no_longer_holds_and_unknown_ids_are_refused() {
    let addr = start(&[
        "--step-ms",
        "0",
        "--resume-grace-ms",
        "5000",
        "--replay-bytes",
        "4000",
    ]);
    let (mut first, name) = post_stream(addr, 500).await;
    assert_eq!(rest(&mut first).await.len(), 502);
    let mut gone = RawResponse::get(addr, &resume_path(&name), "Last-Event-ID: 3\r\n").await;
    assert_eq!(gone.status(), 409);
    assert!(gone.text().await.contains("\"error\""));
    let mut recent = RawResponse::get(addr, &format!("{}?after=499", resume_path(&name)), "").await;
    assert_eq!(
        rest(&mut recent)
            .await
            .iter()
            .map(|e| e.0)
            .collect::<Vec<_>>(),
        [500, 501]
    );
    let unknown = RawResponse::get(addr, &resume_path("nope"), "").await;
    assert_eq!(unknown.status(), 404);
    // The log stays within its bound (chunks as the gate counts them).
    assert!(stats(addr).await["replay_bytes"].as_u64().unwrap() <= 4000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_source_reconnect_attaches_to_the_running_stream() {
    let addr = start(&[
        "--step-ms",
        "2",
        "--resume-grace-ms",
        "5000",
        "--token-salt",
    ]);
    let path = "/v1/stream?max_tokens=40&id=tab-1";
    let mut first = RawResponse::get(addr, path, "").await;
    assert_eq!(first.header("x-request-id").as_deref(), Some("tab-1"));
    let mut seen = events(&mut first, 5).await;
    drop(first);
    let mut again = RawResponse::get(addr, path, "Last-Event-ID: 4\r\n").await;
    seen.extend(rest(&mut again).await);
    assert_eq!(
        seen.iter().map(|e| e.0).collect::<Vec<_>>(),
        (0..42).collect::<Vec<_>>()
    );
    assert_eq!(salts(&seen), 1, "never regenerated");
    let stats = wait_for(addr, "it completes", |s| s["streams_completed"] == 1).await;
    assert_eq!(stats["streams_started"], 1);
}

/// A detached stream paused at a full replay log (its generator blocked on the gate): an
/// explicit cancel still stops the generator and frees its KV blocks at once, not at the end of
/// the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_a_detached_stream_paused_at_a_full_log() {
    let addr = start(&[
        "--step-ms",
        "1",
        "--resume-grace-ms",
        "60000",
        "--replay-bytes",
        "3000",
    ]);
    let (mut first, name) = post_stream(addr, LONG).await;
    events(&mut first, 2).await;
    drop(first);
    wait_for(addr, "the stream detaches", |s| s["streams_detached"] == 1).await;
    // The 3000-byte log fills and the generator blocks on it, holding its blocks.
    let paused = until_paused(addr).await;
    assert_eq!(paused["generators_running"], 1, "{paused}");
    assert!(paused["kv_blocks_in_use"].as_u64() > Some(0), "{paused}");
    let path = format!("/v1/chat/completions/{name}/cancel");
    let mut stopped = RawResponse::post_json(addr, &path, "").await;
    assert!(stopped.text().await.contains("\"cancelled\":true"));
    let stats = wait_for(addr, "the generator stops", |s| {
        s["generators_running"] == 0 && s["kv_blocks_in_use"] == 0
    })
    .await;
    assert_eq!(stats["streams_expired"], 0, "stopped, not expired");
}

/// Without a grace nobody can resume, so the replay log holds only what a reader has still to
/// read: a stopped reader's stream stays within the gate-sized read-ahead, not `--replay-bytes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_grace_the_log_keeps_only_what_is_unread() {
    let addr = start(&["--step-ms", "0"]);
    let (mut reader, _) = post_stream(addr, LONG).await;
    events(&mut reader, 1).await;
    // The reader stops: the generator runs ahead as far as the bounds let it, then waits.
    let paused = until_paused(addr).await;
    assert_eq!(paused["generators_running"], 1, "{paused}");
    let held = paused["replay_bytes"].as_u64().unwrap();
    // 64 events (the read-ahead) of a few hundred bytes each, far below 1 MiB.
    assert!(held <= 64 * 1024, "{held} bytes held");
    drop(reader);
}

/// After `[DONE]` an `EventSource` reconnects with the last id it saw: nothing follows it, and a
/// 204 stops the reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_after_the_end_gets_no_content() {
    let addr = start(&["--step-ms", "0", "--resume-grace-ms", "5000"]);
    let path = "/v1/stream?max_tokens=5&id=tab-9";
    let mut first = RawResponse::get(addr, path, "").await;
    let seen = rest(&mut first).await;
    assert_eq!(seen.last().map(|e| e.1.as_str()), Some("[DONE]"));
    let last = seen.last().unwrap().0;
    let again = RawResponse::get(addr, path, &format!("Last-Event-ID: {last}\r\n")).await;
    assert_eq!(again.status(), 204);
    // An earlier position still replays what follows it.
    let mut earlier = RawResponse::get(addr, path, "Last-Event-ID: 3\r\n").await;
    assert_eq!(
        rest(&mut earlier)
            .await
            .iter()
            .map(|e| e.0)
            .collect::<Vec<_>>(),
        [4, 5, 6]
    );
}

/// An unparsable `Last-Event-ID` (or `?after=`) is refused with an OpenAI-shaped 400, on the
/// resume path and on `GET /v1/stream`, never taken for "from the start": a client that had
/// events would get them twice. So is an `id` that is no valid request id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unparsable_last_event_id_is_refused_never_replayed_from_the_start() {
    let addr = start(&["--step-ms", "0", "--resume-grace-ms", "5000"]);
    let (mut first, name) = post_stream(addr, 5).await;
    assert_eq!(rest(&mut first).await.len(), 7);
    let mut open = RawResponse::get(addr, "/v1/stream?max_tokens=5&id=tab-2", "").await;
    assert_eq!(rest(&mut open).await.len(), 7);
    let refused = |mut response: RawResponse, what: &'static str| async move {
        assert_eq!(response.status(), 400, "{what}");
        let body: serde_json::Value = serde_json::from_str(&response.text().await).unwrap();
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        let message = body["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains(what), "{message}");
    };
    for bad in ["abc", "-1", "1.5", "99999999999999999999", "+2"] {
        let header = format!("Last-Event-ID: {bad}\r\n");
        for path in [
            resume_path(&name),
            "/v1/stream?max_tokens=5&id=tab-2".to_owned(),
            "/v1/stream?max_tokens=5".to_owned(),
        ] {
            refused(
                RawResponse::get(addr, &path, &header).await,
                "Last-Event-ID",
            )
            .await;
        }
        let path = format!("{}?after={bad}", resume_path(&name));
        refused(RawResponse::get(addr, &path, "").await, "after").await;
    }
    let bad_id = "/v1/stream?max_tokens=5&id=tab%2F3";
    refused(RawResponse::get(addr, bad_id, "").await, "`id`").await;
    // A valid one still resumes after it; an empty one is none (from the start).
    let mut after = RawResponse::get(addr, &resume_path(&name), "Last-Event-ID: 4\r\n").await;
    let ids: Vec<u64> = rest(&mut after).await.iter().map(|e| e.0).collect();
    assert_eq!(ids, [5, 6]);
    let mut all = RawResponse::get(addr, &resume_path(&name), "Last-Event-ID: \r\n").await;
    assert_eq!(rest(&mut all).await.len(), 7);
    assert_eq!(stats(addr).await["streams_started"], 2, "no regeneration");
}
