//! The streaming APIs the proxy gates, by path: chat completions, text completions, Anthropic
//! Messages and OpenAI Responses; for each, what ends its answer, what a stop and a failure
//! send, and what the proxy fills in where an upstream left it out.
//!
//! | path | format | the answer ends with | a failure's frame | a stop sends |
//! |---|---|---|---|---|
//! | `/v1/chat/completions` | [`Format::Chat`] | `data: [DONE]` | `event: error`, `{"error":{..}}` | a final chunk, `[DONE]` |
//! | `/v1/completions` | [`Format::Text`] | `data: [DONE]` | the same | the same |
//! | `/v1/messages` | [`Format::Messages`] | `message_stop` | `event: error`, `{"type":"error","error":{"type":"api_error",..}}` | the open block's `content_block_stop`, `message_delta` (`end_turn`), `message_stop` |
//! | `/v1/responses` | [`Format::Responses`] | `response.completed`, `.incomplete`, `.failed` | `event: error`, `{"type":"error","code":"upstream_error",..}` | the open part's and item's `.done` events, `response.incomplete` |
//!
//! The gate's own ends (a slow reader cut off, a shutdown, a reader behind the replay log) are
//! in the same shape ([`Format::error_shape`]), typed by their end reason (`slow_consumer`,
//! `shutdown`, ..) where an upstream's failure is `upstream_error` (`api_error` in Messages).
//!
//! A Responses event's `sequence_number` is its position in the stream, which a resume's
//! `starting_after` names: the proxy writes its own event id there when the upstream sent none
//! or another (llama.cpp's server sends none), and a text event without `output_index` or
//! `content_index` gets those of the item and part it belongs to (the last ones added), as the
//! SDKs' accumulators index by them.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use streamgate::Chunk;
use streamgate::anthropic::{MessagesData, MessagesEvent};
use streamgate::responses::{ResponsesData, ResponsesEvent};
use streamgate::sse::{ErrorShape, SseEvent};

use super::error;

/// A streaming API the proxy gates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Format {
    /// `POST /v1/chat/completions`: `chat.completion.chunk` events.
    Chat,
    /// `POST /v1/completions`: `text_completion` chunks.
    Text,
    /// `POST /v1/messages`: Anthropic Messages events.
    Messages,
    /// `POST /v1/responses`: OpenAI Responses events.
    Responses,
}

impl Format {
    /// The format of a `POST` to `path`, if the proxy gates it.
    pub(super) fn of(path: &str) -> Option<Format> {
        match path {
            "/v1/chat/completions" => Some(Format::Chat),
            "/v1/completions" => Some(Format::Text),
            "/v1/messages" => Some(Format::Messages),
            "/v1/responses" => Some(Format::Responses),
            _ => None,
        }
    }

