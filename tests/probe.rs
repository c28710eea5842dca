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
use streamgate::probe::{HopProbe, HopRecord, Observation, POSITION_CLASSES, RecordSink};
use streamgate::{Gate, GateExt, Kind};

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

/// What brute force says about one stream: (visible gaps with their output position, events by
/// kind, bytes by kind, longest quiet spell).
struct Expected {
    gaps: Vec<(u64, u64)>,
    events: [u64; 3],
    bytes: [u64; 3],
    max_quiet: u64,
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
    for seed in 1..40u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let hop = HopProbe::new("test.hop").stall_threshold(stall);
        let mut all_gaps = Vec::new();
        let mut total_visible = 0;
        for stream in 0..3 {
            let mut recorder = hop.recorder(format!("req-{seed}-{stream}"));
            let start = Instant::now();
            let mut now = start;
            let mut expected = Expected {
                gaps: Vec::new(),
                events: [0; 3],
                bytes: [0; 3],
                max_quiet: 0,
            };
            let (mut last_visible, mut last_alive, mut position) = (None, None, 0u64);
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
                    if let Some(last) = last_alive.replace(now) {
                        let quiet = (now - last).as_nanos() as u64;
                        expected.max_quiet = expected.max_quiet.max(quiet);
                    }
                }
                if kind == Kind::Visible {
                    if let Some(last) = last_visible {
                        let gap = (now - last) as Duration;
                        expected.gaps.push((position, gap.as_nanos() as u64));
                    }
                    last_visible = Some(now);
                    position += 1;
                }
            }
            let counters = recorder.counters();
            let stall_ns = stall.as_nanos() as u64;
            assert_eq!(counters.visible_events(), expected.events[0], "seed {seed}");
            assert_eq!(counters.hidden_events(), expected.events[1], "seed {seed}");
            assert_eq!(counters.control_events(), expected.events[2], "seed {seed}");
            assert_eq!(counters.visible_bytes(), expected.bytes[0], "seed {seed}");
            assert_eq!(counters.hidden_bytes(), expected.bytes[1], "seed {seed}");
            assert_eq!(counters.control_bytes(), expected.bytes[2], "seed {seed}");
            assert_eq!(counters.gaps().count(), expected.gaps.len() as u64);
            let max = expected.gaps.iter().map(|g| g.1).max().unwrap_or(0);
            assert_eq!(counters.max_gap(), Duration::from_nanos(max), "seed {seed}");
            let stalls = expected.gaps.iter().filter(|g| g.1 >= stall_ns).count() as u64;
            assert_eq!(counters.stalls(), stalls, "seed {seed}");
            assert_eq!(
                counters.max_quiet(),
                Duration::from_nanos(expected.max_quiet)
            );
            for (class, seen) in counters.by_position().iter().enumerate() {
                let limits = [0, 64, 256, 1024, 4096, u64::MAX];
                let in_class: Vec<u64> = expected
                    .gaps
                    .iter()
                    .filter(|(p, _)| (limits[class]..limits[class + 1]).contains(p))
                    .map(|g| g.1)
                    .collect();
                assert_eq!(seen.class, POSITION_CLASSES[class]);
                assert_eq!(
                    seen.gaps,
                    in_class.len() as u64,
                    "seed {seed} class {class}"
                );
                assert_eq!(seen.total.as_nanos() as u64, in_class.iter().sum::<u64>());
                assert_eq!(
                    seen.max.as_nanos() as u64,
                    in_class.iter().copied().max().unwrap_or(0)
                );
                let class_stalls = in_class.iter().filter(|&&g| g >= stall_ns).count() as u64;
                assert_eq!(seen.stalls, class_stalls);
            }
            // The histogram's median bucket holds the true median.
            if !expected.gaps.is_empty() {
                let mut sorted: Vec<u64> = expected.gaps.iter().map(|g| g.1).collect();
                sorted.sort_unstable();
                let median = sorted[sorted.len().div_ceil(2) - 1];
                let p50 = counters.gaps().quantile(0.5).unwrap().as_nanos() as u64;
                assert!(
                    p50 > median || median < 1024,
                    "seed {seed}: {p50} vs {median}"
                );
                assert!(p50 as f64 <= median.max(1024) as f64 * 1.125 + 1.0);
            }
            all_gaps.extend(expected.gaps.iter().map(|g| g.1));
            total_visible += expected.events[0];
            recorder.end("completed");
        }
        // The hop's aggregate is the sum of its streams.
        let snapshot = hop.snapshot();
        assert_eq!(snapshot.streams_started, 3);
        assert_eq!(snapshot.streams_ended, vec![("completed", 3)]);
        assert_eq!(snapshot.counters.visible_events(), total_visible);
        assert_eq!(snapshot.counters.gaps().count(), all_gaps.len() as u64);
        let max = all_gaps.iter().copied().max().unwrap_or(0);
        assert_eq!(snapshot.counters.max_gap(), Duration::from_nanos(max));
    }
}

