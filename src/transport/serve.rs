//! Serving a service over HTTP/1.1 and h2c on one [`TunedListener`], with a cap on open
//! connections and timeouts for silent, slow and idle clients.

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
// tokio's `sync` comes with hyper-util's `server-graceful` feature, which `server` enables.
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tower_service::Service;

use super::listener::TunedListener;
use super::stream::TunedStream;
use crate::BoxError;

/// The default bound of h2's send buffer per stream: the gate's default byte bound
/// ([`DEFAULT_MAX_BYTES`](crate::DEFAULT_MAX_BYTES), 64 KiB), where hyper's own default is
/// 400 KiB. What a stream's body yields that h2 cannot send yet waits here; once it is full,
/// the body is not polled, the gate fills and the slow-consumer policy sees the stopped reader.
pub const DEFAULT_H2_SEND_BUFFER: usize = crate::DEFAULT_MAX_BYTES;

/// How long the server waits before accepting again after an error of the listener as a whole
/// (out of file descriptors, say).
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The default [`Server::first_byte_timeout`]: 15 s.
///
/// A real client sends its request (or HTTP/2 preface) right after connecting. The ones that
/// connect ahead are browsers' preconnects, and Chromium drops a preconnected socket it has not
/// used within 10 s (`unused_idle_socket_timeout`): 15 s serves every socket a browser may
/// still use, and halves the 30 s an attacker's silent socket held a connection slot before.
pub const DEFAULT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(15);

/// The default [`Server::header_read_timeout`]: 10 s.
///
/// A request head is a few hundred bytes to a few KiB, which arrive in one or two round trips:
/// even an 8 KiB head over a lossy mobile link with retransmissions takes a few seconds, so
/// 10 s leaves a wide margin for real clients, and a third of hyper's 30 s default for a
/// slowloris.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The default [`Server::idle_timeout`]: 120 s.
///
/// Longer than the idle timeouts of the clients that usually keep connections to a streaming
/// server (nginx's upstream `keepalive_timeout` and AWS ALB's idle timeout, 60 s; hyper's and
/// reqwest's pool, 90 s), so that they close an idle connection first and never send a request
/// onto one the server is closing (for a `POST`, which clients do not retry, that race is a
/// failed request); short enough that idle connections give their slots back within minutes.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// Without a `RLIMIT_NOFILE` to derive it from, the default [`Server::max_connections`].
const FALLBACK_MAX_CONNECTIONS: usize = 8192;

/// The most often a connection that is busy looks whether it has become idle.
const BUSY_RECHECK: Duration = Duration::from_millis(10);

