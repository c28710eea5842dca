//! A request in flight on a connection, and the response body that keeps it so.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::activity::Activity;

/// One request in flight on a connection, from the moment its head was read until its response
/// body is dropped (or its handler's future, if it never answered).
#[derive(Debug)]
pub(super) struct Busy(Arc<Activity>);

impl Busy {
    /// The request whose head was just read on the connection of `activity`.
    pub(super) fn begin(activity: &Arc<Activity>) -> Self {
        activity.request_began();
        Busy(activity.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.request_ended();
    }
}

pin_project! {
    /// A response body that keeps its request in flight until it is dropped.
    pub(super) struct InFlight<B> {
        #[pin]
        body: B,
        _busy: Busy,
    }
}

impl<B> InFlight<B> {
    /// `body`, the response to the request of `busy`.
    pub(super) fn new(body: B, busy: Busy) -> Self {
        InFlight { body, _busy: busy }
    }
}

impl<B: http_body::Body> http_body::Body for InFlight<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
