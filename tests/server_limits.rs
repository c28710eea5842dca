//! `transport::Server`'s protections over real sockets on 127.0.0.1: a slowloris is closed
//! after the header read timeout, idle connections after the idle timeout (HTTP/1.1 and h2c)
//! while long responses are never cut, and at the connection cap new clients wait in the
//! backlog until a slot frees; a client leaving mid-stream is not reported as an error.
//! Timeouts are short (300 ms) and checked with wide margins.
#![cfg(feature = "axum")]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::RawQuery;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use streamgate::transport::{ListenOptions, ServeError, Server, TunedListener};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout};

/// The timeouts under test.
const SHORT: Duration = Duration::from_millis(300);
/// A timeout that does not fire during a test.
const LONG: Duration = Duration::from_secs(60);
/// The longest a close or an answer that is due may take: ten times [`SHORT`].
const LATE: Duration = Duration::from_secs(3);
/// The pace of `/stream`'s events.
const STEP: Duration = Duration::from_millis(100);

/// `/`: `hi`. `/stream?n`: `n` SSE events, one every [`STEP`]. `/slow?ms`: `hi` after `ms`
/// milliseconds.
fn app() -> Router {
    let stream = |RawQuery(query): RawQuery| async move {
        let events: u32 = query.and_then(|n| n.parse().ok()).unwrap_or(1);
        let events = futures_util::stream::unfold(0, move |i| async move {
            if i == events {
                return None;
            }
            sleep(STEP).await;
            let frame = Bytes::from(format!("data: {i}\n\n"));
            Some((Ok::<_, Infallible>(frame), i + 1))
        });
        Body::from_stream(events)
    };
    let slow = |RawQuery(query): RawQuery| async move {
        let millis = query.and_then(|ms| ms.parse().ok()).unwrap_or(0);
        sleep(Duration::from_millis(millis)).await;
        "hi"
    };
    Router::new()
        .route("/", get(|| async { "hi" }))
        .route("/stream", get(stream))
        .route("/slow", get(slow))
}

/// What the server reported, by kind: `limit`, `head` or the error's text.
#[derive(Clone, Default)]
struct Reports(Arc<Mutex<Vec<String>>>);

impl Reports {
    fn count(&self, kind: &str) -> usize {
        let reports = self.0.lock().unwrap();
        reports.iter().filter(|report| *report == kind).count()
    }
}

/// Serves [`app`] with `server` on 127.0.0.1; returns its address and what it reports.
fn serve(server: Server) -> (SocketAddr, Reports) {
    let listener =
        TunedListener::bind(([127, 0, 0, 1], 0).into(), ListenOptions::default()).expect("bind");
    let addr = listener.local_addr().unwrap();
    let reports = Reports::default();
    let kept = reports.clone();
    let server = server.on_error(move |error| {
        eprintln!("server: {error}");
        let kind = match error {
            ServeError::ConnectionLimit { .. } => "limit".to_owned(),
            ServeError::HeaderTimeout { .. } => "head".to_owned(),
            error => error.to_string(),
        };
        kept.0.lock().unwrap().push(kind);
    });
    tokio::spawn(server.serve(listener, app(), std::future::pending()));
    (addr, reports)
}

/// A raw HTTP/1.1 client on one keep-alive connection.
struct Client {
    stream: TcpStream,
    /// Bytes read and not yet taken as a response.
    buf: Vec<u8>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    /// Sends `GET path`.
    async fn send(&mut self, path: &str) {
        let request = format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n");
        self.stream
            .write_all(request.as_bytes())
            .await
            .expect("send");
    }

    /// The next whole response (head and body, chunked or sized); cancel safe. Panics if the
    /// connection ends first.
    async fn response(&mut self) -> String {
        loop {
            if let Some(end) = response_end(&self.buf) {
                let response = self.buf.drain(..end).collect::<Vec<_>>();
                return String::from_utf8(response).expect("a text response");
            }
            let read = self.stream.read_buf(&mut self.buf).await.expect("read");
            assert!(read > 0, "the connection ended before a response");
        }
    }

    /// `GET path` and its response, which must come within [`LATE`].
    async fn get(&mut self, path: &str) -> String {
        self.send(path).await;
        timeout(LATE, self.response())
            .await
            .expect("a response in time")
    }

