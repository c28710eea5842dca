//! The proxy's test upstreams do what they say, as a plain hyper client (or a raw socket, for
//! how a connection ends) sees them: the fake provider's every behaviour (the bytes of its
//! streams, its error statuses, bodies and `Retry-After`, resets and FINs, silence, late headers
//! and late events) and what it records; its TLS variant verified with its CA and refused
//! without; a `streamgate sim` process killed with SIGKILL, frozen and restarted on its port.

mod common;

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use common::provider::{
    Answer, Behaviour, DEFAULT_TOKENS, DONE_EVENT, Endpoint, ErrorCode, Failure, INVALID_EVENT,
    Provider, RetryAfter, Script, Stream,
};
use common::replica::Replica;
use common::tls::Authority;
use common::{BodyEnd, HANG, LONG, RawResponse};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::CertificateError;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};

const CHAT: &str = "/v1/chat/completions";

/// An HTTP/1.1 connection of hyper's client over `io`.
async fn handshake<I>(io: I) -> SendRequest<Full<Bytes>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http1::handshake(TokioIo::new(io)).await.expect("handshake");
    tokio::spawn(connection);
    sender
}

/// A connection to `addr`.
async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    handshake(TcpStream::connect(addr).await.expect("connect")).await
}

/// `POST path` of a completion request for `model`, `max_tokens` tokens, streamed or not.
fn completion(path: &str, model: &str, max_tokens: u64, streamed: bool) -> Request<Full<Bytes>> {
    let body = format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}],"stream":{streamed},"max_tokens":{max_tokens}}}"#
    );
    Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-test")
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// A streamed chat completion request for `model` and `max_tokens` tokens.
fn chat(model: &str, max_tokens: u64) -> Request<Full<Bytes>> {
    completion(CHAT, model, max_tokens, true)
}

/// Sends `request` on a new connection to `addr`; the response head.
async fn send(addr: SocketAddr, request: Request<Full<Bytes>>) -> Response<Incoming> {
    let mut sender = connect(addr).await;
    timeout(HANG, sender.send_request(request))
        .await
        .expect("a response in time")
        .expect("a response")
}

/// The body's bytes, and whether it ended cleanly.
async fn body(response: Response<Incoming>) -> (String, Result<(), hyper::Error>) {
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    loop {
        match timeout(HANG, body.frame()).await.expect("a frame in time") {
            None => break (String::from_utf8(bytes).unwrap(), Ok(())),
            Some(Err(error)) => break (String::from_utf8(bytes).unwrap(), Err(error)),
            Some(Ok(frame)) => bytes.extend_from_slice(frame.data_ref().unwrap()),
        }
    }
}

/// The body of a response that must end cleanly.
async fn whole(response: Response<Incoming>) -> String {
    let (text, end) = body(response).await;
    end.expect("the body ends cleanly");
    text
}

/// The header's value, if any.
fn header<'a>(response: &'a Response<Incoming>, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

/// The `data:` values of an SSE body.
fn events(body: &str) -> Vec<&str> {
    body.split_terminator("\n\n")
        .map(|event| event.strip_prefix("data: ").expect("a data event"))
        .collect()
}

/// The answer `provider` gives to chat request number `attempt` of `model`.
fn answer_of(provider: &Provider, attempt: u64, model: &str, tokens: u64) -> Answer {
    Answer {
        endpoint: Endpoint::Chat,
        id: format!("chatcmpl-{}-{attempt}", provider.addr().port()),
        model: model.to_owned(),
        tokens,
    }
}

