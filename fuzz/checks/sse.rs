//! The properties the SSE fuzz targets check, shared with `tests/fuzz_corpus.rs` so that every
//! corpus entry also runs under plain `cargo test`.

// Each includer (a fuzz target, a test file) uses a part.
#![allow(dead_code)]

use std::convert::Infallible;
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use eventsource_stream::EventStream;
use futures_util::StreamExt;
use streamgate::sse::{DecodeError, SseDecoder, SseEvent};
use tokio_util::codec::Decoder;

/// The line limit `sse_decode` decodes with: small, so that short inputs reach it.
pub const MAX_LINE: usize = 64;
/// The event (data) limit `sse_decode` decodes with.
pub const MAX_EVENT: usize = 256;

/// The limits a decoder is built with.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `SseDecoder::max_line`.
    pub line: usize,
    /// `SseDecoder::max_event`.
    pub event: usize,
}

/// The limits of `sse_decode`.
pub const FUZZ_LIMITS: Limits = Limits {
    line: MAX_LINE,
    event: MAX_EVENT,
};

/// What a decoder yields: events (and retries), or an error's text.
pub type Item = Result<SseEvent, String>;

/// Decodes `input` with the fuzz limits, fed in pieces ending at `cuts` (sorted offsets).
pub fn decode_in_pieces(input: &[u8], cuts: &[usize]) -> Vec<Item> {
    decode_with(FUZZ_LIMITS, input, cuts)
}

/// Decodes `input` fed in pieces ending at `cuts` (sorted offsets), checking after every call
/// that what the decoder stores stays within `limits`, and that every event it yields does.
pub fn decode_with(limits: Limits, input: &[u8], cuts: &[usize]) -> Vec<Item> {
    let mut decoder = SseDecoder::new()
        .max_line(limits.line)
        .max_event(limits.event);
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
                buffer.len() <= limits.line + piece.len(),
                "the decoder holds {} bytes",
                buffer.len()
            );
            assert!(decoder.buffered_data() <= limits.event);
            assert!(decoder.last_event_id().map_or(0, str::len) <= limits.line);
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
    for event in items.iter().flatten() {
        assert!(event.data_str().map_or(0, str::len) <= limits.event);
        assert!(event.event().map_or(0, str::len) <= limits.line);
        assert!(event.id().map_or(0, str::len) <= limits.line);
    }
    items
}

