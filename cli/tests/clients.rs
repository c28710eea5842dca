//! Real clients through `streamgate proxy` in front of `streamgate sim`: `curl -N` and the
//! `openai` Python SDK, as users run them. A client that is not installed is skipped, loudly
//! (`.ci/run` installs both).

use std::net::SocketAddr;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::Value;
use streamgate_cli::{proxy, serving, sim};

fn prometheus() -> PrometheusHandle {
    static PROMETHEUS: OnceLock<PrometheusHandle> = OnceLock::new();
    PROMETHEUS
        .get_or_init(|| serving::prometheus().expect("the test process's recorder"))
        .clone()
}

/// `streamgate sim` (one token per ms, with `sim_flags`) and a proxy in front of it (with
/// `proxy_flags`); returns the proxy's address.
fn start(sim_flags: &[&str], proxy_flags: &[&str]) -> SocketAddr {
    let mut flags = vec!["--addr", "127.0.0.1:0", "--step-ms", "1"];
    flags.extend_from_slice(sim_flags);
    let config = sim::Config::parse_from(flags).unwrap();
    let (listener, app, server) = sim::app(config, prometheus()).expect("sim starts");
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(serving::serve_until(
        listener,
        app,
        server.streams().clone(),
        std::future::pending(),
    ));
    let mut flags = vec!["--upstream", upstream.as_str(), "--addr", "127.0.0.1:0"];
    flags.extend_from_slice(proxy_flags);
    let config = proxy::Config::parse_from(flags).unwrap();
    proxy::spawn(config, prometheus()).expect("the proxy starts")
}

fn expected_text(tokens: u64) -> String {
    (0..tokens).map(|i| format!("t{i} ")).collect()
}

/// Runs `program args` off the runtime's threads (the servers run on them); `None` when the
/// program is not there.
async fn run(program: &'static str, args: Vec<String>) -> Option<std::process::Output> {
    tokio::task::spawn_blocking(move || Command::new(program).args(args).output())
        .await
        .unwrap()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_streams_through_the_proxy() {
    let proxy = start(&[], &[]);
    let body = r#"{"model":"sim","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":50}"#;
    let args = [
        "-sS",
        "-N",
        "--max-time",
        "20",
        "-D",
        "-",
        "-H",
        "content-type: application/json",
        "-H",
        "x-request-id: from-curl",
        "-d",
        body,
    ];
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    args.push(format!("http://{proxy}/v1/chat/completions"));
    let Some(output) = run("curl", args).await else {
        eprintln!("\n*** SKIPPED curl_streams_through_the_proxy: curl is not installed ***\n");
        return;
    };
    assert!(
        output.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    let (head, body) = text.split_once("\r\n\r\n").expect("headers, then the body");
    let head = head.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    for header in [
        "content-type: text/event-stream",
        "cache-control: no-cache",
        "x-accel-buffering: no",
        "x-request-id: from-curl",
    ] {
        assert!(head.contains(header), "no `{header}` in\n{head}");
    }
    let mut content = String::new();
    let mut done = false;
    for data in body.lines().filter_map(|line| line.strip_prefix("data: ")) {
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let chunk: Value = serde_json::from_str(data).expect("each event is a JSON chunk");
        content += chunk["choices"][0]["delta"]["content"]
            .as_str()
            .unwrap_or("");
    }
    assert!(done, "no [DONE]:\n{body}");
    assert_eq!(content, expected_text(50));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_streams_through_the_proxy_and_its_heartbeats() {
    let has_sdk = run("python3", vec!["-c".into(), "import openai".into()])
        .await
        .is_some_and(|output| output.status.success());
    if !has_sdk {
        eprintln!(
            "\n*** SKIPPED the_openai_sdk_streams_through_the_proxy_and_its_heartbeats: the openai Python package \
             is not installed (`python3 -m pip install openai`) ***\n"
        );
        return;
    }
    // A 1 s decode stall at token 40, bridged by heartbeats every 100 ms: the SDK reads them
    // among events that carry ids.
    let proxy = start(
        &["--stall-at", "40", "--stall-ms", "1000"],
        &["--heartbeat-ms", "100"],
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/openai_sdk.py");
    let args = vec![
        script.to_owned(),
        format!("http://{proxy}/v1"),
        "200".into(),
    ];
    let output = tokio::time::timeout(Duration::from_secs(60), run("python3", args))
        .await
        .expect("the SDK finished")
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the SDK failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut lines = stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON"));
    let streamed = lines.next().expect("the stream's line");
    assert_eq!(streamed["text"], expected_text(200));
    assert_eq!(streamed["finish_reason"], "length");
    let refused = lines.next().expect("the error's line");
    // The upstream's 400 reaches the SDK as a 400, which it raises as BadRequestError.
    assert_eq!(refused["error"], "BadRequestError", "{refused}");
    assert_eq!(refused["status"], 400);
}
