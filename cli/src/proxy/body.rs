//! Bodies the proxy holds: a completion request's, read into memory with its share of the
//! process-wide budget of buffered bytes (`--max-buffered-bytes`), and an answer's that holds
//! its attempt's lease on a replica until it ends.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::response::Response;
use hyper::body::{Frame, SizeHint};
use streamgate::fleet::Lease;
use tokio::sync::OwnedSemaphorePermit;

use super::url::UpstreamUrl;

/// A completion request's body, read into memory: the bytes, and their share of the
/// process-wide budget (`--max-buffered-bytes`), given back when it is dropped (once the
/// attempts are over: each sends the bytes again).
pub(super) struct Buffered {
    pub(super) bytes: Bytes,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Buffered {
    /// `bytes`, holding `permit`'s share of the budget.
    pub(super) fn new(bytes: Bytes, permit: Option<OwnedSemaphorePermit>) -> Self {
        Buffered {
            bytes,
            _permit: permit,
        }
    }
}

/// `response` with a body that holds `lease` (a request in flight on its replica) until the
/// body ends, fails or is dropped.
pub(super) fn leased(response: Response, lease: Lease<UpstreamUrl>) -> Response {
    response.map(|body| {
        Body::new(Leased {
            body,
            lease: Some(lease),
        })
    })
}

/// A body and the lease it holds.
struct Leased {
    body: Body,
    lease: Option<Lease<UpstreamUrl>>,
}

impl hyper::body::Body for Leased {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.lease = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
