//! A generation's frames as a client's SSE response: heartbeats, the `worker.write` probe and,
//! over HTTP/1.1, `worker.sent` when each event's bytes left the kernel.

use std::sync::Arc;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use streamgate::GateExt;
use streamgate::resume::RegisterError;
use streamgate::transport::{Departures, SseResponse};

use super::connection::Connection;
use super::generation::generate;
use super::meta::Meta;
use super::state::Sim;
use crate::serving;
use crate::store::{self, Frames};

/// The SSE response for a stream's `frames`, named `name` (its `x-request-id`), probed for
/// `request`.
pub(super) fn respond(
    sim: &Sim,
    frames: Frames,
    name: &str,
    request: &str,
    connection: Connection,
) -> Response {
    let name = header::HeaderValue::from_str(name).ok();
    let frames = frames
        .heartbeat(sim.config.gate.heartbeat)
        .probe(&sim.write, request);
    let mut response = match connection.send_queue() {
        Some(queue) => {
            let frames = Departures::new(frames, queue, sim.sent.recorder(request));
            SseResponse::new(frames).into_response()
        }
        None => SseResponse::new(frames).into_response(),
    };
    if let Some(name) = name {
        response.headers_mut().insert("x-request-id", name);
    }
    response
}

/// Registers a new generation of tokens `from..max_tokens` under its stream name and streams
/// it to this client.
pub(super) async fn start(
    sim: &Arc<Sim>,
    meta: &Arc<Meta>,
    from: u64,
    max_tokens: u64,
    connection: Connection,
) -> Response {
    let events = match generate(sim, meta.clone(), from, max_tokens) {
        Ok(events) => events,
        Err(full) => return full.response(),
    };
    // Only `GET /v1/stream?id=` names streams from outside; a name taken between its
    // lookup and here is a conflict like any other.
    match sim.store.register(&meta.stream, events).await {
        Ok(frames) => respond(sim, frames, &meta.stream, &meta.request, connection),
        Err(error @ RegisterError::Duplicate) => {
            serving::json_error(StatusCode::CONFLICT, &error.to_string(), "conflict_error")
        }
        Err(error) => store::unavailable(&error.to_string()),
    }
}
