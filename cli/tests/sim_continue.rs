//! The reference server continues a final assistant message, over real sockets: given the first
//! k tokens of its deterministic text it streams from token k (events from 0, no role chunk),
//! any other text from token 0, `max_tokens` counting the new tokens; with `--no-prefill` it
//! refuses such a request as some hosted models do.

mod common;

use std::net::SocketAddr;

use common::reference::start;
use common::resume_client::{parse, salts};
use common::{RawResponse, stats, wait_for};
use serde_json::{Value, json};

/// A chat body whose messages end with the assistant's `prefix` (none: with the user's).
fn body(prefix: Option<&str>, flag: Option<bool>, stream: bool, max_tokens: u64) -> String {
    let mut messages = vec![json!({"role": "user", "content": "count"})];
    if let Some(prefix) = prefix {
        messages.push(json!({"role": "assistant", "content": prefix}));
    }
    let mut body = json!({
        "model": "sim",
        "messages": messages,
        "stream": stream,
        "max_tokens": max_tokens,
    });
    if let Some(flag) = flag {
        body["continue_final_message"] = flag.into();
    }
    body.to_string()
}

/// A streamed answer to `body`: every event's (id, text), and the raw frames.
async fn streamed(addr: SocketAddr, body: &str) -> (Vec<(u64, String)>, Vec<String>) {
    let mut response = RawResponse::post_json(addr, "/v1/chat/completions", body).await;
    assert_eq!(response.status(), 200, "{body}");
    let frames: Vec<String> = response
        .rest()
        .await
        .into_iter()
        .filter(|frame| common::data(frame).is_some())
        .collect();
    (frames.iter().map(|f| parse(f)).collect(), frames)
}

/// A whole answer to `body`, as JSON.
async fn whole(addr: SocketAddr, body: &str) -> Value {
    let mut response = RawResponse::post_json(addr, "/v1/chat/completions", body).await;
    assert_eq!(response.status(), 200, "{body}");
    serde_json::from_str(&response.text().await).unwrap()
}

