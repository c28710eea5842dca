//! `streamgate loadgen`: drives any OpenAI-compatible streaming endpoint with many streams and
//! misbehaving readers, and reports what the clients saw and what the server did.
//!
//! `streamgate loadgen --addr http://127.0.0.1:8080 --streams 64 --tokens 200 [flags]`
//!
//! Opens `--streams C` concurrent streams of `--tokens N` tokens each over real HTTP/1.1, in
//! one API (`--api chat|messages|responses`: chat completions, Anthropic Messages or OpenAI
//! Responses, each resumed by its own path). A
//! `--slow F` fraction of clients stop reading after their first event for `--stop-s S`
//! seconds (or, with `--rate R`, read at R bytes/s); a `--disconnect F` fraction hang up after
//! `--after T` events; a `--resume F` fraction hang up after `--after T` events and resume the
//! stream where they left it (the server, or a `streamgate proxy` in front of it, must keep
//! streams resumable). It prints completed, disconnected and resumed streams (and any resume
//! that lost or repeated an event), client-side inter-event gaps (p50, p99, max), time to
//! first event, events/s, and, when the server has a `/stats` like `streamgate sim`'s (or
//! `--stats URL` names one), the wasted tokens and, when every stream disconnects, how soon
//! after the last disconnect every generator had stopped and every KV block was freed.
//! `--json` prints one JSON object; `--hop-records FILE` writes the `client.recv` hop records.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use streamgate::probe::{HopProbe, RecordSink};

use crate::client::{self, Reader};

/// `streamgate loadgen`: drives an OpenAI-compatible endpoint with many streams.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The server (or proxy) to load: `http://HOST:PORT` or `HOST:PORT`.
    #[arg(long, value_name = "URL", default_value = "127.0.0.1:8000", value_parser = client::address)]
    pub addr: SocketAddr,
    /// Where to read `/stats` from, when not `--addr` (the server behind a proxy, say).
    #[arg(long, value_name = "URL", value_parser = client::address)]
    pub stats: Option<SocketAddr>,
    /// The streaming API of each request: `chat` (`/v1/chat/completions`), `messages`
    /// (Anthropic Messages, `/v1/messages`) or `responses` (OpenAI Responses, `/v1/responses`).
    #[arg(long, value_enum, default_value_t = client::Api::Chat)]
    pub api: client::Api,
    /// The `model` of each request (servers that serve one model ignore it).
    #[arg(long, default_value = "sim")]
    pub model: String,
    /// Concurrent streams.
    #[arg(long, value_name = "C", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub streams: u64,
    /// `max_tokens` of each stream.
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub tokens: u64,
    /// The fraction of clients that stop reading after their first event (for `--stop-s`, or
    /// read at `--rate`).
    #[arg(long, value_name = "F", default_value_t = 0.0, value_parser = fraction)]
    pub slow: f64,
    /// How long a slow client stops reading, in seconds.
    #[arg(long = "stop-s", value_name = "S", default_value = "5", value_parser = seconds)]
    pub stop: Duration,
    /// Slow clients read at about this many bytes per second instead of stopping.
    #[arg(long, value_name = "R", value_parser = clap::value_parser!(u64).range(1..))]
    pub rate: Option<u64>,
    /// The fraction of clients that hang up after `--after` events.
    #[arg(long, value_name = "F", default_value_t = 0.0, value_parser = fraction)]
    pub disconnect: f64,
    /// The fraction of clients that hang up after `--after` events and resume the stream
    /// (`GET /v1/chat/completions/{id}/stream` with `Last-Event-ID`; the server, or a proxy
    /// in front of it, must keep streams resumable).
    #[arg(long, value_name = "F", default_value_t = 0.0, value_parser = fraction)]
    pub resume: f64,
    /// How many events a disconnecting or resuming client reads first.
    #[arg(long, value_name = "T", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub after: u64,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    pub json: bool,
    /// Write the `client.recv` hop records to FILE.
    #[arg(long, value_name = "FILE")]
    pub hop_records: Option<String>,
}

fn fraction(value: &str) -> Result<f64, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|f| (0.0..=1.0).contains(f))
        .ok_or_else(|| format!("`{value}` is not a fraction between 0 and 1"))
}

fn seconds(value: &str) -> Result<Duration, String> {
    value
        .parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("`{value}` is not a number of seconds"))
}