#[tokio::test]
async fn a_stream_is_the_tokens_then_the_final_chunk_then_done() {
    let provider = Provider::start(Behaviour::ok()).await;
    let response = send(provider.addr(), chat("m", 3)).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(&response, "content-type"), Some("text/event-stream"));
    assert_eq!(header(&response, "transfer-encoding"), Some("chunked"));
    let id = format!("chatcmpl-{}-1", provider.addr().port());
    let expected = format!(
        concat!(
            "data: {{\"id\":\"{id}\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"t0 \"}},\"finish_reason\":null}}]}}\n\n",
            "data: {{\"id\":\"{id}\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t1 \"}},\"finish_reason\":null}}]}}\n\n",
            "data: {{\"id\":\"{id}\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t2 \"}},\"finish_reason\":null}}]}}\n\n",
            "data: {{\"id\":\"{id}\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":3,\"total_tokens\":4}}}}\n\n",
            "data: [DONE]\n\n",
        ),
        id = id
    );
    assert_eq!(whole(response).await, expected);

    let attempts = provider.attempts();
    assert_eq!(attempts.len(), 1);
    let attempt = &attempts[0];
    assert_eq!(
        (attempt.number, attempt.connection, attempt.method.as_str()),
        (1, 1, "POST")
    );
    assert_eq!(
        (attempt.path.as_str(), attempt.model.as_deref()),
        (CHAT, Some("m"))
    );
    assert_eq!(attempt.header("authorization"), Some("Bearer sk-test"));
    assert!(attempt.streamed());
    assert_eq!(attempt.max_tokens(), Some(3));
    assert_eq!(attempt.json().unwrap()["messages"][0]["content"], "hi");
}

#[tokio::test]
async fn each_model_gets_its_own_model_and_every_api_its_shape() {
    let provider = Provider::start(Behaviour::ok()).await;
    let port = provider.addr().port();

    // The model is the request's: a fallback's answer names the fallback.
    let text = whole(send(provider.addr(), chat("small", 2)).await).await;
    let chunks: Vec<serde_json::Value> = events(&text)[..3]
        .iter()
        .map(|event| serde_json::from_str(event).unwrap())
        .collect();
    assert!(chunks.iter().all(|chunk| chunk["model"] == "small"));
    assert_eq!(chunks[2]["usage"]["completion_tokens"], 2);

    // Legacy completions, behind a path prefix (which is recorded as sent).
    let response = send(
        provider.addr(),
        completion("/openai/v1/completions", "m", 2, true),
    )
    .await;
    let id = format!("cmpl-{port}-2");
    let expected = format!(
        concat!(
            "data: {{\"id\":\"{id}\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"text\":\"t0 \",\"finish_reason\":null}}]}}\n\n",
            "data: {{\"id\":\"{id}\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"text\":\"t1 \",\"finish_reason\":null}}]}}\n\n",
            "data: {{\"id\":\"{id}\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"text\":\"\",\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}}}}\n\n",
            "data: [DONE]\n\n",
        ),
        id = id
    );
    assert_eq!(whole(response).await, expected);
    assert_eq!(provider.attempts()[1].path, "/openai/v1/completions");

    // Unstreamed: one JSON completion.
    let response = send(provider.addr(), completion(CHAT, "m", 2, false)).await;
    assert_eq!(header(&response, "content-type"), Some("application/json"));
    let expected = format!(
        "{{\"id\":\"chatcmpl-{port}-3\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"t0 t1 \"}},\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}}}}"
    );
    let length = expected.len().to_string();
    assert_eq!(header(&response, "content-length"), Some(length.as_str()));
    assert_eq!(whole(response).await, expected);

    // Another path (a health check): `{}`. No max_tokens: DEFAULT_TOKENS.
    let health = Request::get("/health")
        .header("host", "x")
        .body(Full::default())
        .unwrap();
    let response = send(provider.addr(), health).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(whole(response).await, "{}");
    let unbounded = Request::post(CHAT)
        .header("host", "x")
        .body(Full::new(Bytes::from(r#"{"model":"m","stream":true}"#)))
        .unwrap();
    let text = whole(send(provider.addr(), unbounded).await).await;
    assert_eq!(events(&text).len() as u64, DEFAULT_TOKENS + 2);
}

#[tokio::test]
async fn rate_limits_say_when_to_come_back_or_not() {
    let script = Script::queue(
        [
            Failure::new(429).retry_after(RetryAfter::Seconds(2)).into(),
            Failure::new(429)
                .retry_after(RetryAfter::DateIn(Duration::from_secs(3)))
                .into(),
            Behaviour::status(429),
            Failure::new(503)
                .retry_after(RetryAfter::Raw("soon"))
                .into(),
        ],
        Behaviour::ok(),
    );
    let provider = Provider::start(script).await;

    let response = send(provider.addr(), chat("m", 1)).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&response, "retry-after"), Some("2"));
    assert_eq!(header(&response, "content-type"), Some("application/json"));
    let expected = r#"{"error":{"message":"Rate limit reached for requests.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
    assert_eq!(whole(response).await, expected);

    let before = SystemTime::now();
    let response = send(provider.addr(), chat("m", 1)).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let date = httpdate::parse_http_date(header(&response, "retry-after").unwrap()).unwrap();
    // A whole second at or after the answer's now + 3 s: after the request's (truncated) now.
    let after = date
        .duration_since(before - Duration::from_secs(1))
        .unwrap();
    assert!(after >= Duration::from_secs(3), "{after:?}");
    assert!(after <= Duration::from_secs(3) + HANG, "{after:?}");

    let response = send(provider.addr(), chat("m", 1)).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&response, "retry-after"), None);

    let response = send(provider.addr(), chat("m", 1)).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&response, "retry-after"), Some("soon"));

    assert_eq!(send(provider.addr(), chat("m", 1)).await.status(), 200);
    assert_eq!(provider.attempt_count(), 5);
}

