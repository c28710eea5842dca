//! One event of a Responses stream as SSE carries it: its type, its data and its id.

use super::data::ResponsesData;
use crate::chunk::{Chunk, Kind};
use crate::sse::SseEvent;
use crate::wire::{ParseError, read_typed, typed_sse};

/// One event of an OpenAI Responses stream (`POST /v1/responses` with `"stream": true`), with
/// the SSE id it carries: what a gateway decodes from its upstream, gates (deltas merge under
/// [`Coalesce`](crate::Policy::Coalesce), see [`ResponsesData`]'s `merge`) and encodes again
/// as `event: <type>` and `data: <json>`, so an upstream's event ids reach the client
/// unchanged.
///
/// # Examples
///
/// ```
/// use streamgate::Chunk;
/// use streamgate::responses::{ResponsesData, ResponsesEvent};
/// use streamgate::sse::SseEvent;
///
/// let delta = |text: &str, n: u64| {
///     let json = format!(
///         r#"{{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"{text}","logprobs":[],"obfuscation":"x9","sequence_number":{n}}}"#
///     );
///     SseEvent::data(json).with_event("response.output_text.delta")?.with_id(n.to_string())
/// };
/// let mut event = ResponsesEvent::from_sse(&delta("Hel", 4)?)?;
/// event.merge(ResponsesEvent::from_sse(&delta("lo", 5)?)?).unwrap();
///
/// // The merged event keeps the later id and sequence number, and drops the padding.
/// assert_eq!(event.data().sequence_number(), Some(5));
/// let sse = SseEvent::from(event.clone());
/// assert_eq!(sse.id(), Some("5"));
/// assert_eq!(
///     sse.data_str(),
///     Some(r#"{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hello","logprobs":[],"sequence_number":5}"#)
/// );
/// assert_eq!(event.byte_len(), sse.byte_len());
///
/// let failed = r#"{"type":"response.failed","response":{"id":"resp_1","status":"failed","error":{"code":"server_error","message":"boom"}},"sequence_number":6}"#;
/// let failed = ResponsesEvent::from_sse(&SseEvent::data(failed).with_event("response.failed")?)?;
/// assert!(matches!(failed.data(), ResponsesData::Failed(f) if f.response.status.as_deref() == Some("failed")));
/// assert!(failed.data().is_end());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesEvent {
    data: ResponsesData,
    /// From a decoded event (so free of line breaks and NUL) or a number.
    id: Option<String>,
}

impl ResponsesEvent {
    /// An event carrying `data`, without an id.
    pub fn new(data: ResponsesData) -> Self {
        ResponsesEvent { data, id: None }
    }

    /// An `error` frame: `event: error` with
    /// `data: {"type":"error","code":code,"message":message}` (set its `sequence_number` with
    /// [`data_mut`](Self::data_mut)).
    pub fn error(code: impl Into<String>, message: impl Into<String>) -> Self {
        ResponsesEvent::new(ResponsesData::error(code, message))
    }

    /// Reads an event of a Responses stream. Its type is its data's `type` (which the OpenAI
    /// SDKs read) or its `event:` field, which must agree: an event of another type, or whose
    /// data names another type than its `event:`, is kept as it came
    /// ([`ResponsesData::Unknown`]), and so is data that names no type (`[DONE]`, which some
    /// servers end the stream with). The event's id is kept.
    ///
    /// # Errors
    ///
    /// If the event has no data, or is of a known type and its data is not that event (not
    /// JSON, a required field missing or of the wrong type).
    pub fn from_sse(event: &SseEvent) -> Result<Self, ParseError> {
        Ok(ResponsesEvent {
            data: read_typed(event, ResponsesData::parse, ResponsesData::Unknown)?,
            id: event.id().map(str::to_owned),
        })
    }

    /// Sets the SSE id, which a client sends back as `Last-Event-ID`.
    pub fn with_id(mut self, id: u64) -> Self {
        self.id = Some(id.to_string());
        self
    }

    /// What the event carries.
    pub fn data(&self) -> &ResponsesData {
        &self.data
    }

    /// What the event carries, to change.
    pub fn data_mut(&mut self) -> &mut ResponsesData {
        &mut self.data
    }

    /// Takes what the event carries out.
    pub fn into_data(self) -> ResponsesData {
        self.data
    }

    /// The SSE id, if any.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }
}

impl From<ResponsesData> for ResponsesEvent {
    fn from(data: ResponsesData) -> Self {
        ResponsesEvent::new(data)
    }
}

impl Chunk for ResponsesEvent {
    /// What the SSE event's [`byte_len`](Chunk::byte_len) is: the data's JSON, the type and the
    /// id.
    fn byte_len(&self) -> usize {
        self.data.byte_len() + self.id.as_ref().map_or(0, String::len)
    }

    /// The data's kind (see [`ResponsesData`]'s).
    fn kind(&self) -> Kind {
        self.data.kind()
    }

    /// Merges as [`ResponsesData`] does, keeping the later id (a client that has it has
    /// everything up to it), or this one's if the later has none.
    fn merge(&mut self, next: Self) -> Result<(), Self> {
        let ResponsesEvent { data, id } = next;
        match self.data.merge(data) {
            Ok(()) => {
                self.id = id.or(self.id.take());
                Ok(())
            }
            Err(data) => Err(ResponsesEvent { data, id }),
        }
    }
}

/// `event: <type>` and `data: <json>` with the event's id (an unknown event's type and data as
/// they came); an event whose kind a decoder could not tell from that (a reasoning delta is
/// hidden, the lifecycle events are control) is marked [`hidden`](SseEvent::hidden) or
/// [`control`](SseEvent::control).
impl From<ResponsesEvent> for SseEvent {
    fn from(event: ResponsesEvent) -> SseEvent {
        encode(&event.data, event.id)
    }
}

impl From<ResponsesData> for SseEvent {
    fn from(data: ResponsesData) -> SseEvent {
        encode(&data, None)
    }
}

/// As from a [`ResponsesData`], which stays the caller's (to read on after sending it).
///
/// # Examples
///
/// ```
/// use streamgate::responses::ResponsesData;
/// use streamgate::sse::SseEvent;
///
/// let data = ResponsesData::error("server_error", "the upstream went away");
/// let sse = SseEvent::from(&data);
/// assert_eq!(sse.event(), Some("error"));
/// assert_eq!(data.sequence_number(), None);
/// ```
impl From<&ResponsesData> for SseEvent {
    fn from(data: &ResponsesData) -> SseEvent {
        encode(data, None)
    }
}

/// `data` as an SSE event with `id`.
fn encode(data: &ResponsesData, id: Option<String>) -> SseEvent {
    let event_type = match data {
        ResponsesData::Unknown(unknown) => unknown.event_type(),
        known => Some(known.event_type()),
    };
    typed_sse(event_type, data.to_json(), data.kind(), id)
}
