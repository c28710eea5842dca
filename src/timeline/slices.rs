//! Slices: requests grouped by what served them (an attribute their records carry: `pool`,
//! `upstream`, `model`, a client version), by output position or by output length, with each
//! group's stall rate, gap p99 and the hops its stalls began at, so that the question after
//! "where did it freeze" ("do the stalled requests share a pool, a proxy, a region?") has an
//! answer.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::attrs::Attrs;
use super::request_gaps::RequestGaps;
use crate::probe::{Histogram, MAX_ATTR_KEY};

/// The most keys a slice is made of.
pub const MAX_SLICE_KEYS: usize = 2;
/// The most slices of distinct values; requests of further values share one whose attribute
/// values are `(other)`.
pub const MAX_SLICES: usize = 1024;

/// What requests are grouped by.
///
/// # Examples
///
/// ```
/// use streamgate::timeline::By;
///
/// assert_eq!("pool".parse::<By>()?, By::Attr("pool".into()));
/// assert_eq!("position".parse::<By>()?, By::Position);
/// assert_eq!("length".parse::<By>()?, By::Length);
/// assert!("".parse::<By>().is_err());
/// # Ok::<(), streamgate::timeline::ByError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum By {
    /// The value of an attribute the request's hop records carry (see [`HopRecord::attrs`]
    /// (crate::probe::HopRecord::attrs)): as of its first stall when it stalled (what served it
    /// when it went quiet), else as its stream began; `(none)` when no record carried it.
    Attr(String),
    /// Output position, in buckets (`0-63`, `64-127`, `128-255`, ...): each request counts in
    /// every bucket of event ids it reached, each stall in the bucket of the event id it
    /// followed, each gap in the bucket of its output position (the visible events before it).
    Position,
    /// Output length (visible events at the hop of the request's records that saw the most), in
    /// the same buckets: to compare requests of similar length across the values of another
    /// key.
    Length,
}

/// A key that is no [`By`]: empty, or longer than an attribute key may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ByError(String);

impl fmt::Display for ByError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is no slice key (`position`, `length`, or an attribute of 1 to {MAX_ATTR_KEY} bytes)",
            self.0
        )
    }
}

impl std::error::Error for ByError {}

impl FromStr for By {
    type Err = ByError;

    fn from_str(key: &str) -> Result<By, ByError> {
        match key {
            "position" => Ok(By::Position),
            "length" => Ok(By::Length),
            _ if key.is_empty() || key.len() > MAX_ATTR_KEY => Err(ByError(key.to_owned())),
            _ => Ok(By::Attr(key.to_owned())),
        }
    }
}

impl fmt::Display for By {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            By::Attr(key) => key,
            By::Position => "position",
            By::Length => "length",
        })
    }
}

/// One group of requests.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Slice {
    /// Its value for each key, in the order of [`Slices::by`].
    pub values: Vec<String>,
    /// Requests in it.
    pub requests: u64,
    /// Requests in it with a stall that began at some hop (one whose hop is unknown is
    /// counted in [`unknown`](Slice::unknown), not here: the rate is never made of guesses).
    pub stalled: u64,
    /// The hops its stalls began at, and how many began at each, most first.
    pub began: Vec<(String, u64)>,
    /// Its stalls whose hop is unknown (records missing, disordered or past a budget).
    pub unknown: u64,
    /// Its visible gaps' p99 at [`Slices::hop`] (within 12.5%, from above); `None` without
    /// gaps there.
    pub gap_p99: Option<Duration>,
    /// Requests whose gaps were not all kept (past the detail budget): the p99 leaves them
    /// partly out.
    pub gaps_incomplete: u64,
}

impl Slice {
    /// Its stalled requests' share of its requests (0 when it has none).
    ///
    /// See [`Timeline::slice_by`](super::Timeline::slice_by) for an example.
    pub fn stall_rate(&self) -> f64 {
        ratio(self.stalled, self.requests)
    }
}

/// Every request, sliced: see [`Timeline::slice_by`](super::Timeline::slice_by).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Slices {
    /// The keys.
    pub by: Vec<By>,
    /// The hop whose gaps the slices' p99 are of: the path's last (nearest the user).
    pub hop: String,
    /// The slices: by the buckets of position and length keys in order, then those whose stall
    /// rate stands out first: the lower end of its 95% Wilson interval, so a rate on few
    /// requests stands out only as far as it is sure (1 stalled request of 1: above 20.6%,
    /// after 300 of 1,000: above 27.2%).
    pub rows: Vec<Slice>,
}

/// What a stall said of its request, for the slices.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seen {
    pub(super) hop: u8,
    pub(super) after: Option<u64>,
    pub(super) began: bool,
}

