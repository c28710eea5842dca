//! Coalescing a typed stream in tests, for every format whose events merge: at random, as a
//! reader that fell behind at random moments sees them, and through a real coalescing gate read
//! by a slow reader.

use std::time::Duration;

use bytes::BytesMut;
use futures_util::StreamExt;
use streamgate::sse::{SseDecoder, SseEvent};
use streamgate::{Chunk, Gate, GateExt, Policy};
use tokio_util::codec::Decoder;

use super::Rng;

/// Merges adjacent events at random: each attempt picks a pair, and a refusal leaves it as it
/// was; a merge is never longer than the two.
pub fn coalesce<T: Chunk + Clone>(rng: &mut Rng, events: &[T]) -> Vec<T> {
    let mut events = events.to_vec();
    for _ in 0..rng.below(4 * events.len() as u64 + 1) {
        if events.len() < 2 {
            break;
        }
        let at = rng.below(events.len() as u64 - 1) as usize;
        let next = events.remove(at + 1);
        let sum = events[at].byte_len() + next.byte_len();
        match events[at].merge(next) {
            Ok(()) => assert!(events[at].byte_len() <= sum),
            Err(next) => events.insert(at + 1, next),
        }
    }
    events
}

/// What a reader that takes 10 ms per frame receives of `stream` through a coalescing gate
/// holding 3 events, each frame read back with `read`.
pub async fn through_a_slow_reader<T>(stream: &[T], read: fn(&SseEvent) -> T) -> Vec<T>
where
    T: Chunk + Clone + Into<SseEvent> + Send + 'static,
{
    let events = stream.to_vec();
    let mut frames = Gate::new()
        .max_events(3)
        .policy(Policy::coalesce())
        .spawn(|_, mut tx| async move {
            for event in events {
                tx.send(event).await.map_err(|_| "the reader left")?;
            }
            Ok::<_, &'static str>(())
        })
        .sse();
    let mut decoder = SseDecoder::new();
    let mut received = Vec::new();
    while let Some(frame) = frames.next().await {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let mut bytes = BytesMut::from(&frame.bytes()[..]);
        while let Some(sse) = decoder.decode(&mut bytes).unwrap() {
            received.push(read(&sse));
        }
    }
    received
}