/// The texts of tokens `range`.
fn tokens(range: std::ops::Range<u64>) -> Vec<String> {
    range.map(|i| format!("t{i} ")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_assistant_message_continues_from_the_token_after_it() {
    let addr = start(&["--step-ms", "0"]);
    // With `continue_final_message`, and without it (as llama.cpp continues).
    for flag in [Some(true), None, Some(false)] {
        let (events, frames) = streamed(addr, &body(Some("t0 t1 t2 "), flag, true, 4)).await;
        let texts: Vec<String> = events[..4].iter().map(|e| e.1.clone()).collect();
        assert_eq!(texts, tokens(3..7), "{flag:?}: from t3");
        let ids: Vec<u64> = events.iter().map(|e| e.0).collect();
        assert_eq!(ids, [0, 1, 2, 3, 4, 5], "{flag:?}: the new stream's ids");
        assert_eq!(events[4].1, "finish:length");
        assert_eq!(events[5].1, "[DONE]");
        assert!(
            frames.iter().all(|f| !f.contains("\"role\"")),
            "no role chunk: {frames:?}"
        );
        // The whole answer is the new text, and its usage counts the new tokens.
        let answer = whole(addr, &body(Some("t0 t1 t2 "), flag, false, 4)).await;
        assert_eq!(answer["choices"][0]["message"]["content"], "t3 t4 t5 t6 ");
        assert_eq!(answer["usage"]["completion_tokens"], 4, "{answer}");
    }
    // Any other text continues from token 0, still with no role chunk.
    for other in ["Once upon a time", "t0 t1 t2", "t1 t2 ", ""] {
        let (events, frames) = streamed(addr, &body(Some(other), Some(true), true, 2)).await;
        assert_eq!(events[0], (0, "t0 ".to_owned()), "{other:?}");
        assert_eq!(events[1], (1, "t1 ".to_owned()), "{other:?}");
        assert!(!frames[0].contains("\"role\""), "{other:?}: {}", frames[0]);
    }
    // A new answer still names its author first.
    let (_, frames) = streamed(addr, &body(None, None, true, 2)).await;
    assert!(frames[0].contains(r#""role":"assistant""#), "{}", frames[0]);
    let stats = wait_for(addr, "every answer completes", |s| {
        s["generators_running"] == 0
    })
    .await;
    assert_eq!(
        stats["tokens_generated"],
        3 * 8 + 4 * 2 + 2,
        "only new tokens: {stats}"
    );
}

/// `max_tokens` counts the new tokens: a continuation from token 20 on a pool that serves 16
/// tokens a request gets t20 to t35.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_and_the_kv_pool_count_the_new_tokens() {
    let addr = start(&["--step-ms", "0", "--kv-blocks", "1"]);
    let prefix: String = tokens(0..20).concat();
    let (events, _) = streamed(addr, &body(Some(&prefix), Some(true), true, 100)).await;
    let texts: Vec<&str> = events[..16].iter().map(|e| e.1.as_str()).collect();
    assert_eq!(texts, tokens(20..36));
    assert_eq!(events[16], (16, "finish:length".to_owned()));
    assert_eq!(events.len(), 18, "{events:?}");
}

/// With `--token-salt`, the salted text of a stream's first tokens continues with the same
/// salt: the answer reads as one generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_salted_prefix_continues_with_its_salt() {
    let addr = start(&["--step-ms", "0", "--token-salt"]);
    let (first, _) = streamed(addr, &body(None, None, true, 3)).await;
    let prefix: String = first[..3].iter().map(|e| e.1.as_str()).collect();
    let salt = first[0].1.trim().strip_prefix("t0.").unwrap().to_owned();
    let (next, _) = streamed(addr, &body(Some(&prefix), Some(true), true, 3)).await;
    assert_eq!(next[0], (0, format!("t3.{salt} ")), "{next:?}");
    let mut all = first[..3].to_vec();
    all.extend_from_slice(&next[..3]);
    assert_eq!(salts(&all), 1, "{all:?}");
    // The unsalted text is another answer's: from token 0, with a salt of its own.
    let (other, _) = streamed(addr, &body(Some("t0 t1 "), Some(true), true, 1)).await;
    assert!(other[0].1.starts_with("t0."), "{other:?}");
    assert_ne!(other[0].1, first[0].1, "{other:?}");
}

/// `--no-prefill` refuses a final assistant message, with or without the flag, streamed or
/// not: 400, an OpenAI-style `invalid_request_error` that says prefill, and no work started.
/// A request that ends with the user's message is served. `continue_final_message` with no
/// assistant message to continue, or that is no boolean, is refused either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_prefill_refuses_a_final_assistant_message() {
    let refused = |addr, body: String| async move {
        let mut response = RawResponse::post_json(addr, "/v1/chat/completions", &body).await;
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = serde_json::from_str(&response.text().await).unwrap();
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
        error["error"]["message"].as_str().unwrap().to_owned()
    };
    let addr = start(&["--step-ms", "0", "--no-prefill"]);
    for flag in [Some(true), None] {
        for stream in [true, false] {
            let message = refused(addr, body(Some("t0 "), flag, stream, 3)).await;
            assert!(message.contains("prefill"), "{message}");
        }
    }
    assert_eq!(stats(addr).await["streams_started"], 0);
    let (events, _) = streamed(addr, &body(None, None, true, 2)).await;
    assert_eq!(events[0].1, "t0 ");

    let addr = start(&["--step-ms", "0"]);
    let message = refused(addr, body(None, Some(true), true, 3)).await;
    assert!(message.contains("assistant"), "{message}");
    let not_a_flag = body(Some("t0 "), None, true, 3).replace(
        "\"max_tokens\"",
        "\"continue_final_message\":\"yes\",\"max_tokens\"",
    );
    let message = refused(addr, not_a_flag).await;
    assert!(message.contains("boolean"), "{message}");
    assert_eq!(stats(addr).await["streams_started"], 0);
}
