//! The engine-loop shape ([`Gate::channel`]), in the same run as its baselines.
//!
//! `cargo bench --bench engine`
//!
//! - `try_send/{runtime}`: one task moves 10,000 short `String` tokens through
//!   `Sender::try_send` and drains them from the `Consumer`, against tokio
//!   `mpsc::channel(64)`'s `try_send` and `recv`. Two patterns: `burst` (send until the channel
//!   is full, holding the refused token as an engine does, then drain everything) and `one_by_one`
//!   (send one, receive one).
//! - `engine_loop/{runtime}`: one engine task feeds 1,000 channel streams of 60 to 100 tokens,
//!   one token per stream per 4 ms step (a `tokio::time::interval`), never awaiting any one
//!   stream; each stream is drained by its own task that records its inter-event gaps. With 0
//!   and with 10 stopped readers (consumers held but never polled, default policy, so their
//!   streams stay paused for the whole run). Criterion times the whole run; the other streams'
//!   gap p50/p99 of every run is collected and printed to stderr at the end of each group, with
//!   the ratio of the two variants.

mod common;

use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::runtimes;
use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use futures_util::StreamExt;
use streamgate::{Consumer, Gate, Sender, TrySendError};
use tokio::time::MissedTickBehavior;

const EVENTS: usize = 10_000;
const TOKEN: &str = "t12345 ";
const STREAMS: usize = 1_000;
const STEPS: usize = 100;
const STEP: Duration = Duration::from_millis(4);

/// Moves `EVENTS` tokens through a gate of 64 events with `try_send`; returns the bytes
/// received. `burst`: send until full, then drain all; otherwise one send, one receive.
async fn gate_try_send(burst: bool) -> usize {
    let (mut tx, mut rx) = Gate::new().max_events(64).channel::<String>();
    let (mut sent, mut bytes, mut held) = (0, 0, None);
    while sent < EVENTS {
        let mut in_flight = 0;
        while sent < EVENTS {
            let token = held.take().unwrap_or_else(|| TOKEN.to_owned());
            match tx.try_send(token) {
                Ok(()) => (sent, in_flight) = (sent + 1, in_flight + 1),
                Err(TrySendError::Full(token)) => {
                    held = Some(token);
                    break;
                }
                Err(error) => panic!("{error}"),
            }
            if !burst {
                break;
            }
        }
        for _ in 0..in_flight {
            bytes += rx.next().await.unwrap().unwrap().chunk().len();
        }
    }
    tx.finish();
    assert!(rx.next().await.is_none());
    bytes
}

/// The same through `tokio::sync::mpsc::channel(64)`.
async fn tokio_try_send(burst: bool) -> usize {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(64);
    let (mut sent, mut bytes, mut held) = (0, 0, None);
    while sent < EVENTS {
        let mut in_flight = 0;
        while sent < EVENTS {
            let token = held.take().unwrap_or_else(|| TOKEN.to_owned());
            match tx.try_send(token) {
                Ok(()) => (sent, in_flight) = (sent + 1, in_flight + 1),
                Err(tokio::sync::mpsc::error::TrySendError::Full(token)) => {
                    held = Some(token);
                    break;
                }
                Err(error) => panic!("{error}"),
            }
            if !burst {
                break;
            }
        }
        for _ in 0..in_flight {
            bytes += rx.recv().await.unwrap().len();
        }
    }
    drop(tx);
    assert!(rx.recv().await.is_none());
    bytes
}

fn try_send(c: &mut Criterion) {
    let expected = EVENTS * TOKEN.len();
    for (flavor, rt) in runtimes() {
        let mut group = c.benchmark_group(format!("try_send/{flavor}"));
        group.throughput(Throughput::Elements(EVENTS as u64));
        for (pattern, burst) in [("burst", true), ("one_by_one", false)] {
            group.bench_function(format!("tokio_mpsc_64_{pattern}"), |b| {
                b.iter(|| assert_eq!(black_box(rt.block_on(tokio_try_send(burst))), expected))
            });
            group.bench_function(format!("gate_64_{pattern}"), |b| {
                b.iter(|| assert_eq!(black_box(rt.block_on(gate_try_send(burst))), expected))
            });
        }
        group.finish();
    }
}

/// Drains one stream, returning the gaps between its events.
async fn record_gaps(mut events: Consumer<String>) -> Vec<Duration> {
    let mut gaps = Vec::with_capacity(STEPS);
    let mut last = None;
    while let Some(event) = events.next().await {
        black_box(event.expect("completes"));
        let now = Instant::now();
        if let Some(last) = last.replace(now) {
            gaps.push(now - last);
        }
    }
    gaps
}

/// How many tokens stream `i` gets: 60 to 100, so that streams finish at different steps, about
/// 25 per step over the last 40 steps, as requests in a continuous batch do.
fn tokens(i: usize) -> usize {
    STEPS - i % 41
}

