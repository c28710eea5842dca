//! OpenAI Responses events: round trips with unknown fields, events kept as they came (and a
//! server's that leave fields out), the end and error frames, each merge rule, and the property
//! that a coalesced stream accumulates (by the OpenAI SDK's rules, `checks::accumulate`) into
//! the same response as the original, with the same `starting_after` at every event, however a
//! slow reader merged it.

#[path = "../fuzz/checks/responses.rs"]
mod checks;
mod common;

use std::time::Duration;

use bytes::BytesMut;
use checks::{accumulate, check_merge, check_round_trip};
use common::Rng;
use common::coalescing::{self, coalesce};
use serde_json::{Value, json};
use streamgate::responses::{ParseError, ResponsesData, ResponsesEvent};
use streamgate::sse::{DEFAULT_MAX_LINE, DecodeError, SseDecoder, SseEvent};
use streamgate::{Chunk, Kind};
use tokio_util::codec::Decoder;

/// The event `data` is, sent as `event: <its type>`.
fn event(data: Value) -> ResponsesEvent {
    let kind = data["type"].as_str().expect("a type").to_owned();
    let sse = SseEvent::data(data.to_string()).with_event(kind).unwrap();
    let event = ResponsesEvent::from_sse(&sse).expect("an event");
    check_round_trip(&event);
    event
}

/// A delta of type `kind` adding `text` to part 0 of message `msg_1` at 0, numbered `n`.
fn delta_of(kind: &str, text: &str, n: u64) -> ResponsesEvent {
    event(json!({
        "type": kind, "item_id": "msg_1", "output_index": 0, "content_index": 0,
        "delta": text, "sequence_number": n,
    }))
}

fn text(text: &str, n: u64) -> ResponsesEvent {
    delta_of("response.output_text.delta", text, n)
}

/// Merges `next` into `first`, checking the merge against the SDK's accumulation.
fn merged(first: &ResponsesEvent, next: &ResponsesEvent) -> ResponsesEvent {
    assert!(check_merge(first, next), "{first:?} takes {next:?}");
    let mut merged = first.clone();
    merged.merge(next.clone()).unwrap();
    merged
}

fn refused(first: &ResponsesEvent, next: &ResponsesEvent) {
    assert!(!check_merge(first, next), "{first:?} must refuse {next:?}");
}

/// The data's JSON as a value.
fn json_of(event: &ResponsesEvent) -> Value {
    serde_json::from_str(&event.data().to_json()).unwrap()
}

/// One event of every type this module knows, with unknown fields at every level.
fn every_known_event() -> Vec<Value> {
    let response = json!({"id": "resp_1", "object": "response", "status": "in_progress",
                          "output": [], "usage": null, "x": {"y": 1}});
    let mut events: Vec<Value> = [
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.completed",
        "response.incomplete",
        "response.failed",
    ]
    .iter()
    .map(|kind| json!({"type": kind, "response": response, "sequence_number": 0, "x": 1}))
    .collect();
    for kind in ["response.output_item.added", "response.output_item.done"] {
        events.push(json!({"type": kind, "output_index": 0, "sequence_number": 1, "x": [],
            "item": {"type": "message", "id": "msg_1", "status": "in_progress", "role": "assistant", "content": []}}));
    }
    for kind in ["response.content_part.added", "response.content_part.done"] {
        events.push(
            json!({"type": kind, "item_id": "msg_1", "output_index": 0, "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
            "sequence_number": 2, "x": null}),
        );
    }
    for kind in [
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_part.done",
    ] {
        events.push(
            json!({"type": kind, "item_id": "rs_1", "output_index": 1, "summary_index": 0,
            "part": {"type": "summary_text", "text": ""}, "sequence_number": 3}),
        );
    }
    let deltas = [
        ("output_text", "content_index", "text"),
        ("refusal", "content_index", "refusal"),
        ("function_call_arguments", "", "arguments"),
        ("reasoning_summary_text", "summary_index", "text"),
        ("reasoning_text", "content_index", "text"),
    ];
    for (family, index, field) in deltas {
        let mut delta = json!({"type": format!("response.{family}.delta"), "item_id": "it_1",
            "output_index": 2, "delta": "a\"\u{1F642}", "obfuscation": "Zx8", "sequence_number": 4,
            "x": {"k": [1]}});
        let mut done = json!({"type": format!("response.{family}.done"), "item_id": "it_1",
            "output_index": 2, field: "a\"\u{1F642}", "sequence_number": 5, "x": 2});
        if !index.is_empty() {
            delta[index] = json!(0);
            done[index] = json!(0);
        }
        if family == "output_text" {
            delta["logprobs"] = json!([{"token": "a", "logprob": -0.5, "top_logprobs": []}]);
            done["logprobs"] = json!([]);
        }
        if family == "function_call_arguments" {
            done["name"] = json!("f");
        }
        events.extend([delta, done]);
    }
    events.push(
        json!({"type": "error", "code": "server_error", "message": "boom",
                       "param": null, "sequence_number": 6, "x": true}),
    );
    events
}