/// What the slices need of one request.
pub(super) struct Facts<'a> {
    pub(super) request: &'a str,
    /// Visible events at its hop that saw the most.
    pub(super) length: u64,
    /// The highest seq any hop recorded of it.
    pub(super) reach: u64,
    /// Its stalls that began somewhere or are unknown, in the order they happened.
    pub(super) stalls: &'a [Seen],
}

#[derive(Default)]
struct Row {
    values: Vec<String>,
    /// The position and length buckets' lower bounds, in key order (0 for attributes).
    order: Vec<u64>,
    /// Its position bucket, when sliced by position: the gaps it takes.
    position: Option<u8>,
    requests: u64,
    stalled: u64,
    unknown: u64,
    began: Vec<u64>,
    gaps: Histogram,
    gaps_incomplete: u64,
}

/// Builds the slices, one request at a time.
pub(super) struct Slicer<'a> {
    by: &'a [By],
    path: &'a [Box<str>],
    attrs: &'a Attrs,
    gaps: &'a RequestGaps,
    index: HashMap<Vec<String>, usize>,
    rows: Vec<Row>,
}

impl<'a> Slicer<'a> {
    pub(super) fn new(
        by: &'a [By],
        path: &'a [Box<str>],
        attrs: &'a Attrs,
        gaps: &'a RequestGaps,
    ) -> Self {
        Slicer {
            by,
            path,
            attrs,
            gaps,
            index: HashMap::new(),
            rows: Vec::new(),
        }
    }

    pub(super) fn add(&mut self, facts: &Facts<'_>) {
        let first = facts.stalls.first();
        // Each key's values for the request: one, or every position bucket it reached.
        let per_key: Vec<Vec<Value>> = self
            .by
            .iter()
            .map(|by| match by {
                By::Attr(key) => vec![Value::Attr(self.attr(facts.request, key, first))],
                By::Length => vec![Value::Bucket(bucket_index(facts.length))],
                By::Position => (0..=bucket_index(facts.reach)).map(Value::Bucket).collect(),
            })
            .collect();
        let mut hit = Vec::new();
        for key in combinations(&per_key) {
            let row = self.row(key);
            let row = &mut self.rows[row];
            row.requests += 1;
            if !self.gaps.add_to(facts.request, row.position, &mut row.gaps) {
                row.gaps_incomplete += 1;
            }
        }
        for stall in facts.stalls {
            let key: Vec<Value> = self
                .by
                .iter()
                .zip(&per_key)
                .map(|(by, values)| match by {
                    By::Position => Value::Bucket(bucket_index(stall.after.unwrap_or(0))),
                    _ => values[0].clone(),
                })
                .collect();
            let at = self.row(key);
            let row = &mut self.rows[at];
            if stall.began && !hit.contains(&at) {
                hit.push(at);
                row.stalled += 1;
            }
            if stall.began {
                row.began.resize(self.path.len(), 0);
                row.began[usize::from(stall.hop)] += 1;
            } else {
                row.unknown += 1;
            }
        }
    }

    /// The value of attribute `key` for `request`: as of its first stall, at that hop, then
    /// at the others; else as its stream began at the first hop that carried it.
    fn attr(&self, request: &str, key: &str, first: Option<&Seen>) -> String {
        let hops = 0..self.path.len() as u8;
        let found = match first {
            Some(stall) => std::iter::once(stall.hop)
                .chain(hops.filter(|&hop| hop != stall.hop))
                .find_map(|hop| find(self.attrs.at(request, hop, stall.after), key)),
            None => hops
                .into_iter()
                .find_map(|hop| find(self.attrs.at(request, hop, None), key)),
        };
        found.unwrap_or_else(|| NONE.to_owned())
    }

    /// The row of `key`: a new one, or past [`MAX_SLICES`] the one of its buckets whose
    /// attributes are `(other)` (at most one per combination of buckets).
    fn row(&mut self, key: Vec<Value>) -> usize {
        let position = self
            .by
            .iter()
            .zip(&key)
            .find_map(|(by, value)| match (by, value) {
                (By::Position, Value::Bucket(index)) => Some(*index),
                _ => None,
            });
        let order: Vec<u64> = key.iter().map(Value::low).collect();
        let mut values: Vec<String> = key.into_iter().map(Value::label).collect();
        if !self.index.contains_key(&values) && self.rows.len() >= MAX_SLICES {
            for (value, by) in values.iter_mut().zip(self.by) {
                if matches!(by, By::Attr(_)) {
                    *value = OTHER.to_owned();
                }
            }
        }
        let next = self.rows.len();
        let at = *self.index.entry(values.clone()).or_insert(next);
        if at == next {
            self.rows.push(Row {
                values,
                order,
                position,
                ..Row::default()
            });
        }
        at
    }

