//! A resumable stream per event: the gate alone, encoded as SSE frames (the baseline, in the
//! same run), against the gate feeding a memory `resume::Registry`'s replay log read by 1, 2 and
//! 8 subscribers (which yield the same frames), each on a task of its own. 8-byte chunks, so
//! what is measured is the machinery, not the payload. First, the memory of an idle detached
//! stream: 10,000 streams whose generators wait, each read once and left, against as many plain
//! gated streams whose consumers are held (RSS from `/proc`).
//!
//! `cargo bench --bench resume`

mod common;

use std::hint::black_box;

use common::runtimes;
use criterion::{Criterion, Throughput, criterion_group};
use futures_util::StreamExt;
use streamgate::resume::{Registry, ResumeOptions};
use streamgate::sse::SseFrame;
use streamgate::{Consumer, Gate, GateExt};

const EVENTS: u64 = 10_000;
const CHUNK: &str = "t1234567";

/// A gate of 64 events whose generator sends `EVENTS` chunks.
fn generator() -> Consumer<String> {
    Gate::new().max_events(64).spawn(|_, mut tx| async move {
        for _ in 0..EVENTS {
            tx.send(CHUNK.to_owned()).await?;
        }
        Ok::<_, streamgate::SendError<String>>(())
    })
}

/// Starts draining `frames` on a task of its own; it returns the frames received.
fn drain<S>(frames: S) -> tokio::task::JoinHandle<u64>
where
    S: futures_util::Stream<Item = SseFrame> + Send + 'static,
{
    tokio::spawn(async move {
        let mut frames = std::pin::pin!(frames);
        let mut n = 0;
        while let Some(frame) = frames.next().await {
            black_box(frame);
            n += 1;
        }
        n
    })
}

/// `EVENTS` chunks through a registry to `readers` subscribers at once; returns the events
/// received.
async fn through_registry(registry: &Registry<String>, readers: usize, id: u64) -> u64 {
    let id = id.to_string();
    // Every subscriber attaches before any reads: the stream cannot end before the last one.
    let claim = registry.claim(&id).await.unwrap();
    let mut subscribers = vec![registry.register(claim, generator()).await.unwrap()];
    for _ in 1..readers {
        subscribers.push(registry.attach(&id, None).await.unwrap());
    }
    let handles: Vec<_> = subscribers.into_iter().map(drain).collect();
    let mut received = 0;
    for handle in handles {
        received += handle.await.unwrap();
    }
    received
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("resume_per_event");
    group.throughput(Throughput::Elements(EVENTS));
    for (name, runtime) in runtimes() {
        group.bench_function(format!("{name}/gate alone, encoded"), |b| {
            b.iter(|| runtime.block_on(async { drain(generator().sse()).await.unwrap() }))
        });
        // Finished streams are removed at once, so the registry does not grow across runs.
        let options = ResumeOptions::default().retain(std::time::Duration::ZERO);
        let registry = runtime.block_on(async { Registry::memory(options) });
        let mut next_id = 0;
        for readers in [1, 2, 8] {
            group.bench_function(format!("{name}/registry, {readers} subscribers"), |b| {
                b.iter(|| {
                    next_id += 1;
                    runtime.block_on(through_registry(&registry, readers, next_id))
                })
            });
        }
    }
    group.finish();
}

/// The process's resident memory, in KiB (Linux).
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A gate whose generator sends one chunk, then waits for ever.
fn idle() -> Consumer<String> {
    Gate::new().spawn(|_, mut tx| async move {
        tx.send(CHUNK.to_owned()).await?;
        std::future::pending::<()>().await;
        Ok::<_, streamgate::SendError<String>>(())
    })
}

/// RSS per stream of `STREAMS` idle plain gated streams, then of as many detached resumable
/// ones, on one runtime, printed.
fn memory_per_idle_stream() {
    const STREAMS: u64 = 10_000;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let settle = || tokio::time::sleep(std::time::Duration::from_millis(200));
        let (Some(before), _) = (rss_kib(), settle().await) else {
            println!("memory per idle stream: no /proc/self/status here");
            return;
        };
        let mut plain = Vec::new();
        for _ in 0..STREAMS {
            let mut consumer = idle();
            consumer.next().await;
            plain.push(consumer);
        }
        settle().await;
        let gated = rss_kib().unwrap_or(before);
        let registry = Registry::memory(ResumeOptions::default());
        for id in 0..STREAMS {
            let claim = registry.claim(&id.to_string()).await.unwrap();
            let mut subscriber = registry.register(claim, idle()).await.unwrap();
            subscriber.next().await;
        }
        settle().await;
        let resumable = rss_kib().unwrap_or(gated);
        assert_eq!(registry.stats().detached, STREAMS as usize);
        let per = |kib: u64| kib as f64 * 1024.0 / STREAMS as f64;
        println!(
            "memory per idle stream: plain gated {:.0} B, detached resumable {:.0} B ({:.2}x)",
            per(gated - before),
            per(resumable - gated),
            (resumable - gated) as f64 / (gated - before).max(1) as f64
        );
        drop(plain);
    });
}

criterion_group!(benches, bench);

fn main() {
    memory_per_idle_stream();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
