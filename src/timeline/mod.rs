//! Timeline analysis: the hop each stall began at, from the hop records of several processes,
//! in bounded memory.
//!
//! Give a [`Timeline`] the hops in path order (`worker.publish`, `gateway.recv`,
//! `gateway.write`, `client.recv`) and the hop records each wrote ([`HopRecord`] JSON lines,
//! from files, directories or standard input, in any order of files). It reads them as a
//! stream, keeps a small state per request and hop, and after the last record names, for
//! every stall, the hop where it began.
//!
//! # The rule
//!
//! Everything is measured per request, per hop, **on that hop's clock only**: times of
//! different hops (processes, machines) are never subtracted, so clock offsets cannot matter.
//!
//! - *Progress* records are the visible and hidden ones (control records are housekeeping).
//!   A **quiet spell** at a hop is the time between two consecutive progress records, and the
//!   trailing one is the end record's `idle_ns`: the time from the last progress to the end.
//!   That is how a freeze the stream ends in (a user who leaves after 40 s of nothing) is seen.
//! - A **stall** at hop H is a quiet spell at or above the threshold, spanning the events from
//!   `after` (the previous progress record's seq, or the start) to `seq` (the progress record
//!   that ended it, or the end).
//! - For each stall at H, spanning `p` (its `after`) to `s` (its `seq`), with U the hop just
//!   before H in the path and D the hop just after it, first **looking upstream**:
//!   1. H is the first hop of the path: it **began at H**.
//!   2. U has no records of the request: **unknown** ("no records of this request at U").
//!   3. U has no record of `p` or of `s`, or no end record when the stall runs to the end:
//!      **unknown**, naming the missing record (dropped by a full sink, a request U did not
//!      sample, a hop that filtered events).
//!   4. U has a stall within the span (starting at or after `p`, ending at or before `s`;
//!      its trailing one counts when the span runs to the end): **passed on** from upstream.
//!      Not reported at H: U's own analysis reports it, at U or further up. For a stall H
//!      ended in, a stall U began after taking an event H's end record says H never
//!      numbered does not count: H was behind U (its reader had stopped), not waiting on it.
//!   5. U has hidden records strictly inside the span and H carries no hidden events (it
//!      recorded none of the request): a **hidden phase** (reasoning) H does not carry. Not a
//!      stall; counted per hop. A span that runs to the end also needs U to have no visible
//!      record after `p`: visible events H never received are not a phase it does not carry
//!      (a hop that froze during reasoning and was then abandoned did stall).
//!   6. Otherwise it began at H, unless D shows it was back-pressure (below); U's longest
//!      quiet spell over the span is reported as the upstream gap (exact from a tenth of the
//!      threshold up; below that, possibly an upper bound, and said so). With no progress
//!      record of U's within the span there is no such gap to show: **unknown** ("no progress
//!      of U recorded within the span").
//! - Then, for a stall that began at H or is unknown so far, **looking downstream**: a reader
//!   that stops freezes every hop before it, each at a later event (the buffers between them
//!   hold the difference). H's stall is **pushed back** (back-pressure; not reported at H:
//!   D's analysis reports it, at D or further down) when D was behind H as H froze and caught
//!   up as soon as H went on. With `g` H's quiet on its own clock, that is:
//!   1. D had a stall that ended at a seq `s_D` no later than `p` (D had not yet taken `p`),
//!      and D received `s` less than `g` after it received `s_D` (for a stall H ended in: D's
//!      end record, when that end came from upstream: `completed`, `generator_error`,
//!      `generator_panic`, `upstream_error`). Durations on D's clock and on H's are compared,
//!      never times: D receives `s` no earlier than H sends it, so D received `s_D` after H
//!      took `p`, while H was frozen with D behind. A D that stalled long ago and caught up
//!      waited through H's freeze too (its `d` is at least `g`): a later freeze of H's own
//!      stays at H.
//!   2. Or D's stream ended in a stall (its reader stopped) and its end record says it never
//!      numbered `p` (a visible event, or D carries hidden ones): the reader left while H was
//!      blocked.
//!
//!   Neither counts when D has a stall that waited on H's (it had taken everything H had sent,
//!   and was quiet through H's resume): H was not blocked on D then. Each hop asks only the
//!   next one; D's own stall may in turn be pushed back by the hop after it. The stall that
//!   remains is the most downstream one whose next hop does not push it back (the last hop
//!   has none). When D has no records of the request, H's stall stays as upstream decides:
//!   without a record from the hop after a write hop, a slow reader shows as a stall that
//!   began at the write hop.
//! - `d < g` is decided in bounded memory: after each stall (at hops after the first), a hop
//!   keeps a *catch-up profile*, the highest seq it recorded less than 1, 1.5, 2, 3, 4, 6, ...
//!   768 times the threshold after the record that ended the stall, and the first of those its
//!   end record came before. The largest step at most `g` decides: never a catch-up that did
//!   not happen, but one between that step and `g` (at most a third below `g`) is not seen, and
//!   the stall stays at H. A stall a profile not kept would decide is unknown, saying why.
//! - What it cannot tell: two hops with no buffer between them freeze at the same event, and
//!   the rule names the upstream one of the pair even for back-pressure; a hop that froze on
//!   its own while the hop after it had stopped reading looks like back-pressure, and only the
//!   reader's stall is named.
//! - Seqs are the events' ids, the same at every hop: a coalescing hop records a merged event
//!   under its last id, so the hops after it skip seqs and still line up with the hops before.
//!   Records after a hop's end record for a request belong to a resumed stream (a new
//!   subscriber): from another source, or later on the same clock. They continue the hop's
//!   seqs; no quiet spell is measured across the resume.
//! - Per hop, a table of *visible* gaps (visible event to visible event, plus the time from the
//!   last visible event to the end), from a bounded histogram, and the longest and mean gap at
//!   each output position.
//!
//! # Records out of order
//!
//! The records of a request at a hop are analysed in seq order, whatever order their lines
//! arrive in (a log shipper, several writers to one file, merged rotations), within a
//! **reorder window** ([`Timeline::reorder_window`], default [`DEFAULT_REORDER_WINDOW`]
//! records): the last records read, across all sources, are held back, each request's at
//! each hop sorted by seq (then time). When a record leaves the window, its request at its hop
//! takes, in seq order, every pending record from the same source up to it. So a record finds
//! its place when it arrives at most that many records, of the whole input, after the record
//! it belongs before; the same seq twice is still a duplicate. A stream resumed later on the
//! same clock continues the hop's seqs, so the order holds across the resume (its first
//! record, numbered like the end record before it, comes after it in time). Records of one
//! request at one hop from different sources (a resume through another instance, its seqs
//! possibly replaying the last few before the end) are not ordered against each other, but
//! taken as they leave the window, as they would be read.
//!
//! A record that arrives after its request at its hop took a later one is **beyond the
//! window**: it is reported (out of order) and skipped, and nothing is claimed from what is
//! left. Every stall of that request at that hop is unknown ("records of this request at H
//! arrived out of order beyond the reorder window of N records"), and so is every verdict that
//! needs that hop as the upstream or downstream one (never passed on, pushed back or began
//! from it). [`Timeline::diagnose`] first takes in every record still in the window: a record
//! read after it that belongs before one taken is beyond the window.
//!
//! # Bounded memory, hostile input
//!
//! Lines are read with a length limit (a longer line is one problem, never held whole). A
//! request at a hop is a fixed state of 144 bytes, whatever its number of records; what can
//! grow (holes in its seqs, hidden phases, stalls, quiet spells of a tenth of the threshold or
//! more, the catch-up profile after each stall) is counted against one detail budget, and an
//! answer that would need a detail not kept is "unknown", never a guess. A stream keeps at
//! most 256 stalls (later ones are counted and reported, and what needs them is unknown), so
//! judging one stall against the hops beside it stays cheap. The number of requests, of
//! problems kept as examples and of stalls listed are limited too (counts are kept past each
//! limit). The reorder window holds at most its size in records, about 300 bytes each (plus
//! the attributes they set), whatever the number of requests: some 20 MB for the default.
//! Bad lines, duplicates, seqs out of order beyond the window, times going backwards,
//! records after the end, `u64::MAX` seqs and times are reported, line by line (a record's
//! problems with its stream as it leaves the window), and skipped; arithmetic saturates;
//! nothing panics.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use streamgate::timeline::{Blame, Timeline};
//!
//! let worker = r#"{"request":"r1","hop":"worker.publish","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
//! {"request":"r1","hop":"worker.publish","seq":1,"t_ns":5000000,"bytes":3,"kind":"visible"}
//! {"request":"r1","hop":"worker.publish","seq":2,"t_ns":6000000,"bytes":0,"kind":"end","reason":"completed","idle_ns":1000000}"#;
//! // The gateway's clock is unrelated to the worker's; only its own gaps count.
//! let gateway = r#"{"request":"r1","hop":"gateway.write","seq":0,"t_ns":900000000000,"bytes":3,"kind":"visible"}
//! {"request":"r1","hop":"gateway.write","seq":1,"t_ns":902005000000,"bytes":3,"kind":"visible"}
//! {"request":"r1","hop":"gateway.write","seq":2,"t_ns":902006000000,"bytes":0,"kind":"end","reason":"completed","idle_ns":1000000}"#;
//! let mut timeline = Timeline::new(["worker.publish", "gateway.write"], Duration::from_secs(1));
//! timeline.add_lines("worker.jsonl", worker);
//! timeline.add_lines("gateway.jsonl", gateway);
//! let diagnosis = timeline.diagnose();
//! assert!(diagnosis.problems.is_empty());
//! assert_eq!(diagnosis.stalls.len(), 1);
//! let stall = &diagnosis.stalls[0];
//! assert_eq!((stall.hop.as_str(), stall.after, stall.seq), ("gateway.write", Some(0), Some(1)));
//! assert_eq!(stall.blame, Blame::Began);
//! assert_eq!(stall.upstream_gap, Some(Duration::from_millis(5)));
//! ```

