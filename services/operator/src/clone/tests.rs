use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::json;

use super::plan::{self, Observed, Step};
use super::strategy::{decide, ClaimFacts, ClassFacts, Decision, Facts, SnapshotClassFacts};
use crate::controller::kind::Ids;
use crate::crd::{CloneStrategy, Transfer, VolumeMode};
use crate::schedule::build::SnapshotState;

fn transfer(extra: serde_json::Value) -> Transfer {
    let mut t = json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "golden-to-vms", "namespace": "vms", "uid": "u-1"},
        "spec": {
            "source": {"pvc": {"name": "golden"}},
            "targets": [
                {"pvcTemplate": {"name": "vm-1", "size": "10Gi", "storageClassName": "rbd"}},
                {"pvcTemplate": {"name": "vm-2", "size": "10Gi", "storageClassName": "rbd"}},
            ],
        },
    });
    merge(&mut t, &extra);
    serde_json::from_value(t).unwrap()
}

/// A JSON merge patch (RFC 7386): null removes.
fn merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
    match (target, patch) {
        (serde_json::Value::Object(t), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

fn class(name: &str, provisioner: &str) -> ClassFacts {
    ClassFacts {
        name: name.into(),
        provisioner: provisioner.into(),
        expands: true,
        profile_strategy: None,
        binds_when_used: false,
    }
}

fn facts() -> Facts {
    Facts {
        source: Some(ClaimFacts {
            class: Some("rbd".into()),
            mode: VolumeMode::Filesystem,
            bytes: Some(10 << 30),
            unbound_until_used: false,
        }),
        classes: vec![
            class("rbd", "rbd.csi.ceph.com"),
            class("local", "rancher.io/local-path"),
        ],
        snapshot_classes: vec![
            SnapshotClassFacts {
                name: "b-rbd".into(),
                driver: "rbd.csi.ceph.com".into(),
                default: false,
            },
            SnapshotClassFacts {
                name: "a-rbd".into(),
                driver: "rbd.csi.ceph.com".into(),
                default: false,
            },
            SnapshotClassFacts {
                name: "z-rbd-default".into(),
                driver: "rbd.csi.ceph.com".into(),
                default: true,
            },
        ],
        default_class: Some("local".into()),
    }
}

fn fallback(d: Decision) -> String {
    match d {
        Decision::Copy {
            fallback: Some(why),
        } => why,
        other => panic!("not a fallback: {other:?}"),
    }
}

#[test]
fn auto_restores_a_snapshot_of_the_drivers_default_class() {
    assert_eq!(
        decide(&transfer(json!({})), &facts()),
        Decision::Snapshot {
            class: "z-rbd-default".into()
        }
    );
    // Without a default, the first by name.
    let mut f = facts();
    f.snapshot_classes.retain(|c| !c.default);
    assert_eq!(
        decide(&transfer(json!({})), &f),
        Decision::Snapshot {
            class: "a-rbd".into()
        }
    );
}

#[test]
fn auto_falls_back_to_a_copy_saying_why() {
    let mut f = facts();
    f.snapshot_classes.clear();
    assert_eq!(
        fallback(decide(&transfer(json!({})), &f)),
        "no VolumeSnapshotClass of driver rbd.csi.ceph.com"
    );
    let verify = transfer(json!({"spec": {"options": {"verify": true}}}));
    assert_eq!(
        fallback(decide(&verify, &facts())),
        "verify asks for a copy through ferry"
    );
    let digest =
        transfer(json!({"spec": {"expectedDigest": format!("sha256:{}", "0".repeat(64))}}));
    assert_eq!(
        fallback(decide(&digest, &facts())),
        "expectedDigest asks for a copy through ferry"
    );
    let other_driver = transfer(json!({"spec": {"targets": [
        {"pvcTemplate": {"name": "vm-1", "size": "10Gi", "storageClassName": "local"}}]}}));
    assert_eq!(
        fallback(decide(&other_driver, &facts())),
        "pvc/vm-1 is of driver rancher.io/local-path and the source of rbd.csi.ceph.com: storage clones stay with one driver"
    );
    let block = transfer(json!({"spec": {"targets": [
        {"pvcTemplate": {"name": "vm-1", "size": "10Gi", "storageClassName": "rbd", "volumeMode": "Block"}}]}}));
    assert_eq!(
        fallback(decide(&block, &facts())),
        "pvc/vm-1 is Block and the source Filesystem: a clone keeps the volume mode"
    );
    let small = transfer(json!({"spec": {"targets": [
        {"pvcTemplate": {"name": "vm-1", "size": "1Gi", "storageClassName": "rbd"}}]}}));
    assert_eq!(
        fallback(decide(&small, &facts())),
        "pvc/vm-1 (1073741824 bytes) is smaller than the source (10737418240 bytes)"
    );
    let mut fixed = facts();
    fixed.classes[0].expands = false;
    let large = transfer(json!({"spec": {"targets": [
        {"pvcTemplate": {"name": "vm-1", "size": "20Gi", "storageClassName": "rbd"}}]}}));
    assert_eq!(
        fallback(decide(&large, &fixed)),
        "pvc/vm-1 is larger than the source and storage class rbd does not allow volume expansion"
    );
    assert_eq!(
        decide(&large, &facts()),
        Decision::Snapshot {
            class: "z-rbd-default".into()
        }
    );
    let existing = transfer(json!({"spec": {"targets": [{"pvc": {"name": "vm-9"}}]}}));
    assert_eq!(
        fallback(decide(&existing, &facts())),
        "target pvc/vm-9 is not a pvcTemplate: only a new claim can be a clone"
    );
}

#[test]
fn a_strategy_the_transfer_insists_on_fails_it_when_impossible() {
    let mut f = facts();
    f.snapshot_classes.clear();
    let insist = transfer(json!({"spec": {"cloneStrategy": "snapshot"}}));
    assert_eq!(
        decide(&insist, &f),
        Decision::Refused(
            "cloneStrategy snapshot cannot be used: no VolumeSnapshotClass of driver rbd.csi.ceph.com; use cloneStrategy auto or copy".into()
        )
    );
    let copy = transfer(json!({"spec": {"cloneStrategy": "copy"}}));
    assert_eq!(decide(&copy, &facts()), Decision::Copy { fallback: None });
}

#[test]
fn csi_clone_comes_from_the_spec_or_the_class_profile_and_stays_in_the_class() {
    let insist = transfer(json!({"spec": {"cloneStrategy": "csi-clone"}}));
    assert_eq!(decide(&insist, &facts()), Decision::CsiClone);
    let mut profiled = facts();
    profiled.classes[0].profile_strategy = Some(CloneStrategy::CsiClone);
    assert_eq!(decide(&transfer(json!({})), &profiled), Decision::CsiClone);
    // Same driver, another class: a snapshot can, a CSI clone cannot.
    profiled.classes.push(class("rbd-fast", "rbd.csi.ceph.com"));
    profiled.classes[2].profile_strategy = Some(CloneStrategy::CsiClone);
    let other_class = transfer(json!({"spec": {"targets": [
        {"pvcTemplate": {"name": "vm-1", "size": "10Gi", "storageClassName": "rbd-fast"}}]}}));
    assert_eq!(
        fallback(decide(&other_class, &profiled)),
        "pvc/vm-1 is of storage class rbd-fast and the source of rbd: a CSI clone stays in one class"
    );
    // A profile saying copy.
    profiled.classes[2].profile_strategy = Some(CloneStrategy::Copy);
    assert_eq!(
        decide(&other_class, &profiled),
        Decision::Copy { fallback: None }
    );
}

#[test]
fn a_url_source_is_a_copy_without_a_reason() {
    let url = transfer(json!({"spec": {"source": {"pvc": null, "url": "s3://images/a.raw"}}}));
    assert_eq!(decide(&url, &facts()), Decision::Copy { fallback: None });
}

fn ids() -> Ids {
    Ids {
        namespace: "vms".into(),
        name: "golden-to-vms".into(),
        uid: "u-1".into(),
    }
}

#[test]
fn a_snapshot_clone_steps_from_snapshot_to_bound_claims() {
    let t = transfer(json!({}));
    let d = Decision::Snapshot {
        class: "z-rbd-default".into(),
    };
    let Step::Snapshot(snapshot) = plan::next(&t, &ids(), &d, &Observed::default()) else {
        panic!("no snapshot first");
    };
    assert_eq!(
        snapshot.metadata.name.as_deref(),
        Some("golden-to-vms-clone")
    );
    assert_eq!(
        snapshot.data["spec"],
        json!({"volumeSnapshotClassName": "z-rbd-default", "source": {"persistentVolumeClaimName": "golden"}})
    );
    assert_eq!(
        snapshot.metadata.owner_references.as_ref().unwrap()[0].uid,
        "u-1"
    );
    let mut seen = Observed {
        snapshot: Some(SnapshotState::Pending(Some("driver busy".into()))),
        ..Observed::default()
    };
    assert_eq!(
        plan::next(&t, &ids(), &d, &seen),
        Step::Wait {
            reason: plan::SNAPSHOT_PENDING,
            message: "VolumeSnapshot golden-to-vms-clone is not ready: driver busy".into()
        }
    );
    seen.snapshot = Some(SnapshotState::Ready(Some(Quantity("12Gi".into()))));
    let Step::Claims(claims) = plan::next(&t, &ids(), &d, &seen) else {
        panic!("no claims");
    };
    let vm1 = serde_json::to_value(&claims[0]).unwrap();
    assert_eq!(
        vm1["spec"],
        json!({
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "rbd",
            "volumeMode": "Filesystem",
            "resources": {"requests": {"storage": "12Gi"}},
            "dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "golden-to-vms-clone"},
        })
    );
    assert_eq!(vm1["metadata"]["labels"]["ferry.dev/owner-uid"], "u-1");
    // Created: provisioning, then waiting for a consumer, then done.
    for c in &claims {
        seen.targets
            .insert(c.metadata.name.clone().unwrap(), c.clone());
    }
    assert!(matches!(
        plan::next(&t, &ids(), &d, &seen),
        Step::Wait {
            reason: plan::PROVISIONING,
            ..
        }
    ));
    seen.wait_for_consumer = vec!["rbd".into()];
    assert_eq!(
        plan::next(&t, &ids(), &d, &seen),
        Step::Wait {
            reason: plan::WAITING_FOR_FIRST_CONSUMER,
            message: "pvc/vm-1, pvc/vm-2 will be restored from VolumeSnapshot golden-to-vms-clone when a pod uses it (WaitForFirstConsumer)".into()
        }
    );
    for c in seen.targets.values_mut() {
        c.status = Some(serde_json::from_value(json!({"phase": "Bound"})).unwrap());
    }
    assert_eq!(
        plan::next(&t, &ids(), &d, &seen),
        Step::Done("2 claims restored from VolumeSnapshot golden-to-vms-clone".into())
    );
    // A claim of a target's name made by someone else.
    let mut foreign = seen.clone();
    let vm1 = foreign.targets.get_mut("vm-1").unwrap();
    vm1.metadata.labels = None;
    assert!(matches!(
        plan::next(&t, &ids(), &d, &foreign),
        Step::Conflict(m) if m.starts_with("pvc/vm-1 already exists")
    ));
}

#[test]
fn a_csi_clone_names_the_source_claim_as_data_source() {
    let t = transfer(json!({}));
    let Step::Claims(claims) = plan::next(&t, &ids(), &Decision::CsiClone, &Observed::default())
    else {
        panic!("no claims");
    };
    let vm2 = serde_json::to_value(&claims[1]).unwrap();
    assert_eq!(
        vm2["spec"]["dataSource"],
        json!({"kind": "PersistentVolumeClaim", "name": "golden"})
    );
    assert_eq!(vm2["spec"]["resources"]["requests"]["storage"], "10Gi");
}

/// A source claim not bound yet in a class that binds at its first consumer (a
/// GoldenImage's restored claim in a WaitForFirstConsumer class) is copied: a snapshot or
/// CSI clone of it would never start; a strategy insisted on fails saying why.
#[test]
fn an_unbound_source_that_binds_when_used_is_copied() {
    let mut f = facts();
    f.source.as_mut().unwrap().unbound_until_used = true;
    let t = transfer(json!({}));
    match decide(&t, &f) {
        Decision::Copy {
            fallback: Some(why),
        } => assert!(why.contains("binds at the first consumer"), "{why}"),
        other => panic!("{other:?}"),
    }
}

/// A clone for another namespace (the child, labelled `ferry.dev/clone-of`) into a class
/// that binds at the first consumer is copied, saying why (its temporary claims have no
/// consumer), or fails at once when a storage clone is insisted on; in one namespace the
/// storage clone waits for the target's consumer as before.
#[test]
fn a_clone_for_another_namespace_into_a_class_bound_at_first_use_is_copied() {
    let mut f = facts();
    f.classes[0].binds_when_used = true;
    let child = json!({"metadata": {"labels": {"ferry.dev/clone-of": "p-1"}}});
    let why = fallback(decide(&transfer(child.clone()), &f));
    assert_eq!(
        why,
        "pvc/vm-1's storage class rbd binds at its first consumer (WaitForFirstConsumer): a storage clone for another namespace is made in temporary claims that no pod uses, so it would never be provisioned; a copy's mover is their consumer"
    );
    for strategy in ["snapshot", "csi-clone"] {
        let mut insist = child.clone();
        insist["spec"] = json!({"cloneStrategy": strategy});
        match decide(&transfer(insist), &f) {
            Decision::Refused(m) => assert!(
                m.starts_with(&format!("cloneStrategy {strategy} cannot be used: pvc/vm-1's storage class rbd binds at its first consumer")),
                "{m}"
            ),
            other => panic!("{strategy}: {other:?}"),
        }
    }
    assert_eq!(
        decide(&transfer(json!({})), &f),
        Decision::Snapshot {
            class: "z-rbd-default".into()
        },
        "in its own namespace"
    );
}
