//! What the worker hands the gate, and its SSE encoding in the stream's format: a chat chunk's
//! JSON written by the stream's `openai::ChunkTemplate` straight into the buffer the event's
//! frame is made in; a Messages or Responses event by its module.

use std::io;
use std::sync::Arc;

use streamgate::openai::{ApiError, ChunkTemplate};
use streamgate::sse::SseEvent;
use streamgate::{Chunk, Kind};

use super::format::{Ending, Format};
use super::messages::{self, MessagesFrame};
use super::meta::Meta;
use super::responses::{self, ResponsesFrame};
use super::text::Text;

/// What the worker hands the gate: a run of text (merged under `Coalesce`), one of the events
/// the stream's format puts around it, or the error of a failed generation. Each knows its
/// event id (`id`), which a Responses event carries as its `sequence_number`.
#[derive(Debug, Clone)]
pub enum Delta {
    /// A run of the answer's text (`first`: it begins the answer, so a chat chunk names its
    /// author); `id` is its last event id.
    Text {
        meta: Arc<Meta>,
        text: Text,
        first: bool,
        id: u64,
    },
    /// An event before the first token or after the last.
    Frame {
        meta: Arc<Meta>,
        frame: Frame,
        id: u64,
    },
    /// The generation failed: an error event in the format's shape (a chat stream's
    /// `data: {"error":{..}}`, which the OpenAI SDKs raise as an API error; a Messages
    /// `event: error`; a Responses `error` event), before the gate's terminal frame.
    Error {
        meta: Arc<Meta>,
        message: String,
        code: &'static str,
        id: u64,
    },
}

/// The events a format puts around a stream's tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A chat stream's final chunk, with its `finish_reason`.
    Finish(Ending),
    /// A chat stream's `data: [DONE]`.
    Done,
    Messages(MessagesFrame),
    Responses(ResponsesFrame),
}

impl Frame {
    /// The events of a `format` stream before its first token.
    pub fn opening(format: Format) -> Vec<Frame> {
        match format {
            Format::Chat => Vec::new(),
            Format::Messages => MessagesFrame::opening().map(Frame::Messages).into(),
            Format::Responses => ResponsesFrame::opening().map(Frame::Responses).into(),
        }
    }

    /// The events of a `format` stream after its last token, reporting `ending`.
    pub fn closing(format: Format, ending: &Ending) -> Vec<Frame> {
        match format {
            Format::Chat => vec![Frame::Finish(ending.clone()), Frame::Done],
            Format::Messages => MessagesFrame::closing(ending).map(Frame::Messages).into(),
            Format::Responses => ResponsesFrame::closing(ending).map(Frame::Responses).into(),
        }
    }

    /// What an event after the last token reports (none for one before the first, or a chat
    /// stream's `[DONE]`).
    pub fn ending(&self) -> Option<&Ending> {
        match self {
            Frame::Finish(ending)
            | Frame::Messages(MessagesFrame::Delta(ending))
            | Frame::Responses(ResponsesFrame::Completed(ending)) => Some(ending),
            _ => None,
        }
    }
}

impl Delta {
    /// The error object of a failed chat generation (`server_error`, with its `code`).
    pub(super) fn api_error(message: String, code: &'static str) -> ApiError {
        ApiError::new(message, "server_error").with_code(code)
    }
}

impl Chunk for Delta {
    /// What the event will hold once encoded: the text, and the stream's metadata that every
    /// event repeats (a long `model` name is paid for per event, so the byte bound counts it);
    /// a Responses stream's last events repeat the whole text.
    fn byte_len(&self) -> usize {
        match self {
            Delta::Text { meta, text, .. } => meta.chunk_overhead() + text.len(),
            Delta::Frame {
                frame: Frame::Done, ..
            } => "[DONE]".len(),
            Delta::Frame {
                meta,
                frame: Frame::Responses(frame),
                ..
            } => meta.chunk_overhead() + frame.text_len(),
            Delta::Frame { meta, .. } => meta.chunk_overhead(),
            Delta::Error { message, code, .. } => 64 + message.len() + code.len(),
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Delta::Text { .. } => Kind::Visible,
            Delta::Frame { .. } | Delta::Error { .. } => Kind::Control,
        }
    }

    /// Runs of text join before they are encoded: lossless for the client (the run keeps the
    /// later event id).
    fn merge(&mut self, next: Self) -> Result<(), Self> {
        match (self, next) {
            (
                Delta::Text { text, id, .. },
                Delta::Text {
                    meta,
                    text: more,
                    first,
                    id: last,
                },
            ) => match text.merge(more) {
                Ok(()) => {
                    *id = last;
                    Ok(())
                }
                Err(more) => Err(Delta::Text {
                    meta,
                    text: more,
                    first,
                    id: last,
                }),
            },
            (_, next) => Err(next),
        }
    }
}

impl From<Delta> for SseEvent {
    /// The event in the stream's format. A chat chunk's JSON is written by the stream's
    /// template straight into the buffer the frame is made in (with room for the SSE fields
    /// around it): one allocation per event.
    fn from(delta: Delta) -> SseEvent {
        match delta {
            Delta::Text {
                meta,
                text,
                first,
                id,
            } => match meta.format {
                Format::Chat => {
                    // A new answer's first chunk names the author (a continuation's author was
                    // named).
                    let role = (first && !meta.continued).then_some("assistant");
                    encoded(&meta, text.len(), |json, chunk| {
                        chunk.write_content(json, role, &text)
                    })
                }
                Format::Messages => messages::text(&text),
                Format::Responses => responses::text(&meta, &text, id),
            },
            Delta::Frame { meta, frame, id } => match frame {
                Frame::Finish(ending) => encoded(&meta, 0, |json, chunk| {
                    chunk.write_finish(json, ending.reason.as_str())
                }),
                Frame::Done => SseEvent::data("[DONE]"),
                Frame::Messages(frame) => frame.event(&meta),
                Frame::Responses(frame) => frame.event(&meta, id),
            },
            Delta::Error {
                meta,
                message,
                code,
                id,
            } => match meta.format {
                Format::Chat => SseEvent::data(Delta::api_error(message, code).to_json()),
                Format::Messages => messages::error(&message),
                Format::Responses => responses::error(&message, code, id),
            },
        }
    }
}

