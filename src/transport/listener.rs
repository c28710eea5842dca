//! A TCP listener tuned for streaming: what the kernel holds counts, and dead clients are found.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};

use super::stream::TunedStream;

/// The default listen backlog: 1024 pending connections (axum's and std's binds use 128, which
/// overflows when hundreds of clients connect at once).
pub const DEFAULT_BACKLOG: u32 = 1024;

/// The default `TCP_NOTSENT_LOWAT`: a socket takes no more bytes while 16 KiB written to it
/// have not been sent yet.
///
/// Without it, Linux lets the send queue of a client that stopped reading grow to megabytes
/// before a write waits, so a generator runs thousands of tokens ahead and the slow-consumer
/// clock does not even start. With it, the write waits once about 16 KiB are stuck (a little
/// more can stay unsent: BENCHMARKS.md measured up to 46 KiB), the gate fills, and the policy
/// acts on time. Bytes already *in flight* (sent, not yet acknowledged) are not limited, so the window the kernel autotunes for throughput is kept. BENCHMARKS.md has the
/// run-ahead and the throughput measured with and without it.
pub const DEFAULT_NOTSENT_LOWAT: u32 = 16 * 1024;

/// The default `TCP_USER_TIMEOUT`: 20 s, as gRPC uses. Data unacknowledged for longer fails the
/// connection, so a client that vanished (no FIN, no RST) is found within a heartbeat interval
/// plus this, instead of after Linux's ~15 minutes of retransmissions.
pub const DEFAULT_USER_TIMEOUT: Duration = Duration::from_secs(20);

/// The default keepalive idle time: 15 s, the usual SSE heartbeat interval. A connection with
/// nothing to send (no stream, or a stream without heartbeats) is probed after this long, and a
/// peer that does not answer fails it within the user timeout.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(15);

/// How a [`TunedListener`] binds and what it sets on every accepted socket.
///
/// The defaults make the kernel's buffers and timers serve the gate: `TCP_NODELAY`,
/// [`DEFAULT_NOTSENT_LOWAT`], [`DEFAULT_USER_TIMEOUT`] and [`DEFAULT_KEEPALIVE`], with the
/// system's autotuned `SO_SNDBUF`.
///
/// # Kernels and the zero window
///
/// A client that is alive but stopped reading advertises a zero receive window and keeps
/// acknowledging the kernel's window probes. Linux 5.11 and later (the zero-window fix of
/// `TCP_USER_TIMEOUT`) fail such a connection once it has been stuck for the user timeout, so a
/// stopped reader is disconnected after about [`DEFAULT_USER_TIMEOUT`] whatever the gate's policy
/// (a [`Backpressure`](crate::Policy::Backpressure) pause longer than that ends as a transport
/// error). Older kernels never fail a connection whose probes are answered: there only the gate's
/// policy ends it. A vanished client answers nothing, and every kernel fails it after the user
/// timeout.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamgate::transport::{ListenOptions, TunedListener};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let options = ListenOptions::default()
///     .backlog(4096)
///     // Fewer bytes stuck in the kernel for a client that stopped reading.
///     .notsent_lowat(Some(8 * 1024))
///     .user_timeout(Some(Duration::from_secs(30)))
///     .keepalive(Some(Duration::from_secs(20)));
/// let listener = TunedListener::bind("127.0.0.1:0".parse().unwrap(), options)?;
/// assert_eq!(listener.options(), options);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenOptions {
    backlog: u32,
    send_buffer: Option<u32>,
    notsent_lowat: Option<u32>,
    user_timeout: Option<Duration>,
    keepalive: Option<Duration>,
}

impl ListenOptions {
    /// The listen backlog.
    pub fn backlog(mut self, backlog: u32) -> Self {
        self.backlog = backlog;
        self
    }

    /// `SO_SNDBUF` for accepted sockets, in bytes (Linux doubles what is asked, for its own
    /// bookkeeping). A small send buffer bounds everything the kernel holds for a client, in
    /// flight included, at the cost of throughput on long paths. `None` (the default) keeps the
    /// system's autotuning; [`notsent_lowat`](Self::notsent_lowat) bounds what matters without it.
    pub fn send_buffer(mut self, bytes: Option<u32>) -> Self {
        self.send_buffer = bytes;
        self
    }

