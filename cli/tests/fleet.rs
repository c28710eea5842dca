//! `streamgate proxy` in front of a fleet, over real sockets on 127.0.0.1: fake providers that
//! fail the ways providers fail (`common/provider`) and `streamgate sim` replicas as processes
//! (`common/replica.rs`). For each fault: how many attempts reached each upstream and how far
//! apart, what the client got (a whole answer, or the last failure's status and body), and
//! `/stats` and `/metrics` afterwards.

mod common;
#[path = "common/fleet_setup.rs"]
mod fleet_setup;
#[path = "common/proxy_setup.rs"]
mod setup;

// `setup` names the raw client `crate::client`.
use common as client;

use std::net::SocketAddr;
use std::time::Duration;

use common::provider::{
    Answer, Behaviour, ErrorCode, Failure, Provider, RetryAfter, Script, Stream,
};
use common::replica::Replica;
use common::tls::Authority;
use common::{BodyEnd, HANG, RawResponse, content, data, stats, wait_for};
use fleet_setup::{all_ended, chat, configured, file, read, replicas, stream, upstream};
use serde_json::Value;
use setup::CHAT;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

#[tokio::test]
async fn a_one_off_500_is_retried_on_the_only_replica_after_a_backoff_invisibly() {
    let provider = Provider::start(Script::queue([Behaviour::status(500)], Behaviour::ok())).await;
    let proxy = replicas(&[&provider.url()], &[]);
    read(stream(proxy, "m", 5).await).await.assert_whole("m", 5);
    assert_eq!(provider.attempt_count(), 2);
    // The default backoff is 100 ms with jitter: between half and all of it.
    let gap = provider.gaps()[0];
    assert!(gap >= Duration::from_millis(50), "{gap:?}");
    let stats = stats(proxy).await;
    assert_eq!(stats["streams_completed"], 1, "{stats}");
    assert_eq!(stats["attempts_retried"], 1, "{stats}");
    let counted = upstream(&stats, &provider.url());
    assert_eq!(counted["failures_by_cause"]["server_error"], 1, "{stats}");
    assert_eq!(counted["picks"], 2, "{stats}");
}

#[tokio::test]
async fn a_reset_before_the_headers_moves_to_another_replica_at_once() {
    let broken = Provider::start(Script::always(Behaviour::Reset)).await;
    let good = Provider::start(Script::always(Behaviour::ok())).await;
    // A long cool-down: once ejected, the broken one is not asked again in this test.
    let toml = format!(
        "[[pool]]\nname = \"p\"\nupstreams = [\"{}\", \"{}\"]\nfailures = 2\ncooldown_ms = 600000\nmax_cooldown_ms = 600000\n",
        broken.url(),
        good.url()
    );
    let proxy = configured("reset", &toml, &[]);
    // Ties go at random: until the broken one was picked twice (and so ejected), then more.
    let mut requests = 0;
    while broken.attempt_count() < 2 || requests < 10 {
        read(stream(proxy, "m", 3).await).await.assert_whole("m", 3);
        requests += 1;
        assert!(requests < 200, "the broken replica was never picked twice");
    }
    assert_eq!(
        good.attempt_count(),
        requests,
        "every request answered there"
    );
    assert_eq!(
        broken.attempt_count(),
        2,
        "ejected after its second failure"
    );
    let stats = stats(proxy).await;
    let counted = upstream(&stats, &broken.url());
    assert_eq!(counted["failures_by_cause"]["reset"], 2, "{stats}");
    assert_eq!(stats["attempts_retried"], 2, "{stats}");
    assert_eq!(counted["ejected"], true, "{stats}");
}

