//! A request as a server reads it, in any of its formats: the model, the conversation, the
//! sampling it asks for, the tokens asked for, whether to stream, and whether it continues a
//! final assistant message.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::Value;

use super::format::Format;

/// `max_tokens` when a request gives none, for sim (a model's worker goes on to the end of
/// its answer or its context).
pub const DEFAULT_MAX_TOKENS: u64 = 16;
/// The most `max_tokens` a request may ask for.
pub(super) const MAX_TOKENS_LIMIT: u64 = 1_000_000;
/// The most stop sequences a request may give (OpenAI's limit).
const MAX_STOPS: usize = 4;

/// A `POST /v1/chat/completions`, `/v1/messages` or `/v1/responses` body, checked.
#[derive(Debug)]
pub struct Request {
    /// The model it names (none: the worker's own name).
    pub model: Option<String>,
    /// The new tokens asked for (a continued message's text is not counted); none: as many
    /// as the worker gives (sim: [`DEFAULT_MAX_TOKENS`]; a model: to the end of its answer or
    /// its context).
    pub max_tokens: Option<u64>,
    pub stream: bool,
    /// The conversation in order, a system prompt given apart (Messages' `system`, Responses'
    /// `instructions`) first.
    pub conversation: Vec<Turn>,
    /// Whether the answer continues the conversation's final message, the assistant's.
    pub continues: bool,
    pub sampling: Sampling,
}

/// One message of a conversation: who said it, and its text (a string, or its text parts
/// joined; parts of other kinds, such as images, are not read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    pub role: Role,
    pub text: String,
}

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    /// OpenAI's name for the system prompt of newer models.
    Developer,
    User,
    Assistant,
    Tool,
}

impl Role {
    /// The role named `name` in a request.
    fn parse(name: &str) -> Option<Role> {
        Some(match name {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            _ => return None,
        })
    }

    /// As a request (and a chat template) names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// The sampling a request asks for; a field it left out is the server's default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    /// From 0 (greedy) to 2.
    pub temperature: Option<f32>,
    /// Nucleus sampling, from 0 to 1.
    pub top_p: Option<f32>,
    /// The seed of the random draw, for answers that repeat.
    pub seed: Option<u64>,
    /// Texts that end the answer where it would write one (not included): chat's `stop`,
    /// Messages' `stop_sequences`; at most 4, none empty.
    pub stop: Vec<String>,
    /// The answer goes on past the model's end-of-generation token, to its token bound (`ignore_eos`, as
    /// vLLM and llama.cpp's server take it: for benchmarks of a fixed length).
    pub ignore_eos: bool,
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
    /// `messages` (an array, each with a `role`; Messages' `system` before it), Responses'
    /// `input` (an array of items, or a string: one user message; `instructions` before it);
    /// the new tokens are bounded by `max_tokens` (Responses: `max_output_tokens`). A final
    /// assistant message (an item with `"role": "assistant"`) is continued (with or without
    /// `"continue_final_message": true`, as llama.cpp does; as Anthropic does a prefill)
    /// unless `no_prefill`.
    ///
    /// # Errors
    ///
    /// Malformed JSON, no conversation, a message with no role or an unknown one, a token
    /// bound out of range, sampling out of range (`temperature`, `top_p`, `seed`, stop
    /// sequences), a `continue_final_message` that is no boolean or has no assistant message
    /// to continue, and, with `no_prefill`, a final assistant message.
    pub(super) fn parse(format: Format, body: &[u8], no_prefill: bool) -> Result<Self, BadRequest> {
        let request: Value =
            serde_json::from_slice(body).map_err(|_| "the body is not valid JSON")?;
        let (field, bound) = format.request_fields();
        let mut conversation = Vec::new();
        let system = format.system_field().and_then(|field| request.get(field));
        if let Some(system) = system.filter(|system| !system.is_null()) {
            conversation.push(Turn {
                role: Role::System,
                text: content(system),
            });
        }
        // Whether the last message (or Responses item) is the assistant's.
        let mut continues = false;
        match request.get(field) {
            Some(Value::Array(messages)) => {
                for message in messages {
                    // A Responses input item that is no message (a tool call's output, say)
                    // is not part of the conversation's text, and no assistant message.
                    let role = message.get("role");
                    continues = role.and_then(Value::as_str) == Some("assistant");
                    if role.is_none() && format == Format::Responses {
                        continue;
                    }
                    let role = match role.and_then(Value::as_str) {
                        Some(name) => Role::parse(name).ok_or_else(|| {
                            format!(
                                "unknown `role` {name:?}: system, developer, user, assistant \
                                 or tool"
                            )
                        })?,
                        None => {
                            return Err("every message needs a `role`: system, developer, \
                                        user, assistant or tool"
                                .into());
                        }
                    };
                    let text = message.get("content").map(content).unwrap_or_default();
                    conversation.push(Turn { role, text });
                }
            }
            Some(Value::String(text)) if format == Format::Responses => conversation.push(Turn {
                role: Role::User,
                text: text.clone(),
            }),
            _ if format == Format::Responses => {
                return Err("`input` is required: a string or an array of items".into());
            }
            _ => return Err(format!("`{field}` is required and must be an array").into()),
        }
        // Chat's newer name for the bound, when the older is not given.
        let (bound, asked) = match (request.get(bound), format.newer_bound_field()) {
            (None | Some(Value::Null), Some(newer)) => (newer, request.get(newer)),
            (asked, _) => (bound, asked),
        };
        let max_tokens = match asked {
            None | Some(Value::Null) => None,
            Some(value) => Some(max_tokens(bound, value.as_u64())?),
        };
        let asked = match request.get("continue_final_message") {
            None | Some(Value::Null) => false,
            Some(value) => value
                .as_bool()
                .ok_or("`continue_final_message` must be a boolean")?,
        };
        if continues && no_prefill {
            return Err(
                "this model does not support assistant message prefill: the last \
                        message must be the user's (the server runs with --no-prefill)"
                    .into(),
            );
        }
        if asked && !continues {
            return Err(
                "`continue_final_message` needs a final message from the assistant \
                        to continue"
                    .into(),
            );
        }
        Ok(Request {
            model: request
                .get("model")
                .and_then(Value::as_str)
                .map(str::to_owned),
            max_tokens,
            stream: request.get("stream").and_then(Value::as_bool) == Some(true),
            conversation,
            continues,
            sampling: Sampling::parse(format, &request)?,
        })
    }

