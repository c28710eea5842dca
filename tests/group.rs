//! Groups: one shutdown for every member (each ends visibly as `Shutdown` and is released), and
//! a byte budget shared by the members' buffers.

mod common;

use std::future::{Future, pending};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::gate::{Releases, TICK, drain};
use common::{HANG, Rng};
use futures_util::StreamExt;
use streamgate::{Consumer, EndReason, Gate, Group, Policy, SendError, TrySendError};
use tokio::time::{sleep, timeout};

/// Runs `test` on a current-thread runtime with paused time, on its own thread, and fails if
/// it has not finished after HANG of real time. (A task that never stops being runnable keeps
/// paused time from advancing, so a guard on the paused clock itself would never fire.)
fn paused<F, Fut>(test: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let (done, finished) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(test());
        let _ = done.send(());
    });
    match finished.recv_timeout(HANG) {
        Ok(()) => thread.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            // The test panicked: report its panic.
            if let Err(panic) = thread.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("the test did not finish in {HANG:?} of real time (a task spins?)")
        }
    }
}

/// A generator sending `n` numbered tokens (for ever with `None`), stopping when a send fails.
fn tokens(gate: Gate, n: Option<u64>) -> Consumer<String> {
    gate.spawn(move |_, mut tx| async move {
        let mut i = 0;
        while n.is_none_or(|n| i < n) {
            tx.send(format!("t{i} ")).await?;
            i += 1;
            sleep(Duration::from_millis(1)).await;
        }
        Ok::<_, SendError<String>>(())
    })
}

#[test]
fn shutdown_ends_every_member_as_shutdown_and_waits_for_their_release() {
    paused(|| async {
        let group = Group::new();
        // Already over before the shutdown: it left the group at its release.
        let done = Releases::default();
        let mut completed = tokens(done.gate().group(&group).max_events(4), Some(3));
        assert!(drain(&mut completed).await.1.is_none());
        completed.handle().released().await;
        assert_eq!(group.stats().gates, 0);

        // A reader that stopped with events waiting.
        let stopped = Releases::default();
        let mut stopped_consumer = tokens(stopped.gate().group(&group).max_events(4), None);
        // A generator that waits on something that never comes and ignores its token.
        let idle = Releases::default();
        let mut idle_consumer = idle.gate().group(&group).spawn(|_, mut tx| async move {
            tx.send("only ".to_owned()).await?;
            pending::<()>().await;
            Ok::<_, SendError<String>>(())
        });
        // An engine's stream, the engine still holding the sender.
        let engine = Releases::default();
        let (mut tx, mut engine_consumer) = engine.gate().group(&group).channel::<String>();
        tx.try_send("e0 ".into()).unwrap();
        // A reader that keeps up.
        let reading = Releases::default();
        let mut reading_consumer = tokens(reading.gate().group(&group), None);
        let reader = tokio::spawn(async move {
            let result = drain(&mut reading_consumer).await;
            (result, reading_consumer)
        });
        sleep(Duration::from_millis(100)).await;
        assert_eq!(group.stats().gates, 4);
        assert!(!group.is_shutting_down());

        let start = tokio::time::Instant::now();
        let report = timeout(HANG, group.shutdown(Duration::from_secs(5)))
            .await
            .expect("shutdown within its grace");
        // It waited for the engine's stream until its grace ran out, and no longer.
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(5) && waited <= Duration::from_secs(5) + TICK,
            "the shutdown took {waited:?}"
        );
        assert!(group.is_shutting_down());
        // The engine still holds its sender: its release waits for the engine (a channel's
        // default stop grace, 10 s, is longer than the shutdown's 5 s).
        assert_eq!((report.ended, report.released), (4, 3));
        assert_eq!(group.stats().gates, 1);

        // Every consumer gets what was waiting, then the shutdown, then nothing.
        let (events, end) = drain(&mut stopped_consumer).await;
        assert_eq!(events.len(), 4, "the full buffer is delivered");
        assert_eq!(end.unwrap().reason(), EndReason::Shutdown);
        let (events, end) = drain(&mut idle_consumer).await;
        assert_eq!(events, vec![(0, "only ".to_owned())]);
        assert_eq!(end.unwrap().reason(), EndReason::Shutdown);
        let (events, end) = drain(&mut engine_consumer).await;
        assert_eq!(events, vec![(0, "e0 ".to_owned())]);
        assert_eq!(end.unwrap().reason(), EndReason::Shutdown);
        assert!(tx.try_send("late".into()).unwrap_err().is_ended());
        // The engine learns the stream ended and lets go: now the work has stopped.
        drop(tx);
        engine_consumer.handle().released().await;
        assert_eq!(group.stats().gates, 0, "every member left at its release");
        let ((events, end), _) = reader.await.unwrap();
        assert_eq!(end.unwrap().reason(), EndReason::Shutdown);
        assert!(events.iter().enumerate().all(|(i, e)| e.0 == i as u64));

        assert_eq!(done.once().0, EndReason::Completed);
        for releases in [&stopped, &idle, &engine, &reading] {
            let (reason, stats) = releases.once();
            assert_eq!(reason, EndReason::Shutdown);
            assert_eq!(stats.end_reason, Some(EndReason::Shutdown));
            assert!(stats.chunks_after_end <= 1, "{stats:?}");
        }
        // The engine let go within the grace: the release waited for it, unforced.
        assert!(!engine.once().1.stop_forced);
    });
}

