//! The WHATWG "parsing an event stream" rules, each case fed whole, split at every byte offset,
//! and one byte at a time.

#[path = "../fuzz/checks/sse.rs"]
mod checks;

use std::time::Duration;

use checks::{Item, MAX_EVENT, MAX_LINE, decode_in_pieces};
use streamgate::sse::SseEvent;

fn event(data: &str) -> Item {
    Ok(SseEvent::data(data))
}

fn typed(event_type: &str, data: &str) -> Item {
    Ok(SseEvent::data(data).with_event(event_type).unwrap())
}

fn with_id(data: &str, id: &str) -> Item {
    Ok(SseEvent::data(data).with_id(id).unwrap())
}

fn retry(ms: u64) -> Item {
    Ok(SseEvent::retry(Duration::from_millis(ms)))
}

/// Decodes `input` whole, at every two-piece split, and byte by byte: all must give `expected`.
fn check(input: &[u8], expected: &[Item]) {
    assert_eq!(decode_in_pieces(input, &[]), expected, "whole: {input:?}");
    for cut in 1..input.len() {
        assert_eq!(
            decode_in_pieces(input, &[cut]),
            expected,
            "split at {cut}: {input:?}"
        );
    }
    let bytewise: Vec<usize> = (1..input.len()).collect();
    assert_eq!(
        decode_in_pieces(input, &bytewise),
        expected,
        "bytewise: {input:?}"
    );
}

#[test]
fn a_plain_event() {
    check(b"data: hello\n\n", &[event("hello")]);
}

#[test]
fn one_leading_bom_is_skipped() {
    check(b"\xEF\xBB\xBFdata: a\n\n", &[event("a")]);
    // A second BOM belongs to the first field's name, which is then unknown.
    check(
        b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\ndata: b\n\n",
        &[event("b")],
    );
    // A BOM later in the stream is text.
    check(b"data: \xEF\xBB\xBFa\n\n", &[event("\u{FEFF}a")]);
}

#[test]
fn cr_lf_and_crlf_end_lines() {
    check(b"data: a\rdata: b\r\ndata: c\n\r\n", &[event("a\nb\nc")]);
    check(b"data: a\r\rdata: b\r\n\r\n", &[event("a"), event("b")]);
    check(b"data: a\n\r\n\rdata: b\r\r", &[event("a"), event("b")]);
}

#[test]
fn a_line_end_is_found_at_any_offset_of_a_long_line() {
    // The decoder looks for line ends eight bytes at a time: one at each offset of the words
    // (a pad of 0 to 7 bytes moves it through all eight) and of the tail, with bytes on either
    // side that differ from CR and LF by one bit; whole, and split at every point.
    for pad in 0..8 {
        for len in 0..24 {
            for end in ["\n", "\r", "\r\n"] {
                let value: String = "\x0b\x0c\x0e\u{8d}\u{8a}x"
                    .chars()
                    .cycle()
                    .take(len)
                    .collect();
                let value = format!("{}{value}", "x".repeat(pad));
                let input = format!("data:{value}{end}{end}");
                check(input.as_bytes(), &[event(&value)]);
            }
        }
    }
}

#[test]
fn a_field_without_colon_has_an_empty_value() {
    check(b"data\n\n", &[event("")]);
    check(b"data\ndata\n\n", &[event("\n")]);
    check(b"event\ndata: x\n\n", &[event("x")]);
}

#[test]
fn one_leading_space_is_stripped() {
    check(b"data:  two\n\n", &[event(" two")]);
    check(b"data:none\n\n", &[event("none")]);
    check(b"data: \n\n", &[event("")]);
}

#[test]
fn ids_persist_and_ids_with_nul_are_ignored() {
    check(
        b"id: 1\ndata: a\n\nid: 2\x00x\ndata: b\n\ndata: c\n\n",
        &[with_id("a", "1"), with_id("b", "1"), with_id("c", "1")],
    );
    check(b"id: 5\n\nid\ndata: a\n\n", &[with_id("a", "")]);
}

#[test]
fn retry_only_as_ascii_digits() {
    check(b"retry: 1000\n\n", &[retry(1000)]);
    check(b"retry:7\ndata: x\n\n", &[retry(7), event("x")]);
    for bad in [
        &b"retry: 10a\n\n"[..],
        b"retry: \n\n",
        b"retry: -1\n\n",
        b"retry: 1.5\n\n",
        b"retry:  1\n\n",
        b"retry: 99999999999999999999999\n\n",
    ] {
        check(bad, &[]);
    }
}

#[test]
fn the_type_resets_after_each_dispatch() {
    check(
        b"event: x\ndata: a\n\ndata: b\n\n",
        &[typed("x", "a"), event("b")],
    );
    // A type with no data is dropped at the blank line.
    check(b"event: x\n\ndata: y\n\n", &[event("y")]);
    check(b"event:\ndata: a\n\n", &[event("a")]);
}

