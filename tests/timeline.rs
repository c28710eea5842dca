//! The timeline diagnosis on synthetic multi-hop timelines: a stall injected at each hop in
//! turn, each hop on a clock with its own random offset, is blamed on the hop it began at.

mod common;

use common::Rng;
use std::time::Duration;

use streamgate::Kind;
use streamgate::probe::HopRecord;
use streamgate::timeline::Timeline;

const PATH: [&str; 5] = [
    "worker.decode",
    "worker.publish",
    "gateway.recv",
    "gateway.write",
    "client.recv",
];

/// One request's records at every hop: events every 5 ms (with up to 2 ms of jitter per hop),
/// hidden events at every 10th seq, and a `stall_ms` delay added at `stall_hop` before `stall_seq`,
/// which every later hop inherits. Each hop's clock starts at its own random offset.
fn request(
    rng: &mut Rng,
    id: &str,
    events: u64,
    stall: Option<(usize, u64, u64)>,
) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let offsets: Vec<u64> = PATH.iter().map(|_| rng.below(1 << 50)).collect();
    let mut delay = vec![0u64; PATH.len()]; // accumulated stall delay at each hop
    for seq in 0..events {
        for (hop, name) in PATH.iter().enumerate() {
            if let Some((stall_hop, stall_seq, stall_ms)) = stall {
                if hop >= stall_hop && seq == stall_seq {
                    delay[hop] = stall_ms * 1_000_000;
                }
            }
            let t = seq * 5_000_000 + hop as u64 * 300_000 + rng.below(2_000_000) + delay[hop];
            let kind = if seq % 10 == 9 {
                Kind::Hidden
            } else {
                Kind::Visible
            };
            let record = HopRecord {
                request: id.to_owned(),
                hop: (*name).to_owned(),
                seq,
                t_ns: offsets[hop] + t,
                bytes: 12,
                kind,
            };
            lines.push((hop, record.to_json_line()));
        }
    }
    lines
}

#[test]
#[allow(clippy::needless_range_loop)] // the hop index is the point of the test
fn a_stall_is_blamed_on_the_hop_it_began_at() {
    let mut rng = Rng(0x5eed);
    for stall_hop in 0..PATH.len() {
        // One file per hop, as separate processes would write them.
        let mut files = vec![String::new(); PATH.len()];
        let mut injected = Vec::new();
        for r in 0..20 {
            let id = format!("req-{stall_hop}-{r}");
            let seq = 1 + rng.below(150);
            // Stalls never land on a hidden event: gaps are between visible events.
            let seq = if seq % 10 == 9 { seq + 1 } else { seq };
            let stall = (r % 2 == 0).then_some((stall_hop, seq, 1500 + rng.below(3000)));
            if stall.is_some() {
                injected.push((id.clone(), seq));
            }
            for (hop, line) in request(&mut rng, &id, 200, stall) {
                files[hop].push_str(&line);
                files[hop].push('\n');
            }
        }
        let mut timeline = Timeline::new(PATH, Duration::from_secs(1));
        for (hop, text) in files.iter().enumerate() {
            timeline.add_lines(PATH[hop], text);
        }
        let diagnosis = timeline.diagnose();
        assert!(diagnosis.problems.is_empty(), "{:?}", diagnosis.problems);
        assert_eq!(diagnosis.requests, 20);
        let found: Vec<(String, u64)> = diagnosis
            .stalls
            .iter()
            .map(|s| (s.request.clone(), s.seq))
            .collect();
        injected.sort();
        assert_eq!(found, injected, "stall at {}", PATH[stall_hop]);
        for stall in &diagnosis.stalls {
            assert_eq!(
                stall.hop, PATH[stall_hop],
                "only the hop it began at is blamed"
            );
            assert!(stall.gap >= Duration::from_millis(1500));
            match stall.upstream_gap {
                None => assert_eq!(stall_hop, 0),
                Some(gap) => assert!(gap < Duration::from_millis(20)),
            }
        }
        // Every hop from the stall on counts it; the ones before do not.
        for (hop, summary) in diagnosis.hops.iter().enumerate() {
            let expected = if hop >= stall_hop { 10 } else { 0 };
            assert_eq!(summary.stalls, expected, "{}", summary.hop);
            assert!(summary.p50 < Duration::from_millis(10));
        }
        let json = diagnosis.to_json();
        assert!(json.starts_with("{\"requests\":20,\"stalls\":[{\"request\":"));
        assert!(json.contains(&format!("\"hop\":\"{}\"", PATH[stall_hop])));
    }
}

#[test]
fn hidden_events_are_not_gaps() {
    let line = |seq: u64, t_ms: u64, kind: &str| {
        format!(
            "{{\"request\":\"r\",\"hop\":\"worker.publish\",\"seq\":{seq},\"t_ns\":{},\"bytes\":1,\"kind\":\"{kind}\"}}\n",
            t_ms * 1_000_000
        )
    };
    let mut text = line(0, 0, "visible");
    for seq in 1..10 {
        text.push_str(&line(seq, seq * 400, "hidden"));
    }
    text.push_str(&line(10, 4000, "visible"));
    let mut timeline = Timeline::new(["worker.publish"], Duration::from_secs(1));
    timeline.add_lines("w", &text);
    let diagnosis = timeline.diagnose();
    // A 4 s reasoning phase is one 4 s visible gap: a stall for the user, whatever was alive.
    assert_eq!(diagnosis.stalls.len(), 1);
    assert_eq!(diagnosis.stalls[0].gap, Duration::from_secs(4));
    assert_eq!(diagnosis.hops[0].gaps, vec![(1, Duration::from_secs(4))]);
}

#[test]
fn bad_input_is_reported_and_skipped() {
    let good = |seq: u64, t: u64| {
        format!(
            "{{\"request\":\"r\",\"hop\":\"gateway.recv\",\"seq\":{seq},\"t_ns\":{t},\"bytes\":1,\"kind\":\"visible\"}}"
        )
    };
    let text = [
        good(0, 100),
        "{\"request\":\"r\",\"hop\":\"gateway.recv\",\"seq\":1,\"t_ns\"".to_owned(), // truncated
        good(1, 200),
        good(1, 250),                                                               // duplicate
        good(4, 150),                                                               // seq gap, time backwards
        "{\"request\":\"r\",\"hop\":\"edge.cdn\",\"seq\":5,\"t_ns\":1,\"bytes\":1,\"kind\":\"visible\"}".to_owned(),
        "not json at all".to_owned(),
        String::new(),
        good(5, 300),
    ]
    .join("\n");
    let mut timeline = Timeline::new(["gateway.recv"], Duration::from_secs(1));
    timeline.add_lines("gateway.jsonl", &text);
    let diagnosis = timeline.diagnose();
    let lines: Vec<Option<usize>> = diagnosis.problems.iter().map(|p| p.line).collect();
    assert_eq!(lines, [Some(2), Some(4), Some(6), Some(7), None, None]);
    assert!(diagnosis.problems[4].message.contains("seq 2..3 missing"));
    assert!(diagnosis.problems[5].message.contains("backwards"));
    // What could be read still counts: gaps 0->1 (150 ns) and 4->5 (150 ns).
    assert_eq!(diagnosis.hops[0].gaps.len(), 2);
    assert!(diagnosis.report().contains("problems in the input"));
}
