//! The fake provider's server: hyper's HTTP/1.1 (keep-alive) on 127.0.0.1, over plain TCP or
//! TLS, answering each request as its [`Script`] says and recording it first.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::attempt::Attempt;
use super::behaviour::{Answer, Behaviour, DEFAULT_TOKENS, Endpoint, Failure, Stream};
use super::script::Script;
use crate::common::HANG;
use crate::common::tls::Authority;

/// The body of every answer.
type Body = BoxBody<Bytes, std::io::Error>;

/// A fake provider serving on a port of its own until stopped or dropped.
pub struct Provider {
    addr: SocketAddr,
    scheme: &'static str,
    shared: Arc<Shared>,
    stop: CancellationToken,
    accepting: Mutex<Option<JoinHandle<()>>>,
}

/// What the provider's connections share.
struct Shared {
    script: Script,
    port: u16,
    attempts: Mutex<Vec<Attempt>>,
    accepted: AtomicU64,
    open: AtomicUsize,
    /// Streamed answers whose bodies were read to their end.
    bodies_ended: AtomicU64,
}

/// How a connection is ended before its answer ([`Behaviour::Reset`], [`Behaviour::Close`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Reset,
    Close,
}

impl Provider {
    /// Serves `script` over HTTP on a free port of 127.0.0.1.
    pub async fn start(script: impl Into<Script>) -> Provider {
        Provider::serve(script.into(), None).await
    }

    /// Serves `script` over HTTPS on a free port of 127.0.0.1, with `authority`'s server
    /// certificate.
    pub async fn start_tls(script: impl Into<Script>, authority: &Authority) -> Provider {
        Provider::serve(script.into(), Some(authority.acceptor())).await
    }

