//! Configuring a gate and starting its generator.

use std::convert::Infallible;
use std::fmt;
use std::future::{Future, Pending, poll_fn};
use std::pin::pin;
use std::time::Duration;

use futures_core::Stream;
use tokio_util::sync::CancellationToken;

use super::buffer::{Buffer, Config};
use super::consumer::Consumer;
use super::error::BoxError;
use super::group::Group;
use super::handle::GateHandle;
use super::policy::Policy;
use super::release::{Release, ReleaseHook};
use super::run::drive;
use super::sender::Sender;
use super::stats::GateStats;
use crate::chunk::Chunk;
use crate::end::EndReason;
use crate::sync::Arc;

/// The default event bound: 64 events.
pub const DEFAULT_MAX_EVENTS: usize = 64;
/// The default byte bound: 64 KiB.
pub const DEFAULT_MAX_BYTES: usize = 64 * 1024;
/// The default time an async release hook may take: 10 seconds.
pub const DEFAULT_RELEASE_TIMEOUT: Duration = Duration::from_secs(10);
/// The default stop grace of a [`Gate::channel`] gate: how long its release waits for the
/// engine to let go of the sender after an early end.
const DEFAULT_CHANNEL_STOP_GRACE: Duration = Duration::from_secs(10);

/// Configures one gated stream and starts its generator.
///
/// Defaults: [`DEFAULT_MAX_EVENTS`] events, [`DEFAULT_MAX_BYTES`] bytes,
/// [`Policy::backpressure`] (a generator may be paused at most
/// [`DEFAULT_MAX_PAUSE`](crate::DEFAULT_MAX_PAUSE)), ids from 0, no stop grace (an early end
/// drops the generator at once), no release hook, no group.
///
/// The policy's clock, the stop grace and an async hook's time limit use tokio's timer: the
/// runtime needs it enabled (`#[tokio::main]` and `Builder::enable_all` do). The default
/// policy has a pause limit, so on a runtime built without `enable_time` the gate's task
/// panics with tokio's "timers are disabled" message the first time a consumer falls behind;
/// give such a runtime `Policy::backpressure().max_pause(None)`.
///
/// Two shapes:
/// - [`spawn`](Gate::spawn) (and [`stream`](Gate::stream), [`try_stream`](Gate::try_stream)):
///   the gate's task owns and runs one generator;
/// - [`channel`](Gate::channel): an engine loop that feeds many streams keeps the
///   [`Sender`] and never awaits any one stream; the gate's small task keeps the slow-consumer
///   clock and runs the release.
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
///     .stop_grace(Duration::from_millis(50))
///     .on_release(|reason, stats| {
///         println!("stream ended: {reason}, {} chunks wasted; free its KV blocks here", stats.chunks_after_end)
///     })
///     .spawn(|cancel, mut tx| async move {
///         for i in 0..3 {
///             if cancel.is_cancelled() {
///                 break; // asked to stop: finish the step, return
///             }
///             tx.send(format!("t{i} ")).await?;
///         }
///         Ok::<_, streamgate::SendError<String>>(())
///     });
/// # drop(consumer);
/// # }
/// ```
pub struct Gate {
    max_events: usize,
    max_bytes: usize,
    policy: Policy,
    stamp: bool,
    first_id: u64,
    /// `None`: the shape's default (0 for a spawned generator, 10 s for a channel).
    stop_grace: Option<Duration>,
    release_timeout: Duration,
    on_release: Option<ReleaseHook>,
    group: Option<Group>,
}

impl Gate {
    /// A gate with the default bounds and policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::{Gate, SendError};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let mut consumer = Gate::new().spawn(|_, mut tx| async move {
    ///     tx.send("hello".to_owned()).await?;
    ///     Ok::<_, SendError<String>>(())
    /// });
    /// let event = consumer.next().await.unwrap().unwrap();
    /// assert_eq!((event.id(), event.chunk().as_str()), (0, "hello"));
    /// assert!(consumer.next().await.is_none(), "completed");
    /// # }
    /// ```
    pub fn new() -> Self {
        Gate {
            max_events: DEFAULT_MAX_EVENTS,
            max_bytes: DEFAULT_MAX_BYTES,
            policy: Policy::default(),
            stamp: false,
            first_id: 0,
            stop_grace: None,
            release_timeout: DEFAULT_RELEASE_TIMEOUT,
            on_release: None,
            group: None,
        }
    }

