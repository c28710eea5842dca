//! A page's batch of records (`POST /streamgate/hop-records`), from its JSON body, checked.

use std::fmt;

use serde::Deserialize;

use crate::chunk::Kind;
use crate::end::EndReason;
use crate::probe::{MAX_RECORD_REQUEST, RecordKind};

/// The page's hop where an event was parsed from the network.
pub const CLIENT_RECV: &str = "client.recv";
/// The page's hop where the app had handled an event and the next frame was painted.
pub const CLIENT_RENDER: &str = "client.render";
/// The largest batch taken, in bytes.
pub const MAX_POST_BYTES: usize = 64 * 1024;
/// The most records in one batch.
pub const MAX_POST_RECORDS: usize = 256;

/// The body as the page wrote it.
#[derive(Deserialize)]
struct Body {
    request: String,
    token: String,
    records: Vec<Record>,
}

#[derive(Deserialize)]
struct Record {
    hop: String,
    seq: u64,
    t_ns: u64,
    bytes: u64,
    kind: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    idle_ns: Option<u64>,
    #[serde(default)]
    busy_ns: Option<u64>,
}

/// A checked batch: one request's records at the page's hops.
#[derive(Debug)]
pub(super) struct Post {
    pub(super) request: String,
    pub(super) token: String,
    pub(super) records: Vec<Posted>,
}

/// One checked record.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Posted {
    /// `client.recv` (false) or `client.render` (true).
    pub(super) render: bool,
    pub(super) seq: u64,
    pub(super) t_ns: u64,
    pub(super) bytes: u64,
    pub(super) kind: RecordKind,
    /// 0 when the page told none.
    pub(super) busy_ns: u64,
}

/// What is wrong with a body.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Malformed(pub(super) String);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parses and checks a body: a request id within the records' limit, at most
/// [`MAX_POST_RECORDS`] records, each at a page hop, of a known kind, an end with its reason
/// and idle time, `busy_ns` only at `client.render`.
pub(super) fn parse(body: &[u8]) -> Result<Post, Malformed> {
    let body: Body = serde_json::from_slice(body).map_err(|error| Malformed(error.to_string()))?;
    if body.request.is_empty() || body.request.len() > MAX_RECORD_REQUEST {
        return Err(Malformed(format!(
            "a request id of {} bytes (1 to {MAX_RECORD_REQUEST})",
            body.request.len()
        )));
    }
    if body.records.len() > MAX_POST_RECORDS {
        return Err(Malformed(format!(
            "{} records (at most {MAX_POST_RECORDS} a batch)",
            body.records.len()
        )));
    }
    let records = body
        .records
        .into_iter()
        .enumerate()
        .map(|(n, record)| check(record).map_err(|why| Malformed(format!("record {n}: {why}"))))
        .collect::<Result<_, _>>()?;
    Ok(Post {
        request: body.request,
        token: body.token,
        records,
    })
}

