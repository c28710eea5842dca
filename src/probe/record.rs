//! Hop records: one JSON line per observed event, for timeline analysis across processes.

use std::fmt::{self, Write as _};
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::Instant;

use crate::chunk::Kind;
use crate::end::EndReason;

/// What a hop record marks: an event of some kind, or the stream's end at that hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// An event, with how it counts for progress.
    Event(Kind),
    /// The stream's end at this hop.
    End {
        /// Why it ended.
        reason: EndReason,
        /// Nanoseconds since the hop's last visible or hidden event, or since the stream began
        /// at the hop when it saw none.
        idle_ns: u64,
    },
}

impl RecordKind {
    /// The name in a record's `kind` field: `visible`, `hidden`, `control`, `end`.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::Event(kind) => kind.as_str(),
            RecordKind::End { .. } => "end",
        }
    }

    /// The end's reason and idle time, for an end record.
    pub fn end(self) -> Option<(EndReason, u64)> {
        match self {
            RecordKind::End { reason, idle_ns } => Some((reason, idle_ns)),
            RecordKind::Event(_) => None,
        }
    }
}

impl From<Kind> for RecordKind {
    fn from(kind: Kind) -> Self {
        RecordKind::Event(kind)
    }
}

/// The longest request id a hop record (or a probe's span) copies, in bytes: a longer one is
/// cut at a character boundary, so a hostile `x-request-id` cannot multiply the records' size.
pub const MAX_RECORD_REQUEST: usize = 128;

/// One event, or the stream's end, as one hop saw it. No payload: only where, which event,
/// when, how big, what kind.
///
/// Its JSON line has exactly these fields, so that hops written in other languages (a browser
/// client) can produce them too:
///
/// ```text
/// {"request":"<id>","hop":"<name>","seq":<u64>,"t_ns":<u64>,"bytes":<u64>,"kind":"visible"|"hidden"|"control"}
/// {"request":"<id>","hop":"<name>","seq":<u64>,"t_ns":<u64>,"bytes":0,"kind":"end","reason":"<end reason>","idle_ns":<u64>}
/// ```
///
/// `t_ns` is on the writing process's monotonic clock: comparable only with other records of
/// the same hop and process, which is all the timeline analysis ever does.
///
/// `seq` is the event id: the position of the event's (last) chunk in the generator's output,
/// which the gate counts at `send` ([`Event::id`](crate::Event::id)) and the SSE encoder writes
/// as `id:`. A hop in another language records the SSE `id` it received (a browser's
/// `MessageEvent.lastEventId`), so every hop numbers the same event the same way; a coalesced
/// event is recorded under its last id. The kind travels in a `:hidden` or `:control`
/// comment line before a non-visible event's fields.
///
/// An end record's `seq` is one past the last event the hop numbered, its `reason` is an
/// [`EndReason`]'s name, and its `idle_ns` is how long the hop had then been
/// without a visible or hidden event (since the stream began at the hop, when it saw none),
/// so a freeze that ended the stream is visible even when no event followed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HopRecord {
    /// The request id the stream belongs to (at most [`MAX_RECORD_REQUEST`] bytes).
    pub request: String,
    /// The hop's name, e.g. `gateway.recv`.
    pub hop: String,
    /// The event id: the position of the event's (last) chunk in its stream's output.
    pub seq: u64,
    /// When the hop saw it, in nanoseconds on the process's monotonic clock.
    pub t_ns: u64,
    /// Its size in bytes, as the hop saw it: a frame's encoded bytes at a probe on frames, a
    /// decoded event's data at a probe on decoded events.
    pub bytes: u64,
    /// How it counts for progress, or that (and why) the stream ended here.
    pub kind: RecordKind,
}

impl HopRecord {
    /// The record's JSON line, without the line break.
    pub fn to_json_line(&self) -> String {
        let mut line = String::with_capacity(112 + self.request.len() + self.hop.len());
        write_line(
            &mut line,
            &self.request,
            &self.hop,
            self.seq,
            self.t_ns,
            self.bytes,
            self.kind,
        );
        line
    }
}

