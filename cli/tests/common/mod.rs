//! What the command's tests share: the library tests' raw HTTP/1.1 client over a real TCP
//! socket (it sees exactly the bytes and the chunking the server sends, and can stop reading or
//! vanish whenever a test says), the reference server served in process ([`reference`]) and a
//! client of its resumable streams ([`resume_client`]), the SDK scripts several tests run
//! ([`sdk_runs`]), a reader of its Messages and Responses streams ([`formats`]) and of its hop
//! records; for the proxy in front of a fleet, a fake
//! provider that fails as providers fail ([`provider`]), TLS made at test time ([`tls`]) and
//! the reference server as a process to kill and restart ([`replica`]).

#![allow(dead_code)] // each test binary uses a part

pub mod chromium;
pub mod formats;
pub mod provider;
pub mod python;
pub mod reference;
pub mod replica;
pub mod resume_client;
pub mod sdk_runs;
pub mod tls;

#[path = "../../../tests/common/deaf.rs"]
pub mod deaf;
#[path = "../../../tests/common/raw.rs"]
mod raw;
#[path = "../../../tests/common/redis_server.rs"]
pub mod redis_server;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

pub use raw::*;

/// The `(hop, seq)` pairs of hop records, by request id.
pub type Records = BTreeMap<String, BTreeSet<(String, u64)>>;

/// `max_tokens` of a stream that outlasts any test: the most the default KV pool (4096 blocks
/// of 16 tokens) serves one request (a larger one is served as many).
pub const LONG: u64 = 65_536;

/// sim's flags for a pool that runs out: 3 KV blocks of 16 tokens, every stream stalled for a
/// minute at token 20 (see [`hold_two_kv_blocks`]).
pub const STARVED_KV: [&str; 8] = [
    "--step-ms",
    "1",
    "--kv-blocks",
    "3",
    "--stall-at",
    "20",
    "--stall-ms",
    "60000",
];

/// A chat stream on the sim at `addr` (run with [`STARVED_KV`]) that holds two of its three
/// KV blocks, stalled at token 20: the next stream takes the third and runs out at token 16.
/// The blocks are held while the returned response lives.
pub async fn hold_two_kv_blocks(addr: std::net::SocketAddr) -> RawResponse {
    let chat = r#"{"model":"sim","stream":true,"max_tokens":48,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut holder = RawResponse::post(addr, "/v1/chat/completions", "", chat).await;
    for _ in 0..20 {
        holder.expect_frame().await;
    }
    wait_for(addr, "two blocks held", |s| s["kv_blocks_in_use"] == 2).await;
    holder
}

/// The `(hop, seq)` pairs of the hop records in `file` for each request id, once every hop of
/// `ids` has recorded `done` (the writer thread appends them as it goes).
pub async fn records_by_request(
    file: &Path,
    ids: &[&str],
    done: impl Fn(&Records) -> bool,
) -> Records {
    let deadline = Instant::now() + HANG;
    loop {
        let mut by_request = Records::new();
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in text.lines() {
            let record: serde_json::Value = serde_json::from_str(line).expect("a JSON hop record");
            let Some(seq) = record["seq"].as_u64().filter(|_| record["kind"] != "end") else {
                continue; // a stream's end
            };
            let request = record["request"].as_str().unwrap().to_owned();
            let hop = record["hop"].as_str().unwrap().to_owned();
            by_request.entry(request).or_default().insert((hop, seq));
        }
        if done(&by_request) {
            return by_request;
        }
        assert!(
            Instant::now() < deadline,
            "hop records of {ids:?}: {:?}",
            by_request.keys().collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
