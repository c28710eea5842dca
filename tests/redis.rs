//! `resume::Registry::redis` on a real `redis-server` (started here on a free port; each test
//! says SKIPPED and passes when it is not installed), with two registries standing for two
//! instances of a server: a resume through the other instance continues the same generation;
//! the read-ahead pauses the generator and the lag limit cuts a reader off, whichever instance
//! it reads through, as in memory; claims are exclusive across instances; a finished stream
//! answers `Finished`; a stop through the other instance reaches the generator; a reader on
//! the other instance probes the same end reason. (The reference server's instances sharing
//! one Redis are `cli/tests/sim_redis.rs`.)
#![cfg(feature = "redis")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::gate::Releases;
use common::redis_server::RedisServer;
use common::subscriber::{expected, register, register_as, rest, second_names, take, tokens};
use futures_util::StreamExt;
use streamgate::probe::HopProbe;
use streamgate::resume::{AdoptError, AttachError, ClaimError, Registry, ResumeOptions};
use streamgate::sse::ErrorShape;
use streamgate::{EndReason, Gate, GateExt, Policy};
use tokio::time::sleep;

/// Two registries on one Redis: two instances of a server.
fn instances(redis: &RedisServer, options: ResumeOptions) -> (Registry<String>, Registry<String>) {
    let open = || Registry::redis(&redis.url(), options).expect("a Redis URL");
    (open(), open())
}

