//! The gate's promises: order, bounds, flush per event, and each slow-consumer policy.

mod common;

use common::gate::TICK;
use common::{HANG, Rng};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use streamgate::{Chunk, Consumer, EndReason, Gate, Policy};
use tokio::sync::mpsc;
use tokio::time::timeout;

/// The chunks of a consumer until its end, and the end (`None` when it completed).
async fn drain<T: Chunk>(consumer: &mut Consumer<T>) -> (Vec<(u64, T)>, Option<EndReason>) {
    let mut events = Vec::new();
    while let Some(item) = consumer.next().await {
        match item {
            Ok(event) => events.push((event.id(), event.into_chunk())),
            Err(error) => return (events, Some(error.reason())),
        }
    }
    (events, None)
}

/// Generator chunk `i`'s text, as the reference server's tokens.
fn token(i: usize) -> String {
    format!("t{i} ")
}

#[tokio::test]
async fn events_arrive_in_order_with_consecutive_seq() {
    let mut consumer = Gate::new().max_events(4).spawn(|_, mut tx| async move {
        for i in 0..1000 {
            tx.send(token(i)).await?;
        }
        Ok::<_, streamgate::SendError<String>>(())
    });
    let (events, end) = drain(&mut consumer).await;
    assert_eq!(end, None);
    assert_eq!(events.len(), 1000);
    for (i, (seq, text)) in events.iter().enumerate() {
        assert_eq!(*seq, i as u64);
        assert_eq!(*text, token(i));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_generators_complete_and_try_stream_errors_end_the_stream() {
    let tokens = futures_util::stream::iter((0..100).map(token));
    let mut consumer = Gate::new().max_events(3).stream(tokens);
    let (events, end) = drain(&mut consumer).await;
    assert_eq!(end, None);
    assert_eq!(events.len(), 100);

    let items = (0..5)
        .map(|i| Ok(token(i)))
        .chain([Err(std::io::Error::other("upstream reset"))])
        .chain([Ok(token(99))]);
    let mut consumer = Gate::new().try_stream(futures_util::stream::iter(items));
    let (events, end) = drain(&mut consumer).await;
    assert_eq!(end, Some(EndReason::GeneratorError));
    let texts: Vec<_> = events.into_iter().map(|(_, t)| t).collect();
    assert_eq!(texts, (0..5).map(token).collect::<Vec<_>>());
}

/// The consumer receives chunk i while the generator is parked before producing i+1: the
/// generator only goes on when the consumer says it has chunk i.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_per_event_by_handshake() {
    for policy in [
        Policy::backpressure(),
        Policy::coalesce(),
        Policy::disconnect(Duration::from_secs(60)),
    ] {
        let (go_tx, mut go_rx) = mpsc::unbounded_channel::<()>();
        let mut consumer = Gate::new().policy(policy).spawn(|_, mut tx| async move {
            for i in 0..50 {
                tx.send(token(i)).await?;
                // Parked until the consumer has received chunk i.
                if go_rx.recv().await.is_none() {
                    break;
                }
            }
            Ok::<_, streamgate::SendError<String>>(())
        });
        for i in 0..50 {
            let event = timeout(HANG, consumer.next())
                .await
                .expect("event i must arrive while the generator waits")
                .expect("the stream is not over")
                .expect("no error");
            assert_eq!(
                (event.id(), event.chunk().as_str()),
                (i, token(i as usize).as_str())
            );
            go_tx.send(()).unwrap();
        }
        assert!(timeout(HANG, consumer.next()).await.unwrap().is_none());
    }
}

/// One randomized producer/consumer schedule: random chunk sizes (some over the byte bound),
/// random yields on both sides, bounds checked at every consumer step; everything sent arrives,
/// in order, merged or not.
async fn random_schedule(seed: u64, policy: Policy) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let max_events = 1 + rng.below(8) as usize;
    let max_bytes = 1 + rng.below(64) as usize;
    let count = 200;
    let sizes: Vec<usize> = (0..count).map(|_| rng.below(80) as usize).collect();
    let sent: String = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| char::from(b'a' + (i % 26) as u8).to_string().repeat(n))
        .collect();
    let producer_yields: Vec<u64> = (0..count).map(|_| rng.below(3)).collect();
    let mut consumer = Gate::new()
        .max_events(max_events)
        .max_bytes(max_bytes)
        .policy(policy)
        .spawn(move |_, mut tx| async move {
            for (i, n) in sizes.into_iter().enumerate() {
                for _ in 0..producer_yields[i] {
                    tokio::task::yield_now().await;
                }
                let text = char::from(b'a' + (i % 26) as u8).to_string().repeat(n);
                tx.send(text).await?;
            }
            Ok::<_, streamgate::SendError<String>>(())
        });
    let handle = consumer.handle();
    let mut received = String::new();
    // Each event covers the ids of the chunks merged into it: together they tile 0..count.
    let mut next_id = 0;
    let mut events = 0;
    loop {
        for _ in 0..rng.below(4) {
            tokio::task::yield_now().await;
        }
        let stats = handle.stats();
        assert!(
            stats.buffered_events <= max_events,
            "seed {seed}: {stats:?}"
        );
        assert!(
            stats.buffered_bytes <= max_bytes || stats.buffered_events == 1,
            "seed {seed}: {stats:?} over {max_bytes} bytes"
        );
        match timeout(HANG, consumer.next()).await.expect("no hang") {
            Some(Ok(event)) => {
                assert_eq!(*event.ids().start(), next_id, "seed {seed}");
                assert!(event.ids().end() >= event.ids().start(), "seed {seed}");
                assert_eq!(event.id(), *event.ids().end(), "seed {seed}");
                next_id = event.id() + 1;
                events += 1;
                received.push_str(event.chunk());
            }
            Some(Err(error)) => panic!("seed {seed}: {error}"),
            None => break,
        }
    }
    assert_eq!(received, sent, "seed {seed}: lossless and in order");
    let stats = handle.stats();
    assert!(stats.peak_buffered_events <= max_events, "seed {seed}");
    assert_eq!(stats.chunks_sent + stats.chunks_merged, count as u64);
    assert_eq!(
        next_id, count as u64,
        "seed {seed}: the ids tile 0..{count}"
    );
    assert_eq!(stats.next_id, count as u64);
    assert_eq!(stats.events_delivered, events);
    assert_eq!(stats.bytes_delivered, sent.len() as u64);
}

