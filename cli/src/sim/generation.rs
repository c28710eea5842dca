//! One generation behind its gate: the simulated decode loop, from its first KV block to its
//! release (or to the process's end, with `--die-after`).

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use streamgate::probe::Observation;
use streamgate::{BoxError, Consumer, EndReason, Kind, Sender};
use tokio_util::sync::CancellationToken;

use super::delta::{Delta, Frame};
use super::format::{Ending, FinishReason};
use super::kv::{KvBlocks, KvFull};
use super::meta::Meta;
use super::request::Start;
use super::state::Sim;
use crate::hop_end::Following;

/// Which tokens a generation makes, and the id of its first event.
#[derive(Debug, Clone)]
pub(super) struct Output {
    /// Token indices: token i's text is `t{i} `.
    pub(super) tokens: Range<u64>,
    /// The id of the stream's first event (the first token's in chat completions; the events
    /// a format puts before the tokens come first); every other event follows, one id each.
    pub(super) first_id: u64,
}

impl Output {
    /// An answer of `max_tokens` new tokens from `start`: a new one is tokens
    /// `0..max_tokens`, a continuation from token k is tokens `k..k + max_tokens`; either way
    /// its events count from 0.
    pub(super) fn new(start: Start, max_tokens: u64) -> Self {
        let from = match start {
            Start::New => 0,
            Start::Continue { from, .. } => from,
        };
        Output {
            tokens: from..from.saturating_add(max_tokens),
            first_id: 0,
        }
    }

    /// Tokens `from..max_tokens` of an answer regenerated after event `from - 1`: token i is
    /// event i, as in the answer it stands for.
    pub(super) fn from_token(from: u64, max_tokens: u64) -> Self {
        Output {
            tokens: from..max_tokens,
            first_id: from,
        }
    }
}

/// Starts one generation of `output`'s tokens for `meta`'s stream, gated as configured, that
/// `stop` (an explicit stop under the stream's name) ends with a final chunk and `[DONE]`. Its
/// first KV block is taken here: when every block is held by other streams, nothing starts.
pub(super) fn generate(
    sim: &Arc<Sim>,
    meta: Arc<Meta>,
    output: Output,
    stop: CancellationToken,
) -> Result<Consumer<Delta>, KvFull> {
    let mut blocks = sim.kv.holding();
    if !output.tokens.is_empty() {
        blocks
            .room_for(0)
            .inspect_err(|_| sim.stats.refused_kv_full())?;
    }
    sim.stats.streams.start();
    let on_release = {
        let sim = sim.clone();
        // The generator, and the KV blocks it holds, are gone by now.
        move |reason: EndReason, gate: streamgate::GateStats| sim.stats.released(reason, &gate)
    };
    let first_id = output.first_id;
    let worker = Worker {
        sim: sim.clone(),
        meta,
        output,
        stop,
        blocks,
    };
    let config = &sim.config;
    Ok(config
        .gate
        .gate(&config.resume)
        .first_id(first_id)
        .group(&sim.streams)
        .on_release(on_release)
        .spawn(move |_, tx| worker.run(tx)))
}

/// The generator of one stream: decodes a token every `--step-ms`, holding a KV block per 16.
struct Worker {
    sim: Arc<Sim>,
    meta: Arc<Meta>,
    output: Output,
    /// The explicit stop (`POST .../cancel`): finish with `stop`.
    stop: CancellationToken,
    /// Given back when the worker is dropped (every end), or at once when the pool runs out.
    blocks: KvBlocks,
}

/// The worker's two hops. Each records how the stream ended; if the generation stops for the
/// gate's end (its send refused, or the generation dropped), as the gate ended it.
struct Hops {
    decode: Following,
    publish: Following,
}

impl Hops {
    fn end(&mut self, reason: EndReason) {
        self.decode.end(reason);
        self.publish.end(reason);
    }
}

