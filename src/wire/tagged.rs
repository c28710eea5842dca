//! Events whose data names their type (Anthropic Messages, OpenAI Responses): the type an SSE
//! event names, its data with the type in it, and the SSE event it is written as.

use std::borrow::Cow;
use std::io;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::error::ParseError;
use super::unknown::UnknownEvent;
use crate::chunk::{Chunk, Kind};
use crate::sse::SseEvent;

/// An event's data as it is read: the `type` it names (if any), and the rest.
#[derive(Deserialize)]
struct Tagged<T> {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(flatten)]
    body: T,
}

/// An event's data as it is written: `type` first, then the rest.
#[derive(Serialize)]
struct TaggedRef<'a, T> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(flatten)]
    body: &'a T,
}

/// Reads `data` as the data of an event of type `kind`: its `type` (which the data may leave
/// out, as the Anthropic SDKs allow), then the rest as a `T`. `None` when the data names another
/// type.
pub(crate) fn parse_tagged<T: DeserializeOwned>(
    kind: &str,
    data: &str,
) -> Result<Option<T>, serde_json::Error> {
    match serde_json::from_str::<Tagged<T>>(data) {
        Ok(Tagged {
            kind: Some(named), ..
        }) if named != kind => Ok(None),
        Ok(tagged) => Ok(Some(tagged.body)),
        // Not this event, but perhaps one of another type.
        Err(error) => match data_type(data) {
            Some(named) if named != kind => Ok(None),
            _ => Err(error),
        },
    }
}

/// Writes `body` as the data of an event of type `kind`: `{"type":kind,...}`.
pub(crate) fn write_tagged(
    out: &mut dyn io::Write,
    kind: &str,
    body: &impl Serialize,
) -> io::Result<()> {
    serde_json::to_writer(out, &TaggedRef { kind, body }).map_err(io::Error::from)
}

/// Reads `event`'s data as `parse` reads data of the event's [type](named_type), or, when
/// `parse` does not know the type (`None`) or the event names none, as it came (`unknown`).
///
/// # Errors
///
/// If the event has no data, or `parse` fails.
pub(crate) fn read_typed<D>(
    event: &SseEvent,
    parse: impl FnOnce(&str, &str) -> Result<Option<D>, ParseError>,
    unknown: impl FnOnce(UnknownEvent) -> D,
) -> Result<D, ParseError> {
    let data = event.data_str().ok_or(ParseError::NoData)?;
    let known = match named_type(event) {
        Some(kind) => parse(&kind, data)?,
        None => None,
    };
    Ok(known.unwrap_or_else(|| unknown(UnknownEvent::of(event))))
}

/// The type of an event: its `event:` field or, when it has none (or `message`), the `type` of
/// its data if that is a JSON object naming one. `None` when neither names a type.
fn named_type(event: &SseEvent) -> Option<Cow<'_, str>> {
    match event.event_type() {
        "message" => {
            let data = event.data_str()?;
            data_type(data)
        }
        named => Some(Cow::Borrowed(named)),
    }
}

/// The `type` `data` names, if it is a JSON object with a string `type`.
fn data_type(data: &str) -> Option<Cow<'_, str>> {
    // An object only: a derived struct would read `["ping"]` as one, too.
    if !data
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .starts_with('{')
    {
        return None;
    }
    serde_json::from_str::<TypeOf<'_>>(data).ok()?.kind
}

/// Just an object's `type`; the other fields are skipped unread.
#[derive(Deserialize)]
struct TypeOf<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
}

/// `data` as an SSE event of type `event_type` (none: `message`) with `id`, marked `kind` where
/// a decoder could not tell it (an event of type `error` reads as control, any other data as
/// visible).
pub(crate) fn typed_sse(
    event_type: Option<&str>,
    data: String,
    kind: Kind,
    id: Option<String>,
) -> SseEvent {
    let mut sse = SseEvent::data(data);
    if let Some(event_type) = event_type {
        sse = sse
            .with_event(event_type)
            .expect("an event type is a known one or a decoded event's");
    }
    if sse.kind() != kind {
        sse = sse.marked(kind);
    }
    match id {
        Some(id) => sse
            .with_id(id)
            .expect("an id comes from a decoded event or is a number"),
        None => sse,
    }
}
