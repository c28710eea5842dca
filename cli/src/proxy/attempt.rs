//! A completion request's attempts before its first event: a replica of its model's pool, then
//! another, the same one after a backoff, a fallback model, as [`Attempts`] says; each attempt
//! classified ([`Failure`]), counted at its upstream and reported to its health. Nothing has
//! reached the client while they run (heartbeats at most), so a retry is invisible to it.
//!
//! An attempt succeeds when its first event comes (a 2xx `text/event-stream` answer), or with
//! its answer (2xx, no stream: a non-streamed completion). An error status is read (at most
//! [`ERROR_PREFIX`] bytes, for its `error.code`) and either retried or, when the attempts give
//! up, passed on with its status, headers and whole body.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::{Body, Bytes};
use axum::http::header::{self, HeaderMap};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use futures_util::StreamExt;
use http_body_util::{BodyDataStream, BodyExt};
use hyper::body::Incoming;
use streamgate::GateExt;
use streamgate::fleet::{Attempts, Cause, ErrorCode, Failure, Lease, Next};
use streamgate::sse::{DecodeError, SseEvent};

use super::Proxy;
use super::body::{Buffered, leased};
use super::error;
use super::upstream::{UpstreamError, is_event_stream, pass_response};
use super::url::UpstreamUrl;
use crate::serving;

/// The most of an error answer's body read to classify it (the rest follows it to the client
/// when it is passed on).
pub(super) const ERROR_PREFIX: usize = 64 * 1024;

/// How long an error answer's body may take to arrive (its first [`ERROR_PREFIX`] bytes).
const ERROR_BODY_TIME: Duration = Duration::from_secs(1);

/// An upstream's decoded events.
pub(super) type Events =
    Pin<Box<dyn futures_core::Stream<Item = Result<SseEvent, DecodeError>> + Send>>;

/// A completion request, to attempt (and, for a stream that breaks, to carry on: kept until the
/// stream's end).
pub(super) struct Attempted {
    pub(super) path_and_query: String,
    pub(super) headers: HeaderMap,
    pub(super) body: Buffered,
    /// The body asks for a stream: each attempt's headers have a deadline.
    pub(super) asked: bool,
    /// The `model` it names (none: the pool that serves `""`).
    pub(super) model: Option<String>,
}

/// How the attempts ended.
pub(super) enum Outcome {
    /// A stream whose first event came.
    Stream(Started),
    /// A 2xx that is no stream (a non-streamed completion), to pass on as it is: its body
    /// holds the attempt's lease until it ends.
    Answer(Response),
    /// The last attempt's error status, passed on with its headers and whole body.
    Refused(Refused),
    /// No usable answer at all.
    GaveUp(GaveUp),
}

/// A stream, its first event come.
pub(super) struct Started {
    /// The attempt's hold on its replica: keep it until the stream ends.
    pub(super) lease: Lease<UpstreamUrl>,
    /// The events after the first.
    pub(super) events: Events,
    /// The first event with data.
    pub(super) first: SseEvent,
}

/// An error status no other attempt was made for.
pub(super) struct Refused {
    /// The upstream's answer.
    pub(super) response: Response,
    /// The model the refused attempt asked for.
    pub(super) model: String,
    /// The start of its body (what it says of the request).
    pub(super) said: Bytes,
    /// What it was, counted in `/stats`' `upstream_failures`.
    pub(super) cause: Cause,
}

/// Why a request got no usable answer: what its client is told.
#[derive(Debug)]
pub(super) struct GaveUp {
    pub(super) status: StatusCode,
    pub(super) message: String,
    /// The error object's `type` and `code`.
    pub(super) kind: &'static str,
    pub(super) code: Option<&'static str>,
    /// The last attempt's failure, counted in `/stats`' `upstream_failures` (none for a model no
    /// pool serves).
    pub(super) cause: Option<Cause>,
}

impl GaveUp {
    /// The answer: its status and an OpenAI error body.
    pub(super) fn response(&self) -> Response {
        let mut response = serving::json_error(self.status, &self.message, self.kind);
        if let Some(code) = self.code {
            let body = streamgate::openai::ApiError::new(&self.message, self.kind)
                .with_code(serde_json::Value::from(code))
                .to_json();
            *response.body_mut() = Body::from(body);
        }
        response
    }

