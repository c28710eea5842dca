//! Hop records from their JSON lines, through serde_json.

use std::borrow::Cow;
use std::error::Error;
use std::fmt;

use serde::Deserialize;

use crate::probe::{HopRecord, MAX_RECORD_REQUEST, RecordKind};

/// The longest end reason a record may carry, in bytes (the crate's are under 20).
pub(super) const MAX_REASON: usize = 64;

/// Why a line is not a hop record.
///
/// Its `Display` says what is wrong: JSON that does not parse (serde_json's message, with the
/// column), a missing or mistyped field, an unknown `kind`, `reason`/`idle_ns` missing from an
/// end record or present on another, a request id longer than
/// [`MAX_RECORD_REQUEST`](crate::probe::MAX_RECORD_REQUEST).
#[derive(Debug)]
pub struct RecordError {
    kind: ErrorKind,
}

#[derive(Debug)]
enum ErrorKind {
    NotAnObject,
    Json(serde_json::Error),
    Kind(String),
    EndNeeds(&'static str),
    OnlyEnd(&'static str),
    RequestTooLong(usize),
    ReasonTooLong(usize),
}

impl RecordError {
    fn new(kind: ErrorKind) -> Self {
        RecordError { kind }
    }
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::NotAnObject => f.write_str("not a hop record: not a JSON object"),
            ErrorKind::Json(error) => write!(f, "not a hop record: {error}"),
            ErrorKind::Kind(kind) => {
                write!(f, "unknown kind `{kind}` (visible, hidden, control or end)")
            }
            ErrorKind::EndNeeds(field) => write!(f, "an end record needs `{field}`"),
            ErrorKind::OnlyEnd(field) => write!(f, "`{field}` belongs only to end records"),
            ErrorKind::RequestTooLong(len) => write!(
                f,
                "request id of {len} bytes (at most {MAX_RECORD_REQUEST})"
            ),
            ErrorKind::ReasonTooLong(len) => {
                write!(f, "end reason of {len} bytes (at most {MAX_REASON})")
            }
        }
    }
}

impl Error for RecordError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match &self.kind {
            ErrorKind::Json(error) => Some(error),
            _ => None,
        }
    }
}

/// The line as serde sees it: names borrowed from the line unless they hold escapes. Fields
/// other than these are ignored, so that a newer writer (or a hop in another language) may
/// add some.
#[derive(Deserialize)]
struct Line<'a> {
    #[serde(borrow)]
    request: Cow<'a, str>,
    #[serde(borrow)]
    hop: Cow<'a, str>,
    seq: u64,
    t_ns: u64,
    bytes: u64,
    #[serde(borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    idle_ns: Option<u64>,
}

/// A checked record, its names borrowed from the line where they can be.
#[derive(Debug)]
pub(super) struct Parsed<'a> {
    pub(super) request: Cow<'a, str>,
    pub(super) hop: Cow<'a, str>,
    pub(super) seq: u64,
    pub(super) t_ns: u64,
    pub(super) bytes: u64,
    pub(super) kind: RecordKind,
    /// For an end record: the reason and the idle time.
    pub(super) end: Option<(String, u64)>,
}

/// Parses and checks one line (without its line break).
pub(super) fn parse(line: &[u8]) -> Result<Parsed<'_>, RecordError> {
    // serde would also take a struct written as an array: a record is an object.
    if line.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(RecordError::new(ErrorKind::NotAnObject));
    }
    let raw: Line<'_> =
        serde_json::from_slice(line).map_err(|e| RecordError::new(ErrorKind::Json(e)))?;
    let kind = RecordKind::from_name(&raw.kind)
        .ok_or_else(|| RecordError::new(ErrorKind::Kind(cut(&raw.kind, 32).to_owned())))?;
    check(&raw.request, kind, raw.reason.as_deref(), raw.idle_ns)?;
    Ok(Parsed {
        request: raw.request,
        hop: raw.hop,
        seq: raw.seq,
        t_ns: raw.t_ns,
        bytes: raw.bytes,
        kind,
        end: raw.reason.zip(raw.idle_ns),
    })
}

/// What every record must satisfy beyond its types.
pub(super) fn check(
    request: &str,
    kind: RecordKind,
    reason: Option<&str>,
    idle_ns: Option<u64>,
) -> Result<(), RecordError> {
    if request.len() > MAX_RECORD_REQUEST {
        return Err(RecordError::new(ErrorKind::RequestTooLong(request.len())));
    }
    if kind == RecordKind::End {
        let reason = reason.ok_or(RecordError::new(ErrorKind::EndNeeds("reason")))?;
        if idle_ns.is_none() {
            return Err(RecordError::new(ErrorKind::EndNeeds("idle_ns")));
        }
        if reason.len() > MAX_REASON {
            return Err(RecordError::new(ErrorKind::ReasonTooLong(reason.len())));
        }
    } else if reason.is_some() {
        return Err(RecordError::new(ErrorKind::OnlyEnd("reason")));
    } else if idle_ns.is_some() {
        return Err(RecordError::new(ErrorKind::OnlyEnd("idle_ns")));
    }
    Ok(())
}

