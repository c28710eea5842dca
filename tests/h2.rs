//! HTTP/2 over real sockets on 127.0.0.1: `transport::Server` speaking h2c to hyper's h2
//! client (prior knowledge). Several streams on one connection, a stream the client resets, a
//! silent connection at shutdown, and what h2's send buffer lets a stopped stream run ahead.
//! (The reference server's bad h2 clients are `cli/tests/sim_h2.rs`.)
#![cfg(feature = "axum")]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use axum::Router;
use axum::extract::RawQuery;
use axum::routing::get;
use bytes::Bytes;
use common::deaf::Deaf;
use common::gate::Releases;
use common::{HANG, RawResponse};
use futures_util::StreamExt;
use http_body_util::{BodyDataStream, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use streamgate::sse::SseEvent;
use streamgate::transport::{ListenOptions, Server, SseResponse, TunedListener};
use streamgate::{EndReason, GateExt, Policy};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout};

/// The paced generator's decode step.
const STEP: Duration = Duration::from_millis(25);
/// The paced stream's length.
const PACED_EVENTS: u64 = 60;
/// As the stopped stream's neighbour, the paced stream goes on for this many events after the
/// flood's release (and ends at [`PACED_LIMIT`] events in any case).
const PACED_AFTER: u64 = 20;
/// The most events the paced stream sends.
const PACED_LIMIT: u64 = 800;
/// How long the flood's reader may take nothing from a full gate.
const SLOW_DEADLINE: Duration = Duration::from_millis(300);
/// The flood's event size.
const KIB: usize = 1024;

/// The releases of the two endpoints' gates.
#[derive(Clone, Default)]
struct Endpoints {
    paced: Releases,
    flood: Releases,
}

/// `/paced`: one event every [`STEP`], [`PACED_EVENTS`] of them, or with `?neighbour` until
/// [`PACED_AFTER`] events after the flood's release. `/flood`: 1 KiB events as fast as they
/// are taken, ended [`SLOW_DEADLINE`] after its reader stops taking them.
fn app(endpoints: &Endpoints) -> Router {
    let (paced, flood) = (endpoints.paced.clone(), endpoints.flood.clone());
    let flood_ended = flood.clone();
    let paced = move |RawQuery(query): RawQuery| {
        let flood = flood_ended.clone();
        let neighbour = query.as_deref() == Some("neighbour");
        let events = paced.gate().spawn(move |_, mut tx| async move {
            let mut left = PACED_AFTER;
            for i in 0..PACED_LIMIT {
                sleep(STEP).await;
                tx.send(SseEvent::data(format!("t{i}"))).await?;
                if !neighbour && i + 1 == PACED_EVENTS {
                    break;
                }
                if neighbour && flood.count() > 0 {
                    left -= 1;
                    if left == 0 {
                        break;
                    }
                }
            }
            Ok::<_, streamgate::SendError<SseEvent>>(())
        });
        async move { SseResponse::new(events.sse()) }
    };
    let flood = move || {
        let gate = flood.gate().policy(Policy::disconnect(SLOW_DEADLINE));
        let events = gate.spawn(|_, mut tx| async move {
            while tx.send(SseEvent::data("x".repeat(KIB))).await.is_ok() {}
            Ok::<_, Infallible>(())
        });
        async move { SseResponse::new(events.sse()) }
    };
    Router::new()
        .route("/paced", get(paced))
        .route("/flood", get(flood))
}

/// Serves `app` with `server` on a tuned listener on 127.0.0.1; returns its address. Sockets
/// get a small send buffer, so the kernel's share of what a stopped stream runs ahead is small.
fn serve(server: Server, app: Router) -> SocketAddr {
    let options = ListenOptions::default().send_buffer(Some(16 * KIB as u32));
    let listener = TunedListener::bind(([127, 0, 0, 1], 0).into(), options).expect("bind");
    let addr = listener.local_addr().unwrap();
    let server = server.on_error(|error| eprintln!("server: {error}"));
    tokio::spawn(server.serve(listener, app, std::future::pending()));
    addr
}

