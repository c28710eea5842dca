//! `streamgate loadgen` against the reference server in process: its report counts what its
//! clients did and what the server's `/stats` said, under the keys `--json` prints.

mod common;
#[path = "common/hostile.rs"]
mod hostile;

use common::LONG;
use common::reference::start;
use hostile::{Case, Hostile};
use streamgate_cli::{flags, loadgen};

fn args(addr: std::net::SocketAddr, flags: &[&str]) -> loadgen::Args {
    let addr = addr.to_string();
    let all = ["--addr", addr.as_str()]
        .into_iter()
        .chain(flags.iter().copied());
    flags::parse_from("loadgen", all).expect("valid flags")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_counts_what_the_clients_and_the_server_did() {
    let addr = start(&["--step-ms", "1"]);
    let flags = [
        "--streams",
        "4",
        "--tokens",
        "30",
        "--disconnect",
        "0.25",
        "--after",
        "5",
    ];
    let report = loadgen::run(&args(addr, &flags), None).await;
    assert_eq!(report.streams, 4, "{report:?}");
    assert_eq!(report.completed, 3, "{report:?}");
    assert_eq!(report.disconnected, 1, "{report:?}");
    assert_eq!((report.resumed, report.resume_mismatches), (0, 0));
    assert_eq!(report.failed, 0, "{report:?}");
    assert!(report.errors.is_empty());
    // 30 tokens, the final chunk and [DONE] for each completed stream; 5 for the one that left.
    assert_eq!(report.events, 3 * 32 + 5, "{report:?}");
    let generated = report.tokens_generated.expect("sim counts its tokens");
    assert!((3 * 30 + 5..=4 * 30).contains(&generated), "{report:?}");
    assert!(report.wasted_tokens.is_some_and(|n| n <= 1), "{report:?}");
    let (p50, p99) = (report.gap_p50_ms.unwrap(), report.gap_p99_ms.unwrap());
    assert!(
        0.0 < p50 && p50 <= p99 && p99 <= report.gap_max_ms,
        "{report:?}"
    );
    assert!(report.ttfe_p50_ms.is_some() && report.wall_s > 0.0 && report.events_per_s > 0.0);
    assert_eq!(
        report.released_after_last_disconnect_ms, None,
        "not every stream left"
    );

    let json = serde_json::to_value(&report).unwrap();
    let keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut expected = [
        "streams",
        "completed",
        "disconnected",
        "resumed",
        "resume_mismatches",
        "failed",
        "ended_by",
        "unexplained",
        "text_mismatches",
        "cuts_taken_up",
        "slowloris",
        "errors",
        "events",
        "wall_s",
        "events_per_s",
        "gap_p50_ms",
        "gap_p99_ms",
        "gap_max_ms",
        "ttfe_p50_ms",
        "ttfe_p99_ms",
        "tokens_generated",
        "wasted_tokens",
        "released_after_last_disconnect_ms",
    ];
    expected.sort_unstable();
    assert_eq!(keys, expected);
    assert!(json["released_after_last_disconnect_ms"].is_null());
    assert!(json["slowloris"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_client_leaves_the_report_says_how_soon_the_server_let_go() {
    let addr = start(&["--step-ms", "1"]);
    let long = LONG.to_string();
    let flags = [
        "--streams",
        "3",
        "--tokens",
        &long,
        "--disconnect",
        "1",
        "--after",
        "3",
    ];
    let report = loadgen::run(&args(addr, &flags), None).await;
    assert_eq!((report.disconnected, report.failed), (3, 0), "{report:?}");
    // Within a second (it takes milliseconds), not the 65 s the streams would have run.
    let released = report
        .released_after_last_disconnect_ms
        .expect("sim's /stats counts generators and KV blocks");
    assert!(released < 1000.0, "{report:?}");
    assert!(
        report.tokens_generated.is_some_and(|n| n < 3 * 100),
        "{report:?}"
    );
}

/// `--api messages` and `--api responses` stream each API's events and resume by its own path:
/// every stream whole, every resume going on at the event after the last one read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_api_is_loaded_and_resumed_by_its_own_paths() {
    let addr = start(&["--step-ms", "1", "--resume-grace-ms", "5000"]);
    for (api, events_per_stream) in [("messages", 20 + 5), ("responses", 20 + 7)] {
        let flags = [
            "--api",
            api,
            "--streams",
            "4",
            "--tokens",
            "20",
            "--resume",
            "0.5",
            "--after",
            "5",
        ];
        let report = loadgen::run(&args(addr, &flags), None).await;
        assert_eq!(
            (report.completed, report.failed),
            (4, 0),
            "{api}: {report:?}"
        );
        assert_eq!(
            (report.resumed, report.resume_mismatches),
            (2, 0),
            "{api}: {report:?}"
        );
        // Every event of every stream once: nothing lost or repeated across the resumes.
        assert_eq!(report.events, 4 * events_per_stream, "{api}: {report:?}");
    }
}

/// Clients that vanish (neither read nor close for `--stop-s`) or reset the connection count
/// as disconnected; with `--expect-sim-text` every stream's text is sim's; a stream refused at
/// `--addr` is asked for again at its `--failover-addr`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vanishing_and_resetting_clients_and_a_refused_address_are_no_failures() {
    let sim = start(&["--step-ms", "1"]);
    let refused = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap();
    let sim_url = sim.to_string();
    let flags = [
        "--stats",
        &sim_url,
        "--failover-addr",
        &sim_url,
        "--streams",
        "6",
        "--tokens",
        "30",
        "--vanish",
        "0.34",
        "--reset",
        "0.34",
        "--after",
        "5",
        "--stop-s",
        "0.2",
        "--expect-sim-text",
    ];
    let report = loadgen::run(&args(refused, &flags), None).await;
    assert_eq!(
        (report.completed, report.disconnected, report.failed),
        (2, 4, 0),
        "{report:?}"
    );
    assert_eq!(
        (
            report.unexplained,
            report.text_mismatches,
            report.cuts_taken_up
        ),
        (0, 0, 0),
        "{report:?}"
    );
    assert!(report.ended_by.is_empty(), "{report:?}");
}

/// A text other than sim's fails its stream under `--expect-sim-text`, and a stream cut
/// before its end with nowhere to take it up is a failure no frame explained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_text_and_a_cut_stream_are_unexplained_failures() {
    let other = Hostile::start(Case::Stream {
        chunks: 3,
        content_type: "text/event-stream",
    })
    .await;
    let flags = ["--streams", "2", "--tokens", "3", "--expect-sim-text"];
    let report = loadgen::run(&args(other.addr, &flags), None).await;
    assert_eq!(
        (report.completed, report.failed, report.text_mismatches),
        (2, 2, 2),
        "{report:?}"
    );
    assert_eq!(report.unexplained, 2, "{report:?}");
    assert!(
        report.errors[0].contains("not sim's answer from byte 0"),
        "{report:?}"
    );

    let cut = Hostile::start(Case::AbruptClose).await;
    let report = loadgen::run(&args(cut.addr, &["--streams", "2"]), None).await;
    assert_eq!((report.failed, report.unexplained), (2, 2), "{report:?}");
    assert_eq!(report.cuts_taken_up, 0, "{report:?}");
}

/// A stream cut and taken up elsewhere must go on at the event after the last one read: a
/// server that repeats events (or skips some) is a resume mismatch, one that goes on is none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_up_that_repeats_events_is_a_resume_mismatch() {
    let cut = Hostile::start(Case::Numbered {
        from: 0,
        done: false,
    })
    .await;
    for (from, mismatches) in [(1, 1), (3, 0)] {
        let elsewhere = Hostile::start(Case::Numbered { from, done: true }).await;
        let elsewhere = elsewhere.addr.to_string();
        let flags = ["--failover-addr", &elsewhere, "--streams", "1"];
        let report = loadgen::run(&args(cut.addr, &flags), None).await;
        assert_eq!(
            (
                report.completed,
                report.cuts_taken_up,
                report.resume_mismatches
            ),
            (1, 1, mismatches),
            "going on from {from} after 0..=2: {report:?}"
        );
    }
}
