//! The properties the `responses_event` fuzz target checks, shared with `tests/fuzz_corpus.rs`
//! (which replays the corpus) and `tests/responses.rs` (which uses the SDK's accumulator).

// Each includer (a fuzz target, a test file) uses a part.
#![allow(dead_code, unused_imports)]

use serde_json::{Map, Value, json};
use streamgate::responses::{ResponsesData, ResponsesEvent};
use streamgate::sse::SseEvent;

#[path = "typed.rs"]
mod typed;

typed::format_checks! {
    /// `responses_event`: the input is one event, or two cut at the first `0xFF`; each is its SSE
    /// `event:` up to the first LF (none if empty), then its data. Reading never panics; an event
    /// read encodes to an SSE event of its `byte_len` that reads back as the same event, with the
    /// same data; two events either merge into one no longer than both that the SDK's
    /// accumulation ([`accumulate`]) turns into the same response (and the same events in between,
    /// after the same last `sequence_number`) as the two, or stay exactly as they were.
    ResponsesEvent,
    ResponsesData
}

/// The event types the `responses` module knows.
pub const EVENT_TYPES: [&str; 23] = [
    "response.created",
    "response.queued",
    "response.in_progress",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "response.output_item.added",
    "response.output_item.done",
    "response.content_part.added",
    "response.content_part.done",
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_part.done",
    "response.output_text.delta",
    "response.output_text.done",
    "response.refusal.delta",
    "response.refusal.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.reasoning_summary_text.delta",
    "response.reasoning_summary_text.done",
    "response.reasoning_text.delta",
    "response.reasoning_text.done",
    "error",
];

/// A response's start and an item of each kind a delta adds to: a message at 0 (`msg_1`, with
/// an output text part at 0 and a refusal part at 1), a function call at 1 (`fc_1`), a reasoning
/// item at 2 (`rs_1`, with a summary part at 0 and a reasoning text part at 0); numbered from 0.
pub fn preamble() -> Vec<ResponsesEvent> {
    let response =
        json!({"id": "resp_1", "object": "response", "status": "in_progress", "output": []});
    let item = |index: u64, item: Value| json!({"type": "response.output_item.added", "output_index": index, "item": item});
    let part = |kind: &str, item: &str, output: u64, field: &str, index: u64, part: Value| json!({"type": kind, "item_id": item, "output_index": output, field: index, "part": part});
    let added = "response.content_part.added";
    let events = [
        json!({"type": "response.created", "response": response}),
        item(
            0,
            json!({"type": "message", "id": "msg_1", "role": "assistant", "content": []}),
        ),
        part(
            added,
            "msg_1",
            0,
            "content_index",
            0,
            json!({"type": "output_text", "text": ""}),
        ),
        part(
            added,
            "msg_1",
            0,
            "content_index",
            1,
            json!({"type": "refusal", "refusal": ""}),
        ),
        item(
            1,
            json!({"type": "function_call", "id": "fc_1", "name": "f", "arguments": ""}),
        ),
        item(2, json!({"type": "reasoning", "id": "rs_1", "summary": []})),
        part(
            "response.reasoning_summary_part.added",
            "rs_1",
            2,
            "summary_index",
            0,
            json!({"type": "summary_text", "text": ""}),
        ),
        part(
            added,
            "rs_1",
            2,
            "content_index",
            0,
            json!({"type": "reasoning_text", "text": ""}),
        ),
    ];
    events
        .into_iter()
        .enumerate()
        .map(|(sequence_number, mut data)| {
            data["sequence_number"] = json!(sequence_number);
            let kind = data["type"].as_str().unwrap().to_owned();
            let sse = SseEvent::data(data.to_string()).with_event(kind).unwrap();
            ResponsesEvent::from_sse(&sse).unwrap()
        })
        .collect()
}

/// The deltas, and where each places its text.
const DELTAS: [&str; 5] = [
    "response.output_text.delta",
    "response.refusal.delta",
    "response.function_call_arguments.delta",
    "response.reasoning_summary_text.delta",
    "response.reasoning_text.delta",
];

