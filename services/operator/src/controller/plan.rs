//! What a Transfer, Checksum, Backup or Restore needs next, as a pure function of what the
//! cluster shows ([`Observed`]): wait (and why), fail, or start an attempt with exactly
//! these objects (the claims of its templates, the token Secret, the NetworkPolicy, the
//! mover pod). The reconciler reads the cluster ([`observe`]), asks [`attempt`], then does
//! the writes; `ferry operator render` asks the same function about objects from a file,
//! so what it prints is what the operator would create.
//!
//! The status each step writes is also built here ([`waiting`], [`failed`], [`starting`],
//! [`running`]): the reconciler writes it, render prints it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ListParams;
use kube::Api;

use crate::crd::status::condition::{reason, READY, RUNNING};
use crate::crd::Phase;
use crate::mover::network_policy::mover_network_policy;
use crate::mover::pod::labels;
use crate::mover::MoverPodInput;

use super::claims::{self, Resolved, Unresolved};
use super::context::Context;
use super::error::Error;
use super::kind::{Claim, Ids, MoverKind};
use super::life::{now, HasLife, Life};
use super::names;
use super::secrets;
use super::settings::OperatorSettings;
use super::users;

/// What the cluster shows that the next attempt of one resource depends on, all in the
/// resource's namespace.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// The claims the spec names (existing claims and templates' claims) that exist.
    pub claims: BTreeMap<String, PersistentVolumeClaim>,
    /// The namespace's pods, read when a named claim attaches to one node at a time (its
    /// user decides the mover's node); empty otherwise.
    pub pods: Vec<Pod>,
    /// The Secrets the spec references that exist: name -> the keys they hold.
    pub secrets: BTreeMap<String, BTreeSet<String>>,
    /// Whether the namespace assigns user IDs itself (OpenShift's SCC range annotation).
    pub assigns_ids: bool,
}

/// How the operator is set up, as far as planning goes.
#[derive(Debug, Clone, Copy)]
pub struct Setup<'a> {
    /// The operator's settings.
    pub settings: &'a OperatorSettings,
    /// Whether movers serve mutual TLS (the operator has a CA).
    pub tls: bool,
}

/// The next step of a resource that has no mover.
#[derive(Debug, Clone)]
pub enum Plan {
    /// Pending: the condition reason and what the user can do.
    Wait {
        /// `Pending` or `Refused`.
        reason: &'static str,
        /// Why, and what to do about it.
        message: String,
    },
    /// A permanent failure.
    Fail {
        /// The condition reason.
        reason: &'static str,
        /// Why, and what to do about it.
        message: String,
    },
    /// Start an attempt.
    Start(Box<Attempt>),
}

/// The objects of one attempt, in the order they are created.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// Its number (the first is 1).
    pub number: u32,
    /// The claims of the resource's templates that do not exist yet.
    pub new_claims: Vec<PersistentVolumeClaim>,
    /// The name of the mover's token Secret (its content is made when it is created).
    pub token_secret: String,
    /// The mover's NetworkPolicy, when the operator gives movers one.
    pub network_policy: Option<NetworkPolicy>,
    /// The mover pod.
    pub pod: Pod,
}

impl Attempt {
    /// The mover pod's name.
    pub fn pod_name(&self) -> &str {
        self.pod.metadata.name.as_deref().unwrap_or_default()
    }
}

/// Reads what [`attempt`] needs of `obj` from the cluster: the named claims, the pods of
/// the namespace when a claim attaches to one node, the referenced Secrets' keys; up to
/// the first missing claim, where the plan stops.
pub async fn observe<K: MoverKind>(ctx: &Context, obj: &K, ids: &Ids) -> Result<Observed, Error> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    let mut observed = Observed {
        assigns_ids: ctx.assigns_ids(&ids.namespace),
        ..Observed::default()
    };
    let mut single_node = false;
    for claim in obj.claims() {
        let name = match claim {
            Claim::Existing(name) => name,
            Claim::Template(t, _) => t.name.as_str(),
        };
        if observed.claims.contains_key(name) {
            continue;
        }
        match pvcs.get_opt(name).await? {
            Some(pvc) => {
                single_node |= matches!(claim, Claim::Existing(_)) && users::single_node(&pvc);
                observed.claims.insert(name.to_string(), pvc);
            }
            // The plan stops at the first missing claim: nothing after it is looked at.
            None if matches!(claim, Claim::Existing(_)) => return Ok(observed),
            None => {}
        }
    }
    if single_node {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ids.namespace);
        observed.pods = pods.list(&ListParams::default()).await?.items;
    }
    observed.secrets =
        secrets::observe(ctx, &ids.namespace, &obj.endpoints(), &obj.secret_keys()).await?;
    Ok(observed)
}

