//! [`Server`]: how it serves, set up before it starts.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioExecutor;
use hyper_util::server::conn::auto::Builder;

use super::error::{OnError, ServeError};
use super::timeouts::Timeouts;

/// The default bound of h2's send buffer per stream: the gate's default byte bound
/// ([`DEFAULT_MAX_BYTES`](crate::DEFAULT_MAX_BYTES), 64 KiB), where hyper's own default is
/// 400 KiB. What a stream's body yields that h2 cannot send yet waits here; once it is full,
/// the body is not polled, the gate fills and the slow-consumer policy sees the stopped reader.
pub const DEFAULT_H2_SEND_BUFFER: usize = crate::DEFAULT_MAX_BYTES;

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
/// Every request carries its connection's [`SendQueue`](crate::transport::SendQueue) as an
/// extension (`axum::Extension<SendQueue>` in a handler): over HTTP/1.1, where a connection
/// carries one stream at a time, [`Departures`](crate::transport::Departures) records when each
/// event left the kernel. The request's version tells which (`http::Request::version`, axum's
/// `Version` extractor): over HTTP/2 the connection's bytes interleave several streams, so no
/// per-stream departure can be read from them; the stream's flow control holds a stopped
/// reader instead.
///
/// Errors never stop the server: accept errors of the listener as a whole are retried after
/// [`ACCEPT_BACKOFF`](super::ACCEPT_BACKOFF), and a connection that ends with an error ends
/// alone. Each is given to [`on_error`](Server::on_error), if set.
///
/// # Protections
///
/// A connection is *busy* from the moment its request head has been read until its response
/// body has ended or been dropped (over HTTP/2, while any stream has a request in flight), and
/// *idle* otherwise. A busy connection is never cut by the server, however long its response
/// streams: only its client, the socket's own timeouts
/// ([`ListenOptions`](crate::transport::ListenOptions)) and the gate's policy end it. Against
/// clients that hold connections without using them:
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
/// An axum `Router` (feature `axum`), served until Ctrl-C:
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
///
/// Any tower [`Service`](tower_service::Service) of `http::Request<hyper::body::Incoming>`
/// whose responses have an [`http_body::Body`] is served; here one written by hand, until it
/// has answered a client:
///
/// ```
/// use std::convert::Infallible;
/// use std::future::{Ready, ready};
/// use std::task::{Context, Poll};
///
/// use http::{Request, Response};
/// use hyper::body::Incoming;
/// use streamgate::transport::{ListenOptions, Server, TunedListener};
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// #[derive(Clone)]
/// struct Hello;
///
/// impl tower_service::Service<Request<Incoming>> for Hello {
///     type Response = Response<String>;
///     type Error = Infallible;
///     type Future = Ready<Result<Response<String>, Infallible>>;
///
///     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
///         Poll::Ready(Ok(()))
///     }
///
///     fn call(&mut self, _: Request<Incoming>) -> Self::Future {
///         ready(Ok(Response::new("hi".to_owned())))
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let listener = TunedListener::bind("127.0.0.1:0".parse().unwrap(), ListenOptions::default())?;
/// let addr = listener.local_addr()?;
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let served = tokio::spawn(Server::new().serve(listener, Hello, async {
///     let _ = stopped.await;
/// }));
///
/// let mut client = tokio::net::TcpStream::connect(addr).await?;
/// client.write_all(b"GET / HTTP/1.1\r\nhost: example\r\nconnection: close\r\n\r\n").await?;
/// let mut response = String::new();
/// client.read_to_string(&mut response).await?;
/// assert!(response.starts_with("HTTP/1.1 200 OK") && response.ends_with("\r\n\r\nhi"));
///
/// let _ = stop.send(());
/// served.await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Server {
    pub(super) builder: Builder<TokioExecutor>,
    pub(super) timeouts: Timeouts,
    pub(super) max_connections: Option<usize>,
    pub(super) on_error: OnError,
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
            timeouts: Timeouts::default(),
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
    /// an error reported. Default
    /// [`DEFAULT_FIRST_BYTE_TIMEOUT`](super::DEFAULT_FIRST_BYTE_TIMEOUT).
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
        self.timeouts.first_byte = timeout;
        self
    }

    /// How long a client may take to send a whole request head, counted from the first byte
    /// of the head (of the connection's first bytes, for the first request, which also covers
    /// the detection of the protocol). A client that has not finished its head by then is
    /// closed, however it trickles (a slowloris), and reported as [`ServeError::HeaderTimeout`].
    /// Default [`DEFAULT_HEADER_READ_TIMEOUT`](super::DEFAULT_HEADER_READ_TIMEOUT).
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
        self.timeouts.header_read = timeout;
        self
    }

    /// How long a connection may stay idle, with no request in flight, before it is closed:
    /// over HTTP/1.1 the wait for the next request on a keep-alive connection (closed at
    /// once), over HTTP/2 a connection without streams (closed with a `GOAWAY`, which lets a
    /// stream that crossed it finish). Default
    /// [`DEFAULT_IDLE_TIMEOUT`](super::DEFAULT_IDLE_TIMEOUT).
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
        self.timeouts.idle = timeout;
        self
    }

    /// The most connections open at once (0 is taken as 1). At the cap the server stops
    /// accepting: new connections wait in the listen backlog (see
    /// [`ListenOptions::backlog`](crate::transport::ListenOptions::backlog)) and are accepted
    /// as open ones close. Reaching the cap is reported once, as
    /// [`ServeError::ConnectionLimit`], until a tenth of the slots are free again. An upgraded
    /// connection (WebSocket) keeps its slot until its socket closes.
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
}

impl Default for Server {
    fn default() -> Self {
        Server::new()
    }
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("first_byte_timeout", &self.timeouts.first_byte)
            .field("header_read_timeout", &self.timeouts.header_read)
            .field("idle_timeout", &self.timeouts.idle)
            .field("max_connections", &self.max_connections)
            .field("builder", &self.builder)
            .finish_non_exhaustive()
    }
}
