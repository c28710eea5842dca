//! What the proxy gates: one upstream SSE event, passed on as it came unless a slow client
//! made it merge with the next.

use streamgate::anthropic::MessagesEvent;
use streamgate::openai::{ChatData, ChatEvent};
use streamgate::responses::ResponsesEvent;
use streamgate::sse::SseEvent;
use streamgate::{Chunk, Kind};

use super::format::Format;

/// One upstream event on its way to the client, with the proxy's event id.
///
/// It is sent on byte for byte (only its `id:` is the proxy's) unless `--policy coalesce` merges
/// it: events of a chat completion (`chat.completion.chunk`), Messages or Responses stream then
/// merge under the crate's lossless rules for their API (what an SDK accumulates from the
/// merged event equals what it accumulates from the parts; a merged event keeps the later
/// one's id, and a Responses event its `sequence_number`), and the merged event is encoded
/// anew. Anything else (a `text_completion` chunk, `[DONE]`, an error, an event the rules do
/// not merge) never merges. The JSON is parsed only when a merge is tried, that is only when
/// the client is behind.
#[derive(Debug, Clone)]
pub(super) struct Relayed {
    event: SseEvent,
    kind: Kind,
    /// The API whose rules it merges by, gated under `Coalesce` (`None`: it never merges).
    merges: Option<Format>,
    /// The merged event, once this event absorbed a later one: encoded instead of `event`.
    merged: Option<Typed>,
}

/// An event read by its API's typed events, to merge.
#[derive(Debug, Clone)]
enum Typed {
    Chat(ChatEvent),
    Messages(MessagesEvent),
    Responses(ResponsesEvent),
}

impl Typed {
    /// `event` read as an event of `format` that may merge (a chat chunk; any Messages or
    /// Responses event, whose rules say which merge).
    fn of(format: Format, event: &SseEvent) -> Option<Typed> {
        match format {
            Format::Chat => ChatEvent::from_sse(event)
                .ok()
                .filter(|chat| matches!(chat.data(), ChatData::Chunk(_)))
                .map(Typed::Chat),
            Format::Messages => MessagesEvent::from_sse(event).ok().map(Typed::Messages),
            Format::Responses => ResponsesEvent::from_sse(event).ok().map(Typed::Responses),
            Format::Text => None,
        }
    }

    /// Merges `next` into this event; whether the API's rules let it (the caller keeps the
    /// unmerged event it came from).
    fn merge(&mut self, next: Typed) -> bool {
        match (self, next) {
            (Typed::Chat(mine), Typed::Chat(theirs)) => mine.merge(theirs).is_ok(),
            (Typed::Messages(mine), Typed::Messages(theirs)) => mine.merge(theirs).is_ok(),
            (Typed::Responses(mine), Typed::Responses(theirs)) => mine.merge(theirs).is_ok(),
            _ => false,
        }
    }

    fn byte_len(&self) -> usize {
        match self {
            Typed::Chat(event) => event.byte_len(),
            Typed::Messages(event) => event.byte_len(),
            Typed::Responses(event) => event.byte_len(),
        }
    }
}

impl From<Typed> for SseEvent {
    fn from(typed: Typed) -> SseEvent {
        match typed {
            Typed::Chat(event) => event.into(),
            Typed::Messages(event) => event.into(),
            Typed::Responses(event) => event.into(),
        }
    }
}

impl Relayed {
    /// An event that never merges (one the proxy made, an end, a text completion's chunk).
    pub(super) fn new(event: SseEvent) -> Self {
        Relayed::merging(event, None)
    }

    /// This event, counted for progress as `kind` (what its API's type says: an Anthropic
    /// `ping` is control, though its SSE frame carries no mark).
    pub(super) fn counted_as(mut self, kind: Kind) -> Self {
        self.kind = kind;
        self
    }

    /// An event as the upstream sent it, which may merge by the rules of `merges`.
    pub(super) fn merging(event: SseEvent, merges: Option<Format>) -> Self {
        Relayed {
            kind: event.kind(),
            event,
            merges,
            merged: None,
        }
    }
}

