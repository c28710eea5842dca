//! OpenTelemetry export end to end: a worker hop and a gateway hop over real HTTP on loopback,
//! the SDK exporting over OTLP/gRPC to a real receiver (a tonic collector service) running in
//! this process. What the receiver got is what a tracing backend would get.
#![cfg(all(feature = "otel", feature = "hyper"))]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_core::Stream;
use futures_util::StreamExt;
use http_body_util::{BodyStream, Empty};
use hyper::body::Incoming;
use hyper::header::{HOST, HeaderMap};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{MetricExporter, SpanExporter, WithExportConfig};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue as ProtoKeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::metrics::v1::{
    HistogramDataPoint, Metric, metric, number_data_point,
};
use opentelemetry_proto::tonic::trace::v1::{Span, status};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use streamgate::otel::{self, OtelHop};
use streamgate::probe::HopProbe;
use streamgate::sse::{DecodeError, SseEvent};
use streamgate::transport::SseBody;
use streamgate::{Gate, GateExt, SendError};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::sleep;

/// The gap at or above which the hops count a stall.
const STALL: Duration = Duration::from_millis(160);

/// The worker's delays before each event of a stream that completes: ten events, one stall.
const DELAYS_MS: [u64; 10] = [20, 2, 2, 2, 2, 300, 2, 2, 2, 2];

/// Events a client reads of an endless stream before it leaves.
const READ_BEFORE_LEAVING: usize = 5;

/// The reason a stream ends with when its consumer leaves before its end.
const GONE: &str = "consumer_gone";

/// How long a step may take before the test fails instead of hanging.
const HANG: Duration = Duration::from_secs(20);

