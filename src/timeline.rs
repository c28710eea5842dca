//! Timeline analysis: which hop a stall began at, from hop records of several processes.
//!
//! Give it the hops in path order (`worker.decode`, `worker.publish`, `gateway.recv`,
//! `gateway.write`, `client.recv`) and the hop records each wrote. For every request it
//! computes each hop's gaps *on that hop's own clock only*: timestamps of different hops (or
//! processes, or machines) are never subtracted, so clock offsets cannot matter. A stall (a
//! visible gap at or above the threshold) at hop H and seq s is blamed on H when H is the first
//! hop in the path, or when the previous hop that recorded the request was regular (its gap at
//! s below the threshold); a hop that only passes an upstream stall on is never blamed.
//!
//! Bad input (lines that do not parse, unknown hops, duplicate or missing seqs, times going
//! backwards) is reported, line by line where it can be, and skipped; it never panics.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use streamgate::timeline::Timeline;
//!
//! let worker = r#"{"request":"r1","hop":"worker.publish","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
//! {"request":"r1","hop":"worker.publish","seq":1,"t_ns":5000000,"bytes":3,"kind":"visible"}"#;
//! // The gateway's clock is unrelated to the worker's; only its own gaps count.
//! let gateway = r#"{"request":"r1","hop":"gateway.write","seq":0,"t_ns":900000000000,"bytes":3,"kind":"visible"}
//! {"request":"r1","hop":"gateway.write","seq":1,"t_ns":902005000000,"bytes":3,"kind":"visible"}"#;
//! let mut timeline = Timeline::new(["worker.publish", "gateway.write"], Duration::from_secs(1));
//! timeline.add_lines("worker.jsonl", worker);
//! timeline.add_lines("gateway.jsonl", gateway);
//! let diagnosis = timeline.diagnose();
//! assert_eq!(diagnosis.stalls.len(), 1);
//! assert_eq!(diagnosis.stalls[0].hop, "gateway.write");
//! assert_eq!(diagnosis.stalls[0].upstream_gap, Some(Duration::from_millis(5)));
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::chunk::Kind;
use crate::probe::HopRecord;
use crate::probe::json_string;

/// One request's records at one hop: seq -> (t_ns, kind).
type Seqs = BTreeMap<u64, (u64, Kind)>;

/// Hop records gathered for analysis.
#[derive(Debug, Clone)]
pub struct Timeline {
    path: Vec<String>,
    stall_ns: u64,
    /// request -> hop index -> records
    records: BTreeMap<String, BTreeMap<usize, Seqs>>,
    problems: Vec<Problem>,
}

/// Something wrong with the input, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Problem {
    /// The file (or other source) name.
    pub source: String,
    /// The 1-based line, when the problem is one line's.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

/// A stall and the hop it began at.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stall {
    /// The request.
    pub request: String,
    /// The visible event the gap ended at.
    pub seq: u64,
    /// The first hop in path order where the gap is a stall.
    pub hop: String,
    /// The gap at that hop.
    pub gap: Duration,
    /// The previous hop's gap at the same seq, when it has one.
    pub upstream_gap: Option<Duration>,
}

/// One hop's gaps over every request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HopGaps {
    /// The hop.
    pub hop: String,
    /// Every visible gap: the visible event's output position (0-based among the visible
    /// events of its request) and the gap that ended at it.
    pub gaps: Vec<(u64, Duration)>,
    /// The median gap.
    pub p50: Duration,
    /// The 99th percentile gap.
    pub p99: Duration,
    /// The longest gap.
    pub max: Duration,
    /// Gaps at or above the stall threshold, wherever they began.
    pub stalls: u64,
}

/// What the analysis found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Diagnosis {
    /// Requests with records.
    pub requests: usize,
    /// Each stall, at the hop it began at.
    pub stalls: Vec<Stall>,
    /// Per hop, in path order.
    pub hops: Vec<HopGaps>,
    /// Input that was skipped, and why.
    pub problems: Vec<Problem>,
}

