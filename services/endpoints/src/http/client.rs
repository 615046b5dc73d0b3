//! The HTTP client of one source: hyper's pooled client over rustls, requests with the
//! job's authentication and headers, and redirects followed by the rules in
//! [`crate::http`] (at most [`MAX_REDIRECTS`], no https to http, credentials only to the
//! original origin).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use ferry_core::spec::redact_http_url;
use ferry_core::{Error, ErrorKind, Result};
use http::header::{HeaderName, HeaderValue, ACCEPT_ENCODING, AUTHORIZATION, LOCATION, RANGE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use url::Url;

use super::error::{self, Attempt, Failure};
use super::{tls, HttpOptions};

/// Redirects followed for one request.
pub const MAX_REDIRECTS: usize = 10;
/// Idle connections kept per host: one per engine worker and some.
const POOL_PER_HOST: usize = 32;

type Hyper = hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// scheme, host, port: where credentials may be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin(String, String, Option<u16>);

impl Origin {
    fn of(url: &Url) -> Self {
        Self(
            url.scheme().to_string(),
            url.host_str().unwrap_or_default().to_ascii_lowercase(),
            url.port_or_known_default(),
        )
    }
}

/// A shared client: cheap to clone, every clone uses one connection pool.
#[derive(Clone)]
pub(super) struct Client {
    hyper: Hyper,
    /// Authorization and extra headers, sent to `origin` only.
    credentials: Arc<Vec<(HeaderName, HeaderValue)>>,
    origin: Origin,
    read_timeout: Duration,
}

/// What to ask for.
pub(super) struct Ask<'a> {
    pub method: Method,
    /// First and last byte (inclusive).
    pub range: Option<(u64, u64)>,
    /// Preconditions (If-Match, If-Unmodified-Since).
    pub conditions: &'a [(HeaderName, HeaderValue)],
}

impl Client {
    /// A client for the object at `url`.
    pub fn new(url: &Url, options: &HttpOptions) -> Result<Self> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(options.connect_timeout()));
        http.set_nodelay(true);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls::client_config(options)?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(POOL_PER_HOST)
            .pool_idle_timeout(Duration::from_secs(60))
            .build(https);
        Ok(Self {
            hyper,
            credentials: Arc::new(credentials(options)?),
            origin: Origin::of(url),
            read_timeout: options.read_timeout(),
        })
    }

    pub fn read_timeout(&self) -> Duration {
        self.read_timeout
    }

    /// Sends `ask` to `url`, following redirects; returns the final answer and the URL
    /// that gave it.
    pub async fn send(&self, url: &Url, ask: &Ask<'_>) -> Attempt<(Response<Incoming>, Url)> {
        let mut url = url.clone();
        for _ in 0..=MAX_REDIRECTS {
            let response = self.send_once(&url, ask).await?;
            if !is_redirect(response.status()) {
                return Ok((response, url));
            }
            let next = next_location(&url, &response)?;
            tracing::debug!(from = %redact_http_url(&url), to = %redact_http_url(&next), "following a redirect");
            url = next;
        }
        Err(Failure::fatal(Error::protocol(format!(
            "more than {MAX_REDIRECTS} redirects"
        ))))
    }

    async fn send_once(&self, url: &Url, ask: &Ask<'_>) -> Attempt<Response<Incoming>> {
        let uri: http::Uri = url.as_str().parse().map_err(|_| {
            Failure::fatal(Error::invalid_input(format!(
                "'{}' is not a URL hyper can request",
                redact_http_url(url)
            )))
        })?;
        let mut request = Request::builder().method(ask.method.clone()).uri(uri);
        let headers = request
            .headers_mut()
            .ok_or_else(|| Failure::fatal(Error::internal("request builder failed")))?;
        // Bytes as stored: a compressed transfer would change sizes and offsets.
        headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        if let Some((first, last)) = ask.range {
            let value = HeaderValue::from_str(&format!("bytes={first}-{last}"))
                .map_err(|_| Failure::fatal(Error::internal("range header")))?;
            headers.insert(RANGE, value);
        }
        for (name, value) in ask.conditions {
            headers.insert(name.clone(), value.clone());
        }
        if Origin::of(url) == self.origin {
            for (name, value) in self.credentials.iter() {
                headers.append(name.clone(), value.clone());
            }
        }
        let request = request
            .body(Empty::new())
            .map_err(|e| Failure::fatal(Error::internal(format!("building a request: {e}"))))?;
        let host = host_port(url);
        match tokio::time::timeout(self.read_timeout, self.hyper.request(request)).await {
            Err(_) => Err(Failure::transient(Error::new(
                ErrorKind::Timeout,
                format!("{host} did not answer within {:?}", self.read_timeout),
            ))),
            Ok(Err(e)) => Err(error::transport(e, &host)),
            Ok(Ok(response)) => Ok(response),
        }
    }
}

fn is_redirect(status: StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
}

