//! The proxy's resume and stop endpoints, for upstreams that have none:
//! `GET /v1/chat/completions/{request_id}/stream` and `POST .../cancel` (the same under
//! `/v1/messages/`), and a Responses stream served again as OpenAI serves a background
//! response: `GET /v1/responses/{request_id}?stream=true&starting_after=N`, and `POST
//! /v1/responses/{request_id}/cancel`.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;
use streamgate::resume::{AttachError, Subscriber};

use futures_util::StreamExt;

use super::{Proxy, adopt, forward};
use crate::resume::{self, ResumeAfter, StartingAfter};
use crate::serving;

/// `GET /v1/chat/completions/{request_id}/stream` with `Last-Event-ID: n` (or `?after=n`): the
/// events after n of a running (or retained) stream, from its replay log, then live. The
/// upstream is never asked again: a resumed stream continues the same generation, unless the
/// proxy instance that ran it died (`--resume-store redis://`): then, once its lease lapsed,
/// this instance adopts the stream and carries it on upstream from the logged answer.
pub(super) async fn resume(
    State(proxy): State<Arc<Proxy>>,
    Path(id): Path<String>,
    ResumeAfter(after): ResumeAfter,
) -> Response {
    match proxy.store.attach(&id, after).await {
        Ok(frames) => attached(&proxy, frames, &id),
        Err(failure) => resume::attach_error(&failure),
    }
}

/// The client's response of a stream attached to: its frames, watched for the instance that
/// runs it dying (this one then carries it on while the client reads here).
fn attached(proxy: &Arc<Proxy>, frames: Subscriber, id: &str) -> Response {
    let watching = adopt::watch(proxy, id);
    let frames = frames.map(move |frame| {
        let _watching = &watching;
        frame
    });
    // A registered stream's id is its own (claimed), and whoever knows it may read it anyway.
    proxy.sse_response(frames, id, true)
}

/// `GET /v1/responses/{request_id}?stream=true[&starting_after=N]`: the events after sequence
/// number N (a Responses stream's sequence numbers are the proxy's event ids) of a running or
/// retained stream, as [`resume`] serves them; a stream is found by its request id, else by
/// its upstream's response id, through any instance sharing its store. An id the proxy holds
/// no stream of (a background response the upstream stores) is the upstream's: the request
/// passes through, as it does without `stream=true` (a stored response, retrieved).
pub(super) async fn response(
    State(proxy): State<Arc<Proxy>>,
    Path(id): Path<String>,
    StartingAfter { streamed, after }: StartingAfter,
    request: Request,
) -> Response {
    if !streamed {
        return forward::forward(State(proxy), request).await;
    }
    // By its request id, else by the name the stream's `response.created` gave it.
    let mut attached_to = proxy.store.attach(&id, after).await;
    let mut id = id;
    if let Err(AttachError::Unknown) = attached_to {
        match named(&proxy, &id).await {
            Ok(Some(stream)) => {
                attached_to = proxy.store.attach(&stream, after).await;
                id = stream;
            }
            Ok(None) => {}
            Err(failure) => attached_to = Err(failure),
        }
    }
    match attached_to {
        Ok(frames) => attached(&proxy, frames, &id),
        Err(AttachError::Unknown) => forward::forward(State(proxy), request).await,
        Err(failure) => resume::attach_error(&failure),
    }
}

/// `POST /v1/responses/{request_id}/cancel`: as [`cancel`] for a stream the proxy holds; the
/// upstream's for any other id (a background response it runs).
pub(super) async fn response_cancel(
    State(proxy): State<Arc<Proxy>>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    let mut stopped = proxy.store.stop(&id).await;
    let mut id = id;
    if let Err(AttachError::Unknown) = stopped {
        match named(&proxy, &id).await {
            Ok(Some(stream)) => {
                stopped = proxy.store.stop(&stream).await;
                id = stream;
            }
            Ok(None) => {}
            Err(failure) => stopped = Err(failure),
        }
    }
    match stopped {
        Err(AttachError::Unknown) => forward::forward(State(proxy), request).await,
        stopped => stopped_answer(&id, stopped),
    }
}

/// The request id of the Responses stream the upstream's response id `name` names (its
/// `response.created`'s: the registry's alias of the stream, on every instance sharing it),
/// asked when no stream has `name` as its request id.
async fn named(proxy: &Proxy, name: &str) -> Result<Option<String>, AttachError> {
    proxy
        .store
        .resolve(name)
        .await
        .map_err(AttachError::Unavailable)
}

/// `POST /v1/chat/completions/{request_id}/cancel`: an explicit stop. The upstream is dropped
/// at once, and every attached client gets a final chunk (`finish_reason` `stop`) and
/// `[DONE]`; 200 (`{"id":..,"cancelled":true}`; `false` when the stream had already ended), or
/// 404.
pub(super) async fn cancel(State(proxy): State<Arc<Proxy>>, Path(id): Path<String>) -> Response {
    stopped_answer(&id, proxy.store.stop(&id).await)
}

/// The answer to a stop of the stream `id`.
fn stopped_answer(id: &str, stopped: Result<bool, AttachError>) -> Response {
    match stopped {
        Ok(cancelled) => {
            serving::json_response(StatusCode::OK, json!({"id": id, "cancelled": cancelled}))
        }
        Err(failure) => resume::attach_error(&failure),
    }
}
