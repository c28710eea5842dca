//! The engine-loop shape (`Gate::channel`): `try_send` never waits, `ready`/`closed`/`finish`/
//! `abort` behave as documented, the slow-consumer policies hold whichever way chunks arrive,
//! and one loop feeding many streams is never held up by any one of them.

mod common;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use common::HANG;
use common::gate::{Releases, TICK, drain, drain_within};
use futures_util::StreamExt;
use streamgate::{EndReason, Gate, GateHandle, Policy, Sender, TrySendError};
use tokio::time::{Instant, sleep, timeout};

/// Polls `future` once, with a waker that does nothing.
fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    std::pin::Pin::new(future).poll(&mut Context::from_waker(Waker::noop()))
}

/// A hang guard for tests on paused time, where the clock jumps to the next timer.
const PAUSED_HANG: Duration = Duration::from_secs(3600);

async fn released(handle: &GateHandle) {
    timeout(HANG, handle.released())
        .await
        .expect("released in time");
}

#[tokio::test]
async fn try_send_hands_a_full_chunk_back_and_counts_chunks_after_the_consumer_left() {
    let releases = Releases::default();
    let (mut tx, consumer) = releases.gate().max_events(2).channel::<String>();
    let handle = consumer.handle();
    tx.try_send("a".into()).unwrap();
    tx.try_send("b".into()).unwrap();
    match tx.try_send("c".into()) {
        Err(TrySendError::Full(chunk)) => assert_eq!(chunk, "c"),
        other => panic!("expected Full, got {other:?}"),
    }
    let stats = handle.stats();
    assert_eq!((stats.chunks_sent, stats.next_id), (2, 2));
    assert_eq!(stats.chunks_after_end, 0, "a full buffer wastes nothing");
    assert!(!tx.is_closed());

    drop(consumer);
    let refused = tx.try_send("d".into()).unwrap_err();
    assert!(refused.is_ended());
    assert_eq!(refused.into_inner(), "d");
    assert!(tx.try_send("e".into()).unwrap_err().is_ended());
    assert!(tx.is_closed());
    assert!(tx.ready().await.is_err(), "ready fails on an ended stream");
    timeout(HANG, tx.closed()).await.expect("closed resolves");
    let stats = handle.stats();
    assert_eq!(stats.end_reason, Some(EndReason::ConsumerGone));
    assert_eq!(stats.chunks_after_end, 2);
    assert_eq!(stats.events_undelivered, 2);
    assert_eq!(stats.next_id, 2, "refused chunks take no id");

    drop(tx);
    released(&handle).await;
    let (reason, stats, _) = releases.once_at();
    assert_eq!(reason, EndReason::ConsumerGone);
    assert_eq!(stats.chunks_after_end, 2);
    assert_eq!(stats.events_undelivered, 2);
}

#[tokio::test(start_paused = true)]
async fn ready_resolves_when_the_consumer_makes_room() {
    let (mut tx, mut consumer) = Gate::new().max_events(1).channel::<String>();
    tx.try_send("a".into()).unwrap();
    assert!(matches!(
        tx.try_send("b".into()),
        Err(TrySendError::Full(_))
    ));
    let waiter = tokio::spawn(async move {
        let ready = tx.ready().await;
        (ready, tx)
    });
    sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished(), "no room yet");
    assert_eq!(consumer.next().await.unwrap().unwrap().chunk(), "a");
    // Under paused time a lost wake-up would let the clock run to HANG and fail here.
    let (ready, mut tx) = timeout(HANG, waiter).await.expect("woken").unwrap();
    assert!(ready.is_ok());
    tx.try_send("b".into()).expect("room after ready");
    tx.finish();
    let (events, end) = drain(&mut consumer).await;
    assert!(end.is_none());
    assert_eq!(events, vec![(1, "b".to_owned())]);
}