/// The trace a client's request arrives with at the gateway.
const CLIENT_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CLIENT_SPAN: &str = "b7ad6b7169203331";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_and_genai_histograms_reach_an_otlp_receiver_across_two_hops() {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let (receiver, collector) = Receiver::start().await;
    let telemetry = Telemetry::new(collector);
    let hop = |name: &'static str| {
        let otel = OtelHop::new(
            telemetry.tracers.tracer("streamgate-test"),
            &telemetry.meters.meter("streamgate-test"),
        )
        .attribute(KeyValue::new("gen_ai.operation.name", "chat"));
        HopProbe::new(name).stall_threshold(STALL).otel(otel)
    };
    let (gateway_recv, worker_publish) = (hop("gateway.recv"), hop("worker.publish"));
    let (worker, mut bodies_dropped) = Worker::start(worker_publish).await;

    // The gateway's incoming request carries the client's trace.
    let mut incoming = HeaderMap::new();
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    incoming.insert("traceparent", traceparent.parse().unwrap());
    let parent = otel::extract(&incoming);

    // A stream that completes: every event read to the end.
    let started = SystemTime::now();
    let mut events = Upstream::fetch(worker, "/done", "req-done", &gateway_recv, &parent).await;
    let mut read = 0;
    while let Some(event) = within(events.next()).await {
        event.expect("the worker's events decode");
        read += 1;
    }
    assert_eq!(read, DELAYS_MS.len());
    assert_eq!(
        within(bodies_dropped.recv()).await.as_deref(),
        Some("req-done")
    );

    // A client that leaves: the gateway stops reading an endless stream and drops it, which
    // closes the upstream connection; the worker's body is dropped when hyper notices.
    let mut events = Upstream::fetch(worker, "/endless", "req-gone", &gateway_recv, &parent).await;
    for _ in 0..READ_BEFORE_LEAVING {
        within(events.next()).await.unwrap().unwrap();
    }
    let left = SystemTime::now();
    drop(events);
    assert_eq!(
        within(bodies_dropped.recv()).await.as_deref(),
        Some("req-gone")
    );

    // Everything the hops recorded is in the SDK now: flushing exports it and returns once the
    // receiver has answered.
    within(telemetry.flush()).await;
    let spans = receiver.spans.lock().unwrap().clone();
    let metrics = receiver.metrics.lock().unwrap().clone();
    telemetry.shutdown().await;

    // One span per stream per hop, named after the hop, with the request id.
    assert_eq!(spans.len(), 4, "{spans:#?}");
    let span = |hop: &str, request: &str| {
        let found: Vec<&Span> = spans
            .iter()
            .filter(|span| span.name == hop && text(span, "streamgate.request_id") == request)
            .collect();
        assert_eq!(found.len(), 1, "{hop} {request}: {spans:#?}");
        found[0]
    };
    let gateway_done = span("gateway.recv", "req-done");
    let worker_done = span("worker.publish", "req-done");
    let gateway_gone = span("gateway.recv", "req-gone");
    let worker_gone = span("worker.publish", "req-gone");

    // One trace from the client through the gateway to the worker: the gateway's span is a
    // child of the client's, the worker's a child of the gateway's (carried by `traceparent`
    // over the socket).
    for (gateway, worker) in [(gateway_done, worker_done), (gateway_gone, worker_gone)] {
        assert_eq!(hex(&gateway.trace_id), CLIENT_TRACE);
        assert_eq!(hex(&gateway.parent_span_id), CLIENT_SPAN);
        assert_eq!(worker.trace_id, gateway.trace_id);
        assert_eq!(worker.parent_span_id, gateway.span_id);
        assert_eq!(text(worker, "streamgate.hop"), "worker.publish");
        assert_eq!(text(worker, "gen_ai.operation.name"), "chat");
    }

    // The completed stream: its gap summary, and spans that lasted as long as the stream did
    // (the worker's handler returned at once; its span ended with the body).
    let stream_length = Duration::from_millis(DELAYS_MS.iter().sum());
    for span in [gateway_done, worker_done] {
        assert_eq!(text(span, "streamgate.end_reason"), "completed");
        assert_eq!(
            int(span, "streamgate.events.visible"),
            DELAYS_MS.len() as i64
        );
        assert_eq!(int(span, "streamgate.events.hidden"), 0);
        assert!(int(span, "streamgate.stalls") >= 1, "{span:#?}");
        // The worker slept 300 ms between two events; a hop downstream sees that gap shortened
        // by however late the event before it arrived (0.2997 s once), but still a stall.
        let floor = match span.name.as_str() {
            "worker.publish" => 0.3,
            _ => STALL.as_secs_f64(),
        };
        assert!(double(span, "streamgate.gap.max") >= floor, "{span:#?}");
        assert!(double(span, "streamgate.time_to_first_event") >= 0.02);
        assert!(duration(span) >= stream_length, "{span:#?}");
        assert!(
            span.status
                .as_ref()
                .is_none_or(|s| s.code != status::StatusCode::Error as i32)
        );
        let stall = span
            .events
            .iter()
            .find(|event| event.name == "stall")
            .unwrap();
        assert!(double_of(&stall.attributes, "streamgate.quiet") >= 0.3);
        assert_eq!(span.events.len() as i64, int(span, "streamgate.stalls"));
    }
    assert!(worker_done.start_time_unix_nano >= nanos(started));

    // The client that left: both hops' spans end then, as `consumer_gone`, with an error
    // status; the worker's only once its body was dropped.
    for span in [gateway_gone, worker_gone] {
        assert_eq!(text(span, "streamgate.end_reason"), GONE, "{span:#?}");
        assert_eq!(text(span, "error.type"), GONE);
        let status = span.status.as_ref().unwrap();
        assert_eq!(status.code, status::StatusCode::Error as i32);
        assert!(span.end_time_unix_nano >= nanos(left), "{span:#?}");
    }
    assert_eq!(
        int(gateway_gone, "streamgate.events.visible"),
        READ_BEFORE_LEAVING as i64
    );
    let worker_published = int(worker_gone, "streamgate.events.visible");
    assert!(worker_published >= READ_BEFORE_LEAVING as i64);

    // The GenAI histograms, per hop, with the conventions' buckets and one measurement per
    // first event and per gap.
    for (hop, spans) in [
        ("gateway.recv", [gateway_done, gateway_gone]),
        ("worker.publish", [worker_done, worker_gone]),
    ] {
        let first = histogram(&metrics, otel::TIME_TO_FIRST_TOKEN, hop);
        assert_eq!(first.explicit_bounds, otel::TIME_TO_FIRST_TOKEN_BUCKETS);
        assert_eq!(first.count, 2);
        assert!(first.min.unwrap() >= 0.02, "{first:?}");

        let gaps = histogram(&metrics, otel::TIME_PER_OUTPUT_CHUNK, hop);
        assert_eq!(gaps.explicit_bounds, otel::TIME_PER_OUTPUT_CHUNK_BUCKETS);
        let visible: i64 = spans
            .iter()
            .map(|span| int(span, "streamgate.events.visible"))
            .sum();
        assert_eq!(gaps.count as i64, visible - 2, "one per gap: {gaps:?}");
        assert_eq!(gaps.bucket_counts.iter().sum::<u64>(), gaps.count);
        // The stall sits in a bucket at or above the stall threshold's (0.16 to 0.32 s),
        // and every gap that high was a stall.
        let stalls: i64 = spans
            .iter()
            .map(|span| int(span, "streamgate.stalls"))
            .sum();
        let high = gaps
            .explicit_bounds
            .iter()
            .position(|b| *b == 0.16)
            .unwrap()
            + 1;
        assert_eq!(
            gaps.bucket_counts[high..].iter().sum::<u64>() as i64,
            stalls
        );
        assert!(gaps.max.unwrap() >= 0.3);

        let ended = counter(&metrics, otel::STREAMS_ENDED, hop);
        assert_eq!(
            ended,
            BTreeMap::from([("completed".into(), 1), (GONE.into(), 1)])
        );
    }
    assert_eq!(
        worker_published,
        1 + histogram(&metrics, otel::TIME_PER_OUTPUT_CHUNK, "worker.publish").count as i64
            - (DELAYS_MS.len() as i64 - 1)
    );
}

