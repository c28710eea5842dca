//! The gate in one process: a simulated decode loop and four kinds of reader.
//!
//! `cargo run --release --example demo`
//!
//! Each stream is a decode loop producing one token every 2 ms and holding one simulated KV
//! block per 16 tokens; the gate's release hook frees them. The readers: one that keeps up, one
//! that reads slowly under `Coalesce`, one that disconnects, one that stops reading under
//! `Disconnect`. The report shows what each saw and what the generator wasted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use streamgate::{Consumer, Gate, GateHandle, Policy};

const TOKENS: usize = 300;
const STEP: Duration = Duration::from_millis(2);

/// A pool of KV blocks shared by every stream: one block per 16 tokens a live generator holds.
#[derive(Clone, Default)]
struct KvPool(Arc<AtomicUsize>);

impl KvPool {
    /// A gate whose generator decodes `TOKENS` tokens, holding blocks until it is released.
    fn stream(&self, gate: Gate) -> Consumer<String> {
        let pool = self.clone();
        let held = Arc::new(AtomicUsize::new(0));
        let freed = held.clone();
        gate.on_release(move |_| {
            pool.0
                .fetch_sub(freed.swap(0, Ordering::SeqCst), Ordering::SeqCst);
        })
        .spawn({
            let pool = self.clone();
            move |_, mut tx| async move {
                for i in 0..TOKENS {
                    if i % 16 == 0 {
                        held.fetch_add(1, Ordering::SeqCst);
                        pool.0.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(STEP).await;
                    if tx.send(format!("t{i} ")).await.is_err() {
                        break;
                    }
                }
                Ok::<(), std::io::Error>(())
            }
        })
    }

    fn in_use(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// How a reader behaves.
#[derive(Clone, Copy)]
enum Reader {
    KeepsUp,
    /// Pauses this long after each event.
    Slow(Duration),
    /// Drops the stream after this many events (a client disconnecting).
    DisconnectsAfter(usize),
    /// Stops reading after this many events and comes back only once the stream has ended.
    StopsAfter(usize),
}

/// What one reader saw.
struct Seen {
    events: usize,
    text_ok: bool,
    max_gap: Duration,
    end: String,
}

async fn read(mut consumer: Consumer<String>, reader: Reader) -> Seen {
    let handle = consumer.handle();
    let mut text = String::new();
    let (mut events, mut max_gap, mut last) = (0, Duration::ZERO, Instant::now());
    let end = loop {
        match reader {
            Reader::DisconnectsAfter(n) if events == n => break "reader disconnected".to_owned(),
            Reader::StopsAfter(n) if events == n => handle.released().await,
            _ => {}
        }
        let event = match consumer.next().await {
            Some(Ok(event)) => event,
            Some(Err(error)) => break error.to_string(),
            None => break "completed".to_owned(),
        };
        if events > 0 && !matches!(reader, Reader::StopsAfter(n) if events >= n) {
            max_gap = max_gap.max(last.elapsed());
        }
        last = Instant::now();
        events += 1;
        text.push_str(event.chunk());
        if let Reader::Slow(pause) = reader {
            tokio::time::sleep(pause).await;
        }
    };
    let expected: String = (0..TOKENS).map(|i| format!("t{i} ")).collect();
    Seen {
        events,
        text_ok: expected.starts_with(&text),
        max_gap,
        end,
    }
}

fn report(name: &str, seen: &Seen, handle: &GateHandle) {
    let stats = handle.stats();
    println!(
        "{name:<22} events {:>4}  chunks {:>4} (+{:>3} merged)  max gap {:>6.1} ms  in order, lossless: {:<5}  wasted {}  end: {}",
        seen.events,
        stats.chunks_sent + stats.chunks_merged,
        stats.chunks_merged,
        seen.max_gap.as_secs_f64() * 1e3,
        seen.text_ok,
        stats.chunks_after_end,
        seen.end,
    );
}

#[tokio::main]
async fn main() {
    let started = Instant::now();
    let pool = KvPool::default();
    println!(
        "streamgate demo: 4 streams of {TOKENS} tokens, one every {} ms",
        STEP.as_millis()
    );
    let readers = [
        ("keeps up", Gate::new(), Reader::KeepsUp),
        (
            "slow, coalesced",
            Gate::new().max_events(8).policy(Policy::coalesce()),
            Reader::Slow(Duration::from_millis(20)),
        ),
        ("disconnects", Gate::new(), Reader::DisconnectsAfter(40)),
        (
            "stops reading",
            Gate::new()
                .max_events(8)
                .policy(Policy::disconnect(Duration::from_millis(200))),
            Reader::StopsAfter(10),
        ),
    ];
    let mut running = Vec::new();
    for (name, gate, reader) in readers {
        let consumer = pool.stream(gate);
        let handle = consumer.handle();
        running.push((name, handle, tokio::spawn(read(consumer, reader))));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    println!("  {} KV blocks in use while streaming", pool.in_use());
    for (name, handle, reader) in running {
        let seen = reader.await.expect("reader");
        handle.released().await;
        report(name, &seen, &handle);
    }
    println!(
        "  {} KV blocks in use after every stream ended; {:.2} s",
        pool.in_use(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(pool.in_use(), 0, "every stream's KV blocks are freed");
}
