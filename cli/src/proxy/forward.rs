//! Every request that is not one of the proxy's own: a completion request (`POST
//! /v1/chat/completions`, `/v1/completions`, `/v1/messages`, `/v1/responses`) has its body read (bounded in size, time and,
//! across all requests, in buffered bytes) and goes to [`stream::relay`](super::stream::relay),
//! which gates the answer if it is a stream; anything else passes through (method, path and
//! query, headers but the hop-by-hop ones, the body streamed both ways). `Upgrade` and
//! `Connection` are hop-by-hop: a WebSocket handshake reaches the upstream as a plain request,
//! and no upgraded connection is relayed.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use bytes::BytesMut;
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Proxy;
use super::body::{Buffered, leased};
use super::format::Format;
use super::stream::{self, StreamRequest};
use super::upstream::{pass_response, set_request_id};
use crate::serving;

/// The fallback handler: every method and path the proxy does not serve itself.
pub(super) async fn forward(State(proxy): State<Arc<Proxy>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let id = proxy.request_id(&parts.headers);
    let made = crate::request_id::from_client(&parts.headers).is_none();
    let mut headers = parts.headers;
    set_request_id(&mut headers, &id);
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or("/", |path| path.as_str())
        .to_owned();
    let format = Some(&parts.method)
        .filter(|method| **method == Method::POST)
        .and_then(|_| Format::of(parts.uri.path()));
    let mut response = match format {
        None => passthrough(&proxy, parts.method, &path_and_query, &headers, body).await,
        Some(format) => match read(&proxy, body, &headers).await {
            Err(response) => response,
            Ok(body) => {
                // Whatever the body says (`"stream": "true"`, `1`, a key given twice: Python
                // servers stream those too), a 2xx `text/event-stream` answer is gated; a body
                // that asks for a stream in JSON's own terms gets the header deadline and
                // claims its id before going upstream.
                let asked = is_streamed(&body.bytes);
                let model = model(&body.bytes);
                headers.insert(header::CONTENT_LENGTH, body.bytes.len().into());
                let request = StreamRequest {
                    path_and_query,
                    headers,
                    body,
                    id: id.clone(),
                    made,
                    format,
                    asked,
                    model,
                };
                stream::relay(&proxy, request).await
            }
        },
    };
    set_request_id(response.headers_mut(), &id);
    response
}

/// Sends the request as it is to a replica of the first pool (a request that is no completion
/// names no model), and answers with the upstream's response as it is. One attempt: its body
/// streams through unread, so there is nothing to send again. Whatever the answer, the
/// replica is alive; a connection that fails counts against it.
async fn passthrough(
    proxy: &Proxy,
    method: Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let pool = &proxy.fleet.first_pool().replicas;
    // A pool has a replica (checked at start), and nothing is avoided: there is always one.
    let Some(mut lease) = pool.pick("", &[]) else {
        return serving::json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "no upstream to pass the request to",
            "upstream_error",
        );
    };
    let url = lease.replica().clone();
    match proxy
        .upstream
        .send(&url, method, path_and_query, headers, body)
        .await
    {
        Ok(response) => {
            lease.succeeded();
            proxy.stats.passed_through();
            leased(pass_response(response), lease)
        }
        Err(failure) => {
            lease.failed(&failure.failure());
            proxy.upstream_failed(&url, &failure)
        }
    }
}

/// Reads a completion request's body: at most `--max-request-bytes` (413 above it), within
/// `--body-timeout-ms` (408 after it), and within the process-wide budget of buffered bytes
/// (503 when the bytes every request being read holds would pass `--max-buffered-bytes`: a
/// request never waits for room).
async fn read(proxy: &Proxy, body: Body, headers: &HeaderMap) -> Result<Buffered, Response> {
    let limit = proxy.config.max_request_bytes;
    let too_large = || {
        serving::json_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("the request body is larger than {limit} bytes"),
            "invalid_request_error",
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(too_large());
    }
    let timeout = proxy.config.body_timeout;
    let reading = collect(&proxy.buffered, body, limit, declared);
    match tokio::time::timeout(timeout, reading).await {
        Ok(Ok(buffered)) => Ok(buffered),
        Ok(Err(ReadError::TooLarge)) => Err(too_large()),
        Ok(Err(ReadError::OverBudget)) => Err(serving::json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many large requests in flight: try again shortly",
            "server_error",
        )),
        Ok(Err(ReadError::Failed(failure))) => Err(serving::json_error(
            StatusCode::BAD_REQUEST,
            &format!("reading the request body failed: {failure}"),
            "invalid_request_error",
        )),
        Err(_) => Err(serving::json_error(
            StatusCode::REQUEST_TIMEOUT,
            &format!(
                "the request body did not arrive within {} ms",
                timeout.as_millis()
            ),
            "invalid_request_error",
        )),
    }
}

/// Why a body could not be read.
enum ReadError {
    TooLarge,
    OverBudget,
    Failed(String),
}

/// Collects `body` (at most `limit` bytes), taking a permit of `budget` for every byte as it
/// arrives.
async fn collect(
    budget: &Arc<Semaphore>,
    mut body: Body,
    limit: usize,
    declared: Option<u64>,
) -> Result<Buffered, ReadError> {
    // A declared length is allocated at once (it is within the limit); otherwise the buffer
    // grows as the chunks come.
    let capacity = declared.map_or(0, |length| usize::try_from(length).unwrap_or(limit));
    let mut bytes = BytesMut::new();
    let mut permit: Option<OwnedSemaphorePermit> = None;
    let take = |n: usize, permit: &mut Option<OwnedSemaphorePermit>| {
        let n = u32::try_from(n).map_err(|_| ReadError::TooLarge)?;
        let more = budget
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| ReadError::OverBudget)?;
        match permit {
            Some(held) => held.merge(more),
            None => *permit = Some(more),
        }
        Ok::<(), ReadError>(())
    };
    if capacity > 0 {
        take(capacity, &mut permit)?;
        bytes.reserve(capacity);
    }
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|failure| ReadError::Failed(failure.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if bytes.len() + data.len() > limit {
            return Err(ReadError::TooLarge);
        }
        let held = permit.as_ref().map_or(0, OwnedSemaphorePermit::num_permits);
        if bytes.len() + data.len() > held {
            take(bytes.len() + data.len() - held, &mut permit)?;
        }
        bytes.extend_from_slice(&data);
    }
    Ok(Buffered::new(bytes.freeze(), permit))
}

/// Whether a completion request's JSON body asks for a stream (`"stream": true`).
fn is_streamed(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Request {
        #[serde(default)]
        stream: Option<serde_json::Value>,
    }
    serde_json::from_slice::<Request>(body)
        .is_ok_and(|request| request.stream == Some(serde_json::Value::Bool(true)))
}

/// The `model` a completion request names, if its body is a JSON object that names one.
fn model(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Request {
        #[serde(default)]
        model: Option<serde_json::Value>,
    }
    serde_json::from_slice::<Request>(body)
        .ok()
        .and_then(|request| match request.model {
            Some(serde_json::Value::String(model)) => Some(model),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_requests() {
        assert!(is_streamed(br#"{"model":"m","messages":[],"stream":true}"#));
        assert!(!is_streamed(
            br#"{"model":"m","messages":[],"stream":false}"#
        ));
        assert!(!is_streamed(br#"{"model":"m","messages":[]}"#));
        assert!(!is_streamed(br#"{"stream":"true"}"#));
        assert!(!is_streamed(b"not json"));
        assert!(!is_streamed(br#"[1,2]"#));
    }
}
