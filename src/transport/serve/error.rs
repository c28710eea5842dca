//! The errors met while serving, and which of a connection's errors only say the client left.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::BoxError;

/// Where a server gives the errors it meets, [`Server::on_error`](super::Server::on_error)'s.
pub(super) type OnError = Arc<dyn Fn(ServeError) + Send + Sync>;

/// An error met while serving, given to [`Server::on_error`](super::Server::on_error).
///
/// # Examples
///
/// ```
/// use streamgate::transport::{ServeError, Server};
///
/// let server = Server::new().on_error(|error| match &error {
///     // A slowloris, or a very slow link: worth a counter, not a page.
///     ServeError::HeaderTimeout { .. } => {}
///     _ => eprintln!("server: {error}"),
/// });
/// # let _ = server;
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum ServeError {
    /// Accepting failed for the listener as a whole (out of file descriptors, say); the server
    /// accepts again after [`ACCEPT_BACKOFF`](super::ACCEPT_BACKOFF).
    Accept(io::Error),
    /// A connection ended with an error: a malformed request, an HTTP/2 protocol error, a
    /// client that vanished while a response was being written (the user timeout ran out; a
    /// client that closed or reset its connection is not an error).
    Connection {
        /// The client's address.
        peer: SocketAddr,
        /// What hyper reported.
        error: BoxError,
    },
    /// A client did not send a whole request head within
    /// [`header_read_timeout`](super::Server::header_read_timeout) of its first byte (a
    /// slowloris, or a very slow link): its connection was closed.
    HeaderTimeout {
        /// The client's address.
        peer: SocketAddr,
    },
    /// The server reached its [connection cap](super::Server::max_connections) and stopped
    /// accepting: new connections wait in the listen backlog until open ones close. Reported
    /// once until a tenth of the slots are free again, not for every waiting connection.
    ConnectionLimit {
        /// The cap.
        limit: usize,
    },
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::Accept(error) => write!(f, "accepting a connection: {error}"),
            ServeError::Connection { peer, error } => write!(f, "connection from {peer}: {error}"),
            ServeError::HeaderTimeout { peer } => {
                write!(
                    f,
                    "connection from {peer}: request head not received in time"
                )
            }
            ServeError::ConnectionLimit { limit } => write!(
                f,
                "{limit} connections open, the cap: new ones wait in the listen backlog"
            ),
        }
    }
}

/// The message already includes the wrapped error's, so the source is the wrapped error's own.
impl std::error::Error for ServeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ServeError::Accept(error) => error.source(),
            ServeError::Connection { error, .. } => error.source(),
            ServeError::HeaderTimeout { .. } | ServeError::ConnectionLimit { .. } => None,
        }
    }
}

/// Whether a connection's error only says that the client left: before a response was
/// complete (an end of file), or by resetting the connection, as a client that closes its
/// socket with bytes it has not read does (an SSE reader that leaves mid-stream, most often):
/// the next read or write meets a reset or a broken pipe. A client that vanished (the user
/// timeout ran out) is still reported.
pub(super) fn is_client_gone(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_incomplete_message)
        {
            return true;
        }
        if let Some(error) = error.downcast_ref::<io::Error>() {
            return matches!(
                error.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionAborted
            );
        }
        cause = error.source();
    }
    false
}
