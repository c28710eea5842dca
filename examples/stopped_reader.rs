//! How far a generator gets ahead of a client that stopped reading, over HTTP/1.1 for the OS's
//! default socket settings, `TunedListener`'s defaults and a bounded `SO_SNDBUF`, and over
//! HTTP/2 for h2's send buffer and the client's stream window; and what each HTTP/1.1 setting
//! costs a client that reads.
//!
//! `cargo run --release --example stopped_reader --features axum`
//!
//! A `transport::Server` streams ~150-byte OpenAI-style events from a generator that produces
//! as fast as the gate lets it (Backpressure, 64 events, 64 KiB). A client reads the first event
//! and then stops reading, keeping its connection open (over HTTP/1.1 a raw TCP client; over
//! HTTP/2 hyper's client, which keeps reading the socket but stops taking the stream's data, so
//! its stream window closes). Once the generator has stopped producing, the example reports how
//! many tokens it produced, where their bytes are (the gate's buffer, the server's kernel:
//! unsent and in flight, and the rest on the client: its kernel receive queue, or h2's buffers
//! on either side), and how long the same run-ahead takes at a 5 ms decode step: the time a
//! slow-consumer deadline waits before it even starts counting. Then an HTTP/1.1 client that
//! reads takes 100,000 events as fast as it can, three times per setting, interleaved: the
//! median events/s.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::{Extension, Router};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use streamgate::sse::SseEvent;
use streamgate::transport::{
    DEFAULT_H2_SEND_BUFFER, ListenOptions, SendQueue, Server as HttpServer, SseResponse,
    TunedListener,
};
use streamgate::{Gate, GateExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One token's event, as an OpenAI-compatible server frames it.
fn chunk(i: u64) -> String {
    format!(
        "{{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}},\"finish_reason\":null}}]}}"
    )
}

/// The socket settings compared over HTTP/1.1.
fn settings() -> [(&'static str, ListenOptions); 3] {
    let os = ListenOptions::default()
        .notsent_lowat(None)
        .user_timeout(None)
        .keepalive(None);
    [
        ("h1, OS defaults", os),
        ("h1, TunedListener defaults", ListenOptions::default()),
        (
            "h1, SO_SNDBUF 16 KiB (Linux: 32)",
            os.send_buffer(Some(16 * 1024)),
        ),
    ]
}

/// An HTTP/2 setting: the server's h2 send buffer per stream and the client's stream window.
struct H2 {
    label: &'static str,
    send_buffer: usize,
    window: u32,
}

/// The HTTP/2 settings compared, all on `TunedListener`'s defaults.
fn h2_settings() -> [H2; 3] {
    [
        H2 {
            label: "h2, window 64 KiB, h2 buffer 64 KiB",
            send_buffer: DEFAULT_H2_SEND_BUFFER,
            window: 65_535,
        },
        H2 {
            label: "h2, window 64 KiB, h2 buffer 400 KiB",
            send_buffer: 400 * 1024,
            window: 65_535,
        },
        H2 {
            label: "h2, window 2 MiB, h2 buffer 64 KiB",
            send_buffer: DEFAULT_H2_SEND_BUFFER,
            window: 2 * 1024 * 1024,
        },
    ]
}

/// A server whose generator produces `limit` events as fast as the gate takes them.
struct Server {
    addr: SocketAddr,
    produced: Arc<AtomicU64>,
    produced_bytes: Arc<AtomicU64>,
    gate_bytes: Arc<AtomicU64>,
    queue: Arc<Mutex<Option<SendQueue>>>,
    task: tokio::task::JoinHandle<()>,
}

async fn server(options: ListenOptions, h2_send_buffer: usize, limit: u64) -> Server {
    let produced = Arc::new(AtomicU64::new(0));
    let produced_bytes = Arc::new(AtomicU64::new(0));
    let gate_bytes = Arc::new(AtomicU64::new(0));
    let queue = Arc::new(Mutex::new(None));
    let app = {
        let (produced, produced_bytes, gate_bytes) =
            (produced.clone(), produced_bytes.clone(), gate_bytes.clone());
        let seen = queue.clone();
        Router::new().route(
            "/stream",
            get(move |Extension(queue): Extension<SendQueue>| {
                *seen.lock().unwrap() = Some(queue);
                let (produced, produced_bytes) = (produced.clone(), produced_bytes.clone());
                let consumer = Gate::new().spawn(move |_, mut tx| async move {
                    for i in 0..limit {
                        let event = SseEvent::data(chunk(i));
                        // On the wire: the frame inside one HTTP chunk ("<hex>\r\n" ... "\r\n").
                        let frame = event.encode().len();
                        let len = (frame + format!("{frame:x}").len() + 4) as u64;
                        tx.send(event).await?;
                        produced.fetch_add(1, Ordering::SeqCst);
                        produced_bytes.fetch_add(len, Ordering::SeqCst);
                    }
                    Ok::<_, streamgate::SendError<SseEvent>>(())
                });
                let handle = consumer.handle();
                let gate_bytes = gate_bytes.clone();
                tokio::spawn(async move {
                    loop {
                        let stats = handle.stats();
                        gate_bytes.store(stats.buffered_bytes as u64, Ordering::SeqCst);
                        if stats.end_reason.is_some() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                });
                async move { SseResponse::new(consumer.sse()) }
            }),
        )
    };
    let listener = TunedListener::bind(([127, 0, 0, 1], 0).into(), options).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = HttpServer::new().h2_send_buffer(h2_send_buffer);
    let task = tokio::spawn(server.serve(listener, app, std::future::pending()));
    Server {
        addr,
        produced,
        produced_bytes,
        gate_bytes,
        queue,
        task,
    }
}

struct RunAhead {
    tokens: u64,
    /// Wire bytes of the produced events, HTTP chunk framing included.
    bytes: u64,
    gate: u64,
    unsent: u64,
    in_flight: u64,
}

async fn run_ahead(options: ListenOptions, h2: Option<&H2>) -> RunAhead {
    let send_buffer = h2.map_or(DEFAULT_H2_SEND_BUFFER, |h2| h2.send_buffer);
    let server = server(options, send_buffer, u64::MAX).await;
    // The stopped client, kept open while measured.
    let client: Box<dyn std::any::Any> = match h2 {
        None => Box::new(stop_after_first_event(server.addr).await),
        Some(h2) => Box::new(h2_stop_after_first_event(server.addr, h2.window).await),
    };
    // Wait until the generator has stopped producing: no progress for half a second.
    let mut last = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = server.produced.load(Ordering::SeqCst);
        if now == last {
            break;
        }
        last = now;
    }
    let queue = server.queue.lock().unwrap().clone().expect("connected");
    let unsent = queue.unsent().unwrap_or(0) as u64;
    let unacknowledged = queue.unacknowledged().unwrap_or(0) as u64;
    let result = RunAhead {
        tokens: server.produced.load(Ordering::SeqCst),
        bytes: server.produced_bytes.load(Ordering::SeqCst),
        gate: server.gate_bytes.load(Ordering::SeqCst),
        unsent,
        in_flight: unacknowledged.saturating_sub(unsent),
    };
    drop(client);
    server.task.abort();
    result
}

/// Over HTTP/2: takes the first event's data frame, then takes nothing more from the stream
/// (its window closes) while the connection stays served.
async fn h2_stop_after_first_event(addr: SocketAddr, window: u32) -> hyper::body::Incoming {
    let socket = TcpStream::connect(addr).await.unwrap();
    socket.set_nodelay(true).unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(window)
        .handshake(TokioIo::new(socket))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = http::Request::get(format!("http://{addr}/stream"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let mut body = sender.send_request(request).await.unwrap().into_body();
    body.frame().await.expect("a first frame").unwrap();
    body
}

/// Sends the request, reads until the first event, then stops reading (socket left open).
async fn stop_after_first_event(addr: SocketAddr) -> TcpStream {
    let mut client = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET /stream HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    client.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buffer = [0u8; 1];
    // Byte by byte, so that nothing past the first event is taken from the kernel.
    while !seen.ends_with(b"\n\n") || !seen.windows(5).any(|w| w == b"data:") {
        client.read_exact(&mut buffer).await.unwrap();
        seen.push(buffer[0]);
    }
    client
}

/// Events per second of a client that reads `events` events as fast as it can.
async fn throughput(options: ListenOptions, events: u64) -> f64 {
    let server = server(options, DEFAULT_H2_SEND_BUFFER, events).await;
    let mut client = TcpStream::connect(server.addr).await.unwrap();
    client.set_nodelay(true).unwrap();
    let request = format!("GET /stream HTTP/1.1\r\nHost: {}\r\n\r\n", server.addr);
    client.write_all(request.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut buffer = vec![0u8; 1 << 16];
    let mut tail = Vec::new();
    // The body ends with the terminating chunk; every event is counted by the generator.
    loop {
        let n = client.read(&mut buffer).await.unwrap();
        assert!(n > 0, "the server closed before the end of the body");
        tail.extend_from_slice(&buffer[..n]);
        if tail.ends_with(b"\r\n0\r\n\r\n") {
            break;
        }
        let keep = tail.len().saturating_sub(8);
        tail.drain(..keep);
    }
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(server.produced.load(Ordering::SeqCst), events);
    server.task.abort();
    events as f64 / elapsed
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main]
async fn main() {
    let started = Instant::now();
    println!("a client reads one event, then stops reading; the generator runs until held back");
    let runs = settings()
        .into_iter()
        .map(|(label, options)| (label, options, None))
        .chain(
            h2_settings()
                .into_iter()
                .map(|h2| (h2.label, ListenOptions::default(), Some(h2))),
        );
    for (label, options, h2) in runs {
        let run = run_ahead(options, h2.as_ref()).await;
        let client_kernel = run
            .bytes
            .saturating_sub(run.gate + run.unsent + run.in_flight);
        println!(
            "{label:<38} {:>6} tokens ahead ({:>5} KiB): gate {:>3} KiB, server kernel {:>5} KiB unsent + {:>4} KiB in flight, rest ~{:>4} KiB; at 5 ms/token {:>5.1} s",
            run.tokens,
            run.bytes / 1024,
            run.gate / 1024,
            run.unsent / 1024,
            run.in_flight / 1024,
            client_kernel / 1024,
            run.tokens as f64 * 0.005,
        );
    }
    const EVENTS: u64 = 100_000;
    println!("an HTTP/1.1 client that reads: {EVENTS} events, median of 3 runs, interleaved");
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); settings().len()];
    for _ in 0..3 {
        for (rates, (_, options)) in rates.iter_mut().zip(settings()) {
            rates.push(throughput(options, EVENTS).await);
        }
    }
    let baseline = median(rates[0].clone());
    for (rates, (label, _)) in rates.into_iter().zip(settings()) {
        let rate = median(rates);
        println!(
            "{label:<38} {rate:>9.0} events/s ({:.2}x the OS defaults)",
            rate / baseline
        );
    }
    println!("({:.1} s)", started.elapsed().as_secs_f64());
}
