//! The stand-in's storage, as etcd and the watch cache are to the API server: objects by
//! key, one resourceVersion counter for the whole cluster (every write takes the next
//! value), a bounded history of changes (a watch from a resourceVersion older than the
//! history gets 410 Gone, as after an etcd compaction), and the open watches, each fed the
//! changes that match its filter. A change that makes an object stop matching a watch's
//! selector reaches it as DELETED, one that makes it start matching as ADDED, as the
//! watch cache does.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde_json::Value;
use tokio::sync::mpsc;

use super::selector::{FieldSelector, LabelSelector};

/// Where an object lives.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// API group ("" for core).
    pub group: String,
    /// Resource plural.
    pub resource: String,
    /// Namespace ("" for cluster-scoped objects).
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl Key {
    /// A key.
    pub fn new(group: &str, resource: &str, namespace: &str, name: &str) -> Self {
        Self {
            group: group.into(),
            resource: resource.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    /// Created.
    Added,
    /// Written.
    Modified,
    /// Removed.
    Deleted,
}

impl ChangeType {
    /// The watch event type.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, at the resourceVersion it made.
#[derive(Debug, Clone)]
pub struct Change {
    /// The resourceVersion of the write.
    pub rv: u64,
    /// What happened.
    pub kind: ChangeType,
    /// Which object.
    pub key: Key,
    /// The object after the change (the last state for a deletion).
    pub object: Value,
    /// The object before it (None for a creation).
    pub old: Option<Value>,
}

/// What a watch wants to see.
#[derive(Debug, Clone)]
pub struct Filter {
    /// API group.
    pub group: String,
    /// Resource plural.
    pub resource: String,
    /// Only this namespace (None: all).
    pub namespace: Option<String>,
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector.
    pub fields: FieldSelector,
}

impl Filter {
    fn same_resource(&self, key: &Key) -> bool {
        key.group == self.group
            && key.resource == self.resource
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| *ns == key.namespace)
    }

    /// Whether an object of the resource matches the selectors.
    pub fn selects(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }

    /// How a change looks to this watch, if it sees it at all.
    pub fn view(&self, c: &Change) -> Option<(ChangeType, Value)> {
        if !self.same_resource(&c.key) {
            return None;
        }
        let now = self.selects(&c.object);
        let before = c.old.as_ref().is_some_and(|o| self.selects(o));
        match c.kind {
            ChangeType::Added if now => Some((ChangeType::Added, c.object.clone())),
            ChangeType::Deleted if now => Some((ChangeType::Deleted, c.object.clone())),
            ChangeType::Modified => match (before, now) {
                (true, true) => Some((ChangeType::Modified, c.object.clone())),
                (false, true) => Some((ChangeType::Added, c.object.clone())),
                (true, false) => Some((ChangeType::Deleted, c.object.clone())),
                (false, false) => None,
            },
            _ => None,
        }
    }
}

/// A change sent to a watch: its type, the object, and the resourceVersion.
pub type Sent = (ChangeType, Value, u64);

struct Watcher {
    filter: Filter,
    tx: mpsc::UnboundedSender<Sent>,
}

/// Changes kept for watches that resume from a resourceVersion.
const HISTORY: usize = 50_000;

/// The objects, their history and the open watches.
#[derive(Default)]
pub struct Store {
    objects: BTreeMap<Key, Value>,
    rv: u64,
    history: VecDeque<Change>,
    /// Changes at or below this resourceVersion are gone from the history.
    compacted: u64,
    watchers: Vec<Watcher>,
    /// How many ownerReferences name each uid: whether a removal leaves dependents to
    /// collect, without a walk over every object.
    owned: HashMap<String, usize>,
    /// Objects removed, per resource (plural).
    removed: HashMap<String, u64>,
    /// PersistentVolumes written since the binder last looked (so that it looks at a
    /// volume whose claim reference or reclaim policy a client changed, without a walk
    /// over every volume on every pass).
    volumes_written: std::collections::BTreeSet<Key>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("objects", &self.objects.len())
            .field("rv", &self.rv)
            .field("watchers", &self.watchers.len())
            .finish_non_exhaustive()
    }
}

/// A watch asked for a resourceVersion older than the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone {
    /// The oldest resourceVersion a watch may still start from.
    pub oldest: u64,
}

impl Store {
    /// The current resourceVersion (of the last write).
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// An object.
    pub fn get(&self, key: &Key) -> Option<&Value> {
        self.objects.get(key)
    }

