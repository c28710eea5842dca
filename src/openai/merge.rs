//! How chunks coalesce: the OpenAI SDKs' accumulation rules, applied before the client does.
//!
//! A merge is taken only where accumulating the merged chunk gives the client the same message
//! as accumulating the two one after the other, whichever way its SDK reads a field twice (the
//! Python SDK's `accumulate_delta` concatenates every string, `id` and `name` included, where
//! other clients keep the first): a field that must come once (`role`, a tool call's `id`,
//! `type` and `name`) ends a merge when both chunks carry it, rather than being concatenated or
//! dropped.

use super::chunk::{
    ChatCompletionChunk, ChunkChoice, Delta, FunctionDelta, Logprobs, ToolCallDelta,
};
use crate::chunk::{Chunk, Kind};
use crate::wire::{extras_compatible, is_empty, json_len};

impl Chunk for ChatCompletionChunk {
    /// The length of the JSON encoding (what the event's data holds), counted without
    /// building it. A merged chunk repeats the stream's fields once instead of twice and
    /// escapes its joined text exactly as the parts, so it is never longer than the two.
    fn byte_len(&self) -> usize {
        json_len(self)
    }

    /// [`Visible`](Kind::Visible) when a choice adds content, refusal, a tool call or a field
    /// this type does not know; [`Hidden`](Kind::Hidden) when it adds only reasoning;
    /// [`Control`](Kind::Control) when it adds no text at all (a role alone, a finish reason,
    /// the usage chunk).
    fn kind(&self) -> Kind {
        let channels = self
            .choices
            .iter()
            .fold(0, |all, choice| all | channels(&choice.delta));
        match channels {
            0 => Kind::Control,
            REASONING => Kind::Hidden,
            _ => Kind::Visible,
        }
    }

    /// Merges `next` the way the OpenAI SDKs accumulate a stream (`ChatCompletionStreamState`
    /// in openai-python): choices matched by index (a choice only `next` has is added);
    /// `content`, `refusal`, `reasoning_content` and tool-call `arguments` concatenated; tool
    /// calls matched by index, their `id`, `type` and `name` coming from the first fragment;
    /// logprobs extended.
    ///
    /// `next` is handed back, and the two stay separate events, unless both:
    ///
    /// - belong to the same completion: `id`, `object`, `created`, `model`,
    ///   `system_fingerprint`, `service_tier` and unknown top-level fields all equal;
    /// - are plain deltas: no usage, no `finish_reason` (a finish is seen as it happened), no
    ///   index twice in a chunk's choices or a delta's tool calls;
    /// - stay on one channel per choice: a delta adding reasoning, content, refusal or tool
    ///   calls does not merge with one adding another (empty text counts as none), so a client
    ///   still sees the switch where it happened;
    /// - do not both carry a field that comes once: a choice's `role`, a tool call's `id`,
    ///   `type` or function `name`;
    /// - have the same unknown fields in each choice and its logprobs (metadata such as vLLM's
    ///   `stop_reason`), and unknown fields in deltas and tool calls that are empty (`null`,
    ///   `""`, `[]`, `{}`) and equal where both have them: a delta field with a value may be a
    ///   channel this type does not know, and its accumulation rule is unknown.
    fn merge(&mut self, next: Self) -> Result<(), Self> {
        if !self.can_absorb(&next) {
            return Err(next);
        }
        self.absorb(next);
        Ok(())
    }
}

const REASONING: u8 = 1;
const CONTENT: u8 = 2;
const REFUSAL: u8 = 4;
const TOOL_CALLS: u8 = 8;
const UNKNOWN: u8 = 16;

/// The channels a delta adds text to, one bit each.
fn channels(delta: &Delta) -> u8 {
    let text = |text: &Option<String>, bit| match text.as_deref() {
        Some(text) if !text.is_empty() => bit,
        _ => 0,
    };
    let tool_calls = match &delta.tool_calls {
        Some(calls) if !calls.is_empty() => TOOL_CALLS,
        _ => 0,
    };
    let unknown = if delta.extra.values().all(is_empty) {
        0
    } else {
        UNKNOWN
    };
    text(&delta.reasoning_content, REASONING)
        | text(&delta.content, CONTENT)
        | text(&delta.refusal, REFUSAL)
        | tool_calls
        | unknown
}

/// A part of a chunk that may take in the same part of the next chunk.
trait Absorb {
    /// Whether absorbing `next` loses nothing a client accumulates.
    fn can_absorb(&self, next: &Self) -> bool;

    /// Takes `next` in; only called when [`can_absorb`](Absorb::can_absorb) said yes.
    fn absorb(&mut self, next: Self);
}

/// A part that is one of a list, matched across chunks by its index.
trait Indexed: Absorb {
    fn index(&self) -> u32;
}

impl Absorb for ChatCompletionChunk {
    fn can_absorb(&self, next: &Self) -> bool {
        let ChatCompletionChunk {
            id,
            object,
            created,
            model,
            system_fingerprint,
            service_tier,
            choices,
            usage,
            extra,
        } = self;
        (id, object, created, model) == (&next.id, &next.object, &next.created, &next.model)
            && (system_fingerprint, service_tier, extra)
                == (&next.system_fingerprint, &next.service_tier, &next.extra)
            && usage.is_none()
            && next.usage.is_none()
            && choices
                .iter()
                .chain(&next.choices)
                .all(|choice| choice.finish_reason.is_none())
            && can_absorb_list(choices, &next.choices)
    }

