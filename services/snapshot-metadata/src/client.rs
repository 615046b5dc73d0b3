//! [`Client`]: a TLS connection to the SnapshotMetadata service and its two streams,
//! each collected into validated [`Ranges`], resumed from the last extent when it
//! breaks.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::time::{timeout, Instant};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Status, Streaming};

use crate::error::{Error, Result};
use crate::proto::snapshot_metadata_client::SnapshotMetadataClient;
use crate::proto::{
    BlockMetadata, GetMetadataAllocatedRequest, GetMetadataAllocatedResponse,
    GetMetadataDeltaRequest, GetMetadataDeltaResponse,
};
use crate::token::SecurityToken;
use crate::validate::{Collector, Invalid, Ranges};

/// Separate ranges accepted by default: 16 bytes each, so at most 16 MiB held. A 1 TiB
/// volume with a changed 4 KiB block in every 1 MiB has a million.
pub const DEFAULT_MAX_EXTENTS: usize = 1 << 20;
/// Times a broken stream is resumed by default before the answer is given up.
pub const DEFAULT_RESUMES: u32 = 3;
/// Longest server text kept in an error.
const MAX_MESSAGE: usize = 300;

/// Where the service is and how to talk to it.
#[derive(Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// `https://HOST:PORT` (the `SnapshotMetadataService` object's address).
    pub endpoint: String,
    /// The CA certificate(s) the service's certificate must chain to (PEM).
    pub ca_pem: Vec<u8>,
    /// A token for the service's audience.
    pub token: SecurityToken,
    /// The namespace of the VolumeSnapshots.
    pub namespace: String,
    /// Separate ranges (after joining adjacent ones) beyond which an answer is refused.
    pub max_extents: usize,
    /// Times a broken stream is resumed from its last extent.
    pub resumes: u32,
    pub connect_timeout: Duration,
    /// Longest wait for the next message of a stream.
    pub idle_timeout: Duration,
    /// Longest time one answer (with its resumptions) may take.
    pub total_timeout: Duration,
    /// `max_results` of each request (0: the sidecar chooses).
    pub max_results: i32,
}

impl ClientConfig {
    pub fn new(
        endpoint: impl Into<String>,
        ca_pem: Vec<u8>,
        token: SecurityToken,
        namespace: impl Into<String>,
    ) -> Self {
        Self {
            endpoint: endpoint.into(),
            ca_pem,
            token,
            namespace: namespace.into(),
            max_extents: DEFAULT_MAX_EXTENTS,
            resumes: DEFAULT_RESUMES,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            total_timeout: Duration::from_secs(30 * 60),
            max_results: 0,
        }
    }

    pub fn with_max_extents(mut self, max_extents: usize) -> Self {
        self.max_extents = max_extents.max(1);
        self
    }

    pub fn with_resumes(mut self, resumes: u32) -> Self {
        self.resumes = resumes;
        self
    }

    pub fn with_timeouts(mut self, connect: Duration, idle: Duration, total: Duration) -> Self {
        self.connect_timeout = connect;
        self.idle_timeout = idle;
        self.total_timeout = total;
        self
    }
}

impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("endpoint", &self.endpoint)
            .field("ca_pem_bytes", &self.ca_pem.len())
            .field("token", &self.token)
            .field("namespace", &self.namespace)
            .field("max_extents", &self.max_extents)
            .field("resumes", &self.resumes)
            .finish_non_exhaustive()
    }
}

/// A connected client.
#[derive(Debug, Clone)]
pub struct Client {
    stub: SnapshotMetadataClient<Channel>,
    config: ClientConfig,
}