    async fn serve(script: Script, tls: Option<TlsAcceptor>) -> Provider {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("the bound address");
        let shared = Arc::new(Shared {
            script,
            port: addr.port(),
            attempts: Mutex::default(),
            accepted: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            bodies_ended: AtomicU64::new(0),
        });
        let stop = CancellationToken::new();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let accepting = tokio::spawn(accept(listener, shared.clone(), tls, stop.clone()));
        Provider {
            addr,
            scheme,
            shared,
            stop,
            accepting: Mutex::new(Some(accepting)),
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (`https://` over TLS), for `--upstream`.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// Every request received so far, in the order their bodies were read.
    pub fn attempts(&self) -> Vec<Attempt> {
        self.shared.attempts.lock().unwrap().clone()
    }

    /// How many requests were received so far.
    pub fn attempt_count(&self) -> usize {
        self.shared.attempts.lock().unwrap().len()
    }

    /// The time between each received request and the one before it.
    pub fn gaps(&self) -> Vec<Duration> {
        let attempts = self.attempts();
        attempts.windows(2).map(|w| w[1].at - w[0].at).collect()
    }

    /// How many connections are open now.
    pub fn connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// How many streamed answers' bodies were read to their end (their last HTTP chunk
    /// asked for, not their connection closed before it).
    pub fn bodies_ended(&self) -> u64 {
        self.shared.bodies_ended.load(Ordering::SeqCst)
    }

    /// How many connections were accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Waits until `done` holds of the provider, polling; fails the test (naming `what`) if it
    /// does not within [`HANG`].
    pub async fn until(&self, what: &str, done: impl Fn(&Provider) -> bool) {
        let deadline = Instant::now() + HANG;
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "{what}: {} attempts, {} connections open",
                self.attempt_count(),
                self.connections()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops: the port is closed (connecting is refused) and every connection is closed (a
    /// silent one and a stream alike) once this returns.
    pub async fn stop(&self) {
        self.stop.cancel();
        let accepting = self.accepting.lock().unwrap().take();
        if let Some(accepting) = accepting {
            let _ = accepting.await;
        }
        self.until("every connection closed", |provider| {
            provider.connections() == 0
        })
        .await;
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Accepts connections until `stop`.
async fn accept(
    listener: TcpListener,
    shared: Arc<Shared>,
    tls: Option<TlsAcceptor>,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((socket, _)) = accepted else {
            // Out of descriptors, say: try again shortly rather than spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let number = shared.accepted.fetch_add(1, Ordering::SeqCst) + 1;
        shared.open.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(connection(
            socket,
            number,
            shared.clone(),
            tls.clone(),
            stop.clone(),
        ));
    }
}

/// Serves one connection until it ends, a behaviour ends it, or `stop`.
async fn connection(
    socket: TcpStream,
    number: u64,
    shared: Arc<Shared>,
    tls: Option<TlsAcceptor>,
    stop: CancellationToken,
) {
    if let Ok((socket, control)) = with_control(socket) {
        let end = match tls {
            None => serve(socket, number, &shared, &stop).await,
            Some(tls) => {
                let handshake = tokio::select! {
                    _ = stop.cancelled() => None,
                    handshake = tls.accept(socket) => handshake.ok(),
                };
                match handshake {
                    Some(socket) => serve(socket, number, &shared, &stop).await,
                    None => None,
                }
            }
        };
        if end == Some(End::Reset) {
            let _ = socket2::SockRef::from(&control).set_linger(Some(Duration::ZERO));
        }
        // The socket's last descriptor: the close (a reset with SO_LINGER 0, else a FIN).
        drop(control);
    }
    shared.open.fetch_sub(1, Ordering::SeqCst);
}

/// `socket` and a second descriptor of it, which outlives hyper's: SO_LINGER can be set once
/// hyper has let go, and the close comes when the second is dropped.
fn with_control(socket: TcpStream) -> std::io::Result<(TcpStream, std::net::TcpStream)> {
    let socket = socket.into_std()?;
    let control = socket.try_clone()?;
    Ok((TcpStream::from_std(socket)?, control))
}

/// Serves HTTP/1.1 on `io` until the connection ends (`None`), a behaviour ends it (how), or
/// `stop` (`None`).
async fn serve<I>(
    io: I,
    connection: u64,
    shared: &Arc<Shared>,
    stop: &CancellationToken,
) -> Option<End>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (end, mut ended) = oneshot::channel();
    let end = Arc::new(Mutex::new(Some(end)));
    let shared = shared.clone();
    let service = service_fn(move |request| {
        let (shared, end) = (shared.clone(), end.clone());
        async move { Ok::<_, Infallible>(answer(request, connection, shared, end).await) }
    });
    let served = http1::Builder::new().serve_connection(TokioIo::new(io), service);
    tokio::select! {
        _ = served => None,
        end = &mut ended => end.ok(),
        _ = stop.cancelled() => None,
    }
}

/// Records `request`, then answers it as the script says.
async fn answer(
    request: hyper::Request<Incoming>,
    connection: u64,
    shared: Arc<Shared>,
    end: Arc<Mutex<Option<oneshot::Sender<End>>>>,
) -> Response<Body> {
    let at = Instant::now();
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let model = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|json| json["model"].as_str().map(str::to_owned));
    let attempt = {
        let mut attempts = shared.attempts.lock().unwrap();
        let attempt = Attempt {
            number: attempts.len() as u64 + 1,
            at,
            connection,
            method: parts.method,
            path: parts
                .uri
                .path_and_query()
                .map_or_else(|| parts.uri.path().to_owned(), |path| path.to_string()),
            headers: parts.headers,
            body,
            model,
        };
        attempts.push(attempt.clone());
        attempt
    };
    let mut behaviour = shared.script.answer(&attempt);
    loop {
        match behaviour {
            Behaviour::After(delay, then) => {
                tokio::time::sleep(delay).await;
                behaviour = *then;
            }
            Behaviour::Stream(stream) => return success(&attempt, &shared, &stream),
            Behaviour::Error(failure) => return error(&failure),
            Behaviour::Reset => return end_now(&end, End::Reset).await,
            Behaviour::Close => return end_now(&end, End::Close).await,
            // Held until the connection closes (the client leaves or the provider stops).
            Behaviour::Silent => return std::future::pending().await,
        }
    }
}

/// Has the connection end `how`, without an answer.
async fn end_now(end: &Mutex<Option<oneshot::Sender<End>>>, how: End) -> Response<Body> {
    if let Some(end) = end.lock().unwrap().take() {
        let _ = end.send(how);
    }
    std::future::pending().await
}

/// A `200`: the stream, the unstreamed completion, or `{}` for another path.
fn success(attempt: &Attempt, shared: &Arc<Shared>, stream: &Stream) -> Response<Body> {
    let port = shared.port;
    let endpoint = Endpoint::of(&attempt.path);
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        _ => "cmpl",
    };
    let answer = Answer {
        endpoint,
        id: format!("{prefix}-{port}-{}", attempt.number),
        model: attempt.model.clone().unwrap_or_else(|| "fake".to_owned()),
        tokens: attempt.max_tokens().unwrap_or(DEFAULT_TOKENS),
    };
    if endpoint == Endpoint::Other || !attempt.streamed() {
        return json(StatusCode::OK, answer.completion());
    }
    let steps = answer.steps(stream).into_iter();
    let events = stream::unfold(steps, |mut steps| async move {
        let step = steps.next()?;
        tokio::time::sleep(step.after).await;
        let frame = match step.event {
            Some(event) => Ok(Frame::data(Bytes::from(event))),
            None => Err(std::io::Error::other("the stream is cut")),
        };
        Some((frame, steps))
    });
    let end = tokio::time::sleep(stream.ends_after());
    let shared = shared.clone();
    let ended = futures_util::StreamExt::filter_map(stream::once(end), move |()| {
        shared.bodies_ended.fetch_add(1, Ordering::SeqCst);
        async { None }
    });
    let events = futures_util::StreamExt::chain(events, ended);
    let mut response = Response::new(StreamBody::new(events).boxed());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The failure's status, body and `Retry-After`.
fn error(failure: &Failure) -> Response<Body> {
    let mut response = json(failure.status, failure.body());
    if let Some(retry_after) = &failure.retry_after {
        let value = HeaderValue::from_str(&retry_after.value()).expect("a header value");
        response.headers_mut().insert(RETRY_AFTER, value);
    }
    response
}

/// `status` with a JSON `body` (its length declared).
fn json(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)).map_err(|e| match e {}).boxed());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
