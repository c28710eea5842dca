//! Probe counters against brute force, hidden events, hop records, and no allocation per event.

mod common;

use common::Rng;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use streamgate::probe::{HopProbe, Observation, POSITION_CLASSES, RecordSink};
use streamgate::{EndReason, Gate, GateExt, Kind};

/// Counts the allocations a thread makes while its `COUNTING` flag is set: other tests run
/// on other threads meanwhile and are not counted.
struct CountingAllocator;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// What brute force says about one stream: (visible gaps with the output position they ended
/// at, the stream's last gap included), events by kind, bytes by kind, quiet spells (with the
/// position they ended at) and whether the last one ended the stream.
struct Expected {
    gaps: Vec<(u64, u64)>,
    events: [u64; 3],
    bytes: [u64; 3],
    quiet: Vec<(u64, u64, bool)>,
}

fn kind_index(kind: Kind) -> usize {
    match kind {
        Kind::Visible => 0,
        Kind::Hidden => 1,
        Kind::Control => 2,
    }
}

#[test]
fn counters_agree_with_brute_force() {
    let stall = Duration::from_millis(800);
    let stall_ns = stall.as_nanos() as u64;
    for seed in 1..40u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let hop = HopProbe::new("test.hop").stall_threshold(stall);
        let mut all = Expected {
            gaps: Vec::new(),
            events: [0; 3],
            bytes: [0; 3],
            quiet: Vec::new(),
        };
        for stream in 0..3 {
            let mut recorder = hop.recorder(format!("req-{seed}-{stream}"));
            let start = Instant::now();
            let mut now = start;
            let mut expected = Expected {
                gaps: Vec::new(),
                events: [0; 3],
                bytes: [0; 3],
                quiet: Vec::new(),
            };
            // Every stream starts with a visible event, so its end's quiet spell is measured
            // from an event, not from the recorder's creation.
            recorder.observe_at(Observation::new(None, 1, Kind::Visible), now);
            expected.events[0] += 1;
            expected.bytes[0] += 1;
            let (mut last_visible, mut last_alive, mut position) = (now, now, 1u64);
            for _ in 0..rng.below(400) {
                // Mostly short gaps, sometimes stalls, spread over every position class.
                now += Duration::from_micros(match rng.below(20) {
                    0 => 500_000 + rng.below(2_000_000),
                    _ => rng.below(20_000),
                });
                let kind = [Kind::Visible, Kind::Visible, Kind::Hidden, Kind::Control]
                    [rng.below(4) as usize];
                let bytes = rng.below(300);
                recorder.observe_at(Observation::new(None, bytes, kind), now);
                expected.events[kind_index(kind)] += 1;
                expected.bytes[kind_index(kind)] += bytes;
                if kind != Kind::Control {
                    let quiet = (now - last_alive).as_nanos() as u64;
                    expected.quiet.push((position, quiet, false));
                    last_alive = now;
                }
                if kind == Kind::Visible {
                    let gap = (now - last_visible).as_nanos() as u64;
                    expected.gaps.push((position, gap));
                    last_visible = now;
                    position += 1;
                }
            }
            // The end: sometimes promptly, sometimes after a freeze.
            now += Duration::from_micros(match rng.below(3) {
                0 => 900_000 + rng.below(2_000_000),
                _ => rng.below(20_000),
            });
            recorder.end_at(EndReason::ConsumerGone, now);
            let idle = (now - last_alive).as_nanos() as u64;
            expected.quiet.push((position, idle, true));
            if last_visible == last_alive {
                let gap = (now - last_visible).as_nanos() as u64;
                expected.gaps.push((position, gap));
            }
            let summary = *recorder.summary();
            assert_eq!(summary.visible_events, expected.events[0], "seed {seed}");
            assert_eq!(summary.hidden_events, expected.events[1], "seed {seed}");
            assert_eq!(summary.control_events, expected.events[2], "seed {seed}");
            let stalls = expected.quiet.iter().filter(|q| q.1 >= stall_ns).count() as u64;
            assert_eq!(summary.stalls, stalls, "seed {seed}");
            let end = summary.end.unwrap();
            assert_eq!(end.idle, Duration::from_nanos(idle), "seed {seed}");
            assert_eq!(
                (end.reason, end.stalled),
                (EndReason::ConsumerGone, idle >= stall_ns)
            );
            let max_gap = expected.gaps.iter().map(|g| g.1).max().unwrap_or(0);
            assert_eq!(
                summary.max_gap,
                Duration::from_nanos(max_gap),
                "seed {seed}"
            );
            all.gaps.extend(expected.gaps);
            all.quiet.extend(expected.quiet);
            for kind in 0..3 {
                all.events[kind] += expected.events[kind];
                all.bytes[kind] += expected.bytes[kind];
            }
        }
        // The hop's aggregate is the sum of its streams' batches.
        let counters = hop.snapshot().counters;
        assert_eq!(counters.visible_events(), all.events[0], "seed {seed}");
        assert_eq!(counters.hidden_events(), all.events[1], "seed {seed}");
        assert_eq!(counters.control_events(), all.events[2], "seed {seed}");
        assert_eq!(counters.visible_bytes(), all.bytes[0], "seed {seed}");
        assert_eq!(counters.hidden_bytes(), all.bytes[1], "seed {seed}");
        assert_eq!(counters.control_bytes(), all.bytes[2], "seed {seed}");
        assert_eq!(counters.gaps().count(), all.gaps.len() as u64);
        let max = all.gaps.iter().map(|g| g.1).max().unwrap_or(0);
        assert_eq!(counters.max_gap(), Duration::from_nanos(max), "seed {seed}");
        assert_eq!(
            counters.gaps().max(),
            Duration::from_nanos(max),
            "seed {seed}"
        );
        let stalls = all.quiet.iter().filter(|q| q.1 >= stall_ns).count() as u64;
        assert_eq!(counters.stalls(), stalls, "seed {seed}");
        let at_end = all.quiet.iter().filter(|q| q.2 && q.1 >= stall_ns).count();
        assert_eq!(counters.stalls_at_end(), at_end as u64, "seed {seed}");
        let max_quiet = all.quiet.iter().map(|q| q.1).max().unwrap_or(0);
        assert_eq!(counters.max_quiet(), Duration::from_nanos(max_quiet));
        for (class, seen) in counters.by_position().iter().enumerate() {
            let limits = [0, 64, 256, 1024, 4096, u64::MAX];
            let in_class = |p: &u64| (limits[class]..limits[class + 1]).contains(p);
            let gaps: Vec<u64> = all
                .gaps
                .iter()
                .filter(|(p, _)| in_class(p))
                .map(|g| g.1)
                .collect();
            assert_eq!(seen.class, POSITION_CLASSES[class]);
            assert_eq!(seen.gaps, gaps.len() as u64, "seed {seed} class {class}");
            assert_eq!(seen.total.as_nanos() as u64, gaps.iter().sum::<u64>());
            assert_eq!(
                seen.max.as_nanos() as u64,
                gaps.iter().copied().max().unwrap_or(0)
            );
            let class_stalls = all
                .quiet
                .iter()
                .filter(|(p, q, _)| in_class(p) && *q >= stall_ns)
                .count() as u64;
            assert_eq!(seen.stalls, class_stalls, "seed {seed} class {class}");
        }
        // The histogram's median bucket holds the true median.
        let mut sorted: Vec<u64> = all.gaps.iter().map(|g| g.1).collect();
        sorted.sort_unstable();
        let median = sorted[sorted.len().div_ceil(2) - 1];
        let p50 = counters.gaps().quantile(0.5).unwrap().as_nanos() as u64;
        assert!(
            p50 > median || median < 1024,
            "seed {seed}: {p50} vs {median}"
        );
        assert!(p50 as f64 <= median.max(1024) as f64 * 1.125 + 1.0);
        assert_eq!(
            hop.snapshot().streams_ended.occurred(),
            [(EndReason::ConsumerGone, 3)]
        );
    }
}

