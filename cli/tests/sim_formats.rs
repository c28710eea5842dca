//! The reference server's Anthropic Messages (`POST /v1/messages`) and OpenAI Responses
//! (`POST /v1/responses`) streams over real sockets, each frame read by the library's typed
//! events: the contract's events in order with their ids (and, for Responses, the same
//! `sequence_number`), the same deterministic tokens as chat, whole answers, continuation and
//! `--no-prefill`, resume (Responses' `starting_after`), an explicit stop, heartbeats in a
//! decode stall, a slow reader's coalesced deltas, a KV pool running out, and hop records; and
//! the real SDKs against it: the `anthropic` Python SDK's `messages.stream` and the `openai`
//! SDK's `responses.stream` (resumed by `starting_after` too), each skipped, loudly, when it is
//! not installed (`.ci/run` installs both).

mod common;

use std::net::SocketAddr;

use common::formats::{Api, Read, heartbeats_between, read_all, text, tokens};
use common::python::python;
use common::reference::start;
use common::sdk_runs::{
    anthropic_args, assert_anthropic_sdk_streamed, assert_openai_sdk_streamed_and_resumed,
    openai_args,
};
use common::{LONG, RawResponse, assert_sse_headers, records_by_request, stats, wait_for};
use serde_json::Value;

/// A streamed request of `api` for `max_tokens` with extra header lines.
async fn post(addr: SocketAddr, api: Api, headers: &str, max_tokens: u64) -> RawResponse {
    RawResponse::post(addr, api.path(), headers, &api.body(max_tokens, true, None)).await
}

/// The whole stream of `response`, read.
async fn read_rest(api: Api, response: &mut RawResponse) -> Vec<Read> {
    read_all(api, &response.rest().await)
}

/// The types of `events`.
fn kinds(events: &[Read]) -> Vec<&str> {
    events.iter().map(|event| event.kind.as_str()).collect()
}

