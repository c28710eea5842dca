//! The SSE event type and its encoding.

use std::fmt;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};

use crate::chunk::{Chunk, Kind};

/// The comment lines that carry an event's kind across a hop that decodes SSE. Written without
/// the space a comment of the event's own always gets (`: text`), so no comment can pass for
/// one.
pub(crate) const KIND_MARKS: [(Kind, &str); 2] =
    [(Kind::Hidden, ":hidden"), (Kind::Control, ":control")];

/// One server-sent event: data, and optionally an event type, an id, a retry time and a
/// comment.
///
/// Encoding always yields one contiguous frame with LF line endings, ending in a blank line.
/// Data may hold any text: each CR, LF or CRLF in it starts a new `data:` line, so a WHATWG
/// client reconstructs exactly the original text with each CRLF, CR or LF turned into one LF.
/// Empty data still reaches the client as an event (one empty `data:` line).
///
/// The event type and id cannot hold line breaks (and the id no NUL): setting them checks this
/// and fails with a [`FieldError`] instead of letting a value inject fields or events.
///
/// # Examples
///
/// ```
/// use streamgate::sse::SseEvent;
///
/// let event = SseEvent::data("line one\r\nline two").with_event("delta")?.with_id("7")?;
/// assert_eq!(
///     &event.encode()[..],
///     b"event: delta\nid: 7\ndata: line one\ndata: line two\n\n"
/// );
/// assert!(SseEvent::data("x").with_event("a\nb").is_err());
/// # Ok::<(), streamgate::sse::FieldError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    data: Option<String>,
    // The rarer fields live behind one box, so a plain data event (most of a token stream) is
    // small to move through the gate's buffer.
    fields: Option<Box<Fields>>,
    /// A kind set by hand (hidden, control); `None`: from the fields.
    marked: Option<Kind>,
    /// The data is plain text, so consecutive events may merge by concatenation.
    text: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Fields {
    event: Option<String>,
    id: Option<String>,
    retry: Option<u64>,
    comment: Option<String>,
}

impl SseEvent {
    /// An event carrying `data` (possibly empty, possibly several lines). Its data is taken as
    /// a document (JSON, say) that must not be concatenated: under
    /// [`Coalesce`](crate::Policy::Coalesce) it never merges. See [`text`](SseEvent::text).
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::sse::SseEvent;
    ///
    /// let event = SseEvent::data(r#"{"content":"Hi"}"#);
    /// assert_eq!(&event.encode()[..], b"data: {\"content\":\"Hi\"}\n\n");
    /// // Each line break starts a `data:` line; empty data is still an event.
    /// assert_eq!(&SseEvent::data("a\nb").encode()[..], b"data: a\ndata: b\n\n");
    /// assert_eq!(&SseEvent::data("").encode()[..], b"data: \n\n");
    /// ```
    pub fn data(data: impl Into<String>) -> Self {
        SseEvent {
            data: Some(data.into()),
            ..SseEvent::default()
        }
    }

    /// An event whose data is a plain-text delta: consecutive text events of the same type
    /// and kind merge by concatenating their data, which a client that appends deltas cannot
    /// tell from receiving them one by one.
    ///
    /// ```
    /// use streamgate::Chunk;
    /// use streamgate::sse::SseEvent;
    ///
    /// let mut text = SseEvent::text("Hel");
    /// assert!(text.merge(SseEvent::text("lo")).is_ok());
    /// assert_eq!(text.data_str(), Some("Hello"));
    ///
    /// // JSON documents are never concatenated.
    /// let mut json = SseEvent::data(r#"{"content":"Hel"}"#);
    /// assert!(json.merge(SseEvent::data(r#"{"content":"lo"}"#)).is_err());
    /// ```
    pub fn text(data: impl Into<String>) -> Self {
        SseEvent {
            text: true,
            ..SseEvent::data(data)
        }
    }

    /// A comment, which clients ignore: the frame of a heartbeat. Each line of `text` becomes a
    /// comment line of its own.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::sse::SseEvent;
    /// use streamgate::{Chunk, Kind};
    ///
    /// let comment = SseEvent::comment("keep-alive");
    /// assert_eq!(&comment.encode()[..], b": keep-alive\n\n");
    /// assert_eq!(comment.kind(), Kind::Control); // no progress for the probes
    /// ```
    pub fn comment(text: impl Into<String>) -> Self {
        SseEvent::default().with_comment(text)
    }