#[tokio::test]
async fn a_rate_limited_replica_sees_no_second_attempt_within_a_second_or_its_retry_after() {
    let cases = [
        (None, Duration::from_secs(1)),
        (Some(RetryAfter::Seconds(2)), Duration::from_secs(2)),
        // An HTTP date has whole seconds: at least 2 s minus the time it took to arrive.
        (
            Some(RetryAfter::DateIn(Duration::from_secs(2))),
            Duration::from_millis(1900),
        ),
    ];
    let runs = cases.into_iter().map(|(retry_after, least)| async move {
        let mut limited = Failure::new(429);
        if let Some(retry_after) = retry_after.clone() {
            limited = limited.retry_after(retry_after);
        }
        let provider =
            Provider::start(Script::queue([Behaviour::from(limited)], Behaviour::ok())).await;
        let proxy = replicas(&[&provider.url()], &[]);
        read(stream(proxy, "m", 2).await).await.assert_whole("m", 2);
        assert_eq!(provider.attempt_count(), 2, "{retry_after:?}");
        let gap = provider.gaps()[0];
        assert!(gap >= least, "{retry_after:?}: {gap:?}");
    });
    futures_util::future::join_all(runs).await;
}

#[tokio::test]
async fn a_retry_after_beyond_the_budget_is_not_waited_for_the_429_is_passed_on() {
    let limited = Failure::new(429).retry_after(RetryAfter::Seconds(120));
    let provider = Provider::start(Script::always(limited.clone().into())).await;
    let proxy = replicas(&[&provider.url()], &[]);
    let mut response = stream(proxy, "m", 2).await;
    assert_eq!(response.status(), 429);
    assert_eq!(response.header("retry-after").as_deref(), Some("120"));
    assert_eq!(response.text().await, limited.body());
    assert_eq!(provider.attempt_count(), 1);
    let stats = stats(proxy).await;
    assert_eq!(stats["upstream_failures"]["rate_limited"], 1, "{stats}");
    assert_eq!(stats["streams_completed"], 0, "{stats}");
}

#[tokio::test]
async fn overloaded_everywhere_gives_up_after_three_attempts_spaced_on_the_same_replica() {
    let a = Provider::start(Script::always(Behaviour::status(503))).await;
    let b = Provider::start(Script::always(Behaviour::status(503))).await;
    let proxy = replicas(&[&a.url(), &b.url()], &[]);
    let mut response = stream(proxy, "m", 2).await;
    assert_eq!(response.status(), 503);
    assert_eq!(response.text().await, Failure::new(503).body());
    let mut counts = [a.attempt_count(), b.attempt_count()];
    counts.sort();
    assert_eq!(counts, [1, 2], "the other replica, then the same one again");
    let again = if a.attempt_count() == 2 { &a } else { &b };
    let gap = again.gaps()[0];
    assert!(gap >= Duration::from_secs(1), "{gap:?}");
    let stats = stats(proxy).await;
    assert_eq!(stats["attempts_retried"], 2, "{stats}");
    assert_eq!(stats["upstream_failures"]["unavailable"], 1, "{stats}");
}

#[tokio::test]
async fn what_another_attempt_cannot_fix_is_passed_on_after_one() {
    let failures = [
        Failure::new(400),
        Failure::new(401),
        Failure::new(403),
        Failure::new(404),
        Failure::new(413),
        Failure::new(422),
        Failure::new(400).code(ErrorCode::ContentPolicyViolation),
        Failure::new(400).code(ErrorCode::InvalidValue),
        // No context fallback is configured.
        Failure::new(400).code(ErrorCode::ContextLengthExceeded),
    ];
    for failure in failures {
        let a = Provider::start(Script::always(failure.clone().into())).await;
        let b = Provider::start(Script::always(failure.clone().into())).await;
        let proxy = replicas(&[&a.url(), &b.url()], &[]);
        let mut response = stream(proxy, "m", 2).await;
        assert_eq!(response.status(), failure.status.as_u16(), "{failure:?}");
        assert_eq!(response.text().await, failure.body(), "{failure:?}");
        assert_eq!(a.attempt_count() + b.attempt_count(), 1, "{failure:?}");
        let stats = stats(proxy).await;
        assert_eq!(stats["attempts_retried"], 0, "{failure:?}: {stats}");
        let ejected = stats["upstreams"].as_array().unwrap().iter();
        assert!(
            ejected
                .map(|u| u["ejected_models"].as_array().unwrap().len())
                .all(|n| n == 0),
            "the request's fault counts against nobody: {stats}"
        );
    }
}

