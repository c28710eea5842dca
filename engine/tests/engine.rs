//! `streamgate-llama` with a real model (SmolLM2-135M on llama.cpp), as a child process: its
//! promises, checked on the engine's own counts and llama.cpp's.
//!
//! - a client that leaves frees its sequence's KV cells within one decode step: at most one
//!   token is made after the end, and once the stream is released the engine's count and
//!   llama.cpp's are both back to zero, the release hook having reported the cells freed;
//! - a reader that stops pauses only its sequence: its tokens stop while the others' go on,
//!   then its policy ends it and its cells are freed;
//! - a sequence paused between two that decode is moved out of their way (so that a step
//!   stays one micro-batch), or with no free slot to move to gets filler tokens in its slot,
//!   and their answers are those they give alone;
//! - eight concurrent greedy streams give the texts of eight sequential ones;
//! - a resumed stream continues the same generation;
//! - SIGTERM with streams open ends each with its terminal frame;
//! - bad input: a prompt longer than a slot (400), `max_tokens` past it (the answer ends
//!   `length` at the slot's end), a file that is no model, more clients than slots and queue
//!   (503), `GET /v1/stream` regenerating after `Last-Event-ID` (400);
//! - a hundred clients against eight slots wait for one with heartbeats, and are all answered;
//!   one stopped while it waits is answered at once, and one waits no longer than a slot is
//!   held (a client that left frees its slot for it).

mod common;

use std::time::Duration;

use common::{Engine, HANG, SMALL_GATE, Stream, answer, chat, model, post, stopped_reader, text};
use serde_json::{Value, json};
use streamgate_cli::client;

/// Prompts that make different answers.
const TOPICS: [&str; 8] = [
    "cats",
    "the sea",
    "a robot",
    "autumn",
    "coffee",
    "mountains",
    "a city at night",
    "friendship",
];

fn poem(topic: &str) -> String {
    format!("Write a short poem about {topic}.")
}