#[test]
fn a_gate_joining_after_shutdown_ends_at_once() {
    paused(|| async {
        let group = Group::new();
        let report = group.shutdown(Duration::from_secs(1)).await;
        assert_eq!((report.ended, report.released), (0, 0));

        let releases = Releases::default();
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        let mut consumer = releases
            .gate()
            .group(&group)
            .spawn(move |_, mut tx| async move {
                flag.store(true, Ordering::SeqCst);
                tx.send("never".to_owned()).await?;
                Ok::<_, SendError<String>>(())
            });
        let handle = consumer.handle();
        assert_eq!(handle.end_reason(), Some(EndReason::Shutdown));
        let (events, end) = drain(&mut consumer).await;
        assert!(events.is_empty());
        assert_eq!(end.unwrap().reason(), EndReason::Shutdown);
        timeout(HANG, handle.released()).await.unwrap();
        assert_eq!(releases.once().0, EndReason::Shutdown);
        assert_eq!(handle.stats().chunks_sent, 0);
        assert!(
            handle.stats().chunks_after_end <= 1,
            "the generator made at most one chunk"
        );
        assert!(!ran.load(Ordering::SeqCst), "the generator never ran");

        // The engine shape too.
        let releases = Releases::default();
        let (mut tx, mut consumer) = releases.gate().group(&group).channel::<String>();
        assert!(matches!(
            tx.try_send("x".into()),
            Err(TrySendError::Ended(_))
        ));
        assert_eq!(
            drain(&mut consumer).await.1.unwrap().reason(),
            EndReason::Shutdown
        );
        drop(tx);
        timeout(HANG, consumer.handle().released()).await.unwrap();
        assert_eq!(releases.once().0, EndReason::Shutdown);
        assert_eq!(group.stats().gates, 0);
    });
}

#[test]
fn shutdown_releases_a_generator_that_never_stops() {
    paused(|| async {
        let group = Group::new();
        // Zero stop grace: dropped at once, whatever it does.
        let releases = Releases::default();
        let consumer =
            releases
                .gate()
                .group(&group)
                .spawn(|_, _tx: streamgate::Sender<String>| async move {
                    loop {
                        sleep(Duration::from_millis(1)).await;
                    }
                    #[allow(unreachable_code)]
                    Ok::<_, SendError<String>>(())
                });
        // A long stop grace and a generator that ignores its token: the shutdown's own grace
        // bounds the wait, and the stream is released (forced) when its stop grace runs out.
        let stubborn = Releases::default();
        let stubborn_consumer = stubborn
            .gate()
            .group(&group)
            .stop_grace(Duration::from_secs(10))
            .spawn(|_, _tx: streamgate::Sender<String>| async move {
                pending::<()>().await;
                Ok::<_, SendError<String>>(())
            });
        sleep(Duration::from_millis(10)).await;
        let start = tokio::time::Instant::now();
        let report = group.shutdown(Duration::from_secs(1)).await;
        assert_eq!(report.ended, 2);
        assert_eq!(
            report.released, 1,
            "the stubborn one is still in its stop grace"
        );
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(1) && waited <= Duration::from_secs(1) + TICK,
            "the shutdown took {waited:?}"
        );
        assert_eq!(releases.once().0, EndReason::Shutdown);
        let handle = stubborn_consumer.handle();
        timeout(Duration::from_secs(60), handle.released())
            .await
            .expect("released when its stop grace ran out");
        let (reason, stats) = stubborn.once();
        assert_eq!(reason, EndReason::Shutdown);
        assert!(stats.stop_forced);
        let end_to_stop = stats.end_to_stop.unwrap();
        assert!(
            end_to_stop >= Duration::from_secs(10) && end_to_stop <= Duration::from_secs(10) + TICK,
            "dropped {end_to_stop:?} after the shutdown"
        );
        drop((consumer, stubborn_consumer));
    });
}

/// A token of exactly `LEN` bytes carrying its id.
const LEN: usize = 50;

fn sized_token(i: u64) -> String {
    format!("{i:0>width$}|", width = LEN - 1)
}

