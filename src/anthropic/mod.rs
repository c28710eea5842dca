//! Anthropic Messages stream events (feature `anthropic`): the events of `POST /v1/messages`
//! with `"stream": true`, which parse, encode and merge losslessly, with their end
//! (`message_stop`) and error (`error`, which can come after a `200 OK`) frames.
//!
//! ```text
//! upstream SseEvent --MessagesEvent::from_sse--> MessagesEvent --gate (Coalesce)--> SseEvent::from --> client
//! ```
//!
//! Each event is written `event: <type>` and `data: {"type":<type>,...}`. Parsing keeps every
//! field a type does not know (in `extra`, at each level), and an event of a type this module
//! does not know as it came ([`UnknownEvent`]), so a hop passes on what it does not understand;
//! encoding loses nothing but the order of the keys and the `null`s of optional fields (a
//! `message_delta`'s `stop_reason` and `stop_sequence` are always written, as Anthropic does).
//!
//! Under [`Policy::Coalesce`](crate::Policy::Coalesce) a slow reader gets fewer, larger
//! events that an Anthropic SDK accumulates into exactly the message it would have built from
//! the originals (see [`MessagesData`]'s `merge`): a block's text, tool input and thinking
//! deltas concatenate, `ping`s are absorbed, the last `message_delta` stands.
//!
//! ```
//! use streamgate::Chunk;
//! use streamgate::anthropic::{
//!     ContentBlock, ContentBlockStart, ContentBlockStop, Message, MessageDelta, MessageStart,
//!     MessagesData, MessagesEvent, StopDelta, Usage,
//! };
//! use streamgate::sse::SseEvent;
//!
//! let usage = |input, output| Usage {
//!     input_tokens: Some(input),
//!     output_tokens: Some(output),
//!     ..Usage::default()
//! };
//! let message = Message { usage: Some(usage(3, 1)), ..Message::new("msg_1", "my-model") };
//! let start = MessageStart { message, ..MessageStart::default() };
//! let block = ContentBlockStart { index: 0, content_block: ContentBlock::text(), ..ContentBlockStart::default() };
//! let mut hello = MessagesData::text_delta(0, "Hel");
//! hello.merge(MessagesData::ping()).unwrap(); // absorbed
//! hello.merge(MessagesData::text_delta(0, "lo")).unwrap();
//! let stop = ContentBlockStop { index: 0, ..ContentBlockStop::default() };
//! let end_turn = StopDelta { stop_reason: Some("end_turn".into()), ..StopDelta::default() };
//! let delta = MessageDelta { delta: end_turn, usage: Some(usage(3, 2)), ..MessageDelta::default() };
//!
//! let stream = [
//!     start.into(),
//!     block.into(),
//!     hello,
//!     stop.into(),
//!     delta.into(),
//!     MessagesData::message_stop(),
//! ];
//! let frames: Vec<SseEvent> = stream.into_iter().map(SseEvent::from).collect();
//! assert_eq!(frames[2].event(), Some("content_block_delta"));
//! assert_eq!(
//!     frames[2].data_str(),
//!     Some(r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#)
//! );
//! assert_eq!(
//!     frames[4].data_str(),
//!     Some(r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":3,"output_tokens":2}}"#)
//! );
//! assert_eq!(&frames[5].encode()[..], b":control\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
//! ```
//!
//! An event's kind marks it on the wire where a decoder could not tell it (`:hidden` for
//! thinking, `:control` for the lifecycle events and `ping`), as for every event the crate
//! encodes; clients ignore comment lines.

mod data;
mod delta;
mod event;
mod events;
mod merge;
mod message;

pub use self::data::MessagesData;
pub use self::delta::Delta;
pub use self::event::MessagesEvent;
pub use self::events::{
    ContentBlockDelta, ContentBlockStart, ContentBlockStop, ErrorEvent, MessageDelta, MessageStart,
    MessageStop, Ping, StopDelta,
};
pub use self::message::{ApiError, ContentBlock, Message, Usage};
pub use crate::wire::{Extra, ParseError, UnknownEvent};
