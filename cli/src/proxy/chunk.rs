//! What the proxy gates: one upstream SSE event, passed on as it came unless a slow client
//! made it merge with the next.

use streamgate::openai::{ChatData, ChatEvent};
use streamgate::sse::SseEvent;
use streamgate::{Chunk, Kind};

/// One upstream event on its way to the client, with the proxy's event id.
///
/// It is sent on byte for byte (only its `id:` is the proxy's) unless `--policy coalesce` merges
/// it: chunks of a chat completion stream (`chat.completion.chunk`) then merge under the
/// crate's lossless OpenAI rules ([`ChatEvent`]'s `merge`: what an SDK accumulates from the
/// merged chunk equals what it accumulates from the parts), and the merged chunk is encoded
/// anew. Anything else (a `text_completion` chunk, `[DONE]`, an error, a document the rules
/// do not know) never merges. The JSON is parsed only when a merge is tried, that is only
/// when the client is behind.
#[derive(Debug, Clone)]
pub(super) struct Relayed {
    event: SseEvent,
    kind: Kind,
    /// Chunks of a chat completion stream, gated under `Coalesce`: may merge.
    mergeable: bool,
    /// The merged chunk, once this event absorbed a later one: encoded instead of `event`.
    merged: Option<ChatEvent>,
}

impl Relayed {
    /// An event as the upstream sent it (`mergeable`: a chat completion chunk that may merge).
    pub(super) fn new(event: SseEvent, mergeable: bool) -> Self {
        Relayed {
            kind: event.kind(),
            event,
            mergeable,
            merged: None,
        }
    }

    /// The event's chunk, parsed, if it is a chat completion chunk.
    fn chat(event: &SseEvent) -> Option<ChatEvent> {
        ChatEvent::from_sse(event)
            .ok()
            .filter(|chat| matches!(chat.data(), ChatData::Chunk(_)))
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
        if !(self.mergeable && next.mergeable) {
            return Err(next);
        }
        let Some(theirs) = Relayed::chat(&next.event) else {
            return Err(next);
        };
        let merged_before = self.merged.is_some();
        let mut mine = match self.merged.take() {
            Some(merged) => merged,
            None => match Relayed::chat(&self.event) {
                Some(chat) => chat,
                None => {
                    // Not a chunk: it never will be.
                    self.mergeable = false;
                    return Err(next);
                }
            },
        };
        match mine.merge(theirs) {
            Ok(()) => {
                self.merged = Some(mine);
                if self.kind != next.kind {
                    self.kind = Kind::Visible;
                }
                Ok(())
            }
            Err(_) => {
                if merged_before {
                    self.merged = Some(mine);
                }
                Err(next)
            }
        }
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
        Relayed::new(SseEvent::data(json).with_id(id.to_string()).unwrap(), true)
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
        let relayed = Relayed::new(event.clone(), true);
        assert_eq!(SseEvent::from(relayed), event);
    }

    #[test]
    fn done_errors_and_unmergeable_streams_never_merge() {
        let mut a = chunk("a", 0);
        assert!(
            a.merge(Relayed::new(SseEvent::data("[DONE]"), true))
                .is_err()
        );
        let mut b = chunk("a", 0);
        b.mergeable = false;
        assert!(b.merge(chunk("b", 1)).is_err());
        let mut text = Relayed::new(SseEvent::data(r#"{"object":"text_completion"}"#), true);
        assert!(text.merge(chunk("b", 1)).is_err());
        assert!(!text.mergeable);
        // A failed merge after a successful one keeps what was merged.
        let mut c = chunk("x", 0);
        c.merge(chunk("y", 1)).unwrap();
        assert!(
            c.merge(Relayed::new(SseEvent::data("[DONE]"), true))
                .is_err()
        );
        let finish = r#"{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#;
        assert!(c.merge(Relayed::new(SseEvent::data(finish), true)).is_err());
        assert!(
            SseEvent::from(c)
                .data_str()
                .unwrap()
                .contains(r#""content":"xy""#)
        );
    }
}
