//! Serving a service over HTTP/1.1 and h2c on one [`TunedListener`], with a cap on open
//! connections and timeouts for silent, slow and idle clients.
//!
//! - `builder`: [`Server`], how it serves, set up before it starts.
//! - `accept`: [`Server::serve`], the accept loop: a slot, then a connection, each on its own
//!   task, until shutdown.
//! - `limit`: the connection cap, its default from the file descriptor limit
//!   ([`default_max_connections`]) and the slots that enforce it.
//! - `connection`: one connection's task, from its first byte to its close.
//! - `activity`: what a connection is doing (requests in flight, a request head being read),
//!   and what is due when its timer fires.
//! - `in_flight`: a request in flight, and the response body that keeps it so.
//! - `watched`: the accepted socket, which notes when a request head begins.
//! - `cork`: the socket's writes, held to the end of the runtime's tick.
//! - `timeouts`: the timeouts every connection gets, and their defaults.
//! - `error`: [`ServeError`].
//!
//! [`TunedListener`]: crate::transport::TunedListener

mod accept;
mod activity;
mod builder;
mod connection;
mod cork;
mod error;
mod in_flight;
mod limit;
mod timeouts;
mod watched;

pub use self::accept::ACCEPT_BACKOFF;
pub use self::builder::{DEFAULT_H2_SEND_BUFFER, Server};
pub use self::error::ServeError;
pub use self::limit::default_max_connections;
pub use self::timeouts::{
    DEFAULT_FIRST_BYTE_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
};
