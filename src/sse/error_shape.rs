//! The JSON of a terminal `event: error` frame, in the error shape of the API a stream speaks.

use bytes::Bytes;

use super::frame::SseFrame;
use crate::chunk::Kind;
use crate::probe::json_string;

/// The error shape of the API a stream speaks: what the data of the terminal `event: error`
/// frame looks like when the stream ends early (a slow consumer cut off, a shutdown, a failed
/// generator), so that the API's clients read it as the error it is. The `type` (or `code`) is
/// always the [end reason](crate::EndReason) and the message says why.
///
/// Set it with [`EncodeSse::error_shape`](super::EncodeSse::error_shape) (and, for a
/// registered stream, `Claim::error_shape`, so that every subscriber's own ends have it too).
///
/// # Examples
///
/// ```
/// use futures_util::StreamExt;
/// use streamgate::sse::{ErrorShape, SseEvent};
/// use streamgate::{Gate, GateExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let consumer = Gate::new().spawn(|_, mut tx| async move {
///     tx.send(SseEvent::data("{}").with_event("ping").unwrap()).await.ok();
///     Err(std::io::Error::other("the decode loop failed"))
/// });
/// let frames: Vec<_> = consumer.sse().error_shape(ErrorShape::Anthropic).collect().await;
/// assert_eq!(
///     &frames[1].bytes()[..],
///     &br#"event: error
/// data: {"type":"error","error":{"type":"generator_error","message":"stream ended: generator failed"}}
///
/// "#[..]
/// );
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ErrorShape {
    /// `{"error":{"type":"<end reason>","message":"<why>"}}`: OpenAI chat and text completions,
    /// and the servers compatible with them.
    #[default]
    OpenAi,
    /// `{"type":"error","error":{"type":"<end reason>","message":"<why>"}}`: Anthropic Messages
    /// (`POST /v1/messages`), whose SDKs raise it as an API error.
    Anthropic,
    /// `{"type":"error","code":"<end reason>","message":"<why>","param":null,"sequence_number":n}`:
    /// OpenAI Responses (`POST /v1/responses`), numbered after the last event sent (left out
    /// when no event was).
    Responses,
}

impl ErrorShape {
    /// The terminal frame of type `kind` saying `message`; `next` is the id the frame comes
    /// at, when known (a Responses error's `sequence_number`).
    pub(crate) fn frame(self, kind: &str, message: &str, next: Option<u64>) -> SseFrame {
        let mut data = String::with_capacity(96 + kind.len() + message.len());
        data.push_str("event: error\ndata: {");
        match self {
            ErrorShape::OpenAi | ErrorShape::Anthropic => {
                if self == ErrorShape::Anthropic {
                    data.push_str("\"type\":\"error\",");
                }
                data.push_str("\"error\":{\"type\":");
                json_string(&mut data, kind);
                data.push_str(",\"message\":");
                json_string(&mut data, message);
                data.push('}');
            }
            ErrorShape::Responses => {
                data.push_str("\"type\":\"error\",\"code\":");
                json_string(&mut data, kind);
                data.push_str(",\"message\":");
                json_string(&mut data, message);
                data.push_str(",\"param\":null");
                if let Some(next) = next {
                    data.push_str(",\"sequence_number\":");
                    data.push_str(&next.to_string());
                }
            }
        }
        data.push_str("}\n\n");
        SseFrame::new(Bytes::from(data), Kind::Control, None)
    }

    /// Its name in a store (`Claim::error_shape` kept with a Redis stream).
    #[cfg(feature = "redis")]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ErrorShape::OpenAi => "openai",
            ErrorShape::Anthropic => "anthropic",
            ErrorShape::Responses => "responses",
        }
    }

    /// The shape named `name` in a store; the default for a name this version does not know.
    #[cfg(feature = "redis")]
    pub(crate) fn from_name(name: Option<&str>) -> Self {
        match name {
            Some("anthropic") => ErrorShape::Anthropic,
            Some("responses") => ErrorShape::Responses,
            _ => ErrorShape::OpenAi,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_shape_says_the_reason_and_why_as_json_strings() {
        let data = |shape: ErrorShape, next| {
            let frame = shape.frame("slow_consumer", "cut \"off\"", next);
            String::from_utf8(frame.bytes().to_vec()).unwrap()
        };
        assert_eq!(
            data(ErrorShape::OpenAi, Some(3)),
            "event: error\ndata: {\"error\":{\"type\":\"slow_consumer\",\"message\":\"cut \\\"off\\\"\"}}\n\n"
        );
        assert_eq!(
            data(ErrorShape::Anthropic, None),
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"slow_consumer\",\"message\":\"cut \\\"off\\\"\"}}\n\n"
        );
        assert_eq!(
            data(ErrorShape::Responses, Some(3)),
            "event: error\ndata: {\"type\":\"error\",\"code\":\"slow_consumer\",\"message\":\"cut \\\"off\\\"\",\"param\":null,\"sequence_number\":3}\n\n"
        );
        assert!(!data(ErrorShape::Responses, None).contains("sequence_number"));
    }
}