impl Timeline {
    /// An empty timeline for the hops of `path`, in order, with `stall` as the stall threshold.
    pub fn new<I, S>(path: I, stall: Duration) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Timeline {
            path: path.into_iter().map(Into::into).collect(),
            stall_ns: u64::try_from(stall.as_nanos()).unwrap_or(u64::MAX),
            records: BTreeMap::new(),
            problems: Vec::new(),
        }
    }

    /// Adds the hop records in `text` (JSON lines; blank lines are skipped), naming `source` in
    /// any problem found.
    pub fn add_lines(&mut self, source: &str, text: &str) {
        for (index, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match HopRecord::parse_line(line) {
                Ok(record) => self.add(source, Some(index + 1), record),
                Err(error) => self.problem(source, Some(index + 1), error.to_string()),
            }
        }
    }

    /// Adds one record.
    pub fn add_record(&mut self, source: &str, record: HopRecord) {
        self.add(source, None, record);
    }

    fn add(&mut self, source: &str, line: Option<usize>, record: HopRecord) {
        let Some(hop) = self.path.iter().position(|hop| *hop == record.hop) else {
            let message = format!("hop `{}` is not on the path", record.hop);
            return self.problem(source, line, message);
        };
        let seqs = self
            .records
            .entry(record.request.clone())
            .or_default()
            .entry(hop)
            .or_default();
        if seqs
            .insert(record.seq, (record.t_ns, record.kind))
            .is_some()
        {
            let message = format!(
                "request `{}`, hop `{}`: seq {} recorded twice (the later record is kept)",
                record.request, record.hop, record.seq
            );
            self.problem(source, line, message);
        }
    }

    fn problem(&mut self, source: &str, line: Option<usize>, message: String) {
        self.problems.push(Problem {
            source: source.to_owned(),
            line,
            message,
        });
    }

    /// Computes every hop's gaps and names the hop each stall began at.
    pub fn diagnose(&self) -> Diagnosis {
        let mut problems = self.problems.clone();
        let mut per_hop: Vec<Vec<(u64, u64)>> = vec![Vec::new(); self.path.len()];
        let mut stalls = Vec::new();
        for (request, hops) in &self.records {
            // hop index -> seq -> gap, for this request.
            let mut gaps: BTreeMap<usize, BTreeMap<u64, u64>> = BTreeMap::new();
            for (&hop, seqs) in hops {
                let found = self.gaps(request, &self.path[hop], seqs, &mut problems);
                per_hop[hop].extend(found.iter().map(|&(_, position, gap)| (position, gap)));
                gaps.insert(
                    hop,
                    found.into_iter().map(|(seq, _, gap)| (seq, gap)).collect(),
                );
            }
            let mut upstream: Option<usize> = None;
            for (&hop, hop_gaps) in &gaps {
                for (&seq, &gap) in hop_gaps.iter().filter(|(_, gap)| **gap >= self.stall_ns) {
                    let upstream_gap = upstream.and_then(|up| gaps[&up].get(&seq).copied());
                    if upstream_gap.is_some_and(|up| up >= self.stall_ns) {
                        continue; // passed on from upstream
                    }
                    stalls.push(Stall {
                        request: request.clone(),
                        seq,
                        hop: self.path[hop].clone(),
                        gap: Duration::from_nanos(gap),
                        upstream_gap: upstream_gap.map(Duration::from_nanos),
                    });
                }
                upstream = Some(hop);
            }
        }
        stalls.sort_by(|a, b| (&a.request, a.seq).cmp(&(&b.request, b.seq)));
        let hops = self
            .path
            .iter()
            .zip(per_hop)
            .map(|(hop, gaps)| self.summary(hop, gaps))
            .collect();
        Diagnosis {
            requests: self.records.len(),
            stalls,
            hops,
            problems,
        }
    }

    /// One request's visible gaps at one hop: (seq, output position, gap ns).
    fn gaps(
        &self,
        request: &str,
        hop: &str,
        seqs: &Seqs,
        problems: &mut Vec<Problem>,
    ) -> Vec<(u64, u64, u64)> {
        let mut found = Vec::new();
        let mut previous: Option<(u64, u64)> = None; // (seq, t_ns) of the last visible event
        let mut expected = seqs.keys().next().copied().unwrap_or(0);
        let mut position = 0;
        for (&seq, &(t_ns, kind)) in seqs {
            if seq != expected {
                problems.push(self.request_problem(
                    request,
                    hop,
                    format!("seq {expected}..{} missing", seq - 1),
                ));
            }
            expected = seq + 1;
            if kind != Kind::Visible {
                continue;
            }
            if let Some((last_seq, last_t)) = previous {
                match t_ns.checked_sub(last_t) {
                    Some(gap) => found.push((seq, position, gap)),
                    None => problems.push(self.request_problem(
                        request,
                        hop,
                        format!("time goes backwards from seq {last_seq} to seq {seq}"),
                    )),
                }
            }
            previous = Some((seq, t_ns));
            position += 1;
        }
        found
    }

    fn request_problem(&self, request: &str, hop: &str, message: String) -> Problem {
        Problem {
            source: format!("request `{request}`, hop `{hop}`"),
            line: None,
            message,
        }
    }

    fn summary(&self, hop: &str, gaps: Vec<(u64, u64)>) -> HopGaps {
        let mut sorted: Vec<u64> = gaps.iter().map(|&(_, gap)| gap).collect();
        sorted.sort_unstable();
        let quantile = |q: f64| {
            if sorted.is_empty() {
                return Duration::ZERO;
            }
            let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
            Duration::from_nanos(sorted[rank - 1])
        };
        HopGaps {
            hop: hop.to_owned(),
            p50: quantile(0.5),
            p99: quantile(0.99),
            max: Duration::from_nanos(sorted.last().copied().unwrap_or(0)),
            stalls: sorted.iter().filter(|&&gap| gap >= self.stall_ns).count() as u64,
            gaps: gaps
                .into_iter()
                .map(|(position, gap)| (position, Duration::from_nanos(gap)))
                .collect(),
        }
    }
}