impl Client {
    /// Connects over TLS, trusting only `config.ca_pem`.
    pub async fn connect(config: ClientConfig) -> Result<Self> {
        if !config.endpoint.starts_with("https://") {
            return Err(Error::Config(format!(
                "the service address '{}' is not an https:// URL (the SnapshotMetadata service is served over TLS only)",
                config.endpoint
            )));
        }
        if !String::from_utf8_lossy(&config.ca_pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(Error::Config(
                "the CA certificate holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
            ));
        }
        if config.token.is_empty() {
            return Err(Error::Config("the security token is empty".into()));
        }
        let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&config.ca_pem));
        let endpoint = Endpoint::from_shared(config.endpoint.clone())
            .map_err(|e| Error::Config(format!("'{}': {}", config.endpoint, chain(&e))))?
            .connect_timeout(config.connect_timeout)
            .tls_config(tls)
            .map_err(|e| Error::Config(chain(&e)))?;
        let channel = match timeout(config.connect_timeout, endpoint.connect()).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(e)) => {
                return Err(Error::Unreachable {
                    endpoint: config.endpoint.clone(),
                    reason: config.token.redact(&chain(&e)),
                })
            }
            Err(_) => {
                return Err(Error::Unreachable {
                    endpoint: config.endpoint.clone(),
                    reason: format!("no connection within {:?}", config.connect_timeout),
                })
            }
        };
        Ok(Self {
            stub: SnapshotMetadataClient::new(channel),
            config,
        })
    }

    /// The allocated ranges of VolumeSnapshot `snapshot` (`GetMetadataAllocated`).
    /// `capacity`, when known, must be the volume's.
    pub async fn allocated(&self, snapshot: &str, capacity: Option<u64>) -> Result<Ranges> {
        let config = &self.config;
        self.collect(capacity, |offset| {
            let mut stub = self.stub.clone();
            let request = GetMetadataAllocatedRequest {
                security_token: config.token.expose().to_string(),
                namespace: config.namespace.clone(),
                snapshot_name: snapshot.to_string(),
                starting_offset: offset as i64,
                max_results: config.max_results,
            };
            async move {
                stub.get_metadata_allocated(request)
                    .await
                    .map(|r| r.into_inner())
            }
        })
        .await
    }

    /// The ranges changed from the snapshot whose CSI handle is `base_snapshot_id` to
    /// VolumeSnapshot `target` (`GetMetadataDelta`).
    pub async fn delta(
        &self,
        base_snapshot_id: &str,
        target: &str,
        capacity: Option<u64>,
    ) -> Result<Ranges> {
        let config = &self.config;
        self.collect(capacity, |offset| {
            let mut stub = self.stub.clone();
            let request = GetMetadataDeltaRequest {
                security_token: config.token.expose().to_string(),
                namespace: config.namespace.clone(),
                base_snapshot_id: base_snapshot_id.to_string(),
                target_snapshot_name: target.to_string(),
                starting_offset: offset as i64,
                max_results: config.max_results,
            };
            async move {
                stub.get_metadata_delta(request)
                    .await
                    .map(|r| r.into_inner())
            }
        })
        .await
    }

    /// Runs streams opened by `open(starting_offset)` until one ends cleanly, resuming
    /// a broken one from the last extent received, at most `resumes` times.
    async fn collect<R, F, Fut>(&self, capacity: Option<u64>, open: F) -> Result<Ranges>
    where
        R: Reply,
        F: Fn(u64) -> Fut,
        Fut: Future<Output = std::result::Result<Streaming<R>, Status>>,
    {
        let config = &self.config;
        let deadline = Instant::now() + config.total_timeout;
        let mut collector = Collector::new(config.max_extents, capacity);
        let mut breaks = 0u32;
        loop {
            let offset = collector.resume_offset();
            let status = match tokio::time::timeout_at(deadline, async {
                let mut stream = match timeout(config.idle_timeout, open(offset)).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(status)) => return Ok::<_, Invalid>(Some(status)),
                    Err(_) => return Ok(Some(idle(config.idle_timeout))),
                };
                loop {
                    match timeout(config.idle_timeout, stream.message()).await {
                        Ok(Ok(Some(reply))) => {
                            let (style, capacity, blocks) = reply.parts();
                            collector.accept(style, capacity, blocks)?;
                        }
                        Ok(Ok(None)) => return Ok(None),
                        Ok(Err(status)) => return Ok(Some(status)),
                        Err(_) => return Ok(Some(idle(config.idle_timeout))),
                    }
                }
            })
            .await
            {
                Err(_) => {
                    return Err(Error::Timeout(format!(
                        "no complete answer within {:?}",
                        config.total_timeout
                    )))
                }
                Ok(Err(invalid)) => return Err(Error::InvalidReply(invalid)),
                Ok(Ok(None)) => return Ok(collector.finish()?),
                Ok(Ok(Some(status))) => status,
            };
            let err = self.classify(&status);
            if !resumable(status.code()) {
                return Err(err);
            }
            breaks += 1;
            let at = collector.resume_offset();
            if breaks > config.resumes {
                return Err(Error::Interrupted {
                    attempts: breaks,
                    offset: at,
                    last: err.to_string(),
                });
            }
            tracing::warn!(offset = at, attempt = breaks, error = %err, "the SnapshotMetadata stream broke: resuming");
            collector.resume();
            tokio::time::sleep(Duration::from_millis(100 * u64::from(breaks))).await;
        }
    }

    /// The error a status stands for, its text redacted and cut short.
    fn classify(&self, status: &Status) -> Error {
        let mut message = self.config.token.redact(status.message());
        if message.len() > MAX_MESSAGE {
            let mut cut = MAX_MESSAGE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str("...");
        }
        let code = format!("{:?}", status.code());
        match status.code() {
            Code::Unauthenticated => Error::Unauthenticated { message },
            Code::PermissionDenied => Error::PermissionDenied { message },
            Code::NotFound | Code::InvalidArgument => Error::UnknownSnapshot { code, message },
            _ => Error::Rpc { code, message },
        }
    }
}

/// Whether a stream that ended with `code` may be resumed: the service or the way to it
/// broke, rather than refused the request.
fn resumable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::Internal
            | Code::Unknown
            | Code::Aborted
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::ResourceExhausted
    )
}

fn idle(wait: Duration) -> Status {
    Status::deadline_exceeded(format!("no message within {wait:?}"))
}

/// An error and its sources, `a: b: c` (tonic's transport errors say little alone).
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

/// The two response messages share their shape.
trait Reply: Send + 'static {
    fn parts(&self) -> (i32, i64, &[BlockMetadata]);
}

impl Reply for GetMetadataAllocatedResponse {
    fn parts(&self) -> (i32, i64, &[BlockMetadata]) {
        (
            self.block_metadata_type,
            self.volume_capacity_bytes,
            &self.block_metadata,
        )
    }
}

impl Reply for GetMetadataDeltaResponse {
    fn parts(&self) -> (i32, i64, &[BlockMetadata]) {
        (
            self.block_metadata_type,
            self.volume_capacity_bytes,
            &self.block_metadata,
        )
    }
}
