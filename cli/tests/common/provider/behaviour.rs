//! What a fake provider does with one request ([`Behaviour`]), and the exact bytes of each
//! answer: the chunks of a stream ([`Answer`]), an error's body and `Retry-After` ([`Failure`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hyper::StatusCode;

/// The number of tokens of an answer to a request without `max_tokens`.
pub const DEFAULT_TOKENS: u64 = 8;
/// `usage.prompt_tokens` of every answer.
pub const PROMPT_TOKENS: u64 = 1;
/// The event of [`Stream::invalid_after`]: its JSON ends in the middle of a string.
pub const INVALID_EVENT: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t\n\n";
/// The last event of a stream (unless [`Stream::without_done`]).
pub const DONE_EVENT: &str = "data: [DONE]\n\n";
/// The event of [`Stream::error_after`]: an overload, in band, as the stream's end.
pub const ERROR_EVENT: &str = "event: error\ndata: {\"error\":{\"message\":\"The server is overloaded\",\"type\":\"server_error\",\"param\":null,\"code\":\"overloaded\"}}\n\n";

/// What the provider does with one request.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// `200`: the request's `max_tokens` tokens (`t0 t1 ...`; [`DEFAULT_TOKENS`] without it) as
    /// SSE chunks shaped by the [`Stream`]; for a request without `"stream": true`, one JSON
    /// completion of the same text ([`Answer::completion`]). A path of neither completions API
    /// (a health check, `/v1/models`) gets `200 {}`.
    Stream(Stream),
    /// An error status with an OpenAI-shaped JSON body ([`Failure`]).
    Error(Failure),
    /// Reads the request, then closes the connection with `SO_LINGER` 0: the client sees a
    /// reset (RST) and no response.
    Reset,
    /// Reads the request, then closes the connection (FIN): no response.
    Close,
    /// Reads the request and never answers: the connection stays open, silent, until the
    /// client closes it or the provider stops (or the test ends).
    Silent,
    /// Waits, then behaves as the inner behaviour (an answer whose headers come late).
    After(Duration, Box<Behaviour>),
}

impl Behaviour {
    /// A whole, prompt stream: [`Stream::new`].
    pub fn ok() -> Behaviour {
        Behaviour::Stream(Stream::new())
    }

    /// `status` with the error body it carries at OpenAI ([`Failure::new`]).
    pub fn status(status: u16) -> Behaviour {
        Behaviour::Error(Failure::new(status))
    }

    /// `then` after `delay`.
    pub fn after(delay: Duration, then: impl Into<Behaviour>) -> Behaviour {
        Behaviour::After(delay, Box::new(then.into()))
    }
}

impl From<Stream> for Behaviour {
    fn from(stream: Stream) -> Behaviour {
        Behaviour::Stream(stream)
    }
}

impl From<Failure> for Behaviour {
    fn from(failure: Failure) -> Behaviour {
        Behaviour::Error(failure)
    }
}

/// The shape of a streamed answer. Headers go at once; events follow with the delays set here.
#[derive(Debug, Clone)]
pub struct Stream {
    first_event_after: Duration,
    gap: Duration,
    done: bool,
    invalid_after: Option<u64>,
    cut_after: Option<u64>,
    error_after: Option<u64>,
    stall_after: Option<(u64, Duration)>,
    tool_call: bool,
    end_after: Duration,
}

impl Default for Stream {
    fn default() -> Stream {
        Stream::new()
    }
}

impl Stream {
    /// Every token's chunk, the final chunk (`finish_reason` and usage), then `data: [DONE]`,
    /// with no wait between them; the body ends cleanly (its last HTTP chunk).
    pub fn new() -> Stream {
        Stream {
            first_event_after: Duration::ZERO,
            gap: Duration::ZERO,
            done: true,
            invalid_after: None,
            cut_after: None,
            error_after: None,
            stall_after: None,
            tool_call: false,
            end_after: Duration::ZERO,
        }
    }

    /// The body's end (its last HTTP chunk) `delay` after its last event, as a server whose
    /// stream ends after its `[DONE]` went out (one whose generator ends on another thread).
    pub fn end_after(self, delay: Duration) -> Stream {
        Stream {
            end_after: delay,
            ..self
        }
    }

