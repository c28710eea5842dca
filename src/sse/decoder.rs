//! An incremental SSE parser following the WHATWG "parsing an event stream" rules.

use std::borrow::Cow;
use std::fmt;
use std::io;
use std::mem;

use bytes::{Buf, BytesMut};
use tokio_util::codec::Decoder;

use super::event::{KIND_MARKS, SseEvent};
use crate::chunk::Kind;
use crate::gate::BoxError;

/// The default longest line: 256 KiB (see [`SseDecoder::max_line`]).
pub const DEFAULT_MAX_LINE: usize = 256 * 1024;
/// The default largest event data: 1 MiB (see [`SseDecoder::max_event`]).
pub const DEFAULT_MAX_EVENT: usize = 1024 * 1024;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// An incremental parser of an SSE byte stream, as a WHATWG client parses it.
///
/// It yields each dispatched event as an [`SseEvent`] (its data, its type when not the default
/// `message`, and the last event id when one was ever set) and each valid `retry:` as an event
/// carrying only [`retry_ms`](SseEvent::retry_ms). The rules it follows: one leading BOM is
/// skipped (even split across reads); lines end at CR, LF or CRLF (a CRLF split across reads
/// too); a field without a colon has an empty value; one space after the colon is stripped; an
/// `id` containing NUL is ignored; `retry` is accepted only as ASCII digits (and ignored if it
/// does not fit in a `u64`); the last event id persists across events; the type is reset after
/// each dispatch; data pending at the end of the stream is discarded; invalid UTF-8 is decoded
/// with U+FFFD.
///
/// Kinds survive the hop: an event with a `:hidden` or `:control` comment line (as
/// [`SseEvent::encode`] writes for marked events) is marked [`hidden`](SseEvent::hidden) or
/// [`control`](SseEvent::control); an unmarked one has the kind
/// [`SseEvent`'s `Chunk::kind`](SseEvent#impl-Chunk-for-SseEvent) gives it (`[DONE]` and
/// `event: error` are control).
///
/// Time is linear in the input however it is split: the parser remembers how far it scanned.
///
/// # Limits
///
/// Memory is bounded by two limits, both counted in bytes of text as stored: valid UTF-8 counts
/// as it is, each invalid sequence as the 3 bytes of the U+FFFD that replaces it.
///
/// - [`max_line`](SseDecoder::max_line) bounds each line (without its line end), and so the
///   event type and the last event id, which are parts of a line. An unfinished line is
///   checked on its raw bytes as they arrive (it is an error once they exceed the limit: its
///   text can only be longer), a finished one on its text.
/// - [`max_event`](SseDecoder::max_event) bounds the data of an event: its `data:` values
///   joined by LF, as the event would carry it.
///
/// A limit of `n` accepts exactly `n` bytes. Breaking one is a [`DecodeError`]
/// ([`LineTooLong`](DecodeError::LineTooLong) or [`EventTooLarge`](DecodeError::EventTooLarge)),
/// returned by the call that reads the offending line; the parser then skips the rest of that
/// event (up to its blank line) and goes on with the next. The last event id keeps its value
/// from before.
///
/// # Examples
///
/// ```
/// use bytes::BytesMut;
/// use streamgate::sse::SseDecoder;
/// use tokio_util::codec::Decoder;
///
/// let mut decoder = SseDecoder::new();
/// let mut input = BytesMut::from("id: 7\r\ndata: hel");
/// assert!(decoder.decode(&mut input)?.is_none());
/// input.extend_from_slice(b"lo\r\n\r\n");
/// let event = decoder.decode(&mut input)?.expect("one event");
/// assert_eq!((event.data_str(), event.id()), (Some("hello"), Some("7")));
/// # Ok::<(), streamgate::sse::DecodeError>(())
/// ```
#[derive(Clone)]
pub struct SseDecoder {
    max_line: usize,
    max_event: usize,
    /// How many bytes at the front of the input were scanned without finding a line end.
    next_index: usize,
    /// Whether the stream start was passed (a BOM can only be there).
    started: bool,
    /// The last line ended with CR at the end of the input: an LF first thing next belongs to it.
    skip_lf: bool,
    /// Skipping the rest of a line that was too long.
    discarding_line: bool,
    /// Skipping the rest of an event that broke a limit, up to its blank line.
    dropping_event: bool,
    /// The event's `data:` values joined by LF; `None` before its first `data:` line.
    data: Option<String>,
    event_type: String,
    last_event_id: Option<String>,
    /// The kind the event being built was marked with (a `:hidden` or `:control` comment).
    marked: Option<Kind>,
}

