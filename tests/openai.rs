//! OpenAI-native chunks: round trips, each merge rule, the property that a coalesced stream
//! accumulates (by the OpenAI SDK's rules) into the same message as the original, and a
//! stream's chunks written from a template: the owned chunks' bytes, without allocating.

#[path = "../fuzz/checks/openai.rs"]
mod checks;
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::VecDeque;
use std::time::Duration;

use checks::{accumulate, check_merge};
use common::Rng;
use futures_util::StreamExt;
use serde_json::{Value, json};
use streamgate::openai::{
    ApiError, ChatCompletion, ChatCompletionChunk, ChatData, ChatEvent, ChunkChoice, ChunkTemplate,
    CompletionChoice, Delta, FunctionDelta, Logprobs, Message, ParseError, TokenLogprob,
    ToolCallDelta, Usage,
};
use streamgate::sse::SseEvent;
use streamgate::{Chunk, Gate, GateExt, Kind, Policy};

/// Counts the allocations (reallocations included) a thread makes while its `COUNTING` flag is
/// set: other tests run on other threads meanwhile and are not counted.
struct CountingAllocator;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn counted() {
    // `try_with`: allocations while a thread's locals are torn down are not counted.
    let _ = COUNTING.try_with(|counting| {
        if counting.get() {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

// SAFETY: every call is passed on to the system allocator unchanged.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted();
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        counted();
        // SAFETY: as for `GlobalAlloc::realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// The allocations `work` makes on this thread.
fn allocations(work: impl FnOnce()) -> u64 {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|counting| counting.set(true));
    work();
    COUNTING.with(|counting| counting.set(false));
    ALLOCATIONS.with(Cell::get)
}

fn parse(value: Value) -> ChatCompletionChunk {
    ChatCompletionChunk::parse(value.to_string().as_bytes()).expect("a chunk")
}

/// A chunk of stream `c1` with one choice.
fn chunk(choice: Value) -> ChatCompletionChunk {
    parse(json!({
        "id": "c1", "object": "chat.completion.chunk", "created": 7, "model": "m",
        "choices": [choice],
    }))
}

/// A chunk whose choice 0 adds `delta`.
fn delta(delta: Value) -> ChatCompletionChunk {
    chunk(json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}))
}

/// Merges `next` into `first`, checking the merge against the SDK's accumulation.
fn merged(first: &ChatCompletionChunk, next: &ChatCompletionChunk) -> ChatCompletionChunk {
    let mut merged = first.clone();
    assert!(check_merge(first, next), "{first:?} takes {next:?}");
    merged.merge(next.clone()).unwrap();
    merged
}

fn refused(first: &ChatCompletionChunk, next: &ChatCompletionChunk) {
    assert!(!check_merge(first, next), "{first:?} must refuse {next:?}");
}

fn delta_of(chunk: &ChatCompletionChunk) -> Value {
    serde_json::to_value(&chunk.choices[0].delta).unwrap()
}

#[test]
fn unknown_fields_survive_a_round_trip() {
    let input = json!({
        "id": "c1", "object": "chat.completion.chunk", "created": 7, "model": "m",
        "system_fingerprint": "fp", "service_tier": "default", "provider": {"name": "p"},
        "choices": [{
            "index": 0, "stop_reason": null, "finish_reason": null,
            "delta": {
                "role": "assistant", "content": "a\"\n\u{1F642}", "refusal": "r",
                "reasoning_content": "think", "annotations": [{"k": 1}],
                "tool_calls": [{
                    "index": 0, "id": "call_0", "type": "function", "x": true,
                    "function": {"name": "f", "arguments": "{\"a\":", "strict": false},
                }],
            },
            "logprobs": {
                "content": [{
                    "token": "a", "logprob": -0.12345678901234567, "bytes": [97], "alt": 1,
                    "top_logprobs": [{"token": "b", "logprob": -2.5e-7, "bytes": null}],
                }],
                "refusal": null, "note": "x",
            },
        }],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3,
                  "prompt_tokens_details": {"cached_tokens": 0}},
    });
    let chunk = parse(input.clone());
    assert_eq!(chunk.extra["provider"], json!({"name": "p"}));
    assert_eq!(chunk.choices[0].extra["stop_reason"], Value::Null);
    let encoded = chunk.to_json();
    assert_eq!(serde_json::from_str::<Value>(&encoded).unwrap(), input);
    assert_eq!(chunk.byte_len(), encoded.len());
    assert_eq!(
        ChatCompletionChunk::parse(encoded.as_bytes()).unwrap(),
        chunk
    );
}

