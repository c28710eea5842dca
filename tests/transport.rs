//! The transports over real sockets: axum and hyper servers on 127.0.0.1, raw TCP clients.
#![cfg(all(feature = "axum", feature = "io"))]

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use common::{HANG, RawResponse};
use streamgate::sse::{SseEvent, SseFrame};
use streamgate::transport::{ListenOptions, SseBody, SseResponse, TunedListener, unsent_bytes};
use streamgate::{Consumer, EndReason, Gate, GateExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::timeout;

/// Serves `app` on a tuned listener on 127.0.0.1; returns its address.
async fn serve(app: Router) -> SocketAddr {
    let listener =
        TunedListener::bind(([127, 0, 0, 1], 0).into(), ListenOptions::default()).expect("bind");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A generator that sends token i only once the test says so on `go`.
fn stepped(mut go: mpsc::UnboundedReceiver<()>, n: usize) -> Consumer<SseEvent> {
    Gate::new().spawn(move |_, mut tx| async move {
        for i in 0..n {
            if go.recv().await.is_none() {
                break;
            }
            tx.send(SseEvent::data(format!("t{i} "))).await?;
        }
        Ok::<_, streamgate::SendError<SseEvent>>(())
    })
}

/// The handler's consumer, handed over by the test.
type Slot = Arc<Mutex<Option<Consumer<SseEvent>>>>;

fn axum_app(slot: Slot, heartbeat: Duration) -> Router {
    Router::new().route(
        "/stream",
        get(move || {
            let consumer = slot
                .lock()
                .unwrap()
                .take()
                .expect("one request per consumer");
            async move { SseResponse::new(consumer.sse().heartbeat(heartbeat)) }
        }),
    )
}

/// Serves `consumer` to the first request for `/stream`, with heartbeats every `heartbeat`.
async fn serve_one(consumer: Consumer<SseEvent>, heartbeat: Duration) -> SocketAddr {
    serve(axum_app(Arc::new(Mutex::new(Some(consumer))), heartbeat)).await
}

/// Serves one stream with plain hyper, on a connection accepted from a tuned listener.
async fn hyper_server(consumer: Consumer<SseEvent>) -> SocketAddr {
    let listener =
        TunedListener::bind(([127, 0, 0, 1], 0).into(), ListenOptions::default()).expect("bind");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        assert!(
            stream.get_ref().nodelay().unwrap(),
            "accepted sockets have TCP_NODELAY"
        );
        let consumer = Mutex::new(Some(consumer));
        let service = hyper::service::service_fn(move |_request| {
            let consumer = consumer.lock().unwrap().take().unwrap();
            let body = SseBody::new(consumer.sse());
            async move {
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(body)
                        .unwrap(),
                )
            }
        });
        hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
            .await
            .ok();
    });
    addr
}