#[test]
fn unknown_fields_survive_a_round_trip_at_every_level() {
    let events = every_known_event();
    assert_eq!(events.len(), 23, "every type this module knows");
    for input in events {
        let event = event(input.clone());
        assert!(
            !matches!(event.data(), ResponsesData::Unknown(_)),
            "{input}"
        );
        assert_eq!(event.data().event_type(), input["type"]);
        assert_eq!(
            event.data().sequence_number(),
            input["sequence_number"].as_u64()
        );
        // Every field is kept but the `null`s of optional fields.
        let mut expected = input.clone();
        expected
            .as_object_mut()
            .unwrap()
            .retain(|key, value| !(key == "param" && value.is_null()));
        assert_eq!(json_of(&event), expected, "{input}");
    }
}

#[test]
fn a_server_that_leaves_fields_out() {
    // As llama.cpp's llama-server sends a delta: no indexes, no sequence_number.
    let sparse = |text: &str| {
        event(json!({"type": "response.output_text.delta", "item_id": "msg_1", "delta": text}))
    };
    let mut hello = sparse("Hel");
    assert_eq!(hello.data().sequence_number(), None);
    hello = merged(&hello, &sparse("lo"));
    assert_eq!(
        hello.data().to_json(),
        r#"{"type":"response.output_text.delta","item_id":"msg_1","delta":"Hello"}"#
    );
    refused(&hello, &text("!", 9));
    // A proxy fills in what the format requires.
    let mut filled = hello.clone().into_data().with_sequence_number(7);
    let ResponsesData::OutputTextDelta(delta) = &mut filled else {
        panic!("a text delta");
    };
    (delta.output_index, delta.content_index) = (Some(0), Some(0));
    assert_eq!(filled.sequence_number(), Some(7));
    assert_eq!(
        filled.to_json(),
        r#"{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hello","sequence_number":7}"#
    );
    *filled.sequence_number_mut().unwrap() = Some(8);
    assert_eq!(filled.sequence_number(), Some(8));
}

