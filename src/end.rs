//! Why a stream ended: the one vocabulary of end reasons, wherever an end is recorded (the
//! gate, the probes, hop records, the timeline, a server's counters), and counters indexed by
//! it.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

/// Why a stream ended.
///
/// Exactly one end reason is recorded per stream: the first thing that ended it. The gate
/// ends its streams with every reason but [`UpstreamError`](EndReason::UpstreamError), which
/// a gateway's probes and counters give a stream whose upstream failed (it sent an error
/// frame, or its connection broke).
///
/// Its name ([`as_str`](EndReason::as_str)) is what labels, hop records and wire frames carry,
/// and what [`FromStr`] reads back; a name outside the set does not parse, so a typo is an
/// error rather than a new reason.
///
/// # Examples
///
/// ```
/// use streamgate::EndReason;
///
/// let reason: EndReason = "slow_consumer".parse().unwrap();
/// assert_eq!(reason, EndReason::SlowConsumer);
/// assert_eq!(reason.to_string(), "slow_consumer");
/// assert!("slow-consumer".parse::<EndReason>().is_err());
/// assert_eq!(EndReason::ALL.len(), 9);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum EndReason {
    /// The generator finished and the consumer took every event it sent.
    Completed,
    /// The consumer went away (dropped: the client disconnected) before it had taken every
    /// event; [`GateStats::events_undelivered`](crate::GateStats::events_undelivered) says how
    /// many it missed.
    ConsumerGone,
    /// The stream was stopped on purpose through its [`GateHandle`](crate::GateHandle) (a user
    /// pressing Stop).
    Cancelled,
    /// The slow-consumer policy ended the stream: the consumer did not drain it in time.
    SlowConsumer,
    /// The generator returned an error.
    GeneratorError,
    /// The generator panicked; the panic was caught and did not reach the consumer.
    GeneratorPanic,
    /// The process is shutting down: its [`Group`](crate::Group) was shut down, or the runtime
    /// shut down (dropping the gate's task) before the generator finished.
    Shutdown,
    /// The stream's upstream failed (at a gateway): it sent an `event: error` frame, or its
    /// connection broke before the stream's end.
    UpstreamError,
    /// The resume store a resumable stream is kept in failed it: Redis was away for longer
    /// than the registry's outage window (see
    /// [`ResumeOptions::outage`](crate::resume::ResumeOptions::outage)), so nothing more it
    /// made could be kept for a resume.
    ResumeStoreError,
}

impl EndReason {
    /// Every end reason, in the order of [`index`](EndReason::index).
    pub const ALL: [EndReason; 9] = [
        EndReason::Completed,
        EndReason::ConsumerGone,
        EndReason::Cancelled,
        EndReason::SlowConsumer,
        EndReason::GeneratorError,
        EndReason::GeneratorPanic,
        EndReason::Shutdown,
        EndReason::UpstreamError,
        EndReason::ResumeStoreError,
    ];

    /// A short snake-case name for labels, hop records and wire frames: `completed`,
    /// `consumer_gone`, `cancelled`, `slow_consumer`, `generator_error`, `generator_panic`,
    /// `shutdown`, `upstream_error`, `resume_store_error`.
    pub const fn as_str(self) -> &'static str {
        match self {
            EndReason::Completed => "completed",
            EndReason::ConsumerGone => "consumer_gone",
            EndReason::Cancelled => "cancelled",
            EndReason::SlowConsumer => "slow_consumer",
            EndReason::GeneratorError => "generator_error",
            EndReason::GeneratorPanic => "generator_panic",
            EndReason::Shutdown => "shutdown",
            EndReason::UpstreamError => "upstream_error",
            EndReason::ResumeStoreError => "resume_store_error",
        }
    }

    /// Its position in [`ALL`](EndReason::ALL): an index into a table of counters.
    pub const fn index(self) -> usize {
        // Declared in the order of `ALL` (checked by a test).
        self as usize
    }

    /// Whether the stream ended on the generator's side of the path (it finished, failed or
    /// its upstream did) rather than because of a consumer, a stop or a shutdown: an end a hop
    /// receives from the hop before it. [`ResumeStoreError`](EndReason::ResumeStoreError) is
    /// not: the store sits between the generator and its readers, after the generator's hops.
    ///
    /// ```
    /// use streamgate::EndReason;
    ///
    /// assert!(EndReason::UpstreamError.is_from_generator());
    /// assert!(!EndReason::ConsumerGone.is_from_generator());
    /// ```
    pub const fn is_from_generator(self) -> bool {
        matches!(
            self,
            EndReason::Completed
                | EndReason::GeneratorError
                | EndReason::GeneratorPanic
                | EndReason::UpstreamError
        )
    }
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EndReason {
    type Err = UnknownEndReason;

    /// The reason named `name` (as [`as_str`](EndReason::as_str) writes it).
    fn from_str(name: &str) -> Result<Self, UnknownEndReason> {
        EndReason::ALL
            .into_iter()
            .find(|reason| reason.as_str() == name)
            .ok_or(UnknownEndReason(()))
    }
}