#[tokio::test]
async fn a_prompt_too_long_goes_only_to_the_larger_context_fallback() {
    let short = Provider::start(Script::always(
        Failure::new(400)
            .code(ErrorCode::ContextLengthExceeded)
            .into(),
    ))
    .await;
    let long = Provider::start(Script::always(Behaviour::ok())).await;
    let other = Provider::start(Script::always(Behaviour::ok())).await;
    let toml = format!(
        r#"
        [[pool]]
        name = "short"
        models = ["small"]
        upstreams = ["{}"]
        [[pool]]
        name = "long"
        models = ["small-128k"]
        upstreams = ["{}"]
        [[pool]]
        name = "other"
        models = ["other"]
        upstreams = ["{}"]
        [fallbacks]
        small = "other"
        [context_fallbacks]
        small = "small-128k"
        "#,
        short.url(),
        long.url(),
        other.url()
    );
    let proxy = configured("context", &toml, &[]);
    read(stream(proxy, "small", 4).await)
        .await
        .assert_whole("small-128k", 4);
    assert_eq!(short.attempt_count(), 1);
    assert_eq!(other.attempt_count(), 0, "not an ordinary fallback");
    let moved = &long.attempts()[0];
    assert_eq!(moved.model.as_deref(), Some("small-128k"));
    assert_eq!(moved.json().unwrap()["messages"][0]["content"], "hi");
    let stats = stats(proxy).await;
    assert_eq!(stats["fallbacks_answered"], 1, "{stats}");
    assert_eq!(stats["streams_completed"], 1, "{stats}");
}