/// An h2 connection with prior knowledge over `io`, whose streams' receive windows are
/// `stream_window` bytes (hyper's default when `None`: 2 MiB).
async fn h2<I>(io: I, stream_window: Option<u32>) -> SendRequest<Full<Bytes>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(stream_window)
        .handshake(TokioIo::new(io))
        .await
        .expect("h2 handshake");
    tokio::spawn(connection);
    sender
}

async fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).unwrap();
    stream
}

/// `GET path`.
fn get_request(addr: SocketAddr, path: &str) -> http::Request<Full<Bytes>> {
    http::Request::get(format!("http://{addr}{path}"))
        .body(Full::default())
        .unwrap()
}

/// A response's SSE events with the time each arrived, until the body ends.
type Events = Pin<Box<dyn futures_util::Stream<Item = (String, Instant)> + Send>>;

fn events(response: http::Response<hyper::body::Incoming>) -> Events {
    let events = BodyDataStream::new(response.into_body()).sse_events();
    Box::pin(events.filter_map(|event| async move {
        let event = event.expect("a well-formed stream");
        Some((event.data_str()?.to_owned(), Instant::now()))
    }))
}

/// The next event, failing the test if it does not come.
async fn next(events: &mut Events) -> String {
    let next = timeout(HANG, events.next())
        .await
        .expect("an event in time");
    next.expect("an event before the end").0
}

/// Two streams on one connection: one reader stops, so its stream's window closes, h2 stops
/// polling its body, its gate fills and `Disconnect` ends it; the other stream keeps its
/// per-event timing before and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_stream_ends_by_its_policy_while_its_neighbour_keeps_its_pace() {
    let endpoints = Endpoints::default();
    let addr = serve(Server::new(), app(&endpoints));
    let window = 64 * KIB as u32;
    let mut client = h2(connect(addr).await, Some(window)).await;
    let stopped = client.send_request(get_request(addr, "/flood")).await;
    let stopped = stopped.expect("the flood's head");
    assert_eq!(stopped.version(), http::Version::HTTP_2);
    let live = client
        .send_request(get_request(addr, "/paced?neighbour"))
        .await;
    let arrivals: Vec<_> = events(live.expect("the paced stream's head"))
        .collect()
        .await;

    let data: Vec<&str> = arrivals.iter().map(|(data, _)| data.as_str()).collect();
    let expected: Vec<String> = (0..data.len()).map(|i| format!("t{i}")).collect();
    assert_eq!(data, expected, "every event, in order");
    assert!((data.len() as u64) < PACED_LIMIT, "the flood was released");
    // A correctness bound, not a benchmark: a stream held behind its stopped neighbour would
    // wait for ever (or for the policy's deadline), not a few steps.
    let slack = Duration::from_millis(250);
    for pair in arrivals.windows(2) {
        let gap = pair[1].1 - pair[0].1;
        assert!(gap < STEP + slack, "a gap of {gap:?} at {}", pair[1].0);
    }
    let (reason, stats, released) = endpoints.flood.once_at();
    assert_eq!(reason, EndReason::SlowConsumer);
    let after = arrivals.iter().filter(|(_, at)| *at > released).count();
    assert!(after >= 10, "the live stream went on after: {after} events");
    // Its window (64 KiB) held it: beyond that, h2 polled for at most its send buffer.
    let limit = (window as usize + streamgate::transport::DEFAULT_H2_SEND_BUFFER) as u64;
    assert!(stats.bytes_delivered <= limit, "{stats:?}");
    assert_eq!(endpoints.paced.once().0, EndReason::Completed);
    drop(stopped);
}