/// What a run saw: the clients' streams, gaps and times, and what the server's `/stats` said
/// (`--json` prints it as one object with these keys).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Report {
    /// Streams opened (`--streams`).
    pub streams: u64,
    /// Streams read to `[DONE]`.
    pub completed: usize,
    /// Streams whose client hung up on purpose.
    pub disconnected: usize,
    /// Streams whose client hung up and resumed.
    pub resumed: usize,
    /// Resumed streams that lost or repeated an event.
    pub resume_mismatches: usize,
    /// Streams that failed: a refused connection, an error status or event, a stream cut
    /// before `[DONE]`.
    pub failed: usize,
    /// The first five failures.
    pub errors: Vec<String>,
    /// Events every client received, together.
    pub events: u64,
    /// How long the run took, in seconds (to the ms).
    pub wall_s: f64,
    /// Events received per second of the run.
    pub events_per_s: f64,
    /// The clients' median inter-event gap, in ms (to the µs; none without gaps).
    pub gap_p50_ms: Option<f64>,
    /// Their 99th percentile.
    pub gap_p99_ms: Option<f64>,
    /// Their longest.
    pub gap_max_ms: f64,
    /// The median time to first event, in ms.
    pub ttfe_p50_ms: Option<f64>,
    /// Its 99th percentile.
    pub ttfe_p99_ms: Option<f64>,
    /// Tokens the server generated during the run (from its `/stats`, when it has one).
    pub tokens_generated: Option<u64>,
    /// Tokens it generated after a stream was cancelled.
    pub wasted_tokens: Option<u64>,
    /// When every stream disconnected: how soon after the last disconnect the server had
    /// stopped every generator and freed every KV block, in ms.
    pub released_after_last_disconnect_ms: Option<f64>,
}

impl std::fmt::Display for Report {
    /// The report for a person.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |value: Option<f64>| value.map_or_else(|| "null".to_owned(), |v| v.to_string());
        let count = |value: Option<u64>| value.map_or_else(|| "null".to_owned(), |v| v.to_string());
        writeln!(
            f,
            "streams {}: completed {}, disconnected {}, resumed {} ({} lost or repeated an event), failed {}",
            self.streams,
            self.completed,
            self.disconnected,
            self.resumed,
            self.resume_mismatches,
            self.failed
        )?;
        for error in &self.errors {
            writeln!(f, "  error: {error}")?;
        }
        writeln!(
            f,
            "events {} in {} s: {} events/s",
            self.events, self.wall_s, self.events_per_s
        )?;
        writeln!(
            f,
            "client gaps (ms): p50 {} p99 {} max {}; time to first event (ms): p50 {} p99 {}",
            shown(self.gap_p50_ms),
            shown(self.gap_p99_ms),
            self.gap_max_ms,
            shown(self.ttfe_p50_ms),
            shown(self.ttfe_p99_ms)
        )?;
        writeln!(
            f,
            "server: tokens generated {}, wasted (after cancel) {}, generators stopped and KV freed {} ms after the last disconnect",
            count(self.tokens_generated),
            count(self.wasted_tokens),
            shown(self.released_after_last_disconnect_ms)
        )
    }
}

/// The fields of a server's `/stats` (as `streamgate sim`'s) a run reads; a server without
/// them has none.
#[derive(Debug, Default, serde::Deserialize)]
struct ServerStats {
    generators_running: Option<u64>,
    kv_blocks_in_use: Option<u64>,
    tokens_generated: Option<u64>,
    tokens_after_cancel: Option<u64>,
}

/// The server's `/stats` (every field absent if it has none).
async fn server_stats(addr: SocketAddr) -> ServerStats {
    match client::request(addr, "GET", "/stats", &[], String::new()).await {
        Ok(response) => client::body_text(response)
            .await
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default(),
        Err(_) => ServerStats::default(),
    }
}

/// `duration` in ms, to the µs.
fn ms(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1e6).round() / 1e3
}