#[tokio::test]
async fn a_fallback_answers_with_its_own_model_and_usage_and_only_it_is_a_completion() {
    let big = Provider::start(Script::always(Behaviour::status(503))).await;
    let small = Provider::start(Script::always(Behaviour::ok())).await;
    let toml = format!(
        "[[pool]]\nname = \"big\"\nmodels = [\"big\"]\nupstreams = [\"{}\"]\n[[pool]]\nname = \"small\"\nmodels = [\"small\"]\nupstreams = [\"{}\"]\n",
        big.url(),
        small.url()
    );
    let fallbacks = file("fallbacks.json", r#"{"big": "small"}"#);
    let proxy = configured(
        "fallback",
        &toml,
        &["--fallbacks", fallbacks.to_str().unwrap()],
    );
    read(stream(proxy, "big", 6).await)
        .await
        .assert_whole("small", 6);
    // A throttled only replica with a fallback left: the fallback at once.
    assert_eq!(big.attempt_count(), 1);
    assert_eq!(small.attempts()[0].model.as_deref(), Some("small"));
    let stats = stats(proxy).await;
    assert_eq!(stats["streams_completed"], 1, "{stats}");
    assert_eq!(stats["fallbacks_answered"], 1, "{stats}");
    assert_eq!(stats["attempts_retried"], 1, "{stats}");
    let failed = upstream(&stats, &big.url());
    assert_eq!(failed["failures_by_cause"]["unavailable"], 1, "{stats}");
    assert_eq!(upstream(&stats, &small.url())["picks"], 1, "{stats}");
    assert_eq!(upstream(&stats, &small.url())["in_flight"], 0, "{stats}");

    let metrics = RawResponse::get(proxy, "/metrics", "").await.text().await;
    let series = |name: &str, pool: &str, url: &str, rest: &str| {
        format!("{name}{{pool=\"{pool}\",upstream=\"{url}\"{rest}}}")
    };
    let (big_url, small_url) = (
        failed["url"].as_str().unwrap(),
        upstream(&stats, &small.url())["url"].as_str().unwrap(),
    );
    for (line, value) in [
        (
            series(
                "streamgate_proxy_upstream_attempt_failures_total",
                "big",
                big_url,
                ",cause=\"unavailable\"",
            ),
            "1",
        ),
        (
            series(
                "streamgate_proxy_upstream_picks_total",
                "small",
                small_url,
                "",
            ),
            "1",
        ),
        (
            series(
                "streamgate_proxy_upstream_in_flight",
                "small",
                small_url,
                "",
            ),
            "0",
        ),
        (
            series("streamgate_proxy_upstream_ejected", "big", big_url, ""),
            "0",
        ),
    ] {
        assert!(
            metrics.lines().any(|l| l == format!("{line} {value}")),
            "{line} {value} in:\n{metrics}"
        );
    }
}

#[tokio::test]
async fn an_unknown_model_is_a_404_and_reaches_no_upstream() {
    let provider = Provider::start(Script::always(Behaviour::ok())).await;
    let toml = format!(
        "[[pool]]\nname = \"p\"\nmodels = [\"known-*\"]\nupstreams = [\"{}\"]\n",
        provider.url()
    );
    let proxy = configured("unknown", &toml, &[]);
    let mut response = stream(proxy, "unknown", 2).await;
    assert_eq!(response.status(), 404);
    let body: Value = serde_json::from_str(&response.text().await).unwrap();
    assert_eq!(body["error"]["code"], "model_not_found", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown"),
        "{body}"
    );
    read(stream(proxy, "known-1", 2).await)
        .await
        .assert_whole("known-1", 2);
    assert_eq!(provider.attempt_count(), 1);
}

#[tokio::test]
async fn a_silent_replica_is_never_asked_again_by_the_same_request() {
    let silent = Provider::start(Script::always(Behaviour::Silent)).await;
    let proxy = replicas(&[&silent.url()], &["--upstream-headers-ms", "300"]);
    let mut response = stream(proxy, "m", 2).await;
    assert_eq!(response.status(), 504);
    let body = response.text().await;
    assert!(body.contains("300 ms"), "{body}");
    assert_eq!(silent.attempt_count(), 1, "never the same silent replica");

    let good = Provider::start(Script::always(Behaviour::ok())).await;
    let proxy = replicas(
        &[&silent.url(), &good.url()],
        &["--upstream-headers-ms", "300"],
    );
    for _ in 0..4 {
        read(stream(proxy, "m", 2).await).await.assert_whole("m", 2);
    }
    assert_eq!(good.attempt_count(), 4);
    let stats = stats(proxy).await;
    let counted = upstream(&stats, &silent.url());
    assert_eq!(
        counted["failures_by_cause"]["headers_timeout"], counted["picks"],
        "{stats}"
    );
}

#[tokio::test]
async fn a_first_token_too_late_moves_the_request_to_a_fallback() {
    let slow = Provider::start(Script::always(
        Stream::new()
            .first_event_after(Duration::from_secs(5))
            .into(),
    ))
    .await;
    let fast = Provider::start(Script::always(Behaviour::ok())).await;
    let toml = format!(
        "[[pool]]\nname = \"slow\"\nmodels = [\"a\"]\nupstreams = [\"{}\"]\n[[pool]]\nname = \"fast\"\nmodels = [\"b\"]\nupstreams = [\"{}\"]\n[fallbacks]\na = \"b\"\n",
        slow.url(),
        fast.url()
    );
    let proxy = configured("first-token", &toml, &["--first-token-ms", "200"]);
    read(stream(proxy, "a", 3).await).await.assert_whole("b", 3);
    let stats = stats(proxy).await;
    let counted = upstream(&stats, &slow.url());
    assert_eq!(
        counted["failures_by_cause"]["first_event_timeout"], 1,
        "{stats}"
    );
    assert_eq!(stats["fallbacks_answered"], 1, "{stats}");
}

#[tokio::test]
async fn a_final_chunk_closed_without_done_is_complete_with_the_done_the_client_expects() {
    let provider = Provider::start(Script::always(Stream::new().without_done().into())).await;
    let proxy = replicas(&[&provider.url()], &[]);
    read(stream(proxy, "m", 4).await).await.assert_whole("m", 4);
    let stats = stats(proxy).await;
    assert_eq!(stats["streams_completed"], 1, "{stats}");
    assert_eq!(stats["streams_upstream_error"], 0, "{stats}");
}

/// An upstream whose body ends a moment after its `[DONE]` (a server whose stream ends on
/// another thread than the one that sent it) sees its answer read to the end, not its client
/// gone at `[DONE]`: the connection is not closed under it, and serves the next request.
#[tokio::test]
async fn an_upstream_s_body_is_read_to_its_end_after_done_and_its_connection_reused() {
    let late_end = Stream::new().end_after(Duration::from_millis(50));
    let provider = Provider::start(Script::always(late_end.into())).await;
    let proxy = replicas(&[&provider.url()], &[]);
    for n in 1..=3 {
        read(stream(proxy, "m", 4).await).await.assert_whole("m", 4);
        let ended = |p: &Provider| p.bodies_ended() == n;
        provider.until("the body read to its end", ended).await;
    }
    let connections: Vec<u64> = provider.attempts().iter().map(|a| a.connection).collect();
    assert_eq!(
        connections,
        [1, 1, 1],
        "one connection, kept open and reused"
    );
    assert_eq!(provider.accepted(), 1);
}

#[tokio::test]
async fn an_event_of_invalid_json_is_dropped_and_counted_the_stream_stays_whole() {
    let provider = Provider::start(Script::always(Stream::new().invalid_after(2).into())).await;
    let proxy = replicas(&[&provider.url()], &[]);
    // `chunks()` parses every event the client gets.
    read(stream(proxy, "m", 4).await).await.assert_whole("m", 4);
    let stats = stats(proxy).await;
    assert_eq!(stats["events_dropped_invalid"], 1, "{stats}");
    assert_eq!(stats["streams_completed"], 1, "{stats}");
    let metrics = RawResponse::get(proxy, "/metrics", "").await.text().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("streamgate_proxy_invalid_events_total{hop=\"proxy.recv\"}")),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_non_streamed_completion_is_retried_too() {
    let provider = Provider::start(Script::queue([Behaviour::status(502)], Behaviour::ok())).await;
    let proxy = replicas(&[&provider.url()], &[]);
    let mut response = RawResponse::post(proxy, CHAT, "", &chat("m", 3, false)).await;
    assert_eq!(response.status(), 200);
    let body: Value = serde_json::from_str(&response.text().await).unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], Answer::text(3));
    assert_eq!(provider.attempt_count(), 2);
    let stats = wait_for(proxy, "the answer's lease ends", |s| {
        s["upstreams"][0]["in_flight"] == 0
    })
    .await;
    assert_eq!(stats["attempts_retried"], 1, "{stats}");
}

