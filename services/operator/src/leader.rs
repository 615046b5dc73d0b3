//! Leader election through a coordination.k8s.io/v1 Lease, so that of several operator
//! replicas exactly one runs the controllers.
//!
//! The protocol is client-go's: a replica takes the Lease when it is absent (create), has
//! no holder, or its holder has not renewed it within `leaseDurationSeconds`; the leader
//! renews it every `retry_period`. Every write of an existing Lease is a replace guarded
//! by the `resourceVersion` that was read, so of two replicas racing for the same Lease
//! the API server accepts one and answers the other 409 Conflict, which is never
//! leadership. A leader that cannot renew within `renew_deadline` (or finds another
//! holder) has lost: [`Elector::hold`] returns and the caller stops its controllers, so
//! the pod restarts as a follower. On shutdown the leader releases the Lease (clears the
//! holder) so a follower takes over at once instead of waiting for the Lease to expire.
//!
//! A third-party crate was considered: kube-leader-election needs kube 4, and
//! kube-lease-manager (kube 5) writes with unguarded strategic-merge patches and runs its
//! own background task; this module is small and its requests are tested exactly.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

/// Where the Lease is and how it is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// Who this replica is (its pod name).
    pub identity: String,
    /// How long a Lease stays held without a renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up leadership; shorter
    /// than `lease_duration`, so it stops before a follower may take over.
    pub renew_deadline: Duration,
    /// How often the leader renews and a follower tries to acquire.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's defaults (15 s lease, 10 s renew deadline, 2 s retry) for this Lease
    /// and identity.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// The identity of this replica: the pod name (POD_NAME, from the downward API), else
/// the host name (a pod's host name is its name).
pub fn identity() -> String {
    let from_env = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.trim().is_empty());
    from_env
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "ferry-operator".to_string())
}

/// What one try to acquire or renew found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// This replica holds the Lease (it acquired or renewed it).
    Leading,
    /// Another replica holds it and renewed it in time.
    HeldBy(String),
    /// Another replica wrote the Lease between our read and our write (409).
    LostRace,
}

/// Why leadership ended, or could not be tried.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The API server refused or could not be reached.
    #[error("lease {name}: {source}")]
    Api {
        /// The Lease.
        name: String,
        /// What the API said.
        #[source]
        source: kube::Error,
    },
    /// Another replica took the Lease.
    #[error("lost the leader lease to {0}")]
    TakenBy(String),
    /// The Lease was not renewed within the renew deadline.
    #[error("could not renew the leader lease within {0:?}")]
    NotRenewed(Duration),
}

fn micro(t: Timestamp) -> MicroTime {
    MicroTime(t)
}

