//! Server-sent events: an injection-safe encoder, an incremental WHATWG decoder, heartbeats.
//!
//! ```text
//! Consumer<T: Into<SseEvent>> --.sse()--> SseFrame stream --.heartbeat(d)--> transport
//! upstream bytes --.sse_events()--> SseEvent stream --> a gate at the next hop
//! ```
//!
//! The module frames and parses bytes; it knows no transport.

mod decode;
mod decoder;
mod encode;
mod event;
mod frame;
mod heartbeat;

pub use self::decode::DecodeSse;
pub use self::decoder::{DEFAULT_MAX_EVENT, DEFAULT_MAX_LINE, DecodeError, SseDecoder};
pub use self::encode::{EncodeSse, GateItem};
#[cfg(feature = "redis")]
pub(crate) use self::encode::{end_frame, error_frame};
pub use self::event::{FieldError, SseEvent};
pub use self::frame::SseFrame;
pub use self::heartbeat::Heartbeat;