/// The client reads event i, one HTTP chunk holding exactly that frame, before the generator
/// is allowed to produce i+1.
async fn check_one_chunk_per_event(mut response: RawResponse, go: mpsc::UnboundedSender<()>) {
    for i in 0..20 {
        go.send(()).unwrap();
        let chunk = timeout(HANG, response.next_chunk())
            .await
            .expect("event i arrives while the generator waits")
            .expect("a chunk");
        assert_eq!(
            String::from_utf8(chunk).unwrap(),
            format!("id: {i}\ndata: t{i} \n\n")
        );
    }
    drop(go);
    assert_eq!(response.rest().await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_sends_each_event_before_the_next_exists() {
    let (go, steps) = mpsc::unbounded_channel();
    let slot = Arc::new(Mutex::new(Some(stepped(steps, 20))));
    let addr = serve(axum_app(slot, Duration::from_secs(60))).await;
    let response = RawResponse::get(addr, "/stream", "").await;
    assert_eq!(response.status(), 200);
    common::assert_sse_headers(&response);
    assert_eq!(
        response.header("transfer-encoding").as_deref(),
        Some("chunked")
    );
    check_one_chunk_per_event(response, go).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_sends_each_event_before_the_next_exists() {
    let (go, steps) = mpsc::unbounded_channel();
    let addr = hyper_server(stepped(steps, 20)).await;
    let response = RawResponse::get(addr, "/", "").await;
    assert_eq!(
        response.header("transfer-encoding").as_deref(),
        Some("chunked")
    );
    check_one_chunk_per_event(response, go).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_end_is_a_visible_error_frame_before_eof() {
    let consumer = Gate::new().spawn(|_, mut tx| async move {
        tx.send(SseEvent::data("t0 ")).await.ok();
        tx.send(SseEvent::data("t1 ")).await.ok();
        Err(std::io::Error::other("decode failed"))
    });
    let addr = serve_one(consumer, Duration::from_secs(60)).await;
    let mut response = RawResponse::get(addr, "/stream", "").await;
    assert_eq!(
        response.rest().await,
        [
            "id: 0\ndata: t0 \n\n",
            "id: 1\ndata: t1 \n\n",
            "event: error\ndata: {\"error\":{\"type\":\"generator_error\",\"message\":\"stream ended: generator failed\"}}\n\n",
        ]
    );
}

/// A consumer whose generator sends one token and then stalls for ever; `released` fires with
/// the end reason when its release hook runs.
fn stalled() -> (Consumer<SseEvent>, oneshot::Receiver<EndReason>) {
    let (released, on_release) = oneshot::channel();
    let consumer = Gate::new()
        .on_release(move |reason, _| {
            released.send(reason).ok();
        })
        .spawn(|_, mut tx| async move {
            tx.send(SseEvent::data("t0 ")).await.ok();
            std::future::pending::<()>().await;
            Ok::<(), std::io::Error>(())
        });
    (consumer, on_release)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_flow_during_a_stall() {
    let (consumer, _released) = stalled();
    let addr = serve_one(consumer, Duration::from_millis(50)).await;
    let mut response = RawResponse::get(addr, "/stream", "").await;
    assert_eq!(response.expect_frame().await, "id: 0\ndata: t0 \n\n");
    for _ in 0..3 {
        assert_eq!(response.expect_frame().await, ":\n");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_vanishes_during_a_stall_cancels_the_generator() {
    let (consumer, released) = stalled();
    let addr = serve_one(consumer, Duration::from_millis(50)).await;
    let mut response = RawResponse::get(addr, "/stream", "").await;
    assert_eq!(response.expect_frame().await, "id: 0\ndata: t0 \n\n");
    // The generator is silent; the client closes its socket. Only a heartbeat's failed write
    // can tell the server.
    drop(response);
    let reason = timeout(HANG, released)
        .await
        .expect("the generator is released")
        .unwrap();
    assert_eq!(reason, EndReason::ConsumerGone);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tower_http_compression_leaves_the_stream_alone() {
    let (go, steps) = mpsc::unbounded_channel();
    let slot = Arc::new(Mutex::new(Some(stepped(steps, 20))));
    let app = axum_app(slot, Duration::from_secs(60))
        .layer(tower_http::compression::CompressionLayer::new());
    let addr = serve(app).await;
    let response = RawResponse::get(addr, "/stream", "Accept-Encoding: gzip\r\n").await;
    assert_eq!(response.header("content-encoding"), None);
    check_one_chunk_per_event(response, go).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsent_bytes_tell_a_stopped_reader_from_a_reading_one() {
    let listener = TunedListener::bind(
        ([127, 0, 0, 1], 0).into(),
        ListenOptions::default().send_buffer(Some(16 * 1024)),
    )
    .unwrap();
    let addr = listener.local_addr().unwrap();
    let client = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let mut writer = streamgate::transport::FrameWriter::new(server);
    // The client reads nothing: frames pile up in the kernel until writes would block.
    let frame = SseFrame::new(
        SseEvent::data("x".repeat(1000)).encode(),
        streamgate::Kind::Visible,
        None,
    );
    let mut written = 0;
    while timeout(Duration::from_millis(200), writer.write_frame(&frame))
        .await
        .is_ok()
    {
        written += 1;
        assert!(written < 100_000, "a stopped reader must block the writer");
    }
    let held = unsent_bytes(writer.get_ref()).unwrap();
    assert!(
        held > 0,
        "the kernel holds what the stopped reader did not take"
    );
    // Once the client reads everything, nothing is held.
    let mut client = client;
    let mut sink = vec![0u8; 1 << 20];
    while unsent_bytes(writer.get_ref()).unwrap() > 0 {
        use tokio::io::AsyncReadExt;
        let n = timeout(HANG, client.read(&mut sink))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "the held bytes reach the client");
    }
}