    /// How long the body's end follows its last event.
    pub fn ends_after(&self) -> Duration {
        self.end_after
    }

    /// The headers at once, the first event `delay` later (a first-token limit's case).
    pub fn first_event_after(self, delay: Duration) -> Stream {
        Stream {
            first_event_after: delay,
            ..self
        }
    }

    /// `gap` before every event after the first.
    pub fn gap(self, gap: Duration) -> Stream {
        Stream { gap, ..self }
    }

    /// No `data: [DONE]`: the body ends cleanly right after the final chunk.
    pub fn without_done(self) -> Stream {
        Stream {
            done: false,
            ..self
        }
    }

    /// [`INVALID_EVENT`] after `tokens` token chunks (at most all of them), besides them: the
    /// text is still whole.
    pub fn invalid_after(self, tokens: u64) -> Stream {
        Stream {
            invalid_after: Some(tokens),
            ..self
        }
    }

    /// After `tokens` token chunks (at most all of them) the connection fails: the body stops
    /// without its final chunk, `[DONE]` or last HTTP chunk.
    pub fn cut_after(self, tokens: u64) -> Stream {
        Stream {
            cut_after: Some(tokens),
            ..self
        }
    }

    /// After `tokens` token chunks (at most all of them), [`ERROR_EVENT`], and the body ends
    /// cleanly there.
    pub fn error_after(self, tokens: u64) -> Stream {
        Stream {
            error_after: Some(tokens),
            ..self
        }
    }

    /// After `tokens` token chunks (at most all of them), a wait of `stall` before the rest.
    pub fn stall_after(self, tokens: u64, stall: Duration) -> Stream {
        Stream {
            stall_after: Some((tokens, stall)),
            ..self
        }
    }

    /// Token chunks that call a tool (`tool_calls` deltas: the call's id and name first, then
    /// the tokens as its arguments) instead of carrying content.
    pub fn tool_call(self) -> Stream {
        Stream {
            tool_call: true,
            ..self
        }
    }
}

/// Which API a path names, by its end (an upstream URL's path prefix does not change it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `.../chat/completions`: `chat.completion.chunk` and `chat.completion`.
    Chat,
    /// `.../completions`: `text_completion`.
    Completions,
    /// Anything else.
    Other,
}

impl Endpoint {
    /// The API `path` (query included or not) names.
    pub fn of(path: &str) -> Endpoint {
        let path = path.split('?').next().unwrap_or(path);
        if path.ends_with("/chat/completions") {
            Endpoint::Chat
        } else if path.ends_with("/completions") {
            Endpoint::Completions
        } else {
            Endpoint::Other
        }
    }
}

/// One step of a streamed body: wait `after`, then send `event` (`None`: fail the connection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The wait before it.
    pub after: Duration,
    /// A whole event (`data: ...\n\n`), or `None` for the connection's failure.
    pub event: Option<String>,
}

impl Step {
    /// `event` after `after`.
    fn event(after: Duration, event: String) -> Step {
        Step {
            after,
            event: Some(event),
        }
    }
}

/// What a successful answer says: its API, `id`, `model` and number of tokens.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The API asked.
    pub endpoint: Endpoint,
    /// `chatcmpl-PORT-N` (`cmpl-PORT-N` for completions): the provider's port and the
    /// request's [`Attempt::number`](super::attempt::Attempt::number), so a client can tell who answered.
    pub id: String,
    /// The request's model (`fake` without one).
    pub model: String,
    /// The request's `max_tokens` ([`DEFAULT_TOKENS`] without it).
    pub tokens: u64,
}

impl Answer {
    /// The text of `tokens` tokens: `t0 t1 ... t{n-1} ` (each with its trailing space).
    pub fn text(tokens: u64) -> String {
        (0..tokens).map(|i| format!("t{i} ")).collect()
    }

