//! Why an SSE event is not an event of a stream whose events name their type.

use std::fmt;

/// Why an SSE event could not be read as an event of an Anthropic Messages or OpenAI Responses
/// stream.
///
/// An event of a type the format's module does not know is no error: it is kept as it came (see
/// [`UnknownEvent`](super::UnknownEvent)).
///
/// # Examples
///
/// ```
/// use streamgate::sse::SseEvent;
///
/// # #[cfg(feature = "anthropic")] {
/// use streamgate::anthropic::{MessagesEvent, ParseError};
///
/// let cut = SseEvent::data(r#"{"type":"content_block_delta","index":0,"del"#)
///     .with_event("content_block_delta")?;
/// let error = MessagesEvent::from_sse(&cut).unwrap_err();
/// assert!(matches!(error, ParseError::Data { event: "content_block_delta", .. }));
/// # }
/// # #[cfg(feature = "responses")] {
/// use streamgate::responses::{ParseError, ResponsesEvent};
///
/// let no_delta = SseEvent::data(r#"{"type":"response.output_text.delta","item_id":"msg_1"}"#);
/// let error = ResponsesEvent::from_sse(&no_delta).unwrap_err();
/// assert!(matches!(error, ParseError::Data { event: "response.output_text.delta", .. }));
/// assert_eq!(
///     error.to_string(),
///     "invalid `response.output_text.delta` event: missing field `delta` at line 1 column 55"
/// );
/// # }
/// # Ok::<(), streamgate::sse::FieldError>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum ParseError {
    /// The event carries no data (a retry-only event).
    NoData,
    /// The data of an event of a known type is not that event: not JSON, or a field missing or
    /// of the wrong type.
    Data {
        /// The event's type.
        event: &'static str,
        /// What serde_json found.
        error: serde_json::Error,
    },
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::NoData => f.write_str("event carries no data"),
            ParseError::Data { event, error } => {
                write!(f, "invalid `{event}` event: {error}")
            }
        }
    }
}

impl std::error::Error for ParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ParseError::Data { error, .. } => Some(error),
            ParseError::NoData => None,
        }
    }
}
