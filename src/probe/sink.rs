//! Where hop records go: a bounded queue to a writer thread that appends JSON lines.

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};

use super::record::{Line, RecordKind};

/// A record on its way to the writer: shared names, so sending one allocates nothing.
pub(crate) struct Pending {
    pub(crate) request: Arc<str>,
    pub(crate) hop: Arc<str>,
    pub(crate) seq: u64,
    pub(crate) t_ns: u64,
    pub(crate) bytes: u64,
    pub(crate) kind: RecordKind,
    /// How long the hop's thread was busy within the gap this record ended (0: not told).
    pub(crate) busy_ns: u64,
    /// The record's `attrs` object text, when the stream's attributes changed with it.
    pub(crate) attrs: Option<Arc<str>>,
}

enum Message {
    Record(Pending),
    /// Records queued together: all, or none.
    #[cfg(feature = "browser")]
    Batch(Vec<Pending>),
    Sync(mpsc::Sender<()>),
}

/// Where hop records go: a bounded queue to a writer thread that appends JSON lines.
///
/// Recording never blocks a stream: when the queue is full the record is dropped and counted
/// ([`dropped`](RecordSink::dropped)), and a record the writer could not write is counted too
/// ([`failed`](RecordSink::failed)): never lost silently. With feature `metrics` the counts are
/// exported once per sink, however many hops share it (`streamgate_hop_records_total`).
/// Cloning shares the queue.
///
/// Give it to [`HopProbe::records`](super::HopProbe::records), which has an example with a
/// file.
///
/// # Examples
///
/// A writer that fails (a full disk): its records are counted, not lost silently.
///
/// ```
/// use std::io::{self, Write};
/// use streamgate::probe::{HopProbe, Observation, RecordSink};
/// use streamgate::{EndReason, Kind};
///
/// struct Full;
///
/// impl Write for Full {
///     fn write(&mut self, _: &[u8]) -> io::Result<usize> {
///         Err(io::Error::other("no space left on device"))
///     }
///     fn flush(&mut self) -> io::Result<()> {
///         Ok(())
///     }
/// }
///
/// let sink = RecordSink::to_writer(Full, 1024)?;
/// let hop = HopProbe::new("gateway.write").records(sink.clone(), 1.0);
/// let mut recorder = hop.recorder("req-1");
/// recorder.observe(Observation::new(Some(0), 4, Kind::Visible));
/// recorder.end(EndReason::Completed);
/// sink.sync();
/// assert_eq!((sink.written(), sink.failed(), sink.dropped()), (0, 2, 0));
/// # Ok::<(), io::Error>(())
/// ```
#[derive(Clone)]
pub struct RecordSink {
    queue: mpsc::SyncSender<Message>,
    counts: Arc<SinkCounts>,
}

#[derive(Default)]
struct SinkCounts {
    written: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
}

/// The default queue between probes and the writer: 8 Ki records.
///
/// A queue takes its memory when the sink is made, about 100 bytes a record (here 850 KB,
/// resident from the start), so that queueing a record allocates nothing. It holds what the
/// writer thread has not written yet: at 500,000 records a second, 16 ms of them; records that
/// find it full are dropped and counted ([`RecordSink::dropped`]).
pub const DEFAULT_RECORD_QUEUE: usize = 8 * 1024;

