//! What the gate's tests share: a release hook that records its calls, and draining a consumer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use streamgate::{Consumer, EndReason, Gate, GateError, GateStats};
use tokio::time::{Instant, timeout};

/// How late a timer may fire on tokio's paused clock: its resolution, one millisecond (a
/// deadline between two milliseconds fires at the next one). An end measured on the paused
/// clock comes at its deadline and at most this much later, whatever the machine's load.
pub const TICK: Duration = Duration::from_millis(1);

/// Every call of a release hook: the reason, the stats, and when (on tokio's clock).
#[derive(Clone, Default)]
pub struct Releases(Arc<Mutex<Vec<(EndReason, GateStats, Instant)>>>);

impl Releases {
    /// A gate whose release hook records here.
    pub fn gate(&self) -> Gate {
        let calls = self.0.clone();
        Gate::new().on_release(move |reason, stats| {
            calls.lock().unwrap().push((reason, stats, Instant::now()))
        })
    }

    /// The only release: fails if there was none or more than one.
    pub fn once(&self) -> (EndReason, GateStats) {
        let (reason, stats, _) = self.once_at();
        (reason, stats)
    }

    /// The only release and when it happened.
    pub fn once_at(&self) -> (EndReason, GateStats, Instant) {
        let calls = self.0.lock().unwrap();
        assert_eq!(calls.len(), 1, "released exactly once: {calls:?}");
        calls[0].clone()
    }

    /// How many releases so far.
    pub fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Waits (in real time) until there were `n` releases; fails the test if that takes longer
    /// than the hang guard.
    pub async fn wait_for(&self, n: usize) {
        let deadline = std::time::Instant::now() + super::HANG;
        while self.count() < n {
            assert!(
                std::time::Instant::now() < deadline,
                "{n} releases: {:?}",
                self.0.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The events (id, chunk) of a consumer until its end, and the end (`None` when it
/// completed), waiting at most `limit` for each item.
pub async fn drain_within(
    consumer: &mut Consumer<String>,
    limit: Duration,
) -> (Vec<(u64, String)>, Option<GateError>) {
    let mut events = Vec::new();
    while let Some(item) = timeout(limit, consumer.next()).await.expect("no hang") {
        match item {
            Ok(event) => events.push((event.id(), event.into_chunk())),
            Err(error) => {
                assert!(consumer.next().await.is_none(), "nothing after the end");
                return (events, Some(error));
            }
        }
    }
    (events, None)
}

/// [`drain_within`] with the real-time hang guard.
pub async fn drain(consumer: &mut Consumer<String>) -> (Vec<(u64, String)>, Option<GateError>) {
    drain_within(consumer, super::HANG).await
}