/// The first bytes of every HTTP/2 connection with prior knowledge.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Serves a tower service (an axum `Router`, say) over HTTP/1.1 and HTTP/2 on the same port:
/// each connection's protocol is read from its first bytes (h2c with prior knowledge, no TLS,
/// no `Upgrade: h2c`). HTTP/1.1 upgrades (WebSocket) are served.
///
/// Over HTTP/2 many streams share one connection, so a stream whose client stopped reading is
/// held by its flow-control window, not by the socket: once the window is used up (or, when
/// the whole connection stopped, once the stream's [send buffer](Server::h2_send_buffer) in h2
/// is full) h2 stops polling the stream's body, the gate behind it fills and its policy ends
/// it, while the other streams go on. A client's `RST_STREAM` drops the body, which cancels
/// the generator.
///
/// Every request carries its connection's [`SendQueue`](super::SendQueue) as an extension
/// (`axum::Extension<SendQueue>` in a handler): over HTTP/1.1, where a connection carries one
/// stream at a time, [`Departures`](super::Departures) records when each event left the
/// kernel. The request's version tells which (`http::Request::version`, axum's `Version`
/// extractor): over HTTP/2 the connection's bytes interleave several streams, so no
/// per-stream departure can be read from them; the stream's flow control holds a stopped
/// reader instead.
///
/// Errors never stop the server: accept errors of the listener as a whole are retried after
/// [`ACCEPT_BACKOFF`], and a connection that ends with an error ends alone. Each is given to
/// [`on_error`](Server::on_error), if set.
///
/// # Protections
///
/// A connection is *busy* from the moment its request head has been read until its response
/// body has ended or been dropped (over HTTP/2, while any stream has a request in flight), and
/// *idle* otherwise. A busy connection is never cut by the server, however long its response
/// streams: only its client, the socket's own timeouts ([`ListenOptions`](super::ListenOptions))
/// and the gate's policy end it. Against clients that hold connections without using them:
///
/// - a connection that sends nothing is closed after
///   [`first_byte_timeout`](Server::first_byte_timeout) (default 15 s);
/// - a client that has begun a request head must finish it within
///   [`header_read_timeout`](Server::header_read_timeout) (default 10 s), counted from its
///   first byte however slowly it trickles the rest (a slowloris is closed then);
/// - an idle connection is closed after [`idle_timeout`](Server::idle_timeout) (default
///   120 s): between requests over HTTP/1.1, without streams over HTTP/2 (with a `GOAWAY`);
/// - at most [`max_connections`](Server::max_connections) connections are open (by default
///   three quarters of the process's file descriptor limit): at the cap the server stops
///   accepting, new connections wait in the listen backlog until one closes, and the
///   descriptors left serve the open connections, the upstreams and the files.
///
/// A request's body is the handler's to bound: a client that sends its head on time and then
/// trickles the body keeps its connection busy.
///
/// # Examples
///
#[cfg_attr(feature = "axum", doc = "```no_run")]
#[cfg_attr(not(feature = "axum"), doc = "```ignore")]
/// use axum::{Router, routing::get};
/// use streamgate::transport::{ListenOptions, Server, TunedListener};
///
/// # #[tokio::main]
/// # async fn main() -> std::io::Result<()> {
/// let app = Router::new().route("/", get(|| async { "hi" }));
/// let addr = "127.0.0.1:8000".parse().unwrap();
/// let listener = TunedListener::bind(addr, ListenOptions::default())?;
/// Server::new()
///     .on_error(|error| eprintln!("server: {error}"))
///     .serve(listener, app, async {
///         let _ = tokio::signal::ctrl_c().await;
///     })
///     .await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Server {
    builder: Builder<TokioExecutor>,
    limits: Limits,
    max_connections: Option<usize>,
    on_error: Arc<dyn Fn(ServeError) + Send + Sync>,
}

/// The timeouts every connection gets.
#[derive(Debug, Clone, Copy)]
struct Limits {
    first_byte: Duration,
    header_read: Duration,
    idle: Duration,
}

impl Server {
    /// A server with h2's send buffer bounded at [`DEFAULT_H2_SEND_BUFFER`], and the default
    /// [protections](Server#protections).
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::transport::Server;
    ///
    /// let server = Server::new();
    /// # let _ = server;
    /// ```
    pub fn new() -> Self {
        let mut builder = Builder::new(TokioExecutor::new());
        // The server times request heads itself: hyper's timer also runs while a keep-alive
        // connection waits for its next request, which `idle_timeout` governs here.
        builder.http1().header_read_timeout(None);
        builder.http2().max_send_buf_size(DEFAULT_H2_SEND_BUFFER);
        Server {
            builder,
            limits: Limits {
                first_byte: DEFAULT_FIRST_BYTE_TIMEOUT,
                header_read: DEFAULT_HEADER_READ_TIMEOUT,
                idle: DEFAULT_IDLE_TIMEOUT,
            },
            max_connections: None,
            on_error: Arc::new(|_| {}),
        }
    }

    /// The most a stream may have buffered in h2 beyond what its flow-control windows let it
    /// send, in bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::transport::Server;
    ///
    /// let server = Server::new().h2_send_buffer(16 * 1024);
    /// # let _ = server;
    /// ```
    pub fn h2_send_buffer(mut self, bytes: usize) -> Self {
        self.builder.http2().max_send_buf_size(bytes);
        self
    }