/// `ready()` promises that a `try_send` will not find the buffer full. With a byte bound, a
/// chunk larger than the free bytes must not make `ready` resolve at once again and again (an
/// engine doing `ready().await; try_send(..)` would spin).
#[tokio::test(start_paused = true)]
async fn ready_does_not_spin_when_a_chunk_needs_more_bytes_than_are_free() {
    let (mut tx, mut consumer) = Gate::new().max_events(8).max_bytes(10).channel::<String>();
    tx.try_send("aaaaa".into()).unwrap();
    let big = "bbbbbbbb".to_owned();
    let big = match tx.try_send(big) {
        Err(TrySendError::Full(chunk)) => chunk,
        other => panic!("expected Full, got {other:?}"),
    };
    // The engine's loop: wait for room, try again. Count the tries while the reader sleeps.
    let tries = Arc::new(AtomicUsize::new(0));
    let counted = tries.clone();
    let engine = tokio::spawn(async move {
        let mut chunk = big;
        loop {
            if tx.ready().await.is_err() {
                return;
            }
            counted.fetch_add(1, Ordering::Relaxed);
            match tx.try_send(chunk) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) => chunk = back,
                Err(_) => return,
            }
            tokio::task::yield_now().await;
            if counted.load(Ordering::Relaxed) > 1000 {
                return; // spinning: give up so the test can report it
            }
        }
        tx.finish();
    });
    sleep(Duration::from_millis(100)).await;
    assert!(
        tries.load(Ordering::Relaxed) <= 1,
        "ready() resolved {} times while the chunk could not fit",
        tries.load(Ordering::Relaxed)
    );
    let (events, end) = drain(&mut consumer).await;
    assert!(end.is_none(), "{end:?}");
    assert_eq!(
        events,
        vec![(0, "aaaaa".to_owned()), (1, "bbbbbbbb".to_owned())]
    );
    engine.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn closed_resolves_at_every_end() {
    // Consumer gone.
    let (tx, consumer) = Gate::new().channel::<String>();
    let mut closed = pin!(tx.closed());
    assert!(poll_once(&mut closed).is_pending());
    drop(consumer);
    timeout(HANG, closed)
        .await
        .expect("closed at consumer gone");

    // Cancelled through the handle.
    let (tx, consumer) = Gate::new().channel::<String>();
    consumer.handle().cancel();
    timeout(HANG, tx.closed()).await.expect("closed at cancel");
    assert!(tx.is_closed());

    // Slow-consumer end, with the engine not sending at all after the first refusal.
    let (mut tx, consumer) = Gate::new()
        .max_events(1)
        .policy(Policy::disconnect(Duration::from_secs(1)))
        .channel::<String>();
    tx.try_send("a".into()).unwrap();
    assert!(tx.try_send("b".into()).is_err());
    let start = Instant::now();
    timeout(HANG, tx.closed())
        .await
        .expect("closed at slow end");
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited <= Duration::from_secs(1) + TICK,
        "closed {waited:?} after the refusal"
    );
    assert_eq!(
        consumer.handle().end_reason(),
        Some(EndReason::SlowConsumer)
    );
}

#[tokio::test]
async fn finish_completes_only_after_the_consumer_drained_it() {
    let releases = Releases::default();
    let (mut tx, mut consumer) = releases.gate().channel::<String>();
    let handle = consumer.handle();
    for i in 0..3 {
        tx.try_send(format!("t{i}")).unwrap();
    }
    tx.finish();
    tokio::task::yield_now().await;
    assert_eq!(handle.end_reason(), None, "not complete before the drain");
    assert!(!handle.is_released());
    let (events, end) = drain(&mut consumer).await;
    assert!(end.is_none());
    assert_eq!(events.len(), 3);
    released(&handle).await;
    let (reason, stats, _) = releases.once_at();
    assert_eq!(reason, EndReason::Completed);
    assert_eq!(stats.events_delivered, 3);
    assert_eq!(stats.events_undelivered, 0);
    assert!(!stats.stop_forced, "the engine had let go of the sender");

    // The same, but the consumer leaves without reading: not completed.
    let releases = Releases::default();
    let (mut tx, consumer) = releases.gate().channel::<String>();
    let handle = consumer.handle();
    for i in 0..3 {
        tx.try_send(format!("t{i}")).unwrap();
    }
    tx.finish();
    drop(consumer);
    released(&handle).await;
    let (reason, stats, _) = releases.once_at();
    assert_eq!(reason, EndReason::ConsumerGone);
    assert_eq!(stats.events_undelivered, 3);
    assert_eq!(stats.events_delivered, 0);
}

#[tokio::test]
async fn abort_delivers_the_events_then_the_error_with_its_source() {
    let releases = Releases::default();
    let (mut tx, mut consumer) = releases.gate().first_id(7).channel::<String>();
    let handle = consumer.handle();
    tx.try_send("x".into()).unwrap();
    tx.try_send("y".into()).unwrap();
    tx.abort(std::io::Error::other("device lost"));
    let (events, end) = drain(&mut consumer).await;
    assert_eq!(events, vec![(7, "x".to_owned()), (8, "y".to_owned())]);
    let error = end.expect("an error end");
    assert_eq!(error.reason(), EndReason::GeneratorError);
    let source = std::error::Error::source(&error).expect("the engine's error");
    assert_eq!(source.to_string(), "device lost");
    released(&handle).await;
    let (reason, stats, _) = releases.once_at();
    assert_eq!(reason, EndReason::GeneratorError);
    assert_eq!(stats.next_id, 9);
    assert!(!stats.stop_forced);
}