#[test]
fn pending_data_is_discarded_at_the_end() {
    check(b"data: a\n\ndata: b", &[event("a")]);
    check(b"data: a\n\ndata: b\n", &[event("a")]);
    check(b"data: a\n\ndata: b\r", &[event("a")]);
}

#[test]
fn invalid_utf8_becomes_replacement_characters() {
    check(b"data: \xFF\xFEa\n\n", &[event("\u{FFFD}\u{FFFD}a")]);
    // A multi-byte character split across reads is not replaced.
    check("data: é€😀\n\n".as_bytes(), &[event("é€😀")]);
    check(b"data: \xE2\x82\n\n", &[event("\u{FFFD}")]);
}

#[test]
fn comments_and_unknown_fields_are_ignored() {
    check(b": hi\ndata: a\n:\nfoo: bar\n\n", &[event("a")]);
    check(b":\n\n", &[]);
}

fn line_too_long() -> Item {
    Err(format!("sse line longer than {MAX_LINE} bytes"))
}

fn event_too_large() -> Item {
    Err(format!("sse event data larger than {MAX_EVENT} bytes"))
}

/// `n` bytes of `x`.
fn xs(n: usize) -> Vec<u8> {
    vec![b'x'; n]
}

/// An event of one `data:` line per value (no space after the colon), then `data: b` as the
/// next event, which must survive whatever happened to the first.
fn event_then_b(values: &[Vec<u8>]) -> Vec<u8> {
    let mut input = Vec::new();
    for value in values {
        input.extend_from_slice(&[b"data:", value.as_slice(), b"\n"].concat());
    }
    input.extend_from_slice(b"\ndata: b\n\n");
    input
}

/// The data an event of `values` carries: each value as text, joined by LF.
fn joined(values: &[Vec<u8>]) -> String {
    let values: Vec<_> = values.iter().map(|v| String::from_utf8_lossy(v)).collect();
    values.join("\n")
}

#[test]
fn the_line_limit_is_exact_in_stored_text() {
    // `data:` and 59 bytes: 64, the limit (the checks module's `MAX_LINE`).
    for value in [
        xs(MAX_LINE - 5),
        // Each 0xFF is stored as U+FFFD, 3 bytes: 19 of them and 2 x.
        [&[0xFF; 19][..], &xs(2)].concat(),
        // Valid UTF-8 counts as it is.
        [&"é".repeat(29).into_bytes()[..], &xs(1)].concat(),
    ] {
        let values = [value];
        check(
            &event_then_b(&values),
            &[event(&joined(&values)), event("b")],
        );
        let longer = [[&values[0][..], b"x"].concat()];
        check(&event_then_b(&longer), &[line_too_long(), event("b")]);
    }
    // The limit bounds the type and the id, which are parts of a line; a broken id is not set.
    let typed_line = [b"event:".as_slice(), &[0xFF; 20][..], b"\ndata: a\n\n"].concat();
    check(&typed_line, &[line_too_long()]);
    let id_line = [
        b"id: 1\n\nid:".as_slice(),
        &[0xFF; 21][..],
        b"\n\ndata: a\n\n",
    ]
    .concat();
    check(&id_line, &[line_too_long(), with_id("a", "1")]);
}

#[test]
fn an_unfinished_line_breaks_the_limit_by_its_raw_bytes() {
    // Its text can only grow, so more raw bytes than the limit are an error at once, and the
    // rest of the line is skipped however long it goes on.
    let mut input = [b"data: a\n\ndata:".as_slice(), &xs(MAX_LINE)].concat();
    check(&input, &[event("a"), line_too_long()]);
    input.extend_from_slice(&[&xs(3 * MAX_LINE)[..], b"\n\ndata: b\n\n"].concat());
    check(&input, &[event("a"), line_too_long(), event("b")]);
    // One within the limit as raw bytes is discarded at the end, as any unfinished line.
    check(&[b"data:".as_slice(), &[0xFF; 20]].concat(), &[]);
}

#[test]
fn the_event_limit_is_exact_in_stored_text() {
    // Five values of 50 and one of 1, joined by five LF: 256, the limit (`MAX_EVENT`).
    let mut values = vec![xs(50); 5];
    values.push(xs(1));
    check(
        &event_then_b(&values),
        &[event(&joined(&values)), event("b")],
    );
    values[5].push(b'x');
    check(&event_then_b(&values), &[event_too_large(), event("b")]);
    // 16 0xFF store 48 bytes: five such values and one of 11, joined: 256 (96 raw bytes).
    let mut values = vec![vec![0xFF; 16]; 5];
    values.push(xs(11));
    check(
        &event_then_b(&values),
        &[event(&joined(&values)), event("b")],
    );
    values[5].push(b'x');
    check(&event_then_b(&values), &[event_too_large(), event("b")]);
    // Empty values count their LF only.
    let values = vec![Vec::new(); MAX_EVENT + 1];
    check(
        &event_then_b(&values),
        &[event(&joined(&values)), event("b")],
    );
    let values = vec![Vec::new(); MAX_EVENT + 2];
    check(&event_then_b(&values), &[event_too_large(), event("b")]);
}

