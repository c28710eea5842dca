//! A true end on every path: at most one chunk after the end, a runtime that is not pinned, the
//! release exactly once (after the work stopped, with the reason and the final stats), completion
//! only when the consumer has everything, ids that tile the output, and bad configuration that
//! is clamped instead of panicking.

mod common;

use std::future::pending;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use common::gate::{Releases, TICK, drain};
use common::{HANG, Rng};
use futures_util::StreamExt;
use streamgate::{
    BoxError, Consumer, EndReason, Gate, Group, Policy, SendError, Sender, TrySendError,
};
use tokio::runtime::{Builder, Runtime};
use tokio::time::{Instant, sleep, timeout};

fn token(i: u64) -> String {
    format!("t{i} ")
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Flavor {
    CurrentThread,
    MultiThread,
}

fn runtime(flavor: Flavor) -> Runtime {
    match flavor {
        Flavor::CurrentThread => Builder::new_current_thread().enable_all().build(),
        Flavor::MultiThread => Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build(),
    }
    .unwrap()
}

/// How the stream ends.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    /// The consumer is dropped mid-stream.
    ConsumerDrop,
    /// The reader stops; `Disconnect` ends it.
    SlowConsumer,
    /// `GateHandle::cancel`.
    Cancel,
    /// `Group::shutdown`.
    GroupShutdown,
    /// The generator returns an error.
    GeneratorError,
    /// The generator panics.
    GeneratorPanic,
}

impl Path {
    fn reason(self) -> EndReason {
        match self {
            Path::ConsumerDrop => EndReason::ConsumerGone,
            Path::SlowConsumer => EndReason::SlowConsumer,
            Path::Cancel => EndReason::Cancelled,
            Path::GroupShutdown => EndReason::Shutdown,
            Path::GeneratorError => EndReason::GeneratorError,
            Path::GeneratorPanic => EndReason::GeneratorPanic,
        }
    }
}

/// How the generator treats a failed send.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Style {
    /// `tx.send(t).await?`: stops at the first error.
    Stops,
    /// `let _ = tx.send(t).await;` in a loop with no other await point.
    Careless,
}

/// After how many tokens a generator that ends itself fails.
const FAIL_AT: u64 = 500;

/// The generator: one token per send and no other await point; on the generator-made paths it
/// fails after `FAIL_AT` tokens.
async fn generator(mut tx: Sender<String>, style: Style, path: Path) -> Result<(), BoxError> {
    let mut i = 0;
    loop {
        match style {
            Style::Stops => tx.send(token(i)).await?,
            Style::Careless => {
                let _ = tx.send(token(i)).await;
            }
        }
        i += 1;
        if i == FAIL_AT {
            match path {
                Path::GeneratorError => return Err("the engine failed".into()),
                Path::GeneratorPanic => panic!("the engine panicked"),
                _ => {}
            }
        }
    }
}

/// Events a reader takes before it stops or leaves.
const READ_BEFORE: usize = 100;