#[tokio::test]
async fn dropping_the_sender_without_finish_is_a_generator_error() {
    let releases = Releases::default();
    let (mut tx, mut consumer) = releases.gate().channel::<String>();
    let handle = consumer.handle();
    tx.try_send("partial".into()).unwrap();
    drop(tx);
    let (events, end) = drain(&mut consumer).await;
    assert_eq!(events, vec![(0, "partial".to_owned())]);
    assert_eq!(
        end.expect("an error end").reason(),
        EndReason::GeneratorError
    );
    released(&handle).await;
    assert_eq!(releases.once().0, EndReason::GeneratorError);
}

/// An engine that try_sends to a reader that stopped: every `interval` it offers its held
/// chunk again (or, with `None`, never again after the first refusal). Returns when the
/// stream ended, with the time of the first refusal.
async fn engine_to_stopped_reader(
    mut tx: Sender<String>,
    interval: Option<Duration>,
) -> (Instant, u64) {
    let mut first_full = None;
    let mut i = 0u64;
    let mut held = None;
    loop {
        let chunk = held.take().unwrap_or_else(|| format!("t{i}"));
        match tx.try_send(chunk) {
            Ok(()) => i += 1,
            Err(TrySendError::Full(chunk)) => {
                first_full.get_or_insert_with(Instant::now);
                held = Some(chunk);
                match interval {
                    Some(_) => {}
                    None => {
                        tx.closed().await;
                        return (first_full.unwrap(), i);
                    }
                }
            }
            Err(_) => return (first_full.expect("refused as full first"), i),
        }
        sleep(interval.unwrap_or(Duration::from_millis(100))).await;
    }
}

#[tokio::test(start_paused = true)]
async fn disconnect_ends_a_stopped_reader_within_after_plus_a_tick_with_try_send() {
    for interval in [Some(Duration::from_millis(100)), None] {
        let releases = Releases::default();
        let after = Duration::from_secs(10);
        let (tx, mut consumer) = releases
            .gate()
            .max_events(4)
            .policy(Policy::disconnect(after))
            .channel::<String>();
        let handle = consumer.handle();
        let engine = tokio::spawn(engine_to_stopped_reader(tx, interval));
        // The reader keeps up for 10 events, then stops (but stays connected).
        for i in 0..10 {
            let event = consumer.next().await.unwrap().unwrap();
            assert_eq!(event.id(), i);
        }
        let (first_full, _) = timeout(HANG * 10, engine).await.expect("ended").unwrap();
        released(&handle).await;
        let (reason, stats, at) = releases.once_at();
        assert_eq!(reason, EndReason::SlowConsumer, "interval {interval:?}");
        let waited = at - first_full;
        assert!(
            waited >= after && waited <= after + Duration::from_millis(2),
            "ended {waited:?} after the first refusal (interval {interval:?})"
        );
        assert_eq!(stats.events_undelivered, 4);
        // The reader, coming back, gets the waiting events, then the end.
        let (events, end) = drain(&mut consumer).await;
        assert_eq!(
            events.iter().map(|e| e.0).collect::<Vec<_>>(),
            [10, 11, 12, 13]
        );
        assert_eq!(end.unwrap().reason(), EndReason::SlowConsumer);
    }
}

