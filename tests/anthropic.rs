//! Anthropic Messages events: round trips with unknown fields, events kept as they came, the end
//! and error frames, each merge rule, and the property that a coalesced stream accumulates (by
//! the Anthropic SDK's rules, `checks::accumulate`) into the same message as the original,
//! however a slow reader merged it.

#[path = "../fuzz/checks/anthropic.rs"]
mod checks;
mod common;

use std::time::Duration;

use bytes::BytesMut;
use checks::{accumulate, check_merge, check_round_trip};
use common::Rng;
use common::coalescing::{self, coalesce};
use serde_json::{Value, json};
use streamgate::anthropic::{ContentBlockDelta, Delta, MessagesData, MessagesEvent, ParseError};
use streamgate::sse::{DEFAULT_MAX_LINE, DecodeError, SseDecoder, SseEvent};
use streamgate::{Chunk, Kind};
use tokio_util::codec::Decoder;

/// The event `data` is, sent as `event: <its type>`.
fn event(data: Value) -> MessagesEvent {
    let kind = data["type"].as_str().expect("a type").to_owned();
    let sse = SseEvent::data(data.to_string()).with_event(kind).unwrap();
    let event = MessagesEvent::from_sse(&sse).expect("an event");
    check_round_trip(&event);
    event
}

/// A `content_block_delta` of block `index`.
fn delta(index: u64, delta: Value) -> MessagesEvent {
    event(json!({"type": "content_block_delta", "index": index, "delta": delta}))
}

fn text(index: u64, text: &str) -> MessagesEvent {
    delta(index, json!({"type": "text_delta", "text": text}))
}

fn ping() -> MessagesEvent {
    event(json!({"type": "ping"}))
}

fn message_delta(delta: Value, usage: Value) -> MessagesEvent {
    event(json!({"type": "message_delta", "delta": delta, "usage": usage}))
}

/// Merges `next` into `first`, checking the merge against the SDK's accumulation.
fn merged(first: &MessagesEvent, next: &MessagesEvent) -> MessagesEvent {
    assert!(check_merge(first, next), "{first:?} takes {next:?}");
    let mut merged = first.clone();
    merged.merge(next.clone()).unwrap();
    merged
}

fn refused(first: &MessagesEvent, next: &MessagesEvent) {
    assert!(!check_merge(first, next), "{first:?} must refuse {next:?}");
}

/// The data's JSON as a value.
fn json_of(event: &MessagesEvent) -> Value {
    serde_json::from_str(&event.data().to_json()).unwrap()
}