#[tokio::test]
async fn a_throttled_model_does_not_eject_the_replica_s_other_models() {
    let provider = Provider::start(Script::per_model(
        [("a", Script::always(Behaviour::status(503)))],
        Script::always(Behaviour::ok()),
    ))
    .await;
    let toml = format!(
        "[[pool]]\nname = \"p\"\nmodels = [\"a\", \"b\"]\nupstreams = [\"{}\"]\nfailures = 1\ncooldown_ms = 600000\n",
        provider.url()
    );
    let proxy = configured("deployment", &toml, &["--max-attempts", "1"]);
    assert_eq!(stream(proxy, "a", 2).await.status(), 503);
    let stats = stats(proxy).await;
    assert_eq!(stats["upstreams"][0]["ejected"], false, "{stats}");
    assert_eq!(stats["upstreams"][0]["ejected_models"][0], "a", "{stats}");
    read(stream(proxy, "b", 2).await).await.assert_whole("b", 2);
    assert_eq!(provider.attempt_count(), 2);
}

#[tokio::test]
async fn a_pool_whose_every_replica_is_ejected_still_tries_one_and_it_rejoins_on_success() {
    let provider = Provider::start(Script::queue(
        [Behaviour::Reset, Behaviour::Reset, Behaviour::Reset],
        Behaviour::ok(),
    ))
    .await;
    let toml = format!(
        "[[pool]]\nname = \"p\"\nupstreams = [\"{}\"]\nfailures = 1\ncooldown_ms = 600000\nmax_cooldown_ms = 600000\n",
        provider.url()
    );
    let proxy = configured("all-ejected", &toml, &[]);
    let mut response = stream(proxy, "m", 2).await;
    assert_eq!(response.status(), 502);
    let body = response.text().await;
    assert!(body.contains(&provider.addr().to_string()), "{body}");
    assert_eq!(
        provider.attempt_count(),
        3,
        "the only replica, after backoffs"
    );
    assert_eq!(stats(proxy).await["upstreams"][0]["ejected"], true);
    read(stream(proxy, "m", 2).await).await.assert_whole("m", 2);
    let stats = stats(proxy).await;
    assert_eq!(stats["upstreams"][0]["ejected"], false, "{stats}");
}

