//! What one event of a Messages stream carries, by its type: the events this module knows, and
//! the ones it keeps as they came.

use std::io;

use serde::de::DeserializeOwned;

use super::delta::Delta;
use super::events::{
    ContentBlockDelta, ContentBlockStart, ContentBlockStop, ErrorEvent, MessageDelta, MessageStart,
    MessageStop, Ping,
};
use super::message::ApiError;
use crate::wire::{Extra, ParseError, UnknownEvent, parse_tagged, write_tagged, written_len};

/// What one event of a Messages stream carries: its data, typed by the event's type (the SSE
/// `event:` field, which the data's `type` repeats).
///
/// # Examples
///
/// ```
/// use streamgate::Chunk;
/// use streamgate::anthropic::MessagesData;
///
/// let mut delta = MessagesData::text_delta(0, "Hel");
/// assert_eq!(delta.event_type(), "content_block_delta");
/// delta.merge(MessagesData::text_delta(0, "lo")).unwrap();
/// assert_eq!(
///     delta.to_json(),
///     r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#
/// );
/// assert!(MessagesData::message_stop().is_end());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum MessagesData {
    /// `message_start`.
    MessageStart(MessageStart),
    /// `content_block_start`.
    ContentBlockStart(ContentBlockStart),
    /// `content_block_delta`.
    ContentBlockDelta(ContentBlockDelta),
    /// `content_block_stop`.
    ContentBlockStop(ContentBlockStop),
    /// `message_delta`.
    MessageDelta(MessageDelta),
    /// `message_stop`: the stream is complete.
    MessageStop(MessageStop),
    /// `ping`.
    Ping(Ping),
    /// `error`: the stream failed.
    Error(ErrorEvent),
    /// An event of a type this module does not know, as it came.
    Unknown(UnknownEvent),
}

impl MessagesData {
    /// Reads `data` as the data of an event of type `kind`: `None` when the type is not one of
    /// this module's, or the data names another.
    pub(super) fn parse(kind: &str, data: &str) -> Result<Option<Self>, ParseError> {
        fn known<T: DeserializeOwned>(
            kind: &'static str,
            data: &str,
            wrap: fn(T) -> MessagesData,
        ) -> Result<Option<MessagesData>, ParseError> {
            parse_tagged(kind, data)
                .map(|body| body.map(wrap))
                .map_err(|error| ParseError::Data { event: kind, error })
        }
        match kind {
            MESSAGE_START => known(MESSAGE_START, data, MessagesData::MessageStart),
            BLOCK_START => known(BLOCK_START, data, MessagesData::ContentBlockStart),
            BLOCK_DELTA => known(BLOCK_DELTA, data, MessagesData::ContentBlockDelta),
            BLOCK_STOP => known(BLOCK_STOP, data, MessagesData::ContentBlockStop),
            MESSAGE_DELTA => known(MESSAGE_DELTA, data, MessagesData::MessageDelta),
            MESSAGE_STOP => known(MESSAGE_STOP, data, MessagesData::MessageStop),
            PING => known(PING, data, MessagesData::Ping),
            ERROR => known(ERROR, data, MessagesData::Error),
            _ => Ok(None),
        }
    }

    /// A `content_block_delta` adding `text` to block `index` (a `text_delta`).
    pub fn text_delta(index: u64, text: impl Into<String>) -> Self {
        MessagesData::ContentBlockDelta(ContentBlockDelta::new(index, Delta::text(text)))
    }

    /// `message_stop`.
    pub fn message_stop() -> Self {
        MessagesData::MessageStop(MessageStop::default())
    }

    /// `ping`.
    pub fn ping() -> Self {
        MessagesData::Ping(Ping::default())
    }

    /// An `error` event: `{"type":"error","error":{"type":kind,"message":message}}`.
    pub fn error(kind: impl Into<String>, message: impl Into<String>) -> Self {
        MessagesData::Error(ErrorEvent {
            error: ApiError::new(kind, message),
            extra: Extra::new(),
        })
    }

    /// The event's type: the SSE `event:` it is written with (an unknown event's own, or
    /// `message` when it had none).
    pub fn event_type(&self) -> &str {
        match self {
            MessagesData::MessageStart(_) => MESSAGE_START,
            MessagesData::ContentBlockStart(_) => BLOCK_START,
            MessagesData::ContentBlockDelta(_) => BLOCK_DELTA,
            MessagesData::ContentBlockStop(_) => BLOCK_STOP,
            MessagesData::MessageDelta(_) => MESSAGE_DELTA,
            MessagesData::MessageStop(_) => MESSAGE_STOP,
            MessagesData::Ping(_) => PING,
            MessagesData::Error(_) => ERROR,
            MessagesData::Unknown(unknown) => unknown.event_type().unwrap_or("message"),
        }
    }

    /// Whether this is the stream's last event: `message_stop` (complete) or `error` (failed).
    pub fn is_end(&self) -> bool {
        matches!(self, MessagesData::MessageStop(_) | MessagesData::Error(_))
    }

    /// The event's data: `{"type":...}` with the event's fields (an unknown event's data as it
    /// came).
    pub fn to_json(&self) -> String {
        let mut json = Vec::new();
        self.write_json(&mut json).expect("a Vec takes every write");
        String::from_utf8(json).expect("JSON and decoded text are UTF-8")
    }

    /// The length of [`to_json`](Self::to_json), counted without building it.
    pub(super) fn json_len(&self) -> usize {
        written_len(|out| self.write_json(out))
    }

    fn write_json(&self, out: &mut dyn io::Write) -> io::Result<()> {
        let kind = self.event_type();
        match self {
            MessagesData::MessageStart(body) => write_tagged(out, kind, body),
            MessagesData::ContentBlockStart(body) => write_tagged(out, kind, body),
            MessagesData::ContentBlockDelta(body) => write_tagged(out, kind, body),
            MessagesData::ContentBlockStop(body) => write_tagged(out, kind, body),
            MessagesData::MessageDelta(body) => write_tagged(out, kind, body),
            MessagesData::MessageStop(body) => write_tagged(out, kind, body),
            MessagesData::Ping(body) => write_tagged(out, kind, body),
            MessagesData::Error(body) => write_tagged(out, kind, body),
            MessagesData::Unknown(unknown) => out.write_all(unknown.data().as_bytes()),
        }
    }
}

const MESSAGE_START: &str = "message_start";
const BLOCK_START: &str = "content_block_start";
const BLOCK_DELTA: &str = "content_block_delta";
const BLOCK_STOP: &str = "content_block_stop";
const MESSAGE_DELTA: &str = "message_delta";
const MESSAGE_STOP: &str = "message_stop";
const PING: &str = "ping";
const ERROR: &str = "error";

macro_rules! from_events {
    ($($event:ident),*) => {$(
        impl From<$event> for MessagesData {
            fn from(event: $event) -> Self {
                MessagesData::$event(event)
            }
        }
    )*};
}

from_events!(
    MessageStart,
    ContentBlockStart,
    ContentBlockDelta,
    ContentBlockStop,
    MessageDelta,
    MessageStop,
    Ping
);

impl From<ErrorEvent> for MessagesData {
    fn from(event: ErrorEvent) -> Self {
        MessagesData::Error(event)
    }
}
