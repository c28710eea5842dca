//! A chat request as the reference server reads it: the model, the tokens asked for, whether to
//! stream, and where the answer starts (a new one, or the continuation of a final assistant
//! message).

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::Value;

use super::meta::first_tokens;
use crate::serving;

/// `max_tokens` when a request gives none.
pub(super) const DEFAULT_MAX_TOKENS: u64 = 16;
/// The most `max_tokens` a request may ask for.
pub(super) const MAX_TOKENS_LIMIT: u64 = 1_000_000;
/// The `model` of a stream a request named none for.
pub(super) const MODEL: &str = "streamgate-sim";

/// A `POST /v1/chat/completions` body, checked.
#[derive(Debug)]
pub(super) struct ChatRequest {
    pub(super) model: String,
    /// The new tokens asked for (a continuation's prefix is not counted).
    pub(super) max_tokens: u64,
    pub(super) stream: bool,
    pub(super) start: Start,
}

/// Where an answer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Start {
    /// A new answer, from token 0, its first chunk naming the author.
    New,
    /// The continuation of the final assistant message: from token `from` (the message was
    /// the first `from` tokens of the text; else 0), carrying the message's `salt` if it had
    /// one, with no role chunk.
    Continue { from: u64, salt: Option<u64> },
}

/// A request refused with 400 (`invalid_request_error`), saying why.
#[derive(Debug)]
pub(super) struct BadRequest(String);

impl BadRequest {
    /// 400 with an OpenAI-style error body.
    pub(super) fn response(&self) -> Response {
        serving::json_error(StatusCode::BAD_REQUEST, &self.0, "invalid_request_error")
    }
}

impl From<&str> for BadRequest {
    fn from(message: &str) -> Self {
        BadRequest(message.to_owned())
    }
}

impl From<String> for BadRequest {
    fn from(message: String) -> Self {
        BadRequest(message)
    }
}

/// The refusal of a `max_tokens` out of the contract's range.
pub(super) fn bad_max_tokens() -> BadRequest {
    format!("`max_tokens` must be an integer from 1 to {MAX_TOKENS_LIMIT}").into()
}

/// `max_tokens` from 1 to [`MAX_TOKENS_LIMIT`].
pub(super) fn max_tokens(n: Option<u64>) -> Result<u64, BadRequest> {
    n.filter(|n| (1..=MAX_TOKENS_LIMIT).contains(n))
        .ok_or_else(bad_max_tokens)
}

impl ChatRequest {
    /// Reads `body`. A final assistant message is continued (with or without
    /// `"continue_final_message": true`, as llama.cpp does) unless `no_prefill`; its text is
    /// matched against the stream's first tokens, salted when `salted`.
    ///
    /// # Errors
    ///
    /// Malformed JSON, no `messages` array, a `max_tokens` out of range, a
    /// `continue_final_message` that is no boolean or has no assistant message to continue,
    /// and, with `no_prefill`, a final assistant message.
    pub(super) fn parse(body: &[u8], no_prefill: bool, salted: bool) -> Result<Self, BadRequest> {
        let request: Value =
            serde_json::from_slice(body).map_err(|_| "the body is not valid JSON")?;
        let Some(messages) = request.get("messages").and_then(Value::as_array) else {
            return Err("`messages` is required and must be an array".into());
        };
        let max_tokens = match request.get("max_tokens") {
            None | Some(Value::Null) => DEFAULT_MAX_TOKENS,
            Some(value) => max_tokens(value.as_u64())?,
        };
        let asked = match request.get("continue_final_message") {
            None | Some(Value::Null) => false,
            Some(value) => value
                .as_bool()
                .ok_or("`continue_final_message` must be a boolean")?,
        };
        let last = messages.last();
        let start =
            match last.filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant")) {
                Some(_) if no_prefill => {
                    return Err(
                        "this model does not support assistant message prefill: the \
                            last message must be the user's (the server runs with \
                            --no-prefill)"
                            .into(),
                    );
                }
                Some(message) => {
                    let (from, salt) = first_tokens(&content(message), salted).unwrap_or((0, None));
                    Start::Continue { from, salt }
                }
                None if asked => {
                    return Err("`continue_final_message` needs a final message from the \
                            assistant to continue"
                        .into());
                }
                None => Start::New,
            };
        Ok(ChatRequest {
            model: request
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or(MODEL)
                .to_owned(),
            max_tokens,
            stream: request.get("stream").and_then(Value::as_bool) == Some(true),
            start,
        })
    }
}

/// A message's text: its `content` string, or the text of its content parts
/// (`[{"type":"text","text":..}]`) joined; empty for anything else.
fn content(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<ChatRequest, String> {
        ChatRequest::parse(body.as_bytes(), false, false).map_err(|bad| bad.0)
    }

    fn start(body: &str) -> Start {
        parse(body).unwrap().start
    }

    #[test]
    fn a_final_assistant_message_is_continued_from_the_tokens_it_holds() {
        let user = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(start(user), Start::New);
        let continued = |content: &str, flag: &str| {
            start(&format!(
                r#"{{"messages":[{{"role":"user","content":"hi"}},{{"role":"assistant","content":{content}}}]{flag}}}"#
            ))
        };
        let from = |from| Start::Continue { from, salt: None };
        for flag in ["", r#","continue_final_message":true"#] {
            assert_eq!(continued(r#""t0 t1 t2 ""#, flag), from(3), "{flag}");
            assert_eq!(continued(r#""Once upon a time""#, flag), from(0));
            assert_eq!(
                continued(r#""t0 t1 t2""#, flag),
                from(0),
                "a token cut short"
            );
            assert_eq!(continued(r#""""#, flag), from(0));
            assert_eq!(continued("null", flag), from(0));
            let parts = r#"[{"type":"text","text":"t0 t1 "},{"type":"text","text":"t2 "}]"#;
            assert_eq!(continued(parts, flag), from(3));
        }
        let salted = r#"{"messages":[{"role":"assistant","content":"t0.1f t1.1f "}]}"#;
        let request = ChatRequest::parse(salted.as_bytes(), false, true).unwrap();
        let salt = Some(0x1f);
        assert_eq!(request.start, Start::Continue { from: 2, salt });
    }

    #[test]
    fn refusals_say_why() {
        let assistant = r#"{"messages":[{"role":"assistant","content":"t0 "}]}"#;
        let refused = ChatRequest::parse(assistant.as_bytes(), true, false).unwrap_err();
        assert!(refused.0.contains("prefill"), "{}", refused.0);
        for (body, why) in [
            ("{", "JSON"),
            (r#"{"model":"m"}"#, "`messages`"),
            (r#"{"messages":[],"max_tokens":0}"#, "`max_tokens`"),
            (
                r#"{"messages":[],"continue_final_message":"yes"}"#,
                "boolean",
            ),
            (
                r#"{"messages":[{"role":"user","content":"hi"}],"continue_final_message":true}"#,
                "assistant",
            ),
        ] {
            let refused = parse(body).unwrap_err();
            assert!(refused.contains(why), "{body}: {refused}");
        }
        let flag_off =
            r#"{"messages":[{"role":"user","content":"hi"}],"continue_final_message":false}"#;
        assert_eq!(start(flag_off), Start::New);
    }
}
