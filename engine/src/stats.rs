//! The engine's counters, as `/stats` reports them beside the server's: its KV cells (its own
//! count and llama.cpp's), its sequences and queue, and the cells each release freed.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};

/// The engine loop writes these after every step; the release hooks and `/stats` read them.
#[derive(Debug, Default)]
pub struct EngineStats {
    /// KV cells the live sequences hold, by the engine's own count (each sequence's tokens).
    pub kv_cells_in_use: AtomicU64,
    /// KV cells in use as llama.cpp's memory reports them (each slot's positions): equal to
    /// the engine's count after every step.
    pub kv_cells_llama: AtomicU64,
    /// Sequences in a slot that the next step decodes (their prompt or their answer).
    pub sequences_running: AtomicU64,
    /// Sequences in a slot whose gate is full: left out of the steps, their KV kept.
    pub sequences_paused: AtomicU64,
    /// Requests waiting for a slot (their streams started, with heartbeats).
    pub requests_queued: AtomicU64,
    /// KV cells given back, as the release hooks reported them.
    pub kv_cells_freed: AtomicU64,
    /// Prompt tokens decoded.
    pub prompt_tokens: AtomicU64,
    /// Decode steps (`llama_decode` calls).
    pub decode_steps: AtomicU64,
}

impl EngineStats {
    /// The fields `/stats` adds.
    pub fn fields(&self, fields: &mut Map<String, Value>) {
        let load = |n: &AtomicU64| n.load(Ordering::SeqCst);
        let all: [(&str, &AtomicU64); 8] = [
            ("kv_cells_in_use", &self.kv_cells_in_use),
            ("kv_cells_llama", &self.kv_cells_llama),
            ("sequences_running", &self.sequences_running),
            ("sequences_paused", &self.sequences_paused),
            ("requests_queued", &self.requests_queued),
            ("kv_cells_freed", &self.kv_cells_freed),
            ("prompt_tokens", &self.prompt_tokens),
            ("decode_steps", &self.decode_steps),
        ];
        fields.extend(all.map(|(name, n)| (name.to_owned(), load(n).into())));
    }
}