/// One end path on one runtime flavor with one generator style.
fn end_path(path: Path, style: Style, flavor: Flavor) {
    let case = format!("{path:?} / {style:?} / {flavor:?}");
    let releases = Releases::default();
    let group = Group::new();
    let rt = runtime(flavor);
    rt.block_on(async {
        let mut gate = releases.gate().max_events(8).group(&group);
        if path == Path::SlowConsumer {
            gate = gate.policy(Policy::disconnect(Duration::from_millis(50)));
        }
        let mut consumer = gate.spawn(move |_, tx| generator(tx, style, path));
        let handle = consumer.handle();
        // A timer on the same runtime, running across the end.
        let timer = tokio::spawn(async {
            let start = std::time::Instant::now();
            sleep(Duration::from_millis(200)).await;
            start.elapsed()
        });
        let reader = tokio::spawn(async move {
            let mut ids = Vec::new();
            let mut end = None;
            while let Some(item) = consumer.next().await {
                match item {
                    Ok(event) => ids.push(event.id()),
                    Err(error) => {
                        end = Some(error.reason());
                        break;
                    }
                }
                if ids.len() == READ_BEFORE {
                    match path {
                        Path::ConsumerDrop => {
                            drop(consumer);
                            return (ids, None);
                        }
                        Path::SlowConsumer => {
                            // Stopped (still connected) until the stream is released; then
                            // it gets what waited, and the end.
                            let stopped = std::time::Instant::now();
                            consumer.handle().released().await;
                            let waited = stopped.elapsed();
                            // The 50 ms deadline, with the 2 s of slack the runtime's own
                            // 200 ms timer is given below: a loaded machine delays a timer by
                            // milliseconds, a missed deadline by the hang guard.
                            assert!(
                                waited < Duration::from_millis(50) + Duration::from_secs(2),
                                "the slow-consumer end came {waited:?} after the reader stopped"
                            );
                            let (events, tail_end) = drain(&mut consumer).await;
                            ids.extend(events.iter().map(|e| e.0));
                            return (ids, tail_end.map(|e| e.reason()));
                        }
                        _ => {}
                    }
                }
            }
            if end.is_some() {
                assert!(consumer.next().await.is_none(), "nothing after the end");
            }
            (ids, end)
        });
        match path {
            Path::Cancel => {
                sleep(Duration::from_millis(20)).await;
                handle.cancel();
            }
            Path::GroupShutdown => {
                sleep(Duration::from_millis(20)).await;
                let report = group.shutdown(Duration::from_secs(5)).await;
                assert_eq!((report.ended, report.released), (1, 1), "{case}");
            }
            _ => {}
        }
        let (ids, end) = timeout(HANG, reader)
            .await
            .unwrap_or_else(|_| panic!("{case}: the reader ends"))
            .unwrap();
        let late = timeout(HANG, timer)
            .await
            .expect("the timer fires")
            .unwrap();
        assert!(
            late < Duration::from_secs(2),
            "{case}: a 200 ms timer fired after {late:?}: the runtime was pinned"
        );
        timeout(HANG, handle.released())
            .await
            .unwrap_or_else(|_| panic!("{case}: released"));

        // What the consumer saw: consecutive ids from 0, then the reason (unless it left).
        assert!(
            ids.iter().enumerate().all(|(i, id)| *id == i as u64),
            "{case}: ids"
        );
        match path {
            Path::ConsumerDrop => assert_eq!(end, None, "{case}"),
            Path::GeneratorError | Path::GeneratorPanic => {
                assert_eq!(
                    ids.len() as u64,
                    FAIL_AT,
                    "{case}: every event before the error"
                );
                assert_eq!(end, Some(path.reason()), "{case}");
            }
            _ => assert_eq!(end, Some(path.reason()), "{case}"),
        }
        let (reason, stats) = releases.once();
        assert_eq!(reason, path.reason(), "{case}");
        assert_eq!(stats.end_reason, Some(path.reason()), "{case}");
        assert!(
            stats.chunks_after_end <= 1,
            "{case}: {} chunks after the end",
            stats.chunks_after_end
        );
        assert!(
            !stats.released,
            "{case}: the hook runs before the release is marked"
        );
        // With no stop grace the release follows the end at once: 2 s is the slack a timer on
        // this runtime is given above, far beyond any scheduling delay.
        let end_to_release = stats.end_to_release.expect("measured");
        assert!(
            end_to_release < Duration::from_secs(2),
            "{case}: released {end_to_release:?} after the end"
        );
        assert_eq!(
            stats.events_delivered + stats.events_undelivered,
            stats.chunks_sent,
            "{case}: every event delivered or counted undelivered: {stats:?}"
        );
        assert_eq!(stats.next_id, stats.chunks_sent, "{case}");
        let now = handle.stats();
        assert!(now.released, "{case}");
        assert_eq!(
            now.chunks_after_end, stats.chunks_after_end,
            "{case}: nothing later"
        );
    });
    drop(rt);
    assert_eq!(releases.count(), 1, "{case}: once, still");
}

fn every_style_and_flavor(path: Path) {
    for flavor in [Flavor::CurrentThread, Flavor::MultiThread] {
        for style in [Style::Stops, Style::Careless] {
            end_path(path, style, flavor);
        }
    }
}

#[test]
fn consumer_drop_ends_the_stream_on_time() {
    every_style_and_flavor(Path::ConsumerDrop);
}

#[test]
fn slow_consumer_deadline_ends_the_stream_on_time() {
    every_style_and_flavor(Path::SlowConsumer);
}

#[test]
fn cancel_ends_the_stream_on_time() {
    every_style_and_flavor(Path::Cancel);
}

#[test]
fn group_shutdown_ends_the_stream_on_time() {
    every_style_and_flavor(Path::GroupShutdown);
}

#[test]
fn generator_error_ends_the_stream_on_time() {
    every_style_and_flavor(Path::GeneratorError);
}

#[test]
fn generator_panic_ends_the_stream_on_time() {
    every_style_and_flavor(Path::GeneratorPanic);
}

