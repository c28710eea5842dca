//! Hop records from their JSON lines, through serde_json.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::error::Error;
use std::fmt;

use serde::Deserialize;

use crate::chunk::Kind;
use crate::end::EndReason;
use crate::probe::{
    HopRecord, MAX_ATTR_KEY, MAX_ATTR_VALUE, MAX_RECORD_ATTRS, MAX_RECORD_REQUEST, RecordKind, cut,
};

/// Why a line is not a hop record.
///
/// Its `Display` says what is wrong: JSON that does not parse (serde_json's message, with the
/// column), a missing or mistyped field, an unknown `kind`, `reason`/`idle_ns` missing from an
/// end record or present on another, a `reason` that is no [`EndReason`], a request id longer
/// than [`MAX_RECORD_REQUEST`](crate::probe::MAX_RECORD_REQUEST), `attrs` that is not an object
/// of strings or is past its limits.
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
    Reason(String),
    Attrs,
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
            ErrorKind::Reason(reason) => write!(f, "unknown end reason `{reason}`"),
            ErrorKind::Attrs => write!(
                f,
                "`attrs` past its limits ({MAX_RECORD_ATTRS} pairs, keys of {MAX_ATTR_KEY} \
                 bytes, values of {MAX_ATTR_VALUE})"
            ),
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
    #[serde(default, borrow)]
    reason: Option<Cow<'a, str>>,
    #[serde(default)]
    idle_ns: Option<u64>,
    #[serde(default)]
    busy_ns: Option<u64>,
    #[serde(default, borrow)]
    attrs: Option<BTreeMap<Cow<'a, str>, Cow<'a, str>>>,
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
    /// How long the hop's thread was busy within the gap this record ended (0: not told).
    pub(super) busy_ns: u64,
    /// The stream's attributes at the hop from this record on, when it carries them.
    pub(super) attrs: Option<BTreeMap<Cow<'a, str>, Cow<'a, str>>>,
}

/// Parses and checks one line (without its line break).
pub(super) fn parse(line: &[u8]) -> Result<Parsed<'_>, RecordError> {
    // serde would also take a struct written as an array: a record is an object.
    if line.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(RecordError::new(ErrorKind::NotAnObject));
    }
    let raw: Line<'_> =
        serde_json::from_slice(line).map_err(|e| RecordError::new(ErrorKind::Json(e)))?;
    check(&raw.request)?;
    let kind = kind(&raw.kind, raw.reason.as_deref(), raw.idle_ns)?;
    if let Some(attrs) = &raw.attrs {
        check_attrs(attrs.iter().map(|(key, value)| (&**key, &**value)))?;
    }
    Ok(Parsed {
        request: raw.request,
        hop: raw.hop,
        seq: raw.seq,
        t_ns: raw.t_ns,
        bytes: raw.bytes,
        kind,
        busy_ns: raw.busy_ns.unwrap_or(0),
        // An empty object changes nothing, as a record without one.
        attrs: raw.attrs.filter(|attrs| !attrs.is_empty()),
    })
}

/// What every record must satisfy beyond its types: a request id of at most
/// [`MAX_RECORD_REQUEST`] bytes.
pub(super) fn check(request: &str) -> Result<(), RecordError> {
    if request.len() > MAX_RECORD_REQUEST {
        return Err(RecordError::new(ErrorKind::RequestTooLong(request.len())));
    }
    Ok(())
}

/// What a record's attributes must satisfy: at most [`MAX_RECORD_ATTRS`] pairs, keys of at
/// most [`MAX_ATTR_KEY`] bytes and values of at most [`MAX_ATTR_VALUE`].
pub(super) fn check_attrs<'a>(
    attrs: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
) -> Result<(), RecordError> {
    let mut attrs = attrs;
    let too_many = attrs.len() > MAX_RECORD_ATTRS;
    if too_many
        || !attrs.all(|(key, value)| key.len() <= MAX_ATTR_KEY && value.len() <= MAX_ATTR_VALUE)
    {
        return Err(RecordError::new(ErrorKind::Attrs));
    }
    Ok(())
}

