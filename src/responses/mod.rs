//! OpenAI Responses stream events (feature `responses`): the events of `POST /v1/responses`
//! with `"stream": true` (and of `GET /v1/responses/{id}?stream=true`), which parse, encode and
//! merge losslessly, each with its `sequence_number`, and the stream's ends
//! (`response.completed`, `response.incomplete`, `response.failed`) and `error` frame.
//!
//! ```text
//! upstream SseEvent --ResponsesEvent::from_sse--> ResponsesEvent --gate (Coalesce)--> SseEvent::from --> client
//! ```
//!
//! Each event is written `event: <type>` and `data: {"type":<type>,...}`. Parsing keeps every
//! field a type does not know (in `extra`, at each level), and an event of a type this module
//! does not know as it came ([`UnknownEvent`]: the audio, tool-call progress, annotation and
//! other events, `[DONE]`), so a hop passes on what it does not understand; encoding loses
//! nothing but the order of the keys and the `null`s of optional fields. The fields that place
//! an event and its `sequence_number` are optional, as some servers leave them out; a proxy
//! fills them in through [`ResponsesData::sequence_number_mut`] and the shapes' public fields.
//!
//! Under [`Policy::Coalesce`](crate::Policy::Coalesce) a slow reader gets fewer, larger
//! deltas that an OpenAI SDK accumulates into exactly the response it would have built from the
//! originals (see [`ResponsesData`]'s `merge`); a merged delta keeps the last `sequence_number`
//! it covers, so `starting_after` resumes it exactly.
//!
//! ```
//! use streamgate::Chunk;
//! use streamgate::responses::{Item, OutputItemEvent, ResponsesData, ResponsesEvent};
//! use streamgate::sse::SseEvent;
//!
//! let item = Item { kind: "message".into(), id: Some("msg_1".into()), ..Item::default() };
//! let added = OutputItemEvent { output_index: Some(0), item, ..OutputItemEvent::default() };
//! let mut hello = ResponsesData::output_text_delta("msg_1", 0, 0, "Hel").with_sequence_number(3);
//! hello.merge(ResponsesData::output_text_delta("msg_1", 0, 0, "lo").with_sequence_number(4)).unwrap();
//!
//! let added = SseEvent::from(ResponsesData::OutputItemAdded(added).with_sequence_number(2));
//! assert_eq!(
//!     &added.encode()[..],
//!     &b":control\nevent: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":\"msg_1\"},\"sequence_number\":2}\n\n"[..]
//! );
//! let hello = SseEvent::from(ResponsesEvent::new(hello).with_id(4));
//! assert_eq!((hello.event(), hello.id()), (Some("response.output_text.delta"), Some("4")));
//! assert!(hello.data_str().unwrap().contains(r#""delta":"Hello""#));
//! ```
//!
//! An event's kind marks it on the wire where a decoder could not tell it (`:hidden` for
//! reasoning, `:control` for the lifecycle, item, part and `.done` events), as for every event
//! the crate encodes; clients ignore comment lines.

mod data;
mod event;
mod events;
mod merge;

pub use self::data::ResponsesData;
pub use self::event::ResponsesEvent;
pub use self::events::{
    ErrorEvent, Item, OutputItemEvent, PartEvent, Response, ResponseEvent, TextDelta, TextDone,
};
pub use crate::wire::{Extra, ParseError, UnknownEvent};
