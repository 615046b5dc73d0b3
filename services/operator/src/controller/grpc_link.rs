//! [`MoverLink`] over gRPC: the reconcilers start, follow and cancel a mover's jobs
//! through the JobService of the `ferry serve` in the mover pod (ferry-api's client
//! stubs), authenticated with the mover's bearer token; jobs come back as
//! [`JobReport`]s ([`report`]).
//!
//! It sits in the controller beside the trait it implements and the reports it yields:
//! the reconcilers are its only callers, and the requests it sends are already the
//! ferry-api messages the mover pods' service takes, so there is nothing to convert.
//!
//! With the movers' CA ([`GrpcMoverLink::with_ca`]) the link speaks mutual TLS: it
//! trusts only movers whose certificate the CA made for their pod, and shows its own
//! (see [`crate::mover::tls`]).
//!
//! `start` keeps the trait's idempotency contract: when the mover already has a job of
//! the same idempotency key started with another request (a restarted operator resuming
//! from a newer checkpoint), that job is looked up by its labels and returned.

pub mod report;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ferry_api::auth::BearerToken;
use ferry_api::proto::{self, job_service_client::JobServiceClient};
use ferry_core::Secret;
use futures::StreamExt;
use parking_lot::Mutex;
use tonic::codegen::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

use super::link::{JobReport, JobRequest, LinkError, MoverAddress, MoverLink, ReportStream};
use crate::mover::request::OWNER_UID_LABEL;
use crate::mover::tls::{self, MoverCa};
use report::report;

type Client = JobServiceClient<InterceptedService<Channel, BearerToken>>;

/// Most pages of jobs read when looking a job up by its labels.
const MAX_PAGES: usize = 16;

/// How long the link waits for a mover before it calls it lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkTimeouts {
    /// A TCP (and TLS) connection to the mover.
    pub connect: Duration,
    /// One unary call (start, list, cancel); not the job streams, which last as long
    /// as their jobs.
    pub request: Duration,
    /// An HTTP/2 PING is sent when the connection has been quiet this long, streams or
    /// not: a mover that stopped answering (its node gone, a half-open connection, a
    /// frozen process) is noticed even while a job stream waits for the next report.
    pub keepalive_interval: Duration,
    /// The connection, and every stream on it, is closed when a PING is not answered
    /// within this time.
    pub keepalive_timeout: Duration,
}

impl Default for LinkTimeouts {
    /// A silent mover is noticed within 30 s.
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(10),
            request: Duration::from_secs(60),
            keepalive_interval: Duration::from_secs(20),
            keepalive_timeout: Duration::from_secs(10),
        }
    }
}

/// [`MoverLink`] over the movers' gRPC JobService.
#[derive(Debug, Clone, Default)]
pub struct GrpcMoverLink {
    timeouts: LinkTimeouts,
    tls: Option<Arc<ClientTls>>,
    channels: Arc<Mutex<Channels>>,
}

/// Connections to movers, one per mover pod (by namespace, name, address and port), so
/// that a reconcile's calls share one HTTP/2 connection and one TLS handshake instead of
/// making their own. A channel reconnects by itself when its connection broke; one older
/// than [`CHANNEL_REUSE`] is made anew (with the operator's current client certificate).
#[derive(Debug, Default)]
struct Channels {
    by_mover: std::collections::HashMap<(String, String, String, u16), (Channel, Instant)>,
}

/// How long a channel to a mover is reused: well inside the client certificate's
/// renewal time.
const CHANNEL_REUSE: Duration = Duration::from_secs(3600);

/// Most channels kept: the oldest goes first beyond it (movers that ended).
const MAX_CHANNELS: usize = 1024;

impl Channels {
    fn get(&self, key: &(String, String, String, u16)) -> Option<Channel> {
        self.by_mover
            .get(key)
            .filter(|(_, made)| made.elapsed() < CHANNEL_REUSE)
            .map(|(channel, _)| channel.clone())
    }

    fn keep(&mut self, key: (String, String, String, u16), channel: Channel) {
        self.by_mover
            .retain(|_, (_, made)| made.elapsed() < CHANNEL_REUSE);
        if self.by_mover.len() >= MAX_CHANNELS {
            let oldest = self
                .by_mover
                .iter()
                .min_by_key(|(_, (_, made))| *made)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.by_mover.remove(&oldest);
            }
        }
        self.by_mover.insert(key, (channel, Instant::now()));
    }
}