    /// The JSON of the chunk of token `i`; the first also carries the assistant's role:
    /// `{"id":ID,"object":"chat.completion.chunk","created":1,"model":MODEL,"choices":[{"index":0,"delta":{"role":"assistant","content":"t0 "},"finish_reason":null}]}`,
    /// or for completions `{"id":ID,"object":"text_completion","created":1,"model":MODEL,"choices":[{"index":0,"text":"t0 ","finish_reason":null}]}`.
    pub fn token_chunk(&self, i: u64) -> String {
        let choice = match (self.endpoint, i) {
            (Endpoint::Chat, 0) => {
                r#"{"index":0,"delta":{"role":"assistant","content":"t0 "},"finish_reason":null}"#
                    .to_owned()
            }
            (Endpoint::Chat, _) => {
                format!(r#"{{"index":0,"delta":{{"content":"t{i} "}},"finish_reason":null}}"#)
            }
            _ => format!(r#"{{"index":0,"text":"t{i} ","finish_reason":null}}"#),
        };
        format!("{},\"choices\":[{choice}]}}", self.head(Shape::Chunk))
    }

    /// The JSON of the final chunk: `finish_reason` `stop` and the usage, as
    /// `{"id":ID,"object":"chat.completion.chunk","created":1,"model":MODEL,"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":N,"total_tokens":N+1}}`
    /// (completions: `"object":"text_completion"` and `{"index":0,"text":"","finish_reason":"stop"}`).
    pub fn final_chunk(&self) -> String {
        let choice = match self.endpoint {
            Endpoint::Chat => r#"{"index":0,"delta":{},"finish_reason":"stop"}"#,
            _ => r#"{"index":0,"text":"","finish_reason":"stop"}"#,
        };
        format!(
            "{},\"choices\":[{choice}],{}}}",
            self.head(Shape::Chunk),
            self.usage()
        )
    }

    /// The JSON of the whole answer unstreamed: `"object":"chat.completion"` with
    /// `{"index":0,"message":{"role":"assistant","content":TEXT},"finish_reason":"stop"}`
    /// (completions: `"object":"text_completion"`, `{"index":0,"text":TEXT,"finish_reason":"stop"}`),
    /// then the usage; any other endpoint: `{}`.
    pub fn completion(&self) -> String {
        let text = Answer::text(self.tokens);
        let choice = match self.endpoint {
            Endpoint::Chat => format!(
                r#"{{"index":0,"message":{{"role":"assistant","content":"{text}"}},"finish_reason":"stop"}}"#
            ),
            Endpoint::Completions => {
                format!(r#"{{"index":0,"text":"{text}","finish_reason":"stop"}}"#)
            }
            Endpoint::Other => return "{}".to_owned(),
        };
        format!(
            "{},\"choices\":[{choice}],{}}}",
            self.head(Shape::Completion),
            self.usage()
        )
    }

    /// The body of a stream shaped by `stream`, event by event (`data: JSON\n\n` each).
    pub fn steps(&self, stream: &Stream) -> Vec<Step> {
        let at = |n: Option<u64>| n.map(|n| n.min(self.tokens));
        let (invalid_at, cut_at, error_at) = (
            at(stream.invalid_after),
            at(stream.cut_after),
            at(stream.error_after),
        );
        let stall_at = stream
            .stall_after
            .map(|(n, stall)| (n.min(self.tokens), stall));
        let mut steps: Vec<Step> = Vec::new();
        // `sent` token chunks so far: the wait before the next event.
        let wait = |steps: &Vec<Step>, sent: u64| match stall_at {
            Some((at, stall)) if at == sent && !steps.is_empty() => stall,
            _ if steps.is_empty() => stream.first_event_after,
            _ => stream.gap,
        };
        for i in 0..=self.tokens {
            if invalid_at == Some(i) {
                let after = wait(&steps, i);
                steps.push(Step::event(after, INVALID_EVENT.to_owned()));
            }
            if cut_at == Some(i) {
                steps.push(Step {
                    after: Duration::ZERO,
                    event: None,
                });
                return steps;
            }
            if error_at == Some(i) {
                let after = wait(&steps, i);
                steps.push(Step::event(after, ERROR_EVENT.to_owned()));
                return steps;
            }
            if i < self.tokens {
                let chunk = if stream.tool_call {
                    self.tool_chunk(i)
                } else {
                    self.token_chunk(i)
                };
                let after = wait(&steps, i);
                steps.push(Step::event(after, format!("data: {chunk}\n\n")));
            }
        }
        let after = wait(&steps, self.tokens);
        steps.push(Step::event(
            after,
            format!("data: {}\n\n", self.final_chunk()),
        ));
        if stream.done {
            let after = wait(&steps, u64::MAX);
            steps.push(Step::event(after, DONE_EVENT.to_owned()));
        }
        steps
    }

    /// The JSON of the chunk of token `i` of a tool call: the first names the call
    /// (`{"index":0,"id":"call_0","type":"function","function":{"name":"lookup","arguments":"t0 "}}`
    /// in the delta's `tool_calls`, with the assistant's role), the others add `t{i} ` to its
    /// arguments.
    pub fn tool_chunk(&self, i: u64) -> String {
        let call = if i == 0 {
            r#"{"role":"assistant","tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"lookup","arguments":"t0 "}}]}"#.to_owned()
        } else {
            format!(r#"{{"tool_calls":[{{"index":0,"function":{{"arguments":"t{i} "}}}}]}}"#)
        };
        format!(
            r#"{},"choices":[{{"index":0,"delta":{call},"finish_reason":null}}]}}"#,
            self.head(Shape::Chunk)
        )
    }

    /// `{"id":ID,"object":OBJECT,"created":1,"model":MODEL` (no closing brace), of a chunk
    /// (`chat.completion.chunk`, `text_completion`) or of the whole completion
    /// (`chat.completion`, `text_completion`).
    fn head(&self, shape: Shape) -> String {
        let object = match (self.endpoint, shape) {
            (Endpoint::Chat, Shape::Chunk) => "chat.completion.chunk",
            (Endpoint::Chat, Shape::Completion) => "chat.completion",
            _ => "text_completion",
        };
        format!(
            r#"{{"id":{},"object":"{object}","created":1,"model":{}"#,
            json_string(&self.id),
            json_string(&self.model)
        )
    }

    /// `"usage":{...}` for this answer.
    fn usage(&self) -> String {
        let n = self.tokens;
        format!(
            r#""usage":{{"prompt_tokens":{PROMPT_TOKENS},"completion_tokens":{n},"total_tokens":{}}}"#,
            PROMPT_TOKENS + n
        )
    }
}

/// What an answer's JSON is: one chunk of a stream or the whole completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Chunk,
    Completion,
}

/// An error answer: a status, an OpenAI-shaped JSON body
/// (`{"error":{"message":...,"type":...,"param":...,"code":...}}`) and maybe `Retry-After`.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The status.
    pub status: StatusCode,
    /// The body's `code` (and with it its `message` and `param`).
    pub code: ErrorCode,
    /// A `Retry-After` header, if any.
    pub retry_after: Option<RetryAfter>,
}

impl Failure {
    /// `status` with the code it carries at OpenAI: 401 `invalid_api_key`, 404
    /// `model_not_found`, 429 `rate_limit_exceeded`, any other none. Panics if `status` is not
    /// one (a test's typo).
    pub fn new(status: u16) -> Failure {
        let status = StatusCode::from_u16(status).expect("an HTTP status");
        let code = match status.as_u16() {
            401 => ErrorCode::InvalidApiKey,
            404 => ErrorCode::ModelNotFound,
            429 => ErrorCode::RateLimitExceeded,
            _ => ErrorCode::None,
        };
        Failure {
            status,
            code,
            retry_after: None,
        }
    }

    /// The same with `code` in its body.
    pub fn code(self, code: ErrorCode) -> Failure {
        Failure { code, ..self }
    }

    /// The same with a `Retry-After` header.
    pub fn retry_after(self, retry_after: RetryAfter) -> Failure {
        Failure {
            retry_after: Some(retry_after),
            ..self
        }
    }

    /// The body: `message` is the code's (or `STATUS REASON` without one), `type` is
    /// `requests` for `rate_limit_exceeded`, `server_error` for a 5xx and
    /// `invalid_request_error` otherwise, `param` and `code` are the code's (or `null`).
    pub fn body(&self) -> String {
        let message = self.code.message().map(str::to_owned).unwrap_or_else(|| {
            let reason = self.status.canonical_reason().unwrap_or("");
            format!("{} {reason}", self.status.as_u16())
        });
        let kind = match self.code {
            ErrorCode::RateLimitExceeded => "requests",
            _ if self.status.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        let or_null = |value: Option<&str>| value.map_or("null".to_owned(), json_string);
        format!(
            r#"{{"error":{{"message":{},"type":"{kind}","param":{},"code":{}}}}}"#,
            json_string(&message),
            or_null(self.code.param()),
            or_null(self.code.as_str())
        )
    }
}

/// The `code` of an OpenAI error body: what went wrong, and so whether another attempt could
/// help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// `"code": null`.
    None,
    /// `context_length_exceeded` (param `messages`): the prompt is longer than the model takes.
    ContextLengthExceeded,
    /// `content_policy_violation`: the request was refused for what it says.
    ContentPolicyViolation,
    /// `invalid_value` (param `temperature`): a parameter out of its range.
    InvalidValue,
    /// `invalid_api_key`.
    InvalidApiKey,
    /// `model_not_found`.
    ModelNotFound,
    /// `rate_limit_exceeded` (type `requests`).
    RateLimitExceeded,
}

impl ErrorCode {
    /// The `code` field, `None` for `null`.
    pub fn as_str(self) -> Option<&'static str> {
        Some(match self {
            ErrorCode::None => return None,
            ErrorCode::ContextLengthExceeded => "context_length_exceeded",
            ErrorCode::ContentPolicyViolation => "content_policy_violation",
            ErrorCode::InvalidValue => "invalid_value",
            ErrorCode::InvalidApiKey => "invalid_api_key",
            ErrorCode::ModelNotFound => "model_not_found",
            ErrorCode::RateLimitExceeded => "rate_limit_exceeded",
        })
    }

    /// The `param` field, `None` for `null`.
    pub fn param(self) -> Option<&'static str> {
        match self {
            ErrorCode::ContextLengthExceeded => Some("messages"),
            ErrorCode::InvalidValue => Some("temperature"),
            _ => None,
        }
    }

