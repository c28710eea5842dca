//! Resumable streams in memory: a registry's subscribers detach, resume, stop, fan out, fall
//! behind; the grace expires; the log keeps its bounds; attach/detach/expire races under random
//! schedules. (The same registry over Redis: `tests/redis.rs`.)

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::Rng;
use common::gate::Releases;
use common::subscriber::{expected, read, register, register_as, rest, second_names, take, tokens};
use futures_util::{FutureExt, StreamExt};
use streamgate::resume::{AttachError, ClaimError, Registry, ResumeOptions, Subscriber};
use streamgate::sse::ErrorShape;
use streamgate::{EndReason, Policy};
use tokio::time::{sleep, timeout};

use common::HANG;

/// A registry and its stream `"r"`: `n` tokens, one every `step`, its releases, how many tokens
/// were generated, and its first subscriber.
struct Started {
    registry: Registry<String>,
    releases: Releases,
    generated: Arc<AtomicU64>,
    first: Subscriber,
}

async fn started(options: ResumeOptions, n: u64, step: Duration) -> Started {
    let registry = Registry::memory(options);
    let releases = Releases::default();
    let generated = Arc::new(AtomicU64::new(0));
    let consumer = tokens(&releases, n, step, generated.clone());
    let first = register(&registry, "r", consumer).await;
    Started {
        registry,
        releases,
        generated,
        first,
    }
}

#[tokio::test]
async fn a_resume_continues_the_same_generation_at_every_cut_point() {
    for cut in [0, 1, 5, 17, 49] {
        let registry = Registry::memory(ResumeOptions::default());
        let releases = Releases::default();
        let generated = Arc::new(AtomicU64::new(0));
        let consumer = tokens(&releases, 50, Duration::from_millis(1), generated.clone());
        let mut first = register(&registry, "r", consumer).await;
        let mut seen = take(&mut first, cut).await;
        drop(first);
        let last = seen.last().map(|(id, _)| *id);
        let mut resumed = registry.attach("r", last).await.unwrap();
        let (more, end) = rest(&mut resumed).await;
        seen.extend(more);
        assert_eq!(
            seen,
            expected(0..50),
            "cut after {cut} events: nothing lost or repeated"
        );
        assert!(end.is_none(), "completed");
        releases.wait_for(1).await;
        assert_eq!(releases.once().0, EndReason::Completed);
        assert_eq!(
            generated.load(Ordering::SeqCst),
            50,
            "generated once, never again"
        );
        assert_eq!(registry.stats().resumed, 1);
    }
}

#[tokio::test(start_paused = true)]
async fn the_grace_expiry_cancels_the_generator_and_frees_the_log() {
    let grace = Duration::from_secs(5);
    let Started {
        registry,
        releases,
        mut first,
        ..
    } = started(
        ResumeOptions::default().grace(grace),
        1_000_000,
        Duration::from_millis(10),
    )
    .await;
    take(&mut first, 3).await;
    drop(first);
    sleep(grace / 2).await;
    assert_eq!(registry.stats().detached, 1);
    assert!(
        registry.stats().log_bytes > 0,
        "the log keeps what the client missed"
    );
    assert_eq!(releases.count(), 0, "generating through the grace");
    sleep(grace).await;
    releases.wait_for(1).await;
    let (reason, _) = releases.once();
    assert_eq!(reason, EndReason::ConsumerGone);
    let stats = registry.stats();
    assert_eq!((stats.expired, stats.detached, stats.log_bytes), (1, 0, 0));
    // An expired stream is gone, never resumed.
    sleep(Duration::from_millis(1)).await;
    assert!(matches!(
        registry.attach("r", Some(2)).await,
        Err(AttachError::Unknown)
    ));
}

