//! A stateful stand-in for the Kubernetes API server, reachable as a [`::kube::Client`]
//! over an in-process `tower::Service` (no network), or over loopback HTTP for a client in
//! another process ([`Cluster::serve`]), for tests that run the operator's real controllers
//! against something that behaves like a cluster, where a scripted mock only answers what
//! its author expected.
//!
//! # What it simulates
//!
//! - **REST by path**, for core/v1, the built-in groups the operator touches, and every
//!   CRD of `deploy/crds.yaml` (more with [`Cluster::with_crds`]): namespaced and
//!   cluster-scoped objects, lists across namespaces, the `status` subresource.
//! - **Verbs**: GET; LIST with label selectors and the field selectors the API server
//!   supports per kind (`metadata.name`, `metadata.namespace`, pods' `spec.nodeName` and
//!   `status.phase`, events' `involvedObject.*`, ...), `limit`/`continue`; WATCH from a
//!   resourceVersion (or from now, with the current objects as ADDED), `sendInitialEvents`,
//!   bookmarks when `allowWatchBookmarks` asks, 410 Gone (an `ERROR` event) for a
//!   resourceVersion older than the history ([`Cluster::compact`]), `timeoutSeconds`,
//!   watches that deliver late ([`Cluster::lag_watches`]);
//!   POST (`generateName`, 409 AlreadyExists, 404 in a namespace that does not exist);
//!   PUT (409 Conflict on a stale resourceVersion); PATCH (merge, JSON, strategic as
//!   merge, server-side apply as a merge of the applied object, see [`patch`]); DELETE
//!   (preconditions, finalizers and deletionTimestamp, propagation Background or Orphan)
//!   and deletecollection.
//! - **Metadata**: one resourceVersion counter, uid, creationTimestamp, generation bumped
//!   when anything but metadata and status changes, no-op writes that write nothing,
//!   Secrets' `stringData`, `PartialObjectMetadata` answers for metadata-only requests.
//! - **Garbage collection** of dependents whose owners are all gone.
//! - **RBAC**: a client from [`Cluster::client_as`] is held to the Roles and ClusterRoles
//!   bound to a ServiceAccount in a manifest file ([`rbac`]); a refused request gets the
//!   API server's 403 Status and is logged ([`Cluster::denied`]). SubjectAccessReviews
//!   are answered from the Roles, ClusterRoles and bindings created in the stand-in, for
//!   the review's user and groups ([`rbac::review`]).
//! - **Controllers** a test switches on ([`Cluster::simulate`], see [`sim`]): PVC binding
//!   and provisioning (Immediate, WaitForFirstConsumer with the selected-node annotation,
//!   pvc-protection), a scheduler (nodeName, node selector, required node affinity with
//!   matchExpressions and matchFields, taints, volume node affinity, CSINode attach
//!   limits), attach/detach (Multi-Attach of single-node volumes in use on another node)
//!   and a kubelet (Pending, then Running and Ready with a pod IP; Succeeded or Failed when
//!   the test says, [`Cluster::exit_pod`]), writing the Events real components write
//!   (`FailedScheduling`, `FailedAttachVolume`, `WaitForFirstConsumer`, ...).
//!
//! # What it does not
//!
//! Only a real cluster shows these: admission (PodSecurity, quotas, webhooks, OpenShift
//! SCCs, the OwnerReferencesPermissionEnforcement plugin), schema validation of objects
//! (CRD OpenAPI schemas, CEL rules, defaults; built-in field validation), server-side
//! apply's field ownership (managedFields, conflicts between managers, removal of fields a
//! manager stops applying, list merging by key), strategic merge's list merging and
//! directives, foreground deletion, graceful deletion timing (a deleted pod goes on the
//! next kubelet pass), namespace deletion, conversion between CRD versions, discovery
//! (`/api`, `/apis`), authentication, Table and protobuf answers, the events.k8s.io and
//! core/v1 views of one Event store (here they are two resources), resourceVersion
//! semantics of lists (always the latest state), and everything the nodes do for real:
//! images, container runtimes, mounts, fsGroup and permissions, device nodes, networking
//! (the pod IP reaches nothing), NetworkPolicies, CSI drivers, snapshots, resource
//! requests, eviction and node failure.

pub mod patch;
pub mod path;
pub mod rbac;
pub mod resources;
pub mod selector;
mod service;
mod shared;
pub mod sim;
mod socket;
mod state;
pub mod status;
pub mod store;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::mpsc;

pub use self::resources::{ResourceInfo, Resources};
pub use self::service::{ApiService, Identity};
pub use self::shared::Recorded;
pub use self::status::ApiError;
pub use self::store::{ChangeType, Key, Sent};

use self::selector::{FieldSelector, LabelSelector};
use self::shared::Shared;
use self::state::State;
use self::store::Filter;

/// The CRDs of the repository's deploy/ directory.
pub fn ferry_crds() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds.yaml")
}

