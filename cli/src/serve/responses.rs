//! A generation as OpenAI Responses (`POST /v1/responses`): its events, written with the
//! library's `responses` types and numbered by their `sequence_number` (the event id), and the
//! whole response of a request that streams none.
//!
//! The response's `id` is the stream's name (its request id), so a client resumes it at
//! `GET /v1/responses/{id}?stream=true&starting_after=N` from what the stream told it; its one
//! output item is a `message` (`msg_` and the hex digits of the server's own id) whose one part
//! is the `output_text`.

use serde_json::{Value, json};
use streamgate::responses::{
    Extra, Item, OutputItemEvent, PartEvent, Response, ResponseEvent, ResponsesData, TextDone,
};
use streamgate::sse::SseEvent;

use super::format::Ending;
use super::meta::Meta;
use super::text::Text;

/// The events of a Responses stream around its tokens (each an `output_text.delta` of part 0
/// of item 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponsesFrame {
    /// `response.created`.
    Created,
    /// `response.output_item.added`: the message item, no content yet.
    ItemAdded,
    /// `response.content_part.added`: an empty `output_text` part.
    PartAdded,
    /// `response.output_text.done`: the whole text.
    TextDone(Ending),
    /// `response.content_part.done`: the part with the whole text.
    PartDone(Ending),
    /// `response.output_item.done`: the item, complete.
    ItemDone(Ending),
    /// `response.completed`: the whole response, with its `usage`.
    Completed(Ending),
}

impl ResponsesFrame {
    /// The events before the first token.
    pub(super) fn opening() -> [Self; 3] {
        [
            ResponsesFrame::Created,
            ResponsesFrame::ItemAdded,
            ResponsesFrame::PartAdded,
        ]
    }

    /// The events after the last token.
    pub(super) fn closing(ending: &Ending) -> [Self; 4] {
        [
            ResponsesFrame::TextDone(ending.clone()),
            ResponsesFrame::PartDone(ending.clone()),
            ResponsesFrame::ItemDone(ending.clone()),
            ResponsesFrame::Completed(ending.clone()),
        ]
    }

    /// The bytes of text the event repeats (the whole text, in the events after the tokens).
    pub(super) fn text_len(&self) -> usize {
        match self {
            ResponsesFrame::Created | ResponsesFrame::ItemAdded | ResponsesFrame::PartAdded => 0,
            ResponsesFrame::TextDone(ending)
            | ResponsesFrame::PartDone(ending)
            | ResponsesFrame::ItemDone(ending)
            | ResponsesFrame::Completed(ending) => ending.text.len(),
        }
    }

    /// Event `id` of the stream, as `event: <type>` and its data with `"sequence_number": id`.
    pub(super) fn event(self, meta: &Meta, id: u64) -> SseEvent {
        let item_id = item_id(meta);
        let place = |extra: Extra| PartEvent {
            item_id: Some(item_id.clone()),
            output_index: Some(0),
            content_index: Some(0),
            extra,
            ..PartEvent::default()
        };
        let data = match self {
            ResponsesFrame::Created => {
                ResponsesData::Created(lifecycle(response(meta, "in_progress", json!([]), None)))
            }
            ResponsesFrame::ItemAdded => ResponsesData::OutputItemAdded(OutputItemEvent {
                output_index: Some(0),
                item: item(meta, "in_progress", json!([])),
                ..OutputItemEvent::default()
            }),
            ResponsesFrame::PartAdded => ResponsesData::ContentPartAdded(PartEvent {
                part: Some(object(part(""))),
                ..place(Extra::new())
            }),
            ResponsesFrame::TextDone(ending) => {
                let fields = json!({"text": ending.text.to_string(), "logprobs": []});
                ResponsesData::OutputTextDone(TextDone {
                    item_id: Some(item_id.clone()),
                    output_index: Some(0),
                    content_index: Some(0),
                    extra: object(fields),
                    ..TextDone::default()
                })
            }
            ResponsesFrame::PartDone(ending) => ResponsesData::ContentPartDone(PartEvent {
                part: Some(object(part(&ending.text.to_string()))),
                ..place(Extra::new())
            }),
            ResponsesFrame::ItemDone(ending) => ResponsesData::OutputItemDone(OutputItemEvent {
                output_index: Some(0),
                item: item(meta, "completed", content(&ending)),
                ..OutputItemEvent::default()
            }),
            ResponsesFrame::Completed(ending) => {
                ResponsesData::Completed(lifecycle(completed(meta, &ending)))
            }
        };
        data.with_sequence_number(id).into()
    }
}

/// A run of text as event `id`, an `output_text.delta` of part 0 of item 0.
pub(super) fn text(meta: &Meta, text: &Text, id: u64) -> SseEvent {
    ResponsesData::output_text_delta(item_id(meta), 0, 0, text.to_string())
        .with_sequence_number(id)
        .into()
}

/// A failed generation's `error` event, event `id` of the stream.
pub(super) fn error(message: &str, code: &str, id: u64) -> SseEvent {
    ResponsesData::error(code, message)
        .with_sequence_number(id)
        .into()
}

/// The whole response of a request that streams none.
pub(super) fn body(meta: &Meta, ending: &Ending) -> String {
    serde_json::to_string(&completed(meta, ending)).expect("a response encodes")
}

/// The response as it completed: its one message item, and its `usage`.
fn completed(meta: &Meta, ending: &Ending) -> Response {
    let (prompt, made) = (ending.prompt, ending.made());
    let usage =
        json!({"input_tokens": prompt, "output_tokens": made, "total_tokens": prompt + made});
    let output = json!([item(meta, "completed", content(ending))]);
    response(meta, "completed", output, Some(usage))
}

/// The response with `status`, `output` and `usage`.
fn response(meta: &Meta, status: &str, output: Value, usage: Option<Value>) -> Response {
    let fields = json!({
        "object": "response",
        "created_at": meta.created,
        "model": meta.model,
        "output": output,
        "error": null,
        "incomplete_details": null,
        "usage": usage,
    });
    Response {
        id: Some(meta.stream.clone()),
        status: Some(status.to_owned()),
        extra: object(fields),
    }
}

/// A lifecycle event of `response`.
fn lifecycle(response: Response) -> ResponseEvent {
    ResponseEvent {
        response,
        ..ResponseEvent::default()
    }
}

/// The message item with `status` and `content`.
fn item(meta: &Meta, status: &str, content: Value) -> Item {
    Item {
        kind: "message".to_owned(),
        id: Some(item_id(meta)),
        extra: object(json!({"status": status, "role": "assistant", "content": content})),
    }
}

/// The item's content once complete: one part with the whole text.
fn content(ending: &Ending) -> Value {
    json!([part(&ending.text.to_string())])
}

/// An `output_text` part holding `text`.
fn part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// The message item's id: `msg_` and the hex digits of the server's own id.
fn item_id(meta: &Meta) -> String {
    let digits = meta.id.strip_prefix("resp_").unwrap_or(&meta.id);
    format!("msg_{digits}")
}

/// A JSON object's fields (none for anything else).
fn object(value: Value) -> Extra {
    match value {
        Value::Object(fields) => fields,
        _ => Extra::new(),
    }
}
