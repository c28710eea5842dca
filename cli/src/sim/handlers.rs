//! The reference server's endpoints, as `examples/README.md` describes them.

use std::fmt::Write;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use streamgate::openai::{ApiError, ChatCompletion, CompletionChoice, Message, Usage};
use streamgate::resume::AttachError;

use super::connection::Connection;
use super::delta::{Delta, FinishReason};
use super::generation::generate;
use super::state::Sim;
use super::stream;
use crate::resume::{self, ResumeAfter};
use crate::serving;

/// `max_tokens` when a request gives none.
const DEFAULT_MAX_TOKENS: u64 = 16;
/// The most `max_tokens` a request may ask for.
const MAX_TOKENS_LIMIT: u64 = 1_000_000;
/// The `model` of a stream a request named none for.
const MODEL: &str = "streamgate-sim";

fn bad_request(message: &str) -> Response {
    serving::json_error(StatusCode::BAD_REQUEST, message, "invalid_request_error")
}

fn bad_max_tokens() -> Response {
    bad_request("`max_tokens` must be an integer from 1 to 1000000")
}

/// `POST /v1/chat/completions`.
pub(super) async fn chat_completions(
    State(sim): State<Arc<Sim>>,
    connection: Connection,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return bad_request("the body is not valid JSON");
    };
    if !request.get("messages").is_some_and(Value::is_array) {
        return bad_request("`messages` is required and must be an array");
    }
    let max_tokens = match request.get("max_tokens") {
        None | Some(Value::Null) => DEFAULT_MAX_TOKENS,
        Some(value) => match value.as_u64() {
            Some(n) if (1..=MAX_TOKENS_LIMIT).contains(&n) => n,
            _ => return bad_max_tokens(),
        },
    };
    let max_tokens = sim.kv.servable(max_tokens);
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(MODEL)
        .to_owned();
    let meta = sim.meta(model, None, &headers);
    if request.get("stream").and_then(Value::as_bool) == Some(true) {
        return stream::start(&sim, &meta, 0, max_tokens, connection).await;
    }
    // A whole answer in one body is stopped by its client closing the connection: it names no
    // stream, and `POST .../cancel` does not know it.
    let stop = tokio_util::sync::CancellationToken::new();
    let events = match generate(&sim, meta.clone(), 0, max_tokens, stop) {
        Ok(events) => events,
        Err(full) => return full.response(),
    };
    let mut text = String::new();
    let mut tokens = 0;
    let mut finish = FinishReason::Length;
    let mut failed = None;
    let mut events = std::pin::pin!(events);
    while let Some(item) =
        std::future::poll_fn(|cx| futures_core::Stream::poll_next(events.as_mut(), cx)).await
    {
        match item {
            Ok(event) => match event.into_chunk() {
                Delta::Text { meta, from, to, .. } => {
                    let _ = write!(text, "{}", meta.tokens(from, to));
                    tokens += to + 1 - from;
                }
                Delta::Finish { reason, .. } => finish = reason,
                Delta::Error { message, code } => failed = Some(Delta::api_error(message, code)),
                Delta::Done => {}
            },
            Err(error) => {
                // The KV pool ran out mid-generation: busy, not broken (a retry may find room).
                let (status, error) = match failed {
                    Some(failed) => (StatusCode::SERVICE_UNAVAILABLE, failed),
                    None => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        ApiError::new(error.to_string(), "server_error"),
                    ),
                };
                return json_body(status, error.to_json());
            }
        }
    }
    let usage = Usage {
        prompt_tokens: 0,
        completion_tokens: tokens,
        total_tokens: tokens,
        ..Usage::default()
    };
    let completion = ChatCompletion::new(meta.id.as_str(), meta.created, meta.model.as_str())
        .with_choice(CompletionChoice::new(
            0,
            Message::assistant(text),
            finish.as_str(),
        ))
        .with_usage(usage);
    json_body(StatusCode::OK, completion.to_json())
}