#[test]
fn hidden_events_keep_a_stream_alive_and_a_reasoning_phase_is_no_stall() {
    let hop = HopProbe::new("worker.publish");
    let mut recorder = hop.recorder("reasoning");
    let start = Instant::now();
    recorder.observe_at(Observation::new(None, 3, Kind::Visible), start);
    // Five seconds of hidden reasoning, one delta every 500 ms, then visible output again.
    for i in 1..=10 {
        let at = start + Duration::from_millis(500 * i);
        recorder.observe_at(Observation::new(None, 3, Kind::Hidden), at);
    }
    let end = start + Duration::from_millis(5500);
    recorder.observe_at(Observation::new(None, 3, Kind::Visible), end);
    recorder.end_at(EndReason::Completed, end);
    let summary = *recorder.summary();
    assert_eq!(
        summary.max_gap,
        Duration::from_millis(5500),
        "no visible progress"
    );
    assert_eq!(summary.stalls, 0, "a reasoning phase is not a stall");
    assert_eq!(
        summary.max_quiet,
        Duration::from_millis(500),
        "alive throughout"
    );
    assert_eq!(summary.hidden_events, 10);
    assert_eq!(hop.snapshot().counters.stalls(), 0);
}

#[test]
fn a_freeze_that_ends_the_stream_is_a_stall_of_its_hop() {
    let hop = HopProbe::new("gateway.write");
    let mut recorder = hop.recorder("abandoned");
    let start = Instant::now();
    for i in 0..3 {
        recorder.observe_at(
            Observation::new(Some(i), 3, Kind::Visible),
            start + Duration::from_millis(10 * i),
        );
    }
    // Forty seconds of nothing, then the user leaves.
    recorder.end_at(
        EndReason::ConsumerGone,
        start + Duration::from_millis(40_020),
    );
    let end = recorder.summary().end.unwrap();
    assert_eq!(
        (end.reason, end.idle, end.stalled),
        (EndReason::ConsumerGone, Duration::from_secs(40), true)
    );
    let snapshot = hop.snapshot();
    assert_eq!(snapshot.counters.stalls(), 1);
    assert_eq!(snapshot.counters.stalls_at_end(), 1);
    assert_eq!(snapshot.counters.max_gap(), Duration::from_secs(40));
    assert_eq!(
        snapshot.counters.gaps().quantile(1.0),
        Some(Duration::from_secs(40)),
        "the last gap is in the histogram"
    );
    assert_eq!(
        snapshot.streams_ended.occurred(),
        [(EndReason::ConsumerGone, 1)]
    );

    // A stream that never produced anything and was abandoned ends in a stall too.
    let hop = HopProbe::new("client.recv").stall_threshold(Duration::from_millis(1));
    let recorder = hop.recorder("never-started");
    std::thread::sleep(Duration::from_millis(5));
    drop(recorder);
    let snapshot = hop.snapshot();
    assert_eq!(snapshot.counters.stalls_at_end(), 1);
    assert_eq!(
        snapshot.streams_ended.occurred(),
        [(EndReason::ConsumerGone, 1)],
        "dropped"
    );
}