#[tokio::test(start_paused = true)]
async fn an_attach_within_the_grace_ends_it() {
    let grace = Duration::from_secs(5);
    let Started {
        registry,
        releases,
        mut first,
        ..
    } = started(
        ResumeOptions::default().grace(grace),
        2_000,
        Duration::from_millis(10),
    )
    .await;
    let seen = take(&mut first, 3).await;
    drop(first);
    sleep(grace / 2).await;
    let mut resumed = registry.attach("r", Some(seen[2].0)).await.unwrap();
    sleep(grace * 2).await;
    assert_eq!(releases.count(), 0, "the grace ended with the attach");
    let (events, end) = rest(&mut resumed).await;
    assert_eq!(events, expected(3..2_000));
    assert!(end.is_none());
    assert_eq!(registry.stats().expired, 0);
}

#[tokio::test]
async fn a_zero_grace_cancels_at_the_disconnect() {
    let Started {
        releases,
        mut first,
        ..
    } = started(
        ResumeOptions::default().grace(Duration::ZERO),
        1_000_000,
        Duration::from_millis(1),
    )
    .await;
    take(&mut first, 2).await;
    drop(first);
    releases.wait_for(1).await;
    assert_eq!(releases.once().0, EndReason::ConsumerGone);
}

#[tokio::test]
async fn a_stop_reaches_every_subscriber() {
    let Started {
        registry,
        releases,
        mut first,
        ..
    } = started(
        ResumeOptions::default(),
        1_000_000,
        Duration::from_millis(1),
    )
    .await;
    let mut second = registry.attach("r", None).await.unwrap();
    take(&mut first, 2).await;
    take(&mut second, 2).await;
    assert!(registry.stop("r").await.unwrap());
    for subscriber in [&mut first, &mut second] {
        let (_, end) = rest(subscriber).await;
        assert_eq!(end.expect("an end").reason, EndReason::Cancelled);
    }
    releases.wait_for(1).await;
    assert_eq!(releases.once().0, EndReason::Cancelled);
    assert!(matches!(
        registry.stop("unknown").await,
        Err(AttachError::Unknown)
    ));
}

#[tokio::test]
async fn two_subscribers_get_identical_events() {
    let Started {
        registry,
        mut first,
        ..
    } = started(ResumeOptions::default(), 300, Duration::ZERO).await;
    let mut second = registry.attach("r", None).await.unwrap();
    let (a, b) = tokio::join!(rest(&mut first), rest(&mut second));
    assert_eq!(a.0, expected(0..300));
    assert_eq!(a.0, b.0);
    assert!(a.1.is_none() && b.1.is_none(), "both completed");
}

#[tokio::test]
async fn a_position_the_log_no_longer_holds_is_refused() {
    let options = ResumeOptions::default().log_bounds(10, 1 << 20);
    let Started {
        registry,
        mut first,
        ..
    } = started(options, 100, Duration::ZERO).await;
    let (events, _) = rest(&mut first).await;
    assert_eq!(events.len(), 100);
    // The log kept the newest 10 events.
    assert!(matches!(
        registry.attach("r", Some(50)).await,
        Err(AttachError::Gone { oldest: 90 })
    ));
    let mut late = registry.attach("r", Some(89)).await.unwrap();
    assert_eq!(rest(&mut late).await.0, expected(90..100));
    assert!(matches!(
        registry.attach("nope", None).await,
        Err(AttachError::Unknown)
    ));
}

#[tokio::test]
async fn a_subscriber_that_falls_out_of_the_log_ends_and_holds_nobody_back() {
    // The lag limit is the registry's: every subscriber has it (this test gave the stalled one
    // its own, which subscribers no longer have: one set of options for both stores).
    let options = ResumeOptions::default()
        .log_bounds(8, 1 << 20)
        .max_lag(Duration::from_millis(50));
    let Started {
        registry,
        first: mut fast,
        ..
    } = started(options, 500, Duration::ZERO).await;
    let mut stalled = registry.attach("r", None).await.unwrap();
    take(&mut stalled, 1).await;
    // The fast reader takes everything while the other reads nothing.
    let (events, end) = rest(&mut fast).await;
    assert_eq!(events, expected(0..500));
    assert!(end.is_none());
    let (_, end) = rest(&mut stalled).await;
    let end = end.expect("the stalled subscriber ends");
    assert_eq!(end.reason, EndReason::SlowConsumer);
    assert!(end.message.contains("behind"), "{end:?}");
}