#[tokio::test]
async fn bounds_hold_at_every_step_of_random_schedules() {
    for seed in 0..150 {
        random_schedule(seed, Policy::backpressure()).await;
        random_schedule(seed, Policy::coalesce()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounds_hold_at_every_step_of_random_schedules_on_two_threads() {
    for seed in 1000..1100 {
        random_schedule(seed, Policy::backpressure()).await;
        random_schedule(seed, Policy::coalesce()).await;
    }
}

/// A generator that counts what it got into the gate, and never stops on its own.
fn counting_gate(gate: Gate) -> (Consumer<String>, Arc<AtomicU64>) {
    let produced = Arc::new(AtomicU64::new(0));
    let counter = produced.clone();
    let consumer = gate.spawn(|_, mut tx| async move {
        for i in 0.. {
            tx.send(token(i)).await?;
            counter.fetch_add(1, Ordering::SeqCst);
        }
        Ok::<_, streamgate::SendError<String>>(())
    });
    (consumer, produced)
}

/// A pause limit is set only through `max_pause`, so a policy that waits for ever says so; the
/// limit can still be read by matching on the policy.
#[test]
fn a_policy_says_its_pause_limit() {
    let limit = |policy: Policy| match policy {
        Policy::Backpressure { max_pause, .. } | Policy::Coalesce { max_pause, .. } => max_pause,
        Policy::Disconnect { after, .. } => Some(after),
        _ => unreachable!("every policy is matched"),
    };
    let second = Some(Duration::from_secs(1));
    assert_eq!(
        limit(Policy::backpressure()),
        Some(streamgate::DEFAULT_MAX_PAUSE)
    );
    assert_eq!(
        limit(Policy::coalesce()),
        Some(streamgate::DEFAULT_MAX_PAUSE)
    );
    assert_eq!(limit(Policy::backpressure().max_pause(None)), None);
    assert_eq!(limit(Policy::coalesce().max_pause(second)), second);
    assert!(Policy::coalesce().max_pause(None) != Policy::backpressure().max_pause(None));
    // `Disconnect` has no pause limit: its `after` stands.
    let disconnect = Policy::disconnect(Duration::from_secs(10));
    assert_eq!(disconnect.max_pause(None), disconnect);
    assert_eq!(Policy::default(), Policy::backpressure());
}

#[tokio::test(start_paused = true)]
async fn backpressure_pauses_the_generator_while_the_consumer_stalls() {
    let unlimited = Policy::backpressure().max_pause(None);
    let (mut consumer, produced) = counting_gate(Gate::new().max_events(8).policy(unlimited));
    let handle = consumer.handle();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    // The buffer is full and the generator waits in its ninth send.
    assert_eq!(produced.load(Ordering::SeqCst), 8);
    assert_eq!(handle.stats().buffered_events, 8);
    assert_eq!(handle.end_reason(), None);
    // The consumer comes back: every event is there, and the generator resumes.
    for i in 0..20 {
        let event = consumer.next().await.unwrap().unwrap();
        assert_eq!(event.chunk(), &token(i));
    }
    drop(consumer);
    handle.released().await;
    assert_eq!(handle.end_reason(), Some(EndReason::ConsumerGone));
}

#[tokio::test(start_paused = true)]
async fn the_default_policy_ends_a_reader_that_stopped() {
    let start = tokio::time::Instant::now();
    let (consumer, produced) = counting_gate(Gate::new().max_events(8));
    let handle = consumer.handle();
    tokio::time::sleep(streamgate::DEFAULT_MAX_PAUSE - Duration::from_millis(100)).await;
    assert_eq!(handle.end_reason(), None);
    handle.released().await;
    assert_eq!(handle.end_reason(), Some(EndReason::SlowConsumer));
    // The buffer was full from the start: the pause limit ran from there.
    let waited = start.elapsed();
    assert!(
        waited <= streamgate::DEFAULT_MAX_PAUSE + TICK,
        "ended after {waited:?}"
    );
    assert_eq!(produced.load(Ordering::SeqCst), 8);
    drop(consumer);
}

#[tokio::test(start_paused = true)]
async fn backpressure_max_pause_ends_a_stalled_stream() {
    let start = tokio::time::Instant::now();
    let policy = Policy::backpressure().max_pause(Some(Duration::from_secs(5)));
    let (mut consumer, produced) = counting_gate(Gate::new().max_events(8).policy(policy));
    let handle = consumer.handle();
    tokio::time::sleep(Duration::from_millis(4900)).await;
    assert_eq!(handle.end_reason(), None);
    handle.released().await;
    assert_eq!(handle.end_reason(), Some(EndReason::SlowConsumer));
    let waited = start.elapsed();
    assert!(
        waited <= Duration::from_secs(5) + TICK,
        "ended after {waited:?}"
    );
    assert_eq!(produced.load(Ordering::SeqCst), 8);
    // The waiting events are still delivered, then the reason.
    let (events, end) = drain(&mut consumer).await;
    assert_eq!(events.len(), 8);
    assert_eq!(end, Some(EndReason::SlowConsumer));
}

#[tokio::test(start_paused = true)]
async fn coalesce_merges_waiting_deltas_losslessly() {
    let mut consumer =
        Gate::new()
            .max_events(4)
            .policy(Policy::coalesce())
            .spawn(|_, mut tx| async move {
                for i in 0..1000 {
                    tx.send(token(i)).await?;
                }
                Ok::<_, streamgate::SendError<String>>(())
            });
    let handle = consumer.handle();
    // Nobody reads: the generator still finishes, merging into the newest waiting event.
    while handle.stats().next_id < 1000 {
        tokio::task::yield_now().await;
    }
    let stats = handle.stats();
    assert_eq!(stats.next_id, 1000, "the generator finished: {stats:?}");
    assert_eq!(stats.chunks_sent, 4);
    assert_eq!(stats.chunks_merged, 996);
    assert_eq!(
        stats.end_reason, None,
        "complete only once the consumer has it all"
    );
    let (events, end) = drain(&mut consumer).await;
    assert_eq!(end, None);
    assert_eq!(events.len(), 4);
    handle.released().await;
    assert_eq!(handle.end_reason(), Some(EndReason::Completed));
    let text: String = events.into_iter().map(|(_, t)| t).collect();
    assert_eq!(text, (0..1000).map(token).collect::<String>());
}

#[tokio::test(start_paused = true)]
async fn coalesce_is_bounded_by_bytes_and_then_pauses() {
    let (consumer, produced) = counting_gate(
        Gate::new()
            .max_events(4)
            .max_bytes(100)
            .policy(Policy::coalesce().max_pause(None)),
    );
    let handle = consumer.handle();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let stats = handle.stats();
    assert!(stats.buffered_bytes <= 100, "{stats:?}");
    assert_eq!(stats.buffered_events, 4);
    assert!(
        stats.buffered_bytes > 90,
        "merging stopped only at the byte bound: {stats:?}"
    );
    assert_eq!(
        produced.load(Ordering::SeqCst),
        stats.chunks_sent + stats.chunks_merged
    );
    assert_eq!(handle.end_reason(), None);
}

/// Chunks that never merge make `Coalesce` behave as `Backpressure`.
#[derive(Debug)]
struct Opaque;

impl Chunk for Opaque {
    fn byte_len(&self) -> usize {
        1
    }
}

#[tokio::test(start_paused = true)]
async fn coalesce_without_merge_is_backpressure() {
    let mut consumer =
        Gate::new()
            .max_events(2)
            .policy(Policy::coalesce())
            .spawn(|_, mut tx| async move {
                for _ in 0..10 {
                    tx.send(Opaque).await?;
                }
                Ok::<_, streamgate::SendError<Opaque>>(())
            });
    let handle = consumer.handle();
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(handle.stats().chunks_sent, 2);
    assert_eq!(handle.stats().chunks_merged, 0);
    let (events, end) = drain(&mut consumer).await;
    assert_eq!((events.len(), end), (10, None));
}

#[tokio::test(start_paused = true)]
async fn disconnect_ends_a_stopped_reader_after_the_deadline() {
    let policy = Policy::disconnect(Duration::from_secs(10));
    let (mut consumer, produced) = counting_gate(Gate::new().max_events(8).policy(policy));
    let handle = consumer.handle();
    // Read two, then stop reading.
    for _ in 0..2 {
        consumer.next().await.unwrap().unwrap();
    }
    let stopped = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(9_900)).await;
    assert_eq!(handle.end_reason(), None);
    handle.released().await;
    assert_eq!(handle.end_reason(), Some(EndReason::SlowConsumer));
    let waited = stopped.elapsed();
    assert!(
        waited <= Duration::from_secs(10) + TICK,
        "ended {waited:?} after the last take"
    );
    assert_eq!(produced.load(Ordering::SeqCst), 10);
    let (events, end) = drain(&mut consumer).await;
    assert_eq!((events.len(), end), (8, Some(EndReason::SlowConsumer)));
    assert!(handle.stats().end_to_release.is_some());
}

#[tokio::test(start_paused = true)]
async fn disconnect_spares_a_reader_that_trickles() {
    let policy = Policy::disconnect(Duration::from_secs(10));
    let (mut consumer, _) = counting_gate(Gate::new().max_events(8).policy(policy));
    let handle = consumer.handle();
    // One event every 6 s for two minutes: slower than the generator, never idle for 10 s.
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(6)).await;
        consumer.next().await.unwrap().unwrap();
    }
    assert_eq!(handle.end_reason(), None);
}

#[tokio::test]
async fn an_oversized_chunk_is_admitted_alone() {
    let mut consumer = Gate::new()
        .max_events(4)
        .max_bytes(10)
        .spawn(|_, mut tx| async move {
            tx.send("x".repeat(5)).await?;
            tx.send("y".repeat(50)).await?;
            tx.send("z".repeat(5)).await?;
            Ok::<_, streamgate::SendError<String>>(())
        });
    let handle = consumer.handle();
    let (events, end) = drain(&mut consumer).await;
    assert_eq!(end, None);
    assert_eq!(events.len(), 3);
    assert_eq!(handle.stats().peak_buffered_bytes, 50);
}
