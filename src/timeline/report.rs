//! What the analysis found, for people (a text report) and for programs (JSON).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::time::Duration;

use serde::Serialize;

use super::problems::Problems;
use super::table::PositionGap;
use crate::end::EndReason;

/// The slices' table: one line per slice, the values that stand out first.
fn write_slices(out: &mut impl Write, slices: &super::Slices) -> io::Result<()> {
    let by: Vec<String> = slices.by.iter().map(ToString::to_string).collect();
    writeln!(
        out,
        "by {} (gap p99 at {}; the stall rates that stand out first):",
        by.join(", "),
        slices.hop
    )?;
    let width = slices
        .rows
        .iter()
        .map(|row| row.values.join(" ").len())
        .chain([by.join(" ").len()])
        .max()
        .unwrap_or(0)
        .min(48);
    writeln!(
        out,
        "  {:<width$} {:>9} {:>8} {:>7} {:>11}  began at",
        by.join(" "),
        "requests",
        "stalled",
        "rate",
        "gap p99 ms"
    )?;
    for row in &slices.rows {
        let p99 = row
            .gap_p99
            .map_or_else(|| "-".to_owned(), |p99| format!("{:.1}", ms(p99)));
        let mut began: Vec<String> = row
            .began
            .iter()
            .map(|(hop, n)| format!("{hop} {n}"))
            .collect();
        if row.unknown > 0 {
            began.push(format!("unknown {}", row.unknown));
        }
        let line = format!(
            "  {:<width$} {:>9} {:>8} {:>6.2}% {:>11}  {}",
            row.values.join(" "),
            row.requests,
            row.stalled,
            100.0 * row.stall_rate(),
            p99,
            began.join(", ")
        );
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// The page's hop where its app had handled an event and the next frame was painted (the
/// `browser` probe's): a stall that began there is the page's main thread being busy.
const RENDER_HOP: &str = "client.render";

/// Who a stall is blamed on.
///
/// # Examples
///
/// The gateway was quiet for 2 s; the worker before it has no records of the request, so
/// where the stall began cannot be told.
///
/// ```
/// use std::time::Duration;
/// use streamgate::timeline::{Blame, Timeline};
///
/// let records = r#"{"request":"r1","hop":"gateway.write","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
/// {"request":"r1","hop":"gateway.write","seq":1,"t_ns":2000000000,"bytes":3,"kind":"visible"}"#;
/// let mut timeline = Timeline::new(["worker.publish", "gateway.write"], Duration::from_secs(1));
/// timeline.add_lines("gateway.jsonl", records);
/// let stall = &timeline.diagnose().stalls[0];
/// let said = match &stall.blame {
///     Blame::Began => format!("began at {}", stall.hop),
///     Blame::Unknown(why) => format!("seen at {}, unknown: {why}", stall.hop),
///     _ => format!("seen at {}", stall.hop), // `Blame` may grow
/// };
/// assert_eq!(said, "seen at gateway.write, unknown: no records of this request at worker.publish");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Blame {
    /// It began at the stall's hop: the first hop of the path, or the hop before it was
    /// regular over the same events; and the hop after it did not show it was back-pressure
    /// (see [`HopSummary::pushed_back`]).
    Began,
    /// It cannot be told: the data that would decide it is missing (the reason says which).
    /// The stall's hop is where it was seen; it began there or further up.
    Unknown(String),
}

/// A stall, at the hop it began at (or was seen at, when the blame is unknown).
///
/// # Examples
///
/// The gateway was quiet for 2 s between events 0 and 1, while the worker before it sent them
/// 10 ms apart: the stall began at the gateway.
///
/// ```
/// use std::time::Duration;
/// use streamgate::timeline::{Blame, Timeline};
///
/// let records = r#"{"request":"r1","hop":"worker.publish","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
/// {"request":"r1","hop":"worker.publish","seq":1,"t_ns":10000000,"bytes":3,"kind":"visible"}
/// {"request":"r1","hop":"gateway.write","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
/// {"request":"r1","hop":"gateway.write","seq":1,"t_ns":2000000000,"bytes":3,"kind":"visible"}"#;
/// let mut timeline = Timeline::new(["worker.publish", "gateway.write"], Duration::from_secs(1));
/// timeline.add_lines("records.jsonl", records);
/// let diagnosis = timeline.diagnose();
/// let stall = &diagnosis.stalls[0];
/// assert_eq!((stall.request.as_str(), stall.hop.as_str()), ("r1", "gateway.write"));
/// // From the progress record of event 0 to that of event 1; `None` would be the start or end.
/// assert_eq!((stall.after, stall.seq, stall.end_reason), (Some(0), Some(1), None));
/// assert_eq!(stall.gap, Duration::from_secs(2));
/// assert_eq!(stall.upstream_gap, Some(Duration::from_millis(10)));
/// assert!(stall.upstream_gap_exact);
/// assert_eq!(stall.blame, Blame::Began);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stall {
    /// The request.
    pub request: String,
    /// The hop it began at, or, when [`Blame::Unknown`], the hop it was seen at.
    pub hop: String,
    /// The progress record it followed (`None`: it began with the stream at the hop).
    pub after: Option<u64>,
    /// The progress record that ended it (`None`: the stream ended in it).
    pub seq: Option<u64>,
    /// When the stream ended in it: the end reason.
    pub end_reason: Option<EndReason>,
    /// How long the hop was quiet, on its own clock.
    pub gap: Duration,
    /// For [`Blame::Began`] below the first hop: the hop before it, over the same events, was
    /// at most this quiet (its longest quiet spell there; an upper bound when
    /// [`upstream_gap_exact`](Stall::upstream_gap_exact) is false).
    pub upstream_gap: Option<Duration>,
    /// Whether `upstream_gap` is exact rather than an upper bound. The analysis keeps a
    /// stream's quiet spells of a tenth of the threshold or more exactly, and bounds shorter
    /// ones by the longest in each of eight windows of seqs (exact, to the microsecond, while a
    /// stream has at most eight progress records after its first): an upper bound is always
    /// below a tenth of the threshold.
    pub upstream_gap_exact: bool,
    /// Who it is blamed on.
    pub blame: Blame,
    /// The stream's attributes at the hop when it went quiet (as of the record it followed, or
    /// as the stream began there), as its hop records set them (`upstream`, `pool`, ...):
    /// what served it then. Empty when its records carried none, or the analysis did not keep
    /// them (past the detail budget: never the attributes of another time).
    pub attrs: Vec<(String, String)>,
    /// How long the hop's thread was busy within it, when the record that ended it said
    /// (`busy_ns`: a page's long animation frames at `client.render`, where a stall that began
    /// means the page's main thread was busy while its events arrived).
    pub busy: Option<Duration>,
}

