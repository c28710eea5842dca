//! What the library's tests share: a raw HTTP/1.1 client over a real TCP socket (`raw`), the
//! gate helpers, a `redis-server` of a test's own, and a replayable pseudo-random generator.

#![allow(dead_code)] // each test binary uses a part

pub mod deaf;
pub mod gate;
mod raw;
pub mod redis_server;
pub mod subscriber;

pub use raw::*;

/// A small deterministic generator of pseudo-random numbers (xorshift64*), so every randomized
/// case can be replayed from its seed.
pub struct Rng(pub u64);

impl Rng {
    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}
