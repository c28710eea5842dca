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
//! streams resumable); a `--vanish F` fraction go silent after `--after T` events (neither
//! reading nor closing for `--stop-s`) and a `--reset F` fraction reset the connection (RST).
//! `--failover-addr URL` (repeatable) names other instances of the same service: a stream
//! refused or cut before its end is asked for again, or resumed after its last event, there
//! and at `--addr` in turn. `--duration-s S` keeps the clients starting new streams for S
//! seconds (a soak), `--ramp-s S` spreads their first streams, `--slowloris N` holds N
//! request heads open a byte a second, and `--expect-sim-text` checks every stream's text
//! against `streamgate sim`'s answer. It prints completed, disconnected and resumed streams
//! (and any resume that lost or repeated an event), the failures by the terminal frame that
//! explained them (and those nothing explained), client-side inter-event gaps (p50, p99,
//! max), time to first event, events/s, and, when the server has a `/stats` like `streamgate sim`'s (or
//! `--stats URL` names one), the wasted tokens and, when every stream disconnects, how soon
//! after the last disconnect every generator had stopped and every KV block was freed.
//! `--json` prints one JSON object; `--hop-records FILE` writes the `client.recv` hop records.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use streamgate::probe::{HopProbe, RecordSink};

use crate::client::{self, Reader};
use crate::slowloris;

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
    /// Fields merged into each request's body, a JSON object (`{"temperature":0}`, or
    /// `{"temperature":0,"ignore_eos":true}` for answers of exactly `--tokens` tokens from a
    /// real model).
    #[arg(long, value_name = "JSON", value_parser = json_object)]
    pub extra: Option<Map<String, Value>>,
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
    /// The fraction of clients that vanish after `--after` events: they neither read nor
    /// close for `--stop-s` (as a peer whose host went away), then drop the connection.
    #[arg(long, value_name = "F", default_value_t = 0.0, value_parser = fraction)]
    pub vanish: f64,
    /// The fraction of clients that reset the connection (an RST) after `--after` events.
    #[arg(long, value_name = "F", default_value_t = 0.0, value_parser = fraction)]
    pub reset: f64,
    /// How many events a disconnecting, resuming, vanishing or resetting client reads first.
    #[arg(long, value_name = "T", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub after: u64,
    /// Another address of the same service (another proxy instance; repeatable): a stream
    /// whose connection is refused or cut before its end is asked for again or resumed
    /// after its last event there and at `--addr` in turn (up to 8 tries in a row, 500 ms
    /// apart), as a client behind a load balancer would be.
    #[arg(long = "failover-addr", value_name = "URL", value_parser = client::address)]
    pub failover_addrs: Vec<SocketAddr>,
    /// Check every stream's text against `streamgate sim`'s answer (`t0 t1 ...`): a
    /// completed stream must have read all of it, any other a beginning of it (nothing
    /// lost, repeated or reordered); a stream that differs fails.
    #[arg(long)]
    pub expect_sim_text: bool,
    /// Keep `--streams` streams going for S seconds: each client starts a new stream when
    /// its last ends, until then.
    #[arg(long = "duration-s", value_name = "S", value_parser = seconds)]
    pub duration: Option<Duration>,
    /// Spread the clients' first streams over S seconds instead of starting them at once.
    #[arg(long = "ramp-s", value_name = "S", default_value = "0", value_parser = seconds)]
    pub ramp: Duration,
    /// Also open N slowloris connections for the run: each sends a request head one byte a
    /// second and never finishes it; the report says how many the server closed, and how
    /// soon.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub slowloris: usize,
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

