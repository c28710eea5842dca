//! A request as the reference server reads it, in any of its formats: the model, the tokens
//! asked for, whether to stream, and where the answer starts (a new one, or the continuation
//! of a final assistant message).

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::Value;

use super::format::Format;
use super::meta::first_tokens;

/// `max_tokens` when a request gives none.
pub(super) const DEFAULT_MAX_TOKENS: u64 = 16;
/// The most `max_tokens` a request may ask for.
pub(super) const MAX_TOKENS_LIMIT: u64 = 1_000_000;
/// The `model` of a stream a request named none for.
pub(super) const MODEL: &str = "streamgate-sim";

/// A `POST /v1/chat/completions`, `/v1/messages` or `/v1/responses` body, checked.
#[derive(Debug)]
pub(super) struct Request {
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
    /// 400 with an `invalid_request_error` body in `format`'s shape.
    pub(super) fn response(&self, format: Format) -> Response {
        format.error_response(StatusCode::BAD_REQUEST, "invalid_request_error", &self.0)
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

/// `n`, the value of the request's `field` (`max_tokens`), from 1 to [`MAX_TOKENS_LIMIT`].
pub(super) fn max_tokens(field: &str, n: Option<u64>) -> Result<u64, BadRequest> {
    n.filter(|n| (1..=MAX_TOKENS_LIMIT).contains(n))
        .ok_or_else(|| format!("`{field}` must be an integer from 1 to {MAX_TOKENS_LIMIT}").into())
}

impl Request {
    /// Reads `body`, a request of `format`: the conversation is chat's and Messages'
    /// `messages` (an array), Responses' `input` (an array of items, or a string: one user
    /// message); the new tokens are bounded by `max_tokens` (Responses: `max_output_tokens`).
    /// A final assistant message (an item with `"role": "assistant"`) is continued (with or
    /// without `"continue_final_message": true`, as llama.cpp does; as Anthropic does a
    /// prefill) unless `no_prefill`; its text is matched against the stream's first tokens,
    /// salted when `salted`.
    ///
    /// # Errors
    ///
    /// Malformed JSON, no conversation, a token bound out of range, a
    /// `continue_final_message` that is no boolean or has no assistant message to continue,
    /// and, with `no_prefill`, a final assistant message.
    pub(super) fn parse(
        format: Format,
        body: &[u8],
        no_prefill: bool,
        salted: bool,
    ) -> Result<Self, BadRequest> {
        let request: Value =
            serde_json::from_slice(body).map_err(|_| "the body is not valid JSON")?;
        let (conversation, bound) = format.request_fields();
        let messages = match request.get(conversation) {
            Some(Value::Array(messages)) => messages.as_slice(),
            Some(Value::String(_)) if format == Format::Responses => &[],
            _ if format == Format::Responses => {
                return Err("`input` is required: a string or an array of items".into());
            }
            _ => return Err(format!("`{conversation}` is required and must be an array").into()),
        };
        let max_tokens = match request.get(bound) {
            None | Some(Value::Null) => DEFAULT_MAX_TOKENS,
            Some(value) => max_tokens(bound, value.as_u64())?,
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
        Ok(Request {
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

    fn parse(body: &str) -> Result<Request, String> {
        Request::parse(Format::Chat, body.as_bytes(), false, false).map_err(|bad| bad.0)
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
        let request = Request::parse(Format::Chat, salted.as_bytes(), false, true).unwrap();
        let salt = Some(0x1f);
        assert_eq!(request.start, Start::Continue { from: 2, salt });
    }

    #[test]
    fn refusals_say_why() {
        let assistant = r#"{"messages":[{"role":"assistant","content":"t0 "}]}"#;
        let refused = Request::parse(Format::Chat, assistant.as_bytes(), true, false).unwrap_err();
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

    #[test]
    fn messages_and_responses_bodies_are_read_as_their_apis_write_them() {
        let read = |format, body: &str| Request::parse(format, body.as_bytes(), false, false);
        let prefill = r#"{"model":"m","max_tokens":5,"stream":true,"messages":[
            {"role":"user","content":"hi"},
            {"role":"assistant","content":[{"type":"text","text":"t0 t1 "}]}]}"#;
        let request = read(Format::Messages, prefill).unwrap();
        let continued = Start::Continue {
            from: 2,
            salt: None,
        };
        assert_eq!((request.model.as_str(), request.max_tokens), ("m", 5));
        assert!(request.stream);
        assert_eq!(request.start, continued);
        let refused = Request::parse(Format::Messages, prefill.as_bytes(), true, false);
        assert!(refused.unwrap_err().0.contains("prefill"));

        let text = r#"{"model":"m","input":"hi","max_output_tokens":7}"#;
        let request = read(Format::Responses, text).unwrap();
        assert_eq!((request.max_tokens, request.start), (7, Start::New));
        let items = r#"{"input":[{"type":"message","role":"user","content":"hi"},
            {"type":"message","role":"assistant","status":"in_progress",
             "content":[{"type":"output_text","text":"t0 t1 "}]}]}"#;
        assert_eq!(read(Format::Responses, items).unwrap().start, continued);
        for (format, body, why) in [
            (Format::Responses, r#"{"model":"m"}"#, "`input`"),
            (
                Format::Responses,
                r#"{"input":"hi","max_output_tokens":0}"#,
                "`max_output_tokens`",
            ),
            (Format::Responses, r#"{"input":{}}"#, "`input`"),
            (Format::Messages, r#"{"messages":"hi"}"#, "`messages`"),
            (
                Format::Messages,
                r#"{"messages":[],"max_tokens":1000001}"#,
                "`max_tokens`",
            ),
        ] {
            let refused = read(format, body).unwrap_err().0;
            assert!(refused.contains(why), "{body}: {refused}");
        }
    }
}