/// The operator's side of the movers' mutual TLS: the CA both sides trust and the
/// operator's client certificate, made again at half its validity.
#[derive(Debug)]
struct ClientTls {
    ca: Arc<MoverCa>,
    identity: Mutex<Option<(Identity, Instant)>>,
}

impl ClientTls {
    /// The client certificate to present (a fresh one once the last is half-way old).
    fn identity(&self) -> Result<Identity, LinkError> {
        let renew = Duration::try_from(tls::CLIENT_VALIDITY / 2).unwrap_or_default();
        let mut held = self.identity.lock();
        if let Some((identity, made)) = held.as_ref() {
            if made.elapsed() < renew {
                return Ok(identity.clone());
            }
        }
        let issued = self
            .ca
            .issue_client()
            .map_err(|e| LinkError::Rejected(e.to_string()))?;
        let identity = Identity::from_pem(issued.cert_pem, issued.key_pem);
        *held = Some((identity.clone(), Instant::now()));
        Ok(identity)
    }
}

impl GrpcMoverLink {
    /// A link with these timeouts, over plain HTTP/2 (movers without certificates).
    pub fn new(timeouts: LinkTimeouts) -> Self {
        Self {
            timeouts,
            tls: None,
            channels: Arc::default(),
        }
    }

    /// The same link over mutual TLS: movers are checked against `ca` under their pod's
    /// name ([`tls::mover_server_name`]), and the operator presents a certificate of `ca`.
    pub fn with_ca(self, ca: Arc<MoverCa>) -> Self {
        Self {
            tls: Some(Arc::new(ClientTls {
                ca,
                identity: Mutex::new(None),
            })),
            ..self
        }
    }

    fn tls_config(&self, mover: &MoverAddress) -> Result<Option<ClientTlsConfig>, LinkError> {
        let Some(tls) = &self.tls else {
            return Ok(None);
        };
        Ok(Some(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(tls.ca.cert_pem()))
                .identity(tls.identity()?)
                .domain_name(tls::mover_server_name(&mover.pod, &mover.namespace)),
        ))
    }

    async fn client(&self, mover: &MoverAddress) -> Result<Client, LinkError> {
        let key = (
            mover.namespace.clone(),
            mover.pod.clone(),
            mover.ip.clone(),
            mover.port,
        );
        let cached = self.channels.lock().get(&key);
        let channel = match cached {
            Some(channel) => channel,
            None => {
                let channel = self.connect(mover).await?;
                self.channels.lock().keep(key, channel.clone());
                channel
            }
        };
        let token = Secret::new(mover.token.clone());
        let auth =
            BearerToken::new(Some(&token)).map_err(|e| LinkError::Rejected(e.to_string()))?;
        Ok(JobServiceClient::with_interceptor(channel, auth))
    }

    /// A new connection to `mover`.
    async fn connect(&self, mover: &MoverAddress) -> Result<Channel, LinkError> {
        let t = &self.timeouts;
        let host = if mover.ip.contains(':') {
            format!("[{}]", mover.ip)
        } else {
            mover.ip.clone()
        };
        let tls = self.tls_config(mover)?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{host}:{}", mover.port))
            .map_err(|e| LinkError::Rejected(format!("mover address {host}: {e}")))?;
        if let Some(tls) = tls {
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| LinkError::Rejected(format!("TLS to mover {}: {e}", mover.pod)))?;
        }
        endpoint
            .connect_timeout(t.connect)
            .timeout(t.request)
            .http2_keep_alive_interval(t.keepalive_interval)
            .keep_alive_timeout(t.keepalive_timeout)
            .keep_alive_while_idle(true)
            .connect()
            .await
            .map_err(|e| LinkError::Unavailable(format!("{}: {e}", mover.pod)))
    }
}

/// A gRPC status as the reconciler needs it: worth asking again, or not.
fn link_error(status: &Status) -> LinkError {
    let text = format!("{:?}: {}", status.code(), status.message());
    match status.code() {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::Cancelled
        | Code::Unknown
        | Code::ResourceExhausted
        | Code::FailedPrecondition => LinkError::Unavailable(text),
        _ => LinkError::Rejected(text),
    }
}

/// Sends the request to its RPC.
async fn send(client: &mut Client, job: &JobRequest) -> Result<proto::Job, Status> {
    let job = match job {
        JobRequest::Transfer(r) => client.start_transfer(r.as_ref().clone()).await,
        JobRequest::Checksum(r) => client.start_checksum(r.as_ref().clone()).await,
        JobRequest::Backup(r) => client.start_backup(r.as_ref().clone()).await,
        JobRequest::Prune(r) => client.start_prune(r.as_ref().clone()).await,
        JobRequest::Restore(r) => client.start_restore(r.as_ref().clone()).await,
        JobRequest::Sync(r) => client.start_sync(r.as_ref().clone()).await,
    };
    Ok(job?.into_inner())
}

