//! OpenAI-native chunks (feature `openai`): `chat.completion.chunk` types that parse, encode
//! and merge losslessly, the stream's other frames (`[DONE]`, the usage chunk, errors), and the
//! `chat.completion` a request that asked for no stream gets.
//!
//! ```text
//! upstream SseEvent --ChatEvent::from_sse--> ChatEvent --gate (Coalesce)--> SseEvent::from --> client
//! ```
//!
//! A gateway that decodes its upstream into [`ChatEvent`]s can gate them with
//! [`Policy::Coalesce`](crate::Policy::Coalesce): a slow reader then gets fewer, larger chunks
//! that an OpenAI SDK accumulates into exactly the message it would have built from the
//! originals (see [`ChatCompletionChunk`]'s `merge`). A server builds its chunks from one
//! [`ChatCompletionChunk::new`] per stream:
//!
//! ```
//! use streamgate::Chunk;
//! use streamgate::openai::{ChatCompletionChunk, ChatEvent, ChunkChoice, Delta, Usage};
//! use streamgate::sse::SseEvent;
//!
//! let stream = ChatCompletionChunk::new("chatcmpl-1", 1_700_000_000, "my-model");
//! let delta = |content: &str| {
//!     let delta = Delta { content: Some(content.to_owned()), ..Delta::default() };
//!     stream.clone().with_choice(ChunkChoice::new(0, delta))
//! };
//! let mut first = delta("Hel");
//! first.merge(delta("lo")).unwrap();
//!
//! let usage = Usage { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5, ..Usage::default() };
//! let frames = [
//!     SseEvent::from(first),
//!     SseEvent::from(stream.clone().with_usage(usage)),
//!     SseEvent::from(ChatEvent::done()),
//! ];
//! assert_eq!(
//!     frames[0].data_str(),
//!     Some(r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"my-model","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}"#)
//! );
//! assert_eq!(frames[2].data_str(), Some("[DONE]"));
//! ```
//!
//! A server that makes a chunk per token writes them with a [`ChunkTemplate`] instead: the same
//! bytes, straight into the event's buffer, with no chunk built per token.

mod api_error;
mod chunk;
mod completion;
mod error;
mod event;
mod merge;
mod template;

pub use self::api_error::ApiError;
pub use self::chunk::{
    ChatCompletionChunk, ChunkChoice, Delta, FunctionDelta, Logprobs, TokenLogprob, ToolCallDelta,
    Usage,
};
pub use self::completion::{ChatCompletion, CompletionChoice, Message};
pub use self::error::ParseError;
pub use self::event::{ChatData, ChatEvent};
pub use self::template::ChunkTemplate;
pub use crate::wire::Extra;