#[tokio::test(start_paused = true)]
async fn disconnect_spares_a_reader_that_trickles_with_try_send() {
    // Two engines: one waits for `ready()`, one retries every 100 ms.
    for use_ready in [true, false] {
        let (mut tx, mut consumer) = Gate::new()
            .max_events(4)
            .policy(Policy::disconnect(Duration::from_secs(10)))
            .channel::<String>();
        let engine = tokio::spawn(async move {
            for i in 0..30 {
                let mut chunk = format!("t{i}");
                loop {
                    if use_ready && tx.ready().await.is_err() {
                        return false;
                    }
                    match tx.try_send(chunk) {
                        Ok(()) => break,
                        Err(TrySendError::Full(back)) => chunk = back,
                        Err(_) => return false,
                    }
                    if !use_ready {
                        sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            tx.finish();
            true
        });
        // One event every 6 s for a minute, then the rest at once.
        let mut ids = Vec::new();
        for _ in 0..10 {
            ids.push(consumer.next().await.unwrap().unwrap().id());
            sleep(Duration::from_secs(6)).await;
        }
        let (events, end) = drain(&mut consumer).await;
        assert!(end.is_none(), "a trickling reader was ended: {end:?}");
        ids.extend(events.iter().map(|e| e.0));
        assert_eq!(ids, (0..30).collect::<Vec<_>>());
        assert!(engine.await.unwrap());
    }
}

/// The slow-consumer clock watches the consumer, not the engine: a reader that took every
/// event and waits for more is not "slow" while the engine, refused once, produces nothing
/// for a while (a preempted request, a long step for other requests).
#[tokio::test(start_paused = true)]
async fn a_reader_that_caught_up_is_not_ended_while_the_engine_is_quiet() {
    for policy in [
        Policy::disconnect(Duration::from_secs(10)),
        Policy::backpressure().max_pause(Some(Duration::from_secs(10))),
        Policy::coalesce().max_pause(Some(Duration::from_secs(10))),
    ] {
        let (mut tx, mut consumer) = Gate::new()
            .max_events(2)
            .max_bytes(4)
            .policy(policy)
            .channel::<String>();
        tx.try_send("aa".into()).unwrap();
        tx.try_send("bb".into()).unwrap();
        let held = match tx.try_send("cc".into()) {
            Err(TrySendError::Full(chunk)) => chunk,
            other => panic!("expected Full, got {other:?}"),
        };
        // The reader takes both at once and waits for more.
        let reader = tokio::spawn(async move {
            let (events, end) = drain_within(&mut consumer, PAUSED_HANG).await;
            (events, end.map(|e| e.reason()))
        });
        // The engine comes back after 25 s.
        sleep(Duration::from_secs(25)).await;
        assert!(
            tx.try_send(held).is_ok(),
            "{policy:?}: a reader that keeps up was ended as {:?}",
            tx.is_closed()
        );
        tx.finish();
        let (events, end) = reader.await.unwrap();
        assert_eq!(end, None, "{policy:?}");
        assert_eq!(events.len(), 3);
    }
}

/// What each consumer of the many-streams test does.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Reader {
    KeepsUp,
    Slow,
    Stops,
    Leaves,
}

#[tokio::test(start_paused = true)]
async fn one_engine_loop_feeds_many_streams_and_no_stream_holds_it_up() {
    const STREAMS: usize = 200;
    const TOKENS: u64 = 50;
    let after = Duration::from_secs(1);
    let kind = |i: usize| match i % 10 {
        0 => Reader::Stops,
        1 => Reader::Leaves,
        2 | 3 => Reader::Slow,
        _ => Reader::KeepsUp,
    };
    let releases: Vec<Releases> = (0..STREAMS).map(|_| Releases::default()).collect();
    let mut senders = Vec::new();
    let mut readers = Vec::new();
    let start = Instant::now();
    for (i, release) in releases.iter().enumerate() {
        let (tx, mut consumer) = release
            .gate()
            .max_events(4)
            .policy(Policy::disconnect(after))
            .channel::<String>();
        let handle = consumer.handle();
        senders.push(Some((tx, None::<String>, 0u64)));
        let kind = kind(i);
        readers.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            let mut texts = Vec::new();
            loop {
                if matches!(kind, Reader::Stops | Reader::Leaves) && ids.len() == 5 {
                    if kind == Reader::Leaves {
                        drop(consumer);
                        return (ids, texts, None, Instant::now(), handle);
                    }
                    // Stopped, but connected until the stream ends.
                    handle.released().await;
                    return (ids, texts, None, Instant::now(), handle);
                }
                match consumer.next().await {
                    Some(Ok(event)) => {
                        ids.push(event.id());
                        texts.push(event.into_chunk());
                    }
                    Some(Err(error)) => {
                        return (ids, texts, Some(error.reason()), Instant::now(), handle);
                    }
                    None => return (ids, texts, None, Instant::now(), handle),
                }
                if kind == Reader::Slow {
                    sleep(Duration::from_millis(20)).await;
                }
            }
        }));
    }

    // The engine: one step per millisecond, one token per live stream per step, never
    // awaiting any one stream.
    let mut steps = 0u64;
    while senders.iter().any(Option::is_some) {
        for slot in senders.iter_mut() {
            let Some((tx, held, next)) = slot else {
                continue;
            };
            if *next == TOKENS && held.is_none() {
                slot.take().unwrap().0.finish();
                continue;
            }
            let chunk = held.take().unwrap_or_else(|| format!("t{next} "));
            match tx.try_send(chunk) {
                Ok(()) => *next += 1,
                Err(TrySendError::Full(chunk)) => *held = Some(chunk),
                Err(_) => *slot = None, // ended: drop the request
            }
        }
        steps += 1;
        assert!(steps < 100_000, "the loop ends");
        sleep(Duration::from_millis(1)).await;
    }

    for (i, reader) in readers.into_iter().enumerate() {
        let (ids, texts, end, ended_at, handle) =
            timeout(HANG, reader).await.expect("reader ends").unwrap();
        released(&handle).await;
        let (reason, stats, _) = releases[i].once_at();
        match kind(i) {
            Reader::KeepsUp | Reader::Slow => {
                assert_eq!(end, None, "stream {i}");
                assert_eq!(reason, EndReason::Completed, "stream {i}");
                assert_eq!(ids, (0..TOKENS).collect::<Vec<_>>(), "stream {i}");
                let expected: Vec<String> = (0..TOKENS).map(|t| format!("t{t} ")).collect();
                assert_eq!(texts, expected, "stream {i}");
                assert_eq!(stats.events_delivered, TOKENS);
                if kind(i) == Reader::KeepsUp {
                    // Not held up by the stopped readers, whose streams end only after `after`.
                    assert!(
                        ended_at - start < after / 4,
                        "stream {i} completed after {:?}",
                        ended_at - start
                    );
                }
            }
            Reader::Stops => {
                assert_eq!(reason, EndReason::SlowConsumer, "stream {i}");
                // It took 5 events and its 4 slots filled within the engine's first 10 steps
                // (one token per stream per millisecond): the end is `after` later, on the
                // paused clock.
                let ended = ended_at - start;
                assert!(
                    ended >= after && ended <= after + Duration::from_millis(10) + TICK,
                    "stream {i} ended after {ended:?}"
                );
                assert_eq!(ids, (0..5).collect::<Vec<_>>());
                assert!(stats.events_undelivered > 0);
            }
            Reader::Leaves => {
                assert_eq!(reason, EndReason::ConsumerGone, "stream {i}");
                assert!(stats.chunks_after_end <= 1, "stream {i}: {stats:?}");
            }
        }
    }
    for release in &releases {
        assert_eq!(release.count(), 1);
    }
}

