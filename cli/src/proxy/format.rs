//! The streaming APIs the proxy gates, by path: chat completions, text completions, Anthropic
//! Messages and OpenAI Responses; for each, what ends its answer, what a stop and a failure
//! send, and what the proxy fills in where an upstream left it out.
//!
//! | path | format | the answer ends with | a failure's frame | a stop sends |
//! |---|---|---|---|---|
//! | `/v1/chat/completions` | [`Format::Chat`] | `data: [DONE]` | `event: error`, `{"error":{..}}` | a final chunk, `[DONE]` |
//! | `/v1/completions` | [`Format::Text`] | `data: [DONE]` | the same | the same |
//! | `/v1/messages` | [`Format::Messages`] | `message_stop` | `event: error`, `{"type":"error","error":{"type":"api_error",..}}` | `message_delta` (`end_turn`), `message_stop` |
//! | `/v1/responses` | [`Format::Responses`] | `response.completed`, `.incomplete`, `.failed` | `event: error`, `{"type":"error","code":"upstream_error",..}` | `response.incomplete` |
//!
//! A Responses event's `sequence_number` is its position in the stream, which a resume's
//! `starting_after` names: the proxy writes its own event id there when the upstream sent none
//! or another (llama.cpp's server sends none), and a text event without `output_index` or
//! `content_index` gets those of the item and part it belongs to (the last ones added), as the
//! SDKs' accumulators index by them.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use streamgate::anthropic::{MessagesData, MessagesEvent};
use streamgate::responses::{ResponsesData, ResponsesEvent};
use streamgate::sse::SseEvent;

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

    /// Whether `event` ends the answer in a format whose end is an event of its own.
    pub(super) fn ends(self, event: &SseEvent) -> bool {
        let kind = event.event().unwrap_or("");
        match self {
            Format::Chat | Format::Text => false,
            Format::Messages => kind == "message_stop",
            Format::Responses => matches!(
                kind,
                "response.completed" | "response.incomplete" | "response.failed"
            ),
        }
    }

    /// The name of the event that ends its answer, for messages.
    pub(super) fn end_name(self) -> &'static str {
        match self {
            Format::Chat | Format::Text => "data: [DONE]",
            Format::Messages => "message_stop",
            Format::Responses => "response.completed",
        }
    }

    /// `event` as the client gets it as the `id`-th event of a Messages or Responses stream
    /// (numbered, for Responses: see [`numbered`]); `None` when it is not one of the format's
    /// events as the crate reads them (an unknown type is: it passes on). Chat and text chunks
    /// are read elsewhere, and pass.
    pub(super) fn pass(self, event: SseEvent, id: u64, indices: &mut Indices) -> Option<SseEvent> {
        match self {
            Format::Chat | Format::Text => Some(event),
            Format::Messages => MessagesEvent::from_sse(&event).is_ok().then_some(event),
            Format::Responses => numbered(event, id, indices).ok(),
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

    /// The events that end a stream stopped on purpose, for the formats whose stop is not a
    /// final chunk: a Messages answer's `message_delta` (`end_turn`) and `message_stop`; a
    /// Responses answer's `response.incomplete`, with the `response` its `first` event
    /// (`response.created`) carried (status `incomplete`, `incomplete_details.reason`
    /// `stopped`).
    pub(super) fn stop_events(self, first: Option<&str>) -> Vec<SseEvent> {
        let typed = |kind: &str, data: Value| {
            SseEvent::data(data.to_string())
                .with_event(kind)
                .expect("a constant type")
        };
        match self {
            Format::Chat | Format::Text => Vec::new(),
            Format::Messages => vec![
                typed(
                    "message_delta",
                    json!({
                        "type": "message_delta",
                        "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                        "usage": {"output_tokens": 0},
                    }),
                ),
                MessagesEvent::new(MessagesData::message_stop()).into(),
            ],
            Format::Responses => {
                let mut response = first
                    .and_then(|first| serde_json::from_str::<Value>(first).ok())
                    .and_then(|first| first.get("response").cloned())
                    .unwrap_or_else(|| json!({"object": "response", "output": []}));
                response["status"] = json!("incomplete");
                response["incomplete_details"] = json!({"reason": "stopped"});
                vec![typed(
                    "response.incomplete",
                    json!({"type": "response.incomplete", "response": response}),
                )]
            }
        }
    }
}

/// Where a Responses stream is: the item and content part its text events belong to.
#[derive(Debug, Default)]
pub(super) struct Indices {
    output_index: u64,
    content_index: u64,
}

/// `event` of a Responses stream as the client gets it, as its `id`-th event: its
/// `sequence_number` the proxy's id, and a text event's missing `output_index` and
/// `content_index` filled from `indices`, which the event moves on. The event as it came when
/// nothing needs filling; `Err` with it when it is not one the crate reads.
pub(super) fn numbered(
    event: SseEvent,
    id: u64,
    indices: &mut Indices,
) -> Result<SseEvent, SseEvent> {
    let Ok(parsed) = ResponsesEvent::from_sse(&event) else {
        return Err(event);
    };
    let mut data = parsed.into_data();
    let mut changed = false;
    match &mut data {
        ResponsesData::OutputItemAdded(added) => {
            if let Some(index) = added.output_index {
                indices.output_index = index;
            } else {
                added.output_index = Some(indices.output_index);
                changed = true;
            }
            indices.content_index = 0;
        }
        ResponsesData::ContentPartAdded(part) => {
            fill(&mut part.output_index, indices.output_index, &mut changed);
            match part.content_index {
                Some(index) => indices.content_index = index,
                None => {
                    part.content_index = Some(indices.content_index);
                    changed = true;
                }
            }
        }
        ResponsesData::OutputItemDone(done) => {
            fill(&mut done.output_index, indices.output_index, &mut changed);
        }
        ResponsesData::ContentPartDone(part) => {
            fill(&mut part.output_index, indices.output_index, &mut changed);
            fill(&mut part.content_index, indices.content_index, &mut changed);
        }
        ResponsesData::OutputTextDelta(delta) | ResponsesData::RefusalDelta(delta) => {
            fill(&mut delta.output_index, indices.output_index, &mut changed);
            fill(
                &mut delta.content_index,
                indices.content_index,
                &mut changed,
            );
        }
        ResponsesData::OutputTextDone(done) => {
            fill(&mut done.output_index, indices.output_index, &mut changed);
            fill(&mut done.content_index, indices.content_index, &mut changed);
        }
        _ => {}
    }
    if data.sequence_number() != Some(id) {
        if let Some(sequence_number) = data.sequence_number_mut() {
            *sequence_number = Some(id);
            changed = true;
        }
    }
    if !changed {
        return Ok(event);
    }
    Ok(SseEvent::from(ResponsesEvent::new(data)))
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
        let added = numbered(added, 1, &mut indices).unwrap();
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
        let delta = numbered(delta, 3, &mut indices).unwrap();
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
        assert_eq!(numbered(whole.clone(), 4, &mut indices), Ok(whole));
        let broken = event(
            "response.output_text.delta",
            "{\"type\":\"response.output_text.delta\",\"delta\":7}",
        );
        assert!(numbered(broken, 5, &mut indices).is_err());
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
        let created = r#"{"type":"response.created","response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}"#;
        let stopped = Format::Responses.stop_events(Some(created));
        let data: Value = serde_json::from_str(stopped[0].data_str().unwrap()).unwrap();
        assert_eq!(data["response"]["id"], "resp_1");
        assert_eq!(data["response"]["status"], "incomplete");
        let kinds: Vec<_> = Format::Messages
            .stop_events(None)
            .iter()
            .map(|e| e.event().unwrap().to_owned())
            .collect();
        assert_eq!(kinds, ["message_delta", "message_stop"]);
        assert_eq!(Format::of("/v1/messages"), Some(Format::Messages));
        assert_eq!(Format::of("/v1/models"), None);
    }
}
