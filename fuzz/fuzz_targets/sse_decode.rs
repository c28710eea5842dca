#![no_main]
//! Arbitrary bytes, split at arbitrary points: no panic, bounded memory, one-shot equality.

#[path = "../checks/sse.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check_decode(data));
