//! A client of the reference server's resumable streams: starts a stream, reads its events
//! parsed, resumes it.

use std::net::SocketAddr;

use serde_json::Value;

use super::{LONG, RawResponse};

/// A streaming chat request body for `max_tokens` tokens.
pub fn chat(max_tokens: u64) -> String {
    format!(
        r#"{{"model":"sim","messages":[{{"role":"user","content":"hi"}}],"stream":true,"max_tokens":{max_tokens}}}"#
    )
}

/// An event's (id, content or `[DONE]` or the finish reason).
pub fn parse(frame: &str) -> (u64, String) {
    let id = frame
        .lines()
        .find_map(|line| line.strip_prefix("id: "))
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("an id: {frame:?}"));
    let data = frame
        .lines()
        .find_map(|line| line.strip_prefix("data: "))
        .unwrap_or_else(|| panic!("data: {frame:?}"));
    if data == "[DONE]" {
        return (id, data.to_owned());
    }
    let chunk: Value = serde_json::from_str(data).expect("JSON");
    let choice = &chunk["choices"][0];
    match choice["delta"]["content"].as_str() {
        Some(text) => (id, text.to_owned()),
        None => (
            id,
            format!("finish:{}", choice["finish_reason"].as_str().unwrap()),
        ),
    }
}

/// `n` events of `response`, parsed.
pub async fn events(response: &mut RawResponse, n: usize) -> Vec<(u64, String)> {
    let mut events = Vec::new();
    for _ in 0..n {
        events.push(parse(&response.expect_frame().await));
    }
    events
}

/// The rest of `response`, parsed (heartbeats, frames without data, skipped).
pub async fn rest(response: &mut RawResponse) -> Vec<(u64, String)> {
    let frames = response.rest().await;
    frames
        .iter()
        .filter(|f| f.lines().any(|line| line.starts_with("data:")))
        .map(|f| parse(f))
        .collect()
}

/// Starts a stream at `addr`: its response and its name.
pub async fn post_stream(addr: SocketAddr, max_tokens: u64) -> (RawResponse, String) {
    let response = RawResponse::post_json(addr, "/v1/chat/completions", &chat(max_tokens)).await;
    assert_eq!(response.status(), 200);
    let name = response.header("x-request-id").expect("the stream's name");
    (response, name)
}

/// The path that resumes the stream `name`.
pub fn resume_path(name: &str) -> String {
    format!("/v1/chat/completions/{name}/stream")
}

/// A stream started through `generating` and read by a second client through `other` (the
/// same server, or another instance): an explicit stop through `other` ends both clients with a
/// final chunk (`finish_reason` `stop`) and `[DONE]`, and frees the generator and its KV blocks
/// on `generating`; an unknown name is 404.
pub async fn a_stop_reaches_both_clients(generating: SocketAddr, other: SocketAddr) {
    let (mut first, name) = post_stream(generating, LONG).await;
    events(&mut first, 2).await;
    let mut second = RawResponse::get(other, &resume_path(&name), "").await;
    events(&mut second, 2).await;
    let path = format!("/v1/chat/completions/{name}/cancel");
    let mut stopped = RawResponse::post_json(other, &path, "").await;
    assert_eq!(stopped.status(), 200);
    assert!(stopped.text().await.contains("\"cancelled\":true"));
    for client in [&mut first, &mut second] {
        let tail = rest(client).await;
        let n = tail.len();
        assert!(n >= 2, "{tail:?}");
        assert_eq!(tail[n - 2].1, "finish:stop");
        assert_eq!(tail[n - 1].1, "[DONE]");
    }
    let stats = super::wait_for(generating, "the generator stops", |s| {
        s["generators_running"] == 0
    })
    .await;
    assert_eq!(stats["kv_blocks_in_use"], 0);
    let unknown = RawResponse::post_json(other, "/v1/chat/completions/nope/cancel", "").await;
    assert_eq!(unknown.status(), 404);
}

/// How many different salts the tokens of `events` carry (`--token-salt`): one for a single
/// generation, more for a regenerated stream. Events without a salt (the final chunk, `[DONE]`)
/// are not counted.
pub fn salts(events: &[(u64, String)]) -> usize {
    let salts: std::collections::HashSet<&str> = events
        .iter()
        .filter_map(|(_, text)| text.split('.').nth(1))
        .collect();
    salts.len()
}