/// Several streams whose readers stopped share a small budget with one reader that keeps up:
/// at every step the group holds at most the budget plus one chunk per gate, the stopped ones
/// are the ones refused, the reader that keeps up still flows, and once the stopped readers
/// come back every stream delivers every token.
async fn budget_schedule(seed: u64, policy: Policy) {
    const BUDGET: usize = 1000;
    const STOPPED: usize = 6;
    const TOKENS: u64 = 60;
    let mut rng = Rng(seed);
    let group = Group::with_budget(BUDGET);
    let gates = STOPPED + 1;
    let bound = BUDGET + gates * LEN;
    let worst = Arc::new(AtomicUsize::new(0));
    let check = {
        let group = group.clone();
        let worst = worst.clone();
        move || {
            let held = group.stats().buffered_bytes.expect("counted with a budget");
            worst.fetch_max(held, Ordering::Relaxed);
            assert!(held <= bound, "the group holds {held} > {bound} bytes");
        }
    };
    let mut consumers = Vec::new();
    let mut sent = Vec::new();
    for i in 0..gates {
        let sent_here = Arc::new(AtomicUsize::new(0));
        sent.push(sent_here.clone());
        let check = check.clone();
        let pace = rng.below(3);
        let consumer = Gate::new()
            .group(&group)
            .max_events(64)
            .max_bytes(64 * 1024)
            .policy(policy)
            .spawn(move |_, mut tx| async move {
                for t in 0..TOKENS {
                    tx.send(sized_token(t)).await?;
                    sent_here.fetch_add(1, Ordering::Relaxed);
                    check();
                    if pace > 0 {
                        sleep(Duration::from_millis(pace)).await;
                    }
                }
                Ok::<_, SendError<String>>(())
            });
        consumers.push(consumer);
        // Let this one run ahead before the next starts (the worst order for the bound).
        if i < STOPPED {
            sleep(Duration::from_millis(200)).await;
        }
    }
    // The last one keeps up.
    let mut keeping_up = consumers.pop().unwrap();
    let (events, end) = timeout(Duration::from_secs(600), async {
        let mut events = Vec::new();
        while let Some(item) = keeping_up.next().await {
            check();
            match item {
                Ok(event) => events.push(event),
                Err(error) => return (events, Some(error)),
            }
        }
        (events, None)
    })
    .await
    .expect("the reader that keeps up is not held up by the stopped ones");
    assert!(end.is_none(), "{end:?}");
    let text: String = events.iter().map(|e| e.chunk().as_str()).collect();
    assert_eq!(text, (0..TOKENS).map(sized_token).collect::<String>());
    // The stopped ones were refused: none could send all its tokens.
    for (i, sent) in sent.iter().take(STOPPED).enumerate() {
        let sent = sent.load(Ordering::Relaxed) as u64;
        assert!(
            sent < TOKENS,
            "stream {i} sent all {sent} tokens past a stopped reader"
        );
    }
    assert!(
        worst.load(Ordering::Relaxed) >= BUDGET - LEN,
        "the budget was reached"
    );

    // The readers come back, one at a time, at random speeds.
    for (i, mut consumer) in consumers.into_iter().enumerate() {
        let mut text = String::new();
        let mut next_id = 0;
        while let Some(item) = consumer.next().await {
            check();
            let event = item.unwrap_or_else(|e| panic!("stream {i} ended: {e}"));
            assert_eq!(*event.ids().start(), next_id, "stream {i}: ids tile");
            next_id = event.id() + 1;
            text.push_str(event.chunk());
            if rng.below(4) == 0 {
                sleep(Duration::from_millis(rng.below(3))).await;
            }
        }
        let expected: String = (0..TOKENS).map(sized_token).collect();
        assert_eq!(text, expected, "stream {i} lost or reordered nothing");
        assert_eq!(next_id, TOKENS);
    }
    assert_eq!(group.stats().buffered_bytes, Some(0));
}

#[test]
fn the_budget_bounds_the_group_and_refuses_the_streams_holding_the_most() {
    for seed in 1..=4 {
        paused(move || budget_schedule(seed, Policy::backpressure().max_pause(None)));
        paused(move || budget_schedule(seed, Policy::coalesce().max_pause(None)));
    }
}

#[test]
fn a_zero_budget_is_one_byte_and_every_stream_still_flows() {
    paused(|| async {
        let group = Group::with_budget(0);
        assert_eq!(group.stats().budget, Some(1));
        let mut consumers: Vec<_> = (0..3)
            .map(|_| tokens(Gate::new().group(&group), Some(20)))
            .collect();
        for consumer in &mut consumers {
            let (events, end) = drain(consumer).await;
            assert!(end.is_none());
            assert_eq!(events.len(), 20);
        }
        assert_eq!(group.stats().buffered_bytes, Some(0));
    });
}
