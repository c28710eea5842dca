//! Serving a service over HTTP/1.1 and h2c on one [`TunedListener`].

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio_util::sync::CancellationToken;
use tower_service::Service;

use super::listener::TunedListener;
use crate::BoxError;

/// The default bound of h2's send buffer per stream: the gate's default byte bound
/// ([`DEFAULT_MAX_BYTES`](crate::DEFAULT_MAX_BYTES), 64 KiB), where hyper's own default is
/// 400 KiB. What a stream's body yields that h2 cannot send yet waits here; once it is full,
/// the body is not polled, the gate fills and the slow-consumer policy sees the stopped reader.
pub const DEFAULT_H2_SEND_BUFFER: usize = crate::DEFAULT_MAX_BYTES;

/// How long the server waits before accepting again after an error of the listener as a whole
/// (out of file descriptors, say).
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How long a connection may take to send its first byte (from which the protocol is read)
/// before it is closed: 30 s, as hyper gives an HTTP/1.1 request head.
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(30);

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
/// [`on_error`](Server::on_error), if set. A connection gets [`FIRST_BYTE_TIMEOUT`] to send its
/// first byte, and HTTP/1.1 clients 30 s to send a request head.
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
    on_error: Arc<dyn Fn(ServeError) + Send + Sync>,
}

impl Server {
    /// A server with h2's send buffer bounded at [`DEFAULT_H2_SEND_BUFFER`].
    pub fn new() -> Self {
        let mut builder = Builder::new(TokioExecutor::new());
        // The timer enables hyper's limit on how long an HTTP/1.1 request head may take.
        builder.http1().timer(TokioTimer::new());
        builder.http2().max_send_buf_size(DEFAULT_H2_SEND_BUFFER);
        Server {
            builder,
            on_error: Arc::new(|_| {}),
        }
    }

    /// The most a stream may have buffered in h2 beyond what its flow-control windows let it
    /// send, in bytes.
    pub fn h2_send_buffer(mut self, bytes: usize) -> Self {
        self.builder.http2().max_send_buf_size(bytes);
        self
    }

    /// Calls `report` with every error met while serving (none stops the server). A client
    /// that leaves in the middle of a response (an SSE reader closing its connection, as they
    /// do) is not an error: it is not reported.
    pub fn on_error(mut self, report: impl Fn(ServeError) + Send + Sync + 'static) -> Self {
        self.on_error = Arc::new(report);
        self
    }

    /// Accepts connections on `listener` and serves `service` on each until `shutdown`
    /// completes; then stops accepting, lets every connection finish its open requests (HTTP/2
    /// clients get a `GOAWAY`) and returns once all have closed. To bound that wait, end the
    /// open streams first (`Group::shutdown`) or race this future against a timer (dropping it
    /// stops accepting, but the connections it started go on until they close).
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
        let connections = GracefulShutdown::new();
        // Connections still waiting for their first byte are closed at shutdown.
        let stopping = CancellationToken::new();
        let mut shutdown = pin!(shutdown);
        loop {
            // The next connection. The listener skips one connection's failures itself: what
            // is left concerns the listener (out of file descriptors, say) and is reported, and
            // the next try waits a little instead of spinning.
            let mut next = pin!(async {
                loop {
                    match listener.accept().await {
                        Ok(accepted) => return accepted,
                        Err(error) => {
                            (self.on_error)(ServeError::Accept(error));
                            tokio::time::sleep(ACCEPT_BACKOFF).await;
                        }
                    }
                }
            });
            let (stream, peer) = match poll_fn(|cx| match shutdown.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(None),
                Poll::Pending => next.as_mut().poll(cx).map(Some),
            })
            .await
            {
                Some(accepted) => accepted,
                None => break,
            };
            // Each request carries its connection's send queue (for `Departures`).
            let queue = stream.send_queue();
            let service = TowerToHyperService::new(service.clone());
            let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
                request.extensions_mut().insert(queue.clone());
                hyper::service::Service::call(&service, request)
            });
            let (builder, watcher) = (self.builder.clone(), connections.watcher());
            let (on_error, stopping) = (self.on_error.clone(), stopping.clone());
            tokio::spawn(async move {
                // The protocol is read from the first bytes, and hyper's own timeouts start
                // after it: a connection that sends nothing is closed after
                // `FIRST_BYTE_TIMEOUT`, or at shutdown.
                let mut first = [0u8; 1];
                let first =
                    tokio::time::timeout(FIRST_BYTE_TIMEOUT, stream.get_ref().peek(&mut first));
                if !matches!(stopping.run_until_cancelled(first).await, Some(Ok(Ok(1..)))) {
                    return;
                }
                let connection = builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .into_owned();
                match watcher.watch(connection).await {
                    Err(error) if !is_client_gone(&*error) => {
                        on_error(ServeError::Connection { peer, error });
                    }
                    _ => {}
                }
            });
        }
        drop(listener);
        stopping.cancel();
        connections.shutdown().await;
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
            .field("builder", &self.builder)
            .finish_non_exhaustive()
    }
}

/// An error met while serving, given to [`Server::on_error`].
#[derive(Debug)]
#[non_exhaustive]
pub enum ServeError {
    /// Accepting failed for the listener as a whole (out of file descriptors, say); the server
    /// accepts again after [`ACCEPT_BACKOFF`].
    Accept(io::Error),
    /// A connection ended with an error: a malformed request, an HTTP/2 protocol error, a
    /// client that vanished while a response was being written.
    Connection {
        /// The client's address.
        peer: SocketAddr,
        /// What hyper reported.
        error: BoxError,
    },
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::Accept(error) => write!(f, "accepting a connection: {error}"),
            ServeError::Connection { peer, error } => write!(f, "connection from {peer}: {error}"),
        }
    }
}

/// The message already includes the wrapped error's, so the source is the wrapped error's own.
impl std::error::Error for ServeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ServeError::Accept(error) => error.source(),
            ServeError::Connection { error, .. } => error.source(),
        }
    }
}

/// Whether a connection's error only says that the client left before a response was complete.
fn is_client_gone(error: &(dyn std::error::Error + 'static)) -> bool {
    error
        .downcast_ref::<hyper::Error>()
        .is_some_and(hyper::Error::is_incomplete_message)
}