mod attrs;
mod blame;
mod budget;
mod busy;
mod lines;
mod parse;
mod problems;
mod reorder;
mod report;
mod request_at_hop;
mod request_gaps;
mod slices;
mod table;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::sync::Arc;
use std::time::Duration;

use crate::probe::HopRecord;

use self::attrs::Attrs;
use self::blame::{Judge, Verdict};
use self::budget::DetailBudget;
use self::busy::Busy;
use self::lines::{Line, each_line};
use self::parse::Parsed;
use self::problems::ProblemLog;
use self::reorder::{Key, Pending, Reorder};
use self::request_at_hop::{Ctx, Rec, RequestAtHop};
use self::request_gaps::RequestGaps;
use self::slices::{Facts, Seen, Slicer};
use self::table::HopTable;

pub use self::parse::RecordError;
pub use self::problems::{Problem, ProblemKind, Problems};
pub use self::report::{Blame, Diagnosis, HopSummary, Stall};
pub use self::slices::{By, ByError, MAX_SLICE_KEYS, MAX_SLICES, Slice, Slices};
pub use self::table::PositionGap;

/// The longest line read by default: 64 KiB (a record is a few hundred bytes).
pub const DEFAULT_MAX_RECORD_LINE: usize = 64 * 1024;
/// Requests analysed by default: 1 Mi (each 144 bytes per hop it has records of, plus its id
/// and its place in a hash table: about 300 MB for a million requests of one hop).
pub const DEFAULT_MAX_REQUESTS: usize = 1 << 20;
/// Problems kept as examples by default (all are counted).
pub const DEFAULT_MAX_PROBLEMS: usize = 100;
/// Stalls listed by default: the longest 10,000 (all are counted).
pub const DEFAULT_MAX_STALLS: usize = 10_000;
/// The detail budget by default: 4 Mi holes, hidden phases, stalls and quiet spells of a tenth
/// of the threshold or more, over all streams (16 to 48 bytes each), a stall's catch-up
/// profile (104 bytes) counting as two.
pub const DEFAULT_MAX_DETAILS: u64 = 1 << 22;
/// Output positions tracked per hop by default (for the gap-by-position plot).
pub const DEFAULT_MAX_POSITIONS: usize = 4096;
/// The reorder window by default: the last 65,536 records read (about 20 MB while full; see
/// [`Timeline::reorder_window`]).
pub const DEFAULT_REORDER_WINDOW: usize = 1 << 16;

/// The most hops a path may have.
pub const MAX_PATH: usize = 64;
/// Distinct sources told apart (for resumes); later ones share one.
const MAX_SOURCES: usize = u16::MAX as usize;

