//! What the client gets when the upstream fails: a status with an OpenAI-style error body
//! (`{"error":{"message":..,"type":"upstream_error"}}`), or a stream's terminal error frame.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::Value;
use streamgate::openai::ApiError;
use streamgate::sse::SseEvent;

use super::upstream::UpstreamError;
use super::url::UpstreamUrl;
use crate::serving;

/// The answer when the upstream at `url` gave no response: 502 when it could not be reached,
/// its certificate was not trusted or it failed, 504 when it took too long, typed
/// `upstream_error`.
pub(super) fn upstream(url: &UpstreamUrl, error: &UpstreamError) -> Response {
    let (status, message) = failure(url, error);
    serving::json_error(status, &message, "upstream_error")
}

/// The status and the message for an upstream that gave no (usable) response.
pub(super) fn failure(url: &UpstreamUrl, error: &UpstreamError) -> (StatusCode, String) {
    match error {
        UpstreamError::Connect(why) => (
            StatusCode::BAD_GATEWAY,
            format!("upstream {url} unreachable: {why}"),
        ),
        UpstreamError::ConnectTimeout => (
            StatusCode::GATEWAY_TIMEOUT,
            format!("upstream {url}: connecting timed out"),
        ),
        UpstreamError::Tls(why) => (
            StatusCode::BAD_GATEWAY,
            format!("upstream {url}: TLS failed (is --upstream-ca the CA that signed it?): {why}"),
        ),
        UpstreamError::HeadersTimeout(after) => (
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "upstream {url} sent no response headers within {} ms",
                after.as_millis()
            ),
        ),
        UpstreamError::Failed(why) => (
            StatusCode::BAD_GATEWAY,
            format!("upstream {url} failed: {why}"),
        ),
    }
}

/// The terminal frame of a stream whose upstream failed: `event: error` and an OpenAI error
/// object of type `upstream_error` (the frame's type makes the encoder end the stream there, as
/// `upstream_error`, and the OpenAI SDKs raise it).
pub(super) fn upstream_frame(message: &str) -> SseEvent {
    let error = ApiError::new(message, "upstream_error").with_code(Value::Null);
    SseEvent::data(error.to_json())
        .with_event("error")
        .expect("a constant type")
}
