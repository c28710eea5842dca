//! Hop records: one JSON line per observed event, for timeline analysis across processes.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::Instant;

use crate::chunk::Kind;
use crate::end::EndReason;

/// What a hop record marks: an event of some kind, or the stream's end at that hop.
///
/// # Examples
///
/// ```
/// use streamgate::probe::RecordKind;
/// use streamgate::{EndReason, Kind};
///
/// let event = RecordKind::from(Kind::Hidden);
/// assert_eq!((event.as_str(), event.end()), ("hidden", None));
///
/// let end = RecordKind::End { reason: EndReason::ConsumerGone, idle_ns: 40_000_000_000 };
/// assert_eq!(end.as_str(), "end");
/// assert_eq!(end.end(), Some((EndReason::ConsumerGone, 40_000_000_000)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// An event, with how it counts for progress.
    Event(Kind),
    /// The stream's end at this hop.
    End {
        /// Why it ended.
        reason: EndReason,
        /// Nanoseconds since the hop's last visible or hidden event, or since the stream began
        /// at the hop when it saw none.
        idle_ns: u64,
    },
}

impl RecordKind {
    /// The name in a record's `kind` field: `visible`, `hidden`, `control`, `end`.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::Event(kind) => kind.as_str(),
            RecordKind::End { .. } => "end",
        }
    }

    /// The end's reason and idle time, for an end record.
    pub fn end(self) -> Option<(EndReason, u64)> {
        match self {
            RecordKind::End { reason, idle_ns } => Some((reason, idle_ns)),
            RecordKind::Event(_) => None,
        }
    }
}

impl From<Kind> for RecordKind {
    fn from(kind: Kind) -> Self {
        RecordKind::Event(kind)
    }
}

/// The longest request id a hop record (or a probe's span) copies, in bytes: a longer one is
/// cut at a character boundary, so a hostile `x-request-id` cannot multiply the records' size.
pub const MAX_RECORD_REQUEST: usize = 128;

/// One event, or the stream's end, as one hop saw it. No payload: only where, which event,
/// when, how big, what kind.
///
/// Its JSON line has exactly these fields, so that hops written in other languages (a browser
/// client) can produce them too:
///
/// ```text
/// {"request":"<id>","hop":"<name>","seq":<u64>,"t_ns":<u64>,"bytes":<u64>,"kind":"visible"|"hidden"|"control"}
/// {"request":"<id>","hop":"<name>","seq":<u64>,"t_ns":<u64>,"bytes":0,"kind":"end","reason":"<end reason>","idle_ns":<u64>}
/// ```
///
/// and, on the record where a stream's attributes at the hop were set or changed, an
/// `"attrs":{"<key>":"<value>",...}` object (string values, at most [`MAX_RECORD_ATTRS`] pairs,
/// keys of at most [`MAX_ATTR_KEY`] bytes and values of at most [`MAX_ATTR_VALUE`]): what the
/// hop knows of the stream from that record on, until a later record carries others (a proxy
/// names the `upstream` that serves its events, and names the next one after a failover). They
/// travel once per change, not on every record.
///
/// `t_ns` is on the writing process's monotonic clock: comparable only with other records of
/// the same hop and process, which is all the timeline analysis ever does.
///
/// `seq` is the event id: the position of the event's (last) chunk in the generator's output,
/// which the gate counts at `send` ([`Event::id`](crate::Event::id)) and the SSE encoder writes
/// as `id:`. A hop in another language records the SSE `id` it received (a browser's
/// `MessageEvent.lastEventId`), so every hop numbers the same event the same way; a coalesced
/// event is recorded under its last id. The kind travels in a `:hidden` or `:control`
/// comment line before a non-visible event's fields.
///
/// An end record's `seq` is one past the last event the hop numbered, its `reason` is an
/// [`EndReason`]'s name, and its `idle_ns` is how long the hop had then been
/// without a visible or hidden event (since the stream began at the hop, when it saw none),
/// so a freeze that ended the stream is visible even when no event followed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HopRecord {
    /// The request id the stream belongs to (at most [`MAX_RECORD_REQUEST`] bytes).
    pub request: String,
    /// The hop's name, e.g. `gateway.recv`.
    pub hop: String,
    /// The event id: the position of the event's (last) chunk in its stream's output.
    pub seq: u64,
    /// When the hop saw it, in nanoseconds on the process's monotonic clock.
    pub t_ns: u64,
    /// Its size in bytes, as the hop saw it: a frame's encoded bytes at a probe on frames, a
    /// decoded event's data at a probe on decoded events.
    pub bytes: u64,
    /// How it counts for progress, or that (and why) the stream ended here.
    pub kind: RecordKind,
    /// How long the hop's thread was busy (running, not waiting) within the gap this record
    /// ended, when the hop can tell: a page's long animation frames at `client.render`
    /// (written as `busy_ns`, only when given).
    pub busy_ns: Option<u64>,
    /// The stream's attributes at the hop from this record on, when they were set or changed
    /// with it (empty: as before).
    pub attrs: Vec<(String, String)>,
}

