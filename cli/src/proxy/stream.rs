//! A streamed completion: the upstream's SSE decoded, gated and sent on one chunk per event,
//! with heartbeats, an idle deadline, a terminal error frame for every upstream failure, a
//! replay log for resumes, and the upstream dropped the moment nobody can read it.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use axum::http::Method;
use axum::http::header::{self, HeaderMap};
use axum::response::Response;
use futures_util::StreamExt;
use http_body_util::BodyDataStream;
use hyper::body::Incoming;
use serde_json::{Map, Value, json};
use streamgate::openai::{ChatCompletionChunk, ChunkChoice, Delta};
use streamgate::probe::{Observed, Recorder, Seen};
use streamgate::resume::{Claim, ClaimError};
use streamgate::sse::{DecodeError, SseEvent};
use streamgate::{EndReason, GateExt, Sender};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::body::Buffered;
use super::chunk::Relayed;
use super::config::InjectedStall;
use super::stats::Outcome;
use super::upstream::{UpstreamError, is_event_stream, pass_response};
use super::{Proxy, error};
use crate::flags::PolicyFlag;
use crate::{resume, serving};

/// A completion request, its body read.
pub(super) struct StreamRequest {
    pub(super) path_and_query: String,
    pub(super) headers: HeaderMap,
    pub(super) body: Buffered,
    /// The request id (`x-request-id`), under which the stream is resumable.
    pub(super) id: String,
    /// A chat completion (`chat.completion.chunk` events, which may coalesce), or a text one.
    pub(super) chat: bool,
    /// The body asks for a stream (`"stream": true`): the upstream's headers have a deadline,
    /// and the id is claimed before the upstream is asked.
    pub(super) asked: bool,
    /// The request's `model`, for a final chunk made before the upstream sent any.
    pub(super) model: Option<String>,
}

/// Sends `request` upstream and streams its answer: gated SSE when the upstream answers 2xx
/// `text/event-stream` (whatever the body asked), otherwise the upstream's response as it is
/// (an error status with its body, or a non-SSE answer).
///
/// With `--resume-grace-ms` (resumes on), the stream is registered under its request id: a
/// request that asked for a stream claims the id before the upstream is asked, so a duplicate
/// (409) never starts upstream work; one that did not ask claims it when the answer turns out
/// to be a stream. Without a grace nothing is registered, and requests sharing an id are
/// served side by side.
pub(super) async fn relay(proxy: &Arc<Proxy>, request: StreamRequest) -> Response {
    let StreamRequest {
        path_and_query,
        mut headers,
        body,
        id,
        chat,
        asked,
        model,
    } = request;
    let resumable = proxy.resumable();
    let mut claim = None;
    if resumable && asked {
        match proxy.store.claim(&id).await {
            Ok(held) => claim = Some(held),
            Err(refused) => return refused_claim(&id, &refused),
        }
    }
    // The client's `traceparent` goes upstream with its other headers; the proxy's streams
    // continue its trace (their spans, where the embedding application gives the hop one).
    let parent = streamgate::otel::extract(&headers);
    // The events are decoded here: they must arrive as they are.
    headers.remove(header::ACCEPT_ENCODING);
    let mut sent: Sent = {
        let (proxy, body) = (proxy.clone(), body.into_body());
        Box::pin(async move {
            (proxy.upstream)
                .send(Method::POST, &path_and_query, &headers, body)
                .await
        })
    };
    let limit = proxy.config.upstream_headers;
    let mut answer = if asked {
        // The client hears from the proxy within one heartbeat interval. A server that queues
        // the request (llama.cpp with every slot busy) sends its headers only when it starts on
        // it: past that interval the stream is committed (200) and heartbeats flow while the
        // proxy waits, and an error status after it becomes the stream's terminal frame.
        let commit = proxy.config.gate.heartbeat.min(limit);
        match tokio::time::timeout(commit, &mut sent).await {
            Ok(Ok(upstream)) => Answer::Now(upstream),
            Ok(Err(failure)) => return proxy.upstream_failed(&failure),
            Err(_) if commit == limit => {
                return proxy.upstream_failed(&UpstreamError::HeadersTimeout(limit));
            }
            Err(_) => Answer::Awaited {
                sent,
                deadline: Instant::now() + (limit - commit),
                limit,
                proxy: proxy.clone(),
            },
        }
    } else {
        // A non-streamed completion has its headers only once it is done.
        match sent.await {
            Ok(upstream) => Answer::Now(upstream),
            Err(failure) => return proxy.upstream_failed(&failure),
        }
    };
    if let Answer::Now(upstream) = answer {
        if !(upstream.status().is_success() && is_event_stream(upstream.headers())) {
            // An error (`500` even when typed `text/event-stream`), or an answer that is no
            // stream.
            proxy.stats.passed_through();
            return pass_response(upstream);
        }
        if resumable && claim.is_none() {
            match proxy.store.claim(&id).await {
                Ok(held) => claim = Some(held),
                // The upstream response is dropped: its connection closes, its work stops.
                Err(refused) => return refused_claim(&id, &refused),
            }
        }
        answer = Answer::Now(upstream);
    }
    let recv = proxy.recv.recorder_in(id.as_str(), &parent);
    // `/cancel` stops a registered stream through its claim's stop signal: the generator
    // ends it with a final chunk.
    let stop = claim
        .as_mut()
        .map_or_else(CancellationToken::new, Claim::stop_signal);
    let start = Start {
        id: &id,
        chat,
        model,
        stop,
    };
    let consumer = start.spawn(proxy, answer, recv);
    let Some(claim) = claim else {
        return proxy.sse_response(consumer.sse(), &id);
    };
    match proxy.store.register(claim, consumer).await {
        Ok(frames) => proxy.sse_response(frames, &id),
        Err(failure) => resume::register_error(&failure),
    }
}

