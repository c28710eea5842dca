//! One event of a chat completion stream as SSE carries it: a chunk, `[DONE]` or an error.

use super::api_error::{ApiError, ErrorBody};
use super::chunk::ChatCompletionChunk;
use super::error::ParseError;
use crate::chunk::{Chunk, Kind};
use crate::sse::SseEvent;
use crate::wire::json_len;

/// The `[DONE]` marker that ends an OpenAI stream.
const DONE: &str = "[DONE]";

/// One event of a chat completion stream, with the SSE id it carries: what a gateway decodes
/// from its upstream, gates (chunks merge under [`Coalesce`](crate::Policy::Coalesce)) and
/// encodes again, so an upstream's event ids reach the client unchanged.
///
/// # Examples
///
/// ```
/// use streamgate::Chunk;
/// use streamgate::openai::{ChatData, ChatEvent};
/// use streamgate::sse::SseEvent;
///
/// let chunk = |content: &str, id: &str| {
///     let json = format!(
///         r#"{{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{{"index":0,"delta":{{"content":"{content}"}},"finish_reason":null}}]}}"#
///     );
///     SseEvent::data(json).with_id(id)
/// };
/// let mut event = ChatEvent::from_sse(&chunk("Hel", "1")?)?;
/// event.merge(ChatEvent::from_sse(&chunk("lo", "2")?)?).unwrap();
/// let done = ChatEvent::from_sse(&SseEvent::data("[DONE]"))?;
/// assert!(matches!(done.data(), ChatData::Done));
/// assert!(event.merge(done).is_err(), "[DONE] is never merged");
///
/// // The merged event keeps the later id.
/// let sse = SseEvent::from(event);
/// assert_eq!(sse.id(), Some("2"));
/// assert!(sse.data_str().unwrap().contains(r#""content":"Hello""#));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ChatEvent {
    data: ChatData,
    /// From a decoded event (so free of line breaks and NUL) or a number.
    id: Option<String>,
}

/// What a chat completion event carries.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatData {
    /// A `chat.completion.chunk`.
    Chunk(ChatCompletionChunk),
    /// `data: [DONE]`: the stream is complete.
    Done,
    /// `data: {"error":{...}}`: the server failed mid-stream.
    Error(ApiError),
}

impl ChatEvent {
    /// An event carrying `data`, without an id.
    pub fn new(data: ChatData) -> Self {
        ChatEvent { data, id: None }
    }

    /// `data: [DONE]`.
    pub fn done() -> Self {
        ChatEvent::new(ChatData::Done)
    }

    /// An error frame: `data: {"error":{"message":...,"type":...}}`.
    pub fn error(message: impl Into<String>, kind: impl Into<String>) -> Self {
        ChatEvent::new(ChatData::Error(ApiError::new(message, kind)))
    }

    /// Reads an event of a chat completion stream: `[DONE]` (data starting with it, as the
    /// OpenAI SDKs read it), an error object (`{"error":{...}}`, with or without
    /// `event: error`), or a chunk. The event's id is kept.
    ///
    /// # Errors
    ///
    /// If the event has no data, a type other than `message` or `error`, or data that is none
    /// of the three.
    pub fn from_sse(event: &SseEvent) -> Result<Self, ParseError> {
        let data = event.data_str().ok_or(ParseError::NoData)?;
        let data = match event.event_type() {
            "message" | "error" => ChatData::parse(data)?,
            other => return Err(ParseError::EventType(other.to_owned())),
        };
        Ok(ChatEvent {
            data,
            id: event.id().map(str::to_owned),
        })
    }

    /// Sets the SSE id, which a client sends back as `Last-Event-ID` (the position of the
    /// event's last token, say).
    pub fn with_id(mut self, id: u64) -> Self {
        self.id = Some(id.to_string());
        self
    }

    /// What the event carries.
    pub fn data(&self) -> &ChatData {
        &self.data
    }

    /// Takes what the event carries out.
    pub fn into_data(self) -> ChatData {
        self.data
    }

    /// The SSE id, if any.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }
}

impl ChatData {
    /// Reads an event's data: `[DONE]`, an error object or a chunk.
    ///
    /// # Errors
    ///
    /// If `data` is none of the three; the error says why it is not a chunk.
    pub fn parse(data: &str) -> Result<Self, ParseError> {
        if data.starts_with(DONE) {
            return Ok(ChatData::Done);
        }
        ChatCompletionChunk::parse(data.as_bytes())
            .map(ChatData::Chunk)
            .or_else(|not_a_chunk| {
                serde_json::from_str::<ErrorBody<ApiError>>(data)
                    .map(|body| ChatData::Error(body.error))
                    .map_err(|_| not_a_chunk)
            })
    }

    /// The event's data as JSON (or `[DONE]`).
    pub fn to_json(&self) -> String {
        match self {
            ChatData::Chunk(chunk) => chunk.to_json(),
            ChatData::Done => DONE.to_owned(),
            ChatData::Error(error) => error.to_json(),
        }
    }
}

impl From<ChatCompletionChunk> for ChatEvent {
    fn from(chunk: ChatCompletionChunk) -> Self {
        ChatEvent::new(ChatData::Chunk(chunk))
    }
}

impl Chunk for ChatEvent {
    /// The data's length (a chunk's JSON, `[DONE]`, the error object) and the id's.
    fn byte_len(&self) -> usize {
        let data = match &self.data {
            ChatData::Chunk(chunk) => chunk.byte_len(),
            ChatData::Done => DONE.len(),
            ChatData::Error(error) => json_len(&ErrorBody { error }),
        };
        data + self.id.as_ref().map_or(0, String::len)
    }

    /// A chunk's kind; `[DONE]` and an error are [`Control`](Kind::Control).
    fn kind(&self) -> Kind {
        match &self.data {
            ChatData::Chunk(chunk) => chunk.kind(),
            ChatData::Done | ChatData::Error(_) => Kind::Control,
        }
    }

    /// Two chunks merge as [`ChatCompletionChunk`]s do, keeping the later id (a client that
    /// has it has everything up to it); `[DONE]` and errors never merge.
    fn merge(&mut self, next: Self) -> Result<(), Self> {
        match (&mut self.data, next) {
            (
                ChatData::Chunk(mine),
                ChatEvent {
                    data: ChatData::Chunk(theirs),
                    id,
                },
            ) => match mine.merge(theirs) {
                Ok(()) => {
                    self.id = id.or(self.id.take());
                    Ok(())
                }
                Err(theirs) => Err(ChatEvent {
                    data: ChatData::Chunk(theirs),
                    id,
                }),
            },
            (_, next) => Err(next),
        }
    }
}

/// `data: <json>` with the event's id; a chunk of reasoning only is marked
/// [`hidden`](SseEvent::hidden), `[DONE]` and an error [`control`](SseEvent::control).
impl From<ChatEvent> for SseEvent {
    fn from(event: ChatEvent) -> SseEvent {
        let mut sse = SseEvent::data(event.data.to_json());
        if sse.kind() != event.kind() {
            // Marked on the wire only where a decoder could not tell (`[DONE]` it can).
            sse = sse.marked(event.kind());
        }
        match event.id {
            Some(id) => sse
                .with_id(id)
                .expect("an id comes from a decoded event or is a number"),
            None => sse,
        }
    }
}

impl From<ChatCompletionChunk> for SseEvent {
    fn from(chunk: ChatCompletionChunk) -> SseEvent {
        ChatEvent::from(chunk).into()
    }
}
