use std::future::poll_fn;
use std::pin::Pin;

use futures_core::Stream;
use loom::future::block_on;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use tokio_util::sync::CancellationToken;

use crate::gate::buffer::Buffer;
use crate::gate::consumer::Consumer;
use crate::gate::end::EndReason;
use crate::gate::policy::Policy;
use crate::gate::release::Release;
use crate::gate::sender::Sender;
use crate::sync::Arc;

/// A gate's parts without its task: the buffer, the generator's sender, the consumer.
fn parts(
    max_events: usize,
    max_bytes: usize,
    policy: Policy,
) -> (Arc<Buffer<String>>, Sender<String>, Consumer<String>) {
    let buffer = Arc::new(Buffer::new(max_events, max_bytes));
    let token = CancellationToken::new();
    let sender = Sender::new(buffer.clone(), token.clone(), policy, false);
    (buffer.clone(), sender, Consumer::new(buffer, token))
}

/// Everything the consumer receives until its end, and whether that end was an error.
fn drain(consumer: &mut Consumer<String>) -> (Vec<String>, Option<EndReason>) {
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

fn model(f: impl Fn() + Sync + Send + 'static) {
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
        let (buffer, mut sender, mut consumer) = parts(1, 64, Policy::backpressure());
        let producer = thread::spawn(move || {
            block_on(async {
                for text in ["a", "b", "c"] {
                    sender.send(text.to_owned()).await.unwrap();
                }
            });
            buffer.end(EndReason::Completed, None);
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
        let (buffer, mut sender, mut consumer) = parts(1, 64, Policy::coalesce());
        let producer = thread::spawn(move || {
            block_on(async {
                for text in ["a", "b", "c"] {
                    sender.send(text.to_owned()).await.unwrap();
                }
            });
            buffer.end(EndReason::GeneratorError, None);
        });
        let (received, end) = drain(&mut consumer);
        producer.join().unwrap();
        assert_eq!(received.concat(), "abc");
        assert_eq!(end, Some(EndReason::GeneratorError));
    });
}

/// The consumer goes away while the generator waits for room: the send fails rather than
/// waiting for ever, and the stream ends as cancelled.
#[test]
fn consumer_drop_wakes_a_waiting_send() {
    model(|| {
        let (buffer, mut sender, consumer) = parts(1, 64, Policy::backpressure());
        let producer = thread::spawn(move || {
            block_on(async {
                let first = sender.send("a".to_owned()).await;
                let second = sender.send("b".to_owned()).await;
                first.is_ok() as u8 + second.is_ok() as u8
            })
        });
        drop(consumer);
        let accepted = producer.join().unwrap();
        // "b" can only be accepted if "a" was and the consumer was already gone... it cannot:
        // a one-event buffer that nobody reads has room for exactly one.
        assert!(accepted <= 1);
        let stats = buffer.stats();
        assert_eq!(stats.end_reason, Some(EndReason::Cancelled));
        assert_eq!(stats.chunks_sent, u64::from(accepted));
        assert_eq!(stats.chunks_after_end, 2 - u64::from(accepted));
        assert_eq!(stats.buffered_events, 0, "undelivered chunks are dropped");
    });
}

/// The generator's end races the consumer's drop: one reason stands, the hook sees it, once.
#[test]
fn release_races_consumer_drop() {
    model(|| {
        let (buffer, _sender, consumer) = parts(4, 64, Policy::backpressure());
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let mut release = Release::new(
            buffer.clone(),
            CancellationToken::new(),
            Some(Box::new(move |reason| {
                let code = match reason {
                    EndReason::Completed => 1,
                    EndReason::Cancelled => 2,
                    _ => 3,
                };
                seen.fetch_add(code * 10 + 1, Ordering::SeqCst);
            })),
        );
        release.set_outcome(EndReason::Completed, None);
        let task = thread::spawn(move || drop(release));
        drop(consumer);
        task.join().unwrap();
        let reason = buffer.end_reason().expect("ended");
        let expected = match reason {
            EndReason::Completed => 11,
            EndReason::Cancelled => 21,
            other => panic!("unexpected end {other:?}"),
        };
        // Exactly one call, with the reason that stands.
        assert_eq!(calls.load(Ordering::SeqCst), expected);
        assert!(buffer.stats().released);
    });
}

/// A consumer parked on an empty buffer is woken by the end and sees every chunk first.
#[test]
fn end_wakes_a_parked_consumer() {
    model(|| {
        let (buffer, mut sender, mut consumer) = parts(2, 64, Policy::backpressure());
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
        let (buffer, mut sender, mut consumer) = parts(2, 64, Policy::backpressure());
        let done = buffer.clone();
        let producer = thread::spawn(move || {
            block_on(async {
                for text in ["a", "b", "c", "d"] {
                    sender.send(text.to_owned()).await.unwrap();
                }
            });
            done.end(EndReason::Completed, None);
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