    /// How long a new connection may take to send its first byte before it is closed, without
    /// an error reported. Default [`DEFAULT_FIRST_BYTE_TIMEOUT`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::transport::Server;
    ///
    /// let server = Server::new().first_byte_timeout(Duration::from_secs(5));
    /// # let _ = server;
    /// ```
    pub fn first_byte_timeout(mut self, timeout: Duration) -> Self {
        self.limits.first_byte = timeout;
        self
    }

    /// How long a client may take to send a whole request head, counted from the first byte
    /// of the head (of the connection's first bytes, for the first request, which also covers
    /// the detection of the protocol). A client that has not finished its head by then is
    /// closed, however it trickles (a slowloris), and reported as [`ServeError::HeaderTimeout`].
    /// Default [`DEFAULT_HEADER_READ_TIMEOUT`].
    ///
    /// It applies to HTTP/1.1, and to the start of a connection until the HTTP/2 preface has
    /// arrived. HTTP/2 has no request head to time: a connection without streams is idle, and
    /// [`idle_timeout`](Self::idle_timeout) closes it, however slowly its client sends a
    /// header block.
    ///
    /// The wait for the next request on a keep-alive connection is *not* counted: that is
    /// [`idle_timeout`](Self::idle_timeout)'s (as Go's `ReadHeaderTimeout` and Envoy's
    /// `request_headers_timeout`). hyper's own `header_read_timeout` (hyper 1.12, turned off
    /// here) restarts when a response is finished, before the next request's first byte, so it
    /// would close every keep-alive connection idle that long.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::transport::Server;
    ///
    /// let server = Server::new().header_read_timeout(Duration::from_secs(5));
    /// # let _ = server;
    /// ```
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.limits.header_read = timeout;
        self
    }

    /// How long a connection may stay idle, with no request in flight, before it is closed:
    /// over HTTP/1.1 the wait for the next request on a keep-alive connection (closed at
    /// once), over HTTP/2 a connection without streams (closed with a `GOAWAY`, which lets a
    /// stream that crossed it finish). Default [`DEFAULT_IDLE_TIMEOUT`].
    ///
    /// A request is in flight from the moment its head has been read until its response body
    /// has ended or been dropped, so a connection carrying a response, an SSE stream of hours
    /// included, or waiting for a slow handler is never idle. Nothing is done per event: the
    /// connection looks at its state once per `timeout` while busy.
    ///
    /// An HTTP/2 client that does not answer the `GOAWAY`'s `PING` (which hyper waits for before
    /// closing) is dropped once it has had [`header_read_timeout`](Self::header_read_timeout)
    /// to answer and no stream is open; the same holds at shutdown.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::transport::Server;
    ///
    /// let server = Server::new().idle_timeout(Duration::from_secs(300));
    /// # let _ = server;
    /// ```
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.limits.idle = timeout;
        self
    }

    /// The most connections open at once (0 is taken as 1). At the cap the server stops
    /// accepting: new connections wait in the listen backlog (see
    /// [`ListenOptions::backlog`](super::ListenOptions::backlog)) and are accepted as open ones
    /// close. Reaching the cap is reported once, as [`ServeError::ConnectionLimit`], until a
    /// tenth of the slots are free again. An upgraded connection (WebSocket) keeps its slot
    /// until its socket closes.
    ///
    /// By default the cap is read from the process's soft `RLIMIT_NOFILE` when
    /// [`serve`](Self::serve) starts: the limit minus a quarter of it, and at least 64 left for
    /// upstreams, files and the runtime (a limit of 256 allows 192 connections, 1,024 allows 768,
    /// 65,536 allows 49,152). Where there is no such limit, 8,192.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::transport::Server;
    ///
    /// let server = Server::new().max_connections(10_000);
    /// # let _ = server;
    /// ```
    pub fn max_connections(mut self, connections: usize) -> Self {
        self.max_connections = Some(connections);
        self
    }

    /// Calls `report` with every error met while serving (none stops the server). A client
    /// that leaves in the middle of a response (an SSE reader closing its connection, as they
    /// do) is not an error: it is not reported.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::transport::{ServeError, Server};
    ///
    /// let server = Server::new().on_error(|error| match error {
    ///     ServeError::ConnectionLimit { limit } => eprintln!("server full: {limit} connections"),
    ///     error => eprintln!("server: {error}"),
    /// });
    /// # let _ = server;
    /// ```
    pub fn on_error(mut self, report: impl Fn(ServeError) + Send + Sync + 'static) -> Self {
        self.on_error = Arc::new(report);
        self
    }

    /// Accepts connections on `listener` and serves `service` on each until `shutdown`
    /// completes; then stops accepting, lets every connection finish its open requests (HTTP/2
    /// clients get a `GOAWAY`) and returns once all have closed. To bound that wait, end the
    /// open streams first (`Group::shutdown`) or race this future against a timer (dropping it
    /// stops accepting, but the connections it started go on until they close).
    ///
    /// # Examples
    ///
    /// See [`Server`].
    pub async fn serve<S, B>(
        self,
        listener: TunedListener,
        service: S,
        shutdown: impl Future<Output = ()>,
    ) where
        S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        let limit = self
            .max_connections
            .unwrap_or_else(default_max_connections)
            .clamp(1, Semaphore::MAX_PERMITS);
        let slots = Arc::new(Semaphore::new(limit));
        let mut at_limit = false;
        // Every connection's task holds a sender: once none is left, all have ended.
        let (open, mut ended) = mpsc::channel::<()>(1);
        // Tells the connections to close (gracefully) at shutdown.
        let stopping = CancellationToken::new();
        let mut shutdown = pin!(shutdown);
        loop {
            // A slot, then the next connection: at the cap, connections wait in the listen
            // backlog, not in this process. The listener skips one connection's failures
            // itself: what is left concerns the listener (out of file descriptors, say) and is
            // reported, and the next try waits a little instead of spinning.
            let mut next = pin!(async {
                let free = slots.available_permits();
                if free == 0 && !at_limit {
                    at_limit = true;
                    (self.on_error)(ServeError::ConnectionLimit { limit });
                } else if at_limit && free.saturating_mul(10) >= limit {
                    at_limit = false;
                }
                let slot = slots.clone().acquire_owned().await.ok()?;
                loop {
                    match listener.accept().await {
                        Ok((stream, peer)) => return Some((slot, stream, peer)),
                        Err(error) => {
                            (self.on_error)(ServeError::Accept(error));
                            tokio::time::sleep(ACCEPT_BACKOFF).await;
                        }
                    }
                }
            });
            let accepted = poll_fn(|cx| match shutdown.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(None),
                Poll::Pending => next.as_mut().poll(cx),
            })
            .await;
            let Some((slot, stream, peer)) = accepted else {
                break;
            };
            // Each request carries its connection's send queue (for `Departures`), and counts
            // as in flight until its response body is dropped.
            let activity = Arc::new(Activity::new());
            let queue = stream.send_queue();
            let service = TowerToHyperService::new(service.clone());
            let requests = activity.clone();
            let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
                request.extensions_mut().insert(queue.clone());
                let busy = Busy::begin(&requests);
                let response = hyper::service::Service::call(&service, request);
                async move {
                    let response = response.await?;
                    Ok::<_, S::Error>(response.map(|body| InFlight { body, _busy: busy }))
                }
            });
            let io = Watched {
                stream,
                activity: activity.clone(),
                preface: 0,
                _slot: slot,
            };
            let (builder, limits) = (self.builder.clone(), self.limits);
            let (on_error, stopping, open) =
                (self.on_error.clone(), stopping.clone(), open.clone());
            tokio::spawn(async move {
                let _open = open;
                // The protocol is read from the first bytes, and the other timeouts start
                // after it: a connection that sends nothing is closed after the first byte
                // timeout, or at shutdown.
                let mut first = [0u8; 1];
                let first =
                    tokio::time::timeout(limits.first_byte, io.stream.get_ref().peek(&mut first));
                if !matches!(stopping.run_until_cancelled(first).await, Some(Ok(Ok(1..)))) {
                    return;
                }
                let connection = builder
                    .serve_connection_with_upgrades(TokioIo::new(io), service)
                    .into_owned();
                let connection = pin!(connection);
                let ended = drive(
                    connection,
                    |connection| connection.graceful_shutdown(),
                    &activity,
                    limits,
                    &stopping,
                );
                match ended.await {
                    Ended::Closed(Err(error)) if !is_client_gone(&*error) => {
                        on_error(ServeError::Connection { peer, error });
                    }
                    Ended::HeaderTimeout => on_error(ServeError::HeaderTimeout { peer }),
                    Ended::Closed(_) | Ended::Unanswered => {}
                }
            });
        }
        drop(listener);
        stopping.cancel();
        drop(open);
        let _ = ended.recv().await;
    }
}