/// What a client gets from `events`, as JSON: what the OpenAI SDK's `responses.stream()` gives
/// it (`sdk`), and what a client that reads the raw events gets (`events`).
///
/// `sdk` is a port of openai-python (read at e43b422, 2026-08-21): `Stream.__stream__`
/// (`src/openai/_streaming.py`: the stream ends at `[DONE]`, and raises at data that is not JSON
/// or whose `error` is truthy) feeding `ResponseStreamState.handle_event` and
/// `ResponseStreamState.accumulate_event` (`src/openai/lib/streaming/responses/_responses.py`).
/// It holds the snapshot `accumulate_event` builds, the completed response, and, in order,
/// every event `handle_event` yields but the deltas (whose effect is all in the snapshot, or in
/// `events`' texts), each with the snapshot as it stood then. Where the SDK raises (an event
/// before `response.created`, an index that is absent or out of range, an item or a part of
/// another type than it asserts) the port stops, noting the snapshot it had.
///
/// `events`: the text of every delta joined per type and place (`item_id`, `output_index`,
/// `content_index`, `summary_index`) with its log probabilities (a client that reads the deltas
/// themselves, the reasoning and refusal ones included, gets those); in order, every other
/// event, each with the texts as they stood then and the last `sequence_number` before it (the
/// `starting_after` a client resuming there sends); and the last `sequence_number`.
pub fn accumulate<'a>(events: impl IntoIterator<Item = &'a ResponsesEvent>) -> Value {
    let mut sdk = SdkStream::default();
    let mut raw = RawEvents::default();
    for event in events {
        let sse = SseEvent::from(event.clone());
        let text = sse.data_str().unwrap_or_default();
        raw.read(sse.event_type(), text);
        sdk.read(text);
    }
    json!({
        "sdk": {
            "snapshot": sdk.snapshot,
            "completed": sdk.completed,
            "yielded": sdk.yielded,
            "ended": sdk.ended,
        },
        "events": {
            "texts": raw.texts,
            "trace": raw.trace,
            "last_sequence_number": raw.cursor,
        },
    })
}

/// The port of the SDK's stream and its `ResponseStreamState`.
#[derive(Default)]
struct SdkStream {
    /// `ResponseStreamState.__current_snapshot`.
    snapshot: Option<Value>,
    /// `ResponseStreamState._completed_response`.
    completed: Value,
    /// What `handle_event` yielded (the deltas aside), with the snapshot then.
    yielded: Vec<Value>,
    /// Why the stream stopped: `[DONE]`, or where it raised.
    ended: Value,
}

/// Where the SDK raises, and why.
struct Raised(&'static str);

impl SdkStream {
    /// `Stream.__stream__` on one event's data, then `handle_event`.
    fn read(&mut self, text: &str) {
        if !self.ended.is_null() {
            return;
        }
        if text.starts_with("[DONE]") {
            self.ended = json!("[DONE]");
            return;
        }
        let outcome = match serde_json::from_str::<Value>(text) {
            Err(_) => Err(Raised("data that is not JSON")),
            Ok(data) if data.get("error").is_some_and(truthy) => Err(Raised("APIError")),
            Ok(data) if !data.is_object() => Err(Raised("not an event")),
            Ok(data) => self.handle_event(&data),
        };
        if let Err(Raised(why)) = outcome {
            self.ended = json!(["raised", why, self.snapshot]);
        }
    }

    /// `handle_event`: accumulates, then checks what it asserts of the event's place before it
    /// yields the event.
    fn handle_event(&mut self, data: &Value) -> Result<(), Raised> {
        let kind = data.get("type").and_then(Value::as_str).unwrap_or_default();
        self.accumulate_event(kind, data)?;
        let snapshot = self.snapshot.as_mut().ok_or(Raised("no snapshot"))?;
        match kind {
            "response.output_text.delta" | "response.output_text.done" => {
                let output = output_at(snapshot, data)?;
                assert_type(output, "message")?;
                let content = index_into(output.get_mut("content"), data.get("content_index"))?;
                assert_type(content, "output_text")?;
            }
            "response.function_call_arguments.delta" => {
                assert_type(output_at(snapshot, data)?, "function_call")?;
            }
            _ => {}
        }
        if !DELTAS.contains(&kind) {
            self.yielded.push(json!([data, snapshot]));
        }
        Ok(())
    }

    /// `accumulate_event`.
    fn accumulate_event(&mut self, kind: &str, data: &Value) -> Result<(), Raised> {
        let Some(snapshot) = &mut self.snapshot else {
            // `_create_initial_response`.
            if kind != "response.created" {
                return Err(Raised("an event before response.created"));
            }
            let response = data.get("response").filter(|response| response.is_object());
            self.snapshot = Some(response.ok_or(Raised("no response"))?.clone());
            return Ok(());
        };
        let delta = data
            .get("delta")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match kind {
            "response.output_item.added" => {
                let item = data.get("item").ok_or(Raised("no item"))?;
                list(snapshot.get_mut("output"))?.push(item.clone());
            }
            "response.content_part.added" => {
                let output = output_at(snapshot, data)?;
                if output["type"] == "message" {
                    let part = data.get("part").ok_or(Raised("no part"))?;
                    list(output.get_mut("content"))?.push(part.clone());
                }
            }
            "response.output_text.delta" => {
                let output = output_at(snapshot, data)?;
                if output["type"] == "message" {
                    let content = index_into(output.get_mut("content"), data.get("content_index"))?;
                    assert_type(content, "output_text")?;
                    append(content.get_mut("text"), delta)?;
                }
            }
            "response.function_call_arguments.delta" => {
                let output = output_at(snapshot, data)?;
                if output["type"] == "function_call" {
                    append(output.get_mut("arguments"), delta)?;
                }
            }
            "response.completed" => {
                self.completed = data.get("response").cloned().unwrap_or_default();
            }
            _ => {}
        }
        Ok(())
    }
}

/// `snapshot.output[event.output_index]`.
fn output_at<'a>(snapshot: &'a mut Value, data: &Value) -> Result<&'a mut Value, Raised> {
    index_into(snapshot.get_mut("output"), data.get("output_index"))
}

