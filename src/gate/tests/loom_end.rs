//! Model checks of the end: the gate's real task (`drive`), its cancel, the two-phase stop and
//! the release, with the `CancellationToken` the generator really gets.

use std::convert::Infallible;
use std::time::Duration;

use loom::future::block_on;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;

use super::loom_buffer::{UNTIMED, UNTIMED_GRACE, buffer, code, counted_release, drain, model};
use crate::end::EndReason;
use crate::gate::consumer::Consumer;
use crate::gate::release::{Release, ReleaseHook};
use crate::gate::run::drive;
use crate::gate::sender::Sender;
use crate::sync::Arc;

/// A generator that ignores every send error and has no other await point, cancelled while it
/// sends: it makes at most one chunk after the end, is dropped, and the stream is released
/// once as cancelled.
#[test]
fn a_careless_generator_makes_at_most_one_chunk_after_a_cancel() {
    model(|| {
        let buffer = buffer(1, 64, UNTIMED);
        // As `Gate::spawn` makes it with no stop grace.
        let mut tx = Sender::new(buffer.clone(), false, true).parking_at_end();
        let calls = Arc::new(AtomicUsize::new(0));
        let release = counted_release(&buffer, &calls);
        let generator = async move {
            loop {
                let _ = tx.send("t".to_owned()).await;
            }
            #[allow(unreachable_code)]
            Ok::<(), Infallible>(())
        };
        let consumer = Consumer::new(buffer.clone());
        let handle = consumer.handle();
        let task = {
            let buffer = buffer.clone();
            thread::spawn(move || block_on(drive(Some(generator), buffer, release, Duration::ZERO)))
        };
        handle.cancel();
        task.join().unwrap();
        let stats = buffer.stats();
        assert_eq!(stats.end_reason, Some(EndReason::Cancelled));
        assert!(stats.chunks_after_end <= 1, "{stats:?}");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            code(EndReason::Cancelled) * 10 + 1
        );
        assert!(stats.released);
        drop(consumer);
    });
}

/// Two-phase stop: the consumer leaves while the generator is in a step; the token tells it,
/// it finishes the step and returns, and only then is the stream released, once, without
/// forcing. (If the consumer left before the send, the generator parks in the send on the
/// ended stream with nothing in progress, and is dropped there.)
#[test]
fn the_release_waits_for_the_generator_to_stop() {
    model(|| {
        let buffer = buffer(2, 64, UNTIMED);
        let mut tx = Sender::new(buffer.clone(), false, true);
        let token = buffer.token().clone();
        let in_step = Arc::new(AtomicBool::new(false));
        let released_in_step = Arc::new(AtomicBool::new(false));
        let hook = {
            let (in_step, released_in_step) = (in_step.clone(), released_in_step.clone());
            ReleaseHook::Sync(Box::new(move |_, _| {
                released_in_step.store(in_step.load(Ordering::SeqCst), Ordering::SeqCst);
            }))
        };
        let release = Release::new(buffer.clone(), Some(hook), Duration::MAX, None);
        let generator = {
            let in_step = in_step.clone();
            async move {
                tx.send("a".to_owned()).await.ok();
                // The next step is in flight: it notices the stop, then returns.
                in_step.store(true, Ordering::SeqCst);
                token.cancelled().await;
                in_step.store(false, Ordering::SeqCst);
                Ok::<(), Infallible>(())
            }
        };
        let task = {
            let buffer = buffer.clone();
            thread::spawn(move || block_on(drive(Some(generator), buffer, release, UNTIMED_GRACE)))
        };
        drop(Consumer::new(buffer.clone()));
        task.join().unwrap();
        let stats = buffer.stats();
        assert_eq!(stats.end_reason, Some(EndReason::ConsumerGone));
        assert!(
            !released_in_step.load(Ordering::SeqCst),
            "released while the generator was in its step"
        );
        assert!(!stats.stop_forced);
        assert!(stats.released);
        assert!(stats.chunks_after_end <= 1);
    });
}

/// An engine feeds a gate from outside its task and finishes while the consumer reads or
/// leaves: one reason stands, consistent with what was delivered, and the release waits until
/// the engine has let go of the sender.
#[test]
fn an_engine_finish_races_the_consumer() {
    model(|| {
        let buffer = buffer(1, 64, UNTIMED);
        let mut tx = Sender::new(buffer.clone(), false, false);
        let engine_done = Arc::new(AtomicBool::new(false));
        let seen_done = Arc::new(AtomicBool::new(false));
        let hook = {
            let (engine_done, seen_done) = (engine_done.clone(), seen_done.clone());
            ReleaseHook::Sync(Box::new(move |_, _| {
                seen_done.store(engine_done.load(Ordering::SeqCst), Ordering::SeqCst);
            }))
        };
        let release = Release::new(buffer.clone(), Some(hook), Duration::MAX, None);
        let task = {
            let buffer = buffer.clone();
            thread::spawn(move || {
                block_on(drive(
                    None::<std::future::Pending<Result<(), Infallible>>>,
                    buffer,
                    release,
                    UNTIMED_GRACE,
                ))
            })
        };
        let engine = {
            let engine_done = engine_done.clone();
            thread::spawn(move || {
                let sent = tx.try_send("a".to_owned()).is_ok();
                engine_done.store(true, Ordering::SeqCst);
                tx.finish();
                sent
            })
        };
        let mut consumer = Consumer::new(buffer.clone());
        let (received, end) = drain(&mut consumer);
        drop(consumer);
        let sent = engine.join().unwrap();
        task.join().unwrap();
        let stats = buffer.stats();
        // The consumer read to the end: everything sent arrived and the stream completed.
        assert_eq!(received.len(), usize::from(sent));
        assert_eq!(end, None);
        assert_eq!(stats.end_reason, Some(EndReason::Completed));
        assert_eq!(stats.events_undelivered, 0);
        assert!(
            seen_done.load(Ordering::SeqCst),
            "released while the engine held the sender"
        );
        assert!(stats.released);
    });
}

/// A send waiting for room races the end: it fails (or got in before the end), is counted at
/// most once, and never waits for ever.
#[test]
fn a_waiting_send_races_the_end() {
    model(|| {
        let buffer = buffer(1, 64, UNTIMED);
        let mut tx = Sender::new(buffer.clone(), false, false);
        let consumer = Consumer::new(buffer.clone());
        let handle = consumer.handle();
        let engine = thread::spawn(move || {
            block_on(async {
                let first = tx.send("a".to_owned()).await.is_ok();
                // This caller stops at the first failed send.
                let second = first && tx.send("b".to_owned()).await.is_ok();
                (first, second)
            })
        });
        handle.cancel_with(EndReason::Shutdown).unwrap();
        let (first, second) = engine.join().unwrap();
        let stats = buffer.stats();
        assert_eq!(stats.end_reason, Some(EndReason::Shutdown));
        assert!(!second || first, "in order");
        assert!(!second, "a one-event buffer nobody reads has room for one");
        // Each chunk offered is either in or counted as wasted, once.
        assert_eq!(
            stats.chunks_sent + stats.chunks_after_end,
            1 + u64::from(first)
        );
        drop(consumer);
    });
}
