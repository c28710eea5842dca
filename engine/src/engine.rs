//! The engine loop: one thread that owns llama.cpp's context and decodes every running
//! sequence together, one `llama_decode` per step (continuous batching). It never awaits a
//! stream: each event goes to its gate with `try_send`; a full gate leaves its sequence out of
//! the next steps (paused, its KV cells kept) while the others go on, and a gate that ended
//! (its client gone, its policy's end, a shutdown) frees its sequence's cells at the next step.
//!
//! A step takes one token from every sequence that decodes its answer, then prompt tokens
//! of sequences that are still reading theirs, up to `--batch-size` in all: a long prompt is
//! read over several steps, between which the others go on decoding (each of those steps is
//! longer, which `worker.decode`'s gaps show). Before each step the sequences that decode are
//! packed into consecutive slots (`Engine::pack`), which llama.cpp needs to decode them in one
//! computation. When no sequence can be decoded, the loop waits for a new request, room in a
//! paused sequence's gate, an end or an explicit stop.

use std::collections::{BTreeSet, VecDeque};
use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use streamgate_cli::serve::FinishReason;
use tokio::sync::mpsc;

use crate::places::Places;
use crate::sampler::EndTokens;
use crate::sequence::{Admission, Delivery, Sequence};
use crate::stats::EngineStats;

/// What one step and one sequence may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most tokens one step takes.
    pub batch_size: u32,
    /// The sequences decoded together.
    pub slots: u32,
    /// The most tokens one sequence holds.
    pub slot_tokens: u32,
}

/// What one slot puts in a step's batch.
#[derive(Debug, Clone, Copy)]
enum Part {
    /// Sequence `i`'s next token.
    Answer(usize),
    /// `n` more tokens of sequence `i`'s prompt.
    Prompt(usize, usize),
    /// A token nobody reads, at this position (the next of the slot's sequence) of a slot
    /// between two that put tokens in the step and that puts none itself: a paused sequence's
    /// that `Engine::pack` had no free slot to move to, or one whose prompt the step's budget
    /// left out. Without it, llama.cpp would split the step at the hole. Its cell is removed
    /// right after the step.
    Filler(i32),
}

/// The token a filler decodes (any will do: nothing reads its logits, its cell goes).
const FILLER: LlamaToken = LlamaToken(0);

/// The loop's state: the context, the requests waiting for a slot and the sequences in one.
pub struct Engine {
    model: &'static LlamaModel,
    ctx: LlamaContext<'static>,
    batch: LlamaBatch<'static>,
    /// The most tokens one step takes.
    batch_size: usize,
    /// The most tokens one sequence holds.
    slot_tokens: u32,
    incoming: mpsc::UnboundedReceiver<Admission>,
    /// Whether the server has let go of the loop (no request will come).
    closed: bool,
    queue: VecDeque<Admission>,
    /// Slots (llama.cpp sequence ids) no sequence holds: a new sequence takes the lowest.
    free: BTreeSet<i32>,
    /// Every slot's sequence id, for llama.cpp's count.
    slots: i32,
    sequences: Vec<Sequence>,
    /// The model's end-of-generation tokens (for `ignore_eos`).
    ends: EndTokens,
    /// The places requests hold (a slot, or one in the queue), given back here.
    places: Arc<Places>,
    stats: Arc<EngineStats>,
}

impl Engine {
    /// A loop over `ctx` (of `model`, within `limits`), taking requests from `incoming`.
    pub fn new(
        model: &'static LlamaModel,
        ctx: LlamaContext<'static>,
        limits: Limits,
        incoming: mpsc::UnboundedReceiver<Admission>,
        places: Arc<Places>,
        stats: Arc<EngineStats>,
    ) -> Self {
        let Limits {
            batch_size,
            slots,
            slot_tokens,
        } = limits;
        let slots = slots as i32;
        Engine {
            model,
            ctx,
            // A step's tokens, and a filler for each slot but one (at most).
            batch: LlamaBatch::new(batch_size as usize + slots as usize, 1),
            batch_size: batch_size as usize,
            slot_tokens,
            incoming,
            closed: false,
            queue: VecDeque::new(),
            free: (0..slots).collect(),
            slots,
            sequences: Vec::new(),
            ends: EndTokens::of(&model.vocab()),
            places,
            stats,
        }
    }

