//! `streamgate proxy`: a drop-in proxy in front of any OpenAI-compatible server (vLLM, SGLang,
//! llama.cpp, TGI, `streamgate sim`) or a fleet of them, which gives every client bounded,
//! flushed, cancellable, resumable and instrumented streams without changing the servers, and
//! retries what failed before anything reached the client.
//!
//! `streamgate proxy --upstream http://127.0.0.1:8000 --addr 0.0.0.0:8080`
//!
//! ```text
//! client --> [proxy: own endpoints | completion | pass-through] --> replica of the model's pool
//!
//! completion: attempts (replica, another, a fallback) until a first event or an answer
//! streamed: upstream SSE --decode (bounded)--> proxy.recv --gate (policy)--> replay log
//!           --> subscriber --sse + heartbeats--> proxy.write --> one HTTP chunk per event
//! ```
//!
//! # A fleet
//!
//! `--upstream` given several times makes one pool of replicas serving every model; `--config
//! FILE` (TOML, [`Routes::from_toml`]) describes several pools, the models each serves,
//! weights, health checks, circuits, fallbacks and attempts; `--fallbacks FILE` (JSON) adds
//! fallbacks. A completion goes to the pool of its `model` (404 `model_not_found` when none
//! serves it), to the replica with the fewest streams in flight per weight of two drawn at
//! random ([`streamgate::fleet::Pool`]); its stream counts there until its end. Until its
//! first event (or, not streamed, its answer) its attempts are invisible to the client and
//! follow [`streamgate::fleet::Attempts`]: another replica, the same one after a backoff, a
//! fallback (its body's `model` rewritten), `Retry-After` honoured, at most `--max-attempts`;
//! each failure counted at its upstream (`/stats` `upstreams`, `/metrics`
//! `streamgate_proxy_upstream_*`) and against its health (a replica, or only the model on it).
//! An error status is read up to 64 KiB for its `error.code` (`context_length_exceeded` goes
//! only to a `[context_fallbacks]` model) and, when the attempts give up, passed on whole.
//! Requests that are no completion go to the first pool, once.
//!
//! # What goes where
//!
//! - `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/messages` (Anthropic
//!   Messages) and `POST /v1/responses` (OpenAI Responses): the body is read whole (at most
//!   `--max-request-bytes`, 413 above; within `--body-timeout-ms`, 408 after; and all bodies
//!   being read or waiting to go upstream together within `--max-buffered-bytes`, 503 "too many
//!   large requests in flight" past it, at once, never queued). Whatever the body says, an
//!   answer 2xx `text/event-stream` (any case, any parameters) is a stream (Python servers
//!   stream `"stream": "true"`, `"stream": 1` or a key given twice too): decoded with the
//!   crate's SSE decoder, gated (`--buffer-events`, `--buffer-bytes`, `--policy`,
//!   `--slow-deadline-ms`), registered under the request id for resumes when
//!   `--resume-grace-ms` is above 0, and sent one HTTP chunk per event with `Cache-Control:
//!   no-cache`, `X-Accel-Buffering: no` and heartbeats (`--heartbeat-ms`) before the first
//!   token and through stalls. Every event carries the proxy's `id: n` (its position in the
//!   stream: upstream ids are replaced). Events pass byte for byte, unless `--policy coalesce`
//!   merges events a slow client has not read yet (the crate's lossless merge for the API:
//!   OpenAI's chat chunks, Messages' and Responses' events; `text_completion` chunks never
//!   merge), a Responses event is numbered (see below), or they come from a stream carried on
//!   after a failover (joined at the seam, and encoded anew). The response's headers are the
//!   proxy's (the
//!   upstream's other headers are not copied), and the upstream is asked without
//!   `Accept-Encoding`, since the proxy reads its events. Only a body with `"stream": true`
//!   gets the `--upstream-headers-ms` deadline, per attempt (a non-streamed completion has its
//!   headers only once it is done). The client's response starts with the stream's first
//!   event, or one heartbeat interval (`--heartbeat-ms`) in, whichever comes first: a server
//!   that queues the request (llama.cpp with every slot busy sends no headers until it starts
//!   on it) or attempts that take longer commit the stream (200), and heartbeats flow while
//!   the proxy waits on.
//! - Everything else (other paths and methods, a completion the upstream answers with an error
//!   or without SSE) passes through: method, path and query (after the upstream's prefix),
//!   headers without the hop-by-hop ones (`Host` becomes the upstream's), bodies streamed both
//!   ways in bounded memory. An upstream `500` typed `text/event-stream` is a `500` with its
//!   body. `Upgrade` and `Connection` are hop-by-hop: a WebSocket (or other `Upgrade`)
//!   handshake reaches the upstream as a plain request, and no upgraded connection is relayed.
//! - The proxy's own: `GET /metrics`, `GET /stats`, and with `--resume-grace-ms` above 0 `GET
//!   /v1/chat/completions/{id}/stream` and `POST /v1/chat/completions/{id}/cancel`, the same
//!   under `/v1/messages/`, and `GET /v1/responses/{id}?stream=true&starting_after=N` and `POST
//!   /v1/responses/{id}/cancel` (as `sim` serves them; `{id}` is the request id, which a
//!   resumed stream of any API is found by, or, for a Responses stream, the upstream's own
//!   response id its `response.created` named, as the `openai` SDK resumes it: the
//!   registry's alias of the stream, through any instance sharing a Redis store); they
//!   shadow the upstream's paths of the same name (other methods on them, `GET
//!   /v1/responses/{id}` without `stream=true`, and the two Responses paths for an id the
//!   proxy holds no stream of pass through). Without a grace they all pass through to the
//!   upstream.
//!
//! # Messages and Responses
//!
//! An Anthropic Messages or OpenAI Responses stream is gated, numbered, probed, heartbeaten,
//! registered and stopped as a chat completion's is, in its own terms: its events pass byte for
//! byte (each with the proxy's `id: n`), each counted for progress by its type (a `ping` or a
//! `message_start` is control); it is complete at its own end event (`message_stop`,
//! `response.completed` or `.incomplete`, read from the data's `type`, so an upstream that
//! writes no `event:` lines ends too; `response.failed` or an `error` ends it as an upstream
//! error) and the upstream's clean close after it, with no `[DONE]`; an upstream failure ends it with the
//! API's own error event (Messages: `{"type":"error","error":{"type":"api_error",..}}`;
//! Responses: `{"type":"error","code":"upstream_error",..}`, numbered), and so do the gate's
//! own ends (a slow reader cut off, a shutdown, a reader behind the replay log: the type or
//! `code` is the end reason); a stop (`/cancel`) ends it with the open block's
//! `content_block_stop`, `message_delta` (`end_turn`, the visible events' count as output
//! tokens) and `message_stop`, or the open part's and item's `.done` events and
//! `response.incomplete` (the created response, `incomplete_details.reason` `stopped`, its
//! `output` what the client has); stopped before the upstream's first event, an opening of the proxy's own comes
//! first (`message_start`, `response.created`, named by the request id), and after the
//! answer's own end nothing is added. A Responses event's `sequence_number` is the proxy's id
//! (what `starting_after` names), an unknown type's too: written where the upstream sent none
//! or another; an item or part added without its `output_index`, `content_index` or
//! `summary_index` is numbered after the others, and the events in it get the current ones
//! (llama.cpp's server sends neither, and the `openai` SDK cannot read its stream straight:
//! through the proxy it can). An event the crate's `anthropic` or
//! `responses` module cannot read as its API's is dropped and counted (an unknown type passes).
//! `--policy coalesce` merges a slow reader's events by the crate's lossless rules for the API
//! (`streamgate::anthropic`, `streamgate::responses`: same-block text deltas concatenate, a
//! merged Responses delta keeps the last `sequence_number`). A failure mid-answer is carried on
//! as one answer (see [Failover](#failover)).
//!
//! # Request ids and traces
//!
//! `x-request-id` is the client's when it is 1 to 128 bytes of `A-Z a-z 0-9 . _ : -` (safe in a
//! header, a path and a Redis key), or a new unguessable `sg-<32 hex digits>` when it sent none
//! (or another);
//! it goes upstream and comes back on every response. Without a grace (the default) ids name
//! nothing: no stream is registered, and requests sharing one (an Envoy retry keeps its id) are
//! served side by side. With a grace an id names its stream for resumes and stops, and a
//! resumable stream's id is its only credential: the proxy's ids cannot be guessed, a
//! client-chosen one is as secret as the client makes it. A request with `"stream": true`
//! claims its id before the upstream is asked, so a duplicate of a running or retained stream
//! is a 409 that never starts upstream work (the registry's claim: of two claims of one id, here
//! or on two instances sharing a Redis, one wins). A completion that did not ask for a stream
//! but gets one claims its id when the answer comes (a refused claim drops the upstream's
//! answer at once). When Redis does not answer, a warning is logged at
//! start and such requests get 503 before going upstream. W3C
//! `traceparent`/`tracestate` go upstream verbatim with the other headers; the hop probes'
//! recorders are made in the extracted context, so an application that installs an
//! OpenTelemetry propagator and gives the hops a tracer gets one span per stream continuing the
//! client's trace (the binary installs no SDK).
//!
//! # Cancellation
//!
//! The stream's generator owns the upstream response body. When the client goes (and no
//! `--resume-grace-ms` holds the stream), or a policy, `/cancel` or shutdown ends it, the body
//! is dropped; hyper closes that upstream connection (an unfinished body never returns to the
//! pool), and the upstream server sees its client disconnect and frees the slot. With a grace,
//! a disconnected stream goes on reading its upstream into the replay log until the grace runs
//! out or a client resumes. A `/cancel` ends every reader's stream with a final chunk
//! (`finish_reason` `stop`; the envelope of the upstream's first chunk, or, stopped before the
//! upstream sent any or after a first event that was no chunk, a minimal
//! `chat.completion.chunk` / `text_completion` named by the request id and the request's
//! `model`) and `[DONE]`.
//!
//! # Upstream failures
//!
//! What the client sees when the last attempt failed so (the others were retried, as
//! [`streamgate::fleet::Failure`] classifies them):
//!
//! | upstream | client sees |
//! |---|---|
//! | connection refused, unknown host | 502, OpenAI error body, `upstream_error` |
//! | a certificate not trusted (`https://`), a failed handshake | 502 saying TLS failed, never plain text |
//! | connect slower than `--connect-timeout-ms` | 504, OpenAI error body |
//! | no response headers within `--upstream-headers-ms` (streamed requests) | 504, OpenAI error body; or, when the stream was committed (one heartbeat interval in), heartbeats, then the terminal frame "sent no response headers within N ms" |
//! | no first event within `--first-token-ms` (or `--upstream-idle-ms`) after the headers | 504; or heartbeats, then the terminal frame saying so |
//! | error status (any content type) | that status and body; after the stream was committed, the terminal frame quoting the status and the start of the body |
//! | a final chunk (a `finish_reason`), then a clean close without `data: [DONE]` | the answer, whole, and the `[DONE]` the client waits for |
//! | an event whose data is not a JSON object | dropped (`events_dropped_invalid` in `/stats`, `streamgate_proxy_invalid_events_total`); the stream goes on |
//! | 2xx, not SSE, to a completion request | passed through as it is |
//! | SSE cut mid-stream (short `Content-Length`, chunked without its end, a close before `[DONE]`) | carried on (see [Failover](#failover)); when it cannot be, the events so far, then `event: error` / `data: {"error":{"message":..,"type":"upstream_error",..}}` saying why, end |
//! | a line or event past the decoder's limits (256 KiB / 1 MiB) | the same terminal frame; memory stays within the limits |
//! | invalid UTF-8 in SSE | replaced with U+FFFD, as every EventSource client decodes it; the stream goes on |
//! | no event for `--upstream-idle-ms` (comments do not count) | heartbeats meanwhile, the upstream dropped, and the stream carried on; when it cannot be, the terminal frame "upstream stalled" |
//! | its own error (`event: error`, or a chunk that is `{"error":..}`) that another replica could avoid (an overload, an internal error, its KV cache full) | carried on; when it cannot be, the upstream's frame passed on, and the stream ends there (`upstream_error`) |
//! | any other error frame of its own | passed on, and the stream ends there (`upstream_error`) |
//! | a pass-through body cut short | the client's connection is cut before the body's end (never a clean short body) |
//!
//! # Failover
//!
//! A stream that breaks after its first event (cut, stalled, an error another replica could
//! avoid) is carried on as `--failover` says (default `continue`): the broken upstream is
//! dropped and counted against its replica (`cut`, `stalled`, `error_event`), and another
//! replica of the model (then its fallbacks) is asked, with the attempts and limits of the
//! fleet, at most `--failover-max` times per stream. While nothing visible has reached the
//! client, the original request goes again (a restart); after that, a continuation: the
//! original request with the delivered text as a final assistant message,
//! `continue_final_message: true` and `add_generation_prompt: false` (what vLLM and TGI need;
//! llama.cpp continues a final assistant message anyway) and `max_tokens` (or
//! `max_completion_tokens`) less the delivered tokens, counted one per chunk with text. A
//! stream whose asked tokens all came is ended whole (`finish_reason: length`). The client
//! sees one stream: ids go on, every chunk keeps the first one's `id`
//! and `created`, the continuation's role is dropped, `model` names who finished the answer,
//! the final `usage` counts the delivered tokens as the answer's (not the continuation's
//! prompt's), and an echo (a server that streams the continued message back before its new
//! text, as llama.cpp does) is taken off by what arrives: text is held while it still matches
//! the assistant message sent (or the delivered text alone), whitespace aside, and passed on
//! from where the echo ends; text still held when the continuation ends is an echo's start, and
//! is dropped. At the seam the client may see whitespace differ from an uninterrupted answer
//! (the continuing server tokenises the delivered text anew). Delivered text is never sent
//! again; the one ambiguity is new text that itself begins with the whole delivered text, which
//! is taken for an echo.
//!
//! An Anthropic Messages stream is continued by its prefill (the delivered text as a final
//! `assistant` message, or added to the text of the request's own, `max_tokens` less the
//! delivered tokens) and joined as one message (`messages_seam.rs`): no second
//! `message_start`, the carried-on stream's first block goes on in the client's open block when
//! it is of its type (else that block is stopped first), later blocks' indices move on, the
//! final `message_delta`'s usage counts the delivered tokens as output. An OpenAI Responses
//! stream is continued by an assistant message item `in_progress` with the delivered text
//! (`max_output_tokens` less the delivered tokens) and joined as one response
//! (`responses_seam.rs`): no second `response.created`, the carried-on stream's first item and
//! part go on in the client's open ones (under the client's item id), the `.done` events and
//! the final response carry the whole text, the final response is the client's (its `id`, the
//! items it had) with the delivered tokens counted as output. Either way the echo is taken off
//! as for chat; a restart (nothing visible yet) is joined the same way. An answer whose
//! `stop_reason` came and whose stream broke before `message_stop` gets its `message_stop`.
//! An instance that adopts a stream (`--resume-store`) reads the same from its log.
//!
//! A continuation is not sent where it cannot be faithful, and the stream ends with its error
//! event saying which: a tool call in progress, reasoning or a refusal delivered, a Responses
//! answer whose text is not all in the one message part the client has open,
//! `response_format` with a schema (or JSON), `n` > 1, `logprobs`, a text completion, an answer
//! past 1 MiB of text (what is kept to continue from), `--failover restart` once text was
//! delivered, `--failover-max` failovers done, the attempts' deadline (from the stream's first
//! failover) past, no upstream left. Pools whose servers do not continue a final assistant
//! message are marked `prefill = false` in the config (SGLang, some hosted models), or learned:
//! a server that refuses a continuation with a 400 or 422 that speaks of the prefill or the
//! assistant message marks its pool, the next pool is asked at once, and that refusal is never
//! the client's error (Anthropic's own API refuses a prefill that ends in whitespace: that
//! refusal marks nothing, and ends the stream). A stream broken by an upstream's own error event
//! (an overload) that is not carried on (for a reason above) ends with that event as the
//! upstream sent it; one whose carrying on was tried and failed, with the proxy's error event
//! saying so. A Messages answer whose `stop_reason` came, or a Responses answer whose text was
//! final (`output_text.done`), is whole: a break after it ends it with the events it lacks
//! (`message_stop`; the `.done` events and `response.incomplete`, reason `interrupted`). With `--resume-grace-ms` the replay log simply goes on: a
//! client detached across a failover resumes into the one stream. `/stats` counts
//! `failovers` by outcome (`continued`, `restarted`, `whole`, `refused`, `failed`), as does
//! `streamgate_proxy_failovers_total{outcome}`.
//!
//! With `--resume-store redis://` a stream also outlives the proxy instance that runs it
//! crashing (a SIGTERM ends its streams with their terminal frame, as before): it
//! keeps its request (path, headers, body: as private as the Redis) beside its replay log, and
//! its pump holds a lease renewed every 100 ms. While a client reads a stream through another
//! instance (a resume), that instance asks every 250 ms to adopt it; about 2 s after the
//! death the lease has lapsed, one instance wins the adoption, rebuilds what was sent from the
//! log and carries the stream on upstream as a failover (`/stats` `streams_adopted`). A log
//! whose start its bounds evicted cannot be continued faithfully, and ends with an error frame
//! saying so.
//!
//! # Probes and counters
//!
//! Hops `proxy.recv` (each upstream event as it arrives) and `proxy.write` (each frame handed to
//! the client's connection); their gaps, time to first event and end reasons are in `/metrics`
//! with the process's other series (`streamgate_proxy_requests_total{kind}`,
//! `streamgate_proxy_upstream_failures_total{cause}` for requests no attempt got an answer for,
//! `streamgate_proxy_retries_total`, `streamgate_proxy_fallbacks_total` and the per-upstream
//! `streamgate_proxy_upstream_{in_flight,picks_total,attempt_failures_total,ejected}`), and
//! with `--hop-records FILE` in hop records, whose `proxy.recv` records name the `upstream` and
//! `model` serving each stream (`attrs`, on its first record and on the first after each
//! failover), so that a stall the diagnosis finds there names the replica that went quiet.
//! `/stats` is the proxy's own: streams started,
//! running, ended by reason, requests no attempt got an answer for (by cause), requests passed
//! through, retries, fallbacks, invalid events dropped, `upstreams` (each one's figures), and
//! the resume store's counters.

