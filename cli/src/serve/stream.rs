//! A generation's frames as a client's SSE response, named by its request id (claimed before
//! the generation starts): heartbeats, the `worker.write` probe and, over HTTP/1.1,
//! `worker.sent` when each event's bytes left the kernel.

use std::sync::Arc;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_core::Stream;
use streamgate::GateExt;
use streamgate::resume::Claim;
use streamgate::sse::SseFrame;
use streamgate::transport::{Departures, SseResponse};

use super::connection::Connection;
use super::meta::Meta;
use super::request::Request;
use super::state::Server;
use super::worker::Job;
use crate::{request_id, resume};

/// The SSE response for the `frames` of the stream `name` (its request id: the response's
/// `x-request-id`, and the `request` of its hop records), with the page's probe token when it
/// is in the sample.
pub(super) fn respond(
    server: &Server,
    frames: impl Stream<Item = SseFrame> + Send + 'static,
    name: &str,
    connection: Connection,
) -> Response {
    let frames = frames
        .heartbeat(server.config.gate.heartbeat)
        .probe(&server.write, name);
    let mut response = match connection.send_queue() {
        Some(queue) => {
            let frames = Departures::new(frames, queue, server.sent.recorder(name));
            SseResponse::new(frames).into_response()
        }
        None => SseResponse::new(frames).into_response(),
    };
    named(&mut response, name);
    if let Some(browser) = &server.browser {
        browser.tag(name, response.headers_mut());
    }
    response
}

/// Gives `response` the request id `name` as its `x-request-id`.
pub(super) fn named(response: &mut Response, name: &str) {
    if let Ok(name) = header::HeaderValue::from_str(name) {
        response.headers_mut().insert(request_id::HEADER, name);
    }
}

/// Claims the stream's name for a generation under it: a name taken (a running or retained
/// stream's: a client's `x-request-id` or `GET /v1/stream?id=` chose it) is a conflict (409),
/// found before any work starts.
pub(super) async fn claim(server: &Server, name: &str) -> Result<Claim, Response> {
    server
        .store
        .claim(name)
        .await
        .map_err(|refused| resume::claim_error(&format!("id {name}"), name, &refused))
}

/// Claims the stream's name, has the worker start a generation of `request` under it (after
/// the `skip` first tokens, which the client has), registers it and streams it to this client.
pub(super) async fn start(
    server: &Arc<Server>,
    meta: &Arc<Meta>,
    request: Request,
    skip: u64,
    connection: Connection,
) -> Response {
    let name = &meta.stream;
    let mut claim = match claim(server, name).await {
        Ok(claim) => claim,
        Err(refused) => return refused,
    };
    let stop = claim.stop_signal();
    // Its early ends (a slow reader cut off, a shutdown) in its API's error shape.
    claim.error_shape(meta.format.error_shape());
    let job = Job {
        meta: meta.clone(),
        request,
        skip,
        stop,
    };
    let events = match server.worker.start(&server.host, job) {
        Ok(events) => events,
        Err(refusal) => return refusal.response(meta.format),
    };
    match server.store.register(claim, events).await {
        Ok(frames) => respond(server, frames, name, connection),
        Err(failure) => resume::register_error(&failure),
    }
}