#[test]
fn events_of_other_types_are_kept_as_they_came() {
    let cases = [
        // Types this module does not know.
        (
            Some("response.web_search_call.searching"),
            r#"{"type":"response.web_search_call.searching","output_index":0,  "sequence_number":3}"#,
        ),
        (
            None,
            r#"{"type":"response.output_text.annotation.added","annotation":{}}"#,
        ),
        // Data that names another type than the event.
        (
            Some("response.output_text.delta"),
            r#"{"type":"response.refusal.delta","delta":"x"}"#,
        ),
        (
            Some("response.completed"),
            r#"{"type":"response.created","response":{}}"#,
        ),
        // No type, no JSON, the end some servers send.
        (None, r#"{"error":{"message":"boom"}}"#),
        (None, "not json"),
        (None, "[DONE]"),
    ];
    for (kind, data) in cases {
        let mut sse = SseEvent::data(data).with_id("5").unwrap();
        if let Some(kind) = kind {
            sse = sse.with_event(kind).unwrap();
        }
        let event = ResponsesEvent::from_sse(&sse).unwrap();
        let ResponsesData::Unknown(unknown) = event.data() else {
            panic!("{data} is not read as a known event");
        };
        assert_eq!((unknown.event_type(), unknown.data()), (kind, data));
        assert_eq!(event.data().sequence_number(), None, "not read");
        assert_eq!(
            event.clone().into_data().with_sequence_number(1),
            event.data().clone()
        );
        assert_eq!(SseEvent::from(event.clone()), sse, "passed on as it came");
        check_round_trip(&event);
        refused(&event, &event);
        refused(&text("a", 1), &event);
        refused(&event, &text("a", 1));
    }
    let kind = |data: &str| {
        ResponsesEvent::from_sse(&SseEvent::data(data))
            .unwrap()
            .kind()
    };
    assert_eq!(
        kind(r#"{"type":"response.audio.delta","delta":"AAA="}"#),
        Kind::Visible
    );
    assert_eq!(kind("[DONE]"), Kind::Control);
}

#[test]
fn the_type_comes_from_the_data_or_the_event() {
    let data = r#"{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"a","sequence_number":1}"#;
    let event = ResponsesEvent::from_sse(&SseEvent::data(data)).unwrap();
    assert_eq!(event, text("a", 1));
    assert_eq!(
        SseEvent::from(event).event(),
        Some("response.output_text.delta")
    );
    let untyped =
        r#"{"item_id":"msg_1","output_index":0,"content_index":0,"delta":"a","sequence_number":1}"#;
    let sse = SseEvent::data(untyped)
        .with_event("response.output_text.delta")
        .unwrap();
    assert_eq!(ResponsesEvent::from_sse(&sse).unwrap(), text("a", 1));
}

#[test]
fn bad_input_is_a_typed_error() {
    assert!(matches!(
        ResponsesEvent::from_sse(&SseEvent::retry(Duration::from_secs(1))),
        Err(ParseError::NoData)
    ));
    for (kind, data) in [
        (
            "response.output_text.delta",
            r#"{"type":"response.output_text.delta","delta":"#,
        ),
        (
            "response.output_text.delta",
            r#"{"type":"response.output_text.delta","item_id":"m"}"#,
        ),
        (
            "response.output_text.delta",
            r#"{"type":"response.output_text.delta","delta":"a","sequence_number":-1}"#,
        ),
        ("response.created", r#"{"type":"response.created"}"#),
        (
            "response.output_item.added",
            r#"{"type":"response.output_item.added","item":{}}"#,
        ),
        ("error", "not json"),
    ] {
        let error =
            ResponsesEvent::from_sse(&SseEvent::data(data).with_event(kind).unwrap()).unwrap_err();
        assert!(
            matches!(&error, ParseError::Data { event, .. } if *event == kind),
            "{kind} {data}: {error}"
        );
        // Without `event:`, the data names the type.
        let error = ResponsesEvent::from_sse(&SseEvent::data(data));
        if data.starts_with('{') && data.ends_with('}') {
            assert!(matches!(error, Err(ParseError::Data { .. })), "{data}");
        }
    }
}

#[test]
fn end_and_error_frames() {
    for kind in [
        "response.completed",
        "response.incomplete",
        "response.failed",
    ] {
        let end = event(
            json!({"type": kind, "response": {"id": "resp_1", "status": kind.trim_start_matches("response.")}, "sequence_number": 9}),
        );
        assert!(end.data().is_end(), "{kind}");
        assert_eq!(end.kind(), Kind::Control);
        let (ResponsesData::Completed(response)
        | ResponsesData::Incomplete(response)
        | ResponsesData::Failed(response)) = end.data()
        else {
            panic!("{kind} is an end");
        };
        assert_eq!(response.response.id.as_deref(), Some("resp_1"));
        refused(&end, &end);
        refused(&text("a", 1), &end);
        refused(&end, &text("a", 10));
    }
    let wire = "event: error\nid: 3\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"boom\",\"sequence_number\":12}\n\n";
    let mut error = ResponsesEvent::error("server_error", "boom").with_id(3);
    *error.data_mut().sequence_number_mut().unwrap() = Some(12);
    assert_eq!(&SseEvent::from(error.clone()).encode()[..], wire.as_bytes());
    let decoded = SseDecoder::new()
        .decode(&mut BytesMut::from(wire))
        .unwrap()
        .unwrap();
    let read = ResponsesEvent::from_sse(&decoded).unwrap();
    assert_eq!(read, error);
    let ResponsesData::Error(frame) = read.data() else {
        panic!("an error frame");
    };
    assert_eq!(
        (frame.code.as_deref(), frame.message.as_deref()),
        (Some("server_error"), Some("boom"))
    );
    assert!(read.data().is_end());
    assert_eq!(read.byte_len(), decoded.byte_len());
    for not_end in [
        text("a", 1),
        event(json!({"type": "response.in_progress", "response": {}})),
    ] {
        assert!(!not_end.data().is_end());
    }
}

#[test]
fn kinds() {
    for input in every_known_event() {
        let kind = input["type"].as_str().unwrap().to_owned();
        let expected = match kind.as_str() {
            "response.output_text.delta"
            | "response.refusal.delta"
            | "response.function_call_arguments.delta" => Kind::Visible,
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                Kind::Hidden
            }
            _ => Kind::Control,
        };
        let event = event(input);
        assert_eq!(event.kind(), expected, "{kind}");
        // A decoding hop reads the same kind off the wire.
        assert_eq!(SseEvent::from(event).kind(), expected, "{kind}");
    }
}

#[test]
fn deltas_of_one_place_and_type_concatenate() {
    let kinds = [
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.delta",
    ];
    for kind in kinds {
        let ab = merged(&delta_of(kind, "a\"", 3), &delta_of(kind, "b\u{1F642}", 4));
        assert_eq!(json_of(&ab)["delta"], "a\"b\u{1F642}");
        assert_eq!(ab.data().sequence_number(), Some(4), "the later one's");
        for other in kinds.iter().filter(|other| **other != kind) {
            refused(&delta_of(kind, "a", 3), &delta_of(other, "b", 4));
        }
    }
    // Log probabilities follow one another; the padding goes.
    let with = |text: &str, logprob: f64, n: u64| {
        event(
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
            "content_index": 0, "delta": text, "obfuscation": "pad", "sequence_number": n,
            "logprobs": [{"token": text, "logprob": logprob}]}),
        )
    };
    let ab = merged(&with("a", -1.0, 1), &with("b", -2.0, 2));
    let json = json_of(&ab);
    assert_eq!(
        json["logprobs"],
        json!([{"token": "a", "logprob": -1.0}, {"token": "b", "logprob": -2.0}])
    );
    assert_eq!(json.get("obfuscation"), None);
    assert_eq!(
        json_of(&with("a", -1.0, 1))["obfuscation"],
        "pad",
        "kept on an event not merged"
    );
    // Merging keeps the later id.
    let mut with_ids = text("a", 1).with_id(1);
    with_ids.merge(text("b", 2).with_id(2)).unwrap();
    with_ids.merge(text("c", 3)).unwrap();
    assert_eq!(with_ids.id(), Some("2"));
    assert_eq!(with_ids.data().sequence_number(), Some(3));
}

