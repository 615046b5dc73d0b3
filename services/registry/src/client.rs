//! [`Client`]: one repository of one registry over hyper and rustls: the auth
//! challenge answered once and remembered, manifests fetched with their digest checked,
//! and blobs fetched whole or by range (following the redirects registries send to their
//! storage, with credentials kept to the registry itself).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{
    HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, LOCATION, RANGE, WWW_AUTHENTICATE,
};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use url::Url;

use crate::auth::{parse_challenge, parse_token_reply, Challenge, MAX_TOKEN_REPLY};
use crate::manifest::{self, Document, Layer, Platform, ACCEPT as MANIFEST_ACCEPT, MAX_MANIFEST};
use crate::{Credentials, Digest, Error, ErrorKind, Result};

type Hyper = hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// Redirects followed for one request.
const MAX_REDIRECTS: usize = 5;
/// Attempts for a request that fails in a way that may pass.
const ATTEMPTS: u32 = 4;

/// How to reach a registry.
#[derive(Clone, Default)]
pub struct ClientOptions {
    /// Basic credentials, also given to a token service.
    pub credentials: Option<Credentials>,
    /// Extra trusted CA certificates (PEM).
    pub ca_pem: Option<String>,
    /// Plain HTTP (only when the user asked for it).
    pub insecure: bool,
    pub connect_timeout: Option<Duration>,
    pub read_timeout: Option<Duration>,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("credentials", &self.credentials)
            .field("ca_pem", &self.ca_pem.is_some())
            .field("insecure", &self.insecure)
            .finish_non_exhaustive()
    }
}

/// What a reference resolved to: the digest pinned at the start, and the layer to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The digest of what the tag named (an index or a manifest): later requests use
    /// digests only, so a tag that moves cannot mix two images.
    pub digest: Digest,
    /// The platform chosen from an index (None for a single-platform manifest).
    pub platform: Option<Platform>,
    /// The image manifest read (the index entry's, or `digest` itself).
    pub manifest: Digest,
    /// The layer holding the disk, and how many layers the image has.
    pub layer: Layer,
    pub layers: usize,
}

/// A client for one repository. Cheap to clone; clones share the connection pool and
/// the authorization learned.
#[derive(Clone)]
pub struct Client {
    hyper: Hyper,
    base: Url,
    host: String,
    repository: String,
    credentials: Option<Credentials>,
    auth: Arc<parking_mutex::Mutex<Option<HeaderValue>>>,
    read_timeout: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base.as_str())
            .field("repository", &self.repository)
            .finish_non_exhaustive()
    }
}

/// A tiny mutex wrapper so the crate needs no extra dependency.
mod parking_mutex {
    #[derive(Debug, Default)]
    pub struct Mutex<T>(std::sync::Mutex<T>);
    impl<T: Clone> Mutex<T> {
        pub fn new(v: T) -> Self {
            Self(std::sync::Mutex::new(v))
        }
        pub fn get(&self) -> T {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
        }
        pub fn set(&self, v: T) {
            *self.0.lock().unwrap_or_else(|e| e.into_inner()) = v;
        }
    }
}

/// A blob's response body, read chunk by chunk.
pub struct BlobBody {
    body: Incoming,
    /// The registry answered a range request with 206 (else the whole blob, 200).
    pub partial: bool,
    read_timeout: Duration,
}

impl std::fmt::Debug for BlobBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobBody")
            .field("partial", &self.partial)
            .finish()
    }
}

impl BlobBody {
    /// The next bytes, None at the end.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>> {
        next_chunk(&mut self.body, self.read_timeout).await
    }
}

async fn next_chunk(body: &mut Incoming, idle: Duration) -> Result<Option<Bytes>> {
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("the registry's answer stalled for {idle:?}"),
                ))
            }
            Ok(None) => return Ok(None),
            Ok(Some(Err(e))) => {
                return Err(Error::new(
                    ErrorKind::Disconnected,
                    format!("the registry's answer broke off: {e}"),
                ))
            }
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            if !data.is_empty() {
                return Ok(Some(data));
            }
        }
    }
}