#[test]
fn null_optional_fields_are_left_out_and_finish_reason_and_logprobs_always_sent() {
    let chunk = parse(json!({
        "id": "c1", "object": "chat.completion.chunk", "created": 7, "model": "m",
        "system_fingerprint": null, "usage": null,
        "choices": [{"index": 0, "delta": {"content": null, "refusal": null}}],
    }));
    assert_eq!(
        chunk.to_json(),
        r#"{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":null}]}"#
    );
}

#[test]
fn bad_input_is_a_typed_error() {
    for bad in [
        &b""[..],
        b"{",
        b"[]",
        b"\xff",
        br#"{"id":"c1","object":"o","created":-1,"model":"m","choices":[]}"#,
        br#"{"id":"c1","object":"o","created":1,"model":"m"}"#,
        br#"{"id":"c1","object":"o","created":1,"model":"m","choices":[{"index":0}]}"#,
        br#"{"id":"c1","object":"o","created":1,"model":"m","choices":[],"usage":{}}"#,
    ] {
        let error = ChatCompletionChunk::parse(bad).unwrap_err();
        assert!(matches!(error, ParseError::Json(_)), "{error}");
        assert!(std::error::Error::source(&error).is_some());
    }
}

#[test]
fn text_channels_concatenate() {
    for field in ["content", "refusal", "reasoning_content"] {
        let both = merged(&delta(json!({field: "Hel"})), &delta(json!({field: "lo"})));
        assert_eq!(delta_of(&both), json!({field: "Hello"}));
        assert_eq!(
            merged(&both, &delta(json!({}))),
            both,
            "an empty delta adds nothing"
        );
    }
}

#[test]
fn role_comes_from_the_first_chunk_only() {
    let first = delta(json!({"role": "assistant", "content": ""}));
    let both = merged(&first, &delta(json!({"content": "Hi"})));
    assert_eq!(
        delta_of(&both),
        json!({"role": "assistant", "content": "Hi"})
    );
    // The SDK would concatenate a second role: it is never merged.
    refused(&both, &delta(json!({"role": "assistant"})));
}

#[test]
fn tool_calls_merge_by_index_with_id_type_and_name_from_the_first_fragment() {
    let start = |index: u32, name: &str| {
        json!({"index": index, "id": format!("call_{index}"), "type": "function",
               "function": {"name": name, "arguments": ""}})
    };
    let args = |index: u32, text: &str| json!({"index": index, "function": {"arguments": text}});
    let mut calls = delta(json!({"tool_calls": [start(0, "f")]}));
    for next in [
        json!([args(0, "{\"a\":")]),
        json!([args(0, "1}"), start(1, "g")]),
        json!([args(1, "{}")]),
    ] {
        calls = merged(&calls, &delta(json!({"tool_calls": next})));
    }
    assert_eq!(
        delta_of(&calls),
        json!({"tool_calls": [
            {"index": 0, "id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}},
            {"index": 1, "id": "call_1", "type": "function", "function": {"name": "g", "arguments": "{}"}},
        ]})
    );
    // A second id, type or name for one call is never concatenated nor dropped.
    for again in [
        json!({"index": 1, "id": "call_9"}),
        json!({"index": 1, "type": "function"}),
        json!({"index": 1, "function": {"name": "h"}}),
    ] {
        refused(&calls, &delta(json!({"tool_calls": [again]})));
    }
    // Neither is one index twice in a delta.
    refused(
        &calls,
        &delta(json!({"tool_calls": [args(1, "a"), args(1, "b")]})),
    );
}

#[test]
fn a_channel_switch_ends_a_merge() {
    let reasoning = delta(json!({"reasoning_content": "hmm"}));
    let content = delta(json!({"content": "Hi"}));
    let refusal = delta(json!({"refusal": "no"}));
    let tools = delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}));
    let all = [&reasoning, &content, &refusal, &tools];
    for (i, first) in all.iter().enumerate() {
        for (j, next) in all.iter().enumerate() {
            if i != j {
                refused(first, next);
            }
        }
    }
    // Empty text is no channel: it merges either way.
    let empty = delta(json!({"role": "assistant", "content": ""}));
    assert_eq!(
        delta_of(&merged(&empty, &reasoning)),
        json!({"role": "assistant", "content": "", "reasoning_content": "hmm"})
    );
    merged(&reasoning, &delta(json!({"content": ""})));
}

