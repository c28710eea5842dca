//! The seam: a carried-on stream's chunks joined onto what the client already has, so that it
//! sees one stream. Each chunk keeps the original stream's `id` and `created` (its `model` says
//! who finished the answer), loses the `role` its first delta repeats, and a chunk left with
//! nothing to say is dropped. A server that streams the continued message back before its new
//! text (llama.cpp does: its first delta is the whole prefix glued to the first new token) is
//! recognised by what arrives, not by who it is: text is held while it could still be that
//! echo, and passed on from where it stops repeating the delivered text. The final `usage`
//! counts the delivered tokens too.

use serde_json::{Map, Value};

/// The join of one carried-on stream (a restart or a continuation) onto the delivered one.
#[derive(Debug)]
pub(super) struct Seam {
    /// The original stream's `id` and `created`, when its first chunk had them.
    envelope: Map<String, Value>,
    /// The delivered text, while the carried-on text could still be its echo.
    echo: Option<Echo>,
    /// The delivered tokens, added to the final usage's `completion_tokens`.
    tokens: u64,
}

#[derive(Debug)]
struct Echo {
    delivered: String,
    /// The carried-on text so far, held.
    held: String,
}

impl Seam {
    /// The join onto a stream whose first chunk was `first` (its JSON) and whose client has
    /// `delivered` (`tokens` tokens) of the answer.
    pub(super) fn new(first: Option<&str>, delivered: &str, tokens: u64) -> Self {
        let first: Option<Map<String, Value>> =
            first.and_then(|first| serde_json::from_str(first).ok());
        let envelope = first
            .map(|first| {
                first
                    .into_iter()
                    .filter(|(key, _)| key == "id" || key == "created")
                    .collect()
            })
            .unwrap_or_default();
        let echo = (!delivered.is_empty()).then(|| Echo {
            delivered: delivered.to_owned(),
            held: String::new(),
        });
        Seam {
            envelope,
            echo,
            tokens,
        }
    }

    /// The chunk (its JSON) to send on for the carried-on chunk `data`; `None` to drop it.
    /// What is not a JSON object goes on as it is.
    pub(super) fn join(&mut self, data: &str) -> Option<String> {
        let Ok(mut chunk) = serde_json::from_str::<Map<String, Value>>(data) else {
            return Some(data.to_owned());
        };
        for (key, value) in &self.envelope {
            if chunk.contains_key(key) {
                chunk.insert(key.clone(), value.clone());
            }
        }
        let mut says = false;
        if let Some(Value::Array(choices)) = chunk.get_mut("choices") {
            for choice in choices.iter_mut() {
                says |= self.join_choice(choice);
            }
        }
        if let Some(Value::Object(usage)) = chunk.get_mut("usage") {
            self.count_delivered(usage);
            says = true;
        }
        says |= chunk.keys().any(|key| key == "error");
        says.then(|| Value::Object(chunk).to_string())
    }

    /// Joins one choice: no repeated role, the echo taken off its text. Whether it still
    /// says anything (text, a tool call, a finish).
    fn join_choice(&mut self, choice: &mut Value) -> bool {
        let finishes = !choice["finish_reason"].is_null();
        let Some(Value::Object(delta)) = choice.get_mut("delta") else {
            // A text completion's choice.
            if let Some(Value::String(text)) = choice.get_mut("text") {
                *text = self.past_echo(text);
                return finishes || !text.is_empty();
            }
            return finishes;
        };
        delta.remove("role");
        if let Some(Value::String(content)) = delta.get_mut("content") {
            *content = self.past_echo(content);
            if content.is_empty() {
                delta.remove("content");
            }
        }
        finishes || !delta.is_empty()
    }

    /// What of `text` is new: all of it once the echo is settled, else what follows the
    /// delivered text (nothing while the held text is still a prefix of it).
    fn past_echo(&mut self, text: &str) -> String {
        let Some(echo) = self.echo.as_mut() else {
            return text.to_owned();
        };
        echo.held.push_str(text);
        if echo.delivered.starts_with(echo.held.as_str()) {
            // Still the delivered text, or the start of it: held.
            return String::new();
        }
        let echo = self.echo.take().expect("just looked");
        // Re-tokenising may lose the delivered text's trailing whitespace in the echo.
        let repeated = [echo.delivered.as_str(), echo.delivered.trim_end()]
            .into_iter()
            .find(|delivered| !delivered.is_empty() && echo.held.starts_with(delivered));
        match repeated {
            Some(delivered) => echo.held[delivered.len()..].to_owned(),
            None => echo.held,
        }
    }