/// The runtime shuts down (dropped) while a generator runs and its reader, on another
/// runtime, reads: the drop does not hang on the generator, the stream ends as `Shutdown`,
/// the reader gets the waiting events and the end, and the release runs once.
fn runtime_shutdown(style: Style, flavor: Flavor) {
    let case = format!("runtime shutdown / {style:?} / {flavor:?}");
    let releases = Releases::default();
    let rt = runtime(flavor);
    let mut consumer = rt.block_on(async {
        releases
            .gate()
            .max_events(8)
            .spawn(move |_, tx| generator(tx, style, Path::Cancel))
    });
    let handle = consumer.handle();
    // The reader, on a runtime of its own.
    let reader = std::thread::spawn(move || {
        let rt = runtime(Flavor::CurrentThread);
        rt.block_on(async {
            let (events, end) = timeout(HANG, drain(&mut consumer))
                .await
                .expect("the reader ends");
            (events.iter().map(|e| e.0).collect::<Vec<_>>(), end)
        })
    });
    // Let the generator run while the reader reads (a current-thread runtime runs only inside
    // `block_on`), then shut down.
    rt.block_on(async { sleep(Duration::from_millis(50)).await });
    let (dropped, done) = mpsc::channel();
    let start = std::time::Instant::now();
    std::thread::spawn(move || {
        drop(rt);
        let _ = dropped.send(());
    });
    done.recv_timeout(HANG)
        .unwrap_or_else(|_| panic!("{case}: the runtime's drop hangs"));
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{case}: the drop took {:?}",
        start.elapsed()
    );
    let (ids, end) = reader.join().unwrap();
    assert!(!ids.is_empty(), "{case}: the generator ran");
    assert!(
        ids.iter().enumerate().all(|(i, id)| *id == i as u64),
        "{case}"
    );
    assert_eq!(end.map(|e| e.reason()), Some(EndReason::Shutdown), "{case}");
    let (reason, stats) = releases.once();
    assert_eq!(reason, EndReason::Shutdown, "{case}");
    assert!(stats.chunks_after_end <= 1, "{case}: {stats:?}");
    assert!(handle.is_released());
    assert_eq!(handle.end_reason(), Some(EndReason::Shutdown));
}

#[test]
fn runtime_shutdown_ends_the_stream_as_shutdown() {
    for flavor in [Flavor::CurrentThread, Flavor::MultiThread] {
        for style in [Style::Stops, Style::Careless] {
            runtime_shutdown(style, flavor);
        }
    }
}

/// A generator that sends `n` tokens and returns, raising `finished` first.
fn finishing(gate: Gate, n: u64, finished: Arc<AtomicBool>) -> Consumer<String> {
    gate.spawn(move |_, mut tx| async move {
        for i in 0..n {
            tx.send(token(i)).await?;
        }
        finished.store(true, Ordering::SeqCst);
        Ok::<_, SendError<String>>(())
    })
}

#[tokio::test(start_paused = true)]
async fn completed_only_when_the_consumer_received_the_end() {
    // The generator finished with every event still waiting; the consumer leaves unread.
    let releases = Releases::default();
    let finished = Arc::new(AtomicBool::new(false));
    let consumer = finishing(releases.gate(), 5, finished.clone());
    let handle = consumer.handle();
    while !finished.load(Ordering::SeqCst) {
        sleep(Duration::from_millis(1)).await;
    }
    sleep(Duration::from_millis(10)).await;
    assert_eq!(handle.end_reason(), None, "finished is not completed");
    drop(consumer);
    handle.released().await;
    let (reason, stats) = releases.once();
    assert_eq!(reason, EndReason::ConsumerGone);
    assert_eq!(stats.events_undelivered, 5);
    assert_eq!(stats.events_delivered, 0);

    // The consumer takes all but the last, then leaves.
    let releases = Releases::default();
    let finished = Arc::new(AtomicBool::new(false));
    let mut consumer = finishing(releases.gate(), 5, finished.clone());
    let handle = consumer.handle();
    for _ in 0..4 {
        consumer.next().await.unwrap().unwrap();
    }
    while !finished.load(Ordering::SeqCst) {
        sleep(Duration::from_millis(1)).await;
    }
    drop(consumer);
    handle.released().await;
    let (reason, stats) = releases.once();
    assert_eq!(reason, EndReason::ConsumerGone);
    assert_eq!((stats.events_delivered, stats.events_undelivered), (4, 1));

    // The consumer takes everything: completed, even if it leaves before polling the end.
    let releases = Releases::default();
    let finished = Arc::new(AtomicBool::new(false));
    let mut consumer = finishing(releases.gate(), 5, finished.clone());
    let handle = consumer.handle();
    while !finished.load(Ordering::SeqCst) {
        sleep(Duration::from_millis(1)).await;
    }
    for i in 0..5 {
        assert_eq!(consumer.next().await.unwrap().unwrap().id(), i);
    }
    drop(consumer);
    handle.released().await;
    let (reason, stats) = releases.once();
    assert_eq!(reason, EndReason::Completed);
    assert_eq!((stats.events_delivered, stats.events_undelivered), (5, 0));

    // And reading through to the end.
    let releases = Releases::default();
    let mut consumer = finishing(releases.gate(), 5, Arc::default());
    let handle = consumer.handle();
    let (events, end) = drain(&mut consumer).await;
    assert!(end.is_none());
    assert_eq!(events.len(), 5);
    assert_eq!(handle.end_reason(), Some(EndReason::Completed));
    handle.released().await;
    assert_eq!(releases.once().0, EndReason::Completed);
}

