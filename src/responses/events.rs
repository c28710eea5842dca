//! The shapes of a Responses stream's events, as their data carries them (the `type` aside):
//! several event types share each.
//!
//! Every field that places an event (`item_id`, `output_index`, `content_index`,
//! `summary_index`) and its `sequence_number` is optional: OpenAI sends them, but some servers
//! leave them out (llama.cpp's `llama-server` sends no `sequence_number`, and no indexes in its
//! text deltas). An absent field is left out when encoded.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::wire::Extra;

/// The response's lifecycle: `response.created`, `response.queued`, `response.in_progress`,
/// and its ends `response.completed`, `response.incomplete` and `response.failed`, each with
/// the whole response as it stands.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponseEvent {
    /// The response.
    pub response: Response,
    /// The event's position in the stream (from 0), by which a client resumes
    /// (`starting_after`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_number: Option<u64>,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A response as a lifecycle event carries it: its id and status, and the rest (`output`,
/// `usage`, `error`, `incomplete_details`, ...) as it came.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// The response's id (`resp_...`), by which a client retrieves or resumes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `queued`, `in_progress`, `completed`, `incomplete`, `failed`, `cancelled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `response.output_item.added` and `response.output_item.done`: an output item (a message, a
/// function call, a reasoning item, a tool call) begins or is complete.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OutputItemEvent {
    /// The item's position in the response's output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_index: Option<u64>,
    /// The item.
    pub item: Item,
    /// The event's position in the stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_number: Option<u64>,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// An output item: its type and id, and the rest (`status`, `role`, `content`, a call's `name`
/// and `arguments`, ...) as it came.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Item {
    /// `message`, `function_call`, `reasoning`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// The item's id, which its events name as `item_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A part of an item begins or is complete: `response.content_part.added` and `.done` (a
/// message's text or refusal, a reasoning item's text), `response.reasoning_summary_part.added`
/// and `.done` (a reasoning item's summary).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PartEvent {
    /// The item the part belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_id: Option<String>,
    /// The item's position in the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_index: Option<u64>,
    /// The part's position in the item's content (a content part's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_index: Option<u64>,
    /// The part's position in the item's summary (a summary part's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_index: Option<u64>,
    /// The part (`{"type":"output_text","text":"",...}`), as it came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<Extra>,
    /// The event's position in the stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_number: Option<u64>,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A piece of text added to a part (or to a function call's arguments): the deltas of output
/// text, refusal, function-call arguments, reasoning summary text and reasoning text.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TextDelta {
    /// The item the text belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_id: Option<String>,
    /// The item's position in the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_index: Option<u64>,
    /// The content part's position in the item (output text, refusal, reasoning text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_index: Option<u64>,
    /// The summary part's position in the item (reasoning summary text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_index: Option<u64>,
    /// The text added.
    pub delta: String,
    /// The log probabilities of the delta's tokens (output text, when requested).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<Value>>,
    /// Random padding that evens out the events' sizes (`stream_options.include_obfuscation`),
    /// against guessing the text from them. A merged delta has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub obfuscation: Option<String>,
    /// The event's position in the stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_number: Option<u64>,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A text is complete: the `.done` events of output text, refusal, function-call arguments,
/// reasoning summary text and reasoning text. The whole text is in `extra`, under the field its
/// type names (`text`; `refusal`; `arguments`, with the function's `name`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TextDone {
    /// The item the text belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_id: Option<String>,
    /// The item's position in the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_index: Option<u64>,
    /// The content part's position in the item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_index: Option<u64>,
    /// The summary part's position in the item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_index: Option<u64>,
    /// The event's position in the stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_number: Option<u64>,
    /// Fields this type does not know, the text among them.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `error`: the stream failed; it ends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorEvent {
    /// The error's code (`server_error`, `rate_limit_exceeded`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// What went wrong, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The request parameter the error is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
    /// The event's position in the stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_number: Option<u64>,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

impl TextDelta {
    /// `delta` added to the part at `content_index` of item `item_id`, at `output_index`.
    pub fn new(
        item_id: impl Into<String>,
        output_index: u64,
        content_index: u64,
        delta: impl Into<String>,
    ) -> Self {
        TextDelta {
            item_id: Some(item_id.into()),
            output_index: Some(output_index),
            content_index: Some(content_index),
            delta: delta.into(),
            ..TextDelta::default()
        }
    }
}