    /// The final usage counts the answer the client got: the delivered tokens as well.
    fn count_delivered(&self, usage: &mut Map<String, Value>) {
        let Some(completion) = usage.get("completion_tokens").and_then(Value::as_u64) else {
            return;
        };
        let completion = completion + self.tokens;
        usage.insert("completion_tokens".to_owned(), completion.into());
        if let Some(prompt) = usage.get("prompt_tokens").and_then(Value::as_u64) {
            usage.insert("total_tokens".to_owned(), (prompt + completion).into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FIRST: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"big","choices":[{"index":0,"delta":{"role":"assistant","content":"t0 "},"finish_reason":null}]}"#;

    fn chunk(content: &str) -> String {
        json!({"id": "other", "object": "chat.completion.chunk", "created": 9, "model": "small",
               "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]})
        .to_string()
    }

    fn text(joined: Option<String>) -> Option<String> {
        let chunk: Value = serde_json::from_str(&joined?).unwrap();
        Some(chunk["choices"][0]["delta"]["content"].as_str()?.to_owned())
    }

    #[test]
    fn a_continuation_keeps_the_envelope_and_drops_its_role_chunk() {
        let mut seam = Seam::new(Some(FIRST), "t0 t1 ", 2);
        let role = json!({"id": "other", "created": 9, "model": "small",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]});
        assert_eq!(seam.join(&role.to_string()), None);
        let joined: Value = serde_json::from_str(&seam.join(&chunk("t2 ")).unwrap()).unwrap();
        assert_eq!(joined["id"], "chatcmpl-1");
        assert_eq!(joined["created"], 7);
        assert_eq!(joined["model"], "small", "who finished the answer");
        assert_eq!(joined["choices"][0]["delta"], json!({"content": "t2 "}));
        let last = json!({"id": "other", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}});
        let joined: Value = serde_json::from_str(&seam.join(&last.to_string()).unwrap()).unwrap();
        assert_eq!(joined["choices"][0]["finish_reason"], "stop");
        assert_eq!(
            joined["usage"],
            json!({"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9})
        );
    }

    #[test]
    fn an_echo_of_the_delivered_text_is_taken_off_wherever_it_ends() {
        // llama.cpp: the whole prefix glued to the first new token, in one delta.
        let mut seam = Seam::new(Some(FIRST), "Once upon a time, in a small coastal town", 9);
        assert_eq!(
            text(seam.join(&chunk("Once upon a time, in a small coastal town,"))),
            Some(",".to_owned())
        );
        assert_eq!(text(seam.join(&chunk(" where"))), Some(" where".to_owned()));
        // The echo spread over several chunks, then the new text.
        let mut seam = Seam::new(Some(FIRST), "t0 t1 t2 ", 3);
        assert_eq!(seam.join(&chunk("t0 t1")), None);
        assert_eq!(seam.join(&chunk(" t2 ")), None);
        assert_eq!(text(seam.join(&chunk("t3 "))), Some("t3 ".to_owned()));
        // Without the delivered text's trailing space.
        let mut seam = Seam::new(Some(FIRST), "t0 t1 ", 2);
        assert_eq!(text(seam.join(&chunk("t0 t1t2"))), Some("t2".to_owned()));
    }

    #[test]
    fn new_text_from_the_first_token_passes_at_once() {
        let mut seam = Seam::new(Some(FIRST), "t0 t1 t2 ", 3);
        assert_eq!(text(seam.join(&chunk("t3 "))), Some("t3 ".to_owned()));
        assert_eq!(
            text(seam.join(&chunk("t0 "))),
            Some("t0 ".to_owned()),
            "settled"
        );
        // New text that starts like the delivered text is held only until it differs.
        let mut seam = Seam::new(Some(FIRST), "t0 t1 ", 2);
        assert_eq!(seam.join(&chunk("t0")), None);
        assert_eq!(text(seam.join(&chunk("!"))), Some("t0!".to_owned()));
    }

    #[test]
    fn a_restart_only_keeps_the_envelope_and_drops_the_role() {
        let mut seam = Seam::new(Some(FIRST), "", 0);
        let first = json!({"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "t0 "}}]});
        let joined: Value = serde_json::from_str(&seam.join(&first.to_string()).unwrap()).unwrap();
        assert_eq!(joined["id"], "chatcmpl-1");
        assert_eq!(joined["choices"][0]["delta"], json!({"content": "t0 "}));
        assert_eq!(seam.join("not json").as_deref(), Some("not json"));
        let error = r#"{"error":{"message":"x"}}"#;
        assert!(seam.join(error).is_some());
    }
}
