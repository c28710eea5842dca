//! A stream's keys, and the entries of its log.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use crate::chunk::Kind;
use crate::end::EndReason;
use crate::sse::SseFrame;

/// The Redis keys of one stream.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) log: String,
    pub(crate) meta: String,
    pub(crate) readers: String,
    pub(crate) positions: String,
    pub(crate) cut: String,
}

impl Keys {
    pub(crate) fn new(id: &str) -> Self {
        Keys {
            log: format!("streamgate:{{{id}}}:log"),
            meta: format!("streamgate:{{{id}}}:meta"),
            readers: format!("streamgate:{{{id}}}:readers"),
            positions: format!("streamgate:{{{id}}}:positions"),
            cut: format!("streamgate:{{{id}}}:cut"),
        }
    }

    /// Every key: the meta key first, then the log (as the scripts that take them all expect).
    pub(crate) fn all(&self) -> [&str; 5] {
        [
            &self.meta,
            &self.log,
            &self.readers,
            &self.positions,
            &self.cut,
        ]
    }
}

/// The key of a stream's second name `alias`, whose value is the stream's id.
pub(crate) fn alias_key(alias: &str) -> String {
    format!("streamgate:alias:{{{alias}}}")
}

/// The field of a stream's meta key that says it has the second name `alias`.
pub(crate) fn alias_field(alias: &str) -> String {
    format!("alias:{alias}")
}

/// Log entries as `XRANGE` returns them: each id, with its fields and values in turn.
pub(crate) type Entries = Vec<(String, Vec<Vec<u8>>)>;

/// A log entry's id: event `n` is `(n, 1)`; what follows the last event counts up its second
/// part.
pub(crate) type EntryId = (u64, u64);

pub(crate) fn format_id((ms, seq): EntryId) -> String {
    format!("{ms}-{seq}")
}

pub(crate) fn parse_id(id: &str) -> Option<EntryId> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// The `k` field of the end marker; a frame's is its kind ([`Kind::as_str`]), and a terminal
/// frame's `e` field its end reason.
pub(crate) const END: &str = "end";

/// What a log entry holds.
pub(crate) enum LogEntry {
    Frame(SseFrame),
    End,
}

/// The entry `id` with `fields` (`k` and, for a frame, `f`), or `None` if it is not one of ours.
pub(crate) fn parse_entry(id: EntryId, fields: &[Vec<u8>]) -> Option<LogEntry> {
    let field = |name: &[u8]| {
        fields
            .chunks_exact(2)
            .find(|pair| pair[0] == name)
            .map(|pair| &pair[1])
    };
    let kind = field(b"k")?.as_slice();
    if kind == END.as_bytes() {
        return Some(LogEntry::End);
    }
    let kind = [Kind::Visible, Kind::Hidden, Kind::Control]
        .into_iter()
        .find(|known| known.as_str().as_bytes() == kind)?;
    let bytes = Bytes::copy_from_slice(field(b"f")?);
    let event = (id.1 == 1).then_some(id.0);
    let frame = SseFrame::new(bytes, kind, event);
    // A terminal frame's end reason, when it is one of the crate's.
    let reason =
        field(b"e").and_then(|reason| std::str::from_utf8(reason).ok()?.parse::<EndReason>().ok());
    Some(LogEntry::Frame(match reason {
        Some(reason) => frame.ending(reason),
        None => frame,
    }))
}

/// The wall clock in Unix milliseconds: leases are compared across instances, whose clocks
/// are taken to agree within a fraction of [`LEASE`](super::timing::LEASE).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis)
}

pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