/// A writer the test can read back.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_probed_gate_writes_hop_records_and_buffer_ages() {
    let out = Shared::default();
    let sink = RecordSink::to_writer(out.clone(), 1024).unwrap();
    let hop = HopProbe::new("worker.write").records(sink.clone(), 1.0);
    let consumer = Gate::new()
        .stamp_events(true)
        .spawn(|_, mut tx| async move {
            for i in 0..5 {
                tx.send(format!("t{i} ")).await?;
            }
            Ok::<_, streamgate::SendError<String>>(())
        });
    let events: Vec<_> = consumer.probe(&hop, "req-7").collect().await;
    assert_eq!(events.len(), 5);
    sink.sync();
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 6, "five events and the end");
    for (i, record) in records.iter().enumerate() {
        assert_eq!(record["request"], "req-7");
        assert_eq!(record["hop"], "worker.write");
        assert_eq!(record["seq"], i as u64);
        if i < 5 {
            assert_eq!(
                (&record["bytes"], &record["kind"]),
                (&3.into(), &"visible".into())
            );
            assert!(record.get("reason").is_none());
        } else {
            assert_eq!(
                (&record["bytes"], &record["kind"]),
                (&0.into(), &"end".into())
            );
            assert_eq!(record["reason"], "completed");
            assert!(record["idle_ns"].as_u64().unwrap() < 1_000_000_000);
        }
    }
    let times: Vec<u64> = records
        .iter()
        .map(|r| r["t_ns"].as_u64().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    let snapshot = hop.snapshot();
    assert_eq!(
        snapshot.streams_ended.occurred(),
        [(EndReason::Completed, 1)]
    );
    assert_eq!(
        snapshot.counters.buffer_age().count(),
        5,
        "every event was stamped"
    );
    assert_eq!(sink.written(), 6);
    assert_eq!((sink.dropped(), sink.failed()), (0, 0));
}

