//! Slices of a diagnosis (`Timeline::slice_by`): a generated fleet of 10,000 requests over four
//! pools where one pool stalls 5% of its requests, sliced by pool, by output position, by
//! length and by length and pool; a request without the attribute counts as `(none)`; a rare
//! value stands out only as far as its rate is sure.

mod common;

use std::time::Duration;

use common::Rng;
use streamgate::timeline::{By, Diagnosis, Slices, Timeline};

const MS: u64 = 1_000_000;
const PATH: [&str; 3] = ["worker.publish", "proxy.recv", "client.recv"];

/// The fleet: `requests` requests of 41 to `longest` events 10 ms apart, in pools `p0`..`p3` (named
/// by `proxy.recv`'s first record), each hop on its own clock; in `p2`, every 20th request
/// stalls 1.5 s at the worker before event 40 (5% of `p2`, 1.25% of the fleet). One request in
/// 200 of `p1` carries no `pool`. Fed to a timeline sliced `by`, one request at a time.
fn sliced(requests: u64, longest: u64, by: impl IntoIterator<Item = By>) -> (Diagnosis, Slices) {
    let mut timeline = Timeline::new(PATH, Duration::from_secs(1)).slice_by(by);
    let mut rng = Rng(7);
    let mut lines = String::new();
    for r in 0..requests {
        lines.clear();
        let pool = r % 4;
        let events = 41 + rng.below(longest - 40);
        let stalls = pool == 2 && (r / 4) % 20 == 0;
        let named = r % 200 != 1;
        for (h, hop) in PATH.iter().enumerate() {
            let mut t = (h as u64 + 1) * 1_000_000 * MS + r * 7 * MS;
            for seq in 0..events {
                t += 10 * MS + rng.below(MS / 2);
                if stalls && seq == 40 {
                    t += 1_500 * MS;
                }
                let attrs = if seq == 0 && h == 1 && named {
                    format!(r#","attrs":{{"pool":"p{pool}","upstream":"u{}"}}"#, r % 8)
                } else {
                    String::new()
                };
                lines.push_str(&format!(
                    "{{\"request\":\"r{r}\",\"hop\":\"{hop}\",\"seq\":{seq},\"t_ns\":{t},\"bytes\":3,\"kind\":\"visible\"{attrs}}}\n"
                ));
            }
            lines.push_str(&format!(
                "{{\"request\":\"r{r}\",\"hop\":\"{hop}\",\"seq\":{events},\"t_ns\":{},\"bytes\":0,\"kind\":\"end\",\"reason\":\"completed\",\"idle_ns\":{MS}}}\n",
                t + MS
            ));
        }
        timeline.add_lines("fleet.jsonl", &lines);
    }
    let mut diagnosis = timeline.diagnose();
    let slices = diagnosis.slices.pop().expect("sliced");
    (diagnosis, slices)
}

fn values(slices: &Slices) -> Vec<String> {
    slices.rows.iter().map(|row| row.values.join(" ")).collect()
}

#[test]
fn the_pool_that_stalls_comes_first() {
    let (diagnosis, slices) = sliced(10_000, 72, [By::Attr("pool".into())]);
    assert!(diagnosis.problems.is_empty(), "{:?}", diagnosis.problems);
    let stalled = diagnosis.stalls_total;
    assert_eq!(stalled, 125);
    assert_eq!(slices.hop, "client.recv");
    assert_eq!(values(&slices)[0], "p2", "{slices:#?}");
    let p2 = &slices.rows[0];
    assert_eq!((p2.requests, p2.stalled), (2_500, stalled));
    assert_eq!(p2.stall_rate(), 0.05);
    assert_eq!(p2.began, [("worker.publish".to_owned(), stalled)]);
    assert_eq!(p2.unknown, 0);
    // The others: no stall; requests without the attribute are `(none)`, not dropped.
    let total: u64 = slices.rows.iter().map(|row| row.requests).sum();
    assert_eq!(total, 10_000);
    for row in &slices.rows[1..] {
        assert_eq!((row.stalled, row.gaps_incomplete), (0, 0), "{row:?}");
        assert!(
            row.gap_p99.unwrap() <= Duration::from_micros(10_500 * 9 / 8),
            "{row:?}"
        );
    }
    let none = slices
        .rows
        .iter()
        .find(|row| row.values == ["(none)"])
        .unwrap();
    assert_eq!(none.requests, 50, "one in 200 (of p1, as it happens)");
    // The stalled pool's gap p99 at the client: the stalls are 1 in 20 of its requests, each
    // one gap in some 60, so its p99 is the others' (within a bucket).
    assert!(
        p2.gap_p99.unwrap() <= Duration::from_micros(10_500 * 9 / 8),
        "{p2:?}"
    );
}

#[test]
fn by_position_the_stalls_are_where_they_happened() {
    let (diagnosis, slices) = sliced(2_000, 200, [By::Position]);
    let rows: Vec<(String, u64, u64)> = slices
        .rows
        .iter()
        .map(|row| (row.values[0].clone(), row.requests, row.stalled))
        .collect();
    // Every request reaches 0-63; the stalls follow event 39.
    assert_eq!(rows[0], ("0-63".to_owned(), 2_000, diagnosis.stalls_total));
    assert!(rows[1..].iter().all(|row| row.2 == 0), "{rows:?}");
    assert_eq!(
        rows.iter().map(|row| row.0.as_str()).collect::<Vec<_>>(),
        ["0-63", "64-127", "128-255"]
    );
    assert!(
        rows.windows(2).all(|w| w[0].1 >= w[1].1),
        "fewer reach further: {rows:?}"
    );
    // Gaps by their output position: every bucket's p99 is the 10 ms cadence's.
    let cadence = Duration::from_micros(10_500 * 9 / 8);
    assert!(
        slices
            .rows
            .iter()
            .all(|row| row.gap_p99.is_some_and(|p99| p99 <= cadence)),
        "{slices:#?}"
    );
}

#[test]
fn requests_of_similar_length_are_compared_across_pools() {
    let (_, slices) = sliced(4_000, 200, [By::Length, By::Attr("pool".into())]);
    // Length buckets in order; within each, the stalling pool first.
    let rows = values(&slices);
    assert_eq!(rows[0].split(' ').next(), Some("0-63"));
    let buckets: Vec<&str> = rows
        .iter()
        .map(|row| row.split(' ').next().unwrap())
        .collect();
    let mut sorted = buckets.clone();
    sorted.dedup();
    assert_eq!(sorted, ["0-63", "64-127", "128-255"], "{rows:?}");
    for bucket in ["0-63", "64-127", "128-255"] {
        let first = rows.iter().find(|row| row.starts_with(bucket)).unwrap();
        assert_eq!(*first, format!("{bucket} p2"), "{rows:?}");
    }
    for row in &slices.rows {
        assert_eq!(row.stalled > 0, row.values[1] == "p2", "{row:?}");
    }
}

#[test]
fn a_rare_value_stands_out_only_when_it_is_sure_to() {
    // One request of one pool, stalled: at 95%, its rate is above 20.6%, no more sure than
    // that. 1,000 of another, 300 stalled (above 27%): the second first.
    let mut lines = Vec::new();
    let mut add = |r: u64, pool: &str, stall: bool| {
        let gap = if stall { 2_000 } else { 10 };
        lines.push(format!(r#"{{"request":"q{r}","hop":"proxy.recv","seq":0,"t_ns":0,"bytes":3,"kind":"visible","attrs":{{"pool":"{pool}"}}}}"#));
        lines.push(format!(r#"{{"request":"q{r}","hop":"proxy.recv","seq":1,"t_ns":{},"bytes":3,"kind":"visible"}}"#, gap * MS));
    };
    add(0, "rare", true);
    for r in 1..=1000 {
        add(r, "common", r % 10 < 3);
    }
    let mut timeline =
        Timeline::new(["proxy.recv"], Duration::from_secs(1)).slice_by([By::Attr("pool".into())]);
    timeline.add_lines("proxy.jsonl", &lines.join("\n"));
    let slices = timeline.diagnose().slices.pop().unwrap();
    assert_eq!(values(&slices), ["common", "rare"]);
    assert_eq!(slices.rows[1].stall_rate(), 1.0);
}
