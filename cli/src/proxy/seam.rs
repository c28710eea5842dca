//! The seam: a carried-on stream's chunks joined onto what the client already has, so that it
//! sees one stream. Each chunk keeps the original stream's `id` and `created` (its `model` says
//! who finished the answer), loses the `role` its first delta repeats, and a chunk left with
//! nothing to say is dropped; the continued text loses the echo of the delivered text a server
//! may send first ([`Echo`]). The final `usage` counts the delivered tokens as the answer's, not
//! the prompt's. A Messages stream's seam is [`MessagesSeam`](super::messages_seam::MessagesSeam).

use serde_json::{Map, Value};

use super::echo::Echo;

/// The join of one carried-on stream (a restart or a continuation) onto the delivered one.
#[derive(Debug)]
pub(super) struct Seam {
    /// The original stream's `id` and `created`, when its first chunk had them.
    envelope: Map<String, Value>,
    /// While the carried-on text could still be an echo: what it could be the echo of.
    echo: Echo,
    /// The delivered tokens, moved from the final usage's prompt to its completion.
    tokens: u64,
}

impl Seam {
    /// The join onto a stream whose first chunk was `first` (its JSON) and whose client has
    /// `tokens` tokens of the answer; the carried-on text may begin by repeating one of
    /// `echoes` (the assistant message a continuation sent, the delivered text; none for a
    /// restart).
    pub(super) fn new(first: Option<&str>, echoes: &[&str], tokens: u64) -> Self {
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
        Seam {
            envelope,
            echo: Echo::new(echoes),
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
                *text = self.echo.past(text);
                return finishes || !text.is_empty();
            }
            return finishes;
        };
        delta.remove("role");
        if let Some(Value::String(content)) = delta.get_mut("content") {
            *content = self.echo.past(content);
            if content.is_empty() {
                delta.remove("content");
            }
        }
        finishes || !delta.is_empty()
    }

    /// The final usage counts the answer the client got: the delivered tokens are the
    /// answer's, where the continuation counted them in its prompt.
    fn count_delivered(&self, usage: &mut Map<String, Value>) {
        let Some(completion) = usage.get("completion_tokens").and_then(Value::as_u64) else {
            return;
        };
        let completion = completion + self.tokens;
        usage.insert("completion_tokens".to_owned(), completion.into());
        if let Some(prompt) = usage.get("prompt_tokens").and_then(Value::as_u64) {
            let prompt = prompt.saturating_sub(self.tokens);
            usage.insert("prompt_tokens".to_owned(), prompt.into());
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
        let mut seam = Seam::new(Some(FIRST), &["t0 t1 "], 2);
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
        // The continuation's prompt held the 2 delivered tokens: they are the answer's.
        assert_eq!(
            joined["usage"],
            json!({"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7})
        );
    }

    #[test]
    fn an_echo_of_the_delivered_text_is_taken_off_wherever_it_ends() {
        // llama.cpp: the whole prefix glued to the first new token, in one delta.
        let mut seam = Seam::new(
            Some(FIRST),
            &["Once upon a time, in a small coastal town"],
            9,
        );
        assert_eq!(
            text(seam.join(&chunk("Once upon a time, in a small coastal town,"))),
            Some(",".to_owned())
        );
        assert_eq!(text(seam.join(&chunk(" where"))), Some(" where".to_owned()));
        // The echo spread over several chunks, then the new text.
        let mut seam = Seam::new(Some(FIRST), &["t0 t1 t2 "], 3);
        assert_eq!(seam.join(&chunk("t0 t1")), None);
        assert_eq!(seam.join(&chunk(" t2 ")), None);
        assert_eq!(text(seam.join(&chunk("t3 "))), Some("t3 ".to_owned()));
        // Without the delivered text's trailing space.
        let mut seam = Seam::new(Some(FIRST), &["t0 t1 "], 2);
        assert_eq!(text(seam.join(&chunk("t0 t1t2"))), Some("t2".to_owned()));
    }

    #[test]
    fn an_echo_of_the_whole_message_sent_or_with_other_whitespace_is_taken_off() {
        // The client's own prefill ("Sure: ") and the delivered text: the server echoes both.
        let mut seam = Seam::new(Some(FIRST), &["Sure: t0 t1 ", "t0 t1 "], 2);
        assert_eq!(seam.join(&chunk("Sure: t0")), None);
        assert_eq!(text(seam.join(&chunk(" t1 NEW "))), Some("NEW ".to_owned()));
        // Whitespace the server tokenised otherwise: doubled, missing, leading.
        for echo in ["t0  t1 t2", "t0t1 t2", " t0 t1 t2"] {
            let mut seam = Seam::new(Some(FIRST), &["t0 t1 "], 2);
            assert_eq!(
                text(seam.join(&chunk(echo))),
                Some("t2".to_owned()),
                "{echo:?}"
            );
        }
        // An echo that never ends before the continuation does is dropped whole.
        let mut seam = Seam::new(Some(FIRST), &["t0 t1 "], 2);
        assert_eq!(seam.join(&chunk("t0 t1")), None);
        let last =
            json!({"choices": [{"index": 0, "delta": {"content": " "}, "finish_reason": "stop"}]});
        let joined: Value = serde_json::from_str(&seam.join(&last.to_string()).unwrap()).unwrap();
        assert_eq!(joined["choices"][0]["delta"], json!({}));
    }

    #[test]
    fn new_text_from_the_first_token_passes_at_once() {
        let mut seam = Seam::new(Some(FIRST), &["t0 t1 t2 "], 3);
        assert_eq!(text(seam.join(&chunk("t3 "))), Some("t3 ".to_owned()));
        assert_eq!(
            text(seam.join(&chunk("t0 "))),
            Some("t0 ".to_owned()),
            "settled"
        );
        // New text that starts like the delivered text is held only until it differs.
        let mut seam = Seam::new(Some(FIRST), &["t0 t1 "], 2);
        assert_eq!(seam.join(&chunk("t0")), None);
        assert_eq!(text(seam.join(&chunk("!"))), Some("t0!".to_owned()));
    }

    #[test]
    fn a_restart_only_keeps_the_envelope_and_drops_the_role() {
        let mut seam = Seam::new(Some(FIRST), &[], 0);
        let first = json!({"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "t0 "}}]});
        let joined: Value = serde_json::from_str(&seam.join(&first.to_string()).unwrap()).unwrap();
        assert_eq!(joined["id"], "chatcmpl-1");
        assert_eq!(joined["choices"][0]["delta"], json!({"content": "t0 "}));
        assert_eq!(seam.join("not json").as_deref(), Some("not json"));
        let error = r#"{"error":{"message":"x"}}"#;
        assert!(seam.join(error).is_some());
    }
}