#[tokio::test]
async fn errors_carry_openai_shaped_bodies() {
    let cases = [
        (400, ErrorCode::None, "invalid_request_error", None, None),
        (
            401,
            ErrorCode::InvalidApiKey,
            "invalid_request_error",
            None,
            Some("invalid_api_key"),
        ),
        (403, ErrorCode::None, "invalid_request_error", None, None),
        (
            404,
            ErrorCode::ModelNotFound,
            "invalid_request_error",
            None,
            Some("model_not_found"),
        ),
        (413, ErrorCode::None, "invalid_request_error", None, None),
        (422, ErrorCode::None, "invalid_request_error", None, None),
        (500, ErrorCode::None, "server_error", None, None),
        (502, ErrorCode::None, "server_error", None, None),
        (503, ErrorCode::None, "server_error", None, None),
        (504, ErrorCode::None, "server_error", None, None),
    ];
    let provider = Provider::start(Script::from_fn(|attempt| {
        Behaviour::status(attempt.model.as_deref().unwrap().parse().unwrap())
    }))
    .await;
    for (status, code, kind, param, code_text) in cases {
        assert_eq!(Failure::new(status).code, code);
        let response = send(provider.addr(), chat(&status.to_string(), 1)).await;
        assert_eq!(response.status(), status);
        assert_eq!(header(&response, "retry-after"), None);
        let json: serde_json::Value = serde_json::from_str(&whole(response).await).unwrap();
        let error = &json["error"];
        assert_eq!(error["type"], kind, "{status}");
        assert_eq!(error["param"].as_str(), param, "{status}");
        assert_eq!(error["code"].as_str(), code_text, "{status}");
        assert!(error["message"].as_str().unwrap().len() > 3, "{status}");
    }
    let plain = r#"{"error":{"message":"503 Service Unavailable","type":"server_error","param":null,"code":null}}"#;
    assert_eq!(Failure::new(503).body(), plain);

    // What the request itself got wrong.
    let refusals = [
        (ErrorCode::ContextLengthExceeded, Some("messages")),
        (ErrorCode::ContentPolicyViolation, None),
        (ErrorCode::InvalidValue, Some("temperature")),
    ];
    let provider = Provider::start(Script::queue(
        refusals.map(|(code, _)| Failure::new(400).code(code).into()),
        Behaviour::ok(),
    ))
    .await;
    for (code, param) in refusals {
        let response = send(provider.addr(), chat("m", 1)).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let json: serde_json::Value = serde_json::from_str(&whole(response).await).unwrap();
        assert_eq!(json["error"]["code"].as_str(), code.as_str());
        assert_eq!(json["error"]["param"].as_str(), param);
        assert_eq!(json["error"]["type"], "invalid_request_error");
    }
    let context = r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
    assert_eq!(
        Failure::new(400)
            .code(ErrorCode::ContextLengthExceeded)
            .body(),
        context
    );
}