#[test]
fn hidden_events_keep_a_stream_alive_but_are_not_progress() {
    let hop = HopProbe::new("worker.publish");
    let mut recorder = hop.recorder("reasoning");
    let start = Instant::now();
    recorder.observe_at(Observation::new(None, 3, Kind::Visible), start);
    // Five seconds of hidden reasoning, one delta every 500 ms, then visible output again.
    for i in 1..=10 {
        let at = start + Duration::from_millis(500 * i);
        recorder.observe_at(Observation::new(None, 3, Kind::Hidden), at);
    }
    recorder.observe_at(
        Observation::new(None, 3, Kind::Visible),
        start + Duration::from_millis(5500),
    );
    let counters = recorder.counters();
    assert_eq!(
        counters.max_gap(),
        Duration::from_millis(5500),
        "no visible progress"
    );
    assert_eq!(counters.stalls(), 1);
    assert_eq!(
        counters.max_quiet(),
        Duration::from_millis(500),
        "but alive throughout"
    );
    assert_eq!(counters.hidden_events(), 10);
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
    let records: Vec<HopRecord> = text
        .lines()
        .map(|l| HopRecord::parse_line(l).unwrap())
        .collect();
    assert_eq!(records.len(), 5);
    for (i, record) in records.iter().enumerate() {
        assert_eq!(
            (record.request.as_str(), record.hop.as_str()),
            ("req-7", "worker.write")
        );
        assert_eq!(
            (record.seq, record.bytes, record.kind),
            (i as u64, 3, Kind::Visible)
        );
    }
    assert!(records.windows(2).all(|w| w[0].t_ns <= w[1].t_ns));
    let snapshot = hop.snapshot();
    assert_eq!(snapshot.streams_ended, vec![("completed", 1)]);
    assert_eq!(
        snapshot.counters.buffer_age().count(),
        5,
        "every event was stamped"
    );
    assert_eq!(sink.written(), 5);
    assert_eq!(sink.dropped(), 0);
}

#[test]
fn records_over_a_full_queue_are_counted_as_dropped() {
    /// A writer that blocks until released, so the queue fills.
    struct Blocked(Arc<Mutex<()>>);
    impl Write for Blocked {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            drop(self.0.lock().unwrap());
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let gate = Arc::new(Mutex::new(()));
    let held = gate.lock().unwrap();
    let sink = RecordSink::to_writer(Blocked(gate.clone()), 4).unwrap();
    let hop = HopProbe::new("client.recv").records(sink.clone(), 1.0);
    // Each record is larger than the writer thread's buffer, so its first write blocks.
    let mut recorder = hop.recorder("busy".repeat(4096));
    for _ in 0..100 {
        recorder.observe(Observation::new(None, 1, Kind::Visible));
    }
    drop(held);
    sink.sync();
    // At most the queue (4) plus the one the writer held are written; the rest are counted.
    assert_eq!(sink.written() + sink.dropped(), 100);
    assert!(sink.dropped() >= 90, "{sink:?}");
    drop(recorder);
    assert_eq!(hop.snapshot().records_dropped, sink.dropped());
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
