//! An accepted socket that tells its connection's [`Activity`] when a request head begins, and
//! holds the connection's slot until it closes.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
// tokio's `sync` comes with hyper-util's `server-graceful` feature, which `server` enables.
use tokio::sync::OwnedSemaphorePermit;

use super::activity::Activity;
use super::cork::Cork;
use crate::transport::stream::TunedStream;

/// The first bytes of every HTTP/2 connection with prior knowledge.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// [`Watched::preface`] once the connection is known to speak HTTP/1.
const HTTP1: usize = usize::MAX;

/// An accepted socket that notes when a request head begins, and holds its connection's slot
/// until it closes (an upgraded connection's socket included).
#[derive(Debug)]
pub(super) struct Watched {
    stream: TunedStream,
    activity: Arc<Activity>,
    /// How many bytes of [`H2_PREFACE`] the connection's first bytes matched: all of it for
    /// HTTP/2, [`HTTP1`] once one differed.
    preface: usize,
    /// Its writes, held to the end of the runtime's tick.
    cork: Cork,
    _slot: OwnedSemaphorePermit,
}

impl Watched {
    /// `stream`, whose connection's activity is `activity` and which holds `slot`.
    pub(super) fn new(
        stream: TunedStream,
        activity: Arc<Activity>,
        slot: OwnedSemaphorePermit,
    ) -> Self {
        Watched {
            stream,
            activity,
            preface: 0,
            cork: Cork::default(),
            _slot: slot,
        }
    }

    /// Waits for the connection's first byte without taking it: 1 once it arrived, 0 at end of
    /// file.
    pub(super) async fn peek_first(&self) -> io::Result<usize> {
        let mut first = [0u8; 1];
        self.stream.get_ref().peek(&mut first).await
    }

    /// Bytes arrived: while no request is in flight, they begin a request head (over HTTP/1,
    /// or before the protocol is known).
    fn received(&mut self, bytes: &[u8]) {
        if self.preface < H2_PREFACE.len() {
            let expected = &H2_PREFACE[self.preface..];
            let n = bytes.len().min(expected.len());
            if bytes[..n] == expected[..n] {
                self.preface += n;
                if self.preface == H2_PREFACE.len() {
                    // HTTP/2: no head to time, the idle timeout takes over.
                    self.activity.no_head();
                    return;
                }
            } else {
                self.preface = HTTP1;
            }
        } else if self.preface == H2_PREFACE.len() {
            return;
        }
        self.activity.head_began();
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.stream).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            this.cork.read();
            if this.preface != H2_PREFACE.len() {
                this.received(&buf.filled()[before..]);
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.cork.poll_write(cx, Instant::now));
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.cork.poll_write(cx, Instant::now));
        Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(Pin::new(&mut this.stream).poll_flush(cx))?;
        this.cork.flushed(Instant::now);
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