#[tokio::test]
async fn a_replica_killed_between_requests_is_ejected_then_rejoins_once_restarted() {
    let mut first = Replica::start(&["--step-ms", "1"]).await;
    let second = Replica::start(&["--step-ms", "1"]).await;
    let toml = format!(
        "[[pool]]\nname = \"sims\"\nupstreams = [\"{}\", \"{}\"]\nfailures = 1\ncooldown_ms = 300\nmax_cooldown_ms = 600\n",
        first.url(),
        second.url()
    );
    let proxy = configured("killed", &toml, &[]);
    let whole = |mut response: RawResponse| async move {
        assert_eq!(response.status(), 200);
        let frames = response.rest().await;
        assert_eq!(response.ended(), Some(BodyEnd::Complete), "{frames:?}");
        assert_eq!(frames.last().and_then(|f| data(f)), Some("[DONE]"));
        frames.iter().filter_map(|f| content(f)).count()
    };
    assert_eq!(whole(stream(proxy, "sim", 4).await).await, 4);
    first.kill().await;
    // Until a request picks the dead one (ties go at random): each still gets its answer.
    let deadline = tokio::time::Instant::now() + HANG;
    loop {
        assert_eq!(whole(stream(proxy, "sim", 4).await).await, 4);
        let stats = stats(proxy).await;
        if upstream(&stats, &first.url())["failures"] != 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{stats}");
    }
    let now = stats(proxy).await;
    let dead = upstream(&now, &first.url());
    assert_eq!(dead["ejected"], true, "{now}");
    let cause = &dead["failures_by_cause"];
    assert_eq!(
        cause["connect"].as_u64().unwrap() + cause["reset"].as_u64().unwrap(),
        1,
        "{now}"
    );
    first.restart().await;
    // Past its cool-down it is probed by a request, and serves again.
    let deadline = tokio::time::Instant::now() + HANG;
    while first.stats().await["streams_completed"] == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never rejoined");
        assert_eq!(whole(stream(proxy, "sim", 4).await).await, 4);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = stats(proxy).await;
    assert_eq!(upstream(&stats, &first.url())["ejected"], false, "{stats}");
}

/// How a client ends its stream in the many-streams test.
#[derive(Clone, Copy)]
enum Client {
    /// Reads it to its end.
    Whole,
    /// Reads its head and one frame, then closes (FIN).
    Leaves,
    /// Reads its head, then resets (RST).
    Resets,
    /// Sends the request and closes before any answer.
    Vanishes,
}