    /// What the format is called in messages.
    pub(super) fn name(self) -> &'static str {
        match self {
            Format::Chat => "a chat completion",
            Format::Text => "a text completion",
            Format::Messages => "an Anthropic Messages stream",
            Format::Responses => "an OpenAI Responses stream",
        }
    }

    /// Whether its answer ends with `data: [DONE]` (which the proxy sends when the upstream
    /// closed cleanly after its final chunk).
    pub(super) fn ends_with_done(self) -> bool {
        matches!(self, Format::Chat | Format::Text)
    }

    /// Whether `event` ends the answer in a format whose end is an event of its own, by its
    /// type as the crate reads it (the data's `type` when the upstream wrote no `event:`).
    pub(super) fn ends(self, event: &SseEvent) -> bool {
        match self {
            Format::Chat | Format::Text => false,
            Format::Messages => MessagesEvent::from_sse(event).is_ok_and(|e| e.data().is_end()),
            Format::Responses => ResponsesEvent::from_sse(event).is_ok_and(|e| e.data().is_end()),
        }
    }

    /// The name of the events that end its answer, for messages.
    pub(super) fn end_name(self) -> &'static str {
        match self {
            Format::Chat | Format::Text => "data: [DONE]",
            Format::Messages => "message_stop",
            Format::Responses => "response.completed (or .incomplete)",
        }
    }

    /// `event` as the client gets it as the `id`-th event of a Messages or Responses stream
    /// (numbered, for Responses: see [`numbered`]), with its kind and whether it ends the
    /// answer, as the crate reads it; `None` when it is not one of the format's events (an
    /// unknown type is: it passes on). Chat and text chunks are read elsewhere.
    pub(super) fn pass(self, event: SseEvent, id: u64, indices: &mut Indices) -> Option<Passed> {
        match self {
            Format::Chat | Format::Text => None,
            Format::Messages => {
                let parsed = MessagesEvent::from_sse(&event).ok()?;
                let ending = match parsed.data() {
                    MessagesData::MessageStop(_) => Some(Ending::Complete),
                    MessagesData::Error(_) => Some(Ending::Failed),
                    _ => None,
                };
                let kind = parsed.kind();
                Some(Passed {
                    event,
                    kind,
                    ending,
                    data: Some(Parsed::Messages(parsed.into_data())),
                })
            }
            Format::Responses => numbered(event, id, indices).ok(),
        }
    }

    /// The error shape of the gate's own ends (a slow reader cut off, a shutdown), typed by
    /// their end reason.
    pub(super) fn error_shape(self) -> ErrorShape {
        match self {
            Format::Chat | Format::Text => ErrorShape::OpenAi,
            Format::Messages => ErrorShape::Anthropic,
            Format::Responses => ErrorShape::Responses,
        }
    }

    /// An event of the proxy's own as the `id`-th of the stream: a Responses event numbered
    /// (see [`numbered`]; `indices` where the stream is), the others as they are.
    pub(super) fn own(self, event: SseEvent, id: u64, indices: &mut Indices) -> SseEvent {
        match self {
            Format::Responses => match numbered(event, id, indices) {
                Ok(passed) => passed.event,
                Err(event) => event,
            },
            _ => event,
        }
    }

    /// `event` as the crate reads it, when it is a Messages or Responses event.
    pub(super) fn read(self, event: &SseEvent) -> Option<Parsed> {
        match self {
            Format::Chat | Format::Text => None,
            Format::Messages => MessagesEvent::from_sse(event)
                .ok()
                .map(|e| Parsed::Messages(e.into_data())),
            Format::Responses => ResponsesEvent::from_sse(event)
                .ok()
                .map(|e| Parsed::Responses(e.into_data())),
        }
    }

    /// The terminal frame of a stream that failed: the format's error event saying `message`.
    pub(super) fn error_frame(self, message: &str) -> SseEvent {
        match self {
            Format::Chat | Format::Text => error::upstream_frame(message),
            Format::Messages => MessagesEvent::error("api_error", message).into(),
            Format::Responses => ResponsesEvent::error("upstream_error", message).into(),
        }
    }
}

/// An event of type `kind` with `data`.
pub(super) fn typed(kind: &str, data: Value) -> SseEvent {
    SseEvent::data(data.to_string())
        .with_event(kind)
        .expect("a constant type")
}

/// How an event ends its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// The answer is whole (`message_stop`, `response.completed`, `response.incomplete`).
    Complete,
    /// The upstream failed it (an `error` event, `response.failed`).
    Failed,
}

/// A Messages or Responses event as the proxy passes it on.
#[derive(Debug)]
pub(super) struct Passed {
    pub(super) event: SseEvent,
    /// How it counts for progress, by its type (a `ping`, `message_start` or
    /// `response.created` is control).
    pub(super) kind: streamgate::Kind,
    pub(super) ending: Option<Ending>,
    /// The event as read (its blocks or items and text, which a failover goes on from).
    pub(super) data: Option<Parsed>,
}

/// A Messages or Responses event as the crate reads it.
#[derive(Debug)]
pub(super) enum Parsed {
    Messages(MessagesData),
    Responses(ResponsesData),
}

/// Where a Responses stream is: the item and part its events belong to, and how many items
/// and parts of the current item were added, to number the next one the upstream leaves
/// unnumbered.
#[derive(Debug, Default)]
pub(super) struct Indices {
    output: u64,
    items: u64,
    part: u64,
    parts: u64,
}

impl Indices {
    /// An item added at `index` (or, unnumbered, after the others): it is the current one.
    fn item(&mut self, index: &mut Option<u64>, changed: &mut bool) {
        fill(index, self.items, changed);
        self.output = index.unwrap_or(self.items);
        self.items = self.items.max(self.output.saturating_add(1));
        (self.part, self.parts) = (0, 0);
    }

    /// A part of the current item added at `index` (or after the others).
    fn part(&mut self, index: &mut Option<u64>, changed: &mut bool) {
        fill(index, self.parts, changed);
        self.part = index.unwrap_or(self.parts);
        self.parts = self.parts.max(self.part.saturating_add(1));
    }
}

