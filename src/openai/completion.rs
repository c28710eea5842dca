//! The `chat.completion` types: the answer to a request that did not ask for a stream.

use serde::{Deserialize, Serialize};

use super::chunk::{Logprobs, Usage};
use crate::wire::{Extra, to_json};

/// A whole chat completion (`chat.completion`): what an OpenAI-compatible server answers a
/// request without `"stream": true`, the message that a stream's chunks accumulate to.
///
/// As [`ChatCompletionChunk`](super::ChatCompletionChunk) does, parsing keeps every field this
/// type does not know in `extra` (at each level).
///
/// # Examples
///
/// ```
/// use streamgate::openai::{ChatCompletion, CompletionChoice, Message, Usage};
///
/// let usage = Usage { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5, ..Usage::default() };
/// let completion = ChatCompletion::new("chatcmpl-1", 1_700_000_000, "my-model")
///     .with_choice(CompletionChoice::new(0, Message::assistant("Hello"), "stop"))
///     .with_usage(usage);
/// assert_eq!(
///     completion.to_json(),
///     r#"{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"my-model","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#
/// );
/// let parsed: ChatCompletion = serde_json::from_str(&completion.to_json())?;
/// assert_eq!(parsed, completion);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletion {
    /// The completion's id.
    pub id: String,
    /// `chat.completion`.
    pub object: String,
    /// Unix time (seconds) the completion was created.
    pub created: u64,
    /// The model that generated the completion.
    pub model: String,
    /// The backend configuration the model ran with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
    /// The messages, one per choice (`n` > 1 gives several).
    pub choices: Vec<CompletionChoice>,
    /// The token counts of the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// One choice of a completion: its message, and why it finished.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    /// Which choice this is.
    pub index: u32,
    /// The message generated.
    pub message: Message,
    /// The log probabilities of the message's tokens, when requested. Always encoded (as
    /// `null` when absent), as OpenAI does.
    #[serde(default)]
    pub logprobs: Option<Logprobs>,
    /// Why the choice finished (`stop`, `length`, `tool_calls`, ...).
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A message of a completion.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// The author: `assistant`.
    pub role: String,
    /// The message text (`null` when the message is tool calls only). Always encoded.
    #[serde(default)]
    pub content: Option<String>,
    /// Fields this type does not know (`refusal`, `tool_calls`, `reasoning_content`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

impl ChatCompletion {
    /// Completion `id` with no choices yet, to fill with [`with_choice`](Self::with_choice)
    /// and [`with_usage`](Self::with_usage).
    pub fn new(id: impl Into<String>, created: u64, model: impl Into<String>) -> Self {
        ChatCompletion {
            id: id.into(),
            object: "chat.completion".to_owned(),
            created,
            model: model.into(),
            ..ChatCompletion::default()
        }
    }

    /// Adds a choice.
    pub fn with_choice(mut self, choice: CompletionChoice) -> Self {
        self.choices.push(choice);
        self
    }

    /// Sets the request's token counts.
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.usage = Some(usage);
        self
    }

    /// Encodes the completion as compact JSON.
    pub fn to_json(&self) -> String {
        to_json(self)
    }
}

impl CompletionChoice {
    /// Choice `index`: `message`, finished for `finish_reason`.
    pub fn new(index: u32, message: Message, finish_reason: impl Into<String>) -> Self {
        CompletionChoice {
            index,
            message,
            finish_reason: Some(finish_reason.into()),
            ..CompletionChoice::default()
        }
    }
}

impl Message {
    /// The assistant's message saying `content`.
    pub fn assistant(content: impl Into<String>) -> Self {
        Message {
            role: "assistant".to_owned(),
            content: Some(content.into()),
            extra: Extra::new(),
        }
    }
}