/// `sse_decode`: arbitrary bytes, split at points the input itself chooses, decode without
/// panicking, within the limits, to the same items as a one-shot decode; and where
/// `eventsource-stream` defines the result too, to the same events as it.
pub fn check_decode(data: &[u8]) {
    let Some((&seed, input)) = data.split_first() else {
        return;
    };
    check_differential(&String::from_utf8_lossy(input));
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

/// What a `sse_decode` input makes the decoder meet, by name: each limit broken, each limit met
/// exactly (a limit one lower breaks it once more), and a limit broken only because each
/// invalid UTF-8 sequence is stored as the 3 bytes of U+FFFD (replacing each by one `?`
/// breaks it fewer times). The corpus as a whole must meet every one of them.
pub fn reach(data: &[u8]) -> [(&'static str, bool); 5] {
    let input = data.split_first().map_or(&[][..], |(_, input)| input);
    let errors = |limits: Limits, input: &[u8], error: fn(Limits) -> DecodeError| {
        let error = Err(error(limits).to_string());
        let items = decode_with(limits, input, &[]);
        items.iter().filter(|&item| *item == error).count()
    };
    let line = |limits: Limits| DecodeError::LineTooLong { limit: limits.line };
    let event = |limits: Limits| DecodeError::EventTooLarge {
        limit: limits.event,
    };
    let both = |input: &[u8]| errors(FUZZ_LIMITS, input, line) + errors(FUZZ_LIMITS, input, event);
    let lower_line = Limits {
        line: MAX_LINE - 1,
        ..FUZZ_LIMITS
    };
    let lower_event = Limits {
        event: MAX_EVENT - 1,
        ..FUZZ_LIMITS
    };
    let mut replaced = Vec::new();
    for chunk in input.utf8_chunks() {
        replaced.extend_from_slice(chunk.valid().as_bytes());
        if !chunk.invalid().is_empty() {
            replaced.push(b'?');
        }
    }
    [
        ("line too long", errors(FUZZ_LIMITS, input, line) > 0),
        ("event too large", errors(FUZZ_LIMITS, input, event) > 0),
        (
            "line at the limit",
            errors(lower_line, input, line) > errors(FUZZ_LIMITS, input, line),
        ),
        (
            "data at the limit",
            errors(lower_event, input, event) > errors(FUZZ_LIMITS, input, event),
        ),
        ("past a limit by U+FFFD", both(input) > both(&replaced)),
    ]
}

/// Decodes `text` with `eventsource-stream` as well and checks that both yield the same
/// events: type, data, last event id, and the reconnection time where it reports one. (Text,
/// because it fails on invalid UTF-8; ours decodes bytes as their lossy text, so comparing on
/// that text loses nothing.) Returns whether the text was compared: it is not where the two
/// define the result differently, each time `eventsource-stream` departing from the WHATWG
/// rules that ours follows:
///
/// - a `retry` value with a leading `+`: it parses with `u64::from_str`, which takes a sign,
///   where the rules take only ASCII digits;
/// - a BOM after the skipped one (see below): it would skip that one too.
///
/// Other differences are evened out in its input: it panics on a leading BOM (it slices one
/// byte off the three), so it gets the text without the one both skip; it waits after a final
/// CR for an LF that cannot come, losing the line the CR ends, so it gets CRLF instead. It
/// reports a retry only on the next event of the same block, ours each as an item: where it
/// reports one, ours must have yielded the same as its last retry before that event.
pub fn check_differential(text: &str) -> bool {
    let mut theirs = text.strip_prefix('\u{FEFF}').unwrap_or(text).to_owned();
    let signed_retry = text.contains("retry:+") || text.contains("retry: +");
    if signed_retry || theirs.starts_with('\u{FEFF}') {
        return false;
    }
    if theirs.ends_with('\r') {
        theirs.push('\n');
    }
    let mut stream = EventStream::new(futures_util::stream::iter([Ok::<_, Infallible>(theirs)]));
    let mut cx = Context::from_waker(Waker::noop());
    let mut theirs = Vec::new();
    // A stream of one ready chunk never pends.
    while let Poll::Ready(Some(event)) = stream.poll_next_unpin(&mut cx) {
        let event = event.expect("valid UTF-8 parses");
        let retry = event.retry.map(|retry| retry.as_millis() as u64);
        theirs.push((event.event, event.data, event.id, retry));
    }
    // Text is stored as it is: these limits cannot be reached.
    let limits = Limits {
        line: text.len(),
        event: text.len(),
    };
    let mut retry = None;
    let mut ours = Vec::new();
    for item in decode_with(limits, text.as_bytes(), &[]) {
        let event = item.expect("within the limits");
        match event.data_str() {
            None => retry = event.retry_ms(),
            Some(data) => ours.push((
                event.event_type().to_owned(),
                data.to_owned(),
                event.id().unwrap_or_default().to_owned(),
                retry.take(),
            )),
        }
    }
    for (ours, theirs) in ours.iter_mut().zip(&theirs) {
        if theirs.3.is_none() {
            ours.3 = None;
        }
    }
    assert_eq!(ours, theirs, "eventsource-stream on {text:?}");
    true
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
    // Limits no event these inputs make can reach (the text is valid UTF-8, stored as it is):
    // only framing is under test.
    let limits = Limits {
        line: encoded.len(),
        event: encoded.len(),
    };
    let step = usize::from(data.first().copied().unwrap_or(0) % 7) + 1;
    let cuts: Vec<usize> = (step..encoded.len()).step_by(step).collect();
    assert_eq!(
        decode_with(limits, &encoded, &cuts),
        expected,
        "encoded: {:?}",
        String::from_utf8_lossy(&encoded)
    );
    check_differential(&String::from_utf8_lossy(&encoded));
}