/// One hop's gaps and stalls over every request.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamgate::timeline::Timeline;
///
/// let records = r#"{"request":"r1","hop":"worker.publish","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
/// {"request":"r1","hop":"worker.publish","seq":1,"t_ns":10000000,"bytes":3,"kind":"visible"}
/// {"request":"r1","hop":"gateway.write","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
/// {"request":"r1","hop":"gateway.write","seq":1,"t_ns":2000000000,"bytes":3,"kind":"visible"}"#;
/// let mut timeline = Timeline::new(["worker.publish", "gateway.write"], Duration::from_secs(1));
/// timeline.add_lines("records.jsonl", records);
/// let diagnosis = timeline.diagnose();
/// let [worker, gateway] = &diagnosis.hops[..] else { panic!("one summary per hop") };
/// assert_eq!((worker.hop.as_str(), worker.gaps), ("worker.publish", 1));
/// assert_eq!(worker.max, Duration::from_millis(10));
/// assert_eq!((gateway.quiet_spells, gateway.began, gateway.passed_on), (1, 1, 0));
/// assert_eq!(gateway.p99, Duration::from_secs(2));
/// assert_eq!(gateway.records, 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HopSummary {
    /// The hop.
    pub hop: String,
    /// Visible gaps (visible event to visible event, and from the last visible event to the
    /// end when no hidden event came after it).
    pub gaps: u64,
    /// The median gap (the top of its histogram bucket: within 12.5%).
    pub p50: Duration,
    /// The 99th percentile gap (likewise).
    pub p99: Duration,
    /// The longest gap.
    pub max: Duration,
    /// The longest and mean gap at each output position (the visible event's index in its
    /// stream), up to the timeline's position limit.
    pub by_position: Vec<PositionGap>,
    /// Gaps at positions past that limit (counted in the histogram, not by position).
    pub positions_beyond: u64,
    /// Quiet spells at or above the threshold here, wherever they began.
    pub quiet_spells: u64,
    /// Stalls that began here.
    pub began: u64,
    /// Stalls seen here whose blame is unknown.
    pub unknown: u64,
    /// Quiet spells passed on from the hop before (reported there, or further up).
    pub passed_on: u64,
    /// Quiet spells pushed back from the hop after: back-pressure, the hop after being behind
    /// and catching up as soon as this one went on (reported there, or further down).
    pub pushed_back: u64,
    /// Quiet spells in which the hop before progressed with hidden events this hop does not
    /// carry: not stalls.
    pub hidden_phases: u64,
    /// Streams resumed at this hop (records after an end record).
    pub resumes: u64,
    /// Records taken for this hop.
    pub records: u64,
}

