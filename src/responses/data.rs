//! What one event of a Responses stream carries, by its type: the events this module knows, and
//! the ones it keeps as they came.

use std::io;

use serde::de::DeserializeOwned;

use super::events::{ErrorEvent, OutputItemEvent, PartEvent, ResponseEvent, TextDelta, TextDone};
use crate::wire::{ParseError, UnknownEvent, parse_tagged, write_tagged, written_len};

/// Declares [`ResponsesData`] from its table of event types: each variant, the shape of its
/// data and its `type`, so that reading, writing and naming follow one list.
macro_rules! responses_data {
    ($($(#[doc = $doc:literal])* $variant:ident($shape:ident) = $kind:literal,)*) => {
        /// What one event of a Responses stream carries: its data, typed by its `type` (which
        /// the SSE `event:` field repeats).
        ///
        /// # Examples
        ///
        /// ```
        /// use streamgate::Chunk;
        /// use streamgate::responses::ResponsesData;
        ///
        /// let delta = |text: &str, sequence_number| {
        ///     ResponsesData::output_text_delta("msg_1", 0, 0, text).with_sequence_number(sequence_number)
        /// };
        /// let mut hello = delta("Hel", 4);
        /// assert_eq!(hello.event_type(), "response.output_text.delta");
        /// hello.merge(delta("lo", 5)).unwrap();
        /// assert_eq!(hello.sequence_number(), Some(5));
        /// assert_eq!(
        ///     hello.to_json(),
        ///     r#"{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hello","logprobs":[],"sequence_number":5}"#
        /// );
        /// ```
        #[derive(Debug, Clone, PartialEq)]
        pub enum ResponsesData {
            $($(#[doc = $doc])* $variant($shape),)*
            /// An event of a type this module does not know, as it came.
            Unknown(UnknownEvent),
        }

        impl ResponsesData {
            /// Reads `data` as the data of an event of type `kind`: `None` when the type is not
            /// one of this module's, or the data names another.
            pub(super) fn parse(kind: &str, data: &str) -> Result<Option<Self>, ParseError> {
                fn known<T: DeserializeOwned>(
                    kind: &'static str,
                    data: &str,
                    wrap: fn(T) -> ResponsesData,
                ) -> Result<Option<ResponsesData>, ParseError> {
                    parse_tagged(kind, data)
                        .map(|body| body.map(wrap))
                        .map_err(|error| ParseError::Data { event: kind, error })
                }
                match kind {
                    $($kind => known($kind, data, ResponsesData::$variant),)*
                    _ => Ok(None),
                }
            }

            /// The event's type, which its SSE `event:` repeats (an unknown event's `event:`,
            /// or `message` when it had none).
            pub fn event_type(&self) -> &str {
                match self {
                    $(ResponsesData::$variant(_) => $kind,)*
                    ResponsesData::Unknown(unknown) => unknown.event_type().unwrap_or("message"),
                }
            }

            fn write_json(&self, out: &mut dyn io::Write) -> io::Result<()> {
                match self {
                    $(ResponsesData::$variant(body) => write_tagged(out, $kind, body),)*
                    ResponsesData::Unknown(unknown) => out.write_all(unknown.data().as_bytes()),
                }
            }
        }
    };
}

/// `$body` with `$event` bound to the data's shape, whichever it is; `$unknown` for an unknown
/// event.
macro_rules! each_shape {
    ($data:expr, $event:ident => $body:expr, $unknown:expr) => {
        match $data {
            ResponsesData::Created($event)
            | ResponsesData::Queued($event)
            | ResponsesData::InProgress($event)
            | ResponsesData::Completed($event)
            | ResponsesData::Incomplete($event)
            | ResponsesData::Failed($event) => $body,
            ResponsesData::OutputItemAdded($event) | ResponsesData::OutputItemDone($event) => $body,
            ResponsesData::ContentPartAdded($event)
            | ResponsesData::ContentPartDone($event)
            | ResponsesData::ReasoningSummaryPartAdded($event)
            | ResponsesData::ReasoningSummaryPartDone($event) => $body,
            ResponsesData::OutputTextDelta($event)
            | ResponsesData::RefusalDelta($event)
            | ResponsesData::FunctionCallArgumentsDelta($event)
            | ResponsesData::ReasoningSummaryTextDelta($event)
            | ResponsesData::ReasoningTextDelta($event) => $body,
            ResponsesData::OutputTextDone($event)
            | ResponsesData::RefusalDone($event)
            | ResponsesData::FunctionCallArgumentsDone($event)
            | ResponsesData::ReasoningSummaryTextDone($event)
            | ResponsesData::ReasoningTextDone($event) => $body,
            ResponsesData::Error($event) => $body,
            ResponsesData::Unknown(_) => $unknown,
        }
    };
}

responses_data! {
    /// `response.created`: the stream's first event.
    Created(ResponseEvent) = "response.created",
    /// `response.queued`: a background response waits to run.
    Queued(ResponseEvent) = "response.queued",
    /// `response.in_progress`.
    InProgress(ResponseEvent) = "response.in_progress",
    /// `response.completed`: the response is complete; the stream's last event.
    Completed(ResponseEvent) = "response.completed",
    /// `response.incomplete`: the response ended early (`max_output_tokens`, a content
    /// filter); the stream's last event.
    Incomplete(ResponseEvent) = "response.incomplete",
    /// `response.failed`: the response failed (its `error` says why); the stream's last event.
    Failed(ResponseEvent) = "response.failed",
    /// `response.output_item.added`.
    OutputItemAdded(OutputItemEvent) = "response.output_item.added",
    /// `response.output_item.done`.
    OutputItemDone(OutputItemEvent) = "response.output_item.done",
    /// `response.content_part.added`.
    ContentPartAdded(PartEvent) = "response.content_part.added",
    /// `response.content_part.done`.
    ContentPartDone(PartEvent) = "response.content_part.done",
    /// `response.reasoning_summary_part.added`.
    ReasoningSummaryPartAdded(PartEvent) = "response.reasoning_summary_part.added",
    /// `response.reasoning_summary_part.done`.
    ReasoningSummaryPartDone(PartEvent) = "response.reasoning_summary_part.done",
    /// `response.output_text.delta`: text of a message's `output_text` part.
    OutputTextDelta(TextDelta) = "response.output_text.delta",
    /// `response.output_text.done`.
    OutputTextDone(TextDone) = "response.output_text.done",
    /// `response.refusal.delta`: text of a message's `refusal` part.
    RefusalDelta(TextDelta) = "response.refusal.delta",
    /// `response.refusal.done`.
    RefusalDone(TextDone) = "response.refusal.done",
    /// `response.function_call_arguments.delta`: a piece of a function call's arguments (JSON
    /// text, cut anywhere).
    FunctionCallArgumentsDelta(TextDelta) = "response.function_call_arguments.delta",
    /// `response.function_call_arguments.done`.
    FunctionCallArgumentsDone(TextDone) = "response.function_call_arguments.done",
    /// `response.reasoning_summary_text.delta`: text of a reasoning item's summary part.
    ReasoningSummaryTextDelta(TextDelta) = "response.reasoning_summary_text.delta",
    /// `response.reasoning_summary_text.done`.
    ReasoningSummaryTextDone(TextDone) = "response.reasoning_summary_text.done",
    /// `response.reasoning_text.delta`: text of a reasoning item's `reasoning_text` part.
    ReasoningTextDelta(TextDelta) = "response.reasoning_text.delta",
    /// `response.reasoning_text.done`.
    ReasoningTextDone(TextDone) = "response.reasoning_text.done",
    /// `error`: the stream failed; its last event.
    Error(ErrorEvent) = "error",
}

impl ResponsesData {
    /// A `response.output_text.delta` adding `text` to part `content_index` of message
    /// `item_id` at `output_index`, with no log probabilities (`"logprobs":[]`) and no
    /// `sequence_number` yet.
    pub fn output_text_delta(
        item_id: impl Into<String>,
        output_index: u64,
        content_index: u64,
        text: impl Into<String>,
    ) -> Self {
        let delta = TextDelta {
            logprobs: Some(Vec::new()),
            ..TextDelta::new(item_id, output_index, content_index, text)
        };
        ResponsesData::OutputTextDelta(delta)
    }

    /// An `error` event: `{"type":"error","code":code,"message":message}`, with no
    /// `sequence_number` yet.
    pub fn error(code: impl Into<String>, message: impl Into<String>) -> Self {
        ResponsesData::Error(ErrorEvent {
            code: Some(code.into()),
            message: Some(message.into()),
            ..ErrorEvent::default()
        })
    }

    /// Whether this is the stream's last event: `response.completed`, `response.incomplete`,
    /// `response.failed` or `error`.
    pub fn is_end(&self) -> bool {
        matches!(
            self,
            ResponsesData::Completed(_)
                | ResponsesData::Incomplete(_)
                | ResponsesData::Failed(_)
                | ResponsesData::Error(_)
        )
    }

    /// The event's `sequence_number`, if it has one (an unknown event's is not read).
    pub fn sequence_number(&self) -> Option<u64> {
        each_shape!(self, event => event.sequence_number, None)
    }

    /// Sets the event's `sequence_number` (a proxy numbers the events of a server that does
    /// not); an unknown event is left as it came.
    pub fn with_sequence_number(mut self, sequence_number: u64) -> Self {
        if let Some(number) = self.sequence_number_mut() {
            *number = Some(sequence_number);
        }
        self
    }

    /// The event's `sequence_number` field, to change; `None` for an unknown event.
    pub fn sequence_number_mut(&mut self) -> Option<&mut Option<u64>> {
        each_shape!(self, event => Some(&mut event.sequence_number), None)
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
}