#[tokio::test(start_paused = true)]
async fn a_detached_stream_pauses_at_a_full_log_and_loses_nothing() {
    let options = ResumeOptions::default()
        .grace(Duration::from_secs(60))
        .log_bounds(16, 1 << 20);
    let Started {
        registry,
        generated,
        mut first,
        ..
    } = started(options, 1_000, Duration::from_millis(1)).await;
    take(&mut first, 5).await;
    drop(first);
    sleep(Duration::from_secs(5)).await;
    let paused_at = generated.load(Ordering::SeqCst);
    // The log (16) and the gate (4 events, one in the generator's hand) hold it.
    assert!(paused_at < 5 + 16 + 4 + 2, "generated {paused_at}");
    sleep(Duration::from_secs(5)).await;
    assert_eq!(
        generated.load(Ordering::SeqCst),
        paused_at,
        "paused, not dropping"
    );
    let mut resumed = registry.attach("r", Some(4)).await.unwrap();
    assert_eq!(rest(&mut resumed).await.0, expected(5..1_000));
}

/// Random schedules of reads, detaches, attaches at the last position read, explicit stops and
/// time passing, against a grace: every run generates each token once, in order, never after an
/// expiry or a stop; the log stays within its bound; the release happens exactly once; and the
/// registry is empty once the retention has passed.
#[tokio::test(start_paused = true)]
async fn random_schedules_keep_every_promise() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for run in 0..200 {
        let grace = Duration::from_millis(rng.below(50) + 1);
        let retain = Duration::from_millis(100);
        let log_events = rng.below(20) as usize + 1;
        let options = ResumeOptions::default()
            .grace(grace)
            .retain(retain)
            .log_bounds(log_events, 1 << 20);
        let registry = Registry::memory(options);
        let releases = Releases::default();
        let generated = Arc::new(AtomicU64::new(0));
        let total = 60;
        let consumer = tokens(
            &releases,
            total,
            Duration::from_millis(1),
            generated.clone(),
        );
        let mut subscriber = Some(register(&registry, "r", consumer).await);
        let mut seen: Vec<(u64, String)> = Vec::new();
        let mut ended: Option<Option<EndReason>> = None;
        let mut stopped = false;
        while ended.is_none() {
            match rng.below(6) {
                0 | 1 => {
                    if let Some(s) = subscriber.as_mut() {
                        match timeout(Duration::from_millis(5), s.next()).await {
                            Ok(Some(frame)) => match read(frame) {
                                Ok(event) => seen.push(event),
                                Err(end) => {
                                    // The grace never expires under an attached subscriber.
                                    assert_ne!(end.reason, EndReason::ConsumerGone, "run {run}");
                                    ended = Some(Some(end.reason));
                                }
                            },
                            Ok(None) => ended = Some(None),
                            Err(_) => {}
                        }
                    }
                }
                2 => subscriber = None,
                3 => {
                    if subscriber.is_none() {
                        let last = seen.last().map(|(id, _)| *id);
                        match registry.attach("r", last).await {
                            Ok(s) => subscriber = Some(s),
                            // Expired (or done and retained no longer): nothing to resume.
                            Err(AttachError::Unknown) => {
                                ended = Some(Some(EndReason::ConsumerGone))
                            }
                            // A stopped stream's last events wait for nobody.
                            Err(AttachError::Gone { .. }) if stopped => {
                                ended = Some(Some(EndReason::Cancelled))
                            }
                            // Over, and everything was read.
                            Err(AttachError::Finished) => {
                                ended = Some(stopped.then_some(EndReason::Cancelled))
                            }
                            Err(error) => panic!("run {run}: {error}"),
                        }
                    }
                }
                4 => {
                    if rng.below(20) == 0 {
                        stopped |= registry.stop("r").await.unwrap_or(false);
                    }
                }
                _ => sleep(Duration::from_millis(rng.below(30))).await,
            }
            assert!(
                registry.stats().log_bytes <= log_events * 3,
                "run {run}: the log's bound"
            );
        }
        assert_eq!(
            seen,
            expected(0..seen.len() as u64),
            "run {run}: in order, nothing lost"
        );
        drop(subscriber);
        releases.wait_for(1).await;
        let (reason, _) = releases.once();
        if ended == Some(None) {
            assert_eq!(reason, EndReason::Completed, "run {run}");
            assert_eq!(seen.len() as u64, total, "run {run}");
        }
        let after_release = generated.load(Ordering::SeqCst);
        sleep(retain * 2).await;
        assert_eq!(
            generated.load(Ordering::SeqCst),
            after_release,
            "run {run}: never restarted"
        );
        assert_eq!(
            registry.stats().streams,
            0,
            "run {run}: removed after the retention"
        );
        assert_eq!(releases.count(), 1, "run {run}: released once");
    }
}

