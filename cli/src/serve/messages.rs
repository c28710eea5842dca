//! A generation as Anthropic Messages (`POST /v1/messages`): its events, written with the
//! library's `anthropic` types, and the whole message of a request that streams none.

use serde_json::{Value, json};
use streamgate::anthropic::{
    ContentBlock, ContentBlockStart, ContentBlockStop, Message, MessageDelta, MessageStart,
    MessagesData, StopDelta, Usage,
};
use streamgate::sse::SseEvent;

use super::format::Ending;
use super::meta::Meta;
use super::text::Text;

/// The events of a Messages stream around its tokens (each `text_delta` of block 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessagesFrame {
    /// `message_start`: the message, no content yet.
    Start,
    /// `content_block_start`: text block 0.
    BlockStart,
    /// `content_block_stop`: block 0 is complete.
    BlockStop,
    /// `message_delta`: the `stop_reason` and the cumulative `usage`.
    Delta(Ending),
    /// `message_stop`.
    Stop,
}

impl MessagesFrame {
    /// The events before the first token.
    pub(super) fn opening() -> [Self; 2] {
        [MessagesFrame::Start, MessagesFrame::BlockStart]
    }

    /// The events after the last token.
    pub(super) fn closing(ending: &Ending) -> [Self; 3] {
        [
            MessagesFrame::BlockStop,
            MessagesFrame::Delta(ending.clone()),
            MessagesFrame::Stop,
        ]
    }

    /// The event, as `event: <type>` and its data.
    pub(super) fn event(self, meta: &Meta) -> SseEvent {
        let data: MessagesData = match self {
            MessagesFrame::Start => MessageStart {
                message: Message {
                    usage: Some(usage(0, 1)),
                    ..Message::new(meta.id.as_str(), meta.model.as_str())
                },
                ..MessageStart::default()
            }
            .into(),
            MessagesFrame::BlockStart => ContentBlockStart {
                index: 0,
                content_block: ContentBlock::text(),
                ..ContentBlockStart::default()
            }
            .into(),
            MessagesFrame::BlockStop => ContentBlockStop::default().into(),
            MessagesFrame::Delta(ending) => MessageDelta {
                delta: StopDelta {
                    stop_reason: Some(ending.reason.stop_reason().to_owned()),
                    ..StopDelta::default()
                },
                usage: Some(usage(ending.prompt, ending.made())),
                ..MessageDelta::default()
            }
            .into(),
            MessagesFrame::Stop => MessagesData::message_stop(),
        };
        data.into()
    }
}

/// A run of text as a `content_block_delta` of block 0.
pub(super) fn text(text: &Text) -> SseEvent {
    MessagesData::text_delta(0, text.to_string()).into()
}

/// A failed generation's `event: error` (`overloaded_error`, as Anthropic's for a server out
/// of capacity).
pub(super) fn error(message: &str) -> SseEvent {
    MessagesData::error(ERROR_KIND, message).into()
}

/// The error class of a generation that failed for want of capacity.
pub(super) const ERROR_KIND: &str = "overloaded_error";

/// The whole message of a request that streams none: `text` in one text block.
pub(super) fn message(meta: &Meta, text: String, ending: &Ending) -> String {
    let mut message = Message {
        usage: Some(usage(ending.prompt, ending.made())),
        ..Message::new(meta.id.as_str(), meta.model.as_str())
    };
    let fields = [
        ("content", json!([{"type": "text", "text": text}])),
        ("stop_reason", Value::from(ending.reason.stop_reason())),
    ];
    message
        .extra
        .extend(fields.map(|(key, value)| (key.to_owned(), value)));
    message.to_json()
}

/// The token counts: `input` tokens of prompt, `output` tokens so far.
fn usage(input: u64, output: u64) -> Usage {
    Usage {
        input_tokens: Some(input),
        output_tokens: Some(output),
        ..Usage::default()
    }
}