/// Runs the load and prints its report (JSON with `--json`). Exit status: 0 when every
/// stream went as its reader meant (completed, or hung up on purpose), 1 when any failed (a
/// refused connection, an error status or event, a stream cut before `[DONE]`), 2 for bad
/// flags or a `--hop-records` file that cannot be written.
pub async fn main(args: Args) -> ExitCode {
    if args.slow + args.disconnect + args.resume > 1.0 {
        eprintln!("loadgen: --slow, --disconnect and --resume add up to more than 1");
        return ExitCode::from(2);
    }
    let sink = match args
        .hop_records
        .as_deref()
        .map(RecordSink::to_file)
        .transpose()
    {
        Ok(sink) => sink,
        Err(error) => {
            eprintln!("loadgen: --hop-records: {error}");
            return ExitCode::from(2);
        }
    };
    let report = run(&args, sink).await;
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).expect("a report always encodes")
        );
    } else {
        print!("{report}");
    }
    if report.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs the load, writing the `client.recv` hop records to `sink` if any, and returns what it
/// saw.
pub async fn run(args: &Args, sink: Option<RecordSink>) -> Report {
    let stats_addr = args.stats.unwrap_or(args.addr);
    let hop = match &sink {
        Some(sink) => HopProbe::new("client.recv").records(sink.clone(), 1.0),
        None => HopProbe::new("client.recv"),
    };
    let before = server_stats(stats_addr).await;
    // Request ids unique to this run, so a server that keeps finished streams for resumes
    // (or is still running the last run's) never sees a taken id.
    let run = {
        use std::hash::{BuildHasher, RandomState};
        format!("{:08x}", RandomState::new().hash_one(Instant::now()) as u32)
    };
    let disconnecting = (args.disconnect * args.streams as f64).round() as u64;
    let slow = (args.slow * args.streams as f64).round() as u64;
    let resuming = (args.resume * args.streams as f64).round() as u64;
    let started = Instant::now();
    let mut clients = Vec::new();
    for i in 0..args.streams {
        let reader = if i < disconnecting {
            Reader::DisconnectsAfter(args.after)
        } else if i < disconnecting + slow {
            args.rate.map_or(Reader::Stops(args.stop), Reader::Rate)
        } else if i < disconnecting + slow + resuming {
            Reader::Resumes(args.after)
        } else {
            Reader::KeepsUp
        };
        let hop = hop.clone();
        let chat = client::Chat {
            addr: args.addr,
            api: args.api,
            model: args.model.clone(),
            max_tokens: args.tokens,
        };
        let id = format!("load-{run}-{i}");
        clients.push(tokio::spawn(async move {
            let mut recorder = hop.recorder(id.as_str());
            let outcome = client::stream_chat(&chat, &id, reader, &mut recorder).await;
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
    // Only a server whose `/stats` counts its generators and KV blocks (as `streamgate sim`'s
    // does) can say.
    let counts_generators = before.generators_running.is_some();
    let released = match last_disconnect {
        Some(last) if disconnecting == args.streams && counts_generators => loop {
            let stats = server_stats(stats_addr).await;
            if stats.generators_running == Some(0) && stats.kv_blocks_in_use == Some(0) {
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
    let delta = |after: Option<u64>, before: Option<u64>| Some(after?.saturating_sub(before?));
    let gaps = counters.counters.gaps();
    let first = &counters.time_to_first_event;
    let count =
        |pick: fn(&client::Outcome) -> bool| outcomes.iter().filter(|(o, _)| pick(o)).count();
    Report {
        streams: args.streams,
        completed: count(|o| o.completed),
        disconnected: count(|o| o.disconnected),
        resumed: count(|o| o.resumed),
        resume_mismatches: count(|o| o.resume_mismatch),
        failed: count(|o| o.error.is_some()),
        errors: outcomes
            .iter()
            .filter_map(|(o, _)| o.error.clone())
            .take(5)
            .collect(),
        events,
        wall_s: (wall.as_secs_f64() * 1e3).round() / 1e3,
        events_per_s: (events as f64 / wall.as_secs_f64()).round(),
        gap_p50_ms: gaps.quantile(0.5).map(ms),
        gap_p99_ms: gaps.quantile(0.99).map(ms),
        gap_max_ms: ms(counters.counters.max_gap()),
        ttfe_p50_ms: first.quantile(0.5).map(ms),
        ttfe_p99_ms: first.quantile(0.99).map(ms),
        tokens_generated: delta(after.tokens_generated, before.tokens_generated),
        wasted_tokens: delta(after.tokens_after_cancel, before.tokens_after_cancel),
        released_after_last_disconnect_ms: released.map(ms),
    }
}
