//! Hop records: one JSON line per observed event, for timeline analysis across processes.

use std::fmt::{self, Write as _};
use std::io::{self, BufWriter, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::Instant;

use crate::chunk::Kind;

/// One event as one hop saw it. No payload: only where, which event, when, how big, what kind.
///
/// Its JSON line has exactly these fields, so that hops written in other languages (a browser
/// client) can produce them too:
///
/// ```text
/// {"request":"<id>","hop":"<name>","seq":<u64>,"t_ns":<u64>,"bytes":<u64>,"kind":"visible"|"hidden"|"control"}
/// ```
///
/// `t_ns` is on the writing process's monotonic clock: comparable only with other records of
/// the same hop and process, which is all the timeline analysis ever does.
///
/// `seq` is the event id: the position of the event's (last) chunk in the generator's output,
/// which the gate counts at `send` ([`Event::id`](crate::Event::id)) and the SSE encoder writes
/// as `id:`. A hop in another language records the SSE `id` it received (a browser's
/// `MessageEvent.lastEventId`), so every hop numbers the same event the same way; a coalesced
/// event is recorded under its last id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HopRecord {
    /// The request id the stream belongs to.
    pub request: String,
    /// The hop's name, e.g. `gateway.recv`.
    pub hop: String,
    /// The event id: the position of the event's (last) chunk in its stream's output.
    pub seq: u64,
    /// When the hop saw it, in nanoseconds on the process's monotonic clock.
    pub t_ns: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// How it counts for progress.
    pub kind: Kind,
}

impl HopRecord {
    /// The record's JSON line, without the line break.
    pub fn to_json_line(&self) -> String {
        let mut line = String::with_capacity(96 + self.request.len() + self.hop.len());
        write_line(
            &mut line,
            &self.request,
            &self.hop,
            self.seq,
            self.t_ns,
            self.bytes,
            self.kind,
        );
        line
    }

    /// Parses one JSON line.
    ///
    /// # Errors
    ///
    /// A [`RecordError`] saying what is wrong: not a flat JSON object, a field missing or of
    /// the wrong type, an unknown kind.
    pub fn parse_line(line: &str) -> Result<HopRecord, RecordError> {
        let fields = flat_json::parse(line).map_err(RecordError)?;
        let text = |name: &str| match fields.iter().find(|(key, _)| key == name) {
            Some((_, flat_json::Value::Text(text))) => Ok(text.clone()),
            Some(_) => Err(RecordError(format!("`{name}` is not a string"))),
            None => Err(RecordError(format!("`{name}` is missing"))),
        };
        let number = |name: &str| match fields.iter().find(|(key, _)| key == name) {
            Some((_, flat_json::Value::Number(n))) => Ok(*n),
            Some(_) => Err(RecordError(format!("`{name}` is not an unsigned integer"))),
            None => Err(RecordError(format!("`{name}` is missing"))),
        };
        let kind = match text("kind")?.as_str() {
            "visible" => Kind::Visible,
            "hidden" => Kind::Hidden,
            "control" => Kind::Control,
            other => return Err(RecordError(format!("unknown kind `{other}`"))),
        };
        Ok(HopRecord {
            request: text("request")?,
            hop: text("hop")?,
            seq: number("seq")?,
            t_ns: number("t_ns")?,
            bytes: number("bytes")?,
            kind,
        })
    }
}

/// Why a hop record line could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError(String);

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad hop record: {}", self.0)
    }
}

impl std::error::Error for RecordError {}