impl HopRecord {
    /// The record's JSON line, without the line break.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::probe::{HopRecord, RecordKind};
    /// use streamgate::{EndReason, Kind};
    ///
    /// let mut record = HopRecord {
    ///     request: "req-1".into(),
    ///     hop: "client.recv".into(),
    ///     seq: 7,
    ///     t_ns: 1_500_000,
    ///     bytes: 12,
    ///     kind: RecordKind::Event(Kind::Visible),
    ///     busy_ns: None,
    ///     attrs: Vec::new(),
    /// };
    /// assert_eq!(
    ///     record.to_json_line(),
    ///     r#"{"request":"req-1","hop":"client.recv","seq":7,"t_ns":1500000,"bytes":12,"kind":"visible"}"#
    /// );
    ///
    /// record.seq = 8;
    /// record.bytes = 0;
    /// record.kind = RecordKind::End { reason: EndReason::Completed, idle_ns: 20_000 };
    /// let end = r#""seq":8,"t_ns":1500000,"bytes":0,"kind":"end","reason":"completed","idle_ns":20000}"#;
    /// assert!(record.to_json_line().ends_with(end));
    ///
    /// record.attrs = vec![("upstream".into(), "http://10.0.0.2:8000".into())];
    /// assert!(record.to_json_line().ends_with(r#""attrs":{"upstream":"http://10.0.0.2:8000"}}"#));
    /// ```
    pub fn to_json_line(&self) -> String {
        let mut line = String::with_capacity(112 + self.request.len() + self.hop.len());
        let attrs = encode_attrs(self.attrs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let record = Line {
            request: &self.request,
            hop: &self.hop,
            seq: self.seq,
            t_ns: self.t_ns,
            bytes: self.bytes,
            kind: self.kind,
            busy_ns: self.busy_ns.unwrap_or(0),
            attrs: &attrs,
        };
        record.write(&mut line);
        line
    }
}

/// Nanoseconds since this process's monotonic epoch (the first time any probe asked).
pub(crate) fn monotonic_ns(at: Instant) -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(at.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

/// The most attribute pairs a hop record carries; more are left out.
pub const MAX_RECORD_ATTRS: usize = 8;
/// The longest attribute key a hop record carries, in bytes (a longer one is cut at a
/// character boundary).
pub const MAX_ATTR_KEY: usize = 32;
/// The longest attribute value a hop record carries, in bytes (a longer one is cut at a
/// character boundary).
pub const MAX_ATTR_VALUE: usize = 128;

/// `attrs` as a record's `attrs` object text, within the limits (empty when there are none).
pub(crate) fn encode_attrs<'a>(attrs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (n, (key, value)) in attrs.into_iter().take(MAX_RECORD_ATTRS).enumerate() {
        out.push(if n == 0 { '{' } else { ',' });
        json_string(&mut out, cut(key, MAX_ATTR_KEY));
        out.push(':');
        json_string(&mut out, cut(value, MAX_ATTR_VALUE));
    }
    if !out.is_empty() {
        out.push('}');
    }
    out
}

/// `text` cut to at most `max` bytes, at a character boundary.
pub(crate) fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// One record's fields, to write as its JSON line; `busy_ns` is 0 when the hop told none, and
/// `attrs` is an `attrs` object's text ([`encode_attrs`]), empty for none.
pub(super) struct Line<'a> {
    pub(super) request: &'a str,
    pub(super) hop: &'a str,
    pub(super) seq: u64,
    pub(super) t_ns: u64,
    pub(super) bytes: u64,
    pub(super) kind: RecordKind,
    pub(super) busy_ns: u64,
    pub(super) attrs: &'a str,
}

impl Line<'_> {
    /// Writes the JSON line (without the line break) to `out`.
    pub(super) fn write(&self, out: &mut String) {
        out.push_str("{\"request\":");
        json_string(out, self.request);
        out.push_str(",\"hop\":");
        json_string(out, self.hop);
        let _ = write!(
            out,
            ",\"seq\":{},\"t_ns\":{},\"bytes\":{},\"kind\":\"{}\"",
            self.seq,
            self.t_ns,
            self.bytes,
            self.kind.as_str()
        );
        if let Some((reason, idle_ns)) = self.kind.end() {
            let _ = write!(out, ",\"reason\":\"{reason}\",\"idle_ns\":{idle_ns}");
        }
        if self.busy_ns > 0 {
            let _ = write!(out, ",\"busy_ns\":{}", self.busy_ns);
        }
        if !self.attrs.is_empty() {
            out.push_str(",\"attrs\":");
            out.push_str(self.attrs);
        }
        out.push('}');
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_escape_the_request_and_carry_the_end_reason() {
        let record = HopRecord {
            request: "req \"1\"\n\u{1}é".into(),
            hop: "gateway.recv".into(),
            seq: 42,
            t_ns: u64::MAX,
            bytes: 0,
            kind: RecordKind::End {
                reason: EndReason::ConsumerGone,
                idle_ns: 40_000_000_000,
            },
            busy_ns: None,
            attrs: Vec::new(),
        };
        assert_eq!(
            record.to_json_line(),
            r#"{"request":"req \"1\"\n\u0001é","hop":"gateway.recv","seq":42,"t_ns":18446744073709551615,"bytes":0,"kind":"end","reason":"consumer_gone","idle_ns":40000000000}"#
        );
    }

    #[test]
    fn attrs_keep_their_limits() {
        let long = "é".repeat(200);
        let many: Vec<(String, String)> = (0..20)
            .map(|i| (format!("{i}{long}"), format!("\"{long}")))
            .collect();
        let text = encode_attrs(many.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let attrs: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&text).expect("a JSON object");
        assert_eq!(attrs.len(), MAX_RECORD_ATTRS);
        for (key, value) in &attrs {
            let value = value.as_str().expect("a string");
            assert!(key.len() <= MAX_ATTR_KEY, "{key}");
            assert!(
                value.len() <= MAX_ATTR_VALUE && value.starts_with('"'),
                "{value}"
            );
        }
        assert_eq!(encode_attrs([]), "");
    }
}