/// The answer to a request whose id could not be claimed.
fn refused_claim(id: &str, refused: &ClaimError) -> Response {
    resume::claim_error(&format!("x-request-id {id}"), id, refused)
}

/// The upstream's response, on its way.
type Sent = Pin<Box<dyn Future<Output = Result<hyper::Response<Incoming>, UpstreamError>> + Send>>;

/// The upstream's answer to a streamed request.
pub(super) enum Answer {
    /// Its headers came: a 2xx event stream.
    Now(hyper::Response<Incoming>),
    /// Not within a heartbeat interval: the stream is committed, and the generator waits for
    /// the headers until `deadline` (`--upstream-headers-ms`, `limit`, from the request).
    Awaited {
        sent: Sent,
        deadline: Instant,
        limit: Duration,
        proxy: Arc<Proxy>,
    },
}

/// What a stream's gate is started with.
struct Start<'a> {
    id: &'a str,
    chat: bool,
    model: Option<String>,
    /// `/cancel`'s stop (resumes on): the generator ends the stream with a final chunk.
    stop: CancellationToken,
}

impl Start<'_> {
    /// Starts the gate whose generator reads the upstream's `answer`.
    fn spawn(
        self,
        proxy: &Arc<Proxy>,
        answer: Answer,
        recv: Recorder,
    ) -> streamgate::Consumer<Relayed> {
        let config = &proxy.config;
        let stop = self.stop;
        proxy.stats.start();
        let outcome = Arc::new(AtomicU8::new(Outcome::Gate as u8));
        let on_release = {
            let (proxy, outcome) = (proxy.clone(), outcome.clone());
            move |reason: EndReason, _| {
                let outcome = Outcome::from_u8(outcome.load(Ordering::SeqCst));
                proxy.stats.end(outcome.end_reason(reason));
            }
        };
        let pump = Pump {
            stop,
            outcome,
            chat: self.chat,
            id: self.id.to_owned(),
            model: self.model,
            mergeable: self.chat && config.gate.policy == PolicyFlag::Coalesce,
            idle: config.upstream_idle,
            stall: config.stall,
        };
        config
            .gate
            .gate(&config.resume)
            .group(&proxy.group)
            .on_release(on_release)
            // The generator owns the upstream body: when the stream ends early (the client left
            // and no grace holds it, a policy, a stop, shutdown) the gate drops it, hyper closes
            // the upstream connection, and the upstream server cancels its own generation.
            .spawn(move |_, tx| pump.run(answer, recv, tx))
    }
}

