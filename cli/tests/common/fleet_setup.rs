//! A proxy in front of a fleet, served in process for the fleet's and the failover's tests:
//! its flags or its `--config`, the requests a client sends it, and what the client read.

#![allow(dead_code)] // each test uses a part

use std::net::SocketAddr;
use std::path::PathBuf;

use serde_json::Value;
use streamgate_cli::proxy;

use crate::common::provider::Answer;
use crate::common::{BodyEnd, RawResponse, content, data, wait_for};
use crate::setup::{CHAT, args, serve_proxy};

/// A proxy with `flags`, served in process; its address.
pub fn start(flags: &[&str]) -> SocketAddr {
    let config = proxy::Config::parse_from(args(flags)).unwrap();
    serve_proxy(config, None).0
}

/// A proxy in front of `upstreams` (one pool of replicas) with `flags`.
pub fn replicas(upstreams: &[&str], flags: &[&str]) -> SocketAddr {
    let mut all = Vec::new();
    for upstream in upstreams {
        all.extend(["--upstream", upstream]);
    }
    all.extend_from_slice(flags);
    start(&all)
}

/// `text` in a file of its own in the temp dir (left there: the temp dir is the machine's).
pub fn file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("fleet-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

/// A proxy with the fleet `toml` describes (`--config`) and `flags`.
pub fn configured(name: &str, toml: &str, flags: &[&str]) -> SocketAddr {
    let path = file(&format!("{name}.toml"), toml);
    let mut all = vec!["--config", path.to_str().unwrap()];
    all.extend_from_slice(flags);
    start(&all)
}

/// A chat completion request for `model` and `max_tokens` tokens, streamed or not.
pub fn chat(model: &str, max_tokens: u64, streamed: bool) -> String {
    format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}],"stream":{streamed},"max_tokens":{max_tokens}}}"#
    )
}

/// A streamed chat completion of `model` through the proxy.
pub async fn stream(proxy: SocketAddr, model: &str, max_tokens: u64) -> RawResponse {
    RawResponse::post(proxy, CHAT, "", &chat(model, max_tokens, true)).await
}

/// What a client read of a whole stream.
pub struct Read {
    pub status: u16,
    pub frames: Vec<String>,
}

impl Read {
    /// The text its chunks carry.
    pub fn text(&self) -> String {
        self.frames.iter().filter_map(|f| content(f)).collect()
    }

    /// Its events' JSON (not `[DONE]`, not heartbeats).
    pub fn chunks(&self) -> Vec<Value> {
        self.frames
            .iter()
            .filter_map(|frame| data(frame))
            .filter(|data| *data != "[DONE]")
            .map(|data| serde_json::from_str(data).expect("every event the client gets is JSON"))
            .collect()
    }

    /// A whole answer of `tokens` tokens: 200, every token's text once, no error frame
    /// anywhere, and `[DONE]` last.
    pub fn assert_whole_text(&self, tokens: u64) {
        assert_eq!(self.status, 200, "{:?}", self.frames);
        assert_eq!(self.text(), Answer::text(tokens), "{:?}", self.frames);
        assert_eq!(self.error(), None, "{:?}", self.frames);
        let chunks = self.chunks();
        assert!(
            chunks.iter().all(|chunk| chunk.get("error").is_none()),
            "{:?}",
            self.frames
        );
        assert_eq!(
            self.frames.last().and_then(|f| data(f)),
            Some("[DONE]"),
            "{:?}",
            self.frames
        );
    }

    /// A whole answer of `tokens` tokens from `model`: [`assert_whole_text`], every chunk
    /// naming `model`, and the final chunk's `finish_reason` and usage.
    ///
    /// [`assert_whole_text`]: Read::assert_whole_text
    pub fn assert_whole(&self, model: &str, tokens: u64) {
        self.assert_whole_text(tokens);
        let chunks = self.chunks();
        assert!(
            chunks.iter().all(|chunk| chunk["model"] == model),
            "{chunks:?}"
        );
        let last = chunks.last().expect("a final chunk");
        assert_eq!(last["choices"][0]["finish_reason"], "stop", "{chunks:?}");
        assert_eq!(last["usage"]["completion_tokens"], tokens, "{chunks:?}");
    }

    /// The message of the stream's error event (`event: error`), if it ended with one.
    pub fn error(&self) -> Option<String> {
        let frame = self.frames.iter().find(|f| f.starts_with("event: error"))?;
        let error: Value = serde_json::from_str(data(frame)?).ok()?;
        Some(error["error"]["message"].as_str()?.to_owned())
    }
}

/// Reads `response` to its end.
pub async fn read(mut response: RawResponse) -> Read {
    let status = response.status();
    let frames = if status == 200 {
        let frames = response.rest().await;
        assert_eq!(response.ended(), Some(BodyEnd::Complete), "{frames:?}");
        frames
    } else {
        vec![response.text().await]
    };
    Read { status, frames }
}

/// The upstream of `url` in `/stats`' `upstreams`.
pub fn upstream<'a>(stats: &'a Value, url: &str) -> &'a Value {
    let prefix = url.trim_end_matches('/');
    stats["upstreams"]
        .as_array()
        .expect("upstreams")
        .iter()
        .find(|u| u["url"].as_str().unwrap().starts_with(prefix))
        .unwrap_or_else(|| panic!("no upstream {url} in {stats}"))
}

/// The proxy's stats once every stream has ended and every upstream's lease with it.
pub async fn all_ended(proxy: SocketAddr) -> Value {
    wait_for(proxy, "every stream and its leases end", |s| {
        s["streams_running"] == 0
            && s["upstreams"]
                .as_array()
                .unwrap()
                .iter()
                .all(|u| u["in_flight"] == 0)
    })
    .await
}
