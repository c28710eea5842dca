//! A whole answer in one body: a generation collected into one `chat.completion`, Messages
//! message or Responses response, for a request that asked for no stream.

use std::fmt::Write;
use std::sync::Arc;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use streamgate::openai::{ChatCompletion, CompletionChoice, Message, Usage};

use super::delta::Delta;
use super::format::{Ending, FinishReason, Format};
use super::meta::Meta;
use super::request::Request;
use super::state::Server;
use super::text::Text;
use super::worker::Job;
use super::{messages, responses, stream};

/// Has the worker generate `request` for `meta` and answers with the whole answer in the
/// stream's format (named by its request id, as a stream is). The id is claimed while the
/// answer is made, so one id names one generation here too, and `POST .../cancel` stops it
/// (the answer then ends with `finish_reason` `stop`); a client that closes its connection
/// drops the generation.
pub(super) async fn answer(server: &Arc<Server>, meta: Arc<Meta>, request: Request) -> Response {
    let mut claim = match stream::claim(server, &meta.stream).await {
        Ok(claim) => claim,
        Err(refused) => return refused,
    };
    let job = Job {
        meta: meta.clone(),
        request,
        skip: 0,
        stop: claim.stop_signal(),
    };
    let events = match server.worker.start(&server.host, job) {
        Ok(events) => events,
        Err(refusal) => return refusal.response(meta.format),
    };
    let mut text = String::new();
    let mut ending = None;
    let mut failed = None;
    let mut events = std::pin::pin!(events);
    while let Some(item) =
        std::future::poll_fn(|cx| futures_core::Stream::poll_next(events.as_mut(), cx)).await
    {
        match item {
            Ok(event) => match event.into_chunk() {
                Delta::Text { text: run, .. } => {
                    let _ = write!(text, "{run}");
                }
                Delta::Frame { frame, .. } => ending = frame.ending().cloned().or(ending),
                Delta::Error { message, code, .. } => failed = Some((message, code)),
            },
            Err(error) => {
                // The KV pool ran out mid-generation: busy, not broken (a retry may find room).
                let (status, body) = match failed {
                    Some((message, code)) => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        failure(meta.format, &message, code),
                    ),
                    None => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        meta.format
                            .error_body("server_error", &error.to_string(), None),
                    ),
                };
                return json_body(status, body, &meta);
            }
        }
    }
    drop(claim);
    let ending = ending.unwrap_or(Ending {
        text: Text::decoded(String::new(), 0),
        prompt: 0,
        reason: FinishReason::Length,
    });
    let body = match meta.format {
        Format::Chat => completion(&meta, text, &ending),
        Format::Messages => messages::message(&meta, text, &ending),
        Format::Responses => responses::body(&meta, &ending),
    };
    json_body(StatusCode::OK, body, &meta)
}

/// The `chat.completion` of `text`.
fn completion(meta: &Meta, text: String, ending: &Ending) -> String {
    let (prompt, tokens) = (ending.prompt, ending.made());
    let usage = Usage {
        prompt_tokens: prompt,
        completion_tokens: tokens,
        total_tokens: prompt + tokens,
        ..Usage::default()
    };
    ChatCompletion::new(meta.id.as_str(), meta.created, meta.model.as_str())
        .with_choice(CompletionChoice::new(
            0,
            Message::assistant(text),
            ending.reason.as_str(),
        ))
        .with_usage(usage)
        .to_json()
}

/// The body of a generation that failed with `message` (`code`): chat's and Responses'
/// `server_error` with its code, Messages' `overloaded_error`.
fn failure(format: Format, message: &str, code: &str) -> String {
    match format {
        Format::Chat | Format::Responses => format.error_body("server_error", message, Some(code)),
        Format::Messages => format.error_body(messages::ERROR_KIND, message, None),
    }
}

/// A response of `status` with a JSON `body`, named by `meta`'s request id.
fn json_body(status: StatusCode, body: String, meta: &Meta) -> Response {
    let mut response = (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    stream::named(&mut response, &meta.stream);
    response
}