#[tokio::test(start_paused = true)]
async fn an_attached_reader_that_stops_holds_the_generator_within_the_read_ahead() {
    let options = ResumeOptions::default()
        .read_ahead(8)
        .max_lag(Duration::from_secs(60));
    let Started {
        generated,
        first: mut reader,
        ..
    } = started(options, 1_000, Duration::from_millis(1)).await;
    take(&mut reader, 1).await;
    sleep(Duration::from_secs(10)).await;
    // The log (8 unread), the gate (4) and the chunk in the generator's hand.
    let paused_at = generated.load(Ordering::SeqCst);
    assert!(paused_at <= 1 + 8 + 4 + 1, "generated {paused_at}");
    sleep(Duration::from_secs(10)).await;
    assert_eq!(generated.load(Ordering::SeqCst), paused_at, "paused");
    assert_eq!(rest(&mut reader).await.0, expected(1..1_000));
}

#[tokio::test(start_paused = true)]
async fn the_last_reader_cut_off_ends_a_stream_without_grace_as_slow() {
    let options = ResumeOptions::default()
        .grace(Duration::ZERO)
        .read_ahead(8)
        .max_lag(Duration::from_secs(3));
    let Started {
        releases,
        first: mut reader,
        ..
    } = started(options, 1_000_000, Duration::from_millis(1)).await;
    take(&mut reader, 1).await;
    sleep(Duration::from_secs(5)).await;
    releases.wait_for(1).await;
    assert_eq!(releases.once().0, EndReason::SlowConsumer);
    // What it still reads is what the log kept, then the end.
    let (events, end) = rest(&mut reader).await;
    assert_eq!(events, expected(1..1 + events.len() as u64));
    assert_eq!(end.expect("an end").reason, EndReason::SlowConsumer);
}

#[tokio::test(start_paused = true)]
async fn a_stop_ends_the_stream_at_once_even_while_a_reader_holds_it() {
    let options = ResumeOptions::default()
        .read_ahead(2)
        .max_lag(Duration::from_secs(60));
    let Started {
        registry,
        releases,
        first: mut reading,
        ..
    } = started(options, 1_000_000, Duration::from_millis(1)).await;
    let _stalled = registry.attach("r", None).await.unwrap();
    take(&mut reading, 2).await;
    sleep(Duration::from_secs(1)).await;
    registry.stop("r").await.unwrap();
    // The stalled reader holds nothing any more: the reading one gets the end at once.
    let (_, end) = timeout(Duration::from_millis(100), rest(&mut reading))
        .await
        .expect("the end comes at once");
    assert_eq!(end.expect("an end").reason, EndReason::Cancelled);
    releases.wait_for(1).await;
    assert_eq!(releases.once().0, EndReason::Cancelled);
    assert_eq!(registry.stats().expired, 0, "a stop is not an expiry");
}

#[tokio::test(start_paused = true)]
async fn a_lag_limit_too_long_to_express_never_cuts() {
    let options = ResumeOptions::default()
        .read_ahead(2)
        .max_lag(Duration::MAX);
    let Started {
        first: mut reader, ..
    } = started(options, 100, Duration::from_millis(1)).await;
    take(&mut reader, 1).await;
    sleep(Duration::from_secs(3600)).await;
    let (events, end) = rest(&mut reader).await;
    assert_eq!(events, expected(1..100));
    assert!(end.is_none(), "{end:?}");
}

