//! Streams that outlive a failing replica, over real sockets on 127.0.0.1: a fake provider
//! whose stream breaks mid-answer (cut, stalled, an overload in band, a tool call) in front of
//! `streamgate sim` as its fallback, which continues a final assistant message exactly (its
//! text is the provider's: `t0 t1 ...`); and sim replicas as processes, one killed by its own
//! `--die-after` (SIGKILL) mid-stream. The client must get the whole answer exactly once, as
//! one stream.

mod common;
#[path = "common/fleet_setup.rs"]
mod fleet_setup;
#[path = "common/proxy_setup.rs"]
mod setup;

// `setup` names the raw client `crate::client`.
use common as client;

use std::net::SocketAddr;
use std::time::Duration;

use common::formats::{self, Api, read_all, text, tokens};
use common::provider::{Behaviour, ErrorCode, Failure, Provider, Script, Stream};
use common::python;
use common::replica::Replica;
use common::{HANG, RawResponse, id, wait_for};
use fleet_setup::{Read, all_ended, chat, configured, stream, upstream};
use serde_json::{Value, json};
use setup::{CHAT, start_sim};
use streamgate::timeline::{Blame, Timeline};

/// A fleet of the provider (pool `broken`, model `m`) and an in-process sim (pool `sims`,
/// model `sim`), `m` falling back to `sim`; the proxy's address and the sim's.
async fn fleet(name: &str, provider: &Provider, flags: &[&str]) -> (SocketAddr, SocketAddr) {
    let (sim, _) = start_sim(&["--step-ms", "0"]);
    let toml = format!(
        "[[pool]]\nname = \"broken\"\nmodels = [\"m\"]\nupstreams = [\"{}\"]\n[[pool]]\nname = \"sims\"\nmodels = [\"sim\"]\nupstreams = [\"http://{sim}\"]\n[fallbacks]\nm = \"sim\"\n",
        provider.url()
    );
    (configured(name, &toml, flags), sim)
}

/// The answer is whole and one stream: `tokens` tokens of text exactly once, ids 0, 1, 2, ...
/// with no gap, one role (in the first chunk), every chunk in the envelope (`id`, `created`)
/// of the stream's first, a final chunk whose `finish_reason` is `finish`, then `[DONE]`.
fn assert_one_stream(read: &Read, tokens: u64, finish: &str) {
    read.assert_whole_text(tokens);
    let ids: Vec<_> = read.frames.iter().map(|frame| id(frame)).collect();
    let expected: Vec<_> = (0..read.frames.len() as u64).map(Some).collect();
    assert_eq!(ids, expected, "{:?}", read.frames);
    let chunks = read.chunks();
    let roles = chunks
        .iter()
        .filter(|chunk| !chunk["choices"][0]["delta"]["role"].is_null())
        .count();
    assert_eq!(roles, 1, "{chunks:?}");
    assert!(
        chunks
            .iter()
            .all(|c| c["id"] == chunks[0]["id"] && c["created"] == chunks[0]["created"]),
        "{chunks:?}"
    );
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], finish, "{chunks:?}");
}

#[tokio::test]
async fn a_stream_cut_anywhere_is_continued_by_the_fallback_as_one_stream() {
    // Cut after 1, 5 and 9 of 10 tokens (after the first event, in the middle, just before
    // the end).
    for cut in [1, 5, 9] {
        let provider = Provider::start(Script::always(Stream::new().cut_after(cut).into())).await;
        let (proxy, _) = fleet("cut", &provider, &[]).await;
        let read = fleet_setup::read(stream(proxy, "m", 10).await).await;
        assert_one_stream(&read, 10, "length");
        let chunks = read.chunks();
        // The provider's envelope throughout; the sim finished the answer.
        let provider_id = format!("chatcmpl-{}-", provider.addr().port());
        assert!(
            chunks[0]["id"].as_str().unwrap().starts_with(&provider_id),
            "{chunks:?}"
        );
        assert_eq!(chunks.last().unwrap()["model"], "sim");
        let stats = common::stats(proxy).await;
        assert_eq!(stats["failovers"]["continued"], 1, "cut {cut}: {stats}");
        assert_eq!(stats["streams_completed"], 1, "{stats}");
        let failed = upstream(&stats, &provider.url());
        assert_eq!(failed["failures_by_cause"]["cut"], 1, "{stats}");
        assert_eq!(failed["in_flight"], 0, "{stats}");
    }
}