impl Outcome {
    fn from_u8(value: u8) -> Outcome {
        match value {
            1 => Outcome::UpstreamError,
            2 => Outcome::Stopped,
            _ => Outcome::Gate,
        }
    }
}

/// The generator of one stream: reads the upstream's events into the gate.
struct Pump {
    /// `/cancel`: stop reading, send a final chunk and `[DONE]`.
    stop: CancellationToken,
    outcome: Arc<AtomicU8>,
    chat: bool,
    /// The request id and `model`: a final chunk made before the upstream sent any names them.
    id: String,
    model: Option<String>,
    mergeable: bool,
    /// `--upstream-idle-ms` (zero: none): the longest wait for the upstream's next event.
    idle: Duration,
    /// For tests and the demo: a stall before forwarding one event (`Config::stall`).
    stall: Option<InjectedStall>,
}

/// How the upstream's stream ended.
enum End {
    /// `data: [DONE]`.
    Done,
    /// The upstream sent its own error frame (passed on).
    ErrorFrame,
    /// The upstream failed: the client gets a terminal error frame saying this.
    Failed(String),
    /// Stopped through `/cancel`.
    Stopped,
}

/// The upstream's events.
type Events = Pin<Box<dyn futures_core::Stream<Item = Result<SseEvent, DecodeError>> + Send>>;

