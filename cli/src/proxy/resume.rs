//! The proxy's resume and stop endpoints, for upstreams that have none:
//! `GET /v1/chat/completions/{request_id}/stream` and `POST .../cancel`.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use streamgate::resume::AttachError;

use super::{Proxy, error};
use crate::serving;

/// `GET /v1/chat/completions/{request_id}/stream` with `Last-Event-ID: n` (or `?after=n`): the
/// events after n of a running (or retained) stream, from its replay log, then live. The
/// upstream is never asked again: a resumed stream continues the same generation.
pub(super) async fn resume(
    State(proxy): State<Arc<Proxy>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let mut after = headers
        .get("last-event-id")
        .and_then(|id| id.to_str().ok())
        .and_then(|id| id.trim().parse::<u64>().ok());
    for pair in query.as_deref().unwrap_or("").split('&') {
        if let Some(value) = pair.strip_prefix("after=") {
            match value.parse::<u64>() {
                Ok(n) => after = Some(n),
                Err(_) => {
                    return error::openai(
                        StatusCode::BAD_REQUEST,
                        "`after` must be an event id",
                        "invalid_request_error",
                    );
                }
            }
        }
    }
    match proxy.store.attach(&id, after).await {
        Ok(frames) => proxy.sse_response(frames, &id),
        Err(failure) => attach_error(&failure),
    }
}

/// `POST /v1/chat/completions/{request_id}/cancel`: an explicit stop. The upstream is dropped
/// at once, and every attached client gets a final chunk (`finish_reason` `stop`) and
/// `[DONE]`; 200 (`{"id":..,"cancelled":true}`; `false` when the stream had already ended), or
/// 404.
pub(super) async fn cancel(State(proxy): State<Arc<Proxy>>, Path(id): Path<String>) -> Response {
    let stop = proxy
        .stops
        .lock()
        .unwrap()
        .get(&id)
        .map(|(_, stop)| stop.clone());
    let cancelled = match stop {
        Some(stop) => {
            stop.cancel();
            // Its last events wait for no slow reader or resume.
            proxy.store.stop_waiting(&id);
            true
        }
        None => match proxy.store.stop(&id).await {
            Ok(cancelled) => cancelled,
            Err(failure) => return attach_error(&failure),
        },
    };
    serving::json_response(StatusCode::OK, json!({"id": id, "cancelled": cancelled}))
}

/// 404 for an unknown (or expired) stream, 409 for a position its log no longer holds, 204 when
/// nothing follows the position of a finished stream, 503 when the store failed.
fn attach_error(failure: &AttachError) -> Response {
    match failure {
        AttachError::Finished => StatusCode::NO_CONTENT.into_response(),
        AttachError::Gone { .. } => {
            error::openai(StatusCode::CONFLICT, &failure.to_string(), "conflict_error")
        }
        AttachError::Unavailable(_) => error::openai(
            StatusCode::SERVICE_UNAVAILABLE,
            &failure.to_string(),
            "server_error",
        ),
        _ => error::openai(
            StatusCode::NOT_FOUND,
            &failure.to_string(),
            "not_found_error",
        ),
    }
}