    fn absorb(&mut self, next: Self) {
        absorb_list(&mut self.choices, next.choices);
    }
}

impl Indexed for ChunkChoice {
    fn index(&self) -> u32 {
        self.index
    }
}

impl Absorb for ChunkChoice {
    fn can_absorb(&self, next: &Self) -> bool {
        self.extra == next.extra
            && can_absorb_option(&self.logprobs, &next.logprobs)
            && self.delta.can_absorb(&next.delta)
    }

    fn absorb(&mut self, next: Self) {
        self.delta.absorb(next.delta);
        absorb_option(&mut self.logprobs, next.logprobs);
    }
}

impl Absorb for Delta {
    fn can_absorb(&self, next: &Self) -> bool {
        (channels(self) | channels(next)).count_ones() <= 1
            && at_most_one(&self.role, &next.role)
            && extras_compatible(&self.extra, &next.extra)
            && can_absorb_option(&self.tool_calls, &next.tool_calls)
    }

    fn absorb(&mut self, next: Self) {
        self.role = self.role.take().or(next.role);
        absorb_option(&mut self.content, next.content);
        absorb_option(&mut self.refusal, next.refusal);
        absorb_option(&mut self.reasoning_content, next.reasoning_content);
        absorb_option(&mut self.tool_calls, next.tool_calls);
        self.extra.extend(next.extra);
    }
}

impl Indexed for ToolCallDelta {
    fn index(&self) -> u32 {
        self.index
    }
}

impl Absorb for ToolCallDelta {
    fn can_absorb(&self, next: &Self) -> bool {
        at_most_one(&self.id, &next.id)
            && at_most_one(&self.kind, &next.kind)
            && extras_compatible(&self.extra, &next.extra)
            && can_absorb_option(&self.function, &next.function)
    }

    fn absorb(&mut self, next: Self) {
        self.id = self.id.take().or(next.id);
        self.kind = self.kind.take().or(next.kind);
        absorb_option(&mut self.function, next.function);
        self.extra.extend(next.extra);
    }
}

impl Absorb for FunctionDelta {
    fn can_absorb(&self, next: &Self) -> bool {
        at_most_one(&self.name, &next.name) && extras_compatible(&self.extra, &next.extra)
    }

    fn absorb(&mut self, next: Self) {
        self.name = self.name.take().or(next.name);
        absorb_option(&mut self.arguments, next.arguments);
        self.extra.extend(next.extra);
    }
}

impl Absorb for Logprobs {
    fn can_absorb(&self, next: &Self) -> bool {
        self.extra == next.extra
    }

    /// Extends each list by the next one when that is not empty, as the SDK does (an empty
    /// list adds nothing, and does not turn a missing list into an empty one).
    fn absorb(&mut self, next: Self) {
        for (list, more) in [
            (&mut self.content, next.content),
            (&mut self.refusal, next.refusal),
        ] {
            if let Some(more) = more.filter(|more| !more.is_empty()) {
                list.get_or_insert_default().extend(more);
            }
        }
    }
}

/// Text concatenates.
impl Absorb for String {
    fn can_absorb(&self, _: &Self) -> bool {
        true
    }

    fn absorb(&mut self, next: Self) {
        self.push_str(&next);
    }
}

/// Tool calls are matched by index.
impl Absorb for Vec<ToolCallDelta> {
    fn can_absorb(&self, next: &Self) -> bool {
        can_absorb_list(self, next)
    }

    fn absorb(&mut self, next: Self) {
        absorb_list(self, next);
    }
}

/// A field that comes once (a role, a tool call's id, type or name) merges only from one side:
/// the SDKs would concatenate it, or keep the first.
fn at_most_one<T>(mine: &Option<T>, next: &Option<T>) -> bool {
    mine.is_none() || next.is_none()
}

/// A part only one chunk has is taken as it is.
fn can_absorb_option<T: Absorb>(mine: &Option<T>, next: &Option<T>) -> bool {
    match (mine, next) {
        (Some(mine), Some(next)) => mine.can_absorb(next),
        _ => true,
    }
}

fn absorb_option<T: Absorb>(mine: &mut Option<T>, next: Option<T>) {
    match (mine, next) {
        (Some(mine), Some(next)) => mine.absorb(next),
        (mine @ None, next) => *mine = next,
        (Some(_), None) => {}
    }
}

/// Each index at most once per list, and each part of `next` absorbable by the part of the
/// same index in `mine`, if any.
fn can_absorb_list<T: Indexed>(mine: &[T], next: &[T]) -> bool {
    let find = |index| mine.iter().find(|part| part.index() == index);
    unique_indexes(mine)
        && unique_indexes(next)
        && next
            .iter()
            .all(|part| find(part.index()).is_none_or(|mine| mine.can_absorb(part)))
}

/// Each part of `next` is absorbed by the part of the same index in `mine`, or added after
/// them.
fn absorb_list<T: Indexed>(mine: &mut Vec<T>, next: Vec<T>) {
    for part in next {
        match mine.iter_mut().find(|mine| mine.index() == part.index()) {
            Some(mine) => mine.absorb(part),
            None => mine.push(part),
        }
    }
}

fn unique_indexes<T: Indexed>(parts: &[T]) -> bool {
    let mut indexes: Vec<u32> = parts.iter().map(Indexed::index).collect();
    indexes.sort_unstable();
    indexes.windows(2).all(|pair| pair[0] != pair[1])
}
