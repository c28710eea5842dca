//! A Prometheus `/metrics` endpoint fed by the probes, next to a streaming endpoint.
//!
//! `cargo run --example metrics --features axum,metrics` streams a few requests through
//! itself, prints its `/metrics` page and exits; add `-- --serve 127.0.0.1:9000` to keep serving.
//!
//! The probe exports through the `metrics` facade; `metrics-exporter-prometheus` renders it.
//! The names, units and labels are listed in the `streamgate::probe` docs. Handles are looked
//! up when each stream starts, so the recorder may be installed before or after the hop probes
//! are created.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use streamgate::probe::{HopProbe, METRIC_BUCKETS, describe_metrics};
use streamgate::sse::SseEvent;
use streamgate::transport::{ListenOptions, SseResponse, TunedListener};
use streamgate::{Gate, GateExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main]
async fn main() {
    // The crate's buckets reach from 100 µs to 10 minutes; without them the exporter keeps
    // short-window summaries, in which a 5 s stall can vanish.
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Prefix("streamgate_".into()), &METRIC_BUCKETS)
        .expect("valid buckets")
        .install_recorder()
        .expect("no other recorder is installed");
    describe_metrics();
    // This exporter keeps every histogram sample until an upkeep (or a scrape) folds it into
    // its bucket: run one every second, or memory grows with every event between scrapes.
    let upkeep = prometheus.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            upkeep.run_upkeep();
        }
    });
    let hop = HopProbe::new("worker.write").stall_threshold(Duration::from_millis(100));

    let stream_hop = hop.clone();
    let app = Router::new()
        .route(
            "/stream",
            get(move || {
                let hop = stream_hop.clone();
                async move {
                    let events = Gate::new()
                        .stamp_events(true)
                        .spawn(|_, mut tx| async move {
                            for i in 0..50 {
                                // One slow step: a 150 ms decode stall at token 30.
                                let step = if i == 30 { 150 } else { 2 };
                                tokio::time::sleep(Duration::from_millis(step)).await;
                                tx.send(SseEvent::data(format!("t{i} "))).await?;
                            }
                            Ok::<_, streamgate::SendError<SseEvent>>(())
                        });
                    SseResponse::new(events.probe(&hop, "demo").sse())
                }
            }),
        )
        .route(
            "/metrics",
            get(move || std::future::ready(prometheus.render())),
        );

    let serve: Option<SocketAddr> = match std::env::args().skip(1).collect::<Vec<_>>().as_slice() {
        [flag, addr] if flag == "--serve" => {
            Some(addr.parse().expect("an address like 127.0.0.1:9000"))
        }
        [] => None,
        _ => {
            eprintln!("usage: metrics [--serve ADDR]");
            std::process::exit(2);
        }
    };
    let addr = serve.unwrap_or(([127, 0, 0, 1], 0).into());
    let listener = TunedListener::bind(addr, ListenOptions::default()).expect("bind");
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    if serve.is_some() {
        println!("listening on http://{addr} (/stream, /metrics)");
        server.await.unwrap().unwrap();
        return;
    }
    for _ in 0..3 {
        get_text(addr, "/stream").await;
    }
    let page = get_text(addr, "/metrics").await;
    for line in page
        .lines()
        .filter(|l| l.starts_with("streamgate_") && !l.contains("_bucket"))
    {
        println!("{line}");
    }
}

/// A minimal HTTP/1.1 GET on a fresh connection; returns the response as text.
async fn get_text(addr: SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    String::from_utf8_lossy(&response).into_owned()
}
