//! The pump of a stream in memory: the gate's events into the replay log, then the retention.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use futures_core::Stream;

use super::stream::{Offer, Registered, Streams};
use crate::chunk::Chunk;
use crate::end::EndReason;
use crate::gate::Consumer;
use crate::resume::claim::Claim;
use crate::sync::{Arc, lock};

/// Moves the gate's events into the stream's log until the stream ends, gives its claim back
/// once the gate is released, then keeps the log for the retention (none after an expiry) and
/// removes the stream from `streams`.
pub(crate) async fn pump<C>(
    entry: Arc<Registered<C>>,
    mut consumer: Consumer<C>,
    streams: Arc<Streams<C>>,
    retain: Duration,
    claim: Claim,
) where
    C: Chunk + Clone + Send + Sync + 'static,
{
    let mut lag = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
    // A gate ended from outside (a group's shutdown, a cancel) while a full log holds a
    // detached stream's pump: its last events and its end then wait for nobody.
    let handle = entry.handle.clone();
    let mut released = std::pin::pin!(handle.released());
    let mut gate_released = false;
    let end = loop {
        let item = std::future::poll_fn(|cx| Pin::new(&mut consumer).poll_next(cx)).await;
        match item {
            Some(Ok(event)) => {
                let mut slot = Some(event);
                // Until the log takes it; a subscriber's lag limit running out is a reason to
                // look again.
                std::future::poll_fn(|cx| {
                    loop {
                        match entry.offer(&mut slot, cx) {
                            Offer::Taken { cut_last: false } => return Poll::Ready(()),
                            Offer::Taken { cut_last: true } => {
                                let state = lock(&entry.state);
                                entry.nobody_reads(state, EndReason::SlowConsumer);
                            }
                            // Only a detached stream's wait can outlive its gate (an attached
                            // one's is bounded by its readers' lag limits): watching the gate
                            // there costs the hot path nothing.
                            Offer::Detached => {
                                if gate_released || released.as_mut().poll(cx).is_pending() {
                                    return Poll::Pending;
                                }
                                gate_released = true;
                                entry.stop_waiting();
                            }
                            Offer::Wait(None) => return Poll::Pending,
                            Offer::Wait(Some(deadline)) => {
                                lag.as_mut().reset(deadline);
                                if lag.as_mut().poll(cx).is_pending() {
                                    return Poll::Pending;
                                }
                            }
                        }
                    }
                })
                .await;
            }
            Some(Err(error)) => break Some(error),
            None => break None,
        }
    };
    entry.finish(end);
    // The gate's end and release are the consumer's drop away; the id stays claimed until the
    // generator's work has stopped, then stays taken by the retained log.
    drop(consumer);
    if !gate_released {
        released.await;
    }
    drop(claim);
    let retain = if lock(&entry.state).expired {
        Duration::ZERO
    } else {
        retain
    };
    // A zero sleep would still wait for the timer's next millisecond tick.
    if !retain.is_zero() {
        tokio::time::sleep(retain).await;
    }
    let mut streams = lock(&streams);
    if streams
        .get(&entry.id)
        .is_some_and(|held| Arc::ptr_eq(held, &entry))
    {
        streams.remove(&entry.id);
    }
}
