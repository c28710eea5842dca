//! Decodes an SSE byte stream from stdin and prints what a WHATWG client would dispatch.
//!
//! `cargo run --example sse_decode -- [--chunk N] < capture.txt`
//!
//! Each dispatched event is one JSON line `{"type":..,"data":..,"id":..}` (`id` is null until
//! the stream sets one), each accepted retry `{"retry":ms}`, each limit error
//! `{"error":..}`. With `--chunk N` the input is fed to the decoder in N-byte pieces, as a
//! network would split it; the output must not change.

use std::io::{self, Read, Write};
use std::process::ExitCode;

use bytes::BytesMut;
use serde_json::json;
use streamgate::sse::{DecodeError, SseDecoder, SseEvent};
use tokio_util::codec::Decoder;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut chunk = usize::MAX;
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next().map(|n| n.parse::<usize>())) {
            ("--chunk", Some(Ok(n))) if n > 0 => chunk = n,
            _ => {
                eprintln!("usage: sse_decode [--chunk N] < input   (N: a positive byte count)");
                return ExitCode::from(2);
            }
        }
    }
    let mut input = Vec::new();
    if let Err(error) = io::stdin().read_to_end(&mut input) {
        eprintln!("sse_decode: reading stdin: {error}");
        return ExitCode::FAILURE;
    }
    let mut decoder = SseDecoder::new();
    let mut buffer = BytesMut::new();
    let mut out = io::stdout().lock();
    let pieces = input.chunks(chunk.min(input.len().max(1)));
    let printed = pieces
        .into_iter()
        .try_for_each(|piece| {
            buffer.extend_from_slice(piece);
            print_items(&mut out, || decoder.decode(&mut buffer))
        })
        .and_then(|()| print_items(&mut out, || decoder.decode_eof(&mut buffer)));
    match printed {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sse_decode: writing stdout: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Prints what `next` yields until it has nothing more for now.
fn print_items(
    out: &mut impl Write,
    mut next: impl FnMut() -> Result<Option<SseEvent>, DecodeError>,
) -> io::Result<()> {
    loop {
        let line = match next() {
            Ok(Some(event)) => event_json(&event),
            Ok(None) => return Ok(()),
            Err(error) => json!({ "error": error.to_string() }).to_string(),
        };
        writeln!(out, "{line}")?;
    }
}

/// One event as a JSON line, its keys in the documented order.
fn event_json(event: &SseEvent) -> String {
    let text = |value: Option<&str>| serde_json::Value::from(value).to_string();
    match (event.data_str(), event.retry_ms()) {
        (None, Some(ms)) => format!("{{\"retry\":{ms}}}"),
        (data, _) => format!(
            "{{\"type\":{},\"data\":{},\"id\":{}}}",
            text(Some(event.event_type())),
            text(data),
            text(event.id())
        ),
    }
}
