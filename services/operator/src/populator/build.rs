//! The objects the populator creates, as pure functions of the user's claim and its
//! source: the prime claim (the user's claim without its data source, so the provisioner
//! gives it a volume at once) and the Transfer (of an image) or the Restore (of a
//! Backup) that fills it. Both are owned
//! by the user's claim, so deleting the claim deletes them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use crate::crd::validate::quantity_bytes;
use crate::crd::{
    Endpoint, Restore, RestoreSpec, Transfer, TransferSpec, TransferTarget, VolumeImageSource,
};

use super::names;

/// Namespace, name and uid of the user's claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimIds {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl ClaimIds {
    /// The ids of a claim read from the API, if it was.
    pub fn of(pvc: &PersistentVolumeClaim) -> Option<Self> {
        let meta = &pvc.metadata;
        Some(Self {
            namespace: meta.namespace.clone()?,
            name: meta.name.clone()?,
            uid: meta.uid.clone()?,
        })
    }

    /// A controller reference to the claim. `blockOwnerDeletion` is left out: setting it
    /// would need the update right on claims' finalizers, and nothing waits on it.
    pub fn owner(&self) -> OwnerReference {
        OwnerReference {
            api_version: PersistentVolumeClaim::api_version(&()).into_owned(),
            kind: PersistentVolumeClaim::kind(&()).into_owned(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            block_owner_deletion: None,
        }
    }

    fn meta(&self, name: String) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(names::labels(&self.uid)),
            owner_references: Some(vec![self.owner()]),
            ..ObjectMeta::default()
        }
    }
}

/// Whether `obj` is owned by the object of uid `uid`.
pub fn owned_by<K: Resource>(obj: &K, uid: &str) -> bool {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.uid == uid)
}

/// Of a Filesystem volume, the share its filesystem takes for itself, in parts per million
/// (CDI's default `filesystemOverhead`, 5.5%): the prime claim of a Filesystem volume asks
/// for this much more, so that an image as large as the user's claim fits in `disk.img`.
/// A class's `StorageClassProfile` may say otherwise.
pub const FILESYSTEM_OVERHEAD_PPM: u32 = 55_000;

/// The prime claim of `pvc`: same storage class, access modes and volume mode, no data
/// source, the same size (a Filesystem volume's grown by [`FILESYSTEM_OVERHEAD_PPM`], as
/// CDI grows it); pinned to `node` (WaitForFirstConsumer classes) when given.
pub fn prime_claim(
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
    node: Option<&str>,
) -> PersistentVolumeClaim {
    prime_claim_sized(pvc, ids, node, Some(FILESYSTEM_OVERHEAD_PPM))
}