#[test]
fn the_otel_types_cross_threads() {
    fn is_send_sync_unpin<T: Send + Sync + Unpin>() {}
    is_send_sync_unpin::<OtelHop>();
    is_send_sync_unpin::<streamgate::probe::Recorder>();
    is_send_sync_unpin::<HopProbe>();
}

/// `step`'s output, or a panic after `HANG`.
async fn within<T>(step: impl Future<Output = T>) -> T {
    tokio::time::timeout(HANG, step).await.expect("a step hung")
}

// --- The receiver: the OTLP collector's trace and metrics services over gRPC. ---

/// Collects every span and metric exported to it.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
    metrics: Arc<Mutex<Vec<Metric>>>,
}

impl Receiver {
    /// Serves the collector services on a free loopback port.
    async fn start() -> (Receiver, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let receiver = Receiver::default();
        let server = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .add_service(MetricsServiceServer::new(receiver.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
        tokio::spawn(server);
        (receiver, addr)
    }
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = (request.into_inner().resource_spans.into_iter())
            .flat_map(|resource| resource.scope_spans)
            .flat_map(|scope| scope.spans);
        self.spans.lock().unwrap().extend(spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let metrics = (request.into_inner().resource_metrics.into_iter())
            .flat_map(|resource| resource.scope_metrics)
            .flat_map(|scope| scope.metrics);
        self.metrics.lock().unwrap().extend(metrics);
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// The application's SDK: batched spans and periodic (cumulative) metrics over OTLP/gRPC.
struct Telemetry {
    tracers: SdkTracerProvider,
    meters: SdkMeterProvider,
}

impl Telemetry {
    /// Exporters to the receiver at `collector` (built inside the runtime, as tonic needs).
    fn new(collector: SocketAddr) -> Self {
        let endpoint = format!("http://{collector}");
        let spans = SpanExporter::builder()
            .with_tonic()
            .with_endpoint(&endpoint)
            .build()
            .unwrap();
        let metrics = MetricExporter::builder()
            .with_tonic()
            .with_endpoint(&endpoint)
            .build()
            .unwrap();
        Telemetry {
            tracers: SdkTracerProvider::builder()
                .with_batch_exporter(spans)
                .build(),
            meters: SdkMeterProvider::builder()
                .with_periodic_exporter(metrics)
                .build(),
        }
    }

    /// Exports everything recorded so far; returns once the receiver has answered. (The
    /// SDK's calls block: off the runtime's workers, which drive the gRPC client.)
    async fn flush(&self) {
        let (tracers, meters) = (self.tracers.clone(), self.meters.clone());
        tokio::task::spawn_blocking(move || {
            tracers.force_flush().expect("spans exported");
            meters.force_flush().expect("metrics exported");
        })
        .await
        .unwrap();
    }

    async fn shutdown(self) {
        tokio::task::spawn_blocking(move || {
            self.tracers.shutdown().unwrap();
            self.meters.shutdown().unwrap();
        })
        .await
        .unwrap();
    }
}

// --- The two hops. ---

/// A worker: an HTTP server whose streams are probed at `worker.publish`, each a child of the
/// trace its request carries. `/done` sends `DELAYS_MS.len()` events, `/endless` one every
/// 10 ms (the first after 20) until its client leaves.
struct Worker;

impl Worker {
    /// Serves on a free loopback port; the receiver hears each request id when its response
    /// body is dropped (after its recorder ended).
    async fn start(hop: HopProbe) -> (SocketAddr, mpsc::UnboundedReceiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (dropped, bodies_dropped) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                let (hop, dropped) = (hop.clone(), dropped.clone());
                let service = hyper::service::service_fn(move |request| {
                    let response = Worker::respond(&request, &hop, dropped.clone());
                    async move { Ok::<_, std::convert::Infallible>(response) }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(socket), service),
                );
            }
        });
        (addr, bodies_dropped)
    }

    fn respond(
        request: &Request<Incoming>,
        hop: &HopProbe,
        dropped: mpsc::UnboundedSender<String>,
    ) -> Response<SseBody<impl Stream<Item = streamgate::sse::SseFrame> + use<>>> {
        let parent = otel::extract(request.headers());
        let id = request.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let endless = request.uri().path() == "/endless";
        let recorder = hop.recorder_in(id.as_str(), &parent);
        let frames = Gate::new()
            .spawn(move |_, mut tx| async move {
                for n in 0.. {
                    let delay = match (endless, n, DELAYS_MS.get(n)) {
                        (true, 0, _) => DELAYS_MS[0],
                        (true, _, _) => 10,
                        (false, _, Some(ms)) => *ms,
                        (false, _, None) => break,
                    };
                    sleep(Duration::from_millis(delay)).await;
                    tx.send(format!("t{n} ")).await?;
                }
                Ok::<_, SendError<String>>(())
            })
            .sse();
        let probed = recorder.probe(frames);
        Response::new(SseBody::new(OnDrop {
            inner: Some(Box::pin(probed)),
            dropped: Some((dropped, id)),
        }))
    }
}

/// A stream that reports, after dropping its inner stream, that it was dropped.
struct OnDrop<S> {
    inner: Option<Pin<Box<S>>>,
    dropped: Option<(mpsc::UnboundedSender<String>, String)>,
}

impl<S: Stream> Stream for OnDrop<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<S::Item>> {
        match &mut self.get_mut().inner {
            Some(inner) => inner.as_mut().poll_next(cx),
            None => Poll::Ready(None),
        }
    }
}