/// Waits until `generated` has not moved for `quiet`, at most the hang guard: where it paused.
async fn paused(generated: &AtomicU64, quiet: Duration) -> u64 {
    let deadline = std::time::Instant::now() + common::HANG;
    let mut last = generated.load(Ordering::SeqCst);
    loop {
        sleep(quiet).await;
        let now = generated.load(Ordering::SeqCst);
        if now == last {
            return now;
        }
        assert!(std::time::Instant::now() < deadline, "never paused: {now}");
        last = now;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_on_another_instance_probes_the_same_end_reason() {
    let Some(redis) = RedisServer::start("end-reason") else {
        return;
    };
    let (here, there) = instances(&redis, ResumeOptions::default());
    let consumer = Gate::new().spawn(|_, mut tx| async move {
        tx.send("a".to_owned()).await.ok();
        Err(std::io::Error::other("the decode loop failed"))
    });
    let first = register(&here, "failing", consumer).await;
    let hop = HopProbe::new("client.recv");
    // The reader on the other instance sees the event, the terminal frame, and the end.
    let reader = there.attach("failing", None).await.unwrap();
    let frames: Vec<_> = tokio::time::timeout(common::HANG, reader.probe(&hop, "r").collect())
        .await
        .expect("the stream ends");
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert_eq!(frames[1].end_reason(), Some(EndReason::GeneratorError));
    assert_eq!(
        hop.snapshot().streams_ended.occurred(),
        [(EndReason::GeneratorError, 1)]
    );
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_through_another_instance_continues_the_same_generation() {
    let Some(redis) = RedisServer::start("resume") else {
        return;
    };
    let (here, there) = instances(&redis, ResumeOptions::default());
    for (n, cut) in [0, 1, 17].into_iter().enumerate() {
        let id = format!("r{cut}");
        let releases = Releases::default();
        let generated = Arc::new(AtomicU64::new(0));
        let consumer = tokens(&releases, 50, Duration::from_millis(1), generated.clone());
        let mut first = register(&here, &id, consumer).await;
        let mut seen = take(&mut first, cut).await;
        drop(first);
        let last = seen.last().map(|(id, _)| *id);
        let mut resumed = there.attach(&id, last).await.unwrap();
        let (more, end) = rest(&mut resumed).await;
        seen.extend(more);
        assert_eq!(
            seen,
            expected(0..50),
            "cut after {cut}: nothing lost or repeated"
        );
        assert!(end.is_none(), "completed: {end:?}");
        releases.wait_for(1).await;
        assert_eq!(releases.once().0, EndReason::Completed);
        assert_eq!(generated.load(Ordering::SeqCst), 50, "generated once");
        assert_eq!(there.stats().resumed, n as u64 + 1, "attaches through it");
    }
}

/// A stream's second name, given through one instance, is known on the other for as long as
/// the stream is (see `second_names`); a store that is down says so (a name is never guessed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_given_through_one_instance_resolves_through_the_other() {
    let Some(mut redis) = RedisServer::start("aliases") else {
        return;
    };
    let options = ResumeOptions::default().retain(Duration::from_secs(2));
    let (here, there) = instances(&redis, options);
    second_names(&here, &there).await;
    redis.kill();
    assert!(here.resolve("resp_1").await.is_err());
    assert!(here.alias("resp_3", "req-3").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_holds_the_generator_within_the_read_ahead_on_either_instance() {
    let Some(redis) = RedisServer::start("read-ahead") else {
        return;
    };
    let options = ResumeOptions::default()
        .read_ahead(8)
        .max_lag(Duration::from_secs(60));
    let (here, there) = instances(&redis, options);
    for remote in [false, true] {
        let id = format!("r-{remote}");
        let releases = Releases::default();
        let generated = Arc::new(AtomicU64::new(0));
        let consumer = tokens(&releases, 1_000, Duration::ZERO, generated.clone());
        let first = register(&here, &id, consumer).await;
        let other = there.attach(&id, None).await.unwrap();
        // The reader that stops: on this instance (the pump's), or on the other.
        let (mut stopped, mut fast) = if remote {
            (other, first)
        } else {
            (first, other)
        };
        take(&mut stopped, 1).await;
        // The other reads on until the one that stopped holds the log: the read-ahead.
        let reader = tokio::spawn(async move { rest(&mut fast).await });
        let at = paused(&generated, Duration::from_millis(500)).await;
        // The log (8 unread by the reader that stopped, who read 1), the gate (4), the chunk
        // in the generator's hand.
        assert!(at <= 1 + 8 + 4 + 1, "remote {remote}: generated {at}");
        assert!(!reader.is_finished(), "remote {remote}: held back");
        // It reads again: everything comes, to both.
        let (events, end) = rest(&mut stopped).await;
        assert_eq!(events, expected(1..1_000), "remote {remote}");
        assert!(end.is_none(), "{end:?}");
        let (events, end) = reader.await.unwrap();
        assert_eq!(events, expected(0..1_000), "remote {remote}");
        assert!(end.is_none(), "{end:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_past_its_lag_limit_is_cut_off_and_holds_nobody_back_on_either_instance() {
    let Some(redis) = RedisServer::start("lag") else {
        return;
    };
    let options = ResumeOptions::default()
        .read_ahead(4)
        .max_lag(Duration::from_millis(300));
    let (here, there) = instances(&redis, options);
    // Each reader's end in the stream's error shape, on either instance.
    let shapes = [
        ("local", &here, ErrorShape::Responses),
        ("remote", &there, ErrorShape::Anthropic),
    ];
    for (id, stalled_on, shape) in shapes {
        let releases = Releases::default();
        let consumer = tokens(&releases, 200, Duration::ZERO, Arc::default());
        let mut fast = register_as(&here, id, consumer, shape).await;
        let mut stalled = stalled_on.attach(id, None).await.unwrap();
        take(&mut stalled, 1).await;
        let (events, end) = rest(&mut fast).await;
        assert_eq!(
            events,
            expected(0..200),
            "{id}: the fast reader gets everything"
        );
        assert!(end.is_none(), "{id}: {end:?}");
        let (got, end) = rest(&mut stalled).await;
        let end =
            end.unwrap_or_else(|| panic!("{id}: the stalled reader ends, read {}", got.len()));
        assert_eq!(end.reason, EndReason::SlowConsumer, "{id}");
        assert!(end.message.contains("behind"), "{id}: {end:?}");
        assert_eq!(end.data["type"], "error", "{id}: {:?}", end.data);
        match shape {
            ErrorShape::Responses => {
                assert_eq!(end.data["code"], "slow_consumer", "{id}");
                // Numbered after the last event the reader got, however many were queued.
                let last = got.last().map_or(0, |(id, _)| id + 1);
                assert_eq!(end.data["sequence_number"], last.max(1), "{id}: {got:?}");
            }
            _ => assert_eq!(end.data["error"]["type"], "slow_consumer", "{id}"),
        }
        releases.wait_for(1).await;
        assert_eq!(releases.once().0, EndReason::Completed, "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_are_exclusive_across_instances_until_the_retention_ends() {
    let Some(redis) = RedisServer::start("claims") else {
        return;
    };
    let retain = Duration::from_secs(3);
    let (here, there) = instances(&redis, ResumeOptions::default().retain(retain));
    // Two instances claiming one new id at once: one wins, every time.
    for n in 0..1000 {
        let id = format!("new-{n}");
        let (a, b) = tokio::join!(here.claim(&id), there.claim(&id));
        assert!(a.is_ok() != b.is_ok(), "{n}: {a:?} {b:?}");
        let lost = if a.is_ok() { b } else { a };
        assert!(matches!(lost, Err(ClaimError::Running)), "{n}: {lost:?}");
    }
    // A claim dropped unregistered gives the id back: on its instance at once, as in memory;
    // on the other once the release reached Redis (a round trip later).
    let claim = here.claim("dropped").await.unwrap();
    drop(claim);
    let again = here
        .claim("dropped")
        .await
        .expect("free again at once here");
    drop(again);
    let deadline = std::time::Instant::now() + common::HANG;
    while there.claim("dropped").await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the id never came back"
        );
        sleep(Duration::from_millis(10)).await;
    }
    // A finished stream: nothing after its last event, and its id retained.
    let releases = Releases::default();
    let consumer = tokens(&releases, 3, Duration::ZERO, Arc::default());
    let mut first = register(&here, "done", consumer).await;
    assert_eq!(rest(&mut first).await.0, expected(0..3));
    releases.wait_for(1).await;
    assert!(matches!(
        there.attach("done", Some(2)).await,
        Err(AttachError::Finished)
    ));
    let (all, end) = rest(&mut there.attach("done", None).await.unwrap()).await;
    assert_eq!((all, end.is_none()), (expected(0..3), true));
    assert!(matches!(
        there.claim("done").await,
        Err(ClaimError::Retained)
    ));
    assert!(!there.stop("done").await.unwrap(), "ended: nothing to stop");
    assert!(matches!(
        there.stop("never").await,
        Err(AttachError::Unknown)
    ));
}

/// An instance that died between claiming an id and registering its stream (its claim neither
/// registered nor given back) holds the id only for the claim's lease (2 s), not for the
/// claimed key's TTL (10 s): a new request for it then succeeds on another instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_claimed_by_an_instance_that_died_is_free_once_its_lease_lapsed() {
    let Some(redis) = RedisServer::start("orphaned") else {
        return;
    };
    let url = redis.url();
    // The instance that dies: its own runtime, shut down with the claim held, so neither the
    // claim's renewal nor its release runs again (as if the process were killed).
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        runtime.block_on(async {
            let dying = Registry::<String>::redis(&url, ResumeOptions::default()).unwrap();
            std::mem::forget(dying.claim("orphan").await.expect("the first claim"));
        });
        runtime.shutdown_background();
    })
    .join()
    .unwrap();
    let (there, _) = instances(&redis, ResumeOptions::default());
    let died = std::time::Instant::now();
    assert!(
        matches!(there.claim("orphan").await, Err(ClaimError::Running)),
        "the claim holds the id while its lease runs"
    );
    let claim = claim_once_freed(&there, "orphan", died).await;
    assert!(
        died.elapsed() < Duration::from_secs(5),
        "{:?}",
        died.elapsed()
    );
    // The claim taken over registers its stream, which runs to its end.
    let releases = Releases::default();
    let consumer = tokens(&releases, 3, Duration::ZERO, Arc::default());
    let mut stream = there.register(claim, consumer).await.expect("registered");
    assert_eq!(rest(&mut stream).await.0, expected(0..3));
}

/// A claim whose instance stalled past its lease (its renewal could not run) and was taken
/// over by another instance cannot register its stream: the id is the other claim's, whose
/// stream then runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_taken_over_after_its_lease_lapsed_cannot_register() {
    let Some(redis) = RedisServer::start("taken-over") else {
        return;
    };
    let url = redis.url();
    let (claimed, stalled) = std::sync::mpsc::channel::<()>();
    let (took_over, resume) = std::sync::mpsc::channel::<()>();
    // The instance that stalls: a runtime of one thread, blocked while the other takes over.
    let late = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let here = Registry::<String>::redis(&url, ResumeOptions::default()).unwrap();
            let claim = here.claim("stalled").await.expect("the first claim");
            claimed.send(()).unwrap();
            resume.recv().unwrap();
            let releases = Releases::default();
            let consumer = tokens(&releases, 3, Duration::ZERO, Arc::default());
            here.register(claim, consumer)
                .await
                .err()
                .map(|error| error.to_string())
        })
    });
    tokio::task::spawn_blocking(move || stalled.recv().unwrap())
        .await
        .unwrap();
    let (there, _) = instances(&redis, ResumeOptions::default());
    let claim = claim_once_freed(&there, "stalled", std::time::Instant::now()).await;
    took_over.send(()).unwrap();
    let refused = tokio::task::spawn_blocking(move || late.join().unwrap())
        .await
        .unwrap();
    assert!(
        refused.is_some(),
        "the stalled claim registered over the other's"
    );
    let releases = Releases::default();
    let consumer = tokens(&releases, 3, Duration::ZERO, Arc::default());
    let mut stream = there.register(claim, consumer).await.expect("registered");
    assert_eq!(rest(&mut stream).await.0, expected(0..3));
}

