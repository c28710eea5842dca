//! How far a generator gets ahead of a client that stopped reading, with and without a bounded
//! socket send buffer.
//!
//! `cargo run --release --example stopped_reader --features axum`
//!
//! An axum server streams ~150-byte OpenAI-style events from a generator that produces as fast
//! as the gate lets it (Backpressure, 64 events). A raw TCP client reads the first event and
//! then stops reading, keeping its socket open. Once the generator has stopped producing, the
//! example reports how many tokens it produced, where their bytes are (the gate's buffer, the
//! server's kernel send queue, the client's kernel receive queue), and how long the same run
//! ahead would take at a 5 ms decode step, which is how long a slow-consumer deadline waits
//! before it even starts counting.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use axum::serve::ListenerExt;
use streamgate::sse::SseEvent;
use streamgate::transport::{ListenOptions, SseResponse, TunedListener, unsent_bytes};
use streamgate::{Gate, GateExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One token's event, as an OpenAI-compatible server frames it.
fn chunk(i: u64) -> String {
    format!(
        "{{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}},\"finish_reason\":null}}]}}"
    )
}

struct Run {
    tokens: u64,
    /// Wire bytes of the produced events, HTTP chunk framing included.
    bytes: u64,
    gate_bytes: usize,
    server_kernel: usize,
}

async fn run(send_buffer: Option<u32>) -> Run {
    let produced = Arc::new(AtomicU64::new(0));
    let produced_bytes = Arc::new(AtomicU64::new(0));
    let gate_bytes = Arc::new(AtomicU64::new(0));
    let server_fd = Arc::new(AtomicI32::new(-1));
    let app = {
        let (produced, produced_bytes, gate_bytes) =
            (produced.clone(), produced_bytes.clone(), gate_bytes.clone());
        Router::new().route(
            "/stream",
            get(move || {
                let (produced, produced_bytes) = (produced.clone(), produced_bytes.clone());
                let consumer = Gate::new().spawn(move |_, mut tx| async move {
                    for i in 0.. {
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
    let options = ListenOptions::default().send_buffer(send_buffer);
    let listener = TunedListener::bind(([127, 0, 0, 1], 0).into(), options).unwrap();
    let addr = listener.local_addr().unwrap();
    let fd = server_fd.clone();
    let listener = listener.tap_io(move |io| fd.store(io.as_raw_fd(), Ordering::SeqCst));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let client = stop_after_first_event(addr).await;
    // Wait until the generator has stopped producing: no progress for half a second.
    let mut last = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = produced.load(Ordering::SeqCst);
        if now == last {
            break;
        }
        last = now;
    }
    let fd: RawFd = server_fd.load(Ordering::SeqCst);
    let result = Run {
        tokens: produced.load(Ordering::SeqCst),
        bytes: produced_bytes.load(Ordering::SeqCst),
        gate_bytes: gate_bytes.load(Ordering::SeqCst) as usize,
        server_kernel: unsent_bytes(&fd).unwrap_or(0),
    };
    drop(client);
    server.abort();
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

fn report(label: &str, run: &Run) {
    let client_kernel = run
        .bytes
        .saturating_sub((run.gate_bytes + run.server_kernel) as u64);
    println!(
        "{label:<28} {:>6} tokens ahead ({:>5} KiB): gate {:>3} KiB, server kernel {:>5} KiB, client kernel ~{:>4} KiB; at 5 ms/token that is {:>5.1} s of decoding",
        run.tokens,
        run.bytes / 1024,
        run.gate_bytes / 1024,
        run.server_kernel / 1024,
        client_kernel / 1024,
        run.tokens as f64 * 0.005,
    );
}

#[tokio::main]
async fn main() {
    let started = Instant::now();
    println!("a client reads one event, then stops reading; the generator runs until held back");
    report("default SO_SNDBUF", &run(None).await);
    report("SO_SNDBUF 16 KiB (Linux: 32)", &run(Some(16 * 1024)).await);
    println!("({:.1} s)", started.elapsed().as_secs_f64());
}