impl<S> Drop for OnDrop<S> {
    fn drop(&mut self) {
        drop(self.inner.take());
        if let Some((dropped, id)) = self.dropped.take() {
            let _ = dropped.send(id);
        }
    }
}

/// The gateway's side: a request to the worker, its SSE body decoded and probed at
/// `gateway.recv` in a span that is a child of `parent`, whose context the request carries.
struct Upstream;

impl Upstream {
    async fn fetch(
        worker: SocketAddr,
        path: &str,
        id: &str,
        hop: &HopProbe,
        parent: &Context,
    ) -> Pin<Box<dyn Stream<Item = Result<SseEvent, DecodeError>> + Send>> {
        let recorder = hop.recorder_in(id, parent);
        let mut request = Request::get(path)
            .header(HOST, "worker")
            .header("x-request-id", id)
            .body(Empty::<Bytes>::new())
            .unwrap();
        otel::inject(&recorder.otel_context(), request.headers_mut());
        assert!(request.headers().contains_key("traceparent"));
        let socket = TcpStream::connect(worker).await.unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(socket))
            .await
            .unwrap();
        tokio::spawn(connection);
        let response = sender.send_request(request).await.unwrap();
        let bytes = BodyStream::new(response.into_body()).filter_map(|frame| async move {
            match frame {
                Ok(frame) => frame.into_data().ok().map(Ok),
                Err(error) => Some(Err(error)),
            }
        });
        // The stream owns the request's sender: dropping it closes the connection.
        let bytes = bytes.map(move |chunk| {
            let _sender = &sender;
            chunk
        });
        Box::pin(recorder.probe(bytes.sse_events()))
    }
}

