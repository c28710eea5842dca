#![no_main]
//! Untrusted Anthropic Messages events: no panic, stable round trips, merges that lose nothing.

#[path = "../checks/anthropic.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::check_event(data);
});
