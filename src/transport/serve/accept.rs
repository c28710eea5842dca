//! [`Server::serve`]: the accept loop, a slot and then a connection, each served on a task of
//! its own, until shutdown.

use std::future::poll_fn;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
// tokio's `sync` comes with hyper-util's `server-graceful` feature, which `server` enables.
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tower_service::Service;

use super::builder::Server;
use super::connection::{self, Settings};
use super::error::ServeError;
use super::limit::{Slots, default_max_connections};
use crate::BoxError;
use crate::transport::listener::TunedListener;

/// How long the server waits before accepting again after an error of the listener as a whole
/// (out of file descriptors, say).
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

impl Server {
    /// Accepts connections on `listener` and serves `service` on each until `shutdown`
    /// completes; then stops accepting, lets every connection finish its open requests (HTTP/2
    /// clients get a `GOAWAY`) and returns once all have closed. To bound that wait, end the
    /// open streams first (`Group::shutdown`) or race this future against a timer (dropping it
    /// stops accepting, but the connections it started go on until they close).
    ///
    /// # Examples
    ///
    /// See [`Server`].
    pub async fn serve<S, B>(
        self,
        listener: TunedListener,
        service: S,
        shutdown: impl Future<Output = ()>,
    ) where
        S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        let mut slots = Slots::new(self.max_connections.unwrap_or_else(default_max_connections));
        // Every connection's task holds a sender: once none is left, all have ended.
        let (open, mut ended) = mpsc::channel::<()>(1);
        let settings = Settings {
            builder: self.builder,
            timeouts: self.timeouts,
            on_error: self.on_error,
        };
        // Tells the connections to close (gracefully) at shutdown.
        let stopping = CancellationToken::new();
        let mut shutdown = pin!(shutdown);
        loop {
            // A slot, then the next connection: at the cap, connections wait in the listen
            // backlog, not in this process. The listener skips one connection's failures
            // itself: what is left concerns the listener (out of file descriptors, say) and is
            // reported, and the next try waits a little instead of spinning.
            let mut next = pin!(async {
                let slot = slots.acquire(&*settings.on_error).await?;
                loop {
                    match listener.accept().await {
                        Ok((stream, peer)) => return Some((slot, stream, peer)),
                        Err(error) => {
                            (settings.on_error)(ServeError::Accept(error));
                            tokio::time::sleep(ACCEPT_BACKOFF).await;
                        }
                    }
                }
            });
            let accepted = poll_fn(|cx| match shutdown.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(None),
                Poll::Pending => next.as_mut().poll(cx),
            })
            .await;
            let Some((slot, stream, peer)) = accepted else {
                break;
            };
            let connection = connection::serve(
                stream,
                peer,
                slot,
                service.clone(),
                settings.clone(),
                stopping.clone(),
            );
            let open = open.clone();
            tokio::spawn(async move {
                let _open = open;
                connection.await;
            });
        }
        drop(listener);
        stopping.cancel();
        drop(open);
        let _ = ended.recv().await;
    }
}
