//! A generation a worker refused before any work started, as the client is answered.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use streamgate::openai::ApiError;

use super::format::Format;

/// Why a worker did not start a generation.
///
/// # Examples
///
/// ```
/// use streamgate_cli::serve::Refusal;
///
/// let busy = Refusal::Busy {
///     code: "kv_cache_full",
///     message: "every slot is busy".into(),
/// };
/// assert_eq!(busy.to_string(), "every slot is busy");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The worker is busy (every KV block or slot is held): 503 with `Retry-After: 1`, in
    /// OpenAI's error shape in every API (`server_error`, with `code`); a retry may find room.
    Busy { code: &'static str, message: String },
    /// The request cannot be served as it is (a prompt longer than the context): 400
    /// `invalid_request_error` in the API's shape, with `code` where the API has one.
    Invalid { code: &'static str, message: String },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Busy { message, .. } | Refusal::Invalid { message, .. } => {
                f.write_str(message)
            }
        }
    }
}

impl Refusal {
    /// The response a client of `format` gets.
    pub fn response(&self, format: Format) -> Response {
        match self {
            Refusal::Busy { code, message } => {
                let error = ApiError::new(message.as_str(), "server_error").with_code(*code);
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [
                        (header::CONTENT_TYPE, "application/json"),
                        (header::RETRY_AFTER, "1"),
                    ],
                    error.to_json(),
                )
                    .into_response()
            }
            Refusal::Invalid { code, message } => {
                let body = format.error_body("invalid_request_error", message, Some(code));
                let json = [(header::CONTENT_TYPE, "application/json")];
                (StatusCode::BAD_REQUEST, json, body).into_response()
            }
        }
    }
}
