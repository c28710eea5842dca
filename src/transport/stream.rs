//! An accepted connection that counts what it hands to the kernel, and the kernel's view of a
//! socket's send queue.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::task::{Context, Poll, Waker, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// A connection accepted by a [`TunedListener`](super::TunedListener): a [`TcpStream`] that
/// counts the bytes written to it, with a [`SendQueue`] handle telling what the kernel still
/// holds of them.
#[derive(Debug)]
pub struct TunedStream {
    stream: TcpStream,
    queue: SendQueue,
}

impl TunedStream {
    /// Wraps an accepted (or connected) stream.
    pub fn new(stream: TcpStream) -> Self {
        let queue = SendQueue {
            shared: Arc::new(QueueState {
                fd: RwLock::new(Some(std::os::fd::AsRawFd::as_raw_fd(&stream))),
                written: AtomicU64::new(0),
                watchers: AtomicUsize::new(0),
                sent: Mutex::new(None),
                waiting: Mutex::new(None),
            }),
        };
        TunedStream { stream, queue }
    }

    /// A handle on this connection's send queue, usable from any task while the connection
    /// lives (and answering [`io::ErrorKind::NotConnected`] after).
    pub fn send_queue(&self) -> SendQueue {
        self.queue.clone()
    }

    /// The stream.
    pub fn get_ref(&self) -> &TcpStream {
        &self.stream
    }

    fn wrote(&self, bytes: usize) {
        let shared = &self.queue.shared;
        shared.written.fetch_add(bytes as u64, Ordering::Relaxed);
        if shared.watchers.load(Ordering::Relaxed) > 0 {
            // Right after the write is when most bytes leave: note how far sending got, so
            // a frame's departure is timed by the write that sent it.
            let all_sent = self
                .queue
                .refresh()
                .is_ok_and(|(sent, _)| sent >= shared.written.load(Ordering::Relaxed));
            let mut waiting = shared
                .waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if waiting
                .as_ref()
                .is_some_and(|(_, only_unsent)| !(all_sent && *only_unsent))
            {
                if let Some((waker, _)) = waiting.take() {
                    waker.wake();
                }
            }
        }
    }
}

impl Drop for TunedStream {
    fn drop(&mut self) {
        // Taken before the descriptor closes: no handle asks the kernel about a reused number.
        *self
            .queue
            .shared
            .fd
            .write()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl AsFd for TunedStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

impl AsyncRead for TunedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TunedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = ready!(Pin::new(&mut self.stream).poll_write(cx, buf))?;
        self.wrote(written);
        Poll::Ready(Ok(written))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = ready!(Pin::new(&mut self.stream).poll_write_vectored(cx, bufs))?;
        self.wrote(written);
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A handle on one connection's kernel send queue: how many bytes the application wrote, how
/// many the kernel has not sent yet, how many the peer has not acknowledged.
///
/// A completed write only proves the bytes reached a local buffer. What the kernel still holds
/// tells whether they left the machine: a queue that keeps growing while the application writes
/// is a client (or a path) that does not drain. [`Departures`](super::Departures) turns it into
/// per-event times.
///
/// Cheap to clone; every clone answers [`io::ErrorKind::NotConnected`] once the connection is
/// dropped, and [`io::ErrorKind::Unsupported`] off Linux.
///
/// # Examples
///
/// ```
/// use std::io::ErrorKind;
/// use streamgate::transport::{ListenOptions, TunedListener};
/// use tokio::io::AsyncWriteExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let listener = TunedListener::bind("127.0.0.1:0".parse().unwrap(), ListenOptions::default())?;
/// let _client = tokio::net::TcpStream::connect(listener.local_addr()?).await?;
/// let (mut socket, _) = listener.accept().await?;
/// let queue = socket.send_queue();
/// socket.write_all(b"data: hi\n\n").await?;
/// assert_eq!(queue.written(), 10);
/// match queue.unsent() {
///     // At most what was written; a client that stopped reading leaves it growing.
///     Ok(unsent) => assert!(unsent <= 10),
///     Err(error) => assert_eq!(error.kind(), ErrorKind::Unsupported),
/// }
/// drop(socket);
/// assert_eq!(queue.unsent().unwrap_err().kind(), ErrorKind::NotConnected);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SendQueue {
    shared: Arc<QueueState>,
}

/// What every handle on one connection's send queue shares with the connection.
#[derive(Debug)]
struct QueueState {
    /// The connection's descriptor while it is open.
    fd: RwLock<Option<RawFd>>,
    written: AtomicU64,
    /// How many `Departures` time this connection's writes: while any does, writes note how
    /// far sending got.
    watchers: AtomicUsize,
    /// The last reading of how many written bytes had been sent, and when.
    sent: Mutex<Option<(u64, Instant)>>,
    /// Who waits for the next write's reading, and whether only for one that leaves bytes
    /// unsent.
    waiting: Mutex<Option<(Waker, bool)>>,
}

impl SendQueue {
    /// The bytes written to the connection so far.
    pub fn written(&self) -> u64 {
        self.shared.written.load(Ordering::Relaxed)
    }