    /// The `message` field, `None` for the status's words.
    pub fn message(self) -> Option<&'static str> {
        Some(match self {
            ErrorCode::None => return None,
            ErrorCode::ContextLengthExceeded => {
                "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. Please reduce the length of the messages."
            }
            ErrorCode::ContentPolicyViolation => {
                "Your request was rejected as a result of our safety system."
            }
            ErrorCode::InvalidValue => {
                "Invalid value for 'temperature': expected a number between 0 and 2."
            }
            ErrorCode::InvalidApiKey => "Incorrect API key provided.",
            ErrorCode::ModelNotFound => "The model does not exist or you do not have access to it.",
            ErrorCode::RateLimitExceeded => "Rate limit reached for requests.",
        })
    }
}

/// A `Retry-After` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryAfter {
    /// `Retry-After: N` (seconds).
    Seconds(u64),
    /// `Retry-After: <HTTP-date>`, the whole second at or after `now + d` when the answer is
    /// made (so at most a second later than `d`: an HTTP date has no fractions).
    DateIn(Duration),
    /// This text as it is (a malformed or unusual value).
    Raw(&'static str),
}

impl RetryAfter {
    /// The header's value now.
    pub fn value(&self) -> String {
        match self {
            RetryAfter::Seconds(seconds) => seconds.to_string(),
            RetryAfter::DateIn(delay) => {
                let at = (SystemTime::now() + *delay)
                    .duration_since(UNIX_EPOCH)
                    .expect("after 1970");
                let whole = at.as_secs() + u64::from(at.subsec_nanos() > 0);
                httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(whole))
            }
            RetryAfter::Raw(text) => (*text).to_owned(),
        }
    }
}

/// `text` as a JSON string, quotes included.
fn json_string(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}