    fn no_response(url: &UpstreamUrl, error: &UpstreamError) -> Self {
        let (status, message) = error::failure(url, error);
        GaveUp {
            status,
            message,
            kind: "upstream_error",
            code: None,
            cause: Some(error.cause()),
        }
    }
}

/// One attempt's failure: what it says of the upstream, and what the client gets if it is the
/// last.
struct Failed {
    failure: Failure,
    last: Outcome,
}

/// Runs `request`'s attempts until one succeeds or they give up. Each attempt's lease is held
/// while it runs; the successful one's goes with its stream (or its answer's body), a failed
/// one's is dropped at once.
pub(super) async fn run(proxy: Arc<Proxy>, request: Arc<Attempted>) -> Outcome {
    let requested = request.model.clone().unwrap_or_default();
    if proxy.fleet.pool_for(&requested).is_none() {
        return Outcome::GaveUp(GaveUp {
            status: StatusCode::NOT_FOUND,
            message: format!("no pool of this proxy serves the model `{requested}`"),
            kind: "invalid_request_error",
            code: Some("model_not_found"),
            cause: None,
        });
    }
    let attempts = proxy.fleet.attempts(&requested);
    let body = (requested, request.body.bytes.clone());
    run_with(&proxy, &request, body, attempts).await
}

/// `request`'s attempts with `body` (the model it names, and its bytes; the model rewritten
/// for each other model an attempt asks), as `attempts` say: a request's own (from [`run`]),
/// or those that carry on a stream that broke after its first event (with the original
/// request again, or its continuation).
pub(super) async fn run_with(
    proxy: &Arc<Proxy>,
    request: &Attempted,
    mut body: (String, Bytes),
    mut attempts: Attempts,
) -> Outcome {
    let fleet = proxy.fleet.clone();
    let base = body.1.clone();
    let mut last = None;
    loop {
        let model = attempts.model().to_owned();
        // Every fallback is served by some pool (checked at start).
        let lease = fleet.pool_for(&model).and_then(|pool| {
            Some((
                pool.replicas.len(),
                pool.replicas.pick(&model, attempts.avoid())?,
            ))
        });
        let Some((replicas, mut lease)) = lease else {
            match attempts.no_replica() {
                Next::Retry { after } | Next::Fallback { after } => {
                    tokio::time::sleep(after).await;
                    continue;
                }
                Next::GiveUp => return last.unwrap_or_else(|| nothing_left(&model)),
            }
        };
        if body.0 != model {
            body = (model.clone(), with_model(&base, &model));
        }
        if attempts.made() > 0 {
            proxy.stats.retried();
        }
        let url = lease.replica().clone();
        match attempt(proxy, &url, request, &model, body.1.clone()).await {
            Ok(Success::Stream { events, first }) => {
                lease.succeeded();
                if attempts.is_fallback() {
                    proxy.stats.fell_back();
                }
                return Outcome::Stream(Started {
                    lease,
                    events,
                    first,
                });
            }
            Ok(Success::Answer(response)) => {
                lease.succeeded();
                if attempts.is_fallback() {
                    proxy.stats.fell_back();
                }
                return Outcome::Answer(leased(response, lease));
            }
            Err(failed) => {
                lease.failed(&failed.failure);
                let next = attempts.failed(lease.index(), &failed.failure, replicas);
                // The failed attempt no longer counts as in flight there.
                drop(lease);
                match next {
                    Next::Retry { after } | Next::Fallback { after } => {
                        last = Some(failed.last);
                        tokio::time::sleep(after).await;
                    }
                    Next::GiveUp => return failed.last,
                }
            }
        }
    }
}

/// When every replica of `model` is avoided and no fallback is left, before any attempt.
fn nothing_left(model: &str) -> Outcome {
    Outcome::GaveUp(GaveUp {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: format!("no upstream of the model `{model}` is left to try"),
        kind: "upstream_error",
        code: None,
        cause: None,
    })
}

/// What an attempt that worked got.
enum Success {
    Stream { events: Events, first: SseEvent },
    Answer(Response),
}

