//! Server-sent events: an injection-safe encoder, an incremental WHATWG decoder, heartbeats.
//!
//! ```text
//! Consumer<T: Into<SseEvent>> --.sse()--> SseFrame stream --.heartbeat(d)--> transport
//! upstream bytes --.sse_events()--> Result<SseEvent, DecodeError> stream --> a gate at the next hop
//! ```
//!
//! - [`SseEvent`] is one event (data, type, id, retry, comment); setting a type or an id that
//!   would inject lines is a [`FieldError`].
//! - [`EncodeSse`] ([`GateExt::sse`](crate::GateExt::sse)) encodes a gate's events as
//!   [`SseFrame`]s, one per event, and an early end as a terminal `event: error` frame that
//!   carries the [end reason](crate::EndReason), in the [`ErrorShape`] of the API the stream
//!   speaks (OpenAI's by default); each event's id
//!   ([`Event::id`](crate::Event::id)) is its `id:` (unless the event has one of its own, or
//!   [`without_ids`](EncodeSse::without_ids) leaves them out).
//! - [`Heartbeat`] ([`GateExt::heartbeat`](crate::GateExt::heartbeat)) fills silences with a
//!   comment line.
//! - [`SseDecoder`] parses bytes as a WHATWG client does, in bounded memory (a
//!   [`Decoder`](tokio_util::codec::Decoder)); [`DecodeSse`]
//!   ([`GateExt::sse_events`](crate::GateExt::sse_events)) runs it over a stream of byte
//!   chunks.
//!
//! An event's kind crosses a hop that decodes: a hidden or control event is written with a
//! `:hidden` or `:control` comment line, which clients ignore and the decoder reads back, so
//! a gateway's probes count it as the worker's did.
//!
//! The module frames and parses bytes; it knows no transport.
//!
//! # Examples
//!
//! A worker's stream, encoded with ids, and decoded again at the next hop:
//!
//! ```
//! use futures_util::StreamExt;
//! use streamgate::sse::SseEvent;
//! use streamgate::{Chunk, Gate, GateExt, Kind};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let consumer = Gate::new().spawn(|_, mut tx| async move {
//!     tx.send(SseEvent::text("thinking").hidden()).await?;
//!     tx.send(SseEvent::data("Hello")).await?;
//!     Ok::<_, streamgate::SendError<SseEvent>>(())
//! });
//! let frames: Vec<_> = consumer.sse().collect().await;
//! assert_eq!(&frames[1].bytes()[..], b"id: 1\ndata: Hello\n\n");
//!
//! // The bytes on the wire, read by a gateway.
//! let body = futures_util::stream::iter(frames.into_iter().map(|frame| {
//!     Ok::<_, std::io::Error>(frame.into_bytes())
//! }));
//! let events: Vec<SseEvent> = body.sse_events().map(Result::unwrap).collect().await;
//! assert_eq!((events[0].id(), events[0].kind()), (Some("0"), Kind::Hidden));
//! assert_eq!((events[1].id(), events[1].data_str()), (Some("1"), Some("Hello")));
//! # }
//! ```

mod decode;
mod decoder;
mod encode;
mod error_shape;
mod event;
mod frame;
mod heartbeat;

pub use self::decode::DecodeSse;
pub use self::decoder::{DEFAULT_MAX_EVENT, DEFAULT_MAX_LINE, DecodeError, SseDecoder};
#[cfg(feature = "redis")]
pub(crate) use self::encode::end_frame;
pub use self::encode::{EncodeSse, GateItem};
pub use self::error_shape::ErrorShape;
pub use self::event::{FieldError, SseEvent};
pub use self::frame::SseFrame;
pub use self::heartbeat::Heartbeat;
