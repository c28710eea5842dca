//! The reference server: an OpenAI-compatible streaming endpoint backed by a simulated inference
//! worker, wrapped in the crate's combinators. Its interface (flags, endpoints, `/stats`) is
//! described in `examples/README.md`, under "The reference server", and kept exactly: acceptance
//! checks drive it with real clients.
//!
//! ```text
//! streamgate sim --addr 127.0.0.1:0 [flags]
//! cargo run --release --example serve -- --addr 127.0.0.1:0 [flags]    # the same, from the repo
//! ```
//!
//! The worker decodes one token every `--step-ms` (token i's text is `"t{i} "`), optionally
//! stalls before token `--stall-at` for `--stall-ms`, and holds one KV block per 16 tokens from a
//! pool of `--kv-blocks`, freed by the gate's release hook on every end. A request whose
//! `max_tokens` needs more blocks than the whole pool is served as many tokens as the pool
//! holds, ending with `finish_reason` `length` (as a real server's context fills); one that
//! finds every block held by other streams is refused with 503 ("KV cache full"); a stream that
//! runs out of blocks mid-generation gives its blocks back, gets an OpenAI-style error event
//! naming the exhausted pool, then the gate's terminal frame, and is counted in
//! `streams_failed` and `streams_kv_exhausted`, not `streams_cancelled`. Events cross a gate
//! (`--buffer-events`, `--buffer-bytes`, `--policy`, `--slow-deadline-ms`) into a
//! `resume::Registry` (`--resume-grace-ms`, `--replay-bytes`), in memory or, with
//! `--resume-store redis://HOST:PORT`, in Redis, so other instances serve resumes from it; each
//! client reads at its own position, and an explicit stop (`POST .../cancel`) ends the
//! generation with a final chunk. They are encoded as SSE with heartbeats (`--heartbeat-ms`) and
//! written one HTTP chunk per event on sockets with `TCP_NODELAY`, a backlog of 1024, the
//! listener's default `TCP_NOTSENT_LOWAT` and `TCP_USER_TIMEOUT` (`--notsent-lowat`,
//! `--user-timeout-ms`; 0 leaves the system's) and an optional `--sndbuf`, behind the
//! listener's protections (`--header-timeout-ms`, `--idle-timeout-ms`, `--max-connections`,
//! as the proxy's). Probes: `worker.decode`, `worker.publish`, `worker.write` and, over
//! HTTP/1.1, `worker.sent` (when each event's bytes left the kernel); `--hop-records FILE`
//! writes their hop records.
//!
//! # What goes where
//!
//! ```text
//! handlers --> stream (an SSE response) --> generation (the decode loop) --> kv (the pool)
//!     \___________ each reads state (config, counters, probes, store) _________/
//! generation --> delta (what the worker hands the gate) --> meta (id, model, token text)
//! ```
//!
//! - `config`: the flags ([`Config`]).
//! - `state`: the server's state ([`Sim`]), and a new generation's metadata.
//! - `kv`: the KV pool, the blocks one generation holds (given back however it ends), and the
//!   answer when the pool is full.
//! - `meta`, `delta`: what a stream is about, and the chunks the worker hands the gate, encoded
//!   with `openai::ChunkTemplate` straight into the event's buffer.
//! - `generation`: one generation behind its gate, from its first KV block to its release.
//! - `stream`, `connection`: a generation's frames as a client's SSE response.
//! - `handlers`, `stats`: the endpoints, and the counters `GET /stats` reports.
//! - `app`: the listener and the router; [`run`] until a signal.

mod answer;
mod app;
mod config;
mod connection;
mod delta;
mod generation;
mod handlers;
mod kv;
mod meta;
mod request;
mod state;
mod stats;
mod stream;

pub use self::app::{app, run};
pub use self::config::Config;
pub use self::state::Sim;
