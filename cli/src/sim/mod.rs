//! The reference server: the serving code ([`crate::serve`]: three streaming APIs, ids,
//! resume, cancel, probes, `/stats`) in front of a simulated inference worker. Its interface
//! (flags, endpoints, `/stats`) is described in `examples/README.md`, under "The reference
//! server", and kept exactly: acceptance checks drive it with real clients.
//!
//! ```text
//! streamgate sim --addr 127.0.0.1:0 [flags]
//! cargo run --release --example serve -- --addr 127.0.0.1:0 [flags]    # the same, from the repo
//! ```
//!
//! The worker decodes one token every `--step-ms` (token i's text is `"t{i} "`), optionally
//! stalls before token `--stall-at` for `--stall-ms` (each flag needs the other), and holds one
//! KV block per 16 new tokens from a pool of `--kv-blocks` (at least 1), freed by the gate's
//! release hook on every end. A request whose last message is the assistant's continues it
//! (with `continue_final_message: true` or without, as llama.cpp does): from token k when the
//! message is the text's first k tokens (salted with `--token-salt`, whose salt it keeps), else
//! from 0, as a new stream (events from 0, no role chunk) of `max_tokens` new tokens;
//! `--no-prefill` refuses it with a 400 that mentions prefill. `--die-after N` kills the process
//! (SIGKILL to itself) once a generation has made N tokens, for failover tests.
//!
//! A request whose `max_tokens` needs more blocks than the whole pool is served as many tokens
//! as the pool holds, ending with `finish_reason` `length` (as a real server's context fills);
//! one that finds every block held by other streams is refused with 503 ("KV cache full"); a
//! stream that runs out of blocks mid-generation gives its blocks back, gets an OpenAI-style
//! error event naming the exhausted pool, then the gate's terminal frame, and is counted in
//! `streams_failed` and `streams_kv_exhausted`, not `streams_cancelled`.
//!
//! - `config`: the flags ([`Config`]): the serving code's and the worker's.
//! - `tokens`: the deterministic answer, and which text is its first tokens (to continue it).
//! - `kv`: the KV pool, the blocks one generation holds (given back however it ends), and the
//!   refusal when the pool is full.
//! - `generation`: one generation behind its gate (the tokens it makes, its first event id),
//!   from its first KV block to its release, or to the process's death with `--die-after`.

mod config;
mod generation;
mod kv;
mod tokens;

use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{Map, Value};
use streamgate::Consumer;
use streamgate::transport::TunedListener;

pub use self::config::Config;
use self::generation::{Generation, Output};
use self::kv::KvPool;
pub use self::tokens::answer_text;
use crate::request_id::RequestIds;
use crate::serve::{self, Delta, Host, Job, Refusal, Server, Worker};

/// The `model` of a stream whose request named none.
const MODEL: &str = "streamgate-sim";

/// The simulated worker: its flags and its KV pool.
#[derive(Debug)]
pub struct Sim {
    config: Arc<Config>,
    kv: Arc<KvPool>,
    /// Random salts for `--token-salt`.
    salts: RequestIds,
}

impl Sim {
    /// The worker `config` describes, its pool empty.
    pub fn new(config: Config) -> Self {
        Sim {
            kv: KvPool::new(config.kv_blocks),
            config: Arc::new(config),
            salts: RequestIds::new(""),
        }
    }

    /// The tokens `job` asks for, and their salt: a continuation from the tokens its message
    /// holds (keeping their salt), a `GET /v1/stream` resumed after the tokens its client has
    /// (from the start when it has them all, or more), each bounded by what the KV pool holds.
    fn output(&self, job: &Job) -> Output {
        let asked = job.request.max_tokens.unwrap_or(serve::DEFAULT_MAX_TOKENS);
        let max_tokens = self.kv.servable(asked);
        let salted = self.config.token_salt;
        let (from, salt) = job
            .request
            .continued_text()
            .and_then(|text| tokens::first_tokens(text, salted))
            .unwrap_or((0, None));
        let salt = salt.or_else(|| salted.then(|| self.salts.random()));
        if job.skip > 0 {
            // Token i is event i, as in the answer it stands for.
            let from = Some(job.skip)
                .filter(|&from| from <= max_tokens)
                .unwrap_or(0);
            return Output {
                tokens: from..max_tokens,
                salt,
                first_id: from,
            };
        }
        Output {
            tokens: from..from.saturating_add(max_tokens),
            salt,
            first_id: 0,
        }
    }
}

impl Worker for Sim {
    /// Starts a generation of the tokens `job` asks for. Its first KV block is taken here:
    /// when every block is held by other streams, nothing starts.
    fn start(&self, host: &Arc<Host>, job: Job) -> Result<Consumer<Delta>, Refusal> {
        let output = self.output(&job);
        let mut blocks = self.kv.holding();
        if !output.tokens.is_empty() {
            blocks.first().map_err(|full| full.refusal())?;
        }
        let first_id = output.first_id;
        let generation = Generation {
            config: self.config.clone(),
            host: host.clone(),
            meta: job.meta,
            output,
            stop: job.stop,
            blocks,
        };
        // The generator, and the KV blocks it holds, are gone by the release.
        Ok(host
            .gate(first_id, |_, _| {})
            .spawn(move |_, tx| generation.run(tx)))
    }

    fn model(&self) -> &str {
        MODEL
    }

    fn stats(&self, fields: &mut Map<String, Value>) {
        let kv = self.kv.fields();
        fields.extend(kv.map(|(name, n)| (name.to_owned(), n.into())));
    }
}

/// Binds the listener and builds the app for `config`; the caller serves it.
///
/// # Errors
///
/// When the listener cannot be bound, the hop record file cannot be created, or the resume
/// store's URL is malformed.
pub fn app(
    config: Config,
    prometheus: PrometheusHandle,
) -> Result<(TunedListener, Router, Arc<Server>), String> {
    let serve = config.serve.clone();
    serve::app(serve, Arc::new(Sim::new(config)), prometheus)
}

/// Runs the reference server until SIGINT or SIGTERM: exit status 0 after a clean
/// shutdown, 2 when it could not start.
pub async fn run(config: Config) -> ExitCode {
    let serve = config.serve.clone();
    serve::run("sim", serve, Arc::new(Sim::new(config))).await
}
