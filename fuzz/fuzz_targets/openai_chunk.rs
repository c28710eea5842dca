#![no_main]
//! Untrusted chunk JSON: no panic, stable round trips, merges that lose nothing.

#[path = "../checks/openai.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::check_chunk(data);
});
