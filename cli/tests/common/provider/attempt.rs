//! One request as a fake provider received it: an attempt, as the upstream counts it.

use bytes::Bytes;
use hyper::{HeaderMap, Method};
use tokio::time::Instant;

/// A request as the provider received it, recorded before it is answered.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// Its place among the provider's requests: 1 for the first (in the order their bodies were
    /// read).
    pub number: u64,
    /// When its head arrived, on tokio's monotonic clock (the gaps between attempts).
    pub at: Instant,
    /// The connection it came on: 1 for the provider's first (so a test can tell reuse).
    pub connection: u64,
    /// `POST` for a completion, `GET` for a health check.
    pub method: Method,
    /// The path and query as sent (an upstream URL's path prefix included).
    pub path: String,
    /// The request's headers as they came (`authorization`, `traceparent`...).
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
    /// The body's JSON `model`, if it has one.
    pub model: Option<String>,
}

impl Attempt {
    /// The body as JSON, if it is.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// Whether the body asks for a stream (`"stream": true`).
    pub fn streamed(&self) -> bool {
        self.json().is_some_and(|json| json["stream"] == true)
    }

    /// The body's `max_tokens`, if it has one.
    pub fn max_tokens(&self) -> Option<u64> {
        self.json()?["max_tokens"].as_u64()
    }

    /// The value of header `name`, if present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)?.to_str().ok()
    }
}
