//! The decode loop a server hands its generations to (sim's simulated worker, or a real
//! engine): what it is given for each generation, and what it answers.

use std::sync::Arc;

use serde_json::{Map, Value};
use streamgate::Consumer;
use tokio_util::sync::CancellationToken;

use super::delta::Delta;
use super::host::Host;
use super::meta::Meta;
use super::refusal::Refusal;
use super::request::Request;

/// A decode loop behind the serving code: it starts each generation the server asks for, and
/// reports its own counters in `/stats`.
///
/// The server claims the stream's id, registers the generation in its resume store, encodes
/// and sends its events, and counts its end; the worker makes its events. A worker builds
/// each generation's gate from [`Host::gate`] (the configured bounds, policy and group,
/// which counts the stream and its end), counts its tokens with [`Host::generated`], and
/// records its hops with [`Host::hops`].
pub trait Worker: Send + Sync + 'static {
    /// Starts generating `job`: the consumer of its events, or a refusal before any work
    /// started (every KV block held, a prompt too long for the context).
    ///
    /// # Errors
    ///
    /// The [`Refusal`] the client gets instead of an answer.
    fn start(&self, host: &Arc<Host>, job: Job) -> Result<Consumer<Delta>, Refusal>;

    /// The model a stream reports when its request named none.
    fn model(&self) -> &str;

    /// Adds the worker's own `/stats` fields (its KV memory in use, say) to `fields`.
    fn stats(&self, fields: &mut Map<String, Value>);
}

/// One generation a server asks its worker for.
#[derive(Debug)]
pub struct Job {
    /// What the stream is about: its API, ids, model, and whether it continues a message.
    pub meta: Arc<Meta>,
    /// The request: its conversation, sampling and token bound.
    pub request: Request,
    /// How many of the answer's first tokens the client has: token i is event i, and these
    /// are not sent again (`GET /v1/stream` after `Last-Event-ID: n` asks for n + 1). A
    /// worker that cannot make the same answer again refuses a job that skips any.
    pub skip: u64,
    /// The explicit stop (`POST .../cancel`): the generation ends with its final events.
    pub stop: CancellationToken,
}