/// One stream of `model` through `proxy`, ended as `client` says.
async fn end_as(proxy: SocketAddr, client: Client) {
    let body = chat("m", 6, true);
    match client {
        Client::Vanishes => {
            let mut socket = TcpStream::connect(proxy).await.unwrap();
            let request = common::post_request(proxy, CHAT, "", &body);
            socket.write_all(&request).await.unwrap();
        }
        Client::Whole => {
            let mut response = RawResponse::post(proxy, CHAT, "", &body).await;
            if response.status() == 200 {
                response.rest().await;
            } else {
                response.text().await;
            }
        }
        Client::Leaves => {
            let mut response = RawResponse::post(proxy, CHAT, "", &body).await;
            if response.status() == 200 {
                response.next_frame().await;
            }
        }
        Client::Resets => {
            let response = RawResponse::post(proxy, CHAT, "", &body).await;
            let _ = socket2::SockRef::from(&response.stream).set_linger(Some(Duration::ZERO));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_counts_return_to_zero_after_a_thousand_streams_that_end_every_way() {
    // Every attempt's fate by its number at its provider: whole, without `[DONE]`, with an
    // invalid event, cut, late, 500, 429, reset, closed, silent.
    let script = || {
        Script::from_fn(|attempt| match attempt.number % 10 {
            0 => Behaviour::ok(),
            1 => Stream::new().without_done().into(),
            2 => Stream::new().invalid_after(1).into(),
            3 => Stream::new().cut_after(2).into(),
            4 => Stream::new().gap(Duration::from_millis(5)).into(),
            5 => Behaviour::status(500),
            6 => Behaviour::status(429),
            7 => Behaviour::Reset,
            8 => Behaviour::Close,
            _ => Behaviour::Silent,
        })
    };
    let a = Provider::start(script()).await;
    let b = Provider::start(script()).await;
    let toml = format!(
        "[[pool]]\nname = \"p\"\nupstreams = [\"{}\", \"{}\"]\ncooldown_ms = 50\nmax_cooldown_ms = 100\n[attempts]\nbackoff_ms = 10\nmax_backoff_ms = 20\n",
        a.url(),
        b.url()
    );
    let proxy = configured("thousand", &toml, &["--upstream-headers-ms", "100"]);
    let clients = [
        Client::Whole,
        Client::Leaves,
        Client::Resets,
        Client::Vanishes,
    ];
    let streams: Vec<_> = (0..1000).map(|i| clients[i % clients.len()]).collect();
    for batch in streams.chunks(50) {
        let ends = batch.iter().map(|client| end_as(proxy, *client));
        futures_util::future::join_all(ends).await;
    }
    let stats = all_ended(proxy).await;
    let picks: u64 = stats["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["picks"].as_u64().unwrap())
        .sum();
    assert!(picks >= 1000, "{stats}");
    let metrics = RawResponse::get(proxy, "/metrics", "").await.text().await;
    let gauges: Vec<_> = metrics
        .lines()
        .filter(|l| l.starts_with("streamgate_proxy_upstream_in_flight{"))
        .collect();
    assert_eq!(gauges.len(), 2, "{metrics}");
    assert!(gauges.iter().all(|l| l.ends_with(" 0")), "{gauges:?}");
}

#[tokio::test]
async fn a_tls_upstream_is_verified_with_its_ca_and_refused_when_untrusted() {
    let authority = Authority::new();
    let provider = Provider::start_tls(Script::always(Behaviour::ok()), &authority).await;
    let ca = authority.ca_file().to_str().unwrap();
    let trusted = replicas(&[&provider.url()], &["--upstream-ca", ca]);
    read(stream(trusted, "m", 3).await)
        .await
        .assert_whole("m", 3);
    assert_eq!(provider.attempt_count(), 1);

    // The system's roots do not know the test's CA: a 502 that says so, and nothing sent.
    let untrusted = replicas(&[&provider.url()], &[]);
    let mut response = stream(untrusted, "m", 3).await;
    assert_eq!(response.status(), 502);
    let body = response.text().await;
    assert!(
        body.contains("TLS") && body.contains("certificate"),
        "{body}"
    );
    assert_eq!(provider.attempt_count(), 1, "no request went out");
    let stats = stats(untrusted).await;
    assert_eq!(
        stats["upstreams"][0]["failures_by_cause"]["tls"], 1,
        "{stats}"
    );

    // A certificate for another name, from the trusted CA.
    let elsewhere = Authority::for_names(&["elsewhere.test"]);
    let misnamed = Provider::start_tls(Script::always(Behaviour::ok()), &elsewhere).await;
    let ca = elsewhere.ca_file().to_str().unwrap();
    let proxy = replicas(&[&misnamed.url()], &["--upstream-ca", ca]);
    let mut response = stream(proxy, "m", 3).await;
    assert_eq!(response.status(), 502);
    let body = response.text().await;
    assert!(body.contains("TLS"), "{body}");
    assert_eq!(misnamed.attempt_count(), 0);
}
