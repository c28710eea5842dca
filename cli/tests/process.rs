//! The `streamgate` binary as a real child process, where a test needs the process itself:
//! `sim --die-after` dies abruptly mid-stream in every API (the client's connection is cut with
//! no terminal frame, the exit status says it was killed), and flags that cannot mean anything are refused
//! at start with exit status 2 and the flag's name (sim's own, and the shared resume flags, for
//! the proxy too), as is a fleet the proxy cannot serve.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use common::formats::{Api, read_all, text, tokens};
use common::resume_client::{chat, parse};
use common::{BodyEnd, HANG, RawResponse};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// `streamgate ARGS`, with its output piped.
fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_streamgate"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the streamgate binary runs")
}

/// `streamgate sim --addr 127.0.0.1:0 FLAGS`, once it prints where it listens.
fn sim(flags: &[&str]) -> (Child, SocketAddr) {
    let mut args = vec!["sim", "--addr", "127.0.0.1:0"];
    args.extend_from_slice(flags);
    let mut child = spawn(&args);
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(HANG)
        .expect("a `listening on` line in time");
    let addr = line
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("{line:?}"))
        .parse()
        .unwrap();
    (child, addr)
}

/// Waits for `child` to exit (killing it and failing the test if it does not within
/// [`HANG`]); its status and standard error.
fn exited(mut child: Child) -> (ExitStatus, String) {
    let deadline = Instant::now() + HANG;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("the process did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status, stderr)
}

/// The process was killed by SIGKILL (not an exit, not a clean shutdown), and said why first.
fn assert_killed(status: ExitStatus, stderr: &str, n: u64) {
    assert!(!status.success(), "{status:?}");
    assert_eq!(status.signal(), Some(9), "{status:?}: {stderr}");
    assert!(stderr.contains(&format!("--die-after {n}")), "{stderr}");
}

/// The events of a stream cut by the process's death: a first run of tokens (`t0 `, `t1 `,
/// ..., ids from 0), and nothing after it: no final chunk, no `[DONE]`, no `event: error`.
async fn cut_tokens(response: &mut RawResponse) -> u64 {
    let frames = response.rest().await;
    assert_eq!(response.ended(), Some(BodyEnd::Cut), "{frames:?}");
    for (i, frame) in frames.iter().enumerate() {
        assert!(!frame.starts_with("event:"), "no terminal frame: {frame}");
        assert_eq!(parse(frame), (i as u64, format!("t{i} ")), "{frames:?}");
    }
    frames.len() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn die_after_kills_the_process_mid_stream() {
    let (child, addr) = sim(&["--step-ms", "5", "--die-after", "10"]);
    let mut response = RawResponse::post_json(addr, "/v1/chat/completions", &chat(100)).await;
    assert_eq!(response.status(), 200);
    let delivered = cut_tokens(&mut response).await;
    assert!(delivered <= 10, "{delivered} tokens");
    let (status, stderr) = exited(child);
    assert_killed(status, &stderr, 10);

    // A stream of exactly N tokens dies before its final chunk.
    let (child, addr) = sim(&["--step-ms", "5", "--die-after", "3"]);
    let mut response = RawResponse::post_json(addr, "/v1/chat/completions", &chat(3)).await;
    assert!(cut_tokens(&mut response).await <= 3);
    let (status, stderr) = exited(child);
    assert_killed(status, &stderr, 3);
}

/// A Messages or Responses stream is cut the same way: its events before the first token, then
/// tokens, and nothing after them (no final events, no `event: error`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn die_after_cuts_every_api_mid_stream() {
    for api in Api::ALL {
        let (child, addr) = sim(&["--step-ms", "5", "--die-after", "10"]);
        let body = api.body(100, true, None);
        let mut response = RawResponse::post(addr, api.path(), "", &body).await;
        assert_eq!(response.status(), 200);
        let events = read_all(api, &response.rest().await);
        assert_eq!(response.ended(), Some(BodyEnd::Cut), "{events:?}");
        let opened = api.opening().len();
        let made = events.len() - opened;
        assert!(made <= 10, "{made} tokens");
        assert!(
            events[opened..]
                .iter()
                .all(|event| event.kind == api.delta()),
            "{events:?}"
        );
        assert_eq!(text(&events), tokens(0..made as u64));
        let (status, stderr) = exited(child);
        assert_killed(status, &stderr, 10);
    }
}

/// A whole answer (no `stream`) is cut before its response head: the client gets no byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn die_after_cuts_a_whole_answer_before_its_head() {
    let (child, addr) = sim(&["--step-ms", "5", "--die-after", "2"]);
    let body = chat(50).replace("\"stream\":true", "\"stream\":false");
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = common::post_request(addr, "/v1/chat/completions", "", &body);
    socket.write_all(&request).await.unwrap();
    let mut received = Vec::new();
    // A reset or an end: either way, nothing came.
    let _ = tokio::time::timeout(HANG, socket.read_to_end(&mut received))
        .await
        .expect("the connection ends in time");
    assert!(
        received.is_empty(),
        "{}",
        String::from_utf8_lossy(&received)
    );
    let (status, stderr) = exited(child);
    assert_killed(status, &stderr, 2);
}