fn next_location(url: &Url, response: &Response<Incoming>) -> Attempt<Url> {
    let location = response
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            Failure::fatal(Error::protocol(format!(
                "redirect HTTP {} without a usable Location",
                response.status().as_u16()
            )))
        })?;
    let next = url.join(location).map_err(|_| {
        Failure::fatal(Error::protocol(
            "redirect to a Location that is not a URL".to_string(),
        ))
    })?;
    match (url.scheme(), next.scheme()) {
        ("https", "https") | ("http", "http") | ("http", "https") => Ok(next),
        ("https", "http") => Err(Failure::fatal(Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "refusing a redirect from https to plain http ({})",
                redact_http_url(&next)
            ),
        ))),
        (_, other) => Err(Failure::fatal(Error::protocol(format!(
            "redirect to an unsupported scheme '{other}'"
        )))),
    }
}

fn host_port(url: &Url) -> String {
    match (url.host_str(), url.port_or_known_default()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        _ => "the server".to_string(),
    }
}

/// The Authorization header and the extra headers of `options`, marked sensitive.
fn credentials(options: &HttpOptions) -> Result<Vec<(HeaderName, HeaderValue)>> {
    let mut out = Vec::new();
    let auth = match (&options.user, &options.password, &options.bearer_token) {
        (_, _, Some(_)) if options.user.is_some() || options.password.is_some() => {
            return Err(Error::invalid_input(
                "give either a user and password or a bearer token, not both",
            ))
        }
        (_, _, Some(token)) => Some(format!("Bearer {}", token.expose())),
        (Some(user), password, None) => {
            if user.contains(':') {
                return Err(Error::invalid_input(
                    "the HTTP user name must not contain ':'",
                ));
            }
            let pair = format!(
                "{user}:{}",
                password.as_ref().map(|p| p.expose()).unwrap_or_default()
            );
            Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            ))
        }
        (None, Some(_), None) => {
            return Err(Error::invalid_input(
                "an HTTP password needs a user (FERRY_HTTP_USER or the job's user)",
            ))
        }
        (None, None, None) => None,
    };
    if let Some(auth) = auth {
        let mut value = HeaderValue::from_str(&auth).map_err(|_| {
            Error::invalid_input("the HTTP credentials hold characters a header cannot carry")
        })?;
        value.set_sensitive(true);
        out.push((AUTHORIZATION, value));
    }
    for (name, value) in &options.headers {
        let header = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
            Error::invalid_input(format!("'{name}' is not a valid HTTP header name"))
        })?;
        if ferry_core::http_headers::is_reserved_header(name) {
            return Err(Error::invalid_input(format!(
                "header '{name}' is set by ferry itself and cannot be given"
            )));
        }
        if header == AUTHORIZATION && !out.is_empty() {
            return Err(Error::invalid_input(
                "an Authorization header cannot be given with a user or a bearer token",
            ));
        }
        let mut value = HeaderValue::from_str(value.expose().trim()).map_err(|_| {
            Error::invalid_input(format!(
                "the value of header '{name}' holds characters a header cannot carry"
            ))
        })?;
        value.set_sensitive(true);
        out.push((header, value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::Secret;

    #[test]
    fn headers_that_would_undo_the_version_pin_or_the_auth_are_refused() {
        let pin = HttpOptions::new().with_header("If-Match", Secret::new("*"));
        assert!(credentials(&pin).is_err());
        let hop = HttpOptions::new().with_header("transfer-encoding", Secret::new("chunked"));
        assert!(credentials(&hop).is_err());
        let twice = HttpOptions::new()
            .with_basic_auth("u", Secret::new("p"))
            .with_header("Authorization", Secret::new("Bearer x"));
        assert!(credentials(&twice).is_err());
        let alone = HttpOptions::new().with_header("Authorization", Secret::new("Bearer x"));
        assert_eq!(credentials(&alone).unwrap().len(), 1);
    }

    #[test]
    fn credentials_are_checked_without_echoing_them() {
        let both = HttpOptions::new()
            .with_basic_auth("u", Secret::new("p"))
            .with_bearer_token(Secret::new("t"));
        assert!(credentials(&both).is_err());
        let bad = HttpOptions::new().with_header("X-Key", Secret::new("sec\nret"));
        let err = credentials(&bad).unwrap_err();
        assert!(!err.to_string().contains("sec"), "{err}");
        let basic = HttpOptions::new().with_basic_auth("alice", Secret::new("pw"));
        let h = credentials(&basic).unwrap();
        assert_eq!(h[0].1.to_str().unwrap(), "Basic YWxpY2U6cHc=");
        assert!(h[0].1.is_sensitive());
        let url = Url::parse("https://a.example/x").unwrap();
        assert_eq!(
            Origin::of(&url),
            Origin::of(&Url::parse("https://A.example:443/y").unwrap())
        );
        assert_ne!(
            Origin::of(&url),
            Origin::of(&Url::parse("http://a.example/x").unwrap())
        );
    }
}
