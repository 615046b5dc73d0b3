//! The webhook over HTTPS: `POST /mutate-transfer` answered by [`super::review::answer`],
//! `GET /healthz` for probes, anything else 404. One task per connection; a connection
//! whose TLS handshake fails is dropped (and logged at debug: the API server retries).
//!
//! Anyone who can reach the port can open connections, so each is bounded ([`Limits`]):
//! the TLS handshake and the request's headers must arrive within a timeout, and at most
//! so many connections are served at once (more wait in the listen backlog), so that
//! connections that send nothing (slowloris) cannot tie the operator up.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use parking_lot::Mutex;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use time::OffsetDateTime;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use crate::mover::tls::{MoverCa, TlsError};

use super::review::{answer, PATH};
use super::stamp::StampKey;

/// How long the webhook's certificate is valid; a new one is issued once half of it has
/// passed (checked at each handshake), so an operator that runs for months never serves
/// an expired one.
pub const WEBHOOK_VALIDITY: time::Duration = time::Duration::days(30);

/// The largest AdmissionReview read (a Transfer and its old version, with room).
const MAX_BODY: usize = 3 << 20;

/// What can go wrong setting the webhook up.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// No certificate.
    #[error(transparent)]
    Certificate(#[from] TlsError),
    /// The TLS configuration.
    #[error("the webhook's TLS configuration: {0}")]
    Tls(String),
    /// The MutatingWebhookConfiguration.
    #[error("cannot set the caBundle of MutatingWebhookConfiguration {name}: {source}")]
    Install {
        /// Its name.
        name: String,
        /// Why.
        source: kube::Error,
    },
}

/// The DNS names the API server may use for the webhook's Service.
pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        format!("{service}.{namespace}"),
        service.to_string(),
    ]
}

/// The webhook's certificate: issued by the movers' CA for the Service's names, and issued
/// again once half its validity has passed.
struct Renewing {
    ca: Arc<MoverCa>,
    names: Vec<String>,
    provider: Arc<CryptoProvider>,
    current: Mutex<(Arc<CertifiedKey>, OffsetDateTime)>,
}

impl std::fmt::Debug for Renewing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewing")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

fn issue(
    ca: &MoverCa,
    names: &[String],
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, WebhookError> {
    let issued = ca.issue_server(names.to_vec(), WEBHOOK_VALIDITY)?;
    let tls = |e: &dyn std::fmt::Display| WebhookError::Tls(e.to_string());
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| tls(&e))?;
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).map_err(|e| tls(&e))?;
    let certified = CertifiedKey::from_der(chain, key, provider).map_err(|e| tls(&e))?;
    Ok(Arc::new(certified))
}

impl Renewing {
    /// The certificate to serve at `now`: a new one once half the validity has passed.
    fn at(&self, now: OffsetDateTime) -> Arc<CertifiedKey> {
        let mut current = self.current.lock();
        if now - current.1 >= WEBHOOK_VALIDITY / 2 {
            match issue(&self.ca, &self.names, &self.provider) {
                Ok(key) => *current = (key, now),
                // The old one is still valid for a while: serve it, try again next time.
                Err(e) => tracing::warn!(error = %e, "cannot renew the webhook's certificate"),
            }
        }
        current.0.clone()
    }
}

impl ResolvesServerCert for Renewing {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.at(OffsetDateTime::now_utc()))
    }
}

/// The server's TLS configuration: a certificate for `names` issued by `ca` (renewed at
/// half its validity).
pub fn tls_config(ca: Arc<MoverCa>, names: Vec<String>) -> Result<Arc<ServerConfig>, WebhookError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let first = issue(&ca, &names, &provider)?;
    let resolver = Renewing {
        ca,
        names,
        provider: provider.clone(),
        current: Mutex::new((first, OffsetDateTime::now_utc())),
    };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| WebhookError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The bounds on the webhook's connections.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// How long a client has to complete the TLS handshake.
    pub handshake: std::time::Duration,
    /// How long a client has to send a request's headers (each request on the connection).
    pub headers: std::time::Duration,
    /// How long a client has to send a request's body once its headers are in.
    pub body: std::time::Duration,
    /// How long a connection is kept: then it is closed once its request in flight is
    /// answered (the API server opens another).
    pub life: std::time::Duration,
    /// How many connections are served at once.
    pub connections: usize,
}

