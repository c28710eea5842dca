//! The properties the `hop_records` fuzz target checks, shared with `tests/fuzz_corpus.rs` so
//! that every corpus entry also runs under plain `cargo test`.

// Each includer (a fuzz target, a test file) uses a part.
#![allow(dead_code)]

use std::io::{self, Read};
use std::time::Duration;

use streamgate::probe::{HopRecord, MAX_ATTR_KEY, MAX_ATTR_VALUE, MAX_RECORD_ATTRS};
use streamgate::timeline::{Blame, By, Diagnosis, ProblemKind, Timeline};

/// The path the target analyses.
pub const PATH: [&str; 3] = ["a", "b", "c"];
/// The stall threshold: 1 µs, so that small times in short inputs stall.
pub const STALL: Duration = Duration::from_micros(1);
/// The limits, small so that short inputs reach them.
pub const MAX_LINE: usize = 200;
pub const MAX_REQUESTS: usize = 3;
pub const MAX_PROBLEMS: usize = 4;
pub const MAX_STALLS: usize = 2;
pub const MAX_DETAILS: u64 = 6;
pub const MAX_POSITIONS: usize = 4;
pub const REORDER_WINDOW: usize = 2;

fn timeline() -> Timeline {
    timeline_with(REORDER_WINDOW)
}

fn timeline_with(reorder_window: usize) -> Timeline {
    Timeline::new(PATH, STALL)
        .reorder_window(reorder_window)
        .max_line(MAX_LINE)
        .max_requests(MAX_REQUESTS)
        .max_problems(MAX_PROBLEMS)
        .max_stalls(MAX_STALLS)
        .max_details(MAX_DETAILS)
        .max_positions(MAX_POSITIONS)
}

/// The timeline of [`timeline_with`], sliced (by pool and length, and by position).
fn sliced(reorder_window: usize) -> Timeline {
    timeline_with(reorder_window)
        .slice_by([By::Attr("pool".into()), By::Length])
        .slice_by([By::Position])
}

/// A reader that hands out at most `step` bytes per read.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// The diagnosis of `data`, read in one piece.
pub fn diagnose(data: &[u8]) -> Diagnosis {
    diagnose_with(data, REORDER_WINDOW)
}

/// The diagnosis of `data`, read in one piece with a reorder window of `reorder_window`.
fn diagnose_with(data: &[u8], reorder_window: usize) -> Diagnosis {
    let mut timeline = timeline_with(reorder_window);
    timeline.read("fuzz", data).expect("a slice reads");
    timeline.diagnose()
}

/// Arbitrary bytes as hop records: no panic (debug builds check overflow), every limit kept,
/// the counts consistent, nothing claimed from records out of order beyond the reorder window,
/// the JSON output valid and the same as the diagnosis, reading in pieces the same as in one,
/// and every line that parses round-trips through its JSON line.
pub fn check(data: &[u8]) {
    let diagnosis = diagnose(data);

    // Limits.
    assert!(diagnosis.requests <= MAX_REQUESTS as u64);
    assert!(diagnosis.problems.examples.len() <= MAX_PROBLEMS);
    assert!(diagnosis.stalls.len() <= MAX_STALLS);
    assert!(diagnosis.stalls.len() as u64 <= diagnosis.stalls_total);
    for hop in &diagnosis.hops {
        assert!(hop.by_position.len() <= MAX_POSITIONS);
        assert!(hop.p50 <= hop.p99 && hop.p99 <= hop.max, "{hop:?}");
    }
    for problem in &diagnosis.problems.examples {
        assert!(problem.message.len() <= 240 && problem.source.len() <= 240);
    }

    // Counts.
    let counted: u64 = diagnosis.problems.counts.iter().map(|(_, n)| n).sum();
    assert_eq!(counted, diagnosis.problems.total);
    let (began, unknown): (u64, u64) = diagnosis
        .hops
        .iter()
        .fold((0, 0), |(b, u), hop| (b + hop.began, u + hop.unknown));
    assert_eq!(began + unknown, diagnosis.stalls_total);
    for hop in &diagnosis.hops {
        assert!(
            hop.began + hop.unknown + hop.passed_on + hop.pushed_back + hop.hidden_phases
                <= hop.quiet_spells,
            "{hop:?}"
        );
    }
    // Slices: slicing changes no verdict; every request in one slice of a slicing without
    // position, each stall counted in its request's; never more stalled than requests.
    let mut slicing = sliced(REORDER_WINDOW);
    slicing.read("fuzz", data).expect("a slice reads");
    let sliced = slicing.diagnose();
    assert_eq!(sliced.stalls, diagnosis.stalls);
    assert_eq!(sliced.hops, diagnosis.hops);
    assert_eq!(sliced.problems, diagnosis.problems);
    let [by_pool, by_position] = &sliced.slices[..] else {
        panic!("two slicings: {:?}", sliced.slices)
    };
    let in_slices: u64 = by_pool.rows.iter().map(|row| row.requests).sum();
    assert_eq!(in_slices, diagnosis.requests, "{by_pool:?}");
    for slices in [by_pool, by_position] {
        let mut sliced_stalls = 0;
        for row in &slices.rows {
            assert!(row.stalled <= row.requests, "{row:?}");
            assert!(row.gaps_incomplete <= row.requests, "{row:?}");
            assert_eq!(row.values.len(), slices.by.len());
            sliced_stalls += row.unknown + row.began.iter().map(|(_, n)| n).sum::<u64>();
        }
        assert_eq!(sliced_stalls, diagnosis.stalls_total);
    }
    // Nothing after the last hop pushes back.
    assert_eq!(diagnosis.hops.last().map(|hop| hop.pushed_back), Some(0));
    for stall in &diagnosis.stalls {
        assert!(stall.gap >= STALL, "{stall:?}");
        let first = stall.hop == PATH[0];
        match &stall.blame {
            Blame::Began => assert_eq!(first, stall.upstream_gap.is_none(), "{stall:?}"),
            // At the first hop only the hop after it can leave a stall unknown: its details,
            // which say whether it pushed the stall back, were not all kept; or records of the
            // request at either arrived out of order beyond the reorder window.
            Blame::Unknown(why) if first => {
                let next = format!("{}'s ", PATH[1]);
                assert!(
                    (why.starts_with(&next) && why.contains("not"))
                        || PATH[..2].iter().any(|hop| *why == disordered(hop)),
                    "{stall:?}"
                );
            }
            Blame::Unknown(why) => assert!(!why.is_empty(), "{stall:?}"),
            other => panic!("{other:?}"),
        }
        // Unknown for records out of order only when some were.
        if PATH
            .iter()
            .any(|hop| stall.blame == Blame::Unknown(disordered(hop)))
        {
            assert!(
                diagnosis.problems.count(ProblemKind::OutOfOrder) > 0,
                "{stall:?}"
            );
        }
        assert!(
            stall.end_reason.is_none() || stall.seq.is_none(),
            "{stall:?}"
        );
        if let (Some(after), Some(seq)) = (stall.after, stall.seq) {
            assert!(after < seq, "{stall:?}");
        }
        // Attributes come from the records, within their limits.
        assert!(stall.attrs.len() <= MAX_RECORD_ATTRS, "{stall:?}");
        for (key, value) in &stall.attrs {
            assert!(
                key.len() <= MAX_ATTR_KEY && value.len() <= MAX_ATTR_VALUE,
                "{stall:?}"
            );
        }
    }

    // JSON, through serde_json, says the same.
    let json: serde_json::Value = serde_json::from_str(&diagnosis.to_json()).expect("valid JSON");
    assert_eq!(json["requests"], diagnosis.requests);
    assert_eq!(json["stalls_total"], diagnosis.stalls_total);
    assert_eq!(json["problems"]["total"], diagnosis.problems.total);
    assert_eq!(
        json["problems"]["examples"].as_array().map(Vec::len),
        Some(diagnosis.problems.examples.len())
    );
    assert!(!diagnosis.report().is_empty());

    // Reading in pieces changes nothing.
    let step = usize::from(data.first().copied().unwrap_or(1)).max(1);
    let mut timeline = timeline();
    timeline
        .read("fuzz", Trickle { data, step })
        .expect("a trickle reads");
    assert_eq!(timeline.diagnose(), diagnosis);

    // Parsed lines round-trip.
    for line in data.split(|&b| b == b'\n') {
        let Ok(text) = std::str::from_utf8(line) else {
            continue;
        };
        if let Ok(record) = HopRecord::parse_line(text) {
            let again = HopRecord::parse_line(&record.to_json_line()).expect("its own line parses");
            assert_eq!(again, record);
        }
    }
}

