//! The file `ferry operator render` reads: ferry resources and the cluster objects they
//! refer to, as multi-document YAML (or JSON), `kind: List` documents flattened as
//! `kubectl get -o yaml` writes them. What it holds becomes a [`Cluster`]: the world the
//! planning functions observe.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use kube::api::DynamicObject;
use kube::core::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use crate::controller::context::UID_RANGE_ANNOTATION;
use crate::controller::secrets;
use crate::crd::{
    Backup, BackupRepository, BackupSchedule, Checksum, GoldenImage, Restore, StorageClassProfile,
    Transfer, VolumeImageSource,
};

/// Why the file cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// Not YAML.
    #[error("document {document}: not YAML: {source}")]
    Yaml {
        /// Its number, from 1.
        document: usize,
        /// What the parser said.
        source: serde_yaml::Error,
    },
    /// A document without apiVersion or kind.
    #[error("document {0}: no apiVersion and kind: every document must be a Kubernetes object")]
    NotAnObject(usize),
    /// A kind render does not read.
    #[error("document {document}: {kind} ({api_version}) is not a kind render reads: give ferry resources (Transfer, Checksum, Backup, Restore, BackupRepository, BackupSchedule, VolumeImageSource, GoldenImage, StorageClassProfile) and the objects they refer to (PersistentVolumeClaim, Secret, Pod, Namespace, PersistentVolume, StorageClass, VolumeSnapshotClass, CSINode, VolumeAttachment, Node)")]
    UnknownKind {
        /// Its number, from 1.
        document: usize,
        /// Its kind.
        kind: String,
        /// Its apiVersion.
        api_version: String,
    },
    /// A known kind whose fields do not fit its schema.
    #[error("document {document}: {kind} {name}: {source}")]
    Invalid {
        /// Its number, from 1.
        document: usize,
        /// Its kind.
        kind: String,
        /// Its name.
        name: String,
        /// What did not fit.
        source: serde_json::Error,
    },
    /// The same object twice.
    #[error("document {document}: {kind} {namespace}/{name} is given twice")]
    Duplicate {
        /// Its number, from 1.
        document: usize,
        /// Its kind.
        kind: String,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
}

/// A ferry resource of the file, in file order.
#[derive(Debug, Clone)]
pub enum Resource {
    /// A Transfer.
    Transfer(Box<Transfer>),
    /// A Checksum.
    Checksum(Box<Checksum>),
    /// A Backup.
    Backup(Box<Backup>),
    /// A Restore.
    Restore(Box<Restore>),
}

/// Everything the file holds.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    /// The ferry resources that run movers, in file order.
    pub resources: Vec<Resource>,
    /// BackupSchedules, in file order.
    pub schedules: Vec<BackupSchedule>,
    /// VolumeImageSources by (namespace, name).
    pub sources: BTreeMap<(String, String), VolumeImageSource>,
    /// GoldenImages by (namespace, name): a `goldenImage` source reads the claim its
    /// status names as current (render asks no source for its version).
    pub golden_images: BTreeMap<(String, String), GoldenImage>,
    /// StorageClasses by name.
    pub classes: BTreeMap<String, StorageClass>,
    /// BackupRepositories by (namespace, name).
    pub repositories: BTreeMap<(String, String), BackupRepository>,
    /// Backups by (namespace, name) (also in `resources`): Restores name them.
    pub backups: BTreeMap<(String, String), Backup>,
    /// Claims by (namespace, name).
    pub claims: BTreeMap<(String, String), PersistentVolumeClaim>,
    /// Pods by namespace.
    pub pods: BTreeMap<String, Vec<Pod>>,
    /// Secrets' keys by (namespace, name) (values are never kept).
    pub secrets: BTreeMap<(String, String), BTreeSet<String>>,
    /// Namespaces whose pods get their user IDs from a range (OpenShift).
    pub assigning_ids: BTreeSet<String>,
    /// StorageClassProfiles (cluster-scoped).
    pub profiles: Vec<StorageClassProfile>,
    /// VolumeSnapshotClasses (cluster-scoped).
    pub snapshot_classes: Vec<DynamicObject>,
    /// Nodes, their CSINodes and the VolumeAttachments (cluster-scoped): where a
    /// Transfer that fans out places its groups.
    pub nodes: Vec<Node>,
    /// CSINodes (attach limits per driver).
    pub csinodes: Vec<CSINode>,
    /// VolumeAttachments (what each node has attached).
    pub attachments: Vec<VolumeAttachment>,
    /// Objects read for context that no plan looks at yet, by kind.
    pub context: BTreeMap<String, usize>,
}