    /// A request with no conversation for `max_tokens` tokens in a stream, with the default
    /// model and sampling (`GET /v1/stream`'s).
    pub(super) fn empty(max_tokens: Option<u64>) -> Self {
        Request {
            model: None,
            max_tokens,
            stream: true,
            conversation: Vec::new(),
            continues: false,
            sampling: Sampling::default(),
        }
    }

    /// The final assistant message's text, which the answer continues (none: it does not).
    pub fn continued_text(&self) -> Option<&str> {
        self.continues
            .then(|| self.conversation.last().map(|turn| turn.text.as_str()))
            .flatten()
    }
}

impl Sampling {
    /// The sampling fields of `request`, a body of `format`.
    fn parse(format: Format, request: &Value) -> Result<Self, BadRequest> {
        let number = |field: &str, max: f32| -> Result<Option<f32>, BadRequest> {
            match request.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(value) => value
                    .as_f64()
                    .map(|n| n as f32)
                    .filter(|n| (0.0..=max).contains(n))
                    .map(Some)
                    .ok_or_else(|| format!("`{field}` must be a number from 0 to {max}").into()),
            }
        };
        // A negative seed asks for a random one, as llama.cpp's servers take it.
        let seed = match request.get("seed") {
            None | Some(Value::Null) => None,
            Some(value) if value.as_i64().is_some_and(|seed| seed < 0) => None,
            Some(value) => Some(value.as_u64().ok_or("`seed` must be an integer")?),
        };
        let field = format.stop_field();
        let stop = match field.and_then(|field| request.get(field)) {
            None | Some(Value::Null) => Some(Vec::new()),
            Some(Value::String(stop)) => Some(vec![stop.clone()]),
            Some(Value::Array(stops)) => stops
                .iter()
                .map(|stop| stop.as_str().map(str::to_owned))
                .collect(),
            Some(_) => None,
        };
        let stop = stop
            .filter(|stop| stop.len() <= MAX_STOPS && !stop.iter().any(String::is_empty))
            .ok_or_else(|| {
                format!(
                    "`{}` must be a string or an array of at most {MAX_STOPS} non-empty strings",
                    field.unwrap_or_default()
                )
            })?;
        let ignore_eos = match request.get("ignore_eos") {
            None | Some(Value::Null) => false,
            Some(value) => value.as_bool().ok_or("`ignore_eos` must be a boolean")?,
        };
        Ok(Sampling {
            temperature: number("temperature", 2.0)?,
            top_p: number("top_p", 1.0)?,
            seed,
            stop,
            ignore_eos,
        })
    }
}

