#![no_main]
//! Arbitrary events: encode then decode is what a WHATWG client receives.

#[path = "../checks/sse.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check_roundtrip(data));
