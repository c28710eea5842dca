//! `streamgate diagnose`: what its exit status says (stalls found, none, a usage error, nothing
//! analysed), stdin, directories and a closed pipe, driven in process through
//! `streamgate_cli::diagnose`; and the real binary, as a shell runs it.

use std::io::{self, Write};
use std::process::{Command, Stdio};

use streamgate::Kind;
use streamgate::probe::{HopRecord, RecordKind};
use streamgate_cli::diagnose;

const W: &str = "worker.publish";
const G: &str = "gateway.write";

/// Five visible events of request `r` at `hop`, one every 10 ms, with `pause_ms` more before
/// event 2: one stall at the default threshold (1 s) when the pause is that long.
fn records(hop: &str, pause_ms: u64) -> String {
    let mut lines = String::new();
    for seq in 0..5 {
        let extra = if seq >= 2 { pause_ms } else { 0 };
        let record = HopRecord {
            request: "r".into(),
            hop: hop.into(),
            seq,
            t_ns: (10 * seq + extra) * 1_000_000,
            bytes: 5,
            kind: RecordKind::Event(Kind::Visible),
            busy_ns: None,
            attrs: Vec::new(),
        };
        lines.push_str(&record.to_json_line());
        lines.push('\n');
    }
    lines
}

/// Runs the command in process: its status, standard output and standard error. A flag clap
/// refuses is the status and message the command's `main` would exit with.
fn run(args: &[&str], stdin: &str) -> (u8, String, String) {
    let args = match diagnose::Args::parse_from(args) {
        Ok(args) => args,
        Err(error) => {
            let status = u8::try_from(error.exit_code()).expect("a small status");
            return (status, String::new(), error.render().to_string());
        }
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let status = diagnose::run(args, stdin.as_bytes(), &mut out, &mut err);
    (
        status,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

#[test]
fn the_command_says_in_its_status_whether_it_found_stalls() {
    let (stalled, regular) = (records(W, 3000), records(W, 0));
    let (status, out, _) = run(&["--path", W, "-"], &stalled);
    assert_eq!(status, 1, "{out}");
    assert!(out.contains("began at worker.publish"), "{out}");
    let (status, out, _) = run(&["--path", W, "--json", "-"], &regular);
    assert_eq!(status, 0);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["records"], 5);

    // Usage errors: 2, from the flags' parser...
    for args in [
        &["--path", W][..],
        &["-"][..],
        &["--path", W, "--stall-ms", "0", "-"][..],
        &["--path", W, "--since", "5", "x"][..],
        &["--path", W, "--bogus", "-"][..],
        &["--path", W, "--by", "", "-"][..],
    ] {
        let (status, _, err) = run(args, "");
        assert_eq!(status, 2, "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{err}");
    }
    // ... and from what the flags cannot say by themselves, or no readable input.
    for args in [
        &["--path", W, "--since", "5m", "-"][..],
        &["--path", "a,a", "-"][..],
        &["--path", W, "-", "-"][..],
        &["--path", W, "/nonexistent/records.jsonl"][..],
        &["--path", W, "--by", "pool,length,position", "-"][..],
        &["--path", W, "--by", "pool,pool", "-"][..],
    ] {
        let (status, _, err) = run(args, "");
        assert_eq!(status, 2, "{args:?}: {err}");
        assert!(err.starts_with("diagnose: "), "{err}");
    }
    // A hop with nothing analysed is not "no stalls": a misspelt hop, alone or beside real
    // ones, a request with no records.
    let beside = format!("{W},client.rcv");
    for (args, missing) in [
        (&["--path", "worker.publsh", "-"][..], "worker.publsh"),
        (&["--path", beside.as_str(), "-"][..], "client.rcv"),
        (&["--path", W, "--request", "nobody", "-"][..], W),
    ] {
        let (status, out, err) = run(args, &stalled);
        assert_eq!(status, 2, "{args:?}: {err}");
        assert!(
            err.contains(&format!("no record of {missing} on --path")),
            "{err}"
        );
        assert!(
            out.contains(" requests, "),
            "the report still says what was read: {out}"
        );
    }

    // A directory: every record file in it (a rotated one too), not the plot beside them.
    let dir = std::env::temp_dir().join(format!("streamgate-diagnose-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("w.jsonl"), &stalled).unwrap();
    std::fs::write(dir.join("g.jsonl.1"), records(G, 3000)).unwrap();
    std::fs::write(dir.join("gaps.svg"), "<svg>not records</svg>\n").unwrap();
    let path = format!("{W},{G}");
    let (status, out, _) = run(&["--path", &path, dir.to_str().unwrap()], "");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(status, 1);
    assert!(
        out.starts_with("1 requests, 10 records from 10 lines"),
        "{out}"
    );
    assert!(out.contains("1 stalls (0 unknown):"), "{out}");
}

/// A writer whose reader is gone.
struct ClosedPipe;

impl Write for ClosedPipe {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::ErrorKind::BrokenPipe.into())
    }

    fn flush(&mut self) -> io::Result<()> {
        Err(io::ErrorKind::BrokenPipe.into())
    }
}

#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    let stalled = records(W, 3000);
    let mut err = Vec::new();
    let args = diagnose::Args::parse_from(["--path", W, "-"]).unwrap();
    let status = diagnose::run(args, stalled.as_bytes(), &mut ClosedPipe, &mut err);
    assert_eq!(status, 1, "the status still says what was found");
    assert!(err.is_empty(), "{}", String::from_utf8_lossy(&err));
}

/// `streamgate diagnose ARGS` with `stdin`: its exit status, standard output and error.
fn streamgate(args: &[&str], stdin: &str) -> (Option<i32>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_streamgate"))
        .arg("diagnose")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the streamgate binary runs");
    // A command that exits before reading it all closes the pipe: not this test's failure.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let output = child.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[test]
fn the_binary_exits_with_the_status_a_shell_sees() {
    let (status, out, _) = streamgate(&["--path", W, "-"], &records(W, 3000));
    assert_eq!(status, Some(1), "{out}");
    assert!(out.contains("began at worker.publish"), "{out}");
    let (status, out, _) = streamgate(&["--path", W, "-"], &records(W, 0));
    assert_eq!(status, Some(0), "{out}");
    let (status, _, err) = streamgate(&["--path", W, "--bogus", "-"], "");
    assert_eq!(status, Some(2), "{err}");
    assert!(err.contains("--bogus"), "{err}");
    let (status, _, err) = streamgate(&["--path", "worker.publsh", "-"], &records(W, 3000));
    assert_eq!(status, Some(2), "{err}");
    assert!(
        err.contains("no record of worker.publsh on --path"),
        "{err}"
    );
}

#[test]
fn by_a_pool_the_report_lists_the_stalled_pool_first() {
    // Request `r` (pool b) stalls; `s` (pool a) does not.
    let mut input = records(W, 3000).replacen(
        "\"kind\":\"visible\"",
        "\"kind\":\"visible\",\"attrs\":{\"pool\":\"b\"}",
        1,
    );
    input.push_str(
        &records(W, 0)
            .replace("\"request\":\"r\"", "\"request\":\"s\"")
            .replacen(
                "\"kind\":\"visible\"",
                "\"kind\":\"visible\",\"attrs\":{\"pool\":\"a\"}",
                1,
            ),
    );
    let (status, out, err) = run(&["--path", W, "--by", "pool", "-"], &input);
    assert_eq!(status, 1, "{err}");
    let table: Vec<&str> = out
        .lines()
        .skip_while(|line| !line.starts_with("by pool"))
        .collect();
    assert!(
        table[0].starts_with("by pool (gap p99 at worker.publish;"),
        "{out}"
    );
    let rows: Vec<Vec<&str>> = table[2..4]
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0][..4], ["b", "1", "1", "100.00%"], "{out}");
    assert_eq!(rows[0][5..], ["worker.publish", "1"], "{out}");
    assert_eq!(rows[1][..4], ["a", "1", "0", "0.00%"], "{out}");
    let (_, json, _) = run(&["--path", W, "--by", "pool", "--json", "-"], &input);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let slices = &json["slices"][0];
    assert_eq!(slices["by"], serde_json::json!(["pool"]));
    assert_eq!(slices["rows"][0]["values"], serde_json::json!(["b"]));
    assert_eq!(slices["rows"][0]["began"]["worker.publish"], 1);
    assert_eq!(slices["rows"][1]["stall_rate"], 0.0);

    // The plot, split by the pool: a second chart, a line per pool.
    let dir = std::env::temp_dir().join(format!("streamgate-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("gaps.svg");
    let args = [
        "--path",
        W,
        "--by",
        "pool",
        "--plot",
        svg.to_str().unwrap(),
        "-",
    ];
    let (status, out, err) = run(&args, &input);
    assert_eq!(status, 1, "{err}");
    assert!(out.contains("gap by output position written to"), "{out}");
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(
        drawn.contains("gap p99 at worker.publish by output position, per pool"),
        "{drawn}"
    );
    assert!(
        drawn.contains("pool=a") && drawn.contains("pool=b"),
        "{drawn}"
    );
    // Without an attribute to split by, one chart.
    let (_, _, err) = run(&["--path", W, "--plot", svg.to_str().unwrap(), "-"], &input);
    assert!(err.is_empty(), "{err}");
    assert!(!std::fs::read_to_string(&svg).unwrap().contains("per pool"));
    let _ = std::fs::remove_dir_all(&dir);
}
