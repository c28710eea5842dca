//! A server's endpoints, as `examples/README.md` describes them (under "The reference
//! server").

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use streamgate::resume::AttachError;

use super::answer::answer;
use super::connection::Connection;
use super::format::Format;
use super::request::{self, BadRequest, Request};
use super::state::Server;
use super::stream;
use crate::resume::{self, ResumeAfter, StartingAfter};
use crate::{page, request_id, serving};

/// `POST /v1/chat/completions`: a new answer, or the continuation of a final assistant
/// message, streamed or whole, named by the client's `x-request-id` when it is a valid one.
pub(super) async fn chat_completions(
    State(server): State<Arc<Server>>,
    connection: Connection,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    create(&server, Format::Chat, connection, &headers, &body).await
}

/// `POST /v1/messages`: the same, as Anthropic Messages.
pub(super) async fn messages(
    State(server): State<Arc<Server>>,
    connection: Connection,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    create(&server, Format::Messages, connection, &headers, &body).await
}

/// `POST /v1/responses`: the same, as OpenAI Responses.
pub(super) async fn responses(
    State(server): State<Arc<Server>>,
    connection: Connection,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    create(&server, Format::Responses, connection, &headers, &body).await
}

/// A new answer in `format` to the request `body`.
async fn create(
    server: &Arc<Server>,
    format: Format,
    connection: Connection,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let request = match Request::parse(format, body, server.config.no_prefill) {
        Ok(request) => request,
        Err(bad) => return bad.response(format),
    };
    let name = request_id::from_client(headers);
    let meta = server.meta(format, &request, name);
    if request.stream {
        stream::start(server, &meta, request, 0, connection).await
    } else {
        answer(server, meta, request).await
    }
}

/// `GET /v1/stream?max_tokens=N[&id=NAME]`: the same token events for EventSource clients.
/// With `id`, the stream is resumable under that name: the first request starts it, and a
/// reconnect with `Last-Event-ID` (or another client) attaches to the running stream. Without
/// `id`, a `Last-Event-ID` of k asks the worker for a new generation from token k+1 (sim's
/// token text is deterministic; an id past the end starts over; a worker that cannot make
/// the same answer again refuses), named by the client's `x-request-id` if it is a valid one.
/// A `Last-Event-ID` that is no event id, or an `id` that is no valid request id, is a 400.
pub(super) async fn stream_get(
    State(server): State<Arc<Server>>,
    RawQuery(query): RawQuery,
    connection: Connection,
    headers: HeaderMap,
) -> Response {
    let mut max_tokens = None;
    let mut name = None;
    for pair in query.as_deref().unwrap_or("").split('&') {
        if let Some(value) = pair.strip_prefix("max_tokens=") {
            match request::max_tokens("max_tokens", value.parse().ok()) {
                Ok(n) => max_tokens = Some(n),
                Err(bad) => return bad.response(Format::Chat),
            }
        } else if let Some(value) = pair.strip_prefix("id=") {
            if !request_id::is_valid(value) {
                let bad = format!(
                    "`id` must be 1 to {} characters of A-Z, a-z, 0-9, `.`, `_`, `:` and `-`",
                    request_id::MAX_LEN
                );
                return BadRequest::from(bad).response(Format::Chat);
            }
            name = Some(value);
        }
    }
    let last = match resume::last_event_id(&headers) {
        Ok(last) => last,
        Err(refused) => return refused.into_response(),
    };
    let request = Request::empty(max_tokens);
    let mut response = match name {
        Some(name) => match server.store.attach(name, last).await {
            Ok(frames) => stream::respond(&server, frames, name, connection),
            // A first request starts the stream; a reconnect never regenerates it.
            Err(AttachError::Unknown) if last.is_none() => {
                let meta = server.meta(Format::Chat, &request, Some(name));
                stream::start(&server, &meta, request, 0, connection).await
            }
            Err(error) => resume::attach_error(&error),
        },
        None => {
            // The client has the answer's tokens up to `last`: the worker starts after them.
            let skip = last.map_or(0, |last| last.saturating_add(1));
            let name = request_id::from_client(&headers);
            let meta = server.meta(Format::Chat, &request, name);
            stream::start(&server, &meta, request, skip, connection).await
        }
    };
    // A page on another origin may open this with `EventSource`.
    response.headers_mut().insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        header::HeaderValue::from_static("*"),
    );
    response
}

/// `GET /v1/chat/completions/{id}/stream` (and `GET /v1/messages/{id}/stream`) with
/// `Last-Event-ID: n` or `?after=n`: the events after n of a running (or retained) stream,
/// from its replay log, then live. Any stream's, whatever its format.
pub(super) async fn resume(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    ResumeAfter(after): ResumeAfter,
    connection: Connection,
) -> Response {
    match server.store.attach(&id, after).await {
        Ok(frames) => stream::respond(&server, frames, &id, connection),
        Err(error) => resume::attach_error(&error),
    }
}

/// `POST /v1/chat/completions/{id}/cancel` (and the same under `/v1/messages` and
/// `/v1/responses`): an explicit stop. The generator ends with its format's final events (a
/// final chunk with `finish_reason` `stop` and `[DONE]`; `stop_reason` `end_turn`; a completed
/// response), which every attached client gets.
pub(super) async fn cancel(State(server): State<Arc<Server>>, Path(id): Path<String>) -> Response {
    match server.store.stop(&id).await {
        Ok(cancelled) => {
            serving::json_response(StatusCode::OK, json!({"id": id, "cancelled": cancelled}))
        }
        Err(error) => resume::attach_error(&error),
    }
}

/// `GET /v1/responses/{id}?stream=true[&starting_after=N]`: the events after sequence number N
/// (without it, from the start; `Last-Event-ID` works too) of a stream the server still holds,
/// as OpenAI serves a background response again. Only the streamed form is served: without
/// `stream=true`, 400.
pub(super) async fn response_get(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    StartingAfter { streamed, after }: StartingAfter,
    connection: Connection,
) -> Response {
    if !streamed {
        let bad = "this server serves a response again only as a stream: ?stream=true";
        return BadRequest::from(bad).response(Format::Responses);
    }
    match server.store.attach(&id, after).await {
        Ok(frames) => stream::respond(&server, frames, &id, connection),
        Err(error) => resume::attach_error(&error),
    }
}

/// `GET /stats`.
pub(super) async fn stats(State(server): State<Arc<Server>>) -> Response {
    let mut fields = server.host.stats.fields();
    server.worker.stats(&mut fields);
    resume::stats_fields(&server.store.stats(), &mut fields);
    page::stats_fields(server.browser.as_ref(), &mut fields);
    serving::json_response(StatusCode::OK, Value::Object(fields))
}

/// `GET /health`: 200 while the server serves (a proxy's `health_path`, a load balancer's
/// check); once it shuts down, its port refuses connections.
pub(super) async fn health() -> Response {
    serving::json_response(StatusCode::OK, json!({"status": "ok"}))
}

/// `GET /v1/models`: the model it serves, as OpenAI lists models (what `client.models.list()`
/// of the SDKs reads).
pub(super) async fn models(State(server): State<Arc<Server>>) -> Response {
    let model = json!({"id": server.worker.model(), "object": "model", "owned_by": "streamgate"});
    serving::json_response(StatusCode::OK, json!({"object": "list", "data": [model]}))
}

/// `GET /metrics`: Prometheus text, with the per-hop gap histograms and stall counters.
pub(super) async fn metrics(State(server): State<Arc<Server>>) -> Response {
    serving::metrics_response(&server.prometheus)
}