/// [`prime_claim`] with a Filesystem volume grown by `overhead_ppm` (None: not grown, for
/// a clone, whose volume holds the source's filesystem).
pub fn prime_claim_sized(
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
    node: Option<&str>,
    overhead_ppm: Option<u32>,
) -> PersistentVolumeClaim {
    let mut spec = pvc.spec.clone().unwrap_or_default();
    if let Some(ppm) = overhead_ppm.filter(|_| spec.volume_mode.as_deref() != Some("Block")) {
        with_filesystem_overhead(&mut spec, ppm);
    }
    let mut metadata = ids.meta(names::prime(&ids.uid));
    metadata.annotations =
        node.map(|n| BTreeMap::from([(names::SELECTED_NODE.to_string(), n.to_string())]));
    PersistentVolumeClaim {
        metadata,
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: spec.access_modes,
            resources: spec.resources,
            storage_class_name: spec.storage_class_name,
            volume_mode: spec.volume_mode,
            volume_attributes_class_name: spec.volume_attributes_class_name,
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

/// Grows the storage request by the filesystem's overhead (`ppm` parts per million of
/// the volume), in whole MiB rounded up.
fn with_filesystem_overhead(spec: &mut PersistentVolumeClaimSpec, ppm: u32) {
    let Some(storage) = spec
        .resources
        .as_mut()
        .and_then(|r| r.requests.as_mut())
        .and_then(|r| r.get_mut("storage"))
    else {
        return;
    };
    let Some(bytes) = quantity_bytes(storage) else {
        return;
    };
    let ppm = u128::from(ppm.min(999_999));
    let grown = bytes.saturating_mul(1_000_000).div_ceil(1_000_000 - ppm);
    *storage = Quantity(format!("{}Mi", grown.div_ceil(1 << 20)));
}

/// What fills the prime claim from a VolumeImageSource.
#[derive(Debug, Clone)]
pub enum ImageFiller {
    /// A Transfer of its image.
    Transfer(Box<Transfer>),
    /// A Restore of its newest backup of a source.
    Restore(Box<Restore>),
}

/// The Transfer of the VolumeImageSource's image, or the Restore of its backup.
pub fn image_filler(ids: &ClaimIds, source: &VolumeImageSource) -> ImageFiller {
    match (&source.spec.source, &source.spec.backup) {
        (_, Some(latest)) => ImageFiller::Restore(Box::new(restore_latest(
            ids,
            latest,
            source.spec.mover.clone(),
        ))),
        (image, None) => ImageFiller::Transfer(Box::new(transfer(
            ids,
            source,
            &image.clone().unwrap_or_default(),
        ))),
    }
}

/// The Transfer copying `image` (the VolumeImageSource's) into the prime claim, with its
/// options, expected digest and mover settings.
pub fn transfer(ids: &ClaimIds, source: &VolumeImageSource, image: &Endpoint) -> Transfer {
    let spec = TransferSpec {
        source: image.clone(),
        targets: vec![TransferTarget {
            endpoint: Endpoint::pvc(names::prime(&ids.uid)),
            pvc_template: None,
        }],
        options: source.spec.options.clone(),
        expected_digest: source.spec.expected_digest.clone(),
        mover: source.spec.mover.clone(),
        claim_retention: None,
        clone_strategy: None,
        pvc_templates: None,
        fan_out: None,
        relay: None,
    };
    let mut transfer = Transfer::new(&names::transfer(&ids.name), spec);
    transfer.metadata = ids.meta(names::transfer(&ids.name));
    transfer
}

/// The Restore writing the Backup `backup`'s snapshot into the prime claim, with the
/// Backup's mover settings; named as the Transfer of an image would be.
pub fn restore(ids: &ClaimIds, backup: &crate::crd::Backup) -> Restore {
    restore_of(
        ids,
        RestoreSpec {
            backup: backup.metadata.name.clone(),
            repository: None,
            snapshot_id: None,
            source_id: None,
            restore_as_of: None,
            target_pvc: names::prime(&ids.uid),
            mover: backup.spec.mover.clone(),
            resolved: None,
        },
    )
}

/// The Restore writing the newest snapshot of `latest`'s source (at or before its time)
/// into the prime claim; named as the Transfer of an image would be.
pub fn restore_latest(
    ids: &ClaimIds,
    latest: &crate::crd::LatestBackupRef,
    mover: Option<crate::crd::MoverSettings>,
) -> Restore {
    restore_of(
        ids,
        RestoreSpec {
            backup: None,
            repository: Some(latest.repository.clone()),
            snapshot_id: None,
            source_id: Some(latest.source_id.clone()),
            restore_as_of: latest.restore_as_of.clone(),
            target_pvc: names::prime(&ids.uid),
            mover,
            resolved: None,
        },
    )
}

fn restore_of(ids: &ClaimIds, spec: RestoreSpec) -> Restore {
    let mut restore = Restore::new(&names::transfer(&ids.name), spec);
    restore.metadata = ids.meta(names::transfer(&ids.name));
    restore
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn user_claim() -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "disk", "namespace": "vms", "uid": "u-1",
                         "annotations": {"volume.kubernetes.io/selected-node": "node-b"}},
            "spec": {
                "accessModes": ["ReadWriteMany"], "storageClassName": "fast",
                "volumeMode": "Block", "resources": {"requests": {"storage": "20Gi"}},
                "dataSourceRef": {"apiGroup": "ferry.dev", "kind": "VolumeImageSource",
                                  "name": "fedora"},
            },
        }))
        .unwrap()
    }

    #[test]
    fn the_prime_claim_is_the_users_without_its_source_and_owned_by_it() {
        let pvc = user_claim();
        let ids = ClaimIds::of(&pvc).unwrap();
        let prime = serde_json::to_value(prime_claim(&pvc, &ids, Some("node-b"))).unwrap();
        assert_eq!(prime["metadata"]["name"], "ferry-prime-u-1");
        assert_eq!(prime["metadata"]["namespace"], "vms");
        assert_eq!(
            prime["metadata"]["annotations"],
            json!({"volume.kubernetes.io/selected-node": "node-b"})
        );
        assert_eq!(
            prime["metadata"]["labels"]["ferry.dev/populated-claim"],
            "u-1"
        );
        assert_eq!(
            prime["metadata"]["labels"]["velero.io/exclude-from-backup"],
            "true"
        );
        assert_eq!(
            prime["metadata"]["ownerReferences"],
            json!([{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "disk",
                    "uid": "u-1", "controller": true}])
        );
        assert_eq!(
            prime["spec"],
            json!({"accessModes": ["ReadWriteMany"], "storageClassName": "fast",
                   "volumeMode": "Block", "resources": {"requests": {"storage": "20Gi"}}})
        );
        let unpinned = prime_claim(&pvc, &ids, None);
        assert_eq!(unpinned.metadata.annotations, None);
    }

    #[test]
    fn a_filesystem_prime_claim_asks_for_the_filesystems_overhead() {
        let mut pvc = user_claim();
        pvc.spec.as_mut().unwrap().volume_mode = Some("Filesystem".into());
        let ids = ClaimIds::of(&pvc).unwrap();
        let prime = serde_json::to_value(prime_claim(&pvc, &ids, None)).unwrap();
        // 20 GiB / 0.945 = 21,671.95 MiB, rounded up.
        assert_eq!(prime["spec"]["resources"]["requests"]["storage"], "21672Mi");
        pvc.spec.as_mut().unwrap().volume_mode = None;
        let prime = serde_json::to_value(prime_claim(&pvc, &ids, None)).unwrap();
        assert_eq!(prime["spec"]["resources"]["requests"]["storage"], "21672Mi");
    }
}