    /// A frame that only sets the client's reconnection time.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::sse::SseEvent;
    ///
    /// assert_eq!(&SseEvent::retry(Duration::from_secs(3)).encode()[..], b"retry: 3000\n\n");
    /// ```
    pub fn retry(retry: Duration) -> Self {
        SseEvent::default().with_retry(retry)
    }

    /// Sets the event type (`event:`).
    ///
    /// # Errors
    ///
    /// If `event` contains CR or LF.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::sse::SseEvent;
    ///
    /// let event = SseEvent::data("{}").with_event("usage")?;
    /// assert_eq!(event.event_type(), "usage");
    /// assert_eq!(&event.encode()[..], b"event: usage\ndata: {}\n\n");
    ///
    /// // A type that would end the event early and inject another is refused.
    /// let error = SseEvent::data("{}").with_event("x\n\ndata: injected").unwrap_err();
    /// assert_eq!(error.field(), "event");
    /// # Ok::<(), streamgate::sse::FieldError>(())
    /// ```
    pub fn with_event(mut self, event: impl Into<String>) -> Result<Self, FieldError> {
        let event = event.into();
        check(&event, "event", false)?;
        self.fields_mut().event = Some(event);
        Ok(self)
    }

    /// Sets the event id (`id:`), which the client sends back as `Last-Event-ID` on reconnection.
    ///
    /// # Errors
    ///
    /// If `id` contains CR, LF or NUL.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::sse::SseEvent;
    ///
    /// let event = SseEvent::data("hi").with_id("42")?;
    /// assert_eq!(&event.encode()[..], b"id: 42\ndata: hi\n\n");
    ///
    /// for bad in ["4\r2", "4\n2", "4\02"] {
    ///     assert_eq!(SseEvent::data("hi").with_id(bad).unwrap_err().field(), "id");
    /// }
    /// # Ok::<(), streamgate::sse::FieldError>(())
    /// ```
    pub fn with_id(mut self, id: impl Into<String>) -> Result<Self, FieldError> {
        let id = id.into();
        check(&id, "id", true)?;
        self.fields_mut().id = Some(id);
        Ok(self)
    }