impl RecordSink {
    /// Appends records to the file at `path` (created if missing), through a queue of
    /// [`DEFAULT_RECORD_QUEUE`] records.
    ///
    /// See [`HopProbe::records`](super::HopProbe::records) for an example.
    ///
    /// # Errors
    ///
    /// What opening the file or starting the writer thread returns.
    pub fn to_file(path: impl AsRef<std::path::Path>) -> io::Result<RecordSink> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        RecordSink::to_writer(file, DEFAULT_RECORD_QUEUE)
    }

    /// Writes records to `writer` from a thread of its own, through a queue of `capacity`
    /// records (at least one).
    ///
    /// # Errors
    ///
    /// What starting the thread returns.
    ///
    /// # Examples
    ///
    /// Records kept in memory, as a test reads them:
    ///
    /// ```
    /// use std::io::{self, Write};
    /// use std::sync::{Arc, Mutex};
    /// use streamgate::probe::{HopProbe, Observation, RecordSink};
    /// use streamgate::{EndReason, Kind};
    ///
    /// #[derive(Clone, Default)]
    /// struct Lines(Arc<Mutex<Vec<u8>>>);
    ///
    /// impl Write for Lines {
    ///     fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
    ///         self.0.lock().unwrap().write(bytes)
    ///     }
    ///     fn flush(&mut self) -> io::Result<()> {
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let lines = Lines::default();
    /// let sink = RecordSink::to_writer(lines.clone(), 1024)?;
    /// let hop = HopProbe::new("client.recv").records(sink.clone(), 1.0);
    /// let mut recorder = hop.recorder("req-1");
    /// recorder.observe(Observation::new(Some(0), 4, Kind::Visible));
    /// recorder.end(EndReason::Completed);
    /// sink.sync();
    ///
    /// let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    /// assert_eq!(text.lines().count(), 2);
    /// assert_eq!(sink.written(), 2);
    /// # Ok::<(), io::Error>(())
    /// ```
    pub fn to_writer(
        writer: impl Write + Send + 'static,
        capacity: usize,
    ) -> io::Result<RecordSink> {
        let (queue, messages) = mpsc::sync_channel(capacity.max(1));
        let counts = Arc::new(SinkCounts::default());
        let shared = counts.clone();
        std::thread::Builder::new()
            .name("streamgate-records".into())
            .spawn(move || write_records(writer, &messages, &shared))?;
        Ok(RecordSink { queue, counts })
    }

    /// Queues a record, or counts it as dropped when the queue is full; whether it was queued.
    pub(crate) fn send(&self, record: Pending) -> bool {
        if self.queue.try_send(Message::Record(record)).is_err() {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Queues `records` together, or counts them all as dropped when the queue is full;
    /// whether they were queued.
    #[cfg(feature = "browser")]
    pub(crate) fn send_all(&self, records: Vec<Pending>) -> bool {
        let n = records.len() as u64;
        if self.queue.try_send(Message::Batch(records)).is_err() {
            self.counts.dropped.fetch_add(n, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Waits until every record queued before this call is written and flushed. It blocks the
    /// calling thread: meant for shutdown, not for a runtime's worker in the middle of serving.
    pub fn sync(&self) {
        let (done, wait) = mpsc::channel();
        if self.queue.send(Message::Sync(done)).is_ok() {
            let _ = wait.recv();
        }
    }

    /// Records written so far.
    pub fn written(&self) -> u64 {
        self.counts.written.load(Ordering::Relaxed)
    }

    /// Records dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.counts.dropped.load(Ordering::Relaxed)
    }

    /// Records the writer could not write (its error, such as a full disk): the write or the
    /// flush of their batch failed, and the batch was dropped.
    pub fn failed(&self) -> u64 {
        self.counts.failed.load(Ordering::Relaxed)
    }
}

/// The writer thread: gathers what is queued into one buffer and writes it whenever the queue
/// runs dry (or the buffer holds [`WRITE_BATCH`] bytes), so lines reach the file in batches
/// under load and at once when it is quiet. A record counts as written once the write and the
/// flush of its batch succeeded, and as failed otherwise (its batch is dropped, not retried).
fn write_records(mut out: impl Write, messages: &mpsc::Receiver<Message>, counts: &SinkCounts) {
    let mut batch = Unwritten::default();
    while let Ok(first) = messages.recv() {
        for message in std::iter::once(first).chain(messages.try_iter()) {
            match message {
                Message::Record(r) => batch.add(&r, &mut out, counts),
                #[cfg(feature = "browser")]
                Message::Batch(records) => {
                    for r in &records {
                        batch.add(r, &mut out, counts);
                    }
                }
                Message::Sync(done) => {
                    batch.write(&mut out, counts);
                    let _ = done.send(());
                }
            }
        }
        batch.write(&mut out, counts);
    }
}

/// The most bytes of records the writer gathers before it writes them.
const WRITE_BATCH: usize = 64 * 1024;

/// Records gathered since the last write.
#[derive(Default)]
struct Unwritten {
    text: String,
    records: u64,
    /// Drops already exported as metrics.
    #[cfg(feature = "metrics")]
    exported_dropped: u64,
}

impl Unwritten {
    /// Adds `r`'s line, writing the batch when it holds [`WRITE_BATCH`] bytes.
    fn add(&mut self, r: &Pending, out: &mut impl Write, counts: &SinkCounts) {
        let line = Line {
            request: &r.request,
            hop: &r.hop,
            seq: r.seq,
            t_ns: r.t_ns,
            bytes: r.bytes,
            kind: r.kind,
            busy_ns: r.busy_ns,
            attrs: r.attrs.as_deref().unwrap_or(""),
        };
        line.write(&mut self.text);
        self.text.push('\n');
        self.records += 1;
        if self.text.len() >= WRITE_BATCH {
            self.write(out, counts);
        }
    }

    /// Writes and flushes the batch, and adds its outcome to `counts` (and the metrics).
    fn write(&mut self, out: &mut impl Write, counts: &SinkCounts) {
        if self.records == 0 {
            return;
        }
        let records = std::mem::take(&mut self.records);
        let written = out
            .write_all(self.text.as_bytes())
            .and_then(|()| out.flush());
        self.text.clear();
        let (written, failed) = match written {
            Ok(()) => (records, 0),
            Err(_) => (0, records),
        };
        counts.written.fetch_add(written, Ordering::Relaxed);
        counts.failed.fetch_add(failed, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        {
            let dropped = counts.dropped.load(Ordering::Relaxed);
            super::export::records("written", written);
            super::export::records("failed", failed);
            super::export::records("dropped", dropped - self.exported_dropped);
            self.exported_dropped = dropped;
        }
    }
}

impl fmt::Debug for RecordSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordSink")
            .field("written", &self.written())
            .field("dropped", &self.dropped())
            .field("failed", &self.failed())
            .finish()
    }
}