/// Redis restarted while an instance's connection to it was idle: the first request after the
/// restart does not fail for that connection (it is made again at once), and streams run as
/// before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_request_after_a_redis_restart_succeeds() {
    let Some(mut redis) = RedisServer::start("restart") else {
        return;
    };
    let (here, there) = instances(&redis, ResumeOptions::default());
    // Both instances have a connection.
    for instance in [&here, &there] {
        let nothing = instance.attach("nothing", None).await;
        assert!(matches!(nothing, Err(AttachError::Unknown)), "{nothing:?}");
    }
    redis.kill();
    redis.restart();
    let claim = here.claim("after").await;
    assert!(
        claim.is_ok(),
        "the first claim after the restart: {claim:?}"
    );
    drop(claim);
    let releases = Releases::default();
    let consumer = tokens(&releases, 3, Duration::ZERO, Arc::default());
    let mut first = register(&there, "stream", consumer).await;
    assert_eq!(rest(&mut first).await.0, expected(0..3));
}

/// Redis restarted (empty: no persistence) while a stream runs, within the outage window: its
/// subscriber pauses and then gets every event, once, in order; the generator completes (its
/// pump gave the stream back to the empty Redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_within_the_outage_window_loses_no_event() {
    let Some(mut redis) = RedisServer::start("outage") else {
        return;
    };
    let (here, _) = instances(&redis, ResumeOptions::default());
    let releases = Releases::default();
    let generated = Arc::new(AtomicU64::new(0));
    let consumer = tokens(&releases, 60, Duration::from_millis(5), generated.clone());
    let mut subscriber = register(&here, "through", consumer).await;
    let mut seen = take(&mut subscriber, 5).await;
    redis.kill();
    sleep(Duration::from_millis(300)).await;
    redis.restart();
    let (rest, end) = rest(&mut subscriber).await;
    seen.extend(rest);
    assert_eq!(seen, expected(0..60), "every event once, in order");
    assert!(end.is_none(), "completed: {:?}", end.map(|end| end.message));
    releases.wait_for(1).await;
    assert_eq!(releases.once().0, EndReason::Completed);
}

