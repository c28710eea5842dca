//! The reference server (`streamgate sim`) over HTTP/2 (h2c, prior knowledge, hyper's client)
//! on 127.0.0.1: bad clients leak nothing (one that never reads, floods of resets, half-closes),
//! and a shutdown ends every open h2 stream visibly.

mod common;

use std::net::{Shutdown, SocketAddr};
use std::pin::Pin;
use std::time::Duration;

use axum::http;
use bytes::Bytes;
use common::deaf::Deaf;
use common::reference;
use common::{HANG, LONG, RawResponse, wait_for};
use futures_util::StreamExt;
use http_body_util::{BodyDataStream, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use streamgate::GateExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout};

/// An h2 connection with prior knowledge over `io`, hyper's default windows.
async fn h2<I>(io: I) -> SendRequest<Full<Bytes>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
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

/// The body of a streamed chat completion of `max_tokens` tokens.
fn chat_body(max_tokens: u64) -> String {
    format!(
        r#"{{"model":"sim","messages":[{{"role":"user","content":"hi"}}],"stream":true,"max_tokens":{max_tokens}}}"#
    )
}

/// The reference server's streamed chat completion of `max_tokens` tokens.
fn chat(addr: SocketAddr, max_tokens: u64) -> http::Request<Full<Bytes>> {
    http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat_body(max_tokens))))
        .unwrap()
}

/// A response's SSE events' data, until the body ends.
type Events = Pin<Box<dyn futures_util::Stream<Item = String> + Send>>;

fn events(response: http::Response<hyper::body::Incoming>) -> Events {
    let events = BodyDataStream::new(response.into_body()).sse_events();
    Box::pin(events.filter_map(|event| async move {
        let event = event.expect("a well-formed stream");
        Some(event.data_str()?.to_owned())
    }))
}

/// The next event, failing the test if it does not come.
async fn next(events: &mut Events) -> String {
    let next = timeout(HANG, events.next())
        .await
        .expect("an event in time");
    next.expect("an event before the end")
}

/// The reference server's flags for the bad clients: fast tokens, and a paused generator is
/// ended after 300 ms.
const BAD_CLIENT_FLAGS: [&str; 4] = ["--step-ms", "1", "--slow-deadline-ms", "300"];

/// Waits until no generator runs and no KV block is held; returns the stats then.
async fn nothing_leaked(addr: SocketAddr) -> serde_json::Value {
    wait_for(addr, "every generator released", |s| {
        s["generators_running"] == 0 && s["kv_blocks_in_use"] == 0
    })
    .await
}

/// The server still serves a whole h2 stream.
async fn still_serves(addr: SocketAddr) {
    let mut client = h2(connect(addr).await).await;
    let response = client.send_request(chat(addr, 5)).await.expect("a head");
    let data: Vec<_> = events(response).collect().await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
}

/// A client that opens streams on one connection and never reads its socket: every stream is
/// ended by the policy once h2's send buffers and the gates are full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_leaks_nothing() {
    let addr = reference::start(&BAD_CLIENT_FLAGS);
    let mut client = h2(Deaf(connect(addr).await)).await;
    // Never polled: the requests are sent, their responses never read.
    let pending: Vec<_> = (0..20)
        .map(|_| client.send_request(chat(addr, LONG)))
        .collect();
    wait_for(addr, "every stream starts", |s| s["streams_started"] == 20).await;
    let stats = nothing_leaked(addr).await;
    assert_eq!(stats["streams_ended_slow_consumer"], 20, "{stats}");
    drop((pending, client));
    still_serves(addr).await;
}

/// Bursts of streams reset before their head, and streams reset mid-stream: h2 may answer a
/// burst with `GOAWAY` (its rapid-reset guard), and the client reconnects; nothing leaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_resets_leaks_nothing() {
    let addr = reference::start(&BAD_CLIENT_FLAGS);
    let mut client = h2(connect(addr).await).await;
    for _ in 0..10 {
        if client.ready().await.is_err() {
            client = h2(connect(addr).await).await;
        }
        let burst: Vec<_> = (0..30)
            .map(|_| client.send_request(chat(addr, LONG)))
            .collect();
        // The connection's task sends their heads, then their resets.
        sleep(Duration::from_millis(2)).await;
        drop(burst);
        for _ in 0..10 {
            if let Ok(response) = client.send_request(chat(addr, LONG)).await {
                let _ = timeout(HANG, events(response).next()).await;
            }
        }
    }
    drop(client);
    let stats = nothing_leaked(addr).await;
    // Resets reached running generators (100 were reset mid-stream), and cancelled every one.
    assert!(stats["streams_started"].as_u64().unwrap() >= 50, "{stats}");
    assert_eq!(
        stats["streams_cancelled"], stats["streams_started"],
        "{stats}"
    );
    still_serves(addr).await;
}

/// Clients that shut down their sending side mid-stream, over h2 and HTTP/1.1: the server sees
/// the connection end, every stream is cancelled, nothing leaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_leaks_nothing() {
    let addr = reference::start(&BAD_CLIENT_FLAGS);
    let socket = connect(addr).await.into_std().unwrap();
    let write_side = socket.try_clone().unwrap();
    let mut client = h2(TcpStream::from_std(socket).unwrap()).await;
    let mut open = Vec::new();
    for _ in 0..3 {
        let response = client.send_request(chat(addr, LONG)).await;
        let mut events = events(response.expect("a head"));
        next(&mut events).await;
        open.push(events);
    }
    let mut http1 = RawResponse::post_json(addr, "/v1/chat/completions", &chat_body(LONG)).await;
    http1.expect_frame().await;
    write_side.shutdown(Shutdown::Write).unwrap();
    tokio::io::AsyncWriteExt::shutdown(&mut http1.stream)
        .await
        .unwrap();
    let stats = nothing_leaked(addr).await;
    assert_eq!(stats["streams_cancelled"], 4, "{stats}");
    drop((open, http1));
    still_serves(addr).await;
}

/// SIGINT/SIGTERM (the stop future) with h2 streams open on one connection, stalled between
/// tokens: each gets its terminal `shutdown` frame, the connection gets `GOAWAY`, and the server
/// returns with every stream released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_ends_every_open_h2_stream_visibly() {
    let flags = ["--step-ms", "1", "--stall-at", "3", "--stall-ms", "600000"];
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (addr, server, served) = reference::serve_until(&flags, async move {
        stopped.await.ok();
    });
    let mut client = h2(connect(addr).await).await;
    let mut open = Vec::new();
    for _ in 0..3 {
        let response = client.send_request(chat(addr, 100)).await;
        let mut events = events(response.expect("a head"));
        for i in 0..3 {
            assert!(next(&mut events).await.contains(&format!("\"t{i} \"")));
        }
        open.push(events);
    }
    stop.send(()).unwrap();
    for events in open {
        let rest: Vec<_> = events.collect().await;
        let last = rest.last().expect("a terminal event");
        assert!(last.contains(r#""type":"shutdown""#), "{rest:?}");
    }
    timeout(HANG, served)
        .await
        .expect("the server returns")
        .unwrap()
        .expect("served");
    assert_eq!(
        server.streams().stats().gates,
        0,
        "every stream was released"
    );
    // The client's connection task sees the close on its own time.
    let deadline = tokio::time::Instant::now() + HANG;
    while client.ready().await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the connection was closed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