    /// Sets the client's reconnection time (`retry:`, in whole milliseconds).
    pub fn with_retry(mut self, retry: Duration) -> Self {
        self.fields_mut().retry = Some(u64::try_from(retry.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// Adds a comment.
    pub fn with_comment(mut self, text: impl Into<String>) -> Self {
        self.fields_mut().comment = Some(text.into());
        self
    }

    /// Marks the event as hidden output (a reasoning delta): alive, but no user-visible progress
    /// for the gap counters. Its encoding says so in a `:hidden` comment line, which clients
    /// ignore and [`SseDecoder`](super::SseDecoder) reads back.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::sse::SseEvent;
    /// use streamgate::{Chunk, Kind};
    ///
    /// let thinking = SseEvent::text("Let me see").hidden();
    /// assert_eq!(thinking.kind(), Kind::Hidden);
    /// assert_eq!(&thinking.encode()[..], b":hidden\ndata: Let me see\n\n");
    /// ```
    pub fn hidden(self) -> Self {
        self.marked(Kind::Hidden)
    }

    /// Marks the event as housekeeping that carries no model output (a `[DONE]`, a final chunk
    /// with only a finish reason): neither progress nor a sign of life for the gap counters.
    /// Its encoding says so in a `:control` comment line.
    pub fn control(self) -> Self {
        self.marked(Kind::Control)
    }

    /// Marks the event as being of `kind` ([`Visible`](Kind::Visible) takes a mark away).
    pub(crate) fn marked(mut self, kind: Kind) -> Self {
        self.marked = (kind != Kind::Visible).then_some(kind);
        self
    }

    /// The data, if the event carries any.
    pub fn data_str(&self) -> Option<&str> {
        self.data.as_deref()
    }

    /// The event type as set, if any.
    pub fn event(&self) -> Option<&str> {
        self.fields.as_ref()?.event.as_deref()
    }

    /// The event type a client dispatches: the one set, or `message` when none (or an empty one)
    /// was.
    pub fn event_type(&self) -> &str {
        match self.event() {
            None | Some("") => "message",
            Some(event) => event,
        }
    }

    /// The id, if any.
    pub fn id(&self) -> Option<&str> {
        self.fields.as_ref()?.id.as_deref()
    }

    /// The reconnection time in milliseconds, if set.
    pub fn retry_ms(&self) -> Option<u64> {
        self.fields.as_ref()?.retry
    }

    /// The comment, if any.
    pub fn comment_str(&self) -> Option<&str> {
        self.fields.as_ref()?.comment.as_deref()
    }

    /// Takes the data out.
    pub fn into_data(self) -> Option<String> {
        self.data
    }

    /// Encodes the event as one frame. A [`hidden`](SseEvent::hidden) or
    /// [`control`](SseEvent::control) event with data starts with a `:hidden` or `:control`
    /// comment line (no space: a comment of the event's own is written `: text`, so it can
    /// never read as one): clients ignore it, and a decoding hop (a gateway) reads the kind
    /// back.
    ///
    /// ```
    /// use streamgate::sse::SseEvent;
    ///
    /// assert_eq!(&SseEvent::data("[DONE]").control().encode()[..], b":control\ndata: [DONE]\n\n");
    /// ```
    pub fn encode(&self) -> Bytes {
        self.encode_with_id(None)
    }

    /// Encodes the event as one frame, taking its data, with `id` as its `id:` when it has none
    /// of its own. Plain data on one line (a JSON chunk) becomes the frame in its own buffer:
    /// the frame's fields are put before it and the blank line after, so an event costs the
    /// allocation its data made and one reallocation to the frame's exact size (`encode` with
    /// an id makes four allocations besides the data's).
    pub(crate) fn into_frame(self, id: Option<u64>) -> Bytes {
        let mut digits = Digits::default();
        let framed_alone = self.fields.as_ref().is_none_or(|fields| {
            fields.event.is_none() && fields.comment.is_none() && fields.retry.is_none()
        });
        let one_line = self.data.as_ref().is_some_and(|data| !has_line_break(data));
        if !(framed_alone && one_line) {
            // The event's own id, if it has one, comes first there too.
            return self.encode_with_id(id.map(|id| digits.format(id)));
        }
        let mark = self
            .marked
            .and_then(|kind| KIND_MARKS.iter().find(|(marked, _)| *marked == kind))
            .map_or("", |(_, mark)| mark);
        let SseEvent { data, fields, .. } = self;
        let own_id = fields.and_then(|fields| fields.id);
        let id = own_id.as_deref().or_else(|| id.map(|id| digits.format(id)));
        let (id_field, id, id_end) = id.map_or(("", "", ""), |id| ("id: ", id, "\n"));
        let mark_end = if mark.is_empty() { "" } else { "\n" };
        let head = [mark, mark_end, id_field, id, id_end, "data: "];
        let head_len: usize = head.iter().map(|piece| piece.len()).sum();
        let mut frame = data.unwrap_or_default().into_bytes();
        let len = frame.len();
        frame.reserve_exact(head_len + 2);
        frame.resize(len + head_len, 0);
        frame.copy_within(..len, head_len);
        let mut at = 0;
        for piece in head {
            frame[at..at + piece.len()].copy_from_slice(piece.as_bytes());
            at += piece.len();
        }
        frame.extend_from_slice(b"\n\n");
        // A boxed slice (exact size: the one reallocation) becomes `Bytes` without allocating;
        // a `Vec` with room to spare would cost a shared header.
        Bytes::from(frame.into_boxed_slice())
    }

    /// [`encode`](SseEvent::encode), with `id` as the event's `id:` when it has none of its own.
    fn encode_with_id(&self, id: Option<&str>) -> Bytes {
        let mut frame = BytesMut::with_capacity(self.encoded_len_hint());
        if let (Some(kind), Some(_)) = (self.marked, &self.data) {
            // The kind, for a hop that decodes the stream (clients ignore comments).
            if let Some((_, mark)) = KIND_MARKS.iter().find(|(marked, _)| *marked == kind) {
                frame.put_slice(mark.as_bytes());
                frame.put_slice(b"\n");
            }
        }
        if let Some(comment) = self.comment_str() {
            for line in lines(comment) {
                frame.put_slice(b":");
                if !line.is_empty() {
                    frame.put_slice(b" ");
                    frame.put_slice(line.as_bytes());
                }
                frame.put_slice(b"\n");
            }
        }
        if let Some(event) = self.event() {
            field(&mut frame, "event", event);
        }
        if let Some(id) = self.id().or(id) {
            field(&mut frame, "id", id);
        }
        if let Some(retry) = self.retry_ms() {
            field(&mut frame, "retry", &retry.to_string());
        }
        if let Some(data) = &self.data {
            for line in lines(data) {
                field(&mut frame, "data", line);
            }
        }
        frame.put_slice(b"\n");
        frame.freeze()
    }

    /// Bytes the encoding takes when the text has no line breaks (a few more per break).
    fn encoded_len_hint(&self) -> usize {
        let text = |value: Option<&str>| value.map_or(0, |v| v.len() + 8);
        let fields = match &self.fields {
            None => 0,
            Some(_) => text(self.event()) + text(self.id()) + text(self.comment_str()) + 28,
        };
        let mark = if self.marked.is_some() { 10 } else { 0 };
        text(self.data_str()) + fields + mark + 1
    }

    /// Whether `self` carries data and nothing a merge could lose.
    fn is_plain_data(&self) -> bool {
        self.data.is_some() && self.retry_ms().is_none() && self.comment_str().is_none()
    }

    fn fields_mut(&mut self) -> &mut Fields {
        self.fields.get_or_insert_with(Box::default)
    }
}

/// A number's decimal digits, formatted without allocating.
#[derive(Default)]
struct Digits([u8; 20]);

impl Digits {
    fn format(&mut self, mut n: u64) -> &str {
        let mut at = self.0.len();
        loop {
            at -= 1;
            self.0[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        std::str::from_utf8(&self.0[at..]).expect("ASCII digits")
    }
}

/// Writes `name: value\n`.
fn field(frame: &mut BytesMut, name: &str, value: &str) {
    frame.put_slice(name.as_bytes());
    frame.put_slice(b": ");
    frame.put_slice(value.as_bytes());
    frame.put_slice(b"\n");
}

/// Whether `text` has a CR or an LF. Bytes, not chars (neither occurs inside a multi-byte
/// character), and no early exit, so the compiler vectorizes the scan: for `sim`'s chunks,
/// `into_frame` ran 5.6 times fewer instructions than with `str::contains` (callgrind).
fn has_line_break(text: &str) -> bool {
    text.bytes().fold(false, |found, byte| {
        found | (byte == b'\n') | (byte == b'\r')
    })
}

/// Splits `text` at each CRLF, CR or LF (the WHATWG line ends).
fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let text = rest?;
        // Bytes, not chars: CR and LF never occur inside a multi-byte character.
        match text.bytes().position(|b| b == b'\r' || b == b'\n') {
            None => {
                rest = None;
                Some(text)
            }
            Some(at) => {
                let end = if text[at..].starts_with("\r\n") {
                    at + 2
                } else {
                    at + 1
                };
                rest = Some(&text[end..]);
                Some(&text[..at])
            }
        }
    })
}

fn check(value: &str, field: &'static str, nul: bool) -> Result<(), FieldError> {
    if has_line_break(value) {
        Err(FieldError {
            field,
            problem: "a line break",
        })
    } else if nul && value.contains('\0') {
        Err(FieldError {
            field,
            problem: "a NUL character",
        })
    } else {
        Ok(())
    }
}

impl Chunk for SseEvent {
    /// The payload: data, event type, id and comment, without the framing.
    fn byte_len(&self) -> usize {
        let len = |value: Option<&str>| value.map_or(0, str::len);
        len(self.data_str()) + len(self.event()) + len(self.id()) + len(self.comment_str())
    }

    /// Hidden or control if marked so. Unmarked: control when it carries no data (a comment,
    /// a retry), when its data is `[DONE]` (the OpenAI end marker) or when its type is `error`
    /// (an end frame); visible otherwise.
    fn kind(&self) -> Kind {
        match (self.marked, self.data.as_deref()) {
            (Some(kind), _) => kind,
            (None, None | Some("[DONE]")) => Kind::Control,
            (None, Some(_)) if self.event() == Some("error") => Kind::Control,
            (None, Some(_)) => Kind::Visible,
        }
    }

    /// Two [`text`](SseEvent::text) events of the same type and kind, without retry or comment,
    /// merge by concatenating their data; the merged event keeps the later id (a client that
    /// has it has everything up to that id). Any other event (built with
    /// [`data`](SseEvent::data), or decoded from an upstream) never merges: its data may be a
    /// document that concatenation would corrupt. To coalesce those losslessly, gate a delta
    /// type of your own whose `merge` understands the document (as the reference server's
    /// token delta does, merging text before it is encoded as JSON).
    fn merge(&mut self, next: Self) -> Result<(), Self> {
        if !(self.text
            && next.text
            && self.is_plain_data()
            && next.is_plain_data()
            && self.event_type() == next.event_type()
            && self.marked == next.marked)
        {
            return Err(next);
        }
        if let (Some(data), Some(more)) = (&mut self.data, next.data) {
            data.push_str(&more);
        }
        if let Some(id) = next.fields.and_then(|fields| fields.id) {
            self.fields_mut().id = Some(id);
        }
        Ok(())
    }
}

impl From<String> for SseEvent {
    fn from(data: String) -> Self {
        SseEvent::data(data)
    }
}

impl From<&str> for SseEvent {
    fn from(data: &str) -> Self {
        SseEvent::data(data)
    }
}

/// An event type or id that would break the framing: it contains a line break (or, in an id,
/// NUL).
///
/// # Examples
///
/// ```
/// use streamgate::sse::SseEvent;
///
/// // An id taken from a request, meant to inject an event of its own.
/// let hostile = "7\n\nevent: error\ndata: {}";
/// let error = SseEvent::data("hi").with_id(hostile).unwrap_err();
/// assert_eq!(error.field(), "id");
/// assert_eq!(error.to_string(), "sse `id` field contains a line break");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    field: &'static str,
    problem: &'static str,
}

impl FieldError {
    /// The field that was refused: `event` or `id`.
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sse `{}` field contains {}", self.field, self.problem)
    }
}