#[test]
fn deltas_never_merge_across_places_types_or_other_events() {
    let at = |item: &str, output: u64, content: u64| {
        event(
            json!({"type": "response.output_text.delta", "item_id": item, "output_index": output,
            "content_index": content, "delta": "x", "sequence_number": 9}),
        )
    };
    for other in [at("msg_2", 0, 0), at("msg_1", 1, 0), at("msg_1", 0, 1)] {
        refused(&at("msg_1", 0, 0), &other);
    }
    let summary = |index: u64| {
        event(
            json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1",
            "output_index": 0, "summary_index": index, "delta": "x"}),
        )
    };
    refused(&summary(0), &summary(1));
    merged(&summary(1), &summary(1));
    refused(&text("a", 1), &delta_of("response.refusal.delta", "b", 2));
    refused(
        &delta_of("response.reasoning_text.delta", "a", 1),
        &text("b", 2),
    );
    for boundary in every_known_event()
        .into_iter()
        .filter(|input| !input["type"].as_str().unwrap().ends_with(".delta"))
    {
        let boundary = event(boundary);
        refused(&boundary, &text("a", 1));
        refused(&text("a", 1), &boundary);
        refused(&boundary, &boundary);
    }
}

#[test]
fn unknown_fields_merge_only_when_they_add_nothing() {
    let with = |extra: Value, n: u64| {
        let mut data = json!({"type": "response.output_text.delta", "item_id": "msg_1",
            "output_index": 0, "content_index": 0, "delta": "a", "sequence_number": n});
        data.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        event(data)
    };
    merged(
        &with(json!({"annotations": []}), 1),
        &with(json!({"annotations": []}), 2),
    );
    merged(&with(json!({"annotations": []}), 1), &text("b", 2));
    refused(
        &with(json!({"annotations": []}), 1),
        &with(json!({"annotations": null}), 2),
    );
    refused(
        &with(json!({"annotations": [1]}), 1),
        &with(json!({"annotations": [1]}), 2),
    );
    refused(&text("a", 1), &with(json!({"model": "m"}), 2));
}

