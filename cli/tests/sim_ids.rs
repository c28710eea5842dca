//! The reference server's request ids over real sockets: one id names a stream everywhere (the
//! response's `x-request-id`, the chunks' id when the client gave none, the resume and cancel
//! paths, every hop record), a client's valid `x-request-id` is honoured and an invalid one
//! replaced by an unguessable id, and one id names one generation (409 for a second).

mod common;

use std::collections::BTreeSet;

use common::reference::start;
use common::resume_client::{chat, events, parse, rest, resume_path};
use common::{LONG, RawResponse, records_by_request, stats, wait_for};
use serde_json::Value;

/// A streamed chat request of `max_tokens` with extra header lines.
async fn post(addr: std::net::SocketAddr, headers: &str, max_tokens: u64) -> RawResponse {
    RawResponse::post(addr, "/v1/chat/completions", headers, &chat(max_tokens)).await
}

/// With and without a client id (and with an invalid one), the id the response gives is the
/// one the resume path takes and the one every hop record carries (a resumed connection's
/// included): a client that records its own hop under the id the server gave it is joined to
/// the server's records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_id_names_the_stream_in_the_response_the_resume_path_and_every_hop_record() {
    let file = std::env::temp_dir().join(format!("sim-ids-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let addr = start(&[
        "--step-ms",
        "1",
        "--resume-grace-ms",
        "5000",
        "--hop-records",
        file.to_str().unwrap(),
    ]);
    let invalid = ["has/slash", &"x".repeat(129), "with space", ""];
    let mut cases: Vec<(String, Option<&str>)> = vec![
        (
            "x-request-id: Client-7.a_b:c-d\r\n".into(),
            Some("Client-7.a_b:c-d"),
        ),
        (String::new(), None),
    ];
    cases.extend(
        invalid
            .iter()
            .map(|id| (format!("x-request-id: {id}\r\n"), None)),
    );
    let mut named = Vec::new();
    for (header, given) in &cases {
        let mut first = post(addr, header, 12).await;
        assert_eq!(first.status(), 200);
        let id = first.header("x-request-id").expect("the stream's id");
        let frame = first.expect_frame().await;
        let chunk: Value = serde_json::from_str(common::data(&frame).unwrap()).unwrap();
        let completion = chunk["id"].as_str().unwrap();
        match given {
            Some(given) => {
                assert_eq!(&id, given, "a valid client id is honoured");
                assert!(completion.starts_with("chatcmpl-"), "{frame}");
            }
            None => {
                // Unguessable: `chatcmpl-` and 32 hex digits, the completion's own id.
                let hex = id.strip_prefix("chatcmpl-").expect(&id);
                assert!(
                    hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
                    "{id}"
                );
                assert_eq!(completion, id, "{frame}");
            }
        }
        let mut seen = vec![parse(&frame)];
        seen.extend(events(&mut first, 2).await);
        drop(first);
        let last = seen.last().unwrap().0;
        let path = resume_path(&id);
        let mut resumed =
            RawResponse::get(addr, &path, &format!("Last-Event-ID: {last}\r\n")).await;
        assert_eq!(resumed.status(), 200, "{path}");
        assert_eq!(resumed.header("x-request-id").as_deref(), Some(id.as_str()));
        seen.extend(rest(&mut resumed).await);
        assert_eq!(seen.last().unwrap(), &(13, "[DONE]".to_owned()), "{seen:?}");
        named.push(id);
    }
    let distinct: BTreeSet<&String> = named.iter().collect();
    assert_eq!(
        distinct.len(),
        named.len(),
        "every stream its own id: {named:?}"
    );
    let ids: Vec<&str> = named.iter().map(String::as_str).collect();
    let every_hop = [
        "worker.decode",
        "worker.publish",
        "worker.write",
        "worker.sent",
    ];
    let by_request = records_by_request(&file, &ids, |by_request| {
        ids.iter().all(|id| {
            by_request.get(*id).is_some_and(|seen| {
                every_hop
                    .iter()
                    .all(|hop| (0..12).all(|seq| seen.contains(&(hop.to_string(), seq))))
                    && seen.contains(&("worker.write".to_owned(), 13))
            })
        })
    })
    .await;
    let requests: BTreeSet<&str> = by_request.keys().map(String::as_str).collect();
    assert_eq!(
        requests,
        ids.iter().copied().collect(),
        "records name no other id (none the client's invalid one)"
    );
    for id in &ids {
        let decoded: Vec<u64> = by_request[*id]
            .iter()
            .filter(|(hop, _)| hop == "worker.decode")
            .map(|(_, seq)| *seq)
            .collect();
        assert_eq!(
            decoded,
            (0..12).collect::<Vec<_>>(),
            "{id}: seq is the event id"
        );
    }
    let _ = std::fs::remove_file(&file);
}