#[tokio::test]
async fn a_cut_before_the_first_event_is_a_retry_and_after_every_token_a_whole_answer() {
    let provider = Provider::start(Script::always(Stream::new().cut_after(0).into())).await;
    let (proxy, _) = fleet("cut-0", &provider, &[]).await;
    let read = fleet_setup::read(stream(proxy, "m", 6).await).await;
    assert_one_stream(&read, 6, "length");
    let stats = common::stats(proxy).await;
    assert_eq!(stats["fallbacks_answered"], 1, "{stats}");
    assert_eq!(stats["failovers"]["continued"], 0, "{stats}");

    // Every token asked for came, then the cut: nothing is left to ask.
    let provider = Provider::start(Script::always(Stream::new().cut_after(6).into())).await;
    let (proxy, sim) = fleet("cut-all", &provider, &[]).await;
    let read = fleet_setup::read(stream(proxy, "m", 6).await).await;
    assert_one_stream(&read, 6, "length");
    let stats = common::stats(proxy).await;
    assert_eq!(stats["failovers"]["whole"], 1, "{stats}");
    assert_eq!(common::stats(sim).await["streams_started"], 0);
}

#[tokio::test]
async fn a_stalled_stream_and_an_overload_in_band_are_continued() {
    let breaks = [
        (
            Stream::new().stall_after(3, Duration::from_secs(60)),
            "stalled",
        ),
        (Stream::new().error_after(4), "error_event"),
    ];
    for (broken, cause) in breaks {
        let provider = Provider::start(Script::always(broken.into())).await;
        let (proxy, _) = fleet("stall", &provider, &["--upstream-idle-ms", "300"]).await;
        let read = fleet_setup::read(stream(proxy, "m", 8).await).await;
        assert_one_stream(&read, 8, "length");
        let stats = common::stats(proxy).await;
        assert_eq!(stats["failovers"]["continued"], 1, "{cause}: {stats}");
        let failed = upstream(&stats, &provider.url());
        assert_eq!(failed["failures_by_cause"][cause], 1, "{stats}");
    }
}

#[tokio::test]
async fn the_usage_counts_the_answer_the_client_got() {
    // The provider as the fallback this time: it sends usage (the sim does not). It does not
    // continue (its text starts again at t0), so only the usage is looked at.
    let broken = Provider::start(Script::always(Stream::new().cut_after(3).into())).await;
    let finisher = Provider::start(Script::always(Behaviour::ok())).await;
    let toml = format!(
        "[[pool]]\nname = \"a\"\nmodels = [\"m\"]\nupstreams = [\"{}\"]\n[[pool]]\nname = \"b\"\nmodels = [\"n\"]\nupstreams = [\"{}\"]\n[fallbacks]\nm = \"n\"\n",
        broken.url(),
        finisher.url()
    );
    let proxy = configured("usage", &toml, &[]);
    let read = fleet_setup::read(stream(proxy, "m", 10).await).await;
    let last = read.chunks().last().cloned().unwrap();
    // The continuation asked for the 7 tokens left and got them; the client got 3 before.
    assert_eq!(finisher.attempts()[0].max_tokens(), Some(7));
    assert_eq!(last["usage"]["completion_tokens"], 10, "{last}");
    let body = finisher.attempts()[0].json().unwrap();
    assert_eq!(
        body["messages"][1],
        json!({"role": "assistant", "content": "t0 t1 t2 "})
    );
    assert_eq!(body["continue_final_message"], true);
    assert_eq!(body["add_generation_prompt"], false);
}

