//! The objects a Messages stream's events carry: the message `message_start` opens, its token
//! counts, a content block's start and the error object.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::wire::{Extra, to_json};

/// The message a stream builds, as `message_start` opens it: its id, its model, the token counts
/// so far, and the rest (`type`, `role`, the empty `content`, `stop_reason`, ...) as they came.
///
/// # Examples
///
/// ```
/// use streamgate::anthropic::Message;
///
/// let message = Message::new("msg_1", "claude-x");
/// assert_eq!(
///     message.to_json(),
///     r#"{"id":"msg_1","model":"claude-x","content":[],"role":"assistant","stop_reason":null,"stop_sequence":null,"type":"message"}"#
/// );
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// The message's id (`msg_...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The model that answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The token counts when the stream starts (the input's, mostly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// Token counts: in `message_start`'s message, and cumulative in each `message_delta`.
///
/// A count that is `null` reads as absent (as the SDKs read it) and is left out when encoded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// Output tokens (so far, in a `message_delta`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// Input tokens written to the prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_creation_input_tokens: Option<u64>,
    /// Input tokens read from the prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<u64>,
    /// Fields this type does not know (`server_tool_use`, `service_tier`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// A content block as `content_block_start` opens it: its type (`text`, `thinking`,
/// `tool_use`, a server tool's result, ...) and its fields as they came (an empty `text`, a tool
/// call's `id`, `name` and empty `input`, ...).
///
/// # Examples
///
/// ```
/// use streamgate::anthropic::ContentBlock;
///
/// assert_eq!(ContentBlock::text().to_json(), r#"{"type":"text","text":""}"#);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContentBlock {
    /// The block's type.
    #[serde(rename = "type")]
    pub kind: String,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// The error object of an `error` event (and of an error response's body): its type
/// (`overloaded_error`, `api_error`, ...) and message.
///
/// # Examples
///
/// ```
/// use streamgate::anthropic::ApiError;
///
/// let error = ApiError::new("overloaded_error", "Overloaded");
/// assert_eq!(error.to_json(), r#"{"type":"overloaded_error","message":"Overloaded"}"#);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    /// The error class.
    #[serde(rename = "type")]
    pub kind: String,
    /// What went wrong, for a person.
    pub message: String,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

impl Message {
    /// Message `id` from `model`, as a server opens it: an `assistant` message, no content yet, no
    /// stop reason, no usage (set `usage` for the input's counts).
    pub fn new(id: impl Into<String>, model: impl Into<String>) -> Self {
        let extra = [
            ("type", Value::from("message")),
            ("role", Value::from("assistant")),
            ("content", Value::Array(Vec::new())),
            ("stop_reason", Value::Null),
            ("stop_sequence", Value::Null),
        ];
        Message {
            id: Some(id.into()),
            model: Some(model.into()),
            usage: None,
            extra: extra
                .map(|(key, value)| (key.to_owned(), value))
                .into_iter()
                .collect(),
        }
    }

    /// Encodes the message as compact JSON.
    pub fn to_json(&self) -> String {
        to_json(self)
    }
}

impl ContentBlock {
    /// A block of type `kind`, with no fields yet.
    pub fn new(kind: impl Into<String>) -> Self {
        ContentBlock {
            kind: kind.into(),
            extra: Extra::new(),
        }
    }

    /// A `text` block's start: `{"type":"text","text":""}`.
    pub fn text() -> Self {
        let mut block = ContentBlock::new("text");
        block.extra.insert("text".to_owned(), Value::from(""));
        block
    }

    /// Encodes the block as compact JSON.
    pub fn to_json(&self) -> String {
        to_json(self)
    }
}

impl ApiError {
    /// An error of class `kind` (`overloaded_error`, `api_error`, ...) saying `message`.
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            kind: kind.into(),
            message: message.into(),
            extra: Extra::new(),
        }
    }

    /// Encodes the error object as compact JSON.
    pub fn to_json(&self) -> String {
        to_json(self)
    }
}
