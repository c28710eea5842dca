//! The wire formats the reference server speaks (chat completions, Anthropic Messages, OpenAI
//! Responses), why a generation ended, and what the events after its last token report.

use streamgate::sse::ErrorShape;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use streamgate::anthropic::MessagesData;
use streamgate::openai::ApiError;

use super::text::Text;

/// A streaming API: the request it reads, the events it streams, its error shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `POST /v1/chat/completions`: `chat.completion.chunk`s and `[DONE]`.
    Chat,
    /// `POST /v1/messages`: Anthropic Messages events.
    Messages,
    /// `POST /v1/responses`: OpenAI Responses events.
    Responses,
}

impl Format {
    /// Every format, in the order of [`index`](Format::index).
    pub(super) const ALL: [Format; 3] = [Format::Chat, Format::Messages, Format::Responses];

    /// The error shape of its streams' early ends.
    pub(super) fn error_shape(self) -> ErrorShape {
        match self {
            Format::Chat => ErrorShape::OpenAi,
            Format::Messages => ErrorShape::Anthropic,
            Format::Responses => ErrorShape::Responses,
        }
    }

    /// Its name in hop records' `api` attribute: `chat`, `messages`, `responses`.
    pub(super) fn name(self) -> &'static str {
        match self {
            Format::Chat => "chat",
            Format::Messages => "messages",
            Format::Responses => "responses",
        }
    }

    /// Its place in [`ALL`](Format::ALL).
    pub(super) fn index(self) -> usize {
        self as usize
    }

    /// The prefix of the ids the server makes for its answers: `chatcmpl-`, `msg_`, `resp_`.
    pub(super) fn id_prefix(self) -> &'static str {
        match self {
            Format::Chat => "chatcmpl-",
            Format::Messages => "msg_",
            Format::Responses => "resp_",
        }
    }

    /// The request's field holding the conversation, and the one bounding the new tokens.
    pub(super) fn request_fields(self) -> (&'static str, &'static str) {
        match self {
            Format::Chat | Format::Messages => ("messages", "max_tokens"),
            Format::Responses => ("input", "max_output_tokens"),
        }
    }

    /// The newer name of the bound on new tokens, read when the older is not given: chat's
    /// `max_completion_tokens`.
    pub(super) fn newer_bound_field(self) -> Option<&'static str> {
        match self {
            Format::Chat => Some("max_completion_tokens"),
            Format::Messages | Format::Responses => None,
        }
    }

    /// The request's field holding a system prompt given apart from the conversation:
    /// Messages' `system`, Responses' `instructions` (chat's is a message).
    pub(super) fn system_field(self) -> Option<&'static str> {
        match self {
            Format::Chat => None,
            Format::Messages => Some("system"),
            Format::Responses => Some("instructions"),
        }
    }

    /// The request's field holding stop sequences: chat's `stop`, Messages' `stop_sequences`
    /// (Responses has none).
    pub(super) fn stop_field(self) -> Option<&'static str> {
        match self {
            Format::Chat => Some("stop"),
            Format::Messages => Some("stop_sequences"),
            Format::Responses => None,
        }
    }

    /// An error body of class `kind` saying `message` (with `code`, where the format has one):
    /// OpenAI's `{"error":{"message":..,"type":..,"code":..}}` (chat completions, Responses) or
    /// Anthropic's `{"type":"error","error":{"type":..,"message":..}}` (Messages).
    pub(super) fn error_body(self, kind: &str, message: &str, code: Option<&str>) -> String {
        match self {
            Format::Chat | Format::Responses => {
                let error = ApiError::new(message, kind);
                match code {
                    Some(code) => error.with_code(code).to_json(),
                    None => error.to_json(),
                }
            }
            Format::Messages => MessagesData::error(kind, message).to_json(),
        }
    }

    /// A response of `status` with [an error body](Format::error_body).
    pub(super) fn error_response(self, status: StatusCode, kind: &str, message: &str) -> Response {
        let body = self.error_body(kind, message, None);
        (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// Every token asked for (or that the context holds) was generated.
    Length,
    /// The model ended its answer (an end-of-generation token), or an explicit stop
    /// (`POST .../cancel`) ended it.
    Stop,
    /// The answer reached one of the request's stop sequences (which it does not include).
    StopSequence,
}

impl FinishReason {
    /// As a chat chunk's `finish_reason` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Stop | FinishReason::StopSequence => "stop",
        }
    }

    /// As a Messages `stop_reason` spells it.
    pub fn stop_reason(self) -> &'static str {
        match self {
            FinishReason::Length => "max_tokens",
            FinishReason::Stop => "end_turn",
            FinishReason::StopSequence => "stop_sequence",
        }
    }
}

/// What the events after a generation's last token report: the whole answer's text (and the
/// tokens that made it), the prompt's tokens, and why it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    pub text: Text,
    /// The tokens of the prompt the answer followed (sim counts none).
    pub prompt: u64,
    pub reason: FinishReason,
}

impl Ending {
    /// How many tokens were made.
    pub fn made(&self) -> u64 {
        self.text.tokens()
    }
}
