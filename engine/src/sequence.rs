//! One request in the engine loop: what the server handed the engine for it (an
//! [`Admission`]), and once it has a slot of the KV cache (a [`Sequence`]) the tokens it has
//! decoded, its sampler, its text on the way to whole characters and past stop sequences, and
//! the events its gate has not taken yet.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::task::Context;
use std::time::Instant;

use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use streamgate::probe::Observation;
use streamgate::{EndReason, Kind, Sender, TrySendError};
use streamgate_cli::serve::{Delta, Ending, FinishReason, Frame, Hops, Host, Meta, Sampling, Text};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::sampler::{EndTokens, sampler};
use crate::stop::{Found, Stops};
use crate::utf8::Utf8Pieces;

/// A generation the server handed the engine: its prompt, bounds and sampling, and its gate.
pub struct Admission {
    pub meta: Arc<Meta>,
    /// The prompt's tokens (fewer than a slot holds).
    pub prompt: Vec<LlamaToken>,
    /// The most tokens the answer may have (what the request asked, within the slot).
    pub max_tokens: u64,
    pub sampling: Sampling,
    /// The explicit stop (`POST .../cancel`).
    pub stop: CancellationToken,
    /// The gate's sender: the engine never awaits it.
    pub tx: Sender<Delta>,
    /// Completes when the gate has ended (the client left while the request waited).
    pub ended: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Completes at the explicit stop.
    pub stopped: Pin<Box<WaitForCancellationFutureOwned>>,
    pub hops: Hops,
    /// The server's side: the engine counts the tokens it makes there.
    pub host: Arc<Host>,
    /// The KV cells the engine freed for this generation, for its release hook.
    pub freed: Arc<AtomicU64>,
}

/// Where a sequence is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Its prompt is being decoded: tokens `next..` are still to go.
    Prompt { next: usize },
    /// It decodes its answer: `token` was sampled last and goes into the next step.
    Answer { token: LlamaToken },
    /// Its generation has ended and its KV cells are free; its last events wait for the gate.
    Draining,
}

/// What became of a sequence's waiting events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The gate took every one.
    Taken,
    /// The gate is full: the sequence is paused until it has room.
    Paused,
    /// The gate has ended: nobody will read the sequence.
    Gone,
}

/// One request in a slot of the KV cache.
pub struct Sequence {
    pub admission: Admission,
    /// Its slot (its llama.cpp sequence id) while it holds cells in one.
    pub slot: Option<i32>,
    phase: Phase,
    /// The positions it holds in its slot (its prompt and answer tokens decoded so far).
    pub cells: u32,
    /// Answer tokens sampled.
    made: u64,
    /// Tokens sampled whose text has not gone into an event yet (a cut character, the start
    /// of a stop sequence).
    unsaid: u64,
    sampler: LlamaSampler,
    utf8: Utf8Pieces,
    stops: Stops,
    /// The answer's text sent so far (what its last events repeat).
    said: String,
    /// The next event's id.
    next_id: u64,
    /// Events the gate has not taken yet, each with what `worker.publish` records of it.
    outbox: VecDeque<(Delta, Option<Observation>)>,
    /// A failed generation's error, given to the gate once its events are out.
    failed: Option<String>,
}

impl Sequence {
    /// `admission` in `slot` (none: it is answered without decoding, stopped while it waited)
    /// of a model whose end-of-generation tokens are `ends`, its format's opening events
    /// waiting for the gate.
    pub fn new(admission: Admission, slot: Option<i32>, ends: &EndTokens) -> Self {
        let mut sequence = Sequence {
            sampler: sampler(&admission.sampling, ends),
            stops: Stops::new(admission.sampling.stop.clone()),
            slot,
            phase: Phase::Prompt { next: 0 },
            cells: 0,
            made: 0,
            unsaid: 0,
            utf8: Utf8Pieces::default(),
            said: String::new(),
            next_id: 0,
            outbox: VecDeque::new(),
            failed: None,
            admission,
        };
        for frame in Frame::opening(sequence.admission.meta.format) {
            sequence.emit(|meta, id| Delta::Frame { meta, frame, id }, None);
        }
        sequence
    }

