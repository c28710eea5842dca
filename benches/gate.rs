//! One producer task and one consumer task moving 8-byte chunks: through the gate, and through
//! `tokio::sync::mpsc::channel(64)` as the baseline, in the same run.
//!
//! `cargo bench --bench gate`

mod common;

use std::hint::black_box;

use bytes::Bytes;
use common::runtimes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures_util::StreamExt;
use streamgate::probe::HopProbe;
use streamgate::{Gate, GateExt, Policy};

const EVENTS: u64 = 10_000;
const CHUNK: Bytes = Bytes::from_static(b"t1234567");

/// Moves `EVENTS` chunks through a tokio mpsc channel of 64; returns the bytes received.
async fn tokio_mpsc() -> usize {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        for _ in 0..EVENTS {
            if tx.send(CHUNK).await.is_err() {
                break;
            }
        }
    });
    let consumer = tokio::spawn(async move {
        let mut bytes = 0;
        while let Some(chunk) = rx.recv().await {
            bytes += chunk.len();
        }
        bytes
    });
    consumer.await.unwrap()
}

/// A gate of 64 events whose generator sends `EVENTS` chunks.
fn generator(policy: Policy, stamp: bool) -> streamgate::Consumer<Bytes> {
    Gate::new()
        .max_events(64)
        .policy(policy)
        .stamp_events(stamp)
        .spawn(|_, mut tx| async move {
            for _ in 0..EVENTS {
                tx.send(CHUNK).await?;
            }
            Ok::<_, streamgate::SendError<Bytes>>(())
        })
}

/// Drains `events` on a task of its own; returns the bytes received.
async fn drain<S>(events: S) -> usize
where
    S: futures_util::Stream<Item = Result<streamgate::Event<Bytes>, streamgate::GateError>>
        + Send
        + 'static,
{
    let consumer = tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        let mut bytes = 0;
        while let Some(event) = events.next().await {
            bytes += event.expect("completes").chunk().len();
        }
        bytes
    });
    consumer.await.unwrap()
}

/// Moves `EVENTS` chunks through a gate of 64 events; returns the bytes received.
async fn gate(policy: Policy) -> usize {
    drain(generator(policy, false)).await
}

/// The same, with the consumer probed at a hop (and the gate stamping events when `stamp`).
async fn probed_gate(hop: HopProbe, stamp: bool) -> usize {
    drain(generator(Policy::backpressure(), stamp).probe(&hop, "bench")).await
}

fn per_event(c: &mut Criterion) {
    let expected = (EVENTS as usize) * CHUNK.len();
    for (flavor, rt) in runtimes() {
        let mut group = c.benchmark_group(format!("per_event/{flavor}"));
        group.throughput(Throughput::Elements(EVENTS));
        group.bench_function("tokio_mpsc_64", |b| {
            b.iter(|| assert_eq!(black_box(rt.block_on(tokio_mpsc())), expected))
        });
        group.bench_function("gate_64_backpressure", |b| {
            b.iter(|| {
                assert_eq!(
                    black_box(rt.block_on(gate(Policy::backpressure()))),
                    expected
                )
            })
        });
        group.bench_function("gate_64_coalesce", |b| {
            b.iter(|| assert_eq!(black_box(rt.block_on(gate(Policy::coalesce()))), expected))
        });
        group.finish();
    }
}

fn probe_per_event(c: &mut Criterion) {
    let expected = (EVENTS as usize) * CHUNK.len();
    let hop = HopProbe::new("bench.hop");
    for (flavor, rt) in runtimes() {
        let mut group = c.benchmark_group(format!("probe_per_event/{flavor}"));
        group.throughput(Throughput::Elements(EVENTS));
        group.bench_function("gate_64", |b| {
            b.iter(|| {
                assert_eq!(
                    black_box(rt.block_on(gate(Policy::backpressure()))),
                    expected
                )
            })
        });
        group.bench_function("gate_64_probed", |b| {
            b.iter(|| {
                assert_eq!(
                    black_box(rt.block_on(probed_gate(hop.clone(), false))),
                    expected
                )
            })
        });
        group.bench_function("gate_64_stamped_probed", |b| {
            b.iter(|| {
                assert_eq!(
                    black_box(rt.block_on(probed_gate(hop.clone(), true))),
                    expected
                )
            })
        });
        group.finish();
    }
}

criterion_group!(benches, per_event, probe_per_event);
criterion_main!(benches);
