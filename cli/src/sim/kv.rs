//! The simulated KV cache: a pool of blocks, one per 16 tokens a live generation holds, taken
//! and given back in one place.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::serve::Refusal;

/// Tokens per KV block.
pub(super) const BLOCK_TOKENS: u64 = 16;

/// The pool (`--kv-blocks`): how many blocks there are and how many generations hold, and
/// the generations it could not hold.
#[derive(Debug)]
pub(super) struct KvPool {
    total: u64,
    in_use: AtomicU64,
    /// Generations stopped mid-way because the pool ran out (also `streams_failed`).
    exhausted: AtomicU64,
    /// Requests refused with 503 because every block was held by other streams.
    refused: AtomicU64,
}

impl KvPool {
    /// A pool of `total` blocks, none in use.
    pub(super) fn new(total: u64) -> Arc<Self> {
        Arc::new(KvPool {
            total,
            in_use: AtomicU64::new(0),
            exhausted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        })
    }

    /// The blocks held now, by every generation.
    pub(super) fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::SeqCst)
    }

    /// Its `/stats` fields: `kv_blocks_in_use`, `streams_kv_exhausted` and
    /// `requests_refused_kv_full`.
    pub(super) fn fields(&self) -> [(&'static str, u64); 3] {
        let load = |n: &AtomicU64| n.load(Ordering::SeqCst);
        [
            ("streams_kv_exhausted", load(&self.exhausted)),
            ("requests_refused_kv_full", load(&self.refused)),
            ("kv_blocks_in_use", self.in_use()),
        ]
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

    /// The first block of a new generation, or the refusal (counted) when every block is
    /// held.
    pub(super) fn first(&mut self) -> Result<(), KvFull> {
        self.room_for(0)
            .inspect_err(|_| _ = self.pool.refused.fetch_add(1, Ordering::Relaxed))
    }

    /// The pool ran out mid-generation: gives every block back now, counts the generation
    /// as exhausted, and returns how many blocks there were.
    pub(super) fn exhausted(&mut self) -> u64 {
        self.pool.exhausted.fetch_add(1, Ordering::Relaxed);
        self.give_back()
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
    /// The refusal: 503, the pool is busy, a retry may find room.
    pub(super) fn refusal(&self) -> Refusal {
        Refusal::Busy {
            code: "kv_cache_full",
            message: format!("{self}; retry when other streams have ended"),
        }
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