#[test]
fn limits_count_the_text_stored_not_the_raw_bytes() {
    // Issue 9: with limits of 200 and 1000, each line was within the line limit as raw bytes,
    // but each 0xFF is stored as the 3 bytes of U+FFFD, so the data held grew past the event
    // limit (`the_event_limit_is_exact_in_stored_text` checks that case at the current limits).
    let line = [b"data:".as_slice(), &[0xFF; 195], b"\n"].concat();
    let input = [&[0x00][..], &line, &line, b"\n"].concat();
    assert_eq!(input.len(), 404);
    checks::check_decode(&input);
}

#[test]
fn a_line_of_a_megabyte_in_small_pieces_is_linear() {
    // Not a timing assertion, and no figure: a decoder that rescanned its pending line on every
    // read would scan ~8 GB here, the linear one scans the megabyte once. `benches/sse.rs`
    // measures the difference.
    let mut input = b"data: ".to_vec();
    input.extend(std::iter::repeat_n(b'z', 1 << 20));
    input.extend_from_slice(b"\n\n");
    let cuts: Vec<usize> = (64..input.len()).step_by(64).collect();
    let mut decoder = streamgate::sse::SseDecoder::new()
        .max_line(2 << 20)
        .max_event(2 << 20);
    let mut buffer = bytes::BytesMut::new();
    let mut events = 0;
    let mut start = 0;
    for end in cuts.into_iter().chain([input.len()]) {
        buffer.extend_from_slice(&input[start..end]);
        start = end;
        while let Some(event) =
            tokio_util::codec::Decoder::decode(&mut decoder, &mut buffer).unwrap()
        {
            assert_eq!(event.data_str().map(str::len), Some(1 << 20));
            events += 1;
        }
    }
    assert_eq!(events, 1);
}

#[test]
fn encode_then_decode_round_trips() {
    let mut seed = 0x243f_6a88_85a3_08d3_u64;
    for _ in 0..2000 {
        let input: Vec<u8> = (0..64)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // Mostly field separators, line breaks and letters.
                match seed % 10 {
                    0 => 0xFF,
                    1 => b'\r',
                    2 => b'\n',
                    3 => (seed >> 8) as u8 % 6,
                    _ => b'a' + (seed >> 16) as u8 % 26,
                }
            })
            .collect();
        checks::check_roundtrip(&input);
    }
}

#[test]
fn kinds_survive_an_encode_and_a_decode() {
    use streamgate::{Chunk, Kind};
    let cases = [
        (SseEvent::data("a"), Kind::Visible),
        (SseEvent::data("thinking").hidden(), Kind::Hidden),
        (
            SseEvent::data("{\"finish_reason\":\"stop\"}").control(),
            Kind::Control,
        ),
        // Unmarked, from any OpenAI-compatible upstream: `[DONE]` and an end frame.
        (SseEvent::data("[DONE]"), Kind::Control),
        (
            SseEvent::data("{}").with_event("error").unwrap(),
            Kind::Control,
        ),
    ];
    for (event, kind) in cases {
        let encoded = event.encode();
        let decoded = decode_in_pieces(&encoded, &[]);
        let [Ok(decoded)] = &decoded[..] else {
            panic!("one event from {encoded:?}: {decoded:?}")
        };
        assert_eq!(decoded.kind(), kind, "{encoded:?}");
        assert_eq!(decoded.data_str(), event.data_str());
    }
    // A mark belongs to the event it is in: a comment-only frame leaves nothing behind; a
    // comment that is not a mark marks nothing; and no comment of an event's own can read as
    // one (they are written with a space).
    let own = SseEvent::data("v").with_comment("control").encode();
    assert_eq!(&own[..], b": control\ndata: v\n\n");
    let own = String::from_utf8(own.to_vec()).unwrap();
    for input in [":hidden\n\ndata: v\n\n", ":hiddenness\ndata: v\n\n", &own] {
        let decoded = decode_in_pieces(input.as_bytes(), &[]);
        let [Ok(decoded)] = &decoded[..] else {
            panic!("{input:?}: {decoded:?}")
        };
        assert_eq!(decoded.kind(), Kind::Visible, "{input:?}");
    }
}