/// `--extra`: a JSON object.
fn json_object(value: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str(value) {
        Ok(Value::Object(fields)) => Ok(fields),
        _ => Err(format!("`{value}` is not a JSON object")),
    }
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
    /// Streams opened (`--streams`; with `--duration-s`, every stream each client opened).
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
    /// before `[DONE]`, a text other than sim's (`--expect-sim-text`).
    pub failed: usize,
    /// The failed streams that ended with a terminal error frame, by the reason it gave
    /// (`slow_consumer`, `upstream_error`, ..).
    pub ended_by: BTreeMap<String, usize>,
    /// Failed streams whose end no frame explained: a refused connection, an error status,
    /// a cut that could not be taken up again, a text other than sim's.
    pub unexplained: usize,
    /// Streams whose text was not sim's answer, or a beginning of it (`--expect-sim-text`).
    pub text_mismatches: usize,
    /// Times a stream was cut before its end and taken up again (`--failover-addr`).
    pub cuts_taken_up: u64,
    /// The slowloris connections (`--slowloris`), when there were any.
    pub slowloris: Option<slowloris::Report>,
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
        if !self.ended_by.is_empty() || self.unexplained > 0 {
            let frames: Vec<String> = self
                .ended_by
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect();
            writeln!(
                f,
                "  ended by a terminal frame: {}; unexplained {}",
                frames.join(", "),
                self.unexplained
            )?;
        }
        for error in &self.errors {
            writeln!(f, "  error: {error}")?;
        }
        if self.text_mismatches > 0 || self.cuts_taken_up > 0 {
            writeln!(
                f,
                "texts other than sim's {}; cuts taken up again {}",
                self.text_mismatches, self.cuts_taken_up
            )?;
        }
        if let Some(slowloris) = &self.slowloris {
            writeln!(f, "{slowloris}")?;
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
    if args.slow + args.disconnect + args.resume + args.vanish + args.reset > 1.0 {
        eprintln!(
            "loadgen: --slow, --disconnect, --resume, --vanish and --reset add up to more than 1"
        );
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
    let share = |fraction: f64| (fraction * args.streams as f64).round() as u64;
    // Each client's reader, by its place: the fractions' shares in turn, the rest keep up.
    let readers = [
        (share(args.disconnect), Reader::DisconnectsAfter(args.after)),
        (
            share(args.slow),
            args.rate.map_or(Reader::Stops(args.stop), Reader::Rate),
        ),
        (share(args.resume), Reader::Resumes(args.after)),
        (share(args.vanish), Reader::Vanishes(args.after, args.stop)),
        (share(args.reset), Reader::Resets(args.after)),
    ];
    let reader_of = |mut i: u64| {
        for (n, reader) in readers {
            if i < n {
                return reader;
            }
            i -= n;
        }
        Reader::KeepsUp
    };
    let disconnecting = readers[0].0;
    let started = Instant::now();
    let deadline = args.duration.map(|duration| started + duration);
    let chat = client::Chat {
        addr: args.addr,
        elsewhere: args.failover_addrs.clone(),
        api: args.api,
        model: args.model.clone(),
        max_tokens: args.tokens,
        extra: args.extra.clone().unwrap_or_default(),
    };
    let slowloris = (args.slowloris > 0).then(|| {
        // For the streams' run, or (with no deadline) at most a minute.
        let until = args.duration.unwrap_or(Duration::from_secs(60));
        tokio::spawn(slowloris::run(args.addr, args.slowloris, until))
    });
    let mut clients = Vec::new();
    for i in 0..args.streams {
        let reader = reader_of(i);
        let hop = hop.clone();
        let chat = chat.clone();
        let start = started + args.ramp.mul_f64(i as f64 / args.streams as f64);
        let run = run.clone();
        clients.push(tokio::spawn(async move {
            tokio::time::sleep_until(start.into()).await;
            let mut outcomes = Vec::new();
            for k in 0u64.. {
                let id = match k {
                    0 => format!("load-{run}-{i}"),
                    k => format!("load-{run}-{i}.{k}"),
                };
                let mut recorder = hop.recorder(id.as_str());
                let mut outcome = client::stream_chat(&chat, &id, reader, &mut recorder).await;
                outcome.error = outcome.error.map(|error| format!("{id}: {error}"));
                outcomes.push((outcome, Instant::now()));
                if deadline.is_none_or(|deadline| Instant::now() >= deadline) {
                    break;
                }
            }
            outcomes
        }));
    }
    let mut outcomes = Vec::new();
    for client in clients {
        outcomes.extend(client.await.expect("client task"));
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
        Some(last) if disconnecting == args.streams && counts_generators && deadline.is_none() => {
            loop {
                let stats = server_stats(stats_addr).await;
                if stats.generators_running == Some(0) && stats.kv_blocks_in_use == Some(0) {
                    break Some(last.elapsed());
                }
                if last.elapsed() > Duration::from_secs(30) {
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        _ => None,
    };
    let after = server_stats(stats_addr).await;
    if let Some(sink) = &sink {
        sink.sync();
    }
    // Sim's answer, which every stream's text must be (completed) or begin.
    let expected = args
        .expect_sim_text
        .then(|| crate::sim::answer_text(args.tokens));
    let mut text_mismatches = 0;
    let mut unexplained = 0;
    for (outcome, _) in &mut outcomes {
        if let Some(expected) = &expected {
            let whole = !outcome.completed || outcome.text.len() == expected.len();
            if !(whole && expected.starts_with(&outcome.text)) {
                let at = expected
                    .bytes()
                    .zip(outcome.text.bytes())
                    .take_while(|(a, b)| a == b)
                    .count();
                // Sim's answer is ASCII: the bytes that match it end on a char boundary.
                let differs: String = outcome.text[at..].chars().take(40).collect();
                outcome.error = Some(format!(
                    "the text is not sim's answer from byte {at}: {differs:?}"
                ));
                text_mismatches += 1;
                unexplained += 1;
                continue;
            }
        }
        if outcome.error.is_some() && outcome.ended_by.is_none() {
            unexplained += 1;
        }
    }
    let mut ended_by = BTreeMap::new();
    for (outcome, _) in &outcomes {
        if let Some(reason) = &outcome.ended_by {
            *ended_by.entry(reason.clone()).or_insert(0) += 1;
        }
    }
    let slowloris = match slowloris {
        Some(task) => Some(task.await.expect("slowloris task")),
        None => None,
    };
    let counters = hop.snapshot();
    let events: u64 = outcomes.iter().map(|(o, _)| o.events).sum();
    let delta = |after: Option<u64>, before: Option<u64>| Some(after?.saturating_sub(before?));
    let gaps = counters.counters.gaps();
    let first = &counters.time_to_first_event;
    let count =
        |pick: fn(&client::Outcome) -> bool| outcomes.iter().filter(|(o, _)| pick(o)).count();
    Report {
        streams: outcomes.len() as u64,
        completed: count(|o| o.completed),
        disconnected: count(|o| o.disconnected),
        resumed: count(|o| o.resumed),
        resume_mismatches: count(|o| o.resume_mismatch),
        failed: count(|o| o.error.is_some()),
        ended_by,
        unexplained,
        text_mismatches,
        cuts_taken_up: outcomes
            .iter()
            .map(|(o, _)| u64::from(o.cuts_taken_up))
            .sum(),
        slowloris,
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