    /// `TCP_NOTSENT_LOWAT` for accepted sockets: a write waits while more than `bytes` written to
    /// the socket have not been sent. `None` leaves the system's setting (on Linux, unlimited
    /// unless `net.ipv4.tcp_notsent_lowat` says otherwise). Default [`DEFAULT_NOTSENT_LOWAT`].
    pub fn notsent_lowat(mut self, bytes: Option<u32>) -> Self {
        self.notsent_lowat = bytes;
        self
    }

    /// `TCP_USER_TIMEOUT` for accepted sockets: how long written data may stay unacknowledged
    /// before the kernel fails the connection (in whole milliseconds, rounded up). `None` leaves
    /// the system's retransmission limits. Default [`DEFAULT_USER_TIMEOUT`].
    pub fn user_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.user_timeout = timeout;
        self
    }

    /// TCP keepalive for accepted sockets: after `idle` without traffic the kernel probes the
    /// peer (then every third of `idle`), and fails the connection once the user timeout passes
    /// without an answer (or after the system's probe count without one). `None` turns keepalive
    /// off. Whole seconds from 1 to 32,767 (what Linux takes; others are clamped). Default
    /// [`DEFAULT_KEEPALIVE`].
    pub fn keepalive(mut self, idle: Option<Duration>) -> Self {
        self.keepalive = idle;
        self
    }
}

impl Default for ListenOptions {
    fn default() -> Self {
        ListenOptions {
            backlog: DEFAULT_BACKLOG,
            send_buffer: None,
            notsent_lowat: Some(DEFAULT_NOTSENT_LOWAT),
            user_timeout: Some(DEFAULT_USER_TIMEOUT),
            keepalive: Some(DEFAULT_KEEPALIVE),
        }
    }
}

/// A TCP listener for streaming servers. Every accepted socket gets `TCP_NODELAY` (so a small
/// event is not held back by Nagle's algorithm waiting for an ACK) and what its
/// [`ListenOptions`] say: by default the kernel holds at most [`DEFAULT_NOTSENT_LOWAT`] unsent
/// bytes for a client, and a client that vanished is found after [`DEFAULT_USER_TIMEOUT`].
///
/// Accepted connections are [`TunedStream`]s, whose [`SendQueue`](super::SendQueue) tells what
/// the kernel still holds. Usable with `axum::serve` (feature `axum`), with
/// `transport::Server` (feature `server`, HTTP/1.1 and HTTP/2 on one port) and with a
/// hand-written hyper accept loop.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamgate::transport::{ListenOptions, TunedListener};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let options = ListenOptions::default().user_timeout(Some(Duration::from_secs(10)));
/// let listener = TunedListener::bind("127.0.0.1:0".parse().unwrap(), options)?;
/// println!("listening on http://{}", listener.local_addr()?);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct TunedListener {
    listener: TcpListener,
    options: ListenOptions,
}

impl TunedListener {
    /// Binds `addr` (with `SO_REUSEADDR`) and listens.
    ///
    /// # Errors
    ///
    /// What creating, binding or listening on the socket, or setting an option of `options` on
    /// it, returns (a kernel without `TCP_NOTSENT_LOWAT` fails here, not at every accept).
    ///
    /// # Panics
    ///
    /// If called outside a tokio runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::transport::{ListenOptions, TunedListener};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let addr = "127.0.0.1:0".parse().unwrap();
    /// let listener = TunedListener::bind(addr, ListenOptions::default())?;
    /// let client = tokio::net::TcpStream::connect(listener.local_addr()?).await?;
    /// let (socket, peer) = listener.accept().await?;
    /// assert_eq!(peer, client.local_addr()?);
    /// assert!(socket.get_ref().nodelay()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn bind(addr: SocketAddr, options: ListenOptions) -> io::Result<Self> {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        // Accepted sockets inherit the listening socket's buffer sizes (Linux, BSDs) and, on
        // Linux, its TCP options: set here, an option the kernel lacks fails the bind, not every
        // accept.
        if let Some(bytes) = options.send_buffer {
            socket.set_send_buffer_size(bytes)?;
        }
        socket.set_nodelay(true)?;
        options::apply(&socket, &options)?;
        socket.bind(addr)?;
        let listener = socket.listen(options.backlog)?;
        Ok(TunedListener { listener, options })
    }

    /// Accepts the next connection, with `TCP_NODELAY` set and the listener's options (which
    /// accepted sockets inherit).
    ///
    /// A connection that fails before it is accepted concerns nobody else: it is skipped and the
    /// next one is accepted at once. Failing to set `TCP_NODELAY` on an accepted socket (some
    /// systems refuse it once the peer has reset) does not refuse the connection.
    ///
    /// # Errors
    ///
    /// What `accept` returns for the listener as a whole (out of file descriptors, say); the
    /// caller decides whether to wait before trying again.
    ///
    /// # Examples
    ///
    /// See [`bind`](Self::bind).
    pub async fn accept(&self) -> io::Result<(TunedStream, SocketAddr)> {
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => {
                    // Inherited on Linux already; whatever refuses it, hyper finds out too.
                    let _ = stream.set_nodelay(true);
                    return Ok((TunedStream::new(stream), peer));
                }
                Err(error) if is_connection_error(&error) => {}
                Err(error) => return Err(error),
            }
        }
    }

    /// The address the listener is bound to (with the real port when bound to port 0).
    ///
    /// # Errors
    ///
    /// What the system returns.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The options every accepted socket gets.
    pub fn options(&self) -> ListenOptions {
        self.options
    }
}

