//! A server's listener and router, and serving it until a signal.

use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use streamgate::transport::TunedListener;

use super::config::ServeFlags;
use super::handlers::{
    cancel, chat_completions, health, messages, metrics, models, response_get, responses, resume,
    stats, stream_get,
};
use super::state::Server;
use super::worker::Worker;
use crate::{page, serving};

/// Binds the listener and builds the app for `config` in front of `worker`; the caller serves
/// it.
///
/// # Errors
///
/// When the listener cannot be bound, the hop record file cannot be created, or the resume
/// store's URL is malformed.
pub fn app(
    config: ServeFlags,
    worker: Arc<dyn Worker>,
    prometheus: PrometheusHandle,
) -> Result<(TunedListener, Router, Arc<Server>), String> {
    let records = serving::record_sink(config.hop_records.as_deref())?;
    let listener = TunedListener::bind(config.addr, config.listen.options())
        .map_err(|error| format!("binding {}: {error}", config.addr))?;
    let server = Arc::new(Server::new(config, worker, prometheus, records)?);
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
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/stats", get(stats))
        .route("/metrics", get(metrics))
        .route(page::EXAMPLE_PATH, get(page::example))
        .merge(page::routes(server.browser.as_ref()))
        .with_state(server.clone());
    Ok((listener, app, server))
}

/// Runs the server `name` (`sim`, say) with `config` in front of `worker` until SIGINT or
/// SIGTERM: exit status 0 after a clean shutdown, 2 when it could not start.
pub async fn run(name: &'static str, config: ServeFlags, worker: Arc<dyn Worker>) -> ExitCode {
    let protections = config.listen.server();
    match serving::prometheus().and_then(|prometheus| app(config, worker, prometheus)) {
        Ok((listener, app, server)) => {
            let (records, streams) = (server.records.clone(), server.streams().clone());
            serving::serve_until_signal(name, protections, listener, app, records, streams).await
        }
        Err(error) => {
            eprintln!("{name}: {error}");
            ExitCode::from(2)
        }
    }
}