#[tokio::test(start_paused = true)]
async fn a_finished_generator_waits_for_its_reader_on_the_policy_clock() {
    // The default policy: the reader must take something within DEFAULT_MAX_PAUSE.
    let releases = Releases::default();
    let mut consumer = finishing(releases.gate(), 5, Arc::default());
    let handle = consumer.handle();
    let start = Instant::now();
    handle.released().await;
    let waited = start.elapsed();
    assert!(
        waited >= streamgate::DEFAULT_MAX_PAUSE && waited <= streamgate::DEFAULT_MAX_PAUSE + TICK,
        "ended {waited:?} after the generator finished"
    );
    let (reason, stats) = releases.once();
    assert_eq!(reason, EndReason::SlowConsumer);
    assert_eq!(stats.events_undelivered, 5);
    let (events, end) = drain(&mut consumer).await;
    assert_eq!(events.len(), 5, "what waited is still delivered");
    assert_eq!(end.unwrap().reason(), EndReason::SlowConsumer);

    // A reader that takes one event every 20 s is not cut off.
    let mut consumer = finishing(Gate::new(), 5, Arc::default());
    let mut taken = 0;
    while let Some(item) = consumer.next().await {
        item.expect("never ended");
        taken += 1;
        sleep(Duration::from_secs(20)).await;
    }
    assert_eq!(taken, 5);
}