/// Random text, JSON escapes and multi-byte characters included; sometimes empty.
fn random_text(rng: &mut Rng) -> String {
    const PIECES: [&str; 8] = ["a", "Hel", "lo ", "\"", "\\", "\n", "é", "\u{1F642}"];
    (0..rng.below(4))
        .map(|_| PIECES[rng.below(PIECES.len() as u64) as usize])
        .collect()
}

/// The events of one part's text: its deltas (padded, with log probabilities, odd unknown
/// fields now and then) and its `.done` with the whole text.
fn text_script(rng: &mut Rng, family: &str, place: &Value, field: &str) -> Vec<Value> {
    let mut script = Vec::new();
    let mut whole = String::new();
    for _ in 0..rng.below(9) {
        let piece = random_text(rng);
        whole.push_str(&piece);
        let mut delta = place.clone();
        delta["type"] = json!(format!("response.{family}.delta"));
        delta["delta"] = json!(piece);
        if rng.below(3) == 0 {
            delta["obfuscation"] = json!(random_text(rng));
        }
        if family == "output_text" {
            delta["logprobs"] = match rng.below(3) {
                0 => json!([{"token": piece, "logprob": -(rng.below(100) as f64) / 8.0}]),
                _ => json!([]),
            };
        }
        match rng.below(20) {
            0 => delta["annotations"] = json!([]),
            1 => delta["annotations"] = json!([random_text(rng)]),
            _ => {}
        }
        script.push(delta);
    }
    let mut done = place.clone();
    done["type"] = json!(format!("response.{family}.done"));
    done[field] = json!(whole);
    script.push(done);
    script
}

