//! How a Responses stream's events coalesce: the OpenAI SDKs' accumulation rules, applied before
//! the client does.
//!
//! The SDKs build the response from the events (`ResponseStreamState.accumulate_event` in
//! openai-python's `lib/streaming/responses/_responses.py`, the same in openai-node's
//! `ResponseStream`): `response.created` gives the response; `output_item.added` appends an
//! item to its `output`; `content_part.added` appends a part to item `output_index`'s content;
//! an `output_text.delta` adds to part `content_index`'s text, a
//! `function_call_arguments.delta` to the call's `arguments`; `response.completed` gives the
//! final response. Every other event passes to the application as it came. A merge is taken
//! only where accumulating the merged event gives the same response, and the same events in
//! between, as accumulating the two; the reasoning and refusal deltas, which the SDKs pass on
//! without accumulating them, merge by the same rule as the text ones.

use super::data::ResponsesData;
use super::events::TextDelta;
use crate::chunk::{Chunk, Kind};
use crate::wire::extras_compatible;

impl Chunk for ResponsesData {
    /// The data's JSON and the event's type, as the SSE event it is written as counts them.
    /// A merged delta repeats the event's fields once instead of twice, drops the padding and
    /// escapes its joined text exactly as the parts, so it is never longer than the two.
    fn byte_len(&self) -> usize {
        match self {
            ResponsesData::Unknown(unknown) => unknown.byte_len(),
            known => known.json_len() + known.event_type().len(),
        }
    }

    /// [`Visible`](Kind::Visible): the deltas of output text, refusal and function-call
    /// arguments, and an unknown event (it may carry output a user sees; `[DONE]` and
    /// `error`-typed ones aside). [`Hidden`](Kind::Hidden): the reasoning summary and reasoning
    /// text deltas. [`Control`](Kind::Control): every other event (the lifecycle, items and
    /// parts beginning and ending, the `.done` events, which repeat the text the deltas
    /// carried, and `error`).
    fn kind(&self) -> Kind {
        match self {
            ResponsesData::OutputTextDelta(_)
            | ResponsesData::RefusalDelta(_)
            | ResponsesData::FunctionCallArgumentsDelta(_) => Kind::Visible,
            ResponsesData::ReasoningSummaryTextDelta(_) | ResponsesData::ReasoningTextDelta(_) => {
                Kind::Hidden
            }
            ResponsesData::Unknown(unknown) => unknown.kind(),
            _ => Kind::Control,
        }
    }

    /// Merges `next` the way the SDKs accumulate a stream, or hands it back: two deltas of the
    /// same type (output text, refusal, function-call arguments, reasoning summary text,
    /// reasoning text) for the same place (`item_id`, `output_index`, `content_index`,
    /// `summary_index` all equal, present or not) concatenate, when their unknown fields add
    /// nothing (empty, and equal where both have them). The merged delta's log probabilities
    /// are both lists, one after the other; its `sequence_number` is the later one's (the last
    /// event it covers, so a client that resumes `starting_after` it misses nothing and gets
    /// nothing twice); it has no `obfuscation` (the padding is random, and evens out sizes the
    /// merge changes anyway).
    ///
    /// Nothing else merges: a delta never crosses another event (an item's or a part's start or
    /// end, a `.done`, another place's delta), and the lifecycle, `error` and unknown events
    /// stay as they are.
    fn merge(&mut self, next: Self) -> Result<(), Self> {
        use ResponsesData::*;
        match (self, next) {
            (OutputTextDelta(mine), OutputTextDelta(theirs))
            | (RefusalDelta(mine), RefusalDelta(theirs))
            | (FunctionCallArgumentsDelta(mine), FunctionCallArgumentsDelta(theirs))
            | (ReasoningSummaryTextDelta(mine), ReasoningSummaryTextDelta(theirs))
            | (ReasoningTextDelta(mine), ReasoningTextDelta(theirs))
                if mine.can_absorb(&theirs) =>
            {
                mine.absorb(theirs);
                Ok(())
            }
            (_, next) => Err(next),
        }
    }
}

impl TextDelta {
    /// Same place, unknown fields that add nothing.
    fn can_absorb(&self, next: &Self) -> bool {
        (
            &self.item_id,
            self.output_index,
            self.content_index,
            self.summary_index,
        ) == (
            &next.item_id,
            next.output_index,
            next.content_index,
            next.summary_index,
        ) && extras_compatible(&self.extra, &next.extra)
    }

    /// Appends `next`; only called when [`can_absorb`](Self::can_absorb) said yes.
    fn absorb(&mut self, next: Self) {
        self.delta.push_str(&next.delta);
        if let Some(more) = next.logprobs {
            self.logprobs.get_or_insert_default().extend(more);
        }
        self.obfuscation = None;
        self.sequence_number = next.sequence_number.or(self.sequence_number);
        self.extra.extend(next.extra);
    }
}
