//! What `sim` and the proxy answer on the resume paths: the position a resume asks for, and the
//! registry's refusals (`streamgate::resume`'s errors) as HTTP responses.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};
use streamgate::resume::{AttachError, ClaimError, RegisterError, RegistryStats, StoreError};

use crate::serving;

/// The position a resume asks for, an extractor: `?after=n`, else `Last-Event-ID: n` (`None`:
/// from the start); rejected with 400 when either is given and is no [event id](event_id).
#[derive(Debug, Clone, Copy)]
pub struct ResumeAfter(pub Option<u64>);

impl<S: Send + Sync> FromRequestParts<S> for ResumeAfter {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Response> {
        let mut after = last_event_id(&parts.headers).map_err(IntoResponse::into_response)?;
        for pair in parts.uri.query().unwrap_or("").split('&') {
            if let Some(value) = pair.strip_prefix("after=") {
                let n = event_id(value).ok_or(NotAnEventId("`after`"));
                after = Some(n.map_err(IntoResponse::into_response)?);
            }
        }
        Ok(ResumeAfter(after))
    }
}

/// A Responses stream served again, as OpenAI serves a background response: `GET
/// /v1/responses/{id}?stream=true[&starting_after=N]`. `streamed` says whether the query asked
/// for the stream; `after` is `starting_after` (or, without it, `Last-Event-ID`); rejected with
/// 400 when either is given and is no [event id](event_id).
#[derive(Debug, Clone, Copy)]
pub struct StartingAfter {
    pub streamed: bool,
    pub after: Option<u64>,
}

impl<S: Send + Sync> FromRequestParts<S> for StartingAfter {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Response> {
        let mut after = last_event_id(&parts.headers).map_err(IntoResponse::into_response)?;
        let mut streamed = false;
        for pair in parts.uri.query().unwrap_or("").split('&') {
            match pair.split_once('=') {
                Some(("stream", value)) => streamed = value == "true",
                Some(("starting_after", value)) => {
                    let n = event_id(value).ok_or(NotAnEventId("`starting_after`"));
                    after = Some(n.map_err(IntoResponse::into_response)?);
                }
                _ => {}
            }
        }
        Ok(StartingAfter { streamed, after })
    }
}

/// `text` as an event id: decimal digits only (no sign, space or fraction) of a number that
/// fits in 64 bits.
pub fn event_id(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The `Last-Event-ID` header as an event id: `None` when it is absent or empty (the SSE
/// meaning of an empty last event id: none), refused when it is anything but an
/// [event id](event_id) (surrounding spaces aside), so a client that had events is never
/// replayed them from the start.
///
/// # Errors
///
/// [`NotAnEventId`], a 400 as a response.
pub fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, NotAnEventId> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().map(str::trim).unwrap_or("?");
    if text.is_empty() {
        return Ok(None);
    }
    event_id(text)
        .map(Some)
        .ok_or(NotAnEventId("`Last-Event-ID`"))
}

/// A position that is no event id: the header or parameter that gave it (`` `after` ``).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAnEventId(pub &'static str);

impl IntoResponse for NotAnEventId {
    /// 400 with an OpenAI-style `invalid_request_error` naming the header or parameter.
    fn into_response(self) -> Response {
        serving::json_error(
            StatusCode::BAD_REQUEST,
            &format!(
                "{} must be an event id (a whole number, as the stream's `id:` lines give)",
                self.0
            ),
            "invalid_request_error",
        )
    }
}

/// 404 for an unknown (or expired) stream, 409 for a position its log no longer holds, 204 when
/// nothing follows the position of a finished stream (which stops an `EventSource` from
/// reconnecting after `[DONE]`), 503 when the store failed.
pub fn attach_error(error: &AttachError) -> Response {
    match error {
        AttachError::Finished => StatusCode::NO_CONTENT.into_response(),
        AttachError::Gone { .. } => {
            serving::json_error(StatusCode::CONFLICT, &error.to_string(), "conflict_error")
        }
        AttachError::Unavailable(failure) => unavailable(failure),
        _ => serving::json_error(StatusCode::NOT_FOUND, &error.to_string(), "not_found_error"),
    }
}

/// 409 for an id that names another stream (`name` says what the id is: "x-request-id
/// r1"), saying where to resume it; 503 when the store failed.
pub fn claim_error(name: &str, id: &str, error: &ClaimError) -> Response {
    let why = match error {
        ClaimError::Running => "is running",
        ClaimError::Retained => "recently finished (it is retained for its grace)",
        ClaimError::Unavailable(failure) => return unavailable(failure),
        _ => "is taken",
    };
    serving::json_error(
        StatusCode::CONFLICT,
        &format!(
            "a stream with {name} {why}: resume it at /v1/chat/completions/{id}/stream (or \
             /v1/messages/{id}/stream, /v1/responses/{id}?stream=true), or send another id"
        ),
        "conflict_error",
    )
}

/// 503 when the store failed; a registry given another's claim is the server's own bug (500).
pub fn register_error(error: &RegisterError) -> Response {
    match error {
        RegisterError::Unavailable(failure) => unavailable(failure),
        _ => serving::json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &error.to_string(),
            "server_error",
        ),
    }
}

/// A resume registry's counts as `/stats` fields, the same in both servers: `streams_detached`
/// (waiting for a resume now), `streams_resumed` (attaches so far), `streams_expired` (graces
/// that ran out), `streams_adopted` (taken over from an instance that died, sharing a Redis
/// store), `replay_bytes` (held in the replay logs now).
pub fn stats_fields(stats: &RegistryStats, fields: &mut Map<String, Value>) {
    let counts: [(&str, Value); 5] = [
        ("streams_detached", stats.detached.into()),
        ("streams_resumed", stats.resumed.into()),
        ("streams_expired", stats.expired.into()),
        ("streams_adopted", stats.adopted.into()),
        ("replay_bytes", stats.log_bytes.into()),
    ];
    fields.extend(counts.map(|(name, value)| (name.to_owned(), value)));
}

/// 503: the resume store failed, with what it said.
pub fn unavailable(failure: &StoreError) -> Response {
    serving::json_error(
        StatusCode::SERVICE_UNAVAILABLE,
        &serving::with_causes(failure),
        "server_error",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_id_is_digits_that_fit() {
        assert_eq!(event_id("0"), Some(0));
        assert_eq!(event_id("41"), Some(41));
        assert_eq!(event_id(&u64::MAX.to_string()), Some(u64::MAX));
        for bad in [
            "",
            "abc",
            "-1",
            "+1",
            "1.5",
            " 1",
            "1e3",
            "99999999999999999999",
        ] {
            assert_eq!(event_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn last_event_id_is_as_strict_and_an_empty_one_is_none() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("last-event-id", value.parse().unwrap());
            last_event_id(&headers).map_err(|refused| refused.into_response().status())
        };
        assert_eq!(last_event_id(&HeaderMap::new()).ok(), Some(None));
        assert_eq!(with("").ok(), Some(None));
        assert_eq!(with("7").ok(), Some(Some(7)));
        for bad in ["abc", "-1", "1.5", "99999999999999999999"] {
            assert_eq!(with(bad).err(), Some(StatusCode::BAD_REQUEST), "{bad:?}");
        }
    }
}
