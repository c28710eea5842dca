//! What the proxy reads of each upstream chunk, in one parse that keeps nothing but this:
//! whether it is a JSON object at all, whether it finishes the answer (a `finish_reason`), the
//! text it adds and whether it calls a tool, reasons or refuses (what a continuation must
//! know), and whether it is an error the server sent in band.

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

/// One upstream chunk, peeked at: its text borrowed from the chunk where it has no escapes.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Peek<'a> {
    #[serde(default, borrow)]
    choices: Vec<PeekChoice<'a>>,
    /// A chunk that is an error (vLLM sends `data: {"error": {...}}` mid-stream).
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
struct PeekChoice<'a> {
    #[serde(default)]
    finish_reason: Option<IgnoredAny>,
    #[serde(default, borrow)]
    delta: Option<PeekDelta<'a>>,
    /// A text completion's chunk carries its text here.
    #[serde(default, borrow)]
    text: Option<Text<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct PeekDelta<'a> {
    #[serde(default, borrow)]
    content: Option<Text<'a>>,
    #[serde(default)]
    tool_calls: Option<Vec<IgnoredAny>>,
    #[serde(default)]
    function_call: Option<IgnoredAny>,
    /// vLLM's and SGLang's reasoning text (`reasoning` in newer vLLM).
    #[serde(default, borrow, alias = "reasoning")]
    reasoning_content: Option<Text<'a>>,
    #[serde(default, borrow)]
    refusal: Option<Text<'a>>,
}

/// A JSON string, borrowed from the chunk when it has no escapes (serde copies a
/// `Option<Cow<str>>` always; through this, it borrows).
#[derive(Debug, Default, Deserialize)]
#[serde(transparent)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

impl Text<'_> {
    fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'a> Peek<'a> {
    /// What `data` says, if it is a JSON object.
    pub(super) fn of(data: &'a str) -> Option<Peek<'a>> {
        if !data.trim_start().starts_with('{') {
            return None;
        }
        serde_json::from_str(data).ok()
    }

    /// Whether a choice finishes with it.
    pub(super) fn finishes(&self) -> bool {
        self.choices
            .iter()
            .any(|choice| choice.finish_reason.is_some())
    }

    /// The text it adds to the answer (its choices' content, or a text completion's text).
    pub(super) fn text(&self) -> impl Iterator<Item = &str> {
        self.choices.iter().filter_map(|choice| {
            let content = choice.delta.as_ref().and_then(|d| d.content.as_ref());
            content.or(choice.text.as_ref()).map(Text::as_str)
        })
    }

    /// Whether it calls a tool (a `tool_calls` delta that is not empty, or a `function_call`).
    pub(super) fn calls_a_tool(&self) -> bool {
        self.deltas().any(|delta| {
            delta
                .tool_calls
                .as_ref()
                .is_some_and(|calls| !calls.is_empty())
                || delta.function_call.is_some()
        })
    }

    /// Whether it adds reasoning text (`reasoning_content`, `reasoning`).
    pub(super) fn reasons(&self) -> bool {
        self.deltas().any(|delta| {
            delta
                .reasoning_content
                .as_ref()
                .is_some_and(|r| !r.as_str().is_empty())
        })
    }

    /// Whether it adds a refusal (`refusal`).
    pub(super) fn refuses(&self) -> bool {
        self.deltas().any(|delta| {
            delta
                .refusal
                .as_ref()
                .is_some_and(|r| !r.as_str().is_empty())
        })
    }

    fn deltas(&self) -> impl Iterator<Item = &PeekDelta<'a>> {
        self.choices
            .iter()
            .filter_map(|choice| choice.delta.as_ref())
    }

    /// The error object of a chunk that is an error.
    pub(super) fn error(&self) -> Option<&Value> {
        self.error.as_ref()
    }
}

