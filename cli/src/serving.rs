//! What `sim` and `proxy` share: JSON and metrics responses, the Prometheus recorder, hop
//! records, serving until SIGINT or SIGTERM with a visible shutdown of every open stream.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde_json::{Map, Value};
use streamgate::openai::ApiError;
use streamgate::probe::{METRIC_BUCKETS, RecordSink, describe_metrics};
use streamgate::transport::{Server, TunedListener};
use streamgate::{EndCounters, EndCounts, EndReason};

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
    let body = ApiError::new(message, kind).to_json();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The Prometheus text exposition.
pub fn metrics_response(prometheus: &PrometheusHandle) -> Response {
    metrics_text(prometheus.render())
}

/// `text`, in Prometheus' text exposition format, as a response.
pub fn metrics_text(text: String) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// The sink of `--hop-records FILE`, if given.
pub fn record_sink(path: Option<&str>) -> Result<Option<RecordSink>, String> {
    path.map(RecordSink::to_file)
        .transpose()
        .map_err(|error| format!("--hop-records: {error}"))
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
/// not hold the process. Connection errors are logged to stderr. While no stream is open, the
/// allocator's free pages go back to the OS ([`crate::trim::while_idle`]).
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
    let trimming = crate::trim::while_idle(streams.clone());
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
        never = trimming => match never {},
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

/// How a server's streams went, for its `/stats`: started, running, and ended by
/// [`EndReason`], counted from each stream's release hook. Both servers count their ends here,
/// by the same rules.
#[derive(Debug, Default)]
pub struct StreamCounts {
    started: AtomicU64,
    running: AtomicU64,
    ended: EndCounters,
}

/// The ends `/stats` counts as `streams_cancelled`: the client left, the stream was stopped,
/// or the server shut down.
pub const CANCELLED: [EndReason; 3] = [
    EndReason::ConsumerGone,
    EndReason::Cancelled,
    EndReason::Shutdown,
];

/// The ends `/stats` counts as `streams_failed`: the generator failed or panicked, or the
/// upstream or the resume store did.
pub const FAILED: [EndReason; 4] = [
    EndReason::GeneratorError,
    EndReason::GeneratorPanic,
    EndReason::UpstreamError,
    EndReason::ResumeStoreError,
];

impl StreamCounts {
    /// A stream (and its generator) started.
    pub fn start(&self) {
        self.started.fetch_add(1, Ordering::SeqCst);
        self.running.fetch_add(1, Ordering::SeqCst);
    }

    /// A stream ended, for `reason` (from its gate's release hook).
    pub fn end(&self, reason: EndReason) {
        self.ended.add(reason);
        self.running.fetch_sub(1, Ordering::SeqCst);
    }

    /// The ends so far.
    pub fn ended(&self) -> EndCounts {
        self.ended.snapshot()
    }

    /// The counts as `/stats` fields: `streams_started`, the streams running under the name
    /// the server gives them (`running`), `streams_completed`, `streams_cancelled` (see
    /// [`CANCELLED`]), `streams_ended_slow_consumer`, `streams_failed` (see [`FAILED`]), and
    /// `streams_ended`, an object with every end reason's count (zeros included).
    pub fn fields(&self, running: &str) -> Map<String, Value> {
        let ended = self.ended();
        let by_reason: Map<String, Value> = ended
            .iter()
            .map(|(reason, n)| (reason.as_str().to_owned(), n.into()))
            .collect();
        [
            (
                "streams_started",
                self.started.load(Ordering::SeqCst).into(),
            ),
            (running, self.running.load(Ordering::SeqCst).into()),
            ("streams_completed", ended[EndReason::Completed].into()),
            ("streams_cancelled", ended.sum(&CANCELLED).into()),
            (
                "streams_ended_slow_consumer",
                ended[EndReason::SlowConsumer].into(),
            ),
            ("streams_failed", ended.sum(&FAILED).into()),
            ("streams_ended", Value::Object(by_reason)),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect()
    }
}

/// How often the Prometheus recorder's histograms are folded into their buckets: the samples
/// it holds are those of the last 100 ms (at 500,000 gaps a second, 400 KB), not of a second.
const METRICS_UPKEEP: Duration = Duration::from_millis(100);

/// Installs the process's Prometheus recorder (once per process), with the crate's histogram
/// buckets and help texts, and a thread that folds the histograms' samples into their buckets
/// every [`METRICS_UPKEEP`]: the recorder keeps every sample until then, so without it memory
/// would grow with every event until `/metrics` was scraped.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_end_reason_is_in_exactly_one_summary_field() {
        for reason in EndReason::ALL {
            let groups = [
                reason == EndReason::Completed,
                CANCELLED.contains(&reason),
                reason == EndReason::SlowConsumer,
                FAILED.contains(&reason),
            ];
            let counted = groups.iter().filter(|&&in_group| in_group).count();
            assert_eq!(
                counted, 1,
                "{reason} is in {counted} of /stats' summary fields"
            );
        }
    }
}
