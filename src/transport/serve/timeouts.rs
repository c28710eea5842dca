//! The timeouts every connection gets, their defaults, and the deadlines they give.

use std::time::Duration;

use tokio::time::Instant;

/// The default [`Server::first_byte_timeout`](super::Server::first_byte_timeout): 15 s.
///
/// A real client sends its request (or HTTP/2 preface) right after connecting. The ones that
/// connect ahead are browsers' preconnects, and Chromium drops a preconnected socket it has not
/// used within 10 s (`unused_idle_socket_timeout`): 15 s serves every socket a browser may
/// still use, and halves the 30 s an attacker's silent socket held a connection slot before.
pub const DEFAULT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(15);

/// The default [`Server::header_read_timeout`](super::Server::header_read_timeout): 10 s.
///
/// A request head is a few hundred bytes to a few KiB, which arrive in one or two round trips:
/// even an 8 KiB head over a lossy mobile link with retransmissions takes a few seconds, so
/// 10 s leaves a wide margin for real clients, and a third of hyper's 30 s default for a
/// slowloris.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The default [`Server::idle_timeout`](super::Server::idle_timeout): 120 s.
///
/// Longer than the idle timeouts of the clients that usually keep connections to a streaming
/// server (nginx's upstream `keepalive_timeout` and AWS ALB's idle timeout, 60 s; hyper's and
/// reqwest's pool, 90 s), so that they close an idle connection first and never send a request
/// onto one the server is closing (for a `POST`, which clients do not retry, that race is a
/// failed request); short enough that idle connections give their slots back within minutes.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// The timeouts every connection gets.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timeouts {
    pub(super) first_byte: Duration,
    pub(super) header_read: Duration,
    pub(super) idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            first_byte: DEFAULT_FIRST_BYTE_TIMEOUT,
            header_read: DEFAULT_HEADER_READ_TIMEOUT,
            idle: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// `base + duration`, or `base` plus about 30 years where that overflows.
pub(super) fn later(base: Instant, duration: Duration) -> Instant {
    base.checked_add(duration)
        .or_else(|| base.checked_add(Duration::from_secs(30 * 365 * 86_400)))
        .unwrap_or(base)
}
