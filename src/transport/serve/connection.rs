//! One connection, from its first byte to its close: served by hyper, and closed when it is
//! idle too long, when a request head takes too long, or at shutdown.

use std::future::poll_fn;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
// tokio's `sync` comes with hyper-util's `server-graceful` feature, which `server` enables.
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tower_service::Service;

use super::activity::{Activity, Due};
use super::error::{OnError, ServeError, is_client_gone};
use super::in_flight::{Busy, InFlight};
use super::timeouts::{Timeouts, later};
use super::watched::Watched;
use crate::BoxError;
use crate::transport::stream::TunedStream;

/// How a server serves each of its connections.
#[derive(Clone)]
pub(super) struct Settings {
    pub(super) builder: Builder<TokioExecutor>,
    pub(super) timeouts: Timeouts,
    pub(super) on_error: OnError,
}

/// Serves `service` on the accepted `stream` from `peer`, which holds `slot` until its socket
/// closes, and closes it gracefully once `stopping` is cancelled; the future ends when the
/// connection has. Errors go to the settings' `on_error`.
pub(super) fn serve<S, B>(
    stream: TunedStream,
    peer: SocketAddr,
    slot: OwnedSemaphorePermit,
    service: S,
    settings: Settings,
    stopping: CancellationToken,
) -> impl Future<Output = ()> + Send + 'static
where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    // Each request carries its connection's send queue (for `Departures`), and counts as in
    // flight until its response body is dropped.
    let activity = Arc::new(Activity::new());
    let queue = stream.send_queue();
    let service = TowerToHyperService::new(service);
    let requests = activity.clone();
    let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(queue.clone());
        let busy = Busy::begin(&requests);
        let response = hyper::service::Service::call(&service, request);
        async move {
            let response = response.await?;
            Ok::<_, S::Error>(response.map(|body| InFlight::new(body, busy)))
        }
    });
    let io = Watched::new(stream, activity.clone(), slot);
    let Settings {
        builder,
        timeouts,
        on_error,
    } = settings;
    async move {
        // The protocol is read from the first bytes, and the other timeouts start after it: a
        // connection that sends nothing is closed after the first byte timeout, or at
        // shutdown.
        let first = tokio::time::timeout(timeouts.first_byte, io.peek_first());
        if !matches!(stopping.run_until_cancelled(first).await, Some(Ok(Ok(1..)))) {
            return;
        }
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(io), service)
            .into_owned();
        let connection = pin!(connection);
        let ended = drive(
            connection,
            |connection| connection.graceful_shutdown(),
            &activity,
            timeouts,
            &stopping,
        );
        match ended.await {
            Ended::Closed(Err(error)) if !is_client_gone(&*error) => {
                on_error(ServeError::Connection { peer, error });
            }
            Ended::HeaderTimeout => on_error(ServeError::HeaderTimeout { peer }),
            Ended::Closed(_) | Ended::Unanswered => {}
        }
    }
}

/// How a connection's task ended.
enum Ended {
    /// hyper's connection finished, with what it returned.
    Closed(Result<(), BoxError>),
    /// A request head was not complete in time: the connection was dropped.
    HeaderTimeout,
    /// Asked to close, the client did not let the connection finish: it was dropped once no
    /// request was in flight.
    Unanswered,
}

/// Drives one connection to its end, closing it when it is idle too long, when a request head
/// takes too long, or at shutdown. `graceful` asks hyper to close the connection once its open
/// requests are done.
///
/// Per wake-up this costs a poll of the shutdown signal, an atomic load and a poll of the
/// timer, which is reset only when the connection's state asks for another deadline: when a
/// request head begins, or once per `idle` (at most) while the connection is busy.
async fn drive<C>(
    mut connection: Pin<&mut C>,
    graceful: impl Fn(Pin<&mut C>),
    activity: &Activity,
    timeouts: Timeouts,
    stopping: &CancellationToken,
) -> Ended
where
    C: Future,
    C::Output: Into<Result<(), BoxError>>,
{
    let mut stop = pin!(stopping.cancelled());
    let mut timer = pin!(tokio::time::sleep_until(later(
        activity.start(),
        timeouts.idle
    )));
    // When the connection was asked to close, if it was.
    let mut closing: Option<Instant> = None;
    // The request head whose deadline the timer took into account.
    let mut head_seen = None;
    poll_fn(|cx| {
        loop {
            if let Poll::Ready(result) = connection.as_mut().poll(cx) {
                return Poll::Ready(Ended::Closed(result.into()));
            }
            if closing.is_none() && stop.as_mut().poll(cx).is_ready() {
                let now = Instant::now();
                closing = Some(now);
                graceful(connection.as_mut());
                timer.as_mut().reset(later(now, timeouts.header_read));
                continue;
            }
            // A head that began during this poll may be due before the timer.
            let head = activity.head();
            if head != head_seen {
                head_seen = head;
                if let (None, Some(head)) = (closing, head) {
                    let due = later(activity.at(head), timeouts.header_read);
                    if due < timer.deadline() {
                        timer.as_mut().reset(due);
                    }
                }
            }
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let now = Instant::now();
            match activity.due(now, timeouts, closing) {
                Due::Later(at) => reset(timer.as_mut(), at, now),
                Due::Idle => {
                    closing = Some(now);
                    graceful(connection.as_mut());
                    timer.as_mut().reset(later(now, timeouts.header_read));
                }
                Due::HeaderTimeout => return Poll::Ready(Ended::HeaderTimeout),
                Due::Unanswered => return Poll::Ready(Ended::Unanswered),
            }
        }
    })
    .await
}

/// Resets `timer` to `at`, or a little after `now` if `at` is not later (so a zero timeout
/// does not spin).
fn reset(timer: Pin<&mut Sleep>, at: Instant, now: Instant) {
    timer.reset(at.max(later(now, Duration::from_millis(1))));
}