fn check(record: Record) -> Result<Posted, String> {
    let render = match record.hop.as_str() {
        CLIENT_RECV => false,
        CLIENT_RENDER => true,
        other => {
            let other = crate::probe::cut(other, 64);
            return Err(format!(
                "hop `{other}` (a page writes {CLIENT_RECV} and {CLIENT_RENDER})"
            ));
        }
    };
    let kind = match (record.kind.as_str(), record.reason, record.idle_ns) {
        ("end", Some(reason), Some(idle_ns)) => RecordKind::End {
            reason: reason
                .parse::<EndReason>()
                .map_err(|_| format!("unknown end reason `{}`", crate::probe::cut(&reason, 64)))?,
            idle_ns,
        },
        ("end", _, _) => return Err("an end record needs `reason` and `idle_ns`".into()),
        (_, Some(_), _) | (_, _, Some(_)) => {
            return Err("`reason` and `idle_ns` belong only to end records".into());
        }
        ("visible", ..) => RecordKind::Event(Kind::Visible),
        ("hidden", ..) => RecordKind::Event(Kind::Hidden),
        ("control", ..) => RecordKind::Event(Kind::Control),
        (other, ..) => {
            let other = crate::probe::cut(other, 64);
            return Err(format!("unknown kind `{other}`"));
        }
    };
    if record.busy_ns.is_some() && !render {
        return Err(format!("`busy_ns` belongs only to {CLIENT_RENDER} records"));
    }
    Ok(Posted {
        render,
        seq: record.seq,
        t_ns: record.t_ns,
        bytes: record.bytes,
        kind,
        busy_ns: record.busy_ns.unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_of_page_records_parses() {
        let post = parse(
            br#"{"request":"r1","token":"t","records":[
                {"hop":"client.recv","seq":3,"t_ns":10,"bytes":4,"kind":"visible"},
                {"hop":"client.render","seq":3,"t_ns":20,"bytes":4,"kind":"visible","busy_ns":7},
                {"hop":"client.recv","seq":4,"t_ns":30,"bytes":0,"kind":"end","reason":"completed","idle_ns":5}
            ]}"#,
        )
        .unwrap();
        assert_eq!((post.request.as_str(), post.token.as_str()), ("r1", "t"));
        assert_eq!(post.records.len(), 3);
        assert!(post.records[1].render && post.records[1].busy_ns == 7);
        assert_eq!(
            post.records[2].kind,
            RecordKind::End {
                reason: EndReason::Completed,
                idle_ns: 5
            }
        );
    }

    #[test]
    fn a_page_writes_only_its_own_hops_and_well_formed_records() {
        let one = |record: &str| {
            parse(format!(r#"{{"request":"r1","token":"t","records":[{record}]}}"#).as_bytes())
        };
        for (record, why) in [
            (
                r#"{"hop":"proxy.write","seq":0,"t_ns":0,"bytes":0,"kind":"visible"}"#,
                "hop `proxy.write`",
            ),
            (
                r#"{"hop":"client.recv","seq":0,"t_ns":0,"bytes":0,"kind":"shown"}"#,
                "unknown kind",
            ),
            (
                r#"{"hop":"client.recv","seq":0,"t_ns":0,"bytes":0,"kind":"end"}"#,
                "needs `reason`",
            ),
            (
                r#"{"hop":"client.recv","seq":0,"t_ns":0,"bytes":0,"kind":"end","reason":"bored","idle_ns":0}"#,
                "unknown end reason",
            ),
            (
                r#"{"hop":"client.recv","seq":0,"t_ns":0,"bytes":0,"kind":"visible","idle_ns":0}"#,
                "only to end records",
            ),
            (
                r#"{"hop":"client.recv","seq":0,"t_ns":0,"bytes":0,"kind":"visible","busy_ns":1}"#,
                "only to client.render",
            ),
            (
                r#"{"hop":"client.recv","seq":-1,"t_ns":0,"bytes":0,"kind":"visible"}"#,
                "invalid value",
            ),
        ] {
            let error = one(record).unwrap_err();
            assert!(error.0.contains(why), "{record}: {error}");
        }
        let long = "x".repeat(MAX_RECORD_REQUEST + 1);
        let error = parse(format!(r#"{{"request":"{long}","token":"t","records":[]}}"#).as_bytes())
            .unwrap_err();
        assert!(error.0.contains("request id of"), "{error}");
        let many = vec![
            r#"{"hop":"client.recv","seq":0,"t_ns":0,"bytes":0,"kind":"visible"}"#;
            MAX_POST_RECORDS + 1
        ]
        .join(",");
        let error =
            parse(format!(r#"{{"request":"r","token":"t","records":[{many}]}}"#).as_bytes())
                .unwrap_err();
        assert!(error.0.contains("records (at most"), "{error}");
        assert!(parse(b"not json").is_err());
    }
}
