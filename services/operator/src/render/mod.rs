//! `ferry operator render FILE`: a dry run of the operator. The file holds ferry resources
//! and the cluster objects they refer to ([`input`]); render plans each resource with the
//! functions the reconciler calls ([`crate::controller::plan`], the mover limits, the
//! Backup and Restore lookups), treating what it planned as created and ready (a planned
//! claim as bound, a planned mover as running), and goes round until a pass plans nothing
//! new: a claim one resource creates can be what another waits for. It returns every
//! object the operator would create (claims, token Secrets with their data redacted,
//! NetworkPolicies, mover pods) and every resource as the operator would patch it
//! (finalizer and status), in the order the operator writes them.
//!
//! No job runs: a started resource stays Running. A resource that waits says why in its
//! status exactly as on a cluster (the reason and message of its Ready condition).

pub mod input;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimStatus, Pod};
use kube::Resource as _;
use serde::Serialize;
use serde_json::Value;

use crate::controller::finalizer::FINALIZER;
use crate::controller::kind::{Ids, MoverKind};
use crate::controller::life::HasLife;
use crate::controller::limits::{self, Slot};
use crate::controller::plan::{self, Plan, Setup};
use crate::controller::restore::{named_snapshot, snapshot_in};
use crate::controller::{Error, OperatorSettings};
use crate::crd::status::condition::{reason, READY};
use crate::crd::Phase;
use crate::mover::layout::{CLIENT_CA_KEY, TLS_CERT_KEY, TLS_KEY_KEY, TOKEN_KEY};
use crate::mover::pod::labels;

pub use input::{Cluster, InputError, Resource};

/// What the operator would redact: the value every key of a planned Secret shows.
pub const REDACTED: &str = "REDACTED";

/// How render plans.
#[derive(Debug, Clone)]
pub struct Options {
    /// The operator's settings (its flags).
    pub settings: OperatorSettings,
    /// Whether movers serve mutual TLS (`ferry operator run` always makes a CA).
    pub tls: bool,
}

