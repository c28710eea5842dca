//! The serving code a worker sits behind: streaming endpoints in three APIs (OpenAI chat
//! completions, Anthropic Messages, OpenAI Responses) wrapped in the crate's combinators, for
//! any decode loop that implements [`Worker`]: sim's simulated one ([`crate::sim`], whose
//! interface `examples/README.md` describes under "The reference server") or a real engine.
//!
//! `POST /v1/chat/completions`, `POST /v1/messages` and `POST /v1/responses` answer with the
//! worker's text, ids, resume and continuation, each in its API's events (encoded with the
//! library's `openai`, `anthropic` and `responses` types) and error shape: chat chunks and
//! `[DONE]`; `message_start`, a text block's start, one `text_delta` per run of text, its
//! stop, `message_delta` and `message_stop`; `response.created`, an item and a part added, one
//! `output_text.delta` per run, the text, part and item done and `response.completed`, each
//! event's `sequence_number` its id. Every event's `id:` is its position in its stream. A
//! stream resumes at `GET /v1/chat/completions/{id}/stream` or `GET /v1/messages/{id}/stream`
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
//! Events cross a gate (`--buffer-events`, `--buffer-bytes`, `--policy`, `--slow-deadline-ms`)
//! into a `resume::Registry` (`--resume-grace-ms`, `--replay-bytes`), in memory or, with
//! `--resume-store redis://HOST:PORT`, in Redis, so other instances serve resumes from it; each
//! client reads at its own position, and an explicit stop (`POST .../cancel`) ends the
//! generation with its final events. They are encoded as SSE with heartbeats
//! (`--heartbeat-ms`) and written one HTTP chunk per event on sockets with `TCP_NODELAY`, a
//! backlog of 1024, the listener's default `TCP_NOTSENT_LOWAT` and `TCP_USER_TIMEOUT`
//! (`--notsent-lowat`, `--user-timeout-ms`; 0 leaves the system's) and an optional `--sndbuf`,
//! behind the listener's protections (`--header-timeout-ms`, `--idle-timeout-ms`,
//! `--max-connections`, as the proxy's). Probes: `worker.decode` and `worker.publish` (the
//! worker's), `worker.write` and, over HTTP/1.1, `worker.sent` (when each event's bytes left
//! the kernel); `--hop-records FILE` writes their hop records.
//!
//! # What goes where
//!
//! ```text
//! handlers --> request (the body) --> worker (a Job) --> the worker's decode loop
//! handlers --> stream (an SSE response) | answer (one body) --> worker.start
//!     \______________ each reads state (flags, worker, ids, probes, store, host) ______________/
//! the worker --> host (its gates, hops, counters) --> hops; delta (what it hands the gate: text, frames, an error)
//! delta --> text | messages | responses (the other APIs' events) --> meta
//! answer --> messages | responses (their whole answers)
//! each of them --> format (the API, why a generation ended)
//! ```
//!
//! - `config`: the flags every server on this code takes ([`ServeFlags`]).
//! - `format`: the three APIs, why a generation ended and what its last events report.
//! - `request`: a body of any API read and checked: its conversation, sampling and bound.
//! - `worker`: the decode loop's side ([`Worker`]) and what it is given ([`Job`]);
//!   `refusal`: what it answers when it cannot start one.
//! - `state`: the server's state ([`Server`]), and a new generation's metadata and id;
//!   `host`: what the worker's generations get from it ([`Host`]: their gates, hops and
//!   token counts); `hops`: the worker's hops.
//! - `meta`, `text`, `delta`: what a stream is about, a run of its text (numbered tokens or
//!   decoded text), and the chunks a worker hands the gate (text, the events around it, an
//!   error): a chat chunk encoded with `openai::ChunkTemplate` straight into the event's
//!   buffer; `messages`, `responses`: the other APIs' events and whole answers.
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
mod handlers;
mod hops;
mod host;
mod messages;
mod meta;
mod refusal;
mod request;
mod responses;
mod state;
mod stats;
mod stream;
pub mod text;
mod worker;

pub use self::app::{app, run};
pub use self::config::ServeFlags;
pub use self::delta::{Delta, Frame};
pub use self::format::{Ending, FinishReason, Format};
pub use self::hops::Hops;
pub use self::host::Host;
pub use self::meta::Meta;
pub use self::refusal::Refusal;
pub use self::request::{DEFAULT_MAX_TOKENS, Request, Role, Sampling, Turn};
pub use self::state::Server;
pub use self::text::Text;
pub use self::worker::{Job, Worker};
