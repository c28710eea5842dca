//! The reference server's Anthropic Messages and OpenAI Responses streams as a client reads
//! them: the requests, and each frame read by the library's typed events (so a frame the
//! `anthropic` or `responses` module does not know fails the test).

use bytes::BytesMut;
use serde_json::{Value, json};
use streamgate::anthropic::{Delta, MessagesData, MessagesEvent};
use streamgate::responses::{ResponsesData, ResponsesEvent};
use streamgate::sse::SseDecoder;
use tokio_util::codec::Decoder;

use super::is_heartbeat;

/// A streaming API the server speaks besides chat completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/messages`.
    Messages,
    /// `POST /v1/responses`.
    Responses,
}

impl Api {
    pub const ALL: [Api; 2] = [Api::Messages, Api::Responses];

    /// Where a request goes: `/v1/messages`, `/v1/responses`.
    pub fn path(self) -> &'static str {
        match self {
            Api::Messages => "/v1/messages",
            Api::Responses => "/v1/responses",
        }
    }

    /// A request body for `max_tokens` new tokens after a user's "hi" and, with `prefix`, an
    /// assistant message to continue (Responses: an assistant item `in_progress`).
    pub fn body(self, max_tokens: u64, stream: bool, prefix: Option<&str>) -> String {
        let mut body = match self {
            Api::Messages => json!({"model": "sim", "max_tokens": max_tokens, "stream": stream,
                "messages": [{"role": "user", "content": "hi"}]}),
            Api::Responses => json!({"model": "sim", "max_output_tokens": max_tokens,
                "stream": stream, "input": [{"role": "user", "content": "hi"}]}),
        };
        if let Some(prefix) = prefix {
            let (conversation, message) = match self {
                Api::Messages => (
                    "messages",
                    json!({"role": "assistant", "content": [{"type": "text", "text": prefix}]}),
                ),
                Api::Responses => (
                    "input",
                    json!({"type": "message", "role": "assistant", "status": "in_progress",
                       "content": [{"type": "output_text", "text": prefix}]}),
                ),
            };
            body[conversation].as_array_mut().unwrap().push(message);
        }
        body.to_string()
    }

    /// The events before the first token.
    pub fn opening(self) -> &'static [&'static str] {
        match self {
            Api::Messages => &["message_start", "content_block_start"],
            Api::Responses => &[
                "response.created",
                "response.output_item.added",
                "response.content_part.added",
            ],
        }
    }

    /// The events after the last token.
    pub fn closing(self) -> &'static [&'static str] {
        match self {
            Api::Messages => &["content_block_stop", "message_delta", "message_stop"],
            Api::Responses => &[
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ],
        }
    }

    /// The type of each token's event.
    pub fn delta(self) -> &'static str {
        match self {
            Api::Messages => "content_block_delta",
            Api::Responses => "response.output_text.delta",
        }
    }

    /// The event types of a whole stream of `n` tokens, in order.
    pub fn stream_types(self, n: usize) -> Vec<&'static str> {
        let mut types = self.opening().to_vec();
        types.extend(std::iter::repeat_n(self.delta(), n));
        types.extend(self.closing());
        types
    }
}

/// One event of a stream, as a client reads it.
#[derive(Debug, Clone)]
pub struct Read {
    /// Its SSE `id:`, if it has one.
    pub id: Option<u64>,
    /// Its type (`event:`).
    pub kind: String,
    /// The text it adds, if it is a text delta.
    pub text: Option<String>,
    /// Its data.
    pub data: Value,
}

/// Reads `frame`, one SSE frame as the server wrote it, as an event of `api` by the library's
/// typed events: it must be one the module knows; a Responses event's `sequence_number` must be
/// its `id:`.
pub fn read(api: Api, frame: &str) -> Read {
    let mut bytes = BytesMut::from(frame);
    let sse = SseDecoder::new()
        .decode(&mut bytes)
        .expect("an SSE frame")
        .unwrap_or_else(|| panic!("one event: {frame:?}"));
    let data: Value = serde_json::from_str(sse.data_str().expect("data")).expect("JSON data");
    let id = sse.id().map(|id| id.parse().expect("a numeric id"));
    let text = match api {
        Api::Messages => match MessagesEvent::from_sse(&sse)
            .expect("a Messages event")
            .data()
        {
            MessagesData::Unknown(_) => panic!("not a Messages event: {frame}"),
            MessagesData::ContentBlockDelta(delta) => match &delta.delta {
                Delta::Text { text, .. } => Some(text.clone()),
                _ => None,
            },
            _ => None,
        },
        Api::Responses => {
            let event = ResponsesEvent::from_sse(&sse).expect("a Responses event");
            if id.is_some() {
                assert_eq!(event.data().sequence_number(), id, "{frame}");
            }
            match event.data() {
                ResponsesData::Unknown(_) => panic!("not a Responses event: {frame}"),
                ResponsesData::OutputTextDelta(delta) => Some(delta.delta.clone()),
                _ => None,
            }
        }
    };
    Read {
        id,
        kind: sse.event_type().to_owned(),
        text,
        data,
    }
}

/// The events of `frames` (heartbeats skipped).
pub fn read_all(api: Api, frames: &[String]) -> Vec<Read> {
    frames
        .iter()
        .filter(|frame| !is_heartbeat(frame))
        .map(|frame| read(api, frame))
        .collect()
}

/// The text `events` add, joined.
pub fn text(events: &[Read]) -> String {
    events
        .iter()
        .filter_map(|event| event.text.as_deref())
        .collect()
}

/// The text of tokens `tokens` (`t{i} ` each).
pub fn tokens(tokens: std::ops::Range<u64>) -> String {
    tokens.map(|i| format!("t{i} ")).collect()
}

/// The heartbeats among `frames` between the frames that carry the tokens `from` and `to`
/// (`"t1"`, `"t2"`): what bridged a stall between them.
pub fn heartbeats_between(frames: &[String], from: &str, to: &str) -> usize {
    let at = |token: &str| {
        frames
            .iter()
            .position(|frame| frame.contains(&format!("\"{token} \"")))
            .unwrap_or_else(|| panic!("no frame with {token}: {frames:?}"))
    };
    frames[at(from) + 1..at(to)]
        .iter()
        .filter(|frame| is_heartbeat(frame))
        .count()
}
