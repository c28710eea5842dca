//! A connection's writes held to the end of the runtime's tick, so that the events made ready
//! meanwhile leave in one system call.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// A connection that flushed less than this long ago is in a burst, and its next write is
/// held. Token streams are paced 5 to 100 ms apart; events closer than this are a backlog
/// draining (an upstream or a generator running ahead of its client, a replay), where one
/// system call for many events pays.
pub(super) const BURST: Duration = Duration::from_millis(1);

/// Holds a connection's write that follows its last flush by less than [`BURST`], with nothing
/// read in between (a response body streaming, not keep-alive requests answered), until the
/// tasks that are ready to run have run (tokio's [`yield_now`](tokio::task::yield_now): after
/// the worker's other ready tasks and a poll of the I/O driver), then lets every write through
/// until the connection flushes.
///
/// A stream's events reach the connection one task poll at a time (an upstream's next chunk,
/// a generator's next token), and hyper flushes whenever the body has nothing more at once, so
/// without the cork each event costs a `writev` of its own, and on loopback the receiver's
/// TCP work with it. Corked, the events of a burst that became ready while the other tasks ran
/// go out together. No write waits for a later event, and none waits longer than a socket's
/// readiness would: a held write is released when its worker next polls the I/O driver (the
/// points where it learns that a socket became ready): when it has nothing else to run, or
/// every `event_interval` scheduler ticks (61 by default) while busy. A runtime whose tasks run
/// long between awaits delays it as it delays every socket. A write after a quiet spell (a
/// paced stream's every event) is not held at all, and one polled from another task than the
/// held one (an upgraded connection handed over) goes at once.
#[derive(Debug, Default)]
pub(super) struct Cork {
    state: State,
    /// When the connection last flushed.
    flushed_at: Option<Instant>,
}

#[derive(Debug, Default)]
enum State {
    /// The connection is flushed: the next write is held if it is within [`BURST`] of the
    /// flush, with nothing read in between.
    #[default]
    Idle,
    /// A write is held until the flag is set (when the task is woken after its yield).
    Held(Arc<Released>),
    /// Writes go through until the connection flushes.
    Open,
}

/// The deferred wake of a held write: sets the flag, then wakes the connection's task.
#[derive(Debug)]
struct Released {
    released: AtomicBool,
    waker: Waker,
}

impl Wake for Released {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.released.store(true, Ordering::Release);
        self.waker.wake_by_ref();
    }
}

impl Cork {
    /// Whether a write may go now; `Pending` while it is held (the task is woken when it may).
    /// `now` reads the clock, only for a write that may be in a burst.
    pub(super) fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        now: impl FnOnce() -> Instant,
    ) -> Poll<()> {
        match &self.state {
            State::Open => Poll::Ready(()),
            // Released; or polled by another task than the one the release will wake, which
            // would wait for ever: the write goes.
            State::Held(held)
                if held.released.load(Ordering::Acquire) || !held.waker.will_wake(cx.waker()) =>
            {
                self.state = State::Open;
                Poll::Ready(())
            }
            State::Held(_) => Poll::Pending,
            State::Idle
                if self
                    .flushed_at
                    .is_none_or(|at| now().duration_since(at) >= BURST) =>
            {
                self.state = State::Open;
                Poll::Ready(())
            }
            State::Idle => {
                let held = Arc::new(Released {
                    released: AtomicBool::new(false),
                    waker: cx.waker().clone(),
                });
                let waker = Waker::from(held.clone());
                let mut yielded = std::pin::pin!(tokio::task::yield_now());
                // The first poll of a yield defers its wake (outside a runtime's worker, wakes
                // at once) and is pending; the wake outlives the future.
                if yielded
                    .as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_ready()
                {
                    self.state = State::Open;
                    return Poll::Ready(());
                }
                self.state = State::Held(held);
                Poll::Pending
            }
        }
    }

    /// The connection read bytes: a write that follows is an answer to them (a keep-alive
    /// request's response, say), not the next of a burst, and is not held.
    pub(super) fn read(&mut self) {
        self.flushed_at = None;
    }

    /// The connection flushed (`now` reads the clock, only after writes): its next write is
    /// held if it comes within [`BURST`], with nothing read in between.
    pub(super) fn flushed(&mut self, now: impl FnOnce() -> Instant) {
        if matches!(self.state, State::Open) {
            self.state = State::Idle;
            self.flushed_at = Some(now());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::sync::atomic::AtomicUsize;

    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_write_after_a_quiet_spell_or_a_read_goes_at_once() {
        let mut cork = Cork::default();
        let start = Instant::now();
        let waker = Waker::noop();
        // The first write ever, then one a burst after the last flush: neither is held.
        assert!(
            cork.poll_write(&mut Context::from_waker(waker), || start)
                .is_ready()
        );
        cork.flushed(|| start);
        let later = start + BURST;
        assert!(
            cork.poll_write(&mut Context::from_waker(waker), || later)
                .is_ready()
        );
        // A write right after a flush, but with bytes read in between (the next request).
        cork.flushed(|| later);
        cork.read();
        assert!(
            cork.poll_write(&mut Context::from_waker(waker), || later)
                .is_ready()
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_held_write_polled_by_another_task_goes_at_once() {
        let mut cork = Cork::default();
        let start = Instant::now();
        let noop = &mut Context::from_waker(Waker::noop());
        assert!(cork.poll_write(noop, || start).is_ready());
        cork.flushed(|| start);
        // Held for the task that polled first (an upgrade handler whose write was cancelled),
        // then written from another (the connection handed over): nothing would wake it.
        let first = Arc::new(Released {
            released: AtomicBool::new(false),
            waker: Waker::noop().clone(),
        });
        let first = Waker::from(first);
        assert!(
            cork.poll_write(&mut Context::from_waker(&first), || start)
                .is_pending()
        );
        assert!(cork.poll_write(noop, || start).is_ready());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_write_in_a_burst_waits_for_the_ready_tasks_then_writes_go_until_the_flush() {
        let mut cork = Cork::default();
        let start = Instant::now();
        assert!(
            cork.poll_write(&mut Context::from_waker(Waker::noop()), || start)
                .is_ready()
        );
        cork.flushed(|| start);
        // Three tasks ready to run (say, generators with an event each): they run before the
        // held write goes.
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..3 {
            let ran = ran.clone();
            tokio::spawn(async move { ran.fetch_add(1, Ordering::SeqCst) });
        }
        let soon = start + BURST / 2;
        let mut polls = 0;
        poll_fn(|cx| {
            polls += 1;
            cork.poll_write(cx, || soon)
        })
        .await;
        assert!(polls > 1, "the write was held");
        assert_eq!(ran.load(Ordering::SeqCst), 3);
        // Released: every write goes until the flush, and the next burst's first is held.
        let noop = &mut Context::from_waker(Waker::noop());
        for _ in 0..3 {
            assert!(cork.poll_write(noop, || soon).is_ready());
        }
        cork.flushed(|| soon);
        assert!(cork.poll_write(noop, || soon).is_pending());
    }
}