/// The next step of `obj` (with status `status`), which has no mover: its claims and
/// Secrets checked against `observed`, then the objects of its next attempt. The mover
/// limits are the caller's (they depend on every resource, not on this one).
pub fn attempt<K: MoverKind>(
    obj: &K,
    ids: &Ids,
    status: &K::Status,
    observed: &Observed,
    setup: Setup<'_>,
) -> Result<Plan, Error> {
    let Resolved { pvcs, new_claims } =
        match claims::resolve(obj, ids, &observed.claims, &observed.pods) {
            Ok(resolved) => resolved,
            Err(Unresolved::Conflict(message)) => {
                return Ok(Plan::Fail {
                    reason: reason::FAILED,
                    message,
                })
            }
            Err(Unresolved::Missing(message) | Unresolved::Apart(message)) => {
                return Ok(Plan::Wait {
                    reason: reason::PENDING,
                    message,
                })
            }
            Err(Unresolved::Written(message)) => {
                return Ok(Plan::Wait {
                    reason: reason::SOURCE_IN_USE,
                    message,
                })
            }
        };
    let endpoints = obj.endpoints();
    let keys = obj.secret_keys();
    if let Some(message) = secrets::missing(&observed.secrets, &ids.namespace, &endpoints, &keys) {
        return Ok(Plan::Wait {
            reason: reason::PENDING,
            message,
        });
    }
    let number = status.life().attempts + 1;
    let pod_name = names::mover_pod(K::SHORT, &ids.name, &ids.uid, number);
    let token_secret = names::token_secret(&pod_name);
    let pod = obj.mover_pod(&MoverPodInput {
        pod_name: &pod_name,
        token_secret: &token_secret,
        pvcs: &pvcs,
        defaults: &setup.settings.mover,
        assigned_ids: observed.assigns_ids,
        tls: setup.tls,
    })?;
    let network_policy = setup
        .settings
        .mover_network_policy
        .then(|| mover_network_policy(&pod, &setup.settings.operator_namespace));
    Ok(Plan::Start(Box::new(Attempt {
        number,
        new_claims,
        token_secret,
        network_policy,
        pod,
    })))
}

/// The status with its shared part changed by `f`, for the resource's generation.
pub fn with_life<K: MoverKind>(
    obj: &K,
    status: &K::Status,
    f: impl FnOnce(&mut Life),
) -> K::Status {
    let mut next = status.clone();
    let mut life = next.life();
    life.observed_generation = obj.meta().generation;
    f(&mut life);
    next.set_life(life);
    next
}

/// Pending (or Queued, or Refused) with a reason; the lost pod of an earlier attempt is
/// forgotten.
pub fn waiting<K: MoverKind>(obj: &K, status: &K::Status, why: &str, message: &str) -> K::Status {
    with_life(obj, status, |l| {
        l.pending(why, message);
        l.mover_pod = None;
        l.node = None;
    })
}

/// Failed for good.
pub fn failed<K: MoverKind>(obj: &K, status: &K::Status, why: &str, message: &str) -> K::Status {
    with_life(obj, status, |l| l.finish(Phase::Failed, why, Some(message)))
}

/// The mover of `attempt` was created and is starting; the message of its event.
pub fn starting<K: MoverKind>(
    obj: &K,
    status: &K::Status,
    attempt: &Attempt,
) -> (K::Status, String) {
    let pod_name = attempt.pod_name().to_string();
    let message = format!(
        "mover pod {pod_name} (attempt {}) is starting",
        attempt.number
    );
    // The phase stays as it was (Pending on a first attempt) until the pod is ready.
    let next = with_life(obj, status, |l| {
        l.attempts = attempt.number;
        l.mover_pod = Some(pod_name);
        l.node = None;
        l.message = None;
        l.start_time.get_or_insert_with(now);
        l.set_condition(RUNNING, false, reason::MOVER_STARTING, &message);
        l.set_condition(READY, false, reason::MOVER_STARTING, &message);
    });
    (next, message)
}

/// The mover `pod` is ready: Running on its node; the message of its event.
pub fn running<K: MoverKind>(obj: &K, status: &K::Status, pod: &Pod) -> (K::Status, String) {
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let message = format!(
        "mover pod {pod_name} runs on node {}",
        node.as_deref().unwrap_or("(unknown)")
    );
    let next = with_life(obj, status, |l| {
        l.phase = Phase::Running;
        l.node = node;
        l.set_condition(RUNNING, true, reason::MOVER_RUNNING, &message);
        l.set_condition(READY, false, reason::MOVER_RUNNING, &message);
    });
    (next, message)
}

/// The token Secret of a mover pod holding `data` (the token, and with mutual TLS the
/// mover's certificate, key and the client CA), owned by the resource.
pub fn token_secret<K: MoverKind>(
    obj: &K,
    ids: &Ids,
    name: &str,
    data: BTreeMap<String, String>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(ids.namespace.clone()),
            labels: Some(BTreeMap::from([
                (labels::MANAGED_BY.to_string(), "ferry-operator".to_string()),
                (labels::OWNER_UID.to_string(), ids.uid.clone()),
            ])),
            owner_references: obj.controller_owner_ref(&()).map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        immutable: Some(true),
        string_data: Some(data),
        ..Secret::default()
    }
}
