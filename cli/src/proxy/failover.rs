//! Failover after the first event: when an upstream stream breaks mid-answer (cut, stalled, an
//! error event another replica could avoid), the request that carries it on elsewhere. What
//! the client has so far ([`Delivered`]) decides it: nothing visible yet is a restart (the
//! original request again); some text is a continuation (the original request with that text
//! as a final assistant message, the flags vLLM and TGI need to continue it rather than start
//! a new turn, and `max_tokens` less what was delivered), where one can be faithful
//! ([`NotCarried`] says why not). A Messages stream is continued the same way, by Anthropic's
//! prefill (a final `assistant` message, without the chat template's flags).

use std::fmt;

use axum::body::Bytes;
use clap::ValueEnum;
use serde_json::{Map, Value, json};

use streamgate::anthropic::{Delta, MessagesData};

use super::format::Format;
use super::peek::Peek;

/// What the proxy does when a stream breaks after its first event (`--failover`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailoverMode {
    /// End the stream with an error event saying what broke.
    Off,
    /// Send the original request again elsewhere, but only while nothing visible has reached
    /// the client; after that, as `off`.
    Restart,
    /// Send it again while nothing visible has reached the client; after that, ask another
    /// replica (or a fallback) to continue the answer from the text delivered.
    Continue,
}

/// The most text of an answer kept to continue it from: a longer answer is not continued.
pub(super) const MAX_DELIVERED: usize = 1024 * 1024;

/// What the client has of the answer so far: everything the stream sent into its gate (it all
/// reaches the client, merged or not). Its text is kept up to [`MAX_DELIVERED`] bytes.
#[derive(Debug, Default)]
pub(super) struct Delivered {
    /// The answer's text (all of it, unless `too_long`).
    pub(super) text: String,
    /// The text passed [`MAX_DELIVERED`]: it is no longer kept.
    pub(super) too_long: bool,
    /// Its tokens, one per chunk that added text (as the servers fronted stream them).
    pub(super) tokens: u64,
    /// A tool call began.
    pub(super) tool_call: bool,
    /// Reasoning text came (`reasoning_content`).
    pub(super) reasoning: bool,
    /// A refusal came (`refusal`).
    pub(super) refusal: bool,
}

impl Delivered {
    /// `chunk` went to the client.
    pub(super) fn add(&mut self, chunk: &Peek) {
        let mut added = false;
        for text in chunk.text() {
            added |= self.push_text(text);
        }
        if added {
            self.tokens += 1;
        }
        self.tool_call |= chunk.calls_a_tool();
        self.reasoning |= chunk.reasons();
        self.refusal |= chunk.refuses();
    }

    /// The Messages event `data` went to the client: its text deltas are the answer's text, a
    /// tool-use block or its input a tool call, a thinking block or its deltas reasoning.
    pub(super) fn add_messages(&mut self, data: &MessagesData) {
        match data {
            MessagesData::ContentBlockStart(start) => match start.content_block.kind.as_str() {
                "text" => {}
                kind if kind.contains("thinking") => self.reasoning = true,
                _ => self.tool_call = true,
            },
            MessagesData::ContentBlockDelta(delta) => match &delta.delta {
                Delta::Text { text, .. } => {
                    if self.push_text(text) {
                        self.tokens += 1;
                    }
                }
                Delta::Thinking { .. } | Delta::Signature { .. } => self.reasoning = true,
                Delta::InputJson { .. } | Delta::Unknown(_) => self.tool_call = true,
            },
            _ => {}
        }
    }

    /// Text went to the client: kept up to [`MAX_DELIVERED`] bytes (then only counted).
    /// Whether there was any.
    fn push_text(&mut self, text: &str) -> bool {
        if self.text.len() + text.len() > MAX_DELIVERED {
            self.too_long = true;
            self.text = String::new();
        }
        if !self.too_long {
            self.text.push_str(text);
        }
        !text.is_empty()
    }

    /// Whether nothing visible reached the client.
    pub(super) fn is_empty(&self) -> bool {
        self.tokens == 0 && !self.tool_call && !self.reasoning && !self.refusal
    }
}

/// How a stream that broke after its first event went on, for `/stats` and `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Carried {
    /// Continued elsewhere from the delivered text.
    Continued,
    /// Sent again elsewhere: nothing visible had been delivered.
    Restarted,
    /// Ended as a whole answer: its `max_tokens` had all been delivered.
    Whole,
    /// Not carried on ([`NotCarried`]): the client got the error event.
    Refused,
    /// Carrying it on was tried, and every attempt failed.
    Failed,
}

impl Carried {
    /// Every outcome, in the order of their counters.
    pub(super) const ALL: [Carried; 5] = [
        Carried::Continued,
        Carried::Restarted,
        Carried::Whole,
        Carried::Refused,
        Carried::Failed,
    ];