/// Reads a whole body of at most `max` bytes.
async fn read_bounded(
    body: &mut Incoming,
    max: usize,
    idle: Duration,
    what: &str,
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(chunk) = next_chunk(body, idle).await? {
        if out.len() + chunk.len() > max {
            return Err(Error::protocol(format!(
                "the {what} is larger than {max} bytes"
            )));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

fn tls_config(ca_pem: Option<&str>) -> Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if let Some(pem) = ca_pem {
        let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::invalid(format!("the registry CA file is not valid PEM: {e}")))?;
        if certs.is_empty() {
            return Err(Error::invalid(
                "the registry CA file holds no PEM certificate",
            ));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| {
                Error::invalid(format!("the registry CA certificate cannot be used: {e}"))
            })?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::invalid(format!("TLS setup: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The causes of an error, joined.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![err.to_string()];
    let mut cur = err.source();
    while let Some(e) = cur {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = e.source();
    }
    parts.join(": ")
}

fn status_error(status: StatusCode, what: &str) -> Error {
    let n = status.as_u16();
    let reason = status.canonical_reason().unwrap_or("");
    match n {
        404 => Error::new(
            ErrorKind::NotFound,
            format!("the registry has no {what} (HTTP 404)"),
        ),
        401 | 403 => Error::new(
            ErrorKind::Denied,
            format!(
                "permission denied: the registry refused access to the {what} (HTTP {n} \
                 {reason}): check the credentials in FERRY_REGISTRY_AUTH_FILE"
            ),
        ),
        429 | 502 | 503 | 504 => Error::new(
            ErrorKind::Disconnected,
            format!("the registry is unavailable (HTTP {n} {reason})"),
        ),
        500..=599 => Error::new(
            ErrorKind::Server,
            format!("the registry failed (HTTP {n} {reason})"),
        ),
        _ => Error::protocol(format!(
            "unexpected answer to the {what} request: HTTP {n} {reason}"
        )),
    }
}

impl Client {
    /// A client for `repository` at `host` (`host[:port]`).
    pub fn new(host: &str, repository: &str, options: &ClientOptions) -> Result<Self> {
        let scheme = if options.insecure { "http" } else { "https" };
        let base = Url::parse(&format!("{scheme}://{host}/"))
            .map_err(|e| Error::invalid(format!("registry host {host:?}: {e}")))?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(
            options.connect_timeout.unwrap_or(Duration::from_secs(10)),
        ));
        http.set_nodelay(true);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(options.ca_pem.as_deref())?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(16)
            .build(https);
        Ok(Self {
            hyper,
            base,
            host: host.to_string(),
            repository: repository.to_string(),
            credentials: options.credentials.clone(),
            auth: Arc::new(parking_mutex::Mutex::new(None)),
            read_timeout: options.read_timeout.unwrap_or(Duration::from_secs(30)),
        })
    }

    fn url(&self, kind: &str, reference: &str) -> Result<Url> {
        self.base
            .join(&format!("v2/{}/{kind}/{reference}", self.repository))
            .map_err(|e| Error::invalid(format!("request URL: {e}")))
    }

    async fn send_once(
        &self,
        method: &Method,
        url: &Url,
        accept: Option<&str>,
        range: Option<(u64, u64)>,
        auth: Option<&HeaderValue>,
    ) -> Result<Response<Incoming>> {
        let mut request = Request::builder().method(method.clone()).uri(url.as_str());
        if let Some(a) = accept {
            request = request.header(ACCEPT, a);
        }
        if let Some((first, last)) = range {
            request = request.header(RANGE, format!("bytes={first}-{last}"));
        }
        if let Some(a) = auth {
            request = request.header(AUTHORIZATION, a.clone());
        }
        let request = request
            .body(Empty::new())
            .map_err(|e| Error::invalid(format!("building a request: {e}")))?;
        match tokio::time::timeout(self.read_timeout, self.hyper.request(request)).await {
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "{} did not answer within {:?}",
                    self.host, self.read_timeout
                ),
            )),
            Ok(Err(e)) => {
                let text = chain(&e);
                let lower = text.to_ascii_lowercase();
                if [
                    "certificate",
                    "tls handshake",
                    "received fatal alert",
                    "invalidcontenttype",
                ]
                .iter()
                .any(|m| lower.contains(m))
                {
                    return Err(Error::new(
                        ErrorKind::Denied,
                        format!(
                            "TLS with {} failed: {text} (a private CA is given with \
                             FERRY_REGISTRY_CA_FILE; plain HTTP only with FERRY_REGISTRY_INSECURE=1)",
                            self.host
                        ),
                    ));
                }
                Err(Error::new(
                    ErrorKind::Disconnected,
                    format!("cannot reach the registry {}: {text}", self.host),
                ))
            }
            Ok(Ok(r)) => Ok(r),
        }
    }

    /// Answers a 401's challenge: remembers the Authorization to send from now on.
    async fn authenticate(&self, response: &Response<Incoming>) -> Result<()> {
        let challenge = response
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Denied,
                    "the registry refused access (HTTP 401) without a challenge",
                )
            })?;
        let value = match parse_challenge(challenge)? {
            Challenge::Basic => {
                let creds = self.credentials.as_ref().ok_or_else(|| {
                    Error::new(
                        ErrorKind::Denied,
                        format!(
                            "permission denied: the registry {} asks for credentials: give a \
                             docker config.json with FERRY_REGISTRY_AUTH_FILE",
                            self.host
                        ),
                    )
                })?;
                creds.basic()
            }
            Challenge::Bearer {
                realm,
                service,
                scope,
            } => {
                format!("Bearer {}", self.token(&realm, service, scope).await?.0)
            }
        };
        let mut header = HeaderValue::from_str(&value)
            .map_err(|_| Error::invalid("the credentials hold characters a header cannot carry"))?;
        header.set_sensitive(true);
        self.auth.set(Some(header));
        Ok(())
    }

    /// Asks the token service for a pull token.
    async fn token(
        &self,
        realm: &str,
        service: Option<String>,
        scope: Option<String>,
    ) -> Result<crate::auth::Token> {
        let mut url = Url::parse(realm)
            .map_err(|_| Error::protocol("the registry's token realm is not a URL"))?;
        if !matches!(url.scheme(), "https" | "http") {
            return Err(Error::protocol(
                "the registry's token realm is not an http(s) URL",
            ));
        }
        if url.scheme() == "http" && self.base.scheme() == "https" {
            return Err(Error::new(
                ErrorKind::Denied,
                "the registry sends the credentials to a plain-http token service; refused",
            ));
        }
        {
            let mut q = url.query_pairs_mut();
            if let Some(s) = &service {
                q.append_pair("service", s);
            }
            let scope = scope.unwrap_or_else(|| format!("repository:{}:pull", self.repository));
            q.append_pair("scope", &scope);
        }
        let basic = self
            .credentials
            .as_ref()
            .map(|c| {
                let mut v = HeaderValue::from_str(&c.basic()).map_err(|_| {
                    Error::invalid("the credentials hold characters a header cannot carry")
                })?;
                v.set_sensitive(true);
                Ok::<_, Error>(v)
            })
            .transpose()?;
        let response = self
            .send_once(&Method::GET, &url, None, None, basic.as_ref())
            .await?;
        let status = response.status();
        if !status.is_success() {
            return Err(match status.as_u16() {
                401 | 403 => Error::new(
                    ErrorKind::Denied,
                    format!(
                        "permission denied: the registry's token service refused the \
                         credentials (HTTP {}): check FERRY_REGISTRY_AUTH_FILE",
                        status.as_u16()
                    ),
                ),
                _ => status_error(status, "token"),
            });
        }
        let mut body = response.into_body();
        let bytes =
            read_bounded(&mut body, MAX_TOKEN_REPLY, self.read_timeout, "token reply").await?;
        parse_token_reply(&bytes)
    }

    /// Sends a request to the registry: answers one auth challenge, retries what may
    /// pass, follows redirects (without credentials to another origin).
    async fn send(
        &self,
        url: &Url,
        accept: Option<&str>,
        range: Option<(u64, u64)>,
        what: &str,
    ) -> Result<Response<Incoming>> {
        let mut attempt = 0;
        let mut challenged = false;
        loop {
            attempt += 1;
            let result = self.send_redirected(url, accept, range).await;
            let response = match result {
                Err(e) if e.is_transient() && attempt < ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                    continue;
                }
                other => other?,
            };
            let status = response.status();
            if status == StatusCode::UNAUTHORIZED && !challenged {
                challenged = true;
                self.authenticate(&response).await?;
                continue;
            }
            if status.is_success() {
                return Ok(response);
            }
            let err = status_error(status, what);
            if err.is_transient() && attempt < ATTEMPTS {
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                continue;
            }
            return Err(err);
        }
    }

    async fn send_redirected(
        &self,
        url: &Url,
        accept: Option<&str>,
        range: Option<(u64, u64)>,
    ) -> Result<Response<Incoming>> {
        let mut url = url.clone();
        let auth = self.auth.get();
        for _ in 0..=MAX_REDIRECTS {
            let same_origin = url.origin() == self.base.origin();
            let response = self
                .send_once(
                    &Method::GET,
                    &url,
                    accept,
                    range,
                    auth.as_ref().filter(|_| same_origin),
                )
                .await?;
            if !matches!(response.status().as_u16(), 301 | 302 | 303 | 307 | 308) {
                return Ok(response);
            }
            let next = response
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|l| url.join(l).ok())
                .ok_or_else(|| Error::protocol("a redirect without a usable Location"))?;
            if url.scheme() == "https" && next.scheme() != "https" {
                return Err(Error::new(
                    ErrorKind::Denied,
                    "refusing a redirect from https to plain http",
                ));
            }
            url = next;
        }
        Err(Error::protocol(format!(
            "more than {MAX_REDIRECTS} redirects"
        )))
    }

    /// Fetches a manifest or index by tag or digest; returns its parsed form and the
    /// digest of its bytes (checked against `reference` when that is a digest, and
    /// against the registry's Docker-Content-Digest when it sends one).
    pub async fn manifest(&self, reference: &str) -> Result<(Document, Digest)> {
        let url = self.url("manifests", reference)?;
        let response = self
            .send(&url, Some(MANIFEST_ACCEPT), None, "manifest")
            .await?;
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let announced = response
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut body = response.into_body();
        let bytes = read_bounded(&mut body, MAX_MANIFEST, self.read_timeout, "manifest").await?;
        let digest = Digest::of(&bytes);
        if reference.starts_with("sha256:") && Digest::parse(reference)? != digest {
            return Err(Error::corrupt(format!(
                "the manifest {reference} the registry sent hashes to {digest}"
            )));
        }
        if let Some(a) = announced.as_deref().filter(|a| a.starts_with("sha256:")) {
            if Digest::parse(a)? != digest {
                return Err(Error::corrupt(format!(
                    "the registry says the manifest is {a}, its bytes hash to {digest}"
                )));
            }
        }
        Ok((manifest::parse(&bytes, content_type.as_deref())?, digest))
    }

    /// Resolves `reference` (a tag or digest) to its pinned digest and the disk layer,
    /// through an index to `platform` (linux/amd64 when None).
    pub async fn resolve(&self, reference: &str, platform: Option<&Platform>) -> Result<Resolved> {
        let (doc, digest) = self.manifest(reference).await?;
        let (layers, platform, manifest) = match doc {
            Document::Manifest(layers) => (layers, None, digest.clone()),
            Document::Index(entries) => {
                let want = platform.cloned().unwrap_or_default();
                let entry = manifest::pick(&entries, &want)?;
                let chosen = entry.digest.clone();
                let found = entry.platform.clone();
                match self.manifest(&chosen.to_string()).await? {
                    (Document::Manifest(layers), _) => (layers, found, chosen),
                    (Document::Index(_), _) => {
                        return Err(Error::new(
                            ErrorKind::Unsupported,
                            "the image index names another index; nested indexes are not read",
                        ))
                    }
                }
            }
        };
        let layer = manifest::disk_layer(&layers)?.clone();
        Ok(Resolved {
            digest,
            platform,
            manifest,
            layer,
            layers: layers.len(),
        })
    }

    /// GETs a blob, whole or the bytes `first..=last`. A registry that ignores the range
    /// answers 200 with the whole blob (`partial` false).
    pub async fn blob(&self, digest: &Digest, range: Option<(u64, u64)>) -> Result<BlobBody> {
        let url = self.url("blobs", &digest.to_string())?;
        let response = self.send(&url, None, range, "blob").await?;
        let partial = response.status() == StatusCode::PARTIAL_CONTENT;
        Ok(BlobBody {
            body: response.into_body(),
            partial,
            read_timeout: self.read_timeout,
        })
    }

    /// Whether the registry serves ranges of `digest` (asks for its first byte).
    pub async fn serves_ranges(&self, digest: &Digest) -> Result<bool> {
        Ok(self.blob(digest, Some((0, 0))).await?.partial)
    }
}
