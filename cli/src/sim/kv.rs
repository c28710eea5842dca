//! The simulated KV cache: a pool of blocks, one per 16 tokens a live generation holds, taken
//! and given back in one place.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use streamgate::openai::ApiError;

/// Tokens per KV block.
pub(super) const BLOCK_TOKENS: u64 = 16;

/// The pool (`--kv-blocks`): how many blocks there are and how many generations hold.
#[derive(Debug)]
pub(super) struct KvPool {
    total: u64,
    in_use: AtomicU64,
}

impl KvPool {
    /// A pool of `total` blocks, none in use.
    pub(super) fn new(total: u64) -> Arc<Self> {
        Arc::new(KvPool {
            total,
            in_use: AtomicU64::new(0),
        })
    }

    /// The blocks held now, by every generation.
    pub(super) fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::SeqCst)
    }

    /// A new generation's holding, with no block yet.
    pub(super) fn holding(self: &Arc<Self>) -> KvBlocks {
        KvBlocks {
            pool: self.clone(),
            held: 0,
        }
    }

    /// The most tokens a request is served: its `max_tokens`, or what the whole pool holds (a
    /// generation holds one block per 16 tokens until it ends), where a request asks for more.
    /// Such a stream ends there with `finish_reason` `length`, as a real server's generation
    /// ends when its context is full, instead of running the pool dry and failing.
    pub(super) fn servable(&self, max_tokens: u64) -> u64 {
        max_tokens.min(self.total.saturating_mul(BLOCK_TOKENS))
    }

    /// Takes one block, or says how full the pool is.
    fn take(&self) -> Result<(), KvFull> {
        let total = self.total;
        self.in_use
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < total).then_some(n + 1)
            })
            .map(|_| ())
            .map_err(|in_use| KvFull { in_use, total })
    }

    /// Gives `blocks` back.
    fn give_back(&self, blocks: u64) {
        self.in_use.fetch_sub(blocks, Ordering::SeqCst);
    }
}

/// The blocks one generation holds. They go back to the pool when it is [given
/// back](KvBlocks::give_back) or dropped: the generator owns it, and the gate drops the
/// generator before the stream's release hook runs, however the stream ended (completed,
/// stopped, cut off, failed, panicked).
#[derive(Debug)]
pub(super) struct KvBlocks {
    pool: Arc<KvPool>,
    held: u64,
}

impl KvBlocks {
    /// Makes room for the generation's token `n` (counted from its first, 0-based): one block
    /// more at every 16th token, or how full the pool is.
    pub(super) fn room_for(&mut self, n: u64) -> Result<(), KvFull> {
        if n / BLOCK_TOKENS < self.held {
            return Ok(());
        }
        self.pool.take()?;
        self.held += 1;
        Ok(())
    }

    /// Gives every block back now; returns how many there were.
    pub(super) fn give_back(&mut self) -> u64 {
        let blocks = std::mem::take(&mut self.held);
        self.pool.give_back(blocks);
        blocks
    }
}

impl Drop for KvBlocks {
    fn drop(&mut self) {
        self.give_back();
    }
}

/// Every KV block is held: `in_use` of `total`.
#[derive(Debug, Clone, Copy)]
pub(super) struct KvFull {
    in_use: u64,
    total: u64,
}

impl fmt::Display for KvFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "KV cache full: {} of {} blocks in use",
            self.in_use, self.total
        )
    }
}

impl KvFull {
    /// 503 with an OpenAI-style error body: the pool is busy, a retry may find room.
    pub(super) fn response(&self) -> Response {
        let error = ApiError::new(
            format!("{self}; retry when other streams have ended"),
            "server_error",
        )
        .with_code("kv_cache_full");
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::RETRY_AFTER, "1"),
            ],
            error.to_json(),
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_taken_per_16_tokens_and_come_back_however_a_holding_ends() {
        let pool = KvPool::new(3);
        let mut first = pool.holding();
        for n in 0..32 {
            first.room_for(n).unwrap();
        }
        assert_eq!(pool.in_use(), 2, "tokens 0..32: two blocks");
        let mut second = pool.holding();
        second.room_for(0).unwrap();
        let full = second.room_for(16).unwrap_err();
        assert_eq!(full.to_string(), "KV cache full: 3 of 3 blocks in use");
        assert_eq!(second.give_back(), 1);
        assert_eq!(second.give_back(), 0, "given back once");
        drop(second);
        assert_eq!(pool.in_use(), 2);
        drop(first);
        assert_eq!(pool.in_use(), 0, "a dropped holding gives its blocks back");
        assert_eq!(pool.servable(1_000), 48);
    }
}
