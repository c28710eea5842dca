//! The properties the `responses_event` fuzz target checks, shared with `tests/fuzz_corpus.rs`
//! (which replays the corpus) and `tests/responses.rs` (which uses the SDK's accumulator).

// Each includer (a fuzz target, a test file) uses a part.
#![allow(dead_code, unused_imports)]

use serde_json::{Map, Value, json};
use streamgate::responses::{ResponsesData, ResponsesEvent};
use streamgate::sse::SseEvent;

#[path = "typed.rs"]
mod typed;

pub use typed::{Outcome, check_merge, check_round_trip};

/// What an input reaches (see `typed::reach`).
pub fn reach(input: &[u8]) -> Vec<String> {
    typed::reach::<ResponsesEvent>(input)
}

/// `responses_event`: the input is one event, or two cut at the first `0xFF`; each is its SSE
/// `event:` up to the first LF (none if empty), then its data. Reading never panics; an event
/// read encodes to an SSE event of its `byte_len` that reads back as the same event, with the
/// same data; two events either merge into one no longer than both that the SDK's
/// accumulation ([`accumulate`]) turns into the same response (and the same events in between,
/// after the same last `sequence_number`) as the two, or stay exactly as they were.
pub fn check_event(input: &[u8]) -> Outcome {
    typed::check_event::<ResponsesEvent>(input)
}

impl typed::Typed for ResponsesEvent {
    fn read(sse: &SseEvent) -> Result<Self, Box<dyn std::error::Error>> {
        Ok(ResponsesEvent::from_sse(sse)?)
    }

    fn is_unknown(&self) -> bool {
        matches!(self.data(), ResponsesData::Unknown(_))
    }

    fn event_type(&self) -> &str {
        self.data().event_type()
    }

    fn preamble() -> Vec<Self> {
        preamble()
    }

    fn accumulate(events: &[Self]) -> Value {
        accumulate(events)
    }
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

/// What a client of the OpenAI SDK gets from `events`, as the JSON it receives: the response
/// `ResponseStreamState.accumulate_event` (openai-python, `lib/streaming/responses/
/// _responses.py`) builds, and the completed one; the text of every delta joined per type and
/// place (`item_id`, `output_index`, `content_index`, `summary_index`), with its log
/// probabilities (which a client that reads the deltas themselves, the reasoning and refusal
/// ones included, gets); in order, every event that is not a delta, each with all of that as it
/// stood then and the last `sequence_number` before it (the `starting_after` a client resuming
/// there sends); and the last `sequence_number`. The SDK's stream ends at `[DONE]` and raises
/// at data with an `error`; the port stops there too. Where the SDK raises on bad input (an
/// event before `response.created`, an index out of range) it keeps what it has.
pub fn accumulate<'a>(events: impl IntoIterator<Item = &'a ResponsesEvent>) -> Value {
    let mut response: Option<Value> = None;
    let mut completed = Value::Null;
    let mut texts = Map::new();
    let mut trace = Vec::new();
    let mut cursor = Value::Null;
    for event in events {
        let sse = SseEvent::from(event.clone());
        let raw = sse.data_str().unwrap_or_default();
        if raw.starts_with("[DONE]") {
            trace.push(json!([sse.event_type(), raw, cursor]));
            break;
        }
        let data = serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()));
        let kind = data.get("type").and_then(Value::as_str).unwrap_or_default();
        let raises = data.get("error").is_some_and(truthy);
        let delta = data.get("delta").and_then(Value::as_str);
        match delta.filter(|_| DELTAS.contains(&kind) && !raises) {
            Some(delta) => {
                let place = ["item_id", "output_index", "content_index", "summary_index"]
                    .map(|key| data.get(key).cloned().unwrap_or_default());
                let key = json!([kind, place]).to_string();
                let text = texts
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
            None => trace.push(json!([sse.event_type(), data, response, texts, cursor])),
        }
        if raises {
            break;
        }
        if let Some(number) = data.get("sequence_number") {
            cursor = number.clone();
        }
        accumulate_event(&mut response, &mut completed, kind, &data);
    }
    json!({
        "response": response,
        "completed": completed,
        "texts": texts,
        "trace": trace,
        "last_sequence_number": cursor,
    })
}

/// `accumulate_event` on one event.
fn accumulate_event(response: &mut Option<Value>, completed: &mut Value, kind: &str, data: &Value) {
    let Some(snapshot) = response else {
        if kind == "response.created" {
            *response = data.get("response").cloned();
        }
        return;
    };
    let index = |key: &str| {
        data.get(key)
            .and_then(Value::as_u64)
            .and_then(|index| usize::try_from(index).ok())
    };
    let output = index("output_index").and_then(|index| snapshot.get_mut("output")?.get_mut(index));
    let delta = data
        .get("delta")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match kind {
        "response.output_item.added" => {
            let output = snapshot
                .as_object_mut()
                .map(|snapshot| snapshot.entry("output").or_insert_with(|| json!([])));
            if let (Some(Value::Array(output)), Some(item)) = (output, data.get("item")) {
                output.push(item.clone());
            }
        }
        "response.content_part.added" => {
            let Some(output) = output.filter(|output| output["type"] == "message") else {
                return;
            };
            let content = output
                .as_object_mut()
                .map(|output| output.entry("content").or_insert_with(|| json!([])));
            if let (Some(Value::Array(content)), Some(part)) = (content, data.get("part")) {
                content.push(part.clone());
            }
        }
        "response.output_text.delta" => {
            let Some(output) = output.filter(|output| output["type"] == "message") else {
                return;
            };
            let content = index("content_index")
                .and_then(|index| output.get_mut("content")?.get_mut(index))
                .filter(|content| content["type"] == "output_text");
            if let Some(Value::String(text)) = content.and_then(|content| content.get_mut("text")) {
                text.push_str(delta);
            }
        }
        "response.function_call_arguments.delta" => {
            let output = output.filter(|output| output["type"] == "function_call");
            if let Some(Value::String(arguments)) =
                output.and_then(|output| output.get_mut("arguments"))
            {
                arguments.push_str(delta);
            }
        }
        "response.completed" => *completed = data.get("response").cloned().unwrap_or_default(),
        _ => {}
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