/// Hop records gathered for analysis: a small state per request and hop, read as a stream.
///
/// # Examples
///
/// A client that stopped receiving and left after 40 s, while the gateway before it kept
/// writing: the freeze began between them, at `client.recv`.
///
/// ```
/// use std::time::Duration;
/// use streamgate::timeline::{Blame, Timeline};
///
/// let mut records = String::new();
/// let mut line = |hop: &str, seq: u64, t_ms: u64, end: Option<u64>| {
///     let t_ns = t_ms * 1_000_000;
///     records.push_str(&match end {
///         None => format!(r#"{{"request":"r","hop":"{hop}","seq":{seq},"t_ns":{t_ns},"bytes":5,"kind":"visible"}}"#),
///         Some(idle_ms) => format!(
///             r#"{{"request":"r","hop":"{hop}","seq":{seq},"t_ns":{t_ns},"bytes":0,"kind":"end","reason":"consumer_gone","idle_ns":{}}}"#,
///             idle_ms * 1_000_000
///         ),
///     });
///     records.push('\n');
/// };
/// for seq in 0..100 {
///     line("gateway.write", seq, 10 * seq, None);
/// }
/// line("gateway.write", 100, 990 + 3, Some(3));
/// for seq in 0..10 {
///     line("client.recv", seq, 5_000 + 10 * seq, None);
/// }
/// line("client.recv", 10, 5_090 + 40_000, Some(40_000));
///
/// let mut timeline = Timeline::new(["gateway.write", "client.recv"], Duration::from_secs(1));
/// timeline.read("records.jsonl", records.as_bytes())?;
/// let diagnosis = timeline.diagnose();
/// let stall = &diagnosis.stalls[0];
/// assert_eq!(stall.hop, "client.recv");
/// assert_eq!((stall.after, stall.seq), (Some(9), None));
/// assert_eq!(stall.end_reason, Some(streamgate::EndReason::ConsumerGone));
/// assert_eq!(stall.gap, Duration::from_secs(40));
/// assert_eq!(stall.blame, Blame::Began);
/// assert!(stall.upstream_gap < Some(Duration::from_millis(20)));
/// assert!(diagnosis.has_stalls());
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Timeline {
    path: Vec<Box<str>>,
    stall_ns: u64,
    max_line: usize,
    max_requests: usize,
    max_stalls: usize,
    only: Option<Box<str>>,
    sources: Vec<Box<str>>,
    requests: HashMap<Arc<str>, Vec<RequestAtHop>>,
    reorder: Reorder,
    tables: Vec<HopTable>,
    problems: ProblemLog,
    budget: DetailBudget,
    attrs: Attrs,
    busy: Busy,
    /// The keys of each slicing the diagnosis makes, and the requests' gaps at the path's
    /// last hop, kept within a budget of their own (slicing never changes the diagnosis).
    slicings: Vec<Vec<By>>,
    gaps: RequestGaps,
    gap_budget: DetailBudget,
    /// The budget of the busy times kept ([`Busy`]).
    busy_budget: DetailBudget,
    lines: u64,
    records: u64,
    filtered: u64,
}