    /// The most events the buffer holds. 0 is taken as 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::{Gate, TrySendError};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut tx, _consumer) = Gate::new().max_events(2).channel::<String>();
    /// tx.try_send("a".to_owned()).unwrap();
    /// tx.try_send("b".to_owned()).unwrap();
    /// assert!(matches!(tx.try_send("c".to_owned()), Err(TrySendError::Full(_))));
    /// # }
    /// ```
    pub fn max_events(mut self, max_events: usize) -> Self {
        self.max_events = max_events.max(1);
        self
    }

    /// The most bytes (by [`Chunk::byte_len`]) the buffer holds. One chunk larger than this is
    /// still admitted into an empty buffer, so an oversized chunk never deadlocks the stream.
    /// 0 is taken as 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::{Gate, TrySendError};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut tx, _consumer) = Gate::new().max_bytes(8).channel::<String>();
    /// // Larger than the bound, but the buffer was empty: admitted alone.
    /// tx.try_send("0123456789".to_owned()).unwrap();
    /// assert!(matches!(tx.try_send("x".to_owned()), Err(TrySendError::Full(_))));
    /// # }
    /// ```
    pub fn max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes.max(1);
        self
    }

    /// What to do when the consumer does not keep up.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::{Gate, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut tx, mut consumer) = Gate::new()
    ///     .max_events(1)
    ///     .policy(Policy::coalesce())
    ///     .channel::<String>();
    /// tx.try_send("Hel".to_owned()).unwrap();
    /// tx.try_send("lo".to_owned()).unwrap(); // merged into the event that waits
    /// tx.finish();
    /// let event = consumer.next().await.unwrap().unwrap();
    /// assert_eq!((event.chunk().as_str(), event.ids()), ("Hello", 0..=1));
    /// # }
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Stamps each event with the time it entered the buffer
    /// ([`Event::enqueued_at`](crate::Event::enqueued_at)), so a probe on the consumer measures
    /// how long events waited in the gate. Off by default: it costs a clock read per send.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::Gate;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut tx, mut consumer) = Gate::new().stamp_events(true).channel::<String>();
    /// tx.try_send("a".to_owned()).unwrap();
    /// let event = consumer.next().await.unwrap().unwrap();
    /// let waited = event.enqueued_at().expect("stamped").elapsed();
    /// # let _ = waited;
    /// # }
    /// ```
    pub fn stamp_events(mut self, stamp: bool) -> Self {
        self.stamp = stamp;
        self
    }

    /// The id of the first chunk (0 by default). A gateway re-gating an upstream stream that
    /// starts at id `n` (a resumed stream) starts here, so every hop numbers each event the
    /// same way. Ids do not wrap: past `u64::MAX` every chunk gets `u64::MAX`.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::Gate;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// // A gateway re-gating an upstream stream that a client resumed after event 41.
    /// let (mut tx, mut consumer) = Gate::new().first_id(42).channel::<String>();
    /// tx.try_send("t42 ".to_owned()).unwrap();
    /// assert_eq!(consumer.next().await.unwrap().unwrap().id(), 42);
    /// # }
    /// ```
    pub fn first_id(mut self, id: u64) -> Self {
        self.first_id = id;
        self
    }

    /// How long a generator may go on after an early end (the consumer gone, a slow-consumer
    /// end, a cancel, a shutdown) before it is dropped: the two-phase stop.
    ///
    /// At the end the generator's `CancellationToken` is cancelled (the *stop*) and its next
    /// send fails: a generator that checks either can finish its step (a `spawn_blocking`
    /// decode step, an engine call in flight) and return. If it is still running when the
    /// grace is over, it is dropped (the *kill*); a generator that ignores the failed send is
    /// parked in its next one until then. The release waits for either, so the hook runs after
    /// the work stopped; [`GateStats::end_to_stop`] and [`GateStats::stop_forced`] say how it
    /// went.
    ///
    /// For a spawned generator the default, zero, drops it at once. For a
    /// [`channel`](Gate::channel) gate, the work has stopped when the engine drops the
    /// [`Sender`] (or calls [`finish`](Sender::finish)/[`abort`](Sender::abort)), which an
    /// engine does when a send tells it the stream ended; the release waits for it at most
    /// this long, 10 s by default, so an engine's KV blocks are not counted free while it
    /// still decodes for the stream. Any duration is accepted; one too long to represent waits
    /// for ever.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::{Gate, SendError};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let consumer = Gate::new()
    ///     .stop_grace(Duration::from_secs(1))
    ///     .spawn(|cancel, mut tx| async move {
    ///         loop {
    ///             // One decode step: it finishes before the stop is looked at.
    ///             tokio::time::sleep(Duration::from_millis(10)).await;
    ///             if cancel.is_cancelled() {
    ///                 return Ok::<(), SendError<String>>(());
    ///             }
    ///             tx.send("t ".to_owned()).await?;
    ///         }
    ///     });
    /// let handle = consumer.handle();
    /// drop(consumer); // the client left
    /// handle.released().await;
    /// assert!(!handle.stats().stop_forced, "it finished its step and returned");
    /// # }
    /// ```
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = Some(grace);
        self
    }

    /// A hook run exactly once per stream, after the generator's work has stopped, with the
    /// reason that stands and the final counters: where an engine frees the stream's KV blocks
    /// and counts what the stream cost.
    ///
    /// It runs on every end: completion, generator error or panic, consumer gone, slow-consumer
    /// end, cancellation, shutdown, and the runtime shutting down. The counters are those at
    /// the release: after an early end a consumer that is still there may yet read the events
    /// that were waiting (the hook counts them in `events_undelivered`). When a runtime shuts
    /// down with the consumer's task on it, whichever task it drops first decides the reason:
    /// `Shutdown`, or `ConsumerGone` if the consumer went first (shut streams down through a
    /// [`Group`] first to report them as `Shutdown`). It runs on the gate's task,
    /// so it should be quick and must not block; see
    /// [`on_release_async`](Gate::on_release_async) for work that awaits.
    /// [`GateHandle::released`] completes after it has returned.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use futures_util::StreamExt;
    /// use streamgate::{EndReason, Gate, SendError};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (released, calls) = mpsc::channel();
    /// let mut consumer = Gate::new()
    ///     .on_release(move |reason, stats| {
    ///         // Free the stream's KV blocks here.
    ///         let _ = released.send((reason, stats.events_delivered));
    ///     })
    ///     .spawn(|_, mut tx| async move {
    ///         tx.send("a".to_owned()).await?;
    ///         tx.send("b".to_owned()).await?;
    ///         Ok::<_, SendError<String>>(())
    ///     });
    /// while consumer.next().await.is_some() {}
    /// consumer.handle().released().await;
    /// assert_eq!(calls.recv().unwrap(), (EndReason::Completed, 2));
    /// # }
    /// ```
    pub fn on_release<F>(mut self, hook: F) -> Self
    where
        F: FnOnce(EndReason, GateStats) + Send + 'static,
    {
        self.on_release = Some(ReleaseHook::Sync(Box::new(hook)));
        self
    }

    /// Like [`on_release`](Gate::on_release), for a hook that awaits (an engine's
    /// `abort(id).await`). The stream counts as released once the future has completed or
    /// the [`release_timeout`](Gate::release_timeout) has cut it off
    /// ([`GateStats::release_timed_out`]).
    ///
    /// If the runtime shuts down before the release, no runtime is left to await it on: the
    /// future is polled once, so it runs up to its first await.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::{Gate, SendError, Sender};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let consumer = Gate::new()
    ///     .on_release_async(|reason, _stats| async move {
    ///         // An engine's `abort(request_id).await`.
    ///         tokio::task::yield_now().await;
    ///         println!("freed after {reason}");
    ///     })
    ///     .spawn(|cancel, _tx: Sender<String>| async move {
    ///         cancel.cancelled().await;
    ///         Ok::<_, SendError<String>>(())
    ///     });
    /// let handle = consumer.handle();
    /// drop(consumer);
    /// handle.released().await; // after the hook's future completed
    /// assert!(!handle.stats().release_timed_out);
    /// # }
    /// ```
    pub fn on_release_async<F, Fut>(mut self, hook: F) -> Self
    where
        F: FnOnce(EndReason, GateStats) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.on_release = Some(ReleaseHook::Async(Box::new(move |reason, stats| {
            Box::pin(hook(reason, stats))
        })));
        self
    }

    /// How long an async release hook may take ([`DEFAULT_RELEASE_TIMEOUT`] by default).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::Gate;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, consumer) = Gate::new()
    ///     // An engine that never answers its abort.
    ///     .on_release_async(|_, _| std::future::pending::<()>())
    ///     .release_timeout(Duration::from_millis(10))
    ///     .channel::<String>();
    /// let handle = consumer.handle();
    /// tx.finish();
    /// drop(consumer);
    /// handle.released().await;
    /// assert!(handle.stats().release_timed_out);
    /// # }
    /// ```
    pub fn release_timeout(mut self, timeout: Duration) -> Self {
        self.release_timeout = timeout;
        self
    }

    /// Makes the stream a member of `group`: it ends at the group's
    /// [`shutdown`](Group::shutdown) and counts against its byte budget. A gate started after
    /// the shutdown began ends at once, as [`EndReason::Shutdown`].
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::{Gate, Group};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let group = Group::with_budget(16 * 1024 * 1024);
    /// let (tx, _consumer) = Gate::new().group(&group).channel::<String>();
    /// assert_eq!(group.stats().gates, 1);
    /// # drop(tx);
    /// # }
    /// ```
    pub fn group(mut self, group: &Group) -> Self {
        self.group = Some(group.clone());
        self
    }

    /// Spawns `generator` on the current tokio runtime and returns the consumer half.
    ///
    /// The generator is a closure given the stream's [`CancellationToken`] (cancelled when the
    /// stream ends) and the [`Sender`] for its chunks; its future owns whatever the stream
    /// holds. Returning `Ok` finishes the stream: it completes once the consumer has taken
    /// every event. A generator that hands its `Sender` to another task and returns finishes
    /// the stream when that sender is dropped (or [`finish`](Sender::finish)ed) instead. An
    /// `Err` ends it as [`GeneratorError`](EndReason::GeneratorError); a panic is caught and
    /// ends it as [`GeneratorPanic`](EndReason::GeneratorPanic).
    ///
    /// # Panics
    ///
    /// If called outside a tokio runtime, as [`tokio::spawn`] does.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::{BoxError, EndReason, Gate};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let mut consumer = Gate::new().spawn(|cancel, mut tx| async move {
    ///     for token in ["Hel", "lo"] {
    ///         if cancel.is_cancelled() {
    ///             return Ok(()); // asked to stop: finish the step, return
    ///         }
    ///         tx.send(token.to_owned()).await?;
    ///     }
    ///     Err::<(), BoxError>("the engine failed".into())
    /// });
    /// let mut text = String::new();
    /// let end = loop {
    ///     match consumer.next().await {
    ///         Some(Ok(event)) => text.push_str(event.chunk()),
    ///         Some(Err(error)) => break Some(error.reason()),
    ///         None => break None,
    ///     }
    /// };
    /// // Every chunk before the error, then the error.
    /// assert_eq!((text.as_str(), end), ("Hello", Some(EndReason::GeneratorError)));
    /// # }
    /// ```
    pub fn spawn<T, F, G, E>(self, generator: F) -> Consumer<T>
    where
        T: Chunk + Send + 'static,
        F: FnOnce(CancellationToken, Sender<T>) -> G,
        G: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let stop_grace = self.stop_grace.unwrap_or(Duration::ZERO);
        let (buffer, release, stamp) = self.start();
        let mut sender = Sender::new(buffer.clone(), stamp, true);
        if stop_grace.is_zero() {
            sender = sender.parking_at_end();
        }
        // A child: the generator cancelling its own token does not end the stream behind the
        // gate's back, while every end still reaches it.
        let generator = generator(buffer.token().child_token(), sender);
        tokio::spawn(drive(Some(generator), buffer.clone(), release, stop_grace));
        Consumer::new(buffer)
    }

    /// A gate fed from outside its task: the [`Sender`] for an engine loop that produces chunks
    /// for many streams, and the consumer half.
    ///
    /// The engine never awaits one stream: [`Sender::try_send`] hands a chunk back when the
    /// buffer is full, [`Sender::ready`] says when there is room, [`Sender::closed`] when the
    /// stream has ended, and [`Sender::finish`]/[`Sender::abort`] end it. Dropping the sender
    /// without either ends the stream as a generator error (output cut short must not look
    /// complete). The gate's own small task keeps the slow-consumer clock and runs the release
    /// once the stream has ended and the engine has dropped the sender (or the
    /// [`stop_grace`](Gate::stop_grace), 10 s by default here, ran out).
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::{Gate, TrySendError};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut tx, mut consumer) = Gate::new().max_events(2).channel::<String>();
    /// // One step of an engine loop: never waits for this stream.
    /// for token in ["a", "b", "c"] {
    ///     match tx.try_send(token.to_owned()) {
    ///         Ok(()) => {}
    ///         Err(TrySendError::Full(token)) => assert_eq!(token, "c"), // keep it for later
    ///         Err(TrySendError::Ended(_)) => return, // the client left: drop the request
    ///     }
    /// }
    /// tx.finish();
    /// assert_eq!(consumer.next().await.unwrap().unwrap().into_chunk(), "a");
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// If called outside a tokio runtime.
    pub fn channel<T>(self) -> (Sender<T>, Consumer<T>)
    where
        T: Chunk + Send + 'static,
    {
        let stop_grace = self.stop_grace.unwrap_or(DEFAULT_CHANNEL_STOP_GRACE);
        let (buffer, release, stamp) = self.start();
        let sender = Sender::new(buffer.clone(), stamp, false);
        tokio::spawn(drive(
            None::<Pending<Result<(), Infallible>>>,
            buffer.clone(),
            release,
            stop_grace,
        ));
        (sender, Consumer::new(buffer))
    }

    /// The buffer and the release of a new stream, joined to the group.
    fn start<T: Chunk + Send + 'static>(self) -> (Arc<Buffer<T>>, Release<T>, bool) {
        let config = Config {
            max_events: self.max_events,
            max_bytes: self.max_bytes,
            policy: self.policy,
            first_id: self.first_id,
            budget: self.group.as_ref().and_then(Group::shared_budget),
        };
        let buffer = Arc::new(Buffer::new(config, CancellationToken::new()));
        let membership = self.group.as_ref().and_then(|group| {
            let membership = group.join(&GateHandle::new(buffer.clone()));
            if membership.is_none() {
                buffer.end(EndReason::Shutdown, None);
            }
            membership
        });
        let release = Release::new(
            buffer.clone(),
            self.on_release,
            self.release_timeout,
            membership,
        );
        (buffer, release, self.stamp)
    }

    /// Spawns a task that forwards every chunk of `generator` through the gate; the stream
    /// finishes when `generator` does.
    ///
    /// # Panics
    ///
    /// If called outside a tokio runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::{StreamExt, stream};
    /// use streamgate::Gate;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let tokens = stream::iter(["Hel", "lo"].map(String::from));
    /// let events: Vec<_> = Gate::new().stream(tokens).collect().await;
    /// let text: String = events.into_iter().map(|e| e.unwrap().into_chunk()).collect();
    /// assert_eq!(text, "Hello");
    /// # }
    /// ```
    pub fn stream<S>(self, generator: S) -> Consumer<S::Item>
    where
        S: Stream + Send + 'static,
        S::Item: Chunk + Send + 'static,
    {
        self.spawn(|_, tx| forward(generator, tx, Ok::<_, Infallible>))
    }

    /// Like [`stream`](Gate::stream) for a generator that can fail: its first `Err` ends the
    /// stream as [`GeneratorError`](EndReason::GeneratorError), after every chunk before it.
    ///
    /// # Panics
    ///
    /// If called outside a tokio runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::{StreamExt, stream};
    /// use streamgate::{EndReason, Gate};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// // An upstream body that fails half way.
    /// let upstream = stream::iter([Ok("Hel".to_owned()), Err(std::io::Error::other("reset"))]);
    /// let mut consumer = Gate::new().try_stream(upstream);
    /// assert_eq!(consumer.next().await.unwrap().unwrap().chunk(), "Hel");
    /// let error = consumer.next().await.unwrap().unwrap_err();
    /// assert_eq!(error.reason(), EndReason::GeneratorError);
    /// # }
    /// ```
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
            .field("first_id", &self.first_id)
            .field("stop_grace", &self.stop_grace)
            .field("release_timeout", &self.release_timeout)
            .field("on_release", &self.on_release.is_some())
            .field("group", &self.group.is_some())
            .finish()
    }
}
