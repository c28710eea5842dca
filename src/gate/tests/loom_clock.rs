//! Model checks of the slow-consumer clock: the gate's task, when its timer fires, races the
//! consumer's takes, the sender's next chunk and the producer's finish.
//!
//! The models run without tokio's timer: a thread calls [`Buffer::check_stall`] as the gate's
//! task does when the timer fires, at a time past the limit.

use std::future::poll_fn;
use std::pin::Pin;
use std::time::Duration;

use futures_core::Stream;
use loom::future::block_on;
use loom::thread;
use tokio::time::Instant as Clock;

use super::loom_buffer::{drain, model, parts};
use crate::end::EndReason;
use crate::gate::policy::Policy;
use crate::sync::{Arc, AtomicBool, Ordering};

/// The policy's limit; the models' timer fires at twice it.
const LIMIT: Duration = Duration::from_secs(1);

/// A full buffer's clock runs out while the consumer takes the event that holds the sender up,
/// and the sender tries again and finishes: whichever comes first, every chunk the gate
/// accepted reaches the consumer before the end, a chunk refused is refused only because the
/// stream ended as a slow consumer, a consumer that took the event before the timer fired is
/// not ended for it, and the counters add up. With either clock: one that forgives a take
/// (`Disconnect`), one that forgives only a consumer that has made room (`Backpressure`).
#[test]
fn the_slow_consumer_clock_races_a_take() {
    for policy in [
        Policy::disconnect(LIMIT),
        Policy::backpressure().max_pause(Some(LIMIT)),
    ] {
        model(move || clock_races_a_take(policy));
    }
}

/// One run of [`the_slow_consumer_clock_races_a_take`] under `policy`.
fn clock_races_a_take(policy: Policy) {
    let (buffer, mut sender, mut consumer) = parts(1, 64, policy);
    sender.try_send("a".to_owned()).unwrap();
    // Full: the clock starts.
    assert!(sender.try_send("b".to_owned()).is_err());
    let took = Arc::new(AtomicBool::new(false));
    let timer = {
        let (buffer, took) = (buffer.clone(), took.clone());
        thread::spawn(move || {
            let took_before = took.load(Ordering::SeqCst);
            buffer.check_stall(Clock::now() + 2 * LIMIT);
            took_before
        })
    };
    let first = block_on(poll_fn(|cx| Pin::new(&mut consumer).poll_next(cx)));
    assert_eq!(first.unwrap().unwrap().into_chunk(), "a");
    took.store(true, Ordering::SeqCst);
    let second_accepted = sender.try_send("b".to_owned()).is_ok();
    sender.finish();
    let (rest, end) = drain(&mut consumer);
    let took_before_the_timer = timer.join().unwrap();
    if took_before_the_timer {
        assert!(
            second_accepted,
            "a consumer that took the event was ended for it"
        );
    }
    let expected: &[&str] = if second_accepted { &["b"] } else { &[] };
    assert_eq!(rest, expected, "every accepted chunk, once, in order");
    assert!(
        matches!(end, None | Some(EndReason::SlowConsumer)),
        "{end:?}"
    );
    if !second_accepted {
        assert_eq!(
            end,
            Some(EndReason::SlowConsumer),
            "refused only after the end"
        );
    }
    let stats = buffer.stats();
    let reason = end.unwrap_or(EndReason::Completed);
    assert_eq!(stats.end_reason, Some(reason));
    assert_eq!(stats.chunks_sent, 1 + u64::from(second_accepted));
    assert_eq!(stats.events_delivered, stats.chunks_sent);
    assert_eq!(stats.chunks_after_end, u64::from(!second_accepted));
    assert_eq!(stats.events_undelivered, 0);
}

/// A finished generator's last event waits for its consumer while the clock runs out: the
/// consumer gets the event in every interleaving, then either the completion (it took it in
/// time) or the slow-consumer end, and the gate's reason agrees with what it saw.
#[test]
fn a_finished_stream_s_clock_races_its_last_take() {
    model(|| {
        let (buffer, mut sender, mut consumer) =
            parts(2, 64, Policy::backpressure().max_pause(Some(LIMIT)));
        sender.try_send("a".to_owned()).unwrap();
        // Finished with an event waiting: the clock watches the consumer.
        sender.finish();
        let timer = {
            let buffer = buffer.clone();
            thread::spawn(move || buffer.check_stall(Clock::now() + 2 * LIMIT))
        };
        let (received, end) = drain(&mut consumer);
        timer.join().unwrap();
        assert_eq!(received, ["a"]);
        assert!(
            matches!(end, None | Some(EndReason::SlowConsumer)),
            "{end:?}"
        );
        let stats = buffer.stats();
        assert_eq!(stats.end_reason, Some(end.unwrap_or(EndReason::Completed)));
        assert_eq!((stats.events_delivered, stats.events_undelivered), (1, 0));
    });
}