/// What the analysis found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Diagnosis {
    /// The stall threshold.
    pub stall: Duration,
    /// Requests analysed.
    pub requests: u64,
    /// Records taken.
    pub records: u64,
    /// Lines read (blank ones included).
    pub lines: u64,
    /// Records left out by the request filter or the window of
    /// [`Timeline::read_last`](super::Timeline::read_last).
    pub filtered: u64,
    /// Stalls found: began at a hop, or unknown.
    pub stalls_total: u64,
    /// The stalls listed: all of them, or the longest up to the timeline's stall limit; by
    /// request, then hop in path order, then seq.
    pub stalls: Vec<Stall>,
    /// Per hop, in path order.
    pub hops: Vec<HopSummary>,
    /// The requests sliced by the keys of each [`Timeline::slice_by`](super::Timeline::slice_by),
    /// in the order they were given (none without).
    pub slices: Vec<super::Slices>,
    /// What was wrong with the input.
    pub problems: Problems,
}

fn ms(duration: Duration) -> f64 {
    (duration.as_nanos() as f64 / 1e3).round() / 1e3
}

fn span(stall: &Stall) -> String {
    let after = stall
        .after
        .map_or_else(|| "start".to_owned(), |s| format!("seq {s}"));
    let to = match (stall.seq, &stall.end_reason) {
        (Some(s), _) => format!("seq {s}"),
        (None, Some(reason)) => format!("end ({reason})"),
        (None, None) => "end".to_owned(),
    };
    format!("{after} -> {to}")
}

impl Diagnosis {
    /// Whether any stall was found (began at a hop, or unknown): the `diagnose` command's exit
    /// status.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::Timeline;
    ///
    /// let records = r#"{"request":"r1","hop":"worker.publish","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
    /// {"request":"r1","hop":"worker.publish","seq":1,"t_ns":10000000,"bytes":3,"kind":"visible"}
    /// {"request":"r1","hop":"gateway.write","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
    /// {"request":"r1","hop":"gateway.write","seq":1,"t_ns":2000000000,"bytes":3,"kind":"visible"}"#;
    /// let mut timeline = Timeline::new(["worker.publish", "gateway.write"], Duration::from_secs(1));
    /// timeline.add_lines("records.jsonl", records);
    /// let diagnosis = timeline.diagnose();
    /// assert!(diagnosis.has_stalls());
    /// ```
    pub fn has_stalls(&self) -> bool {
        self.stalls_total > 0
    }

    /// A report for people: the stalls, a table per hop, and the problems.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::Timeline;
    ///
    /// let records = r#"{"request":"r1","hop":"worker.publish","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
    /// {"request":"r1","hop":"worker.publish","seq":1,"t_ns":10000000,"bytes":3,"kind":"visible"}
    /// {"request":"r1","hop":"gateway.write","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
    /// {"request":"r1","hop":"gateway.write","seq":1,"t_ns":2000000000,"bytes":3,"kind":"visible"}"#;
    /// let mut timeline = Timeline::new(["worker.publish", "gateway.write"], Duration::from_secs(1));
    /// timeline.add_lines("records.jsonl", records);
    /// let diagnosis = timeline.diagnose();
    /// let report = diagnosis.report();
    /// let lines: Vec<&str> = report.lines().collect();
    /// assert_eq!(lines[0], "1 requests, 4 records from 4 lines; a stall is a quiet spell of 1000 ms or more");
    /// assert_eq!(lines[1], "1 stalls (0 unknown):");
    /// assert_eq!(
    ///     lines[2],
    ///     "  began at gateway.write    request r1: seq 0 -> seq 1, quiet 2000.0 ms (upstream quiet 10.0 ms)"
    /// );
    /// // Then a table of gaps and stalls per hop, and the problems in the input, if any.
    /// assert!(lines[3].trim_start().starts_with("hop"));
    /// ```
    pub fn report(&self) -> String {
        let mut out = Vec::new();
        self.write_report(&mut out)
            .expect("writing into a Vec cannot fail");
        String::from_utf8(out).expect("the report is UTF-8")
    }