/// Redis restarted empty while a stream is idle between two tokens (its pump's next call is a
/// look, not an append) and a reader on the other instance has read everything: the pump gives
/// the stream back to Redis, and both subscribers, here and there, get every event once, in
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_read_through_both_instances_outlives_a_redis_restart() {
    let Some(mut redis) = RedisServer::start("outage-idle") else {
        return;
    };
    let (here, there) = instances(&redis, ResumeOptions::default());
    let releases = Releases::default();
    let consumer = releases
        .gate()
        .policy(Policy::backpressure().max_pause(None))
        .max_events(4)
        .spawn(|_, mut tx| async move {
            for i in 0..20u64 {
                if i == 5 {
                    // Idle while Redis restarts.
                    sleep(Duration::from_millis(1500)).await;
                }
                tx.send(format!("t{i}")).await?;
            }
            Ok::<_, streamgate::SendError<String>>(())
        });
    let mut local = register(&here, "idle", consumer).await;
    let mut remote = there.attach("idle", None).await.unwrap();
    let mut seen_here = take(&mut local, 5).await;
    let mut seen_there = take(&mut remote, 5).await;
    sleep(Duration::from_millis(200)).await;
    redis.kill();
    sleep(Duration::from_millis(300)).await;
    redis.restart();
    let (rest_here, end_here) = rest(&mut local).await;
    let (rest_there, end_there) = rest(&mut remote).await;
    seen_here.extend(rest_here);
    seen_there.extend(rest_there);
    assert_eq!(seen_here, expected(0..20), "here");
    assert_eq!(seen_there, expected(0..20), "there");
    assert!(end_here.is_none() && end_there.is_none(), "completed");
    releases.wait_for(1).await;
    assert_eq!(releases.once().0, EndReason::Completed);
}

