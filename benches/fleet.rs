//! What balancing costs per request, against what a stream costs per event, in the same run.
//!
//! Per request: a request's attempts made (with a fallback), a pick from its pool (two drawn by
//! weight among the replicas whose circuits admit the model, the lighter loaded kept) and its
//! lease's verdict and release, for pools of 1, 3 and 16 replicas that already hold 64 streams
//! each (so the loads compared are not all zero), and for a pool of 16 with half its replicas
//! ejected. Per event, the baseline: `EVENTS` events through a gate of 64, encoded as SSE frames
//! and drained on a current-thread runtime.
//!
//! `cargo bench --bench fleet`

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group};
use futures_util::StreamExt;
use streamgate::fleet::{AttemptOptions, Attempts, CircuitOptions, Failure, Pool};
use streamgate::{Gate, GateExt};

const EVENTS: u64 = 10_000;

/// A pool of `replicas` that hold `held` streams each (returned, to keep them in flight).
fn busy_pool(replicas: usize) -> (Pool<String>, Vec<streamgate::fleet::Lease<String>>) {
    let urls = (0..replicas).map(|at| (format!("http://10.0.0.{at}:8000"), 1));
    let pool = Pool::with_circuits(urls, CircuitOptions::default().failures(1));
    let held = (0..replicas * 64)
        .map(|_| pool.pick("m", &[]).expect("a replica"))
        .collect();
    (pool, held)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("fleet");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    group.throughput(Throughput::Elements(EVENTS));
    group.bench_function("per event: gate of 64, encoded (baseline)", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let consumer = Gate::new().max_events(64).spawn(|_, mut tx| async move {
                    for _ in 0..EVENTS {
                        tx.send("t1234567".to_owned()).await?;
                    }
                    Ok::<_, streamgate::SendError<String>>(())
                });
                let mut frames = std::pin::pin!(consumer.sse());
                while let Some(frame) = frames.next().await {
                    black_box(frame);
                }
            })
        })
    });
    group.throughput(Throughput::Elements(1));
    let options = AttemptOptions::default();
    for replicas in [1, 3, 16] {
        let (pool, _held) = busy_pool(replicas);
        group.bench_function(format!("per request: {replicas} replicas"), |b| {
            b.iter(|| {
                let attempts = Attempts::new("m", options).fallbacks(["n"]);
                let mut lease = pool.pick(attempts.model(), attempts.avoid()).unwrap();
                lease.succeeded();
                black_box(lease.index())
            })
        });
    }
    let (pool, _held) = busy_pool(16);
    for at in (0..16).step_by(2) {
        let others: Vec<usize> = (0..16).filter(|other| *other != at).collect();
        pool.pick("m", &others).unwrap().failed(&Failure::Connect);
    }
    assert_eq!(pool.stats().iter().filter(|s| s.ejected).count(), 8);
    group.bench_function("per request: 16 replicas, 8 ejected", |b| {
        b.iter(|| {
            let attempts = Attempts::new("m", options).fallbacks(["n"]);
            let mut lease = pool.pick(attempts.model(), attempts.avoid()).unwrap();
            lease.succeeded();
            black_box(lease.index())
        })
    });
    group.finish();
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