/// Whether an error the upstream sent mid-stream (its `error` object, or the event's whole
/// JSON) is one another replica could avoid: an overload, an internal error, a server's own
/// resources (its KV cache) running out, its shutdown (a restart, a scale-down: the
/// `shutdown` end frame of a server on this crate), a 5xx. A request error
/// (`invalid_request_error`, a 4xx) is not.
pub(super) fn another_replica_could_avoid(error: &Value) -> bool {
    let error = error.get("error").unwrap_or(error);
    ["type", "code"]
        .iter()
        .filter_map(|key| error.get(key))
        .any(|value| match value {
            Value::String(word) => {
                let word = word.to_ascii_lowercase();
                [
                    "server_error",
                    "overloaded",
                    "internal",
                    "unavailable",
                    "kv_cache",
                    "shutdown",
                ]
                .iter()
                .any(|transient| word.contains(transient))
            }
            Value::Number(code) => code.as_u64().is_some_and(|code| code >= 500),
            _ => false,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_says_its_text_its_end_and_its_tool_calls() {
        let chunk = Peek::of(r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"hi \"you\""},"finish_reason":null}]}"#).unwrap();
        assert_eq!(chunk.text().collect::<String>(), "hi \"you\"");
        // Text without escapes is read in place, not copied.
        let plain = Peek::of(r#"{"choices":[{"index":0,"delta":{"content":"t0 "}}]}"#).unwrap();
        let content = plain.choices[0]
            .delta
            .as_ref()
            .unwrap()
            .content
            .as_ref()
            .unwrap();
        assert!(matches!(content.0, Cow::Borrowed("t0 ")));
        assert!(!chunk.finishes() && !chunk.calls_a_tool());
        let last = Peek::of(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"completion_tokens":3}}"#).unwrap();
        assert!(last.finishes());
        assert_eq!(last.text().count(), 0);
        let tool = Peek::of(r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}]}"#).unwrap();
        assert!(tool.calls_a_tool());
        let none = Peek::of(r#"{"choices":[{"index":0,"delta":{"content":"a","tool_calls":[]}}]}"#)
            .unwrap();
        assert!(!none.calls_a_tool(), "an empty list calls nothing");
        let thinks =
            Peek::of(r#"{"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}"#).unwrap();
        assert!(thinks.reasons() && thinks.text().count() == 0);
        let newer = Peek::of(r#"{"choices":[{"index":0,"delta":{"reasoning":"hmm"}}]}"#).unwrap();
        assert!(newer.reasons());
        let no = Peek::of(r#"{"choices":[{"index":0,"delta":{"refusal":"I can't"}}]}"#).unwrap();
        assert!(no.refuses());
        let text = Peek::of(r#"{"choices":[{"index":0,"text":"t1 "}]}"#).unwrap();
        assert_eq!(text.text().collect::<String>(), "t1 ");
        assert!(Peek::of("[DONE]").is_none());
        assert!(Peek::of(r#"{"choices":[{"delta":{"content":"t"#).is_none());
    }

    #[test]
    fn an_overload_or_an_internal_error_is_for_another_replica_a_bad_request_is_not() {
        let avoidable = [
            r#"{"error":{"message":"kv full","type":"server_error","code":"kv_cache_exhausted"}}"#,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            r#"{"object":"error","message":"boom","type":"InternalServerError","code":500}"#,
            // A server on this crate shutting down, in each API's shape.
            r#"{"error":{"type":"shutdown","message":"stream ended: shutting down"}}"#,
            r#"{"type":"error","error":{"type":"shutdown","message":"stream ended: shutting down"}}"#,
            r#"{"type":"error","code":"shutdown","message":"stream ended: shutting down"}"#,
        ];
        for error in avoidable {
            let error: Value = serde_json::from_str(error).unwrap();
            assert!(another_replica_could_avoid(&error), "{error}");
        }
        let not = [
            r#"{"error":{"message":"bad","type":"invalid_request_error","code":null}}"#,
            r#"{"object":"error","message":"too long","type":"BadRequestError","code":400}"#,
            r#"{"error":"a string"}"#,
        ];
        for error in not {
            let error: Value = serde_json::from_str(error).unwrap();
            assert!(!another_replica_could_avoid(&error), "{error}");
        }
        let peeked = Peek::of(r#"{"error":{"type":"server_error"}}"#).unwrap();
        assert!(another_replica_could_avoid(peeked.error().unwrap()));
    }
}