/// Dropping a response body sends `RST_STREAM`: the server drops the body, which cancels the
/// generator; the connection serves the next stream to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_stream_cancels_its_generator_and_the_connection_goes_on() {
    let endpoints = Endpoints::default();
    let addr = serve(Server::new(), app(&endpoints));
    let mut client = h2(connect(addr).await, None).await;
    let response = client.send_request(get_request(addr, "/paced")).await;
    let mut reset = events(response.expect("a head"));
    for i in 0..3 {
        assert_eq!(next(&mut reset).await, format!("t{i}"));
    }
    drop(reset);
    endpoints.paced.wait_for(1).await;
    let (reason, stats) = endpoints.paced.once();
    assert_eq!(reason, EndReason::ConsumerGone);
    assert!(stats.chunks_sent < PACED_EVENTS, "stopped early: {stats:?}");

    client.ready().await.expect("the connection is still open");
    let response = client.send_request(get_request(addr, "/paced")).await;
    let next_stream: Vec<_> = events(response.expect("a head")).collect().await;
    assert_eq!(next_stream.len() as u64, PACED_EVENTS);
    endpoints.paced.wait_for(2).await;
}

/// A connection that never sends a byte holds neither the server's shutdown nor its task:
/// it is closed when the server stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_does_not_hold_the_shutdown() {
    let listener =
        TunedListener::bind(([127, 0, 0, 1], 0).into(), ListenOptions::default()).expect("bind");
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let app = Router::new().route("/", get(|| async { "hi" }));
    let served = tokio::spawn(Server::new().serve(listener, app, async move {
        stopped.await.ok();
    }));
    let mut silent = connect(addr).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.send(()).unwrap();
    timeout(HANG, served)
        .await
        .expect("the server returns")
        .unwrap();
    let mut byte = [0u8; 1];
    let read = timeout(HANG, tokio::io::AsyncReadExt::read(&mut silent, &mut byte))
        .await
        .expect("the silent connection is closed");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}

/// A stream whose client stopped reading its socket: what its generator made beyond what the
/// client read (nothing) sits in the gate, in h2's send buffer and in the kernel. h2's bound
/// shows in it: the default (64 KiB) against hyper's (400 KiB). The numbers are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2s_send_buffer_bounds_what_a_stopped_stream_runs_ahead() {
    let mut beyond_the_gate = Vec::new();
    for (name, server) in [
        ("default", Server::new()),
        ("hyper's", Server::new().h2_send_buffer(400 * KIB)),
    ] {
        let endpoints = Endpoints::default();
        let addr = serve(server, app(&endpoints));
        let mut client = h2(Deaf(connect(addr).await), None).await;
        let pending = client.send_request(get_request(addr, "/flood"));
        endpoints.flood.wait_for(1).await;
        let (reason, stats) = endpoints.flood.once();
        assert_eq!(reason, EndReason::SlowConsumer);
        println!(
            "h2 send buffer {name}: {} KiB ({} events) produced, {} KiB of them past the gate",
            stats.bytes_sent / 1024,
            stats.chunks_sent,
            stats.bytes_delivered / 1024
        );
        beyond_the_gate.push(stats.bytes_delivered);
        drop((pending, client));
    }
    // The kernel's share is the same in both runs; h2's differs by 336 KiB.
    assert!(
        beyond_the_gate[1] > beyond_the_gate[0] + 200 * KIB as u64,
        "{beyond_the_gate:?}"
    );
}

/// A client that leaves in the middle of a stream (HTTP/1.1 or h2) is what SSE readers do: the
/// server does not report it as an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_stream_is_not_an_error() {
    let errors = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let endpoints = Endpoints::default();
    let seen = errors.clone();
    let server = Server::new().on_error(move |error| seen.lock().unwrap().push(error.to_string()));
    let listener =
        TunedListener::bind(([127, 0, 0, 1], 0).into(), ListenOptions::default()).expect("bind");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server.serve(listener, app(&endpoints), std::future::pending()));
    let mut h1 = RawResponse::get(addr, "/paced", "").await;
    h1.expect_frame().await;
    drop(h1);
    let mut client = h2(connect(addr).await, None).await;
    let response = client.send_request(get_request(addr, "/paced")).await;
    let mut h2_events = events(response.expect("a head"));
    next(&mut h2_events).await;
    drop((h2_events, client));
    endpoints.paced.wait_for(2).await;
    sleep(Duration::from_millis(100)).await;
    assert_eq!(*errors.lock().unwrap(), Vec::<String>::new());
}