    pub(super) fn finish(self) -> Slices {
        let path = self.path;
        let mut rows: Vec<(Vec<u64>, f64, Slice)> = self
            .rows
            .into_iter()
            .map(|row| {
                let mut began: Vec<(String, u64)> = row
                    .began
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| **n > 0)
                    .map(|(hop, &n)| (path[hop].to_string(), n))
                    .collect();
                began.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
                let slice = Slice {
                    values: row.values,
                    requests: row.requests,
                    stalled: row.stalled,
                    began,
                    unknown: row.unknown,
                    gap_p99: row.gaps.quantile(0.99),
                    gaps_incomplete: row.gaps_incomplete,
                };
                (row.order, wilson_low(row.stalled, row.requests), slice)
            })
            .collect();
        rows.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then(b.1.total_cmp(&a.1))
                .then(b.2.requests.cmp(&a.2.requests))
                .then_with(|| a.2.values.cmp(&b.2.values))
        });
        Slices {
            by: self.by.to_vec(),
            hop: path.last().map_or_else(String::new, |hop| hop.to_string()),
            rows: rows.into_iter().map(|(_, _, slice)| slice).collect(),
        }
    }
}

/// A request without the attribute.
const NONE: &str = "(none)";
/// Requests of values past [`MAX_SLICES`].
const OTHER: &str = "(other)";
/// The first bucket of positions and lengths holds 0 to 63 (2^6 - 1); then each doubles.
const FIRST_BUCKET_BITS: u32 = 6;

/// The bucket of position or length `n`: 0 for 0 to 63, 1 for 64 to 127, ... 58 at most.
pub(super) fn bucket_index(n: u64) -> u8 {
    let bits = 64 - n.leading_zeros();
    bits.saturating_sub(FIRST_BUCKET_BITS) as u8
}

/// One key's value for a request (or stall).
#[derive(Debug, Clone)]
enum Value {
    Attr(String),
    /// A position or length bucket ([`bucket_index`]).
    Bucket(u8),
}

impl Value {
    /// The lowest position or length in its bucket (0 for an attribute: they sort by rate).
    fn low(&self) -> u64 {
        match self {
            Value::Attr(_) => 0,
            Value::Bucket(0) => 0,
            Value::Bucket(index) => 1 << (u32::from(*index) + FIRST_BUCKET_BITS - 1),
        }
    }

    fn label(self) -> String {
        match self {
            Value::Attr(value) => value,
            Value::Bucket(index) => {
                let low = self.low();
                let high = match index {
                    0 => (1 << FIRST_BUCKET_BITS) - 1,
                    _ => low.checked_mul(2).map_or(u64::MAX, |next| next - 1),
                };
                format!("{low}-{high}")
            }
        }
    }
}

fn find(attrs: Vec<(String, String)>, key: &str) -> Option<String> {
    attrs.into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// Every combination of one value per key.
fn combinations(per_key: &[Vec<Value>]) -> Vec<Vec<Value>> {
    per_key.iter().fold(vec![Vec::new()], |combos, values| {
        combos
            .iter()
            .flat_map(|combo| {
                values.iter().map(move |value| {
                    let mut combo = combo.clone();
                    combo.push(value.clone());
                    combo
                })
            })
            .collect()
    })
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The lower end of the 95% Wilson score interval of `stalled` in `requests`.
fn wilson_low(stalled: u64, requests: u64) -> f64 {
    if requests == 0 {
        return 0.0;
    }
    let (n, p, z) = (requests as f64, ratio(stalled, requests), 1.96_f64);
    let z2 = z * z;
    let centre = p + z2 / (2.0 * n);
    let spread = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    (centre - spread) / (1.0 + z2 / n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_double_from_64() {
        let bucket = |n| {
            let value = Value::Bucket(bucket_index(n));
            (value.low(), value.label())
        };
        assert_eq!(bucket(0), (0, "0-63".to_owned()));
        assert_eq!(bucket(63).0, 0);
        assert_eq!(bucket(64), (64, "64-127".to_owned()));
        assert_eq!(bucket(255), (128, "128-255".to_owned()));
        assert_eq!(
            bucket(u64::MAX),
            (1 << 63, format!("{}-{}", 1u64 << 63, u64::MAX))
        );
        assert_eq!(bucket_index(u64::MAX), 58);
    }

    #[test]
    fn a_rate_on_few_requests_stands_out_less() {
        assert!(wilson_low(1, 1) < wilson_low(300, 1000));
        assert!((wilson_low(1, 1) - 0.2065).abs() < 1e-3);
        assert!(wilson_low(50, 1000) < wilson_low(100, 1000));
        assert_eq!(wilson_low(0, 0), 0.0);
        assert!(wilson_low(0, 100) < 1e-12);
    }
}