/// Nanoseconds since this process's monotonic epoch (the first time any probe asked).
pub(crate) fn monotonic_ns(at: Instant) -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(at.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

fn write_line(
    out: &mut String,
    request: &str,
    hop: &str,
    seq: u64,
    t_ns: u64,
    bytes: u64,
    kind: RecordKind,
) {
    out.push_str("{\"request\":");
    json_string(out, request);
    out.push_str(",\"hop\":");
    json_string(out, hop);
    let _ = write!(
        out,
        ",\"seq\":{seq},\"t_ns\":{t_ns},\"bytes\":{bytes},\"kind\":\"{}\"",
        kind.as_str()
    );
    if let Some((reason, idle_ns)) = kind.end() {
        let _ = write!(out, ",\"reason\":\"{reason}\",\"idle_ns\":{idle_ns}");
    }
    out.push('}');
}

/// Writes `text` as a JSON string.
pub(crate) fn json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c < ' ' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A record on its way to the writer: shared names, so sending one allocates nothing.
pub(crate) struct Pending {
    pub(crate) request: Arc<str>,
    pub(crate) hop: Arc<str>,
    pub(crate) seq: u64,
    pub(crate) t_ns: u64,
    pub(crate) bytes: u64,
    pub(crate) kind: RecordKind,
}

enum Message {
    Record(Pending),
    Sync(mpsc::Sender<()>),
}

/// Where hop records go: a bounded queue to a writer thread that appends JSON lines.
///
/// Recording never blocks a stream: when the queue is full the record is dropped and counted
/// ([`dropped`](RecordSink::dropped)), and a record the writer could not write is counted too
/// ([`failed`](RecordSink::failed)): never lost silently. With feature `metrics` the counts are
/// exported once per sink, however many hops share it (`streamgate_hop_records_total`).
/// Cloning shares the queue.
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

/// The default queue between probes and the writer: 64 Ki records.
pub const DEFAULT_RECORD_QUEUE: usize = 64 * 1024;

impl RecordSink {
    /// Appends records to the file at `path` (created if missing).
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

    /// Writes records to `writer` from a thread of its own, through a queue of `capacity`.
    ///
    /// # Errors
    ///
    /// What starting the thread returns.
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

    /// Queues a record, or counts it as dropped when the queue is full.
    pub(crate) fn send(&self, record: Pending) {
        if self.queue.try_send(Message::Record(record)).is_err() {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
        }
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
    let mut batch = Batch::default();
    while let Ok(first) = messages.recv() {
        for message in std::iter::once(first).chain(messages.try_iter()) {
            match message {
                Message::Record(r) => {
                    let text = &mut batch.text;
                    write_line(text, &r.request, &r.hop, r.seq, r.t_ns, r.bytes, r.kind);
                    text.push('\n');
                    batch.records += 1;
                    if batch.text.len() >= WRITE_BATCH {
                        batch.write(&mut out, counts);
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
struct Batch {
    text: String,
    records: u64,
    /// Drops already exported as metrics.
    #[cfg(feature = "metrics")]
    exported_dropped: u64,
}

impl Batch {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_escape_the_request_and_carry_the_end_reason() {
        let record = HopRecord {
            request: "req \"1\"\n\u{1}é".into(),
            hop: "gateway.recv".into(),
            seq: 42,
            t_ns: u64::MAX,
            bytes: 0,
            kind: RecordKind::End {
                reason: EndReason::ConsumerGone,
                idle_ns: 40_000_000_000,
            },
        };
        assert_eq!(
            record.to_json_line(),
            r#"{"request":"req \"1\"\n\u0001é","hop":"gateway.recv","seq":42,"t_ns":18446744073709551615,"bytes":0,"kind":"end","reason":"consumer_gone","idle_ns":40000000000}"#
        );
    }
}
