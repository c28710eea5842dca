//! The properties the `anthropic_event` fuzz target checks, shared with `tests/fuzz_corpus.rs`
//! (which replays the corpus) and `tests/anthropic.rs` (which uses the SDK's accumulator).

// Each includer (a fuzz target, a test file) uses a part.
#![allow(dead_code, unused_imports)]

use serde_json::{Map, Value, json};
use streamgate::anthropic::{MessagesData, MessagesEvent};
use streamgate::sse::SseEvent;

#[path = "typed.rs"]
mod typed;

typed::format_checks! {
    /// `anthropic_event`: the input is one event, or two cut at the first `0xFF`; each is its SSE
    /// `event:` up to the first LF (none if empty), then its data. Reading never panics; an event
    /// read encodes to an SSE event of its `byte_len` that reads back as the same event, with the
    /// same data; two events either merge into one no longer than both that the SDK's
    /// accumulation ([`accumulate`]) turns into the same message (and the same events in between)
    /// as the two, or stay exactly as they were.
    MessagesEvent,
    MessagesData
}

/// The event types the `anthropic` module knows.
pub const EVENT_TYPES: [&str; 8] = [
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "ping",
    "error",
];

/// A message's start and a block of each kind a delta adds to: text at 0, tool use at 1,
/// thinking at 2, server tool use at 3, text again at 4.
pub fn preamble() -> Vec<MessagesEvent> {
    let start = json!({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 3, "output_tokens": 1, "cache_read_input_tokens": 0},
    }});
    let blocks = [
        json!({"type": "text", "text": ""}),
        json!({"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}),
        json!({"type": "thinking", "thinking": "", "signature": ""}),
        json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}),
        json!({"type": "text", "text": ""}),
    ];
    let starts = blocks.into_iter().enumerate().map(|(index, block)| {
        json!({"type": "content_block_start", "index": index, "content_block": block})
    });
    std::iter::once(start)
        .chain(starts)
        .map(|data| {
            let kind = data["type"].as_str().unwrap().to_owned();
            let sse = SseEvent::data(data.to_string()).with_event(kind).unwrap();
            MessagesEvent::from_sse(&sse).unwrap()
        })
        .collect()
}

/// What a client of the Anthropic SDK gets from `events`, as the JSON it receives: a port of
/// anthropic-sdk-python (read at 009b035, 2026-08-07): `Stream.__stream__`
/// (`src/anthropic/_streaming.py`: it skips `ping`s, raises at `error`, and yields the data of
/// the Messages event types it knows, by their `event:`, with a missing `type` filled in from
/// it) feeding `accumulate_event` (`src/anthropic/lib/streaming/_messages.py`, as
/// `MessageStream` calls it for each event). The result is the message `accumulate_event`
/// builds and, in order, every event whose effect is not all in that message (all but the
/// text, tool-input and thinking deltas and the `message_delta`s), each with the message as it
/// stood then (where a delta was merged across one, the message there differs). The events the
/// SDK's stream drops (of a type it does not know, or without an `event:`) are noted in that
/// order too, as a client of a stream that passes them on sees them. Where the SDK raises (at
/// `error`, an event before `message_start`, a block index out of range) the port stops,
/// noting the message it had.
pub fn accumulate<'a>(events: impl IntoIterator<Item = &'a MessagesEvent>) -> Value {
    let mut message: Option<Value> = None;
    let mut trace = Vec::new();
    for event in events {
        let sse = SseEvent::from(event.clone());
        let raw = sse.data_str().unwrap_or_default();
        let data = serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()));
        let summed = match sse.event() {
            Some("ping") => continue,
            Some("error") => {
                trace.push(json!(["raised", message]));
                break;
            }
            // `sse.json()` raises at data that is not JSON.
            Some(name) if YIELDED.contains(&name) && !data.is_object() => {
                trace.push(json!(["raised", message]));
                break;
            }
            Some(name) if YIELDED.contains(&name) => {
                let kind = data.get("type").and_then(Value::as_str).unwrap_or(name);
                match accumulate_event(&mut message, kind, &data) {
                    Ok(summed) => summed,
                    Err(Raised) => {
                        trace.push(json!(["raised", message]));
                        break;
                    }
                }
            }
            _ => false,
        };
        if !summed {
            trace.push(json!([sse.event_type(), data, message.clone()]));
        }
    }
    json!({"message": message, "trace": trace})
}

/// Where the SDK raises.
struct Raised;