/// Which simulated controllers to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sim {
    /// PVC binding and provisioning.
    Binding,
    /// The scheduler.
    Scheduler,
    /// Attach/detach and the kubelet.
    Kubelet,
}

impl Sim {
    /// All of them.
    pub const ALL: [Sim; 3] = [Sim::Binding, Sim::Scheduler, Sim::Kubelet];
}

/// One stand-in API server. Clones share it. Create it inside a tokio runtime for the
/// simulated controllers to run by themselves (else call [`Cluster::settle`]).
#[derive(Debug, Clone)]
pub struct Cluster {
    shared: Arc<Shared>,
}

impl Default for Cluster {
    fn default() -> Self {
        Self::new()
    }
}

/// Panics with the API error, as a test assertion does.
fn must<T>(what: &str, r: Result<T, ApiError>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {} {}: {}", e.code, e.reason, e.message))
}

impl Cluster {
    /// The built-in kinds and the CRDs of `deploy/crds.yaml`.
    pub fn new() -> Self {
        Self::with_crds(&ferry_crds())
    }

    /// The built-in kinds and the CRDs of `file`.
    pub fn with_crds(file: &Path) -> Self {
        let mut resources = Resources::builtin();
        must(
            "CRDs",
            resources.add_crds_from(file).map_err(ApiError::bad_request),
        );
        Self::with_resources(resources)
    }

    /// Exactly these kinds.
    pub fn with_resources(resources: Resources) -> Self {
        Self {
            shared: Shared::start(State::new(resources)),
        }
    }

    /// A client allowed everything (the test's own, as a cluster administrator).
    pub fn client(&self) -> ::kube::Client {
        self.client_with(Identity::Admin)
    }

    /// A client held to the rules bound to `service_account` (namespace, name) in the
    /// RBAC manifest `rbac_file`.
    pub fn client_as(&self, rbac_file: &Path, service_account: (&str, &str)) -> ::kube::Client {
        self.client_with(Identity::Account(rbac::Rules::load(
            rbac_file,
            service_account,
        )))
    }

    /// A client with this identity.
    pub fn client_with(&self, identity: Identity) -> ::kube::Client {
        ::kube::Client::new(self.service(identity), "default")
    }

    fn service(&self, identity: Identity) -> ApiService {
        ApiService {
            shared: Arc::clone(&self.shared),
            identity: Arc::new(identity),
        }
    }

    /// Switches simulated controllers on.
    pub fn simulate(&self, sims: &[Sim]) -> &Self {
        {
            let mut state = self.shared.state.lock();
            for s in sims {
                match s {
                    Sim::Binding => state.sims.binding = true,
                    Sim::Scheduler => state.sims.scheduler = true,
                    Sim::Kubelet => state.sims.kubelet = true,
                }
            }
        }
        self.shared.wake();
        self
    }

    /// Makes the simulated kubelet take `delay` to start a pod once its volumes are
    /// attached (zero, the default: at once).
    pub fn pod_start_delay(&self, delay: std::time::Duration) -> &Self {
        self.shared.state.lock().sims.pod_start = delay;
        self
    }

    /// Runs the switched-on controllers until they settle; whether anything changed.
    pub fn settle(&self) -> bool {
        self.shared.settle()
    }

    /// Creates a whole object (its `apiVersion` and `kind` say where); panics on failure.
    pub fn create(&self, object: Value) -> Value {
        let what = format!("creating {} {}", object["kind"], object["metadata"]["name"]);
        let created = must(&what, self.shared.state.lock().create_object(object));
        self.shared.wake();
        created
    }

    /// Creates an object, or replaces the one of its name (status included, as a
    /// controller would write it); panics on failure.
    pub fn put(&self, object: Value) -> Value {
        let written = {
            let mut state = self.shared.state.lock();
            let t = must("put", state.target_of(&object));
            let name = t.name.clone().unwrap_or_default();
            let key = Key::new(
                &t.info.group,
                &t.info.plural,
                t.namespace.as_deref().unwrap_or_default(),
                &name,
            );
            match state.store.get(&key).cloned() {
                None => {
                    let status = object.get("status").cloned();
                    let mut created = must("put", state.create_object(object));
                    if let Some(status) = status {
                        created["status"] = status;
                        created = state.replace(&key, created);
                    }
                    created
                }
                Some(old) => {
                    let mut next = object;
                    for owned in ["uid", "creationTimestamp", "generation", "resourceVersion"] {
                        next["metadata"][owned] = old["metadata"][owned].clone();
                    }
                    state.replace(&key, next)
                }
            }
        };
        self.shared.wake();
        written
    }

    /// An object.
    pub fn get(&self, group: &str, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .state
            .lock()
            .store
            .get(&Key::new(group, resource, namespace, name))
            .cloned()
    }

