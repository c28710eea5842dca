//! An axum response of SSE frames, and `axum::serve` support for [`TunedListener`].

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use futures_core::Stream;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};

use super::body::SseBody;
use super::listener::TunedListener;
use super::stream::{SendQueue, TunedStream};
use crate::sse::SseFrame;

/// An axum response streaming SSE frames, one HTTP chunk per frame.
///
/// It sets `Content-Type: text/event-stream`, `Cache-Control: no-cache` and
/// `X-Accel-Buffering: no` (so nginx-style proxies stream it), and no `Content-Length`.
/// tower-http's `CompressionLayer` leaves `text/event-stream` alone by default, so frames are
/// not held back in a compressor.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::get};
/// use streamgate::transport::SseResponse;
/// use streamgate::{Gate, GateExt, sse::SseEvent};
///
/// async fn tokens() -> SseResponse<impl futures_core::Stream<Item = streamgate::sse::SseFrame>> {
///     let consumer = Gate::new().spawn(|_, mut tx| async move {
///         for i in 0..3 {
///             tx.send(SseEvent::data(format!("t{i} "))).await?;
///         }
///         Ok::<_, streamgate::SendError<SseEvent>>(())
///     });
///     // Each event's id as its SSE `id:`, for a client's `Last-Event-ID`.
///     SseResponse::new(consumer.sse().heartbeat(Duration::from_secs(15)))
/// }
///
/// let app: Router = Router::new().route("/tokens", get(tokens));
/// ```
#[derive(Debug)]
#[must_use = "a response does nothing unless returned"]
pub struct SseResponse<S> {
    body: SseBody<S>,
}

impl<S> SseResponse<S> {
    /// A response streaming `frames`.
    pub fn new(frames: S) -> Self {
        SseResponse {
            body: SseBody::new(frames),
        }
    }
}

impl<S> IntoResponse for SseResponse<S>
where
    S: Stream<Item = SseFrame> + Send + 'static,
{
    fn into_response(self) -> Response {
        let mut response = Response::new(axum::body::Body::new(self.body));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
        response
    }
}

impl axum::serve::Listener for TunedListener {
    type Io = TunedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TunedStream, SocketAddr) {
        loop {
            match TunedListener::accept(self).await {
                Ok(accepted) => return accepted,
                // Out of file descriptors and the like (one connection's failures never reach
                // here): wait before trying again, as axum's own listener does, instead of
                // spinning.
                Err(_error) => {
                    #[cfg(feature = "tracing")]
                    tracing::error!(error = %_error, "accepting a connection failed; retrying in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        TunedListener::local_addr(self)
    }
}

/// With `Router::into_make_service_with_connect_info::<SendQueue>()`, a handler takes
/// `ConnectInfo<SendQueue>` to see what the kernel holds of its connection (for
/// [`Departures`](super::Departures)).
impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TunedListener>>
    for SendQueue
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, TunedListener>) -> Self {
        stream.io().send_queue()
    }
}
