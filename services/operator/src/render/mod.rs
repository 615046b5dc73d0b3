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

mod claims;
mod cross;
mod fan_out;
pub mod input;
mod movers;
mod schedules;
mod yaml;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimStatus, Pod};
use serde::Serialize;
use serde_json::Value;

use crate::controller::limits;
use crate::controller::{Error, OperatorSettings};
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
    /// Every object created or patched, in write order, as compact JSON: a plan of ten
    /// thousand claims held as JSON values would take several times the memory.
    documents: Vec<String>,
    /// One line per resource: its phase, and the reason and message of a resource that
    /// waits or failed.
    pub summary: Vec<String>,
}

impl Rendered {
    /// Every object created or patched, in write order.
    pub fn objects(&self) -> Vec<Value> {
        self.documents.iter().map(|d| parse(d)).collect()
    }

    /// The objects as one multi-document YAML stream that kubectl reads back as it is.
    pub fn yaml(&self) -> String {
        let mut out = String::new();
        for document in &self.documents {
            out.push_str("---\n");
            out.push_str(&yaml::to_string(&parse(document)));
        }
        out
    }
}

/// A document render wrote itself (so it parses).
fn parse(document: &str) -> Value {
    serde_json::from_str(document).unwrap_or(Value::Null)
}

/// The world as planned so far: the file's objects plus what render created.
pub(crate) struct World<'a> {
    pub(crate) cluster: &'a Cluster,
    /// Claims created by earlier plans, by (namespace, name).
    claims: BTreeMap<(String, String), PersistentVolumeClaim>,
    /// Mover pods (the file's and the planned), for the limits.
    pub(crate) movers: Vec<Arc<Pod>>,
    /// Planned mover pods by namespace (they use claims, like any pod).
    pods: BTreeMap<String, Vec<Pod>>,
    /// Objects created, in order (compact JSON).
    created: Vec<String>,
    /// Resources created by the populator and the schedules, planned like the file's.
    pub(crate) spawned: Vec<Resource>,
}

/// How one look at a resource ended.
pub(crate) enum Look {
    /// A mover was planned.
    Started,
    /// Waiting (it may start once another resource's plan creates what it needs).
    Waiting,
    /// Nothing will change for it.
    Settled,
}

/// Plans every resource of `cluster`: the repositories' statuses, the claims the
/// populator fills, the schedules, then every resource that runs a mover (the file's and
/// those the populator and the schedules create), round after round until a round starts
/// no mover.
pub fn render(cluster: &Cluster, options: &Options) -> Result<Rendered, RenderError> {
    let mut resources = cluster.resources.clone();
    let mut seen = BTreeSet::new();
    for (i, resource) in resources.iter_mut().enumerate() {
        let (kind, meta) = resource.meta_mut();
        let name = meta.name.clone().ok_or(RenderError::Unnamed(kind))?;
        let namespace = input::namespace_of(meta);
        meta.namespace = Some(namespace.clone());
        meta.uid.get_or_insert_with(|| made_up_uid(1, i));
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
        .map(|p| Arc::new(p.clone()))
        .collect();
    let mut world = World {
        cluster,
        claims: BTreeMap::new(),
        movers,
        pods: BTreeMap::new(),
        created: Vec::new(),
        spawned: Vec::new(),
    };
    let mut patched = Vec::new();
    let mut summary = Vec::new();
    for (repository, note) in schedules::repositories(cluster) {
        summary.push(note);
        patched.push(repository.to_string());
    }
    summary.extend(claims::populate(&mut world));
    for (schedule, note) in schedules::schedules(&mut world, options) {
        summary.push(note);
        patched.push(schedule.to_string());
    }
    resources.append(&mut world.spawned);
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
        if !world.spawned.is_empty() {
            // Resources a look created (a fan-out's groups) are planned from the next round.
            let first = resources.len();
            resources.append(&mut world.spawned);
            notes.resize(resources.len(), String::new());
            still_open.extend(first..resources.len());
        }
        open = still_open;
        if !started || open.is_empty() {
            break;
        }
    }
    for (resource, note) in resources.iter().zip(notes) {
        summary.push(format!("{} {note}", resource.title()));
        patched.push(resource.to_value().to_string());
    }
    if !cluster.context.is_empty() {
        let read: Vec<String> = cluster
            .context
            .iter()
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect();
        summary.push(format!("read, not used by any plan: {}", read.join(", ")));
    }
    let mut documents = world.created;
    documents.append(&mut patched);
    Ok(Rendered { documents, summary })
}

