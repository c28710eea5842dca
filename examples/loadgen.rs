//! A load generator for OpenAI-compatible streaming servers, printing the release measures.
//!
//! `cargo run --release --example loadgen --features axum,metrics -- --addr 127.0.0.1:8000 [flags]`
//!
//! Opens `--streams C` concurrent streams of `--tokens N` tokens each over real HTTP. A
//! `--slow F` fraction of clients stop reading after their first event for `--stop-s S`
//! seconds (or, with `--rate R`, read at R bytes/s); a `--disconnect F` fraction hang up after
//! `--after T` events. It prints completed streams, client-side inter-event gaps (p50, p99,
//! max), time to first event, events/s, and from the server's `/stats` (or `--stats ADDR`'s)
//! the wasted tokens and, when every stream disconnects, how soon after the last disconnect
//! every generator had stopped and every KV block was freed. `--json` prints one JSON object;
//! `--hop-records FILE` writes the `client.recv` hop records.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use streamgate::probe::{HopProbe, RecordSink};

#[allow(dead_code)] // each example uses a part
#[path = "common/mod.rs"]
mod common;

use common::Reader;

#[derive(Debug, Clone)]
struct Args {
    addr: SocketAddr,
    stats: Option<SocketAddr>,
    streams: u64,
    tokens: u64,
    slow: f64,
    stop: Duration,
    rate: Option<u64>,
    disconnect: f64,
    after: u64,
    json: bool,
    hop_records: Option<String>,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args {
        addr: ([127, 0, 0, 1], 8000).into(),
        stats: None,
        streams: 1,
        tokens: 100,
        slow: 0.0,
        stop: Duration::from_secs(5),
        rate: None,
        disconnect: 0.0,
        after: 10,
        json: false,
        hop_records: None,
    };
    while let Some(flag) = args.next() {
        if flag == "--json" {
            parsed.json = true;
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = || format!("{flag}: `{value}` is not valid");
        let number = || value.parse::<u64>().map_err(|_| bad());
        let fraction = || {
            value
                .parse::<f64>()
                .ok()
                .filter(|f| (0.0..=1.0).contains(f))
                .ok_or_else(bad)
        };
        match flag.as_str() {
            "--addr" => parsed.addr = value.parse().map_err(|_| bad())?,
            "--stats" => parsed.stats = Some(value.parse().map_err(|_| bad())?),
            "--streams" => parsed.streams = number()?.max(1),
            "--tokens" => parsed.tokens = number()?.max(1),
            "--slow" => parsed.slow = fraction()?,
            "--stop-s" => parsed.stop = Duration::from_secs_f64(value.parse().map_err(|_| bad())?),
            "--rate" => parsed.rate = Some(number()?.max(1)),
            "--disconnect" => parsed.disconnect = fraction()?,
            "--after" => parsed.after = number()?.max(1),
            "--hop-records" => parsed.hop_records = Some(value.clone()),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(parsed)
}

/// The server's `/stats`, or `Null` if it has none.
async fn server_stats(addr: SocketAddr) -> Value {
    match common::request(addr, "GET", "/stats", &[], String::new()).await {
        Ok(response) => common::body_text(response)
            .await
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

fn ms(duration: Option<Duration>) -> Value {
    duration.map_or(Value::Null, |d| {
        json!((d.as_secs_f64() * 1e6).round() / 1e3)
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("loadgen: {error}");
            return ExitCode::from(2);
        }
    };
    let report = run(&args).await;
    if args.json {
        println!("{report}");
    } else {
        print_report(&report);
    }
    ExitCode::SUCCESS
}

/// Runs the load and returns the release measures as JSON.
async fn run(args: &Args) -> Value {
    let stats_addr = args.stats.unwrap_or(args.addr);
    let sink = args
        .hop_records
        .as_deref()
        .and_then(|path| RecordSink::to_file(path).ok());
    let hop = match &sink {
        Some(sink) => HopProbe::new("client.recv").records(sink.clone(), 1.0),
        None => HopProbe::new("client.recv"),
    };
    let before = server_stats(stats_addr).await;
    let disconnecting = (args.disconnect * args.streams as f64).round() as u64;
    let slow = (args.slow * args.streams as f64).round() as u64;
    let started = Instant::now();
    let mut clients = Vec::new();
    for i in 0..args.streams {
        let reader = if i < disconnecting {
            Reader::DisconnectsAfter(args.after)
        } else if i < disconnecting + slow {
            args.rate.map_or(Reader::Stops(args.stop), Reader::Rate)
        } else {
            Reader::KeepsUp
        };
        let (hop, addr, tokens) = (hop.clone(), args.addr, args.tokens);
        clients.push(tokio::spawn(async move {
            let id = format!("load-{i}");
            let mut recorder = hop.recorder(id.as_str());
            let outcome = common::stream_chat(addr, &id, tokens, reader, &mut recorder).await;
            (outcome, Instant::now())
        }));
    }
    let mut outcomes = Vec::new();
    for client in clients {
        outcomes.push(client.await.expect("client task"));
    }
    let wall = started.elapsed();
    let last_disconnect = outcomes
        .iter()
        .filter(|(o, _)| o.disconnected)
        .map(|(_, at)| *at)
        .max();
    // When every stream disconnected, how soon the server had stopped every generator and
    // freed every KV block (polled every millisecond).
    let released = match last_disconnect {
        Some(last) if disconnecting == args.streams => loop {
            let stats = server_stats(stats_addr).await;
            if stats["generators_running"] == 0 && stats["kv_blocks_in_use"] == 0 {
                break Some(last.elapsed());
            }
            if last.elapsed() > Duration::from_secs(30) {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        },
        _ => None,
    };
    let after = server_stats(stats_addr).await;
    if let Some(sink) = &sink {
        sink.sync();
    }
    let counters = hop.snapshot();
    let events: u64 = outcomes.iter().map(|(o, _)| o.events).sum();
    let delta = |key: &str| match (after[key].as_u64(), before[key].as_u64()) {
        (Some(a), Some(b)) => json!(a.saturating_sub(b)),
        _ => Value::Null,
    };
    let gaps = counters.counters.gaps();
    let first = &counters.time_to_first_event;
    json!({
        "streams": args.streams,
        "completed": outcomes.iter().filter(|(o, _)| o.completed).count(),
        "disconnected": outcomes.iter().filter(|(o, _)| o.disconnected).count(),
        "failed": outcomes.iter().filter(|(o, _)| o.error.is_some()).count(),
        "errors": outcomes.iter().filter_map(|(o, _)| o.error.clone()).take(5).collect::<Vec<_>>(),
        "events": events,
        "wall_s": (wall.as_secs_f64() * 1e3).round() / 1e3,
        "events_per_s": (events as f64 / wall.as_secs_f64()).round(),
        "gap_p50_ms": ms(gaps.quantile(0.5)),
        "gap_p99_ms": ms(gaps.quantile(0.99)),
        "gap_max_ms": ms(Some(counters.counters.max_gap())),
        "ttfe_p50_ms": ms(first.quantile(0.5)),
        "ttfe_p99_ms": ms(first.quantile(0.99)),
        "tokens_generated": delta("tokens_generated"),
        "wasted_tokens": delta("tokens_after_cancel"),
        "released_after_last_disconnect_ms": ms(released),
    })
}

fn print_report(report: &Value) {
    println!(
        "streams {}: completed {}, disconnected {}, failed {}",
        report["streams"], report["completed"], report["disconnected"], report["failed"]
    );
    if let Some(errors) = report["errors"].as_array().filter(|e| !e.is_empty()) {
        println!("  errors: {errors:?}");
    }
    println!(
        "events {} in {} s: {} events/s",
        report["events"], report["wall_s"], report["events_per_s"]
    );
    println!(
        "client gaps (ms): p50 {} p99 {} max {}; time to first event (ms): p50 {} p99 {}",
        report["gap_p50_ms"],
        report["gap_p99_ms"],
        report["gap_max_ms"],
        report["ttfe_p50_ms"],
        report["ttfe_p99_ms"]
    );
    println!(
        "server: tokens generated {}, wasted (after cancel) {}, generators stopped and KV freed {} ms after the last disconnect",
        report["tokens_generated"],
        report["wasted_tokens"],
        report["released_after_last_disconnect_ms"]
    );
}