#[tokio::test(start_paused = true)]
async fn every_detach_generates_through_its_grace() {
    let grace = Duration::from_millis(300);
    let options = ResumeOptions::default()
        .grace(grace)
        .log_bounds(32, 1 << 20);
    let Started {
        registry,
        generated,
        first: mut reader,
        ..
    } = started(options, 10_000, Duration::from_millis(5)).await;
    let mut last = 0;
    for session in 0..3 {
        // Catch up with everything generated so far, then leave.
        loop {
            last = take(&mut reader, 1).await[0].0;
            if last + 1 >= generated.load(Ordering::SeqCst) {
                break;
            }
        }
        drop(reader);
        let before = generated.load(Ordering::SeqCst);
        sleep(grace / 2).await;
        let during = generated.load(Ordering::SeqCst) - before;
        // 150 ms at 5 ms a token, the log (32) not yet full.
        assert!(
            during >= 20,
            "session {session}: {during} tokens during the grace"
        );
        reader = registry.attach("r", Some(last)).await.unwrap();
    }
    assert_eq!(take(&mut reader, 1).await[0].0, last + 1);
}

#[tokio::test(start_paused = true)]
async fn a_reader_cut_off_ends_behind_at_its_next_read() {
    let options = ResumeOptions::default()
        .grace(Duration::from_secs(60))
        .read_ahead(2)
        .max_lag(Duration::from_millis(100));
    let Started {
        registry,
        first: mut reader,
        ..
    } = started(options, 1_000_000, Duration::from_millis(1)).await;
    take(&mut reader, 1).await;
    sleep(Duration::from_secs(1)).await;
    let (events, end) = rest(&mut reader).await;
    assert!(events.is_empty(), "{events:?}");
    let end = end.expect("an end");
    assert_eq!(end.reason, EndReason::SlowConsumer);
    assert!(end.message.contains("behind"), "{end:?}");
    // Nobody reads: the stream waits for a resume through its grace.
    assert_eq!(registry.stats().detached, 1);
}

/// A stream registered for another API ends every reader in that API's error shape: the first
/// subscriber's and a resumed one's, numbered after the last event each read.
#[tokio::test(start_paused = true)]
async fn every_readers_end_is_in_the_streams_error_shape() {
    let options = ResumeOptions::default()
        .grace(Duration::from_secs(60))
        .read_ahead(2)
        .max_lag(Duration::from_millis(100));
    let registry = Registry::memory(options);
    let releases = Releases::default();
    let consumer = tokens(
        &releases,
        1_000_000,
        Duration::from_millis(1),
        Arc::default(),
    );
    let mut first = register_as(&registry, "r", consumer, ErrorShape::Responses).await;
    take(&mut first, 1).await;
    let mut resumed = registry.attach("r", Some(0)).await.unwrap();
    take(&mut resumed, 2).await;
    sleep(Duration::from_secs(1)).await;
    for (reader, read) in [(&mut first, 1), (&mut resumed, 3)] {
        let end = rest(reader).await.1.expect("cut off");
        assert_eq!(end.reason, EndReason::SlowConsumer);
        let data = &end.data;
        assert_eq!(
            (&data["type"], &data["code"]),
            (&"error".into(), &"slow_consumer".into()),
            "{data}"
        );
        assert!(end.message.contains("behind"), "{end:?}");
        assert_eq!(data["sequence_number"], read, "{data}");
    }
}

