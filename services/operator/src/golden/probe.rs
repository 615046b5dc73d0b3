//! The version of a GoldenImage's source, asked of the source itself without reading the
//! image: an HTTP(S) `HEAD` (a `GET` of one byte where a server refuses `HEAD`), whose
//! strong or weak `ETag`, else `Last-Modified`, is the version; a registry image's
//! manifest digest ([`super::registry`]). A source that gives none, and the URL kinds not
//! probed here, have no version: every fire imports.
//!
//! The operator never reads a Secret's value, so only a source reachable without the
//! endpoint's `http` options is asked (a public image server, or a presigned URL, whose
//! query is never shown): the caller treats the others as having no version.

use std::sync::Arc;
use std::time::Duration;

use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::{ClientConfig, RootCertStore};

/// Redirects followed at most.
const MAX_REDIRECTS: usize = 5;
/// Longest wait for an answer.
pub(super) const TIMEOUT: Duration = Duration::from_secs(30);

/// The client the probes ask with: HTTP/1.1, TLS trusting the system's roots.
pub(super) type HttpClient = Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Empty<Bytes>,
>;

/// A new [`HttpClient`].
pub(super) fn client() -> Result<HttpClient, ProbeError> {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls()?)
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new()).build(https))
}

/// Why the version could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The URL, a header or a certificate is unusable.
    #[error("{0}")]
    Invalid(String),
    /// The server could not be reached or answered nothing usable.
    #[error("{url}: {why}")]
    Unreachable {
        /// The URL without its query.
        url: String,
        /// What failed.
        why: String,
    },
    /// The server answered with an error status.
    #[error("{url}: the server answered {status}{hint}")]
    Status {
        /// The URL without its query.
        url: String,
        /// Its status.
        status: StatusCode,
        /// What to check.
        hint: &'static str,
    },
}

/// Sends `request` with the probes' timeout; errors name `shown_url`.
pub(super) async fn send(
    client: &HttpClient,
    request: Request<Empty<Bytes>>,
    shown_url: &str,
) -> Result<hyper::Response<hyper::body::Incoming>, ProbeError> {
    tokio::time::timeout(TIMEOUT, client.request(request))
        .await
        .map_err(|_| ProbeError::Unreachable {
            url: shown_url.to_string(),
            why: format!("no answer within {} s", TIMEOUT.as_secs()),
        })?
        .map_err(|e| ProbeError::Unreachable {
            url: shown_url.to_string(),
            why: e.to_string(),
        })
}

/// The URL as errors show it: no user information, no query (a presigned URL's signature).
pub(super) fn shown(url: &str) -> String {
    let plain = ferry_core::spec::redact_userinfo(url);
    match plain.split_once('?') {
        Some((base, _)) => format!("{base}?..."),
        None => plain,
    }
}

/// Whether `url` is of a kind whose version is asked here.
pub fn probes(url: &str) -> bool {
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    matches!(scheme.as_deref(), Some("http" | "https" | "docker" | "oci"))
}

fn tls() -> Result<ClientConfig, ProbeError> {
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ProbeError::Invalid(format!("TLS setup: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The version of the source at `source`: `etag:<ETag>` or `last-modified:<date>`, or
/// None when the server gives neither; a registry image's `digest:sha256:<hex>` (asked
/// over plain HTTP when `insecure`).
pub async fn version(source: &str, insecure: bool) -> Result<Option<String>, ProbeError> {
    if let Ok(ferry_core::EndpointSpec::Registry(spec)) = ferry_core::EndpointSpec::parse(source) {
        return super::registry::version(&spec, insecure).await.map(Some);
    }
    let client = client()?;
    let mut url = source.to_string();
    let mut method = Method::HEAD;
    for _ in 0..=MAX_REDIRECTS {
        let mut request = Request::builder().method(method.clone()).uri(url.as_str());
        if method == Method::GET {
            request = request.header(header::RANGE, "bytes=0-0");
        }
        let request = request
            .body(Empty::new())
            .map_err(|e| ProbeError::Invalid(format!("{}: {e}", shown(&url))))?;
        let response = send(&client, request, &shown(&url)).await?;
        let status = response.status();
        let text = |name: header::HeaderName| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        if status.is_redirection() {
            let Some(location) = text(header::LOCATION) else {
                return Err(ProbeError::Status {
                    url: shown(&url),
                    status,
                    hint: ": a redirect without a Location",
                });
            };
            url = resolve(&url, &location)?;
            continue;
        }
        if matches!(
            status,
            StatusCode::METHOD_NOT_ALLOWED | StatusCode::NOT_IMPLEMENTED
        ) && method == Method::HEAD
        {
            method = Method::GET;
            continue;
        }
        if !status.is_success() {
            let hint = match status {
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    ": the source needs credentials: give them in its http options (then every fire imports)"
                }
                StatusCode::NOT_FOUND => ": check the URL",
                _ => "",
            };
            return Err(ProbeError::Status {
                url: shown(&url),
                status,
                hint,
            });
        }
        let version = text(header::ETAG)
            .map(|e| format!("etag:{e}"))
            .or_else(|| text(header::LAST_MODIFIED).map(|m| format!("last-modified:{m}")));
        // A GET's one byte is not wanted.
        drop(response.into_body().collect());
        return Ok(version);
    }
    Err(ProbeError::Unreachable {
        url: shown(source),
        why: format!("more than {MAX_REDIRECTS} redirects"),
    })
}

/// `location` as an absolute URL, relative to `base`.
fn resolve(base: &str, location: &str) -> Result<String, ProbeError> {
    let base =
        url::Url::parse(base).map_err(|e| ProbeError::Invalid(format!("{}: {e}", shown(base))))?;
    base.join(location)
        .map(|u| u.to_string())
        .map_err(|e| ProbeError::Invalid(format!("a redirect to an unusable location: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_http_urls_are_asked_and_queries_never_show() {
        let text = shown("https://user:pw@images.example.com/a.img?X-Amz-Signature=s3cr3t");
        assert!(!text.contains("pw") && !text.contains("s3cr3t"), "{text}");
        assert!(text.ends_with("@images.example.com/a.img?..."), "{text}");
        assert!(probes("HTTPS://x/y") && probes("http://x/y") && probes("docker://r/i:t"));
        assert!(!probes("s3://bucket/key") && !probes("nbd://h/e"));
    }

    #[test]
    fn redirects_resolve_against_their_base() {
        assert_eq!(
            resolve("https://a.example.com/x/y.img", "/z.img").unwrap(),
            "https://a.example.com/z.img"
        );
        assert_eq!(
            resolve("https://a.example.com/x/y.img", "https://b.example.com/c").unwrap(),
            "https://b.example.com/c"
        );
    }
}