/// A message's text: its `content` string, or the text of its content parts
/// (`[{"type":"text","text":..}]`) joined; empty for anything else.
fn content(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
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
        Request::parse(Format::Chat, body.as_bytes(), false).map_err(|bad| bad.0)
    }

    #[test]
    fn a_final_assistant_message_is_continued() {
        let user = parse(r#"{"messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        assert!(!user.continues);
        assert_eq!(user.continued_text(), None);
        let continued = |content: &str, flag: &str| {
            parse(&format!(
                r#"{{"messages":[{{"role":"user","content":"hi"}},{{"role":"assistant","content":{content}}}]{flag}}}"#
            ))
            .unwrap()
        };
        for flag in ["", r#","continue_final_message":true"#] {
            let request = continued(r#""t0 t1 t2 ""#, flag);
            assert_eq!(request.continued_text(), Some("t0 t1 t2 "), "{flag}");
            assert_eq!(continued("null", flag).continued_text(), Some(""));
            let parts = r#"[{"type":"text","text":"t0 t1 "},{"type":"text","text":"t2 "}]"#;
            assert_eq!(continued(parts, flag).continued_text(), Some("t0 t1 t2 "));
        }
        let request = continued(r#""Once""#, "");
        let roles: Vec<_> = request.conversation.iter().map(|turn| turn.role).collect();
        assert_eq!(roles, [Role::User, Role::Assistant]);
    }

    #[test]
    fn refusals_say_why() {
        let assistant = r#"{"messages":[{"role":"assistant","content":"t0 "}]}"#;
        let refused = Request::parse(Format::Chat, assistant.as_bytes(), true).unwrap_err();
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
            (r#"{"messages":[{"content":"hi"}]}"#, "needs a `role`"),
            (
                r#"{"messages":[{"role":"robot","content":"hi"}]}"#,
                "unknown `role` \"robot\"",
            ),
            (r#"{"messages":[],"temperature":2.5}"#, "`temperature`"),
            (r#"{"messages":[],"temperature":"hot"}"#, "`temperature`"),
            (r#"{"messages":[],"top_p":-0.1}"#, "`top_p`"),
            (r#"{"messages":[],"seed":1.5}"#, "`seed`"),
            (r#"{"messages":[],"stop":""}"#, "`stop`"),
            (r#"{"messages":[],"stop":["a",1]}"#, "`stop`"),
            (r#"{"messages":[],"stop":["a","b","c","d","e"]}"#, "`stop`"),
            (r#"{"messages":[],"stop":{"a":1}}"#, "`stop`"),
            (r#"{"messages":[],"ignore_eos":1}"#, "`ignore_eos`"),
        ] {
            let refused = parse(body).unwrap_err();
            assert!(refused.contains(why), "{body}: {refused}");
        }
        let flag_off =
            r#"{"messages":[{"role":"user","content":"hi"}],"continue_final_message":false}"#;
        assert!(!parse(flag_off).unwrap().continues);
    }

    #[test]
    fn sampling_is_read_as_the_apis_write_it() {
        let body = r#"{"messages":[],"temperature":0,"top_p":0.9,"seed":7,"stop":"\n\n",
            "ignore_eos":true}"#;
        let sampling = Sampling {
            temperature: Some(0.0),
            top_p: Some(0.9),
            seed: Some(7),
            stop: vec!["\n\n".into()],
            ignore_eos: true,
        };
        assert_eq!(parse(body).unwrap().sampling, sampling);
        // A negative seed is llama.cpp's "random".
        let random = parse(r#"{"messages":[],"seed":-1}"#).unwrap().sampling;
        assert_eq!(random.seed, None);
        assert_eq!(
            parse(r#"{"messages":[]}"#).unwrap().sampling,
            Sampling::default()
        );
        let messages = r#"{"messages":[],"max_tokens":5,"stop_sequences":["END"],"stop":"x"}"#;
        let request = Request::parse(Format::Messages, messages.as_bytes(), false).unwrap();
        assert_eq!(request.sampling.stop, ["END"], "Messages' own field");
    }

    #[test]
    fn messages_and_responses_bodies_are_read_as_their_apis_write_them() {
        let read = |format, body: &str| Request::parse(format, body.as_bytes(), false);
        let prefill = r#"{"model":"m","max_tokens":5,"stream":true,"system":"Be brief.",
            "messages":[{"role":"user","content":"hi"},
            {"role":"assistant","content":[{"type":"text","text":"t0 t1 "}]}]}"#;
        let request = read(Format::Messages, prefill).unwrap();
        assert_eq!(
            (request.model.as_deref(), request.max_tokens),
            (Some("m"), Some(5))
        );
        assert!(request.stream);
        assert_eq!(request.continued_text(), Some("t0 t1 "));
        let system = Turn {
            role: Role::System,
            text: "Be brief.".into(),
        };
        assert_eq!(request.conversation[0], system);
        let refused = Request::parse(Format::Messages, prefill.as_bytes(), true);
        assert!(refused.unwrap_err().0.contains("prefill"));

        let text = r#"{"model":"m","input":"hi","max_output_tokens":7,"instructions":"Be brief."}"#;
        let request = read(Format::Responses, text).unwrap();
        assert_eq!((request.max_tokens, request.continues), (Some(7), false));
        let user = Turn {
            role: Role::User,
            text: "hi".into(),
        };
        assert_eq!(request.conversation, [system, user]);
        let items = r#"{"input":[{"type":"message","role":"user","content":"hi"},
            {"type":"message","role":"assistant","status":"in_progress",
             "content":[{"type":"output_text","text":"t0 t1 "}]}]}"#;
        let request = read(Format::Responses, items).unwrap();
        assert_eq!(request.continued_text(), Some("t0 t1 "));
        let tool = r#"{"input":[{"role":"assistant","content":"calling"},
            {"type":"function_call_output","call_id":"c","output":"42"}]}"#;
        let request = read(Format::Responses, tool).unwrap();
        assert!(!request.continues, "a tool's output is the last item");
        assert_eq!(request.conversation.len(), 1);
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
            (
                Format::Messages,
                r#"{"messages":[],"stop_sequences":[""]}"#,
                "`stop_sequences`",
            ),
        ] {
            let refused = read(format, body).unwrap_err().0;
            assert!(refused.contains(why), "{body}: {refused}");
        }
    }
}