/// Flags that cannot mean anything, or only half of a pair, stop the command at start: exit
/// status 2 and a message naming the flag, before it listens.
#[test]
fn absurd_or_contradictory_flags_are_refused_at_start() {
    let sim = |flags: &[&str]| {
        let mut args = vec!["sim", "--addr", "127.0.0.1:0"];
        args.extend_from_slice(flags);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let proxy = |flags: &[&str]| {
        let mut args = vec![
            "proxy",
            "--addr",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:9",
        ];
        args.extend_from_slice(flags);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let redis = ["--resume-store", "redis://127.0.0.1:9"];
    // A fleet that cannot serve: a file that is no TOML, a pool without upstreams, a fallback
    // cycle.
    let file = |name: &str, text: &str| {
        let path = std::env::temp_dir().join(format!("process-{}-{name}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let fleet = |file: &str| {
        ["proxy", "--addr", "127.0.0.1:0", "--config", file]
            .map(str::to_owned)
            .to_vec()
    };
    let (malformed, empty) = (
        file("malformed.toml", "[[pool]\nname = "),
        file("empty.toml", "[[pool]]\nname = \"p\"\nupstreams = []\n"),
    );
    let cycle = file("cycle.json", r#"{"a": "b", "b": ["a"]}"#);
    let cases = [
        (sim(&["--stall-ms", "100"]), "--stall-at"),
        (sim(&["--stall-at", "3"]), "--stall-ms"),
        (sim(&["--kv-blocks", "0"]), "--kv-blocks"),
        (sim(&["--resume-grace-ms", "86400001"]), "--resume-grace-ms"),
        (
            sim(&["--resume-grace-ms", "99999999999999999"]),
            "--resume-grace-ms",
        ),
        (sim(&redis), "needs --resume-grace-ms"),
        (
            proxy(&["--resume-grace-ms", "99999999999999999"]),
            "--resume-grace-ms",
        ),
        (proxy(&redis), "needs --resume-grace-ms"),
        (proxy(&["--max-attempts", "0"]), "--max-attempts"),
        (fleet(&malformed), "--config"),
        (fleet(&empty), "has no upstream"),
        (
            proxy(&["--fallbacks", &cycle]),
            "fallback cycle: a -> b -> a",
        ),
    ];
    for (args, named) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut child = spawn(&args);
        let mut stdout = child.stdout.take().unwrap();
        let (status, stderr) = exited(child);
        let mut out = String::new();
        stdout.read_to_string(&mut out).unwrap();
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
        assert!(!out.contains("listening on"), "{args:?}: {out}");
    }
}