impl Default for Server {
    fn default() -> Self {
        Server::new()
    }
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("first_byte_timeout", &self.limits.first_byte)
            .field("header_read_timeout", &self.limits.header_read)
            .field("idle_timeout", &self.limits.idle)
            .field("max_connections", &self.max_connections)
            .field("builder", &self.builder)
            .finish_non_exhaustive()
    }
}

/// How a connection's task ended.
enum Ended {
    /// hyper's connection finished, with what it returned.
    Closed(Result<(), BoxError>),
    /// A request head was not complete in time: the connection was dropped.
    HeaderTimeout,
    /// Asked to close, the client did not let the connection finish: it was dropped once no
    /// request was in flight.
    Unanswered,
}

/// Drives one connection to its end, closing it when it is idle too long, when a request head
/// takes too long, or at shutdown. `graceful` asks hyper to close the connection once its open
/// requests are done.
///
/// Per wake-up this costs a poll of the shutdown signal, an atomic load and a poll of the
/// timer, which is reset only when the connection's state asks for another deadline: when a
/// request head begins, or once per `idle` (at most) while the connection is busy.
async fn drive<C>(
    mut connection: Pin<&mut C>,
    graceful: impl Fn(Pin<&mut C>),
    activity: &Activity,
    limits: Limits,
    stopping: &CancellationToken,
) -> Ended
where
    C: Future,
    C::Output: Into<Result<(), BoxError>>,
{
    let mut stop = pin!(stopping.cancelled());
    let mut timer = pin!(tokio::time::sleep_until(later(activity.start, limits.idle)));
    // When the connection was asked to close, if it was.
    let mut closing: Option<Instant> = None;
    // The request head whose deadline the timer took into account.
    let mut head_seen = NO_HEAD;
    poll_fn(|cx| {
        loop {
            if let Poll::Ready(result) = connection.as_mut().poll(cx) {
                return Poll::Ready(Ended::Closed(result.into()));
            }
            if closing.is_none() && stop.as_mut().poll(cx).is_ready() {
                let now = Instant::now();
                closing = Some(now);
                graceful(connection.as_mut());
                timer.as_mut().reset(later(now, limits.header_read));
                continue;
            }
            // A head that began during this poll may be due before the timer.
            let head = activity.head.load(Ordering::Relaxed);
            if head != head_seen {
                head_seen = head;
                if closing.is_none() && head != NO_HEAD {
                    let due = later(activity.at(head), limits.header_read);
                    if due < timer.deadline() {
                        timer.as_mut().reset(due);
                    }
                }
            }
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let now = Instant::now();
            match activity.verdict(now, limits, closing) {
                Verdict::Wait(at) => reset(timer.as_mut(), at, now),
                Verdict::Idle => {
                    closing = Some(now);
                    graceful(connection.as_mut());
                    timer.as_mut().reset(later(now, limits.header_read));
                }
                Verdict::HeaderTimeout => return Poll::Ready(Ended::HeaderTimeout),
                Verdict::Unanswered => return Poll::Ready(Ended::Unanswered),
            }
        }
    })
    .await
}

