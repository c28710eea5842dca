//! JSON that keeps the fields a type does not know, and the length of an encoding counted
//! without building it.

use std::io;

#[cfg(any(feature = "openai", feature = "anthropic"))]
use serde::Serialize;
use serde_json::{Map, Value};

/// Fields a type does not know, kept as they came so that a hop never drops them.
pub type Extra = Map<String, Value>;

/// Encodes `value` as compact JSON.
#[cfg(any(feature = "openai", feature = "anthropic"))]
pub(crate) fn to_json(value: &impl Serialize) -> String {
    serde_json::to_string(value).expect("string keys and finite numbers always encode")
}

/// The length of `value`'s JSON encoding, counted without building it.
#[cfg(feature = "openai")]
pub(crate) fn json_len(value: &impl Serialize) -> usize {
    written_len(|out| serde_json::to_writer(out, value).map_err(io::Error::from))
}

/// The number of bytes `write` writes, counted without keeping them.
pub(crate) fn written_len(write: impl FnOnce(&mut dyn io::Write) -> io::Result<()>) -> usize {
    let mut count = ByteCount(0);
    write(&mut count).expect("counting never fails");
    count.0
}

/// An `io::Write` that only counts.
struct ByteCount(usize);

impl io::Write for ByteCount {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0 += bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Unknown fields of the parts that carry text (a delta) may merge only when they add nothing:
/// every value empty, and equal where both have the key (so the union is what accumulating both
/// gives, whatever a client's rule for the field is).
pub(crate) fn extras_compatible(mine: &Extra, next: &Extra) -> bool {
    mine.values().chain(next.values()).all(is_empty)
        && next
            .iter()
            .all(|(key, value)| mine.get(key).is_none_or(|mine| mine == value))
}

/// A value accumulating adds nothing with: `null`, `""`, `[]`, `{}`.
pub(crate) fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(text) => text.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(fields) => fields.is_empty(),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

/// Whether `later` has a value (not `null`) wherever `earlier` has one, in every object nested
/// in objects: a later cumulative report (Anthropic's `message_delta`) that supersedes an
/// earlier one, for a client that keeps the last report and for one that takes each field it
/// is given alike.
#[cfg(feature = "anthropic")]
pub(crate) fn covers(later: &Value, earlier: &Value) -> bool {
    match (later, earlier) {
        (_, Value::Null) => true,
        (Value::Null, _) => false,
        (Value::Object(later), Value::Object(earlier)) => earlier
            .iter()
            .all(|(key, value)| covers(later.get(key).unwrap_or(&Value::Null), value)),
        _ => true,
    }
}