// --- Reading what the receiver got. ---

fn attribute<'a>(attributes: &'a [ProtoKeyValue], key: &str) -> &'a Value {
    let found = attributes.iter().find(|kv| kv.key == key);
    let value = found.and_then(|kv| kv.value.as_ref()?.value.as_ref());
    value.unwrap_or_else(|| panic!("no attribute {key} in {attributes:?}"))
}

fn text<'a>(span: &'a Span, key: &str) -> &'a str {
    match attribute(&span.attributes, key) {
        Value::StringValue(text) => text,
        other => panic!("{key}: {other:?}"),
    }
}

fn int(span: &Span, key: &str) -> i64 {
    match attribute(&span.attributes, key) {
        Value::IntValue(value) => *value,
        other => panic!("{key}: {other:?}"),
    }
}

fn double(span: &Span, key: &str) -> f64 {
    double_of(&span.attributes, key)
}

fn double_of(attributes: &[ProtoKeyValue], key: &str) -> f64 {
    match attribute(attributes, key) {
        Value::DoubleValue(value) => *value,
        other => panic!("{key}: {other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

fn duration(span: &Span) -> Duration {
    Duration::from_nanos(span.end_time_unix_nano - span.start_time_unix_nano)
}

fn hop_of(attributes: &[ProtoKeyValue]) -> Option<&str> {
    attributes
        .iter()
        .find(|kv| kv.key == "streamgate.hop")
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(hop) => Some(hop.as_str()),
            _ => None,
        })
}

/// The last export of histogram `name` at `hop` (cumulative: it holds every measurement).
fn histogram(metrics: &[Metric], name: &str, hop: &str) -> HistogramDataPoint {
    let mut points = metrics
        .iter()
        .filter(|metric| metric.name == name)
        .inspect(|metric| assert_eq!(metric.unit, "s"))
        .filter_map(|metric| match &metric.data {
            Some(metric::Data::Histogram(histogram)) => Some(&histogram.data_points),
            _ => None,
        })
        .flatten()
        .filter(|point| hop_of(&point.attributes) == Some(hop));
    let point = points.next_back();
    point
        .unwrap_or_else(|| panic!("no {name} at {hop} in {metrics:#?}"))
        .clone()
}

/// The last export of counter `name` at `hop`, by end reason.
fn counter(metrics: &[Metric], name: &str, hop: &str) -> BTreeMap<String, u64> {
    let mut by_reason = BTreeMap::new();
    let sums = metrics
        .iter()
        .filter(|metric| metric.name == name)
        .filter_map(|metric| match &metric.data {
            Some(metric::Data::Sum(sum)) => Some(&sum.data_points),
            _ => None,
        })
        .flatten()
        .filter(|point| hop_of(&point.attributes) == Some(hop));
    for point in sums {
        let Value::StringValue(reason) = attribute(&point.attributes, "streamgate.end_reason")
        else {
            panic!("{point:?}");
        };
        let Some(number_data_point::Value::AsInt(count)) = point.value else {
            panic!("{point:?}");
        };
        by_reason.insert(reason.clone(), count as u64);
    }
    by_reason
}