impl SseDecoder {
    /// A parser with the default limits ([`DEFAULT_MAX_LINE`], [`DEFAULT_MAX_EVENT`]).
    ///
    /// # Examples
    ///
    /// As a [`Decoder`] over any `AsyncRead`, through tokio-util's `FramedRead`:
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use streamgate::sse::SseDecoder;
    /// use tokio_util::codec::FramedRead;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), streamgate::sse::DecodeError> {
    /// let body: &[u8] = b"event: delta\ndata: hel\ndata: lo\n\n: a comment\ndata: world\n\n";
    /// let mut events = FramedRead::new(body, SseDecoder::new());
    /// let first = events.next().await.expect("an event")?;
    /// assert_eq!((first.event_type(), first.data_str()), ("delta", Some("hel\nlo")));
    /// let second = events.next().await.expect("an event")?;
    /// assert_eq!((second.event_type(), second.data_str()), ("message", Some("world")));
    /// assert!(events.next().await.is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub fn new() -> Self {
        SseDecoder {
            max_line: DEFAULT_MAX_LINE,
            max_event: DEFAULT_MAX_EVENT,
            next_index: 0,
            started: false,
            skip_lf: false,
            discarding_line: false,
            dropping_event: false,
            data: None,
            event_type: String::new(),
            last_event_id: None,
            marked: None,
        }
    }

    /// The longest line accepted, in bytes of its text without the line end (see
    /// [Limits](SseDecoder#limits)); the default is [`DEFAULT_MAX_LINE`].
    ///
    /// # Examples
    ///
    /// An over-long line is an error; the rest of its event is skipped, and the next one
    /// decodes:
    ///
    /// ```
    /// use bytes::BytesMut;
    /// use streamgate::sse::{DecodeError, SseDecoder};
    /// use tokio_util::codec::Decoder;
    ///
    /// let mut decoder = SseDecoder::new().max_line(16);
    /// let mut input = BytesMut::from("data: this line is too long\ndata: rest\n\ndata: ok\n\n");
    /// let error = decoder.decode(&mut input).unwrap_err();
    /// assert!(matches!(error, DecodeError::LineTooLong { limit: 16 }));
    /// let next = decoder.decode(&mut input)?.expect("the next event");
    /// assert_eq!(next.data_str(), Some("ok"));
    /// # Ok::<(), DecodeError>(())
    /// ```
    pub fn max_line(mut self, max_line: usize) -> Self {
        self.max_line = max_line;
        self
    }

    /// The largest event data accepted, in bytes of text: its `data:` values joined by LF (see
    /// [Limits](SseDecoder#limits)); the default is [`DEFAULT_MAX_EVENT`].
    ///
    /// # Examples
    ///
    /// ```
    /// use bytes::BytesMut;
    /// use streamgate::sse::{DecodeError, SseDecoder};
    /// use tokio_util::codec::Decoder;
    ///
    /// // Five bytes of data: `abc`, LF, `d`.
    /// let mut decoder = SseDecoder::new().max_event(4);
    /// let mut input = BytesMut::from("data: abc\ndata: d\n\ndata: abcd\n\n");
    /// let error = decoder.decode(&mut input).unwrap_err();
    /// assert!(matches!(error, DecodeError::EventTooLarge { limit: 4 }));
    /// // A limit of 4 accepts exactly 4 bytes.
    /// let next = decoder.decode(&mut input)?.expect("the next event");
    /// assert_eq!(next.data_str(), Some("abcd"));
    /// # Ok::<(), DecodeError>(())
    /// ```
    pub fn max_event(mut self, max_event: usize) -> Self {
        self.max_event = max_event;
        self
    }

    /// The last event id seen, as a reconnecting client would send it in `Last-Event-ID`.
    ///
    /// # Examples
    ///
    /// ```
    /// use bytes::BytesMut;
    /// use streamgate::sse::SseDecoder;
    /// use tokio_util::codec::Decoder;
    ///
    /// let mut decoder = SseDecoder::new();
    /// let mut input = BytesMut::from("id: 41\ndata: a\n\ndata: b\n\n");
    /// while decoder.decode(&mut input)?.is_some() {}
    /// // The id persists across events: `b` was sent after event 41 too.
    /// assert_eq!(decoder.last_event_id(), Some("41"));
    /// # Ok::<(), streamgate::sse::DecodeError>(())
    /// ```
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_event_id.as_deref()
    }

    /// Bytes of data held for the event being parsed, counted as
    /// [`max_event`](SseDecoder::max_event) counts them (so at most that).
    pub fn buffered_data(&self) -> usize {
        self.data.as_ref().map_or(0, String::len)
    }

    /// Processes lines from the front of `src` until one yields an item or `src` holds no
    /// complete line.
    fn next_item(&mut self, src: &mut BytesMut) -> Result<Option<SseEvent>, DecodeError> {
        loop {
            if !self.started {
                let n = src.len().min(BOM.len());
                if src[..n] != BOM[..n] {
                    self.started = true;
                } else if n == BOM.len() {
                    src.advance(n);
                    self.started = true;
                } else {
                    return Ok(None);
                }
            }
            if self.skip_lf && !src.is_empty() {
                self.skip_lf = false;
                if src[0] == b'\n' {
                    src.advance(1);
                }
            }
            let scanned = self.next_index;
            let Some(at) = line_end(&src[scanned..]).map(|at| scanned + at) else {
                self.next_index = src.len();
                if self.discarding_line {
                    src.clear();
                    self.next_index = 0;
                } else if src.len() > self.max_line {
                    src.clear();
                    self.next_index = 0;
                    self.discarding_line = true;
                    return Err(self.broke_limit(DecodeError::LineTooLong {
                        limit: self.max_line,
                    }));
                }
                return Ok(None);
            };
            let mut end = at + 1;
            if src[at] == b'\r' {
                match src.get(end) {
                    Some(b'\n') => end += 1,
                    Some(_) => {}
                    None => self.skip_lf = true,
                }
            }
            self.next_index = 0;
            let item = match mem::take(&mut self.discarding_line) {
                true => Ok(None),
                false => self.complete_line(&src[..at]),
            };
            src.advance(end);
            if let Some(item) = item? {
                return Ok(Some(item));
            }
        }
    }

    /// One complete line's raw bytes (without its line end): checked against `max_line` and
    /// processed as text.
    fn complete_line(&mut self, line: &[u8]) -> Result<Option<SseEvent>, DecodeError> {
        // The text is never shorter than the raw bytes: check those first, so an over-long
        // line is never converted.
        let text = (line.len() <= self.max_line).then(|| match std::str::from_utf8(line) {
            // The common case, validated a word at a time; only invalid bytes go through
            // the slower replacing conversion.
            Ok(text) => Cow::Borrowed(text),
            Err(_) => String::from_utf8_lossy(line),
        });
        let Some(line) = text.filter(|text| text.len() <= self.max_line) else {
            return Err(self.broke_limit(DecodeError::LineTooLong {
                limit: self.max_line,
            }));
        };
        self.process_line(&line)
    }

    /// One complete line as text (within `max_line`), per the WHATWG rules.
    fn process_line(&mut self, line: &str) -> Result<Option<SseEvent>, DecodeError> {
        if line.is_empty() {
            if mem::take(&mut self.dropping_event) {
                self.data = None;
                self.event_type.clear();
                self.marked = None;
                return Ok(None);
            }
            return Ok(self.dispatch());
        }
        if self.dropping_event {
            return Ok(None);
        }
        if line.starts_with(':') {
            if let Some((kind, _)) = KIND_MARKS.iter().find(|(_, mark)| *mark == line) {
                self.marked = Some(*kind);
            }
            return Ok(None);
        }
        let (name, value) = match line.split_once(':') {
            Some((name, value)) => (name, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match name {
            "event" => value.clone_into(&mut self.event_type),
            "data" => {
                let separator = usize::from(self.data.is_some());
                if self.buffered_data() + separator + value.len() > self.max_event {
                    return Err(self.broke_limit(DecodeError::EventTooLarge {
                        limit: self.max_event,
                    }));
                }
                match &mut self.data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(value);
                    }
                    None => self.data = Some(value.to_owned()),
                }
            }
            "id" if !value.contains('\0') => self.last_event_id = Some(value.to_owned()),
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                // A value too large for u64 is ignored.
                if let Ok(ms) = value.parse() {
                    return Ok(Some(SseEvent::retry(std::time::Duration::from_millis(ms))));
                }
            }
            _ => {}
        }
        Ok(None)
    }

    /// Dispatches the event built so far, if it has data.
    fn dispatch(&mut self) -> Option<SseEvent> {
        let event_type = mem::take(&mut self.event_type);
        let marked = mem::take(&mut self.marked);
        let data = self.data.take()?;
        let mut event = SseEvent::data(data);
        if let Some(kind) = marked {
            event = event.marked(kind);
        }
        if !event_type.is_empty() {
            event = event
                .with_event(event_type)
                .expect("a parsed line holds no line break");
        }
        if let Some(id) = &self.last_event_id {
            event = event
                .with_id(id.clone())
                .expect("a parsed id holds no line break or NUL");
        }
        Some(event)
    }

    /// Starts skipping the current event, and returns `error`.
    fn broke_limit(&mut self, error: DecodeError) -> DecodeError {
        self.dropping_event = true;
        self.data = None;
        self.event_type.clear();
        error
    }
}