#[tokio::test]
async fn a_fallback_that_refuses_an_assistant_prefix_is_skipped_and_never_the_error() {
    let broken = Provider::start(Script::always(Stream::new().cut_after(2).into())).await;
    // As sim --no-prefill and hosted models refuse a final assistant message.
    let (refusing_sim, _) = start_sim(&["--step-ms", "0", "--no-prefill"]);
    let (sim, _) = start_sim(&["--step-ms", "0"]);
    let toml = format!(
        "[[pool]]\nname = \"a\"\nmodels = [\"m\"]\nupstreams = [\"{}\"]\n[[pool]]\nname = \"no-prefill\"\nmodels = [\"n\"]\nupstreams = [\"{}\"]\n[[pool]]\nname = \"sims\"\nmodels = [\"sim\"]\nupstreams = [\"http://{sim}\"]\n[fallbacks]\nm = [\"n\", \"sim\"]\n",
        broken.url(),
        format_args!("http://{refusing_sim}")
    );
    let proxy = configured("prefill", &toml, &[]);
    for _ in 0..2 {
        let read = fleet_setup::read(stream(proxy, "m", 6).await).await;
        assert_one_stream(&read, 6, "length");
    }
    let refused = upstream(
        &common::stats(proxy).await,
        &format!("http://{refusing_sim}"),
    )["picks"]
        .clone();
    assert_eq!(refused, 1, "marked, and not asked again");
    let stats = common::stats(proxy).await;
    assert_eq!(stats["failovers"]["continued"], 2, "{stats}");

    // A pool configured as one that takes no prefix is never asked to continue.
    let refusing = Provider::start(Script::always(Behaviour::status(400))).await;
    let toml = format!(
        "[[pool]]\nname = \"a\"\nmodels = [\"m\"]\nupstreams = [\"{}\"]\n[[pool]]\nname = \"no-prefill\"\nmodels = [\"n\"]\nupstreams = [\"{}\"]\nprefill = false\n[fallbacks]\nm = \"n\"\n",
        broken.url(),
        refusing.url()
    );
    let proxy = configured("no-prefill", &toml, &[]);
    let read = fleet_setup::read(stream(proxy, "m", 6).await).await;
    let error = read.error().expect("the stream's error");
    assert!(
        error.contains("before data: [DONE]") || error.contains("mid-stream"),
        "{error}"
    );
    assert!(error.contains("no other upstream is left"), "{error}");
    assert_eq!(refusing.attempt_count(), 0);

    // A 400 that is not about the prefix (a prompt too long) does not mark its pool.
    let long = Failure::new(400).code(ErrorCode::ContextLengthExceeded);
    let refusing = Provider::start(Script::always(long.into())).await;
    let toml = format!(
        "[[pool]]\nname = \"a\"\nmodels = [\"m\"]\nupstreams = [\"{}\"]\n[[pool]]\nname = \"b\"\nmodels = [\"n\"]\nupstreams = [\"{}\"]\n[fallbacks]\nm = \"n\"\n",
        broken.url(),
        refusing.url()
    );
    let proxy = configured("long-prompt", &toml, &[]);
    for _ in 0..2 {
        let read = fleet_setup::read(stream(proxy, "m", 6).await).await;
        let error = read.error().expect("the stream's error");
        assert!(error.contains("carrying it on failed"), "{error}");
    }
    assert_eq!(refusing.attempt_count(), 2, "asked again: not marked");
}

#[tokio::test]
async fn what_a_continuation_cannot_be_faithful_to_ends_with_the_error_saying_why() {
    let cases: [(Stream, Value, &[&str], &str); 5] = [
        (
            Stream::new().tool_call().cut_after(3),
            json!({}),
            &[],
            "a tool call was in progress",
        ),
        (
            Stream::new().cut_after(3),
            json!({"n": 2}),
            &[],
            "several choices",
        ),
        (
            Stream::new().cut_after(3),
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}),
            &[],
            "structured output",
        ),
        (
            Stream::new().cut_after(3),
            json!({}),
            &["--failover", "restart"],
            "only restarts",
        ),
        (
            Stream::new().cut_after(3),
            json!({}),
            &["--failover", "off"],
            "",
        ),
    ];
    for (broken, extra, flags, why) in cases {
        let provider = Provider::start(Script::always(broken.into())).await;
        let (proxy, sim) = fleet("refused", &provider, flags).await;
        let mut body: Value = serde_json::from_str(&chat("m", 10, true)).unwrap();
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        let response = RawResponse::post(proxy, CHAT, "", &body.to_string()).await;
        let read = fleet_setup::read(response).await;
        let error = read.error().expect("the stream's error");
        assert!(error.contains(why), "{why:?} in {error:?}");
        if why.is_empty() {
            assert!(
                !error.contains("not carried on"),
                "off: today's error, {error}"
            );
        }
        assert_eq!(common::stats(sim).await["streams_started"], 0, "{why}");
        let stats = common::stats(proxy).await;
        assert_eq!(stats["failovers"]["refused"], 1, "{why}: {stats}");
        assert_eq!(stats["streams_upstream_error"], 1, "{why}: {stats}");
    }
}

