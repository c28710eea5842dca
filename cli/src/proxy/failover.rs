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
use streamgate::responses::ResponsesData;

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
/// reaches the client, merged or not). Its text is kept up to [`MAX_DELIVERED`] bytes: a chat
/// or Messages answer's here, a Responses answer's in its outline (by item and part, where a
/// continuation finds it), only counted here.
#[derive(Debug, Default)]
pub(super) struct Delivered {
    /// A chat or Messages answer's text (all of it, unless `too_long`).
    pub(super) text: String,
    /// The bytes of text delivered.
    pub(super) text_len: usize,
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
            added |= self.push_text(text, true);
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
                    if self.push_text(text, true) {
                        self.tokens += 1;
                    }
                }
                Delta::Thinking { .. } | Delta::Signature { .. } => self.reasoning = true,
                Delta::InputJson { .. } | Delta::Unknown(_) => self.tool_call = true,
            },
            _ => {}
        }
    }

    /// Text went to the client: counted, and kept (if `keep`) up to [`MAX_DELIVERED`] bytes.
    /// Whether there was any.
    fn push_text(&mut self, text: &str, keep: bool) -> bool {
        self.text_len += text.len();
        if self.text_len > MAX_DELIVERED {
            self.too_long = true;
            self.text = String::new();
        } else if keep {
            self.text.push_str(text);
        }
        !text.is_empty()
    }

    /// The Responses event `data` went to the client: its text deltas are the answer's text,
    /// an item other than a message or a reasoning item (a function or tool call) or its
    /// arguments a tool call, reasoning text reasoning, refusal text a refusal.
    pub(super) fn add_responses(&mut self, data: &ResponsesData) {
        match data {
            ResponsesData::OutputTextDelta(delta) if self.push_text(&delta.delta, false) => {
                self.tokens += 1;
            }
            ResponsesData::OutputItemAdded(added)
                if !matches!(added.item.kind.as_str(), "message" | "reasoning") =>
            {
                self.tool_call = true;
            }
            ResponsesData::FunctionCallArgumentsDelta(_) => self.tool_call = true,
            ResponsesData::ReasoningSummaryTextDelta(_) | ResponsesData::ReasoningTextDelta(_) => {
                self.reasoning = true;
            }
            ResponsesData::RefusalDelta(_) => self.refusal = true,
            _ => {}
        }
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

/// Why a broken stream is not carried on: the client gets the stream's error event, saying it
/// (or, when an upstream's own error event broke it, that event as the upstream sent it).
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
    /// The request asked for structured output (`response_format` with a schema or JSON;
    /// Responses: `text.format`).
    StructuredOutput,
    /// The request asked for several choices (`n` > 1).
    SeveralChoices,
    /// The request asked for log probabilities, which a continuation cannot give for the
    /// delivered tokens.
    Logprobs,
    /// A text completion: restarted while nothing was delivered, but never continued.
    Api(Format),
    /// A Responses answer whose text is not all in the one message part the client has open
    /// (in several parts or items, or in a part already done), where no continuation can go on.
    Scattered,
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
            NotCarried::Api(format) => write!(f, "{} is not continued", format.name()),
            NotCarried::Scattered => f.write_str(
                "the answer's text is not all in one open message part, for a continuation to go on in",
            ),
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
/// `delivered` reached its client, as `mode` allows; `text`: the answer's text where a
/// continuation goes on from it (`None`: a Responses answer's text is not all in the message
/// part the client has open, the one place it could go on in).
pub(super) fn carry_on(
    mode: FailoverMode,
    body: &Bytes,
    (format, text): (Format, Option<&str>),
    delivered: &Delivered,
) -> Result<CarryOn, NotCarried> {
    if mode == FailoverMode::Off {
        return Err(NotCarried::Off);
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
    // Messages' `max_tokens` and Responses' `max_output_tokens` count them as chat's does.
    for key in ["max_tokens", "max_completion_tokens", "max_output_tokens"] {
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
    let Some(text) = text else {
        return Err(NotCarried::Scattered);
    };
    match format {
        Format::Messages => {
            let message = json!({"role": "assistant", "content": text});
            return Ok(continue_conversation(request, "messages", message, text));
        }
        Format::Responses => {
            let format = request
                .get("text")
                .and_then(|text| text.get("format"))
                .and_then(|format| format.get("type"))
                .and_then(Value::as_str);
            if matches!(format, Some("json_schema" | "json_object")) {
                return Err(NotCarried::StructuredOutput);
            }
            let included = request.get("include").and_then(Value::as_array);
            let logprobs = included
                .is_some_and(|included| included.contains(&json!("message.output_text.logprobs")));
            if logprobs || request.get("top_logprobs").is_some_and(|n| !n.is_null()) {
                return Err(NotCarried::Logprobs);
            }
            // An output message in progress, as OpenAI defines an input item of the kind.
            let item = json!({"type": "message", "role": "assistant", "status": "in_progress",
                "content": [{"type": "output_text", "text": text, "annotations": []}]});
            return Ok(continue_conversation(request, "input", item, text));
        }
        Format::Chat | Format::Text => {}
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
    request.insert("continue_final_message".to_owned(), true.into());
    request.insert("add_generation_prompt".to_owned(), false.into());
    let message = json!({"role": "assistant", "content": text});
    Ok(continue_conversation(request, "messages", message, text))
}

/// A request carried on after `delivered` (the text delivered): its conversation (`key`: chat's
/// and Messages' `messages`, Responses' `input`, a string being one user message) with
/// `message`, the delivered text as a final assistant message (the prefill the model goes on
/// from), or the delivered text added to the request's own final assistant message.
fn continue_conversation(
    mut request: Map<String, Value>,
    key: &str,
    message: Value,
    delivered: &str,
) -> CarryOn {
    let mut sent = delivered.to_owned();
    let conversation = request
        .entry(key)
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::String(text) = conversation {
        *conversation = json!([{"role": "user", "content": text}]);
    }
    if let Value::Array(messages) = conversation {
        match messages.last_mut().and_then(prefill_text) {
            Some(text) => {
                text.push_str(delivered);
                sent = text.clone();
            }
            None => messages.push(message),
        }
    }
    CarryOn::Continue {
        body: Bytes::from(Value::Object(request).to_string()),
        message: sent,
    }
}

/// The text a continuation adds to, when `message` is an assistant message of the request's
/// own (a prefill): its content, or its last part's text when that is a text part.
fn prefill_text(message: &mut Value) -> Option<&mut String> {
    if message["role"] != "assistant" {
        return None;
    }
    match message.get_mut("content")? {
        Value::String(text) => Some(text),
        Value::Array(parts) => {
            let last = parts.last_mut()?;
            if !matches!(last["type"].as_str(), Some("text" | "output_text")) {
                return None;
            }
            match last.get_mut("text")? {
                Value::String(text) => Some(text),
                _ => None,
            }
        }
        _ => None,
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
            (Format::Chat, Some("t0 t1 t2 ")),
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
            (Format::Chat, Some("t0 ")),
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

    /// The body a continuation sends, and the message it carries.
    fn continued(original: Value, format: Format, delivered: &Delivered) -> (Value, String) {
        let how = (format, Some(delivered.text.as_str()));
        match carry_on(FailoverMode::Continue, &body(original), how, delivered) {
            Ok(CarryOn::Continue { body, message }) => {
                (serde_json::from_slice(&body).unwrap(), message)
            }
            other => panic!("a continuation: {other:?}"),
        }
    }

    #[test]
    fn messages_and_responses_are_continued_by_their_own_assistant_prefix() {
        // Messages: a final assistant message, without chat's template flags.
        let (carried, message) = continued(
            json!({"model": "m", "max_tokens": 10, "stream": true,
                "messages": [{"role": "user", "content": "hi"}]}),
            Format::Messages,
            &delivered("t0 t1 ", 2),
        );
        assert_eq!(
            carried,
            json!({"model": "m", "max_tokens": 8, "stream": true, "messages": [
                {"role": "user", "content": "hi"}, {"role": "assistant", "content": "t0 t1 "}]})
        );
        assert_eq!(message, "t0 t1 ");
        // A prefill of the client's own, in blocks, goes on with what followed it.
        let (carried, message) = continued(
            json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "Sure: "}]}]}),
            Format::Messages,
            &delivered("t0 ", 1),
        );
        assert_eq!(carried["messages"][1]["content"][0]["text"], "Sure: t0 ");
        assert_eq!(
            (
                carried["messages"].as_array().unwrap().len(),
                message.as_str()
            ),
            (2, "Sure: t0 ")
        );
        // Responses: a string input becomes the user's message, then an assistant item in
        // progress; `max_output_tokens` less the delivered.
        let (carried, _) = continued(
            json!({"model": "m", "input": "hi", "max_output_tokens": 5, "stream": true}),
            Format::Responses,
            &delivered("t0 ", 1),
        );
        assert_eq!(carried["max_output_tokens"], 4);
        assert_eq!(
            carried["input"][0],
            json!({"role": "user", "content": "hi"})
        );
        let item = &carried["input"][1];
        assert_eq!(
            (&item["type"], &item["role"], &item["status"]),
            (
                &json!("message"),
                &json!("assistant"),
                &json!("in_progress")
            )
        );
        assert_eq!(
            item["content"][0],
            json!({"type": "output_text", "text": "t0 ", "annotations": []})
        );
        assert!(carried.get("continue_final_message").is_none());
    }

    #[test]
    fn nothing_visible_yet_is_a_restart_and_every_token_delivered_is_a_whole_answer() {
        let original = body(json!({"model": "m", "max_tokens": 3, "messages": []}));
        for mode in [FailoverMode::Restart, FailoverMode::Continue] {
            assert_eq!(
                carry_on(
                    mode,
                    &original,
                    (Format::Chat, Some("")),
                    &Delivered::default()
                ),
                Ok(CarryOn::Restart(original.clone()))
            );
        }
        assert_eq!(
            carry_on(
                FailoverMode::Continue,
                &original,
                (Format::Chat, Some("a b c")),
                &delivered("a b c", 3)
            ),
            Ok(CarryOn::Whole)
        );
    }

    #[test]
    fn what_a_continuation_cannot_be_faithful_to_is_refused_saying_which() {
        let text = delivered("t0 ", 1);
        let refused = |request: Value, format: Format, delivered: &Delivered| {
            carry_on(
                FailoverMode::Continue,
                &body(request),
                (format, Some(delivered.text.as_str())),
                delivered,
            )
            .unwrap_err()
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
        // A Responses answer whose text has no open part to go on in.
        let scattered = carry_on(
            FailoverMode::Continue,
            &body(json!({"model": "m", "input": "hi"})),
            (Format::Responses, None),
            &text,
        );
        assert_eq!(scattered, Err(NotCarried::Scattered));
        let original = body(json!({"model": "m"}));
        assert_eq!(
            carry_on(
                FailoverMode::Restart,
                &original,
                (Format::Chat, Some("t0 ")),
                &text
            ),
            Err(NotCarried::Delivered)
        );
        assert_eq!(
            carry_on(
                FailoverMode::Off,
                &original,
                (Format::Chat, Some("")),
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
        // A Responses answer's text is counted here, and kept in its outline.
        let mut delivered = Delivered::default();
        let delta = json!({"type": "response.output_text.delta", "item_id": "msg_1",
            "output_index": 0, "content_index": 0, "delta": "t0 "});
        let event = streamgate::sse::SseEvent::data(delta.to_string());
        let event = streamgate::responses::ResponsesEvent::from_sse(&event).unwrap();
        delivered.add_responses(event.data());
        assert_eq!(
            (
                delivered.text.as_str(),
                delivered.text_len,
                delivered.tokens
            ),
            ("", 3, 1)
        );
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
            carry_on(
                FailoverMode::Continue,
                &original,
                (Format::Chat, Some(delivered.text.as_str())),
                &delivered
            ),
            Err(NotCarried::TooLong)
        );
    }
}