/// A channel gate's work has stopped when the engine lets go of the sender: with a stop grace
/// the release waits for that (and no longer than the grace).
#[tokio::test(start_paused = true)]
async fn the_release_of_a_channel_waits_for_the_engine_within_the_stop_grace() {
    // The engine lets go after 100 ms: released then, not forced.
    let releases = Releases::default();
    let (mut tx, consumer) = releases
        .gate()
        .stop_grace(Duration::from_secs(1))
        .channel::<String>();
    let handle = consumer.handle();
    tx.try_send("a".into()).unwrap();
    let start = Instant::now();
    drop(consumer);
    sleep(Duration::from_millis(100)).await;
    assert!(!handle.is_released(), "the engine still holds the sender");
    assert!(tx.try_send("b".into()).unwrap_err().is_ended());
    drop(tx);
    released(&handle).await;
    let (reason, stats, at) = releases.once_at();
    assert_eq!(reason, EndReason::ConsumerGone);
    assert!(!stats.stop_forced);
    assert_eq!(at - start, Duration::from_millis(100));
    assert_eq!(stats.end_to_stop, Some(Duration::from_millis(100)));
    assert_eq!(stats.chunks_after_end, 1);

    // The engine never lets go: released when the grace runs out, forced.
    let releases = Releases::default();
    let (tx, consumer) = releases
        .gate()
        .stop_grace(Duration::from_millis(200))
        .channel::<String>();
    let handle = consumer.handle();
    let start = Instant::now();
    handle.cancel();
    released(&handle).await;
    let (reason, stats, at) = releases.once_at();
    assert_eq!(reason, EndReason::Cancelled);
    assert!(stats.stop_forced);
    assert_eq!(at - start, Duration::from_millis(200));
    drop((tx, consumer));
    assert_eq!(
        releases.count(),
        1,
        "dropping the sender later releases nothing more"
    );
}

