//! `streamgate proxy` in front of Anthropic Messages (`POST /v1/messages`) and OpenAI
//! Responses (`POST /v1/responses`) streams, over real sockets, each frame read by the
//! library's typed events: one gated stream numbered by the proxy (a Responses event's
//! `sequence_number` is its id, filled where the upstream sent none, as llama.cpp's server does),
//! heartbeats through a stall, a failure ending with the API's own error event, a stop ending
//! with its own end events, and a resume by each API's path with nothing lost or repeated.

mod common;
#[path = "common/proxy_setup.rs"]
mod setup;

// `setup` names the raw client `crate::client`.
use common as client;

use std::net::SocketAddr;

use std::convert::Infallible;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::response::IntoResponse;
use axum::routing::post;
use common::formats::{Api, Read, heartbeats_between, read_all, text, tokens};
use common::python::{lines, python};
use common::replica::Replica;
use common::sdk_runs::{
    anthropic_args, assert_anthropic_sdk_streamed, assert_openai_sdk_streamed_and_resumed,
    openai_args,
};
use common::{LONG, RawResponse, assert_sse_headers, stats, wait_for};
use serde_json::Value;
use setup::{start_proxy, start_sim};

/// A streamed request of `api` through `addr` for `max_tokens`, with extra header lines.
async fn post_api(addr: SocketAddr, api: Api, headers: &str, max_tokens: u64) -> RawResponse {
    RawResponse::post(addr, api.path(), headers, &api.body(max_tokens, true, None)).await
}

/// The types of `events`.
fn kinds(events: &[Read]) -> Vec<&str> {
    events.iter().map(|event| event.kind.as_str()).collect()
}

