//! How far a generator gets ahead of a client that stopped reading, for the OS's default socket
//! settings, `TunedListener`'s defaults and a bounded `SO_SNDBUF`; and what each costs a client
//! that reads.
//!
//! `cargo run --release --example stopped_reader --features axum`
//!
//! An axum server streams ~150-byte OpenAI-style events from a generator that produces as fast
//! as the gate lets it (Backpressure, 64 events, 64 KiB). A raw TCP client reads the first event
//! and then stops reading, keeping its socket open. Once the generator has stopped producing,
//! the example reports how many tokens it produced, where their bytes are (the gate's buffer,
//! the server's kernel: unsent and in flight, the client's kernel receive queue), and how long
//! the same run-ahead takes at a 5 ms decode step: the time a slow-consumer deadline waits
//! before it even starts counting. Then a client that reads takes 100,000 events as fast as it
//! can, three times per setting, interleaved: the median events/s.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use axum::serve::ListenerExt;
use streamgate::sse::SseEvent;
use streamgate::transport::{ListenOptions, SendQueue, SseResponse, TunedListener};
use streamgate::{Gate, GateExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One token's event, as an OpenAI-compatible server frames it.
fn chunk(i: u64) -> String {
    format!(
        "{{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}},\"finish_reason\":null}}]}}"
    )
}

/// The socket settings compared.
fn settings() -> [(&'static str, ListenOptions); 3] {
    let os = ListenOptions::default()
        .notsent_lowat(None)
        .user_timeout(None)
        .keepalive(None);
    [
        ("OS defaults", os),
        ("TunedListener defaults", ListenOptions::default()),
        (
            "SO_SNDBUF 16 KiB (Linux: 32)",
            os.send_buffer(Some(16 * 1024)),
        ),
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

async fn server(options: ListenOptions, limit: u64) -> Server {
    let produced = Arc::new(AtomicU64::new(0));
    let produced_bytes = Arc::new(AtomicU64::new(0));
    let gate_bytes = Arc::new(AtomicU64::new(0));
    let app = {
        let (produced, produced_bytes, gate_bytes) =
            (produced.clone(), produced_bytes.clone(), gate_bytes.clone());
        Router::new().route(
            "/stream",
            get(move || {
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
    let queue = Arc::new(Mutex::new(None));
    let seen = queue.clone();
    let listener = listener.tap_io(move |io| *seen.lock().unwrap() = Some(io.send_queue()));
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
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

async fn run_ahead(options: ListenOptions) -> RunAhead {
    let server = server(options, u64::MAX).await;
    let client = stop_after_first_event(server.addr).await;
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
    let server = server(options, events).await;
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
    for (label, options) in settings() {
        let run = run_ahead(options).await;
        let client_kernel = run
            .bytes
            .saturating_sub(run.gate + run.unsent + run.in_flight);
        println!(
            "{label:<30} {:>6} tokens ahead ({:>5} KiB): gate {:>3} KiB, server kernel {:>5} KiB unsent + {:>4} KiB in flight, client kernel ~{:>4} KiB; at 5 ms/token {:>5.1} s",
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
    println!("a client that reads: {EVENTS} events, median of 3 runs, interleaved");
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
            "{label:<30} {rate:>9.0} events/s ({:.2}x the OS defaults)",
            rate / baseline
        );
    }
    println!("({:.1} s)", started.elapsed().as_secs_f64());
}
