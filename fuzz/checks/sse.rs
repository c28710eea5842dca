//! The properties the SSE fuzz targets check, shared with `tests/fuzz_corpus.rs` so that every
//! corpus entry also runs under plain `cargo test`.

// Each includer (a fuzz target, a test file) uses a part.
#![allow(dead_code)]

use bytes::BytesMut;
use streamgate::sse::{SseDecoder, SseEvent};
use tokio_util::codec::Decoder;

/// Small limits, so that inputs of a few KiB reach them.
const MAX_LINE: usize = 200;
const MAX_EVENT: usize = 1000;

/// What a decoder yields: events (and retries), or an error's text.
pub type Item = Result<SseEvent, String>;

/// Decodes `input` fed in pieces ending at `cuts` (sorted offsets), checking after every call
/// that memory stays bounded.
pub fn decode_in_pieces(input: &[u8], cuts: &[usize]) -> Vec<Item> {
    let mut decoder = SseDecoder::new().max_line(MAX_LINE).max_event(MAX_EVENT);
    let mut buffer = BytesMut::new();
    let mut items = Vec::new();
    let mut start = 0;
    for &end in cuts.iter().chain([input.len()].iter()) {
        let end = end.clamp(start, input.len());
        let piece = &input[start..end];
        buffer.extend_from_slice(piece);
        start = end;
        loop {
            let item = decoder.decode(&mut buffer);
            // At most one partial line within the limit, and what is left of the last piece.
            assert!(
                buffer.len() <= MAX_LINE + piece.len(),
                "the decoder holds {} bytes",
                buffer.len()
            );
            assert!(decoder.buffered_data() <= MAX_EVENT);
            match item {
                Ok(Some(event)) => items.push(Ok(event)),
                Ok(None) => break,
                Err(error) => items.push(Err(error.to_string())),
            }
        }
    }
    loop {
        match decoder.decode_eof(&mut buffer) {
            Ok(Some(event)) => items.push(Ok(event)),
            Ok(None) => break,
            Err(error) => items.push(Err(error.to_string())),
        }
    }
    assert!(buffer.is_empty(), "everything is consumed at the end");
    items
}

/// `sse_decode`: arbitrary bytes, split at points the input itself chooses, decode without
/// panicking, within bounded memory, to the same items as a one-shot decode.
pub fn check_decode(data: &[u8]) {
    let Some((&seed, input)) = data.split_first() else {
        return;
    };
    let whole = decode_in_pieces(input, &[]);
    // Split every `step` bytes, and byte by byte.
    let step = usize::from(seed % 17) + 1;
    let cuts: Vec<usize> = (step..input.len()).step_by(step).collect();
    assert_eq!(
        decode_in_pieces(input, &cuts),
        whole,
        "split every {step} bytes"
    );
    let bytewise: Vec<usize> = (1..input.len()).collect();
    assert_eq!(
        decode_in_pieces(input, &bytewise),
        whole,
        "split at every byte"
    );
}

/// Builds events from arbitrary bytes: the input is cut at each 0xFF into fields, each chosen
/// by its first byte, their text taken as lossy UTF-8.
pub fn events_from(data: &[u8]) -> Vec<SseEvent> {
    let mut events = Vec::new();
    let mut event: Option<SseEvent> = None;
    for field in data.split(|&b| b == 0xFF) {
        let Some((&op, rest)) = field.split_first() else {
            continue;
        };
        let text = String::from_utf8_lossy(rest).into_owned();
        let current = event.take();
        event = Some(match (op % 6, current) {
            (0, current) => {
                events.extend(current);
                SseEvent::data(text)
            }
            (1, Some(e)) => e.clone().with_event(text).unwrap_or(e),
            (2, Some(e)) => e.clone().with_id(text).unwrap_or(e),
            (3, Some(e)) => e.with_retry(std::time::Duration::from_millis(
                rest.iter().map(|&b| u64::from(b)).sum(),
            )),
            (4, Some(e)) => e.with_comment(text),
            (_, None) => SseEvent::data(text),
            (_, current) => {
                events.extend(current);
                SseEvent::comment(text)
            }
        });
    }
    events.extend(event);
    events
}

/// What a WHATWG client makes of `events`: each retry, then each event with data, its line
/// breaks as LF, its type, and the last id set so far.
pub fn as_received(events: &[SseEvent]) -> Vec<Item> {
    let mut received = Vec::new();
    let mut last_id: Option<String> = None;
    for event in events {
        if let Some(id) = event.id() {
            last_id = Some(id.to_owned());
        }
        if let Some(ms) = event.retry_ms() {
            received.push(Ok(SseEvent::retry(std::time::Duration::from_millis(ms))));
        }
        let Some(data) = event.data_str() else {
            continue;
        };
        let mut expected = SseEvent::data(data.replace("\r\n", "\n").replace('\r', "\n"));
        if let Some(event_type) = event.event().filter(|t| !t.is_empty()) {
            expected = expected.with_event(event_type).unwrap();
        }
        if let Some(id) = &last_id {
            expected = expected.with_id(id.clone()).unwrap();
        }
        received.push(Ok(expected));
    }
    received
}

/// `sse_roundtrip`: arbitrary events, encoded and decoded (whole and in pieces), are what a
/// WHATWG client receives from them.
pub fn check_roundtrip(data: &[u8]) {
    let events = events_from(data);
    let mut encoded = Vec::new();
    for event in &events {
        encoded.extend_from_slice(&event.encode());
    }
    let expected = as_received(&events);
    // Limits large enough for any event these inputs make: only framing is under test.
    let mut decoder = SseDecoder::new()
        .max_line(encoded.len() + 1)
        .max_event(encoded.len() + 1);
    let mut buffer = BytesMut::new();
    let mut decoded = Vec::new();
    for piece in encoded.chunks(usize::from(data.first().copied().unwrap_or(0) % 7) + 1) {
        buffer.extend_from_slice(piece);
        while let Some(event) = decoder.decode(&mut buffer).expect("within limits") {
            decoded.push(Ok(event));
        }
    }
    while let Some(event) = decoder.decode_eof(&mut buffer).expect("within limits") {
        decoded.push(Ok(event));
    }
    assert_eq!(
        decoded,
        expected,
        "encoded: {:?}",
        String::from_utf8_lossy(&encoded)
    );
}