    /// Writes [`report`](Diagnosis::report) to `out`.
    ///
    /// # Errors
    ///
    /// What writing to `out` returns (a closed pipe, for one).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::Timeline;
    ///
    /// let diagnosis = Timeline::new(["gateway.write"], Duration::from_secs(1)).diagnose();
    /// diagnosis.write_report(&mut std::io::stdout().lock())?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn write_report(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "{} requests, {} records from {} lines; a stall is a quiet spell of {} ms or more",
            self.requests,
            self.records,
            self.lines,
            ms(self.stall)
        )?;
        if self.filtered > 0 {
            writeln!(
                out,
                "  {} records left out by --request / --since",
                self.filtered
            )?;
        }
        let unknown = self
            .hops
            .iter()
            .fold(0u64, |n, hop| n.saturating_add(hop.unknown));
        write!(out, "{} stalls ({} unknown)", self.stalls_total, unknown)?;
        if (self.stalls.len() as u64) < self.stalls_total {
            write!(out, "; the {} longest are listed", self.stalls.len())?;
        }
        writeln!(out, "{}", if self.stalls.is_empty() { "" } else { ":" })?;
        for stall in &self.stalls {
            let mut line = match &stall.blame {
                Blame::Began => format!("  began at {:<16}", stall.hop),
                Blame::Unknown(_) => format!("  unknown, at {:<13}", stall.hop),
            };
            let _ = write!(
                line,
                " request {}: {}, quiet {:.1} ms",
                stall.request,
                span(stall),
                ms(stall.gap)
            );
            match (&stall.blame, stall.upstream_gap) {
                (Blame::Unknown(why), _) => {
                    let _ = write!(line, ": {why}");
                }
                (Blame::Began, None) => line.push_str(" (first hop)"),
                (Blame::Began, Some(gap)) => {
                    let bound = if stall.upstream_gap_exact {
                        ""
                    } else {
                        "at most "
                    };
                    let _ = write!(line, " (upstream quiet {bound}{:.1} ms)", ms(gap));
                }
            }
            match (&stall.blame, stall.busy) {
                (Blame::Began, busy) if stall.hop == RENDER_HOP => {
                    line.push_str(": the page's main thread was busy");
                    match busy {
                        Some(busy) => {
                            let _ = write!(line, " (long frames for {:.1} ms)", ms(busy));
                        }
                        None => line.push_str(" (the browser reported no long frame)"),
                    }
                }
                (_, Some(busy)) => {
                    let _ = write!(line, " (its thread busy {:.1} ms)", ms(busy));
                }
                (_, None) => {}
            }
            for (key, value) in &stall.attrs {
                let _ = write!(line, " {key}={value}");
            }
            writeln!(out, "{line}")?;
        }
        writeln!(
            out,
            "  {:<16} {:>8} {:>9} {:>9} {:>9} {:>7} {:>6} {:>7} {:>7} {:>7} {:>7}",
            "hop",
            "gaps",
            "p50 ms",
            "p99 ms",
            "max ms",
            "stalls",
            "began",
            "unknown",
            "passed",
            "pushed",
            "hidden"
        )?;
        for hop in &self.hops {
            writeln!(
                out,
                "  {:<16} {:>8} {:>9.1} {:>9.1} {:>9.1} {:>7} {:>6} {:>7} {:>7} {:>7} {:>7}",
                hop.hop,
                hop.gaps,
                ms(hop.p50),
                ms(hop.p99),
                ms(hop.max),
                hop.quiet_spells,
                hop.began,
                hop.unknown,
                hop.passed_on,
                hop.pushed_back,
                hop.hidden_phases
            )?;
        }
        for slices in &self.slices {
            write_slices(out, slices)?;
        }
        let problems = &self.problems;
        if !problems.is_empty() {
            let counts: Vec<String> = problems
                .counts
                .iter()
                .map(|(kind, n)| format!("{} {n}", kind.as_str()))
                .collect();
            write!(
                out,
                "{} problems in the input ({})",
                problems.total,
                counts.join(", ")
            )?;
            if (problems.examples.len() as u64) < problems.total {
                write!(out, "; the first {}", problems.examples.len())?;
            }
            writeln!(out, ":")?;
            for problem in &problems.examples {
                let at = match problem.line {
                    Some(line) => format!("{}:{line}", problem.source),
                    None => problem.source.clone(),
                };
                writeln!(
                    out,
                    "  {at}: [{}] {}",
                    problem.kind.as_str(),
                    problem.message
                )?;
            }
        }
        Ok(())
    }

    /// The diagnosis as one JSON object (through serde_json):
    ///
    /// ```text
    /// {"stall_ms":..,"requests":..,"records":..,"lines":..,"filtered":..,
    ///  "stalls_total":..,"stalls":[{"request":..,"hop":..,"after":SEQ|null,"seq":SEQ|null,
    ///    "end_reason":..|null,"gap_ms":..,"upstream_gap_ms":..|null,"upstream_gap_exact":..,
    ///    "blame":"began"|"unknown","why":..|null}],
    ///  "hops":[{"hop":..,"gaps":..,"p50_ms":..,"p99_ms":..,"max_ms":..,"positions_beyond":..,
    ///    "quiet_spells":..,"began":..,"unknown":..,"passed_on":..,"pushed_back":..,
    ///    "hidden_phases":..,
    ///    "resumes":..,"records":..}],
    ///  "slices":[{"by":[KEY,..],"hop":..,"rows":[{"values":[..],"requests":..,"stalled":..,
    ///    "stall_rate":..,"unknown":..,"gap_p99_ms":..|null,"gaps_incomplete":..,
    ///    "began":{HOP:N,..}}]},..]  (one per `Timeline::slice_by`; absent without),
    ///  "problems":{"total":..,"counts":{KIND:N,..},"examples":[{"source":..,"line":N|null,
    ///    "kind":..,"message":..}]}}
    /// ```
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::Timeline;
    ///
    /// let records = r#"{"request":"r1","hop":"worker.publish","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
    /// {"request":"r1","hop":"worker.publish","seq":1,"t_ns":10000000,"bytes":3,"kind":"visible"}
    /// {"request":"r1","hop":"gateway.write","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
    /// {"request":"r1","hop":"gateway.write","seq":1,"t_ns":2000000000,"bytes":3,"kind":"visible"}"#;
    /// let mut timeline = Timeline::new(["worker.publish", "gateway.write"], Duration::from_secs(1));
    /// timeline.add_lines("records.jsonl", records);
    /// let diagnosis = timeline.diagnose();
    /// let json: serde_json::Value = serde_json::from_str(&diagnosis.to_json())?;
    /// assert_eq!(json["stalls_total"], 1);
    /// let stall = &json["stalls"][0];
    /// assert_eq!(stall["hop"], "gateway.write");
    /// assert_eq!(stall["blame"], "began");
    /// assert_eq!(stall["gap_ms"], 2000.0);
    /// assert_eq!(json["hops"][0]["max_ms"], 10.0);
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.json()).expect("plain data serializes")
    }

    /// Writes [`to_json`](Diagnosis::to_json) to `out`.
    ///
    /// # Errors
    ///
    /// What writing to `out` returns.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::timeline::Timeline;
    ///
    /// let diagnosis = Timeline::new(["gateway.write"], Duration::from_secs(1)).diagnose();
    /// let mut out = Vec::new();
    /// diagnosis.write_json(&mut out)?;
    /// assert_eq!(out, diagnosis.to_json().into_bytes());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn write_json(&self, out: &mut impl Write) -> io::Result<()> {
        serde_json::to_writer(&mut *out, &self.json()).map_err(io::Error::from)
    }

    fn json(&self) -> Json<'_> {
        Json {
            stall_ms: ms(self.stall),
            requests: self.requests,
            records: self.records,
            lines: self.lines,
            filtered: self.filtered,
            stalls_total: self.stalls_total,
            stalls: self
                .stalls
                .iter()
                .map(|stall| JsonStall {
                    request: &stall.request,
                    hop: &stall.hop,
                    after: stall.after,
                    seq: stall.seq,
                    end_reason: stall.end_reason.map(EndReason::as_str),
                    gap_ms: ms(stall.gap),
                    upstream_gap_ms: stall.upstream_gap.map(ms),
                    upstream_gap_exact: stall.upstream_gap_exact,
                    blame: match stall.blame {
                        Blame::Began => "began",
                        Blame::Unknown(_) => "unknown",
                    },
                    why: match &stall.blame {
                        Blame::Began => None,
                        Blame::Unknown(why) => Some(why),
                    },
                    busy_ms: stall.busy.map(ms),
                    attrs: stall
                        .attrs
                        .iter()
                        .map(|(key, value)| (key.as_str(), value.as_str()))
                        .collect(),
                })
                .collect(),
            hops: self
                .hops
                .iter()
                .map(|hop| JsonHop {
                    hop: &hop.hop,
                    gaps: hop.gaps,
                    p50_ms: ms(hop.p50),
                    p99_ms: ms(hop.p99),
                    max_ms: ms(hop.max),
                    positions_beyond: hop.positions_beyond,
                    quiet_spells: hop.quiet_spells,
                    began: hop.began,
                    unknown: hop.unknown,
                    passed_on: hop.passed_on,
                    pushed_back: hop.pushed_back,
                    hidden_phases: hop.hidden_phases,
                    resumes: hop.resumes,
                    records: hop.records,
                })
                .collect(),
            slices: self
                .slices
                .iter()
                .map(|slices| JsonSlices {
                    by: slices.by.iter().map(ToString::to_string).collect(),
                    hop: &slices.hop,
                    rows: slices
                        .rows
                        .iter()
                        .map(|row| JsonSlice {
                            values: &row.values,
                            requests: row.requests,
                            stalled: row.stalled,
                            stall_rate: row.stall_rate(),
                            unknown: row.unknown,
                            gap_p99_ms: row.gap_p99.map(ms),
                            gaps_incomplete: row.gaps_incomplete,
                            began: row
                                .began
                                .iter()
                                .map(|(hop, n)| (hop.as_str(), *n))
                                .collect(),
                        })
                        .collect(),
                })
                .collect(),
            problems: JsonProblems {
                total: self.problems.total,
                counts: self
                    .problems
                    .counts
                    .iter()
                    .map(|(kind, n)| (kind.as_str(), *n))
                    .collect(),
                examples: self
                    .problems
                    .examples
                    .iter()
                    .map(|p| JsonProblem {
                        source: &p.source,
                        line: p.line,
                        kind: p.kind.as_str(),
                        message: &p.message,
                    })
                    .collect(),
            },
        }
    }
}