/// The events of output item `index` of a random stream: a message (output text and refusal
/// parts), a function call, a reasoning item (summary parts, reasoning text), or a web search
/// call with events this module does not know; each added, its parts, done. A `sparse` one
/// has no part and no `.done` events, so the deltas of two parts, or of two items, follow one
/// another (servers that send less than OpenAI).
fn item_script(rng: &mut Rng, index: u64, sparse: bool) -> Vec<Value> {
    let id = format!("it_{index}");
    let (kind, item) = match rng.below(4) {
        0 => (
            "message",
            json!({"type": "message", "id": id, "role": "assistant", "content": []}),
        ),
        1 => (
            "function_call",
            json!({"type": "function_call", "id": id, "name": "f", "arguments": ""}),
        ),
        2 => (
            "reasoning",
            json!({"type": "reasoning", "id": id, "summary": []}),
        ),
        _ => (
            "web_search_call",
            json!({"type": "web_search_call", "id": id}),
        ),
    };
    let mut script =
        vec![json!({"type": "response.output_item.added", "output_index": index, "item": item})];
    let place = |key: &str, part: u64| json!({"item_id": id, "output_index": index, key: part});
    let part = |script: &mut Vec<Value>, kind: &str, place: &Value, part: Value| {
        if sparse {
            return;
        }
        let mut event = place.clone();
        event["type"] = json!(kind);
        event["part"] = part;
        script.push(event);
    };
    match kind {
        "message" | "reasoning" => {
            for part_index in 0..1 + rng.below(2) {
                let (family, key, field, body, added, done) = match (kind, rng.below(2)) {
                    ("message", 0) => (
                        "output_text",
                        "content_index",
                        "text",
                        json!({"type": "output_text", "text": "", "annotations": []}),
                        "response.content_part.added",
                        "response.content_part.done",
                    ),
                    ("message", _) => (
                        "refusal",
                        "content_index",
                        "refusal",
                        json!({"type": "refusal", "refusal": ""}),
                        "response.content_part.added",
                        "response.content_part.done",
                    ),
                    (_, 0) => (
                        "reasoning_summary_text",
                        "summary_index",
                        "text",
                        json!({"type": "summary_text", "text": ""}),
                        "response.reasoning_summary_part.added",
                        "response.reasoning_summary_part.done",
                    ),
                    _ => (
                        "reasoning_text",
                        "content_index",
                        "text",
                        json!({"type": "reasoning_text", "text": ""}),
                        "response.content_part.added",
                        "response.content_part.done",
                    ),
                };
                let place = place(key, part_index);
                part(&mut script, added, &place, body.clone());
                let mut texts = text_script(rng, family, &place, field);
                if sparse {
                    texts.pop();
                }
                script.extend(texts);
                part(&mut script, done, &place, body);
            }
        }
        "function_call" => {
            let mut place = place("", 0);
            place.as_object_mut().unwrap().remove("");
            let mut texts = text_script(rng, "function_call_arguments", &place, "arguments");
            texts.last_mut().unwrap()["name"] = json!("f");
            if sparse {
                texts.pop();
            }
            script.extend(texts);
        }
        _ => {
            for step in ["in_progress", "searching", "completed"] {
                script.push(json!({"type": format!("response.web_search_call.{step}"), "item_id": id, "output_index": index}));
            }
        }
    }
    if !sparse {
        script.push(json!({"type": "response.output_item.done", "output_index": index, "item": {"type": kind, "id": id, "status": "completed"}}));
    }
    script
}

/// A random stream: `response.created` (queued first at times), `in_progress`, output items one
/// after another (or, sparse ones, all added first and their deltas interleaved), and an end: `completed` (with `[DONE]` after it at times), `incomplete`,
/// `failed`, `error`, or none; numbered from 0, or (as llama-server sends them) not at all.
fn random_stream(rng: &mut Rng) -> Vec<ResponsesEvent> {
    let response = |status: &str| json!({"id": "resp_1", "object": "response", "status": status, "output": []});
    let mut data = Vec::new();
    if rng.below(4) == 0 {
        data.push(json!({"type": "response.queued", "response": response("queued")}));
    }
    data.push(json!({"type": "response.created", "response": response("in_progress")}));
    data.push(json!({"type": "response.in_progress", "response": response("in_progress")}));
    let sparse = rng.below(5) == 0;
    let mut items: Vec<Vec<Value>> = (0..rng.below(4))
        .map(|index| item_script(rng, index, sparse))
        .collect();
    if sparse {
        // Every item added first, then their deltas interleaved: deltas of two items meet.
        data.extend(items.iter_mut().map(|item| item.remove(0)));
        for item in &mut items {
            item.reverse();
        }
        while let Some(open) = items.iter().position(|item| !item.is_empty()) {
            let pick = match items.get(open + 1) {
                Some(next) if !next.is_empty() && rng.below(2) == 0 => open + 1,
                _ => open,
            };
            data.extend(items[pick].pop());
        }
    } else {
        data.extend(items.into_iter().flatten());
    }
    let mut done = false;
    match rng.below(8) {
        0 => data.push(json!({"type": "response.incomplete", "response": response("incomplete")})),
        1 => data.push(json!({"type": "response.failed", "response": response("failed")})),
        2 => data.push(json!({"type": "error", "code": "server_error", "message": "boom"})),
        3 => {}
        _ => {
            data.push(json!({"type": "response.completed", "response": response("completed")}));
            done = rng.below(3) == 0;
        }
    }
    let numbered = rng.below(6) != 0;
    let mut events: Vec<ResponsesEvent> = data
        .into_iter()
        .enumerate()
        .map(|(n, mut data)| {
            if numbered {
                data["sequence_number"] = json!(n);
            }
            let kind = data["type"].as_str().unwrap().to_owned();
            let sse = SseEvent::data(data.to_string()).with_event(kind).unwrap();
            ResponsesEvent::from_sse(&sse).unwrap()
        })
        .collect();
    if done {
        events.push(ResponsesEvent::from_sse(&SseEvent::data("[DONE]")).unwrap());
    }
    events
}

