//! The `chat.completion.chunk` types and their JSON form.

use serde::{Deserialize, Serialize};

use super::error::ParseError;
use crate::wire::{Extra, to_json};

/// One `chat.completion.chunk`: what an OpenAI-compatible server sends per SSE event.
///
/// Parsing keeps every field this type does not know in `extra` (at each level), so
/// [`parse`](ChatCompletionChunk::parse) then [`to_json`](ChatCompletionChunk::to_json) loses
/// nothing but the order of the keys and the `null`s of optional fields. Under
/// [`Coalesce`](crate::Policy::Coalesce) consecutive chunks merge the way the OpenAI SDKs
/// accumulate them (see [`Chunk::merge`](crate::Chunk::merge) on this type).
///
/// # Examples
///
/// ```
/// use streamgate::Chunk;
/// use streamgate::openai::ChatCompletionChunk;
///
/// let data = |content: &str| {
///     format!(
///         r#"{{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m",
///             "choices":[{{"index":0,"delta":{{"content":"{content}"}},"logprobs":null,
///             "finish_reason":null,"stop_reason":null}}]}}"#
///     )
/// };
/// let mut chunk = ChatCompletionChunk::parse(data("Hel").as_bytes())?;
/// chunk.merge(ChatCompletionChunk::parse(data("lo").as_bytes())?).unwrap();
/// assert_eq!(chunk.choices[0].delta.content.as_deref(), Some("Hello"));
/// // The field this type does not know survives.
/// assert!(chunk.to_json().contains(r#""stop_reason":null"#));
/// assert_eq!(chunk.byte_len(), chunk.to_json().len());
/// # Ok::<(), streamgate::openai::ParseError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    /// The completion's id, the same on every chunk of a stream.
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: String,
    /// Unix time (seconds) the completion was created.
    pub created: u64,
    /// The model that generates the completion.
    pub model: String,
    /// The backend configuration the model runs with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
    /// The service tier that processed the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<String>,
    /// The deltas, one per choice this chunk advances (none in the usage chunk).
    pub choices: Vec<ChunkChoice>,
    /// The token counts of the whole request: only in the last chunk, when the client asked
    /// for them (`stream_options.include_usage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// One choice of a chunk: its delta, and why it finished.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChunkChoice {
    /// Which choice this is (`n` > 1 gives several).
    pub index: u32,
    /// The message text this chunk adds.
    pub delta: Delta,
    /// The log probabilities of the tokens in `delta`, when requested. Always encoded (as
    /// `null` when absent), as OpenAI does.
    #[serde(default)]
    pub logprobs: Option<Logprobs>,
    /// Why the choice finished (`stop`, `length`, `tool_calls`, ...); `null` until then and
    /// always encoded, as clients test it against `null`.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Fields this type does not know (`stop_reason`, say).
    #[serde(flatten)]
    pub extra: Extra,
}

/// What a chunk adds to a choice's message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    /// The author, `assistant`: only in a choice's first chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Message text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Refusal text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// Reasoning text (DeepSeek, vLLM and others): output the user does not see as the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Fragments of tool calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A fragment of one tool call: the first carries its id, type and name, the rest pieces of
/// its arguments.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    /// Which tool call of the message this fragment belongs to.
    pub index: u32,
    /// The tool call's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The function called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionDelta>,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A fragment of a function call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionDelta {
    /// The function's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A piece of the arguments (JSON text, cut anywhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// The log probabilities of a delta's tokens.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Logprobs {
    /// One entry per content token.
    #[serde(default)]
    pub content: Option<Vec<TokenLogprob>>,
    /// One entry per refusal token.
    #[serde(default)]
    pub refusal: Option<Vec<TokenLogprob>>,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// One token's log probability, and the most likely alternatives (which have none of their
/// own).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token.
    pub token: String,
    /// Its log probability.
    pub logprob: f64,
    /// Its UTF-8 bytes (a token may hold part of a character).
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
    /// The most likely tokens at this position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Vec<TokenLogprob>>,
    /// Fields this type does not know.
    #[serde(flatten)]
    pub extra: Extra,
}

/// The token counts of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
    /// Both.
    pub total_tokens: u64,
    /// Fields this type does not know (`prompt_tokens_details`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

impl ChatCompletionChunk {
    /// A chunk of completion `id` with no choices yet: the part every chunk of a stream
    /// repeats, to clone per chunk and fill with [`with_choice`](Self::with_choice) or
    /// [`with_usage`](Self::with_usage).
    pub fn new(id: impl Into<String>, created: u64, model: impl Into<String>) -> Self {
        ChatCompletionChunk {
            id: id.into(),
            object: "chat.completion.chunk".to_owned(),
            created,
            model: model.into(),
            ..ChatCompletionChunk::default()
        }
    }

    /// Adds a choice.
    pub fn with_choice(mut self, choice: ChunkChoice) -> Self {
        self.choices.push(choice);
        self
    }

    /// Makes this the usage chunk: no choices, the request's token counts.
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.choices.clear();
        self.usage = Some(usage);
        self
    }

    /// Parses a chunk from JSON (an SSE event's data).
    ///
    /// # Errors
    ///
    /// If `json` is not a chunk: not JSON, or a required field (`id`, `object`, `created`,
    /// `model`, `choices`) missing or of the wrong type.
    pub fn parse(json: &[u8]) -> Result<Self, ParseError> {
        serde_json::from_slice(json).map_err(ParseError::Json)
    }

    /// Encodes the chunk as compact JSON.
    pub fn to_json(&self) -> String {
        to_json(self)
    }
}

impl ChunkChoice {
    /// Choice `index` adding `delta`, not finished.
    pub fn new(index: u32, delta: Delta) -> Self {
        ChunkChoice {
            index,
            delta,
            ..ChunkChoice::default()
        }
    }
}