/// Two-phase stop: the consumer leaves while the generator is in a blocking step; the step
/// finishes, the generator sees its token and returns, and only then is the stream released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_waits_for_a_blocking_step_within_the_stop_grace() {
    for grace in [Duration::from_secs(1), Duration::ZERO] {
        let step_done = Arc::new(AtomicBool::new(false));
        let seen_at_release = Arc::new(Mutex::new(None));
        let seen = seen_at_release.clone();
        let done_flag = step_done.clone();
        let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
        let mut consumer = Gate::new()
            .stop_grace(grace)
            .on_release(move |reason, stats| {
                *seen.lock().unwrap() = Some((reason, stats, done_flag.load(Ordering::SeqCst)));
            })
            .spawn(move |cancel, mut tx| async move {
                tx.send("a".to_owned()).await?;
                loop {
                    let done = step_done.clone();
                    let started = started_tx.clone();
                    tokio::task::spawn_blocking(move || {
                        let _ = started.send(());
                        std::thread::sleep(Duration::from_millis(100));
                        done.store(true, Ordering::SeqCst);
                    })
                    .await
                    .unwrap();
                    if cancel.is_cancelled() {
                        return Ok::<_, SendError<String>>(());
                    }
                    tx.send("b".to_owned()).await?;
                }
            });
        let handle = consumer.handle();
        assert_eq!(consumer.next().await.unwrap().unwrap().chunk(), "a");
        started.recv().await.unwrap();
        drop(consumer);
        timeout(HANG, handle.released()).await.expect("released");
        let (reason, stats, step_finished) = seen_at_release.lock().unwrap().clone().unwrap();
        assert_eq!(reason, EndReason::ConsumerGone);
        if grace.is_zero() {
            // No grace: dropped at once, the blocking step still running.
            assert!(stats.stop_forced);
            assert!(!step_finished);
        } else {
            assert!(step_finished, "released before the step in flight returned");
            assert!(!stats.stop_forced);
            assert_eq!(stats.chunks_after_end, 0, "it checked its token");
            // Stopped when the step returned (100 ms), before the grace ran out (or it would
            // have been forced): within the grace by construction, whatever the load.
            let end_to_stop = stats.end_to_stop.expect("measured");
            assert!(
                end_to_stop > Duration::ZERO && end_to_stop <= grace,
                "{end_to_stop:?}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_generator_that_ignores_its_token_is_dropped_when_the_grace_runs_out() {
    let releases = Releases::default();
    let dropped = Arc::new(AtomicBool::new(false));
    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let guard = SetOnDrop(dropped.clone());
    let consumer = releases
        .gate()
        .stop_grace(Duration::from_millis(200))
        .spawn(move |_, _tx: Sender<String>| async move {
            let _guard = guard;
            pending::<()>().await;
            Ok::<_, SendError<String>>(())
        });
    let handle = consumer.handle();
    sleep(Duration::from_millis(10)).await;
    let start = Instant::now();
    handle.cancel();
    sleep(Duration::from_millis(100)).await;
    assert!(!dropped.load(Ordering::SeqCst), "within the grace");
    assert!(!handle.is_released());
    timeout(HANG, handle.released()).await.expect("released");
    assert!(dropped.load(Ordering::SeqCst));
    let grace = Duration::from_millis(200);
    let waited = start.elapsed();
    assert!(
        waited >= grace && waited <= grace + TICK,
        "released {waited:?} after the cancel"
    );
    let (reason, stats) = releases.once();
    assert_eq!(reason, EndReason::Cancelled);
    assert!(stats.stop_forced);
    let end_to_stop = stats.end_to_stop.unwrap();
    assert!(
        end_to_stop >= grace && end_to_stop <= grace + TICK,
        "{end_to_stop:?}"
    );
    drop(consumer);
}

#[tokio::test(start_paused = true)]
async fn a_generator_that_returns_on_the_failed_send_is_released_at_once() {
    // A long grace does not hold up a generator that stops when its send fails.
    let releases = Releases::default();
    let consumer = releases
        .gate()
        .max_events(2)
        .stop_grace(Duration::from_secs(3600))
        .spawn(|_, mut tx| async move {
            for i in 0.. {
                tx.send(token(i)).await?;
            }
            Ok::<_, SendError<String>>(())
        });
    let handle = consumer.handle();
    sleep(Duration::from_millis(10)).await;
    let start = Instant::now();
    drop(consumer);
    timeout(HANG, handle.released()).await.expect("released");
    assert!(start.elapsed() < Duration::from_secs(1));
    let (reason, stats) = releases.once();
    assert_eq!(reason, EndReason::ConsumerGone);
    assert!(!stats.stop_forced);
    assert_eq!(stats.chunks_after_end, 1);
    assert_eq!(stats.events_undelivered, 2);
}

#[tokio::test(start_paused = true)]
async fn a_generator_that_ignores_the_failed_send_is_parked_until_the_grace_ends() {
    let releases = Releases::default();
    let consumer = releases
        .gate()
        .max_events(2)
        .stop_grace(Duration::from_secs(1))
        .spawn(|_, mut tx| async move {
            let mut i = 0;
            loop {
                let _ = tx.send(token(i)).await;
                i += 1;
            }
            #[allow(unreachable_code)]
            Ok::<_, SendError<String>>(())
        });
    let handle = consumer.handle();
    sleep(Duration::from_millis(10)).await;
    drop(consumer);
    timeout(HANG, handle.released()).await.expect("released");
    let (reason, stats) = releases.once();
    assert_eq!(reason, EndReason::ConsumerGone);
    assert!(
        stats.stop_forced,
        "parked, then dropped when the grace ran out"
    );
    let end_to_stop = stats.end_to_stop.unwrap();
    assert!(
        end_to_stop >= Duration::from_secs(1) && end_to_stop <= Duration::from_secs(1) + TICK,
        "dropped {end_to_stop:?} after the end"
    );
    // The failed one and the one it is parked in: never a spin.
    assert!(stats.chunks_after_end <= 2, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn an_async_release_hook_is_awaited_before_released() {
    let done = Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    let consumer = Gate::new()
        .on_release_async(move |reason, stats| async move {
            assert_eq!(reason, EndReason::ConsumerGone);
            assert_eq!(stats.end_reason, Some(EndReason::ConsumerGone));
            sleep(Duration::from_millis(50)).await;
            flag.store(true, Ordering::SeqCst);
        })
        .spawn(|_, mut tx| async move {
            tx.send("a".to_owned()).await?;
            pending::<()>().await;
            Ok::<_, SendError<String>>(())
        });
    let handle = consumer.handle();
    sleep(Duration::from_millis(1)).await;
    drop(consumer);
    sleep(Duration::from_millis(10)).await;
    assert!(!handle.is_released(), "the hook is still running");
    timeout(HANG, handle.released()).await.expect("released");
    assert!(
        done.load(Ordering::SeqCst),
        "released() after the hook finished"
    );
    let stats = handle.stats();
    assert!(stats.released && !stats.release_timed_out);
    let end_to_release = stats.end_to_release.unwrap();
    assert!(
        end_to_release >= Duration::from_millis(50)
            && end_to_release <= Duration::from_millis(50) + TICK,
        "released {end_to_release:?} after the end: the hook takes 50 ms"
    );
}

#[tokio::test(start_paused = true)]
async fn an_async_release_hook_that_never_finishes_is_cut_off() {
    for (timeout_set, expected) in [
        (Some(Duration::from_millis(100)), Duration::from_millis(100)),
        (None, streamgate::DEFAULT_RELEASE_TIMEOUT),
    ] {
        let mut gate = Gate::new().on_release_async(|_, _| pending::<()>());
        if let Some(limit) = timeout_set {
            gate = gate.release_timeout(limit);
        }
        let (tx, consumer) = gate.channel::<String>();
        let handle = consumer.handle();
        tx.finish();
        drop(consumer);
        let start = Instant::now();
        timeout(Duration::from_secs(3600), handle.released())
            .await
            .expect("released");
        let waited = start.elapsed();
        assert!(
            waited >= expected && waited <= expected + TICK,
            "cut off after {waited:?}, not {expected:?}"
        );
        let stats = handle.stats();
        assert!(stats.released && stats.release_timed_out);
        assert_eq!(stats.end_reason, Some(EndReason::Completed));
    }
}

/// One random schedule: a generator (spawned, or an engine's channel) sends `n` tokens at a
/// random pace under `policy`; a consumer reads at a random pace. The ids it sees strictly
/// increase, the ranges tile `first_id..first_id + n` exactly, and each event's text is the
/// tokens of its range.
async fn ids_schedule(seed: u64, policy: Policy) {
    let mut rng = Rng(seed);
    let n = 1 + rng.below(150);
    let first_id = [0, 1, 1 << 40][rng.below(3) as usize];
    let max_events = 1 + rng.below(5) as usize;
    let max_bytes = [8, 32, 1 << 16][rng.below(3) as usize];
    let engine = rng.below(2) == 0;
    let text = |id: u64| format!("{id},");
    let gate = Gate::new()
        .max_events(max_events)
        .max_bytes(max_bytes)
        .policy(policy)
        .first_id(first_id);
    let mut gen_rng = Rng(seed ^ 0x9e37_79b9);
    let pause = |rng: &mut Rng| {
        let roll = rng.below(8);
        (roll < 3).then(|| Duration::from_micros(rng.below(3000)))
    };
    let mut consumer = if engine {
        let (mut tx, consumer) = gate.channel::<String>();
        tokio::spawn(async move {
            for id in first_id..first_id + n {
                let mut chunk = text(id);
                loop {
                    match tx.try_send(chunk) {
                        Ok(()) => break,
                        Err(TrySendError::Full(back)) => chunk = back,
                        Err(_) => panic!("seed {seed}: ended"),
                    }
                    if gen_rng.below(2) == 0 {
                        let _ = tx.ready().await;
                    } else {
                        sleep(Duration::from_micros(500)).await;
                    }
                }
                if let Some(d) = pause(&mut gen_rng) {
                    sleep(d).await;
                }
            }
            tx.finish();
        });
        consumer
    } else {
        gate.spawn(move |_, mut tx| async move {
            for id in first_id..first_id + n {
                tx.send(text(id)).await?;
                if let Some(d) = pause(&mut gen_rng) {
                    sleep(d).await;
                }
            }
            Ok::<_, SendError<String>>(())
        })
    };
    let handle = consumer.handle();
    let mut next = first_id;
    let mut events = 0u64;
    while let Some(item) = consumer.next().await {
        let event = item.unwrap_or_else(|e| panic!("seed {seed} {policy:?}: ended: {e}"));
        let ids = event.ids();
        assert_eq!(*ids.start(), next, "seed {seed} {policy:?}: ranges tile");
        assert!(ids.start() <= ids.end());
        assert_eq!(event.id(), *ids.end());
        let expected: String = ids.clone().map(text).collect();
        assert_eq!(
            event.chunk(),
            &expected,
            "seed {seed}: the range is the text"
        );
        next = event.id() + 1;
        events += 1;
        if !policy_coalesces(policy) {
            assert_eq!(ids.start(), ids.end(), "only Coalesce merges");
        }
        if let Some(d) = pause(&mut rng) {
            sleep(d).await;
        }
    }
    assert_eq!(next, first_id + n, "seed {seed} {policy:?}: every id");
    let stats = handle.stats();
    assert_eq!(stats.end_reason, Some(EndReason::Completed));
    assert_eq!(stats.next_id, first_id + n);
    assert_eq!(stats.chunks_sent + stats.chunks_merged, n);
    assert_eq!(stats.events_delivered, events);
}

fn policy_coalesces(policy: Policy) -> bool {
    matches!(policy, Policy::Coalesce { .. })
}

#[tokio::test(start_paused = true)]
async fn ids_strictly_increase_and_tile_the_output_under_every_policy() {
    for seed in 1..=60 {
        for policy in [
            Policy::backpressure(),
            Policy::coalesce(),
            Policy::disconnect(Duration::from_secs(1)),
        ] {
            ids_schedule(seed, policy).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_tile_the_output_on_two_threads() {
    for seed in 100..=115 {
        for policy in [
            Policy::backpressure(),
            Policy::coalesce(),
            Policy::disconnect(Duration::from_secs(5)),
        ] {
            timeout(HANG, ids_schedule(seed, policy))
                .await
                .expect("no hang");
        }
    }
}

/// `Completed` is not a reason to end a stream early: `cancel_with` refuses it, says so, and
/// leaves the stream as it was (it used to end it quietly as `Cancelled`).
#[tokio::test(start_paused = true)]
async fn cancel_with_completed_is_refused_and_the_stream_goes_on() {
    let releases = Releases::default();
    let (mut tx, mut consumer) = releases.gate().channel::<String>();
    let handle = consumer.handle();
    tx.try_send(token(0)).unwrap();
    let refused = handle
        .cancel_with(EndReason::Completed)
        .expect_err("completed is not an early end");
    assert_eq!(
        refused.to_string(),
        "`completed` is not a reason to end a stream early"
    );
    assert_eq!(handle.end_reason(), None, "the stream is untouched");
    assert!(!tx.is_closed());
    tx.try_send(token(1))
        .expect("the stream still takes chunks");
    tx.finish();
    let (events, end) = drain(&mut consumer).await;
    assert!(end.is_none(), "{end:?}");
    assert_eq!(events.len(), 2);
    timeout(HANG, handle.released()).await.expect("released");
    assert_eq!(releases.once().0, EndReason::Completed);
    // Every other reason is an early end, and the first one stands.
    let (_tx, consumer) = Gate::new().channel::<String>();
    let handle = consumer.handle();
    assert_eq!(
        handle.cancel_with(EndReason::SlowConsumer),
        Ok(EndReason::SlowConsumer)
    );
    assert_eq!(
        handle.cancel_with(EndReason::Shutdown),
        Ok(EndReason::SlowConsumer)
    );
    assert!(handle.cancel_with(EndReason::Completed).is_err());
    assert_eq!(handle.end_reason(), Some(EndReason::SlowConsumer));
}

// Bad configuration: a documented clamp, never a panic.

#[tokio::test(start_paused = true)]
async fn zero_bounds_are_taken_as_one() {
    for gate in [Gate::new().max_events(0), Gate::new().max_bytes(0)] {
        let mut consumer = gate.spawn(|_, mut tx| async move {
            for i in 0..5 {
                tx.send(token(i)).await?;
            }
            Ok::<_, SendError<String>>(())
        });
        let handle = consumer.handle();
        sleep(Duration::from_millis(10)).await;
        assert_eq!(handle.stats().buffered_events, 1, "one event at a time");
        let (events, end) = drain(&mut consumer).await;
        assert!(end.is_none());
        assert_eq!(events.len(), 5);
        assert_eq!(handle.stats().peak_buffered_events, 1);
    }
}

#[tokio::test(start_paused = true)]
async fn absurd_durations_wait_for_ever_without_overflow() {
    // A stop grace too long to represent: the cooperative generator still stops and is
    // released; an engine's stream is released when the engine lets go.
    let consumer = Gate::new()
        .stop_grace(Duration::MAX)
        .release_timeout(Duration::MAX)
        .on_release_async(|_, _| async {})
        .spawn(|cancel, _tx: Sender<String>| async move {
            cancel.cancelled().await;
            Ok::<_, SendError<String>>(())
        });
    let handle = consumer.handle();
    drop(consumer);
    timeout(HANG, handle.released()).await.expect("released");
    assert!(!handle.stats().stop_forced);

    let (tx, consumer) = Gate::new().stop_grace(Duration::MAX).channel::<String>();
    let handle = consumer.handle();
    drop(consumer);
    sleep(Duration::from_secs(365 * 24 * 3600)).await;
    assert!(!handle.is_released(), "waits for the engine");
    drop(tx);
    timeout(HANG, handle.released()).await.expect("released");
    assert!(!handle.stats().stop_forced);

    // Policy limits too long to represent never fire.
    for policy in [
        Policy::disconnect(Duration::MAX),
        Policy::backpressure().max_pause(Some(Duration::MAX)),
    ] {
        let (mut tx, mut consumer) = Gate::new().max_events(1).policy(policy).channel::<String>();
        tx.try_send("a".into()).unwrap();
        assert!(tx.try_send("b".into()).is_err());
        sleep(Duration::from_secs(365 * 24 * 3600)).await;
        assert_eq!(consumer.handle().end_reason(), None, "{policy:?}");
        tx.finish();
        let (events, end) = drain(&mut consumer).await;
        assert!(end.is_none());
        assert_eq!(events.len(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_zero_policy_limit_ends_the_stream_as_soon_as_the_buffer_is_full() {
    for policy in [
        Policy::disconnect(Duration::ZERO),
        Policy::backpressure().max_pause(Some(Duration::ZERO)),
    ] {
        let releases = Releases::default();
        let mut consumer =
            releases
                .gate()
                .max_events(2)
                .policy(policy)
                .spawn(|_, mut tx| async move {
                    for i in 0..10 {
                        tx.send(token(i)).await?;
                    }
                    Ok::<_, SendError<String>>(())
                });
        let handle = consumer.handle();
        let start = Instant::now();
        timeout(HANG, handle.released()).await.expect("released");
        assert_eq!(start.elapsed(), Duration::ZERO, "{policy:?}");
        let (reason, stats) = releases.once();
        assert_eq!(reason, EndReason::SlowConsumer);
        assert_eq!(stats.chunks_sent, 2);
        let (events, end) = drain(&mut consumer).await;
        assert_eq!(events.len(), 2);
        assert_eq!(end.unwrap().reason(), EndReason::SlowConsumer);
    }
}

#[tokio::test]
async fn ids_near_the_end_of_u64_saturate_instead_of_panicking() {
    for first in [u64::MAX, u64::MAX - 1] {
        let (mut tx, mut consumer) = Gate::new().first_id(first).channel::<String>();
        for i in 0..3 {
            tx.try_send(token(i)).unwrap();
        }
        tx.finish();
        let (events, end) = drain(&mut consumer).await;
        assert!(end.is_none());
        let ids: Vec<u64> = events.iter().map(|e| e.0).collect();
        // Documented on `Gate::first_id`: past `u64::MAX` every chunk gets `u64::MAX`.
        let expected: Vec<u64> = (0..3).map(|i| first.saturating_add(i)).collect();
        assert_eq!(ids, expected);
        assert_eq!(consumer.handle().stats().next_id, u64::MAX);
    }
}

/// A snapshot adds up even while the consumer yields on another thread: every event sent is
/// either delivered or still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stats_snapshot_adds_up_while_the_consumer_reads_on_another_thread() {
    let mut consumer = Gate::new().max_events(64).spawn(|_, mut tx| async move {
        for i in 0..200_000u64 {
            tx.send(token(i % 10)).await?;
        }
        Ok::<_, SendError<String>>(())
    });
    let handle = consumer.handle();
    let reader = tokio::spawn(async move { while consumer.next().await.is_some() {} });
    let (mut samples, mut off) = (0u64, 0u64);
    while !reader.is_finished() {
        let stats = handle.stats();
        samples += 1;
        if stats.events_delivered + stats.buffered_events as u64 != stats.chunks_sent {
            off += 1;
        }
        tokio::task::yield_now().await;
    }
    assert!(samples > 100, "sampled while it ran");
    assert_eq!(off, 0, "{off} of {samples} snapshots did not add up");
    let stats = handle.stats();
    assert_eq!(stats.events_delivered, 200_000);
    assert_eq!(stats.end_reason, Some(EndReason::Completed));
}