    /// Its label: `continued`, `restarted`, `whole`, `refused`, `failed`.
    pub(super) const fn as_str(self) -> &'static str {
        match self {
            Carried::Continued => "continued",
            Carried::Restarted => "restarted",
            Carried::Whole => "whole",
            Carried::Refused => "refused",
            Carried::Failed => "failed",
        }
    }
}

/// The request that carries a broken stream on.
#[derive(Debug, PartialEq)]
pub(super) enum CarryOn {
    /// The original request again: nothing visible had reached the client.
    Restart(Bytes),
    /// The original request with the delivered text as a final assistant message.
    Continue {
        /// The request.
        body: Bytes,
        /// The final assistant message's content as sent (the client's own prefill, if it
        /// had one, and the delivered text): what a server may echo first.
        message: String,
    },
    /// The delivered tokens already are the `max_tokens` asked for: the answer is whole, and
    /// ends with `finish_reason: length`.
    Whole,
}

/// Why a broken stream is not carried on: the client gets the stream's error event, saying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NotCarried {
    /// `--failover off`.
    Off,
    /// `--failover restart`, and text had reached the client.
    Delivered,
    /// The stream failed over `--failover-max` times already.
    Budget(u32),
    /// The attempts' deadline, counted from the stream's first failover, is past.
    Deadline,
    /// A tool call was in progress: a continuation could not be faithful to it.
    ToolCall,
    /// Reasoning text had reached the client, which a continuation's assistant message cannot
    /// carry.
    Reasoning,
    /// A refusal had reached the client.
    Refusal,
    /// The request asked for structured output (`response_format` with a schema or JSON).
    StructuredOutput,
    /// The request asked for several choices (`n` > 1).
    SeveralChoices,
    /// The request asked for log probabilities, which a continuation cannot give for the
    /// delivered tokens.
    Logprobs,
    /// Not a chat completion or a Messages stream: a text completion is restarted while
    /// nothing was delivered but never continued; Responses streams are not carried on yet.
    Api(Format),
    /// The answer had grown past [`MAX_DELIVERED`] bytes of text.
    TooLong,
    /// The request's body is no JSON object, to add an assistant message to.
    NotJson,
    /// No upstream is left to carry it on: no other replica of its model, and no fallback
    /// (that accepts an assistant prefix, for a continuation).
    NoUpstream,
}

impl fmt::Display for NotCarried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotCarried::Off => f.write_str("failover is off"),
            NotCarried::Delivered => {
                f.write_str("text had reached the client, and --failover restart only restarts")
            }
            NotCarried::Budget(max) => write!(f, "it failed over {max} times already"),
            NotCarried::Deadline => {
                f.write_str("the attempts' deadline since its first failover is past")
            }
            NotCarried::ToolCall => f.write_str("a tool call was in progress"),
            NotCarried::Reasoning => f.write_str("reasoning had reached the client"),
            NotCarried::Refusal => f.write_str("a refusal had reached the client"),
            NotCarried::StructuredOutput => {
                f.write_str("the request asked for structured output (response_format)")
            }
            NotCarried::SeveralChoices => f.write_str("the request asked for several choices (n)"),
            NotCarried::Logprobs => f.write_str("the request asked for logprobs"),
            NotCarried::Api(Format::Text) => f.write_str("text completions are not continued"),
            NotCarried::Api(format) => {
                write!(
                    f,
                    "{} is not carried on (chat completions and Anthropic Messages are)",
                    format.name()
                )
            }
            NotCarried::TooLong => write!(
                f,
                "the answer had passed {MAX_DELIVERED} bytes, more than is kept to continue it"
            ),
            NotCarried::NotJson => f.write_str("the request's body is no JSON object"),
            NotCarried::NoUpstream => f.write_str(
                "no other upstream is left to carry it on (another replica, or a fallback that accepts an assistant prefix)",
            ),
        }
    }
}