impl Chunk for Relayed {
    fn byte_len(&self) -> usize {
        match &self.merged {
            Some(merged) => merged.byte_len(),
            None => self.event.byte_len(),
        }
    }

    /// The upstream event's kind (its `:hidden`/`:control` mark, or `[DONE]` and errors as
    /// control); the JSON is not read for it.
    fn kind(&self) -> Kind {
        self.kind
    }

    fn merge(&mut self, next: Self) -> Result<(), Self> {
        let Some(format) = self.merges.filter(|format| next.merges == Some(*format)) else {
            return Err(next);
        };
        let Some(theirs) = Typed::of(format, &next.event) else {
            return Err(next);
        };
        let merged_before = self.merged.is_some();
        let mut mine = match self.merged.take() {
            Some(merged) => merged,
            None => match Typed::of(format, &self.event) {
                Some(typed) => typed,
                None => {
                    // Not one that merges: it never will be.
                    self.merges = None;
                    return Err(next);
                }
            },
        };
        if mine.merge(theirs) {
            self.merged = Some(mine);
            if self.kind != next.kind {
                self.kind = Kind::Visible;
            }
            return Ok(());
        }
        if merged_before {
            self.merged = Some(mine);
        }
        Err(next)
    }
}

impl From<Relayed> for SseEvent {
    fn from(relayed: Relayed) -> SseEvent {
        match relayed.merged {
            Some(merged) => merged.into(),
            None => relayed.event,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(content: &str, id: u64) -> Relayed {
        let json = format!(
            r#"{{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{{"index":0,"delta":{{"content":"{content}"}},"finish_reason":null}}]}}"#
        );
        Relayed::merging(
            SseEvent::data(json).with_id(id.to_string()).unwrap(),
            Some(Format::Chat),
        )
    }

    #[test]
    fn chat_chunks_merge_and_keep_the_later_id() {
        let mut a = chunk("Hel", 0);
        a.merge(chunk("lo", 1)).unwrap();
        a.merge(chunk(" you", 2)).unwrap();
        let sse = SseEvent::from(a);
        assert_eq!(sse.id(), Some("2"));
        assert!(sse.data_str().unwrap().contains(r#""content":"Hello you""#));
    }

    #[test]
    fn an_unmerged_event_passes_byte_for_byte() {
        let raw = r#"{"object":"chat.completion.chunk",  "odd":1}"#;
        let event = SseEvent::data(raw).with_id("4").unwrap();
        let relayed = Relayed::merging(event.clone(), Some(Format::Chat));
        assert_eq!(SseEvent::from(relayed), event);
    }

    #[test]
    fn done_errors_and_unmergeable_streams_never_merge() {
        let mut a = chunk("a", 0);
        assert!(
            a.merge(Relayed::merging(
                SseEvent::data("[DONE]"),
                Some(Format::Chat)
            ))
            .is_err()
        );
        let mut b = chunk("a", 0);
        b.merges = None;
        assert!(b.merge(chunk("b", 1)).is_err());
        let mut text = Relayed::merging(
            SseEvent::data(r#"{"object":"text_completion"}"#),
            Some(Format::Chat),
        );
        assert!(text.merge(chunk("b", 1)).is_err());
        assert!(text.merges.is_none());
        // A failed merge after a successful one keeps what was merged.
        let mut c = chunk("x", 0);
        c.merge(chunk("y", 1)).unwrap();
        assert!(
            c.merge(Relayed::merging(
                SseEvent::data("[DONE]"),
                Some(Format::Chat)
            ))
            .is_err()
        );
        let finish = r#"{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#;
        assert!(
            c.merge(Relayed::merging(SseEvent::data(finish), Some(Format::Chat)))
                .is_err()
        );
        assert!(
            SseEvent::from(c)
                .data_str()
                .unwrap()
                .contains(r#""content":"xy""#)
        );
    }
}