/// Room for the SSE fields around a chunk's JSON (`id: N`, `data: `, the blank line) besides
/// what [`Meta::chunk_overhead`] counts.
const FRAME_ROOM: usize = 64;

/// The event whose data `write` writes with `meta`'s template, into a buffer with room for
/// `text_len` bytes of text besides the chunk's metadata and the frame's fields.
fn encoded(
    meta: &Meta,
    text_len: usize,
    write: impl FnOnce(&mut Vec<u8>, ChunkTemplate<'_>) -> io::Result<()>,
) -> SseEvent {
    let mut json = Vec::with_capacity(FRAME_ROOM + meta.chunk_overhead() + text_len);
    write(&mut json, meta.template()).expect("a chunk writes into a Vec");
    SseEvent::data(String::from_utf8(json).expect("serde_json writes UTF-8"))
}

#[cfg(test)]
mod tests {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    use streamgate::openai::{ChatCompletionChunk, ChunkChoice, Delta as OpenAiDelta};

    use super::super::format::FinishReason;
    use super::*;

    /// Counts the allocations (reallocations included) of the thread whose `COUNTING` is set.
    struct Counting;

    thread_local! {
        static COUNTING: Cell<bool> = const { Cell::new(false) };
        static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    }

    fn counted() {
        let _ = COUNTING.try_with(|counting| {
            if counting.get() {
                let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
            }
        });
    }

    // SAFETY: every call is passed on to the system allocator unchanged.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            counted();
            // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
            unsafe { System.alloc(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` came from `alloc` with this layout.
            unsafe { System.dealloc(ptr, layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            counted();
            // SAFETY: as for `GlobalAlloc::realloc`.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    fn meta() -> Arc<Meta> {
        Arc::new(Meta {
            format: Format::Chat,
            id: "chatcmpl-123456".into(),
            model: "streamgate-sim".into(),
            created: 1_700_000_000,
            stream: "chatcmpl-123456".into(),
            continued: false,
        })
    }

    fn text(meta: &Arc<Meta>, tokens: std::ops::Range<u64>, salt: Option<u64>) -> Delta {
        Delta::Text {
            meta: meta.clone(),
            first: tokens.start == 0,
            id: tokens.end - 1,
            text: Text::numbered(tokens, salt),
        }
    }

    /// The final chunk of tokens 0..5 of `meta`'s stream.
    fn final_chunk(meta: &Arc<Meta>, reason: FinishReason) -> Delta {
        Delta::Frame {
            meta: meta.clone(),
            frame: Frame::Finish(Ending {
                text: Text::numbered(0..5, None),
                prompt: 0,
                reason,
            }),
            id: 5,
        }
    }

    /// One allocation per event, as before the chunks came from the openai module (measured
    /// then with this test: 1 allocation, no reallocation, for each of these events).
    #[test]
    fn an_event_is_encoded_in_one_allocation() {
        let meta = meta();
        let salt = Some(u64::MAX);
        let events = [
            text(&meta, 0..1, salt),
            text(&meta, 12_345..12_346, salt),
            text(&meta, 100..151, salt),
            final_chunk(&meta, FinishReason::Length),
        ];
        for delta in events {
            let shown = format!("{delta:?}");
            ALLOCATIONS.with(|n| n.set(0));
            COUNTING.with(|counting| counting.set(true));
            let event = SseEvent::from(delta);
            COUNTING.with(|counting| counting.set(false));
            assert_eq!(ALLOCATIONS.with(Cell::get), 1, "{shown}");
            drop(event);
        }
    }

    #[test]
    fn events_are_the_openai_chunks_of_the_stream() {
        let meta = meta();
        let stream = ChatCompletionChunk::new("chatcmpl-123456", 1_700_000_000, "streamgate-sim");
        let content = |role: Option<&str>, text: &str| {
            stream.clone().with_choice(ChunkChoice::new(
                0,
                OpenAiDelta {
                    role: role.map(str::to_owned),
                    content: Some(text.to_owned()),
                    ..OpenAiDelta::default()
                },
            ))
        };
        let data = |delta: Delta| SseEvent::from(delta).data_str().unwrap().to_owned();
        assert_eq!(
            data(text(&meta, 0..1, None)),
            content(Some("assistant"), "t0 ").to_json()
        );
        assert_eq!(
            data(text(&meta, 3..6, None)),
            content(None, "t3 t4 t5 ").to_json()
        );
        let finish = ChunkChoice {
            finish_reason: Some("stop".into()),
            ..ChunkChoice::new(0, OpenAiDelta::default())
        };
        let finished = final_chunk(&meta, FinishReason::Stop);
        assert_eq!(data(finished), stream.with_choice(finish).to_json());
        let error = Delta::Error {
            meta: meta.clone(),
            message: "KV cache full".into(),
            code: "kv_cache_exhausted",
            id: 6,
        };
        assert_eq!(
            data(error),
            r#"{"error":{"message":"KV cache full","type":"server_error","code":"kv_cache_exhausted"}}"#
        );
        let done = Delta::Frame {
            meta,
            frame: Frame::Done,
            id: 7,
        };
        assert_eq!(data(done), "[DONE]");
    }
}