/// A second request under the id of a running or retained stream is a 409 that says where to
/// resume it and starts no work; an explicit stop takes the client's id; without a grace
/// nothing is retained, so the id is free once its stream is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_request_under_a_running_or_retained_id_is_a_conflict() {
    let addr = start(&["--step-ms", "5", "--resume-grace-ms", "5000"]);
    let mut running = post(addr, "x-request-id: twice\r\n", LONG).await;
    events(&mut running, 1).await;
    for stream in [true, false] {
        let body = chat(5).replace("\"stream\":true", &format!("\"stream\":{stream}"));
        let mut second = RawResponse::post(
            addr,
            "/v1/chat/completions",
            "x-request-id: twice\r\n",
            &body,
        )
        .await;
        assert_eq!(second.status(), 409, "stream: {stream}");
        let text = second.text().await;
        assert!(text.contains("conflict_error"), "{text}");
        assert!(text.contains("id twice is running"), "{text}");
        assert!(text.contains("/v1/chat/completions/twice/stream"), "{text}");
    }
    let mut short = post(addr, "x-request-id: short\r\n", 2).await;
    rest(&mut short).await;
    let mut again = post(addr, "x-request-id: short\r\n", 2).await;
    assert_eq!(again.status(), 409);
    let text = again.text().await;
    assert!(text.contains("id short recently finished"), "{text}");
    assert_eq!(
        stats(addr).await["streams_started"],
        2,
        "the duplicates started nothing"
    );
    // The stop path takes the client's id.
    let mut stopped = RawResponse::post_json(addr, "/v1/chat/completions/twice/cancel", "").await;
    assert_eq!(stopped.status(), 200);
    assert!(stopped.text().await.contains("\"cancelled\":true"));
    let tail = rest(&mut running).await;
    let n = tail.len();
    assert_eq!(tail[n - 2].1, "finish:stop", "{tail:?}");
    assert_eq!(tail[n - 1].1, "[DONE]");

    // Without a grace nothing is retained: the id is free again once the stream is released.
    let addr = start(&["--step-ms", "0"]);
    let mut first = post(addr, "x-request-id: reused\r\n", 3).await;
    assert_eq!(rest(&mut first).await.len(), 5);
    wait_for(addr, "the first is released", |s| {
        s["generators_running"] == 0
    })
    .await;
    let mut second = post(addr, "x-request-id: reused\r\n", 3).await;
    assert_eq!(second.status(), 200);
    assert_eq!(rest(&mut second).await.len(), 5);
}

/// A whole answer (no `stream`) is named as a stream is: its response carries the id, which it
/// holds while it is generated, and `POST .../cancel` under that id stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_is_named_by_its_id_and_stopped_through_it() {
    let addr = start(&["--step-ms", "5"]);
    let body = chat(LONG).replace("\"stream\":true", "\"stream\":false");
    let answer = tokio::spawn(async move {
        let mut response = RawResponse::post(
            addr,
            "/v1/chat/completions",
            "x-request-id: whole-1\r\n",
            &body,
        )
        .await;
        let id = response.header("x-request-id");
        (response.status(), id, response.text().await)
    });
    wait_for(addr, "the answer is being generated", |s| {
        s["generators_running"] == 1
    })
    .await;
    let mut stopped = RawResponse::post_json(addr, "/v1/chat/completions/whole-1/cancel", "").await;
    assert_eq!(stopped.status(), 200);
    assert!(stopped.text().await.contains("\"cancelled\":true"));
    let (status, id, text) = answer.await.unwrap();
    assert_eq!((status, id.as_deref()), (200, Some("whole-1")));
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
    let tokens = body["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(tokens < LONG, "{body}");
    wait_for(addr, "its id is free", |s| s["generators_running"] == 0).await;
    let unknown = RawResponse::post_json(addr, "/v1/chat/completions/whole-1/cancel", "").await;
    assert_eq!(unknown.status(), 404, "no grace: nothing retained");
}