/// Resets `timer` to `at`, or a little after `now` if `at` is not later (so a zero timeout
/// does not spin).
fn reset(timer: Pin<&mut Sleep>, at: Instant, now: Instant) {
    timer.reset(at.max(later(now, Duration::from_millis(1))));
}

/// `base + duration`, or `base` plus about 30 years where that overflows.
fn later(base: Instant, duration: Duration) -> Instant {
    base.checked_add(duration)
        .or_else(|| base.checked_add(Duration::from_secs(30 * 365 * 86_400)))
        .unwrap_or(base)
}

/// `head` when no request head has begun.
const NO_HEAD: u64 = u64::MAX;

/// What a connection's timer finds when it fires.
enum Verdict {
    /// Nothing is due before `at`.
    Wait(Instant),
    /// Idle for the idle timeout: close gracefully.
    Idle,
    /// A request head took too long: drop the connection.
    HeaderTimeout,
    /// Asked to close, the connection is still open with nothing in flight: drop it.
    Unanswered,
}

/// What a connection is doing, shared by its task, its socket and its requests' bodies (which
/// may be polled on other tasks, over HTTP/2). Times are nanoseconds since `start`.
#[derive(Debug)]
struct Activity {
    /// When the connection was accepted.
    start: Instant,
    /// Requests whose response body has not been dropped.
    in_flight: AtomicUsize,
    /// When a request last left, or `start`.
    idle_since: AtomicU64,
    /// When the first byte of the request head being read arrived, or [`NO_HEAD`]. Written
    /// on the connection's task only (by its socket and at each request's start).
    head: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity {
            start: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head: AtomicU64::new(NO_HEAD),
        }
    }

    fn now(&self) -> u64 {
        let elapsed = self.start.elapsed().as_nanos();
        // `NO_HEAD` is never a time: 584 years.
        u64::try_from(elapsed)
            .unwrap_or(NO_HEAD - 1)
            .min(NO_HEAD - 1)
    }

    fn at(&self, nanos: u64) -> Instant {
        later(self.start, Duration::from_nanos(nanos))
    }

    fn verdict(&self, now: Instant, limits: Limits, closing: Option<Instant>) -> Verdict {
        // Acquire: the `idle_since` stored before the last request's release is seen.
        let busy = self.in_flight.load(Ordering::Acquire) > 0;
        if let Some(since) = closing {
            // A request in flight is never cut: look again later.
            let due = later(since, limits.header_read);
            return match (busy, due <= now) {
                (false, true) => Verdict::Unanswered,
                (true, true) => Verdict::Wait(later(now, limits.header_read.max(BUSY_RECHECK))),
                (_, false) => Verdict::Wait(due),
            };
        }
        if busy {
            // Once a request leaves, the idle deadline counts from then: looking again after
            // `idle` is early enough to close on time.
            return Verdict::Wait(later(now, limits.idle.max(BUSY_RECHECK)));
        }
        let head = self.head.load(Ordering::Relaxed);
        if head != NO_HEAD {
            let due = later(self.at(head), limits.header_read);
            return if due <= now {
                Verdict::HeaderTimeout
            } else {
                Verdict::Wait(due)
            };
        }
        let due = later(
            self.at(self.idle_since.load(Ordering::Relaxed)),
            limits.idle,
        );
        if due <= now {
            Verdict::Idle
        } else {
            Verdict::Wait(due)
        }
    }
}

