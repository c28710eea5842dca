//! Slowloris connections (`streamgate loadgen --slowloris N`): each sends a request head one
//! byte a second and never finishes it, which a server must close (its header timeout)
//! rather than hold, descriptor and all, for as long as the client likes.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The request head the connections send, a byte at a time (its end never comes).
const HEAD: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nhost: slowloris\r\nx-padding: ";

/// How often each connection sends its next byte.
const PACE: Duration = Duration::from_secs(1);

/// What the slowloris connections saw.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Report {
    /// Connections opened.
    pub opened: usize,
    /// Connections that could not be opened (refused, or no descriptor).
    pub refused: usize,
    /// Opened connections the server closed (or reset) before the run's end.
    pub closed_by_server: usize,
    /// The longest a connection stayed open before the server closed it, in ms (none closed:
    /// none).
    pub longest_held_ms: Option<u64>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self
            .longest_held_ms
            .map_or_else(|| "none".to_owned(), |ms| ms.to_string());
        write!(
            f,
            "slowloris: {} opened ({} refused), {} closed by the server, the longest after {held} ms",
            self.opened, self.refused, self.closed_by_server
        )
    }
}

/// Opens `n` slowloris connections to `addr` and keeps each sending until the server closes
/// it or `until` has passed.
///
/// # Examples
///
/// ```no_run
/// # async fn example() {
/// let addr = "127.0.0.1:8080".parse().unwrap();
/// let report = streamgate_cli::slowloris::run(addr, 100, std::time::Duration::from_secs(30)).await;
/// assert_eq!(report.closed_by_server, report.opened, "the server holds slow request heads");
/// # }
/// ```
pub async fn run(addr: SocketAddr, n: usize, until: Duration) -> Report {
    let deadline = tokio::time::Instant::now() + until;
    let connections: Vec<_> = (0..n).map(|_| tokio::spawn(one(addr, deadline))).collect();
    let mut report = Report {
        opened: 0,
        refused: 0,
        closed_by_server: 0,
        longest_held_ms: None,
    };
    for connection in connections {
        match connection.await.expect("slowloris task") {
            None => report.refused += 1,
            Some(held) => {
                report.opened += 1;
                if let Some(held) = held {
                    report.closed_by_server += 1;
                    let ms = held.as_millis() as u64;
                    report.longest_held_ms = Some(report.longest_held_ms.map_or(ms, |m| m.max(ms)));
                }
            }
        }
    }
    report
}

/// One connection: `None` if it could not be opened, else how long it was held before the
/// server closed it (`None` inside: it was still open at `deadline`).
async fn one(addr: SocketAddr, deadline: tokio::time::Instant) -> Option<Option<Duration>> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let opened = Instant::now();
    let mut pace = tokio::time::interval(PACE);
    let mut sent = 0;
    let mut byte = [0u8; 1];
    let closed = async {
        loop {
            tokio::select! {
                // The server's answer (a 408, say) or its close: either way it let go.
                _ = stream.read(&mut byte) => return,
                _ = pace.tick() => {
                    let next = HEAD.get(sent).copied().unwrap_or(b'a');
                    if stream.write_all(&[next]).await.is_err() {
                        return;
                    }
                    sent += 1;
                }
            }
        }
    };
    let held = tokio::time::timeout_at(deadline, closed).await;
    Some(held.ok().map(|()| opened.elapsed()))
}