    /// The objects of a resource (in one namespace, or all), ordered by namespace and name.
    pub fn list<'a>(
        &'a self,
        group: &'a str,
        resource: &'a str,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a Key, &'a Value)> + 'a {
        // Keys sort by group, resource, namespace, name: one kind (in one namespace) is a
        // contiguous range, found without walking every other object.
        let from = Key::new(group, resource, namespace.unwrap_or(""), "");
        self.objects.range(from..).take_while(move |(k, _)| {
            k.group == group
                && k.resource == resource
                && namespace.is_none_or(|ns| ns == k.namespace)
        })
    }

    /// Every object.
    pub fn all(&self) -> impl Iterator<Item = (&Key, &Value)> {
        self.objects.iter()
    }

    /// Writes an object with the next resourceVersion; returns it as stored.
    pub fn put(&mut self, key: Key, mut object: Value) -> Value {
        if key.resource == "persistentvolumes" && key.group.is_empty() {
            self.volumes_written.insert(key.clone());
        }
        self.rv += 1;
        object["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        self.count_owners(&object, true);
        let old = self.objects.insert(key.clone(), object.clone());
        if let Some(old) = &old {
            self.count_owners(old, false);
        }
        let kind = if old.is_some() {
            ChangeType::Modified
        } else {
            ChangeType::Added
        };
        self.record(Change {
            rv: self.rv,
            kind,
            key,
            object: object.clone(),
            old,
        });
        object
    }

    /// Removes an object; returns its last state (with the deletion's resourceVersion).
    pub fn remove(&mut self, key: &Key) -> Option<Value> {
        let mut object = self.objects.remove(key)?;
        self.count_owners(&object, false);
        *self.removed.entry(key.resource.clone()).or_default() += 1;
        self.rv += 1;
        object["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        self.record(Change {
            rv: self.rv,
            kind: ChangeType::Deleted,
            key: key.clone(),
            object: object.clone(),
            old: None,
        });
        Some(object)
    }

    /// How many objects of `resource` (plural, any group) were removed so far.
    pub fn removed(&self, resource: &str) -> u64 {
        self.removed.get(resource).copied().unwrap_or(0)
    }

    /// The PersistentVolumes written since the last call.
    pub fn take_volumes_written(&mut self) -> std::collections::BTreeSet<Key> {
        std::mem::take(&mut self.volumes_written)
    }

    /// Whether any object names `uid` as an owner.
    pub fn has_dependents(&self, uid: &str) -> bool {
        self.owned.contains_key(uid)
    }

    fn count_owners(&mut self, object: &Value, add: bool) {
        let Some(refs) = object["metadata"]["ownerReferences"].as_array() else {
            return;
        };
        for uid in refs.iter().filter_map(|r| r["uid"].as_str()) {
            if add {
                *self.owned.entry(uid.to_string()).or_default() += 1;
            } else if let Some(n) = self.owned.get_mut(uid) {
                *n -= 1;
                if *n == 0 {
                    self.owned.remove(uid);
                }
            }
        }
    }

    fn record(&mut self, change: Change) {
        self.watchers.retain(|w| match w.filter.view(&change) {
            Some((kind, object)) => w.tx.send((kind, object, change.rv)).is_ok(),
            None => !w.tx.is_closed(),
        });
        self.history.push_back(change);
        while self.history.len() > HISTORY {
            if let Some(c) = self.history.pop_front() {
                self.compacted = c.rv;
            }
        }
    }

    /// Forgets the history up to now: a watch from an older resourceVersion gets 410 Gone
    /// (as after an etcd compaction).
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    /// Opens a watch: `since` None sends every matching object as ADDED first (a watch
    /// from resourceVersion 0 or none); Some(rv) sends the changes after `rv` from the
    /// history, or fails with [`Gone`] when they are no longer there. Then every matching
    /// change as it happens.
    pub fn watch(
        &mut self,
        filter: Filter,
        since: Option<u64>,
    ) -> Result<mpsc::UnboundedReceiver<Sent>, Gone> {
        let (tx, rx) = mpsc::unbounded_channel();
        match since {
            None => {
                for (k, v) in self.objects.iter() {
                    if filter.same_resource(k) && filter.selects(v) {
                        let _ = tx.send((ChangeType::Added, v.clone(), self.rv));
                    }
                }
            }
            Some(rv) if rv < self.compacted => {
                return Err(Gone {
                    oldest: self.compacted + 1,
                })
            }
            Some(rv) => {
                for c in self.history.iter().filter(|c| c.rv > rv) {
                    if let Some((kind, object)) = filter.view(c) {
                        let _ = tx.send((kind, object, c.rv));
                    }
                }
            }
        }
        self.watchers.push(Watcher { filter, tx });
        Ok(rx)
    }
}
