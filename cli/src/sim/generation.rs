//! One generation behind its gate: the simulated decode loop, from its first KV block to its
//! release (or to the process's end, with `--die-after`).

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use streamgate::probe::Observation;
use streamgate::{BoxError, EndReason, Kind, Sender};
use tokio_util::sync::CancellationToken;

use super::config::Config;
use super::kv::KvBlocks;
use crate::serve::{Delta, Ending, FinishReason, Frame, Host, Meta, Text};

/// Which tokens a generation makes, the salt of their text, and the id of its first event.
#[derive(Debug, Clone)]
pub(super) struct Output {
    /// Token indices: token i's text is `t{i} ` (`t{i}.{salt} ` salted).
    pub(super) tokens: Range<u64>,
    pub(super) salt: Option<u64>,
    /// The id of the stream's first event (the first token's in chat completions; the events
    /// a format puts before the tokens come first); every other event follows, one id each.
    pub(super) first_id: u64,
}

/// The generator of one stream: decodes a token every `--step-ms`, holding a KV block per 16.
pub(super) struct Generation {
    pub(super) config: Arc<Config>,
    pub(super) host: Arc<Host>,
    pub(super) meta: Arc<Meta>,
    pub(super) output: Output,
    /// The explicit stop (`POST .../cancel`): finish with `stop`.
    pub(super) stop: CancellationToken,
    /// Given back when the worker is dropped (every end), or at once when the pool runs out.
    pub(super) blocks: KvBlocks,
}

impl Generation {
    pub(super) async fn run(mut self, mut tx: Sender<Delta>) -> Result<(), BoxError> {
        let config = &self.config;
        let mut hops = self.host.hops(&self.meta, tx.handle());
        let gone = |_| "the stream ended";
        let mut finish = FinishReason::Length;
        let Output {
            tokens,
            salt,
            first_id,
        } = self.output.clone();
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
                let blocks = self.blocks.exhausted();
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
            self.host.generated(1);
            let text = Text::numbered(i..i + 1, salt);
            // The hop records' seq is the event id.
            let observed = Observation::new(Some(id), text.len() as u64, Kind::Visible);
            hops.decode.observe(observed);
            len += text.len();
            let token = Delta::Text {
                meta: self.meta.clone(),
                text,
                first: i == 0,
                id,
            };
            tx.send(token).await.map_err(gone)?;
            hops.publish.observe(observed);
            id += 1;
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
            FinishReason::Length | FinishReason::StopSequence => EndReason::Completed,
        };
        hops.end(ended);
        let ending = Ending {
            text: Text::Numbered {
                tokens: from..from + made,
                salt,
                len,
            },
            prompt: 0,
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
        if self.config.die_after == Some(made) {
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
