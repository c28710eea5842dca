//! The probe's metrics through a real Prometheus recorder: install order, names, buckets.

use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use streamgate::probe::{HopProbe, METRIC_BUCKETS, Observation, describe_metrics};
use streamgate::{EndReason, Kind};

/// The value of the sample line that starts with `prefix`.
fn sample(page: &str, prefix: &str) -> f64 {
    page.lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .unwrap_or_else(|| panic!("no `{prefix}` in\n{page}"))
        .parse()
        .unwrap()
}

#[test]
fn a_hop_made_before_the_recorder_exports_every_metric_with_the_crates_buckets() {
    // The hop exists before any recorder: its first handles are the no-op recorder's.
    let hop = HopProbe::new("worker.write");
    drop(hop.recorder("before"));
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Prefix("streamgate_".into()), &METRIC_BUCKETS)
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        describe_metrics();
        let mut stream = hop.recorder("req-1");
        let start = Instant::now();
        // Three 5 s stalls, then a prompt end.
        for (seq, s) in [0u64, 5, 10, 15].into_iter().enumerate() {
            let at = start + Duration::from_secs(s);
            stream.observe_at(Observation::new(Some(seq as u64), 3, Kind::Visible), at);
        }
        stream.end_at(EndReason::Completed, start + Duration::from_secs(15));
        // A stream abandoned in a freeze.
        let mut frozen = hop.recorder("req-2");
        frozen.observe_at(Observation::new(Some(0), 3, Kind::Visible), start);
        frozen.end_at(EndReason::ConsumerGone, start + Duration::from_secs(40));
        // One ten minutes long: past the crate's last bucket, exported at its true value.
        let mut long = hop.recorder("req-3");
        long.observe_at(Observation::new(Some(0), 3, Kind::Visible), start);
        let later = start + Duration::from_secs(600);
        long.observe_at(Observation::new(Some(1), 3, Kind::Visible), later);
        long.end_at(EndReason::Completed, later);
    });
    let page = handle.render();
    let hop = r#"hop="worker.write""#;
    assert!(page.contains("# HELP streamgate_gap_seconds"), "{page}");
    assert_eq!(
        sample(&page, &format!("streamgate_stalls_total{{{hop}}}")),
        5.0
    );
    assert_eq!(
        sample(
            &page,
            &format!(r#"streamgate_events_total{{{hop},kind="visible"}}"#)
        ),
        7.0
    );
    assert_eq!(
        sample(
            &page,
            &format!("streamgate_time_to_first_event_seconds_count{{{hop}}}")
        ),
        3.0
    );
    // Gaps: three of 5 s, 600 s, and the last one of each stream (0 s, 40 s, 0 s).
    assert_eq!(
        sample(&page, &format!("streamgate_gap_seconds_count{{{hop}}}")),
        7.0
    );
    let bucket = |le: &str| {
        sample(
            &page,
            &format!(r#"streamgate_gap_seconds_bucket{{{hop},le="{le}"}}"#),
        )
    };
    assert_eq!(bucket("0.0001"), 2.0, "the prompt ends");
    assert_eq!(bucket("2"), 2.0);
    assert_eq!(bucket("10"), 5.0, "three 5 s stalls are stalls, not 28 ms");
    assert_eq!(bucket("60"), 6.0);
    assert_eq!(bucket("300"), 6.0, "ten minutes is not 275 s");
    assert_eq!(bucket("600"), 7.0);
    let ended = |reason: &str, stalled: &str| {
        sample(
            &page,
            &format!(
                r#"streamgate_streams_ended_total{{{hop},reason="{reason}",stalled="{stalled}"}}"#
            ),
        )
    };
    assert_eq!(ended("completed", "false"), 2.0);
    assert_eq!(ended("consumer_gone", "true"), 1.0);
}
