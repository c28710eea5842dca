//! The SDK scripts of `tests/clients/` that more than one test runs against a server (sim
//! itself, or the proxy in front of it): their arguments, and what they must print.

use std::net::SocketAddr;
use std::process::Output;

use super::formats::tokens;
use super::python::lines;

/// `anthropic_sdk.py`'s arguments against the server at `addr`: 40 tokens, each read waiting at
/// most 0.5 s (a longer stall passes on heartbeats alone).
pub fn anthropic_args(addr: SocketAddr) -> Vec<String> {
    vec![format!("http://{addr}"), "40".to_owned(), "0.5".to_owned()]
}

/// What `anthropic_sdk.py` printed, reading 40 tokens through a stall: the text its events
/// carried and the final message's, all 40 tokens; sim's 400 in Anthropic's shape is the SDK's
/// `BadRequestError`.
pub fn assert_anthropic_sdk_streamed(output: &Output) {
    let lines = lines(output);
    let streamed = &lines[0];
    assert_eq!(streamed["text"], tokens(0..40), "{streamed}");
    assert_eq!(streamed["final"], tokens(0..40));
    assert_eq!(streamed["stop_reason"], "max_tokens");
    assert_eq!(streamed["output_tokens"], 40);
    assert_eq!(lines[1]["error"], "BadRequestError", "{}", lines[1]);
    assert_eq!(lines[1]["status"], 400);
}

/// `openai_responses.py`'s arguments against the server at `addr`: 40 tokens under the request
/// id `name`, each read waiting at most 0.5 s (a longer stall passes on heartbeats alone).
pub fn openai_args(addr: SocketAddr, name: &str) -> Vec<String> {
    let args = [&format!("http://{addr}/v1"), "40", name, "0.5"];
    args.map(str::to_owned).to_vec()
}

/// What `openai_responses.py` printed: the response `name` read to its fifth delta (event 7,
/// after three events before the first delta), resumed after it by the SDK (every event once,
/// numbered on) and by the server's `starting_after`, and completed with all 40 tokens.
pub fn assert_openai_sdk_streamed_and_resumed(output: &Output, name: &str) {
    let got = &lines(output)[0];
    assert_eq!(got["response_id"], name, "{got}");
    assert_eq!(got["last"], 7, "{got}");
    assert_eq!(got["first"], tokens(0..5));
    assert_eq!(got["resumed"], tokens(5..40), "{got}");
    let numbers: Vec<u64> = got["numbers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    let after: Vec<u64> = (8..8 + 35 + 4).collect();
    assert_eq!(numbers, after, "{got}");
    assert_eq!(got["final"], tokens(0..40));
    assert_eq!(got["status"], "completed");
    assert_eq!(got["skipped"], tokens(5..40), "the server's starting_after");
}
