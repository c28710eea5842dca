//! What a registry holds and what happened so far, and the counters both stores keep.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a [`Registry`](super::Registry) holds now, and what happened so far.
///
/// A Redis registry counts this instance's part: the streams it pumps, the attaches made
/// through it and the graces that ran out in its pumps.
///
/// # Examples
///
/// ```
/// use streamgate::resume::{Registry, ResumeOptions};
///
/// let registry = Registry::<String>::memory(ResumeOptions::default());
/// let stats = registry.stats();
/// assert_eq!((stats.streams, stats.detached, stats.resumed), (0, 0, 0));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegistryStats {
    /// Streams registered and not yet removed (running, or retained after their end).
    pub streams: usize,
    /// Running streams nobody is attached to: their grace is running.
    pub detached: usize,
    /// Attaches to a registered stream so far (every [`Registry::attach`](super::Registry::attach)).
    pub resumed: u64,
    /// Streams whose grace ran out so far.
    pub expired: u64,
    /// Streams this instance adopted from an instance that died (`Registry::adopt`) so far.
    pub adopted: u64,
    /// Bytes held in every replay log now.
    pub log_bytes: usize,
}

/// The counts both stores keep of what happened.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    resumed: AtomicU64,
    expired: AtomicU64,
    adopted: AtomicU64,
}

impl Counters {
    pub(crate) fn resumed(&self) {
        self.resumed.fetch_add(1, Ordering::Relaxed);
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn adopted(&self) {
        self.adopted.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn expired(&self) {
        self.expired.fetch_add(1, Ordering::Relaxed);
    }

    /// The stats with these counts and what the store holds now.
    pub(crate) fn stats(&self, streams: usize, detached: usize, log_bytes: usize) -> RegistryStats {
        RegistryStats {
            streams,
            detached,
            resumed: self.resumed.load(Ordering::Relaxed),
            expired: self.expired.load(Ordering::Relaxed),
            adopted: self.adopted.load(Ordering::Relaxed),
            log_bytes,
        }
    }
}