#[tokio::test]
async fn a_client_that_leaves_during_a_failover_ends_it_and_every_lease() {
    // The fallback never answers: the failover waits on its headers when the client leaves.
    let broken = Provider::start(Script::always(Stream::new().cut_after(2).into())).await;
    let silent = Provider::start(Script::always(Behaviour::Silent)).await;
    let toml = format!(
        "[[pool]]\nname = \"a\"\nmodels = [\"m\"]\nupstreams = [\"{}\"]\n[[pool]]\nname = \"b\"\nmodels = [\"n\"]\nupstreams = [\"{}\"]\n[fallbacks]\nm = \"n\"\n",
        broken.url(),
        silent.url()
    );
    let proxy = configured("leaves", &toml, &[]);
    let mut response = stream(proxy, "m", 10).await;
    response.expect_event().await;
    silent
        .until("the failover's attempt", |p| p.attempt_count() == 1)
        .await;
    drop(response);
    let stats = all_ended(proxy).await;
    assert_eq!(stats["streams_ended"]["consumer_gone"], 1, "{stats}");
    silent
        .until("its connection closed", |p| p.connections() == 0)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_streams_cut_at_random_points_lose_and_repeat_nothing() {
    const TOKENS: u64 = 20;
    // Each attempt's cut, from its number: every point from before the first event to after
    // the last token, in an order that is no pattern.
    let provider = Provider::start(Script::from_fn(|attempt| {
        let cut = attempt.number.wrapping_mul(2_654_435_761) % (TOKENS + 1);
        Stream::new().cut_after(cut).into()
    }))
    .await;
    let (proxy, _) = fleet("thousand", &provider, &[]).await;
    for batch in 0..20 {
        let reads =
            (0..50).map(|_| async { fleet_setup::read(stream(proxy, "m", TOKENS).await).await });
        for read in futures_util::future::join_all(reads).await {
            assert_one_stream(&read, TOKENS, "length");
            assert!(
                read.frames.iter().all(|f| !f.starts_with("event: error")),
                "batch {batch}"
            );
        }
    }
    let stats = wait_for(proxy, "every stream ended", |s| s["streams_running"] == 0).await;
    assert_eq!(stats["streams_completed"], 1000, "{stats}");
    let failovers = &stats["failovers"];
    let carried = failovers["continued"].as_u64().unwrap() + failovers["whole"].as_u64().unwrap();
    assert!(carried > 900, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_detaches_and_resumes_across_a_failover_sees_one_stream() {
    let provider = Provider::start(Script::always(
        Stream::new()
            .gap(Duration::from_millis(30))
            .cut_after(6)
            .into(),
    ))
    .await;
    let (proxy, _) = fleet("resume", &provider, &["--resume-grace-ms", "10000"]).await;
    let mut first = stream(proxy, "m", 12).await;
    let name = first.header("x-request-id").unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(first.expect_event().await);
    }
    drop(first);
    // The failover happens while nobody reads: the replay log goes on.
    wait_for(proxy, "the stream carried on", |s| {
        s["failovers"]["continued"] == 1
    })
    .await;
    let last = id(seen.last().unwrap()).unwrap();
    let path = format!("/v1/chat/completions/{name}/stream");
    let response = RawResponse::get(proxy, &path, &format!("Last-Event-ID: {last}\r\n")).await;
    let rest = fleet_setup::read(response).await;
    seen.extend(rest.frames);
    let whole = Read {
        status: 200,
        frames: seen,
    };
    assert_one_stream(&whole, 12, "length");
}

#[tokio::test]
async fn a_replica_killed_mid_stream_by_sigkill_is_continued_by_another_in_its_pool() {
    for die_after in [1, 15, 29] {
        let (stats, dying) = killed_mid_stream(die_after, |proxy| async move {
            let read = fleet_setup::read(stream(proxy, "sim", 30).await).await;
            assert_one_stream(&read, 30, "length");
        })
        .await;
        assert_eq!(stats["failovers"]["continued"], 1, "{die_after}: {stats}");
        assert_eq!(
            upstream(&stats, &dying)["failures_by_cause"]["cut"],
            1,
            "{stats}"
        );
    }
}

/// A replica stopped with SIGTERM mid-stream (a rolling restart, a scale-down) ends its streams
/// with its `shutdown` end frame: the proxy carries each on from another replica of its pool
/// as one answer, in every API, instead of passing that frame on to the client.
#[tokio::test]
async fn a_replica_stopped_by_sigterm_mid_stream_is_continued_by_another_in_its_pool() {
    for api in [None, Some(Api::Messages), Some(Api::Responses)] {
        let replicas = [
            Replica::start(&["--step-ms", "20"]).await,
            Replica::start(&["--step-ms", "20"]).await,
        ];
        let toml = format!(
            "[[pool]]\nname = \"sims\"\nupstreams = [\"{}\", \"{}\"]\n",
            replicas[0].url(),
            replicas[1].url()
        );
        let name = format!("terminated-{}", replicas[0].addr().port());
        let proxy = configured(&name, &toml, &[]);
        let mut response = match api {
            None => stream(proxy, "sim", 30).await,
            Some(api) => RawResponse::post(proxy, api.path(), "", &api.body(30, true, None)).await,
        };
        let mut frames = Vec::new();
        for _ in 0..5 {
            frames.push(response.expect_frame().await);
        }
        let mut serving = None;
        for replica in &replicas {
            if replica.stats().await["generators_running"] == 1 {
                serving = Some(replica);
            }
        }
        serving.expect("a replica generates the stream").terminate();
        frames.extend(response.rest().await);
        let at = format!("{api:?}");
        match api {
            None => {
                let read = Read {
                    status: response.status(),
                    frames,
                };
                assert_one_stream(&read, 30, "length");
            }
            Some(api) => assert_one_answer(api, &read_all(api, &frames), &at),
        }
        let stats = common::stats(proxy).await;
        assert_eq!(stats["failovers"]["continued"], 1, "{at}: {stats}");
    }
}

/// An Anthropic Messages or OpenAI Responses stream whose replica is killed mid-answer (after
/// its first token, in the middle, before its last) is continued by another replica of its
/// pool as one answer: Messages by a final `assistant` message (one `message_start`, the open
/// text block going on: one `content_block_start` and `content_block_stop`, index 0),
/// Responses by an assistant item `in_progress` (one `response.created`, one item and part
/// under the client's ids, the `.done` events and the final response carrying the whole text
/// under the client's response id); every token once, ids without a gap, the final usage
/// counting the whole answer as output.
#[tokio::test]
async fn a_messages_or_responses_stream_whose_replica_dies_is_continued_as_one_answer() {
    for api in Api::ALL {
        for die_after in [1, 15, 29] {
            let at = format!("{api:?} after {die_after}");
            let (stats, _) = killed_mid_stream(die_after, |proxy| {
                let at = at.clone();
                async move {
                    let body = api.body(30, true, None);
                    let mut response = RawResponse::post(proxy, api.path(), "", &body).await;
                    let events = read_all(api, &response.rest().await);
                    assert_one_answer(api, &events, &at);
                }
            })
            .await;
            // Killed after its first token, it may die before its response began: an attempt
            // retried, not a failover.
            let n = |v: &Value| v.as_u64().unwrap_or(0);
            let carried = n(&stats["failovers"]["continued"])
                + n(&stats["failovers"]["restarted"])
                + n(&stats["attempts_retried"]);
            assert_eq!(carried, 1, "{at}: {stats}");
            if die_after > 1 {
                assert_eq!(stats["failovers"]["continued"], 1, "{at}: {stats}");
            }
        }
    }
}

/// A stop that comes while a Messages or Responses stream's failover waits on its fallback
/// ends the stream in its API's own way, from what the client has (Messages: the open text
/// block stopped, a `message_delta` and `message_stop`; Responses: `response.incomplete` with
/// its output, under the client's response id), every token once and numbered without a gap;
/// the fallback's request is dropped and every lease released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_a_messages_or_responses_failover_ends_it_in_its_api() {
    for api in Api::ALL {
        let dying = Replica::start(&["--step-ms", "1", "--die-after", "5"]).await;
        let silent = Provider::start(Script::always(Behaviour::Silent)).await;
        let toml = format!(
            "[[pool]]\nname = \"a\"\nmodels = [\"sim\"]\nupstreams = [\"{}\"]\n[[pool]]\nname = \"b\"\nmodels = [\"n\"]\nupstreams = [\"{}\"]\n[fallbacks]\nsim = \"n\"\n",
            dying.url(),
            silent.url()
        );
        let name = format!("stop-{}", dying.addr().port());
        let proxy = configured(&name, &toml, &["--resume-grace-ms", "10000"]);
        let header = format!("x-request-id: {name}\r\n");
        let mut response =
            RawResponse::post(proxy, api.path(), &header, &api.body(30, true, None)).await;
        let mut seen = Vec::new();
        while seen.len() < api.opening().len() + 5 {
            seen.extend(read_all(api, &[response.expect_frame().await]));
        }
        silent
            .until("the failover's attempt", |p| p.attempt_count() == 1)
            .await;
        let mut stopped =
            RawResponse::post(proxy, &format!("{}/{name}/cancel", api.path()), "", "").await;
        assert_eq!(stopped.status(), 200, "{api:?}");
        let answer: Value = serde_json::from_str(&stopped.text().await).unwrap();
        assert_eq!(answer["cancelled"], true, "{api:?}");
        seen.extend(read_all(api, &response.rest().await));
        let ids: Vec<_> = seen.iter().map(|event| event.id).collect();
        let expected: Vec<_> = (0..seen.len() as u64).map(Some).collect();
        assert_eq!(ids, expected, "{api:?}: {seen:?}");
        assert_eq!(text(&seen), tokens(0..5), "{api:?}");
        let last = &seen[seen.len() - 1].data;
        match api {
            Api::Messages => {
                let ends: Vec<&str> = kinds(&seen).into_iter().rev().take(3).collect();
                assert_eq!(
                    ends,
                    ["message_stop", "message_delta", "content_block_stop"]
                );
                assert_eq!(
                    seen[seen.len() - 2].data["delta"]["stop_reason"],
                    "end_turn"
                );
            }
            Api::Responses => {
                assert_eq!(seen[seen.len() - 1].kind, "response.incomplete", "{seen:?}");
                let response = &last["response"];
                assert_eq!(response["id"], seen[0].data["response"]["id"]);
                assert_eq!(response["output"][0]["content"][0]["text"], tokens(0..5));
            }
        }
        let stats = all_ended(proxy).await;
        assert_eq!(stats["streams_ended"]["cancelled"], 1, "{api:?}: {stats}");
        silent
            .until("its connection closed", |p| p.connections() == 0)
            .await;
    }
}

/// The SDKs' own accumulators (the anthropic SDK's `messages.stream`, the openai SDK's
/// `responses.stream`) read a stream whose replica died mid-answer as one answer: the text
/// their events carried and the final message's are the whole answer's, its output tokens
/// all of them, its end the model's (sim completes a Responses answer at its limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_read_a_stream_whose_replica_died_as_one_answer() {
    let test = "the_sdks_read_a_stream_whose_replica_died_as_one_answer";
    // The anthropic SDK's base URL is the server's, the openai SDK's its `/v1`.
    for (api, module, base, ended) in [
        (Api::Messages, "anthropic", "", "max_tokens"),
        (Api::Responses, "openai", "/v1", "completed"),
    ] {
        if !python::installed(test, module).await {
            continue;
        }
        let (stats, _) = killed_mid_stream(15, |proxy| async move {
            let name = api.path().trim_start_matches("/v1/");
            let args = vec![
                format!("http://{proxy}{base}"),
                name.to_owned(),
                "30".to_owned(),
            ];
            let output = python::python(test, module, "sdk_one_answer.py", args).await;
            let got = &python::lines(&output.unwrap())[0];
            assert_eq!(got["text"], tokens(0..30), "{api:?}: {got}");
            assert_eq!(got["final"], tokens(0..30), "{api:?}: {got}");
            assert_eq!(
                (&got["output_tokens"], &got["ended"]),
                (&json!(30), &json!(ended)),
                "{api:?}: {got}"
            );
        })
        .await;
        assert_eq!(stats["failovers"]["continued"], 1, "{api:?}: {stats}");
    }
}

