//! The acceptance clients stream from `streamgate-llama` as they do from `streamgate sim`:
//! `curl -N`, the `openai` Python SDK (chat completions and Responses), the `anthropic` SDK
//! (Messages), an `EventSource` client that reconnects with `Last-Event-ID`, and the example
//! page in headless Chromium, whose records sit beside the engine's own hops'. A client that is
//! not installed is skipped, loudly (`.ci/run` installs them).

#[path = "../../cli/tests/common/chromium.rs"]
mod chromium;
mod common;
#[path = "../../cli/tests/common/python.rs"]
mod python;

use std::time::Duration;

use common::{Engine, HANG, Stream, model};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_streams_an_answer_and_its_end() {
    let Some(model) = model("curl_streams_an_answer_and_its_end") else {
        return;
    };
    let engine = Engine::start(&model, &[]).await;
    let body =
        r#"{"messages":[{"role":"user","content":"Say hello."}],"stream":true,"max_tokens":12}"#;
    let url = format!("http://{}/v1/chat/completions", engine.addr);
    let output = tokio::process::Command::new("curl")
        .args([
            "-sN",
            "--max-time",
            "60",
            "-H",
            "content-type: application/json",
            "-d",
            body,
        ])
        .arg(&url)
        .output()
        .await;
    let Ok(output) = output else {
        eprintln!("\n*** SKIPPED curl_streams_an_answer_and_its_end: curl is not installed ***\n");
        return;
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let chunks = text
        .lines()
        .filter(|line| line.starts_with("data: {"))
        .count();
    assert!(chunks >= 2, "{text}");
    assert!(text.contains(r#""role":"assistant""#), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdks_stream_in_every_api() {
    let test = "the_python_sdks_stream_in_every_api";
    let Some(model) = model(test) else {
        return;
    };
    let engine = Engine::start(&model, &[]).await;
    let base = format!("http://{}/v1", engine.addr);
    if let Some(output) = python::python(
        test,
        "openai",
        "openai_sdk.py",
        vec![base.clone(), "20".into()],
    )
    .await
    {
        let lines = python::lines(&output);
        let streamed = &lines[0];
        assert!(!streamed["text"].as_str().unwrap().is_empty(), "{streamed}");
        assert!(streamed["chunks"].as_u64().unwrap() >= 2, "{streamed}");
        let finish = streamed["finish_reason"].as_str().unwrap();
        assert!(["length", "stop"].contains(&finish), "{streamed}");
        // `max_tokens: 0` is the SDK's BadRequestError.
        assert_eq!(
            (lines[1]["error"].as_str(), lines[1]["status"].as_u64()),
            (Some("BadRequestError"), Some(400))
        );
    }
    for (module, api, base) in [
        ("openai", "responses", base.clone()),
        ("anthropic", "messages", format!("http://{}", engine.addr)),
    ] {
        let args = vec![base, api.to_owned(), "16".to_owned()];
        let Some(output) = python::python(test, module, "sdk_one_answer.py", args).await else {
            continue;
        };
        let answer = &python::lines(&output)[0];
        // The SDK's accumulator built the final answer from the same events.
        assert!(
            !answer["text"].as_str().unwrap().is_empty(),
            "{api}: {answer}"
        );
        assert_eq!(answer["final"], answer["text"], "{api}: {answer}");
        let tokens = answer["output_tokens"].as_u64().unwrap();
        assert!((1..=16).contains(&tokens), "{api}: {answer}");
        let ended = answer["ended"].as_str().unwrap();
        assert!(
            ["completed", "end_turn", "max_tokens"].contains(&ended),
            "{api}: {answer}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eventsource_client_reconnects_to_the_same_generation() {
    let Some(model) = model("an_eventsource_client_reconnects_to_the_same_generation") else {
        return;
    };
    let engine = Engine::start(&model, &["--resume-grace-ms", "10000"]).await;
    let path = "/v1/stream?max_tokens=40&id=page-7";
    let mut first = Stream::open(engine.addr, "GET", path, &[], String::new()).await;
    assert_eq!(first.status, 200);
    let mut read = Vec::new();
    for _ in 0..6 {
        read.push(first.next().await.unwrap());
    }
    drop(first);
    // As a browser's EventSource reconnects: the same URL, with the last id it had.
    let last = read.last().unwrap().id.clone();
    let mut again = Stream::open(
        engine.addr,
        "GET",
        path,
        &[("last-event-id", &last)],
        String::new(),
    )
    .await;
    let rest = again.rest().await;
    let next: u64 = last.parse::<u64>().unwrap() + 1;
    assert_eq!(
        rest[0].id,
        next.to_string(),
        "attached after its last event"
    );
    assert_eq!(rest.last().unwrap().data, "[DONE]");
    let stats = engine.idle().await;
    assert_eq!(
        (
            stats["streams_started"].as_u64(),
            stats["streams_resumed"].as_u64()
        ),
        (Some(1), Some(1)),
        "one generation: {stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_page_streams_in_chromium_and_its_records_join_the_engines() {
    let Some(browser) = chromium::installed("the example page against streamgate-llama") else {
        return;
    };
    let Some(model) =
        model("the_example_page_streams_in_chromium_and_its_records_join_the_engines")
    else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("streamgate-engine-page-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("records.jsonl");
    let engine = Engine::start(&model, &["--hop-records", file.to_str().unwrap()]).await;
    let url = format!("http://{}/browser?max_tokens=30&model=smollm2", engine.addr);
    let page = chromium::open(&browser, &url, &dir);
    let records = |file: &std::path::Path| -> Vec<Value> {
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    };
    let ended = tokio::time::timeout(HANG, async {
        loop {
            let all = records(&file);
            if all
                .iter()
                .any(|r| r["hop"] == "client.render" && r["kind"] == "end")
            {
                return all;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the page's stream ended at client.render");
    drop(page);
    let request = ended.iter().find(|r| r["hop"] == "client.render").unwrap()["request"].clone();
    for hop in [
        "worker.decode",
        "worker.publish",
        "worker.write",
        "client.recv",
        "client.render",
    ] {
        let events = ended
            .iter()
            .filter(|r| r["request"] == request && r["hop"] == hop && r["kind"] == "visible")
            .count();
        assert!(events > 0, "no visible event of {request} at {hop}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
