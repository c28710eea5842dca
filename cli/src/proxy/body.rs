//! A completion request's body, read into memory, and its share of the process-wide budget
//! of buffered bytes (`--max-buffered-bytes`), held until hyper has sent it upstream.

use axum::body::{Body, Bytes};
use tokio::sync::OwnedSemaphorePermit;

/// A completion request's body, read into memory: the bytes and their share of the
/// process-wide budget (`--max-buffered-bytes`), given back once the body is sent upstream.
pub(super) struct Buffered {
    pub(super) bytes: Bytes,
    permit: Option<OwnedSemaphorePermit>,
}

impl Buffered {
    /// `bytes`, holding `permit`'s share of the budget.
    pub(super) fn new(bytes: Bytes, permit: Option<OwnedSemaphorePermit>) -> Self {
        Buffered { bytes, permit }
    }

    /// The body to send upstream: it gives the budget back when hyper has taken its bytes (or
    /// drops it).
    pub(super) fn into_body(self) -> Body {
        Body::new(HeldBody {
            bytes: Some(self.bytes),
            permit: self.permit,
        })
    }
}

/// A request body that holds its share of the buffered-bytes budget until it is sent.
struct HeldBody {
    bytes: Option<Bytes>,
    permit: Option<OwnedSemaphorePermit>,
}

impl hyper::body::Body for HeldBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        this.permit = None;
        std::task::Poll::Ready(
            this.bytes
                .take()
                .filter(|bytes| !bytes.is_empty())
                .map(|bytes| Ok(hyper::body::Frame::data(bytes))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.bytes.as_ref().is_none_or(Bytes::is_empty)
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.bytes.as_ref().map_or(0, |bytes| bytes.len() as u64))
    }
}
