//! The main job: a worker, a gateway and clients in one process on loopback, two injected
//! stalls, hop records at every hop, and the diagnosis naming where each stall began.
//!
//! `cargo run --release --example demo --features axum,metrics,timeline`
//!
//! The worker (`examples/serve.rs`) decodes one token every 5 ms and stalls 1.2 s before
//! token 40 of every stream; the gateway (`examples/gateway.rs`) stalls 1.2 s before forwarding
//! event 90. Through the gateway, four clients read normally, one stops reading for a second
//! after its first event, and one disconnects after 20 events. Every hop writes hop records
//! into `target/demo/`; the timeline analysis then names, for each stall, the first hop where
//! it appeared, prints the gap distribution per hop, and draws `target/demo/gaps.svg`.
#![allow(clippy::duplicate_mod)] // serve and gateway each include the examples' shared module

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::Value;
use streamgate::probe::{HopProbe, RecordSink};
use streamgate::timeline::{Blame, Timeline};
use streamgate::transport::Server;

#[allow(dead_code)]
#[path = "common/mod.rs"]
mod common;
#[allow(dead_code)]
#[path = "gateway.rs"]
mod gateway;
#[allow(dead_code)] // its `main` is not called here
#[path = "serve.rs"]
mod serve;

use common::Reader;

const PATH: [&str; 7] = [
    "worker.decode",
    "worker.publish",
    "worker.write",
    "worker.sent",
    "gateway.recv",
    "gateway.write",
    "client.recv",
];
const TOKENS: u64 = 150;

fn flags(flags: &[&str]) -> impl Iterator<Item = String> {
    flags
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .into_iter()
}