/// An error that concerns one connection, not the listener: accept(2) on Linux reports a
/// connection's network errors this way, and asks that they be treated like `EAGAIN`.
fn is_connection_error(error: &io::Error) -> bool {
    use io::ErrorKind::{
        ConnectionAborted, ConnectionRefused, ConnectionReset, HostUnreachable, NetworkDown,
        NetworkUnreachable,
    };
    if matches!(
        error.kind(),
        ConnectionRefused
            | ConnectionAborted
            | ConnectionReset
            | NetworkDown
            | NetworkUnreachable
            | HostUnreachable
    ) {
        return true;
    }
    #[cfg(target_os = "linux")]
    if let Some(code) = error.raw_os_error() {
        return [
            libc::EPROTO,
            libc::ENOPROTOOPT,
            libc::EHOSTDOWN,
            libc::ENONET,
            libc::EOPNOTSUPP,
        ]
        .contains(&code);
    }
    false
}

#[cfg(target_os = "linux")]
mod options {
    use std::io;
    use std::os::fd::{AsFd, AsRawFd};
    use std::time::Duration;

    use super::ListenOptions;

    pub(super) fn apply(socket: &impl AsFd, options: &ListenOptions) -> io::Result<()> {
        if let Some(bytes) = options.notsent_lowat {
            set(
                socket,
                libc::IPPROTO_TCP,
                libc::TCP_NOTSENT_LOWAT,
                clamp(bytes.into()),
            )?;
        }
        if let Some(timeout) = options.user_timeout {
            set(
                socket,
                libc::IPPROTO_TCP,
                libc::TCP_USER_TIMEOUT,
                millis(timeout),
            )?;
        }
        if let Some(idle) = options.keepalive {
            // Linux takes 1 to 32,767 s.
            let idle_secs = idle.as_secs().clamp(1, 32_767);
            set(socket, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
            set(
                socket,
                libc::IPPROTO_TCP,
                libc::TCP_KEEPIDLE,
                clamp(idle_secs),
            )?;
            set(
                socket,
                libc::IPPROTO_TCP,
                libc::TCP_KEEPINTVL,
                clamp((idle_secs / 3).max(1)),
            )?;
        }
        Ok(())
    }

    /// Whole milliseconds, rounded up: a timeout under 1 ms is 1 ms, not 0 (which turns the
    /// option off).
    fn millis(duration: Duration) -> libc::c_int {
        let millis = duration.as_nanos().div_ceil(1_000_000);
        clamp(u64::try_from(millis).unwrap_or(u64::MAX))
    }

    fn clamp(value: u64) -> libc::c_int {
        libc::c_int::try_from(value).unwrap_or(libc::c_int::MAX)
    }

    #[allow(unsafe_code)]
    fn set(
        socket: &impl AsFd,
        level: libc::c_int,
        name: libc::c_int,
        value: libc::c_int,
    ) -> io::Result<()> {
        // SAFETY: the option value is one live `c_int` whose size is passed alongside; the
        // descriptor is borrowed from a live socket for the duration of the call.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_fd().as_raw_fd(),
                level,
                name,
                (&raw const value).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Off Linux only `TCP_NODELAY`, the backlog and `SO_SNDBUF` are set.
#[cfg(not(target_os = "linux"))]
mod options {
    use super::ListenOptions;

    pub(super) fn apply<S>(_socket: &S, _options: &ListenOptions) -> std::io::Result<()> {
        Ok(())
    }
}
