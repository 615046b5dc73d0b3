//! A Backup's changed-block tracking through the CSI SnapshotMetadata service (KEP-3314):
//! which service its mover asks about `spec.volumeSnapshot`, and the token it asks with.
//!
//! Looked up before a mover starts, never while one runs: the VolumeSnapshot, its bound
//! VolumeSnapshotContent (the snapshot's CSI handle and driver), the
//! SnapshotMetadataService named after the driver (`cbt.storage.k8s.io` v1beta1, else
//! v1alpha1), and the source claim's volume mode (only a Block volume's blocks are the
//! image). Anything missing is not an error: the backup is made without the service
//! (comparing change digests, or reading every allocated chunk), and its status says why.
//!
//! The token: the service's sidecar authenticates a caller by a TokenReview for its
//! audience and authorizes it by a SubjectAccessReview (`get volumesnapshots` in the
//! snapshot's namespace). The mover asks with a token of its own pod's ServiceAccount,
//! projected by the kubelet for the service's audience (bound to the pod, renewed, never
//! in a Secret, 10 minutes): so the service answers only for what that account, in that
//! namespace, may read, and a user who can read the namespace's Secrets learns nothing.
//! The account needs `get volumesnapshots` in its namespace (the upstream client role);
//! without it the service refuses, and the backup compares change digests instead.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::ByteString;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::Api;

use crate::crd::{Backup, MetadataLookup, MetadataService};

use super::context::Context;
use super::error::Error;

/// The versions of the SnapshotMetadataService kind asked for, in order.
pub const SERVICE_VERSIONS: [&str; 2] = ["v1beta1", "v1alpha1"];

fn snapshot_api(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind),
        plural,
    )
}

/// The SnapshotMetadataService API of `version`.
pub fn service_api(version: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cbt.storage.k8s.io", version, "SnapshotMetadataService"),
        "snapshotmetadataservices",
    )
}

/// Why a Backup reads without the service, in its status's words.
fn unavailable(why: impl std::fmt::Display) -> MetadataLookup {
    MetadataLookup::Unavailable(format!(
        "the CSI SnapshotMetadata service is not used: {why}"
    ))
}