/// Whether a Lease held by someone else may be taken: no holder, or not renewed within
/// its duration.
fn is_free(spec: &LeaseSpec, now: Timestamp) -> bool {
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() {
        return true;
    }
    let (Some(renewed), Some(seconds)) = (spec.renew_time.as_ref(), spec.lease_duration_seconds)
    else {
        return true;
    };
    match renewed
        .0
        .checked_add(SignedDuration::from_secs(i64::from(seconds)))
    {
        Ok(expires) => expires < now,
        Err(_) => false,
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Takes, renews and releases one Lease for one identity.
#[derive(Debug, Clone)]
pub struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
}

impl Elector {
    /// An elector for the Lease of `config`.
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    fn api_error(&self, source: kube::Error) -> LeaderError {
        LeaderError::Api {
            name: format!("{}/{}", self.config.namespace, self.config.name),
            source,
        }
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.config.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// One try: create the Lease if absent, renew it if ours, take it if free; a Lease
    /// held by another live holder is left alone.
    pub async fn try_acquire_or_renew(&self) -> Result<Attempt, LeaderError> {
        let now = Timestamp::now();
        let Some(mut lease) = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(|e| self.api_error(e))?
        else {
            return self.create(now).await;
        };
        let mut spec = lease.spec.take().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let ours = holder == self.config.identity;
        if !ours && !is_free(&spec, now) {
            return Ok(Attempt::HeldBy(holder));
        }
        if !ours {
            spec.holder_identity = Some(self.config.identity.clone());
            spec.acquire_time = Some(micro(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        spec.renew_time = Some(micro(now));
        spec.lease_duration_seconds = Some(self.duration_seconds());
        lease.spec = Some(spec);
        self.replace(&lease).await
    }

    async fn create(&self, now: Timestamp) -> Result<Attempt, LeaderError> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.config.name.clone()),
                namespace: Some(self.config.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.config.identity.clone()),
                lease_duration_seconds: Some(self.duration_seconds()),
                acquire_time: Some(micro(now)),
                renew_time: Some(micro(now)),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(Attempt::Leading),
            Err(e) if is_conflict(&e) => Ok(Attempt::LostRace),
            Err(e) => Err(self.api_error(e)),
        }
    }

    /// Replaces the Lease as read (its `resourceVersion` guards the write).
    async fn replace(&self, lease: &Lease) -> Result<Attempt, LeaderError> {
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), lease)
            .await
        {
            Ok(_) => Ok(Attempt::Leading),
            Err(e) if is_conflict(&e) => Ok(Attempt::LostRace),
            Err(e) => Err(self.api_error(e)),
        }
    }

    /// Waits until this replica leads, trying every `retry_period`; API errors are
    /// logged and tried again (a follower has nothing better to do).
    pub async fn acquire(&self) {
        let mut last_holder = None;
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Leading) => {
                    tracing::info!(lease = %self.config.name, identity = %self.config.identity, "leading");
                    return;
                }
                Ok(Attempt::HeldBy(holder)) => {
                    if last_holder.as_ref() != Some(&holder) {
                        tracing::info!(lease = %self.config.name, %holder, "following");
                        last_holder = Some(holder);
                    }
                }
                Ok(Attempt::LostRace) => tracing::debug!("another replica wrote the lease first"),
                Err(e) => tracing::warn!(error = %e, "cannot acquire the leader lease"),
            }
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    /// Renews the Lease every `retry_period` while this replica leads; returns why
    /// leadership ended (another holder, or no renewal within `renew_deadline`).
    pub async fn hold(&self) -> LeaderError {
        let mut renewed = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Leading) => renewed = tokio::time::Instant::now(),
                Ok(Attempt::HeldBy(holder)) => return LeaderError::TakenBy(holder),
                Ok(Attempt::LostRace) => tracing::warn!("the leader lease changed under us"),
                Err(e) => tracing::warn!(error = %e, "cannot renew the leader lease"),
            }
            if renewed.elapsed() >= self.config.renew_deadline {
                return LeaderError::NotRenewed(self.config.renew_deadline);
            }
        }
    }

    /// Hands the Lease over: clears the holder if it is still this replica (a guarded
    /// replace, so a Lease someone else took meanwhile is left alone). Whether it did.
    pub async fn release(&self) -> Result<bool, LeaderError> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(|e| self.api_error(e))?
        else {
            return Ok(false);
        };
        let mut spec = lease.spec.take().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(false);
        }
        spec.holder_identity = None;
        spec.renew_time = Some(micro(Timestamp::now()));
        lease.spec = Some(spec);
        Ok(self.replace(&lease).await? == Attempt::Leading)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, renewed_secs_ago: i64, duration: i32) -> LeaseSpec {
        let now = Timestamp::now();
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            renew_time: Some(micro(
                now.checked_sub(SignedDuration::from_secs(renewed_secs_ago))
                    .unwrap(),
            )),
            lease_duration_seconds: Some(duration),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_lease_is_free_without_a_holder_or_after_its_duration() {
        let now = Timestamp::now();
        assert!(is_free(&spec(None, 0, 15), now));
        assert!(is_free(&spec(Some(""), 0, 15), now));
        assert!(!is_free(&spec(Some("a"), 5, 15), now));
        assert!(is_free(&spec(Some("a"), 16, 15), now));
        assert!(is_free(&LeaseSpec::default(), now));
    }
}
