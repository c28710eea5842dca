//! Every request that is not one of the proxy's own: a streamed completion goes to
//! [`stream::relay`](super::stream::relay); anything else passes through untouched (method,
//! path and query, headers but the hop-by-hop ones, the body streamed both ways).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap};
use axum::http::{Method, StatusCode, Version};
use axum::response::Response;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;

use super::stream::{self, StreamRequest};
use super::upstream::{set_request_id, strip_hop_by_hop};
use super::{Proxy, REQUEST_ID};
use crate::serving;

/// The endpoints whose `"stream": true` requests the proxy streams itself, and whether their
/// chunks are chat completion chunks.
const STREAMED: [(&str, bool); 2] = [("/v1/chat/completions", true), ("/v1/completions", false)];

/// The fallback handler: every method and path the proxy does not serve itself.
pub(super) async fn forward(State(proxy): State<Arc<Proxy>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let id = proxy.request_id(&parts.headers);
    let mut headers = parts.headers;
    set_request_id(&mut headers, &id);
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or("/", |path| path.as_str())
        .to_owned();
    let chat = STREAMED
        .iter()
        .find(|(path, _)| parts.method == Method::POST && parts.uri.path() == *path)
        .map(|(_, chat)| *chat);
    let mut response = match chat {
        None => passthrough(&proxy, parts.method, &path_and_query, &headers, body).await,
        Some(chat) => match read(body, &headers, proxy.config.max_request_bytes).await {
            Err(response) => response,
            Ok(body) if is_streamed(&body) => {
                let request = StreamRequest {
                    path_and_query,
                    headers,
                    body,
                    id: id.clone(),
                    chat,
                };
                stream::relay(&proxy, request).await
            }
            // Not streamed (or not JSON: the upstream says what is wrong with it).
            Ok(body) => {
                headers.insert(header::CONTENT_LENGTH, body.len().into());
                passthrough(&proxy, parts.method, &path_and_query, &headers, body.into()).await
            }
        },
    };
    set_request_id(response.headers_mut(), &id);
    response
}

/// Sends the request upstream as it is and answers with the upstream's response as it is.
async fn passthrough(
    proxy: &Proxy,
    method: Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    match proxy
        .upstream
        .send(method, path_and_query, headers, body)
        .await
    {
        Ok(response) => {
            proxy.stats.passed_through();
            pass_response(response)
        }
        Err(failure) => proxy.upstream_failed(&failure),
    }
}

/// The upstream's response as the client's: status, headers but the hop-by-hop ones, and the
/// body streamed as it comes. A body the upstream cuts short (fewer bytes than its
/// `Content-Length`, a chunked body without its last chunk) fails the client's response too,
/// so hyper cuts the client's connection rather than end a short body cleanly.
pub(super) fn pass_response(response: hyper::Response<Incoming>) -> Response {
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    // The client's connection has its own version.
    parts.version = Version::default();
    Response::from_parts(parts, Body::new(body))
}

/// Reads a request body of at most `limit` bytes: 413 above it.
async fn read(body: Body, headers: &HeaderMap, limit: usize) -> Result<Bytes, Response> {
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
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(failure) if failure.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Err(failure) => Err(serving::json_error(
            StatusCode::BAD_REQUEST,
            &format!("reading the request body failed: {failure}"),
            "invalid_request_error",
        )),
    }
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

/// `x-request-id`, as the client sent it.
pub(super) fn client_request_id(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(REQUEST_ID)
        .and_then(|value| value.to_str().ok())
        .filter(|id| !id.is_empty() && id.len() <= 256)
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