/// Why render cannot plan.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The file.
    #[error(transparent)]
    Input(#[from] InputError),
    /// A resource without a name.
    #[error("a {0} has no metadata.name")]
    Unnamed(&'static str),
    /// The same resource twice.
    #[error("{kind} {namespace}/{name} is given twice")]
    Duplicate {
        /// Its kind.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A mover pod or its objects could not be built.
    #[error("{kind} {namespace}/{name}: {source}")]
    Plan {
        /// The resource's kind.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// What failed.
        source: Box<Error>,
    },
}

/// What render found.
#[derive(Debug, Clone, Default)]
pub struct Rendered {
    /// Every object created or patched, in write order.
    pub objects: Vec<Value>,
    /// One line per resource: its phase, and the reason and message of a resource that
    /// waits or failed.
    pub summary: Vec<String>,
}

impl Rendered {
    /// The objects as one multi-document YAML stream.
    pub fn yaml(&self) -> Result<String, serde_yaml::Error> {
        let mut out = String::new();
        for object in &self.objects {
            out.push_str("---\n");
            out.push_str(&serde_yaml::to_string(object)?);
        }
        Ok(out)
    }
}

/// The world as planned so far: the file's objects plus what render created.
struct World<'a> {
    cluster: &'a Cluster,
    /// Claims created by earlier plans, by (namespace, name).
    claims: BTreeMap<(String, String), PersistentVolumeClaim>,
    /// Mover pods (the file's and the planned), for the limits.
    movers: Vec<std::sync::Arc<Pod>>,
    /// Planned mover pods by namespace (they use claims, like any pod).
    pods: BTreeMap<String, Vec<Pod>>,
    /// Objects created, in order.
    created: Vec<Value>,
}

/// How one look at a resource ended.
enum Look {
    /// A mover was planned.
    Started,
    /// Waiting (it may start once another resource's plan creates what it needs).
    Waiting,
    /// Nothing will change for it.
    Settled,
}

/// Plans every resource of `cluster`.
pub fn render(cluster: &Cluster, options: &Options) -> Result<Rendered, RenderError> {
    let mut resources = cluster.resources.clone();
    let mut seen = std::collections::BTreeSet::new();
    for (i, resource) in resources.iter_mut().enumerate() {
        let (kind, meta) = resource.meta_mut();
        let name = meta.name.clone().ok_or(RenderError::Unnamed(kind))?;
        let namespace = input::namespace_of(meta);
        meta.namespace = Some(namespace.clone());
        // A stable uid per file position when the file gives none (owner references
        // and long mover names use it).
        meta.uid
            .get_or_insert_with(|| format!("00000000-0000-4000-8000-{:012x}", i + 1));
        if !seen.insert((kind, namespace.clone(), name.clone())) {
            return Err(RenderError::Duplicate {
                kind,
                namespace,
                name,
            });
        }
    }
    let movers = cluster
        .pods
        .values()
        .flatten()
        .filter(|p| is_mover(p))
        .map(|p| std::sync::Arc::new(p.clone()))
        .collect();
    let mut world = World {
        cluster,
        claims: BTreeMap::new(),
        movers,
        pods: BTreeMap::new(),
        created: Vec::new(),
    };
    let mut open: Vec<usize> = (0..resources.len()).collect();
    let mut notes = vec![String::new(); resources.len()];
    loop {
        let mut started = false;
        let mut still_open = Vec::new();
        for &i in &open {
            let (look, note) = resources[i].look(&mut world, options)?;
            notes[i] = note;
            match look {
                Look::Started => started = true,
                Look::Waiting => still_open.push(i),
                Look::Settled => {}
            }
        }
        open = still_open;
        if !started || open.is_empty() {
            break;
        }
    }
    let mut objects = world.created;
    let mut summary = Vec::new();
    for (resource, note) in resources.iter().zip(notes) {
        let value = resource.to_value();
        summary.push(format!("{} {}", resource.title(), note));
        objects.push(value);
    }
    Ok(Rendered { objects, summary })
}

fn is_mover(pod: &Pod) -> bool {
    let labels = pod.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    label(labels::COMPONENT) == Some("mover") && label(labels::MANAGED_BY) == Some("ferry-operator")
}

impl Resource {
    fn meta_mut(&mut self) -> (&'static str, &mut kube::core::ObjectMeta) {
        match self {
            Resource::Transfer(r) => ("Transfer", r.meta_mut()),
            Resource::Checksum(r) => ("Checksum", r.meta_mut()),
            Resource::Backup(r) => ("Backup", r.meta_mut()),
            Resource::Restore(r) => ("Restore", r.meta_mut()),
        }
    }

    fn title(&self) -> String {
        let (kind, meta) = match self {
            Resource::Transfer(r) => ("Transfer", r.meta()),
            Resource::Checksum(r) => ("Checksum", r.meta()),
            Resource::Backup(r) => ("Backup", r.meta()),
            Resource::Restore(r) => ("Restore", r.meta()),
        };
        format!(
            "{kind} {}/{}:",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        )
    }

    fn to_value(&self) -> Value {
        let value = match self {
            Resource::Transfer(r) => serde_json::to_value(r.as_ref()),
            Resource::Checksum(r) => serde_json::to_value(r.as_ref()),
            Resource::Backup(r) => serde_json::to_value(strip_backup(r)),
            Resource::Restore(r) => serde_json::to_value(strip_restore(r)),
        };
        value.unwrap_or(Value::Null)
    }

    /// One look: the status (and the objects) the reconciler would write now.
    fn look(
        &mut self,
        world: &mut World<'_>,
        options: &Options,
    ) -> Result<(Look, String), RenderError> {
        match self {
            Resource::Transfer(r) => {
                let (look, note, status) = look(r.as_mut(), world, options)?;
                r.status = status.or(r.status.take());
                Ok((look, note))
            }
            Resource::Checksum(r) => {
                let (look, note, status) = look(r.as_mut(), world, options)?;
                r.status = status.or(r.status.take());
                Ok((look, note))
            }
            Resource::Backup(r) => {
                let key = (
                    r.metadata.namespace.clone().unwrap_or_default(),
                    r.spec.repository.clone(),
                );
                r.spec.resolved_repository = world
                    .cluster
                    .repositories
                    .get(&key)
                    .map(|repo| repo.spec.clone());
                let (look, note, status) = look(r.as_mut(), world, options)?;
                r.status = status.or(r.status.take());
                Ok((look, note))
            }
            Resource::Restore(r) => {
                let namespace = r.metadata.namespace.clone().unwrap_or_default();
                let backup = r.spec.backup.as_ref().and_then(|name| {
                    world
                        .cluster
                        .backups
                        .get(&(namespace.clone(), name.clone()))
                });
                r.spec.resolved = Some(named_snapshot(r, backup).and_then(|(repo, id)| {
                    let found = world
                        .cluster
                        .repositories
                        .get(&(namespace.clone(), repo.clone()))
                        .cloned();
                    snapshot_in(&repo, id, found)
                }));
                let (look, note, status) = look(r.as_mut(), world, options)?;
                r.status = status.or(r.status.take());
                Ok((look, note))
            }
        }
    }
}

/// A Backup as written back: without the never-stored lookup.
fn strip_backup(backup: &crate::crd::Backup) -> crate::crd::Backup {
    let mut b = backup.clone();
    b.spec.resolved_repository = None;
    b
}

/// A Restore as written back: without the never-stored lookup.
fn strip_restore(restore: &crate::crd::Restore) -> crate::crd::Restore {
    let mut r = restore.clone();
    r.spec.resolved = None;
    r
}

/// One look at `obj`, as the reconciler's steps for a resource without a mover: the
/// finalizer, validation, the cluster's mover limit, the plan, the node's limit. Returns
/// the status to write (None: unchanged) and the summary note.
fn look<K: MoverKind>(
    obj: &mut K,
    world: &mut World<'_>,
    options: &Options,
) -> Result<(Look, String, Option<K::Status>), RenderError> {
    let meta = obj.meta_mut();
    let ids = Ids {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
    };
    if meta.deletion_timestamp.is_some() {
        return Ok((Look::Settled, "being deleted: nothing to plan".into(), None));
    }
    let finalizers = meta.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == FINALIZER) {
        finalizers.push(FINALIZER.to_string());
    }
    let status = obj.status().cloned().unwrap_or_default();
    let life = status.life();
    if life.phase.is_final() {
        return Ok((
            Look::Settled,
            format!("{:?}: nothing to plan", life.phase),
            None,
        ));
    }
    if let Some(pod) = &life.mover_pod {
        let note = format!(
            "{:?}: mover pod {pod} exists already: nothing new to plan",
            life.phase
        );
        return Ok((Look::Settled, note, None));
    }
    if let Err(e) = obj.validate() {
        let message = format!("{e}: fix the spec and create the {} again", K::KIND);
        let next = plan::failed(obj, &status, reason::INVALID_SPEC, &message);
        return Ok((Look::Settled, note_of(&next), Some(next)));
    }
    let settings = &options.settings;
    let slot = |world: &World<'_>, node: Option<&str>| {
        limits::slot(&world.movers, &[], &ids.uid, node, settings)
    };
    if let Slot::Queued(message) = slot(world, None) {
        let next = plan::waiting(obj, &status, reason::QUEUED, &message);
        return Ok((Look::Waiting, note_of(&next), Some(next)));
    }
    let observed = plan::Observed {
        claims: world.claims_in(&ids.namespace),
        pods: world.pods_in(&ids.namespace),
        secrets: world.cluster.secrets_in(&ids.namespace),
        assigns_ids: world.cluster.assigning_ids.contains(&ids.namespace),
    };
    let setup = Setup {
        settings,
        tls: options.tls,
    };
    let failed = |source| RenderError::Plan {
        kind: K::KIND,
        namespace: ids.namespace.clone(),
        name: ids.name.clone(),
        source: Box::new(source),
    };
    let attempt = match plan::attempt(obj, &ids, &status, &observed, setup).map_err(failed)? {
        Plan::Wait { reason, message } => {
            let next = plan::waiting(obj, &status, reason, &message);
            return Ok((Look::Waiting, note_of(&next), Some(next)));
        }
        Plan::Fail { reason, message } => {
            let next = plan::failed(obj, &status, reason, &message);
            return Ok((Look::Settled, note_of(&next), Some(next)));
        }
        Plan::Start(attempt) => attempt,
    };
    if let Slot::Queued(message) = slot(world, limits::pinned_node(&attempt.pod)) {
        let next = plan::waiting(obj, &status, reason::QUEUED, &message);
        return Ok((Look::Waiting, note_of(&next), Some(next)));
    }
    for pvc in &attempt.new_claims {
        world.create(pvc);
        let mut bound = pvc.clone();
        bound.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..PersistentVolumeClaimStatus::default()
        });
        let key = (
            ids.namespace.clone(),
            pvc.metadata.name.clone().unwrap_or_default(),
        );
        world.claims.insert(key, bound);
    }
    let mut data = BTreeMap::from([(TOKEN_KEY.to_string(), REDACTED.to_string())]);
    if options.tls {
        for key in [TLS_CERT_KEY, TLS_KEY_KEY, CLIENT_CA_KEY] {
            data.insert(key.to_string(), REDACTED.to_string());
        }
    }
    world.create(&plan::token_secret(obj, &ids, &attempt.token_secret, data));
    if let Some(policy) = &attempt.network_policy {
        world.create(policy);
    }
    world.create(&attempt.pod);
    let mut running = attempt.pod.clone();
    if let Some(spec) = running.spec.as_mut() {
        spec.node_name = limits::pinned_node(&attempt.pod).map(str::to_string);
    }
    world.movers.push(std::sync::Arc::new(running.clone()));
    world
        .pods
        .entry(ids.namespace.clone())
        .or_default()
        .push(running.clone());
    let (next, _) = plan::starting(obj, &status, &attempt);
    let (next, message) = plan::running(obj, &next, &running);
    let note = format!("Running: {message} (render starts no job)");
    Ok((Look::Started, note, Some(next)))
}