/// Every event numbered by its position.
fn assert_numbered(events: &[Read]) {
    let ids: Vec<Option<u64>> = events.iter().map(|event| event.id).collect();
    let expected: Vec<Option<u64>> = (0..events.len() as u64).map(Some).collect();
    assert_eq!(ids, expected, "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_api_through_the_proxy_is_one_gated_stream() {
    let (sim, _) = start_sim(&["--step-ms", "1"]);
    let proxy = start_proxy(&format!("http://{sim}"), &[]);
    for api in Api::ALL {
        let name = format!("through-{api:?}");
        let mut response = post_api(proxy, api, &format!("x-request-id: {name}\r\n"), 5).await;
        assert_eq!(response.status(), 200);
        assert_sse_headers(&response);
        assert_eq!(response.header("x-request-id"), Some(name));
        let events = read_all(api, &response.rest().await);
        assert_eq!(kinds(&events), api.stream_types(5), "{api:?}");
        assert_numbered(&events);
        assert_eq!(text(&events), tokens(0..5));
    }
    let stats = stats(proxy).await;
    assert_eq!(stats["streams_completed"], 2, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_bridge_a_stall_in_each_api() {
    let (sim, _) = start_sim(&["--step-ms", "1", "--stall-at", "2", "--stall-ms", "400"]);
    let proxy = start_proxy(&format!("http://{sim}"), &["--heartbeat-ms", "50"]);
    for api in Api::ALL {
        let frames = post_api(proxy, api, "", 4).await.rest().await;
        let beats = heartbeats_between(&frames, "t1", "t2");
        assert!(beats >= 2, "heartbeats in the 400 ms stall: {frames:?}");
        assert_eq!(text(&read_all(api, &frames)), tokens(0..4));
    }
}

/// The SDKs through the proxy in front of sim, which stalls for 1.5 s at token 3 and sends no
/// heartbeat of its own in it: the anthropic SDK's `messages.stream` and the openai SDK's
/// `responses.stream`, reading at most 0.5 s each, pass the stall on the proxy's heartbeats;
/// the openai SDK resumes its response through the proxy by `starting_after`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_stream_through_the_proxy_across_a_stall_and_resume() {
    let sim_flags = ["--step-ms", "1", "--stall-at", "3", "--stall-ms", "1500"];
    let (sim, _) = start_sim(&sim_flags);
    let flags = ["--heartbeat-ms", "100", "--resume-grace-ms", "10000"];
    let proxy = start_proxy(&format!("http://{sim}"), &flags);
    let test = "the_sdks_stream_through_the_proxy_across_a_stall_and_resume";
    if let Some(output) = python(test, "anthropic", "anthropic_sdk.py", anthropic_args(proxy)).await
    {
        assert_anthropic_sdk_streamed(&output);
    }
    let args = openai_args(proxy, "sdk-proxied");
    if let Some(output) = python(test, "openai", "openai_responses.py", args).await {
        assert_openai_sdk_streamed_and_resumed(&output, "sdk-proxied");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_dies_mid_stream_ends_each_api_with_its_own_error_event() {
    for api in Api::ALL {
        let dying = Replica::start(&["--step-ms", "1", "--die-after", "3"]).await;
        let proxy = start_proxy(&dying.url(), &[]);
        let events = read_all(api, &post_api(proxy, api, "", 20).await.rest().await);
        let last = events.last().unwrap();
        assert_eq!(last.kind, "error", "{events:?}");
        assert_eq!(last.data["type"], "error", "{events:?}");
        let message = match api {
            Api::Messages => {
                assert_eq!(last.data["error"]["type"], "api_error");
                last.data["error"]["message"].as_str().unwrap()
            }
            Api::Responses => {
                assert_eq!(last.data["code"], "upstream_error");
                last.data["message"].as_str().unwrap()
            }
        };
        assert!(message.contains("not carried on"), "{message}");
        // Nothing after the error event, and every event before it numbered.
        assert_numbered(&events[..events.len() - 1]);
        assert!(text(&events).starts_with("t0 t1 t2 "), "{events:?}");
        let stats = stats(proxy).await;
        assert_eq!(stats["failovers"]["refused"], 1, "{stats}");
        assert_eq!(stats["streams_upstream_error"], 1, "{stats}");
    }
}

/// An upstream's own error event another replica could avoid (sim's pool of KV blocks
/// exhausted mid-answer), with no other replica to carry the stream on: the client gets that
/// event as the upstream sent it (Messages' `overloaded_error`, Responses' `kv_cache_exhausted`,
/// numbered by the proxy), and the stream ends there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overload_not_carried_on_reaches_the_client_as_the_upstream_sent_it() {
    let sim_flags = common::STARVED_KV;
    let (sim, _) = start_sim(&sim_flags);
    let proxy = start_proxy(&format!("http://{sim}"), &[]);
    let _holder = common::hold_two_kv_blocks(sim).await;
    for (n, api) in Api::ALL.into_iter().enumerate() {
        let events = read_all(api, &post_api(proxy, api, "", 48).await.rest().await);
        let last = events.last().unwrap();
        assert_eq!(
            (last.kind.as_str(), &last.data["type"]),
            ("error", &"error".into())
        );
        match api {
            Api::Messages => assert_eq!(last.data["error"]["type"], "overloaded_error", "{last:?}"),
            Api::Responses => {
                assert_eq!(last.data["code"], "kv_cache_exhausted", "{last:?}");
                assert_eq!(last.data["sequence_number"], events.len() as u64 - 1);
            }
        }
        assert_eq!(text(&events), tokens(0..16), "{api:?}");
        // Counted at the stream's release, which may follow the client's end by a moment.
        let stats = wait_for(proxy, "the stream released", |s| s["streams_running"] == 0).await;
        assert_eq!(stats["failovers"]["refused"], n as u64 + 1, "{stats}");
        assert_eq!(stats["streams_upstream_error"], n as u64 + 1, "{stats}");
    }
}

/// The gate's own end, not an upstream's: a reader that stopped reading is cut off after the
/// slow deadline, and the last event it gets is its API's error event, typed `slow_consumer`
/// (each SDK raises or yields it as that API's error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_cut_off_ends_each_api_with_its_own_error_event() {
    let (sim, _) = start_sim(&["--step-ms", "0"]);
    let flags = [
        "--sndbuf",
        "16384",
        "--policy",
        "disconnect",
        "--slow-deadline-ms",
        "200",
        "--buffer-events",
        "8",
    ];
    let proxy = start_proxy(&format!("http://{sim}"), &flags);
    for (n, api) in Api::ALL.into_iter().enumerate() {
        let request = common::post_request(proxy, api.path(), "", &api.body(LONG, true, None));
        let mut response = RawResponse::send_small(proxy, &request, 4096).await;
        response.expect_frame().await;
        wait_for(proxy, "the reader cut off", |s| {
            s["streams_ended_slow_consumer"] == n as u64 + 1
        })
        .await;
        let events = read_all(api, &response.rest().await);
        let last = events.last().unwrap();
        assert_eq!(
            (last.kind.as_str(), &last.data["type"]),
            ("error", &"error".into())
        );
        let (reason, message) = match api {
            Api::Messages => (&last.data["error"]["type"], &last.data["error"]["message"]),
            Api::Responses => (&last.data["code"], &last.data["message"]),
        };
        assert_eq!(reason, "slow_consumer", "{api:?}: {:?}", last.data);
        assert!(message.as_str().is_some_and(|m| !m.is_empty()), "{api:?}");
        // Every event after the one read first numbered by its position (none lost silently),
        // and more than the kernel's buffers hold came before the cut.
        assert!(events.len() > 8, "{api:?}: {} events", events.len());
        let ids: Vec<u64> = events[..events.len() - 1]
            .iter()
            .map(|e| e.id.unwrap())
            .collect();
        assert!(
            ids.iter().zip(1..).all(|(id, at)| *id == at),
            "{api:?}: ids {ids:?}"
        );
        if api == Api::Responses {
            // Numbered after the last event the reader got.
            assert_eq!(last.data["sequence_number"], ids.len() as u64 + 1);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_ends_each_api_with_its_own_end_events() {
    let (sim, _) = start_sim(&["--step-ms", "2"]);
    let proxy = start_proxy(&format!("http://{sim}"), &["--resume-grace-ms", "10000"]);
    for api in Api::ALL {
        let name = format!("stopped-{api:?}");
        let mut response = post_api(proxy, api, &format!("x-request-id: {name}\r\n"), LONG).await;
        let mut seen = Vec::new();
        while seen.len() < api.opening().len() + 3 {
            seen.extend(read_all(api, &[response.expect_frame().await]));
        }
        let path = format!("{}/{name}/cancel", api.path());
        let mut stopped = RawResponse::post(proxy, &path, "", "").await;
        assert_eq!(stopped.status(), 200);
        let answer: Value = serde_json::from_str(&stopped.text().await).unwrap();
        assert_eq!(answer["cancelled"], true);
        seen.extend(read_all(api, &response.rest().await));
        assert_numbered(&seen);
        let ends: Vec<&str> = kinds(&seen).into_iter().rev().take(3).collect();
        match api {
            Api::Messages => {
                // The text block left open is stopped first.
                assert_eq!(
                    ends,
                    ["message_stop", "message_delta", "content_block_stop"]
                );
                let delta = &seen[seen.len() - 2].data;
                assert_eq!(delta["delta"]["stop_reason"], "end_turn");
            }
            Api::Responses => {
                assert_eq!(ends[0], "response.incomplete");
                let last = &seen[seen.len() - 1].data;
                assert_eq!(last["response"]["status"], "incomplete");
                assert_eq!(last["response"]["id"], name, "the created response's");
            }
        }
        wait_for(sim, "the upstream's generator stops", |s| {
            s["generators_running"] == 0
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnected_stream_resumes_by_each_apis_path_through_the_proxy() {
    let (sim, _) = start_sim(&["--step-ms", "5", "--token-salt"]);
    let proxy = start_proxy(&format!("http://{sim}"), &["--resume-grace-ms", "10000"]);
    for api in Api::ALL {
        let name = format!("resumed-{api:?}");
        let mut first = post_api(proxy, api, &format!("x-request-id: {name}\r\n"), 200).await;
        let mut seen = Vec::new();
        while seen.len() < api.opening().len() + 5 {
            seen.extend(read_all(api, &[first.expect_frame().await]));
        }
        drop(first);
        let last = seen.last().unwrap().id.unwrap();
        let mut resumed = match api {
            Api::Messages => {
                let path = format!("/v1/messages/{name}/stream");
                RawResponse::get(proxy, &path, &format!("Last-Event-ID: {last}\r\n")).await
            }
            Api::Responses => {
                let path = format!("/v1/responses/{name}?stream=true&starting_after={last}");
                RawResponse::get(proxy, &path, "").await
            }
        };
        assert_eq!(resumed.status(), 200);
        let rest = read_all(api, &resumed.rest().await);
        assert_eq!(rest[0].id, Some(last + 1), "the next event");
        seen.extend(rest);
        assert_eq!(kinds(&seen), api.stream_types(200), "{api:?}");
        assert_numbered(&seen);
        let text = text(&seen);
        let salt = text.split(' ').next().unwrap().strip_prefix("t0.").unwrap();
        let expected: String = (0..200).map(|i| format!("t{i}.{salt} ")).collect();
        assert_eq!(text, expected, "one generation");
    }
    assert_eq!(stats(sim).await["streams_started"], 2);
}

/// A Responses stream as llama.cpp's server sends it: no `sequence_number`, and text deltas
/// without `output_index` or `content_index`.
const UNNUMBERED: &str = concat!(
    "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n",
    "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"item\":{\"type\":\"message\",\"id\":\"msg_1\",\"role\":\"assistant\",\"status\":\"in_progress\",\"content\":[]}}\n\n",
    "event: response.content_part.added\ndata: {\"type\":\"response.content_part.added\",\"item_id\":\"msg_1\",\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}}\n\n",
    "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"msg_1\",\"delta\":\"Hello\"}\n\n",
    "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"msg_1\",\"delta\":\" there\"}\n\n",
    "event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"item_id\":\"msg_1\",\"text\":\"Hello there\"}\n\n",
    "event: response.content_part.done\ndata: {\"type\":\"response.content_part.done\",\"item_id\":\"msg_1\",\"part\":{\"type\":\"output_text\",\"text\":\"Hello there\",\"annotations\":[]}}\n\n",
    "event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"item\":{\"type\":\"message\",\"id\":\"msg_1\",\"role\":\"assistant\",\"status\":\"completed\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hello there\",\"annotations\":[]}]}}\n\n",
    "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"id\":\"msg_1\",\"role\":\"assistant\",\"status\":\"completed\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hello there\",\"annotations\":[]}]}]}}\n\n",
);

/// A Messages and Responses upstream on 127.0.0.1 that answers every `POST /v1/messages` and
/// `POST /v1/responses` with `body` as its event stream; its address.
async fn answering(body: String) -> SocketAddr {
    answering_in(body, usize::MAX).await
}

/// As [`answering`], writing `body` in pieces of `piece` bytes (an event split across reads).
async fn answering_in(body: String, piece: usize) -> SocketAddr {
    let answer = move || {
        let pieces: Vec<Result<Bytes, Infallible>> = body
            .as_bytes()
            .chunks(piece)
            .map(|piece| Ok(Bytes::copy_from_slice(piece)))
            .collect();
        async move {
            let body = Body::from_stream(futures_util::stream::iter(pieces));
            ([("content-type", "text/event-stream")], body).into_response()
        }
    };
    let app = Router::new()
        .route("/v1/responses", post(answer.clone()))
        .route("/v1/messages", post(answer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    upstream
}

/// A Messages stream with, between its two text deltas, an event whose JSON is cut off and an
/// event of a type the crate does not know.
const MESSAGES_WITH_HOSTILE_EVENTS: &str = concat!(
    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"usage\":{\"input_tokens\":1,\"output_tokens\":0}}}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\n\n",
    "event: content_block_annotation\ndata: {\"type\":\"content_block_annotation\",\"index\":0}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" there\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n",
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
);

/// Hostile input in each API, split across reads of 7 bytes: an event whose JSON is cut off
/// is dropped and counted (an SDK would raise on it), an unknown event type passes, the rest
/// is one stream numbered without a gap; a 10 MB delta (past the decoder's 1 MiB event) ends
/// the stream with the API's own error event, after what came before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_events_in_each_api_are_dropped_passed_or_end_it_clearly() {
    let cut = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"msg_1\",\"delta\":\n\n";
    let unknown = "event: response.future_event\ndata: {\"type\":\"response.future_event\",\"item_id\":\"msg_1\"}\n\n";
    let mut events: Vec<&str> = UNNUMBERED.split_inclusive("\n\n").collect();
    events.splice(4..4, [cut, unknown]);
    let responses = events.concat();
    for (api, body, unknown) in [
        (
            Api::Messages,
            MESSAGES_WITH_HOSTILE_EVENTS.to_owned(),
            "content_block_annotation",
        ),
        (Api::Responses, responses, "response.future_event"),
    ] {
        let upstream = answering_in(body, 7).await;
        let proxy = start_proxy(&format!("http://{upstream}"), &[]);
        let frames = post_api(proxy, api, "", 2).await.rest().await;
        let ids: Vec<_> = frames.iter().map(|frame| common::id(frame)).collect();
        let expected: Vec<_> = (0..frames.len() as u64).map(Some).collect();
        assert_eq!(ids, expected, "{api:?}: numbered without a gap: {frames:?}");
        let (unknowns, known): (Vec<String>, Vec<String>) = frames
            .into_iter()
            .partition(|frame| frame.starts_with(&format!("event: {unknown}\n")));
        assert_eq!(unknowns.len(), 1, "{api:?}: the unknown type passes");
        let events = read_all(api, &known);
        assert_eq!(text(&events), "Hello there", "{api:?}: {events:?}");
        assert_eq!(kinds(&events).last(), api.closing().last());
        let stats = stats(proxy).await;
        assert_eq!(stats["events_dropped_invalid"], 1, "{api:?}: {stats}");
        // A 10 MB delta after the opening.
        let huge = match api {
            Api::Messages => format!(
                "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{}\"}}}}\n\n",
                "x".repeat(10 << 20)
            ),
            Api::Responses => format!(
                "event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"item_id\":\"msg_1\",\"delta\":\"{}\"}}\n\n",
                "x".repeat(10 << 20)
            ),
        };
        let opening = match api {
            Api::Messages => MESSAGES_WITH_HOSTILE_EVENTS
                .split_inclusive("\n\n")
                .take(2)
                .collect::<String>(),
            Api::Responses => UNNUMBERED.split_inclusive("\n\n").take(3).collect(),
        };
        let upstream = answering(opening + &huge).await;
        let proxy = start_proxy(&format!("http://{upstream}"), &[]);
        let events = read_all(api, &post_api(proxy, api, "", 2).await.rest().await);
        assert_eq!(
            kinds(&events)[..api.opening().len()],
            *api.opening(),
            "{api:?}"
        );
        let last = events.last().unwrap();
        assert_eq!(last.kind, "error", "{api:?}: {events:?}");
        let message = match api {
            Api::Messages => &last.data["error"]["message"],
            Api::Responses => &last.data["message"],
        };
        assert!(
            message.as_str().unwrap().contains("sse line longer than"),
            "{last:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_upstream_that_numbers_nothing_is_numbered_by_the_proxy() {
    let upstream = answering(UNNUMBERED.to_owned()).await;
    let proxy = start_proxy(&format!("http://{upstream}"), &[]);
    let frames = post_api(proxy, Api::Responses, "", 2).await.rest().await;
    // `read` checks each event's sequence_number against its id.
    let events = read_all(Api::Responses, &frames);
    assert_numbered(&events);
    assert_eq!(text(&events), "Hello there");
    for delta in events
        .iter()
        .filter(|e| e.kind == "response.output_text.delta")
    {
        assert_eq!(
            (&delta.data["output_index"], &delta.data["content_index"]),
            (&Value::from(0), &Value::from(0))
        );
    }
    assert_eq!(kinds(&events).last(), Some(&"response.completed"));
}

/// A client resumes a Responses stream by the id its `response.created` named, the upstream's
/// own (`resp_1`, where llama.cpp's are `resp_` and random letters), as the `openai` SDK does:
/// the proxy knows which of its streams that is, and so does every instance sharing its Redis
/// store (a stream whose request id is the name comes first); a response it holds no stream of
/// goes to the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_stream_resumes_by_the_upstreams_own_response_id() {
    let upstream = format!("http://{}", answering(UNNUMBERED.to_owned()).await);
    let flags = ["--resume-grace-ms", "10000"];
    let proxy = start_proxy(&upstream, &flags);
    resumed_by_response_id(proxy, proxy).await;
    // A stream whose request id is that name is found by its request id first.
    let mut named = post_api(proxy, Api::Responses, "x-request-id: resp_1\r\n", 2).await;
    let _ = named.rest().await;
    let path = "/v1/responses/resp_1?stream=true&starting_after=0";
    let resumed = RawResponse::get(proxy, path, "").await;
    assert_eq!(resumed.header("x-request-id").as_deref(), Some("resp_1"));
    // An id it holds no stream of is the upstream's to answer: this one has no such route, and
    // says so with an empty 404 (the proxy's own would be a JSON error).
    let mut unknown = RawResponse::get(proxy, "/v1/responses/resp_2?stream=true", "").await;
    assert_eq!(
        (unknown.status(), unknown.text().await),
        (404, String::new())
    );
    let Some(redis) = common::redis_server::RedisServer::start("response-ids") else {
        return;
    };
    let url = redis.url();
    let shared = [flags.as_slice(), &["--resume-store", &url]].concat();
    let (a, b) = (
        start_proxy(&upstream, &shared),
        start_proxy(&upstream, &shared),
    );
    resumed_by_response_id(a, b).await;
    // A stop by that id through the other instance finds the (ended) stream too.
    let mut stopped = RawResponse::post(b, "/v1/responses/resp_1/cancel", "", "").await;
    let stopped: Value = serde_json::from_str(&stopped.text().await).unwrap();
    assert_eq!(
        stopped,
        serde_json::json!({"id": "up-1", "cancelled": false})
    );
}

/// A Responses stream begun through `first` whose client left after 4 events, resumed through
/// `then` by the upstream's response id: the rest, numbered on, once.
async fn resumed_by_response_id(first: SocketAddr, then: SocketAddr) {
    let mut response = post_api(first, Api::Responses, "x-request-id: up-1\r\n", 2).await;
    let mut seen = Vec::new();
    while seen.len() < 4 {
        seen.extend(read_all(Api::Responses, &[response.expect_frame().await]));
    }
    drop(response);
    assert_eq!(seen[0].data["response"]["id"], "resp_1");
    let path = "/v1/responses/resp_1?stream=true&starting_after=3";
    let mut resumed = RawResponse::get(then, path, "").await;
    assert_eq!(resumed.status(), 200);
    seen.extend(read_all(Api::Responses, &resumed.rest().await));
    assert_numbered(&seen);
    assert_eq!(text(&seen), "Hello there");
    assert_eq!(seen.last().unwrap().kind, "response.completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_fails_on_such_an_upstream_straight_and_streams_it_through_the_proxy() {
    let upstream = answering(UNNUMBERED.to_owned()).await;
    let proxy = start_proxy(&format!("http://{upstream}"), &[]);
    let test = "the_openai_sdk_fails_on_such_an_upstream_straight_and_streams_it_through_the_proxy";
    let mut got = Vec::new();
    for base in [upstream, proxy] {
        let args = vec![format!("http://{base}/v1")];
        let Some(output) = python(test, "openai", "openai_responses_text.py", args).await else {
            return;
        };
        got.push(lines(&output).remove(0));
    }
    let error = got[0]["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("TypeError"), "straight: {}", got[0]);
    assert_eq!(
        got[1]["error"],
        Value::Null,
        "through the proxy: {}",
        got[1]
    );
    assert_eq!(got[1]["text"], "Hello there");
}

/// A reader that stops while the stream runs gets, when it reads again, fewer and larger text
/// deltas that carry every token once, in order, each numbered by its last event (a Responses
/// delta's `sequence_number` too: `read` checks it), merged by the proxy's gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_readers_events_are_coalesced_losslessly_in_each_api() {
    let (sim, _) = start_sim(&["--step-ms", "0"]);
    let flags = [
        "--sndbuf",
        "16384",
        "--policy",
        "coalesce",
        "--buffer-events",
        "8",
    ];
    let proxy = start_proxy(&format!("http://{sim}"), &flags);
    const TOKENS: u64 = 4000;
    for api in Api::ALL {
        let before = stats(sim).await["tokens_generated"].as_u64().unwrap();
        let request = common::post_request(proxy, api.path(), "", &api.body(TOKENS, true, None));
        // A small receive buffer: the kernel holds little, the proxy's gate merges the rest.
        let mut response = RawResponse::send_small(proxy, &request, 4096).await;
        response.expect_frame().await;
        wait_for(sim, "every token made while the reader waits", |s| {
            s["tokens_generated"].as_u64() == Some(before + TOKENS)
        })
        .await;
        let events = read_all(api, &response.rest().await);
        let deltas = events.iter().filter(|e| e.kind == api.delta()).count() as u64;
        assert!(deltas < TOKENS, "merged: {deltas} deltas");
        assert_eq!(
            text(&events),
            tokens(0..TOKENS),
            "every token once, in order"
        );
        let ids: Vec<u64> = events.iter().map(|event| event.id.unwrap()).collect();
        assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "{ids:?}");
        let events_in_stream = api.stream_types(TOKENS as usize).len() as u64;
        assert_eq!(ids.last(), Some(&(events_in_stream - 1)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_writes_no_event_lines_ends_on_its_end_type() {
    // Some servers send only `data:` lines, the type in the data alone.
    let data_only: String = UNNUMBERED
        .lines()
        .filter(|line| !line.starts_with("event:"))
        .map(|line| format!("{line}\n"))
        .collect();
    let upstream = answering(data_only).await;
    let proxy = start_proxy(&format!("http://{upstream}"), &[]);
    let frames = post_api(proxy, Api::Responses, "", 2).await.rest().await;
    assert!(
        !frames.iter().any(|frame| frame.contains("error")),
        "{frames:?}"
    );
    let events = read_all(Api::Responses, &frames);
    assert_numbered(&events);
    assert_eq!(events.last().unwrap().data["type"], "response.completed");
    // Counted at the stream's release, which may follow the client's end by a moment.
    let stats = wait_for(proxy, "the stream released", |s| s["streams_running"] == 0).await;
    assert_eq!(stats["streams_completed"], 1, "{stats}");
    assert_eq!(stats["events_dropped_invalid"], 0, "{stats}");
}