async fn stats(addr: std::net::SocketAddr) -> Value {
    let response = common::request(addr, "GET", "/stats", &[], String::new()).await;
    match response {
        Ok(response) => {
            serde_json::from_str(&common::body_text(response).await.unwrap_or_default())
                .unwrap_or(Value::Null)
        }
        Err(_) => Value::Null,
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("demo: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let started = Instant::now();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("demo");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let file = |name: &str| dir.join(name).to_string_lossy().into_owned();
    for name in ["worker.jsonl", "gateway.jsonl", "client.jsonl"] {
        let _ = std::fs::remove_file(file(name));
    }
    let prometheus = serve::prometheus()?;

    println!(
        "streamgate demo: worker -> gateway -> clients on 127.0.0.1, hop records in {}",
        dir.display()
    );
    let worker_file = file("worker.jsonl");
    let worker_flags = [
        "--addr",
        "127.0.0.1:0",
        "--step-ms",
        "5",
        "--stall-at",
        "40",
        "--stall-ms",
        "1200",
        "--heartbeat-ms",
        "500",
        "--hop-records",
        &worker_file,
    ];
    let (listener, app, _) =
        serve::app(serve::parse_args(flags(&worker_flags))?, prometheus.clone())?;
    let worker = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(Server::new().serve(listener, app, std::future::pending()));
    println!("  worker   http://{worker}  (5 ms per token, a 1.2 s decode stall before token 40)");

    let upstream = format!("http://{worker}");
    let gateway_file = file("gateway.jsonl");
    let gateway_flags = [
        "--addr",
        "127.0.0.1:0",
        "--upstream",
        &upstream,
        "--stall-at",
        "90",
        "--stall-ms",
        "1200",
        "--heartbeat-ms",
        "500",
        "--hop-records",
        &gateway_file,
    ];
    let (listener, app, _) = gateway::app(gateway::parse_args(flags(&gateway_flags))?, prometheus)?;
    let gateway = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(Server::new().serve(listener, app, std::future::pending()));
    println!("  gateway  http://{gateway}  (a 1.2 s stall before forwarding event 90)");

    let sink = RecordSink::to_file(file("client.jsonl")).map_err(|e| e.to_string())?;
    let client = HopProbe::new("client.recv").records(sink.clone(), 1.0);
    let readers = [
        ("reader-1", Reader::KeepsUp),
        ("reader-2", Reader::KeepsUp),
        ("reader-3", Reader::KeepsUp),
        ("reader-4", Reader::KeepsUp),
        ("stops-reading", Reader::Stops(Duration::from_secs(1))),
        ("disconnects", Reader::DisconnectsAfter(20)),
    ];
    println!(
        "  clients  {} streams of {TOKENS} tokens: 4 keep up, 1 stops reading for 1 s, 1 disconnects after 20 events",
        readers.len()
    );
    let mut running = Vec::new();
    for (name, reader) in readers {
        let client = client.clone();
        running.push(tokio::spawn(async move {
            let mut recorder = client.recorder(name);
            let outcome = common::stream_chat(gateway, name, TOKENS, reader, &mut recorder).await;
            (name, outcome)
        }));
    }
    for task in running {
        let (name, outcome) = task.await.map_err(|e| e.to_string())?;
        let how = if outcome.completed {
            "completed".to_owned()
        } else if outcome.disconnected {
            "disconnected".to_owned()
        } else {
            format!("failed: {:?}", outcome.error)
        };
        println!(
            "  {:>5.1} s  {name:<14} {:>4} events, {how}",
            started.elapsed().as_secs_f64(),
            outcome.events
        );
    }
    sink.sync();

    // The servers' record writers flush as soon as they are idle; the worker's stats settle
    // once the disconnected stream's generator is gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    let worker_stats = loop {
        let stats = stats(worker).await;
        let settled = stats["generators_running"] == 0;
        let records = ["worker.jsonl", "gateway.jsonl"]
            .iter()
            .all(|f| std::fs::metadata(file(f)).is_ok_and(|m| m.len() > 0));
        if (settled && records) || Instant::now() > deadline {
            break stats;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_millis(100)).await;

    let mut timeline = Timeline::new(PATH, Duration::from_millis(500));
    for name in ["worker.jsonl", "gateway.jsonl", "client.jsonl"] {
        let records = std::fs::File::open(file(name)).map_err(|e| format!("{name}: {e}"))?;
        timeline
            .read(name, records)
            .map_err(|e| format!("{name}: {e}"))?;
    }
    let diagnosis = timeline.diagnose();
    println!(
        "\ndiagnosis ({} requests; a stall is a quiet spell of 500 ms or more, the one a stream ends in included):",
        diagnosis.requests
    );
    for hop in PATH {
        for began in [true, false] {
            let stalls: Vec<_> = diagnosis
                .stalls
                .iter()
                .filter(|s| s.hop == hop && (s.blame == Blame::Began) == began)
                .collect();
            if stalls.is_empty() {
                continue;
            }
            let streams: Vec<&str> = stalls.iter().map(|s| s.request.as_str()).collect();
            let seqs: std::collections::BTreeSet<String> = stalls
                .iter()
                .map(|s| {
                    s.seq
                        .map_or_else(|| "end".to_owned(), |seq| seq.to_string())
                })
                .collect();
            let seqs = seqs.into_iter().collect::<Vec<_>>().join(", ");
            let worst = stalls.iter().map(|s| s.gap).max().unwrap_or_default();
            let what = if began { "began at" } else { "unknown, at" };
            let count = match stalls.len() {
                1 => "1 stall".to_owned(),
                n => format!("{n} stalls"),
            };
            println!(
                "  {what} {hop:<14} {count} (ending at seq {seqs}, up to {:.0} ms): {}",
                worst.as_secs_f64() * 1e3,
                streams.join(", ")
            );
        }
    }
    println!("\ngaps per hop:");
    print!(
        "{}",
        diagnosis
            .report()
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("hop "))
            .map(|l| format!("{l}\n"))
            .collect::<String>()
    );
    let svg = file("gaps.svg");
    common::plot(&diagnosis, &svg).map_err(|e| format!("plot: {e}"))?;
    println!("  gap by output position: {svg}");
    println!(
        "\nworker: {} streams completed, {} cancelled; {} tokens generated, {} wasted after a cancel; {} generators running, {} KV blocks in use",
        worker_stats["streams_completed"],
        worker_stats["streams_cancelled"],
        worker_stats["tokens_generated"],
        worker_stats["tokens_after_cancel"],
        worker_stats["generators_running"],
        worker_stats["kv_blocks_in_use"]
    );
    println!("done in {:.1} s", started.elapsed().as_secs_f64());
    if worker_stats["kv_blocks_in_use"] != 0 || worker_stats["generators_running"] != 0 {
        return Err("the worker still holds generators or KV blocks".into());
    }
    Ok(())
}
