//! The engine loop: one thread that owns llama.cpp's context and decodes every running
//! sequence together, one `llama_decode` per step (continuous batching). It never awaits a
//! stream: each event goes to its gate with `try_send`; a full gate leaves its sequence out of
//! the next steps (paused, its KV cells kept) while the others go on, and a gate that ended
//! (its client gone, its policy's end, a shutdown) frees its sequence's cells at the next step.
//!
//! A step takes one token from every sequence that decodes its answer, then prompt tokens
//! of sequences that are still reading theirs, up to `--batch-size` in all: a long prompt is
//! read over several steps, between which the others go on decoding (each of those steps is
//! longer, which `worker.decode`'s gaps show). When no sequence can be decoded, the loop waits
//! for a new request, room in a paused sequence's gate, an end or an explicit stop.

use std::collections::{BTreeSet, VecDeque};
use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
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
    /// Slots no sequence holds cells in: a new sequence takes the lowest.
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
            batch: LlamaBatch::new(batch_size as usize, 1),
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
        // In slot order: with a KV stream per slot, llama.cpp puts only sequences with
        // consecutive ids in one micro-batch, so a step in any other order is split into
        // several graph computations (each as slow as the whole step).
        self.sequences
            .sort_unstable_by_key(|s| s.slot.unwrap_or(i32::MAX));
        self.batch.clear();
        // (sequence, tokens it put in the batch, the batch index of its logits)
        let mut taken: Vec<(usize, usize, Option<i32>)> = Vec::new();
        let mut budget = self.batch_size;
        for (i, sequence) in self.sequences.iter().enumerate() {
            if !sequence.decodes() || budget == 0 {
                continue;
            }
            let (Some((token, pos)), Some(slot)) = (sequence.answer_token(), sequence.slot) else {
                continue;
            };
            {
                let index = self.batch.n_tokens();
                self.batch
                    .add(token, pos, &[slot], true)
                    .expect("the batch holds --batch-size tokens");
                taken.push((i, 1, Some(index)));
                budget -= 1;
            }
        }
        for (i, sequence) in self.sequences.iter().enumerate() {
            if !sequence.decodes() || budget == 0 {
                continue;
            }
            let (Some((tokens, pos, last)), Some(slot)) =
                (sequence.prompt_chunk(budget), sequence.slot)
            else {
                continue;
            };
            for (k, &token) in tokens.iter().enumerate() {
                let logits = last && k + 1 == tokens.len();
                self.batch
                    .add(token, pos + k as i32, &[slot], logits)
                    .expect("the batch holds --batch-size tokens");
            }
            let index = last.then(|| self.batch.n_tokens() - 1);
            taken.push((i, tokens.len(), index));
            budget -= tokens.len();
        }
        if taken.is_empty() {
            return false;
        }
        let decoded = self.ctx.decode(&mut self.batch);
        let at = Instant::now();
        self.stats.decode_steps.fetch_add(1, Ordering::Relaxed);
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
        let paused = self.sequences.iter().filter(|s| s.is_paused()).count();
        let running = self.sequences.iter().filter(|s| s.decodes()).count();
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