#[test]
fn coalesced_streams_accumulate_to_the_same_response() {
    let (mut before, mut after, mut raised) = (0, 0, 0);
    for seed in 1..=2000u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let stream = random_stream(&mut rng);
        let coalesced = coalesce(&mut rng, &stream);
        for event in &coalesced {
            check_round_trip(event);
        }
        let response = accumulate(&stream);
        assert_eq!(accumulate(&coalesced), response, "seed {seed}: {stream:#?}");
        raised += usize::from(response["sdk"]["ended"][0] == "raised");
        // The numbers still rise, so `starting_after` any of them is well defined.
        let numbers: Vec<u64> = coalesced
            .iter()
            .filter_map(|e| e.data().sequence_number())
            .collect();
        assert!(
            numbers.windows(2).all(|pair| pair[0] < pair[1]),
            "seed {seed}"
        );
        before += stream.len();
        after += coalesced.len();
    }
    assert!(
        after * 20 < before * 17,
        "some events merge: {after} events of {before}"
    );
    // Sparse streams raise in the SDK (their text deltas name parts it never added); the
    // others it reads to their end, so both of the port's views are compared.
    assert!(
        (200..1000).contains(&raised),
        "{raised} of 2000 streams raise in the SDK"
    );
}

/// What a slow reader of a coalescing gate receives of `stream`.
async fn through_a_slow_reader(stream: &[ResponsesEvent]) -> Vec<ResponsesEvent> {
    coalescing::through_a_slow_reader(stream, |sse| ResponsesEvent::from_sse(sse).unwrap()).await
}

#[tokio::test(start_paused = true)]
async fn a_slow_reader_of_a_coalescing_gate_gets_the_same_response() {
    let mut rng = Rng(13);
    let streams: Vec<_> = (0..20).map(|_| random_stream(&mut rng)).collect();
    let (mut sent, mut delivered) = (0, 0);
    for stream in streams {
        let received = through_a_slow_reader(&stream).await;
        assert_eq!(accumulate(&received), accumulate(&stream));
        (sent, delivered) = (sent + stream.len(), delivered + received.len());
    }
    assert!(delivered < sent, "{delivered} events of {sent} delivered");
}

/// `events` as an upstream writes them: `event: <type>` and the data, numbered from 0.
fn wire(events: &[Value]) -> Vec<u8> {
    let mut wire = Vec::new();
    for (n, data) in events.iter().enumerate() {
        let mut data = data.clone();
        if data.is_object() {
            data["sequence_number"] = json!(n);
        }
        let text = data
            .as_str()
            .map_or_else(|| data.to_string(), str::to_owned);
        let kind = text_type(&text);
        wire.extend_from_slice(format!("event: {kind}\ndata: {text}\n\n").as_bytes());
    }
    wire
}

