//! A fake OpenAI-compatible provider that fails the ways providers fail, scripted per test: a
//! real HTTP/1.1 server (hyper) on 127.0.0.1, over TCP or TLS, answering
//! `POST .../chat/completions` and `.../completions` with a [`Behaviour`] that a [`Script`]
//! chooses per request (always one, a queue, per model, any function of the [`Attempt`]), and
//! recording every request first (arrival on tokio's monotonic clock, path, model, headers,
//! body, connection) so a test can count the attempts that reached it and the gaps between
//! them.
//!
//! ```ignore
//! let provider = Provider::start(Script::queue([Behaviour::status(500)], Behaviour::ok())).await;
//! // ... a proxy in front of provider.url() ...
//! provider.until("a retry", |p| p.attempt_count() == 2).await;
//! assert!(provider.gaps()[0] >= Duration::from_millis(10));
//! ```

// Each test binary uses a part of what is re-exported here.
#![allow(unused_imports)]

mod attempt;
mod behaviour;
mod script;
mod server;

pub use attempt::Attempt;
pub use behaviour::{
    Answer, Behaviour, DEFAULT_TOKENS, DONE_EVENT, ERROR_EVENT, Endpoint, ErrorCode, Failure,
    INVALID_EVENT, PROMPT_TOKENS, RetryAfter, Step, Stream,
};
pub use script::Script;
pub use server::Provider;
