//! What every reconcile shares: the client, the settings, the mover link, the store of
//! mover pods (filled by a watch, so reading a pod or counting movers costs no request),
//! the event recorder, and the operator's memory of what it runs: the job-stream tasks,
//! the tokens of its movers and the backoff of resources waiting for a claim. That memory
//! is only a cache: after a restart everything is found again from the API and the
//! movers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::core::PartialObjectMeta;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::{Client, Resource};
use parking_lot::Mutex;
use tokio::task::JoinHandle;

use crate::events;
use crate::metrics::OperatorMetrics;

use super::kind::Ids;
use super::limits::{self, Slot};
use super::link::MoverLink;
use super::settings::OperatorSettings;
use crate::mover::pod::labels;
use crate::mover::tls::MoverCa;

/// The annotation of a namespace whose pods get their user IDs from a range (OpenShift).
pub const UID_RANGE_ANNOTATION: &str = "openshift.io/sa.scc.uid-range";

/// The field manager and event reporter of every write.
pub const MANAGER: &str = events::REPORTER;

/// A running job-stream task of one attempt of a resource.
#[derive(Debug)]
pub struct Watch {
    /// The attempt it follows.
    pub attempt: u32,
    /// The task.
    pub task: JoinHandle<()>,
}

/// Shared by every reconcile.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// The operator's settings.
    pub settings: OperatorSettings,
    /// How the operator talks to movers.
    pub link: Arc<dyn MoverLink>,
    /// Every mover pod of the cluster (by the mover labels).
    pub pods: Store<Pod>,
    /// The namespaces' metadata (empty until [`Context::with_namespaces`]).
    namespaces: Store<PartialObjectMeta<Namespace>>,
    /// The operator's metrics (the reconcilers count into them).
    pub metrics: Arc<OperatorMetrics>,
    /// What the StorageClassProfiles say of the claims ferry makes (nothing until
    /// [`Context::with_class_defaults`]).
    pub class_defaults: crate::class_defaults::ClassDefaults,
    recorder: Recorder,
    watches: Mutex<HashMap<String, Watch>>,
    tokens: Mutex<HashMap<String, String>>,
    waits: Mutex<HashMap<String, u32>>,
    /// Slots taken by movers created but not in the store yet: resource uid -> node.
    reserved: Mutex<HashMap<String, Reservation>>,
    /// Resources waiting for a mover slot: uid -> (kind, namespace, name), woken when a
    /// mover goes.
    queued: Mutex<HashMap<String, Queued>>,
    /// Order of queueing: the next queued resource's number.
    queue_seq: std::sync::atomic::AtomicU64,
    /// Per kind, where to send (namespace, name) of a resource whose job stream broke,
    /// so that it is reconciled at once (its controller reads the other end).
    relinks: Mutex<HashMap<&'static str, UnboundedSender<(String, String)>>>,
    /// The movers' CA (None: movers serve plain gRPC, in tests of other things).
    mover_ca: Option<Arc<MoverCa>>,
    /// Resources whose mover could not be reached: uid -> (attempt, first failure).
    unreachable: Mutex<HashMap<String, (u32, Instant)>>,
    /// The last attachment check of a starting mover: pod uid -> (when, what it said).
    attachment_checks: Mutex<HashMap<String, (Instant, Option<String>)>>,
    /// Every Transfer (the Transfer controller's store), where a fan-out reads its groups.
    transfers: std::sync::OnceLock<Store<crate::crd::Transfer>>,
    /// Serving groups' movers told that no reader is still to come: "uid/pod".
    relays_ended: Mutex<std::collections::HashSet<String>>,
}

/// A resource waiting for a mover slot.
#[derive(Debug, Clone)]
struct Queued {
    /// Its place in the queue.
    seq: u64,
    kind: &'static str,
    namespace: String,
    name: String,
}

