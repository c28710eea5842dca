//! A whole answer in one body: a generation collected into one `chat.completion`, for a request
//! that asked for no stream.

use std::fmt::Write;
use std::sync::Arc;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use streamgate::openai::{ApiError, ChatCompletion, CompletionChoice, Message, Usage};

use super::delta::{Delta, FinishReason};
use super::generation::{Output, generate};
use super::meta::Meta;
use super::state::Sim;
use super::stream;

/// Generates `output` for `meta` and answers with the whole `chat.completion` (named by its
/// request id, as a stream is). The id is claimed while the answer is made, so one id names
/// one generation here too, and `POST .../cancel` stops it (the answer then ends with
/// `finish_reason` `stop`); a client that closes its connection drops the generation.
pub(super) async fn answer(sim: &Arc<Sim>, meta: Arc<Meta>, output: Output) -> Response {
    let mut claim = match stream::claim(sim, &meta.stream).await {
        Ok(claim) => claim,
        Err(refused) => return refused,
    };
    let events = match generate(sim, meta.clone(), output, claim.stop_signal()) {
        Ok(events) => events,
        Err(full) => return full.response(),
    };
    let mut text = String::new();
    let mut tokens = 0;
    let mut finish = FinishReason::Length;
    let mut failed = None;
    let mut events = std::pin::pin!(events);
    while let Some(item) =
        std::future::poll_fn(|cx| futures_core::Stream::poll_next(events.as_mut(), cx)).await
    {
        match item {
            Ok(event) => match event.into_chunk() {
                Delta::Text { meta, from, to, .. } => {
                    let _ = write!(text, "{}", meta.tokens(from, to));
                    tokens += to + 1 - from;
                }
                Delta::Finish { reason, .. } => finish = reason,
                Delta::Error { message, code } => failed = Some(Delta::api_error(message, code)),
                Delta::Done => {}
            },
            Err(error) => {
                // The KV pool ran out mid-generation: busy, not broken (a retry may find room).
                let (status, error) = match failed {
                    Some(failed) => (StatusCode::SERVICE_UNAVAILABLE, failed),
                    None => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        ApiError::new(error.to_string(), "server_error"),
                    ),
                };
                return json_body(status, error.to_json(), &meta);
            }
        }
    }
    drop(claim);
    let usage = Usage {
        prompt_tokens: 0,
        completion_tokens: tokens,
        total_tokens: tokens,
        ..Usage::default()
    };
    let completion = ChatCompletion::new(meta.id.as_str(), meta.created, meta.model.as_str())
        .with_choice(CompletionChoice::new(
            0,
            Message::assistant(text),
            finish.as_str(),
        ))
        .with_usage(usage);
    json_body(StatusCode::OK, completion.to_json(), &meta)
}

/// A response of `status` with a JSON `body`, named by `meta`'s request id.
fn json_body(status: StatusCode, body: String, meta: &Meta) -> Response {
    let mut response = (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    stream::named(&mut response, &meta.stream);
    response
}