    /// Whether the next step may take this sequence's tokens: it is generating and its gate
    /// took every event (a paused one waits, its KV kept).
    pub fn decodes(&self) -> bool {
        self.outbox.is_empty() && self.phase != Phase::Draining
    }

    /// Whether its generation is over (its KV cells free, only events left to deliver).
    pub fn is_draining(&self) -> bool {
        self.phase == Phase::Draining
    }

    /// Whether its gate holds back events it has made.
    pub fn is_paused(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// The prompt tokens still to decode, at most `budget` of them, with their positions;
    /// `true` when they finish the prompt (the last one's logits are wanted).
    pub fn prompt_chunk(&self, budget: usize) -> Option<(&[LlamaToken], i32, bool)> {
        let Phase::Prompt { next } = self.phase else {
            return None;
        };
        let prompt = &self.admission.prompt;
        let end = prompt.len().min(next + budget);
        Some((&prompt[next..end], self.cells as i32, end == prompt.len()))
    }

    /// The token its answer decodes next, at its position.
    pub fn answer_token(&self) -> Option<(LlamaToken, i32)> {
        match self.phase {
            Phase::Answer { token } => Some((token, self.cells as i32)),
            _ => None,
        }
    }

    /// A step decoded `tokens` of its tokens into its slot.
    pub fn decoded(&mut self, tokens: usize) {
        self.cells += tokens as u32;
        if let Phase::Prompt { next } = &mut self.phase {
            *next += tokens;
        }
    }

    /// Samples its next token from the step's logits at `index` (the step ended at `at`),
    /// and hands its text on; `slot_tokens` is what its slot holds. Returns why its answer
    /// ended, when it did.
    pub fn sample(
        &mut self,
        ctx: &llama_cpp_2::context::LlamaContext<'_>,
        index: i32,
        at: Instant,
        vocab: &llama_cpp_2::vocab::LlamaVocab<'_>,
        slot_tokens: u32,
    ) -> Option<FinishReason> {
        let token = self.sampler.sample(ctx, index);
        if vocab.is_eog(token) {
            return Some(FinishReason::Stop);
        }
        self.made += 1;
        self.unsaid += 1;
        self.admission.host.generated(1);
        let piece = vocab.token_to_piece(token, false, None);
        let text = self.utf8.push(&piece);
        let found = self.stops.push(&text);
        let (Found::Text(text) | Found::Stop(text)) = &found;
        self.emit_text(text.clone(), at);
        if matches!(found, Found::Stop(_)) {
            return Some(FinishReason::StopSequence);
        }
        if self.made >= self.admission.max_tokens || self.cells >= slot_tokens {
            return Some(FinishReason::Length);
        }
        self.phase = Phase::Answer { token };
        None
    }

    /// Its answer ended for `reason` (its KV cells already freed by the engine): the text
    /// still held back goes out, then its format's last events. An explicit stop is the
    /// stream cancelled; any other end completes it.
    pub fn finish(&mut self, reason: FinishReason, at: Instant) {
        let mut rest = self.utf8.finish();
        if reason == FinishReason::StopSequence {
            // What followed the stop sequence is not part of the answer.
            rest.clear();
        } else {
            let held = self.stops.finish();
            rest.insert_str(0, &held);
        }
        self.emit_text(rest, at);
        let ended = match self.admission.stop.is_cancelled() {
            true => EndReason::Cancelled,
            false => EndReason::Completed,
        };
        self.admission.hops.end(ended);
        let ending = Ending {
            text: Text::decoded(std::mem::take(&mut self.said), self.made),
            prompt: self.admission.prompt.len() as u64,
            reason,
        };
        for frame in Frame::closing(self.admission.meta.format, &ending) {
            self.emit(|meta, id| Delta::Frame { meta, frame, id }, None);
        }
        self.phase = Phase::Draining;
    }

    /// Its generation failed (`message`): an error event in its format's shape, then the
    /// gate's end as a generator error.
    pub fn fail(&mut self, message: String, code: &'static str) {
        self.admission.hops.end(EndReason::GeneratorError);
        let error = message.clone();
        self.emit(
            |meta, id| Delta::Error {
                meta,
                message: error,
                code,
                id,
            },
            None,
        );
        self.failed = Some(message);
        self.phase = Phase::Draining;
    }

    /// Offers the gate its waiting events, in order, until it is full. Once the gate has
    /// ended, only text is offered, once (the gate counts a token made for nobody), and the
    /// rest is let go.
    pub fn deliver(&mut self) -> Delivery {
        while let Some((delta, observed)) = self.outbox.pop_front() {
            if self.admission.tx.is_closed() && !matches!(delta, Delta::Text { .. }) {
                self.outbox.clear();
                return Delivery::Gone;
            }
            match self.admission.tx.try_send(delta) {
                Ok(()) => {
                    if let Some(observed) = observed {
                        self.admission.hops.publish.observe(observed);
                    }
                }
                Err(TrySendError::Full(delta)) => {
                    self.outbox.push_front((delta, observed));
                    return Delivery::Paused;
                }
                Err(TrySendError::Ended(_)) => {
                    self.outbox.clear();
                    return Delivery::Gone;
                }
            }
        }
        Delivery::Taken
    }

    /// Whether its gate has ended (the engine's own `finish` consumes the sequence, so this
    /// is the client gone, a policy's end, a shutdown).
    pub fn is_gone(&self) -> bool {
        self.admission.tx.is_closed()
    }

    /// Ends its stream once every event is out: complete, or failed with its error.
    pub fn end(self) {
        let Sequence {
            admission, failed, ..
        } = self;
        match failed {
            Some(message) => admission.tx.abort(message),
            None => admission.tx.finish(),
        }
    }

    /// Whether something it waits for has come: room in its gate (or its end) while paused,
    /// or its explicit stop.
    pub fn poll_woken(&mut self, cx: &mut Context<'_>) -> bool {
        let room = self.is_paused() && self.admission.tx.poll_ready(cx).is_ready();
        let stopped = !self.is_draining() && self.admission.stopped.as_mut().poll(cx).is_ready();
        room || stopped
    }

    /// Whether its explicit stop was asked for while it still generates.
    pub fn is_stopped(&self) -> bool {
        !self.is_draining() && self.admission.stop.is_cancelled()
    }

    /// Queues `text` (made by the tokens not said yet) as the answer's next event, recorded
    /// at `worker.decode` as made at `at`; empty text is no event.
    fn emit_text(&mut self, text: String, at: Instant) {
        if text.is_empty() {
            return;
        }
        let tokens = std::mem::take(&mut self.unsaid);
        let observed = Observation::new(Some(self.next_id), text.len() as u64, Kind::Visible);
        self.admission.hops.decode.observe_at(observed, at);
        self.said.push_str(&text);
        let first = self.said.len() == text.len();
        let text = Text::decoded(text, tokens);
        self.emit(
            |meta, id| Delta::Text {
                meta,
                text,
                first,
                id,
            },
            Some(observed),
        );
    }

    /// Queues the event `make` builds from the stream's metadata and the next id.
    fn emit(&mut self, make: impl FnOnce(Arc<Meta>, u64) -> Delta, observed: Option<Observation>) {
        let delta = make(self.admission.meta.clone(), self.next_id);
        self.next_id += 1;
        self.outbox.push_back((delta, observed));
    }
}

impl Admission {
    /// Whether its client left, or it was stopped, while it waited for a slot.
    pub fn poll_woken(&mut self, cx: &mut Context<'_>) -> bool {
        let ended = self.ended.as_mut().poll(cx).is_ready();
        let stopped = self.stopped.as_mut().poll(cx).is_ready();
        ended || stopped
    }
}