    /// How long after `since` the server closed the connection (EOF or reset), if it did
    /// within `limit` from now. Whatever arrives meanwhile is dropped.
    async fn closed_within(&mut self, since: Instant, limit: Duration) -> Option<Duration> {
        closed_within(&mut self.stream, since, limit).await
    }
}

/// How long after `since` the peer closed `stream` (EOF or reset), if it did within `limit`.
async fn closed_within(
    stream: &mut (impl AsyncReadExt + Unpin),
    since: Instant,
    limit: Duration,
) -> Option<Duration> {
    let deadline = Instant::now() + limit;
    let mut scratch = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut scratch)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(since.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// Where the first whole response in `buf` ends, if it is there.
fn response_end(buf: &[u8]) -> Option<usize> {
    let head_end = find(buf, b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    if head.contains("transfer-encoding: chunked") {
        let body = &buf[head_end - 2..];
        return Some(head_end - 2 + find(body, b"\r\n0\r\n\r\n")? + 7);
    }
    let length = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length: "))
        .map_or(0, |length| length.trim().parse().expect("a length"));
    (buf.len() >= head_end + length).then_some(head_end + length)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// Asserts `response` is a `200` with `body` at its end.
fn assert_ok(response: &str, body: &str) {
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with(body), "{response}");
}

#[tokio::test]
async fn slowloris_is_closed_after_the_header_read_timeout() {
    let (addr, reports) = serve(
        Server::new()
            .header_read_timeout(SHORT)
            .idle_timeout(LONG)
            .first_byte_timeout(LONG),
    );
    let slow = TcpStream::connect(addr).await.expect("connect");
    let (mut from_server, mut to_server) = slow.into_split();
    let start = Instant::now();
    // A byte every 50 ms, header lines without end, until the server closes.
    let trickle = tokio::spawn(async move {
        let head = b"GET / HTTP/1.1\r\nhost: test\r\n".iter();
        let lines = b"x-slow: a\r\n".iter().cycle();
        for byte in head.chain(lines).take(200) {
            if to_server.write_all(&[*byte]).await.is_err() {
                return true;
            }
            sleep(Duration::from_millis(50)).await;
        }
        false
    });

    // A well-behaved client is served meanwhile.
    sleep(STEP).await;
    assert_ok(&Client::connect(addr).await.get("/").await, "hi");

    let closed = closed_within(&mut from_server, start, LATE)
        .await
        .expect("the slowloris closed");
    assert!(closed >= SHORT / 2, "closed after {closed:?}");
    assert!(!trickle.is_finished() || trickle.await.unwrap());
    assert_eq!(reports.count("head"), 1);
    assert_ok(&Client::connect(addr).await.get("/").await, "hi");
}

#[tokio::test]
async fn idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let (addr, _) = serve(Server::new().idle_timeout(SHORT));
    let mut client = Client::connect(addr).await;
    // Requests at 0, 200 and 400 ms: the idle time counts from the last response, not from
    // the connection's start.
    for _ in 0..2 {
        assert_ok(&client.get("/").await, "hi");
        sleep(SHORT * 2 / 3).await;
    }
    assert_ok(&client.get("/").await, "hi");
    let answered = Instant::now();
    let closed = client
        .closed_within(answered, LATE)
        .await
        .expect("the idle connection closed");
    assert!(closed >= SHORT / 2, "closed after {closed:?}");
}

#[tokio::test]
async fn idle_wait_between_requests_is_not_cut_by_the_header_read_timeout() {
    let (addr, reports) = serve(Server::new().header_read_timeout(SHORT).idle_timeout(LATE));
    let mut client = Client::connect(addr).await;
    assert_ok(&client.get("/").await, "hi");
    // Idle for three header timeouts: hyper's own header timer would have closed it.
    sleep(SHORT * 3).await;
    assert_ok(&client.get("/").await, "hi");
    assert_eq!(reports.count("head"), 0);
}

#[tokio::test]
async fn streaming_response_and_slow_handler_are_not_cut_by_the_idle_timeout() {
    let (addr, reports) = serve(Server::new().idle_timeout(SHORT).header_read_timeout(SHORT));
    let mut client = Client::connect(addr).await;
    // 8 events over 800 ms, more than twice the idle timeout.
    let start = Instant::now();
    let response = client.get("/stream?8").await;
    assert!(start.elapsed() >= 8 * STEP);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert_eq!(response.matches("data: ").count(), 8, "{response}");
    // A handler that takes twice the idle timeout to answer.
    assert_ok(&client.get("/slow?600").await, "hi");
    let answered = Instant::now();
    let closed = client.closed_within(answered, LATE).await;
    assert!(
        closed.is_some_and(|closed| closed >= SHORT / 2),
        "{closed:?}"
    );
    assert_eq!(reports.count("head"), 0);
}

/// A client that leaves in the middle of a stream is not a server error: one that closes its
/// socket with events still unread (which resets the connection, as a reader that gives up
/// does) and one that had read everything (a plain close) are neither reported, while the
/// server goes on to write to both.
#[tokio::test]
async fn a_client_that_leaves_mid_stream_is_not_reported() {
    let (addr, reports) = serve(Server::new());
    for unread in [true, false] {
        let mut client = Client::connect(addr).await;
        client.send("/stream?50").await;
        let mut seen = Vec::new();
        while !String::from_utf8_lossy(&seen).contains("data: 1\n") {
            let mut buf = [0u8; 1024];
            let n = timeout(LATE, client.stream.read(&mut buf))
                .await
                .expect("events flow")
                .expect("read");
            assert!(n > 0, "the stream ended early");
            seen.extend_from_slice(&buf[..n]);
        }
        if unread {
            // Two more events arrive and stay unread: the close resets the connection.
            sleep(STEP * 2 + STEP / 2).await;
        }
        drop(client);
    }
    // The server's next writes (one every STEP) meet the closed connections.
    sleep(STEP * 4).await;
    let reports = reports.0.lock().unwrap().clone();
    assert!(reports.is_empty(), "reported: {reports:?}");
}

#[tokio::test]
async fn at_the_cap_a_new_client_is_served_once_an_idle_connection_times_out() {
    let idle = Duration::from_secs(1);
    let (addr, reports) = serve(
        Server::new()
            .max_connections(4)
            .idle_timeout(idle)
            .header_read_timeout(LONG)
            .first_byte_timeout(LONG),
    );
    let mut open = Vec::new();
    for _ in 0..4 {
        let mut client = Client::connect(addr).await;
        assert_ok(&client.get("/").await, "hi");
        open.push(client);
    }
    let idle_from = Instant::now();
    // The fifth connects (the kernel completes it in the backlog) and asks.
    let mut fifth = Client::connect(addr).await;
    fifth.send("/").await;
    let early = timeout(idle / 2, fifth.response()).await;
    assert!(early.is_err(), "served at the cap: {early:?}");
    assert_eq!(reports.count("limit"), 1);

    let response = timeout(LATE, fifth.response())
        .await
        .expect("served once a slot freed");
    assert_ok(&response, "hi");
    let served = idle_from.elapsed();
    assert!(served >= idle / 2, "served after {served:?}");
    // One of the four at least was closed by its idle timeout.
    let mut closed = 0;
    for client in &mut open {
        let gone = client
            .closed_within(idle_from, Duration::from_millis(50))
            .await;
        closed += usize::from(gone.is_some());
    }
    assert!(closed >= 1);
    assert_eq!(reports.count("limit"), 1);
}

#[tokio::test]
async fn silent_sockets_at_the_cap_give_their_slots_back_after_the_first_byte_timeout() {
    let first_byte = SHORT * 2;
    let (addr, _) = serve(
        Server::new()
            .max_connections(2)
            .first_byte_timeout(first_byte)
            .idle_timeout(LONG),
    );
    let start = Instant::now();
    let mut silent = [
        TcpStream::connect(addr).await.unwrap(),
        TcpStream::connect(addr).await.unwrap(),
    ];
    sleep(STEP).await;
    let mut client = Client::connect(addr).await;
    client.send("/").await;
    let early = timeout(first_byte / 3, client.response()).await;
    assert!(early.is_err(), "served at the cap: {early:?}");
    let response = timeout(LATE, client.response())
        .await
        .expect("served once a silent socket was closed");
    assert_ok(&response, "hi");
    for socket in &mut silent {
        let closed = closed_within(socket, start, LATE).await;
        assert!(
            closed.is_some_and(|closed| closed >= first_byte / 2),
            "{closed:?}"
        );
    }
}

#[tokio::test]
async fn reaching_the_cap_is_reported_once_per_episode() {
    let (addr, reports) = serve(
        Server::new()
            .max_connections(2)
            .idle_timeout(LONG)
            .header_read_timeout(LONG)
            .first_byte_timeout(LONG),
    );
    let settle = Duration::from_millis(200);
    let mut a = Client::connect(addr).await;
    assert_ok(&a.get("/").await, "hi");
    let mut b = Client::connect(addr).await;
    assert_ok(&b.get("/").await, "hi");
    let mut c = Client::connect(addr).await;
    c.send("/").await;
    let mut d = Client::connect(addr).await;
    d.send("/").await;
    sleep(settle).await;
    assert_eq!(reports.count("limit"), 1);

    // Each close lets one waiting client in, and the server stays at its cap: one episode.
    drop(a);
    assert_ok(&timeout(LATE, c.response()).await.expect("c served"), "hi");
    drop(b);
    assert_ok(&timeout(LATE, d.response()).await.expect("d served"), "hi");
    sleep(settle).await;
    assert_eq!(reports.count("limit"), 1);

    // Below the cap, then at it again: a second episode.
    drop((c, d));
    sleep(settle).await;
    let mut e = Client::connect(addr).await;
    assert_ok(&e.get("/").await, "hi");
    let mut f = Client::connect(addr).await;
    assert_ok(&f.get("/").await, "hi");
    sleep(settle).await;
    assert_eq!(reports.count("limit"), 2);
}

#[tokio::test]
async fn idle_h2c_connection_is_closed_with_a_goaway_after_its_streams() {
    let (addr, reports) = serve(Server::new().idle_timeout(SHORT).header_read_timeout(SHORT));
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake::<_, Full<Bytes>>(TokioIo::new(stream))
        .await
        .expect("h2 handshake");
    let connection = tokio::spawn(connection);

    // A stream of 8 events over 800 ms, more than twice the idle timeout, is not cut.
    let request = http::Request::get(format!("http://{addr}/stream?8"))
        .body(Full::default())
        .unwrap();
    let response = sender.send_request(request).await.expect("a response");
    assert_eq!(response.version(), http::Version::HTTP_2);
    let body = timeout(LATE, response.into_body().collect())
        .await
        .expect("the body in time")
        .expect("the whole body")
        .to_bytes();
    let body = String::from_utf8(body.to_vec()).unwrap();
    assert_eq!(body.matches("data: ").count(), 8, "{body}");

    // Then, without streams, the connection is idle: the server sends a GOAWAY and closes.
    let answered = Instant::now();
    let ended = timeout(LATE, connection)
        .await
        .expect("the idle connection closed")
        .unwrap();
    assert!(ended.is_ok(), "{ended:?}");
    let closed = answered.elapsed();
    assert!(closed >= SHORT / 2, "closed after {closed:?}");
    assert!(sender.is_closed());
    assert_eq!(reports.0.lock().unwrap().len(), 0);
}

#[tokio::test]
async fn h2c_client_that_ignores_the_goaway_is_dropped() {
    let (addr, reports) = serve(Server::new().idle_timeout(SHORT).header_read_timeout(SHORT));
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    // The preface and an empty SETTINGS frame; then nothing: the GOAWAY's PING is never
    // answered, so hyper waits for the client.
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let start = Instant::now();
    let mut frames = Vec::new();
    let closed = timeout(LATE, async {
        loop {
            match stream.read_buf(&mut frames).await {
                Ok(0) | Err(_) => return start.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("the unanswering client dropped");
    // Idle first, then given the header read timeout to answer.
    assert!(closed >= SHORT, "closed after {closed:?}");
    assert!(frame_types(&frames).contains(&GOAWAY), "{frames:?}");
    assert_eq!(reports.count("head"), 0);
}

/// HTTP/2's `GOAWAY` frame type.
const GOAWAY: u8 = 0x7;

/// The types of the whole HTTP/2 frames in `bytes`.
fn frame_types(mut bytes: &[u8]) -> Vec<u8> {
    let mut types = Vec::new();
    while bytes.len() >= 9 {
        let length =
            usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        types.push(bytes[3]);
        bytes = &bytes[(9 + length).min(bytes.len())..];
    }
    types
}
