//! One hop's table over every request: visible gaps in a bounded histogram, the longest and
//! mean gap at each output position (up to a limit), and counts.

use std::time::Duration;

use crate::probe::Histogram;

/// The gaps that ended at one output position, over every request.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamgate::timeline::Timeline;
///
/// // Two requests: their second events came 10 ms and 30 ms after their first.
/// let records = r#"{"request":"r1","hop":"client.recv","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
/// {"request":"r1","hop":"client.recv","seq":1,"t_ns":10000000,"bytes":3,"kind":"visible"}
/// {"request":"r2","hop":"client.recv","seq":0,"t_ns":0,"bytes":3,"kind":"visible"}
/// {"request":"r2","hop":"client.recv","seq":1,"t_ns":30000000,"bytes":3,"kind":"visible"}"#;
/// let mut timeline = Timeline::new(["client.recv"], Duration::from_secs(1));
/// timeline.add_lines("client.jsonl", records);
/// let by_position = &timeline.diagnose().hops[0].by_position;
/// // Position 0 is each stream's first visible event: no gap ends there.
/// assert_eq!(by_position[0].count, 0);
/// assert_eq!(by_position[1].count, 2);
/// assert_eq!(by_position[1].max, Duration::from_millis(30));
/// assert_eq!(by_position[1].mean, Duration::from_millis(20));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PositionGap {
    /// How many gaps.
    pub count: u64,
    /// The longest.
    pub max: Duration,
    /// Their mean.
    pub mean: Duration,
}

#[derive(Debug, Clone, Copy, Default)]
struct Cell {
    count: u64,
    max_ns: u64,
    sum_ns: u64,
}

/// What the timeline keeps for one hop while it reads.
#[derive(Debug, Clone)]
pub(super) struct HopTable {
    gaps: Histogram,
    max_gap: u64,
    positions: Vec<Cell>,
    max_positions: usize,
    /// Gaps at positions past `max_positions`.
    beyond: u64,
    /// Quiet spells at or above the threshold, wherever they began.
    pub(super) quiet_spells: u64,
    /// Streams resumed at this hop (records after an end record).
    pub(super) resumes: u64,
    /// Records taken.
    pub(super) records: u64,
    /// The gaps counted since the slices last took them (output position, ns), when they are
    /// sliced.
    pub(super) recent: Option<Vec<(u32, u64)>>,
}

impl HopTable {
    pub(super) fn new(max_positions: usize) -> Self {
        HopTable {
            gaps: Histogram::default(),
            max_gap: 0,
            positions: Vec::new(),
            max_positions,
            beyond: 0,
            quiet_spells: 0,
            resumes: 0,
            records: 0,
            recent: None,
        }
    }

    pub(super) fn set_max_positions(&mut self, max: usize) {
        self.max_positions = max;
        self.positions.truncate(max);
    }

    /// Counts a visible gap that ended at output `position` (the visible event's index in its
    /// stream, or the number of visible events for the gap a stream ended in).
    pub(super) fn gap(&mut self, position: u32, ns: u64) {
        self.gaps.record(ns);
        self.max_gap = self.max_gap.max(ns);
        if let Some(recent) = &mut self.recent {
            recent.push((position, ns));
        }
        let position = position as usize;
        if position >= self.max_positions {
            self.beyond = self.beyond.saturating_add(1);
            return;
        }
        if self.positions.len() <= position {
            self.positions.resize(position + 1, Cell::default());
        }
        let cell = &mut self.positions[position];
        cell.count = cell.count.saturating_add(1);
        cell.max_ns = cell.max_ns.max(ns);
        cell.sum_ns = cell.sum_ns.saturating_add(ns);
    }

    pub(super) fn count(&self) -> u64 {
        self.gaps.count()
    }

    /// The `q` quantile of the gaps: the top of its histogram bucket (within 12.5%), never
    /// above the longest gap.
    pub(super) fn quantile(&self, q: f64) -> Duration {
        self.gaps
            .quantile(q)
            .map_or(Duration::ZERO, |d| d.min(self.max()))
    }

    pub(super) fn max(&self) -> Duration {
        Duration::from_nanos(self.max_gap)
    }

    pub(super) fn beyond(&self) -> u64 {
        self.beyond
    }

    pub(super) fn positions(&self) -> Vec<PositionGap> {
        self.positions
            .iter()
            .map(|cell| PositionGap {
                count: cell.count,
                max: Duration::from_nanos(cell.max_ns),
                mean: Duration::from_nanos(cell.sum_ns.checked_div(cell.count).unwrap_or(0)),
            })
            .collect()
    }
}
