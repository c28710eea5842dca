//! The engine's counters, as `/stats` reports them beside the server's: its KV cells (its own
//! count and llama.cpp's), its sequences and queue, and the cells each release freed.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};

/// The KV cells in use, by the engine's count and by llama.cpp's.
#[derive(Debug, Default, Clone, Copy)]
struct KvCells {
    own: u64,
    llama: u64,
}

/// The engine loop writes these after every step; the release hooks and `/stats` read them.
#[derive(Debug, Default)]
pub struct EngineStats {
    /// KV cells in use, as one snapshot: the engine's own count (the tokens each live
    /// sequence has decoded) and llama.cpp's (the positions its memory holds for each slot,
    /// the same as its cells for a model with a plain KV cache, as every model this engine
    /// serves has: a sliding-window or recurrent model's memory holds fewer).
    kv_cells: Mutex<KvCells>,
    /// Sequences in a slot that the next step decodes (their prompt or their answer).
    pub sequences_running: AtomicU64,
    /// Sequences in a slot whose gate is full: left out of the steps, their KV kept.
    pub sequences_paused: AtomicU64,
    /// Requests waiting for a slot (their streams started, with heartbeats).
    pub requests_queued: AtomicU64,
    /// KV cells given back, as the release hooks reported them.
    pub kv_cells_freed: AtomicU64,
    /// Prompt tokens of the requests given a slot.
    pub prompt_tokens: AtomicU64,
    /// Decode steps (`llama_decode` calls).
    pub decode_steps: AtomicU64,
    /// Sequences moved to another slot, to keep those that decode in consecutive slots.
    pub slot_moves: AtomicU64,
}

impl EngineStats {
    /// The cells in use now: `own` by the engine's count, `llama` by llama.cpp's.
    pub fn kv_cells(&self, own: u64, llama: u64) {
        *self.kv_cells.lock().unwrap_or_else(|e| e.into_inner()) = KvCells { own, llama };
    }

    /// The fields `/stats` adds.
    pub fn fields(&self, fields: &mut Map<String, Value>) {
        let cells = *self.kv_cells.lock().unwrap_or_else(|e| e.into_inner());
        fields.insert("kv_cells_in_use".into(), cells.own.into());
        fields.insert("kv_cells_llama".into(), cells.llama.into());
        let load = |n: &AtomicU64| n.load(Ordering::SeqCst);
        let all: [(&str, &AtomicU64); 7] = [
            ("sequences_running", &self.sequences_running),
            ("sequences_paused", &self.sequences_paused),
            ("requests_queued", &self.requests_queued),
            ("kv_cells_freed", &self.kv_cells_freed),
            ("prompt_tokens", &self.prompt_tokens),
            ("decode_steps", &self.decode_steps),
            ("slot_moves", &self.slot_moves),
        ];
        fields.extend(all.map(|(name, n)| (name.to_owned(), load(n).into())));
    }
}
