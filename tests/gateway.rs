//! The gateway example in front of the reference server, over real sockets: content passes
//! through, cancellation crosses the hop, and hop records from worker, gateway and client name
//! the hop where an injected stall began.
#![cfg(all(feature = "axum", feature = "metrics", feature = "timeline"))]
// Both examples include the examples' shared module; each gets its own copy here.
#![allow(clippy::duplicate_mod)]

mod common;

#[allow(dead_code)] // the example's `main` is not called here
#[path = "../examples/serve.rs"]
mod serve;

#[allow(dead_code)]
#[path = "../examples/gateway.rs"]
mod gateway;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use common::{HANG, RawResponse, wait_for};
use metrics_exporter_prometheus::PrometheusHandle;
use streamgate::Kind;
use streamgate::probe::{HopProbe, Observation, RecordSink};
use streamgate::timeline::Timeline;
use streamgate::transport::Server;
use tokio::time::{Instant, sleep};

fn prometheus() -> PrometheusHandle {
    static PROMETHEUS: OnceLock<PrometheusHandle> = OnceLock::new();
    PROMETHEUS
        .get_or_init(|| serve::prometheus().expect("the test process's recorder"))
        .clone()
}

fn args(flags: &[&str]) -> impl Iterator<Item = String> {
    ["--addr", "127.0.0.1:0"]
        .iter()
        .chain(flags)
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .into_iter()
}

/// A worker with `worker_flags` and a gateway in front of it with `gateway_flags`, served as
/// their `main`s serve them.
async fn path(worker_flags: &[&str], gateway_flags: &[&str]) -> (SocketAddr, SocketAddr) {
    let config = serve::parse_args(args(worker_flags)).unwrap();
    let (listener, app, _) = serve::app(config, prometheus()).unwrap();
    let worker = listener.local_addr().unwrap();
    tokio::spawn(Server::new().serve(listener, app, std::future::pending()));
    let upstream = format!("http://{worker}");
    let mut flags = vec!["--upstream", upstream.as_str()];
    flags.extend_from_slice(gateway_flags);
    let config = gateway::parse_args(args(&flags)).unwrap();
    let (listener, app, _) = gateway::app(config, prometheus()).unwrap();
    let gateway = listener.local_addr().unwrap();
    tokio::spawn(Server::new().serve(listener, app, std::future::pending()));
    (worker, gateway)
}

fn chat(max_tokens: u64) -> String {
    format!(
        r#"{{"model":"sim","messages":[{{"role":"user","content":"hi"}}],"stream":true,"max_tokens":{max_tokens}}}"#
    )
}