mod adopt;
mod attempt;
mod body;
mod chunk;
mod config;
mod echo;
mod error;
mod failover;
mod fleet;
mod format;
mod forward;
mod kept;
mod messages_seam;
mod pages;
mod peek;
mod responses_seam;
mod resume;
mod routes;
mod seam;
mod state;
mod stats;
mod stream;
mod upstream;
mod url;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use streamgate::transport::TunedListener;

pub use self::config::{Config, InjectedStall};
pub use self::failover::FailoverMode;
use self::fleet::Fleet;
pub use self::routes::{PoolConfig, Routes};
pub use self::state::Proxy;
use self::stats::Stats;
use self::upstream::Upstream;
pub use self::url::{Scheme, UpstreamUrl};
use crate::request_id::RequestIds;
use crate::{page, serving};

/// The most `--record-header`s: with `upstream`, `pool` and `model`, a hop record's
/// attributes.
const MAX_RECORD_HEADERS: usize = streamgate::probe::MAX_RECORD_ATTRS - 3;

/// Binds the listener (with the crate's kernel-aware defaults, as `--sndbuf`,
/// `--notsent-lowat` and `--user-timeout-ms` adjust them) and builds the app for `config`;
/// the caller serves it (see [`serving::serve_until`], or [`serving::serve_with`] and
/// [`Config::server`] for the connection protections of `--header-timeout-ms`,
/// `--idle-timeout-ms` and `--max-connections`, whose default here is half the library's,
/// since every proxied stream holds an upstream socket besides its client's).
///
/// # Errors
///
/// When the fleet cannot serve (see [`Config::routes`]), `--upstream-ca` cannot be read, the
/// listener cannot be bound, the hop record file cannot be created, or the Redis store URL is
/// malformed.
pub fn app(
    config: Config,
    prometheus: PrometheusHandle,
) -> Result<(TunedListener, Router, Arc<Proxy>), String> {
    if config.record_headers.len() > MAX_RECORD_HEADERS {
        return Err(format!(
            "--record-header: at most {MAX_RECORD_HEADERS} headers"
        ));
    }
    let fleet = Arc::new(Fleet::new(config.routes()?));
    let upstream = Upstream::new(config.connect_timeout, config.upstream_ca.as_deref())?;
    let records = serving::record_sink(config.hop_records.as_deref())?;
    let listener = TunedListener::bind(config.addr, config.listen.options())
        .map_err(|error| format!("binding {}: {error}", config.addr))?;
    stats::describe();
    let proxy = Arc::new(Proxy {
        group: streamgate::Group::new(),
        upstream,
        fleet,
        recv: config.hop_records_sample.hop(&records, "proxy.recv"),
        write: config.hop_records_sample.hop(&records, "proxy.write"),
        browser: config.hop_records_sample.browser(&records),
        records,
        stats: Stats::default(),
        store: config.resume.open(&config.gate)?,
        prometheus,
        ids: RequestIds::new("sg-"),
        buffered: Arc::new(tokio::sync::Semaphore::new(
            config
                .max_buffered_bytes
                .min(tokio::sync::Semaphore::MAX_PERMITS),
        )),
        config,
    });
    let mut app = Router::new()
        .route("/metrics", get(pages::metrics).fallback(forward::forward))
        .route("/stats", get(pages::stats).fallback(forward::forward));
    if proxy.resumable() {
        for api in ["/v1/chat/completions", "/v1/messages"] {
            app = app
                .route(
                    &format!("{api}/{{request_id}}/stream"),
                    get(resume::resume).fallback(forward::forward),
                )
                .route(
                    &format!("{api}/{{request_id}}/cancel"),
                    post(resume::cancel).fallback(forward::forward),
                );
        }
        app = app
            .route(
                "/v1/responses/{request_id}",
                get(resume::response).fallback(forward::forward),
            )
            .route(
                "/v1/responses/{request_id}/cancel",
                post(resume::response_cancel).fallback(forward::forward),
            );
    }
    let app = app
        .merge(page::routes(proxy.browser.as_ref()))
        .fallback(forward::forward)
        .with_state(proxy.clone());
    Fleet::check_health(&proxy.fleet, &proxy.upstream);
    Ok((listener, app, proxy))
}