fn ms(duration: Duration) -> f64 {
    (duration.as_nanos() as f64 / 1e3).round() / 1e3
}

impl Diagnosis {
    /// The diagnosis as one JSON object:
    /// `{"requests":N,"stalls":[{"request":..,"seq":..,"hop":..,"gap_ms":..,"upstream_gap_ms":..}],"hops":{HOP:{"p50_ms":..,"p99_ms":..,"max_ms":..,"stalls":..}}}`.
    pub fn to_json(&self) -> String {
        let mut out = format!("{{\"requests\":{},\"stalls\":[", self.requests);
        for (index, stall) in self.stalls.iter().enumerate() {
            if index > 0 {
                out.push(',');
            }
            out.push_str("{\"request\":");
            json_string(&mut out, &stall.request);
            let _ = write!(out, ",\"seq\":{},\"hop\":", stall.seq);
            json_string(&mut out, &stall.hop);
            let upstream = stall
                .upstream_gap
                .map_or_else(|| "null".to_owned(), |gap| ms(gap).to_string());
            let _ = write!(
                out,
                ",\"gap_ms\":{},\"upstream_gap_ms\":{upstream}}}",
                ms(stall.gap)
            );
        }
        out.push_str("],\"hops\":{");
        for (index, hop) in self.hops.iter().enumerate() {
            if index > 0 {
                out.push(',');
            }
            json_string(&mut out, &hop.hop);
            let _ = write!(
                out,
                ":{{\"p50_ms\":{},\"p99_ms\":{},\"max_ms\":{},\"stalls\":{}}}",
                ms(hop.p50),
                ms(hop.p99),
                ms(hop.max),
                hop.stalls
            );
        }
        out.push_str("}}");
        out
    }

    /// A short report for people.
    pub fn report(&self) -> String {
        let mut out = format!("{} requests, {} stalls\n", self.requests, self.stalls.len());
        for stall in &self.stalls {
            let upstream = stall.upstream_gap.map_or_else(
                || "first hop".to_owned(),
                |gap| format!("upstream gap {:.1} ms", ms(gap)),
            );
            let _ = writeln!(
                out,
                "  stall began at {:<16} request {} seq {}: gap {:.1} ms ({upstream})",
                stall.hop,
                stall.request,
                stall.seq,
                ms(stall.gap)
            );
        }
        let _ = writeln!(
            out,
            "  {:<16} {:>7} {:>9} {:>9} {:>9} {:>7}",
            "hop", "gaps", "p50 ms", "p99 ms", "max ms", "stalls"
        );
        for hop in &self.hops {
            let _ = writeln!(
                out,
                "  {:<16} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>7}",
                hop.hop,
                hop.gaps.len(),
                ms(hop.p50),
                ms(hop.p99),
                ms(hop.max),
                hop.stalls
            );
        }
        if !self.problems.is_empty() {
            let _ = writeln!(
                out,
                "  {} problems in the input (skipped):",
                self.problems.len()
            );
            for problem in &self.problems {
                match problem.line {
                    Some(line) => {
                        let _ = writeln!(out, "    {}:{line}: {}", problem.source, problem.message);
                    }
                    None => {
                        let _ = writeln!(out, "    {}: {}", problem.source, problem.message);
                    }
                }
            }
        }
        out
    }
}
