//! What a `content_block_delta` adds to its block: a piece of text, tool input, thinking or a
//! signature, or a delta of a type this module does not know.

use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::wire::Extra;

/// What a `content_block_delta` adds to its block.
///
/// Each known delta is one string under the field its type names (`text_delta`'s `text`,
/// `input_json_delta`'s `partial_json`, `thinking_delta`'s `thinking`, `signature_delta`'s
/// `signature`), with the fields this type does not know beside it. A delta of another type
/// (`citations_delta`, a newer API's), or of a known type without its string, is kept whole as
/// [`Unknown`](Delta::Unknown), its `type` included, and never merges.
///
/// # Examples
///
/// ```
/// use streamgate::anthropic::Delta;
///
/// let delta: Delta = serde_json::from_str(r#"{"type":"text_delta","text":"Hi","x":1}"#)?;
/// assert!(matches!(&delta, Delta::Text { text, .. } if text == "Hi"));
/// assert_eq!(serde_json::to_string(&delta)?, r#"{"type":"text_delta","text":"Hi","x":1}"#);
///
/// let citation = r#"{"citation":{"cited_text":"c"},"type":"citations_delta"}"#;
/// let delta: Delta = serde_json::from_str(citation)?;
/// assert!(matches!(delta, Delta::Unknown(_)));
/// assert_eq!(serde_json::to_string(&delta)?, citation);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    /// `text_delta`: text of a `text` block.
    Text {
        /// The text.
        text: String,
        /// Fields this type does not know.
        extra: Extra,
    },
    /// `input_json_delta`: a piece of a tool call's input (JSON text, cut anywhere).
    InputJson {
        /// The piece of JSON.
        partial_json: String,
        /// Fields this type does not know.
        extra: Extra,
    },
    /// `thinking_delta`: text of a `thinking` block.
    Thinking {
        /// The thinking text.
        thinking: String,
        /// Fields this type does not know.
        extra: Extra,
    },
    /// `signature_delta`: the signature of a `thinking` block, sent whole just before its stop.
    Signature {
        /// The signature.
        signature: String,
        /// Fields this type does not know.
        extra: Extra,
    },
    /// A delta of a type this module does not know, every field (`type` included) as it came.
    Unknown(Extra),
}

/// The known delta types.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DeltaKind {
    Text,
    InputJson,
    Thinking,
    Signature,
}

impl DeltaKind {
    const ALL: [DeltaKind; 4] = [
        DeltaKind::Text,
        DeltaKind::InputJson,
        DeltaKind::Thinking,
        DeltaKind::Signature,
    ];

    /// The delta's `type`.
    fn as_str(self) -> &'static str {
        match self {
            DeltaKind::Text => "text_delta",
            DeltaKind::InputJson => "input_json_delta",
            DeltaKind::Thinking => "thinking_delta",
            DeltaKind::Signature => "signature_delta",
        }
    }

    /// The field that carries its string.
    fn field(self) -> &'static str {
        match self {
            DeltaKind::Text => "text",
            DeltaKind::InputJson => "partial_json",
            DeltaKind::Thinking => "thinking",
            DeltaKind::Signature => "signature",
        }
    }

    fn parse(kind: &str) -> Option<Self> {
        DeltaKind::ALL
            .into_iter()
            .find(|known| known.as_str() == kind)
    }

    /// The delta of this kind adding `piece`.
    fn with(self, piece: String, extra: Extra) -> Delta {
        match self {
            DeltaKind::Text => Delta::Text { text: piece, extra },
            DeltaKind::InputJson => Delta::InputJson {
                partial_json: piece,
                extra,
            },
            DeltaKind::Thinking => Delta::Thinking {
                thinking: piece,
                extra,
            },
            DeltaKind::Signature => Delta::Signature {
                signature: piece,
                extra,
            },
        }
    }
}

impl Delta {
    /// A `text_delta` adding `text`.
    pub fn text(text: impl Into<String>) -> Self {
        DeltaKind::Text.with(text.into(), Extra::new())
    }

    /// The delta's `type` (an unknown delta's, if it has a string one).
    pub fn delta_type(&self) -> Option<&str> {
        match self.piece() {
            Ok((kind, _, _)) => Some(kind.as_str()),
            Err(fields) => fields.get("type").and_then(Value::as_str),
        }
    }

    /// A known delta's kind, its string and its unknown fields; an unknown delta's fields.
    fn piece(&self) -> Result<(DeltaKind, &String, &Extra), &Extra> {
        match self {
            Delta::Text { text, extra } => Ok((DeltaKind::Text, text, extra)),
            Delta::InputJson {
                partial_json,
                extra,
            } => Ok((DeltaKind::InputJson, partial_json, extra)),
            Delta::Thinking { thinking, extra } => Ok((DeltaKind::Thinking, thinking, extra)),
            Delta::Signature { signature, extra } => Ok((DeltaKind::Signature, signature, extra)),
            Delta::Unknown(fields) => Err(fields),
        }
    }
}

impl Serialize for Delta {
    /// `type`, the string under its field, then the unknown fields; an unknown delta as it came.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (kind, piece, extra) = match self.piece() {
            Ok(piece) => piece,
            Err(fields) => return fields.serialize(serializer),
        };
        let mut map = serializer.serialize_map(Some(2 + extra.len()))?;
        map.serialize_entry("type", kind.as_str())?;
        map.serialize_entry(kind.field(), piece)?;
        for (key, value) in extra {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Delta {
    /// Any JSON object: a known `type` with its string is that delta, anything else
    /// [`Unknown`](Delta::Unknown).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut fields = Extra::deserialize(deserializer)?;
        let kind = fields
            .get("type")
            .and_then(Value::as_str)
            .and_then(DeltaKind::parse);
        let Some(kind) = kind else {
            return Ok(Delta::Unknown(fields));
        };
        match fields.remove(kind.field()) {
            Some(Value::String(piece)) => {
                fields.remove("type");
                Ok(kind.with(piece, fields))
            }
            other => {
                // Not the delta it says it is: kept whole.
                fields.extend(other.map(|value| (kind.field().to_owned(), value)));
                Ok(Delta::Unknown(fields))
            }
        }
    }
}