#[derive(Serialize)]
struct Json<'a> {
    stall_ms: f64,
    requests: u64,
    records: u64,
    lines: u64,
    filtered: u64,
    stalls_total: u64,
    stalls: Vec<JsonStall<'a>>,
    hops: Vec<JsonHop<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    slices: Vec<JsonSlices<'a>>,
    problems: JsonProblems<'a>,
}

#[derive(Serialize)]
struct JsonSlices<'a> {
    by: Vec<String>,
    hop: &'a str,
    rows: Vec<JsonSlice<'a>>,
}

#[derive(Serialize)]
struct JsonSlice<'a> {
    values: &'a [String],
    requests: u64,
    stalled: u64,
    stall_rate: f64,
    unknown: u64,
    gap_p99_ms: Option<f64>,
    gaps_incomplete: u64,
    began: BTreeMap<&'a str, u64>,
}

#[derive(Serialize)]
struct JsonStall<'a> {
    request: &'a str,
    hop: &'a str,
    after: Option<u64>,
    seq: Option<u64>,
    end_reason: Option<&'a str>,
    gap_ms: f64,
    upstream_gap_ms: Option<f64>,
    upstream_gap_exact: bool,
    blame: &'static str,
    why: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    busy_ms: Option<f64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    attrs: BTreeMap<&'a str, &'a str>,
}

#[derive(Serialize)]
struct JsonHop<'a> {
    hop: &'a str,
    gaps: u64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    positions_beyond: u64,
    quiet_spells: u64,
    began: u64,
    unknown: u64,
    passed_on: u64,
    pushed_back: u64,
    hidden_phases: u64,
    resumes: u64,
    records: u64,
}

#[derive(Serialize)]
struct JsonProblems<'a> {
    total: u64,
    counts: std::collections::BTreeMap<&'static str, u64>,
    examples: Vec<JsonProblem<'a>>,
}

#[derive(Serialize)]
struct JsonProblem<'a> {
    source: &'a str,
    line: Option<u64>,
    kind: &'static str,
    message: &'a str,
}