/// Nanoseconds since this process's monotonic epoch (the first time any probe asked).
pub(crate) fn monotonic_ns(at: Instant) -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(at.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

fn write_line(
    out: &mut String,
    request: &str,
    hop: &str,
    seq: u64,
    t_ns: u64,
    bytes: u64,
    kind: Kind,
) {
    out.push_str("{\"request\":");
    json_string(out, request);
    out.push_str(",\"hop\":");
    json_string(out, hop);
    let _ = write!(
        out,
        ",\"seq\":{seq},\"t_ns\":{t_ns},\"bytes\":{bytes},\"kind\":\"{}\"}}",
        kind.as_str()
    );
}

/// Writes `text` as a JSON string.
pub(crate) fn json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c < ' ' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A record on its way to the writer: shared names, so sending one allocates nothing.
pub(crate) struct Pending {
    pub(crate) request: Arc<str>,
    pub(crate) hop: Arc<str>,
    pub(crate) seq: u64,
    pub(crate) t_ns: u64,
    pub(crate) bytes: u64,
    pub(crate) kind: Kind,
}

enum Message {
    Record(Pending),
    Sync(mpsc::Sender<()>),
}

/// Where hop records go: a bounded queue to a writer thread that appends JSON lines.
///
/// Recording never blocks a stream: when the queue is full the record is dropped and counted
/// ([`dropped`](RecordSink::dropped)), never lost silently. Cloning shares the queue.
#[derive(Clone)]
pub struct RecordSink {
    queue: mpsc::SyncSender<Message>,
    counts: Arc<SinkCounts>,
}

#[derive(Default)]
struct SinkCounts {
    written: AtomicU64,
    dropped: AtomicU64,
}

/// The default queue between probes and the writer: 64 Ki records.
pub const DEFAULT_RECORD_QUEUE: usize = 64 * 1024;

impl RecordSink {
    /// Appends records to the file at `path` (created if missing).
    ///
    /// # Errors
    ///
    /// What opening the file or starting the writer thread returns.
    pub fn to_file(path: impl AsRef<std::path::Path>) -> io::Result<RecordSink> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        RecordSink::to_writer(file, DEFAULT_RECORD_QUEUE)
    }

    /// Writes records to `writer` from a thread of its own, through a queue of `capacity`.
    ///
    /// # Errors
    ///
    /// What starting the thread returns.
    pub fn to_writer(
        writer: impl Write + Send + 'static,
        capacity: usize,
    ) -> io::Result<RecordSink> {
        let (queue, messages) = mpsc::sync_channel(capacity.max(1));
        let counts = Arc::new(SinkCounts::default());
        let written = counts.clone();
        std::thread::Builder::new()
            .name("streamgate-records".into())
            .spawn(move || {
                let mut out = BufWriter::new(writer);
                let mut line = String::new();
                // Write what is queued, then flush whenever the queue runs dry: lines reach the
                // file in batches under load and at once when it is quiet.
                while let Ok(first) = messages.recv() {
                    for message in std::iter::once(first).chain(messages.try_iter()) {
                        match message {
                            Message::Record(r) => {
                                line.clear();
                                write_line(
                                    &mut line, &r.request, &r.hop, r.seq, r.t_ns, r.bytes, r.kind,
                                );
                                line.push('\n');
                                if out.write_all(line.as_bytes()).is_ok() {
                                    written.written.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            Message::Sync(done) => {
                                let _ = out.flush();
                                let _ = done.send(());
                            }
                        }
                    }
                    let _ = out.flush();
                }
            })?;
        Ok(RecordSink { queue, counts })
    }

    /// Queues a record, or counts it as dropped when the queue is full.
    pub(crate) fn send(&self, record: Pending) {
        if self.queue.try_send(Message::Record(record)).is_err() {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waits until every record queued before this call is written and flushed. It blocks the
    /// calling thread: meant for shutdown, not for a runtime's worker in the middle of serving.
    pub fn sync(&self) {
        let (done, wait) = mpsc::channel();
        if self.queue.send(Message::Sync(done)).is_ok() {
            let _ = wait.recv();
        }
    }

    /// Records written so far.
    pub fn written(&self) -> u64 {
        self.counts.written.load(Ordering::Relaxed)
    }

    /// Records dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.counts.dropped.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for RecordSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordSink")
            .field("written", &self.written())
            .field("dropped", &self.dropped())
            .finish()
    }
}

/// A parser for the one JSON shape hop records have: a flat object of strings and unsigned
/// integers. Anything else is an error with a short reason, never a panic.
mod flat_json {
    pub(super) enum Value {
        Text(String),
        Number(u64),
    }

    pub(super) fn parse(line: &str) -> Result<Vec<(String, Value)>, String> {
        let mut chars = line.trim().chars().peekable();
        let mut fields = Vec::new();
        expect(&mut chars, '{')?;
        skip_space(&mut chars);
        if chars.peek() == Some(&'}') {
            chars.next();
        } else {
            loop {
                skip_space(&mut chars);
                let key = string(&mut chars)?;
                skip_space(&mut chars);
                expect(&mut chars, ':')?;
                skip_space(&mut chars);
                let value = match chars.peek() {
                    Some('"') => Value::Text(string(&mut chars)?),
                    Some(c) if c.is_ascii_digit() => Value::Number(number(&mut chars)?),
                    Some(c) => return Err(format!("unexpected `{c}` in the value of `{key}`")),
                    None => return Err("the line ends inside the object".into()),
                };
                fields.push((key, value));
                skip_space(&mut chars);
                match chars.next() {
                    Some(',') => continue,
                    Some('}') => break,
                    Some(c) => return Err(format!("unexpected `{c}` after a value")),
                    None => return Err("the line ends inside the object".into()),
                }
            }
        }
        skip_space(&mut chars);
        match chars.next() {
            None => Ok(fields),
            Some(c) => Err(format!("unexpected `{c}` after the object")),
        }
    }

    type Chars<'a> = std::iter::Peekable<std::str::Chars<'a>>;

    fn skip_space(chars: &mut Chars<'_>) {
        while chars.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            chars.next();
        }
    }

    fn expect(chars: &mut Chars<'_>, want: char) -> Result<(), String> {
        match chars.next() {
            Some(c) if c == want => Ok(()),
            Some(c) => Err(format!("expected `{want}`, found `{c}`")),
            None => Err(format!("expected `{want}`, found the end of the line")),
        }
    }

    fn number(chars: &mut Chars<'_>) -> Result<u64, String> {
        let mut value: u64 = 0;
        while let Some(digit) = chars.peek().and_then(|c| c.to_digit(10)) {
            chars.next();
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(digit)))
                .ok_or("a number too large for u64")?;
        }
        if chars.peek().is_some_and(|c| matches!(c, '.' | 'e' | 'E')) {
            return Err("a number that is not an unsigned integer".into());
        }
        Ok(value)
    }

    fn string(chars: &mut Chars<'_>) -> Result<String, String> {
        expect(chars, '"')?;
        let mut text = String::new();
        loop {
            match chars.next().ok_or("the line ends inside a string")? {
                '"' => return Ok(text),
                '\\' => match chars.next().ok_or("the line ends inside an escape")? {
                    '"' => text.push('"'),
                    '\\' => text.push('\\'),
                    '/' => text.push('/'),
                    'b' => text.push('\u{8}'),
                    'f' => text.push('\u{c}'),
                    'n' => text.push('\n'),
                    'r' => text.push('\r'),
                    't' => text.push('\t'),
                    'u' => {
                        let high = hex4(chars)?;
                        let code = if (0xD800..0xDC00).contains(&high) {
                            expect(chars, '\\')?;
                            expect(chars, 'u')?;
                            let low = hex4(chars)?;
                            if !(0xDC00..0xE000).contains(&low) {
                                return Err("an unpaired surrogate".into());
                            }
                            0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
                        } else {
                            high
                        };
                        text.push(char::from_u32(code).ok_or("an invalid \\u escape")?);
                    }
                    c => return Err(format!("an unknown escape `\\{c}`")),
                },
                c if c < ' ' => return Err("a control character inside a string".into()),
                c => text.push(c),
            }
        }
    }

    fn hex4(chars: &mut Chars<'_>) -> Result<u32, String> {
        let mut value = 0;
        for _ in 0..4 {
            let digit = chars
                .next()
                .and_then(|c| c.to_digit(16))
                .ok_or("a \\u escape without four hex digits")?;
            value = value * 16 + digit;
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let record = HopRecord {
            request: "req \"1\"\n\u{1}é".into(),
            hop: "gateway.recv".into(),
            seq: 42,
            t_ns: u64::MAX,
            bytes: 7,
            kind: Kind::Hidden,
        };
        let line = record.to_json_line();
        assert_eq!(HopRecord::parse_line(&line), Ok(record));
        assert_eq!(
            HopRecord::parse_line(
                r#"{"request":"r","hop":"h","seq":1,"t_ns":2,"bytes":3,"kind":"visible"}"#
            )
            .unwrap()
            .seq,
            1
        );
    }

    #[test]
    fn bad_lines_are_errors() {
        for bad in [
            "",
            "{",
            "{\"request\":\"r\"",
            r#"{"request":"r","hop":"h","seq":1,"t_ns":2,"bytes":3}"#,
            r#"{"request":"r","hop":"h","seq":-1,"t_ns":2,"bytes":3,"kind":"visible"}"#,
            r#"{"request":"r","hop":"h","seq":1.5,"t_ns":2,"bytes":3,"kind":"visible"}"#,
            r#"{"request":"r","hop":"h","seq":99999999999999999999999,"t_ns":2,"bytes":3,"kind":"visible"}"#,
            r#"{"request":"r","hop":"h","seq":1,"t_ns":2,"bytes":3,"kind":"loud"}"#,
            r#"{"request":"\ud800","hop":"h","seq":1,"t_ns":2,"bytes":3,"kind":"visible"}"#,
            r#"{"request":"r","hop":"h","seq":1,"t_ns":2,"bytes":3,"kind":"visible"} x"#,
            "[1,2]",
        ] {
            assert!(HopRecord::parse_line(bad).is_err(), "{bad}");
        }
    }
}