/// One attempt: `request` (with `body`) at `url`, until its first event or its answer.
async fn attempt(
    proxy: &Proxy,
    url: &UpstreamUrl,
    request: &Attempted,
    model: &str,
    body: Bytes,
) -> Result<Success, Failed> {
    let no_response = |error: UpstreamError| Failed {
        failure: error.failure(),
        last: Outcome::GaveUp(GaveUp::no_response(url, &error)),
    };
    let send = proxy.upstream.send(
        url,
        Method::POST,
        &request.path_and_query,
        &request.headers,
        Body::from(body),
    );
    let limit = proxy.config.upstream_headers;
    let response = if request.asked {
        // A silent upstream is no answer: another replica, or the client is told.
        match tokio::time::timeout(limit, send).await {
            Ok(response) => response,
            Err(_) => return Err(no_response(UpstreamError::HeadersTimeout(limit))),
        }
    } else {
        // A non-streamed completion has its headers only once it is done.
        send.await
    };
    let response = response.map_err(no_response)?;
    let status = response.status();
    if !status.is_success() {
        return Err(refused(response, model).await);
    }
    if !is_event_stream(response.headers()) {
        return Ok(Success::Answer(pass_response(response)));
    }
    let mut events: Events = Box::pin(BodyDataStream::new(response.into_body()).sse_events());
    let first = first_event(proxy, url, &mut events).await?;
    Ok(Success::Stream { events, first })
}

/// The first event with data of a stream, within `--first-token-ms` and `--upstream-idle-ms`
/// (the lesser of those set): a stream that ends, breaks or says nothing before it is a failed
/// attempt.
async fn first_event(
    proxy: &Proxy,
    url: &UpstreamUrl,
    events: &mut Events,
) -> Result<SseEvent, Failed> {
    let config = &proxy.config;
    let limit = [config.first_token, config.upstream_idle]
        .into_iter()
        .filter(|limit| !limit.is_zero())
        .min();
    let deadline = limit.map(|limit| tokio::time::Instant::now() + limit);
    let failed = |failure: Failure, status: StatusCode, why: String| Failed {
        failure: failure.clone(),
        last: Outcome::GaveUp(GaveUp {
            status,
            message: format!("upstream {url} {why}"),
            kind: "upstream_error",
            code: None,
            cause: Some(failure.cause()),
        }),
    };
    loop {
        let next = events.next();
        let item = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, next).await {
                Ok(item) => item,
                Err(_) => {
                    let ms = limit.unwrap_or_default().as_millis();
                    return Err(failed(
                        Failure::FirstEventTimeout,
                        StatusCode::GATEWAY_TIMEOUT,
                        format!("sent no first event within {ms} ms"),
                    ));
                }
            },
            None => next.await,
        };
        let reset = |why: String| failed(Failure::Reset, StatusCode::BAD_GATEWAY, why);
        match item {
            None => return Err(reset("closed the stream before its first event".into())),
            Some(Err(error)) => {
                return Err(reset(format!("failed before its first event: {error}")));
            }
            // A `retry:` alone, no data.
            Some(Ok(event)) if event.data_str().is_none() => {}
            Some(Ok(event)) => return Ok(event),
        }
    }
}

/// An error answer, read far enough to classify it: its status, `Retry-After` and the
/// `error.code` of its body; passed on whole if it is the last.
async fn refused(response: hyper::Response<Incoming>, model: &str) -> Failed {
    let retry_after = response
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(retry_after);
    let status = response.status().as_u16();
    let (parts, body) = pass_response(response).into_parts();
    let (prefix, rest) = read_prefix(body).await;
    let failure = Failure::status(status, retry_after, error_code(&prefix));
    let said = prefix.clone();
    let chunks = futures_util::stream::once(async move { Ok::<_, axum::Error>(prefix) })
        .chain(BodyDataStream::new(rest));
    let body = Body::from_stream(chunks);
    Failed {
        last: Outcome::Refused(Refused {
            response: Response::from_parts(parts, body),
            model: model.to_owned(),
            said: said.clone(),
            cause: failure.cause(),
        }),
        failure,
    }
}

