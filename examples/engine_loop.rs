//! One engine loop feeding 1,000 concurrent streams, as a continuous-batching engine does.
//!
//! `cargo run --release --example engine_loop`
//!
//! Each stream is a [`Gate::channel`] with its own policy. Every step the loop makes one token
//! for every active request and hands it over with `try_send`, which never waits: a `Full`
//! token is kept by the engine (that request is paused, the loop goes on); `Ended` means the
//! client is gone, so the engine drops the request (that token was wasted). Readers: 600 keep
//! up, 200 are slow (half under `Backpressure`, half under `Coalesce`), 100 stop reading (ended
//! by `Policy::disconnect` on the gate's own clock) and 100 leave early. It prints the ends,
//! the tokens and the loop's step time, and asserts its invariants (it runs in CI).
//!
//! The release hook (where an engine frees a request's KV blocks) runs once per stream, after
//! the engine has dropped that stream's `Sender`: a channel gate waits for it up to its
//! `stop_grace` (10 s by default), so the hook sees the token the engine wasted.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use streamgate::{Consumer, EndReason, Event, Gate, GateStats, Policy, Sender, TrySendError};

const STREAMS: usize = 1_000;
/// The simulated forward pass of one engine step.
const STEP: Duration = Duration::from_millis(1);

#[derive(Clone, Copy, PartialEq, Debug)]
enum Reader {
    Fast,
    Slow,
    Stops,
    Leaves,
}

impl Reader {
    /// Stream `id`'s reader and policy.
    fn of(id: usize) -> (Reader, Policy) {
        match id % 10 {
            0..=5 => (Reader::Fast, Policy::backpressure()),
            6 => (Reader::Slow, Policy::backpressure()),
            7 => (Reader::Slow, Policy::coalesce()),
            8 => (
                Reader::Stops,
                Policy::disconnect(Duration::from_millis(100)),
            ),
            _ => (Reader::Leaves, Policy::backpressure()),
        }
    }

    /// How a stream with this reader must end.
    fn end(self) -> EndReason {
        match self {
            Reader::Fast | Reader::Slow => EndReason::Completed,
            Reader::Stops => EndReason::SlowConsumer,
            Reader::Leaves => EndReason::ConsumerGone,
        }
    }
}

/// Reads as `kind` says; returns the next id it expected and the error that ended it, if any.
async fn read(kind: Reader, mut events: Consumer<String>) -> (u64, Option<EndReason>) {
    let (handle, mut next) = (events.handle(), 0);
    let limit = match kind {
        Reader::Stops => 5,
        Reader::Leaves => 10,
        _ => u64::MAX,
    };
    while let Some(event) = events.next().await {
        check(&mut next, event.expect("fast and slow readers complete"));
        if kind == Reader::Slow {
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        if next == limit {
            break;
        }
    }
    if kind == Reader::Stops {
        // Holds the consumer without polling it: the policy ends the stream, the engine lets
        // go, the stream is released; what was waiting is still delivered, then the error.
        handle.released().await;
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => check(&mut next, event),
                Err(error) => return (next, Some(error.reason())),
            }
        }
    }
    (next, None) // `Leaves` drops its consumer here
}

/// Every event holds its tokens in order, and the ids of consecutive events tile the output.
fn check(next: &mut u64, event: Event<String>) {
    assert_eq!(*event.ids().start(), *next, "no token lost or repeated");
    let expected: String = event.ids().map(|id| format!("t{id} ")).collect();
    assert_eq!(event.chunk(), &expected);
    *next = event.id() + 1;
}

/// A request in the engine's batch.
struct Request {
    tokens: u64,
    next: u64,
    /// A token `try_send` handed back as `Full`: the request is paused until it is accepted.
    held: Option<String>,
    tx: Sender<String>,
}

#[tokio::main]
async fn main() {
    let released: Arc<Mutex<Vec<(usize, EndReason, GateStats)>>> = Arc::default();
    let (mut batch, mut readers) = (Vec::new(), Vec::new());
    for id in 0..STREAMS {
        let (kind, policy) = Reader::of(id);
        let log = released.clone();
        let (tx, consumer) = Gate::new()
            .max_events(16)
            .policy(policy)
            .on_release(move |reason, stats| log.lock().unwrap().push((id, reason, stats)))
            .channel::<String>();
        readers.push((kind, consumer.handle(), tokio::spawn(read(kind, consumer))));
        let tokens = 100 + (id as u64 * 7) % 101;
        batch.push(Request {
            tokens,
            next: 0,
            held: None,
            tx,
        });
    }

    // The engine loop: one task, never awaiting any one stream.
    let (mut wasted, mut paused, mut emit) = (0, 0, Vec::new());
    while !batch.is_empty() {
        let start = Instant::now();
        let mut i = 0;
        while i < batch.len() {
            let request = &mut batch[i];
            let token = (request.held.take()).unwrap_or_else(|| format!("t{} ", request.next));
            match request.tx.try_send(token) {
                Ok(()) if request.next + 1 == request.tokens => {
                    batch.swap_remove(i).tx.finish(); // completes once the reader has it all
                    continue;
                }
                Ok(()) => request.next += 1,
                Err(TrySendError::Full(token)) => {
                    request.held = Some(token); // paused: offered again next step
                    paused += 1;
                }
                Err(_ended) => {
                    wasted += 1; // the client is gone: drop the request, free its slot
                    drop(batch.swap_remove(i));
                    continue;
                }
            }
            i += 1;
        }
        emit.push(start.elapsed());
        tokio::time::sleep(STEP).await;
    }

    // Every stream ended as its reader behaved; completed readers have every token, in order.
    let mut delivered = 0;
    for (kind, handle, reader) in readers {
        let (received, error) = reader.await.expect("reader panicked");
        handle.released().await;
        delivered += received;
        let expected = kind.end();
        assert_eq!(handle.end_reason(), Some(expected), "{kind:?}");
        assert_eq!(error, (kind == Reader::Stops).then_some(expected));
        if expected == EndReason::Completed {
            assert_eq!(received, handle.stats().next_id, "every token, in order");
        }
    }
    // Released once each, after the engine let go, with the wasted tokens counted.
    let mut log = released.lock().unwrap();
    log.sort_by_key(|(id, ..)| *id);
    assert!(log.iter().map(|(id, ..)| *id).eq(0..STREAMS));
    assert!(log.iter().all(|(.., stats)| !stats.stop_forced));
    let count = |reason| log.iter().filter(|(_, r, _)| *r == reason).count() as u64;
    let (completed, gone, slow) = (
        count(EndReason::Completed),
        count(EndReason::ConsumerGone),
        count(EndReason::SlowConsumer),
    );
    assert_eq!((completed, gone, slow), (800, 100, 100));
    let sent: u64 = log.iter().map(|(.., stats)| stats.next_id).sum();
    let after_end: u64 = log.iter().map(|(.., stats)| stats.chunks_after_end).sum();
    assert_eq!((wasted, after_end), (gone + slow, gone + slow)); // one per early end

    emit.sort_unstable();
    let pct = |p: usize| emit[(emit.len() - 1) * p / 100].as_micros();
    println!(
        "{STREAMS} streams: completed {completed}, consumer_gone {gone}, slow_consumer {slow}"
    );
    println!(
        "tokens: {} made, {sent} sent, {delivered} read, {wasted} wasted",
        sent + wasted
    );
    println!("try_send found a stream full {paused} times; the loop went on each time");
    let (steps, p50, p99, max) = (emit.len(), pct(50), pct(99), pct(100));
    println!("engine step ({steps} steps, all streams): p50 {p50} us, p99 {p99} us, max {max} us");
}
