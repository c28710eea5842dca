//! One event of a Messages stream as SSE carries it: its type, its data and its id.

use super::data::MessagesData;
use crate::chunk::{Chunk, Kind};
use crate::sse::SseEvent;
use crate::wire::{ParseError, read_typed, typed_sse};

/// One event of an Anthropic Messages stream (`POST /v1/messages` with `"stream": true`), with
/// the SSE id it carries: what a gateway decodes from its upstream, gates (deltas merge under
/// [`Coalesce`](crate::Policy::Coalesce), see [`MessagesData`]'s `merge`) and encodes again as
/// `event: <type>` and `data: <json>`, so an upstream's event ids reach the client unchanged.
///
/// # Examples
///
/// ```
/// use streamgate::Chunk;
/// use streamgate::anthropic::{MessagesData, MessagesEvent};
/// use streamgate::sse::SseEvent;
///
/// let delta = |text: &str, id: &str| {
///     let json = format!(
///         r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{text}"}}}}"#
///     );
///     SseEvent::data(json).with_event("content_block_delta")?.with_id(id)
/// };
/// let mut event = MessagesEvent::from_sse(&delta("Hel", "1")?)?;
/// event.merge(MessagesEvent::from_sse(&delta("lo", "2")?)?).unwrap();
///
/// // The merged event keeps the later id.
/// let sse = SseEvent::from(event.clone());
/// assert_eq!((sse.event(), sse.id()), (Some("content_block_delta"), Some("2")));
/// assert!(sse.data_str().unwrap().contains(r#""text":"Hello""#));
/// assert_eq!(event.byte_len(), sse.byte_len());
///
/// // An error after a 200 is the stream's end.
/// let error = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
/// let error = MessagesEvent::from_sse(&SseEvent::data(error).with_event("error")?)?;
/// assert!(matches!(error.data(), MessagesData::Error(e) if e.error.kind == "overloaded_error"));
/// assert!(error.data().is_end());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct MessagesEvent {
    data: MessagesData,
    /// From a decoded event (so free of line breaks and NUL) or a number.
    id: Option<String>,
}

impl MessagesEvent {
    /// An event carrying `data`, without an id.
    pub fn new(data: MessagesData) -> Self {
        MessagesEvent { data, id: None }
    }

    /// An `error` frame: `event: error` with
    /// `data: {"type":"error","error":{"type":kind,"message":message}}`, what a server sends
    /// when a stream fails after its `200 OK`.
    pub fn error(kind: impl Into<String>, message: impl Into<String>) -> Self {
        MessagesEvent::new(MessagesData::error(kind, message))
    }

    /// Reads an event of a Messages stream. Its type is its `event:` field (or, without one,
    /// its data's `type`); data that leaves its `type` out takes the event's, as the Anthropic
    /// SDKs read it. An event of another type, or whose data names a type other than its
    /// `event:`, is kept as it came ([`MessagesData::Unknown`]). The event's id is kept.
    ///
    /// # Errors
    ///
    /// If the event has no data, or is of a known type and its data is not that event (not
    /// JSON, a required field missing or of the wrong type).
    pub fn from_sse(event: &SseEvent) -> Result<Self, ParseError> {
        Ok(MessagesEvent {
            data: read_typed(event, MessagesData::parse, MessagesData::Unknown)?,
            id: event.id().map(str::to_owned),
        })
    }

    /// Sets the SSE id, which a client sends back as `Last-Event-ID`.
    pub fn with_id(mut self, id: u64) -> Self {
        self.id = Some(id.to_string());
        self
    }

    /// What the event carries.
    pub fn data(&self) -> &MessagesData {
        &self.data
    }

    /// What the event carries, to change.
    pub fn data_mut(&mut self) -> &mut MessagesData {
        &mut self.data
    }

    /// Takes what the event carries out.
    pub fn into_data(self) -> MessagesData {
        self.data
    }

    /// The SSE id, if any.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }
}

impl From<MessagesData> for MessagesEvent {
    fn from(data: MessagesData) -> Self {
        MessagesEvent::new(data)
    }
}

impl Chunk for MessagesEvent {
    /// What the SSE event's [`byte_len`](Chunk::byte_len) is: the data's JSON, the type and the
    /// id.
    fn byte_len(&self) -> usize {
        self.data.byte_len() + self.id.as_ref().map_or(0, String::len)
    }

    /// The data's kind (see [`MessagesData`]'s).
    fn kind(&self) -> Kind {
        self.data.kind()
    }

    /// Merges as [`MessagesData`] does, keeping the later id (a client that has it has
    /// everything up to it), or this one's if the later has none.
    fn merge(&mut self, next: Self) -> Result<(), Self> {
        let MessagesEvent { data, id } = next;
        match self.data.merge(data) {
            Ok(()) => {
                self.id = id.or(self.id.take());
                Ok(())
            }
            Err(data) => Err(MessagesEvent { data, id }),
        }
    }
}

/// `event: <type>` and `data: <json>` with the event's id (an unknown event's type and data as
/// they came); an event whose kind a decoder could not tell from that (a thinking delta is
/// hidden, a `ping` control) is marked [`hidden`](SseEvent::hidden) or
/// [`control`](SseEvent::control).
impl From<MessagesEvent> for SseEvent {
    fn from(event: MessagesEvent) -> SseEvent {
        let kind = event.kind();
        let event_type = match &event.data {
            MessagesData::Unknown(unknown) => unknown.event_type(),
            known => Some(known.event_type()),
        };
        typed_sse(event_type, event.data.to_json(), kind, event.id)
    }
}

impl From<MessagesData> for SseEvent {
    fn from(data: MessagesData) -> SseEvent {
        MessagesEvent::new(data).into()
    }
}
