//! Every fuzz corpus entry, replayed as a plain test on stable.

#[path = "../fuzz/checks/sse.rs"]
mod checks;

use std::fs;
use std::path::Path;

/// Runs `check` on every file of `fuzz/corpus/<target>`; returns how many there were.
fn replay(target: &str, check: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut count = 0;
    for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let data = fs::read(&path).unwrap();
        let result = std::panic::catch_unwind(|| check(&data));
        assert!(result.is_ok(), "{target} failed on {}", path.display());
        count += 1;
    }
    count
}

#[test]
fn sse_decode_corpus() {
    assert!(replay("sse_decode", checks::check_decode) > 0);
}

#[test]
fn sse_roundtrip_corpus() {
    assert!(replay("sse_roundtrip", checks::check_roundtrip) > 0);
}
