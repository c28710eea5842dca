//! Writing frames to an `AsyncWrite`, with the time each write completed.

use std::io;
use std::pin::pin;

use futures_core::Stream;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::sse::SseFrame;

/// Writes SSE frames to any [`AsyncWrite`], flushing after each, and reports when each write
/// completed: the "socket write completion" boundary of a hop.
///
/// A completed write means the bytes reached the kernel (or whatever the writer wraps), not the
/// client: over a `TunedStream`, `transport::Departures` (feature `net`) records when each
/// frame's bytes left the kernel.
///
/// # Examples
///
/// ```
/// use streamgate::sse::{SseFrame, SseEvent};
/// use streamgate::transport::FrameWriter;
/// use streamgate::Kind;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let mut writer = FrameWriter::new(Vec::new());
/// let frame = SseFrame::new(SseEvent::data("hi").encode(), Kind::Visible, Some(0));
/// writer.write_frame(&frame).await?;
/// assert_eq!(writer.get_ref().as_slice(), b"data: hi\n\n");
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct FrameWriter<W> {
    writer: W,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// A writer of frames to `writer`.
    pub fn new(writer: W) -> Self {
        FrameWriter { writer }
    }

    /// Writes one frame whole and flushes it; returns when the write completed.
    ///
    /// # Errors
    ///
    /// What writing or flushing returns; a peer that went away shows up here.
    pub async fn write_frame(&mut self, frame: &SseFrame) -> io::Result<Instant> {
        self.writer.write_all(frame.bytes()).await?;
        self.writer.flush().await?;
        Ok(Instant::now())
    }

    /// Writes every frame of `frames`, calling `on_written` with each frame and the time its
    /// write completed; returns how many frames were written.
    ///
    /// # Errors
    ///
    /// The first write error; the rest of `frames` is dropped with it (for a gated stream, that
    /// cancels the generator).
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::transport::FrameWriter;
    /// use streamgate::{Gate, GateExt, sse::SseEvent};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let consumer = Gate::new().spawn(|_, mut tx| async move {
    ///     for token in ["Hel", "lo"] {
    ///         tx.send(SseEvent::data(token)).await?;
    ///     }
    ///     Ok::<_, streamgate::SendError<SseEvent>>(())
    /// });
    /// let mut writer = FrameWriter::new(Vec::new());
    /// let mut completions = Vec::new();
    /// let written = writer
    ///     .forward(consumer.sse(), |_frame, at| completions.push(at))
    ///     .await?;
    /// assert_eq!(written, 2);
    /// assert_eq!(completions.len(), 2);
    /// assert_eq!(writer.get_ref().as_slice(), b"id: 0\ndata: Hel\n\nid: 1\ndata: lo\n\n");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn forward<S>(
        &mut self,
        frames: S,
        mut on_written: impl FnMut(&SseFrame, Instant),
    ) -> io::Result<u64>
    where
        S: Stream<Item = SseFrame>,
    {
        let mut frames = pin!(frames);
        let mut written = 0;
        while let Some(frame) = std::future::poll_fn(|cx| frames.as_mut().poll_next(cx)).await {
            let at = self.write_frame(&frame).await?;
            on_written(&frame, at);
            written += 1;
        }
        Ok(written)
    }

    /// The wrapped writer.
    pub fn get_ref(&self) -> &W {
        &self.writer
    }

    /// Takes the wrapped writer out.
    pub fn into_inner(self) -> W {
        self.writer
    }
}