/// The index of the first CR or LF in `bytes`, found eight bytes at a time.
fn line_end(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    const CRS: u64 = u64::from_ne_bytes([b'\r'; 8]);
    const LFS: u64 = u64::from_ne_bytes([b'\n'; 8]);
    // Whether a byte of `word` is zero (exact: a borrow can only run past a zero byte).
    let has_zero = |word: u64| word.wrapping_sub(ONES) & !word & HIGHS != 0;
    let mut start = 0;
    for chunk in bytes.chunks_exact(8) {
        let word = u64::from_ne_bytes(chunk.try_into().expect("a chunk of eight bytes"));
        if has_zero(word ^ CRS) || has_zero(word ^ LFS) {
            break;
        }
        start += 8;
    }
    bytes[start..]
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .map(|at| start + at)
}

impl Default for SseDecoder {
    fn default() -> Self {
        SseDecoder::new()
    }
}

impl fmt::Debug for SseDecoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SseDecoder")
            .field("max_line", &self.max_line)
            .field("max_event", &self.max_event)
            .field("pending_data", &self.buffered_data())
            .field("last_event_id", &self.last_event_id)
            .finish_non_exhaustive()
    }
}

impl Decoder for SseDecoder {
    type Item = SseEvent;
    type Error = DecodeError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<SseEvent>, DecodeError> {
        self.next_item(src)
    }

