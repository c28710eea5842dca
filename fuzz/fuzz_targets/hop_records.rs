#![no_main]
//! Arbitrary bytes as hop records: no panic, every limit kept, JSON valid, split reads equal.

#[path = "../checks/hop_records.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