impl Timeline {
    /// An empty timeline for the hops of `path`, in order, with `stall` as the stall
    /// threshold.
    ///
    /// # Panics
    ///
    /// If the path is empty, longer than [`MAX_PATH`], or names a hop twice.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::Timeline;
    ///
    /// // The hops in path order, and the shortest quiet spell that is a stall.
    /// let path = ["worker.publish", "gateway.write", "client.recv"];
    /// let mut timeline = Timeline::new(path, Duration::from_millis(500));
    /// let diagnosis = timeline.diagnose();
    /// assert_eq!(diagnosis.stall, Duration::from_millis(500));
    /// assert_eq!(diagnosis.hops[1].hop, "gateway.write");
    /// ```
    pub fn new<I, S>(path: I, stall: Duration) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let path: Vec<Box<str>> = path
            .into_iter()
            .map(|hop| hop.into().into_boxed_str())
            .collect();
        assert!(
            !path.is_empty() && path.len() <= MAX_PATH,
            "a path has 1 to {MAX_PATH} hops"
        );
        for (index, hop) in path.iter().enumerate() {
            assert!(
                !path[..index].contains(hop),
                "hop `{hop}` is twice in the path"
            );
        }
        Timeline {
            stall_ns: u64::try_from(stall.as_nanos()).unwrap_or(u64::MAX),
            max_line: DEFAULT_MAX_RECORD_LINE,
            max_requests: DEFAULT_MAX_REQUESTS,
            max_stalls: DEFAULT_MAX_STALLS,
            only: None,
            sources: Vec::new(),
            requests: HashMap::new(),
            reorder: Reorder::new(DEFAULT_REORDER_WINDOW),
            tables: path
                .iter()
                .map(|_| HopTable::new(DEFAULT_MAX_POSITIONS))
                .collect(),
            path,
            problems: ProblemLog::new(DEFAULT_MAX_PROBLEMS),
            budget: DetailBudget::new(DEFAULT_MAX_DETAILS),
            gap_budget: DetailBudget::new(DEFAULT_MAX_DETAILS),
            busy_budget: DetailBudget::new(DEFAULT_MAX_DETAILS),
            attrs: Attrs::default(),
            busy: Busy::default(),
            slicings: Vec::new(),
            gaps: RequestGaps::default(),
            lines: 0,
            records: 0,
            filtered: 0,
        }
    }

    /// Analyses only the request `id`: other requests' records are counted as filtered.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::Timeline;
    ///
    /// let records = r#"{"request":"r1","hop":"gateway.write","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
    /// {"request":"r2","hop":"gateway.write","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}"#;
    /// let mut timeline = Timeline::new(["gateway.write"], Duration::from_secs(1)).request("r2");
    /// timeline.add_lines("gateway.jsonl", records);
    /// let diagnosis = timeline.diagnose();
    /// assert_eq!((diagnosis.requests, diagnosis.records, diagnosis.filtered), (1, 1, 1));
    /// ```
    pub fn request(mut self, id: impl Into<String>) -> Self {
        self.only = Some(id.into().into_boxed_str());
        self
    }

    /// Reads lines of at most `bytes` (default [`DEFAULT_MAX_RECORD_LINE`]); longer ones are
    /// skipped as they are read, one problem each.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::{ProblemKind, Timeline};
    ///
    /// let mut timeline = Timeline::new(["gateway.write"], Duration::from_secs(1)).max_line(1024);
    /// timeline.add_lines("gateway.jsonl", &"x".repeat(4096));
    /// let problems = timeline.diagnose().problems;
    /// assert_eq!(problems.count(ProblemKind::LongLine), 1);
    /// assert_eq!(problems.examples[0].message, "a line of 4096 bytes (at most 1024): skipped");
    /// ```
    pub fn max_line(mut self, bytes: usize) -> Self {
        self.max_line = bytes;
        self
    }

    /// Analyses at most `n` requests (default [`DEFAULT_MAX_REQUESTS`]); records of later
    /// ones are counted as [`ProblemKind::RequestLimit`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::{ProblemKind, Timeline};
    ///
    /// let records = r#"{"request":"r1","hop":"gateway.write","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
    /// {"request":"r2","hop":"gateway.write","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}"#;
    /// let mut timeline = Timeline::new(["gateway.write"], Duration::from_secs(1)).max_requests(1);
    /// timeline.add_lines("gateway.jsonl", records);
    /// let diagnosis = timeline.diagnose();
    /// assert_eq!(diagnosis.requests, 1);
    /// assert_eq!(diagnosis.problems.count(ProblemKind::RequestLimit), 1);
    /// ```
    pub fn max_requests(mut self, n: usize) -> Self {
        self.max_requests = n;
        self
    }

    /// Keeps the first `n` problems as examples (default [`DEFAULT_MAX_PROBLEMS`]); all are
    /// counted by kind.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::{ProblemKind, Timeline};
    ///
    /// let mut timeline = Timeline::new(["gateway.write"], Duration::from_secs(1)).max_problems(1);
    /// timeline.add_lines("gateway.jsonl", "not a record\nnor this\n");
    /// let problems = timeline.diagnose().problems;
    /// assert_eq!((problems.total, problems.examples.len()), (2, 1));
    /// assert_eq!(problems.examples[0].line, Some(1));
    /// assert_eq!(problems.count(ProblemKind::BadRecord), 2);
    /// ```
    pub fn max_problems(mut self, n: usize) -> Self {
        self.problems.set_max(n);
        self
    }

    /// Lists the `n` longest stalls (default [`DEFAULT_MAX_STALLS`]); all are counted.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::Timeline;
    ///
    /// // Two requests, quiet for 2 s and for 3 s.
    /// let records = r#"{"request":"r1","hop":"worker.publish","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
    /// {"request":"r1","hop":"worker.publish","seq":1,"t_ns":2000000000,"bytes":3,"kind":"visible"}
    /// {"request":"r2","hop":"worker.publish","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
    /// {"request":"r2","hop":"worker.publish","seq":1,"t_ns":3000000000,"bytes":3,"kind":"visible"}"#;
    /// let mut timeline = Timeline::new(["worker.publish"], Duration::from_secs(1)).max_stalls(1);
    /// timeline.add_lines("worker.jsonl", records);
    /// let diagnosis = timeline.diagnose();
    /// assert_eq!((diagnosis.stalls_total, diagnosis.stalls.len()), (2, 1));
    /// assert_eq!(diagnosis.stalls[0].request, "r2");
    /// ```
    pub fn max_stalls(mut self, n: usize) -> Self {
        self.max_stalls = n;
        self
    }

    /// Keeps at most `n` details (default [`DEFAULT_MAX_DETAILS`]) over all streams: holes
    /// in a hop's seqs, hidden phases, stalls, quiet spells of a tenth of the threshold or
    /// more, catch-up profiles (two each). What would need a hole, a phase, a stall or a
    /// profile not kept is unknown; a quiet spell not kept goes into the stream's sketch (an
    /// upstream gap becomes an upper bound).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::{ProblemKind, Timeline};
    ///
    /// let records = r#"{"request":"r1","hop":"worker.publish","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
    /// {"request":"r1","hop":"worker.publish","seq":1,"t_ns":2000000000,"bytes":3,"kind":"visible"}"#;
    /// let mut timeline = Timeline::new(["worker.publish"], Duration::from_secs(1)).max_details(0);
    /// timeline.add_lines("worker.jsonl", records);
    /// let diagnosis = timeline.diagnose();
    /// // The quiet spell is counted, but there was no room to keep it as a stall.
    /// assert_eq!((diagnosis.hops[0].quiet_spells, diagnosis.stalls_total), (1, 0));
    /// assert_eq!(
    ///     diagnosis.problems.examples[0].message,
    ///     "request `r1` at worker.publish: a stall after seq 0 not analysed: the detail budget is spent"
    /// );
    /// assert!(diagnosis.problems.count(ProblemKind::DetailLimit) > 0);
    /// ```
    pub fn max_details(mut self, n: u64) -> Self {
        self.budget.set_max(n);
        self.gap_budget.set_max(n);
        self.busy_budget.set_max(n);
        self
    }

    /// Slices the diagnosis by `by` (one of [`Diagnosis::slices`], in the order given; call it
    /// again for another slicing of the same records): per value of one key (or pair of
    /// values of two), its requests, stalled requests, stall rate, gap p99 at the path's last
    /// hop, and the hops its stalls began at, the values whose stall rate stands out first.
    /// Give it before reading: each request's gaps at the last hop are then kept, sparse (a
    /// few buckets a request, 8 bytes each), within a budget of their own as large as the
    /// detail budget ([`max_details`](Timeline::max_details) sets both), so slicing never
    /// changes the diagnosis; a request whose gaps were not all kept is counted in its slice's
    /// `gaps_incomplete`.
    ///
    /// # Panics
    ///
    /// With no key, more than [`MAX_SLICE_KEYS`], or a key twice.
    ///
    /// # Examples
    ///
    /// Two pools; the stalled request was served by `b`:
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::{By, Timeline};
    ///
    /// let mut records = String::new();
    /// for (request, pool, stall_ms) in [("r1", "a", 10), ("r2", "a", 10), ("r3", "b", 2000)] {
    ///     records.push_str(&format!(
    ///         r#"{{"request":"{request}","hop":"proxy.recv","seq":0,"t_ns":0,"bytes":3,"kind":"visible","attrs":{{"pool":"{pool}"}}}}
    /// {{"request":"{request}","hop":"proxy.recv","seq":1,"t_ns":{},"bytes":3,"kind":"visible"}}
    /// "#,
    ///         stall_ms * 1_000_000
    ///     ));
    /// }
    /// let mut timeline = Timeline::new(["proxy.recv"], Duration::from_secs(1))
    ///     .slice_by([By::Attr("pool".into())]);
    /// timeline.add_lines("proxy.jsonl", &records);
    /// let slices = &timeline.diagnose().slices[0];
    /// let first = &slices.rows[0];
    /// assert_eq!((first.values[0].as_str(), first.requests, first.stalled), ("b", 1, 1));
    /// assert_eq!(first.began, [("proxy.recv".to_owned(), 1)]);
    /// assert_eq!((slices.rows[1].values[0].as_str(), slices.rows[1].stalled), ("a", 0));
    /// assert!(slices.rows[1].gap_p99.unwrap() <= Duration::from_micros(11_250));
    /// ```
    pub fn slice_by(mut self, by: impl IntoIterator<Item = By>) -> Self {
        let by: Vec<By> = by.into_iter().collect();
        assert!(
            (1..=MAX_SLICE_KEYS).contains(&by.len()),
            "1 to {MAX_SLICE_KEYS} slice keys"
        );
        for (index, key) in by.iter().enumerate() {
            assert!(!by[..index].contains(key), "slice key `{key}` given twice");
        }
        if let Some(last) = self.tables.last_mut() {
            last.recent.get_or_insert_with(Vec::new);
        }
        self.slicings.push(by);
        self
    }

    /// Tracks gaps by output position for the first `n` positions of each stream (default
    /// [`DEFAULT_MAX_POSITIONS`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::Timeline;
    ///
    /// // Four visible events 10 ms apart: gaps end at output positions 1, 2 and 3.
    /// let records = r#"{"request":"r1","hop":"client.recv","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
    /// {"request":"r1","hop":"client.recv","seq":1,"t_ns":10000000,"bytes":3,"kind":"visible"}
    /// {"request":"r1","hop":"client.recv","seq":2,"t_ns":20000000,"bytes":3,"kind":"visible"}
    /// {"request":"r1","hop":"client.recv","seq":3,"t_ns":30000000,"bytes":3,"kind":"visible"}"#;
    /// let mut timeline = Timeline::new(["client.recv"], Duration::from_secs(1)).max_positions(2);
    /// timeline.add_lines("client.jsonl", records);
    /// let hop = &timeline.diagnose().hops[0];
    /// assert_eq!(hop.gaps, 3);
    /// assert_eq!(hop.by_position.len(), 2);
    /// assert_eq!(hop.by_position[1].max, Duration::from_millis(10));
    /// assert_eq!(hop.positions_beyond, 2);
    /// ```
    pub fn max_positions(mut self, n: usize) -> Self {
        for table in &mut self.tables {
            table.set_max_positions(n);
        }
        self
    }

    /// Puts back in order the records of each request at each hop that arrive at most `n`
    /// records (of the whole input, in read order) after the record they belong before
    /// (default [`DEFAULT_REORDER_WINDOW`]; 0: none). A record further out of order is
    /// [`ProblemKind::OutOfOrder`], and every stall of that request at that hop, or that needs
    /// it to be judged, is unknown.
    ///
    /// The last `n` records read are held back, each stream's sorted by seq (then time): when
    /// a record leaves the window, its stream takes every pending record from the same source
    /// up to its seq. The window costs about 300 bytes per record it holds (plus the
    /// attributes those records set), whatever the number of requests: some 20 MB for the
    /// default. Records of one stream from different sources (a stream resumed through
    /// another instance) are not ordered against each other.
    ///
    /// # Examples
    ///
    /// Lines of one hop swapped by a log shipper: put back, not a problem. With no window,
    /// seq 0 comes after seq 1 was taken: what is left of the stream is not the stream, and
    /// the stall seen in it cannot be told.
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::{Blame, ProblemKind, Timeline};
    ///
    /// let records = r#"{"request":"r1","hop":"worker.publish","seq":1,"t_ns":2000000000,"bytes":3,"kind":"visible"}
    /// {"request":"r1","hop":"worker.publish","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
    /// {"request":"r1","hop":"worker.publish","seq":2,"t_ns":4000000000,"bytes":3,"kind":"visible"}"#;
    /// let mut timeline = Timeline::new(["worker.publish"], Duration::from_secs(1));
    /// timeline.add_lines("worker.jsonl", records);
    /// let diagnosis = timeline.diagnose();
    /// assert!(diagnosis.problems.is_empty());
    /// let spans: Vec<_> = diagnosis.stalls.iter().map(|s| (s.after, s.seq, &s.blame)).collect();
    /// assert_eq!(spans, [(Some(0), Some(1), &Blame::Began), (Some(1), Some(2), &Blame::Began)]);
    ///
    /// let mut timeline = Timeline::new(["worker.publish"], Duration::from_secs(1)).reorder_window(0);
    /// timeline.add_lines("worker.jsonl", records);
    /// let diagnosis = timeline.diagnose();
    /// assert_eq!(diagnosis.problems.count(ProblemKind::OutOfOrder), 1);
    /// assert_eq!(
    ///     diagnosis.stalls[0].blame,
    ///     Blame::Unknown(
    ///         "records of this request at worker.publish arrived out of order beyond the reorder \
    ///          window of 0 records"
    ///             .into()
    ///     )
    /// );
    /// ```
    pub fn reorder_window(mut self, n: usize) -> Self {
        self.reorder.set_max(n);
        self
    }

    /// Reads the hop records of `source` (JSON lines, any hops, blank lines skipped), naming
    /// `source` in any problem found. Memory stays bounded however long the input or its
    /// lines are.
    ///
    /// # Errors
    ///
    /// What reading returns; the records read before the error count (the error is also a
    /// problem of the diagnosis).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::Timeline;
    ///
    /// let records = r#"{"request":"r1","hop":"gateway.write","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
    ///
    /// not a record
    /// {"request":"r1","hop":"gateway.write","seq":1,"t_ns":0,"bytes":0,"kind":"end","reason":"completed","idle_ns":0}
    /// "#;
    /// let mut timeline = Timeline::new(["gateway.write"], Duration::from_secs(1));
    /// // Any reader: a file (`File::open("gateway.jsonl")?`), standard input, bytes.
    /// timeline.read("gateway.jsonl", records.as_bytes())?;
    /// let diagnosis = timeline.diagnose();
    /// assert_eq!((diagnosis.lines, diagnosis.records), (4, 2));
    /// let problem = &diagnosis.problems.examples[0];
    /// assert_eq!((problem.source.as_str(), problem.line), ("gateway.jsonl", Some(3)));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn read(&mut self, source: &str, reader: impl Read) -> io::Result<()> {
        let id = self.source(source);
        self.read_from(id, source, reader, None)
    }

    /// Reads the hop records of `source` from `input`, as [`read`](Timeline::read) does, but
    /// only the last `window` of each hop's clock there: older records are counted as
    /// filtered.
    ///
    /// Hop records carry monotonic times of the process that wrote them: times of different
    /// processes share no origin, and none of them is wall-clock time. So the window is taken
    /// per hop in `input`: it ends at that hop's latest record in `input`, which a first pass
    /// finds; the second pass, from where `input` stood before the first, takes the records.
    /// `input` is read twice, so it must [`Seek`]: a file, or a [`Cursor`](io::Cursor) over
    /// records held in memory. A stream that can be read only once (standard input, a socket)
    /// cannot be windowed, and does not compile:
    ///
    /// ```compile_fail,E0277
    /// # use std::time::Duration;
    /// # use streamgate::timeline::Timeline;
    /// let mut timeline = Timeline::new(["gateway.write"], Duration::from_secs(1));
    /// timeline.read_last("-", std::io::stdin(), Duration::from_secs(600))?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// An input holding records of several processes of one hop (the logs of two replicas, or
    /// of a restart, in one file) mixes their clocks: split it first. A request that crosses
    /// the window's start may have records at one hop and not at the hop before; its stalls
    /// there are unknown, and say so.
    ///
    /// # Errors
    ///
    /// What reading or seeking returns. After an error in the first pass nothing is taken
    /// (where the window ends is not known); after one in the second, the records read before
    /// it count. Either is also a problem of the diagnosis.
    ///
    /// # Examples
    ///
    /// The last 5 s of the worker's clock in a file: the request before them is left out.
    ///
    /// ```
    /// use std::io::Cursor;
    /// use std::time::Duration;
    /// use streamgate::timeline::Timeline;
    ///
    /// let records = r#"{"request":"old","hop":"worker.publish","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
    /// {"request":"old","hop":"worker.publish","seq":1,"t_ns":2000000000,"bytes":3,"kind":"visible"}
    /// {"request":"new","hop":"worker.publish","seq":0,"t_ns":10000000000,"bytes":3,"kind":"visible"}
    /// {"request":"new","hop":"worker.publish","seq":1,"t_ns":12000000000,"bytes":3,"kind":"visible"}
    /// "#;
    /// let mut timeline = Timeline::new(["worker.publish"], Duration::from_secs(1));
    /// // A file would do as well: `File::open("worker.jsonl")?`.
    /// timeline.read_last("worker.jsonl", Cursor::new(records), Duration::from_secs(5))?;
    /// let diagnosis = timeline.diagnose();
    /// assert_eq!((diagnosis.requests, diagnosis.filtered), (1, 2));
    /// assert_eq!(diagnosis.stalls[0].request, "new");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn read_last(
        &mut self,
        source: &str,
        mut input: impl Read + Seek,
        window: Duration,
    ) -> io::Result<()> {
        let id = self.source(source);
        let window_ns = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        let starts = match self.window_starts(&mut input, window_ns) {
            Ok(starts) => starts,
            Err(error) => {
                self.problems
                    .add(ProblemKind::Unreadable, source, None, || error.to_string());
                return Err(error);
            }
        };
        self.read_from(id, source, input, Some(&starts))
    }

    /// The first pass of [`read_last`](Timeline::read_last): where the window starts at each
    /// hop of the path (its latest time in `input`, less `window_ns`; 0 for a hop with no
    /// record there), leaving `input` where it stood.
    fn window_starts(&self, mut input: impl Read + Seek, window_ns: u64) -> io::Result<Vec<u64>> {
        let start = input.stream_position()?;
        let mut latest: Vec<Option<u64>> = vec![None; self.path.len()];
        each_line(
            BufReader::with_capacity(1 << 16, &mut input),
            self.max_line,
            |_, line| {
                let Line::Text(text) = line else { return };
                let Ok(record) = parse::parse(text) else {
                    return;
                };
                if let Some(hop) = self.path.iter().position(|h| **h == *record.hop) {
                    let t = &mut latest[hop];
                    *t = Some(t.map_or(record.t_ns, |t| t.max(record.t_ns)));
                }
            },
        )?;
        input.seek(SeekFrom::Start(start))?;
        Ok(latest
            .into_iter()
            .map(|t| t.map_or(0, |t| t.saturating_sub(window_ns)))
            .collect())
    }

    /// Reads the records of `source` (interned as `id`) from `reader`; with `starts`, only
    /// those at or after the start of their hop's window.
    fn read_from(
        &mut self,
        id: u16,
        source: &str,
        reader: impl Read,
        starts: Option<&[u64]>,
    ) -> io::Result<()> {
        let max_line = self.max_line;
        let result = each_line(
            BufReader::with_capacity(1 << 16, reader),
            max_line,
            |n, line| self.line(id, n, line, starts),
        );
        if let Err(error) = &result {
            self.problems
                .add(ProblemKind::Unreadable, source, None, || error.to_string());
        }
        result
    }

    /// Reads the hop records in `text` (see [`read`](Timeline::read)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::Timeline;
    ///
    /// let mut timeline = Timeline::new(["gateway.write"], Duration::from_secs(1));
    /// timeline.add_lines(
    ///     "gateway.jsonl",
    ///     r#"{"request":"r1","hop":"gateway.write","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}"#,
    /// );
    /// assert_eq!(timeline.diagnose().records, 1);
    /// ```
    pub fn add_lines(&mut self, source: &str, text: &str) {
        // Reading from a slice cannot fail.
        let _ = self.read(source, text.as_bytes());
    }

    /// Adds one record, as a hop made it (see [`HopRecord`]), naming `source` in any problem
    /// found.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::Kind;
    /// use streamgate::probe::{HopRecord, RecordKind};
    /// use streamgate::timeline::Timeline;
    ///
    /// let mut timeline = Timeline::new(["client.recv"], Duration::from_secs(1));
    /// for (seq, t_ms) in [(0, 0), (1, 10), (2, 1500)] {
    ///     let record = HopRecord {
    ///         request: "r1".into(),
    ///         hop: "client.recv".into(),
    ///         seq,
    ///         t_ns: t_ms * 1_000_000,
    ///         bytes: 5,
    ///         kind: RecordKind::Event(Kind::Visible),
    ///         busy_ns: None,
    ///         attrs: Vec::new(),
    ///     };
    ///     timeline.add_record("client", &record);
    /// }
    /// let diagnosis = timeline.diagnose();
    /// assert_eq!((diagnosis.stalls[0].after, diagnosis.stalls[0].seq), (Some(1), Some(2)));
    /// ```
    pub fn add_record(&mut self, source: &str, record: &HopRecord) {
        let id = self.source(source);
        let attrs = record
            .attrs
            .iter()
            .map(|(key, value)| (key.as_str(), value.as_str()));
        let checked = parse::check(&record.request).and_then(|()| parse::check_attrs(attrs));
        if let Err(error) = checked {
            self.problems
                .add(ProblemKind::BadRecord, source, None, || error.to_string());
            return;
        }
        let attrs = record
            .attrs
            .iter()
            .map(|(key, value)| (key.as_str().into(), value.as_str().into()));
        let parsed = Parsed {
            request: record.request.as_str().into(),
            hop: record.hop.as_str().into(),
            seq: record.seq,
            t_ns: record.t_ns,
            bytes: record.bytes,
            kind: record.kind,
            busy_ns: record.busy_ns.unwrap_or(0),
            attrs: (!record.attrs.is_empty()).then(|| attrs.collect()),
        };
        self.take(id, None, &parsed, None);
    }

    /// A problem not tied to a line: an input that could not be opened, for one.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::fs::File;
    /// use std::time::Duration;
    /// use streamgate::timeline::{ProblemKind, Timeline};
    ///
    /// let mut timeline = Timeline::new(["gateway.write"], Duration::from_secs(1));
    /// let name = "/nonexistent/gateway.jsonl";
    /// match File::open(name) {
    ///     Ok(file) => timeline.read(name, file)?,
    ///     Err(error) => timeline.add_problem(ProblemKind::Unreadable, name, &error.to_string()),
    /// }
    /// let problems = timeline.diagnose().problems;
    /// assert_eq!(problems.count(ProblemKind::Unreadable), 1);
    /// assert_eq!(problems.examples[0].line, None);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn add_problem(&mut self, kind: ProblemKind, source: &str, message: &str) {
        self.problems.add(kind, source, None, || message.to_owned());
    }

    fn source(&mut self, name: &str) -> u16 {
        if let Some(id) = self.sources.iter().position(|s| **s == *name) {
            return id as u16;
        }
        if self.sources.len() < MAX_SOURCES {
            self.sources.push(name.into());
        }
        (self.sources.len() - 1) as u16
    }

    fn line(&mut self, source: u16, number: u64, line: Line<'_>, starts: Option<&[u64]>) {
        self.lines = self.lines.saturating_add(1);
        let name = &self.sources[usize::from(source)];
        match line {
            Line::TooLong(length) => {
                let max = self.max_line;
                self.problems
                    .add(ProblemKind::LongLine, name, Some(number), || {
                        format!("a line of {length} bytes (at most {max}): skipped")
                    });
            }
            Line::Text(text) => {
                if text.iter().all(u8::is_ascii_whitespace) {
                    return;
                }
                match parse::parse(text) {
                    Ok(parsed) => self.take(source, Some(number), &parsed, starts),
                    Err(error) => {
                        self.problems
                            .add(ProblemKind::BadRecord, name, Some(number), || {
                                error.to_string()
                            })
                    }
                }
            }
        }
    }

    /// Takes a record as it is read: filtered, refused (an unknown hop, past the request
    /// limit) or put in the reorder window, which releases what leaves it.
    fn take(
        &mut self,
        source: u16,
        line: Option<u64>,
        record: &Parsed<'_>,
        starts: Option<&[u64]>,
    ) {
        if self
            .only
            .as_deref()
            .is_some_and(|only| only != record.request)
        {
            self.filtered = self.filtered.saturating_add(1);
            return;
        }
        let source_name = &self.sources[usize::from(source)];
        let Some(hop) = self.path.iter().position(|h| **h == *record.hop) else {
            let hop = crate::probe::cut(&record.hop, 64);
            self.problems
                .add(ProblemKind::UnknownHop, source_name, line, || {
                    format!("hop `{hop}` is not on the path")
                });
            return;
        };
        let hop = hop as u8;
        if starts.is_some_and(|starts| record.t_ns < starts[usize::from(hop)]) {
            self.filtered = self.filtered.saturating_add(1);
            return;
        }
        let request = match self.requests.get_key_value(&*record.request) {
            Some((request, _)) => request.clone(),
            None => {
                if self.requests.len() >= self.max_requests {
                    let max = self.max_requests;
                    self.problems
                        .add(ProblemKind::RequestLimit, source_name, line, || {
                            format!(
                                "request `{}` not analysed: more than {max} requests",
                                record.request
                            )
                        });
                    return;
                }
                let request: Arc<str> = record.request.as_ref().into();
                self.requests.insert(request.clone(), Vec::with_capacity(1));
                request
            }
        };
        let attrs = record.attrs.as_ref().map(|set| {
            set.iter()
                .map(|(key, value)| (Cow::Owned(key.to_string()), Cow::Owned(value.to_string())))
                .collect()
        });
        let key = Key::new(request, hop, source, record.seq, record.t_ns);
        let pending = Pending {
            kind: record.kind,
            line,
            windowed: starts.is_some(),
            busy_ns: record.busy_ns,
            attrs,
        };
        self.reorder.push(key, pending);
        self.release(false);
    }

    /// Takes in the records that left the reorder window (every record in it, with `flush`).
    fn release(&mut self, flush: bool) {
        while let Some((key, pending)) = self.reorder.release(flush) {
            self.take_in(&key, &pending);
        }
    }

    /// Takes a record released by the reorder window into its request's state at its hop.
    fn take_in(&mut self, key: &Key, pending: &Pending) {
        let Timeline {
            path,
            stall_ns,
            requests,
            tables,
            problems,
            budget,
            sources,
            records,
            attrs,
            busy,
            gaps,
            gap_budget,
            busy_budget,
            reorder,
            ..
        } = self;
        let Some(streams) = requests.get_mut(&key.request) else {
            return;
        };
        let hop = key.hop;
        let at = match streams.iter().position(|s| s.hop == hop) {
            Some(at) => at,
            None => {
                if streams.len() == streams.capacity() {
                    // Grow once, to the path's length, rather than doubling.
                    streams.reserve_exact(path.len() - streams.len());
                }
                streams.push(RequestAtHop::new(hop, key.source));
                streams.len() - 1
            }
        };
        let rec = Rec {
            seq: key.seq,
            t_ns: key.t_ns,
            kind: pending.kind,
            source: key.source,
        };
        let mut cx = Ctx {
            stall_ns: *stall_ns,
            budget,
            table: &mut tables[usize::from(hop)],
            problems,
            source: &sources[usize::from(key.source)],
            line: pending.line,
            request: &key.request,
            hop: &path[usize::from(hop)],
            windowed: pending.windowed,
            reorder_window: reorder.max(),
        };
        if streams[at].add(&rec, &mut cx) {
            cx.table.records = cx.table.records.saturating_add(1);
            *records = records.saturating_add(1);
            if let Some(set) = &pending.attrs {
                attrs.change((&key.request, hop, key.seq), set, cx.budget);
            }
            // Busy time that could explain a stall (a tenth of the threshold or more), kept
            // within a budget of its own: a page's long frames never cost a verdict's details.
            if pending.busy_ns >= *stall_ns / 10 && pending.busy_ns > 0 {
                busy.note((&key.request, hop, key.seq), pending.busy_ns, busy_budget);
            }
            if let Some(recent) = &mut cx.table.recent {
                for (position, ns) in recent.drain(..) {
                    let position = slices::bucket_index(u64::from(position));
                    gaps.add(&key.request, position, ns, gap_budget);
                }
            }
        }
    }

    /// Names the hop each stall began at, from everything read so far (see the
    /// [module](self) for the rule), taking in first every record still in the reorder
    /// window. It can be called again after reading more; a record read after it that belongs
    /// before one it took is then beyond the window (see
    /// [`reorder_window`](Timeline::reorder_window)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::{Blame, Timeline};
    ///
    /// let mut timeline = Timeline::new(["worker.publish"], Duration::from_secs(1));
    /// timeline.add_lines(
    ///     "worker.jsonl",
    ///     r#"{"request":"r1","hop":"worker.publish","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}"#,
    /// );
    /// assert!(!timeline.diagnose().has_stalls());
    /// // Two seconds later on the worker's clock, the next event.
    /// timeline.add_lines(
    ///     "worker.jsonl",
    ///     r#"{"request":"r1","hop":"worker.publish","seq":1,"t_ns":2000000000,"bytes":3,"kind":"visible"}"#,
    /// );
    /// let diagnosis = timeline.diagnose();
    /// assert_eq!(diagnosis.stalls[0].gap, Duration::from_secs(2));
    /// assert_eq!(diagnosis.stalls[0].blame, Blame::Began);
    /// ```
    pub fn diagnose(&mut self) -> Diagnosis {
        self.release(true);
        #[derive(Default, Clone)]
        struct Counts {
            began: u64,
            unknown: u64,
            passed_on: u64,
            pushed_back: u64,
            hidden: u64,
        }
        let mut counts = vec![Counts::default(); self.path.len()];
        let judge = Judge {
            path: &self.path,
            stall_ns: self.stall_ns,
            reorder_window: self.reorder.max(),
        };
        let mut stalls: Vec<Stall> = Vec::new();
        let mut total: u64 = 0;
        let keep = self.max_stalls;
        let mut slicers: Vec<Slicer<'_>> = self
            .slicings
            .iter()
            .map(|by| Slicer::new(by, &self.path, &self.attrs, &self.gaps))
            .collect();
        let mut seen: Vec<Seen> = Vec::new();
        for (request, streams) in &self.requests {
            seen.clear();
            for stream in streams {
                let upstream = stream
                    .hop
                    .checked_sub(1)
                    .and_then(|up| streams.iter().find(|s| s.hop == up));
                let downstream = streams.iter().find(|s| s.hop == stream.hop + 1);
                let count = &mut counts[usize::from(stream.hop)];
                for spell in stream.spells() {
                    let (blame, upstream_gap) =
                        match blame::judge(&judge, stream, upstream, downstream, spell) {
                            Verdict::PassedOn => {
                                count.passed_on += 1;
                                continue;
                            }
                            Verdict::PushedBack => {
                                count.pushed_back += 1;
                                continue;
                            }
                            Verdict::Hidden => {
                                count.hidden += 1;
                                continue;
                            }
                            Verdict::Began(gap) => {
                                count.began += 1;
                                (Blame::Began, gap)
                            }
                            Verdict::Unknown(why) => {
                                count.unknown += 1;
                                (Blame::Unknown(why), None)
                            }
                        };
                    total = total.saturating_add(1);
                    if !slicers.is_empty() {
                        seen.push(Seen {
                            hop: stream.hop,
                            after: spell.after,
                            began: blame == Blame::Began,
                        });
                    }
                    if keep == 0 {
                        continue;
                    }
                    let end_reason = spell.reason.filter(|_| spell.seq.is_none());
                    stalls.push(Stall {
                        request: request.to_string(),
                        hop: self.path[usize::from(stream.hop)].to_string(),
                        after: spell.after,
                        seq: spell.seq,
                        end_reason,
                        gap: Duration::from_nanos(spell.quiet_ns),
                        upstream_gap: upstream_gap.map(|(ns, _)| Duration::from_nanos(ns)),
                        upstream_gap_exact: upstream_gap.is_some_and(|(_, exact)| exact),
                        blame,
                        attrs: self.attrs.at(request, stream.hop, spell.after),
                        // The record that ended it: its seq, or the end record's.
                        busy: spell
                            .seq
                            .or_else(|| stream.final_end().map(|(seq, _)| seq))
                            .and_then(|seq| self.busy.at(request, stream.hop, seq))
                            .map(Duration::from_nanos),
                    });
                    if stalls.len() >= keep.saturating_mul(2) {
                        longest_first(&mut stalls);
                        stalls.truncate(keep);
                    }
                }
            }
            if !slicers.is_empty() {
                // In the order they happened (then path order): the first is the first stall.
                seen.sort_by_key(|stall| (stall.after, stall.hop));
                let facts = Facts {
                    request,
                    length: streams
                        .iter()
                        .map(|s| u64::from(s.visible()))
                        .max()
                        .unwrap_or(0),
                    // The furthest it got: its last records, or a stall past them (a resume
                    // that ended earlier at a hop).
                    reach: streams
                        .iter()
                        .map(RequestAtHop::last_seq)
                        .chain(seen.iter().filter_map(|stall| stall.after))
                        .max()
                        .unwrap_or(0),
                    stalls: &seen,
                };
                for slicer in &mut slicers {
                    slicer.add(&facts);
                }
            }
        }
        longest_first(&mut stalls);
        stalls.truncate(keep);
        let order = |hop: &str| self.path.iter().position(|h| **h == *hop);
        stalls.sort_by(|a, b| {
            (&a.request, order(&a.hop), a.after, a.seq).cmp(&(
                &b.request,
                order(&b.hop),
                b.after,
                b.seq,
            ))
        });
        let hops = self
            .path
            .iter()
            .zip(&self.tables)
            .zip(counts)
            .map(|((hop, table), count)| HopSummary {
                hop: hop.to_string(),
                gaps: table.count(),
                p50: table.quantile(0.5),
                p99: table.quantile(0.99),
                max: table.max(),
                by_position: table.positions(),
                positions_beyond: table.beyond(),
                quiet_spells: table.quiet_spells,
                began: count.began,
                unknown: count.unknown,
                passed_on: count.passed_on,
                pushed_back: count.pushed_back,
                hidden_phases: count.hidden,
                resumes: table.resumes,
                records: table.records,
            })
            .collect();
        Diagnosis {
            stall: Duration::from_nanos(self.stall_ns),
            requests: self.requests.len() as u64,
            records: self.records,
            lines: self.lines,
            filtered: self.filtered,
            stalls_total: total,
            stalls,
            hops,
            slices: slicers.into_iter().map(Slicer::finish).collect(),
            problems: self.problems.summary(),
        }
    }
}

/// Sorts stalls longest first (ties in a fixed order, so the ones kept do not depend on the
/// order requests are stored in).
fn longest_first(stalls: &mut [Stall]) {
    stalls.sort_unstable_by(|a, b| {
        b.gap
            .cmp(&a.gap)
            .then_with(|| a.request.cmp(&b.request))
            .then_with(|| a.hop.cmp(&b.hop))
            .then_with(|| a.after.cmp(&b.after))
            .then_with(|| a.seq.cmp(&b.seq))
    });
}

impl fmt::Debug for Timeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Timeline")
            .field("path", &self.path)
            .field("stall", &Duration::from_nanos(self.stall_ns))
            .field("requests", &self.requests.len())
            .field("records", &self.records)
            .field("details_left", &self.budget.left())
            .finish_non_exhaustive()
    }
}
