//! Transports: where frames leave the process, each behind a cargo feature.
//!
//! - `SseBody` (feature `hyper`): an `http_body::Body` yielding exactly one data frame per
//!   event, never holding a ready frame back.
//! - `SseResponse` (feature `axum`): an axum response with the streaming headers.
//! - `FrameWriter` (feature `io`): writes and flushes each frame to any `AsyncWrite` and
//!   reports when each write completed.
//! - `TunedListener` (feature `net`): accepted sockets with `TCP_NODELAY`, a bounded unsent
//!   queue (`TCP_NOTSENT_LOWAT`), a user timeout and keepalive that find vanished clients, a
//!   chosen listen backlog and an optional bounded `SO_SNDBUF`.
//! - `TunedStream`, `SendQueue`, `unsent_bytes` (feature `net`): what the kernel still holds
//!   for a connection; `Departures` records when each event's bytes left it, as a hop.
//! - `Server` (feature `server`): serves a service over HTTP/1.1 and h2c on one
//!   `TunedListener`, with h2's per-stream send buffer bounded like the gate.
//!
//! Every transport carries what [`GateExt::sse`](crate::GateExt::sse) encodes, so a stream
//! that did not complete ends with a visible `event: error` frame before EOF; and dropping a
//! transport drops the gate's consumer, which cancels the generator.

#[cfg(feature = "axum")]
mod axum;
#[cfg(feature = "hyper")]
mod body;
#[cfg(feature = "net")]
mod departures;
#[cfg(feature = "net")]
mod listener;
#[cfg(feature = "server")]
mod serve;
#[cfg(feature = "net")]
mod stream;
#[cfg(feature = "io")]
mod writer;

#[cfg(feature = "axum")]
pub use self::axum::SseResponse;
#[cfg(feature = "hyper")]
pub use self::body::SseBody;
#[cfg(feature = "net")]
pub use self::departures::{DEPARTURE_CHECK, DEPARTURE_CHECK_MAX, Departures};
#[cfg(feature = "net")]
pub use self::listener::{
    DEFAULT_BACKLOG, DEFAULT_KEEPALIVE, DEFAULT_NOTSENT_LOWAT, DEFAULT_USER_TIMEOUT, ListenOptions,
    TunedListener,
};
#[cfg(feature = "server")]
pub use self::serve::{
    ACCEPT_BACKOFF, DEFAULT_FIRST_BYTE_TIMEOUT, DEFAULT_H2_SEND_BUFFER,
    DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT, ServeError, Server, default_max_connections,
};
#[cfg(feature = "net")]
pub use self::stream::{SendQueue, TunedStream, unacknowledged_bytes, unsent_bytes};
#[cfg(feature = "io")]
pub use self::writer::FrameWriter;