/// The error of parsing an [`EndReason`]: the name is none of the crate's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownEndReason(());

impl fmt::Display for UnknownEndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not an end reason (completed, consumer_gone, cancelled, slow_consumer, generator_error, generator_panic, shutdown, upstream_error, resume_store_error)")
    }
}

impl std::error::Error for UnknownEndReason {}

/// How many streams ended for each [`EndReason`]: a snapshot of [`EndCounters`].
///
/// # Examples
///
/// ```
/// use streamgate::{EndCounters, EndReason};
///
/// let counters = EndCounters::new();
/// counters.add(EndReason::Completed);
/// counters.add(EndReason::ConsumerGone);
/// counters.add(EndReason::Completed);
/// let counts = counters.snapshot();
/// assert_eq!(counts[EndReason::Completed], 2);
/// assert_eq!(counts.total(), 3);
/// assert_eq!(counts.occurred(), [(EndReason::Completed, 2), (EndReason::ConsumerGone, 1)]);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndCounts([u64; EndReason::ALL.len()]);

impl EndCounts {
    /// Every reason with its count, in the order of [`EndReason::ALL`] (zeros included).
    pub fn iter(&self) -> impl Iterator<Item = (EndReason, u64)> + '_ {
        EndReason::ALL.into_iter().zip(self.0)
    }

    /// The reasons some stream ended for, with their counts, in the order of
    /// [`EndReason::ALL`].
    pub fn occurred(&self) -> Vec<(EndReason, u64)> {
        self.iter().filter(|(_, n)| *n > 0).collect()
    }

    /// The streams that ended, for any reason.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// The streams that ended for any of `reasons`.
    pub fn sum(&self, reasons: &[EndReason]) -> u64 {
        reasons.iter().map(|reason| self[*reason]).sum()
    }
}

impl std::ops::Index<EndReason> for EndCounts {
    type Output = u64;

    fn index(&self, reason: EndReason) -> &u64 {
        &self.0[reason.index()]
    }
}

/// A counter of stream ends per [`EndReason`], shared between threads (relaxed atomics: each
/// count is exact, a snapshot taken while streams end may be between two of them).
///
/// See [`EndCounts`] for an example.
#[derive(Debug, Default)]
pub struct EndCounters([AtomicU64; EndReason::ALL.len()]);

impl EndCounters {
    /// Counters at zero.
    pub fn new() -> Self {
        EndCounters::default()
    }

    /// Counts one stream that ended for `reason`.
    pub fn add(&self, reason: EndReason) {
        self.0[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> EndCounts {
        EndCounts(std::array::from_fn(|at| self.0[at].load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_index_and_name_and_parses_back() {
        for (at, reason) in EndReason::ALL.into_iter().enumerate() {
            assert_eq!(reason.index(), at);
            assert_eq!(reason.as_str().parse::<EndReason>(), Ok(reason));
        }
        let mut names: Vec<_> = EndReason::ALL.iter().map(|r| r.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), EndReason::ALL.len());
        for bad in ["", "Completed", "completed ", "other"] {
            assert!(bad.parse::<EndReason>().is_err(), "{bad:?}");
        }
    }
}
