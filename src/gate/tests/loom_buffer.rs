use std::future::poll_fn;
use std::pin::Pin;

use futures_core::Stream;
use loom::future::block_on;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use tokio_util::sync::CancellationToken;

use crate::end::EndReason;
use crate::gate::buffer::{Buffer, Config};
use crate::gate::consumer::Consumer;
use crate::gate::policy::Policy;
use crate::gate::release::{Release, ReleaseHook};
use crate::gate::run::drive;
use crate::gate::sender::Sender;
use crate::sync::Arc;

/// The policy without a deadline: the models run without tokio's timer.
pub(super) const UNTIMED: Policy = Policy::backpressure().max_pause(None);

/// A stop grace too long to represent: the gate's task waits for the generator to stop on its
/// own, without tokio's timer.
pub(super) const UNTIMED_GRACE: std::time::Duration = std::time::Duration::MAX;

/// A buffer with these bounds and policy, ids from 0, no group.
pub(super) fn buffer(max_events: usize, max_bytes: usize, policy: Policy) -> Arc<Buffer<String>> {
    let config = Config {
        max_events,
        max_bytes,
        policy,
        first_id: 0,
        budget: None,
    };
    Arc::new(Buffer::new(config, CancellationToken::new()))
}

/// A gate's parts without its task, as [`Gate::channel`](crate::Gate::channel) makes them: the
/// buffer, the engine's sender, the consumer.
pub(super) fn parts(
    max_events: usize,
    max_bytes: usize,
    policy: Policy,
) -> (Arc<Buffer<String>>, Sender<String>, Consumer<String>) {
    let buffer = buffer(max_events, max_bytes, policy);
    let sender = Sender::new(buffer.clone(), false, false);
    (buffer.clone(), sender, Consumer::new(buffer))
}

/// A release whose hook adds `10 * code(reason) + 1` to `calls`, so one call with one reason
/// is one exact number.
pub(super) fn counted_release(
    buffer: &Arc<Buffer<String>>,
    calls: &Arc<AtomicUsize>,
) -> Release<String> {
    let seen = calls.clone();
    let hook = ReleaseHook::Sync(Box::new(move |reason, _| {
        seen.fetch_add(code(reason) * 10 + 1, Ordering::SeqCst);
    }));
    Release::new(buffer.clone(), Some(hook), std::time::Duration::MAX, None)
}

/// A number per end reason, for [`counted_release`].
pub(super) fn code(reason: EndReason) -> usize {
    match reason {
        EndReason::Completed => 1,
        EndReason::ConsumerGone => 2,
        EndReason::Cancelled => 3,
        EndReason::SlowConsumer => 4,
        _ => 5,
    }
}

/// Everything the consumer receives until its end, and whether that end was an error.
pub(super) fn drain(consumer: &mut Consumer<String>) -> (Vec<String>, Option<EndReason>) {
    block_on(async {
        let mut received = Vec::new();
        while let Some(item) = poll_fn(|cx| Pin::new(&mut *consumer).poll_next(cx)).await {
            match item {
                Ok(event) => received.push(event.into_chunk()),
                Err(error) => return (received, Some(error.reason())),
            }
        }
        (received, None)
    })
}

pub(super) fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// A one-event buffer: every chunk crosses, in order, with no lost wake-up on either side.
#[test]
fn send_and_receive_through_a_full_buffer() {
    model(|| {
        let (_, mut sender, mut consumer) = parts(1, 64, UNTIMED);
        let producer = thread::spawn(move || {
            block_on(async {
                for text in ["a", "b", "c"] {
                    sender.send(text.to_owned()).await.unwrap();
                }
            });
            sender.finish();
        });
        let (received, end) = drain(&mut consumer);
        producer.join().unwrap();
        assert_eq!(received, ["a", "b", "c"]);
        assert_eq!(end, None);
    });
}

/// Coalescing races the consumer's takes: whatever merges, nothing is lost or reordered.
#[test]
fn coalesce_against_receive_is_lossless() {
    model(|| {
        let (_, mut sender, mut consumer) = parts(1, 64, Policy::coalesce().max_pause(None));
        let producer = thread::spawn(move || {
            block_on(async {
                for text in ["a", "b", "c"] {
                    sender.send(text.to_owned()).await.unwrap();
                }
            });
            sender.abort("the engine failed");
        });
        let (received, end) = drain(&mut consumer);
        producer.join().unwrap();
        assert_eq!(received.concat(), "abc");
        assert_eq!(end, Some(EndReason::GeneratorError));
    });
}

