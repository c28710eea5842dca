//! What was wrong with the input: the first few examples, and a count of every kind.

use crate::probe::cut;

/// The longest problem message kept, in bytes (a message may quote the input).
const MAX_MESSAGE: usize = 240;

/// What kind of thing was wrong with the input.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamgate::timeline::{ProblemKind, Timeline};
///
/// let records = r#"{"request":"r1","hop":"gateway.write","seq":1,"t_ns":0,"bytes":3,"kind":"visible"}
/// {"request":"r1","hop":"gateway.write","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
/// {"request":"r1","hop":"gateway.rite","seq":2,"t_ns":0,"bytes":3,"kind":"visible"}"#;
/// // Without a reorder window, seq 0 arrives out of order beyond it.
/// let mut timeline = Timeline::new(["gateway.write"], Duration::from_secs(1)).reorder_window(0);
/// timeline.add_lines("gateway.jsonl", records);
/// let problems = timeline.diagnose().problems;
/// assert_eq!(problems.count(ProblemKind::OutOfOrder), 1);
/// assert_eq!(problems.count(ProblemKind::UnknownHop), 1);
/// // As reports and JSON name them, in the order they list them.
/// let named: Vec<String> = problems
///     .counts
///     .iter()
///     .map(|(kind, n)| format!("{} {n}", kind.as_str()))
///     .collect();
/// assert_eq!(named, ["unknown_hop 1", "out_of_order 1"]);
/// assert!(ProblemKind::ALL.iter().all(|kind| !kind.as_str().is_empty()));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ProblemKind {
    /// A line that is not a hop record: not JSON, a missing or mistyped field, an unknown
    /// kind, end fields on the wrong record, a request id too long. Skipped.
    BadRecord,
    /// A line longer than the line limit: skipped without being held whole.
    LongLine,
    /// A record of a hop that is not on the path. Skipped.
    UnknownHop,
    /// A record of a seq the hop already recorded for the request. Skipped.
    Duplicate,
    /// A record whose seq is below one the hop already took for the request: it arrived out
    /// of order beyond the [reorder window](super::Timeline::reorder_window). Skipped; every
    /// stall of the request at that hop, and every verdict that needs that hop, is unknown.
    /// (Also an end record not past the hop's last seq.)
    OutOfOrder,
    /// A record whose time is before the hop's previous one for the request. Skipped: never
    /// a gap of 584 years.
    TimeBackwards,
    /// An end record idle for longer than the hop's records allow (longer than its clock,
    /// or than the time since its last progress record): the idle time is cut to that.
    BadIdle,
    /// A record after the hop's end record for the request that cannot be a resumed stream
    /// (same source, and not later than the end). Skipped.
    AfterEnd,
    /// A record of a request beyond the request limit: not analysed.
    RequestLimit,
    /// A detail of a stream (a hole in its seqs, a hidden phase, a stall) beyond the detail
    /// budget: what depends on it is reported as unknown, and stalls of that stream past it
    /// are not analysed.
    DetailLimit,
    /// A source that could not be read, or stopped with an error.
    Unreadable,
}

impl ProblemKind {
    /// Every kind, in the order reports list them.
    pub const ALL: [ProblemKind; 11] = [
        ProblemKind::BadRecord,
        ProblemKind::LongLine,
        ProblemKind::UnknownHop,
        ProblemKind::Duplicate,
        ProblemKind::OutOfOrder,
        ProblemKind::TimeBackwards,
        ProblemKind::BadIdle,
        ProblemKind::AfterEnd,
        ProblemKind::RequestLimit,
        ProblemKind::DetailLimit,
        ProblemKind::Unreadable,
    ];

    /// Its name in reports and JSON: `bad_record`, `long_line`, `unknown_hop`, `duplicate`,
    /// `out_of_order`, `time_backwards`, `bad_idle`, `after_end`, `request_limit`,
    /// `detail_limit`, `unreadable`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::BadRecord => "bad_record",
            ProblemKind::LongLine => "long_line",
            ProblemKind::UnknownHop => "unknown_hop",
            ProblemKind::Duplicate => "duplicate",
            ProblemKind::OutOfOrder => "out_of_order",
            ProblemKind::TimeBackwards => "time_backwards",
            ProblemKind::BadIdle => "bad_idle",
            ProblemKind::AfterEnd => "after_end",
            ProblemKind::RequestLimit => "request_limit",
            ProblemKind::DetailLimit => "detail_limit",
            ProblemKind::Unreadable => "unreadable",
        }
    }

    fn index(self) -> usize {
        ProblemKind::ALL
            .iter()
            .position(|&kind| kind == self)
            .unwrap_or(0)
    }
}

