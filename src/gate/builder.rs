//! Configuring a gate and starting its generator.

use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::pin;

use futures_core::Stream;
use tokio_util::sync::CancellationToken;

use super::buffer::Buffer;
use super::consumer::Consumer;
use super::end::{BoxError, EndReason};
use super::policy::Policy;
use super::release::{Release, ReleaseHook};
use super::run::drive;
use super::sender::Sender;
use crate::chunk::Chunk;
use crate::sync::Arc;

/// The default event bound: 64 events.
pub const DEFAULT_MAX_EVENTS: usize = 64;
/// The default byte bound: 64 KiB.
pub const DEFAULT_MAX_BYTES: usize = 64 * 1024;

/// Configures one gated stream and starts its generator.
///
/// Defaults: [`DEFAULT_MAX_EVENTS`] events, [`DEFAULT_MAX_BYTES`] bytes,
/// [`Policy::Backpressure`] with no deadline, no release hook.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamgate::{Gate, Policy};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let consumer = Gate::new()
///     .max_events(32)
///     .max_bytes(16 * 1024)
///     .policy(Policy::disconnect(Duration::from_secs(10)))
///     .on_release(|reason| println!("stream ended: {reason}; free its KV blocks here"))
///     .spawn(|cancel, mut tx| async move {
///         for i in 0..3 {
///             if cancel.is_cancelled() || tx.send(format!("t{i} ")).await.is_err() {
///                 break;
///             }
///         }
///         Ok::<(), std::io::Error>(())
///     });
/// # drop(consumer);
/// # }
/// ```
pub struct Gate {
    max_events: usize,
    max_bytes: usize,
    policy: Policy,
    stamp: bool,
    on_release: Option<ReleaseHook>,
}

impl Gate {
    /// A gate with the default bounds and policy.
    pub fn new() -> Self {
        Gate {
            max_events: DEFAULT_MAX_EVENTS,
            max_bytes: DEFAULT_MAX_BYTES,
            policy: Policy::default(),
            stamp: false,
            on_release: None,
        }
    }

    /// The most events the buffer holds.
    ///
    /// # Panics
    ///
    /// If `max_events` is 0.
    pub fn max_events(mut self, max_events: usize) -> Self {
        assert!(max_events > 0, "a gate's event bound must be at least 1");
        self.max_events = max_events;
        self
    }

    /// The most bytes (by [`Chunk::byte_len`]) the buffer holds. One chunk larger than this is
    /// still admitted into an empty buffer, so an oversized chunk never deadlocks the stream.
    ///
    /// # Panics
    ///
    /// If `max_bytes` is 0.
    pub fn max_bytes(mut self, max_bytes: usize) -> Self {
        assert!(max_bytes > 0, "a gate's byte bound must be at least 1");
        self.max_bytes = max_bytes;
        self
    }

    /// What to do when the consumer does not keep up.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Stamps each event with the time it entered the buffer
    /// ([`Event::enqueued_at`](crate::Event::enqueued_at)), so a probe on the consumer measures
    /// how long events waited in the gate. Off by default: it costs a clock read per send.
    pub fn stamp_events(mut self, stamp: bool) -> Self {
        self.stamp = stamp;
        self
    }

    /// A hook run exactly once when the stream ends, after the generator has been dropped, with
    /// the reason that stands: where an engine frees the stream's KV blocks.
    ///
    /// It runs on every end: completion, generator error or panic, consumer dropped,
    /// slow-consumer end, cancellation, and the runtime shutting down. It runs on the gate's
    /// task, so it should be quick and must not block.
    pub fn on_release<F>(mut self, hook: F) -> Self
    where
        F: FnOnce(EndReason) + Send + 'static,
    {
        self.on_release = Some(Box::new(hook));
        self
    }

    /// Spawns `generator` on the current tokio runtime and returns the consumer half.
    ///
    /// The generator is a closure given the stream's [`CancellationToken`] (cancelled when the
    /// stream ends early) and the [`Sender`] for its chunks; its future owns whatever the
    /// stream holds. An `Err` it returns ends the stream as
    /// [`GeneratorError`](EndReason::GeneratorError); a panic is caught and ends it as
    /// [`GeneratorPanic`](EndReason::GeneratorPanic).
    ///
    /// # Panics
    ///
    /// If called outside a tokio runtime, as [`tokio::spawn`] does.
    pub fn spawn<T, F, G, E>(self, generator: F) -> Consumer<T>
    where
        T: Chunk + Send + 'static,
        F: FnOnce(CancellationToken, Sender<T>) -> G,
        G: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let buffer = Arc::new(Buffer::new(self.max_events, self.max_bytes));
        let token = CancellationToken::new();
        let sender = Sender::new(buffer.clone(), token.clone(), self.policy, self.stamp);
        let release = Release::new(buffer.clone(), token.clone(), self.on_release);
        let generator = generator(token.clone(), sender);
        tokio::spawn(drive(generator, token.clone(), release));
        Consumer::new(buffer, token)
    }

    /// Spawns a task that forwards every chunk of `generator` through the gate; the stream
    /// completes when `generator` does.
    ///
    /// # Panics
    ///
    /// If called outside a tokio runtime.
    pub fn stream<S>(self, generator: S) -> Consumer<S::Item>
    where
        S: Stream + Send + 'static,
        S::Item: Chunk + Send + 'static,
    {
        self.spawn(|_, tx| forward(generator, tx, Ok::<_, std::convert::Infallible>))
    }

    /// Like [`stream`](Gate::stream) for a generator that can fail: its first `Err` ends the
    /// stream as [`GeneratorError`](EndReason::GeneratorError), after every chunk before it.
    ///
    /// # Panics
    ///
    /// If called outside a tokio runtime.
    pub fn try_stream<S, T, E>(self, generator: S) -> Consumer<T>
    where
        S: Stream<Item = Result<T, E>> + Send + 'static,
        T: Chunk + Send + 'static,
        E: Into<BoxError> + Send + 'static,
    {
        self.spawn(|_, tx| forward(generator, tx, |item| item))
    }
}

/// Sends every item of `generator`, as `chunk` turns it into a chunk or an error, until it ends
/// or the stream does.
async fn forward<S, T, E>(
    generator: S,
    mut tx: Sender<T>,
    chunk: impl Fn(S::Item) -> Result<T, E>,
) -> Result<(), E>
where
    S: Stream,
    T: Chunk,
{
    let mut generator = pin!(generator);
    while let Some(item) = poll_fn(|cx| generator.as_mut().poll_next(cx)).await {
        if tx.send(chunk(item)?).await.is_err() {
            break;
        }
    }
    Ok(())
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new()
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("max_events", &self.max_events)
            .field("max_bytes", &self.max_bytes)
            .field("policy", &self.policy)
            .field("stamp", &self.stamp)
            .field("on_release", &self.on_release.is_some())
            .finish()
    }
}
