//! The reference server's listener and router, and serving it until a signal.

use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use streamgate::transport::TunedListener;

use super::config::Config;
use super::handlers::{
    cancel, chat_completions, messages, metrics, response_get, responses, resume, stats, stream_get,
};
use super::state::Sim;
use crate::{page, serving};

/// Binds the listener and builds the app for `config`; the caller serves it.
///
/// # Errors
///
/// When the listener cannot be bound, the hop record file cannot be created, or the resume
/// store's URL is malformed.
pub fn app(
    config: Config,
    prometheus: PrometheusHandle,
) -> Result<(TunedListener, Router, Arc<Sim>), String> {
    let records = serving::record_sink(config.hop_records.as_deref())?;
    let listener = TunedListener::bind(config.addr, config.listen.options())
        .map_err(|error| format!("binding {}: {error}", config.addr))?;
    let sim = Arc::new(Sim::new(config, prometheus, records)?);
    let app = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/chat/completions/{id}/stream", get(resume))
        .route("/v1/chat/completions/{id}/cancel", post(cancel))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/{id}/stream", get(resume))
        .route("/v1/messages/{id}/cancel", post(cancel))
        .route("/v1/responses", post(responses))
        .route("/v1/responses/{id}", get(response_get))
        .route("/v1/responses/{id}/cancel", post(cancel))
        .route("/v1/stream", get(stream_get))
        .route("/stats", get(stats))
        .route("/metrics", get(metrics))
        .route(page::EXAMPLE_PATH, get(page::example))
        .merge(page::routes(sim.browser.as_ref()))
        .with_state(sim.clone());
    Ok((listener, app, sim))
}

/// Runs the reference server until SIGINT or SIGTERM: exit status 0 after a clean
/// shutdown, 2 when it could not start.
pub async fn run(config: Config) -> ExitCode {
    let protections = config.listen.server();
    match serving::prometheus().and_then(|prometheus| app(config, prometheus)) {
        Ok((listener, app, sim)) => {
            let (records, streams) = (sim.records.clone(), sim.streams.clone());
            serving::serve_until_signal("sim", protections, listener, app, records, streams).await
        }
        Err(error) => {
            eprintln!("sim: {error}");
            ExitCode::from(2)
        }
    }
}