#[test]
fn finish_reason_and_usage_never_merge() {
    let content = delta(json!({"content": "a"}));
    let finish = chunk(json!({"index": 0, "delta": {}, "finish_reason": "stop"}));
    refused(&content, &finish);
    refused(&finish, &content);
    let usage = Usage {
        prompt_tokens: 1,
        completion_tokens: 1,
        total_tokens: 2,
        ..Usage::default()
    };
    let usage = ChatCompletionChunk::new("c1", 7, "m").with_usage(usage);
    assert!(usage.choices.is_empty());
    refused(&content, &usage);
    refused(&usage, &content);
    refused(&usage, &usage);
}

#[test]
fn only_chunks_of_one_completion_merge() {
    let content = delta(json!({"content": "a"}));
    for (field, value) in [
        ("id", json!("c2")),
        ("model", json!("m2")),
        ("created", json!(8)),
        ("object", json!("x")),
        ("system_fingerprint", json!("fp")),
        ("service_tier", json!("flex")),
        ("provider", json!("p")),
    ] {
        let mut other = serde_json::to_value(&content).unwrap();
        other[field] = value;
        refused(&content, &parse(other));
    }
}

#[test]
fn choices_match_by_index_and_new_ones_join() {
    let choice = |index: u32, text: &str| json!({"index": index, "delta": {"content": text}, "finish_reason": null});
    let both = merged(&chunk(choice(0, "a")), &chunk(choice(1, "x")));
    let both = merged(&both, &chunk(choice(0, "b")));
    assert_eq!(
        both.choices
            .iter()
            .map(|c| (c.index, c.delta.content.as_deref().unwrap()))
            .collect::<Vec<_>>(),
        [(0, "ab"), (1, "x")]
    );
    // A switch is per choice: choice 1 reasoning does not stop choice 0's content.
    let reasoning =
        chunk(json!({"index": 1, "delta": {"reasoning_content": "r"}, "finish_reason": null}));
    refused(&both, &reasoning);
    let fresh = chunk(choice(0, "c"));
    let reasoning_2 =
        chunk(json!({"index": 2, "delta": {"reasoning_content": "r"}, "finish_reason": null}));
    merged(&fresh, &reasoning_2);
    // A chunk naming one choice twice never merges.
    let mut twice = chunk(choice(0, "a"));
    twice.choices.push(twice.choices[0].clone());
    refused(&twice, &fresh);
    refused(&fresh, &twice);
}

#[test]
fn unknown_fields_merge_only_when_they_add_nothing() {
    // Metadata of a choice must be the same in both.
    let stop = |value: Value| {
        chunk(
            json!({"index": 0, "delta": {"content": "a"}, "finish_reason": null, "stop_reason": value}),
        )
    };
    merged(&stop(json!(null)), &stop(json!(null)));
    refused(&stop(json!(null)), &stop(json!(1)));
    // A delta field with a value may be a channel this type does not know.
    let content = delta(json!({"content": "a"}));
    let unknown = delta(json!({"reasoning": "r"}));
    refused(&content, &unknown);
    refused(&unknown, &content);
    refused(&unknown, &unknown);
    assert_eq!(unknown.kind(), Kind::Visible);
    // Empty ones merge (OpenRouter sends `"reasoning": null` with every delta).
    let empty = delta(json!({"content": "b", "reasoning": null, "details": []}));
    let both = merged(&content, &empty);
    assert_eq!(
        delta_of(&both),
        json!({"content": "ab", "reasoning": null, "details": []})
    );
    merged(&both, &empty);
    refused(
        &both,
        &delta(json!({"content": "c", "reasoning": "", "details": []})),
    );
}