#[test]
fn records_over_a_full_queue_are_counted_as_dropped() {
    /// A writer that says when it is writing and then blocks until released, so the queue
    /// behind it fills.
    struct Blocked(Arc<Mutex<()>>, Arc<std::sync::atomic::AtomicBool>);
    impl Write for Blocked {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.1.store(true, std::sync::atomic::Ordering::SeqCst);
            drop(self.0.lock().unwrap());
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let gate = Arc::new(Mutex::new(()));
    let writing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let held = gate.lock().unwrap();
    let sink = RecordSink::to_writer(Blocked(gate.clone(), writing.clone()), 4).unwrap();
    let hop = HopProbe::new("client.recv").records(sink.clone(), 1.0);
    let mut recorder = hop.recorder("busy");
    // One record, and the writer thread is blocked writing it: nothing drains the queue now.
    recorder.observe(Observation::new(None, 1, Kind::Visible));
    let started = std::time::Instant::now();
    while !writing.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the writer never wrote"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    for _ in 0..100 {
        recorder.observe(Observation::new(None, 1, Kind::Visible));
    }
    drop(held);
    sink.sync();
    // The one being written and the queue (4) are written; the rest are counted as dropped.
    assert_eq!(sink.written() + sink.dropped(), 101);
    assert!(sink.dropped() >= 96, "{sink:?}");
    drop(recorder);
    sink.sync();
    assert_eq!(sink.written() + sink.dropped(), 102, "the end record too");
    assert_eq!(sink.failed(), 0);
}

#[test]
fn records_the_writer_fails_to_write_are_counted() {
    struct Full;
    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::from(std::io::ErrorKind::StorageFull))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Err(std::io::Error::from(std::io::ErrorKind::StorageFull))
        }
    }
    let sink = RecordSink::to_writer(Full, 1024).unwrap();
    let hop = HopProbe::new("worker.decode").records(sink.clone(), 1.0);
    let mut recorder = hop.recorder("disk-full");
    for _ in 0..10 {
        recorder.observe(Observation::new(None, 1, Kind::Visible));
    }
    recorder.end(EndReason::Completed);
    sink.sync();
    assert_eq!(sink.written(), 0);
    assert!(sink.failed() >= 1, "{sink:?}");
}

