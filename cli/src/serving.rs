//! What `sim` and `proxy` share: JSON and metrics responses, the Prometheus recorder, hop
//! records, serving until SIGINT or SIGTERM with a visible shutdown of every open stream.

use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde_json::{Value, json};
use streamgate::probe::{HopProbe, METRIC_BUCKETS, RecordSink, describe_metrics};
use streamgate::transport::{Server, TunedListener};

use crate::flags::RecordSample;

/// A JSON body with `status`.
pub fn json_response(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// An OpenAI-style error: `{"error":{"message":..,"type":..}}`.
pub fn json_error(status: StatusCode, message: &str, kind: &str) -> Response {
    json_response(status, json!({"error": {"message": message, "type": kind}}))
}

/// The Prometheus text exposition.
pub fn metrics_response(prometheus: &PrometheusHandle) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        prometheus.render(),
    )
        .into_response()
}

/// The sink of `--hop-records FILE`, if given.
pub fn record_sink(path: Option<&str>) -> Result<Option<RecordSink>, String> {
    path.map(RecordSink::to_file)
        .transpose()
        .map_err(|error| format!("--hop-records: {error}"))
}

/// A hop probe that writes the records of a `sample` of requests to `records`, if any.
pub fn hop(records: &Option<RecordSink>, sample: RecordSample, name: &str) -> HopProbe {
    match records {
        Some(sink) => HopProbe::new(name).records(sink.clone(), sample.share),
        None => HopProbe::new(name),
    }
}

/// How long open streams get to end and be released at shutdown.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Prints the `listening on` line, serves with `server`'s protections
/// (`ListenFlags::server`) until SIGINT or SIGTERM, then shuts down: every open stream of
/// `streams` ends as `shutdown` (clients get the terminal frame), then the hop records are
/// flushed.
pub async fn serve_until_signal(
    name: &str,
    server: Server,
    listener: TunedListener,
    app: Router,
    records: Option<RecordSink>,
    streams: streamgate::Group,
) -> ExitCode {
    match listener.local_addr() {
        Ok(addr) => println!("listening on http://{addr}"),
        Err(error) => {
            eprintln!("{name}: {error}");
            return ExitCode::FAILURE;
        }
    }
    let served = serve_with(server, listener, app, streams, signal()).await;
    // Every hop record queued so far reaches the file before the process exits.
    if let Some(records) = records {
        records.sync();
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{name}: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Serves HTTP/1.1 and h2c on the same port until `stop` completes, then ends every stream of
/// `streams` (waiting at most [`SHUTDOWN_GRACE`] for their releases) and lets the connections
/// finish, their bodies having ended. A connection that cannot take its last bytes (a client
/// that stopped reading) gets [`DRAIN_LIMIT`] more, then is abandoned: one stopped reader must
/// not hold the process. Connection errors are logged to stderr.
pub async fn serve_until(
    listener: TunedListener,
    app: Router,
    streams: streamgate::Group,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(Server::new(), listener, app, streams, stop).await
}

/// [`serve_until`] with `server`'s protections (`ListenFlags::server`).
pub async fn serve_with(
    server: Server,
    listener: TunedListener,
    app: Router,
    streams: streamgate::Group,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (ended, streams_ended) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        stop.await;
        let report = streams.shutdown(SHUTDOWN_GRACE).await;
        eprintln!(
            "shutting down: {} open streams ended, {} released",
            report.ended, report.released
        );
        let _ = ended.send(());
    };
    let served = server
        .on_error(|error| eprintln!("serving: {}", with_causes(&error)))
        .serve(listener, app, shutdown);
    let drain_limit = async {
        if streams_ended.await.is_ok() {
            tokio::time::sleep(DRAIN_LIMIT).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = served => Ok(()),
        () = drain_limit => {
            eprintln!("shutting down: connections still draining after {DRAIN_LIMIT:?} abandoned");
            Ok(())
        }
    }
}

/// `error`'s message followed by its causes': `connection from ..: connection error: Connection
/// reset by peer (os error 104)`.
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        message = format!("{message}: {error}");
        cause = error.source();
    }
    message
}

/// How long connections may take to drain once every stream has ended.
pub const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// SIGINT (Ctrl-C) or, on Unix, SIGTERM.
async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut term) = signal(SignalKind::terminate()) else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// How a server's streams went, for its `/stats`.
#[derive(Debug, Default)]
pub struct StreamCounts {
    started: std::sync::atomic::AtomicU64,
    completed: std::sync::atomic::AtomicU64,
    cancelled: std::sync::atomic::AtomicU64,
    slow_consumer: std::sync::atomic::AtomicU64,
    failed: std::sync::atomic::AtomicU64,
    running: std::sync::atomic::AtomicU64,
}

impl StreamCounts {
    /// A stream (and its generator) started.
    pub fn start(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.started.fetch_add(1, SeqCst);
        self.running.fetch_add(1, SeqCst);
    }

    /// A stream ended, for `reason` (from its gate's release hook).
    pub fn end(&self, reason: streamgate::EndReason) {
        use std::sync::atomic::Ordering::SeqCst;
        use streamgate::EndReason;
        let counter = match reason {
            EndReason::Completed => &self.completed,
            EndReason::SlowConsumer => &self.slow_consumer,
            EndReason::GeneratorError | EndReason::GeneratorPanic => &self.failed,
            _ => &self.cancelled,
        };
        counter.fetch_add(1, SeqCst);
        self.running.fetch_sub(1, SeqCst);
    }

    /// The counts as `/stats` fields: `streams_started`, `streams_completed`,
    /// `streams_cancelled` (failed streams included unless `failed` names a field of their
    /// own), `streams_ended_slow_consumer`, and `running` named as the server calls it.
    pub fn fields(&self, running: &str, failed: Option<&str>) -> serde_json::Map<String, Value> {
        use std::sync::atomic::Ordering::SeqCst;
        let load = |n: &std::sync::atomic::AtomicU64| n.load(SeqCst);
        let mut fields = serde_json::Map::new();
        let mut cancelled = load(&self.cancelled);
        match failed {
            Some(name) => {
                fields.insert(name.into(), load(&self.failed).into());
            }
            None => cancelled += load(&self.failed),
        }
        fields.insert("streams_started".into(), load(&self.started).into());
        fields.insert("streams_completed".into(), load(&self.completed).into());
        fields.insert("streams_cancelled".into(), cancelled.into());
        fields.insert(
            "streams_ended_slow_consumer".into(),
            load(&self.slow_consumer).into(),
        );
        fields.insert(running.into(), load(&self.running).into());
        fields
    }
}

/// How often the Prometheus recorder's histograms are folded into their buckets.
const METRICS_UPKEEP: Duration = Duration::from_secs(1);

/// Installs the process's Prometheus recorder (once per process), with the crate's histogram
/// buckets and help texts, and a thread that folds the histograms' samples into their buckets
/// every second: the recorder keeps every sample until then, so without it memory would
/// grow with every event until `/metrics` was scraped.
pub fn prometheus() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Prefix("streamgate_".into()), &METRIC_BUCKETS)
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|error| format!("metrics: {error}"))?;
    describe_metrics();
    let upkeep = handle.clone();
    std::thread::Builder::new()
        .name("metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(METRICS_UPKEEP);
                upkeep.run_upkeep();
            }
        })
        .map_err(|error| format!("metrics: starting the upkeep thread: {error}"))?;
    Ok(handle)
}
