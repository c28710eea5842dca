//! The release: runs the release hook exactly once, after the generator's work has stopped, on
//! every path.

use std::fmt;
use std::future::{Future, poll_fn};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::buffer::Buffer;
use super::group::Membership;
use super::stats::GateStats;
use crate::chunk::Chunk;
use crate::end::EndReason;
use crate::sync::Arc;

/// A boxed, sendable future of an async release hook.
type HookFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The hook an engine gives to free what a stream holds (KV blocks): called once with the
/// reason that stands and the final counters.
pub(crate) enum ReleaseHook {
    Sync(Box<dyn FnOnce(EndReason, GateStats) + Send + 'static>),
    Async(Box<dyn FnOnce(EndReason, GateStats) -> HookFuture + Send + 'static>),
}

/// Owned by the gate's task. [`run`](Release::run) releases the stream when the work has
/// stopped; its `Drop` does it if the task is dropped first (the runtime shutting down), so the
/// hook runs exactly once on every path.
pub(crate) struct Release<T: Chunk> {
    buffer: Arc<Buffer<T>>,
    hook: Option<ReleaseHook>,
    timeout: Duration,
    // Left after the hook, before the stream counts as released.
    membership: Option<Membership>,
    done: bool,
}

impl<T: Chunk> Release<T> {
    pub(crate) fn new(
        buffer: Arc<Buffer<T>>,
        hook: Option<ReleaseHook>,
        timeout: Duration,
        membership: Option<Membership>,
    ) -> Self {
        Release {
            buffer,
            hook,
            timeout,
            membership,
            done: false,
        }
    }

    /// Runs the hook with the reason that stands and the final counters, awaiting an async hook
    /// for at most the release timeout, then marks the stream released.
    pub(crate) async fn run(mut self) {
        let (reason, stats) = self.ending();
        let mut timed_out = false;
        let panicked = match self.hook.take() {
            None => None,
            Some(ReleaseHook::Sync(hook)) => {
                catch_unwind(AssertUnwindSafe(|| hook(reason, stats))).err()
            }
            Some(ReleaseHook::Async(hook)) => {
                match catch_unwind(AssertUnwindSafe(|| hook(reason, stats))) {
                    Err(panic) => Some(panic),
                    Ok(mut future) => {
                        let guarded = poll_fn(|cx| {
                            catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx)))
                                .map_or_else(|panic| Poll::Ready(Some(panic)), |p| p.map(|()| None))
                        });
                        match tokio::time::timeout(self.timeout, guarded).await {
                            Ok(panicked) => panicked,
                            Err(_) => {
                                timed_out = true;
                                None
                            }
                        }
                    }
                }
            }
        };
        self.done = true;
        // Out of the group before anyone waiting for `released()` looks at it.
        drop(self.membership.take());
        // Released even if the hook panicked, so nobody waits for ever on `released()`.
        self.buffer.mark_released(timed_out);
        if let Some(panic) = panicked {
            resume_unwind(panic);
        }
    }

    /// The reason that stands (ending the stream as `Shutdown` if nothing has) and the counters.
    fn ending(&self) -> (EndReason, GateStats) {
        let reason = self.buffer.end(EndReason::Shutdown, None);
        (reason, self.buffer.stats())
    }
}

impl<T: Chunk> Drop for Release<T> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // The task was dropped before the release ran: its runtime is shutting down.
        let (reason, stats) = self.ending();
        let panicked = match self.hook.take() {
            None => None,
            Some(ReleaseHook::Sync(hook)) => {
                catch_unwind(AssertUnwindSafe(|| hook(reason, stats))).err()
            }
            // No runtime is left to await it on: it runs up to its first await.
            Some(ReleaseHook::Async(hook)) => catch_unwind(AssertUnwindSafe(|| {
                let mut future = hook(reason, stats);
                let _ = future
                    .as_mut()
                    .poll(&mut Context::from_waker(Waker::noop()));
            }))
            .err(),
        };
        drop(self.membership.take());
        self.buffer.mark_released(false);
        if let Some(panic) = panicked {
            if !std::thread::panicking() {
                resume_unwind(panic);
            }
        }
    }
}

impl<T: Chunk> fmt::Debug for Release<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Release")
            .field("has_hook", &self.hook.is_some())
            .field("in_group", &self.membership.is_some())
            .field("done", &self.done)
            .finish()
    }
}