/// An object the API may not have: `None` for a 404.
fn found<T>(result: Result<T, kube::Error>) -> Result<Option<T>, kube::Error> {
    match result {
        Ok(object) => Ok(Some(object)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// A refusal the operator's RBAC explains, as a reason; other failures are errors.
fn refused(
    result: Result<Option<DynamicObject>, kube::Error>,
    what: &str,
) -> Result<Result<Option<DynamicObject>, MetadataLookup>, Error> {
    match result {
        Ok(object) => Ok(Ok(object)),
        Err(kube::Error::Api(e)) if e.code == 403 => Ok(Err(unavailable(format!(
            "the operator may not read {what} (403: re-apply its RBAC from this release)"
        )))),
        Err(e) => Err(e.into()),
    }
}

/// What the mover of `backup` can ask (see the module docs).
pub async fn lookup(ctx: &Context, backup: &Backup) -> Result<Option<MetadataLookup>, Error> {
    let Some(name) = &backup.spec.volume_snapshot else {
        return Ok(None);
    };
    let namespace = backup.metadata.namespace.as_deref().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let Some(claim) = found(claims.get(&backup.spec.source_pvc).await)? else {
        // The mover's own wait for its claim says it.
        return Ok(Some(unavailable(format!(
            "pvc/{} does not exist",
            backup.spec.source_pvc
        ))));
    };
    if let Some(why) = not_block(&claim).or_else(|| not_restored_from(&claim, name)) {
        return Ok(Some(unavailable(why)));
    }
    let snapshots: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        namespace,
        &snapshot_api("VolumeSnapshot", "volumesnapshots"),
    );
    let snapshot = match refused(found(snapshots.get(name).await), "volumesnapshots")? {
        Ok(Some(snapshot)) => snapshot,
        Ok(None) => {
            return Ok(Some(unavailable(format!(
                "VolumeSnapshot {name} does not exist"
            ))))
        }
        Err(why) => return Ok(Some(why)),
    };
    let Some(content_name) = snapshot.data["status"]["boundVolumeSnapshotContentName"].as_str()
    else {
        return Ok(Some(unavailable(format!(
            "VolumeSnapshot {name} is bound to no VolumeSnapshotContent yet"
        ))));
    };
    let contents: Api<DynamicObject> = Api::all_with(
        ctx.client.clone(),
        &snapshot_api("VolumeSnapshotContent", "volumesnapshotcontents"),
    );
    let content = match refused(
        found(contents.get(content_name).await),
        "volumesnapshotcontents",
    )? {
        Ok(Some(content)) => content,
        Ok(None) => {
            return Ok(Some(unavailable(format!(
                "VolumeSnapshotContent {content_name} of VolumeSnapshot {name} does not exist"
            ))))
        }
        Err(why) => return Ok(Some(why)),
    };
    let (driver, handle) = match content_facts(&content) {
        Ok(facts) => facts,
        Err(why) => return Ok(Some(unavailable(why))),
    };
    for version in SERVICE_VERSIONS {
        let services: Api<DynamicObject> = Api::all_with(ctx.client.clone(), &service_api(version));
        match refused(
            found(services.get(&driver).await),
            "snapshotmetadataservices",
        )? {
            Ok(Some(service)) => {
                return Ok(Some(match service_of(&driver, &service, handle) {
                    Ok(service) => MetadataLookup::Service(service),
                    Err(why) => unavailable(why),
                }))
            }
            Ok(None) => continue,
            Err(why) => return Ok(Some(why)),
        }
    }
    Ok(Some(unavailable(format!(
        "CSI driver {driver} has no SnapshotMetadataService (cbt.storage.k8s.io): it offers no changed-block tracking, or its external-snapshot-metadata sidecar is not installed"
    ))))
}

/// Why the claim's blocks are not the image, when they are not.
pub fn not_block(claim: &PersistentVolumeClaim) -> Option<String> {
    let mode = claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref());
    (mode != Some("Block")).then(|| {
        format!(
            "pvc/{} is a Filesystem volume: its image is a file, whose blocks are not the volume's",
            claim.metadata.name.as_deref().unwrap_or_default()
        )
    })
}

/// Why the claim's blocks are not the snapshot's, when the claim was not restored from
/// the VolumeSnapshot `snapshot` (its metadata would then describe other blocks: a
/// wrong backup).
pub fn not_restored_from(claim: &PersistentVolumeClaim, snapshot: &str) -> Option<String> {
    let spec = claim.spec.as_ref();
    let source = spec
        .and_then(|s| s.data_source_ref.as_ref())
        .map(|r| (r.api_group.as_deref(), r.kind.as_str(), r.name.as_str()))
        .or_else(|| {
            spec.and_then(|s| s.data_source.as_ref())
                .map(|r| (r.api_group.as_deref(), r.kind.as_str(), r.name.as_str()))
        });
    (source != Some((Some("snapshot.storage.k8s.io"), "VolumeSnapshot", snapshot))).then(|| {
        format!(
            "pvc/{} was not restored from VolumeSnapshot {snapshot}: the snapshot's blocks are not the claim's",
            claim.metadata.name.as_deref().unwrap_or_default()
        )
    })
}

/// A VolumeSnapshotContent's driver and snapshot handle.
pub fn content_facts(content: &DynamicObject) -> Result<(String, String), String> {
    let name = content.metadata.name.as_deref().unwrap_or_default();
    let driver = content.data["spec"]["driver"].as_str().unwrap_or_default();
    let handle = content.data["status"]["snapshotHandle"]
        .as_str()
        .unwrap_or_default();
    if driver.is_empty() || driver.len() > 63 {
        return Err(format!("VolumeSnapshotContent {name} names no CSI driver"));
    }
    if handle.is_empty() || handle.len() > 1024 || handle.chars().any(char::is_control) {
        return Err(format!(
            "VolumeSnapshotContent {name} has no snapshot handle yet"
        ));
    }
    Ok((driver.to_string(), handle.to_string()))
}

/// A SnapshotMetadataService object as the mover needs it.
pub fn service_of(
    driver: &str,
    object: &DynamicObject,
    snapshot_handle: String,
) -> Result<MetadataService, String> {
    let spec = &object.data["spec"];
    let text = |field: &str| spec[field].as_str().unwrap_or_default().to_string();
    let (address, audience) = (text("address"), text("audience"));
    let ca: Option<ByteString> = serde_json::from_value(spec["caCert"].clone()).ok();
    let ca_pem = ca.map(|ByteString(bytes)| bytes).unwrap_or_default();
    let bad = |field: &str| {
        Err(format!(
            "SnapshotMetadataService {driver} has no valid spec.{field}: ask its driver's installer"
        ))
    };
    if address.is_empty() || address.len() > 1000 || address.contains(['/', ' ']) {
        return bad("address");
    }
    if audience.is_empty() || audience.len() > 1024 {
        return bad("audience");
    }
    if ca_pem.is_empty() || ca_pem.len() > 64 * 1024 {
        return bad("caCert");
    }
    Ok(MetadataService {
        driver: driver.to_string(),
        address: format!("https://{address}"),
        ca_pem,
        audience,
        snapshot_handle,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(api: &ApiResource, value: serde_json::Value) -> DynamicObject {
        let mut o = DynamicObject::new("x", api);
        o.metadata.name = value["metadata"]["name"].as_str().map(str::to_string);
        o.data = value;
        o
    }

    #[test]
    fn a_content_gives_its_driver_and_handle_once_it_has_them() {
        let api = snapshot_api("VolumeSnapshotContent", "volumesnapshotcontents");
        let ready = object(
            &api,
            json!({"metadata": {"name": "c1"}, "spec": {"driver": "rbd.csi.ceph.com"},
                   "status": {"snapshotHandle": "0001-0009-rook-ceph-0000"}}),
        );
        assert_eq!(
            content_facts(&ready).unwrap(),
            ("rbd.csi.ceph.com".into(), "0001-0009-rook-ceph-0000".into())
        );
        let pending = object(
            &api,
            json!({"metadata": {"name": "c1"}, "spec": {"driver": "rbd.csi.ceph.com"}}),
        );
        assert_eq!(
            content_facts(&pending).unwrap_err(),
            "VolumeSnapshotContent c1 has no snapshot handle yet"
        );
        let driverless = object(
            &api,
            json!({"metadata": {"name": "c1"}, "status": {"snapshotHandle": "h"}}),
        );
        assert!(content_facts(&driverless)
            .unwrap_err()
            .contains("names no CSI driver"));
    }

    #[test]
    fn a_service_needs_its_address_audience_and_ca() {
        let api = service_api("v1beta1");
        let good = json!({"metadata": {"name": "d"}, "spec": {
            "address": "sms.csi:6443", "audience": "aud",
            "caCert": "LS0tLS1CRUdJTg=="}});
        let service = service_of("d", &object(&api, good.clone()), "h".into()).unwrap();
        assert_eq!(service.address, "https://sms.csi:6443");
        assert_eq!(service.ca_pem, b"-----BEGIN");
        assert_eq!(service.audience, "aud");
        assert_eq!(service.snapshot_handle, "h");
        for (field, bad) in [
            ("address", json!("https://sms.csi:6443")),
            ("address", json!("")),
            ("audience", json!("")),
            ("caCert", json!("not base64!")),
            ("caCert", json!("")),
        ] {
            let mut v = good.clone();
            v["spec"][field] = bad.clone();
            let why = service_of("d", &object(&api, v), "h".into()).unwrap_err();
            assert!(
                why.contains(&format!("spec.{field}")),
                "{field} {bad}: {why}"
            );
        }
    }

    #[test]
    fn only_a_claim_restored_from_the_snapshot_is_described_by_it() {
        let claim = |source: serde_json::Value| -> PersistentVolumeClaim {
            serde_json::from_value(json!({"metadata": {"name": "snap-src"},
                                          "spec": {"volumeMode": "Block", "dataSource": source}}))
            .unwrap()
        };
        let from = |name: &str| json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": name});
        assert_eq!(not_restored_from(&claim(from("snap")), "snap"), None);
        assert!(not_restored_from(&claim(from("other")), "snap")
            .unwrap()
            .starts_with("pvc/snap-src was not restored from VolumeSnapshot snap"));
        let cloned = json!({"kind": "PersistentVolumeClaim", "name": "snap"});
        assert!(not_restored_from(&claim(cloned), "snap").is_some());
        assert!(not_restored_from(&claim(serde_json::Value::Null), "snap").is_some());
    }

    #[test]
    fn only_a_block_claims_blocks_are_the_image() {
        let claim = |mode: Option<&str>| -> PersistentVolumeClaim {
            serde_json::from_value(json!({"metadata": {"name": "web1"},
                                          "spec": {"volumeMode": mode}}))
            .unwrap()
        };
        assert_eq!(not_block(&claim(Some("Block"))), None);
        assert!(not_block(&claim(Some("Filesystem")))
            .unwrap()
            .starts_with("pvc/web1 is a Filesystem volume"));
        assert!(not_block(&claim(None)).is_some(), "Filesystem by default");
    }
}