    /// At the end of the stream, an incomplete line or event is discarded, as the WHATWG rules
    /// say: a cut-off event is never dispatched.
    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<SseEvent>, DecodeError> {
        if let Some(item) = self.next_item(src)? {
            return Ok(Some(item));
        }
        src.clear();
        self.next_index = 0;
        self.data = None;
        self.event_type.clear();
        self.dropping_event = false;
        self.discarding_line = false;
        Ok(None)
    }
}

/// Why an SSE byte stream could not be decoded.
///
/// A limit error ([`LineTooLong`](DecodeError::LineTooLong),
/// [`EventTooLarge`](DecodeError::EventTooLarge)) costs one event, and decoding goes on; a
/// failed read ([`Io`](DecodeError::Io), [`Upstream`](DecodeError::Upstream)) ends the stream
/// and keeps its cause as the [`source`](std::error::Error::source).
///
/// # Examples
///
/// ```
/// use std::error::Error as _;
/// use bytes::Bytes;
/// use futures_util::StreamExt;
/// use streamgate::GateExt;
/// use streamgate::sse::DecodeError;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let body = futures_util::stream::iter([
///     Ok(Bytes::from_static(b"data: a\n\n")),
///     Err(std::io::Error::other("connection reset")),
/// ]);
/// let items: Vec<_> = body.sse_events().collect().await;
/// assert_eq!(items.len(), 2);
/// assert_eq!(items[0].as_ref().unwrap().data_str(), Some("a"));
/// let error = items[1].as_ref().unwrap_err();
/// assert!(matches!(error, DecodeError::Upstream(_)));
/// assert_eq!(error.source().unwrap().to_string(), "connection reset");
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum DecodeError {
    /// A line was longer than [`SseDecoder::max_line`]; the rest of its event is skipped.
    LineTooLong {
        /// The limit, in bytes.
        limit: usize,
    },
    /// An event's data grew past [`SseDecoder::max_event`]; the rest of the event is skipped.
    EventTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// Reading the bytes failed.
    Io(io::Error),
    /// The stream of bytes yielded an error.
    Upstream(BoxError),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::LineTooLong { limit } => write!(f, "sse line longer than {limit} bytes"),
            DecodeError::EventTooLarge { limit } => {
                write!(f, "sse event data larger than {limit} bytes")
            }
            DecodeError::Io(_) => f.write_str("reading the sse stream failed"),
            DecodeError::Upstream(_) => f.write_str("the sse byte stream failed"),
        }
    }
}

impl std::error::Error for DecodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DecodeError::Io(error) => Some(error),
            DecodeError::Upstream(error) => Some(&**error),
            _ => None,
        }
    }
}

impl From<io::Error> for DecodeError {
    fn from(error: io::Error) -> Self {
        DecodeError::Io(error)
    }
}
