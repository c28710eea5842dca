#![no_main]
//! Untrusted OpenAI Responses events: no panic, stable round trips, merges that lose nothing.

#[path = "../checks/responses.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::check_event(data);
});