/// Why a stall is unknown when records of its request at `hop` arrived out of order beyond
/// the reorder window.
fn disordered(hop: &str) -> String {
    format!(
        "records of this request at {hop} arrived out of order beyond the reorder window of \
         {REORDER_WINDOW} records"
    )
}

/// What an input reaches: each limit, each problem kind, each verdict of the blame rule.
pub fn reach(data: &[u8]) -> Vec<(&'static str, bool)> {
    let d = diagnose(data);
    let problem = |kind| d.problems.count(kind) > 0;
    let any_hop = |f: fn(&streamgate::timeline::HopSummary) -> bool| d.hops.iter().any(f);
    vec![
        ("line limit", problem(ProblemKind::LongLine)),
        ("request limit", problem(ProblemKind::RequestLimit)),
        ("detail limit", problem(ProblemKind::DetailLimit)),
        (
            "problem examples limit",
            d.problems.total > d.problems.examples.len() as u64,
        ),
        ("stall list limit", d.stalls_total > d.stalls.len() as u64),
        ("position limit", any_hop(|h| h.positions_beyond > 0)),
        ("bad record", problem(ProblemKind::BadRecord)),
        ("unknown hop", problem(ProblemKind::UnknownHop)),
        ("duplicate", problem(ProblemKind::Duplicate)),
        ("out of order", problem(ProblemKind::OutOfOrder)),
        (
            "put back in order",
            diagnose_with(data, 0)
                .problems
                .count(ProblemKind::OutOfOrder)
                > d.problems.count(ProblemKind::OutOfOrder),
        ),
        (
            "unknown for records out of order",
            d.stalls.iter().any(|s| {
                PATH.iter()
                    .any(|hop| s.blame == Blame::Unknown(disordered(hop)))
            }),
        ),
        ("time backwards", problem(ProblemKind::TimeBackwards)),
        ("bad idle", problem(ProblemKind::BadIdle)),
        ("after end", problem(ProblemKind::AfterEnd)),
        ("resume", any_hop(|h| h.resumes > 0)),
        ("began", any_hop(|h| h.began > 0)),
        ("unknown", any_hop(|h| h.unknown > 0)),
        ("passed on", any_hop(|h| h.passed_on > 0)),
        ("pushed back", any_hop(|h| h.pushed_back > 0)),
        ("hidden phase", any_hop(|h| h.hidden_phases > 0)),
        ("stall to the end", d.stalls.iter().any(|s| s.seq.is_none())),
        ("attributes", d.stalls.iter().any(|s| !s.attrs.is_empty())),
        (
            "u64::MAX",
            data.windows(20).any(|w| w == b"18446744073709551615"),
        ),
    ]
}
