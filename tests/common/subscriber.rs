//! Reading a registry's subscribers in tests: frames back into (id, token) events and the
//! terminal frame into an end, whichever store the registry keeps its logs in.

use futures_util::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use streamgate::resume::{ClaimError, Registry, Subscriber};
use streamgate::sse::{ErrorShape, SseFrame};
use streamgate::{Consumer, EndReason};

use streamgate::Policy;
use tokio::time::{sleep, timeout};

use super::HANG;
use super::gate::Releases;

/// Claims `id` and registers `consumer` under it.
pub async fn register(
    registry: &Registry<String>,
    id: &str,
    consumer: Consumer<String>,
) -> Subscriber {
    register_as(registry, id, consumer, ErrorShape::default()).await
}

/// Claims `id` and registers `consumer` under it, its early ends in `shape`.
pub async fn register_as(
    registry: &Registry<String>,
    id: &str,
    consumer: Consumer<String>,
    shape: ErrorShape,
) -> Subscriber {
    let mut claim = registry.claim(id).await.expect("a new id");
    claim.error_shape(shape);
    registry
        .register(claim, consumer)
        .await
        .expect("registered")
}

/// How a subscriber's stream ended early: the reason and the message of its terminal frame,
/// and its data (in the stream's error shape).
#[derive(Debug)]
pub struct End {
    pub reason: EndReason,
    pub message: String,
    pub data: serde_json::Value,
}

/// A subscriber's frame: an event as (id, token), or the terminal frame of an early end.
pub fn read(frame: SseFrame) -> Result<(u64, String), End> {
    let text = std::str::from_utf8(frame.bytes()).expect("UTF-8");
    let data = text
        .lines()
        .find_map(|line| line.strip_prefix("data: "))
        .expect("a data line");
    match frame.end_reason() {
        Some(reason) => {
            let data: serde_json::Value = serde_json::from_str(data).expect("JSON");
            // `{"error":{"message":..}}`, or a Responses error's own `message`.
            let message = data["error"]["message"]
                .as_str()
                .or(data["message"].as_str());
            Err(End {
                reason,
                message: message.expect("a message").to_owned(),
                data,
            })
        }
        None => Ok((frame.id().expect("an event id"), data.to_owned())),
    }
}

/// The next `count` events of `subscriber` as (id, token).
pub async fn take(subscriber: &mut Subscriber, count: usize) -> Vec<(u64, String)> {
    let mut events = Vec::new();
    for _ in 0..count {
        let frame = timeout(HANG, subscriber.next())
            .await
            .expect("no hang")
            .expect("an event");
        events.push(read(frame).expect("not an end"));
    }
    events
}

/// Every event of `subscriber` until its end, and the end (`None`: completed).
pub async fn rest(subscriber: &mut Subscriber) -> (Vec<(u64, String)>, Option<End>) {
    let mut events = Vec::new();
    while let Some(frame) = timeout(HANG, subscriber.next()).await.expect("no hang") {
        match read(frame) {
            Ok(event) => events.push(event),
            Err(end) => return (events, Some(end)),
        }
    }
    (events, None)
}

/// The events `t{i}` for `range`, as (id, token).
pub fn expected(range: std::ops::Range<u64>) -> Vec<(u64, String)> {
    range.map(|i| (i, format!("t{i}"))).collect()
}

/// A generator of `n` tokens `"t{i}"`, one every `step`, counting what it generated; its gate
/// holds 4 events, records its release and pauses without limit (the registry's grace and lag
/// limits bound a slow or absent reader).
pub fn tokens(
    releases: &Releases,
    n: u64,
    step: Duration,
    generated: Arc<AtomicU64>,
) -> Consumer<String> {
    releases
        .gate()
        .policy(Policy::backpressure().max_pause(None))
        .max_events(4)
        .spawn(move |_, mut tx| async move {
            for i in 0..n {
                if !step.is_zero() {
                    sleep(step).await;
                }
                tx.send(format!("t{i}")).await?;
                generated.fetch_add(1, Ordering::SeqCst);
            }
            Ok::<_, streamgate::SendError<String>>(())
        })
}

/// A stream's second name, given through `here` while the stream is only claimed (as its first
/// event would name it): `there` resolves it to that stream while it runs and while it is
/// retained after its end; an id is no name, and naming no stream does nothing; once the
/// retention ended and the id is claimed anew, the old name names nothing.
pub async fn second_names(here: &Registry<String>, there: &Registry<String>) {
    let claim = here.claim("named").await.expect("a new id");
    here.alias("resp_1", "named").await.unwrap();
    let releases = Releases::default();
    let consumer = tokens(&releases, 3, Duration::ZERO, Arc::default());
    let mut first = here.register(claim, consumer).await.expect("registered");
    assert_eq!(
        there.resolve("resp_1").await.unwrap().as_deref(),
        Some("named")
    );
    assert_eq!(
        there.resolve("named").await.unwrap(),
        None,
        "an id is no name"
    );
    here.alias("resp_2", "unknown").await.unwrap();
    assert_eq!(
        there.resolve("resp_2").await.unwrap(),
        None,
        "no stream, no name"
    );
    assert_eq!(rest(&mut first).await.0, expected(0..3));
    releases.wait_for(1).await;
    // Once its claim is given back, the retained stream keeps the id, and the name.
    let deadline = std::time::Instant::now() + HANG;
    while !matches!(there.claim("named").await, Err(ClaimError::Retained)) {
        assert!(std::time::Instant::now() < deadline, "never retained");
        sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        there.resolve("resp_1").await.unwrap().as_deref(),
        Some("named"),
        "retained"
    );
    let claim = loop {
        if let Ok(claim) = there.claim("named").await {
            break claim;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the id was never free again"
        );
        sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        here.resolve("resp_1").await.unwrap(),
        None,
        "not the later claim"
    );
    let again = Releases::default();
    let consumer = tokens(&again, 3, Duration::ZERO, Arc::default());
    let mut second = there.register(claim, consumer).await.expect("registered");
    assert_eq!(rest(&mut second).await.0, expected(0..3));
    again.wait_for(1).await;
    assert_eq!(
        here.resolve("resp_1").await.unwrap(),
        None,
        "not the later stream"
    );
}