/// A chat request whose answer is `max_tokens` long whatever the model says (`ignore_eos`).
fn long(prompt: &str, max_tokens: u64) -> Value {
    let mut body = chat(prompt, max_tokens, true);
    body["ignore_eos"] = json!(true);
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_frees_its_kv_cells_within_a_step() {
    let Some(model) = model("a_client_that_disconnects_frees_its_kv_cells_within_a_step") else {
        return;
    };
    let engine = Engine::start(&model, &[]).await;
    let mut stream = Stream::chat(engine.addr, &long(&poem("cats"), 1000)).await;
    assert_eq!(stream.status, 200);
    for _ in 0..20 {
        stream.next().await.expect("an event");
    }
    let running = engine.stats().await;
    assert_eq!(running["sequences_running"], 1, "{running}");
    let held = running["kv_cells_in_use"].as_u64().unwrap();
    assert!(held > 20, "the prompt and 20 tokens at least: {running}");
    assert_eq!(
        running["kv_cells_llama"], held,
        "llama.cpp's count is the engine's"
    );

    drop(stream);
    let stats = engine.idle().await;
    assert_eq!(stats["streams_ended"]["consumer_gone"], 1, "{stats}");
    assert_eq!(
        (
            stats["kv_cells_in_use"].as_u64(),
            stats["kv_cells_llama"].as_u64()
        ),
        (Some(0), Some(0))
    );
    let after = stats["tokens_after_cancel"].as_u64().unwrap();
    assert!(
        after <= 1,
        "at most one step decoded it after its end: {after}"
    );
    let made = stats["tokens_generated"].as_u64().unwrap();
    let prompt = stats["prompt_tokens"].as_u64().unwrap();
    // Every token decoded into its slot was freed (the last token made is never decoded).
    let freed = stats["kv_cells_freed"].as_u64().unwrap();
    assert_eq!(freed, prompt + made - 1, "{stats}");
    assert!(made < 1000, "it stopped when its client left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_pauses_only_its_sequence_until_its_policy_ends_it() {
    let Some(model) =
        model("a_reader_that_stops_pauses_only_its_sequence_until_its_policy_ends_it")
    else {
        return;
    };
    // A small gate and sockets, so that a stopped reader fills them within a few hundred
    // tokens; `disconnect` ends it 5 s after it stopped taking. Slots of 2048 tokens: it
    // pauses long before its answer could end.
    let more = [
        "--policy",
        "disconnect",
        "--slow-deadline-ms",
        "5000",
        "-c",
        "8192",
    ];
    let engine = Engine::start(&model, &[&SMALL_GATE[..], &more].concat()).await;
    let body = long(&poem("the sea"), 2000);
    let stopped = stopped_reader(engine.addr, "/v1/chat/completions", &body).await;
    engine
        .stats_until(|stats| stats["sequences_paused"] == 1)
        .await;
    let readers: Vec<_> = TOPICS[..3]
        .iter()
        .map(|topic| {
            let addr = engine.addr;
            let body = long(&poem(topic), 200);
            tokio::spawn(async move { Stream::chat(addr, &body).await.rest().await })
        })
        .collect();
    let paused = engine
        .stats_until(|stats| stats["sequences_running"].as_u64() >= Some(1))
        .await;
    assert_eq!(paused["sequences_paused"], 1, "{paused}");
    assert_eq!(paused["kv_cells_in_use"], paused["kv_cells_llama"]);
    let made = paused["tokens_generated"].as_u64().unwrap();
    // The others keep decoding while it is paused.
    let later = engine
        .stats_until(|stats| stats["tokens_generated"].as_u64().unwrap() > made + 50)
        .await;
    assert_eq!(later["sequences_paused"], 1, "{later}");
    for reader in readers {
        let events = reader.await.unwrap();
        assert_eq!(events.last().unwrap().data, "[DONE]", "the others complete");
    }
    let stats = engine.idle().await;
    assert_eq!(stats["streams_ended"]["slow_consumer"], 1, "{stats}");
    assert_eq!(stats["streams_ended"]["completed"], 3, "{stats}");
    assert_eq!(
        (
            stats["kv_cells_in_use"].as_u64(),
            stats["kv_cells_llama"].as_u64()
        ),
        (Some(0), Some(0))
    );
    drop(stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_paused_between_two_that_decode_moves_out_of_their_way() {
    let test = "a_sequence_paused_between_two_that_decode_moves_out_of_their_way";
    // A free slot above the three: the paused one moves there, the last one into its slot.
    if let Some(moves) = paused_between(test, 4).await {
        assert!(moves >= 2, "{moves} slot moves");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_paused_between_two_that_decode_with_no_slot_to_move_to_gets_fillers() {
    let test = "a_sequence_paused_between_two_that_decode_with_no_slot_to_move_to_gets_fillers";
    // Every slot held: the steps put a filler token in its slot, removed after each.
    if let Some(moves) = paused_between(test, 3).await {
        assert_eq!(moves, 0);
    }
}

/// Three sequences in slots 0, 1 and 2 of `parallel`, the middle one's reader stopped: the two
/// others' greedy answers are those they give alone, llama.cpp's count of cells is the
/// engine's while it is paused, and every cell is freed at the end. The slot moves made.
async fn paused_between(test: &str, parallel: u32) -> Option<u64> {
    let model = model(test)?;
    let parallel = parallel.to_string();
    let more = [
        "--parallel",
        &parallel,
        "-c",
        "4096",
        "--slow-deadline-ms",
        "60000",
    ];
    let engine = Engine::start(&model, &[&SMALL_GATE[..], &more].concat()).await;
    let (first, last) = (long(&poem("cats"), 400), long(&poem("autumn"), 400));
    let mut alone = Vec::new();
    for body in [&first, &last] {
        let mut body = body.clone();
        body["stream"] = json!(false);
        alone.push(answer(engine.addr, &body).await);
    }
    // Slots are taken lowest first: the stopped reader's sequence sits between the others.
    let read = |body: Value| {
        let addr = engine.addr;
        tokio::spawn(async move { text(&Stream::chat(addr, &body).await.rest().await) })
    };
    let held = |stats: &Value| {
        stats["sequences_running"].as_u64().unwrap() + stats["sequences_paused"].as_u64().unwrap()
    };
    let first = read(first);
    engine.stats_until(|stats| held(stats) == 1).await;
    let body = long(&poem("the sea"), 2000);
    let stopped = stopped_reader(engine.addr, "/v1/chat/completions", &body).await;
    engine.stats_until(|stats| held(stats) == 2).await;
    let last = read(last);
    let paused = engine
        .stats_until(|stats| stats["sequences_paused"] == 1 && stats["sequences_running"] == 2)
        .await;
    assert_eq!(
        paused["kv_cells_in_use"], paused["kv_cells_llama"],
        "{paused}"
    );
    let together = [first.await.unwrap(), last.await.unwrap()];
    assert_eq!(together, *alone, "the others' answers are as alone");
    let stats = engine.stats().await;
    assert_eq!(stats["sequences_paused"], 1, "{stats}");
    assert_eq!(stats["kv_cells_in_use"], stats["kv_cells_llama"], "{stats}");
    drop(stopped);
    let idle = engine.idle().await;
    assert_eq!(
        (
            idle["kv_cells_in_use"].as_u64(),
            idle["kv_cells_llama"].as_u64()
        ),
        (Some(0), Some(0))
    );
    stats["slot_moves"].as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_greedy_streams_give_the_texts_of_eight_sequential_ones() {
    let Some(model) =
        model("eight_concurrent_greedy_streams_give_the_texts_of_eight_sequential_ones")
    else {
        return;
    };
    let engine = Engine::start(&model, &["--parallel", "8", "-c", "4096"]).await;
    let mut sequential = Vec::new();
    for topic in TOPICS {
        sequential.push(answer(engine.addr, &chat(&poem(topic), 48, false)).await);
    }
    let steps = engine.stats().await["decode_steps"].as_u64().unwrap();
    let concurrent: Vec<_> = TOPICS
        .iter()
        .map(|topic| {
            let (addr, body) = (engine.addr, chat(&poem(topic), 48, true));
            tokio::spawn(async move { text(&Stream::chat(addr, &body).await.rest().await) })
        })
        .collect();
    for (topic, (alone, together)) in TOPICS.iter().zip(sequential.iter().zip(concurrent)) {
        assert!(!alone.is_empty());
        assert_eq!(&together.await.unwrap(), alone, "{topic}");
    }
    let stats = engine.idle().await;
    assert_eq!(stats["streams_completed"], 16, "{stats}");
    // Decoded together: about one step per token of the longest answer (and a few for the
    // prompts), where one after the other would take one per token of every answer.
    let together = stats["decode_steps"].as_u64().unwrap() - steps;
    assert!(
        together <= 48 + 16,
        "{together} steps for 8 answers of at most 48 tokens"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_stream_continues_the_same_generation() {
    let Some(model) = model("a_resumed_stream_continues_the_same_generation") else {
        return;
    };
    let engine = Engine::start(&model, &["--resume-grace-ms", "10000"]).await;
    // Sampled, with a random seed: a generation made again would not give the same text.
    let mut body = chat(&poem("autumn"), 60, true);
    body["temperature"] = json!(1.0);
    let mut first = Stream::chat(engine.addr, &body).await;
    let mut read = Vec::new();
    for _ in 0..5 {
        read.push(first.next().await.unwrap());
    }
    let (id, last) = (first.request_id.clone(), read.last().unwrap().id.clone());
    drop(first);
    let path = format!("/v1/chat/completions/{id}/stream");
    let headers = [("last-event-id", last.as_str())];
    let mut resumed = Stream::open(engine.addr, "GET", &path, &headers, String::new()).await;
    assert_eq!(resumed.status, 200);
    let rest = resumed.rest().await;
    let next = last.parse::<u64>().unwrap() + 1;
    assert_eq!(rest[0].id, next.to_string(), "nothing lost or repeated");
    assert_eq!(rest.last().unwrap().data, "[DONE]");
    // Its answer once more from the start, from the replay log: the same text, to the end.
    let mut again = Stream::open(engine.addr, "GET", &path, &[], String::new()).await;
    let whole = text(&again.rest().await);
    assert_eq!(text(&read) + &text(&rest), whole);
    let stats = engine.idle().await;
    assert_eq!(stats["streams_started"], 1, "one generation: {stats}");
    assert_eq!(stats["streams_resumed"], 2, "{stats}");
    let made = stats["tokens_generated"].as_u64().unwrap();
    assert!(made <= 60, "no token made twice: {stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_every_open_stream_with_its_terminal_frame() {
    let Some(model) = model("sigterm_ends_every_open_stream_with_its_terminal_frame") else {
        return;
    };
    let mut engine = Engine::start(&model, &["--parallel", "2"]).await;
    // Two decoding, one waiting for a slot.
    let mut streams = Vec::new();
    for topic in &TOPICS[..3] {
        let stream = Stream::chat(engine.addr, &long(&poem(topic), 5000)).await;
        assert_eq!(stream.status, 200);
        streams.push(stream);
    }
    for stream in &mut streams[..2] {
        stream.next().await.expect("a first token");
    }
    engine
        .stats_until(|stats| stats["requests_queued"] == 1)
        .await;
    let pid = engine.child.id().unwrap() as i32;
    // SAFETY: `kill` has no memory preconditions.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    for mut stream in streams {
        let events = stream.rest().await;
        let last = events.last().expect("a terminal frame");
        assert_eq!(last.event, "error", "{last:?}");
        assert_eq!(last.json().unwrap()["error"]["type"], "shutdown");
    }
    let status = tokio::time::timeout(HANG, engine.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_answered_never_a_crash() {
    let Some(model) = model("bad_input_is_answered_never_a_crash") else {
        return;
    };
    // Slots of 256 tokens; two of them, and two requests may wait.
    let engine = Engine::start(&model, &["--parallel", "2", "-c", "512", "--queue", "2"]).await;
    // Its model, named by the file (no `--alias`), as the SDKs list models.
    let models = common::get_json(engine.addr, "/v1/models").await;
    let named = model.file_stem().and_then(|stem| stem.to_str());
    assert_eq!(models["data"][0]["id"].as_str(), named, "{models}");
    let long_prompt = "cat ".repeat(400);
    for path in ["/v1/chat/completions", "/v1/messages"] {
        let (status, body) = post(engine.addr, path, &chat(&long_prompt, 10, true)).await;
        assert_eq!(status, 400, "{body}");
        assert!(body.to_string().contains("context"), "{body}");
    }
    let (_, body) = post(
        engine.addr,
        "/v1/chat/completions",
        &chat(&long_prompt, 10, false),
    )
    .await;
    assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");

    // `max_tokens` past the slot: the answer ends at the slot's end, `length`.
    let mut past = chat(&poem("coffee"), 100_000, false);
    past["ignore_eos"] = json!(true);
    let (status, body) = post(engine.addr, "/v1/chat/completions", &past).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    let usage = &body["usage"];
    assert_eq!(usage["total_tokens"], 256, "the slot's tokens: {usage}");

    // Two decode, two wait (with heartbeats), the fifth is refused until a slot frees.
    let mut open = Vec::new();
    for topic in &TOPICS[..2] {
        open.push(Stream::chat(engine.addr, &long(&poem(topic), 150)).await);
    }
    engine
        .stats_until(|stats| stats["sequences_running"] == 2)
        .await;
    for topic in &TOPICS[2..4] {
        open.push(Stream::chat(engine.addr, &long(&poem(topic), 150)).await);
    }
    engine
        .stats_until(|stats| stats["requests_queued"] == 2)
        .await;
    let (status, body) = post(engine.addr, "/v1/chat/completions", &long(&poem("x"), 10)).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "queue_full");
    for mut stream in open {
        let events = stream.rest().await;
        assert_eq!(
            events.last().unwrap().data,
            "[DONE]",
            "the queued complete too"
        );
    }

    let regenerate = Stream::open(
        engine.addr,
        "GET",
        "/v1/stream?max_tokens=5",
        &[("last-event-id", "3")],
        String::new(),
    )
    .await;
    assert_eq!(regenerate.status, 400);
    let stats = engine.idle().await;
    assert_eq!(
        (
            stats["kv_cells_in_use"].as_u64(),
            stats["requests_queued"].as_u64()
        ),
        (Some(0), Some(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_request_takes_the_slot_a_client_that_left_frees() {
    let Some(model) = model("a_waiting_request_takes_the_slot_a_client_that_left_frees") else {
        return;
    };
    let engine = Engine::start(&model, &["--parallel", "1"]).await;
    let mut busy = Stream::chat(engine.addr, &long(&poem("cats"), 1000)).await;
    busy.next().await.expect("the slot's stream runs");
    let mut waiting = Stream::chat(engine.addr, &long(&poem("dogs"), 20)).await;
    engine
        .stats_until(|stats| stats["requests_queued"] == 1)
        .await;
    // Nothing else happens after this: the slot it frees must wake the loop.
    drop(busy);
    let events = waiting.rest().await;
    assert_eq!(events.last().unwrap().data, "[DONE]", "{events:?}");
    assert!(text(&events).len() > 20, "its whole answer");
    let stats = engine.idle().await;
    assert_eq!(stats["streams_completed"], 1, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_stopped_while_it_waits_for_a_slot_is_answered_at_once() {
    let Some(model) = model("a_request_stopped_while_it_waits_for_a_slot_is_answered_at_once")
    else {
        return;
    };
    let engine = Engine::start(&model, &["--parallel", "1"]).await;
    let mut busy = Stream::chat(engine.addr, &long(&poem("cats"), 1000)).await;
    busy.next().await.expect("the slot's stream runs");
    let headers = [("x-request-id", "waiting-1")];
    let body = long(&poem("dogs"), 50).to_string();
    let mut waiting =
        Stream::open(engine.addr, "POST", "/v1/chat/completions", &headers, body).await;
    engine
        .stats_until(|stats| stats["requests_queued"] == 1)
        .await;
    let (status, stopped) = post(
        engine.addr,
        "/v1/chat/completions/waiting-1/cancel",
        &json!({}),
    )
    .await;
    assert_eq!(
        (status, &stopped["cancelled"]),
        (200, &json!(true)),
        "{stopped}"
    );
    // Its final chunk and [DONE] while the other still holds the only slot.
    let events = waiting.rest().await;
    let finish = events[events.len() - 2].json().unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "stop", "{events:?}");
    assert_eq!(events.last().unwrap().data, "[DONE]");
    let stats = engine
        .stats_until(|stats| stats["streams_completed"] == 1)
        .await;
    assert_eq!(
        stats["sequences_running"], 1,
        "the other still decodes: {stats}"
    );
    drop(busy);
    engine.idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_clients_against_eight_slots_wait_with_heartbeats_and_are_all_answered() {
    let test = "a_hundred_clients_against_eight_slots_wait_with_heartbeats_and_are_all_answered";
    let Some(model) = model(test) else {
        return;
    };
    let flags = ["--parallel", "8", "-c", "4096", "--heartbeat-ms", "100"];
    let engine = Engine::start(&model, &flags).await;
    let clients: Vec<_> = (0..100)
        .map(|i| {
            let (addr, body) = (engine.addr, long(&poem(TOPICS[i % 8]), 6));
            tokio::spawn(async move {
                use futures_util::StreamExt;
                let path = "/v1/chat/completions";
                let response = client::request(addr, "POST", path, &[], body.to_string())
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200);
                let mut bytes = Vec::new();
                let mut body = client::body_stream(response);
                while let Some(chunk) = body.next().await {
                    bytes.extend_from_slice(&chunk.unwrap());
                }
                String::from_utf8(bytes).unwrap()
            })
        })
        .collect();
    let mut waited = 0;
    for client in clients {
        let body = tokio::time::timeout(HANG, client).await.unwrap().unwrap();
        assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
        let first = body.find("data: {").unwrap();
        // A heartbeat before the first token: this one waited for a slot.
        if body[..first].contains(":\n") {
            waited += 1;
        }
    }
    assert!(
        waited >= 50,
        "most waited for a slot, with heartbeats: {waited}"
    );
    let stats = engine.idle().await;
    assert_eq!(stats["streams_completed"], 100, "{stats}");
    assert_eq!(
        (
            stats["kv_cells_in_use"].as_u64(),
            stats["requests_queued"].as_u64()
        ),
        (Some(0), Some(0))
    );
}

#[tokio::test]
async fn a_file_that_is_no_model_or_flags_that_cannot_work_stop_it_at_start() {
    let dir = std::env::temp_dir().join(format!("streamgate-engine-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("model.gguf");
    std::fs::write(&fake, "not a model").unwrap();
    let refused: [(_, &[&str], _); 3] = [
        (fake.clone(), &[], "not a GGUF"),
        (dir.join("missing.gguf"), &[], "No such file"),
        (
            fake.clone(),
            &["--parallel", "32", "-b", "16"],
            "--batch-size",
        ),
    ];
    for (file, flags, why) in refused {
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_streamgate-llama"))
            .arg("-m")
            .arg(&file)
            .args(flags)
            .output();
        let output = tokio::time::timeout(Duration::from_secs(20), output)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(output.status.code(), Some(2));
        let error = String::from_utf8_lossy(&output.stderr);
        assert!(error.contains(why), "{error}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