impl Pump {
    async fn run(
        self,
        answer: Answer,
        mut recv: Recorder,
        mut tx: Sender<Relayed>,
    ) -> Result<(), &'static str> {
        let body = match self.body(answer).await {
            Ok(body) => body,
            Err(end) => return self.finish(end, recv, tx, None, 0).await,
        };
        let mut events: Events = Box::pin(BodyDataStream::new(body).sse_events());
        let gone = |_| "the stream ended";
        // The idle deadline: one timer, moved only when it fires (an event only reads the
        // clock), as the heartbeat's. It runs only while the upstream is awaited: a wait for
        // room in the gate (a slow client) is not the upstream's.
        let mut waiting_since = Instant::now();
        let mut idle = std::pin::pin!(tokio::time::sleep(self.idle));
        let mut stall = self.stall;
        let mut next_id = 0u64;
        // The first chunk, whose envelope (id, model, ...) a final chunk after a stop repeats.
        let mut first: Option<String> = None;
        let end = loop {
            if let Some(injected) = stall.filter(|injected| injected.at == next_id) {
                // An injected freeze before forwarding event n (a proxy-side stall), once.
                stall = None;
                tokio::select! {
                    () = tokio::time::sleep(injected.duration) => {}
                    () = self.stop.cancelled() => {}
                }
                waiting_since = Instant::now();
            }
            let item = tokio::select! {
                biased;
                () = self.stop.cancelled() => break End::Stopped,
                () = &mut idle, if !self.idle.is_zero() => {
                    let due = waiting_since + self.idle;
                    if Instant::now() < due {
                        idle.as_mut().reset(due);
                        continue;
                    }
                    break End::Failed(format!(
                        "upstream stalled: no event for {} ms",
                        self.idle.as_millis()
                    ));
                }
                item = events.next() => item,
            };
            let Some(item) = item else {
                break End::Failed("the upstream closed the stream before data: [DONE]".into());
            };
            match item.observed() {
                Seen::Event(event) | Seen::Last(event, _) => recv.observe(event),
                Seen::End(_) | Seen::Nothing => {}
            }
            let event = match item {
                Ok(event) => event,
                Err(error) => break End::Failed(describe(&error)),
            };
            let Some(data) = event.data_str() else {
                // A `retry:` alone: the proxy's clients reconnect to the proxy.
                continue;
            };
            if event.event() == Some("error") {
                // The upstream's own end frame, passed on as the stream's end.
                let frame = SseEvent::data(data)
                    .with_event("error")
                    .expect("a constant type");
                tx.send(Relayed::new(frame, false)).await.map_err(gone)?;
                break End::ErrorFrame;
            }
            let done = data.starts_with("[DONE]");
            if first.is_none() && !done {
                first = Some(data.to_owned());
            }
            let event = event
                .with_id(next_id.to_string())
                .expect("a number is a valid id");
            tx.send(Relayed::new(event, self.mergeable && !done))
                .await
                .map_err(gone)?;
            waiting_since = Instant::now();
            next_id += 1;
            if done {
                break End::Done;
            }
        };
        // Whatever the end, the upstream connection goes now (an unfinished body closes it).
        drop(events);
        self.finish(end, recv, tx, first, next_id).await
    }

    /// The upstream's event stream: at once, or once its headers come (a committed stream).
    async fn body(&self, answer: Answer) -> Result<Incoming, End> {
        let (sent, deadline, limit, proxy) = match answer {
            Answer::Now(upstream) => return Ok(upstream.into_body()),
            Answer::Awaited {
                sent,
                deadline,
                limit,
                proxy,
            } => (sent, deadline, limit, proxy),
        };
        let failed = |failure: &UpstreamError| {
            proxy.stats.upstream_failed(failure.cause());
            End::Failed(error::failure(&proxy.upstream, failure).1)
        };
        let answered = tokio::select! {
            biased;
            () = self.stop.cancelled() => return Err(End::Stopped),
            () = tokio::time::sleep_until(deadline) => {
                return Err(failed(&UpstreamError::HeadersTimeout(limit)));
            }
            answered = sent => answered,
        };
        let upstream = answered.map_err(|failure| failed(&failure))?;
        if upstream.status().is_success() && is_event_stream(upstream.headers()) {
            return Ok(upstream.into_body());
        }
        // Too late for its status: the stream's terminal frame says what it was.
        let status = upstream.status();
        let body = prefix(upstream.into_body(), ANSWER_PREFIX).await;
        Err(End::Failed(format!(
            "the upstream answered {status} after the stream had started: {body}"
        )))
    }

    /// Ends the stream as `end` says, after `next_id` events (the first of them `first`).
    async fn finish(
        &self,
        end: End,
        mut recv: Recorder,
        mut tx: Sender<Relayed>,
        first: Option<String>,
        mut next_id: u64,
    ) -> Result<(), &'static str> {
        let gone = |_| "the stream ended";
        match end {
            End::Done => recv.end(EndReason::Completed),
            End::ErrorFrame => {
                self.outcome
                    .store(Outcome::UpstreamError as u8, Ordering::SeqCst);
                recv.end(EndReason::UpstreamError);
            }
            End::Failed(message) => {
                self.outcome
                    .store(Outcome::UpstreamError as u8, Ordering::SeqCst);
                recv.end(EndReason::UpstreamError);
                tx.send(Relayed::new(error::upstream_frame(&message), false))
                    .await
                    .map_err(gone)?;
            }
            End::Stopped => {
                self.outcome.store(Outcome::Stopped as u8, Ordering::SeqCst);
                recv.end(EndReason::Cancelled);
                let finish =
                    final_chunk(first.as_deref(), &self.id, self.model.as_deref(), self.chat);
                for data in [finish, "[DONE]".to_owned()] {
                    let event = SseEvent::data(data).with_id(next_id.to_string());
                    let event = event.expect("a number is a valid id");
                    tx.send(Relayed::new(event, false)).await.map_err(gone)?;
                    next_id += 1;
                }
            }
        }
        Ok(())
    }
}

/// The most of a late error answer's body a terminal frame quotes.
const ANSWER_PREFIX: usize = 4096;

/// The first `limit` bytes of `body` as text, waiting at most a second for them.
async fn prefix(body: Incoming, limit: usize) -> String {
    use http_body_util::BodyExt;
    let read = async {
        let mut body = body;
        let mut bytes = Vec::new();
        while bytes.len() < limit {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        bytes.extend_from_slice(&data);
                    }
                }
                _ => break,
            }
        }
        bytes.truncate(limit);
        String::from_utf8_lossy(&bytes).into_owned()
    };
    tokio::time::timeout(Duration::from_secs(1), read)
        .await
        .unwrap_or_default()
}

