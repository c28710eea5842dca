//! A resumable stream per event: the gate alone (the baseline, in the same run) against the gate
//! feeding a `resume::Registry`'s replay log read by 1, 2 and 8 subscribers, each on a task of
//! its own. 8-byte chunks, so what is measured is the machinery, not the payload.
//!
//! `cargo bench --bench resume`

mod common;

use std::hint::black_box;

use bytes::Bytes;
use common::runtimes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures_util::StreamExt;
use streamgate::resume::{Registry, ResumeOptions};
use streamgate::{Consumer, Gate};

const EVENTS: u64 = 10_000;
const CHUNK: Bytes = Bytes::from_static(b"t1234567");

/// A gate of 64 events whose generator sends `EVENTS` chunks.
fn generator() -> Consumer<Bytes> {
    Gate::new().max_events(64).spawn(|_, mut tx| async move {
        for _ in 0..EVENTS {
            tx.send(CHUNK).await?;
        }
        Ok::<_, streamgate::SendError<Bytes>>(())
    })
}

/// Starts draining `events` on a task of its own; it returns the events received.
fn drain<S>(events: S) -> tokio::task::JoinHandle<u64>
where
    S: futures_util::Stream<Item = Result<streamgate::Event<Bytes>, streamgate::GateError>>
        + Send
        + 'static,
{
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        let mut n = 0;
        while let Some(event) = events.next().await {
            black_box(event.expect("completes"));
            n += 1;
        }
        n
    })
}

/// `EVENTS` chunks through a registry to `readers` subscribers at once; returns the events
/// received.
async fn through_registry(registry: &Registry<Bytes>, readers: usize, id: u64) -> u64 {
    let id = id.to_string();
    let mut handles = vec![drain(registry.register(id.as_str(), generator()).unwrap())];
    for _ in 1..readers {
        handles.push(drain(registry.attach(&id, None).unwrap()));
    }
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
        group.bench_function(format!("{name}/gate alone"), |b| {
            b.iter(|| runtime.block_on(async { drain(generator()).await.unwrap() }))
        });
        // Finished streams are removed at once, so the registry does not grow across runs.
        let options = ResumeOptions::default().retain(std::time::Duration::ZERO);
        let registry = runtime.block_on(async { Registry::new(options) });
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

criterion_group!(benches, bench);
criterion_main!(benches);
