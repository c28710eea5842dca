//! The reference server: streaming endpoints in three APIs (OpenAI chat completions, Anthropic
//! Messages, OpenAI Responses) backed by a simulated inference worker, wrapped in the crate's
//! combinators. Its interface (flags, endpoints, `/stats`) is described in `examples/README.md`,
//! under "The reference server", and kept exactly: acceptance checks drive it with real clients.
//!
//! ```text
//! streamgate sim --addr 127.0.0.1:0 [flags]
//! cargo run --release --example serve -- --addr 127.0.0.1:0 [flags]    # the same, from the repo
//! ```
//!
//! `POST /v1/chat/completions`, `POST /v1/messages` and `POST /v1/responses` answer with the same
//! tokens, ids, faults, resume and continuation, each in its API's events (encoded with the
//! library's `openai`, `anthropic` and `responses` types) and error shape: chat chunks and
//! `[DONE]`; `message_start`, a text block's start, one `text_delta` per token, its stop,
//! `message_delta` and `message_stop`; `response.created`, an item and a part added, one
//! `output_text.delta` per token, the text, part and item done and `response.completed`, each
//! event's `sequence_number` its id. Every event's `id:` is its position in its stream. A stream
//! resumes at `GET /v1/chat/completions/{id}/stream` or `GET /v1/messages/{id}/stream`
//! (`Last-Event-ID` or `?after=`) and at `GET /v1/responses/{id}?stream=true&starting_after=N`,
//! and stops at `POST .../{id}/cancel` under any of the three.
//!
//! One id names each stream everywhere (the response's `x-request-id`, the resume and cancel
//! paths, every hop record, a Responses stream's response `id`): the client's `x-request-id`
//! when it is valid (1 to 128 bytes of `[A-Za-z0-9._:-]`), else an unguessable one of the
//! server's (`chatcmpl-`, `msg_` or `resp_` and 32 hex digits, also the chunks' or the
//! message's `id`). Each request claims its id in the registry before any work starts,
//! so a second one under the id of a running or retained stream is a 409.
//!
//! The worker decodes one token every `--step-ms` (token i's text is `"t{i} "`), optionally
//! stalls before token `--stall-at` for `--stall-ms` (each flag needs the other), and holds one
//! KV block per 16 new tokens from a pool of `--kv-blocks` (at least 1), freed by the gate's
//! release hook on every end. A request whose last message is the assistant's continues it
//! (with `continue_final_message: true` or without, as llama.cpp does): from token k when the
//! message is the text's first k tokens (salted with `--token-salt`, whose salt it keeps), else
//! from 0, as a new stream (events from 0, no role chunk) of `max_tokens` new tokens;
//! `--no-prefill` refuses it with a 400 that mentions prefill. `--die-after N` kills the process
//! (SIGKILL to itself) once a generation has made N tokens, for failover tests.
//!
//! A request whose `max_tokens` needs more blocks than the whole pool is served as many tokens as the pool
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
//! handlers --> request (the body) --> meta (id, model, token text)
//! handlers --> stream (an SSE response) | answer (one body) --> generation (the decode loop) --> kv (the pool)
//!     \______________ each reads state (config, ids, counters, probes, store) ______________/
//! generation --> delta (what the worker hands the gate) --> messages | responses (the other APIs' events) --> meta
//! answer --> messages | responses (their whole answers)
//! each of them --> format (the API, why a generation ended)
//! ```
//!
//! - `config`: the flags ([`Config`]).
//! - `format`: the three APIs, why a generation ended and what its last events report.
//! - `request`: a body of any API read and checked, and where its answer starts (a
//!   continuation).
//! - `state`: the server's state ([`Sim`]), and a new generation's metadata and id.
//! - `kv`: the KV pool, the blocks one generation holds (given back however it ends), and the
//!   answer when the pool is full.
//! - `meta`, `delta`: what a stream is about (its API, and which text is its first tokens), and
//!   the chunks the worker hands the gate (tokens, the events around them, an error): a chat
//!   chunk encoded with `openai::ChunkTemplate` straight into the event's buffer;
//!   `messages`, `responses`: the other APIs' events and whole answers.
//! - `generation`: one generation behind its gate (the tokens it makes, its first event id),
//!   from its first KV block to its release, or to the process's death with `--die-after`.
//! - `stream`, `connection`: claiming a stream's id, and a generation's frames as a client's
//!   SSE response; `answer`: a whole generation as one body (`chat.completion`, message,
//!   response).
//! - `handlers`, `stats`: the endpoints, and the counters `GET /stats` reports.
//! - `app`: the listener and the router; [`run`] until a signal.

mod answer;
mod app;
mod config;
mod connection;
mod delta;
mod format;
mod generation;
mod handlers;
mod kv;
mod messages;
mod meta;
mod request;
mod responses;
mod state;
mod stats;
mod stream;

pub use self::app::{app, run};
pub use self::config::Config;
pub use self::meta::answer_text;
pub use self::state::Sim;