/// A re-attach racing the grace's expiry on a multi-threaded runtime: either it comes first and
/// the stream goes on under it, or the expiry comes first and the attach is refused; never an
/// attached subscriber on an expired stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reattach_racing_the_expiry_never_lands_on_an_expired_stream() {
    let grace = Duration::from_millis(2);
    for _ in 0..200 {
        let registry = Registry::memory(ResumeOptions::default().grace(grace));
        let releases = Releases::default();
        let consumer = tokens(
            &releases,
            1_000_000,
            Duration::from_micros(100),
            Arc::default(),
        );
        let mut reader = register(&registry, "r", consumer).await;
        let last = take(&mut reader, 1).await[0].0;
        drop(reader);
        std::thread::sleep(grace);
        match registry.attach("r", Some(last)).await {
            Ok(mut resumed) => {
                let next = timeout(HANG, resumed.next()).await.unwrap().unwrap();
                assert!(read(next).is_ok(), "attached, the stream goes on");
            }
            Err(error) => assert!(matches!(error, AttachError::Unknown), "{error}"),
        }
        drop(registry);
    }
}

/// A gate ended from outside (a group's shutdown) while a full log holds its detached stream:
/// the stream ends too, instead of waiting for its grace.
#[tokio::test(start_paused = true)]
async fn a_shutdown_ends_a_detached_stream_paused_at_a_full_log() {
    let options = ResumeOptions::default()
        .grace(Duration::from_secs(600))
        .log_bounds(8, 1 << 20);
    let registry = Registry::memory(options);
    let releases = Releases::default();
    let group = streamgate::Group::new();
    let consumer = releases
        .gate()
        .group(&group)
        .policy(Policy::backpressure().max_pause(None))
        .spawn(|_, mut tx| async move {
            for i in 0.. {
                tx.send(format!("t{i}")).await?;
            }
            Ok::<_, streamgate::SendError<String>>(())
        });
    let mut reader = register(&registry, "r", consumer).await;
    take(&mut reader, 1).await;
    drop(reader);
    sleep(Duration::from_secs(1)).await;
    assert_eq!(registry.stats().detached, 1, "paused, waiting for a resume");
    let report = group.shutdown(Duration::from_secs(5)).await;
    assert_eq!(report.released, 1);
    sleep(Duration::from_millis(10)).await;
    assert_eq!(
        registry.stats().detached,
        0,
        "the stream ended with its gate"
    );
    // Its last events waited for nobody; the log's newest ones and the end remain.
    let Err(AttachError::Gone { oldest }) = registry.attach("r", Some(0)).await else {
        panic!("the log moved on");
    };
    let mut late = registry.attach("r", Some(oldest)).await.unwrap();
    let (_, end) = rest(&mut late).await;
    assert_eq!(end.expect("an end").reason, EndReason::Shutdown);
}

