//! The OpenAI error object, as an error frame or an error response carries it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::wire::{Extra, to_json};

/// An OpenAI-shaped error object, as sent in an error frame or an error response's body:
/// `{"error":{"message","type"}}`, with a `code` where the server gives one.
///
/// # Examples
///
/// ```
/// use streamgate::openai::ApiError;
///
/// let error = ApiError::new("KV cache full", "server_error").with_code("kv_cache_full");
/// assert_eq!(
///     error.to_json(),
///     r#"{"error":{"message":"KV cache full","type":"server_error","code":"kv_cache_full"}}"#
/// );
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    /// What went wrong, for a person.
    pub message: String,
    /// The error class (`server_error`, `invalid_request_error`, ...).
    #[serde(default, rename = "type")]
    pub kind: String,
    /// Fields this type does not know (`code`, `param`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// An error frame's data and an error response's body: the error object under `error`.
#[derive(Serialize, Deserialize)]
pub(super) struct ErrorBody<E> {
    pub(super) error: E,
}

impl ApiError {
    /// An error of class `kind` (`server_error`, `invalid_request_error`, ...) saying
    /// `message`.
    pub fn new(message: impl Into<String>, kind: impl Into<String>) -> Self {
        ApiError {
            message: message.into(),
            kind: kind.into(),
            extra: Extra::new(),
        }
    }

    /// Sets the error's `code`, by which a client tells errors of one class apart (a string
    /// such as `kv_cache_full`, or [`Value::Null`] for a `"code": null`).
    pub fn with_code(mut self, code: impl Into<Value>) -> Self {
        self.extra.insert("code".to_owned(), code.into());
        self
    }

    /// The error frame's data or the error response's body: `{"error":{...}}`.
    pub fn to_json(&self) -> String {
        to_json(&ErrorBody { error: self })
    }
}