/// A response of `status` with a JSON `body`.
fn json_body(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// `GET /v1/stream?max_tokens=N[&id=NAME]`: the same token events for EventSource clients.
/// With `id`, the stream is resumable under that name: the first request starts it, and a
/// reconnect with `Last-Event-ID` (or another client) attaches to the running stream. Without
/// `id`, a `Last-Event-ID` of k starts a new generation at token k+1 (token text is
/// deterministic; an id past the end, or not a number, starts over).
pub(super) async fn stream_get(
    State(sim): State<Arc<Sim>>,
    RawQuery(query): RawQuery,
    connection: Connection,
    headers: HeaderMap,
) -> Response {
    let mut max_tokens = DEFAULT_MAX_TOKENS;
    let mut name = None;
    for pair in query.as_deref().unwrap_or("").split('&') {
        if let Some(value) = pair.strip_prefix("max_tokens=") {
            match value.parse::<u64>() {
                Ok(n) if (1..=MAX_TOKENS_LIMIT).contains(&n) => max_tokens = sim.kv.servable(n),
                _ => return bad_max_tokens(),
            }
        } else if let Some(value) = pair.strip_prefix("id=") {
            name = Some(value.to_owned());
        }
    }
    let last = resume::last_event_id(&headers);
    let mut response = match name {
        Some(name) => match sim.store.attach(&name, last).await {
            Ok(frames) => stream::respond(&sim, frames, &name, &name, connection),
            // A first request starts the stream; a reconnect never regenerates it.
            Err(AttachError::Unknown) if last.is_none() => {
                let meta = sim.meta(MODEL.into(), Some(name), &headers);
                stream::start(&sim, &meta, 0, max_tokens, connection).await
            }
            Err(error) => resume::attach_error(&error),
        },
        None => {
            let from = last
                .map(|last| last + 1)
                .filter(|&from| from <= max_tokens)
                .unwrap_or(0);
            let meta = sim.meta(MODEL.into(), None, &headers);
            stream::start(&sim, &meta, from, max_tokens, connection).await
        }
    };
    // A page on another origin may open this with `EventSource`.
    response.headers_mut().insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        header::HeaderValue::from_static("*"),
    );
    response
}

/// `GET /v1/chat/completions/{id}/stream` with `Last-Event-ID: n` or `?after=n`: the events
/// after n of a running (or retained) stream, from its replay log, then live.
pub(super) async fn resume(
    State(sim): State<Arc<Sim>>,
    Path(id): Path<String>,
    ResumeAfter(after): ResumeAfter,
    connection: Connection,
) -> Response {
    match sim.store.attach(&id, after).await {
        Ok(frames) => stream::respond(&sim, frames, &id, &id, connection),
        Err(error) => resume::attach_error(&error),
    }
}

/// `POST /v1/chat/completions/{id}/cancel`: an explicit stop. The generator ends with a final
/// chunk (`finish_reason` `stop`) and `[DONE]`, which every attached client gets.
pub(super) async fn cancel(State(sim): State<Arc<Sim>>, Path(id): Path<String>) -> Response {
    match sim.store.stop(&id).await {
        Ok(cancelled) => {
            serving::json_response(StatusCode::OK, json!({"id": id, "cancelled": cancelled}))
        }
        Err(error) => resume::attach_error(&error),
    }
}

/// `GET /stats`.
pub(super) async fn stats(State(sim): State<Arc<Sim>>) -> Response {
    let mut fields = sim.stats.fields(sim.kv.in_use());
    resume::stats_fields(&sim.store.stats(), &mut fields);
    serving::json_response(StatusCode::OK, Value::Object(fields))
}

/// `GET /metrics`: Prometheus text, with the per-hop gap histograms and stall counters.
pub(super) async fn metrics(State(sim): State<Arc<Sim>>) -> Response {
    serving::metrics_response(&sim.prometheus)
}
