//! What a handler knows of its connection.

use axum::http::Version;
use streamgate::transport::SendQueue;

/// What a handler knows of its connection: its HTTP version and, when served by
/// `transport::Server`, its kernel send queue.
pub(super) struct Connection {
    version: Version,
    queue: Option<SendQueue>,
}

impl Connection {
    /// The send queue, when the connection carries only this stream (HTTP/1.1).
    pub(super) fn send_queue(self) -> Option<SendQueue> {
        self.queue.filter(|_| self.version <= Version::HTTP_11)
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Connection {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Connection {
            version: parts.version,
            queue: parts.extensions.get::<SendQueue>().cloned(),
        })
    }
}