/// The record's kind from its `kind`, `reason` and `idle_ns` fields: an end record must have
/// both of the last two, any other record neither.
fn kind(name: &str, reason: Option<&str>, idle_ns: Option<u64>) -> Result<RecordKind, RecordError> {
    let event = match name {
        "visible" => Kind::Visible,
        "hidden" => Kind::Hidden,
        "control" => Kind::Control,
        "end" => {
            let reason = reason.ok_or(RecordError::new(ErrorKind::EndNeeds("reason")))?;
            let idle_ns = idle_ns.ok_or(RecordError::new(ErrorKind::EndNeeds("idle_ns")))?;
            let reason = reason
                .parse::<EndReason>()
                .map_err(|_| RecordError::new(ErrorKind::Reason(cut(reason, 32).to_owned())))?;
            return Ok(RecordKind::End { reason, idle_ns });
        }
        other => return Err(RecordError::new(ErrorKind::Kind(cut(other, 32).to_owned()))),
    };
    if reason.is_some() {
        return Err(RecordError::new(ErrorKind::OnlyEnd("reason")));
    }
    if idle_ns.is_some() {
        return Err(RecordError::new(ErrorKind::OnlyEnd("idle_ns")));
    }
    Ok(RecordKind::Event(event))
}

impl HopRecord {
    /// Parses one JSON line (without its line break) written by
    /// [`to_json_line`](HopRecord::to_json_line), or by a hop in another language.
    ///
    /// Fields beyond the record's are ignored, so writers may add some; a field given twice,
    /// a missing one, a `kind` that is not `visible`, `hidden`, `control` or `end`, an end
    /// record without `reason` and `idle_ns`, another record with them, a `reason` that is no
    /// [`EndReason`](crate::EndReason) or a request id longer than
    /// [`MAX_RECORD_REQUEST`](crate::probe::MAX_RECORD_REQUEST) is an error.
    ///
    /// # Errors
    ///
    /// A [`RecordError`] saying what is wrong.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::EndReason;
    /// use streamgate::probe::{HopRecord, RecordKind};
    ///
    /// let line = r#"{"request":"r1","hop":"client.recv","seq":7,"t_ns":5,"bytes":0,"kind":"end","reason":"consumer_gone","idle_ns":40000000000}"#;
    /// let record = HopRecord::parse_line(line)?;
    /// let idle_ns = 40_000_000_000;
    /// assert_eq!(record.kind, RecordKind::End { reason: EndReason::ConsumerGone, idle_ns });
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
        Ok(HopRecord {
            request: parsed.request.into_owned(),
            hop: parsed.hop.into_owned(),
            seq: parsed.seq,
            t_ns: parsed.t_ns,
            bytes: parsed.bytes,
            kind: parsed.kind,
            busy_ns: (parsed.busy_ns > 0).then_some(parsed.busy_ns),
            attrs: parsed
                .attrs
                .into_iter()
                .flatten()
                .map(|(key, value)| (key.into_owned(), value.into_owned()))
                .collect(),
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
            kind: RecordKind::Event(Kind::Hidden),
            busy_ns: Some(u64::MAX),
            attrs: vec![
                ("pool".into(), "a\"b".into()),
                ("upstream".into(), "http://[::1]:8000/v1".into()),
            ],
        };
        assert_eq!(
            HopRecord::parse_line(&record.to_json_line()).unwrap(),
            record
        );
        let end = HopRecord {
            kind: RecordKind::End {
                reason: EndReason::SlowConsumer,
                idle_ns: 0,
            },
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
            error(&base(r#","kind":"end","reason":"finished","idle_ns":4"#)),
            "unknown end reason `finished`"
        );
        assert_eq!(
            error(&base(r#","kind":"visible","reason":"completed""#)),
            "`reason` belongs only to end records"
        );
        assert_eq!(
            error(&base(r#","kind":"hidden","idle_ns":4"#)),
            "`idle_ns` belongs only to end records"
        );
        assert!(error(&base(r#","kind":"visible","attrs":{"n":1}"#)).contains("invalid type"));
        assert!(error(&base(r#","kind":"visible","attrs":["a"]"#)).contains("invalid type"));
        let many: Vec<String> = (0..=MAX_RECORD_ATTRS)
            .map(|i| format!(r#""k{i}":"v""#))
            .collect();
        let long_value = "v".repeat(MAX_ATTR_VALUE + 1);
        for attrs in [
            format!("{{{}}}", many.join(",")),
            format!(r#"{{"{}":"v"}}"#, "k".repeat(MAX_ATTR_KEY + 1)),
            format!(r#"{{"k":"{long_value}"}}"#),
        ] {
            let line = base(&format!(r#","kind":"visible","attrs":{attrs}"#));
            assert!(
                error(&line).starts_with("`attrs` past its limits"),
                "{line}"
            );
        }
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
