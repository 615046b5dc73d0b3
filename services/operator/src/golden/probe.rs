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

use crate::crd::{Endpoint, S3Options};

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

impl ProbeError {
    /// The server refused to answer without credentials (401 or 403).
    pub fn denied(&self) -> bool {
        matches!(
            self,
            Self::Status { status, .. }
                if *status == StatusCode::UNAUTHORIZED || *status == StatusCode::FORBIDDEN
        )
    }
}

/// The version of `source` as the operator can ask it, anonymously: an HTTP(S) URL's,
/// a registry image's ([`version`]) or an S3 object's ([`s3_version`]).
pub async fn version_of(source: &Endpoint) -> Result<Option<String>, ProbeError> {
    let url = source.url.clone().unwrap_or_default();
    if let Ok(ferry_core::EndpointSpec::S3(spec)) = ferry_core::EndpointSpec::parse(&url) {
        let options = source.s3.clone().unwrap_or_default();
        return s3_version(&s3_url(&spec.bucket, &spec.key, &options)?).await;
    }
    let insecure = source
        .registry
        .as_ref()
        .and_then(|r| r.insecure)
        .unwrap_or(false);
    version(&url, insecure).await
}

/// Where an S3 client sends requests for `bucket/key`, as the AWS SDK addresses them
/// (and so the mover): `endpointUrl` (default `https://s3.<region>.amazonaws.com`, the
/// region `us-east-1` unless given) with the bucket in the host name, or in the path when
/// `forcePathStyle` is set, the endpoint's host is an IP address, or the bucket is no DNS
/// label (dots, capitals).
pub fn s3_url(bucket: &str, key: &str, options: &S3Options) -> Result<String, ProbeError> {
    let region = options.region.as_deref().unwrap_or("us-east-1");
    let base = options
        .endpoint_url
        .clone()
        .unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
    let mut url = url::Url::parse(&base)
        .map_err(|e| ProbeError::Invalid(format!("the S3 endpoint URL {}: {e}", shown(&base))))?;
    let host = url.host().ok_or_else(|| {
        ProbeError::Invalid(format!(
            "the S3 endpoint URL {} names no host",
            shown(&base)
        ))
    })?;
    let dns_label = !bucket.is_empty()
        && bucket.len() <= 63
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ip = !matches!(host, url::Host::Domain(_));
    let path_style = options.force_path_style.unwrap_or(false) || ip || !dns_label;
    if !path_style {
        let virtual_host = format!("{bucket}.{host}");
        url.set_host(Some(&virtual_host))
            .map_err(|e| ProbeError::Invalid(format!("the bucket {bucket}: {e}")))?;
    }
    {
        let mut segments = url
            .path_segments_mut()
            .map_err(|_| ProbeError::Invalid(format!("the S3 endpoint URL {}", shown(&base))))?;
        segments.pop_if_empty();
        if path_style {
            segments.push(bucket);
        }
        segments.extend(key.split('/'));
    }
    Ok(url.to_string())
}

/// The version of the S3 object at `url` ([`s3_url`]), asked with an anonymous `HEAD`:
/// its ETag, and its version id on a versioned bucket
/// ([`ferry_core::http_headers::s3_object_version`], as the S3 endpoint names it).
/// A 401 or 403 is [`ProbeError::denied`]: the caller asks with credentials instead.
pub async fn s3_version(url: &str) -> Result<Option<String>, ProbeError> {
    let client = client()?;
    let request = Request::builder()
        .method(Method::HEAD)
        .uri(url)
        .body(Empty::new())
        .map_err(|e| ProbeError::Invalid(format!("{}: {e}", shown(url))))?;
    let response = send(&client, request, &shown(url)).await?;
    let status = response.status();
    let text = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    if !status.is_success() {
        let region = text("x-amz-bucket-region");
        let hint = match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                ": the object is not public: give spec.source.s3 credentials"
            }
            StatusCode::NOT_FOUND => ": check the bucket and the key",
            _ if region.is_some() => ": the bucket is in another region: set spec.source.s3.region",
            _ => "",
        };
        return Err(ProbeError::Status {
            url: shown(url),
            status,
            hint,
        });
    }
    Ok(ferry_core::http_headers::s3_object_version(
        text("etag").as_deref(),
        text("x-amz-version-id").as_deref(),
    ))
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
    fn queries_never_show() {
        let text = shown("https://user:pw@images.example.com/a.img?X-Amz-Signature=s3cr3t");
        assert!(!text.contains("pw") && !text.contains("s3cr3t"), "{text}");
        assert!(text.ends_with("@images.example.com/a.img?..."), "{text}");
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

    #[test]
    fn s3_objects_are_addressed_as_the_sdk_addresses_them() {
        let o = |endpoint: Option<&str>, region: Option<&str>, path: Option<bool>| S3Options {
            endpoint_url: endpoint.map(String::from),
            region: region.map(String::from),
            force_path_style: path,
            ..S3Options::default()
        };
        assert_eq!(
            s3_url("images", "fedora/41/disk.img", &o(None, None, None)).unwrap(),
            "https://images.s3.us-east-1.amazonaws.com/fedora/41/disk.img"
        );
        assert_eq!(
            s3_url("images", "a b+c.img", &o(None, Some("eu-west-3"), None)).unwrap(),
            "https://images.s3.eu-west-3.amazonaws.com/a%20b+c.img"
        );
        assert_eq!(
            s3_url(
                "images",
                "d.img",
                &o(Some("http://minio.storage:9000"), None, Some(true))
            )
            .unwrap(),
            "http://minio.storage:9000/images/d.img"
        );
        assert_eq!(
            s3_url(
                "images",
                "d.img",
                &o(Some("https://objects.example.com/"), None, None)
            )
            .unwrap(),
            "https://images.objects.example.com/d.img"
        );
        // An IP endpoint and a bucket that is no DNS label: path style.
        assert_eq!(
            s3_url(
                "images",
                "d.img",
                &o(Some("http://127.0.0.1:9000"), None, None)
            )
            .unwrap(),
            "http://127.0.0.1:9000/images/d.img"
        );
        assert_eq!(
            s3_url("my.images", "d.img", &o(None, None, None)).unwrap(),
            "https://s3.us-east-1.amazonaws.com/my.images/d.img"
        );
        assert!(s3_url("b", "k", &o(Some("not a url"), None, None)).is_err());
    }
}
