//! A TCP listener tuned for streaming, and the kernel's view of a socket's unsent bytes.

use std::io;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// The default listen backlog: 1024 pending connections (axum's and std's binds use 128, which
/// overflows when hundreds of clients connect at once).
pub const DEFAULT_BACKLOG: u32 = 1024;

/// How a [`TunedListener`] binds and what it sets on every accepted socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenOptions {
    backlog: u32,
    send_buffer: Option<u32>,
}

impl ListenOptions {
    /// The listen backlog.
    pub fn backlog(mut self, backlog: u32) -> Self {
        self.backlog = backlog;
        self
    }

    /// `SO_SNDBUF` for accepted sockets, in bytes (Linux doubles what is asked, for its own
    /// bookkeeping). A small send buffer bounds what the kernel holds for a client that stopped
    /// reading, so the gate, not the kernel, sees the slow consumer. `None` (the default) keeps
    /// the system's autotuning, which on Linux lets a send queue grow to megabytes.
    pub fn send_buffer(mut self, bytes: Option<u32>) -> Self {
        self.send_buffer = bytes;
        self
    }
}

impl Default for ListenOptions {
    fn default() -> Self {
        ListenOptions {
            backlog: DEFAULT_BACKLOG,
            send_buffer: None,
        }
    }
}

/// A TCP listener for streaming servers: every accepted socket has `TCP_NODELAY` set (so a
/// small event is not held back by Nagle's algorithm waiting for an ACK), the listen backlog is
/// chosen, and `SO_SNDBUF` may be bounded.
///
/// Usable with `axum::serve` (feature `axum`) and with a hand-written hyper accept loop.
///
/// # Examples
///
/// ```
/// use streamgate::transport::{ListenOptions, TunedListener};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let options = ListenOptions::default().send_buffer(Some(64 * 1024));
/// let listener = TunedListener::bind("127.0.0.1:0".parse().unwrap(), options)?;
/// println!("listening on http://{}", listener.local_addr()?);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct TunedListener {
    listener: TcpListener,
}

impl TunedListener {
    /// Binds `addr` (with `SO_REUSEADDR`) and listens.
    ///
    /// # Errors
    ///
    /// What creating, binding or listening on the socket returns.
    ///
    /// # Panics
    ///
    /// If called outside a tokio runtime.
    pub fn bind(addr: SocketAddr, options: ListenOptions) -> io::Result<Self> {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        // Accepted sockets inherit the listening socket's buffer sizes (Linux, BSDs).
        if let Some(bytes) = options.send_buffer {
            socket.set_send_buffer_size(bytes)?;
        }
        socket.bind(addr)?;
        let listener = socket.listen(options.backlog)?;
        Ok(TunedListener { listener })
    }

    /// Accepts a connection and sets `TCP_NODELAY` on it.
    ///
    /// # Errors
    ///
    /// What `accept` or setting the option returns.
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let (stream, peer) = self.listener.accept().await?;
        stream.set_nodelay(true)?;
        Ok((stream, peer))
    }

    /// The address the listener is bound to (with the real port when bound to port 0).
    ///
    /// # Errors
    ///
    /// What the system returns.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// The bytes the kernel still holds for `socket`: written by the application but not yet
/// acknowledged by the peer (Linux `SIOCOUTQ`).
///
/// A successful write only proves the bytes reached a local buffer. When this grows while the
/// application keeps writing, the client (or the path to it) is not draining: the event has not
/// left the machine.
///
/// # Errors
///
/// What the `ioctl` returns; [`io::ErrorKind::Unsupported`] off Linux.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub fn unsent_bytes(socket: &impl std::os::fd::AsRawFd) -> io::Result<usize> {
    let mut queued: libc::c_int = 0;
    // SAFETY: `SIOCOUTQ` (numerically `TIOCOUTQ`) stores one `int` through its argument, which
    // points to a live, writable `c_int`; the descriptor is borrowed from a live socket for the
    // duration of the call, and the call touches no other memory.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(queued).unwrap_or(0))
}

/// The bytes the kernel still holds for `socket`; only Linux can tell.
///
/// # Errors
///
/// Always [`io::ErrorKind::Unsupported`] off Linux.
#[cfg(not(target_os = "linux"))]
pub fn unsent_bytes<S>(_socket: &S) -> io::Result<usize> {
    Err(io::ErrorKind::Unsupported.into())
}