/// Something wrong with the input, and where.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamgate::timeline::{ProblemKind, Timeline};
///
/// let records = r#"{"request":"r1","hop":"gateway.write","seq":1,"t_ns":0,"bytes":3,"kind":"visible"}
/// {"request":"r1","hop":"gateway.write","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
/// {"request":"r1","hop":"gateway.rite","seq":2,"t_ns":0,"bytes":3,"kind":"visible"}"#;
/// // Without a reorder window, seq 0 arrives out of order beyond it.
/// let mut timeline = Timeline::new(["gateway.write"], Duration::from_secs(1)).reorder_window(0);
/// timeline.add_lines("gateway.jsonl", records);
/// let problems = timeline.diagnose().problems;
/// let first = &problems.examples[0];
/// assert_eq!((first.source.as_str(), first.line), ("gateway.jsonl", Some(2)));
/// assert_eq!(first.kind, ProblemKind::OutOfOrder);
/// assert_eq!(
///     first.message,
///     "request `r1` at gateway.write: seq 0 after seq 1: out of order beyond the reorder window of 0 records"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Problem {
    /// The source (a file name, `-` for standard input).
    pub source: String,
    /// The 1-based line, when the problem is one line's.
    pub line: Option<u64>,
    /// What kind of problem.
    pub kind: ProblemKind,
    /// What is wrong (at most 240 bytes: a message may quote the input).
    pub message: String,
}

/// The problems found: the first few as examples, and how many of each kind in all.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamgate::timeline::{ProblemKind, Timeline};
///
/// let records = r#"{"request":"r1","hop":"gateway.write","seq":1,"t_ns":0,"bytes":3,"kind":"visible"}
/// {"request":"r1","hop":"gateway.write","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
/// {"request":"r1","hop":"gateway.rite","seq":2,"t_ns":0,"bytes":3,"kind":"visible"}"#;
/// // Without a reorder window, seq 0 arrives out of order beyond it.
/// let mut timeline = Timeline::new(["gateway.write"], Duration::from_secs(1)).reorder_window(0);
/// timeline.add_lines("gateway.jsonl", records);
/// let problems = timeline.diagnose().problems;
/// assert!(!problems.is_empty());
/// assert_eq!((problems.total, problems.examples.len()), (2, 2));
/// assert_eq!(problems.count(ProblemKind::BadRecord), 0);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Problems {
    /// The first problems found, up to
    /// [`Timeline::max_problems`](super::Timeline::max_problems), in the order found: a line's
    /// as it is read, a record's against its stream as it leaves the
    /// [reorder window](super::Timeline::reorder_window).
    pub examples: Vec<Problem>,
    /// How many of each kind in all (kinds with none left out), in [`ProblemKind::ALL`]'s order.
    pub counts: Vec<(ProblemKind, u64)>,
    /// How many in all.
    pub total: u64,
}

impl Problems {
    /// Whether the input had no problem at all.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// How many of `kind` were found.
    pub fn count(&self, kind: ProblemKind) -> u64 {
        self.counts
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0, |&(_, n)| n)
    }
}

/// Collects problems: keeps the first `max` and counts every one.
#[derive(Debug, Clone)]
pub(super) struct ProblemLog {
    examples: Vec<Problem>,
    max: usize,
    counts: [u64; ProblemKind::ALL.len()],
}

impl ProblemLog {
    pub(super) fn new(max: usize) -> Self {
        ProblemLog {
            examples: Vec::new(),
            max,
            counts: [0; ProblemKind::ALL.len()],
        }
    }

    pub(super) fn set_max(&mut self, max: usize) {
        self.max = max;
        self.examples.truncate(max);
    }

    /// Counts a problem; builds its message only when it is kept as an example.
    pub(super) fn add(
        &mut self,
        kind: ProblemKind,
        source: &str,
        line: Option<u64>,
        message: impl FnOnce() -> String,
    ) {
        let count = &mut self.counts[kind.index()];
        *count = count.saturating_add(1);
        if self.examples.len() < self.max {
            let message = message();
            self.examples.push(Problem {
                source: cut(source, MAX_MESSAGE).to_owned(),
                line,
                kind,
                message: cut(&message, MAX_MESSAGE).to_owned(),
            });
        }
    }

    pub(super) fn summary(&self) -> Problems {
        let counts: Vec<(ProblemKind, u64)> = ProblemKind::ALL
            .iter()
            .zip(self.counts)
            .filter(|(_, n)| *n > 0)
            .map(|(&kind, n)| (kind, n))
            .collect();
        Problems {
            examples: self.examples.clone(),
            total: counts
                .iter()
                .fold(0u64, |sum, (_, n)| sum.saturating_add(*n)),
            counts,
        }
    }
}
