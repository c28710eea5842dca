//! A decode stall in a real engine, found where it began: while one stream decodes, a long
//! prompt arrives, and the steps that read it hold every running sequence's next token for as
//! long; the diagnosis of the engine's hop records names `worker.decode` (the end of the
//! engine's step) as the hop the stall began at, and the hops after it as passing it on.

mod common;

use std::time::Duration;

use common::{Engine, Stream, chat, model};
use serde_json::json;
use streamgate::timeline::{Blame, Timeline};

/// The engine's hops, in path order.
const PATH: [&str; 3] = ["worker.decode", "worker.publish", "worker.write"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prompt_s_prefill_is_a_stall_that_began_at_worker_decode() {
    let Some(model) = model("a_long_prompt_s_prefill_is_a_stall_that_began_at_worker_decode")
    else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("streamgate-engine-diag-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("records.jsonl");
    // Slots of 4096 tokens; a prompt is read in steps of up to 2048 tokens.
    let flags = [
        "-c",
        "8192",
        "--parallel",
        "2",
        "-b",
        "2048",
        "--hop-records",
        file.to_str().unwrap(),
    ];
    let mut engine = Engine::start(&model, &flags).await;
    let mut body = chat("Tell me a long story about a lighthouse.", 300, true);
    body["ignore_eos"] = json!(true);
    let mut reader = Stream::chat(engine.addr, &body).await;
    let steady = reader.request_id.clone();
    for _ in 0..30 {
        reader.next().await.unwrap();
    }
    // A prompt of ~1,800 tokens: its reading is one long step of the engine.
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(180);
    let (status, _) = common::post(
        engine.addr,
        "/v1/chat/completions",
        &chat(&prompt, 4, false),
    )
    .await;
    assert_eq!(status, 200);
    let events = reader.rest().await;
    assert_eq!(events.last().unwrap().data, "[DONE]");
    // SIGTERM flushes the records.
    let pid = engine.child.id().unwrap() as i32;
    // SAFETY: `kill` has no memory preconditions.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    engine.child.wait().await.unwrap();

    let mut timeline = Timeline::new(PATH, Duration::from_millis(300));
    timeline
        .read("engine", std::fs::File::open(&file).unwrap())
        .unwrap();
    let diagnosis = timeline.diagnose();
    let report = format!("{diagnosis:#?}");
    let began: Vec<_> = diagnosis
        .stalls
        .iter()
        .filter(|stall| stall.blame == Blame::Began)
        .collect();
    assert!(!began.is_empty(), "{report}");
    for stall in &began {
        assert_eq!(
            (stall.request.as_str(), stall.hop.as_str()),
            (steady.as_str(), "worker.decode"),
            "{report}"
        );
    }
    assert!(
        began
            .iter()
            .any(|stall| stall.gap >= Duration::from_millis(300)),
        "{report}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