/// A stream whose generator finishes while Redis is away, and Redis comes back empty: its pump
/// gives the stream back and ends it there, so both subscribers, here and on the other
/// instance, complete with every event (not a `resume_store_error` after the last one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_finishes_while_redis_is_away_completes() {
    let Some(mut redis) = RedisServer::start("outage-finish") else {
        return;
    };
    let (here, there) = instances(&redis, ResumeOptions::default());
    let releases = Releases::default();
    let killed = Arc::new(tokio::sync::Notify::new());
    let consumer = {
        let killed = killed.clone();
        releases
            .gate()
            .policy(Policy::backpressure().max_pause(None))
            .spawn(move |_, mut tx| async move {
                for i in 0..5u64 {
                    tx.send(format!("t{i}")).await?;
                }
                // Finishes while Redis is away.
                killed.notified().await;
                Ok::<_, streamgate::SendError<String>>(())
            })
    };
    let mut local = register(&here, "finishing", consumer).await;
    let mut remote = there.attach("finishing", None).await.unwrap();
    let mut seen_here = take(&mut local, 5).await;
    let mut seen_there = take(&mut remote, 5).await;
    redis.kill();
    killed.notify_one();
    sleep(Duration::from_millis(300)).await;
    redis.restart();
    let (rest_here, end_here) = rest(&mut local).await;
    let (rest_there, end_there) = rest(&mut remote).await;
    seen_here.extend(rest_here);
    seen_there.extend(rest_there);
    assert_eq!(
        (seen_here, end_here.map(|end| end.message)),
        (expected(0..5), None)
    );
    assert_eq!(
        (seen_there, end_there.map(|end| end.message)),
        (expected(0..5), None)
    );
    releases.wait_for(1).await;
    assert_eq!(releases.once().0, EndReason::Completed);
}

/// Redis away past the outage window: the subscriber ends with a `resume_store_error` frame
/// once the window has passed (not before, never a hang), and the generator is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_away_past_the_outage_window_ends_the_stream_visibly() {
    let Some(mut redis) = RedisServer::start("outage-past") else {
        return;
    };
    let window = Duration::from_millis(400);
    let (here, _) = instances(&redis, ResumeOptions::default().outage(window));
    let releases = Releases::default();
    let consumer = tokens(
        &releases,
        u64::MAX,
        Duration::from_millis(5),
        Arc::default(),
    );
    let mut subscriber = register(&here, "gone", consumer).await;
    take(&mut subscriber, 3).await;
    redis.kill();
    let killed = std::time::Instant::now();
    let (_, end) = rest(&mut subscriber).await;
    let ended = killed.elapsed();
    let end = end.expect("an early end");
    assert!(
        end.data.to_string().contains("resume_store_error"),
        "{}",
        end.data
    );
    assert!(window <= ended && ended < window * 4, "{ended:?}");
    releases.wait_for(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_through_another_instance_cancels_the_signal_the_claim_gave_out() {
    let Some(redis) = RedisServer::start("stop") else {
        return;
    };
    let (here, there) = instances(&redis, ResumeOptions::default());
    let mut claim = here.claim("r").await.unwrap();
    let stop = claim.stop_signal();
    let releases = Releases::default();
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
    let mut first = here.register(claim, consumer).await.unwrap();
    let mut other = there.attach("r", None).await.unwrap();
    take(&mut first, 3).await;
    assert!(there.stop("r").await.unwrap());
    for reader in [&mut first, &mut other] {
        let (events, end) = rest(reader).await;
        assert!(end.is_none(), "completed on its own terms: {end:?}");
        assert_eq!(events.last().map(|(_, t)| t.as_str()), Some("stopped"));
    }
    releases.wait_for(1).await;
    assert_eq!(releases.once().0, EndReason::Completed);
}

/// A stop through the other instance while a reader there holds the pump (so the pump also
/// looks at Redis between its ticks): it reaches the generator every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_reaches_a_pump_held_by_a_reader_on_the_other_instance() {
    let Some(redis) = RedisServer::start("stop-held") else {
        return;
    };
    let options = ResumeOptions::default().read_ahead(2);
    let (here, there) = instances(&redis, options);
    for n in 0..20 {
        let id = format!("held-{n}");
        let releases = Releases::default();
        let consumer = tokens(&releases, u64::MAX, Duration::ZERO, Arc::default());
        let first = register(&here, &id, consumer).await;
        // Attached before the first leaves, so the log never runs ahead of it.
        let mut slow = there.attach(&id, None).await.unwrap();
        drop(first);
        let reader = tokio::spawn(async move {
            while slow.next().await.is_some() {
                sleep(Duration::from_millis(30)).await;
            }
        });
        sleep(Duration::from_millis(150)).await;
        assert!(there.stop(&id).await.unwrap(), "{n}: running");
        releases.wait_for(1).await;
        assert_eq!(releases.once().0, EndReason::Cancelled, "{n}");
        reader.await.unwrap();
    }
}