/// Serves the proxy `config` describes on a task of the current tokio runtime, for as long as
/// the runtime runs (no signal handling, no shutdown: for a process that serves other things
/// too, and for tests); its address.
///
/// # Errors
///
/// As [`app`].
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), String> {
/// use streamgate_cli::{proxy, serving};
///
/// let flags = ["--upstream", "http://127.0.0.1:8000", "--addr", "127.0.0.1:0"];
/// let config = proxy::Config::parse_from(flags).map_err(|error| error.to_string())?;
/// let addr = proxy::spawn(config, serving::prometheus()?)?;
/// println!("streams through http://{addr}/v1/chat/completions");
/// # Ok(())
/// # }
/// ```
pub fn spawn(config: Config, prometheus: PrometheusHandle) -> Result<SocketAddr, String> {
    let (listener, app, proxy) = app(config, prometheus)?;
    let addr = listener
        .local_addr()
        .map_err(|error| format!("the proxy's address: {error}"))?;
    let streams = proxy.group.clone();
    tokio::spawn(serving::serve_until(
        listener,
        app,
        streams,
        std::future::pending(),
    ));
    Ok(addr)
}

/// Runs the proxy until SIGINT or SIGTERM: every open stream then gets a terminal frame, hop
/// records are flushed, and the process exits (status 0; 2 when it could not start).
pub async fn run(config: Config) -> ExitCode {
    let server = config.server();
    match serving::prometheus().and_then(|prometheus| app(config, prometheus)) {
        Ok((listener, app, proxy)) => {
            eprintln!("proxy: forwarding to{}", proxy.fleet.describe());
            if proxy.resumable() {
                if let Err(failure) = proxy.store.check().await {
                    let why = serving::with_causes(&failure);
                    eprintln!("proxy: warning: {why}; streamed requests get 503 until it answers");
                }
            }
            let (records, group) = (proxy.records.clone(), proxy.group.clone());
            serving::serve_until_signal("proxy", server, listener, app, records, group).await
        }
        Err(error) => {
            eprintln!("proxy: {error}");
            ExitCode::from(2)
        }
    }
}
