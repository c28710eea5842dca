//! The upstream client: one pool of HTTP/1.1 connections (plain, or TLS through rustls) with
//! TCP_NODELAY, a connect timeout and a 16 KiB read buffer for every upstream, and the requests
//! and responses it carries, without hop-by-hop headers.
//!
//! Pooling reuses connections for requests that finish (non-streamed completions, `/v1/models`).
//! A response body dropped before its end (a stream whose client left) is not returned to the
//! pool: hyper reads what has already arrived and, the body being unfinished, closes the
//! connection, so the upstream sees its client disconnect and frees its slot.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Method, Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use streamgate::fleet::{Cause, Failure};

use super::url::UpstreamUrl;
use crate::serving;

/// How long an idle pooled connection is kept.
const POOL_IDLE: Duration = Duration::from_secs(30);
/// TCP keepalive on upstream connections: an upstream host that vanished is found.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// The most bytes an upstream connection reads ahead of the stream (and the largest response
/// head it takes). hyper's default lets the read buffer of an upstream that sends faster than
/// the client reads grow to ~400 KB per stream; at this size a read still carries dozens of
/// events, and an answer's memory does not grow with its upstream's speed.
const UPSTREAM_BUFFER: usize = 16 * 1024;

/// The headers that belong to one connection, never forwarded (RFC 9110, 7.6.1), besides the
/// ones a `Connection` header names.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// The pooled client that reaches every upstream, `http://` and `https://`.
#[derive(Debug, Clone)]
pub(super) struct Upstream {
    client: Client<HttpsConnector<HttpConnector>, Body>,
}

/// Why an upstream gave no response.
#[derive(Debug)]
pub(super) enum UpstreamError {
    /// Connecting failed: refused, unreachable, no such host (502).
    Connect(String),
    /// Connecting took longer than `--connect-timeout-ms` (504).
    ConnectTimeout,
    /// The TLS handshake failed: most often a certificate the proxy does not trust (502,
    /// naming it; never a retry in plain text).
    Tls(String),
    /// The response headers took longer than `--upstream-headers-ms` (504).
    HeadersTimeout(Duration),
    /// The connection failed before the response headers came: a reset, a close (502).
    Failed(String),
}

impl UpstreamError {
    /// What it says of the attempt, for retries and health.
    pub(super) fn failure(&self) -> Failure {
        match self {
            UpstreamError::Connect(_) => Failure::Connect,
            UpstreamError::ConnectTimeout => Failure::ConnectTimeout,
            UpstreamError::Tls(_) => Failure::Tls,
            UpstreamError::HeadersTimeout(_) => Failure::HeadersTimeout,
            UpstreamError::Failed(_) => Failure::Reset,
        }
    }

    /// Its cause, as metrics and `/stats` count it.
    pub(super) fn cause(&self) -> Cause {
        self.failure().cause()
    }
}

/// The request id header, carried both ways.
pub(super) const REQUEST_ID: HeaderName = HeaderName::from_static(crate::request_id::HEADER);

impl Upstream {
    /// A client whose connections take at most `connect_timeout` to open, and that trusts the
    /// system's root certificates and those of the PEM file `ca` (`--upstream-ca`).
    ///
    /// # Errors
    ///
    /// `ca` cannot be read, holds no certificate, or one that is no valid root.
    pub(super) fn new(connect_timeout: Duration, ca: Option<&Path>) -> Result<Self, String> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_keepalive(Some(KEEPALIVE));
        // `https://` upstreams go through the TLS layer around it.
        connector.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(ca)?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE)
            .http1_max_buf_size(UPSTREAM_BUFFER)
            .build(connector);
        Ok(Upstream { client })
    }

    /// Sends `method path_and_query` to `url` with the client's `headers` (minus hop-by-hop
    /// ones and `Host`, which becomes the upstream's) and `body`, streamed.
    pub(super) async fn send(
        &self,
        url: &UpstreamUrl,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Body,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let uri: Uri = url
            .join(path_and_query)
            .map_err(|error| UpstreamError::Failed(format!("bad path: {error}")))?;
        let mut request = Request::builder()
            .method(method)
            .uri(uri)
            .body(body)
            .map_err(|error| UpstreamError::Failed(error.to_string()))?;
        let forwarded = request.headers_mut();
        *forwarded = headers.clone();
        strip_hop_by_hop(forwarded);
        // The upstream's authority, and a body the proxy sends as it comes.
        forwarded.remove(header::HOST);
        forwarded.remove(header::EXPECT);
        self.client.request(request).await.map_err(|error| {
            let message = serving::with_causes(&error);
            if head_too_large(&error) {
                UpstreamError::Failed(format!(
                    "its response head is larger than the proxy takes ({UPSTREAM_BUFFER} bytes): {message}"
                ))
            } else if !error.is_connect() {
                UpstreamError::Failed(message)
            } else if caused_by::<rustls::Error>(&error) {
                UpstreamError::Tls(message)
            } else if timed_out(&error) {
                UpstreamError::ConnectTimeout
            } else {
                UpstreamError::Connect(message)
            }
        })
    }
}

