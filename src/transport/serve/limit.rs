//! The cap on open connections: its default, drawn from the process's file descriptor limit,
//! and the slots that enforce it.

use std::sync::Arc;

// tokio's `sync` comes with hyper-util's `server-graceful` feature, which `server` enables.
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ServeError;

/// Without a `RLIMIT_NOFILE` to derive it from, the default
/// [`Server::max_connections`](super::Server::max_connections).
const FALLBACK_MAX_CONNECTIONS: usize = 8192;

/// The default cap on open connections,
/// [`Server::max_connections`](super::Server::max_connections)'s when none is given: the
/// process's soft `RLIMIT_NOFILE` minus a quarter of it, and at least 64 left for everything
/// else (a limit of 256 allows 192 connections, 1,024 allows 768); 8,192 where there is no
/// such limit. Read anew at each call.
///
/// A server that opens a descriptor of its own per connection (a proxy's upstream socket) can
/// use a share of it: half, for one each.
///
/// # Examples
///
/// ```
/// use streamgate::transport::{Server, default_max_connections};
///
/// // A proxy: every connection also holds one upstream socket.
/// let server = Server::new().max_connections((default_max_connections() / 2).max(1));
/// # let _ = server;
/// ```
pub fn default_max_connections() -> usize {
    soft_descriptor_limit().map_or(FALLBACK_MAX_CONNECTIONS, connections_below)
}

/// The connections a descriptor limit of `limit` allows: a quarter of it, and at least 64, is
/// left for everything else.
fn connections_below(limit: u64) -> usize {
    let headroom = (limit / 4).max(64);
    let connections = limit.saturating_sub(headroom);
    usize::try_from(connections)
        .unwrap_or(usize::MAX)
        .clamp(1, Semaphore::MAX_PERMITS)
}

/// The process's soft `RLIMIT_NOFILE` (`RLIM_INFINITY` is the largest number).
#[cfg(unix)]
#[allow(unsafe_code)]
fn soft_descriptor_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit` through the pointer, which points to a live,
    // writable one for the duration of the call.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) };
    // `rlim_t` is unsigned on Linux and macOS, signed on some BSDs.
    #[allow(clippy::useless_conversion)]
    let soft = u64::try_from(limit.rlim_cur).unwrap_or(u64::MAX);
    (rc == 0).then_some(soft)
}

#[cfg(not(unix))]
fn soft_descriptor_limit() -> Option<u64> {
    None
}

/// One slot per open connection, at most the cap: a connection is accepted once it has one,
/// and gives it back when its socket closes.
#[derive(Debug)]
pub(super) struct Slots {
    slots: Arc<Semaphore>,
    limit: usize,
    /// The cap was reached and reported, and a tenth of the slots have not been free since.
    at_limit: bool,
}

impl Slots {
    /// `limit` slots (0 is taken as 1).
    pub(super) fn new(limit: usize) -> Self {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        Slots {
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            at_limit: false,
        }
    }

    /// A free slot, once there is one. Finding none free is given to `report` as
    /// [`ServeError::ConnectionLimit`], once until a tenth of the slots are free again.
    pub(super) async fn acquire(
        &mut self,
        report: impl FnOnce(ServeError),
    ) -> Option<OwnedSemaphorePermit> {
        let free = self.slots.available_permits();
        if free == 0 && !self.at_limit {
            self.at_limit = true;
            report(ServeError::ConnectionLimit { limit: self.limit });
        } else if self.at_limit && free.saturating_mul(10) >= self.limit {
            self.at_limit = false;
        }
        self.slots.clone().acquire_owned().await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_leaves_descriptors_free() {
        assert_eq!(connections_below(256), 192);
        assert_eq!(connections_below(1024), 768);
        assert_eq!(connections_below(65_536), 49_152);
        // Small limits keep 64 free, and at least one connection is served.
        assert_eq!(connections_below(100), 36);
        assert_eq!(connections_below(10), 1);
        // RLIM_INFINITY.
        assert_eq!(connections_below(u64::MAX), Semaphore::MAX_PERMITS);
    }

    #[test]
    fn the_default_cap_follows_the_process_limit() {
        let cap = default_max_connections();
        match soft_descriptor_limit() {
            Some(limit) => assert_eq!(cap, connections_below(limit)),
            None => assert_eq!(cap, FALLBACK_MAX_CONNECTIONS),
        }
    }
}
