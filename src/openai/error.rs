//! Why bytes or an event are not part of a chat completion stream.

use std::fmt;

/// Why an SSE event or its data could not be read as part of a chat completion stream.
#[derive(Debug)]
#[non_exhaustive]
pub enum ParseError {
    /// The event carries no data (a retry-only event).
    NoData,
    /// The event has a type other than `message` or `error`.
    EventType(String),
    /// The data is not a chunk (nor an error object): not JSON, or a field missing or of the
    /// wrong type.
    Json(serde_json::Error),
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::NoData => f.write_str("openai event carries no data"),
            ParseError::EventType(kind) => write!(f, "openai event has type `{kind}`"),
            ParseError::Json(error) => write!(f, "invalid chat completion chunk: {error}"),
        }
    }
}

impl std::error::Error for ParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ParseError::Json(error) => Some(error),
            _ => None,
        }
    }
}
