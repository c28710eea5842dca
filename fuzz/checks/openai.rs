//! The properties the `openai_chunk` fuzz target checks, shared with `tests/fuzz_corpus.rs`
//! (which replays the corpus) and `tests/openai.rs` (which uses the SDK's accumulator).

// Each includer (a fuzz target, a test file) uses a part.
#![allow(dead_code)]

use serde_json::{Map, Value};
use streamgate::Chunk;
use streamgate::openai::{ChatCompletionChunk, ChatEvent};
use streamgate::sse::SseEvent;

/// `openai_chunk`: the input is one chunk's JSON, or two cut at the first `0xFF`. Parsing never
/// panics; a parsed chunk encodes to JSON of its `byte_len` that parses back to the same chunk
/// and the same JSON; read as an SSE event's data it round-trips through [`ChatEvent`]; and two
/// parsed chunks either merge into one no longer than both that a client accumulates into the
/// same message as the two, or stay unchanged. Returns whether they merged, when the input
/// held two chunks.
pub fn check_chunk(data: &[u8]) -> Option<bool> {
    let mut parts = data.splitn(2, |&byte| byte == 0xFF);
    let first = parts.next().and_then(parse_stable);
    let second = parts.next().and_then(parse_stable);
    Some(check_merge(&first?, &second?))
}

/// Parses `json` as a chunk and as an event's data, checking both round trips.
fn parse_stable(json: &[u8]) -> Option<ChatCompletionChunk> {
    let sse = SseEvent::data(String::from_utf8_lossy(json));
    if let Ok(event) = ChatEvent::from_sse(&sse) {
        let again = ChatEvent::from_sse(&SseEvent::from(event.clone()));
        assert_eq!(again.expect("an encoded event parses"), event);
    }
    let chunk = ChatCompletionChunk::parse(json).ok()?;
    let encoded = chunk.to_json();
    assert_eq!(chunk.byte_len(), encoded.len());
    let again = ChatCompletionChunk::parse(encoded.as_bytes()).expect("an encoded chunk parses");
    assert_eq!(again, chunk);
    assert_eq!(again.to_json(), encoded);
    Some(chunk)
}

/// Merges `next` into `first`: a refusal hands `next` back and leaves `first` as it was; a
/// merge is no longer than the two and accumulates to the same message. Returns whether they
/// merged.
pub fn check_merge(first: &ChatCompletionChunk, next: &ChatCompletionChunk) -> bool {
    let mut merged = first.clone();
    match merged.merge(next.clone()) {
        Ok(()) => {
            assert!(merged.byte_len() <= first.byte_len() + next.byte_len());
            assert_eq!(accumulate([&merged]), accumulate([first, next]));
            true
        }
        Err(back) => {
            assert_eq!((&merged, &back), (first, next));
            false
        }
    }
}

/// The message(s) an OpenAI SDK builds from `chunks`, following openai-python's
/// `ChatCompletionStreamState` on the JSON a client receives: the first chunk's fields with
/// `object` `chat.completion`; per choice, the first chunk of it (its fields, its delta as
/// `message`), then each later delta accumulated into `message` by `accumulate_delta`, a
/// non-empty `finish_reason` set, logprob lists extended; `usage` and `system_fingerprint`
/// from the last chunk. Choices and tool calls are matched by their `index` field where the
/// SDK takes it as a position in the list (the same when indexes count from 0, as servers
/// send them).
pub fn accumulate<'a>(chunks: impl IntoIterator<Item = &'a ChatCompletionChunk>) -> Value {
    let mut snapshot: Option<Map<String, Value>> = None;
    let mut choices: Vec<Map<String, Value>> = Vec::new();
    for chunk in chunks {
        let Ok(Value::Object(mut data)) = serde_json::from_str(&chunk.to_json()) else {
            unreachable!("a chunk encodes as an object");
        };
        let Some(Value::Array(chunk_choices)) = data.remove("choices") else {
            unreachable!("a chunk has choices");
        };
        for choice in chunk_choices {
            let Value::Object(mut choice) = choice else {
                unreachable!("a choice is an object");
            };
            let delta = choice.remove("delta").unwrap_or_default();
            match choices
                .iter_mut()
                .find(|seen| seen["index"] == choice["index"])
            {
                None => {
                    choice.insert("message".to_owned(), delta);
                    choices.push(choice);
                }
                Some(seen) => accumulate_choice(seen, choice, delta),
            }
        }
        let last = ["usage", "system_fingerprint"]
            .map(|key| (key.to_owned(), data.remove(key).unwrap_or_default()));
        let snapshot = snapshot.get_or_insert_with(|| {
            data.insert("object".to_owned(), "chat.completion".into());
            data
        });
        snapshot.extend(last);
    }
    let mut snapshot = snapshot.unwrap_or_default();
    snapshot.insert(
        "choices".to_owned(),
        choices.into_iter().map(Value::Object).collect(),
    );
    Value::Object(snapshot)
}