async fn post(addr: SocketAddr, request_id: &str, body: &str) -> RawResponse {
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nx-request-id: {request_id}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    RawResponse::send(addr, &request).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_pass_through_in_order() {
    let (_, gateway) = path(&["--step-ms", "1"], &[]).await;
    let mut response = post(gateway, "r1", &chat(10)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.header("x-accel-buffering").as_deref(), Some("no"));
    let frames = response.rest().await;
    assert_eq!(frames.len(), 12, "{frames:?}");
    for (i, frame) in frames[..10].iter().enumerate() {
        assert!(frame.contains(&format!("\"content\":\"t{i} \"")), "{frame}");
    }
    // Every event carries its id: the final chunk and `[DONE]` the ids after the tokens'.
    assert_eq!(frames[11], "id: 11\ndata: [DONE]\n\n");
    // Errors pass through.
    let mut refused = post(gateway, "r2", r#"{"messages":[],"max_tokens":0}"#).await;
    assert_eq!(refused.status(), 400);
    assert!(refused.body_text().await.contains("invalid_request_error"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_the_gateway_cancels_the_worker() {
    let (worker, gateway) = path(&["--step-ms", "1"], &[]).await;
    let mut response = post(gateway, "leaver", &chat(100_000)).await;
    for _ in 0..30 {
        response.expect_frame().await;
    }
    drop(response);
    let worker_stats = wait_for(worker, "the worker's generator stops", |s| {
        s["generators_running"] == 0 && s["kv_blocks_in_use"] == 0
    })
    .await;
    assert_eq!(worker_stats["streams_cancelled"], 1);
    assert!(worker_stats["tokens_after_cancel"].as_u64().unwrap() <= 1);
    wait_for(gateway, "the gateway's stream ends", |s| {
        s["streams_running"] == 0 && s["streams_cancelled"] == 1
    })
    .await;
}

const PATH: [&str; 7] = [
    "worker.decode",
    "worker.publish",
    "worker.write",
    "worker.sent",
    "gateway.recv",
    "gateway.write",
    "client.recv",
];

/// Streams one request through worker and gateway with hop records at every hop (the client's
/// written here), and returns the diagnosis.
async fn diagnose(
    worker_flags: &[&str],
    gateway_flags: &[&str],
    tag: &str,
) -> Vec<(String, Option<u64>)> {
    let dir = std::env::temp_dir();
    let file = |hop: &str| -> PathBuf {
        dir.join(format!("records-{tag}-{hop}-{}.jsonl", std::process::id()))
    };
    let (worker_file, gateway_file, client_file) =
        (file("worker"), file("gateway"), file("client"));
    for f in [&worker_file, &gateway_file, &client_file] {
        let _ = std::fs::remove_file(f);
    }
    let mut worker_flags = worker_flags.to_vec();
    worker_flags.extend(["--hop-records", worker_file.to_str().unwrap()]);
    let mut gateway_flags = gateway_flags.to_vec();
    gateway_flags.extend(["--hop-records", gateway_file.to_str().unwrap()]);
    let (_, gateway) = path(&worker_flags, &gateway_flags).await;

    let sink = RecordSink::to_file(&client_file).unwrap();
    let client = HopProbe::new("client.recv").records(sink.clone(), 1.0);
    let mut recorder = client.recorder(tag);
    let mut response = post(gateway, tag, &chat(60)).await;
    while let Some(frame) = response.next_frame().await {
        // A heartbeat has no data; the final chunk is marked `:control`; `[DONE]` is control.
        let data = frame.lines().any(|line| line.starts_with("data:"));
        let kind = if !data || frame.starts_with(":control\n") || frame.contains("data: [DONE]") {
            Kind::Control
        } else {
            Kind::Visible
        };
        let seq = frame
            .lines()
            .find_map(|line| line.strip_prefix("id: "))
            .and_then(|id| id.parse().ok());
        if data {
            recorder.observe(Observation::new(seq, frame.len() as u64, kind));
        }
    }
    recorder.end("completed");
    sink.sync();
    // The servers' writers flush as soon as they are idle: wait for every hop's records.
    let deadline = Instant::now() + HANG;
    let mut timeline;
    loop {
        timeline = Timeline::new(PATH, Duration::from_millis(500));
        for f in [&worker_file, &gateway_file, &client_file] {
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
    let diagnosis = timeline.diagnose();
    for f in [&worker_file, &gateway_file, &client_file] {
        let _ = std::fs::remove_file(f);
    }
    diagnosis
        .stalls
        .into_iter()
        .map(|stall| (stall.hop, stall.seq))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_records_name_the_hop_where_a_stall_began() {
    let stalls = diagnose(
        &["--step-ms", "2", "--stall-at", "20", "--stall-ms", "800"],
        &[],
        "worker-stall",
    )
    .await;
    assert_eq!(stalls, [("worker.decode".to_owned(), Some(20))]);
    let stalls = diagnose(
        &["--step-ms", "2"],
        &["--stall-at", "30", "--stall-ms", "800"],
        "gateway-stall",
    )
    .await;
    assert_eq!(stalls, [("gateway.recv".to_owned(), Some(30))]);
}