/// An engine loop serves many streams, so a send it retries on one ended stream must not park
/// it: on a channel gate every send (and `ready`) after the end fails again at once, handing
/// the chunk back, and each chunk is counted as made after the end.
#[tokio::test(start_paused = true)]
async fn a_send_after_a_failed_send_fails_again_at_once_on_a_channel() {
    let (mut tx, consumer) = Gate::new().max_events(2).channel::<String>();
    let handle = consumer.handle();
    drop(consumer);
    for i in 0..3 {
        let token = format!("t{i} ");
        let mut send = pin!(tx.send(token.clone()));
        match poll_once(&mut send) {
            Poll::Ready(Err(refused)) => assert_eq!(refused.into_inner(), token),
            Poll::Ready(Ok(())) => panic!("send {i} was accepted on an ended stream"),
            Poll::Pending => panic!("send {i} on an ended stream parks the engine loop"),
        }
    }
    for i in 0..2 {
        let mut ready = pin!(tx.ready());
        assert!(
            matches!(poll_once(&mut ready), Poll::Ready(Err(_))),
            "ready {i} on an ended stream does not fail at once"
        );
    }
    let stats = handle.stats();
    assert_eq!(stats.end_reason, Some(EndReason::ConsumerGone));
    assert_eq!(stats.chunks_after_end, 3, "{stats:?}");
}

/// A spawned generator that ignores a failed send and sends again is parked there, not left to
/// spin making chunks nobody reads: exactly two chunks after the end (the failed one and the
/// one it is parked in), until its stop grace runs out.
#[tokio::test(start_paused = true)]
async fn a_send_after_a_failed_send_parks_a_spawned_generator() {
    let returned = Arc::new(AtomicUsize::new(0));
    let counted = returned.clone();
    let consumer = Gate::new()
        .max_events(1)
        .stop_grace(Duration::from_secs(1200))
        .spawn(move |_, mut tx| async move {
            loop {
                let _ = tx.send("t ".to_owned()).await;
                counted.fetch_add(1, Ordering::SeqCst);
            }
            #[allow(unreachable_code)]
            Ok::<_, streamgate::SendError<String>>(())
        });
    let handle = consumer.handle();
    // The first send is in, the second waits for room.
    while handle.stats().chunks_sent == 0 {
        tokio::task::yield_now().await;
    }
    drop(consumer);
    sleep(Duration::from_secs(600)).await;
    assert_eq!(
        returned.load(Ordering::SeqCst),
        2,
        "the accepted send and the failed one returned; the next one is parked"
    );
    let stats = handle.stats();
    assert_eq!(stats.end_reason, Some(EndReason::ConsumerGone));
    assert_eq!(stats.chunks_after_end, 2, "{stats:?}");
    assert!(!handle.is_released(), "parked within its stop grace");
    timeout(PAUSED_HANG, handle.released())
        .await
        .expect("released when the grace runs out");
    let stats = handle.stats();
    assert!(stats.stop_forced, "{stats:?}");
    assert_eq!(stats.end_to_stop, Some(Duration::from_secs(1200)));
}

/// The generator's token is a child of the stream's: a generator cancelling it does not end the
/// stream behind the gate's back, while the stream's end still reaches it.
#[tokio::test]
async fn the_generators_token_cannot_end_the_stream() {
    let mut consumer = Gate::new().spawn(|cancel, mut tx| async move {
        cancel.cancel();
        tx.send("still here".to_owned()).await?;
        Ok::<_, streamgate::SendError<String>>(())
    });
    let event = consumer.next().await.unwrap().unwrap();
    assert_eq!(event.chunk(), "still here");
    assert!(consumer.next().await.is_none());
    assert_eq!(consumer.handle().end_reason(), Some(EndReason::Completed));
}

/// A spawned generator that hands its sender to another task and returns: the stream finishes
/// when that sender is done, with every chunk it sent, not when the generator returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_handed_to_another_task_finishes_the_stream_when_dropped() {
    let mut consumer = Gate::new().spawn(|_, mut tx| async move {
        tokio::spawn(async move {
            for i in 0..3 {
                sleep(Duration::from_millis(5)).await;
                tx.send(format!("t{i} ")).await?;
            }
            Ok::<_, streamgate::SendError<String>>(())
        });
        Ok::<_, streamgate::SendError<String>>(())
    });
    let handle = consumer.handle();
    let mut text = String::new();
    while let Some(event) = timeout(HANG, consumer.next()).await.expect("no hang") {
        text.push_str(event.expect("completes").chunk());
    }
    assert_eq!(text, "t0 t1 t2 ");
    timeout(HANG, handle.released()).await.expect("released");
    assert_eq!(handle.end_reason(), Some(EndReason::Completed));
}
