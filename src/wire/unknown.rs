//! An event of a type its format's module does not know, kept as it came.

use crate::chunk::{Chunk, Kind};
use crate::sse::SseEvent;

/// An event of a type the module does not know (a newer API's, a server's own), or whose data
/// names another type than its `event:` field: kept as it came, its `event:` and its data
/// unchanged, so a hop passes it on without understanding it. It never merges with another
/// event (a `ping` after it is absorbed, as after any event of a Messages stream).
///
/// # Examples
///
/// ```
/// use streamgate::Chunk;
/// use streamgate::sse::SseEvent;
///
/// let data = r#"{"type":"agent.thinking", "odd" :1}"#;
/// let sse = SseEvent::data(data).with_event("agent.thinking")?.with_id("4")?;
/// # #[cfg(feature = "anthropic")] {
/// use streamgate::anthropic::{MessagesData, MessagesEvent};
///
/// let event = MessagesEvent::from_sse(&sse)?;
/// let MessagesData::Unknown(unknown) = event.data() else { unreachable!() };
/// assert_eq!((unknown.event_type(), unknown.data()), (Some("agent.thinking"), data));
/// assert_eq!(SseEvent::from(event), sse);
/// # }
/// # #[cfg(feature = "responses")] {
/// use streamgate::responses::{ResponsesData, ResponsesEvent};
///
/// let event = ResponsesEvent::from_sse(&sse)?;
/// assert!(matches!(event.data(), ResponsesData::Unknown(unknown) if unknown.data() == data));
/// assert_eq!(SseEvent::from(event), sse);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownEvent {
    /// From a decoded event, so free of line breaks.
    event: Option<String>,
    data: String,
}

impl UnknownEvent {
    /// `event`'s type and data, as they came.
    pub(crate) fn of(event: &SseEvent) -> Self {
        UnknownEvent {
            event: event.event().map(str::to_owned),
            data: event.data_str().unwrap_or_default().to_owned(),
        }
    }

    /// The `event:` field, if the event had one.
    pub fn event_type(&self) -> Option<&str> {
        self.event.as_deref()
    }

    /// The data, as it came.
    pub fn data(&self) -> &str {
        &self.data
    }
}

impl Chunk for UnknownEvent {
    /// The data's length and the `event:` field's.
    fn byte_len(&self) -> usize {
        self.data.len() + self.event.as_ref().map_or(0, String::len)
    }

    /// As a decoder reads it: [`Control`](Kind::Control) for `data: [DONE]` (some servers end a
    /// Responses stream with it) and an event of type `error`; otherwise
    /// [`Visible`](Kind::Visible): an event the module does not know may carry output a user
    /// sees.
    fn kind(&self) -> Kind {
        if self.data == "[DONE]" || self.event.as_deref() == Some("error") {
            Kind::Control
        } else {
            Kind::Visible
        }
    }
}