/// One stream as the engine sees it.
struct Request {
    tx: Option<Sender<String>>,
    tokens: usize,
    next: usize,
    /// A token `try_send` handed back as full: offered again next step.
    held: Option<String>,
}

/// Every step, one token for every active stream with `try_send` only; a full stream's token is
/// held and offered again next step. A stream is finished as soon as its last token is in; the
/// streams still paused after `STEPS` steps (stopped readers) are aborted.
async fn engine(mut batch: Vec<Request>) {
    // A fixed step period, as a forward pass of fixed length gives.
    let mut steps = tokio::time::interval(STEP);
    steps.set_missed_tick_behavior(MissedTickBehavior::Delay);
    for _ in 0..STEPS {
        steps.tick().await;
        for request in &mut batch {
            let Some(tx) = &mut request.tx else { continue };
            let token = (request.held.take()).unwrap_or_else(|| format!("t{} ", request.next));
            match tx.try_send(token) {
                Ok(()) => request.next += 1,
                Err(TrySendError::Full(token)) => request.held = Some(token),
                Err(error) => panic!("no stream ends early here: {error}"),
            }
            if request.next == request.tokens {
                request.tx.take().unwrap().finish();
            }
        }
    }
    for tx in batch.into_iter().filter_map(|request| request.tx) {
        tx.abort("the benchmark is over");
    }
}

/// One run: 1,000 streams, the first `stopped` of them never read. Returns the gap p50 and p99
/// of the other streams.
async fn engine_run(stopped: usize) -> (Duration, Duration) {
    let (mut batch, mut idle, mut readers) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..STREAMS {
        let (tx, consumer) = Gate::new().max_events(64).channel::<String>();
        let (tokens, next, held) = (tokens(i), 0, None);
        batch.push(Request {
            tx: Some(tx),
            tokens,
            next,
            held,
        });
        if i < stopped {
            idle.push(consumer);
        } else {
            readers.push((i, tokio::spawn(record_gaps(consumer))));
        }
    }
    tokio::spawn(engine(batch)).await.unwrap();
    drop(idle);
    let mut gaps = Vec::with_capacity((STREAMS - stopped) * STEPS);
    for (i, reader) in readers {
        let mine = reader.await.unwrap();
        assert_eq!(mine.len(), tokens(i) - 1, "every other stream completes");
        gaps.extend(mine);
    }
    gaps.sort_unstable();
    let at = |p: usize| gaps[(gaps.len() - 1) * p / 100];
    (at(50), at(99))
}

fn engine_loop(c: &mut Criterion) {
    for (flavor, rt) in runtimes() {
        let mut group = c.benchmark_group(format!("engine_loop/{flavor}"));
        group.sampling_mode(SamplingMode::Flat);
        let variants = [("0_stopped", 0), ("10_stopped", 10)];
        let measured: [Mutex<Vec<(Duration, Duration)>>; 2] = Default::default();
        for ((name, stopped), gaps) in variants.into_iter().zip(&measured) {
            group.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let start = Instant::now();
                        let run = rt.block_on(engine_run(stopped));
                        total += start.elapsed();
                        gaps.lock().unwrap().push(run);
                    }
                    total
                })
            });
        }
        group.finish();
        report_gaps(flavor, &variants, &measured);
    }
}

/// Prints, per variant, the median over runs of the others' gap p50 and p99 (and the range of
/// p99), and the ratio of the medians.
fn report_gaps(
    flavor: &str,
    variants: &[(&str, usize); 2],
    measured: &[Mutex<Vec<(Duration, Duration)>>; 2],
) {
    let mut p99s = Vec::new();
    for ((name, _), runs) in variants.iter().zip(measured) {
        let runs = runs.lock().unwrap();
        let median = |pick: fn(&(Duration, Duration)) -> Duration| {
            let mut values: Vec<Duration> = runs.iter().map(pick).collect();
            values.sort_unstable();
            (
                values[values.len() / 2],
                values[0],
                values[values.len() - 1],
            )
        };
        let (p50, ..) = median(|run| run.0);
        let (p99, low, high) = median(|run| run.1);
        eprintln!(
            "engine_loop/{flavor}/{name}: {} runs, others' gap p50 {:.3} ms, p99 {:.3} ms \
             (per-run p99 {:.3}..{:.3} ms)",
            runs.len(),
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            low.as_secs_f64() * 1e3,
            high.as_secs_f64() * 1e3,
        );
        p99s.push(p99);
    }
    eprintln!(
        "engine_loop/{flavor}: others' gap p99 with 10 stopped readers / without: {:.3}x",
        p99s[1].as_secs_f64() / p99s[0].as_secs_f64()
    );
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = try_send, engine_loop
}
criterion_main!(benches);
