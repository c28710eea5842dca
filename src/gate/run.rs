//! The gate's task: runs the generator (if the gate owns one), keeps the slow-consumer clock,
//! stops the work in two phases after an early end, and releases the stream.

use std::any::Any;
use std::future::{Future, poll_fn};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use super::buffer::Buffer;
use super::error::BoxError;
use super::release::Release;
use crate::chunk::Chunk;
use crate::end::EndReason;
use crate::sync::Arc;

/// What the task owns.
struct Running<T: Chunk, G> {
    // Field order is drop order: on every path, including the task being dropped with its
    // runtime, the generator (and the KV memory it holds) is gone before the release hook runs.
    generator: Option<Pin<Box<G>>>,
    release: Option<Release<T>>,
}

/// The timers of the task: the slow-consumer clock, and the stop grace after an early end.
#[derive(Default)]
struct Timers {
    stall: Option<Pin<Box<Sleep>>>,
    stop: Option<Pin<Box<Sleep>>>,
}

/// Runs the stream to its release: polls `generator` (when the gate owns one) until it
/// finishes or the stream ends, ends the stream when the slow-consumer clock runs out, gives
/// the generator `stop_grace` to stop after an early end, then runs the release.
///
/// Without a generator (an engine feeds the gate through its `Sender`), the work has stopped
/// when the engine drops the sender; the task waits for that at most `stop_grace`.
///
/// The generator is boxed before the task's future is built: an `async fn` keeps its arguments
/// in its state for its whole life, so a generator passed by value would sit in the task
/// (twice, beside a moved copy) as well as in its box.
pub(crate) fn drive<T, G, E>(
    generator: Option<G>,
    buffer: Arc<Buffer<T>>,
    release: Release<T>,
    stop_grace: Duration,
) -> impl Future<Output = ()>
where
    T: Chunk,
    G: Future<Output = Result<(), E>>,
    E: Into<BoxError>,
{
    drive_boxed(generator.map(Box::pin), buffer, release, stop_grace)
}

async fn drive_boxed<T, G, E>(
    generator: Option<Pin<Box<G>>>,
    buffer: Arc<Buffer<T>>,
    release: Release<T>,
    stop_grace: Duration,
) where
    T: Chunk,
    G: Future<Output = Result<(), E>>,
    E: Into<BoxError>,
{
    let owns_generator = generator.is_some();
    let mut running = Running {
        generator,
        release: Some(release),
    };
    let mut timers = Timers::default();
    poll_fn(|cx| {
        loop {
            let view = buffer.poll_task(cx);
            if let Some(deadline) = timers.poll_stall(cx, view.stall_deadline) {
                // The timer fires at its deadline or later; reading the clock as no earlier
                // than that means the check always acts (ends, or restarts the clock).
                buffer.check_stall(Instant::now().max(deadline));
                continue;
            }
            let Some(ended_at) = view.ended_at else {
                // Running, or finished and waiting for the consumer to take the last events.
                let Some(generator) = running.generator.as_mut() else {
                    return Poll::Pending;
                };
                match poll_generator(generator, cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(outcome) => {
                        running.generator = None;
                        end_with(&buffer, outcome);
                        continue;
                    }
                }
            };
            // Ended: the work must stop before the release.
            let working = if owns_generator {
                running.generator.is_some()
            } else {
                !view.producer_stopped
            };
            if !working {
                // `end_to_stop` is 0 when the work had already stopped: nothing to wait for.
                buffer.mark_stopped(false);
                return Poll::Ready(());
            }
            if timers.stop_grace_over(cx, ended_at, stop_grace) {
                running.generator = None;
                buffer.mark_stopped(true);
                return Poll::Ready(());
            }
            // Within the grace the generator may finish its step and return.
            if let Some(generator) = running.generator.as_mut() {
                if poll_generator(generator, cx).is_ready() {
                    running.generator = None;
                    buffer.mark_stopped(false);
                    return Poll::Ready(());
                }
            }
            return Poll::Pending;
        }
    })
    .await;
    running.generator = None;
    if let Some(release) = running.release.take() {
        release.run().await;
    }
}

impl Timers {
    /// Keeps the stall timer at `deadline`; returns the deadline once it has fired.
    fn poll_stall(&mut self, cx: &mut Context<'_>, deadline: Option<Instant>) -> Option<Instant> {
        let Some(deadline) = deadline else {
            self.stall = None;
            return None;
        };
        let timer = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        timer.as_mut().poll(cx).is_ready().then_some(deadline)
    }

    /// Whether the stop grace that began at `ended_at` is over (a zero grace always is).
    fn stop_grace_over(
        &mut self,
        cx: &mut Context<'_>,
        ended_at: Instant,
        grace: Duration,
    ) -> bool {
        if grace.is_zero() {
            return true;
        }
        let Some(deadline) = ended_at.checked_add(grace) else {
            return false;
        };
        let timer = self
            .stop
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        timer.as_mut().poll(cx).is_ready()
    }
}

/// How a generator ended: its result, or the panic it raised.
type Outcome<E> = Result<Result<(), E>, Box<dyn Any + Send>>;

/// Polls the generator, catching a panic.
fn poll_generator<G, E>(generator: &mut Pin<Box<G>>, cx: &mut Context<'_>) -> Poll<Outcome<E>>
where
    G: Future<Output = Result<(), E>>,
{
    match catch_unwind(AssertUnwindSafe(|| generator.as_mut().poll(cx))) {
        Ok(Poll::Pending) => Poll::Pending,
        Ok(Poll::Ready(result)) => Poll::Ready(Ok(result)),
        Err(panic) => Poll::Ready(Err(panic)),
    }
}

/// Records how the generator ended: a success finishes the stream once its sender is gone too
/// (it completes once the consumer has taken everything), an error or a panic ends it.
fn end_with<T: Chunk, E: Into<BoxError>>(buffer: &Buffer<T>, outcome: Outcome<E>) {
    match outcome {
        Ok(Ok(())) => buffer.generator_returned(),
        Ok(Err(error)) => {
            buffer.end(EndReason::GeneratorError, Some(error.into()));
        }
        Err(panic) => {
            buffer.end(EndReason::GeneratorPanic, Some(panic_message(panic)));
        }
    }
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
