//! What the wire formats' modules share (features `openai`, `anthropic`, `responses`): JSON that
//! keeps the fields a type does not know, lengths counted without encoding, and, for the formats
//! whose events name their type (Anthropic Messages, OpenAI Responses), how an event's type is
//! read and written and the events kept as they came.

#[cfg(any(feature = "anthropic", feature = "responses"))]
mod error;
mod json;
#[cfg(any(feature = "anthropic", feature = "responses"))]
mod tagged;
#[cfg(any(feature = "anthropic", feature = "responses"))]
mod unknown;

#[cfg(any(feature = "anthropic", feature = "responses"))]
pub use self::error::ParseError;
pub use self::json::Extra;
#[cfg(feature = "anthropic")]
pub(crate) use self::json::covers;
pub(crate) use self::json::extras_compatible;
#[cfg(any(feature = "openai", feature = "anthropic"))]
pub(crate) use self::json::to_json;
#[cfg(any(feature = "anthropic", feature = "responses"))]
pub(crate) use self::json::written_len;
#[cfg(feature = "openai")]
pub(crate) use self::json::{is_empty, json_len};
#[cfg(any(feature = "anthropic", feature = "responses"))]
pub(crate) use self::tagged::{parse_tagged, read_typed, typed_sse, write_tagged};
#[cfg(any(feature = "anthropic", feature = "responses"))]
pub use self::unknown::UnknownEvent;
