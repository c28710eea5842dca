#![no_main]
//! A page's batch of hop records: no panic; never taken with a made-up token; with the right
//! token, taken whole or refused for its body only.

#[path = "../checks/browser_post.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::check(data);
});