#[tokio::test(start_paused = true)]
async fn a_subscriber_left_unpolled_does_not_stop_a_stream_within_its_read_ahead() {
    // Polled once with nothing to read, then never again (a `Pending` a caller walked away
    // from): within the read-ahead (64 events by default) the pump still moves every event into
    // the log, and the stream completes and is released. Past it, the subscriber's lag limit
    // cuts it off (`a_reader_cut_off_ends_behind_at_its_next_read`).
    let Started {
        registry,
        releases,
        generated,
        first: mut reader,
    } = started(ResumeOptions::default(), 10, Duration::from_millis(1)).await;
    assert!(
        reader.next().now_or_never().is_none(),
        "nothing to read yet"
    );
    releases.wait_for(1).await;
    assert_eq!(releases.once().0, EndReason::Completed);
    assert_eq!(generated.load(Ordering::SeqCst), 10);
    // The log has it all, for another subscriber and for the one left waiting.
    let mut other = registry.attach("r", None).await.unwrap();
    for subscriber in [&mut other, &mut reader] {
        let (events, end) = rest(subscriber).await;
        assert_eq!(events, expected(0..10));
        assert!(end.is_none(), "{end:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_subscriber_attaching_and_leaving_mid_stream_loses_nothing() {
    // Twenty streams as fast as the generator goes, on two workers: a second subscriber
    // attaches at event 500 and leaves at 600 while the generator and the pump run on the
    // other worker; both read the same events, and the first reads every event once, in order.
    for _ in 0..20 {
        let options = ResumeOptions::default().read_ahead(4);
        let Started {
            registry,
            releases,
            first: mut reader,
            ..
        } = started(options, 2_000, Duration::ZERO).await;
        let mut events = take(&mut reader, 500).await;
        let mut second = registry.attach("r", Some(499)).await.unwrap();
        let (more, seen) = tokio::join!(take(&mut reader, 100), take(&mut second, 100));
        assert_eq!(seen, more);
        events.extend(more);
        drop(second);
        let (more, end) = rest(&mut reader).await;
        events.extend(more);
        assert_eq!(events, expected(0..2_000));
        assert!(end.is_none(), "{end:?}");
        releases.wait_for(1).await;
        assert_eq!(releases.once().0, EndReason::Completed);
    }
}

#[tokio::test(start_paused = true)]
async fn an_id_names_one_stream_from_its_claim_to_the_end_of_its_retention() {
    let retain = Duration::from_secs(10);
    let registry = Registry::memory(ResumeOptions::default().retain(retain));
    let claim = registry.claim("r").await.unwrap();
    assert!(matches!(
        registry.claim("r").await,
        Err(ClaimError::Running)
    ));
    let releases = Releases::default();
    let consumer = tokens(&releases, 3, Duration::ZERO, Arc::default());
    let mut first = registry.register(claim, consumer).await.unwrap();
    assert!(matches!(
        registry.claim("r").await,
        Err(ClaimError::Running)
    ));
    assert_eq!(rest(&mut first).await.0, expected(0..3));
    releases.wait_for(1).await;
    // Released: retained for replay, still not a new stream's.
    sleep(Duration::from_millis(1)).await;
    assert!(matches!(
        registry.claim("r").await,
        Err(ClaimError::Retained)
    ));
    assert!(!registry.stop("r").await.unwrap(), "ended: nothing to stop");
    sleep(retain).await;
    assert!(matches!(
        registry.attach("r", None).await,
        Err(AttachError::Unknown)
    ));
    // The retention is over: the id is free.
    drop(registry.claim("r").await.unwrap());
    // A claim of another registry registers nothing here.
    let other = Registry::<String>::memory(ResumeOptions::default());
    let foreign = other.claim("s").await.unwrap();
    let consumer = tokens(&releases, 3, Duration::ZERO, Arc::default());
    assert!(matches!(
        registry.register(foreign, consumer).await,
        Err(streamgate::resume::RegisterError::ForeignClaim)
    ));
}

#[tokio::test(start_paused = true)]
async fn a_stop_cancels_the_signal_a_claim_gave_out_instead_of_the_gate() {
    let registry = Registry::memory(ResumeOptions::default());
    let mut claim = registry.claim("r").await.unwrap();
    let stop = claim.stop_signal();
    let releases = Releases::default();
    // The generator ends the stream itself when stopped, with a last word of its own.
    let consumer = releases
        .gate()
        .policy(Policy::backpressure().max_pause(None))
        .spawn(move |_, mut tx| async move {
            for i in 0.. {
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = sleep(Duration::from_millis(1)) => {}
                }
                tx.send(format!("t{i}")).await?;
            }
            tx.send("stopped".to_owned()).await?;
            Ok::<_, streamgate::SendError<String>>(())
        });
    let mut first = registry.register(claim, consumer).await.unwrap();
    take(&mut first, 3).await;
    assert!(registry.stop("r").await.unwrap());
    let (events, end) = rest(&mut first).await;
    assert!(end.is_none(), "completed on its own terms: {end:?}");
    assert_eq!(events.last().map(|(_, t)| t.as_str()), Some("stopped"));
    releases.wait_for(1).await;
    assert_eq!(releases.once().0, EndReason::Completed);
}

/// A stream's second name resolves to the stream it was given to while that stream is kept,
/// never to one claimed later under its id (see `second_names`).
#[tokio::test]
async fn a_name_resolves_to_its_stream_while_it_is_kept() {
    let registry = Registry::memory(ResumeOptions::default().retain(Duration::from_secs(1)));
    second_names(&registry, &registry).await;
}