#[tokio::test]
async fn scripts_go_by_attempt_and_by_model() {
    // 500 once, then OK; the gap between the attempts is recorded.
    let provider = Provider::start(Script::queue([Behaviour::status(500)], Behaviour::ok())).await;
    assert_eq!(send(provider.addr(), chat("m", 1)).await.status(), 500);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(send(provider.addr(), chat("m", 1)).await.status(), 200);
    assert_eq!(send(provider.addr(), chat("m", 1)).await.status(), 200);
    let attempts = provider.attempts();
    assert_eq!(
        attempts.iter().map(|a| a.number).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    let gaps = provider.gaps();
    assert_eq!(gaps.len(), 2);
    assert!(gaps[0] >= Duration::from_millis(100), "{gaps:?}");

    // `a` rate-limited, `b` fine; `c` fails once (its own count), anything else is unknown.
    let provider = Provider::start(Script::per_model(
        [
            ("a", Behaviour::status(429).into()),
            ("b", Behaviour::ok().into()),
            (
                "c",
                Script::queue([Behaviour::status(503)], Behaviour::ok()),
            ),
        ],
        Behaviour::status(404).into(),
    ))
    .await;
    let mut statuses = Vec::new();
    for model in ["b", "c", "a", "c", "a", "b", "x"] {
        statuses.push(
            send(provider.addr(), chat(model, 1))
                .await
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 503, 429, 200, 429, 200, 404]);
    let fine = provider
        .attempts()
        .into_iter()
        .filter(|a| a.model.as_deref() == Some("b"))
        .count();
    assert_eq!(fine, 2);
}

/// Writes a chat request on a raw socket to `addr`, then reads: how the connection ends.
async fn raw_end(addr: SocketAddr) -> std::io::Result<usize> {
    let mut socket = TcpStream::connect(addr).await.unwrap();
    let body = r#"{"model":"m","stream":true}"#;
    socket
        .write_all(&common::post_request(addr, CHAT, "", body))
        .await
        .unwrap();
    let mut buffer = [0u8; 1024];
    timeout(HANG, socket.read(&mut buffer))
        .await
        .expect("an end in time")
}

/// The kind of the I/O error under `error`, if one is.
fn io_kind(error: &(dyn std::error::Error + 'static)) -> Option<ErrorKind> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        cause = error.source();
    }
    None
}

#[tokio::test]
async fn a_reset_is_a_reset_and_a_close_is_a_fin() {
    let provider = Provider::start(Script::queue(
        [Behaviour::Reset, Behaviour::Close, Behaviour::Reset],
        Behaviour::Close,
    ))
    .await;
    let reset = raw_end(provider.addr()).await;
    assert_eq!(reset.map_err(|e| e.kind()), Err(ErrorKind::ConnectionReset));
    assert_eq!(raw_end(provider.addr()).await.unwrap(), 0, "a FIN, no byte");
    // hyper's client: no response either way, a reset then an early end.
    let mut sender = connect(provider.addr()).await;
    let reset = sender.send_request(chat("m", 1)).await.unwrap_err();
    assert_eq!(
        io_kind(&reset),
        Some(ErrorKind::ConnectionReset),
        "{reset:?}"
    );
    let mut sender = connect(provider.addr()).await;
    let closed = sender.send_request(chat("m", 1)).await.unwrap_err();
    assert!(closed.is_incomplete_message(), "{closed:?}");
    // The request was read (and recorded) before the connection went.
    assert_eq!(provider.attempt_count(), 4);
    provider
        .until("the connections closed", |p| p.connections() == 0)
        .await;
    assert_eq!(provider.accepted(), 4);
}

#[tokio::test]
async fn a_silent_provider_holds_the_connection_until_it_stops() {
    let provider = Provider::start(Behaviour::Silent).await;
    let addr = provider.addr();
    let read = tokio::spawn(raw_end(addr));
    provider
        .until("the request", |p| p.attempt_count() == 1)
        .await;
    assert_eq!(provider.connections(), 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!read.is_finished(), "no answer and no close while silent");

    // A client that gives up closes its connection: it is not held.
    let leaving = tokio::spawn(raw_end(addr));
    provider
        .until("the second request", |p| p.attempt_count() == 2)
        .await;
    assert_eq!(provider.connections(), 2);
    leaving.abort();
    provider
        .until("the leaving client's connection closed", |p| {
            p.connections() == 1
        })
        .await;

    provider.stop().await;
    assert_eq!(provider.connections(), 0);
    assert_eq!(read.await.unwrap().unwrap(), 0, "closed at the stop");
    let refused = TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
}

#[tokio::test]
async fn headers_can_come_late_and_events_later() {
    let late = Duration::from_millis(300);
    let provider = Provider::start(Script::queue(
        [Behaviour::after(late, Behaviour::status(503))],
        Stream::new()
            .first_event_after(Duration::from_secs(1))
            .into(),
    ))
    .await;
    let sent = Instant::now();
    let response = send(provider.addr(), chat("m", 1)).await;
    assert!(sent.elapsed() >= late);
    assert_eq!(response.status(), 503);

    // Headers at once; the first event a second later.
    let sent = Instant::now();
    let response = send(provider.addr(), chat("m", 2)).await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let early = timeout(Duration::from_millis(100), body.frame()).await;
    assert!(early.is_err(), "no event before its delay");
    let first = timeout(HANG, body.frame()).await.unwrap().unwrap().unwrap();
    assert!(sent.elapsed() >= Duration::from_secs(1));
    assert!(first.data_ref().unwrap().starts_with(b"data: {"));
}

#[tokio::test]
async fn events_can_be_spaced() {
    let gap = Duration::from_millis(50);
    let provider = Provider::start(Behaviour::Stream(Stream::new().gap(gap))).await;
    let started = Instant::now();
    let text = whole(send(provider.addr(), chat("m", 3)).await).await;
    // Three tokens, the final chunk and [DONE]: four gaps.
    assert!(started.elapsed() >= gap * 4);
    assert_eq!(events(&text).len(), 5);
}

#[tokio::test]
async fn a_stream_can_end_without_done_or_hold_an_invalid_event_or_be_cut() {
    let provider = Provider::start(Script::queue(
        [
            Stream::new().without_done().into(),
            Stream::new().invalid_after(1).into(),
        ],
        Stream::new().cut_after(2).into(),
    ))
    .await;

    // The final chunk, then a clean end (the last HTTP chunk) with no [DONE].
    let text = whole(send(provider.addr(), chat("m", 2)).await).await;
    let answer = answer_of(&provider, 1, "m", 2);
    let expected = format!(
        "data: {}\n\ndata: {}\n\ndata: {}\n\n",
        answer.token_chunk(0),
        answer.token_chunk(1),
        answer.final_chunk()
    );
    assert_eq!(text, expected);
    assert!(!text.contains("[DONE]"));

    // An invalid event between whole ones: the text is still whole.
    let text = whole(send(provider.addr(), chat("m", 3)).await).await;
    let answer = answer_of(&provider, 2, "m", 3);
    let expected = [
        format!("data: {}\n\n", answer.token_chunk(0)),
        INVALID_EVENT.to_owned(),
        format!("data: {}\n\n", answer.token_chunk(1)),
        format!("data: {}\n\n", answer.token_chunk(2)),
        format!("data: {}\n\n", answer.final_chunk()),
        DONE_EVENT.to_owned(),
    ];
    assert_eq!(text, expected.concat());
    let invalid = events(&text)
        .into_iter()
        .filter(|event| *event != "[DONE]")
        .filter(|event| serde_json::from_str::<serde_json::Value>(event).is_err())
        .count();
    assert_eq!(invalid, 1);

    // Cut after two tokens: the body fails, with no final chunk.
    let (text, end) = body(send(provider.addr(), chat("m", 5)).await).await;
    assert!(end.is_err(), "the body fails");
    let answer = answer_of(&provider, 3, "m", 5);
    let expected = format!(
        "data: {}\n\ndata: {}\n\n",
        answer.token_chunk(0),
        answer.token_chunk(1)
    );
    assert_eq!(text, expected);
}

#[tokio::test]
async fn connections_are_reused_and_counted() {
    let provider = Provider::start(Behaviour::ok()).await;
    let mut sender = connect(provider.addr()).await;
    for _ in 0..2 {
        let response = sender.send_request(chat("m", 1)).await.unwrap();
        whole(response).await;
        sender.ready().await.unwrap();
    }
    let attempts = provider.attempts();
    assert_eq!((attempts[0].connection, attempts[1].connection), (1, 1));
    assert_eq!(provider.connections(), 1);
    let _second = connect(provider.addr()).await;
    provider
        .until("a second connection", |p| p.connections() == 2)
        .await;
    drop(sender);
    provider
        .until("the first connection closed", |p| p.connections() == 1)
        .await;
    assert_eq!(provider.accepted(), 2);

    // A client that leaves mid-stream, while the provider waits to send: the connection closes
    // then, not at the next event.
    let slow = Provider::start(Behaviour::Stream(Stream::new().gap(HANG * 2))).await;
    let mut body = send(slow.addr(), chat("m", 3)).await.into_body();
    timeout(HANG, body.frame()).await.unwrap().unwrap().unwrap();
    assert_eq!(slow.connections(), 1);
    drop(body);
    slow.until("the reader's connection closed", |p| p.connections() == 0)
        .await;
}

/// A TLS handshake with `connector` to `addr` under `name`.
async fn tls(
    addr: SocketAddr,
    authority: &Authority,
    name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(name.to_owned()).unwrap();
    authority.connector().connect(name, tcp).await
}

/// Why the client refused the server's certificate, if it did.
fn certificate_error(error: &std::io::Error) -> Option<&CertificateError> {
    match error.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::InvalidCertificate(error) => Some(error),
        _ => None,
    }
}