/// What the client is told when decoding the upstream failed.
fn describe(error: &DecodeError) -> String {
    match error {
        DecodeError::Upstream(cause) => {
            format!(
                "the upstream connection failed mid-stream: {}",
                serving::with_causes(&**cause)
            )
        }
        other => format!("the upstream sent a malformed stream: {other}"),
    }
}

/// The last chunk of a stream stopped on purpose: one choice that finishes with `stop` (a
/// `delta` for a chat completion, a `text` for a text one), in the envelope (`id`, `model`,
/// ...) of the stream's `first` chunk, without its `usage`. When there was none (stopped before
/// the upstream's first chunk), or it was not a chunk, a minimal one of the proxy's own: its id
/// the request id, its `model` the request's (empty when it named none).
fn final_chunk(first: Option<&str>, id: &str, model: Option<&str>, chat: bool) -> String {
    let created = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs())
    };
    let model = model.unwrap_or("");
    if chat {
        let mut chunk = first
            .and_then(|first| ChatCompletionChunk::parse(first.as_bytes()).ok())
            .unwrap_or_else(|| ChatCompletionChunk::new(id, created(), model));
        chunk.usage = None;
        chunk.choices = vec![ChunkChoice {
            finish_reason: Some("stop".to_owned()),
            ..ChunkChoice::new(0, Delta::default())
        }];
        return chunk.to_json();
    }
    // A text completion's chunk: the openai module has no type for it.
    let mut chunk = match first.and_then(|first| serde_json::from_str::<Value>(first).ok()) {
        Some(Value::Object(chunk)) => chunk,
        _ => Map::from_iter([
            ("id".to_owned(), json!(id)),
            ("object".to_owned(), json!("text_completion")),
            ("created".to_owned(), json!(created())),
            ("model".to_owned(), json!(model)),
        ]),
    };
    chunk.remove("usage");
    let choice = json!({"index": 0, "text": "", "logprobs": null, "finish_reason": "stop"});
    chunk.insert("choices".into(), json!([choice]));
    Value::Object(chunk).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_final_chunk_repeats_the_envelope() {
        let first = r#"{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","system_fingerprint":"fp","choices":[{"index":0,"delta":{"role":"assistant","content":"a"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
        let chunk: Value =
            serde_json::from_str(&final_chunk(Some(first), "r1", Some("x"), true)).unwrap();
        assert_eq!(
            chunk,
            json!({
                "id": "c1", "object": "chat.completion.chunk", "created": 7, "model": "m",
                "system_fingerprint": "fp",
                "choices": [{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop"}],
            })
        );
        let text = r#"{"id":"c2","object":"text_completion","choices":[{"index":0,"text":"a"}]}"#;
        let chunk: Value =
            serde_json::from_str(&final_chunk(Some(text), "r1", None, false)).unwrap();
        assert_eq!(chunk["id"], "c2");
        assert_eq!(
            chunk["choices"],
            json!([{"index": 0, "text": "", "logprobs": null, "finish_reason": "stop"}])
        );
        // Stopped before the first chunk, or after one that was none: the proxy's own.
        for first in [None, Some("not json"), Some(r#"{"odd":1}"#)] {
            let chunk: Value =
                serde_json::from_str(&final_chunk(first, "r1", Some("m"), true)).unwrap();
            assert_eq!(chunk["id"], "r1", "{first:?}");
            assert_eq!(chunk["object"], "chat.completion.chunk");
            assert_eq!(chunk["model"], "m");
            assert_eq!(chunk["choices"][0]["finish_reason"], "stop");
            assert_eq!(chunk["choices"][0]["delta"], json!({}));
        }
        let chunk: Value = serde_json::from_str(&final_chunk(None, "r2", None, false)).unwrap();
        assert_eq!(chunk["id"], "r2");
        assert_eq!(chunk["object"], "text_completion");
        assert_eq!(chunk["model"], "");
        assert_eq!(chunk["choices"][0]["text"], "");
    }
}