impl Default for Limits {
    /// The API server's webhook calls time out after at most 30 s (10 s by default) and
    /// reuse few connections: 10 s for each of the handshake, the headers and the body,
    /// a connection kept at most 5 minutes, 64 at once.
    fn default() -> Self {
        Self {
            handshake: std::time::Duration::from_secs(10),
            headers: std::time::Duration::from_secs(10),
            body: std::time::Duration::from_secs(10),
            life: std::time::Duration::from_secs(300),
            connections: 64,
        }
    }
}

/// Serves the webhook on `listener` with the default [`Limits`] until the task is dropped.
pub async fn serve(listener: TcpListener, tls: Arc<ServerConfig>, key: Arc<StampKey>) {
    serve_with(listener, tls, key, Limits::default()).await
}

/// Serves the webhook on `listener` within `limits` until the task is dropped.
pub async fn serve_with(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    key: Arc<StampKey>,
    limits: Limits,
) {
    let acceptor = TlsAcceptor::from(tls);
    let slots = Arc::new(Semaphore::new(limits.connections.max(1)));
    loop {
        // A slot first: beyond the bound, connections wait in the kernel's backlog.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "webhook listener accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let stream = match tokio::time::timeout(limits.handshake, acceptor.accept(stream)).await
            {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "webhook TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!("webhook TLS handshake timed out");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let key = key.clone();
                async move { Ok::<_, Infallible>(handle(req, &key, limits.body).await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.headers)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                () = tokio::time::sleep(limits.life) => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, "webhook connection ended");
            }
        });
    }
}

fn reply(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}

async fn handle(
    req: Request<Incoming>,
    key: &StampKey,
    body_time: std::time::Duration,
) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&http::Method::POST, PATH) => {
            let read = Limited::new(req.into_body(), MAX_BODY).collect();
            let body = match tokio::time::timeout(body_time, read).await {
                Ok(Ok(b)) => b.to_bytes(),
                Ok(Err(e)) => {
                    let text = format!("cannot read the AdmissionReview: {e}\n");
                    return reply(StatusCode::BAD_REQUEST, "text/plain", text.into_bytes());
                }
                Err(_) => {
                    let text = format!(
                        "the AdmissionReview's body did not come within {} s\n",
                        body_time.as_secs_f32()
                    );
                    let mut response =
                        reply(StatusCode::REQUEST_TIMEOUT, "text/plain", text.into_bytes());
                    // The rest of the body is not read: the connection cannot be reused.
                    response.headers_mut().insert(
                        http::header::CONNECTION,
                        http::HeaderValue::from_static("close"),
                    );
                    return response;
                }
            };
            let review = answer(&body, key);
            reply(
                StatusCode::OK,
                "application/json",
                serde_json::to_vec(&review).unwrap_or_default(),
            )
        }
        (&http::Method::GET, "/healthz") => reply(StatusCode::OK, "text/plain", b"ok\n".to_vec()),
        _ => reply(StatusCode::NOT_FOUND, "text/plain", b"not found\n".to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_certificate_is_issued_again_at_half_its_validity() {
        let ca = Arc::new(MoverCa::generate().unwrap());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let names = service_names("hook", "ns");
        let start = OffsetDateTime::now_utc();
        let first = issue(&ca, &names, &provider).unwrap();
        let renewing = Renewing {
            ca,
            names,
            provider,
            current: Mutex::new((first.clone(), start)),
        };
        let early = renewing.at(start + WEBHOOK_VALIDITY / 2 - time::Duration::minutes(1));
        assert!(Arc::ptr_eq(&early, &first));
        let renewed = renewing.at(start + WEBHOOK_VALIDITY / 2);
        assert!(!Arc::ptr_eq(&renewed, &first));
        assert_ne!(renewed.cert[0], first.cert[0]);
        let later = renewing.at(start + WEBHOOK_VALIDITY / 2 + time::Duration::minutes(1));
        assert!(
            Arc::ptr_eq(&later, &renewed),
            "kept until its own half-life"
        );
    }
}
