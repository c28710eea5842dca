//! The gate's task: owns the generator, drops it on cancellation, catches its panics.

use std::any::Any;
use std::future::{Future, poll_fn};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::{Pin, pin};
use std::task::Poll;

use tokio_util::sync::CancellationToken;

use super::end::{BoxError, EndReason};
use super::release::Release;
use crate::chunk::Chunk;

/// What the task owns while the generator runs.
struct Running<T: Chunk, G> {
    // Field order is drop order: on every path, including the task being dropped with its
    // runtime, the generator (and the KV memory it holds) is gone before the release hook runs.
    generator: Option<Pin<Box<G>>>,
    release: Release<T>,
}

/// Runs `generator` until it finishes or `token` is cancelled, then ends the stream.
pub(crate) async fn drive<T, G, E>(generator: G, token: CancellationToken, release: Release<T>)
where
    T: Chunk,
    G: Future<Output = Result<(), E>>,
    E: Into<BoxError>,
{
    let mut running = Running {
        generator: Some(Box::pin(generator)),
        release,
    };
    let mut cancelled = pin!(token.cancelled());
    let outcome = poll_fn(|cx| {
        // Cancellation first: a cancelled generator is not polled again.
        if cancelled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        let generator = running.generator.as_mut().expect("polled after completion");
        match catch_unwind(AssertUnwindSafe(|| generator.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(result)) => Poll::Ready(Some(Ok(result))),
            Err(panic) => Poll::Ready(Some(Err(panic))),
        }
    })
    .await;
    running.generator = None;
    let (reason, source) = match outcome {
        None => (EndReason::Cancelled, None),
        Some(Ok(Ok(()))) => (EndReason::Completed, None),
        Some(Ok(Err(error))) => (EndReason::GeneratorError, Some(error.into())),
        Some(Err(panic)) => (EndReason::GeneratorPanic, Some(panic_message(panic))),
    };
    running.release.set_outcome(reason, source);
}

/// The message of a caught panic, as an error.
fn panic_message(panic: Box<dyn Any + Send>) -> BoxError {
    match panic.downcast::<String>() {
        Ok(message) => (*message).into(),
        Err(panic) => match panic.downcast::<&'static str>() {
            Ok(message) => (*message).into(),
            Err(_) => "panic with a non-string payload".into(),
        },
    }
}