impl Worker {
    async fn run(mut self, mut tx: Sender<Delta>) -> Result<(), BoxError> {
        let config = &self.sim.config;
        let stream = self.meta.stream.as_str();
        let mut hops = Hops {
            decode: Following::new(self.sim.decode.recorder(stream), tx.handle()),
            publish: Following::new(self.sim.publish.recorder(stream), tx.handle()),
        };
        // What a diagnosis slices the worker's records by (`diagnose --by model`).
        let attrs = [
            ("model", self.meta.model.as_str()),
            ("api", self.meta.format.name()),
        ];
        hops.decode.attrs(&attrs);
        hops.publish.attrs(&attrs);
        let gone = |_| "the stream ended";
        let mut finish = FinishReason::Length;
        let Output { tokens, first_id } = self.output.clone();
        let format = self.meta.format;
        // The gate numbers the events as they are sent: the next one is `id`.
        let mut id = first_id;
        for frame in Frame::opening(format) {
            let meta = self.meta.clone();
            tx.send(Delta::Frame { meta, frame, id })
                .await
                .map_err(gone)?;
            id += 1;
        }
        let (from, first_token_id) = (tokens.start, id);
        let mut len = 0;
        for i in tokens {
            // How many tokens this generation has made.
            let made = i - from;
            if config.stall_at == Some(i) {
                // `--stall-at` comes with `--stall-ms`.
                self.pause(config.stall.unwrap_or_default()).await;
            }
            if !config.step.is_zero() {
                self.pause(config.step).await;
            }
            // A step after the last token made: a client that keeps up has it.
            self.die_if_made(made);
            if self.stop.is_cancelled() {
                finish = FinishReason::Stop;
                break;
            }
            if let Err(full) = self.blocks.room_for(made) {
                hops.end(EndReason::GeneratorError);
                // Other streams hold the rest of the pool: this one stops, gives its blocks
                // back at once, and says why before the gate's end.
                let blocks = self.blocks.give_back();
                self.sim.stats.kv_exhausted();
                let message = format!(
                    "{full}: the generation stopped after {made} tokens and gave back the \
                     blocks it held ({blocks})"
                );
                let error = Delta::Error {
                    meta: self.meta.clone(),
                    message: message.clone(),
                    code: "kv_cache_exhausted",
                    id,
                };
                let _ = tx.send(error).await;
                return Err(message.into());
            }
            self.sim.stats.generated();
            let token_len = self.meta.token_len(i);
            // The hop records' seq is the event id.
            let observed = Observation::new(Some(id), token_len as u64, Kind::Visible);
            hops.decode.observe(observed);
            let token = Delta::Text {
                meta: self.meta.clone(),
                from: i,
                to: i,
                len: token_len,
                id,
            };
            tx.send(token).await.map_err(gone)?;
            hops.publish.observe(observed);
            id += 1;
            len += token_len;
        }
        let made = id - first_token_id;
        if finish == FinishReason::Length && config.die_after == Some(made) {
            // Every token asked for was made: dies before the final events, a step after the
            // last token.
            tokio::time::sleep(config.step).await;
            self.die_if_made(made);
        }
        // A stop asked for is the stream cancelled (a gate that ended first is recorded as it
        // ended, by `Hops`).
        let ended = match finish {
            FinishReason::Stop => EndReason::Cancelled,
            FinishReason::Length => EndReason::Completed,
        };
        hops.end(ended);
        let ending = Ending {
            tokens: from..from + made,
            len,
            reason: finish,
        };
        for frame in Frame::closing(format, &ending) {
            let meta = self.meta.clone();
            tx.send(Delta::Frame { meta, frame, id })
                .await
                .map_err(gone)?;
            id += 1;
        }
        Ok(())
    }

    /// With `--die-after N`, when this generation has made N tokens: the process dies at once,
    /// as if killed (SIGKILL: no shutdown frames, nothing flushed), for failover tests.
    fn die_if_made(&self, made: u64) {
        if self.sim.config.die_after == Some(made) {
            eprintln!("sim: --die-after {made}: a generation made {made} tokens; dying now");
            // SAFETY: `kill` and `getpid` have no memory preconditions; SIGKILL ends the
            // process here.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            std::process::abort();
        }
    }

    /// Waits `duration`, or until the stream is stopped.
    async fn pause(&self, duration: Duration) {
        tokio::select! {
            () = tokio::time::sleep(duration) => {}
            () = self.stop.cancelled() => {}
        }
    }
}