/// The TLS client configuration: rustls with ring, the system's roots and those of `ca`.
fn tls_config(ca: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    // The system's store: certificates it cannot parse are skipped, as every client does.
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if let Some(path) = ca {
        let shown = path.display();
        let certificates = CertificateDer::pem_file_iter(path)
            .map_err(|error| format!("--upstream-ca {shown}: {error}"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| format!("--upstream-ca {shown}: {error}"))?;
        if certificates.is_empty() {
            return Err(format!("--upstream-ca {shown}: no PEM certificate in it"));
        }
        let (_, refused) = roots.add_parsable_certificates(certificates);
        if refused > 0 {
            return Err(format!(
                "--upstream-ca {shown}: {refused} of its certificates are no valid roots"
            ));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    // ALPN (HTTP/1.1) is set by the connector.
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("TLS: {error}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The upstream's response as the client's: status, headers but the hop-by-hop ones, and the
/// body streamed as it comes. A body the upstream cuts short (fewer bytes than its
/// `Content-Length`, a chunked body without its last chunk) fails the client's response too,
/// so hyper cuts the client's connection rather than end a short body cleanly.
pub(super) fn pass_response(response: Response<Incoming>) -> Response<Body> {
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    // The client's connection has its own version.
    parts.version = Version::default();
    Response::from_parts(parts, Body::new(body))
}

/// Removes the headers that belong to one connection: the standard ones and those the
/// `Connection` header names.
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(&HOP_BY_HOP) {
        headers.remove(name);
    }
}

/// Whether `headers` say the body is an SSE stream: `text/event-stream`, in any case, with
/// any parameters (`Text/Event-Stream; charset=utf-8`).
pub(super) fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("text/event-stream"))
}

/// Sets `x-request-id` to `id`.
pub(super) fn set_request_id(headers: &mut HeaderMap, id: &str) {
    if let Ok(value) = HeaderValue::from_str(id) {
        headers.insert(REQUEST_ID, value);
    }
}

/// Whether an I/O error somewhere in `error`'s causes timed out.
fn timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    any_cause(error, &|error| {
        error
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
    })
}

/// Whether hyper gave up on a response head that did not fit in [`UPSTREAM_BUFFER`].
fn head_too_large(error: &(dyn std::error::Error + 'static)) -> bool {
    any_cause(error, &|error| {
        error
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_parse_too_large)
    })
}

/// Whether an `E` is somewhere in `error`'s causes.
fn caused_by<E: std::error::Error + 'static>(error: &(dyn std::error::Error + 'static)) -> bool {
    any_cause(error, &|error| error.is::<E>())
}

/// Whether `test` holds for `error` or one of its causes, looking inside I/O errors too (an
/// `io::Error`'s `source` skips the error it wraps).
fn any_cause(
    error: &(dyn std::error::Error + 'static),
    test: &dyn Fn(&(dyn std::error::Error + 'static)) -> bool,
) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if test(error) {
            return true;
        }
        let wrapped = error
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref);
        if wrapped.is_some_and(|inner| any_cause(inner, test)) {
            return true;
        }
        cause = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_stream_types() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_str(value).unwrap());
            is_event_stream(&headers)
        };
        assert!(with("text/event-stream"));
        assert!(with("Text/Event-Stream; charset=utf-8"));
        assert!(with(" text/event-stream ;charset=UTF-8"));
        assert!(!with("text/event-streams"));
        assert!(!with("application/json"));
        assert!(!is_event_stream(&HeaderMap::new()));
    }

    #[test]
    fn hop_by_hop_headers_go() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "close, x-secret"),
            ("x-secret", "1"),
            ("transfer-encoding", "chunked"),
            ("keep-alive", "timeout=5"),
            ("authorization", "Bearer k"),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        ] {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        strip_hop_by_hop(&mut headers);
        let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["authorization", "traceparent"]);
    }
}
