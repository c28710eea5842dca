//! The events of a Messages stream, one type each, as their data carries them (the `type` aside).

use serde::{Deserialize, Serialize};

use super::delta::Delta;
use super::message::{ApiError, ContentBlock, Message, Usage};
use crate::wire::Extra;

/// `message_start`: the stream's first event, the message with no content yet.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MessageStart {
    /// The message.
    pub message: Message,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `content_block_start`: block `index` of the message begins.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContentBlockStart {
    /// The block's position in the message's content.
    pub index: u64,
    /// The block, before any delta.
    pub content_block: ContentBlock,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `content_block_delta`: a piece of block `index`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentBlockDelta {
    /// The block the piece belongs to.
    pub index: u64,
    /// The piece.
    pub delta: Delta,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `content_block_stop`: block `index` is complete.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContentBlockStop {
    /// The block.
    pub index: u64,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `message_delta`: the message's stop reason and its cumulative token counts, near the end.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MessageDelta {
    /// Why and where the message stopped.
    pub delta: StopDelta,
    /// The token counts so far (cumulative: a later `message_delta` supersedes this one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// What a `message_delta` changes at the message's top level.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StopDelta {
    /// Why the message stopped (`end_turn`, `max_tokens`, `tool_use`, `stop_sequence`, ...).
    /// Always encoded, as `null` when absent, as Anthropic sends it.
    #[serde(default)]
    pub stop_reason: Option<String>,
    /// The stop sequence that was met, if one was. Always encoded, as `null` when absent.
    #[serde(default)]
    pub stop_sequence: Option<String>,
    /// Fields this type does not know (`stop_details`, `container`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `message_stop`: the stream is complete.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MessageStop {
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `ping`: the server is alive; no output.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ping {
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `error`: the server failed mid-stream (after a `200 OK`); the stream ends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorEvent {
    /// What failed.
    pub error: ApiError,
    /// Fields this type does not know (`request_id`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

impl ContentBlockDelta {
    /// A piece of block `index`.
    pub fn new(index: u64, delta: Delta) -> Self {
        ContentBlockDelta {
            index,
            delta,
            extra: Extra::new(),
        }
    }
}