#[test]
fn unknown_fields_survive_a_round_trip_at_every_level() {
    let inputs = [
        json!({"type": "message_start", "trace": "t", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
            "stop_reason": null, "stop_sequence": null, "container": {"id": "c"},
            "usage": {"input_tokens": 3, "output_tokens": 1, "cache_read_input_tokens": 0,
                      "service_tier": "standard", "server_tool_use": {"web_search_requests": 0}},
        }}),
        json!({"type": "content_block_start", "index": 1, "x": [1],
               "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}}),
        json!({"type": "content_block_delta", "index": 0, "x": null,
               "delta": {"type": "text_delta", "text": "a\"\n\u{1F642}", "y": {"z": 1}}}),
        json!({"type": "content_block_delta", "index": 2,
               "delta": {"type": "thinking_delta", "thinking": "hm", "y": ""}}),
        json!({"type": "content_block_delta", "index": 2,
               "delta": {"type": "signature_delta", "signature": "EqQB", "y": 2}}),
        json!({"type": "content_block_delta", "index": 1,
               "delta": {"type": "input_json_delta", "partial_json": "{\"a\":", "y": []}}),
        json!({"type": "content_block_stop", "index": 0, "x": 1}),
        json!({"type": "message_delta", "x": 1,
               "delta": {"stop_reason": "end_turn", "stop_sequence": null,
                         "stop_details": {"type": "refusal"}},
               "usage": {"output_tokens": 7, "output_tokens_details": {"thinking_tokens": 3}}}),
        json!({"type": "message_stop", "amazon-bedrock-invocationMetrics": {"inputTokenCount": 3}}),
        json!({"type": "ping", "x": 1}),
        json!({"type": "error", "request_id": "req_1",
               "error": {"type": "overloaded_error", "message": "Overloaded", "details": null}}),
    ];
    for input in inputs {
        let event = event(input.clone());
        assert!(!matches!(event.data(), MessagesData::Unknown(_)), "{input}");
        assert_eq!(json_of(&event), input, "every field is kept");
        assert_eq!(event.data().event_type(), input["type"]);
    }
}

#[test]
fn typed_fields_are_read() {
    let start = event(json!({"type": "message_start", "message": {
        "id": "msg_1", "model": "m", "usage": {"input_tokens": 3, "output_tokens": null}}}));
    let MessagesData::MessageStart(start) = start.data() else {
        panic!("a message_start");
    };
    let usage = start.message.usage.as_ref().unwrap();
    assert_eq!(start.message.id.as_deref(), Some("msg_1"));
    assert_eq!((usage.input_tokens, usage.output_tokens), (Some(3), None));
    let thinking = delta(3, json!({"type": "thinking_delta", "thinking": "hm"}));
    let MessagesData::ContentBlockDelta(ContentBlockDelta {
        index: 3, delta, ..
    }) = thinking.data()
    else {
        panic!("a delta of block 3");
    };
    assert!(matches!(delta, Delta::Thinking { thinking, .. } if thinking == "hm"));
    assert_eq!(delta.delta_type(), Some("thinking_delta"));
}

#[test]
fn events_of_other_types_are_kept_as_they_came() {
    let cases = [
        // A type this module does not know.
        (
            Some("agent.thinking"),
            r#"{"type":"agent.thinking",  "x":1}"#,
        ),
        // Data that names another type than the event.
        (Some("content_block_delta"), r#"{"type":"ping"}"#),
        (Some("ping"), r#"{"type":"content_block_delta","index":0}"#),
        // No type at all, or no JSON.
        (None, r#"{"index":0}"#),
        (None, "not json"),
        (None, r#"["ping"]"#),
        (None, "[DONE]"),
    ];
    for (kind, data) in cases {
        let mut sse = SseEvent::data(data).with_id("5").unwrap();
        if let Some(kind) = kind {
            sse = sse.with_event(kind).unwrap();
        }
        let event = MessagesEvent::from_sse(&sse).unwrap();
        let MessagesData::Unknown(unknown) = event.data() else {
            panic!("{data} is not read as a known event");
        };
        assert_eq!((unknown.event_type(), unknown.data()), (kind, data));
        assert_eq!(event.data().event_type(), kind.unwrap_or("message"));
        assert_eq!(SseEvent::from(event.clone()), sse, "passed on as it came");
        check_round_trip(&event);
        // Never merged (a ping after it aside).
        assert!(event.clone().merge(event.clone()).is_err());
        assert!(text(0, "a").merge(event.clone()).is_err());
        let mut absorbing = event.clone();
        absorbing.merge(ping()).unwrap();
        assert_eq!(absorbing.data(), event.data());
    }
    let kind = |data: &str| {
        MessagesEvent::from_sse(&SseEvent::data(data))
            .unwrap()
            .kind()
    };
    assert_eq!(kind(r#"{"type":"agent.thinking"}"#), Kind::Visible);
    assert_eq!(kind("[DONE]"), Kind::Control);
}

#[test]
fn the_type_comes_from_the_event_or_the_data() {
    // No `type` in the data: the event's, as the SDK fills it in.
    let sse = SseEvent::data(r#"{"index":0,"delta":{"type":"text_delta","text":"a"}}"#)
        .with_event("content_block_delta")
        .unwrap();
    let event = MessagesEvent::from_sse(&sse).unwrap();
    assert_eq!(event, text(0, "a"));
    // No `event:`: the data's type (the frame gains its `event:`).
    let sse = SseEvent::data(
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}"#,
    );
    let event = MessagesEvent::from_sse(&sse).unwrap();
    assert_eq!(event, text(0, "a"));
    assert_eq!(SseEvent::from(event).event(), Some("content_block_delta"));
}

#[test]
fn a_delta_of_a_type_not_known_is_kept_whole_and_never_merges() {
    let citation = json!({"type": "citations_delta", "citation": {"type": "char_location", "cited_text": "c"}});
    let broken = json!({"type": "text_delta", "text": 7});
    for unknown in [citation, broken, json!({"text": "a"})] {
        let event = delta(0, unknown.clone());
        let MessagesData::ContentBlockDelta(block) = event.data() else {
            panic!("a content_block_delta");
        };
        assert!(
            matches!(&block.delta, Delta::Unknown(fields) if Value::Object(fields.clone()) == unknown)
        );
        assert_eq!(json_of(&event)["delta"], unknown);
        assert_eq!(event.kind(), Kind::Visible);
        refused(&event, &event);
        refused(&text(0, "a"), &event);
        refused(&event, &text(0, "a"));
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let typed = |kind: &str, data: &str| {
        MessagesEvent::from_sse(&SseEvent::data(data).with_event(kind).unwrap())
    };
    assert!(matches!(
        MessagesEvent::from_sse(&SseEvent::retry(Duration::from_secs(1))),
        Err(ParseError::NoData)
    ));
    for (kind, data) in [
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0"#,
        ),
        ("content_block_delta", r#"{"index":0}"#),
        ("content_block_delta", r#"{"index":-1,"delta":{}}"#),
        ("message_start", r#"{"type":"message_start"}"#),
        ("error", r#"{"type":"error","error":{"message":"no type"}}"#),
        ("ping", "[]"),
        ("message_stop", "not json"),
    ] {
        let error = typed(kind, data).unwrap_err();
        assert!(
            matches!(&error, ParseError::Data { event, .. } if *event == kind),
            "{kind} {data}: {error}"
        );
        assert!(
            error
                .to_string()
                .starts_with(&format!("invalid `{kind}` event: "))
        );
        assert!(std::error::Error::source(&error).is_some());
    }
}

#[test]
fn end_and_error_frames() {
    // An error after a 200, exactly as Anthropic sends it.
    let wire = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let error = MessagesEvent::error("overloaded_error", "Overloaded");
    assert_eq!(&SseEvent::from(error.clone()).encode()[..], wire.as_bytes());
    let mut decoder = SseDecoder::new();
    let decoded = decoder.decode(&mut BytesMut::from(wire)).unwrap().unwrap();
    let read = MessagesEvent::from_sse(&decoded).unwrap();
    assert_eq!(read, error);
    let MessagesData::Error(frame) = read.data() else {
        panic!("an error frame");
    };
    assert_eq!(
        (frame.error.kind.as_str(), frame.error.message.as_str()),
        ("overloaded_error", "Overloaded")
    );
    assert!(read.data().is_end());
    assert_eq!(read.kind(), Kind::Control);
    assert_eq!(read.byte_len(), decoded.byte_len());

    let stop = MessagesEvent::new(MessagesData::message_stop()).with_id(9);
    assert!(stop.data().is_end());
    assert_eq!(
        &SseEvent::from(stop.clone()).encode()[..],
        b":control\nevent: message_stop\nid: 9\ndata: {\"type\":\"message_stop\"}\n\n"
    );
    // Neither takes in what follows, nor is taken in (a ping aside).
    for end in [error, stop] {
        refused(&end, &text(0, "a"));
        refused(&text(0, "a"), &end);
        refused(&end, &end);
        merged(&end, &ping());
    }
    for not_end in [ping(), text(0, "a"), message_delta(json!({}), json!({}))] {
        assert!(!not_end.data().is_end());
    }
}

#[test]
fn kinds() {
    let visible = [
        text(0, "a"),
        delta(1, json!({"type": "input_json_delta", "partial_json": "{"})),
        delta(0, json!({"type": "citations_delta", "citation": {}})),
    ];
    let hidden = [
        delta(2, json!({"type": "thinking_delta", "thinking": "hm"})),
        delta(2, json!({"type": "signature_delta", "signature": "s"})),
    ];
    let control = [
        event(json!({"type": "message_start", "message": {}})),
        event(
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        event(json!({"type": "content_block_stop", "index": 0})),
        message_delta(
            json!({"stop_reason": "end_turn"}),
            json!({"output_tokens": 1}),
        ),
        event(json!({"type": "message_stop"})),
        ping(),
        MessagesEvent::error("api_error", "boom"),
    ];
    for (events, kind) in [
        (&visible[..], Kind::Visible),
        (&hidden[..], Kind::Hidden),
        (&control[..], Kind::Control),
    ] {
        for event in events {
            assert_eq!(event.kind(), kind, "{event:?}");
            // A decoding hop reads the same kind off the wire.
            assert_eq!(SseEvent::from(event.clone()).kind(), kind, "{event:?}");
        }
    }
}

#[test]
fn deltas_of_one_block_and_one_type_concatenate() {
    let ab = merged(&text(0, "a\""), &text(0, "b\u{1F642}"));
    assert_eq!(json_of(&ab)["delta"]["text"], "a\"b\u{1F642}");
    let json = |piece: &str| {
        delta(
            1,
            json!({"type": "input_json_delta", "partial_json": piece}),
        )
    };
    let call = merged(&merged(&json("{\"a\""), &json(":")), &json("1}"));
    assert_eq!(json_of(&call)["delta"]["partial_json"], "{\"a\":1}");
    let thinking = |piece: &str| delta(2, json!({"type": "thinking_delta", "thinking": piece}));
    let thought = merged(&thinking("hm"), &thinking(" yes"));
    assert_eq!(json_of(&thought)["delta"]["thinking"], "hm yes");
    assert_eq!(thought.kind(), Kind::Hidden);
    // Merging keeps the later id.
    let mut with_ids = text(0, "a").with_id(1);
    with_ids.merge(text(0, "b").with_id(2)).unwrap();
    with_ids.merge(text(0, "c")).unwrap();
    assert_eq!(with_ids.id(), Some("2"));
}

#[test]
fn deltas_never_merge_across_blocks_types_or_signatures() {
    refused(&text(0, "a"), &text(1, "b"));
    let thinking = delta(0, json!({"type": "thinking_delta", "thinking": "a"}));
    refused(&text(0, "a"), &thinking);
    refused(&thinking, &text(0, "a"));
    let signature = |s: &str| delta(2, json!({"type": "signature_delta", "signature": s}));
    let thinking = delta(2, json!({"type": "thinking_delta", "thinking": "a"}));
    refused(&thinking, &signature("s"));
    refused(&signature("s"), &thinking);
    refused(&signature("s"), &signature("t"));
    let start = event(
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    );
    let stop = event(json!({"type": "content_block_stop", "index": 0}));
    for boundary in [&start, &stop] {
        refused(boundary, &text(0, "a"));
        refused(&text(0, "a"), boundary);
        refused(boundary, boundary);
    }
}

#[test]
fn unknown_fields_merge_only_when_they_lose_nothing() {
    let with = |event_extra: Value, delta_extra: Value| {
        let mut delta = json!({"type": "text_delta", "text": "a"});
        let mut data = json!({"type": "content_block_delta", "index": 0});
        delta
            .as_object_mut()
            .unwrap()
            .extend(delta_extra.as_object().unwrap().clone());
        data.as_object_mut()
            .unwrap()
            .extend(event_extra.as_object().unwrap().clone());
        data["delta"] = delta;
        event(data)
    };
    let none = json!({});
    // Equal at the event's level: metadata, kept once.
    let tagged = with(json!({"trace": "t"}), none.clone());
    assert_eq!(json_of(&merged(&tagged, &tagged))["trace"], "t");
    refused(&tagged, &with(json!({"trace": "u"}), none.clone()));
    refused(&tagged, &text(0, "a"));
    // In the delta, only empty values, equal where both have them.
    let empty = with(none.clone(), json!({"citations": []}));
    merged(&empty, &empty);
    merged(&empty, &text(0, "b"));
    merged(&text(0, "b"), &empty);
    refused(&empty, &with(none.clone(), json!({"citations": null})));
    let valued = with(none.clone(), json!({"citations": [1]}));
    refused(&valued, &valued);
    refused(&text(0, "a"), &valued);
}

#[test]
fn pings_are_absorbed_but_take_in_nothing() {
    let ab = merged(&merged(&text(0, "a"), &ping()), &text(0, "b"));
    assert_eq!(json_of(&ab)["delta"]["text"], "ab");
    let odd_ping = event(json!({"type": "ping", "server": {"load": 1}}));
    for before in [
        text(0, "a"),
        ping(),
        event(json!({"type": "content_block_stop", "index": 0})),
        event(json!({"type": "message_start", "message": {"id": "m"}})),
    ] {
        let after = merged(&before, &odd_ping);
        assert_eq!(after.data(), before.data(), "the ping is dropped");
    }
    refused(&ping(), &text(0, "a"));
    refused(
        &ping(),
        &message_delta(json!({}), json!({"output_tokens": 1})),
    );
}

#[test]
fn the_last_message_delta_stands() {
    let first = message_delta(
        json!({"stop_reason": null}),
        json!({"input_tokens": 3, "output_tokens": 5}),
    );
    let last = message_delta(
        json!({"stop_reason": "end_turn", "stop_sequence": null}),
        json!({"input_tokens": 3, "output_tokens": 9, "cache_read_input_tokens": 0}),
    );
    let both = merged(&first, &last);
    assert_eq!(both.data(), last.data());
    assert_eq!(json_of(&both)["usage"]["output_tokens"], 9);
    // A later one without a count the earlier had: the SDK keeps the earlier count, a client
    // that keeps the last message_delta does not; they stay two.
    let without_input = message_delta(
        json!({"stop_reason": "end_turn"}),
        json!({"output_tokens": 9}),
    );
    refused(&first, &without_input);
    let null_input = message_delta(
        json!({"stop_reason": "end_turn"}),
        json!({"input_tokens": null, "output_tokens": 9}),
    );
    refused(&first, &null_input);
    let details = message_delta(
        json!({"stop_details": {"type": "refusal"}}),
        json!({"output_tokens": 1}),
    );
    refused(
        &details,
        &message_delta(json!({}), json!({"output_tokens": 2})),
    );
    merged(
        &details,
        &message_delta(
            json!({"stop_details": {"type": "refusal", "x": 1}}),
            json!({"output_tokens": 2}),
        ),
    );
    refused(&first, &text(0, "a"));
    refused(&text(0, "a"), &first);
}

/// Random text, JSON escapes and multi-byte characters included; sometimes empty.
fn random_text(rng: &mut Rng) -> String {
    const PIECES: [&str; 8] = ["a", "Hel", "lo ", "\"", "\\", "\n", "é", "\u{1F642}"];
    (0..rng.below(4))
        .map(|_| PIECES[rng.below(PIECES.len() as u64) as usize])
        .collect()
}

/// The events of one block of a random stream: its start, deltas of its kind (a citation, a
/// stray delta of another type, odd unknown fields now and then; a thinking block's signature
/// last, twice at times), its stop.
fn block_script(rng: &mut Rng, index: u64) -> Vec<Value> {
    let kinds = [
        "text",
        "thinking",
        "tool_use",
        "server_tool_use",
        "web_search_tool_result",
        "mystery",
    ];
    let kind = kinds[rng.below(kinds.len() as u64) as usize];
    let block = match kind {
        "text" => json!({"type": "text", "text": ""}),
        "thinking" => json!({"type": "thinking", "thinking": "", "signature": ""}),
        "tool_use" | "server_tool_use" => {
            json!({"type": kind, "id": "toolu_1", "name": "f", "input": {}})
        }
        "web_search_tool_result" => {
            json!({"type": kind, "tool_use_id": "srvtoolu_1", "content": [{"url": "u"}]})
        }
        _ => json!({"type": kind, "x": 1}),
    };
    let tagged = rng.below(4) == 0;
    let with_extra = |rng: &mut Rng, mut data: Value| {
        if tagged {
            data["trace"] = json!("t");
        }
        match rng.below(24) {
            0 => data["delta"]["annotations"] = json!([]),
            1 => data["delta"]["annotations"] = json!(["a"]),
            2 => data["trace"] = json!("other"),
            _ => {}
        }
        data
    };
    let mut script =
        vec![json!({"type": "content_block_start", "index": index, "content_block": block})];
    let (delta_type, field) = match kind {
        "text" => ("text_delta", "text"),
        "thinking" => ("thinking_delta", "thinking"),
        "tool_use" | "server_tool_use" => ("input_json_delta", "partial_json"),
        _ => ("", ""),
    };
    if !delta_type.is_empty() {
        for _ in 0..rng.below(9) {
            let delta = match rng.below(16) {
                0 if kind == "text" => {
                    json!({"type": "citations_delta", "citation": {"cited_text": random_text(rng)}})
                }
                1 => json!({"type": "text_delta", "text": random_text(rng)}),
                _ => json!({"type": delta_type, field: random_text(rng)}),
            };
            let data = json!({"type": "content_block_delta", "index": index, "delta": delta});
            script.push(with_extra(rng, data));
        }
        if kind == "thinking" {
            for _ in 0..1 + rng.below(2) {
                let delta = json!({"type": "signature_delta", "signature": random_text(rng)});
                script.push(json!({"type": "content_block_delta", "index": index, "delta": delta}));
            }
        }
    }
    script.push(json!({"type": "content_block_stop", "index": index}));
    script
}

/// A random stream: `message_start`, blocks (two at once at times: servers do not, the SDK
/// allows it) with pings and unknown events between, one or two `message_delta`s (a later one
/// sometimes without a count the earlier had), and an end: `message_stop`, an `error`, or none.
fn random_stream(rng: &mut Rng) -> Vec<MessagesEvent> {
    let usage = json!({"input_tokens": 5, "output_tokens": 1, "cache_read_input_tokens": 0});
    let start = json!({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": null, "stop_sequence": null, "usage": usage}});
    let mut data = vec![start];
    let mut scripts: Vec<Vec<Value>> = (0..rng.below(5))
        .map(|index| block_script(rng, index))
        .collect();
    for script in &mut scripts {
        script.reverse();
    }
    let interleave = rng.below(4) == 0;
    let mut open = 0;
    while open < scripts.len() {
        // The next block starts only after this one did, so the blocks are in the message in
        // the order of their indexes, as the SDK counts them.
        let started = scripts[open]
            .last()
            .is_none_or(|next| next["type"] != "content_block_start");
        let pick = if interleave && started && open + 1 < scripts.len() && rng.below(3) == 0 {
            open + 1
        } else {
            open
        };
        match scripts[pick].pop() {
            Some(next) => data.push(next),
            None => open += 1,
        }
        match rng.below(12) {
            0 => data.push(json!({"type": "ping"})),
            1 => data.push(json!({"type": "agent.status", "x": random_text(rng)})),
            _ => {}
        }
    }
    let deltas = 1 + rng.below(2);
    for n in 0..deltas {
        let last = n + 1 == deltas;
        let mut usage = json!({"output_tokens": 10 + n});
        if !last || rng.below(3) != 0 {
            // Not message_start's count: a later delta without it must not stand alone.
            usage["input_tokens"] = json!(6);
        }
        let reason = if last { json!("end_turn") } else { Value::Null };
        data.push(json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null}, "usage": usage}));
    }
    match rng.below(8) {
        0 => data.push(json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
        1 => {}
        _ => data.push(json!({"type": "message_stop"})),
    }
    data.into_iter()
        .map(|data| {
            let kind = data["type"].as_str().unwrap().to_owned();
            let sse = SseEvent::data(data.to_string()).with_event(kind).unwrap();
            MessagesEvent::from_sse(&sse).unwrap()
        })
        .collect()
}

#[test]
fn coalesced_streams_accumulate_to_the_same_message() {
    let (mut before, mut after, mut raised) = (0, 0, 0);
    for seed in 1..=2000u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let stream = random_stream(&mut rng);
        let coalesced = coalesce(&mut rng, &stream);
        for event in &coalesced {
            check_round_trip(event);
        }
        let message = accumulate(&stream);
        assert_eq!(accumulate(&coalesced), message, "seed {seed}: {stream:#?}");
        let trace = message["trace"].as_array().unwrap();
        raised += usize::from(trace.last().is_some_and(|last| last[0] == "raised"));
        before += stream.len();
        after += coalesced.len();
    }
    assert!(
        after * 20 < before * 17,
        "some events merge: {after} events of {before}"
    );
    // Those that end in an `error` raise; the others the SDK reads to their end.
    assert!(raised < 400, "{raised} of 2000 streams raise in the SDK");
}

/// What a slow reader of a coalescing gate receives of `stream`.
async fn through_a_slow_reader(stream: &[MessagesEvent]) -> Vec<MessagesEvent> {
    coalescing::through_a_slow_reader(stream, |sse| MessagesEvent::from_sse(sse).unwrap()).await
}

#[tokio::test(start_paused = true)]
async fn a_slow_reader_of_a_coalescing_gate_gets_the_same_message() {
    let mut rng = Rng(11);
    let streams: Vec<_> = (0..20).map(|_| random_stream(&mut rng)).collect();
    let (mut sent, mut delivered) = (0, 0);
    for stream in streams {
        let received = through_a_slow_reader(&stream).await;
        assert_eq!(accumulate(&received), accumulate(&stream));
        (sent, delivered) = (sent + stream.len(), delivered + received.len());
    }
    assert!(delivered < sent, "{delivered} events of {sent} delivered");
}

/// `events` (type, data) as an upstream writes them.
fn wire(events: &[(&str, String)]) -> Vec<u8> {
    let mut wire = Vec::new();
    for (kind, data) in events {
        wire.extend_from_slice(format!("event: {kind}\ndata: {data}\n\n").as_bytes());
    }
    wire
}

fn message_start() -> Value {
    json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
        "role": "assistant", "model": "m", "content": [], "stop_reason": null,
        "stop_sequence": null, "usage": {"input_tokens": 3, "output_tokens": 1}}})
}

#[test]
fn hostile_input_costs_one_event_each_within_the_decoders_limits() {
    let huge = "a".repeat(10 << 20);
    let text_delta = |text: &str| {
        json!({"type": "content_block_delta", "index": 0,
               "delta": {"type": "text_delta", "text": text}})
        .to_string()
    };
    let unknown = r#"{"type":"agent.status", "state" : "busy"}"#.to_owned();
    let input = wire(&[
        ("message_start", message_start().to_string()),
        ("agent.status", unknown.clone()),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "text", "text": ""}})
            .to_string(),
        ),
        // Cut JSON, then a delta of 10 MB (one line, past the decoder's limits).
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_del"#.to_owned(),
        ),
        ("content_block_delta", text_delta(&huge)),
        ("content_block_delta", text_delta("b")),
        (
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#.to_owned(),
        ),
        ("message_stop", r#"{"type":"message_stop"}"#.to_owned()),
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
                Ok(sse) => match MessagesEvent::from_sse(&sse) {
                    Err(ParseError::Data {
                        event: "content_block_delta",
                        ..
                    }) => "invalid".to_owned(),
                    Err(error) => panic!("{error}"),
                    Ok(event) => {
                        if let MessagesData::Unknown(kept) = event.data() {
                            assert_eq!(kept.data(), unknown, "passed on as it came");
                            assert_eq!(SseEvent::from(event.clone()), sse);
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
                "message_start",
                "agent.status",
                "content_block_start",
                "invalid",
                "too long",
                "content_block_delta",
                "content_block_stop",
                "message_stop",
            ],
            "{piece}-byte reads"
        );
        // The stream goes on after each: the message holds the text that came whole.
        let message = accumulate(&read);
        assert_eq!(message["message"]["content"][0]["text"], "b");
    }
    // A gateway that admits such deltas reads one whole, and merges two.
    let big = SseEvent::data(text_delta(&huge))
        .with_event("content_block_delta")
        .unwrap();
    let mut merged = MessagesEvent::from_sse(&big).unwrap();
    merged
        .merge(MessagesEvent::from_sse(&big).unwrap())
        .unwrap();
    assert_eq!(merged.byte_len(), SseEvent::from(merged.clone()).byte_len());
    assert_eq!(merged.byte_len(), big.byte_len() + huge.len());
}

#[tokio::test(start_paused = true)]
async fn a_message_stop_before_any_block() {
    let stream = [
        event(message_start()),
        ping(),
        event(json!({"type": "message_stop"})),
    ];
    let empty = accumulate(&stream);
    assert_eq!(empty["message"]["content"], json!([]));
    assert_eq!(empty["trace"].as_array().unwrap().len(), 2, "{empty}");
    // Through a slow reader it stays a message_start and a message_stop.
    let received = through_a_slow_reader(&stream).await;
    assert_eq!(accumulate(&received), empty);
    assert!(received.last().unwrap().data().is_end());
    // Nothing after the end merges into it.
    refused(&stream[2], &text(0, "a"));
    // Before even a message_start it still reads and passes as it came (the SDK raises there:
    // the library keeps a stream's order, it does not judge it).
    let early = event(json!({"type": "message_stop"}));
    assert!(early.data().is_end());
    assert_eq!(accumulate([&early])["trace"], json!([["raised", null]]));
}
