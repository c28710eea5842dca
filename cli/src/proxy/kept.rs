//! What a stream keeps in the resume store for another proxy instance to carry it on, should
//! this one die (see `adopt.rs`): the request as it goes upstream.

use axum::http::header::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::attempt::Attempted;
use super::body::Buffered;
use super::format::Format;

/// What a stream keeps in the store for an adopter: the request as it goes upstream (its
/// headers, credentials among them, are as safe as the Redis), as one JSON line, then the
/// body's bytes.
#[derive(Serialize, Deserialize)]
struct Kept {
    path_and_query: String,
    format: Format,
    asked: bool,
    model: Option<String>,
    headers: Vec<(String, KeptValue)>,
}

/// A header's value: text, or (obs-text, which HTTP allows) its bytes.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum KeptValue {
    Text(String),
    Bytes(Vec<u8>),
}

/// The request `request` (of `format`) as a stream keeps it.
pub(super) fn keep(request: &Attempted, format: Format) -> Bytes {
    let headers = request
        .headers
        .iter()
        .map(|(name, value)| {
            let value = match std::str::from_utf8(value.as_bytes()) {
                Ok(text) => KeptValue::Text(text.to_owned()),
                Err(_) => KeptValue::Bytes(value.as_bytes().to_vec()),
            };
            (name.as_str().to_owned(), value)
        })
        .collect();
    let kept = Kept {
        path_and_query: request.path_and_query.clone(),
        format,
        asked: request.asked,
        model: request.model.clone(),
        headers,
    };
    let mut bytes = serde_json::to_vec(&kept).expect("plain data serializes");
    bytes.push(b'\n');
    bytes.extend_from_slice(&request.body.bytes);
    bytes.into()
}

/// The request a stream kept, and its format; `None` when it kept none this proxy wrote.
pub(super) fn kept(bytes: &Bytes) -> Option<(Attempted, Format)> {
    let line = bytes.iter().position(|&byte| byte == b'\n')?;
    let kept: Kept = serde_json::from_slice(&bytes[..line]).ok()?;
    let mut headers = HeaderMap::new();
    for (name, value) in kept.headers {
        let value = match value {
            KeptValue::Text(text) => HeaderValue::from_str(&text).ok()?,
            KeptValue::Bytes(bytes) => HeaderValue::from_bytes(&bytes).ok()?,
        };
        headers.append(HeaderName::from_bytes(name.as_bytes()).ok()?, value);
    }
    let request = Attempted {
        path_and_query: kept.path_and_query,
        headers,
        body: Buffered::new(bytes.slice(line + 1..), None),
        asked: kept.asked,
        model: kept.model,
    };
    Some((request, kept.format))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_request_comes_back_whole() {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", HeaderValue::from_static("Bearer k"));
        headers.append("x-many", HeaderValue::from_static("one"));
        headers.append("x-many", HeaderValue::from_static("two"));
        headers.insert("x-latin", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        let body = Bytes::from_static(b"{\"model\":\"m\",\n\"stream\":true}\n");
        let request = Attempted {
            path_and_query: "/v1/chat/completions?x=1".to_owned(),
            headers: headers.clone(),
            body: Buffered::new(body.clone(), None),
            asked: true,
            model: Some("m".to_owned()),
        };
        let (back, format) = kept(&keep(&request, Format::Chat)).expect("kept");
        assert_eq!(format, Format::Chat);
        assert_eq!(back.path_and_query, request.path_and_query);
        assert_eq!(back.headers, headers);
        assert_eq!(back.body.bytes, body);
        assert!(back.asked);
        assert_eq!(back.model.as_deref(), Some("m"));
        for foreign in [&b""[..], b"no line", b"{\"x\":1}\nbody"] {
            assert!(kept(&Bytes::copy_from_slice(foreign)).is_none());
        }
    }
}
