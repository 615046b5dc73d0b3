//! The kinds the stand-in serves: the built-in ones the operator and its tests touch, and
//! every CustomResourceDefinition loaded from a manifest (deploy/crds.yaml by default).
//! A kind is known by its group and plural; whether it is namespaced and has a `status`
//! subresource decides how writes treat it. A path naming no known kind gets the API
//! server's 404, as a CRD that is not installed does.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

/// One served resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceInfo {
    /// The API group ("" for the core group).
    pub group: String,
    /// The versions served (the first is the one the stand-in writes into new objects'
    /// `apiVersion` when they have none).
    pub versions: Vec<String>,
    /// The plural, as in paths.
    pub plural: String,
    /// The kind.
    pub kind: String,
    /// Namespaced, or cluster-scoped.
    pub namespaced: bool,
    /// Whether it has a `status` subresource (writes of the object then ignore its status
    /// and writes of the status ignore the rest).
    pub status: bool,
}

impl ResourceInfo {
    /// A resource of `group`/`version`.
    pub fn new(
        group: &str,
        version: &str,
        plural: &str,
        kind: &str,
        namespaced: bool,
        status: bool,
    ) -> Self {
        Self {
            group: group.into(),
            versions: vec![version.into()],
            plural: plural.into(),
            kind: kind.into(),
            namespaced,
            status,
        }
    }

    /// `group/version` (or `v1` for the core group) of `version`.
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// The resource as an error message names it: `pods`, `transfers.ferry.dev`.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// Every resource the stand-in serves, by (group, plural).
#[derive(Debug, Clone, Default)]
pub struct Resources {
    by_path: BTreeMap<(String, String), ResourceInfo>,
}

const BUILTIN: &[(&str, &str, &str, &str, bool, bool)] = &[
    ("", "v1", "pods", "Pod", true, true),
    (
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        true,
    ),
    (
        "",
        "v1",
        "persistentvolumes",
        "PersistentVolume",
        false,
        true,
    ),
    ("", "v1", "secrets", "Secret", true, false),
    ("", "v1", "configmaps", "ConfigMap", true, false),
    ("", "v1", "serviceaccounts", "ServiceAccount", true, false),
    ("", "v1", "services", "Service", true, true),
    ("", "v1", "namespaces", "Namespace", false, true),
    ("", "v1", "nodes", "Node", false, true),
    ("", "v1", "events", "Event", true, false),
    ("events.k8s.io", "v1", "events", "Event", true, false),
    ("coordination.k8s.io", "v1", "leases", "Lease", true, false),
    (
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        false,
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "Role",
        true,
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "RoleBinding",
        true,
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "ClusterRole",
        false,
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
        false,
    ),
    (
        "storage.k8s.io",
        "v1",
        "storageclasses",
        "StorageClass",
        false,
        false,
    ),
    ("storage.k8s.io", "v1", "csinodes", "CSINode", false, false),
    (
        "storage.k8s.io",
        "v1",
        "csidrivers",
        "CSIDriver",
        false,
        false,
    ),
    (
        "storage.k8s.io",
        "v1",
        "volumeattachments",
        "VolumeAttachment",
        false,
        true,
    ),
    (
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        "NetworkPolicy",
        true,
        false,
    ),
    (
        "snapshot.storage.k8s.io",
        "v1",
        "volumesnapshots",
        "VolumeSnapshot",
        true,
        true,
    ),
    (
        "snapshot.storage.k8s.io",
        "v1",
        "volumesnapshotcontents",
        "VolumeSnapshotContent",
        false,
        true,
    ),
    (
        "snapshot.storage.k8s.io",
        "v1",
        "volumesnapshotclasses",
        "VolumeSnapshotClass",
        false,
        false,
    ),
];

impl Resources {
    /// The built-in kinds only.
    pub fn builtin() -> Self {
        let mut r = Self::default();
        for (group, version, plural, kind, namespaced, status) in BUILTIN {
            r.add(ResourceInfo::new(
                group,
                version,
                plural,
                kind,
                *namespaced,
                *status,
            ));
        }
        r
    }

    /// Serves `info` (replacing a kind of the same group and plural).
    pub fn add(&mut self, info: ResourceInfo) {
        self.by_path
            .insert((info.group.clone(), info.plural.clone()), info);
    }

    /// The resource of a path's group and plural, when served in `version`.
    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceInfo> {
        self.by_path
            .get(&(group.to_string(), plural.to_string()))
            .filter(|r| r.versions.iter().any(|v| v == version))
    }

    /// The resource of a kind in an `apiVersion` (for owner references and objects given
    /// whole to [`super::Cluster::apply`]).
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<&ResourceInfo> {
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        self.by_path
            .values()
            .find(|r| r.group == group && r.kind == kind && r.versions.iter().any(|v| v == version))
    }

    /// Serves every CustomResourceDefinition in a multi-document YAML file.
    pub fn add_crds_from(&mut self, file: &Path) -> Result<usize, String> {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let mut added = 0;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value: Value = serde::Deserialize::deserialize(doc)
                .map_err(|e| format!("{}: {e}", file.display()))?;
            if value["kind"] == "CustomResourceDefinition" {
                self.add_crd(&value)?;
                added += 1;
            }
        }
        Ok(added)
    }

    /// Serves one CustomResourceDefinition (its served versions; a `status` subresource
    /// when any served version has one).
    pub fn add_crd(&mut self, crd: &Value) -> Result<(), String> {
        let spec = &crd["spec"];
        let field = |v: &Value, what: &str| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("a CRD without {what}: {crd}"))
        };
        let versions: Vec<&Value> = spec["versions"]
            .as_array()
            .map(|v| v.iter().filter(|v| v["served"] != false).collect())
            .unwrap_or_default();
        let mut names: Vec<String> = Vec::new();
        for v in &versions {
            names.push(field(&v["name"], "a version name")?);
        }
        // The storage version first: new objects get it.
        if let Some(i) = versions.iter().position(|v| v["storage"] == true) {
            names.swap(0, i);
        }
        if names.is_empty() {
            return Err(format!("a CRD with no served version: {crd}"));
        }
        self.add(ResourceInfo {
            group: field(&spec["group"], "spec.group")?,
            versions: names,
            plural: field(&spec["names"]["plural"], "spec.names.plural")?,
            kind: field(&spec["names"]["kind"], "spec.names.kind")?,
            namespaced: spec["scope"] != "Cluster",
            status: versions
                .iter()
                .any(|v| v["subresources"]["status"].is_object()),
        });
        Ok(())
    }
}