#[test]
fn logprobs_extend() {
    let token = |text: &str| json!({"token": text, "logprob": -0.5, "bytes": text.as_bytes(), "top_logprobs": []});
    let with = |text: &str, logprobs: Value| {
        chunk(
            json!({"index": 0, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": null}),
        )
    };
    let a = with("a", json!({"content": [token("a")], "refusal": null}));
    let b = with("b", json!({"content": [token("b")], "refusal": []}));
    let none = with("c", Value::Null);
    let ab = merged(&merged(&a, &b), &none);
    let logprobs: &Logprobs = ab.choices[0].logprobs.as_ref().unwrap();
    let tokens: Vec<&str> = logprobs
        .content
        .iter()
        .flatten()
        .map(|t: &TokenLogprob| t.token.as_str())
        .collect();
    assert_eq!(tokens, ["a", "b"]);
    assert_eq!(logprobs.refusal, None, "an empty list adds nothing");
    assert_eq!(merged(&none, &a).choices[0].logprobs, a.choices[0].logprobs);
}

#[test]
fn kinds() {
    assert_eq!(delta(json!({"content": "a"})).kind(), Kind::Visible);
    assert_eq!(delta(json!({"refusal": "a"})).kind(), Kind::Visible);
    assert_eq!(
        delta(json!({"tool_calls": [{"index": 0}]})).kind(),
        Kind::Visible
    );
    assert_eq!(
        delta(json!({"reasoning_content": "a"})).kind(),
        Kind::Hidden
    );
    assert_eq!(
        delta(json!({"role": "assistant", "content": ""})).kind(),
        Kind::Control
    );
    assert_eq!(ChatCompletionChunk::new("c", 1, "m").kind(), Kind::Control);
    assert_eq!(ChatEvent::done().kind(), Kind::Control);
    assert_eq!(ChatEvent::error("x", "y").kind(), Kind::Control);
    let hidden = SseEvent::from(delta(json!({"reasoning_content": "a"})));
    assert_eq!(hidden.kind(), Kind::Hidden);
}

#[test]
fn done_usage_and_error_frames() {
    let done = SseEvent::from(ChatEvent::done());
    assert_eq!(&done.encode()[..], b"data: [DONE]\n\n");
    let error = SseEvent::from(ChatEvent::error("upstream: reset", "upstream_error"));
    assert_eq!(
        &error.encode()[..],
        &b":control\ndata: {\"error\":{\"message\":\"upstream: reset\",\"type\":\"upstream_error\"}}\n\n"[..]
    );
    let Ok(ChatData::Error(api_error)) = ChatEvent::from_sse(&error).map(ChatEvent::into_data)
    else {
        panic!("an error frame");
    };
    assert_eq!(
        (api_error.message.as_str(), api_error.kind.as_str()),
        ("upstream: reset", "upstream_error")
    );
    // The crate's own end frame (`event: error`) reads as an error too, unknown fields kept.
    let end = SseEvent::data(r#"{"error":{"type":"slow_consumer","message":"m","code":7}}"#)
        .with_event("error")
        .unwrap();
    let end = ChatEvent::from_sse(&end).unwrap();
    let ChatData::Error(api_error) = end.data() else {
        panic!("an error frame");
    };
    assert_eq!(api_error.extra["code"], json!(7));
    let mut error = ChatEvent::from_sse(&error).unwrap();
    assert!(error.merge(ChatEvent::done()).is_err());
    assert_eq!(error.byte_len(), error.data().to_json().len());

    let usage = Usage {
        prompt_tokens: 3,
        completion_tokens: 2,
        total_tokens: 5,
        ..Usage::default()
    };
    let stream = ChatCompletionChunk::new("c1", 7, "m");
    let usage = SseEvent::from(stream.with_usage(usage));
    assert_eq!(
        usage.data_str(),
        Some(
            r#"{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#
        )
    );
}

#[test]
fn events_keep_their_ids_and_refuse_what_is_not_a_chat_stream() {
    let sse = |content: &str, id: &str| {
        SseEvent::from(delta(json!({"content": content})))
            .with_id(id)
            .unwrap()
    };
    let mut event = ChatEvent::from_sse(&sse("a", "1")).unwrap();
    assert_eq!(event.id(), Some("1"));
    event
        .merge(ChatEvent::from_sse(&sse("b", "2")).unwrap())
        .unwrap();
    event
        .merge(ChatEvent::from(delta(json!({"content": "c"}))))
        .unwrap();
    assert_eq!(
        event.id(),
        Some("2"),
        "the later id, kept when none follows"
    );
    assert_eq!(event.byte_len(), event.data().to_json().len() + 1);
    let numbered = ChatEvent::done().with_id(42);
    assert_eq!(SseEvent::from(numbered).id(), Some("42"));
    assert!(matches!(
        ChatEvent::from_sse(&SseEvent::data("[DONE]")).map(ChatEvent::into_data),
        Ok(ChatData::Done)
    ));

    let typed = SseEvent::data("{}").with_event("ping").unwrap();
    assert!(matches!(
        ChatEvent::from_sse(&typed),
        Err(ParseError::EventType(kind)) if kind == "ping"
    ));
    let retry = SseEvent::retry(Duration::from_secs(1));
    assert!(matches!(
        ChatEvent::from_sse(&retry),
        Err(ParseError::NoData)
    ));
    let error = ChatEvent::from_sse(&SseEvent::data("{\"choices\":[]}")).unwrap_err();
    assert!(
        error.to_string().contains("missing field `id`"),
        "the chunk's error: {error}"
    );
}

/// Random text, JSON escapes and multi-byte characters included; sometimes empty.
fn text(rng: &mut Rng) -> String {
    const PIECES: [&str; 8] = ["a", "Hel", "lo ", "\"", "\\", "\n", "é", "\u{1F642}"];
    (0..rng.below(4))
        .map(|_| PIECES[rng.below(PIECES.len() as u64) as usize])
        .collect()
}

/// The chunks of one choice of a random stream, in order: a role first, then runs of
/// reasoning, content, refusal and tool-call fragments (content with logprobs at times),
/// an odd one out now and then (an unknown field, a second role), a finish reason last.
fn choice_script(rng: &mut Rng, index: u32) -> VecDeque<ChunkChoice> {
    let stop_reason = rng.below(2) == 0;
    let choice = |rng: &mut Rng, delta: Delta| {
        let mut choice = ChunkChoice::new(index, delta);
        if stop_reason {
            choice.extra.insert("stop_reason".into(), Value::Null);
        }
        if rng.below(40) == 0 {
            choice.extra.insert("stop_reason".into(), json!(1));
        }
        choice
    };
    let mut script = VecDeque::new();
    let role = Delta {
        role: Some("assistant".into()),
        content: (rng.below(2) == 0).then(String::new),
        ..Delta::default()
    };
    script.push_back(choice(rng, role));
    let mut tools = 0;
    for _ in 0..rng.below(6) {
        let channel = rng.below(4);
        for fragment in 0..1 + rng.below(6) {
            let mut delta = Delta::default();
            let mut logprobs = None;
            match channel {
                0 => delta.reasoning_content = Some(text(rng)),
                1 => {
                    let content = text(rng);
                    if rng.below(3) == 0 {
                        logprobs = Some(Logprobs {
                            content: Some(vec![TokenLogprob {
                                token: content.clone(),
                                logprob: -(rng.below(1000) as f64) / 7.0,
                                bytes: Some(content.clone().into_bytes()),
                                top_logprobs: Some(Vec::new()),
                                ..TokenLogprob::default()
                            }]),
                            ..Logprobs::default()
                        });
                    }
                    delta.content = Some(content);
                }
                2 => delta.refusal = Some(text(rng)),
                _ => {
                    if fragment == 0 || rng.below(8) == 0 {
                        tools += 1;
                    }
                    let tool = tools - 1;
                    let mut call = ToolCallDelta {
                        index: tool,
                        function: Some(FunctionDelta {
                            arguments: Some(text(rng)),
                            ..FunctionDelta::default()
                        }),
                        ..ToolCallDelta::default()
                    };
                    // The first fragment names the call; a later one may name it again.
                    let mut again = || fragment == 0 || rng.below(16) == 0;
                    call.id = again().then(|| format!("call_{tool}"));
                    call.kind = again().then(|| "function".to_owned());
                    let name = again().then(|| format!("f{tool}"));
                    call.function.as_mut().unwrap().name = name;
                    delta.tool_calls = Some(vec![call]);
                }
            }
            match rng.below(30) {
                0 => {
                    delta.extra.insert("reasoning".into(), json!(text(rng)));
                }
                1 => {
                    delta.extra.insert("reasoning".into(), Value::Null);
                }
                2 => delta.role = Some("assistant".into()),
                _ => {}
            }
            let mut next = choice(rng, delta);
            next.logprobs = logprobs;
            script.push_back(next);
        }
    }
    let mut finish = choice(rng, Delta::default());
    finish.finish_reason = Some(if tools > 0 { "tool_calls" } else { "stop" }.into());
    script.push_back(finish);
    script
}

/// A random stream: one to three choices whose chunks interleave (two choices share a chunk
/// now and then), and the usage chunk at the end at times.
fn random_stream(rng: &mut Rng) -> Vec<ChatCompletionChunk> {
    let mut stream = ChatCompletionChunk::new("chatcmpl-1", 1_700_000_000, "m");
    if rng.below(2) == 0 {
        stream.system_fingerprint = Some("fp".into());
        stream.extra.insert("provider".into(), json!("p"));
    }
    let mut scripts: Vec<_> = (0..1 + rng.below(3) as u32)
        .map(|index| choice_script(rng, index))
        .collect();
    let mut chunks = Vec::new();
    loop {
        let open: Vec<usize> = (0..scripts.len())
            .filter(|&i| !scripts[i].is_empty())
            .collect();
        if open.is_empty() {
            break;
        }
        let mut chunk = stream.clone();
        let takes = if open.len() > 1 && rng.below(5) == 0 {
            2
        } else {
            1
        };
        let start = rng.below(open.len() as u64) as usize;
        for i in (0..takes).map(|k| open[(start + k) % open.len()]) {
            chunk.choices.extend(scripts[i].pop_front());
        }
        chunks.push(chunk);
    }
    if rng.below(2) == 0 {
        let usage = Usage {
            prompt_tokens: 5,
            completion_tokens: chunks.len() as u64,
            total_tokens: 5 + chunks.len() as u64,
            ..Usage::default()
        };
        chunks.push(stream.with_usage(usage));
    }
    chunks
}

/// Cuts `chunks` into random runs and merges each run left to right, a chunk that refuses
/// starting a new event; checks that each merge stays within the two lengths.
fn coalesce(rng: &mut Rng, chunks: &[ChatCompletionChunk]) -> Vec<ChatCompletionChunk> {
    let mut events: Vec<ChatCompletionChunk> = Vec::new();
    let mut run = 0;
    for chunk in chunks.iter().cloned() {
        let last = match events.last_mut() {
            Some(last) if run > 0 => last,
            _ => {
                run = 1 + rng.below(8);
                events.push(chunk);
                continue;
            }
        };
        run -= 1;
        let sum = last.byte_len() + chunk.byte_len();
        match last.merge(chunk) {
            Ok(()) => assert!(last.byte_len() <= sum),
            Err(chunk) => events.push(chunk),
        }
    }
    events
}

#[test]
fn coalesced_streams_accumulate_to_the_same_message() {
    let (mut chunks, mut events) = (0, 0);
    for seed in 1..=2000u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let stream = random_stream(&mut rng);
        let coalesced = coalesce(&mut rng, &stream);
        assert_eq!(
            accumulate(&coalesced),
            accumulate(&stream),
            "seed {seed}: {stream:#?}"
        );
        chunks += stream.len();
        events += coalesced.len();
    }
    assert!(
        events * 2 < chunks,
        "most chunks merge: {events} events of {chunks} chunks"
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_reader_of_a_coalescing_gate_gets_the_same_message() {
    let mut rng = Rng(7);
    let streams: Vec<_> = (0..20).map(|_| random_stream(&mut rng)).collect();
    for stream in streams {
        let chunks = stream.clone();
        let events =
            Gate::new()
                .max_events(3)
                .policy(Policy::coalesce())
                .spawn(|_, mut tx| async move {
                    for chunk in chunks {
                        tx.send(ChatEvent::from(chunk)).await?;
                    }
                    tx.send(ChatEvent::done()).await
                });
        let mut received = Vec::new();
        let mut frames = events.sse();
        while let Some(frame) = frames.next().await {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let text = String::from_utf8(frame.bytes().to_vec()).unwrap();
            let data = text
                .lines()
                .find_map(|line| line.strip_prefix("data: "))
                .unwrap();
            received.push(ChatData::parse(data).unwrap());
        }
        assert!(matches!(received.pop(), Some(ChatData::Done)));
        let received: Vec<_> = received
            .into_iter()
            .map(|data| match data {
                ChatData::Chunk(chunk) => chunk,
                other => panic!("a chunk: {other:?}"),
            })
            .collect();
        assert!(received.len() < stream.len());
        assert_eq!(accumulate(&received), accumulate(&stream));
    }
}

/// Texts a JSON string must escape, and some it need not.
const AWKWARD: [&str; 5] = [
    "",
    "t0 ",
    "quote \" backslash \\ slash / newline \n tab \t return \r",
    "control \u{1} \u{1f} del \u{7f}",
    "unicode é 日本語 🦀 \u{2028}",
];

#[test]
fn a_template_writes_the_owned_chunks_bytes() {
    for (id, model) in [("chatcmpl-1", "m"), ("odd \"id\"\n", "model/\\é")] {
        let template = ChunkTemplate::new(id, 1_700_000_000, model);
        let stream = ChatCompletionChunk::new(id, 1_700_000_000, model);
        for content in AWKWARD {
            for role in [None, Some("assistant")] {
                let mut written = Vec::new();
                template.write_content(&mut written, role, content).unwrap();
                let delta = Delta {
                    role: role.map(str::to_owned),
                    content: Some(content.to_owned()),
                    ..Delta::default()
                };
                let owned = stream.clone().with_choice(ChunkChoice::new(0, delta));
                assert_eq!(
                    String::from_utf8(written).unwrap(),
                    owned.to_json(),
                    "{content:?}, {role:?}"
                );
                // And it reads back as that chunk.
                assert_eq!(
                    ChatCompletionChunk::parse(owned.to_json().as_bytes()).unwrap(),
                    owned
                );
            }
        }
        for reason in ["stop", "length", "tool_calls"] {
            let mut written = Vec::new();
            template.write_finish(&mut written, reason).unwrap();
            let finish = ChunkChoice {
                finish_reason: Some(reason.to_owned()),
                ..ChunkChoice::new(0, Delta::default())
            };
            let owned = stream.clone().with_choice(finish);
            assert_eq!(String::from_utf8(written).unwrap(), owned.to_json());
        }
    }
}

/// Tokens `0..n`, displayed one by one (as a server renders a run of tokens).
struct Tokens(u64);

impl std::fmt::Display for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (0..self.0).try_for_each(|i| write!(f, "t{i} \"x\" "))
    }
}

#[test]
fn a_template_writes_into_a_buffer_with_room_without_allocating() {
    let template = ChunkTemplate::new("chatcmpl-1", 1_700_000_000, "my-model");
    for tokens in [0, 1, 50] {
        let mut json = Vec::with_capacity(4096);
        let made = allocations(|| {
            template
                .write_content(&mut json, Some("assistant"), &Tokens(tokens))
                .unwrap();
            template.write_finish(&mut json, "length").unwrap();
        });
        assert_eq!(made, 0, "{tokens} tokens");
        assert!(
            json.len() > 200,
            "written: {}",
            String::from_utf8_lossy(&json)
        );
    }
}

#[test]
fn a_completion_and_an_error_object_encode_as_openai_sends_them() {
    let usage = Usage {
        prompt_tokens: 0,
        completion_tokens: 3,
        total_tokens: 3,
        ..Usage::default()
    };
    let completion = ChatCompletion::new("chatcmpl-0", 7, "m")
        .with_choice(CompletionChoice::new(
            0,
            Message::assistant("t0 t1 t2 "),
            "length",
        ))
        .with_usage(usage);
    let json: Value = serde_json::from_str(&completion.to_json()).unwrap();
    assert_eq!(
        json,
        json!({
            "id": "chatcmpl-0", "object": "chat.completion", "created": 7, "model": "m",
            "choices": [{
                "index": 0, "message": {"role": "assistant", "content": "t0 t1 t2 "},
                "logprobs": null, "finish_reason": "length",
            }],
            "usage": {"prompt_tokens": 0, "completion_tokens": 3, "total_tokens": 3},
        })
    );
    // Fields it does not know survive a round trip.
    let vllm = json!({
        "id": "c", "object": "chat.completion", "created": 1, "model": "m", "prompt_logprobs": null,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "t"}]}, "logprobs": null, "finish_reason": "tool_calls",
            "stop_reason": null}],
    });
    let parsed: ChatCompletion = serde_json::from_value(vllm.clone()).unwrap();
    assert_eq!(parsed.choices[0].message.content, None);
    assert_eq!(serde_json::to_value(&parsed).unwrap(), vllm);

    let error = ApiError::new("busy", "server_error").with_code("kv_cache_full");
    assert_eq!(
        error.to_json(),
        r#"{"error":{"message":"busy","type":"server_error","code":"kv_cache_full"}}"#
    );
    let null_code = ApiError::new("cut", "upstream_error").with_code(Value::Null);
    assert_eq!(
        null_code.to_json(),
        r#"{"error":{"message":"cut","type":"upstream_error","code":null}}"#
    );
    let Ok(ChatData::Error(read)) = ChatData::parse(&error.to_json()) else {
        panic!("an error object");
    };
    assert_eq!(read, error);
}
