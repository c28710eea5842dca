//! How `transport::Server` hands a stream's events to the kernel, over a real socket on
//! 127.0.0.1: a burst of events, each handed to the generator by another task through a
//! channel of one (as hyper hands an upstream's chunks to a proxy), leaves in a few writes;
//! events a few milliseconds apart leave one write each, none held for the next. Writes are
//! counted as the TCP segments with data the client received (`tcpi_data_segs_in`): with
//! `TCP_NODELAY` on loopback, each write the server makes is one.
#![cfg(all(feature = "axum", target_os = "linux"))]

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use axum::Router;
use axum::extract::Path;
use axum::routing::get;
use streamgate::sse::SseEvent;
use streamgate::transport::{ListenOptions, Server, SseResponse, TunedListener};
use streamgate::{Gate, GateExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The events of a burst.
const BURST: u64 = 500;
/// The events of a paced stream, and their pace.
const PACED: u64 = 20;
const PACE: Duration = Duration::from_millis(5);

/// `/burst`: [`BURST`] events as fast as another task hands them over. `/paced`: [`PACED`]
/// events, one every [`PACE`].
fn app() -> Router {
    let stream = |Path(kind): Path<String>| async move {
        let (events, pace) = match kind.as_str() {
            "burst" => (BURST, None),
            _ => (PACED, Some(PACE)),
        };
        let (upstream, mut chunks) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            for i in 0..events {
                if let Some(pace) = pace {
                    tokio::time::sleep(pace).await;
                }
                if upstream.send(i).await.is_err() {
                    return;
                }
            }
        });
        let consumer = Gate::new().spawn(move |_, mut tx| async move {
            while let Some(i) = chunks.recv().await {
                tx.send(SseEvent::data(format!("token {i}"))).await?;
            }
            Ok::<_, streamgate::SendError<SseEvent>>(())
        });
        SseResponse::new(consumer.sse())
    };
    Router::new().route("/{kind}", get(stream))
}

/// The TCP segments with data `stream` has received.
fn segments_in(stream: &TcpStream) -> u32 {
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is a `tcp_info` of `len` bytes, and the descriptor is open.
    let result = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    assert_eq!(result, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
    info.tcpi_data_segs_in
}

/// `GET path` on a new connection: the response body's events, and the segments with data
/// they came in (the head's and the end's included).
async fn events(addr: SocketAddr, path: &str) -> (u64, u32) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("read");
    let response = String::from_utf8(response).expect("text");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let events = response.matches("data: token ").count() as u64;
    (events, segments_in(&stream))
}

/// Serves [`app`] on 127.0.0.1.
fn serve() -> SocketAddr {
    let listener =
        TunedListener::bind(([127, 0, 0, 1], 0).into(), ListenOptions::default()).expect("bind");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Server::new().serve(listener, app(), std::future::pending()));
    addr
}

/// A burst of [`BURST`] events arrives whole, in at most a twelfth as many segments (without
/// the cork: 451-477 on one worker, 53-136 on two); `runtime` names the runtime it ran on.
async fn a_burst_leaves_in_a_few_writes(runtime: &str) {
    let (events, segments) = events(serve(), "/burst").await;
    assert_eq!(events, BURST);
    eprintln!("a burst of {BURST} events ({runtime}): {segments} segments");
    assert!(u64::from(segments) <= BURST / 12, "{segments} segments");
}

#[tokio::test(flavor = "current_thread")]
async fn a_burst_of_events_leaves_in_a_few_writes() {
    a_burst_leaves_in_a_few_writes("current_thread").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_events_leaves_in_a_few_writes_on_two_workers() {
    a_burst_leaves_in_a_few_writes("two workers").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_events_leave_one_write_each() {
    let (events, segments) = events(serve(), "/paced").await;
    assert_eq!(events, PACED);
    eprintln!(
        "{PACED} events {} ms apart: {segments} segments",
        PACE.as_millis()
    );
    // The head may go with the first event; every event goes on its own.
    assert!(u64::from(segments) >= PACED, "{segments} segments");
}