    /// Runs until the server has let go and every sequence has ended.
    pub async fn run(mut self) {
        loop {
            self.take_requests();
            // What ended frees its slot before the waiting are given the free ones.
            self.settle();
            self.start_waiting();
            let stepped = self.step();
            self.publish();
            if stepped {
                continue;
            }
            if self.closed && self.queue.is_empty() && self.sequences.is_empty() {
                return;
            }
            self.wait().await;
        }
    }

    /// Takes the requests that have come, without waiting.
    fn take_requests(&mut self) {
        loop {
            match self.incoming.try_recv() {
                Ok(admission) => self.queue.push_back(admission),
                Err(mpsc::error::TryRecvError::Empty) => return,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.closed = true;
                    return;
                }
            }
        }
    }

    /// Gives free slots to waiting requests, in order; drops those whose client left, and
    /// answers those stopped while they waited (their final events, no decoding).
    fn start_waiting(&mut self) {
        let waiting = self.queue.len();
        self.queue.retain(|admission| !admission.tx.is_closed());
        for _ in self.queue.len()..waiting {
            self.places.give_back();
        }
        let (stopped, waiting_on): (Vec<_>, Vec<_>) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(|admission| admission.stop.is_cancelled());
        self.queue = waiting_on.into();
        for admission in stopped {
            self.places.give_back();
            let mut sequence = Sequence::new(admission, None, &self.ends);
            sequence.finish(FinishReason::Stop, Instant::now());
            self.start(sequence);
        }
        while let Some(&slot) = self.free.first() {
            let Some(admission) = self.queue.pop_front() else {
                return;
            };
            self.free.remove(&slot);
            self.stats
                .prompt_tokens
                .fetch_add(admission.prompt.len() as u64, Ordering::Relaxed);
            let sequence = Sequence::new(admission, Some(slot), &self.ends);
            self.start(sequence);
        }
    }

    /// Takes `sequence` into the loop, its first events (its format's opening ones) offered
    /// to its gate at once.
    fn start(&mut self, mut sequence: Sequence) {
        sequence.deliver();
        self.sequences.push(sequence);
    }

    /// Hands every sequence's waiting events to its gate, and ends what is over: a gate that
    /// ended frees its sequence's cells and drops it, an explicit stop finishes the answer,
    /// a sequence whose last events are out completes its stream.
    fn settle(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.sequences.len() {
            let sequence = &mut self.sequences[i];
            if sequence.is_stopped() {
                self.end_generation(i, FinishReason::Stop, now);
            }
            let sequence = &mut self.sequences[i];
            // Offered first, so a token made after the end is counted as one by the gate.
            let gone = sequence.deliver() == Delivery::Gone || sequence.is_gone();
            if gone {
                self.free_cells(i);
                // Dropping its sender lets the gate release the stream.
                drop(self.sequences.swap_remove(i));
                continue;
            }
            if sequence.is_draining() && !sequence.is_paused() {
                self.sequences.swap_remove(i).end();
                continue;
            }
            i += 1;
        }
    }

    /// Decodes one step of every sequence that can go on, and samples the next token of each
    /// whose step gave logits. `false` when no sequence could.
    fn step(&mut self) -> bool {
        self.pack();
        // What each slot puts in the batch, in slot order (see `Part::Filler`).
        self.sequences
            .sort_unstable_by_key(|s| s.slot.unwrap_or(i32::MAX));
        let mut parts: Vec<(i32, Part)> = Vec::new();
        let mut budget = self.batch_size;
        for (i, sequence) in self.sequences.iter().enumerate() {
            if let (true, Some(_), Some(slot)) =
                (sequence.decodes(), sequence.answer_token(), sequence.slot)
            {
                if budget > 0 {
                    parts.push((slot, Part::Answer(i)));
                    budget -= 1;
                }
            }
        }
        for (i, sequence) in self.sequences.iter().enumerate() {
            if let (true, Some((tokens, _, _)), Some(slot)) = (
                sequence.decodes(),
                sequence.prompt_chunk(budget),
                sequence.slot,
            ) {
                if budget > 0 {
                    parts.push((slot, Part::Prompt(i, tokens.len())));
                    budget -= tokens.len();
                }
            }
        }
        let Some(highest) = parts.iter().map(|&(slot, _)| slot).max() else {
            return false;
        };
        let lowest = parts.iter().map(|&(slot, _)| slot).min().unwrap_or(highest);
        for slot in lowest..highest {
            if !parts.iter().any(|&(taken, _)| taken == slot) {
                let holder = self.sequences.iter().find(|s| s.slot == Some(slot));
                parts.push((slot, Part::Filler(holder.map_or(0, |s| s.cells as i32))));
            }
        }
        parts.sort_unstable_by_key(|&(slot, _)| slot);
        self.batch.clear();
        // (sequence, tokens it put in the batch, the batch index of its logits)
        let mut taken: Vec<(usize, usize, Option<i32>)> = Vec::new();
        for &(slot, part) in &parts {
            let add = |batch: &mut LlamaBatch, token, pos, logits| {
                batch
                    .add(token, pos, &[slot], logits)
                    .expect("the batch holds --batch-size tokens and a filler per slot");
            };
            match part {
                Part::Answer(i) => {
                    let (token, pos) = self.sequences[i].answer_token().expect("planned");
                    add(&mut self.batch, token, pos, true);
                    taken.push((i, 1, Some(self.batch.n_tokens() - 1)));
                }
                Part::Prompt(i, n) => {
                    let (tokens, pos, last) = self.sequences[i].prompt_chunk(n).expect("planned");
                    for (k, &token) in tokens.iter().enumerate() {
                        add(&mut self.batch, token, pos + k as i32, last && k + 1 == n);
                    }
                    taken.push((i, n, last.then(|| self.batch.n_tokens() - 1)));
                }
                Part::Filler(pos) => add(&mut self.batch, FILLER, pos, false),
            }
        }
        let decoded = self.ctx.decode(&mut self.batch);
        let at = Instant::now();
        self.stats.decode_steps.fetch_add(1, Ordering::Relaxed);
        for &(slot, part) in &parts {
            if let Part::Filler(pos) = part {
                // Its cell goes at once: the slot holds what it held before the step.
                let _ = self
                    .ctx
                    .clear_kv_cache_seq(Some(slot as u32), Some(pos as u32), None);
            }
        }
        if let Err(error) = decoded {
            // The step's sequences cannot go on: each ends with an error event.
            let message = format!("llama.cpp could not decode a step: {error}");
            for &(i, _, _) in &taken {
                self.sequences[i].fail(message.clone(), "decode_failed");
                self.free_cells(i);
            }
            return true;
        }
        let vocab = self.model.vocab();
        for &(i, tokens, index) in &taken {
            let sequence = &mut self.sequences[i];
            sequence.decoded(tokens);
            let Some(index) = index else { continue };
            let ended = sequence.sample(&self.ctx, index, at, &vocab, self.slot_tokens);
            if let Some(reason) = ended {
                self.end_generation(i, reason, at);
            }
            // Flush per event: the gate has it the moment the step that made it ended (a
            // gate that ended or is full is the next `settle`'s).
            self.sequences[i].deliver();
        }
        true
    }

    /// Moves sequences between slots so that those that can decode hold consecutive slots:
    /// with a KV stream per slot, llama.cpp puts only sequences with consecutive ids in one
    /// micro-batch, so a slot between two that decode, free or holding a paused sequence,
    /// would split every step in two graph computations (each costing about as much as the
    /// whole step). The highest that decodes moves into the lowest hole between them, a paused
    /// sequence in the hole first moving to a free slot above them all; with no such slot, the
    /// hole gets a filler instead (`Part::Filler`).
    ///
    /// A move copies the slot's whole KV stream, however few of its cells are used (llama.cpp
    /// does it at the start of the next step, and builds its graphs again): a pause between
    /// sequences that decode costs two moves, the end of a sequence below the highest one,
    /// and a paused sequence that decodes again above a hole one more, after which it is the
    /// highest. A filler instead would cost a token in every step, and widen every
    /// sequence's attention to the paused one's length (llama.cpp's `n_kv` is the largest of
    /// the step's streams).
    fn pack(&mut self) {
        loop {
            let mut decoding: Vec<i32> = (self.sequences.iter())
                .filter(|s| s.decodes())
                .filter_map(|s| s.slot)
                .collect();
            decoding.sort_unstable();
            let (Some(&lowest), Some(&highest)) = (decoding.first(), decoding.last()) else {
                return;
            };
            let Some(hole) = (lowest..highest).find(|slot| !decoding.contains(slot)) else {
                return;
            };
            if let Some(held) = self.sequences.iter().position(|s| s.slot == Some(hole)) {
                // Above them all: a free slot among them is a hole of its own.
                let Some(&free) = self.free.range(highest + 1..).next() else {
                    return; // no room to move it: the step fills the hole
                };
                self.move_to(held, free);
            }
            let top = (self.sequences.iter())
                .position(|s| s.slot == Some(highest))
                .expect("a slot that decodes has its sequence");
            self.move_to(top, hole);
        }
    }

    /// Moves sequence `i` into the free slot `to`: its KV stream is copied there (unless it
    /// holds no cell yet) and its old slot freed.
    fn move_to(&mut self, i: usize, to: i32) {
        let sequence = &mut self.sequences[i];
        let from = sequence.slot.expect("a sequence that moves holds a slot");
        if sequence.cells > 0 {
            // Whole streams: the copy is llama.cpp's, at the start of its next step.
            let _ = self.ctx.copy_kv_cache_seq(from, to, None, None);
            let _ = self.ctx.clear_kv_cache_seq(Some(from as u32), None, None);
        }
        sequence.slot = Some(to);
        self.free.remove(&to);
        self.free.insert(from);
        self.stats.slot_moves.fetch_add(1, Ordering::Relaxed);
    }

    /// Sequence `i`'s answer ended for `reason`: its cells are freed now, before its last
    /// events reach its client.
    fn end_generation(&mut self, i: usize, reason: FinishReason, at: Instant) {
        self.free_cells(i);
        self.sequences[i].finish(reason, at);
    }

    /// Frees the KV cells of sequence `i` (once): llama.cpp's memory of its slot is removed
    /// and the slot is free for a waiting request; the count goes to its release hook.
    fn free_cells(&mut self, i: usize) {
        let sequence = &mut self.sequences[i];
        let Some(slot) = sequence.slot.take() else {
            return;
        };
        // A whole sequence's removal always succeeds.
        let _ = self.ctx.clear_kv_cache_seq(Some(slot as u32), None, None);
        sequence
            .admission
            .freed
            .fetch_add(u64::from(sequence.cells), Ordering::SeqCst);
        self.free.insert(slot);
        self.places.give_back();
        sequence.cells = 0;
        // Before the sequence's sender is dropped: once its stream is released, `/stats`
        // shows the cells free.
        self.publish();
    }

    /// Publishes the counters `/stats` reads: the engine's and llama.cpp's count of cells in
    /// use, the sequences running and paused.
    fn publish(&self) {
        let own: u64 = self.sequences.iter().map(|s| u64::from(s.cells)).sum();
        let llama: u64 = (0..self.slots)
            .map(|slot| {
                let (min, max) = (
                    self.ctx.kv_cache_seq_pos_min(slot),
                    self.ctx.kv_cache_seq_pos_max(slot),
                );
                if max < 0 { 0 } else { (max - min + 1) as u64 }
            })
            .sum();
        // A sequence whose cells were just freed (it leaves the list next) is neither.
        let holding = || self.sequences.iter().filter(|s| s.slot.is_some());
        let paused = holding().filter(|s| s.is_paused()).count();
        let running = holding().filter(|s| s.decodes()).count();
        let stats = &self.stats;
        stats.kv_cells(own, llama);
        stats
            .sequences_running
            .store(running as u64, Ordering::SeqCst);
        stats
            .sequences_paused
            .store(paused as u64, Ordering::SeqCst);
        stats
            .requests_queued
            .store(self.queue.len() as u64, Ordering::SeqCst);
    }

    /// Waits until there is something to do: a request, a waiting client gone, room in a
    /// paused sequence's gate (or its end), an explicit stop.
    async fn wait(&mut self) {
        poll_fn(|cx| {
            if !self.closed {
                match self.incoming.poll_recv(cx) {
                    Poll::Ready(Some(admission)) => {
                        self.queue.push_back(admission);
                        return Poll::Ready(());
                    }
                    Poll::Ready(None) => {
                        self.closed = true;
                        return Poll::Ready(());
                    }
                    Poll::Pending => {}
                }
            }
            let left = self.queue.iter_mut().any(|a| a.poll_woken(cx));
            let woken = self.sequences.iter_mut().any(|s| s.poll_woken(cx));
            if left || woken {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }
}