    /// The objects of a resource, in every namespace.
    pub fn list(&self, group: &str, resource: &str) -> Vec<Value> {
        self.shared
            .state
            .lock()
            .store
            .list(group, resource, None)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Deletes an object as a DELETE does (finalizers and kubelets respected, dependents
    /// collected); false when it did not exist.
    pub fn delete(&self, group: &str, resource: &str, namespace: &str, name: &str) -> bool {
        let gone = {
            let mut state = self.shared.state.lock();
            let key = Key::new(group, resource, namespace, name);
            state.delete_key(&key, None).is_some()
        };
        self.shared.wake();
        gone
    }

    /// Ends a pod's containers with `exit_code` (0: Succeeded, else Failed); false when
    /// there is no such pod.
    pub fn exit_pod(&self, namespace: &str, name: &str, exit_code: i32) -> bool {
        self.exit_pod_with(namespace, name, exit_code, None, None)
    }

    /// Ends a pod's containers with `exit_code`, a reason (`OOMKilled`) and a termination
    /// message.
    pub fn exit_pod_with(
        &self,
        namespace: &str,
        name: &str,
        exit_code: i32,
        reason: Option<&str>,
        message: Option<&str>,
    ) -> bool {
        let key = Key::new("", "pods", namespace, name);
        let done = sim::kubelet::exit(
            &mut self.shared.state.lock(),
            &key,
            exit_code,
            reason,
            message,
        );
        self.shared.wake();
        done
    }

    /// The core/v1 Events about an object, oldest first: (type, reason, message).
    pub fn events_of(
        &self,
        group: &str,
        resource: &str,
        namespace: &str,
        name: &str,
    ) -> Vec<(String, String, String)> {
        sim::events::of(
            &self.shared.state.lock(),
            &Key::new(group, resource, namespace, name),
        )
    }

    /// Every change to the objects of a resource from now on (matching `labels`), as a
    /// watch sees them: for counting what existed at once over a whole test.
    pub fn changes(
        &self,
        group: &str,
        resource: &str,
        labels: &str,
    ) -> mpsc::UnboundedReceiver<Sent> {
        let filter = Filter {
            group: group.into(),
            resource: resource.into(),
            namespace: None,
            labels: must(
                "labels",
                LabelSelector::parse(labels).map_err(ApiError::bad_request),
            ),
            fields: FieldSelector::default(),
        };
        let mut state = self.shared.state.lock();
        let rv = state.store.rv();
        must(
            "changes",
            state
                .store
                .watch(filter, Some(rv))
                .map_err(|g| ApiError::gone(rv, g.oldest)),
        )
    }

    /// Makes the watches of a resource opened with exactly the label selector `labels`
    /// from now on deliver each change `lag` late, as a slow watch connection does: two
    /// watches of one kind (a controller's trigger and a reflector's store) then see a
    /// change in a different order, as they may on a real cluster.
    pub fn lag_watches(&self, group: &str, resource: &str, labels: &str, lag: std::time::Duration) {
        self.shared.set_lag(group, resource, labels, lag);
    }

    /// Forgets the change history: a watch from an older resourceVersion gets 410 Gone.
    pub fn compact(&self) {
        self.shared.state.lock().store.compact();
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.state.lock().store.rv()
    }

    /// Every request answered so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests()
    }

    /// The 403 messages given so far (RBAC refusals).
    pub fn denied(&self) -> Vec<String> {
        self.shared.denied()
    }

    /// Adds a Ready node with these labels (and `kubernetes.io/hostname`).
    pub fn add_node(&self, name: &str, labels: &[(&str, &str)]) -> Value {
        let mut l = serde_json::Map::new();
        l.insert("kubernetes.io/hostname".into(), json!(name));
        for (k, v) in labels {
            l.insert((*k).into(), json!(v));
        }
        self.put(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": l},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "addresses": [{"type": "InternalIP", "address": format!("192.168.0.{}", 10 + self.list("", "nodes").len())}]},
        }))
    }

    /// Adds a namespace (with these labels and annotations).
    pub fn add_namespace(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
    ) -> Value {
        let map = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| ((*k).to_string(), json!(v)))
                .collect::<serde_json::Map<_, _>>()
        };
        self.create(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": map(labels), "annotations": map(annotations)},
        }))
    }

    /// Adds a StorageClass of the provisioner `driver` (`WaitForFirstConsumer` when
    /// `wait_for_consumer`), the default class when `default`.
    pub fn add_storage_class(
        &self,
        name: &str,
        driver: &str,
        wait_for_consumer: bool,
        default: bool,
    ) -> Value {
        let mut class = json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name},
            "provisioner": driver,
            "volumeBindingMode": if wait_for_consumer { "WaitForFirstConsumer" } else { "Immediate" },
            "reclaimPolicy": "Delete",
        });
        if default {
            class["metadata"]["annotations"] = json!({sim::binding::DEFAULT_CLASS: "true"});
        }
        self.create(class)
    }
}