/// The summary note of a status: its phase, and the reason and message of its Ready
/// condition.
fn note_of<S: HasLife>(status: &S) -> String {
    let life = status.life();
    let phase = match life.phase {
        Phase::Pending => "Pending",
        Phase::Failed => "Failed",
        other => return format!("{other:?}"),
    };
    let (why, message) = life
        .condition(READY)
        .map(|c| (c.reason.clone(), c.message.clone()))
        .unwrap_or_default();
    format!("{phase} ({why}): {message}")
}

impl World<'_> {
    fn create<T: Serialize>(&mut self, object: &T) {
        if let Ok(value) = serde_json::to_value(object) {
            self.created.push(value);
        }
    }

    fn claims_in(&self, namespace: &str) -> BTreeMap<String, PersistentVolumeClaim> {
        let mut claims = self.cluster.claims_in(namespace);
        for ((ns, name), pvc) in &self.claims {
            if ns == namespace {
                claims.insert(name.clone(), pvc.clone());
            }
        }
        claims
    }

    fn pods_in(&self, namespace: &str) -> Vec<Pod> {
        let mut pods = self
            .cluster
            .pods
            .get(namespace)
            .cloned()
            .unwrap_or_default();
        pods.extend(self.pods.get(namespace).into_iter().flatten().cloned());
        pods
    }
}