#[async_trait]
impl MoverLink for GrpcMoverLink {
    async fn start(&self, mover: &MoverAddress, job: &JobRequest) -> Result<JobReport, LinkError> {
        let mut client = self.client(mover).await?;
        match send(&mut client, job).await {
            Ok(started) => Ok(report(&started)),
            Err(status) if status.code() == Code::AlreadyExists => {
                find_by_key(&mut client, job.labels(), job.idempotency_key())
                    .await?
                    .ok_or_else(|| link_error(&status))
            }
            Err(status) => Err(link_error(&status)),
        }
    }

    async fn watch(&self, mover: &MoverAddress, job_id: &str) -> Result<ReportStream, LinkError> {
        let mut client = self.client(mover).await?;
        let stream = client
            .watch_job(proto::WatchJobRequest { id: job_id.into() })
            .await
            .map_err(|s| link_error(&s))?
            .into_inner();
        Ok(stream
            .map(|event| match event {
                Ok(proto::JobEvent { job: Some(job) }) => Ok(report(&job)),
                Ok(proto::JobEvent { job: None }) => Err(LinkError::Unavailable(
                    "the mover sent an event without a job".into(),
                )),
                Err(status) => Err(link_error(&status)),
            })
            .boxed())
    }

    async fn cancel(&self, mover: &MoverAddress, owner_uid: &str) -> Result<(), LinkError> {
        let mut client = self.client(mover).await?;
        let labels = [(OWNER_UID_LABEL.to_string(), owner_uid.to_string())].into();
        let states = vec![
            proto::JobState::Queued as i32,
            proto::JobState::Running as i32,
        ];
        for job in list(&mut client, &labels, states).await? {
            match client
                .cancel_job(proto::CancelJobRequest { id: job.id })
                .await
            {
                Ok(_) => {}
                // Ended in the meantime.
                Err(s) if s.code() == Code::FailedPrecondition || s.code() == Code::NotFound => {}
                Err(s) => return Err(link_error(&s)),
            }
        }
        Ok(())
    }

    async fn end_relay(&self, mover: &MoverAddress, owner_uid: &str) -> Result<(), LinkError> {
        let mut client = self.client(mover).await?;
        let labels = [(OWNER_UID_LABEL.to_string(), owner_uid.to_string())].into();
        let states = vec![proto::JobState::Running as i32];
        for job in list(&mut client, &labels, states).await? {
            match client
                .end_relay(proto::EndRelayRequest { id: job.id })
                .await
            {
                Ok(_) => {}
                // A job that relays nothing (a prune after the copy), or gone meanwhile.
                Err(s) if s.code() == Code::FailedPrecondition || s.code() == Code::NotFound => {}
                Err(s) => return Err(link_error(&s)),
            }
        }
        Ok(())
    }
}

/// Jobs with these labels (and states, when given), at most [`MAX_PAGES`] pages.
async fn list(
    client: &mut Client,
    labels: &BTreeMap<String, String>,
    states: Vec<i32>,
) -> Result<Vec<proto::Job>, LinkError> {
    let mut jobs = Vec::new();
    let mut page_token = String::new();
    for _ in 0..MAX_PAGES {
        let page = client
            .list_jobs(proto::ListJobsRequest {
                states: states.clone(),
                labels: labels.clone(),
                kind: 0,
                page_size: 100,
                page_token,
            })
            .await
            .map_err(|s| link_error(&s))?
            .into_inner();
        jobs.extend(page.jobs);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    Ok(jobs)
}

/// The job of this idempotency key among those with these labels.
async fn find_by_key(
    client: &mut Client,
    labels: &BTreeMap<String, String>,
    key: &str,
) -> Result<Option<JobReport>, LinkError> {
    Ok(list(client, labels, Vec::new())
        .await?
        .iter()
        .find(|j| j.idempotency_key == key)
        .map(report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_split_into_retry_and_refuse() {
        assert!(matches!(
            link_error(&Status::unavailable("down")),
            LinkError::Unavailable(_)
        ));
        assert!(matches!(
            link_error(&Status::invalid_argument("bad")),
            LinkError::Rejected(_)
        ));
        assert!(matches!(
            link_error(&Status::unauthenticated("token")),
            LinkError::Rejected(_)
        ));
    }
}