#[test]
fn a_failed_write_counts_its_batch_and_what_is_written_is_counted_written() {
    /// Fails its first write, then writes.
    struct FailsOnce(bool, Shared);
    impl Write for FailsOnce {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            if !std::mem::replace(&mut self.0, true) {
                return Err(std::io::Error::from(std::io::ErrorKind::StorageFull));
            }
            self.1.write(bytes)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let out = Shared::default();
    let sink = RecordSink::to_writer(FailsOnce(false, out.clone()), 1024).unwrap();
    let hop = HopProbe::new("worker.decode").records(sink.clone(), 1.0);
    let mut recorder = hop.recorder("flaky");
    recorder.observe(Observation::new(None, 1, Kind::Visible));
    sink.sync();
    assert_eq!((sink.written(), sink.failed()), (0, 1));
    for _ in 0..3 {
        recorder.observe(Observation::new(None, 1, Kind::Visible));
    }
    sink.sync();
    assert_eq!((sink.written(), sink.failed()), (3, 1));
    let lines = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    assert_eq!(lines.lines().count(), 3, "{lines}");
}

#[test]
fn a_long_request_id_is_cut_before_it_is_copied() {
    let out = Shared::default();
    let sink = RecordSink::to_writer(out.clone(), 1024).unwrap();
    let hop = HopProbe::new("gateway.recv").records(sink.clone(), 1.0);
    // 65 KB of a multi-byte character: the cut falls on a character boundary.
    let mut recorder = hop.recorder("é".repeat(32_768));
    assert_eq!(recorder.request().len(), 128);
    for _ in 0..1000 {
        recorder.observe(Observation::new(None, 1, Kind::Visible));
    }
    recorder.end(EndReason::Completed);
    sink.sync();
    let written = out.0.lock().unwrap().len();
    assert!(written < 1001 * 300, "{written} bytes for 1,001 records");
}

#[test]
fn a_recorder_is_under_one_kibibyte() {
    let size = std::mem::size_of::<streamgate::probe::Recorder>();
    println!("a recorder: {size} bytes");
    assert!(size <= 1024, "{size} bytes");
    // Besides itself, a recorder allocates only its request id (here: shared, so nothing).
    let hop = HopProbe::new("worker.publish");
    let request: Arc<str> = Arc::from("shared-id");
    let _warm = hop.recorder(request.clone());
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.with(|counting| counting.set(true));
    let recorders: Vec<_> = (0..100).map(|_| hop.recorder(request.clone())).collect();
    COUNTING.with(|counting| counting.set(false));
    // One allocation: the vector holding them.
    assert_eq!(ALLOCATIONS.load(Ordering::SeqCst), 1);
    drop(recorders);
}

#[test]
fn sampling_is_the_same_in_every_hop() {
    let sink = RecordSink::to_writer(std::io::sink(), 16).unwrap();
    let a = HopProbe::new("a").records(sink.clone(), 0.3);
    let b = HopProbe::new("b").records(sink, 0.3);
    let mut sampled = 0;
    for i in 0..1000 {
        let request = format!("req-{i}");
        let (ra, rb) = (a.recorder(request.as_str()), b.recorder(request.as_str()));
        assert_eq!(ra.is_sampled(), rb.is_sampled());
        sampled += usize::from(ra.is_sampled());
    }
    assert!(
        (200..400).contains(&sampled),
        "about 30% of 1000: {sampled}"
    );
}

#[test]
fn no_allocation_per_event() {
    let sink = RecordSink::to_writer(std::io::sink(), 1 << 16).unwrap();
    let plain = HopProbe::new("plain");
    let recorded = HopProbe::new("recorded").records(sink.clone(), 1.0);
    let mut recorders = [plain.recorder("a"), recorded.recorder("b")];
    // Warm up: first-event paths, flushes.
    for recorder in &mut recorders {
        for _ in 0..200 {
            recorder.observe(Observation::new(None, 5, Kind::Visible));
        }
    }
    sink.sync();
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.with(|counting| counting.set(true));
    for recorder in &mut recorders {
        for i in 0..10_000u64 {
            let kind = if i % 7 == 0 {
                Kind::Hidden
            } else {
                Kind::Visible
            };
            recorder.observe(Observation::new(Some(200 + i), 5, kind).waiting(3));
        }
    }
    COUNTING.with(|counting| counting.set(false));
    assert_eq!(
        ALLOCATIONS.load(Ordering::SeqCst),
        0,
        "20,000 events, no allocation"
    );
}