/// `text` cut to at most `max` bytes, at a character boundary.
pub(super) fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl HopRecord {
    /// Parses one JSON line (without its line break) written by
    /// [`to_json_line`](HopRecord::to_json_line), or by a hop in another language.
    ///
    /// Fields beyond the record's are ignored, so writers may add some; a field given twice,
    /// a missing one, a `kind` that is not `visible`, `hidden`, `control` or `end`, an end
    /// record without `reason` and `idle_ns`, another record with them, a request id longer
    /// than [`MAX_RECORD_REQUEST`](crate::probe::MAX_RECORD_REQUEST) or an end reason longer
    /// than 64 bytes is an error.
    ///
    /// # Errors
    ///
    /// A [`RecordError`] saying what is wrong.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::probe::{HopRecord, RecordKind};
    ///
    /// let line = r#"{"request":"r1","hop":"client.recv","seq":7,"t_ns":5,"bytes":0,"kind":"end","reason":"consumer_gone","idle_ns":40000000000}"#;
    /// let record = HopRecord::parse_line(line)?;
    /// assert_eq!(record.kind, RecordKind::End);
    /// assert_eq!(record.idle_ns, Some(40_000_000_000));
    /// assert_eq!(record.to_json_line(), line);
    ///
    /// let error = HopRecord::parse_line(r#"{"request":"r1","hop":"h","seq":7,"t_ns":5,"bytes":0,"kind":"end"}"#)
    ///     .unwrap_err();
    /// assert_eq!(error.to_string(), "an end record needs `reason`");
    /// # Ok::<(), streamgate::timeline::RecordError>(())
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "timeline")))]
    pub fn parse_line(line: &str) -> Result<HopRecord, RecordError> {
        let parsed = parse(line.as_bytes())?;
        let (reason, idle_ns) = match parsed.end {
            Some((reason, idle)) => (Some(reason), Some(idle)),
            None => (None, None),
        };
        Ok(HopRecord {
            request: parsed.request.into_owned(),
            hop: parsed.hop.into_owned(),
            seq: parsed.seq,
            t_ns: parsed.t_ns,
            bytes: parsed.bytes,
            kind: parsed.kind,
            reason,
            idle_ns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(line: &str) -> String {
        HopRecord::parse_line(line).unwrap_err().to_string()
    }

    #[test]
    fn records_round_trip_with_escapes_and_extremes() {
        let record = HopRecord {
            request: "req \"1\"\n\u{1}é".into(),
            hop: "gateway.recv".into(),
            seq: u64::MAX,
            t_ns: u64::MAX,
            bytes: u64::MAX,
            kind: RecordKind::Hidden,
            reason: None,
            idle_ns: None,
        };
        assert_eq!(
            HopRecord::parse_line(&record.to_json_line()).unwrap(),
            record
        );
        let end = HopRecord {
            kind: RecordKind::End,
            reason: Some("slow_consumer".into()),
            idle_ns: Some(0),
            ..record
        };
        assert_eq!(HopRecord::parse_line(&end.to_json_line()).unwrap(), end);
    }

    #[test]
    fn unknown_fields_are_ignored_and_duplicates_refused() {
        let line = r#"{"trace":"x","request":"r","hop":"h","seq":1,"t_ns":2,"bytes":3,"kind":"visible","extra":[1,{"a":null}]}"#;
        assert_eq!(HopRecord::parse_line(line).unwrap().seq, 1);
        let twice =
            r#"{"request":"r","hop":"h","seq":1,"seq":2,"t_ns":2,"bytes":3,"kind":"visible"}"#;
        assert!(
            error(twice).contains("duplicate field `seq`"),
            "{}",
            error(twice)
        );
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let base =
            |rest: &str| format!(r#"{{"request":"r","hop":"h","seq":1,"t_ns":2,"bytes":3{rest}}}"#);
        assert!(error(&base("")).contains("missing field `kind`"));
        assert_eq!(
            error(&base(r#","kind":"loud""#)),
            "unknown kind `loud` (visible, hidden, control or end)"
        );
        assert_eq!(
            error(&base(r#","kind":"end","reason":"completed""#)),
            "an end record needs `idle_ns`"
        );
        assert_eq!(
            error(&base(r#","kind":"visible","reason":"completed""#)),
            "`reason` belongs only to end records"
        );
        assert_eq!(
            error(&base(r#","kind":"hidden","idle_ns":4"#)),
            "`idle_ns` belongs only to end records"
        );
        assert!(
            error(r#"{"request":"r","hop":"h","seq":-1,"t_ns":2,"bytes":3,"kind":"visible"}"#)
                .contains("invalid value")
        );
        assert!(error(r#"{"request":"r","hop":"h","seq":18446744073709551616,"t_ns":2,"bytes":3,"kind":"visible"}"#)
            .starts_with("not a hop record"));
        assert_eq!(
            error(r#"["r","h",1,2,3,"visible"]"#),
            "not a hop record: not a JSON object"
        );
        assert!(error(r#"{"request":"r","hop":"h","seq":1,"t_ns""#).contains("EOF"));
        let long = "x".repeat(MAX_RECORD_REQUEST + 1);
        assert_eq!(
            error(&format!(
                r#"{{"request":"{long}","hop":"h","seq":1,"t_ns":2,"bytes":3,"kind":"visible"}}"#
            )),
            format!(
                "request id of {} bytes (at most {MAX_RECORD_REQUEST})",
                MAX_RECORD_REQUEST + 1
            )
        );
        let kind = "é".repeat(40);
        assert_eq!(
            error(&base(&format!(r#","kind":"{kind}""#))),
            format!(
                "unknown kind `{}` (visible, hidden, control or end)",
                "é".repeat(16)
            )
        );
    }

    #[test]
    fn invalid_utf8_is_an_error_not_a_panic() {
        let line = b"{\"request\":\"\xff\",\"hop\":\"h\",\"seq\":1,\"t_ns\":2,\"bytes\":3,\"kind\":\"visible\"}";
        assert!(
            parse(line)
                .unwrap_err()
                .to_string()
                .starts_with("not a hop record")
        );
    }
}
