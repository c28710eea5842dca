//! What the example servers share: JSON and metrics responses, hop records, serving until
//! Ctrl-C.

use std::process::ExitCode;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{Value, json};
use streamgate::probe::{HopProbe, RecordSink};
use streamgate::transport::TunedListener;

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

/// A hop probe that writes every request's records to `records`, if any.
pub fn hop(records: &Option<RecordSink>, name: &str) -> HopProbe {
    match records {
        Some(sink) => HopProbe::new(name).records(sink.clone(), 1.0),
        None => HopProbe::new(name),
    }
}

/// Prints the `listening on` line, serves until Ctrl-C, then flushes the hop records.
pub async fn serve_until_ctrl_c(
    name: &str,
    listener: TunedListener,
    app: Router,
    records: Option<RecordSink>,
) -> ExitCode {
    match listener.local_addr() {
        Ok(addr) => println!("listening on http://{addr}"),
        Err(error) => {
            eprintln!("{name}: {error}");
            return ExitCode::FAILURE;
        }
    }
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(ctrl_c)
        .await;
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