/// A later chunk of a choice, as `_accumulate_chunk` takes it in.
fn accumulate_choice(seen: &mut Map<String, Value>, choice: Map<String, Value>, delta: Value) {
    if let (Some(Value::Object(message)), Value::Object(delta)) = (seen.get_mut("message"), delta) {
        accumulate_delta(message, delta);
    }
    if let Some(reason) = choice.get("finish_reason").filter(|reason| truthy(reason)) {
        seen.insert("finish_reason".to_owned(), reason.clone());
    }
    let Some(Value::Object(logprobs)) = choice.get("logprobs") else {
        return;
    };
    match seen.get_mut("logprobs") {
        Some(Value::Object(seen)) => {
            for key in ["content", "refusal"] {
                if let Some(Value::Array(more)) = logprobs.get(key).filter(|more| truthy(more)) {
                    let list = seen.entry(key).or_insert_with(|| Value::Array(Vec::new()));
                    if list.is_null() {
                        *list = Value::Array(Vec::new());
                    }
                    if let Value::Array(list) = list {
                        list.extend(more.iter().cloned());
                    }
                }
            }
        }
        _ => {
            let lists = ["content", "refusal"].map(|key| {
                (
                    key.to_owned(),
                    logprobs.get(key).cloned().unwrap_or_default(),
                )
            });
            seen.insert(
                "logprobs".to_owned(),
                Value::Object(lists.into_iter().collect()),
            );
        }
    }
}

/// openai-python's `accumulate_delta` (`lib/streaming/_deltas.py`), where it raises keeping
/// what it has.
fn accumulate_delta(acc: &mut Map<String, Value>, delta: Map<String, Value>) {
    for (key, value) in delta {
        let Some(current) = acc.get_mut(&key) else {
            let value = match value {
                Value::Array(items) if !items.is_empty() => Value::Array(normalize(items)),
                value => value,
            };
            acc.insert(key, value);
            continue;
        };
        if current.is_null() || key == "index" || key == "type" {
            *current = value;
            continue;
        }
        match (current, value) {
            (Value::String(text), Value::String(more)) => text.push_str(&more),
            (Value::Number(number), Value::Number(more)) => {
                let sum = match (number.as_i64(), more.as_i64()) {
                    (Some(a), Some(b)) => a.checked_add(b).map(Value::from),
                    _ => None,
                };
                let float = || {
                    number
                        .as_f64()
                        .zip(more.as_f64())
                        .map(|(a, b)| Value::from(a + b))
                };
                if let Some(Value::Number(sum)) = sum.or_else(float) {
                    *number = sum;
                }
            }
            (Value::Object(fields), Value::Object(more)) => accumulate_delta(fields, more),
            (Value::Array(items), Value::Array(more)) => {
                if items
                    .iter()
                    .all(|item| item.is_string() || item.is_number())
                {
                    items.extend(more);
                    continue;
                }
                for entry in more {
                    let Value::Object(entry) = entry else {
                        continue;
                    };
                    if !entry.get("index").is_some_and(Value::is_u64) {
                        continue;
                    }
                    match items
                        .iter_mut()
                        .find(|item| item["index"] == entry["index"])
                    {
                        Some(Value::Object(item)) => accumulate_delta(item, entry),
                        Some(_) => {}
                        None => items.push(Value::Object(entry)),
                    }
                }
            }
            _ => {}
        }
    }
}

/// `_normalize_indexed_list`: entries of one list sharing an index, accumulated into one.
fn normalize(items: Vec<Value>) -> Vec<Value> {
    let indexed = |item: &Value| item.get("index").is_some_and(Value::is_u64);
    if !items.iter().all(|item| item.is_object() && indexed(item)) {
        return items;
    }
    let mut merged: Vec<Map<String, Value>> = Vec::new();
    for item in items {
        let Value::Object(item) = item else { continue };
        match merged
            .iter_mut()
            .find(|seen| seen["index"] == item["index"])
        {
            Some(seen) => accumulate_delta(seen, item),
            None => merged.push(item),
        }
    }
    merged.into_iter().map(Value::Object).collect()
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