/// A pool of two replicas, one killed (SIGKILL) by its own `--die-after die_after` mid-stream,
/// behind a proxy: `serve` streams through it and checks what the client got, again until the
/// dying replica has served a stream (ties go at random) and died in it. The proxy's stats
/// then, and the dead replica's URL.
async fn killed_mid_stream<F: Future<Output = ()>>(
    die_after: u64,
    serve: impl Fn(SocketAddr) -> F,
) -> (Value, String) {
    let mut dying =
        Replica::start(&["--step-ms", "1", "--die-after", &die_after.to_string()]).await;
    let other = Replica::start(&["--step-ms", "1"]).await;
    let toml = format!(
        "[[pool]]\nname = \"sims\"\nupstreams = [\"{}\", \"{}\"]\n",
        dying.url(),
        other.url()
    );
    // Named by the port: tests run side by side.
    let proxy = configured(&format!("killed-{}", dying.addr().port()), &toml, &[]);
    let deadline = tokio::time::Instant::now() + HANG;
    loop {
        serve(proxy).await;
        let stats = common::stats(proxy).await;
        if upstream(&stats, &dying.url())["picks"] != 0 {
            assert!(dying.exited(), "after {die_after}: it died");
            return (stats, dying.url());
        }
        assert!(tokio::time::Instant::now() < deadline, "{stats}");
    }
}

