//! An upstream's URL: `http://` or `https://`, a host and port, and an optional path prefix.

use std::fmt;
use std::str::FromStr;

use axum::http::Uri;
use axum::http::uri::Authority;

/// How the proxy speaks to an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Plain HTTP/1.1.
    Http,
    /// HTTP/1.1 over TLS (rustls), the certificate verified against the system's roots and
    /// `--upstream-ca`.
    Https,
}

impl Scheme {
    /// `http` or `https`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    /// The port a URL without one means: 80 or 443.
    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// An upstream server: `http[s]://HOST[:PORT][/PREFIX]` (without a scheme, `http`; without a
/// port, the scheme's). Every path the proxy forwards is appended to the prefix
/// (`http://gpu-1:8000/api` sends `/v1/models` to `/api/v1/models`). A prefix that ends in
/// `/v1` is a base URL as the OpenAI SDKs take one, and the `/v1` the client's path starts
/// with is not repeated: `https://gpu-1/openai/v1` sends `/v1/models` to `/openai/v1/models`.
///
/// # Examples
///
/// ```
/// use streamgate_cli::proxy::UpstreamUrl;
///
/// let url: UpstreamUrl = "https://gpu-1/openai".parse().unwrap();
/// assert_eq!(url.to_string(), "https://gpu-1:443/openai");
/// assert_eq!(
///     url.join("/v1/models").unwrap().to_string(),
///     "https://gpu-1:443/openai/v1/models"
/// );
/// // A base URL, as the SDKs take one: the same path.
/// let base: UpstreamUrl = "https://gpu-1/openai/v1".parse().unwrap();
/// assert_eq!(base.join("/v1/models").unwrap(), url.join("/v1/models").unwrap());
/// assert!("ftp://gpu-1".parse::<UpstreamUrl>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UpstreamUrl {
    scheme: Scheme,
    authority: Authority,
    prefix: String,
}

impl UpstreamUrl {
    /// `http` or `https`.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The upstream's `HOST:PORT`.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// The path every forwarded path is appended to (empty, or `/PREFIX` without a trailing
    /// slash).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The absolute URI of `path_and_query` (which starts with `/`) at the upstream.
    ///
    /// # Errors
    ///
    /// If the joined URI is not valid (a path the client sent can always be joined).
    pub fn join(&self, path_and_query: &str) -> Result<Uri, axum::http::uri::InvalidUri> {
        let repeated = self.prefix.ends_with("/v1")
            && path_and_query
                .strip_prefix("/v1")
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['/', '?']));
        let path = if repeated {
            &path_and_query[3..]
        } else {
            path_and_query
        };
        format!("{self}{path}").parse()
    }
}

impl FromStr for UpstreamUrl {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        let problem = |why: &str| format!("`{value}` is not http[s]://HOST[:PORT][/PREFIX]: {why}");
        let with_scheme = if value.contains("://") {
            value.to_owned()
        } else {
            format!("http://{value}")
        };
        let uri: Uri = with_scheme.parse().map_err(|_| problem("not a URL"))?;
        let scheme = match uri.scheme_str() {
            Some("http") => Scheme::Http,
            Some("https") => Scheme::Https,
            _ => return Err(problem("the scheme must be http or https")),
        };
        let authority = uri.authority().cloned().ok_or_else(|| problem("no host"))?;
        if authority.as_str().contains('@') {
            return Err(problem("credentials in the URL are not supported"));
        }
        if authority.host().is_empty() {
            return Err(problem("no host"));
        }
        if uri.query().is_some() {
            return Err(problem("a query is not supported"));
        }
        let authority = match authority.port_u16() {
            Some(_) => authority,
            None => format!("{}:{}", authority.host(), scheme.default_port())
                .parse()
                .map_err(|_| problem("not a host"))?,
        };
        Ok(UpstreamUrl {
            scheme,
            authority,
            prefix: uri.path().trim_end_matches('/').to_owned(),
        })
    }
}

impl fmt::Display for UpstreamUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = self.scheme.as_str();
        write!(f, "{scheme}://{}{}", self.authority, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls() {
        let url: UpstreamUrl = "http://127.0.0.1:8000".parse().unwrap();
        assert_eq!(url.to_string(), "http://127.0.0.1:8000");
        assert_eq!(url.scheme(), Scheme::Http);
        assert_eq!(
            url.join("/v1/models?x=1").unwrap().to_string(),
            "http://127.0.0.1:8000/v1/models?x=1"
        );
        let url: UpstreamUrl = "http://gpu-1:8000/api/".parse().unwrap();
        assert_eq!(
            url.join("/v1/models").unwrap().to_string(),
            "http://gpu-1:8000/api/v1/models"
        );
        let url: UpstreamUrl = "localhost".parse().unwrap();
        assert_eq!(url.to_string(), "http://localhost:80");
        let url: UpstreamUrl = "https://gpu-2/openai/".parse().unwrap();
        assert_eq!(url.scheme(), Scheme::Https);
        assert_eq!(url.to_string(), "https://gpu-2:443/openai");
        assert_eq!(url.prefix(), "/openai");
        let base: UpstreamUrl = "https://gpu-2/openai/v1".parse().unwrap();
        for (path, joined) in [
            (
                "/v1/chat/completions",
                "https://gpu-2:443/openai/v1/chat/completions",
            ),
            ("/v1?x=1", "https://gpu-2:443/openai/v1?x=1"),
            ("/v1x", "https://gpu-2:443/openai/v1/v1x"),
            ("/health", "https://gpu-2:443/openai/v1/health"),
        ] {
            assert_eq!(base.join(path).unwrap().to_string(), joined);
        }
        let url: UpstreamUrl = "https://[::1]:8443".parse().unwrap();
        assert_eq!(url.authority().port_u16(), Some(8443));
        for bad in [
            "ftp://a:1",
            "http://a:1/x?y=1",
            "http://u:p@a:1",
            "http://",
            "a b",
        ] {
            let error = bad.parse::<UpstreamUrl>().unwrap_err();
            assert!(error.contains(bad), "{error}");
        }
    }
}