impl std::error::Error for FieldError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(event: &SseEvent) -> String {
        String::from_utf8(event.encode().to_vec()).unwrap()
    }

    #[test]
    fn a_line_break_is_found_wherever_it_is() {
        let long = "x".repeat(100);
        // NEL and U+2028 are not SSE line ends; U+010A and U+0D0D have continuation bytes whose
        // low bits are those of LF and CR.
        let none = [
            "",
            "{\"a\":1}",
            "é∑ no break 🦀",
            "\u{85}\u{2028}",
            "\u{10a}\u{d0d}",
            &long,
        ];
        let some = [
            "\n",
            "\r",
            "a\r\nb",
            "é\n",
            &format!("{long}\r"),
            &format!("\n{long}"),
        ];
        for text in none.iter().chain(&some) {
            let expected = text.contains(['\r', '\n']);
            assert_eq!(has_line_break(text), expected, "{text:?}");
            assert_eq!(expected, some.contains(text), "{text:?}");
        }
    }

    #[test]
    fn an_owned_frame_is_the_same_bytes_as_the_encoding() {
        let events = [
            SseEvent::data(r#"{"content":"t1 "}"#),
            SseEvent::data(String::with_capacity(256) + "roomy"),
            SseEvent::data(""),
            SseEvent::data("two\nlines"),
            SseEvent::data("[DONE]").control(),
            SseEvent::text("thinking").hidden(),
            SseEvent::data("own id").with_id("abc").unwrap(),
            SseEvent::data("typed").with_event("delta").unwrap(),
            SseEvent::data("noted").with_comment("a\nb"),
            SseEvent::data("later").with_retry(Duration::from_millis(1500)),
            SseEvent::comment("only a comment"),
            SseEvent::retry(Duration::from_secs(3)),
            SseEvent::default(),
        ];
        for event in events {
            for id in [None, Some(0), Some(7), Some(u64::MAX)] {
                let expected = match (id, event.id()) {
                    (Some(id), None) => event.clone().with_id(id.to_string()).unwrap().encode(),
                    _ => event.encode(),
                };
                assert_eq!(
                    event.clone().into_frame(id),
                    expected,
                    "{event:?} with id {id:?}"
                );
            }
        }
    }

    #[test]
    fn data_line_breaks_become_data_lines() {
        let event = SseEvent::data("a\r\nb\rc\nd");
        assert_eq!(encoded(&event), "data: a\ndata: b\ndata: c\ndata: d\n\n");
        assert_eq!(encoded(&SseEvent::data("")), "data: \n\n");
        assert_eq!(encoded(&SseEvent::data("x\n")), "data: x\ndata: \n\n");
        assert_eq!(encoded(&SseEvent::data(" lead")), "data:  lead\n\n");
    }

    #[test]
    fn fields_comments_and_retry() {
        let event = SseEvent::data("d")
            .with_event("e")
            .unwrap()
            .with_id("")
            .unwrap()
            .with_retry(Duration::from_millis(1500))
            .with_comment("two\nlines");
        assert_eq!(
            encoded(&event),
            ": two\n: lines\nevent: e\nid: \nretry: 1500\ndata: d\n\n"
        );
        assert_eq!(encoded(&SseEvent::comment("")), ":\n\n");
        assert_eq!(SseEvent::comment("x").kind(), Kind::Control);
        assert_eq!(SseEvent::data("x").hidden().kind(), Kind::Hidden);
        assert_eq!(SseEvent::data("[DONE]").control().kind(), Kind::Control);
    }

    #[test]
    fn injection_is_refused() {
        for bad in ["a\rb", "a\nb", "a\r\nb"] {
            assert_eq!(
                SseEvent::data("").with_event(bad).unwrap_err().field(),
                "event"
            );
            assert_eq!(SseEvent::data("").with_id(bad).unwrap_err().field(), "id");
        }
        let error = SseEvent::data("").with_id("a\0b").unwrap_err();
        assert_eq!(error.to_string(), "sse `id` field contains a NUL character");
        assert!(SseEvent::data("").with_event("a\0b").is_ok());
    }

    #[test]
    fn merge_concatenates_text_of_one_type() {
        let mut a = SseEvent::text("Hel").with_id("1").unwrap();
        a.merge(SseEvent::text("lo").with_id("2").unwrap()).unwrap();
        assert_eq!((a.data_str(), a.id()), (Some("Hello"), Some("2")));
        a.merge(SseEvent::text("!")).unwrap();
        assert_eq!((a.data_str(), a.id()), (Some("Hello!"), Some("2")));
        assert!(
            a.merge(SseEvent::text("x").with_event("other").unwrap())
                .is_err()
        );
        assert!(a.merge(SseEvent::text("x").hidden()).is_err());
        assert!(a.merge(SseEvent::comment("x")).is_err());
        assert!(a.merge(SseEvent::retry(Duration::from_secs(1))).is_err());
        let mut typed = SseEvent::text("a").with_event("message").unwrap();
        assert!(
            typed.merge(SseEvent::text("b")).is_ok(),
            "`message` is the default type"
        );
    }

    #[test]
    fn documents_never_merge() {
        let openai = |content: &str| {
            SseEvent::data(format!(
                r#"{{"choices":[{{"index":0,"delta":{{"content":"{content}"}}}}]}}"#
            ))
        };
        let mut a = openai("Hel");
        assert!(a.merge(openai("lo")).is_err(), "two JSON chunks stay two");
        assert!(a.merge(SseEvent::data("[DONE]")).is_err());
        // Text and data do not mix either way.
        assert!(a.merge(SseEvent::text("x")).is_err());
        assert!(SseEvent::text("x").merge(openai("y")).is_err());
        assert_eq!(a, openai("Hel"));
    }
}