/// `events` are one whole answer of `api` of 30 tokens, numbered without a gap.
fn assert_one_answer(api: Api, events: &[formats::Read], at: &str) {
    assert_eq!(kinds(events), api.stream_types(30), "{at}: {events:?}");
    assert_eq!(text(events), tokens(0..30), "{at}");
    let ids: Vec<_> = events.iter().map(|event| event.id).collect();
    let expected: Vec<_> = (0..events.len() as u64).map(Some).collect();
    assert_eq!(ids, expected, "{at}");
    let last = &events[events.len() - 1].data;
    match api {
        Api::Messages => {
            for event in events
                .iter()
                .filter(|e| e.kind.starts_with("content_block"))
            {
                assert_eq!(event.data["index"], 0, "{at}: {event:?}");
            }
            let usage = &events[events.len() - 2].data["usage"];
            assert_eq!(usage["output_tokens"], 30, "{at}: {usage}");
        }
        Api::Responses => {
            let created = &events[0].data["response"]["id"];
            let item = &events[1].data["item"]["id"];
            for event in &events[1..events.len() - 1] {
                assert_eq!(event.data["output_index"], 0, "{at}: {event:?}");
                let id = event
                    .data
                    .get("item_id")
                    .unwrap_or(&event.data["item"]["id"]);
                assert_eq!(id, item, "{at}: {event:?}");
            }
            let done = events
                .iter()
                .find(|e| e.kind == "response.output_text.done")
                .unwrap();
            assert_eq!(done.data["text"], tokens(0..30), "{at}");
            let response = &last["response"];
            assert_eq!(&response["id"], created, "{at}: the client's response");
            assert_eq!(
                response["output"][0]["content"][0]["text"],
                tokens(0..30),
                "{at}"
            );
            assert_eq!(response["usage"]["output_tokens"], 30, "{at}: {response}");
        }
    }
}