/// The first [`ERROR_PREFIX`] bytes of `body` (what arrives of them within
/// [`ERROR_BODY_TIME`]), and the rest of it.
pub(super) async fn read_prefix(mut body: Body) -> (Bytes, Body) {
    let mut prefix = Vec::new();
    let read = async {
        while prefix.len() < ERROR_PREFIX {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        prefix.extend_from_slice(&data);
                    }
                }
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(ERROR_BODY_TIME, read).await;
    (Bytes::from(prefix), body)
}

/// A `Retry-After` value: delay seconds, or an HTTP date (its time from now; a date past is no
/// wait).
fn retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(SystemTime::now()).unwrap_or_default())
}

/// What an error body says of the request, from its `error.code` or `error.type` (OpenAI,
/// llama.cpp), its top-level `code` or `type` (vLLM), or a message that says the context is too
/// small (vLLM's `BadRequestError` carries only that).
fn error_code(body: &[u8]) -> Option<ErrorCode> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let object = value
        .get("error")
        .filter(|error| error.is_object())
        .unwrap_or(&value);
    let named = ["code", "type"]
        .iter()
        .filter_map(|key| object.get(key).and_then(serde_json::Value::as_str))
        .find_map(ErrorCode::from_body);
    if named.is_some() {
        return named;
    }
    let message = object
        .get("message")
        .or_else(|| value.get("message"))
        .and_then(serde_json::Value::as_str)?;
    let message = message.to_ascii_lowercase();
    [
        "maximum context length",
        "context length",
        "exceeds the available context size",
    ]
    .iter()
    .any(|phrase| message.contains(phrase))
    .then_some(ErrorCode::ContextLength)
}

/// `body` (a JSON object) with its `model` set to `model`, for a fallback's attempt; `body` as
/// it is when it is no JSON object.
fn with_model(body: &Bytes, model: &str) -> Bytes {
    match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body) {
        Ok(mut object) => {
            object.insert("model".to_owned(), model.into());
            Bytes::from(serde_json::Value::Object(object).to_string())
        }
        Err(_) => body.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        assert_eq!(retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(retry_after(" 0 "), Some(Duration::ZERO));
        let soon = SystemTime::now() + Duration::from_secs(30);
        let asked = retry_after(&httpdate::fmt_http_date(soon)).unwrap();
        assert!(asked > Duration::from_secs(28) && asked <= Duration::from_secs(30));
        let past = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(30));
        assert_eq!(retry_after(&past), Some(Duration::ZERO));
        assert_eq!(retry_after("soon"), None);
        assert_eq!(retry_after("-1"), None);
    }

    #[test]
    fn error_bodies_say_what_is_wrong_with_the_request() {
        let openai = br#"{"error":{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        assert_eq!(error_code(openai), Some(ErrorCode::ContextLength));
        let llama = br#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}}"#;
        assert_eq!(error_code(llama), Some(ErrorCode::ContextLength));
        let vllm = br#"{"object":"error","message":"This model's maximum context length is 2048 tokens.","type":"BadRequestError","code":400}"#;
        assert_eq!(error_code(vllm), Some(ErrorCode::ContextLength));
        let policy = br#"{"error":{"message":"no","type":"invalid_request_error","code":"content_policy_violation"}}"#;
        assert_eq!(error_code(policy), Some(ErrorCode::ContentPolicy));
        let invalid = br#"{"error":{"message":"bad temperature","type":"invalid_request_error","code":null}}"#;
        assert_eq!(error_code(invalid), Some(ErrorCode::InvalidRequest));
        let busy = br#"{"error":{"message":"overloaded","type":"server_error"}}"#;
        assert_eq!(error_code(busy), None);
        assert_eq!(error_code(b"<html>502</html>"), None);
        assert_eq!(error_code(b""), None);
    }

    #[test]
    fn a_fallback_names_its_model() {
        let body = Bytes::from_static(br#"{"model":"big","messages":[],"stream":true}"#);
        let moved: serde_json::Value = serde_json::from_slice(&with_model(&body, "small")).unwrap();
        assert_eq!(moved["model"], "small");
        assert_eq!(moved["stream"], true);
        let odd = Bytes::from_static(b"not json");
        assert_eq!(with_model(&odd, "small"), odd);
    }
}