/// A pump whose reader on the other instance held a full log and left waits for a resume
/// looking at Redis every tick, not in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_pump_looks_at_redis_every_tick() {
    let Some(redis) = RedisServer::start("detached-looks") else {
        return;
    };
    let options = ResumeOptions::default()
        .grace(Duration::from_secs(30))
        .read_ahead(8)
        .log_bounds(4, 1 << 20);
    let (here, there) = instances(&redis, options);
    let releases = Releases::default();
    let consumer = tokens(&releases, u64::MAX, Duration::ZERO, Arc::default());
    let first = register(&here, "r", consumer).await;
    let mut held = there.attach("r", None).await.unwrap();
    drop(first);
    take(&mut held, 1).await;
    // The log is full of what the reader there has not read: the pump waits on it.
    sleep(Duration::from_millis(500)).await;
    drop(held);
    sleep(Duration::from_millis(500)).await;
    let zrange_calls = || async {
        let client = redis::Client::open(redis.url()).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut connection)
            .await
            .unwrap();
        let line = info
            .lines()
            .find(|line| line.starts_with("cmdstat_zrange:"))
            .expect("ZRANGE was called");
        let calls = line
            .split("calls=")
            .nth(1)
            .unwrap()
            .split(',')
            .next()
            .unwrap();
        calls.parse::<u64>().unwrap()
    };
    let before = zrange_calls().await;
    sleep(Duration::from_secs(1)).await;
    let looks = zrange_calls().await - before;
    // One look per 100 ms tick (a few more around the edges), never thousands.
    assert!(looks <= 15, "{looks} looks in a second");
    assert_eq!(releases.count(), 0, "waiting for a resume");
}

