//! Transports: where frames leave the process, each behind a cargo feature.
//!
//! - `SseBody` (feature `hyper`): an `http_body::Body` yielding exactly one data frame per
//!   event, never holding a ready frame back.
//! - `SseResponse` (feature `axum`): an axum response with the streaming headers.
//! - `FrameWriter` (feature `io`): writes and flushes each frame to any `AsyncWrite` and
//!   reports when each write completed.
//! - `TunedListener` and `unsent_bytes` (feature `net`): accepted sockets with
//!   `TCP_NODELAY`, a chosen listen backlog and an optional bounded `SO_SNDBUF`, and the bytes
//!   the kernel still holds for a socket.
//!
//! Every transport carries what [`GateExt::sse`](crate::GateExt::sse) encodes, so a stream
//! that did not complete ends with a visible `event: error` frame before EOF; and dropping a
//! transport drops the gate's consumer, which cancels the generator.

#[cfg(feature = "axum")]
mod axum;
#[cfg(feature = "hyper")]
mod body;
#[cfg(feature = "net")]
mod listener;
#[cfg(feature = "io")]
mod writer;

#[cfg(feature = "axum")]
pub use self::axum::SseResponse;
#[cfg(feature = "hyper")]
pub use self::body::SseBody;
#[cfg(feature = "net")]
pub use self::listener::{DEFAULT_BACKLOG, ListenOptions, TunedListener, unsent_bytes};
#[cfg(feature = "io")]
pub use self::writer::FrameWriter;
