//! Every fuzz corpus entry, replayed as a plain test on stable; and what the corpus as a whole
//! reaches, so that a claim about it cannot silently rot.

// The Anthropic and Responses checks each bring their own copy of `typed.rs` (what they share),
// as each is also a fuzz target's whole crate; here both are loaded.
#![allow(clippy::duplicate_mod)]

#[cfg(feature = "anthropic")]
#[path = "../fuzz/checks/anthropic.rs"]
mod anthropic_checks;
#[cfg(feature = "browser")]
#[path = "../fuzz/checks/browser_post.rs"]
mod browser_checks;
#[path = "../fuzz/checks/sse.rs"]
mod checks;
#[cfg(feature = "timeline")]
#[path = "../fuzz/checks/hop_records.rs"]
mod hop_checks;
#[cfg(feature = "openai")]
#[path = "../fuzz/checks/openai.rs"]
mod openai_checks;
#[cfg(feature = "responses")]
#[path = "../fuzz/checks/responses.rs"]
mod responses_checks;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// The contents of every file of `fuzz/corpus/<target>`, with its path.
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let files: Vec<_> = entries
        .map(|entry| {
            let path = entry.unwrap().path();
            (path.display().to_string(), fs::read(&path).unwrap())
        })
        .collect();
    assert!(!files.is_empty(), "{} is empty", dir.display());
    files
}

/// Runs `check` on every file of `fuzz/corpus/<target>`.
fn replay(target: &str, check: fn(&[u8])) {
    for (path, data) in corpus(target) {
        let result = std::panic::catch_unwind(|| check(&data));
        assert!(result.is_ok(), "{target} failed on {path}");
    }
}

#[test]
fn sse_decode_corpus() {
    replay("sse_decode", checks::check_decode);
}

#[test]
fn sse_roundtrip_corpus() {
    replay("sse_roundtrip", checks::check_roundtrip);
}

#[cfg(feature = "openai")]
#[test]
fn openai_chunk_corpus() {
    replay("openai_chunk", |data| {
        openai_checks::check_chunk(data);
    });
}

#[cfg(feature = "openai")]
#[test]
fn openai_chunk_corpus_merges_and_refuses() {
    let mut outcomes = BTreeMap::new();
    for (_, data) in corpus("openai_chunk") {
        *outcomes
            .entry(openai_checks::check_chunk(&data))
            .or_insert(0) += 1;
    }
    assert!(
        [Some(true), Some(false), None]
            .iter()
            .all(|outcome| outcomes.contains_key(outcome)),
        "corpus files by merge outcome: {outcomes:?}"
    );
}

#[cfg(feature = "anthropic")]
#[test]
fn anthropic_event_corpus() {
    replay("anthropic_event", |data| {
        anthropic_checks::check_event(data);
    });
}

#[cfg(feature = "anthropic")]
#[test]
fn anthropic_event_corpus_reaches_every_type_and_outcome() {
    typed_corpus_reaches(
        "anthropic_event",
        anthropic_checks::reach,
        &anthropic_checks::EVENT_TYPES,
    );
}

#[cfg(feature = "responses")]
#[test]
fn responses_event_corpus() {
    replay("responses_event", |data| {
        responses_checks::check_event(data);
    });
}

#[cfg(feature = "responses")]
#[test]
fn responses_event_corpus_reaches_every_type_and_outcome() {
    typed_corpus_reaches(
        "responses_event",
        responses_checks::reach,
        &responses_checks::EVENT_TYPES,
    );
}

/// Checks that the corpus of `target` (a format whose events name their type) holds an event
/// of each of `types`, one of a type the module does not know, one of a known type with data
/// that is not that event, a pair that merges and one that does not.
#[cfg(any(feature = "anthropic", feature = "responses"))]
fn typed_corpus_reaches(target: &str, reach: fn(&[u8]) -> Vec<String>, types: &[&str]) {
    let mut reached = BTreeMap::new();
    for (_, data) in corpus(target) {
        for label in reach(&data) {
            *reached.entry(label).or_insert(0) += 1;
        }
    }
    let outcomes = ["unknown", "invalid", "merged", "refused"];
    let missing: Vec<&str> = types
        .iter()
        .chain(&outcomes)
        .copied()
        .filter(|label| !reached.contains_key(*label))
        .collect();
    assert!(
        missing.is_empty(),
        "{target}: nothing reaches {missing:?}; inputs reaching each: {reached:?}"
    );
}

#[test]
fn sse_decode_corpus_reaches_every_limit() {
    let mut inputs = BTreeMap::new();
    for (_, data) in corpus("sse_decode") {
        for (name, reached) in checks::reach(&data) {
            *inputs.entry(name).or_insert(0) += usize::from(reached);
        }
    }
    assert!(
        inputs.values().all(|&n| n > 0),
        "inputs reaching each: {inputs:?}"
    );
}

#[test]
fn sse_decode_corpus_is_compared_with_eventsource_stream() {
    let files = corpus("sse_decode");
    let compared = files
        .iter()
        .filter(|(_, data)| {
            let input = data.get(1..).unwrap_or_default();
            checks::check_differential(&String::from_utf8_lossy(input))
        })
        .count();
    // Only a signed retry or a second BOM is left out.
    assert!(
        compared * 2 > files.len(),
        "{compared} of {} compared",
        files.len()
    );
}

#[cfg(feature = "timeline")]
#[test]
fn hop_records_corpus() {
    replay("hop_records", hop_checks::check);
}

#[cfg(feature = "timeline")]
#[test]
fn hop_records_corpus_reaches_every_limit() {
    let mut inputs = BTreeMap::new();
    for (_, data) in corpus("hop_records") {
        for (name, reached) in hop_checks::reach(&data) {
            *inputs.entry(name).or_insert(0) += usize::from(reached);
        }
    }
    assert!(
        inputs.values().all(|&n| n > 0),
        "inputs reaching each: {inputs:?}"
    );
}

#[cfg(feature = "browser")]
#[test]
fn browser_post_corpus_reaches_every_outcome() {
    let mut reached = BTreeMap::new();
    for (path, data) in corpus("browser_post") {
        let labels = std::panic::catch_unwind(|| browser_checks::reach(&data));
        for label in labels.unwrap_or_else(|_| panic!("browser_post failed on {path}")) {
            *reached.entry(label).or_insert(0) += 1;
        }
    }
    let missing: Vec<&str> = [
        "own bad_token",
        "own malformed",
        "own too_large",
        "tokened taken",
        "tokened malformed",
        "tokened too_large",
        "another hop",
        "unknown kind",
        "end without reason",
        "unknown end reason",
        "reason on an event",
        "busy at recv",
        "request id length",
        "too many records",
    ]
    .into_iter()
    .filter(|label| !reached.contains_key(*label))
    .collect();
    assert!(
        missing.is_empty(),
        "nothing reaches {missing:?}; inputs reaching each: {reached:?}"
    );
}