/// `event` of a Responses stream as the client gets it, as its `id`-th event: its
/// `sequence_number` the proxy's id, and missing `output_index`, `content_index` and
/// `summary_index` filled from `indices` (an added item or part without one numbered after the
/// others), which the event moves on. The event as it came when nothing needs filling; `Err`
/// with it when it is not one the crate reads.
pub(super) fn numbered(
    event: SseEvent,
    id: u64,
    indices: &mut Indices,
) -> Result<Passed, SseEvent> {
    let Ok(parsed) = ResponsesEvent::from_sse(&event) else {
        return Err(event);
    };
    let kind = parsed.kind();
    let mut data = parsed.into_data();
    let ending = match &data {
        ResponsesData::Completed(_) | ResponsesData::Incomplete(_) => Some(Ending::Complete),
        ResponsesData::Failed(_) | ResponsesData::Error(_) => Some(Ending::Failed),
        _ => None,
    };
    let mut changed = false;
    let (output, part) = (indices.output, indices.part);
    match &mut data {
        ResponsesData::OutputItemAdded(added) => {
            indices.item(&mut added.output_index, &mut changed)
        }
        ResponsesData::OutputItemDone(done) => fill(&mut done.output_index, output, &mut changed),
        ResponsesData::ContentPartAdded(added) => {
            fill(&mut added.output_index, output, &mut changed);
            indices.part(&mut added.content_index, &mut changed);
        }
        ResponsesData::ReasoningSummaryPartAdded(added) => {
            fill(&mut added.output_index, output, &mut changed);
            indices.part(&mut added.summary_index, &mut changed);
        }
        ResponsesData::ContentPartDone(done) => {
            fill(&mut done.output_index, output, &mut changed);
            fill(&mut done.content_index, part, &mut changed);
        }
        ResponsesData::ReasoningSummaryPartDone(done) => {
            fill(&mut done.output_index, output, &mut changed);
            fill(&mut done.summary_index, part, &mut changed);
        }
        ResponsesData::OutputTextDelta(delta)
        | ResponsesData::RefusalDelta(delta)
        | ResponsesData::ReasoningTextDelta(delta) => {
            fill(&mut delta.output_index, output, &mut changed);
            fill(&mut delta.content_index, part, &mut changed);
        }
        ResponsesData::ReasoningSummaryTextDelta(delta) => {
            fill(&mut delta.output_index, output, &mut changed);
            fill(&mut delta.summary_index, part, &mut changed);
        }
        ResponsesData::FunctionCallArgumentsDelta(delta) => {
            fill(&mut delta.output_index, output, &mut changed);
        }
        ResponsesData::OutputTextDone(done)
        | ResponsesData::RefusalDone(done)
        | ResponsesData::ReasoningTextDone(done) => {
            fill(&mut done.output_index, output, &mut changed);
            fill(&mut done.content_index, part, &mut changed);
        }
        ResponsesData::ReasoningSummaryTextDone(done) => {
            fill(&mut done.output_index, output, &mut changed);
            fill(&mut done.summary_index, part, &mut changed);
        }
        ResponsesData::FunctionCallArgumentsDone(done) => {
            fill(&mut done.output_index, output, &mut changed);
        }
        _ => {}
    }
    if let ResponsesData::Unknown(unknown) = &data {
        // A type the crate does not know: numbered too, its other fields as they came.
        let renumbered = serde_json::from_str::<serde_json::Map<String, Value>>(unknown.data())
            .ok()
            .filter(|fields| fields.get("sequence_number") != Some(&json!(id)));
        let Some(mut fields) = renumbered else {
            return Ok(Passed {
                event,
                kind,
                ending,
                data: None,
            });
        };
        fields.insert("sequence_number".to_owned(), json!(id));
        let mut renumbered = SseEvent::data(Value::Object(fields).to_string());
        if let Some(name) = event.event() {
            renumbered = renumbered.with_event(name).expect("a decoded type");
        }
        return Ok(Passed {
            event: renumbered,
            kind,
            ending,
            data: None,
        });
    }
    if data.sequence_number() != Some(id) {
        if let Some(sequence_number) = data.sequence_number_mut() {
            *sequence_number = Some(id);
            changed = true;
        }
    }
    let event = match changed {
        true => SseEvent::from(&data),
        false => event,
    };
    Ok(Passed {
        event,
        kind,
        ending,
        data: Some(Parsed::Responses(data)),
    })
}