/// A uid for an object the file gives without one (owner references and long mover
/// names use it): stable per file position; `set` tells objects of different lists apart.
pub(crate) fn made_up_uid(set: u32, position: usize) -> String {
    format!(
        "00000000-0000-4000-{:04x}-{:012x}",
        0x8000 + set,
        position + 1
    )
}

fn is_mover(pod: &Pod) -> bool {
    let labels = pod.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    label(labels::COMPONENT) == Some("mover") && label(labels::MANAGED_BY) == Some("ferry-operator")
}

impl World<'_> {
    /// Records the creation of `object`.
    pub(crate) fn create<T: Serialize>(&mut self, object: &T) {
        if let Ok(document) = serde_json::to_string(object) {
            self.created.push(document);
        }
    }

    /// Records the creation of an object several resources share (a group snapshot),
    /// once: the first of the same kind, namespace and name.
    pub(crate) fn create_once<T: Serialize>(&mut self, object: &T) {
        let Ok(value) = serde_json::to_value(object) else {
            return;
        };
        let key = |v: &serde_json::Value| {
            (
                v["kind"].clone(),
                v["metadata"]["namespace"].clone(),
                v["metadata"]["name"].clone(),
            )
        };
        let made = self.created.iter().any(|d| {
            serde_json::from_str::<serde_json::Value>(d).is_ok_and(|c| key(&c) == key(&value))
        });
        if !made {
            self.create(object);
        }
    }

    /// Records the creation of a claim, which then exists, bound.
    pub(crate) fn create_claim(&mut self, pvc: &PersistentVolumeClaim) {
        self.create(pvc);
        let mut bound = pvc.clone();
        bound.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..PersistentVolumeClaimStatus::default()
        });
        let key = (
            pvc.metadata.namespace.clone().unwrap_or_default(),
            pvc.metadata.name.clone().unwrap_or_default(),
        );
        self.claims.insert(key, bound);
    }

    /// Records a planned mover pod, running (on its pinned node, if any).
    pub(crate) fn run_mover(&mut self, pod: &Pod) -> Pod {
        self.create(pod);
        let mut running = pod.clone();
        if let Some(spec) = running.spec.as_mut() {
            spec.node_name = limits::pinned_node(pod).map(str::to_string);
        }
        self.movers.push(Arc::new(running.clone()));
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        self.pods
            .entry(namespace)
            .or_default()
            .push(running.clone());
        running
    }

    /// The claims of `namespace` by name: the file's and the planned.
    pub(crate) fn claims_in(&self, namespace: &str) -> BTreeMap<String, PersistentVolumeClaim> {
        let mut claims = self.cluster.claims_in(namespace);
        for ((ns, name), pvc) in &self.claims {
            if ns == namespace {
                claims.insert(name.clone(), pvc.clone());
            }
        }
        claims
    }

    /// The claims of `namespace` with these names that exist (the file's or planned).
    pub(crate) fn claims_named<'n>(
        &self,
        namespace: &str,
        names: impl Iterator<Item = &'n str>,
    ) -> BTreeMap<String, PersistentVolumeClaim> {
        names
            .filter_map(|name| {
                let key = (namespace.to_string(), name.to_string());
                let pvc = self
                    .claims
                    .get(&key)
                    .or_else(|| self.cluster.claims.get(&key))?;
                Some((name.to_string(), pvc.clone()))
            })
            .collect()
    }

    /// The pods of `namespace`: the file's and the planned movers.
    pub(crate) fn pods_in(&self, namespace: &str) -> Vec<Pod> {
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
