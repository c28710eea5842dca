//! SSE costs against what people use today, in the same run:
//! - per event: the gate + SSE encoding + heartbeat + hyper body, versus tokio mpsc + axum's
//!   `Event` through axum's `Sse` body with `KeepAlive`;
//! - decoding throughput versus the `eventsource-stream` crate, with the input whole and in
//!   64-byte pieces, and one long line arriving in 64-byte pieces.
//!
//! `cargo bench --all-features --bench sse`

mod common;

use std::convert::Infallible;
use std::hint::black_box;
use std::time::Duration;

use axum::response::IntoResponse;
use axum::response::sse::{Event as AxumEvent, KeepAlive, Sse};
use bytes::Bytes;
use common::runtimes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use streamgate::probe::HopProbe;
use streamgate::sse::{SseDecoder, SseEvent};
use streamgate::transport::SseBody;
use streamgate::{Gate, GateExt};
use tokio::runtime::Runtime;

const EVENTS: u64 = 10_000;

fn token(i: u64) -> String {
    format!("t{i} ")
}

/// Drains an HTTP body frame by frame; returns the bytes and the frames seen.
async fn drain<B>(body: B) -> (usize, usize)
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let mut body = std::pin::pin!(body);
    let (mut bytes, mut frames) = (0, 0);
    while let Some(frame) = body.frame().await {
        bytes += frame.unwrap().into_data().map_or(0, |data| data.len());
        frames += 1;
    }
    (bytes, frames)
}

/// tokio mpsc(64) of axum `Event`s through axum's `Sse` with the default keep-alive.
async fn axum_path() -> (usize, usize) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<AxumEvent, Infallible>>(64);
    tokio::spawn(async move {
        for i in 0..EVENTS {
            if tx
                .send(Ok(AxumEvent::default().data(token(i))))
                .await
                .is_err()
            {
                break;
            }
        }
    });
    let events = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let response = Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response();
    let consumer = tokio::spawn(drain(response.into_body()));
    consumer.await.unwrap()
}

/// The gate of 64 events, SSE encoding (no ids), a 15 s heartbeat, and `SseBody`; with `probe`, the
/// frames are recorded at a hop on their way into the body.
async fn gate_path(probe: Option<HopProbe>) -> (usize, usize) {
    let events = Gate::new().max_events(64).spawn(|_, mut tx| async move {
        for i in 0..EVENTS {
            tx.send(SseEvent::data(token(i))).await?;
        }
        Ok::<_, streamgate::SendError<SseEvent>>(())
    });
    // Without ids, as the baseline's events have none: the same bytes, so the same work
    // (ids are `.sse()`'s default; axum's `Event::id` would be one more string per event).
    let frames = events
        .sse()
        .without_ids()
        .heartbeat(Duration::from_secs(15));
    let consumer = match probe {
        None => tokio::spawn(drain(SseBody::new(frames))),
        Some(hop) => tokio::spawn(drain(SseBody::new(frames.probe(&hop, "bench")))),
    };
    consumer.await.unwrap()
}

fn per_event(c: &mut Criterion) {
    for (flavor, rt) in runtimes() {
        let expected = rt.block_on(axum_path());
        assert_eq!(expected.1 as u64, EVENTS);
        assert_eq!(
            rt.block_on(gate_path(None)),
            expected,
            "the same bytes in the same frames"
        );
        let mut group = c.benchmark_group(format!("encode_per_event/{flavor}"));
        group.throughput(Throughput::Elements(EVENTS));
        group.bench_function("axum_sse_mpsc_64", |b| {
            b.iter(|| assert_eq!(black_box(rt.block_on(axum_path())), expected))
        });
        group.bench_function("gate_sse_body_64", |b| {
            b.iter(|| assert_eq!(black_box(rt.block_on(gate_path(None))), expected))
        });
        let hop = HopProbe::new("bench.write");
        group.bench_function("gate_sse_body_64_probed", |b| {
            b.iter(|| {
                assert_eq!(
                    black_box(rt.block_on(gate_path(Some(hop.clone())))),
                    expected
                )
            })
        });
        group.finish();
    }
}

/// A stream of OpenAI-style chunk events, as a gateway receives it.
fn upstream(events: usize) -> Vec<u8> {
    let mut input = Vec::new();
    for i in 0..events {
        input.extend_from_slice(
            format!(
                "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}},\"finish_reason\":null}}]}}\n\n"
            )
            .as_bytes(),
        );
    }
    input
}

fn pieces(input: &[u8], size: usize) -> Vec<Bytes> {
    input.chunks(size).map(Bytes::copy_from_slice).collect()
}

fn ours(rt: &Runtime, pieces: &[Bytes]) -> usize {
    let stream = futures_util::stream::iter(pieces.iter().cloned().map(Ok::<_, Infallible>));
    rt.block_on(
        stream
            // Limits above the longest line benchmarked.
            .sse_events_with(SseDecoder::new().max_line(4 << 20).max_event(4 << 20))
            .fold(0, |n, event| async move {
                n + event.unwrap().data_str().map_or(0, str::len)
            }),
    )
}

fn theirs(rt: &Runtime, pieces: &[Bytes]) -> usize {
    let stream = futures_util::stream::iter(pieces.iter().cloned().map(Ok::<_, Infallible>));
    rt.block_on(
        stream
            .eventsource()
            .fold(0, |n, event| async move { n + event.unwrap().data.len() }),
    )
}

fn decoding(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let input = upstream(5_000);
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Bytes(input.len() as u64));
    for (label, size) in [("whole", input.len()), ("64_byte_pieces", 64)] {
        let pieces = pieces(&input, size);
        let expected = theirs(&rt, &pieces);
        assert_eq!(ours(&rt, &pieces), expected);
        group.bench_with_input(
            BenchmarkId::new("eventsource_stream", label),
            &pieces,
            |b, p| b.iter(|| assert_eq!(theirs(&rt, black_box(p)), expected)),
        );
        group.bench_with_input(BenchmarkId::new("streamgate", label), &pieces, |b, p| {
            b.iter(|| assert_eq!(ours(&rt, black_box(p)), expected))
        });
    }
    group.finish();

    // One long line in 64-byte pieces: linear (ours) or quadratic in the line's length.
    let mut group = c.benchmark_group("long_line_64_byte_pieces");
    group.sample_size(10);
    for kib in [64, 256, 1024] {
        let mut input = b"data: ".to_vec();
        input.extend(std::iter::repeat_n(b'x', kib * 1024));
        input.extend_from_slice(b"\n\n");
        let pieces = pieces(&input, 64);
        group.throughput(Throughput::Bytes(input.len() as u64));
        group.bench_with_input(BenchmarkId::new("streamgate", kib), &pieces, |b, p| {
            b.iter(|| assert_eq!(ours(&rt, black_box(p)), kib * 1024))
        });
        if kib <= 256 {
            group.bench_with_input(
                BenchmarkId::new("eventsource_stream", kib),
                &pieces,
                |b, p| b.iter(|| assert_eq!(theirs(&rt, black_box(p)), kib * 1024)),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, per_event, decoding);
criterion_main!(benches);