/// `list[index]`: a `TypeError` for an index that is not a number (absent: `None`), an
/// `IndexError` out of range.
fn index_into<'a>(
    list: Option<&'a mut Value>,
    index: Option<&Value>,
) -> Result<&'a mut Value, Raised> {
    let index = index
        .and_then(Value::as_u64)
        .and_then(|index| usize::try_from(index).ok())
        .ok_or(Raised("list indices must be integers"))?;
    self::list(list)?
        .get_mut(index)
        .ok_or(Raised("list index out of range"))
}

/// A list the SDK appends to or indexes.
fn list(value: Option<&mut Value>) -> Result<&mut Vec<Value>, Raised> {
    match value {
        Some(Value::Array(items)) => Ok(items),
        _ => Err(Raised("not a list")),
    }
}

/// `assert value.type == kind`.
fn assert_type(value: &Value, kind: &str) -> Result<(), Raised> {
    if value["type"] == kind {
        Ok(())
    } else {
        Err(Raised("AssertionError"))
    }
}

/// `text += delta`.
fn append(text: Option<&mut Value>, delta: &str) -> Result<(), Raised> {
    match text {
        Some(Value::String(text)) => {
            text.push_str(delta);
            Ok(())
        }
        _ => Err(Raised("can only concatenate str")),
    }
}

/// A client that reads every event as it comes.
#[derive(Default)]
struct RawEvents {
    /// Each delta's text (and log probabilities) joined, per type and place.
    texts: Map<String, Value>,
    /// Every event that is not a delta, with the texts and the cursor before it.
    trace: Vec<Value>,
    /// The last `sequence_number` seen.
    cursor: Value,
}

impl RawEvents {
    fn read(&mut self, event_type: &str, text: &str) {
        let data = serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()));
        let kind = data.get("type").and_then(Value::as_str).unwrap_or_default();
        let delta = data.get("delta").and_then(Value::as_str);
        match delta.filter(|_| DELTAS.contains(&kind)) {
            Some(delta) => {
                let place = ["item_id", "output_index", "content_index", "summary_index"]
                    .map(|key| data.get(key).cloned().unwrap_or_default());
                let key = json!([kind, place]).to_string();
                let text = self
                    .texts
                    .entry(key)
                    .or_insert_with(|| json!({"text": "", "logprobs": []}));
                if let Value::String(text) = &mut text["text"] {
                    text.push_str(delta);
                }
                if let (Value::Array(all), Some(Value::Array(more))) =
                    (&mut text["logprobs"], data.get("logprobs"))
                {
                    all.extend(more.iter().cloned());
                }
            }
            None => self
                .trace
                .push(json!([event_type, data, self.texts, self.cursor])),
        }
        if let Some(number) = data.get("sequence_number") {
            self.cursor = number.clone();
        }
    }
}

/// Python's truth value of a JSON value.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(value) => *value,
        Value::Number(number) => number.as_f64() != Some(0.0),
        Value::String(text) => !text.is_empty(),
        Value::Array(items) => !items.is_empty(),
        Value::Object(fields) => !fields.is_empty(),
    }
}