#[tokio::test]
async fn tls_verifies_with_its_ca_and_fails_without() {
    let authority = Authority::new();
    let provider = Provider::start_tls(Behaviour::ok(), &authority).await;
    assert_eq!(provider.url(), format!("https://{}", provider.addr()));
    let ca = std::fs::read_to_string(authority.ca_file()).unwrap();
    assert_eq!(ca, authority.ca_pem());
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");

    // Trusted, by name and by address: the same provider behind TLS.
    for name in ["localhost", "127.0.0.1"] {
        let stream = tls(provider.addr(), &authority, name).await.unwrap();
        assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
        let mut sender = handshake(stream).await;
        let response = sender.send_request(chat("m", 2)).await.unwrap();
        assert_eq!(response.status(), 200);
        assert!(whole(response).await.ends_with("data: [DONE]\n\n"));
    }
    assert_eq!(provider.attempt_count(), 2);

    // Another authority's trust: refused at the handshake, no request reaches the provider.
    let stranger = Authority::new();
    let refused = tls(provider.addr(), &stranger, "localhost")
        .await
        .unwrap_err();
    assert!(
        matches!(
            certificate_error(&refused),
            Some(CertificateError::UnknownIssuer)
        ),
        "{refused}"
    );

    // The right CA, the wrong name.
    let elsewhere = Authority::for_names(&["upstream.example"]);
    let misnamed = Provider::start_tls(Behaviour::ok(), &elsewhere).await;
    let refused = tls(misnamed.addr(), &elsewhere, "localhost")
        .await
        .unwrap_err();
    assert!(
        matches!(
            certificate_error(&refused),
            Some(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
            )
        ),
        "{refused}"
    );

    // Plain HTTP to a TLS port gets no answer.
    let mut sender = connect(provider.addr()).await;
    assert!(sender.send_request(chat("m", 1)).await.is_err());
    assert_eq!(provider.attempt_count(), 2);
    assert_eq!(misnamed.attempt_count(), 0);

    // The CA file lives as long as its authority.
    let file = stranger.ca_file().to_owned();
    assert!(file.exists());
    drop(stranger);
    assert!(!file.exists());
}