/// The consumer goes away while the engine waits for room: the send fails rather than waiting
/// for ever, and the stream ends as consumer-gone.
#[test]
fn consumer_drop_wakes_a_waiting_send() {
    model(|| {
        let (buffer, mut sender, consumer) = parts(1, 64, UNTIMED);
        let producer = thread::spawn(move || {
            block_on(async {
                let first = sender.send("a".to_owned()).await.is_ok();
                // This caller stops at the first failed send.
                let second = first && sender.send("b".to_owned()).await.is_ok();
                first as u8 + second as u8
            })
        });
        drop(consumer);
        let accepted = producer.join().unwrap();
        // "b" can only be accepted if "a" was and the consumer was already gone... it cannot:
        // a one-event buffer that nobody reads has room for exactly one.
        assert!(accepted <= 1);
        let stats = buffer.stats();
        assert_eq!(stats.end_reason, Some(EndReason::ConsumerGone));
        assert_eq!(stats.chunks_sent, u64::from(accepted));
        assert_eq!(stats.chunks_after_end, 1);
        assert_eq!(stats.buffered_events, 0, "undelivered chunks are dropped");
    });
}

/// The generator's completion races the consumer's drop, on the gate's real task: one reason
/// stands, the hook sees it once, after the generator has stopped.
#[test]
fn completion_races_consumer_drop() {
    model(|| {
        let buffer = buffer(4, 64, UNTIMED);
        let sender = Sender::new(buffer.clone(), false, true);
        let calls = Arc::new(AtomicUsize::new(0));
        let release = counted_release(&buffer, &calls);
        let generator = async move {
            drop(sender);
            Ok::<(), std::io::Error>(())
        };
        let task = {
            let buffer = buffer.clone();
            thread::spawn(move || block_on(drive(Some(generator), buffer, release, UNTIMED_GRACE)))
        };
        drop(Consumer::new(buffer.clone()));
        task.join().unwrap();
        let reason = buffer.end_reason().expect("ended");
        // Nothing was sent: a consumer that leaves after the generator finished took everything.
        assert!(matches!(
            reason,
            EndReason::Completed | EndReason::ConsumerGone
        ));
        assert_eq!(calls.load(Ordering::SeqCst), code(reason) * 10 + 1);
        assert!(buffer.stats().released);
    });
}

/// A consumer parked on an empty buffer is woken by the end and sees every chunk first.
#[test]
fn end_wakes_a_parked_consumer() {
    model(|| {
        let (buffer, mut sender, mut consumer) = parts(2, 64, UNTIMED);
        let producer = thread::spawn(move || {
            block_on(sender.send("a".to_owned())).unwrap();
            buffer.end(EndReason::SlowConsumer, None);
        });
        let (received, end) = drain(&mut consumer);
        producer.join().unwrap();
        assert_eq!(received, ["a"]);
        assert_eq!(end, Some(EndReason::SlowConsumer));
    });
}

/// A batch lent to the consumer counts against the bounds until it is yielded: whatever the
/// interleaving, the gate never holds more than its bound, and the consumer's progress frees
/// room event by event.
#[test]
fn a_lent_batch_counts_against_the_bounds() {
    model(|| {
        let (buffer, mut sender, mut consumer) = parts(2, 64, UNTIMED);
        let producer = thread::spawn(move || {
            block_on(async {
                for text in ["a", "b", "c", "d"] {
                    sender.send(text.to_owned()).await.unwrap();
                }
            });
            sender.finish();
        });
        let mut received = Vec::new();
        block_on(async {
            while let Some(item) = poll_fn(|cx| Pin::new(&mut consumer).poll_next(cx)).await {
                let stats = buffer.stats();
                assert!(stats.buffered_events <= 2, "{stats:?}");
                assert!(stats.peak_buffered_events <= 2, "{stats:?}");
                received.push(item.unwrap().into_chunk());
            }
        });
        producer.join().unwrap();
        assert_eq!(received, ["a", "b", "c", "d"]);
        let stats = buffer.stats();
        assert_eq!((stats.events_delivered, stats.bytes_delivered), (4, 4));
        assert_eq!(stats.buffered_events, 0);
    });
}

/// A consumer takes one event from a full one-event buffer and then stops polling: the sender
/// waiting for room is still woken by that one take (not only when the consumer comes back for
/// a new batch), so it never waits for room that exists.
#[test]
fn one_take_wakes_a_waiting_sender() {
    model(|| {
        let (_, mut sender, mut consumer) = parts(1, 64, UNTIMED);
        let producer = thread::spawn(move || {
            block_on(async {
                sender.send("a".to_owned()).await.unwrap();
                // Waits for the consumer's one take.
                sender.send("b".to_owned()).await.unwrap();
            });
            sender
        });
        let first = block_on(poll_fn(|cx| Pin::new(&mut consumer).poll_next(cx)));
        assert_eq!(first.unwrap().unwrap().into_chunk(), "a");
        // The consumer does not poll again; the producer finishes anyway.
        let sender = producer.join().unwrap();
        sender.finish();
        let (rest, end) = drain(&mut consumer);
        assert_eq!((rest, end), (vec!["b".to_owned()], None));
    });
}