/// The request that carries a stream of the original `body` (of `format`) on, after
/// `delivered` reached its client, as `mode` allows.
pub(super) fn carry_on(
    mode: FailoverMode,
    body: &Bytes,
    format: Format,
    delivered: &Delivered,
) -> Result<CarryOn, NotCarried> {
    if mode == FailoverMode::Off {
        return Err(NotCarried::Off);
    }
    if format == Format::Responses {
        return Err(NotCarried::Api(format));
    }
    if delivered.is_empty() {
        return Ok(CarryOn::Restart(body.clone()));
    }
    if mode == FailoverMode::Restart {
        return Err(NotCarried::Delivered);
    }
    // The body was a JSON object when the stream started (its `model` was read).
    let Ok(mut request) = serde_json::from_slice::<Map<String, Value>>(body) else {
        return Err(NotCarried::NotJson);
    };
    // A Messages request's `max_tokens` counts the answer's tokens as chat's does.
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(asked) = request.get(key).and_then(Value::as_u64) {
            let left = asked.saturating_sub(delivered.tokens);
            if left == 0 {
                return Ok(CarryOn::Whole);
            }
            request.insert(key.to_owned(), left.into());
        }
    }
    if delivered.tool_call {
        return Err(NotCarried::ToolCall);
    }
    if delivered.reasoning {
        return Err(NotCarried::Reasoning);
    }
    if delivered.refusal {
        return Err(NotCarried::Refusal);
    }
    if delivered.too_long {
        return Err(NotCarried::TooLong);
    }
    if format == Format::Messages {
        return Ok(continue_messages(request, delivered));
    }
    if format != Format::Chat {
        return Err(NotCarried::Api(format));
    }
    if request
        .get("n")
        .and_then(Value::as_u64)
        .is_some_and(|n| n > 1)
    {
        return Err(NotCarried::SeveralChoices);
    }
    let logprobs = request
        .get("logprobs")
        .is_some_and(|asked| asked == &json!(true))
        || request.get("top_logprobs").is_some_and(|n| !n.is_null());
    if logprobs {
        return Err(NotCarried::Logprobs);
    }
    let format = request
        .get("response_format")
        .and_then(|format| format.get("type"))
        .and_then(Value::as_str);
    if matches!(format, Some("json_schema" | "json_object")) {
        return Err(NotCarried::StructuredOutput);
    }
    let mut message = delivered.text.clone();
    let messages = request
        .entry("messages")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(messages) = messages {
        // A request that ended with an assistant message of its own (a prefill) continues it.
        let prefilled = messages
            .last_mut()
            .filter(|last| last["role"] == "assistant")
            .and_then(|last| last.get_mut("content"))
            .and_then(|content| match content {
                Value::String(text) => Some(text),
                _ => None,
            });
        match prefilled {
            Some(text) => {
                text.push_str(&delivered.text);
                message = text.clone();
            }
            None => messages.push(json!({"role": "assistant", "content": delivered.text})),
        }
    }
    request.insert("continue_final_message".to_owned(), true.into());
    request.insert("add_generation_prompt".to_owned(), false.into());
    Ok(CarryOn::Continue {
        body: Bytes::from(Value::Object(request).to_string()),
        message,
    })
}

