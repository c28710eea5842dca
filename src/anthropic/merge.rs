//! How a Messages stream's events coalesce: the Anthropic SDKs' accumulation rules, applied
//! before the client does.
//!
//! The SDKs build the message from the events (`accumulate_event` in anthropic-sdk-python's
//! `lib/streaming/_messages.py`, the same in the TypeScript SDK's `MessageStream`):
//! `message_start` gives the message; `content_block_start` appends a block; a
//! `content_block_delta` adds to block `index`: a `text_delta` to its `text`, an
//! `input_json_delta` to its input's JSON text (parsed partially after each), a
//! `thinking_delta` to its `thinking`, a `signature_delta` *sets* its `signature`, a
//! `citations_delta` appends a citation; `message_delta` sets `stop_reason`, `stop_sequence` and
//! `output_tokens`, and the other counts it carries; `ping` and unknown events add nothing.
//! A merge is taken only where accumulating the merged event gives the same message (and the
//! same events in between) as accumulating the two.

use super::data::MessagesData;
use super::delta::Delta;
use super::events::{ContentBlockDelta, MessageDelta};
use crate::chunk::{Chunk, Kind};
use crate::wire::{covers, extras_compatible};

impl Chunk for MessagesData {
    /// The data's JSON and the event's type, as the SSE event it is written as counts them.
    /// A merged delta repeats the event's fields once instead of twice and escapes its joined
    /// text exactly as the parts, so it is never longer than the two.
    fn byte_len(&self) -> usize {
        match self {
            MessagesData::Unknown(unknown) => unknown.byte_len(),
            known => known.json_len() + known.event_type().len(),
        }
    }

    /// [`Visible`](Kind::Visible): a `content_block_delta` of text, tool input or a type this
    /// module does not know (a citation), and an unknown event (it may carry output a user
    /// sees; `error`-typed ones aside). [`Hidden`](Kind::Hidden): a thinking or signature
    /// delta. [`Control`](Kind::Control): every other event (the message's and blocks' starts
    /// and stops, `message_delta`, `ping`, `error`): a block's start carries no model output
    /// yet (a server tool's result, which comes whole in its block's start, is the tool's
    /// output, not the model's).
    fn kind(&self) -> Kind {
        match self {
            MessagesData::ContentBlockDelta(event) => match event.delta {
                Delta::Thinking { .. } | Delta::Signature { .. } => Kind::Hidden,
                Delta::Text { .. } | Delta::InputJson { .. } | Delta::Unknown(_) => Kind::Visible,
            },
            MessagesData::Unknown(unknown) => unknown.kind(),
            _ => Kind::Control,
        }
    }

    /// Merges `next` the way the SDKs accumulate a stream, or hands it back:
    ///
    /// - Two `content_block_delta`s of the same block (`index`) and the same type, text, tool
    ///   input or thinking, concatenate, when their unknown fields are equal at the event's
    ///   level and add nothing in the delta (empty, and equal where both have them). Never
    ///   across a block's start or stop, or another block's delta (each is an event of its own),
    ///   and never a `signature_delta` (the SDK sets a signature, it does not append it) nor a
    ///   delta of a type this module does not know.
    /// - A later `message_delta` replaces an earlier one when it carries, non-null, every field
    ///   the earlier one carries (its counts are cumulative): only the last one's `usage` and
    ///   `stop_reason` stand, whether a client keeps the last `message_delta` or, as the SDK
    ///   does, takes each count it is given.
    /// - A `ping` after any event is absorbed (dropped): it adds nothing to the message. A ping
    ///   never takes in what follows it: the event would be the ping's (a control event,
    ///   stamped when the ping was queued), so the gate would count the output after it as
    ///   having waited since the ping came, and a probe would see model output in a control
    ///   event. The ping keeps its slot; the deltas after it merge with each other.
    ///
    /// Nothing else merges: the starts and stops, `message_stop`, `error` and unknown events
    /// stay as they are.
    fn merge(&mut self, next: Self) -> Result<(), Self> {
        match (self, next) {
            (_, MessagesData::Ping(_)) => Ok(()),
            (MessagesData::ContentBlockDelta(mine), MessagesData::ContentBlockDelta(theirs))
                if mine.can_absorb(&theirs) =>
            {
                mine.absorb(theirs);
                Ok(())
            }
            (MessagesData::MessageDelta(mine), MessagesData::MessageDelta(theirs))
                if theirs.supersedes(mine) =>
            {
                *mine = theirs;
                Ok(())
            }
            (_, next) => Err(next),
        }
    }
}

impl ContentBlockDelta {
    /// Same block, same type of text, unknown fields that lose nothing.
    fn can_absorb(&self, next: &Self) -> bool {
        self.index == next.index
            && self.extra == next.extra
            && match (&self.delta, &next.delta) {
                (Delta::Text { extra, .. }, Delta::Text { extra: more, .. })
                | (Delta::InputJson { extra, .. }, Delta::InputJson { extra: more, .. })
                | (Delta::Thinking { extra, .. }, Delta::Thinking { extra: more, .. }) => {
                    extras_compatible(extra, more)
                }
                _ => false,
            }
    }

    /// Appends `next`'s piece; only called when [`can_absorb`](Self::can_absorb) said yes.
    fn absorb(&mut self, next: Self) {
        match (&mut self.delta, next.delta) {
            (
                Delta::Text { text, extra },
                Delta::Text {
                    text: more,
                    extra: fields,
                },
            )
            | (
                Delta::InputJson {
                    partial_json: text,
                    extra,
                },
                Delta::InputJson {
                    partial_json: more,
                    extra: fields,
                },
            )
            | (
                Delta::Thinking {
                    thinking: text,
                    extra,
                },
                Delta::Thinking {
                    thinking: more,
                    extra: fields,
                },
            ) => {
                text.push_str(&more);
                extra.extend(fields);
            }
            _ => debug_assert!(false, "absorb after can_absorb"),
        }
    }
}

impl MessageDelta {
    /// Whether `self`, a later `message_delta`, has a value wherever `earlier` has one.
    fn supersedes(&self, earlier: &MessageDelta) -> bool {
        let value = |delta: &MessageDelta| {
            serde_json::to_value(delta).expect("string keys and finite numbers always encode")
        };
        covers(&value(self), &value(earlier))
    }
}