/// One request in flight on a connection, from the moment its head was read until its response
/// body is dropped (or its handler's future, if it never answered).
#[derive(Debug)]
struct Busy(Arc<Activity>);

impl Busy {
    fn begin(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        // The head is read: the next one's time starts with its first byte.
        activity.head.store(NO_HEAD, Ordering::Relaxed);
        Busy(activity.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let activity = &self.0;
        // Stored before the release, so whoever sees the count at zero sees this time.
        activity
            .idle_since
            .fetch_max(activity.now(), Ordering::Relaxed);
        activity.in_flight.fetch_sub(1, Ordering::Release);
    }
}

pin_project! {
    /// A response body that keeps its request in flight until it is dropped.
    struct InFlight<B> {
        #[pin]
        body: B,
        _busy: Busy,
    }
}

impl<B: http_body::Body> http_body::Body for InFlight<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// An accepted socket that notes when a request head begins, and holds its connection's slot
/// until it closes (an upgraded connection's socket included).
#[derive(Debug)]
struct Watched {
    stream: TunedStream,
    activity: Arc<Activity>,
    /// How many bytes of [`H2_PREFACE`] the connection's first bytes matched: all of it for
    /// HTTP/2, [`HTTP1`] once one differed.
    preface: usize,
    _slot: OwnedSemaphorePermit,
}

/// [`Watched::preface`] once the connection is known to speak HTTP/1.
const HTTP1: usize = usize::MAX;

impl Watched {
    /// Bytes arrived: while no request is in flight, they begin a request head (over HTTP/1,
    /// or before the protocol is known).
    fn received(&mut self, bytes: &[u8]) {
        if self.preface < H2_PREFACE.len() {
            let expected = &H2_PREFACE[self.preface..];
            let n = bytes.len().min(expected.len());
            if bytes[..n] == expected[..n] {
                self.preface += n;
                if self.preface == H2_PREFACE.len() {
                    // HTTP/2: no head to time, the idle timeout takes over.
                    self.activity.head.store(NO_HEAD, Ordering::Relaxed);
                    return;
                }
            } else {
                self.preface = HTTP1;
            }
        } else if self.preface == H2_PREFACE.len() {
            return;
        }
        let activity = &self.activity;
        if activity.in_flight.load(Ordering::Relaxed) == 0
            && activity.head.load(Ordering::Relaxed) == NO_HEAD
        {
            activity.head.store(activity.now(), Ordering::Relaxed);
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.stream).poll_read(cx, buf))?;
        if this.preface != H2_PREFACE.len() && buf.filled().len() > before {
            this.received(&buf.filled()[before..]);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// The default cap on open connections, [`Server::max_connections`]'s when none is given: the
/// process's soft `RLIMIT_NOFILE` minus a quarter of it, and at least 64 left for everything
/// else (a limit of 256 allows 192 connections, 1,024 allows 768); 8,192 where there is no
/// such limit. Read anew at each call.
///
/// A server that opens a descriptor of its own per connection (a proxy's upstream socket) can
/// use a share of it: half, for one each.
///
/// # Examples
///
/// ```
/// use streamgate::transport::{Server, default_max_connections};
///
/// // A proxy: every connection also holds one upstream socket.
/// let server = Server::new().max_connections((default_max_connections() / 2).max(1));
/// # let _ = server;
/// ```
pub fn default_max_connections() -> usize {
    soft_descriptor_limit().map_or(FALLBACK_MAX_CONNECTIONS, connections_below)
}

/// The connections a descriptor limit of `limit` allows: a quarter of it, and at least 64, is
/// left for everything else.
fn connections_below(limit: u64) -> usize {
    let headroom = (limit / 4).max(64);
    let connections = limit.saturating_sub(headroom);
    usize::try_from(connections)
        .unwrap_or(usize::MAX)
        .clamp(1, Semaphore::MAX_PERMITS)
}

/// The process's soft `RLIMIT_NOFILE` (`RLIM_INFINITY` is the largest number).
#[cfg(unix)]
#[allow(unsafe_code)]
fn soft_descriptor_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit` through the pointer, which points to a live,
    // writable one for the duration of the call.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) };
    // `rlim_t` is unsigned on Linux and macOS, signed on some BSDs.
    #[allow(clippy::useless_conversion)]
    let soft = u64::try_from(limit.rlim_cur).unwrap_or(u64::MAX);
    (rc == 0).then_some(soft)
}

#[cfg(not(unix))]
fn soft_descriptor_limit() -> Option<u64> {
    None
}

/// An error met while serving, given to [`Server::on_error`].
///
/// # Examples
///
/// ```
/// use streamgate::transport::{ServeError, Server};
///
/// let server = Server::new().on_error(|error| match &error {
///     // A slowloris, or a very slow link: worth a counter, not a page.
///     ServeError::HeaderTimeout { .. } => {}
///     _ => eprintln!("server: {error}"),
/// });
/// # let _ = server;
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum ServeError {
    /// Accepting failed for the listener as a whole (out of file descriptors, say); the server
    /// accepts again after [`ACCEPT_BACKOFF`].
    Accept(io::Error),
    /// A connection ended with an error: a malformed request, an HTTP/2 protocol error, a
    /// client that vanished while a response was being written (the user timeout ran out; a
    /// client that closed or reset its connection is not an error).
    Connection {
        /// The client's address.
        peer: SocketAddr,
        /// What hyper reported.
        error: BoxError,
    },
    /// A client did not send a whole request head within
    /// [`header_read_timeout`](Server::header_read_timeout) of its first byte (a slowloris, or
    /// a very slow link): its connection was closed.
    HeaderTimeout {
        /// The client's address.
        peer: SocketAddr,
    },
    /// The server reached its [connection cap](Server::max_connections) and stopped
    /// accepting: new connections wait in the listen backlog until open ones close. Reported
    /// once until a tenth of the slots are free again, not for every waiting connection.
    ConnectionLimit {
        /// The cap.
        limit: usize,
    },
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::Accept(error) => write!(f, "accepting a connection: {error}"),
            ServeError::Connection { peer, error } => write!(f, "connection from {peer}: {error}"),
            ServeError::HeaderTimeout { peer } => {
                write!(
                    f,
                    "connection from {peer}: request head not received in time"
                )
            }
            ServeError::ConnectionLimit { limit } => write!(
                f,
                "{limit} connections open, the cap: new ones wait in the listen backlog"
            ),
        }
    }
}

/// The message already includes the wrapped error's, so the source is the wrapped error's own.
impl std::error::Error for ServeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ServeError::Accept(error) => error.source(),
            ServeError::Connection { error, .. } => error.source(),
            ServeError::HeaderTimeout { .. } | ServeError::ConnectionLimit { .. } => None,
        }
    }
}

