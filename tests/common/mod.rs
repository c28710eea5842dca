//! What the library's tests share: a raw HTTP/1.1 client over a real TCP socket (`raw`), the
//! gate helpers, a `redis-server` of a test's own, and a replayable pseudo-random generator.

#![allow(dead_code)] // each test binary uses a part

pub mod coalescing;
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

/// What a gateway's decoder (the default limits) reads from `wire` fed `piece` bytes at a time,
/// every event and error in order, and the most it held between reads: the input not yet
/// consumed and the data it stored.
pub fn decode_in_pieces(
    wire: &[u8],
    piece: usize,
) -> (
    Vec<Result<streamgate::sse::SseEvent, streamgate::sse::DecodeError>>,
    usize,
) {
    use tokio_util::codec::Decoder;

    let mut decoder = streamgate::sse::SseDecoder::new();
    let mut input = bytes::BytesMut::new();
    let (mut items, mut held) = (Vec::new(), 0);
    for chunk in wire.chunks(piece) {
        input.extend_from_slice(chunk);
        loop {
            match decoder.decode(&mut input) {
                Ok(Some(event)) => items.push(Ok(event)),
                Ok(None) => break,
                Err(error) => items.push(Err(error)),
            }
        }
        held = held.max(input.len() + decoder.buffered_data());
    }
    (items, held)
}