/// A Messages `request` carried on after `delivered`: its conversation with the delivered text
/// as a final `assistant` message (Anthropic's prefill: the model goes on from it), or added to
/// the text of the request's own final assistant message.
fn continue_messages(mut request: Map<String, Value>, delivered: &Delivered) -> CarryOn {
    let mut message = delivered.text.clone();
    let messages = request
        .entry("messages")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(messages) = messages {
        let prefill = messages
            .last_mut()
            .filter(|last| last["role"] == "assistant")
            .and_then(|last| last.get_mut("content"));
        // The prefill's text: a string, or its last block's when that is a text block.
        let text = match prefill {
            Some(Value::String(text)) => Some(text),
            Some(Value::Array(blocks)) => blocks
                .last_mut()
                .filter(|block| block["type"] == "text")
                .and_then(|block| block.get_mut("text"))
                .and_then(|text| match text {
                    Value::String(text) => Some(text),
                    _ => None,
                }),
            _ => None,
        };
        match text {
            Some(text) => {
                text.push_str(&delivered.text);
                message = text.clone();
            }
            None => messages.push(json!({"role": "assistant", "content": delivered.text})),
        }
    }
    CarryOn::Continue {
        body: Bytes::from(Value::Object(request).to_string()),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered(text: &str, tokens: u64) -> Delivered {
        Delivered {
            text: text.to_owned(),
            tokens,
            ..Delivered::default()
        }
    }

    fn body(json: Value) -> Bytes {
        Bytes::from(json.to_string())
    }

    #[test]
    fn text_delivered_is_continued_as_a_final_assistant_message() {
        let original = body(json!({
            "model": "m", "stream": true, "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}],
        }));
        let Ok(CarryOn::Continue {
            body: carried,
            message,
        }) = carry_on(
            FailoverMode::Continue,
            &original,
            Format::Chat,
            &delivered("t0 t1 t2 ", 3),
        )
        else {
            panic!("a continuation");
        };
        let carried: Value = serde_json::from_slice(&carried).unwrap();
        assert_eq!(message, "t0 t1 t2 ");
        assert_eq!(
            carried,
            json!({
                "model": "m", "stream": true, "max_tokens": 7,
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "t0 t1 t2 "},
                ],
                "continue_final_message": true, "add_generation_prompt": false,
            })
        );
        // A prefill of the client's own goes on with what followed it.
        let prefilled = body(json!({
            "model": "m", "max_completion_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure: "}],
        }));
        let Ok(CarryOn::Continue {
            body: carried,
            message,
        }) = carry_on(
            FailoverMode::Continue,
            &prefilled,
            Format::Chat,
            &delivered("t0 ", 1),
        )
        else {
            panic!("a continuation");
        };
        let carried: Value = serde_json::from_slice(&carried).unwrap();
        assert_eq!(carried["messages"][1]["content"], "Sure: t0 ");
        assert_eq!(message, "Sure: t0 ");
        assert_eq!(carried["messages"].as_array().unwrap().len(), 2);
        assert_eq!(carried["max_completion_tokens"], 4);
    }

    #[test]
    fn nothing_visible_yet_is_a_restart_and_every_token_delivered_is_a_whole_answer() {
        let original = body(json!({"model": "m", "max_tokens": 3, "messages": []}));
        for mode in [FailoverMode::Restart, FailoverMode::Continue] {
            assert_eq!(
                carry_on(mode, &original, Format::Chat, &Delivered::default()),
                Ok(CarryOn::Restart(original.clone()))
            );
        }
        assert_eq!(
            carry_on(
                FailoverMode::Continue,
                &original,
                Format::Chat,
                &delivered("a b c", 3)
            ),
            Ok(CarryOn::Whole)
        );
    }

    #[test]
    fn what_a_continuation_cannot_be_faithful_to_is_refused_saying_which() {
        let text = delivered("t0 ", 1);
        let refused = |request: Value, format: Format, delivered: &Delivered| {
            carry_on(FailoverMode::Continue, &body(request), format, delivered).unwrap_err()
        };
        let with = |key: &str, value: Value| {
            let mut request = json!({"model": "m", "messages": []});
            request[key] = value;
            request
        };
        assert_eq!(
            refused(with("n", json!(2)), Format::Chat, &text),
            NotCarried::SeveralChoices
        );
        assert_eq!(
            refused(with("logprobs", json!(true)), Format::Chat, &text),
            NotCarried::Logprobs
        );
        assert_eq!(
            refused(
                with(
                    "response_format",
                    json!({"type": "json_schema", "json_schema": {}})
                ),
                Format::Chat,
                &text
            ),
            NotCarried::StructuredOutput
        );
        let calling = Delivered {
            tool_call: true,
            ..Delivered::default()
        };
        assert_eq!(
            refused(with("n", json!(1)), Format::Chat, &calling),
            NotCarried::ToolCall
        );
        assert_eq!(
            refused(with("n", json!(1)), Format::Text, &text),
            NotCarried::Api(Format::Text)
        );
        // Responses streams are never carried on, even before any text.
        assert_eq!(
            refused(
                with("n", json!(1)),
                Format::Responses,
                &Delivered::default()
            ),
            NotCarried::Api(Format::Responses)
        );
        let original = body(json!({"model": "m"}));
        assert_eq!(
            carry_on(FailoverMode::Restart, &original, Format::Chat, &text),
            Err(NotCarried::Delivered)
        );
        assert_eq!(
            carry_on(
                FailoverMode::Off,
                &original,
                Format::Chat,
                &Delivered::default()
            ),
            Err(NotCarried::Off)
        );
        assert!(NotCarried::ToolCall.to_string().contains("tool call"));
    }

    #[test]
    fn every_outcome_has_its_own_counter_and_label() {
        for (at, carried) in Carried::ALL.into_iter().enumerate() {
            assert_eq!(carried as usize, at, "{carried:?}: the counters' order");
        }
        let mut labels: Vec<_> = Carried::ALL.iter().map(|c| c.as_str()).collect();
        labels.dedup();
        assert_eq!(labels.len(), Carried::ALL.len());
    }

    #[test]
    fn delivered_counts_a_token_per_chunk_with_text() {
        let mut delivered = Delivered::default();
        for chunk in [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"t0 "}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"t1 "}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        ] {
            delivered.add(&Peek::of(chunk).unwrap());
        }
        assert_eq!((delivered.text.as_str(), delivered.tokens), ("t0 t1 ", 2));
        assert!(!delivered.is_empty());
    }

    #[test]
    fn an_answer_past_the_bound_is_counted_not_kept_and_not_continued() {
        let mut delivered = Delivered::default();
        let big = "x".repeat(MAX_DELIVERED / 2 + 1);
        let chunk = format!(r#"{{"choices":[{{"index":0,"delta":{{"content":"{big}"}}}}]}}"#);
        for _ in 0..3 {
            delivered.add(&Peek::of(&chunk).unwrap());
        }
        assert!(delivered.too_long && delivered.text.is_empty());
        assert_eq!(delivered.tokens, 3);
        let original = body(json!({"model": "m", "messages": []}));
        assert_eq!(
            carry_on(FailoverMode::Continue, &original, Format::Chat, &delivered),
            Err(NotCarried::TooLong)
        );
    }
}
