//! What the reconciler steps need to know about a kind (Transfer, Checksum): its claims,
//! its mover pod, its jobs, and how job reports become its status. The steps themselves
//! are generic over this trait, so both kinds go through the same state machine.

use std::fmt::Debug;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::crd::{ClaimRetention, Endpoint, PvcTemplate, SecretKeyRef, ValidationError};
use crate::mover::{MoverError, MoverPodInput, ResolvedPvc};

use super::context::{Context, MANAGER};
use super::error::Error;
use super::life::HasLife;
use super::link::{JobReport, JobRequest};

/// A claim a resource names.
#[derive(Debug, Clone, Copy)]
pub enum Claim<'a> {
    /// An existing claim.
    Existing(&'a str),
    /// A claim the operator creates, and whether the resource's deletion takes it.
    Template(&'a PvcTemplate, ClaimRetention),
}

/// How finished jobs end the resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every job succeeded (and the digests match).
    Succeeded,
    /// A permanent failure: the condition reason and the message.
    Failed {
        /// Condition reason (`Failed`, `DigestMismatch`).
        reason: &'static str,
        /// What went wrong and what to fix.
        message: String,
    },
    /// A transient failure: a new mover resumes from the checkpoint.
    Retry {
        /// What went wrong.
        message: String,
    },
    /// This step's jobs succeeded and the next step's run on the same mover (a backup,
    /// then the prune after it): the status records the step, the mover stays, and the
    /// next reconcile starts the jobs [`MoverKind::jobs`] gives for the new status.
    Continue {
        /// What was done.
        message: String,
    },
}

impl Outcome {
    /// A failure's end: a retry on a new mover when `transient`, else Failed (reason
    /// `Failed`), with `message`.
    pub fn of_failure(transient: bool, message: String) -> Self {
        if transient {
            Self::Retry { message }
        } else {
            Self::Failed {
                reason: crate::crd::status::condition::reason::FAILED,
                message,
            }
        }
    }
}

/// A kind the operator runs movers for.
pub trait MoverKind:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// Its status.
    type Status: HasLife + Serialize + Debug;
    /// The kind's name (`Transfer`).
    const KIND: &'static str;
    /// The short name used in mover pod names (`ft`).
    const SHORT: &'static str;

    /// The status, if written.
    fn status(&self) -> Option<&Self::Status>;
    /// What the schema cannot check.
    fn validate(&self) -> Result<(), ValidationError>;
    /// Every claim it names, in spec order.
    fn claims(&self) -> Vec<Claim<'_>>;
    /// Every endpoint it names (for the Secrets they reference).
    fn endpoints(&self) -> Vec<&Endpoint>;
    /// Secret keys it references outside its endpoints (a repository's encryption key).
    fn secret_keys(&self) -> Vec<&SecretKeyRef> {
        Vec::new()
    }
    /// Its mover pod.
    fn mover_pod(&self, input: &MoverPodInput<'_>) -> Result<Pod, MoverError>;
    /// Whether it reads claim `name` as an image that must not change while it is read
    /// (a Transfer's source: Some(true)); None when the kind reads live volumes by design
    /// (a Backup of a running app).
    fn reads_whole_image(&self, _name: &str) -> Option<bool> {
        None
    }
    /// The node its mover is placed on, if the spec places it: the claims it creates are
    /// provisioned for that node.
    fn placed_on(&self) -> Option<&str> {
        None
    }
    /// Its jobs, resuming from what the status recorded.
    fn jobs(
        &self,
        status: &Self::Status,
        pvcs: &[ResolvedPvc],
    ) -> Result<Vec<JobRequest>, MoverError>;
    /// Progress, checkpoint and per-job state of the latest reports, into the status.
    fn observe(&self, status: &mut Self::Status, reports: &[JobReport]);
    /// Whether a write of `after` over `before` records new committed ranges (written at
    /// once, not throttled).
    fn checkpoint_changed(before: &Self::Status, after: &Self::Status) -> bool;
    /// How finished jobs end the resource (or its step), given the status they were
    /// observed into.
    fn outcome(&self, status: &Self::Status, reports: &[JobReport]) -> Outcome;
    /// Copies what the operator looked up for this reconcile (never stored, so missing
    /// from the object a write returns) into `written`.
    fn keep_lookups(&self, _written: &mut Self) {}
    /// What succeeded jobs produced (digests, a snapshot id), into the status; called for
    /// [`Outcome::Succeeded`] and [`Outcome::Continue`].
    fn succeed(&self, status: &mut Self::Status, reports: &[JobReport]);
}

/// Namespace, name and uid of a stored resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ids {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl Ids {
    /// The ids of a resource read from the API.
    pub fn of<K: MoverKind>(obj: &K) -> Result<Self, Error> {
        let meta = obj.meta();
        match (&meta.namespace, &meta.name, &meta.uid) {
            (Some(namespace), Some(name), Some(uid)) => Ok(Self {
                namespace: namespace.clone(),
                name: name.clone(),
                uid: uid.clone(),
            }),
            _ => Err(Error::NotStored(K::KIND)),
        }
    }
}

/// Writes the whole status by server-side apply (field manager `ferry-operator`), so
/// what the operator no longer sets is removed. The write carries the resource version
/// of `based_on`, the object the step decided on: when the resource changed since (a
/// reconcile working from a stale copy while the follow task wrote), the API server
/// refuses it (409) and the next reconcile decides again from the current object.
/// Returns the resource as written.
pub async fn write_status<K: MoverKind>(
    ctx: &Context,
    ids: &Ids,
    based_on: &K,
    status: &K::Status,
) -> Result<K, Error> {
    let mut written = apply_status(ctx, &ids.namespace, &ids.name, based_on, status).await?;
    based_on.keep_lookups(&mut written);
    Ok(written)
}

/// Applies `status` to the namespaced object `name` (any kind with a status subresource),
/// as the operator's field manager, based on `based_on`'s resource version; returns the
/// object as written.
pub async fn apply_status<K>(
    ctx: &Context,
    namespace: &str,
    name: &str,
    based_on: &K,
    status: &impl Serialize,
) -> Result<K, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    let mut body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    if let Some(version) = &based_on.meta().resource_version {
        body["metadata"] = serde_json::json!({ "resourceVersion": version });
    }
    Ok(api
        .patch_status(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(body),
        )
        .await?)
}
