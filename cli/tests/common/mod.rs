//! What the command's tests share: the library tests' raw HTTP/1.1 client over a real TCP
//! socket (it sees exactly the bytes and the chunking the server sends, and can stop reading or
//! vanish whenever a test says), the reference server served in process ([`reference`]) and a
//! client of its resumable streams ([`resume_client`]); for the proxy in front of a fleet, a
//! fake provider that fails as providers fail ([`provider`]), TLS made at test time ([`tls`])
//! and the reference server as a process to kill and restart ([`replica`]).

#![allow(dead_code)] // each test binary uses a part

pub mod provider;
pub mod reference;
pub mod replica;
pub mod resume_client;
pub mod tls;

#[path = "../../../tests/common/deaf.rs"]
pub mod deaf;
#[path = "../../../tests/common/raw.rs"]
mod raw;
#[path = "../../../tests/common/redis_server.rs"]
pub mod redis_server;

pub use raw::*;

/// `max_tokens` of a stream that outlasts any test: the most the default KV pool (4096 blocks
/// of 16 tokens) serves one request (a larger one is served as many).
pub const LONG: u64 = 65_536;