/// The type a data's text names, or where it names none the one it was meant to be (cut JSON).
fn text_type(text: &str) -> String {
    let named = serde_json::from_str::<Value>(text).ok();
    named
        .and_then(|data| data["type"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "response.output_text.delta".to_owned())
}

fn created() -> Value {
    json!({"type": "response.created", "response": {"id": "resp_1", "object": "response",
        "status": "in_progress", "output": []}})
}

#[test]
fn hostile_input_costs_one_event_each_within_the_decoders_limits() {
    let huge = "a".repeat(10 << 20);
    let text_delta = |text: &str| {
        json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
               "content_index": 0, "delta": text, "logprobs": []})
    };
    let unknown = json!({"type": "response.output_text.annotation.added", "item_id": "msg_1",
                         "output_index": 0, "content_index": 0, "annotation_index": 0,
                         "annotation": {"type": "url_citation", "url": "u"}});
    let input = wire(&[
        created(),
        json!({"type": "response.output_item.added", "output_index": 0,
               "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []}}),
        json!({"type": "response.content_part.added", "item_id": "msg_1", "output_index": 0,
               "content_index": 0, "part": {"type": "output_text", "text": ""}}),
        // Cut JSON, then a delta of 10 MB (one line, past the decoder's limits).
        json!(r#"{"type":"response.output_text.delta","item_id":"msg_1","output_in"#),
        text_delta(&huge),
        unknown.clone(),
        text_delta("b"),
        json!({"type": "response.completed", "response": {"id": "resp_1", "status": "completed"}}),
    ]);
    // Each event split across reads, down to a few bytes.
    for piece in [5, 4096, 1 << 20] {
        let (items, held) = common::decode_in_pieces(&input, piece);
        assert!(
            held <= DEFAULT_MAX_LINE + piece + 256,
            "{piece}-byte reads: the decoder held {held} bytes"
        );
        let mut read = Vec::new();
        let mut outcomes = Vec::new();
        for item in items {
            let outcome = match item {
                Err(DecodeError::LineTooLong { limit }) if limit == DEFAULT_MAX_LINE => {
                    "too long".to_owned()
                }
                Err(error) => panic!("{error}"),
                Ok(sse) => match ResponsesEvent::from_sse(&sse) {
                    Err(ParseError::Data {
                        event: "response.output_text.delta",
                        ..
                    }) => "invalid".to_owned(),
                    Err(error) => panic!("{error}"),
                    Ok(event) => {
                        if let ResponsesData::Unknown(kept) = event.data() {
                            assert_eq!(
                                serde_json::from_str::<Value>(kept.data()).unwrap()["annotation"],
                                unknown["annotation"]
                            );
                            assert_eq!(SseEvent::from(event.clone()), sse, "passed on as it came");
                        }
                        let kind = event.data().event_type().to_owned();
                        read.push(event);
                        kind
                    }
                },
            };
            outcomes.push(outcome);
        }
        assert_eq!(
            outcomes,
            [
                "response.created",
                "response.output_item.added",
                "response.content_part.added",
                "invalid",
                "too long",
                "response.output_text.annotation.added",
                "response.output_text.delta",
                "response.completed",
            ],
            "{piece}-byte reads"
        );
        // The stream goes on after each: the response holds the text that came whole, and a
        // client resuming after the last event it got asks for what followed the cut ones.
        let response = accumulate(&read);
        assert_eq!(
            response["sdk"]["snapshot"]["output"][0]["content"][0]["text"],
            "b"
        );
        assert_eq!(response["sdk"]["ended"], Value::Null);
        assert_eq!(response["events"]["last_sequence_number"], 7);
    }
    // A gateway that admits such deltas reads one whole, and merges two.
    let big = SseEvent::data(text_delta(&huge).to_string())
        .with_event("response.output_text.delta")
        .unwrap();
    let mut merged = ResponsesEvent::from_sse(&big).unwrap();
    merged
        .merge(ResponsesEvent::from_sse(&big).unwrap())
        .unwrap();
    assert_eq!(merged.byte_len(), SseEvent::from(merged.clone()).byte_len());
    assert_eq!(merged.byte_len(), big.byte_len() + huge.len());
}

#[tokio::test(start_paused = true)]
async fn a_response_completed_before_any_item() {
    let stream = [
        event(json!({"type": "response.created", "sequence_number": 0,
                     "response": {"id": "resp_1", "status": "in_progress", "output": []}})),
        event(json!({"type": "response.completed", "sequence_number": 1,
                     "response": {"id": "resp_1", "status": "completed", "output": []}})),
    ];
    let empty = accumulate(&stream);
    assert_eq!(empty["sdk"]["snapshot"]["output"], json!([]));
    assert_eq!(empty["sdk"]["completed"]["status"], "completed");
    let received = through_a_slow_reader(&stream).await;
    assert_eq!(accumulate(&received), empty);
    refused(&stream[1], &text("a", 2));
    // Before even a response.created it still reads and passes as it came (the SDK raises
    // there: the library keeps a stream's order, it does not judge it).
    assert!(stream[1].data().is_end());
    assert_eq!(accumulate([&stream[1]])["sdk"]["ended"][0], "raised");
}