/// The event types the SDK's stream yields, of the Messages API (`_streaming.py`).
const YIELDED: [&str; 7] = [
    "message_start",
    "message_delta",
    "message_stop",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message",
];

/// `accumulate_event` on one event; returns whether its whole effect is in the message (a
/// delta the SDK appends, a `message_delta`).
fn accumulate_event(message: &mut Option<Value>, kind: &str, data: &Value) -> Result<bool, Raised> {
    let Some(Value::Object(snapshot)) = message else {
        if kind != "message_start" {
            return Err(Raised);
        }
        *message = data.get("message").cloned();
        return Ok(false);
    };
    match kind {
        "content_block_start" => {
            let content = snapshot.entry("content").or_insert_with(|| json!([]));
            if let (Value::Array(content), Some(block)) = (content, data.get("content_block")) {
                content.push(block.clone());
            }
            Ok(false)
        }
        "content_block_delta" => {
            // By position in the content, as the SDK takes `index`.
            let index = data
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(u64::MAX);
            let block = snapshot
                .get_mut("content")
                .and_then(|content| content.get_mut(usize::try_from(index).ok()?));
            match (block, data.get("delta")) {
                (Some(Value::Object(block)), Some(Value::Object(delta))) => {
                    Ok(add_delta(block, delta))
                }
                _ => Err(Raised),
            }
        }
        "content_block_stop" => {
            // `build_events` looks the block up, as the delta's does.
            let index = data
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(u64::MAX);
            let content = snapshot.get("content").and_then(Value::as_array);
            match content.and_then(|content| content.get(usize::try_from(index).ok()?)) {
                Some(_) => Ok(false),
                None => Err(Raised),
            }
        }
        "message_delta" => {
            let delta = data.get("delta").cloned().unwrap_or_default();
            let usage = data.get("usage").cloned().unwrap_or_default();
            for key in ["stop_reason", "stop_sequence"] {
                snapshot.insert(key.to_owned(), delta.get(key).cloned().unwrap_or_default());
            }
            if let Some(details) = delta.get("stop_details").filter(|v| !v.is_null()) {
                snapshot.insert("stop_details".to_owned(), details.clone());
            }
            let counts = snapshot.entry("usage").or_insert_with(|| json!({}));
            if let Value::Object(counts) = counts {
                let output = usage.get("output_tokens").cloned().unwrap_or_default();
                counts.insert("output_tokens".to_owned(), output);
                for key in [
                    "input_tokens",
                    "cache_creation_input_tokens",
                    "cache_read_input_tokens",
                    "server_tool_use",
                ] {
                    if let Some(count) = usage.get(key).filter(|v| !v.is_null()) {
                        counts.insert(key.to_owned(), count.clone());
                    }
                }
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// A `content_block_delta` added to its block as the SDK adds it; whether it is one the SDK
/// appends (text, tool input, thinking).
fn add_delta(block: &mut Map<String, Value>, delta: &Map<String, Value>) -> bool {
    let block_type = block
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let delta_type = delta
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let piece = |field: &str| delta.get(field).and_then(Value::as_str);
    let append = |block: &mut Map<String, Value>, field: &str, piece: &str| {
        let text = block.entry(field).or_insert_with(|| json!(""));
        if let Value::String(text) = text {
            text.push_str(piece);
        }
    };
    match (delta_type, block_type) {
        ("text_delta", "text") => {
            if let Some(text) = piece("text") {
                append(block, "text", text);
            }
            true
        }
        ("input_json_delta", "tool_use" | "server_tool_use") => {
            // The SDK parses the joined JSON text after each piece; the text decides it.
            if let Some(json) = piece("partial_json") {
                append(block, "__json_buf", json);
            }
            true
        }
        ("thinking_delta", "thinking") => {
            if let Some(thinking) = piece("thinking") {
                append(block, "thinking", thinking);
            }
            true
        }
        ("signature_delta", "thinking") => {
            block.insert("signature".to_owned(), json!(piece("signature")));
            false
        }
        ("citations_delta", "text") => {
            let citations = block.entry("citations").or_insert_with(|| json!([]));
            if citations.is_null() {
                *citations = json!([]);
            }
            if let (Value::Array(citations), Some(citation)) = (citations, delta.get("citation")) {
                citations.push(citation.clone());
            }
            false
        }
        // A delta the SDK does not add to this block (or does not know): no effect.
        ("text_delta" | "input_json_delta" | "thinking_delta", _) => true,
        _ => false,
    }
}
