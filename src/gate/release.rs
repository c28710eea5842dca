//! The release guard: ends the stream and runs the release hook exactly once, on every path.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use tokio_util::sync::CancellationToken;

use super::buffer::Buffer;
use super::end::{BoxError, EndReason};
use crate::chunk::Chunk;
use crate::sync::Arc;

/// The hook an engine gives to free what a stream holds (KV blocks): called once with the
/// reason that stands.
pub(crate) type ReleaseHook = Box<dyn FnOnce(EndReason) + Send + 'static>;

/// Owned by the gate's task. Its `Drop` is the one place a stream ends from the generator's
/// side, so the hook runs exactly once whether the generator completed, failed, panicked, was
/// cancelled, or the task was dropped with its runtime.
pub(crate) struct Release<T: Chunk> {
    buffer: Arc<Buffer<T>>,
    token: CancellationToken,
    hook: Option<ReleaseHook>,
    outcome: Option<(EndReason, Option<BoxError>)>,
}

impl<T: Chunk> Release<T> {
    pub(crate) fn new(
        buffer: Arc<Buffer<T>>,
        token: CancellationToken,
        hook: Option<ReleaseHook>,
    ) -> Self {
        Release {
            buffer,
            token,
            hook,
            outcome: None,
        }
    }

    /// Records how the generator ended; without this the guard reports
    /// [`EndReason::Shutdown`].
    pub(crate) fn set_outcome(&mut self, reason: EndReason, source: Option<BoxError>) {
        self.outcome = Some((reason, source));
    }
}

impl<T: Chunk> Drop for Release<T> {
    fn drop(&mut self) {
        let (reason, source) = self.outcome.take().unwrap_or((EndReason::Shutdown, None));
        let reason = self.buffer.end(reason, source);
        // Every end cancels the token: a `Sender` that outlived the generator (moved to another
        // task) stops waiting, and the generator's own `CancellationToken` tells it too.
        self.token.cancel();
        let hooked = self
            .hook
            .take()
            .map(|hook| catch_unwind(AssertUnwindSafe(|| hook(reason))));
        // Released even if the hook panicked, so nobody waits for ever on `released()`.
        self.buffer.mark_released();
        if let Some(Err(panic)) = hooked {
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
            .field("outcome", &self.outcome.as_ref().map(|(reason, _)| reason))
            .finish()
    }
}
