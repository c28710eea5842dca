//! The main job: a worker (`streamgate sim`), the proxy (`streamgate proxy`) and clients in one
//! process on loopback, two injected stalls, hop records at every hop, and the diagnosis naming
//! where each stall began.
//!
//! `cargo run --release --example demo [-- --out DIR]`
//!
//! The worker decodes one token every 5 ms and stalls 1.2 s before token 40 of every stream;
//! the proxy stalls 1.2 s before forwarding event 90. Through the proxy, four clients read
//! normally, one stops reading for a second after its first event, and one disconnects after
//! 20 events. Every hop writes hop records into `DIR` (by default `demo/` in the cargo target
//! directory this example was built in: `target/demo/`, or under `CARGO_TARGET_DIR`); the
//! timeline analysis then names, for each stall, the first hop where it appeared, prints the
//! gap distribution per hop, and draws `gaps.svg` there.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::Value;
use streamgate::probe::{HopProbe, RecordSink};
use streamgate::timeline::{Blame, Timeline};
use streamgate_cli::client::{self, Chat, Reader};
use streamgate_cli::{plot, proxy, serving, sim};

const PATH: [&str; 7] = [
    "worker.decode",
    "worker.publish",
    "worker.write",
    "worker.sent",
    "proxy.recv",
    "proxy.write",
    "client.recv",
];
const TOKENS: u64 = 150;

/// The demo: worker, proxy and six clients on loopback; two injected stalls, diagnosed.
#[derive(Parser)]
#[command(name = "demo")]
struct Args {
    /// Where to write the hop records and the plot (default: `demo/` in the cargo target
    /// directory the demo was built in).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

async fn stats(addr: std::net::SocketAddr) -> Value {
    let response = client::request(addr, "GET", "/stats", &[], String::new()).await;
    match response {
        Ok(response) => {
            serde_json::from_str(&client::body_text(response).await.unwrap_or_default())
                .unwrap_or(Value::Null)
        }
        Err(_) => Value::Null,
    }
}

/// The cargo target directory this example was built in: the nearest directory above the
/// executable (`<target>/release/examples/demo`) that cargo marked with a `CACHEDIR.TAG`; else
/// `CARGO_TARGET_DIR` as it was at build time; else the workspace's `target/`.
fn target_dir() -> PathBuf {
    let built_in = std::env::current_exe().ok().and_then(|exe| {
        exe.ancestors()
            .skip(1)
            .find(|dir| dir.join("CACHEDIR.TAG").is_file())
            .map(Path::to_path_buf)
    });
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    built_in
        .or_else(|| option_env!("CARGO_TARGET_DIR").map(|dir| workspace.join(dir)))
        .unwrap_or_else(|| workspace.join("target"))
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let dir = args.out.unwrap_or_else(|| target_dir().join("demo"));
    match run(&dir).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("demo: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(dir: &Path) -> Result<(), String> {
    let started = Instant::now();
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // Printed as an absolute path, without `..` steps.
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let file = |name: &str| dir.join(name).to_string_lossy().into_owned();
    for name in ["worker.jsonl", "proxy.jsonl", "client.jsonl"] {
        let _ = std::fs::remove_file(file(name));
    }
    let prometheus = serving::prometheus()?;

    println!(
        "streamgate demo: worker -> proxy -> clients on 127.0.0.1, hop records in {}",
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
    let config = sim::Config::parse_from(worker_flags).map_err(|e| e.to_string())?;
    let (listener, app, sim) = sim::app(config, prometheus.clone())?;
    let worker = listener.local_addr().map_err(|e| e.to_string())?;
    let worker_records = sim.records.clone();
    tokio::spawn(serving::serve_until(
        listener,
        app,
        sim.streams().clone(),
        std::future::pending(),
    ));
    println!("  worker   http://{worker}  (5 ms per token, a 1.2 s decode stall before token 40)");

    let upstream = format!("http://{worker}");
    let proxy_file = file("proxy.jsonl");
    let proxy_flags = [
        "--addr",
        "127.0.0.1:0",
        "--upstream",
        &upstream,
        "--heartbeat-ms",
        "500",
        "--hop-records",
        &proxy_file,
    ];
    let mut config = proxy::Config::parse_from(proxy_flags).map_err(|e| e.to_string())?;
    // The drill's proxy-side freeze: injected from code, as the proxy has no flag for faults.
    config.stall = Some(proxy::InjectedStall {
        at: 90,
        duration: Duration::from_millis(1200),
    });
    let (listener, app, proxied) = proxy::app(config, prometheus)?;
    let proxy = listener.local_addr().map_err(|e| e.to_string())?;
    let proxy_records = proxied.records.clone();
    tokio::spawn(serving::serve_until(
        listener,
        app,
        proxied.group.clone(),
        std::future::pending(),
    ));
    println!("  proxy    http://{proxy}  (a 1.2 s stall before forwarding event 90)");

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
            let chat = Chat::sim(proxy, TOKENS);
            let outcome = client::stream_chat(&chat, name, reader, &mut recorder).await;
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

    // The worker's stats settle once the disconnected stream's generator is gone; then every
    // hop's records are flushed to their files.
    let deadline = Instant::now() + Duration::from_secs(10);
    let worker_stats = loop {
        let stats = stats(worker).await;
        let settled = stats["generators_running"] == 0;
        if settled || Instant::now() > deadline {
            break stats;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for records in [worker_records, proxy_records].into_iter().flatten() {
        records.sync();
    }

    let mut timeline = Timeline::new(PATH, Duration::from_millis(500));
    for name in ["worker.jsonl", "proxy.jsonl", "client.jsonl"] {
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
    plot::plot(&diagnosis, None, &svg).map_err(|e| format!("plot: {e}"))?;
    println!("  gap by output position: {svg}");
    println!(
        "\nworker: {} streams completed, {} cancelled, {} failed; {} tokens generated, {} wasted after a cancel; {} generators running, {} KV blocks in use",
        worker_stats["streams_completed"],
        worker_stats["streams_cancelled"],
        worker_stats["streams_failed"],
        worker_stats["tokens_generated"],
        worker_stats["tokens_after_cancel"],
        worker_stats["generators_running"],
        worker_stats["kv_blocks_in_use"]
    );
    println!(
        "done in {:.1} s; hop records and the plot are in {}",
        started.elapsed().as_secs_f64(),
        dir.display()
    );
    if worker_stats["kv_blocks_in_use"] != 0 || worker_stats["generators_running"] != 0 {
        return Err("the worker still holds generators or KV blocks".into());
    }
    Ok(())
}