/// Sets `field` to `value` when the upstream left it out.
fn fill(field: &mut Option<u64>, value: u64, changed: &mut bool) {
    if field.is_none() {
        *field = Some(value);
        *changed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, data: &str) -> SseEvent {
        SseEvent::data(data).with_event(kind).unwrap()
    }

    #[test]
    fn a_responses_stream_without_numbers_gets_the_proxys() {
        let mut indices = Indices::default();
        // llama.cpp's server: no sequence_number, no indices on its text deltas.
        let added = event(
            "response.output_item.added",
            r#"{"type":"response.output_item.added","item":{"type":"message","id":"m1","role":"assistant","content":[],"status":"in_progress"}}"#,
        );
        let added = numbered(added, 1, &mut indices).unwrap().event;
        let added: Value = serde_json::from_str(added.data_str().unwrap()).unwrap();
        assert_eq!(
            (
                added["sequence_number"].clone(),
                added["output_index"].clone()
            ),
            (json!(1), json!(0))
        );
        let delta = event(
            "response.output_text.delta",
            r#"{"type":"response.output_text.delta","item_id":"m1","delta":"Hi"}"#,
        );
        let delta = numbered(delta, 3, &mut indices).unwrap().event;
        let delta: Value = serde_json::from_str(delta.data_str().unwrap()).unwrap();
        assert_eq!(delta["sequence_number"], 3);
        assert_eq!(
            (
                delta["output_index"].clone(),
                delta["content_index"].clone()
            ),
            (json!(0), json!(0))
        );
        assert_eq!(delta["delta"], "Hi");
        // An event that has them all passes byte for byte.
        let whole = event(
            "response.output_text.delta",
            r#"{"type":"response.output_text.delta","item_id":"m1","output_index":0,"content_index":0,"delta":"a","sequence_number":4}"#,
        );
        assert_eq!(
            numbered(whole.clone(), 4, &mut indices).unwrap().event,
            whole
        );
        let broken = event(
            "response.output_text.delta",
            "{\"type\":\"response.output_text.delta\",\"delta\":7}",
        );
        assert!(numbered(broken, 5, &mut indices).is_err());
    }

    #[test]
    fn unnumbered_items_and_parts_are_numbered_after_the_others() {
        let mut indices = Indices::default();
        let mut pass = |kind: &str, data: &str, id| {
            let passed = numbered(event(kind, data), id, &mut indices).unwrap();
            serde_json::from_str::<Value>(passed.event.data_str().unwrap()).unwrap()
        };
        let item = r#"{"type":"response.output_item.added","item":{"type":"reasoning","id":"r1"}}"#;
        assert_eq!(
            pass("response.output_item.added", item, 0)["output_index"],
            0
        );
        let item = r#"{"type":"response.output_item.added","item":{"type":"message","id":"m1"}}"#;
        assert_eq!(
            pass("response.output_item.added", item, 1)["output_index"],
            1
        );
        let part = r#"{"type":"response.content_part.added","item_id":"m1","part":{"type":"output_text"}}"#;
        let part = pass("response.content_part.added", part, 2);
        assert_eq!(
            (&part["output_index"], &part["content_index"]),
            (&json!(1), &json!(0))
        );
        let delta = r#"{"type":"response.output_text.delta","item_id":"m1","delta":"a"}"#;
        let delta = pass("response.output_text.delta", delta, 3);
        assert_eq!(
            (&delta["output_index"], &delta["content_index"]),
            (&json!(1), &json!(0))
        );
        // A type the crate does not know is numbered too, its fields kept.
        let unknown =
            r#"{"type":"response.web_search_call.searching","item_id":"w1","sequence_number":9}"#;
        let unknown = pass("response.web_search_call.searching", unknown, 4);
        assert_eq!(
            (&unknown["sequence_number"], &unknown["item_id"]),
            (&json!(4), &json!("w1"))
        );
    }

    #[test]
    fn each_format_has_its_own_end_stop_and_error() {
        let stop = event("message_stop", r#"{"type":"message_stop"}"#);
        assert!(Format::Messages.ends(&stop));
        assert!(!Format::Chat.ends(&stop));
        let completed = event(
            "response.completed",
            r#"{"type":"response.completed","response":{}}"#,
        );
        assert!(Format::Responses.ends(&completed));
        let frame = Format::Messages.error_frame("upstream stalled");
        let data: Value = serde_json::from_str(frame.data_str().unwrap()).unwrap();
        assert_eq!(
            (frame.event(), data["type"].as_str()),
            (Some("error"), Some("error"))
        );
        assert_eq!(data["error"]["message"], "upstream stalled");
        let frame = Format::Responses.error_frame("upstream stalled");
        let data: Value = serde_json::from_str(frame.data_str().unwrap()).unwrap();
        assert_eq!(
            (data["type"].as_str(), data["code"].as_str()),
            (Some("error"), Some("upstream_error"))
        );
        assert_eq!(Format::of("/v1/messages"), Some(Format::Messages));
        assert_eq!(Format::of("/v1/models"), None);
    }
}
