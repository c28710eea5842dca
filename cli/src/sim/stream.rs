//! A generation's frames as a client's SSE response: heartbeats, the `worker.write` probe and,
//! over HTTP/1.1, `worker.sent` when each event's bytes left the kernel.

use std::sync::Arc;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_core::Stream;
use streamgate::GateExt;
use streamgate::sse::SseFrame;
use streamgate::transport::{Departures, SseResponse};

use super::connection::Connection;
use super::generation::generate;
use super::meta::Meta;
use super::state::Sim;
use crate::resume;

/// The SSE response for a stream's `frames`, named `name` (its `x-request-id`), probed for
/// `request`.
pub(super) fn respond(
    sim: &Sim,
    frames: impl Stream<Item = SseFrame> + Send + 'static,
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

/// Claims the stream's name, registers a new generation of tokens `from..max_tokens` under it
/// and streams it to this client. A name taken (only `GET /v1/stream?id=` names streams from
/// outside) is a conflict, found before any work starts.
pub(super) async fn start(
    sim: &Arc<Sim>,
    meta: &Arc<Meta>,
    from: u64,
    max_tokens: u64,
    connection: Connection,
) -> Response {
    let name = &meta.stream;
    let mut claim = match sim.store.claim(name).await {
        Ok(claim) => claim,
        Err(refused) => return resume::claim_error(&format!("id {name}"), name, &refused),
    };
    let stop = claim.stop_signal();
    let events = match generate(sim, meta.clone(), from, max_tokens, stop) {
        Ok(events) => events,
        Err(full) => return full.response(),
    };
    match sim.store.register(claim, events).await {
        Ok(frames) => respond(sim, frames, name, &meta.request, connection),
        Err(failure) => resume::register_error(&failure),
    }
}