/// The types of `events`.
fn kinds(events: &[formats::Read]) -> Vec<&str> {
    events.iter().map(|event| event.kind.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_outlives_a_proxy_instance_killed_mid_stream_through_another_sharing_redis() {
    let Some((_redis, sim, flags)) = sharing_redis("proxy-death").await else {
        return;
    };
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let survivor = Replica::proxy(&flags).await;
    for (n, kill_after) in [1u64, 25].into_iter().enumerate() {
        let mut dying = Replica::proxy(&flags).await;
        let name = format!("orphan-{kill_after}");
        let header = format!("x-request-id: {name}\r\n");
        let body = fleet_setup::chat("sim", 60, true);
        let mut first = RawResponse::post(dying.addr(), setup::CHAT, &header, &body).await;
        assert_eq!(first.status(), 200);
        let path = format!("/v1/chat/completions/{name}/stream");
        // A second reader, through the instance that survives, from the first event.
        let watcher = RawResponse::get(survivor.addr(), &path, "").await;
        let mut seen = Vec::new();
        while seen.len() < kill_after as usize {
            seen.push(first.expect_event().await);
        }
        dying.kill().await;
        let last = id(seen.last().unwrap()).unwrap();
        let resumed = RawResponse::get(
            survivor.addr(),
            &path,
            &format!("Last-Event-ID: {last}\r\n"),
        )
        .await;
        let rest = fleet_setup::read(resumed).await;
        seen.extend(rest.frames);
        let whole = Read {
            status: 200,
            frames: seen,
        };
        assert_one_stream(&whole, 60, "length");
        let watched = fleet_setup::read(watcher).await;
        assert_one_stream(&watched, 60, "length");
        assert_eq!(watched.frames, whole.frames, "one stream for both readers");
        let stats = common::stats(survivor.addr()).await;
        assert_eq!(stats["streams_adopted"], n + 1, "{stats}");
        assert_eq!(stats["failovers"]["continued"], n + 1, "{stats}");
    }
    // The original and the continuation of each: the answer was not generated again.
    assert_eq!(sim.stats().await["streams_started"], 4);
}

/// A sim replica (20 ms steps) and the flags of proxy instances in front of it that share a
/// real `redis-server` of the test's own (`name`) for resumes; `None` when there is none (the
/// test says SKIPPED).
async fn sharing_redis(
    name: &str,
) -> Option<(common::redis_server::RedisServer, Replica, Vec<String>)> {
    let redis = common::redis_server::RedisServer::start(name)?;
    let sim = Replica::start(&["--step-ms", "20"]).await;
    let flags = [
        "--upstream",
        &sim.url(),
        "--resume-store",
        &redis.url(),
        "--resume-grace-ms",
        "10000",
    ];
    let flags = flags.map(str::to_owned).to_vec();
    Some((redis, sim, flags))
}

/// A Messages or Responses stream outlives the proxy instance that served it, SIGKILLed after
/// 1 and 12 events: resumed through another sharing Redis by the API's own path, it is adopted
/// and carried on from its log as one answer (no second opening: the adopter knows the
/// blocks or items the client has).
#[tokio::test]
async fn a_messages_or_responses_stream_outlives_a_proxy_instance_killed_mid_stream() {
    let Some((_redis, _sim, flags)) = sharing_redis("proxy-death-apis").await else {
        return;
    };
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let survivor = Replica::proxy(&flags).await;
    let mut adopted = 0;
    for api in Api::ALL {
        for kill_after in [1usize, 12] {
            let mut dying = Replica::proxy(&flags).await;
            let name = format!("orphan-{api:?}-{kill_after}");
            let header = format!("x-request-id: {name}\r\n");
            let body = api.body(30, true, None);
            let mut first = RawResponse::post(dying.addr(), api.path(), &header, &body).await;
            assert_eq!(first.status(), 200);
            let mut seen = Vec::new();
            while seen.len() < kill_after {
                seen.extend(read_all(api, &[first.expect_frame().await]));
            }
            dying.kill().await;
            let last = seen.last().unwrap().id.unwrap();
            let (path, headers) = match api {
                Api::Messages => (
                    format!("/v1/messages/{name}/stream"),
                    format!("Last-Event-ID: {last}\r\n"),
                ),
                Api::Responses => (
                    format!("/v1/responses/{name}?stream=true&starting_after={last}"),
                    String::new(),
                ),
            };
            let mut resumed = RawResponse::get(survivor.addr(), &path, &headers).await;
            assert_eq!(resumed.status(), 200, "{name}");
            seen.extend(read_all(api, &resumed.rest().await));
            assert_one_answer(api, &seen, &name);
            adopted += 1;
            let stats = common::stats(survivor.addr()).await;
            assert_eq!(stats["streams_adopted"], adopted, "{name}: {stats}");
        }
    }
}

#[tokio::test]
async fn the_diagnosis_names_the_replica_a_stream_stalled_on_before_its_failover() {
    let records = std::env::temp_dir().join(format!("failover-attrs-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&records);
    let file = records.to_str().unwrap();
    let provider = Provider::start(Script::always(
        Stream::new().stall_after(3, Duration::from_secs(60)).into(),
    ))
    .await;
    let flags = ["--upstream-idle-ms", "400", "--hop-records", file];
    let (proxy, sim) = fleet("attrs", &provider, &flags).await;
    let read = fleet_setup::read(stream(proxy, "m", 8).await).await;
    assert_one_stream(&read, 8, "length");
    // The proxy's writer flushes once idle: until both hops' end records are in.
    let deadline = tokio::time::Instant::now() + HANG;
    let text = loop {
        let text = std::fs::read_to_string(&records).unwrap_or_default();
        if text.matches(r#""kind":"end""#).count() == 2 {
            break text;
        }
        assert!(tokio::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let path = ["proxy.recv", "proxy.write"];
    let mut timeline = Timeline::new(path, Duration::from_millis(300));
    timeline.add_lines(file, &text);
    let diagnosis = timeline.diagnose();
    let _ = std::fs::remove_file(&records);
    // Every record fits (the continuation's events are recorded under the ids the client
    // got, not the continuing server's own, which start again at 0).
    assert_eq!(diagnosis.problems.total, 0, "{}", diagnosis.report());
    // One stall, where the upstream went quiet, naming the replica that served it then (the
    // continuation's events name the other: the records change with the failover).
    assert_eq!(diagnosis.stalls.len(), 1, "{}", diagnosis.report());
    let stall = &diagnosis.stalls[0];
    assert_eq!(stall.hop, "proxy.recv");
    assert_eq!(stall.blame, Blame::Began);
    assert!(stall.gap >= Duration::from_millis(400), "{stall:?}");
    assert_eq!(stall.seq, stall.after.map(|after| after + 1), "{stall:?}");
    let stalled = provider.url().trim_end_matches('/').to_owned();
    let attrs = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    };
    assert_eq!(
        stall.attrs,
        attrs(&[("model", "m"), ("pool", "broken"), ("upstream", &stalled)]),
        "{stall:?}"
    );
    assert!(
        diagnosis.report().contains(&format!("upstream={stalled}")),
        "{}",
        diagnosis.report()
    );
    let changed: Vec<&str> = text.lines().filter(|line| line.contains("attrs")).collect();
    assert_eq!(
        changed.len(),
        2,
        "set at the start and at the failover: {changed:?}"
    );
    assert!(changed[1].contains(&format!("http://{sim}")), "{changed:?}");
    // The fallback's pool too.
    assert!(changed[1].contains(r#""pool":"sims""#), "{changed:?}");
}