/// Kinds read for context only.
const CONTEXT_KINDS: [&str; 1] = ["PersistentVolume"];

/// The namespace of an object, `default` when it names none (as kubectl applies it).
pub fn namespace_of(meta: &ObjectMeta) -> String {
    meta.namespace
        .clone()
        .unwrap_or_else(|| "default".to_string())
}

impl Cluster {
    /// Reads `text`: multi-document YAML (JSON is YAML too).
    pub fn parse(text: &str) -> Result<Self, InputError> {
        let mut cluster = Cluster::default();
        cluster.read(text)?;
        Ok(cluster)
    }

    /// Adds the objects of `text` (one more file) to those read so far.
    pub fn read(&mut self, text: &str) -> Result<(), InputError> {
        let cluster = self;
        for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
            let number = i + 1;
            let value = Value::deserialize(document).map_err(|source| InputError::Yaml {
                document: number,
                source,
            })?;
            if value.is_null() {
                continue;
            }
            if value.get("kind").and_then(Value::as_str) == Some("List") {
                let items = value.get("items").and_then(Value::as_array);
                for item in items.into_iter().flatten() {
                    cluster.add(number, item.clone())?;
                }
                continue;
            }
            cluster.add(number, value)?;
        }
        Ok(())
    }

    fn add(&mut self, document: usize, value: Value) -> Result<(), InputError> {
        let text = |field: &str| value.get(field).and_then(Value::as_str).map(str::to_string);
        let (Some(api_version), Some(kind)) = (text("apiVersion"), text("kind")) else {
            return Err(InputError::NotAnObject(document));
        };
        let group = api_version.split_once('/').map_or("", |(g, _)| g);
        match (group, kind.as_str()) {
            ("ferry.dev", "Transfer") => {
                let t: Transfer = typed(document, &kind, value)?;
                self.resources.push(Resource::Transfer(Box::new(t)));
            }
            ("ferry.dev", "Checksum") => {
                let c: Checksum = typed(document, &kind, value)?;
                self.resources.push(Resource::Checksum(Box::new(c)));
            }
            ("ferry.dev", "Backup") => {
                let b: Backup = typed(document, &kind, value)?;
                let key = (namespace_of(&b.metadata), name_of(&b.metadata));
                self.backups.insert(key, b.clone());
                self.resources.push(Resource::Backup(Box::new(b)));
            }
            ("ferry.dev", "Restore") => {
                let r: Restore = typed(document, &kind, value)?;
                self.resources.push(Resource::Restore(Box::new(r)));
            }
            ("ferry.dev", "BackupRepository") => {
                let r: BackupRepository = typed(document, &kind, value)?;
                let key = (namespace_of(&r.metadata), name_of(&r.metadata));
                unique(document, &kind, &key, self.repositories.contains_key(&key))?;
                self.repositories.insert(key, r);
            }
            ("ferry.dev", "BackupSchedule") => {
                let b: BackupSchedule = typed(document, &kind, value)?;
                self.schedules.push(b);
            }
            ("ferry.dev", "VolumeImageSource") => {
                let v: VolumeImageSource = typed(document, &kind, value)?;
                let key = (namespace_of(&v.metadata), name_of(&v.metadata));
                unique(document, &kind, &key, self.sources.contains_key(&key))?;
                self.sources.insert(key, v);
            }
            ("ferry.dev", "GoldenImage") => {
                let g: GoldenImage = typed(document, &kind, value)?;
                let key = (namespace_of(&g.metadata), name_of(&g.metadata));
                unique(document, &kind, &key, self.golden_images.contains_key(&key))?;
                self.golden_images.insert(key, g);
            }
            ("ferry.dev", "StorageClassProfile") => {
                let p: StorageClassProfile = typed(document, &kind, value)?;
                self.profiles.push(p);
            }
            ("snapshot.storage.k8s.io", "VolumeSnapshotClass") => {
                let c: DynamicObject = typed(document, &kind, value)?;
                self.snapshot_classes.push(c);
            }
            ("", "Node") => self.nodes.push(typed(document, &kind, value)?),
            ("storage.k8s.io", "CSINode") => self.csinodes.push(typed(document, &kind, value)?),
            ("storage.k8s.io", "VolumeAttachment") => {
                self.attachments.push(typed(document, &kind, value)?)
            }
            ("storage.k8s.io", "StorageClass") => {
                let c: StorageClass = typed(document, &kind, value)?;
                let key = (String::new(), name_of(&c.metadata));
                unique(document, &kind, &key, self.classes.contains_key(&key.1))?;
                self.classes.insert(key.1, c);
            }
            ("", "PersistentVolumeClaim") => {
                let c: PersistentVolumeClaim = typed(document, &kind, value)?;
                let key = (namespace_of(&c.metadata), name_of(&c.metadata));
                unique(document, &kind, &key, self.claims.contains_key(&key))?;
                self.claims.insert(key, c);
            }
            ("", "Pod") => {
                let p: Pod = typed(document, &kind, value)?;
                self.pods
                    .entry(namespace_of(&p.metadata))
                    .or_default()
                    .push(p);
            }
            ("", "Secret") => {
                let s: Secret = typed(document, &kind, value)?;
                let key = (namespace_of(&s.metadata), name_of(&s.metadata));
                unique(document, &kind, &key, self.secrets.contains_key(&key))?;
                self.secrets.insert(key, secrets::keys_of(&s));
            }
            ("", "Namespace") => {
                let n: Namespace = typed(document, &kind, value)?;
                let assigns = n
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(UID_RANGE_ANNOTATION));
                if assigns {
                    self.assigning_ids.insert(name_of(&n.metadata));
                }
            }
            (_, kind) if CONTEXT_KINDS.contains(&kind) => {
                *self.context.entry(kind.to_string()).or_default() += 1;
            }
            _ => {
                return Err(InputError::UnknownKind {
                    document,
                    kind,
                    api_version,
                })
            }
        }
        Ok(())
    }

    /// The claims of `namespace` by name.
    pub fn claims_in(&self, namespace: &str) -> BTreeMap<String, PersistentVolumeClaim> {
        self.claims
            .iter()
            .filter(|((ns, _), _)| ns == namespace)
            .map(|((_, name), pvc)| (name.clone(), pvc.clone()))
            .collect()
    }

    /// The Secrets of `namespace` by name, with their keys.
    pub fn secrets_in(&self, namespace: &str) -> BTreeMap<String, BTreeSet<String>> {
        self.secrets
            .iter()
            .filter(|((ns, _), _)| ns == namespace)
            .map(|((_, name), keys)| (name.clone(), keys.clone()))
            .collect()
    }
}

fn name_of(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

fn unique(
    document: usize,
    kind: &str,
    (namespace, name): &(String, String),
    seen: bool,
) -> Result<(), InputError> {
    if seen {
        return Err(InputError::Duplicate {
            document,
            kind: kind.to_string(),
            namespace: namespace.clone(),
            name: name.clone(),
        });
    }
    Ok(())
}

fn typed<T: DeserializeOwned>(document: usize, kind: &str, value: Value) -> Result<T, InputError> {
    let name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("(unnamed)")
        .to_string();
    serde_json::from_value(value).map_err(|source| InputError::Invalid {
        document,
        kind: kind.to_string(),
        name,
        source,
    })
}