/// The JSON body of `response`.
async fn json_body(response: &mut RawResponse) -> Value {
    serde_json::from_str(&response.text().await).expect("a JSON body")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_api_streams_the_contracts_events_with_the_same_tokens_as_chat() {
    let file = std::env::temp_dir().join(format!("sim-formats-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let addr = start(&["--step-ms", "1", "--hop-records", file.to_str().unwrap()]);
    let mut names = Vec::new();
    for api in Api::ALL {
        let name = format!("named-{api:?}");
        let mut response = post(addr, api, &format!("x-request-id: {name}\r\n"), 5).await;
        assert_eq!(response.status(), 200);
        assert_sse_headers(&response);
        assert_eq!(response.header("x-request-id"), Some(name.clone()));
        let events = read_rest(api, &mut response).await;
        assert_eq!(kinds(&events), api.stream_types(5), "{api:?}");
        let ids: Vec<Option<u64>> = events.iter().map(|event| event.id).collect();
        let expected: Vec<Option<u64>> = (0..events.len() as u64).map(Some).collect();
        assert_eq!(ids, expected, "every event numbered by its position");
        assert_eq!(text(&events), tokens(0..5));
        let last = &events[events.len() - 1].data;
        match api {
            Api::Messages => {
                let message = &events[0].data["message"];
                let id = message["id"].as_str().unwrap();
                assert!(id.starts_with("msg_") && id.len() == 36, "{id}");
                assert_eq!(message["model"], "sim");
                assert_eq!(message["role"], "assistant");
                let delta = &events[events.len() - 2].data;
                assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
                assert_eq!(delta["usage"]["output_tokens"], 5);
            }
            Api::Responses => {
                // The response is known by the stream's name, so resuming it needs nothing
                // else.
                assert_eq!(events[0].data["response"]["id"], name.as_str());
                assert_eq!(events[0].data["response"]["status"], "in_progress");
                let response = &last["response"];
                assert_eq!(response["status"], "completed");
                assert_eq!(response["output"][0]["content"][0]["text"], tokens(0..5));
                assert_eq!(response["usage"]["output_tokens"], 5);
                let done = &events[events.len() - 4].data;
                assert_eq!(done["text"], tokens(0..5));
            }
        }
        names.push(name);
        // Without a client id, the server names the stream by its answer's id.
        let unnamed = post(addr, api, "", 1).await;
        let id = unnamed.header("x-request-id").unwrap();
        let prefix = match api {
            Api::Messages => "msg_",
            Api::Responses => "resp_",
        };
        let hex = id.strip_prefix(prefix).unwrap_or_else(|| panic!("{id}"));
        assert!(hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
    }
    // Hop records: the stream's name, and seq the event id (the tokens' after the events
    // before them).
    let ids: Vec<&str> = names.iter().map(String::as_str).collect();
    let writes = |api: Api| api.stream_types(5).len() as u64;
    let by_request = records_by_request(&file, &ids, |records| {
        Api::ALL.iter().zip(&ids).all(|(api, id)| {
            records.get(*id).is_some_and(|seen| {
                (0..writes(*api)).all(|seq| seen.contains(&("worker.write".to_owned(), seq)))
            })
        })
    })
    .await;
    for (api, id) in Api::ALL.iter().zip(&ids) {
        let decoded: Vec<u64> = by_request[*id]
            .iter()
            .filter(|(hop, _)| hop == "worker.decode")
            .map(|(_, seq)| *seq)
            .collect();
        let first = api.opening().len() as u64;
        assert_eq!(decoded, (first..first + 5).collect::<Vec<_>>(), "{api:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_answers_in_each_api() {
    let addr = start(&["--step-ms", "0"]);
    for api in Api::ALL {
        let mut response = RawResponse::post(
            addr,
            api.path(),
            "x-request-id: whole\r\n",
            &api.body(4, false, None),
        )
        .await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.header("x-request-id").as_deref(), Some("whole"));
        let body = json_body(&mut response).await;
        match api {
            Api::Messages => {
                assert_eq!(body["type"], "message");
                assert_eq!(body["content"][0]["text"], tokens(0..4));
                assert_eq!(body["stop_reason"], "max_tokens");
                assert_eq!(body["usage"]["output_tokens"], 4);
            }
            Api::Responses => {
                assert_eq!(body["object"], "response");
                assert_eq!(body["id"], "whole");
                assert_eq!(body["status"], "completed");
                assert_eq!(body["output"][0]["content"][0]["text"], tokens(0..4));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_assistant_message_is_continued_or_refused_in_each_apis_shape() {
    let addr = start(&["--step-ms", "0"]);
    let refusing = start(&["--step-ms", "0", "--no-prefill"]);
    for api in Api::ALL {
        let body = api.body(3, true, Some("t0 t1 t2 "));
        let mut response = RawResponse::post(addr, api.path(), "", &body).await;
        let events = read_rest(api, &mut response).await;
        assert_eq!(kinds(&events), api.stream_types(3), "a new stream");
        assert_eq!(events[0].id, Some(0));
        assert_eq!(text(&events), tokens(3..6), "from token 3");
        // Other text: from token 0.
        let body = api.body(2, true, Some("Once upon a time"));
        let mut response = RawResponse::post(addr, api.path(), "", &body).await;
        assert_eq!(text(&read_rest(api, &mut response).await), tokens(0..2));

        let body = api.body(3, true, Some("t0 "));
        let mut refused = RawResponse::post(refusing, api.path(), "", &body).await;
        assert_eq!(refused.status(), 400);
        let error = json_body(&mut refused).await;
        let (kind, message) = match api {
            // Anthropic's error shape; OpenAI's.
            Api::Messages => {
                assert_eq!(error["type"], "error", "{error}");
                (&error["error"]["type"], &error["error"]["message"])
            }
            Api::Responses => (&error["error"]["type"], &error["error"]["message"]),
        };
        assert_eq!(kind, "invalid_request_error", "{error}");
        assert!(message.as_str().unwrap().contains("prefill"), "{error}");
        let mut bad = RawResponse::post(addr, api.path(), "", "{").await;
        assert_eq!(bad.status(), 400);
        let error = json_body(&mut bad).await;
        assert_eq!(error["type"] == "error", api == Api::Messages, "{error}");
    }
}

/// A disconnected stream goes on under a grace; each API resumes it by its own path, the
/// events after the last one seen, from the same generation (one salt throughout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnected_stream_resumes_by_each_apis_path_with_nothing_lost_or_repeated() {
    let addr = start(&[
        "--step-ms",
        "5",
        "--resume-grace-ms",
        "10000",
        "--token-salt",
    ]);
    for api in Api::ALL {
        let name = format!("resumed-{api:?}");
        let mut first = post(addr, api, &format!("x-request-id: {name}\r\n"), 200).await;
        let mut seen = Vec::new();
        while seen.len() < api.opening().len() + 5 {
            seen.extend(read_all(api, &[first.expect_frame().await]));
        }
        drop(first);
        wait_for(addr, "the stream detaches", |s| s["streams_detached"] == 1).await;
        let last = seen.last().unwrap().id.unwrap();
        let mut resumed = match api {
            Api::Messages => {
                let path = format!("/v1/messages/{name}/stream");
                RawResponse::get(addr, &path, &format!("Last-Event-ID: {last}\r\n")).await
            }
            Api::Responses => {
                let path = format!("/v1/responses/{name}?stream=true&starting_after={last}");
                RawResponse::get(addr, &path, "").await
            }
        };
        assert_eq!(resumed.status(), 200);
        assert_eq!(resumed.header("x-request-id"), Some(name.clone()));
        let rest = read_rest(api, &mut resumed).await;
        assert_eq!(rest[0].id, Some(last + 1), "the next event");
        seen.extend(rest);
        assert_eq!(kinds(&seen), api.stream_types(200), "{api:?}");
        let ids: Vec<u64> = seen.iter().map(|event| event.id.unwrap()).collect();
        assert_eq!(ids, (0..seen.len() as u64).collect::<Vec<_>>());
        // One salt: the text is the salted stream's first 200 tokens, not a regenerated one's.
        let text = text(&seen);
        let salt = text.split(' ').next().unwrap().strip_prefix("t0.").unwrap();
        let expected: String = (0..200).map(|i| format!("t{i}.{salt} ")).collect();
        assert_eq!(text, expected);
        wait_for(addr, "the stream is retained, not detached", |s| {
            s["streams_detached"] == 0
        })
        .await;
        if api == Api::Responses {
            // From the start, while it is retained; refusals.
            let path = format!("/v1/responses/{name}?stream=true");
            let mut again = RawResponse::get(addr, &path, "").await;
            assert_eq!(read_rest(api, &mut again).await.len(), seen.len());
            for (path, status) in [
                (format!("/v1/responses/{name}"), 400),
                (
                    format!("/v1/responses/{name}?stream=true&starting_after=-1"),
                    400,
                ),
                ("/v1/responses/nobody?stream=true".to_owned(), 404),
            ] {
                let refused = RawResponse::get(addr, &path, "").await;
                assert_eq!(refused.status(), status, "{path}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_ends_each_api_with_its_final_events() {
    let addr = start(&["--step-ms", "2"]);
    for api in Api::ALL {
        let name = format!("stopped-{api:?}");
        let mut response = post(addr, api, &format!("x-request-id: {name}\r\n"), LONG).await;
        let mut seen = Vec::new();
        while seen.len() < api.opening().len() + 3 {
            seen.extend(read_all(api, &[response.expect_frame().await]));
        }
        let path = format!("{}/{name}/cancel", api.path());
        let mut stopped = RawResponse::post(addr, &path, "", "").await;
        assert_eq!(stopped.status(), 200);
        assert_eq!(json_body(&mut stopped).await["cancelled"], true);
        seen.extend(read_rest(api, &mut response).await);
        let n = seen.len() - api.opening().len() - api.closing().len();
        assert_eq!(kinds(&seen), api.stream_types(n));
        assert_eq!(text(&seen), tokens(0..n as u64));
        let last = &seen[seen.len() - 1].data;
        match api {
            Api::Messages => {
                let delta = &seen[seen.len() - 2].data;
                assert_eq!(delta["delta"]["stop_reason"], "end_turn");
                assert_eq!(delta["usage"]["output_tokens"], n);
            }
            Api::Responses => assert_eq!(last["response"]["usage"]["output_tokens"], n),
        }
        wait_for(addr, "the generator stops", |s| {
            s["generators_running"] == 0 && s["kv_blocks_in_use"] == 0
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_flow_during_a_decode_stall_in_each_api() {
    let addr = start(&[
        "--step-ms",
        "1",
        "--stall-at",
        "2",
        "--stall-ms",
        "400",
        "--heartbeat-ms",
        "50",
    ]);
    for api in Api::ALL {
        let mut response = post(addr, api, "", 4).await;
        let frames = response.rest().await;
        let beats = heartbeats_between(&frames, "t1", "t2");
        assert!(beats >= 2, "heartbeats in the 400 ms stall: {frames:?}");
        assert_eq!(text(&read_all(api, &frames)), tokens(0..4));
    }
}

/// A reader that stops while the stream runs gets, when it reads again, fewer and larger text
/// deltas that carry every token once, in order, each numbered by its last token's event (so a
/// Responses client resuming `starting_after` it misses nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_readers_deltas_are_coalesced_losslessly_in_each_api() {
    let addr = start(&[
        "--step-ms",
        "0",
        "--sndbuf",
        "16384",
        "--policy",
        "coalesce",
        "--buffer-events",
        "8",
    ]);
    const TOKENS: u64 = 4000;
    for api in Api::ALL {
        let before = stats(addr).await["tokens_generated"].as_u64().unwrap();
        let request = common::post_request(addr, api.path(), "", &api.body(TOKENS, true, None));
        // A small receive buffer: the kernel holds little, the gate merges the rest.
        let mut response = RawResponse::send_small(addr, &request, 4096).await;
        response.expect_frame().await;
        wait_for(addr, "every token made while the reader waits", |s| {
            s["tokens_generated"].as_u64() == Some(before + TOKENS)
        })
        .await;
        let events = read_all(api, &response.rest().await);
        let deltas: Vec<&Read> = events.iter().filter(|e| e.kind == api.delta()).collect();
        assert!(
            (deltas.len() as u64) < TOKENS,
            "merged: {} deltas",
            deltas.len()
        );
        assert!(text(&events).ends_with(&tokens(TOKENS - 3..TOKENS)));
        let ids: Vec<u64> = events.iter().map(|event| event.id.unwrap()).collect();
        assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "{ids:?}");
        let events_in_stream = api.stream_types(TOKENS as usize).len() as u64;
        assert_eq!(ids.last(), Some(&(events_in_stream - 1)));
        wait_for(addr, "the stream ends", |s| s["generators_running"] == 0).await;
    }
}

/// A stream that needs a KV block while another holds the rest of the pool stops with an
/// error event in its API's shape, then the terminal frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_out_of_kv_blocks_says_so_in_its_apis_shape() {
    let addr = start(&common::STARVED_KV);
    let _holder = common::hold_two_kv_blocks(addr).await;
    for api in Api::ALL {
        let mut starved = post(addr, api, "", 48).await;
        assert_eq!(starved.status(), 200);
        let frames = starved.rest().await;
        let events = read_all(api, &frames);
        let opened = api.opening().len();
        assert_eq!(text(&events), tokens(0..16), "{frames:?}");
        assert_eq!(events.len(), opened + 16 + 2, "{frames:?}");
        let error = &events[opened + 16];
        assert_eq!(error.kind, "error");
        let message = match api {
            Api::Messages => {
                assert_eq!(error.data["type"], "error");
                assert_eq!(error.data["error"]["type"], "overloaded_error");
                &error.data["error"]["message"]
            }
            Api::Responses => {
                assert_eq!(error.data["code"], "kv_cache_exhausted");
                assert_eq!(error.data["sequence_number"], opened + 16);
                &error.data["message"]
            }
        };
        assert!(
            message
                .as_str()
                .unwrap()
                .starts_with("KV cache full: 3 of 3 blocks in use"),
            "{message}"
        );
        // The gate's end after it, in the API's error shape too.
        let end = &events[opened + 17];
        assert_eq!(
            (end.kind.as_str(), &end.data["type"]),
            ("error", &"error".into())
        );
        let reason = match api {
            Api::Messages => &end.data["error"]["type"],
            Api::Responses => {
                assert_eq!(end.data["sequence_number"], opened + 17, "{:?}", end.data);
                &end.data["code"]
            }
        };
        assert_eq!(reason, "generator_error", "{:?}", end.data);
        // Without streaming: a 503 in the API's shape.
        let body = api.body(48, false, None);
        let mut answer = RawResponse::post(addr, api.path(), "", &body).await;
        assert_eq!(answer.status(), 503);
        let error = json_body(&mut answer).await;
        match api {
            Api::Messages => assert_eq!(error["error"]["type"], "overloaded_error", "{error}"),
            Api::Responses => assert_eq!(error["error"]["code"], "kv_cache_exhausted", "{error}"),
        }
    }
    let stats = stats(addr).await;
    assert_eq!(stats["streams_kv_exhausted"], 4, "{stats}");
}

/// The flags of a server the SDKs read: a 1.5 s decode stall at token 3 (the scripts warm up
/// with two tokens first), bridged by heartbeats every 100 ms, and streams kept for a resume.
const SDK_SIM: [&str; 10] = [
    "--step-ms",
    "1",
    "--stall-at",
    "3",
    "--stall-ms",
    "1500",
    "--heartbeat-ms",
    "100",
    "--resume-grace-ms",
    "10000",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_sdk_streams_a_message_through_a_stall() {
    let addr = start(&SDK_SIM);
    let test = "the_anthropic_sdk_streams_a_message_through_a_stall";
    if let Some(output) = python(test, "anthropic", "anthropic_sdk.py", anthropic_args(addr)).await
    {
        assert_anthropic_sdk_streamed(&output);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_streams_a_response_through_a_stall_and_resumes_it_after_its_last_event() {
    let addr = start(&SDK_SIM);
    let test =
        "the_openai_sdk_streams_a_response_through_a_stall_and_resumes_it_after_its_last_event";
    let args = openai_args(addr, "sdk-1");
    if let Some(output) = python(test, "openai", "openai_responses.py", args).await {
        assert_openai_sdk_streamed_and_resumed(&output, "sdk-1");
    }
}