/// Queued resources woken per freed mover slot: more than one, since a woken resource
/// may not fit the slot (a per-node limit, its claims not ready).
pub const WAKE_PER_FREED_SLOT: usize = 4;

/// A mover slot taken before its pod is in the store.
#[derive(Debug, Clone)]
struct Reservation {
    node: Option<String>,
    at: Instant,
}

/// A reservation whose pod never shows up (its creation failed) is dropped after this.
const RESERVATION_TTL: Duration = Duration::from_secs(60);

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("settings", &self.settings)
            .field("pods", &self.pods.len())
            .field("watches", &self.watches.lock().len())
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context over this client, settings, link and store of mover pods.
    pub fn new(
        client: Client,
        settings: OperatorSettings,
        link: Arc<dyn MoverLink>,
        pods: Store<Pod>,
    ) -> Self {
        Self {
            recorder: events::recorder(client.clone()),
            client,
            settings,
            link,
            pods,
            namespaces: reflector::store().0,
            metrics: Arc::default(),
            class_defaults: crate::class_defaults::ClassDefaults::default(),
            watches: Mutex::default(),
            tokens: Mutex::default(),
            waits: Mutex::default(),
            reserved: Mutex::default(),
            queued: Mutex::default(),
            queue_seq: std::sync::atomic::AtomicU64::new(0),
            relinks: Mutex::default(),
            mover_ca: None,
            unreachable: Mutex::default(),
            attachment_checks: Mutex::default(),
            transfers: std::sync::OnceLock::new(),
            relays_ended: Mutex::default(),
        }
    }

    /// Lets fan-outs read their groups from the Transfer controller's store.
    pub fn set_transfers(&self, store: Store<crate::crd::Transfer>) {
        let _ = self.transfers.set(store);
    }

    /// The Transfer controller's store, once set.
    pub fn transfers(&self) -> Option<&Store<crate::crd::Transfer>> {
        self.transfers.get()
    }

    /// The same context reading namespaces' metadata from `namespaces` (filled by a watch).
    pub fn with_namespaces(mut self, namespaces: Store<PartialObjectMeta<Namespace>>) -> Self {
        self.namespaces = namespaces;
        self
    }

    /// Whether `namespace` assigns its pods' user and group IDs itself (OpenShift's
    /// restricted SCCs, which refuse an ID outside the namespace's range): its
    /// `openshift.io/sa.scc.uid-range` annotation says so.
    pub fn assigns_ids(&self, namespace: &str) -> bool {
        self.namespaces
            .get(&ObjectRef::new(namespace))
            .is_some_and(|ns| {
                ns.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(UID_RANGE_ANNOTATION))
            })
    }

    /// The same context filling templates from `defaults` (filled by watches).
    pub fn with_class_defaults(mut self, defaults: crate::class_defaults::ClassDefaults) -> Self {
        self.class_defaults = defaults;
        self
    }

    /// The same context counting into `metrics` (the ones the binary serves).
    pub fn with_metrics(mut self, metrics: Arc<OperatorMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Publishes an event on the resource; a failure is logged, never fatal. `note` must
    /// hold no secret (the callers pass messages that were redacted at their source).
    pub async fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        warning: bool,
        reason: &str,
        note: &str,
    ) {
        events::publish(&self.recorder, obj, warning, reason, note).await;
    }

    /// Whether a job-stream task follows this attempt of the resource.
    pub fn is_watching(&self, uid: &str, attempt: u32) -> bool {
        self.watches
            .lock()
            .get(uid)
            .is_some_and(|w| w.attempt == attempt && !w.task.is_finished())
    }

    /// Records the task following an attempt (stopping an older one).
    pub fn set_watch(&self, uid: &str, watch: Watch) {
        if let Some(old) = self.watches.lock().insert(uid.to_string(), watch) {
            old.task.abort();
        }
    }

    /// Stops the task following the resource, if any.
    pub fn stop_watch(&self, uid: &str) {
        if let Some(old) = self.watches.lock().remove(uid) {
            old.task.abort();
        }
    }

    /// Takes the task following the resource (tests await it).
    pub fn take_watch(&self, uid: &str) -> Option<Watch> {
        self.watches.lock().remove(uid)
    }

    /// The token of a mover's Secret, if this operator wrote or read it.
    pub fn token(&self, secret: &str) -> Option<String> {
        self.tokens.lock().get(secret).cloned()
    }

    /// Remembers the token of a mover's Secret.
    pub fn remember_token(&self, secret: &str, token: &str) {
        self.tokens
            .lock()
            .insert(secret.to_string(), token.to_string());
    }

    /// Forgets the token of a mover's Secret.
    pub fn forget_token(&self, secret: &str) {
        self.tokens.lock().remove(secret);
    }

    /// How many times in a row the resource waited (and counts this one).
    pub fn waited(&self, uid: &str) -> u32 {
        let mut waits = self.waits.lock();
        let n = waits.entry(uid.to_string()).or_insert(0);
        let before = *n;
        *n = n.saturating_add(1);
        before
    }

    /// Whether a new mover of the resource `uid`, on `node` when known, fits the limits
    /// now (nothing is taken).
    pub fn slot(&self, uid: &str, node: Option<&str>) -> Slot {
        let mut reserved = self.reserved.lock();
        self.slot_locked(&mut reserved, uid, node)
    }

    /// Takes a mover slot for the resource `uid` (on `node` when known), held until its pod
    /// is in the store; or says why it must wait.
    pub fn take_slot(&self, uid: &str, node: Option<&str>) -> Slot {
        let mut reserved = self.reserved.lock();
        let slot = self.slot_locked(&mut reserved, uid, node);
        if slot == Slot::Free {
            reserved.insert(
                uid.to_string(),
                Reservation {
                    node: node.map(str::to_string),
                    at: Instant::now(),
                },
            );
        }
        slot
    }

    /// Gives back the slot of a mover that was not created.
    pub fn release_slot(&self, uid: &str) {
        self.reserved.lock().remove(uid);
    }

    fn slot_locked(
        &self,
        reserved: &mut HashMap<String, Reservation>,
        uid: &str,
        node: Option<&str>,
    ) -> Slot {
        let pods = self.pods.state();
        reserved.retain(|owner, r| {
            r.at.elapsed() < RESERVATION_TTL
                && !pods.iter().any(|p| {
                    p.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(labels::OWNER_UID))
                        .is_some_and(|o| o == owner)
                })
        });
        let others: Vec<Option<&str>> = reserved
            .iter()
            .filter(|(owner, _)| owner.as_str() != uid)
            .map(|(_, r)| r.node.as_deref())
            .collect();
        limits::slot(&pods, &others, uid, node, &self.settings)
    }

    /// The resource stopped waiting.
    pub fn done_waiting(&self, uid: &str) {
        self.waits.lock().remove(uid);
        self.queued.lock().remove(uid);
    }

    /// What the attachment check of the mover pod `pod_uid` said, if it was made less than
    /// [`super::attachments::RECHECK_AFTER`] ago.
    pub fn attachment_check(&self, pod_uid: &str) -> Option<Option<String>> {
        let checks = self.attachment_checks.lock();
        let (at, said) = checks.get(pod_uid)?;
        (at.elapsed() < super::attachments::RECHECK_AFTER).then(|| said.clone())
    }

    /// Remembers what the attachment check of the mover pod `pod_uid` said (and forgets
    /// checks too old to be reused).
    pub fn remember_attachment_check(&self, pod_uid: &str, said: Option<String>) {
        let mut checks = self.attachment_checks.lock();
        checks.retain(|_, (at, _)| at.elapsed() < super::attachments::RECHECK_AFTER);
        checks.insert(pod_uid.to_string(), (Instant::now(), said));
    }

    /// The resource ended or is being deleted: nothing about it is worth remembering.
    pub fn forget(&self, uid: &str) {
        self.done_waiting(uid);
        self.reached(uid);
        let prefix = format!("{uid}/");
        self.relays_ended.lock().retain(|k| !k.starts_with(&prefix));
    }

    /// Whether the relay of resource `uid`'s mover `pod` is to be told that its readers
    /// are done (true once, until [`Context::relay_not_ended`]).
    pub fn relay_ending(&self, uid: &str, pod: &str) -> bool {
        self.relays_ended.lock().insert(format!("{uid}/{pod}"))
    }

    /// The relay of `uid`'s mover `pod` could not be told: tell it on a later look.
    pub fn relay_not_ended(&self, uid: &str, pod: &str) {
        self.relays_ended.lock().remove(&format!("{uid}/{pod}"));
    }

    /// Remembers that a resource of `kind` waits for a mover slot (keeping its place when
    /// it was queued already).
    pub fn queue(&self, kind: &'static str, ids: &Ids) {
        let mut queued = self.queued.lock();
        if !queued.contains_key(&ids.uid) {
            let seq = self
                .queue_seq
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            queued.insert(
                ids.uid.clone(),
                Queued {
                    seq,
                    kind,
                    namespace: ids.namespace.clone(),
                    name: ids.name.clone(),
                },
            );
        }
    }

    /// The queued resources of `kind` to look at again when `pod` changes: once a mover is
    /// finished or going (its slot frees), the [`WAKE_PER_FREED_SLOT`] longest waiting,
    /// none otherwise. Waking every queued resource for each freed slot would reconcile a
    /// queue of a thousand a thousand times over; the others keep their requeue.
    pub fn to_wake(&self, kind: &str, pod: &Pod) -> Vec<(String, String)> {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let going = pod.metadata.deletion_timestamp.is_some()
            || matches!(phase, Some("Succeeded" | "Failed"));
        if !going {
            return Vec::new();
        }
        let queued = self.queued.lock();
        let mut waiting: Vec<&Queued> = queued.values().filter(|q| q.kind == kind).collect();
        waiting.sort_by_key(|q| q.seq);
        waiting
            .into_iter()
            .take(WAKE_PER_FREED_SLOT)
            .map(|q| (q.namespace.clone(), q.name.clone()))
            .collect()
    }

    /// Movers get certificates from this CA and serve mutual TLS.
    pub fn with_mover_ca(mut self, ca: Arc<MoverCa>) -> Self {
        self.mover_ca = Some(ca);
        self
    }

    /// The movers' CA, when movers serve mutual TLS.
    pub fn mover_ca(&self) -> Option<&Arc<MoverCa>> {
        self.mover_ca.as_ref()
    }

    /// The stream of resources of `kind` to reconcile because their job stream broke
    /// (one receiver per kind: a second call replaces the first).
    pub fn relinked(&self, kind: &'static str) -> UnboundedReceiver<(String, String)> {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        self.relinks.lock().insert(kind, tx);
        rx
    }

    /// Asks for a reconcile of this resource: its job stream broke.
    pub fn relink(&self, kind: &'static str, ids: &Ids) {
        if let Some(tx) = self.relinks.lock().get(kind) {
            // A closed receiver means the controller is stopping: nothing to wake.
            let _ = tx.unbounded_send((ids.namespace.clone(), ids.name.clone()));
        }
    }

    /// Records that this attempt's mover could not be reached; returns how long it has
    /// not been (zero on the first failure).
    pub fn unreachable_for(&self, uid: &str, attempt: u32) -> Duration {
        let mut map = self.unreachable.lock();
        let entry = map
            .entry(uid.to_string())
            .or_insert((attempt, Instant::now()));
        if entry.0 != attempt {
            *entry = (attempt, Instant::now());
        }
        entry.1.elapsed()
    }

    /// The mover answered (or its attempt ended): forget its failures.
    pub fn reached(&self, uid: &str) {
        self.unreachable.lock().remove(uid);
    }
}