/// Polls `adopt` until the lapsed lease lets `registry` adopt `id` (at most the hang guard).
/// Claims `id` through `registry` once another claim's lease on it lapsed: within 5 s of
/// `since`.
async fn claim_once_freed(
    registry: &Registry<String>,
    id: &str,
    since: std::time::Instant,
) -> streamgate::resume::Claim {
    loop {
        match registry.claim(id).await {
            Ok(claim) => return claim,
            Err(ClaimError::Running) => {
                assert!(since.elapsed() < Duration::from_secs(5), "never freed");
                sleep(Duration::from_millis(100)).await;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
}

async fn adopted(registry: &Registry<String>, id: &str) -> streamgate::resume::Adoption {
    let deadline = std::time::Instant::now() + common::HANG;
    loop {
        match registry.adopt(id).await {
            Ok(adoption) => return adoption,
            Err(AdoptError::Pumped) => {}
            Err(other) => panic!("not adoptable: {other}"),
        }
        assert!(std::time::Instant::now() < deadline, "never adopted");
        sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_instance_died_is_adopted_and_carried_on_from_its_log() {
    let Some(redis) = RedisServer::start("adopt") else {
        return;
    };
    let (here, there) = instances(&redis, ResumeOptions::default());
    // `here` runs on a runtime of its own, which dies without a word: its pump, gate,
    // generator and subscriber are dropped where they are, its leases left to lapse.
    let dying = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (seen_tx, seen_rx) = tokio::sync::oneshot::channel();
    let releases = Releases::default();
    dying.spawn(async move {
        let mut claim = here.claim("orphan").await.unwrap();
        claim.keep_request("the request");
        let generated = Arc::new(AtomicU64::new(0));
        let consumer = tokens(&releases, 1000, Duration::from_millis(2), generated);
        let mut first = here.register(claim, consumer).await.unwrap();
        let seen = take(&mut first, 10).await;
        seen_tx.send(seen).unwrap();
        std::future::pending::<()>().await;
    });
    let mut seen = seen_rx.await.unwrap();
    dying.shutdown_background();
    // A reader attaches to the orphan meanwhile, through the other instance.
    let mut reader = there.attach("orphan", Some(9)).await.unwrap();
    let adoption = adopted(&there, "orphan").await;
    assert_eq!(adoption.request(), "the request");
    assert_eq!(adoption.start(), 0, "the log holds the whole stream");
    let logged: Vec<u64> = adoption.frames().iter().filter_map(|f| f.id()).collect();
    let next = adoption.next_event();
    assert!(next >= 10, "{next}");
    assert_eq!(
        logged,
        (0..next).collect::<Vec<_>>(),
        "every event, in order"
    );
    // One adopter at a time.
    assert!(matches!(
        there.adopt("orphan").await,
        Err(AdoptError::Pumped)
    ));
    let carried = Releases::default();
    let consumer = carried
        .gate()
        .first_id(next)
        .spawn(move |_, mut tx| async move {
            for i in next..50 {
                tx.send(format!("t{i}")).await?;
            }
            Ok::<_, streamgate::SendError<String>>(())
        });
    there.carry_on(adoption, consumer).await.unwrap();
    let (more, end) = rest(&mut reader).await;
    assert!(end.is_none(), "completed: {end:?}");
    seen.extend(more);
    assert_eq!(seen, expected(0..50), "nothing lost or repeated");
    carried.wait_for(1).await;
    assert_eq!(carried.once().0, EndReason::Completed);
    assert_eq!(there.stats().adopted, 1);
    // The end reaches Redis just after the gate's release: until then its pump holds it.
    let deadline = std::time::Instant::now() + common::HANG;
    let finished = loop {
        match there.adopt("orphan").await {
            Err(AdoptError::Pumped) if std::time::Instant::now() < deadline => {
                sleep(Duration::from_millis(5)).await;
            }
            other => break other,
        }
    };
    assert!(
        matches!(finished, Err(AdoptError::Finished)),
        "{finished:?}"
    );
    assert!(matches!(
        there.adopt("never").await,
        Err(AdoptError::Unknown)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pump_whose_stream_was_adopted_stops_at_its_next_look() {
    let Some(redis) = RedisServer::start("adopt-fence") else {
        return;
    };
    let (here, there) = instances(&redis, ResumeOptions::default());
    assert!(matches!(
        here.adopt("fenced").await,
        Err(AdoptError::Unknown)
    ));
    let releases = Releases::default();
    let consumer = releases.gate().spawn(|_, mut tx| async move {
        for i in 0..5 {
            tx.send(format!("t{i}")).await?;
        }
        // A generation that stalls: its pump stays alive, looking at Redis every tick.
        std::future::pending::<()>().await;
        Ok::<_, streamgate::SendError<String>>(())
    });
    let mut first = register(&here, "fenced", consumer).await;
    let seen = take(&mut first, 5).await;
    assert!(matches!(
        here.adopt("fenced").await,
        Err(AdoptError::Pumped)
    ));
    assert!(matches!(
        there.adopt("fenced").await,
        Err(AdoptError::Pumped)
    ));
    // Its lease lapses, as if this instance stalled past it.
    let client = ::redis::Client::open(redis.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let () = ::redis::cmd("HSET")
        .arg("streamgate:{fenced}:meta")
        .arg("pump")
        .arg(0)
        .query_async(&mut connection)
        .await
        .unwrap();
    let adoption = there.adopt("fenced").await.expect("adopted");
    assert_eq!(adoption.next_event(), 5);
    // The old pump sees at its next look that the stream is no longer its own.
    releases.wait_for(1).await;
    assert_eq!(releases.once().0, EndReason::ConsumerGone);
    let consumer = Gate::new().first_id(5).spawn(|_, mut tx| async move {
        tx.send("t5".to_owned()).await?;
        Ok::<_, streamgate::SendError<String>>(())
    });
    there.carry_on(adoption, consumer).await.unwrap();
    let mut resumed = here.attach("fenced", Some(4)).await.unwrap();
    let (more, end) = rest(&mut resumed).await;
    assert!(end.is_none(), "completed: {end:?}");
    assert_eq!([seen, more].concat(), expected(0..6));
    drop(first);
}