/// Whether a connection's error only says that the client left: before a response was
/// complete (an end of file), or by resetting the connection, as a client that closes its
/// socket with bytes it has not read does (an SSE reader that leaves mid-stream, most often):
/// the next read or write meets a reset or a broken pipe. A client that vanished (the user
/// timeout ran out) is still reported.
fn is_client_gone(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_incomplete_message)
        {
            return true;
        }
        if let Some(error) = error.downcast_ref::<io::Error>() {
            return matches!(
                error.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionAborted
            );
        }
        cause = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_leaves_descriptors_free() {
        assert_eq!(connections_below(256), 192);
        assert_eq!(connections_below(1024), 768);
        assert_eq!(connections_below(65_536), 49_152);
        // Small limits keep 64 free, and at least one connection is served.
        assert_eq!(connections_below(100), 36);
        assert_eq!(connections_below(10), 1);
        // RLIM_INFINITY.
        assert_eq!(connections_below(u64::MAX), Semaphore::MAX_PERMITS);
    }

    #[test]
    fn the_default_cap_follows_the_process_limit() {
        let cap = default_max_connections();
        match soft_descriptor_limit() {
            Some(limit) => assert_eq!(cap, connections_below(limit)),
            None => assert_eq!(cap, FALLBACK_MAX_CONNECTIONS),
        }
    }
}