    /// The bytes written but not yet sent (Linux `SIOCOUTQNSD`): what a client that stopped
    /// reading leaves in the kernel. Held near `TCP_NOTSENT_LOWAT` when it is set.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::NotConnected`] once the connection is dropped; what the system returns.
    pub fn unsent(&self) -> io::Result<usize> {
        self.with_fd(|fd| unsent_bytes(&fd))
    }

    /// The bytes written but not yet acknowledged by the peer, sent or not (Linux `SIOCOUTQ`).
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::NotConnected`] once the connection is dropped; what the system returns.
    pub fn unacknowledged(&self) -> io::Result<usize> {
        self.with_fd(|fd| unacknowledged_bytes(&fd))
    }

    /// Asks the kernel how many of the bytes written so far have been sent, and notes it.
    pub(crate) fn refresh(&self) -> io::Result<(u64, Instant)> {
        // Read before asking: bytes written after the reading are not counted as sent.
        let written = self.written();
        let unsent = self.unsent()?;
        let reading = (written.saturating_sub(unsent as u64), Instant::now());
        let mut sent = self
            .shared
            .sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if sent.is_none_or(|(before, _)| before < reading.0) {
            *sent = Some(reading);
        }
        Ok(sent.unwrap_or(reading))
    }

    /// The last noted count of sent bytes, and when it was noted.
    pub(crate) fn last_sent(&self) -> Option<(u64, Instant)> {
        *self
            .shared
            .sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Until the matching [`unwatch`](Self::unwatch), every write notes how far sending got.
    pub(crate) fn watch(&self) {
        self.shared.watchers.fetch_add(1, Ordering::Relaxed);
    }

    /// Ends one [`watch`](Self::watch).
    pub(crate) fn unwatch(&self) {
        self.shared.watchers.fetch_sub(1, Ordering::Relaxed);
    }

    /// Wakes `waker` after the next write has noted how far sending got (`only_unsent`: after
    /// the next one that leaves some of the connection's bytes unsent).
    pub(crate) fn wake_after_write(&self, waker: &Waker, only_unsent: bool) {
        let mut waiting = self
            .shared
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match &mut *waiting {
            Some((held, only)) if held.will_wake(waker) => *only = only_unsent,
            _ => *waiting = Some((waker.clone(), only_unsent)),
        }
    }

    /// Whether the connection can still send: open, and not failed or reset (the kernel keeps
    /// counting unsent bytes of a connection it gave up on).
    pub(crate) fn can_send(&self) -> bool {
        self.with_fd(tcp_state).is_ok_and(|state| state.can_send())
    }

    fn with_fd<T>(&self, ask: impl FnOnce(BorrowedFd<'_>) -> io::Result<T>) -> io::Result<T> {
        let fd = self
            .shared
            .fd
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let fd = fd.ok_or(io::ErrorKind::NotConnected)?;
        // SAFETY: the descriptor is open while the lock is held: `TunedStream` clears it under
        // the write lock before its `TcpStream` closes it.
        #[allow(unsafe_code)]
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        ask(fd)
    }
}

/// The bytes the kernel holds for `socket` that it has not sent yet (Linux `SIOCOUTQNSD`).
///
/// When this grows while the application keeps writing, the client (or the path to it) is not
/// draining: the event has not left the machine.
///
/// # Errors
///
/// What the `ioctl` returns; [`io::ErrorKind::Unsupported`] off Linux.
///
/// # Examples
///
/// Any socket will do, a standard library one included:
///
/// ```
/// use std::io::Write;
/// use std::net::{TcpListener, TcpStream};
/// use streamgate::transport::{unacknowledged_bytes, unsent_bytes};
///
/// let listener = TcpListener::bind("127.0.0.1:0")?;
/// let mut client = TcpStream::connect(listener.local_addr()?)?;
/// client.write_all(b"hello")?;
/// if cfg!(target_os = "linux") {
///     // Unsent bytes are unacknowledged too (and both only shrink once the writes stop).
///     let unacknowledged = unacknowledged_bytes(&client)?;
///     let unsent = unsent_bytes(&client)?;
///     assert!(unsent <= unacknowledged && unacknowledged <= 5);
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn unsent_bytes(socket: &impl AsFd) -> io::Result<usize> {
    queue_ioctl(socket.as_fd(), Queue::Unsent)
}

/// The bytes the kernel holds for `socket`, sent or not, that the peer has not acknowledged
/// (Linux `SIOCOUTQ`).
///
/// # Errors
///
/// What the `ioctl` returns; [`io::ErrorKind::Unsupported`] off Linux.
///
/// # Examples
///
/// See [`unsent_bytes`].
pub fn unacknowledged_bytes(socket: &impl AsFd) -> io::Result<usize> {
    queue_ioctl(socket.as_fd(), Queue::Unacknowledged)
}

/// A TCP connection's state, as far as sending goes.
#[derive(Clone, Copy)]
struct TcpState(u8);

impl TcpState {
    /// `TCP_ESTABLISHED` or `TCP_CLOSE_WAIT` (the peer closed its side, ours still sends).
    fn can_send(self) -> bool {
        matches!(self.0, 1 | 8)
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn tcp_state(fd: BorrowedFd<'_>) -> io::Result<TcpState> {
    use std::os::fd::AsRawFd;
    // `tcp_info` starts with the state byte; the kernel copies no more than asked for.
    let mut state: u8 = 0;
    let mut len: libc::socklen_t = 1;
    // SAFETY: the option value points to one live, writable byte and `len` says so; the
    // descriptor is borrowed for the duration of the call.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut state).cast(),
            &mut len,
        )
    };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(TcpState(state))
}

#[cfg(not(target_os = "linux"))]
fn tcp_state(_fd: BorrowedFd<'_>) -> io::Result<TcpState> {
    Err(io::ErrorKind::Unsupported.into())
}

#[derive(Clone, Copy)]
enum Queue {
    Unsent,
    Unacknowledged,
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn queue_ioctl(fd: BorrowedFd<'_>, queue: Queue) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let request = match queue {
        Queue::Unsent => libc::SIOCOUTQNSD,
        // `SIOCOUTQ` is numerically `TIOCOUTQ`.
        Queue::Unacknowledged => libc::TIOCOUTQ,
    };
    let mut queued: libc::c_int = 0;
    // SAFETY: both requests store one `int` through their argument, which points to a live,
    // writable `c_int`; the descriptor is borrowed for the duration of the call, and the call
    // touches no other memory.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, &mut queued) };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(queued).unwrap_or(0))
}

#[cfg(not(target_os = "linux"))]
fn queue_ioctl(_fd: BorrowedFd<'_>, _queue: Queue) -> io::Result<usize> {
    Err(io::ErrorKind::Unsupported.into())
}