#[tokio::test]
async fn tls_providers_reset_and_close_as_plain_ones_do() {
    let authority = Authority::new();
    let provider = Provider::start_tls(
        Script::queue([Behaviour::Reset], Behaviour::Close),
        &authority,
    )
    .await;
    for _ in 0..2 {
        let stream = tls(provider.addr(), &authority, "localhost").await.unwrap();
        let mut sender = handshake(stream).await;
        assert!(sender.send_request(chat("m", 1)).await.is_err());
    }
    assert_eq!(provider.attempt_count(), 2);
}

#[tokio::test]
async fn a_replica_can_be_killed_frozen_and_restarted_on_its_port() {
    let mut replica = Replica::start(&["--step-ms", "1"]).await;
    let addr = replica.addr();
    assert_eq!(replica.url(), format!("http://{addr}"));
    let body =
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":3}"#;
    let mut response = RawResponse::post_json(addr, CHAT, body).await;
    assert_eq!(response.status(), 200);
    let frames = response.rest().await;
    assert_eq!(
        frames.last().and_then(|frame| common::data(frame)),
        Some("[DONE]")
    );
    assert_eq!(replica.stats().await["streams_completed"], 1);

    // Killed mid-stream: the stream is cut, the port refuses.
    let long = body.replace(r#""max_tokens":3"#, &format!(r#""max_tokens":{LONG}"#));
    let mut response = RawResponse::post_json(addr, CHAT, &long).await;
    assert_eq!(response.status(), 200);
    response.expect_event().await;
    let pid = replica.pid().unwrap();
    replica.kill().await;
    assert!(!replica.running());
    response.rest().await;
    assert_eq!(response.ended(), Some(BodyEnd::Cut));
    let refused = TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);

    // Back on the same port, a new process with fresh stats.
    replica.restart().await;
    assert_eq!(replica.addr(), addr);
    assert_ne!(replica.pid(), Some(pid));
    assert_eq!(replica.stats().await["streams_completed"], 0);
    assert!(replica.output().starts_with("listening on http://"));

    // Frozen: the kernel still accepts, nothing answers until it goes on.
    replica.pause().await;
    let waiting = tokio::spawn(async move {
        let mut response = RawResponse::post_json(addr, CHAT, body).await;
        response.rest().await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "a frozen replica answers nothing");
    replica.resume();
    let events = timeout(HANG, waiting).await.unwrap().unwrap();
    assert_eq!(
        events.last().and_then(|frame| common::data(frame)),
        Some("[DONE]")
    );

    // A restart of a running replica kills it first.
    replica.restart().await;
    assert_eq!(replica.stats().await["streams_completed"], 0);
}

#[tokio::test]
async fn a_restart_waits_for_its_port() {
    let mut replica = Replica::start(&[]).await;
    let addr = replica.addr();
    replica.kill().await;
    // Something else holds the port for a while: the restart tries again until it is free.
    let squatter = std::net::TcpListener::bind(addr).unwrap();
    let release = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(squatter);
    };
    let started = Instant::now();
    tokio::join!(replica.restart(), release);
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(replica.addr(), addr);
    assert_eq!(replica.stats().await["streams_started"], 0);
}
