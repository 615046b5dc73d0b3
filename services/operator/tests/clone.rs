//! A Transfer made by the storage, against a mocked API server: the strategy decided from
//! the classes (a VolumeSnapshotClass of the source's driver: a snapshot), the snapshot
//! of the source created, the target claim restored from it once ready, the snapshot
//! deleted once the claim is bound, Succeeded; and a fallback to a copy, saying why.

use crate::support;

use std::time::Duration;

use ferry_operator::clone::reconcile::reconcile_transfer;
use kube::runtime::controller::Action;
use serde_json::{json, Value};

use support::{settings, with_status, Harness, Reply};

const NS: &str = "vms";
const T_STATUS: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers/clone/status";
const PVCS: &str = "/api/v1/namespaces/vms/persistentvolumeclaims";
const CLASSES: &str = "/apis/storage.k8s.io/v1/storageclasses";
const PROFILES: &str = "/apis/ferry.dev/v1alpha1/storageclassprofiles";
const SNAPSHOT_CLASSES: &str = "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses";
const SNAPSHOTS: &str = "/apis/snapshot.storage.k8s.io/v1/namespaces/vms/volumesnapshots";

fn transfer_json(status: Option<Value>) -> Value {
    let mut t = json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {
            "name": "clone", "namespace": NS, "uid": "uid-9", "generation": 1,
            "resourceVersion": "7", "finalizers": ["ferry.dev/cancel"],
        },
        "spec": {
            "source": {"pvc": {"name": "golden"}},
            "targets": [{"pvcTemplate": {"name": "vm-1", "size": "10Gi", "storageClassName": "rbd"}}],
        },
    });
    if let Some(status) = status {
        t["status"] = status;
    }
    t
}

fn transfer(v: &Value) -> std::sync::Arc<ferry_operator::crd::Transfer> {
    std::sync::Arc::new(serde_json::from_value(v.clone()).unwrap())
}

fn list(kind: &str, items: Value) -> Reply {
    Reply::Ok(json!({"apiVersion": "v1", "kind": format!("{kind}List"),
                     "metadata": {"resourceVersion": "1"}, "items": items}))
}

/// The classes: `rbd` of the Ceph driver, with or without a snapshot class of it.
async fn classes_read(h: &mut Harness, snapshot_class: bool) {
    h.server
        .expect(
            "GET",
            CLASSES,
            list(
                "StorageClass",
                json!([{"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": "rbd"}, "provisioner": "rbd.csi.ceph.com",
                "allowVolumeExpansion": true, "volumeBindingMode": "Immediate"}]),
            ),
        )
        .await;
    h.server
        .expect("GET", PROFILES, list("StorageClassProfile", json!([])))
        .await;
    let snapshot_classes = if snapshot_class {
        json!([{"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
                "metadata": {"name": "rbd-snap"}, "driver": "rbd.csi.ceph.com",
                "deletionPolicy": "Delete"}])
    } else {
        json!([])
    };
    h.server
        .expect(
            "GET",
            SNAPSHOT_CLASSES,
            list("VolumeSnapshotClass", snapshot_classes),
        )
        .await;
    h.server
        .expect(
            "GET",
            &format!("{PVCS}/golden"),
            Reply::Ok(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "golden", "namespace": NS},
                "spec": {"storageClassName": "rbd", "volumeMode": "Filesystem",
                         "resources": {"requests": {"storage": "10Gi"}}},
                "status": {"phase": "Bound", "capacity": {"storage": "10Gi"}}})),
        )
        .await;
}

async fn finish(
    task: tokio::task::JoinHandle<Result<Action, ferry_operator::controller::Error>>,
) -> Action {
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the reconcile did not finish")
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn a_clone_by_snapshot_restores_every_target_and_removes_the_snapshot() {
    let mut h = Harness::new(settings());
    let object = transfer_json(None);

    // 1. The strategy: a snapshot, of the class of the source's driver. Then the snapshot.
    let task = tokio::spawn(reconcile_transfer(transfer(&object), h.ctx.clone()));
    classes_read(&mut h, true).await;
    h.server
        .expect("GET", &format!("{SNAPSHOTS}/clone-clone"), Reply::NotFound)
        .await;
    h.server
        .expect("GET", &format!("{PVCS}/vm-1"), Reply::NotFound)
        .await;
    let created = h.server.expect("POST", SNAPSHOTS, Reply::Echo).await;
    assert_eq!(
        created.body["spec"],
        json!({"volumeSnapshotClassName": "rbd-snap", "source": {"persistentVolumeClaimName": "golden"}})
    );
    assert_eq!(
        created.body["metadata"]["ownerReferences"][0]["uid"],
        "uid-9"
    );
    h.server.expect_event(NS).await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(status["phase"], "Running");
    assert_eq!(status["cloneStrategy"], "snapshot");
    assert_eq!(status["cloneSnapshot"], "clone-clone");
    assert!(status.get("cloneFallbackReason").is_none(), "{status}");
    assert_eq!(status["targets"][0]["name"], "pvc/vm-1");
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    h.server.done().await;

    // 2. The snapshot is ready: the claim restored from it, at its restore size. A
    // decided clone reads no classes again.
    let object = with_status(&object, &json!({ "status": status }));
    let task = tokio::spawn(reconcile_transfer(transfer(&object), h.ctx.clone()));
    h.server
        .expect(
            "GET",
            &format!("{SNAPSHOTS}/clone-clone"),
            Reply::Ok(
                json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                "metadata": {"name": "clone-clone", "namespace": NS},
                "status": {"readyToUse": true, "restoreSize": "11Gi"}}),
            ),
        )
        .await;
    h.server
        .expect("GET", &format!("{PVCS}/vm-1"), Reply::NotFound)
        .await;
    let claim = h.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(
        claim["spec"]["dataSource"],
        json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "clone-clone"})
    );
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "11Gi");
    assert_eq!(claim["metadata"]["labels"]["ferry.dev/owner-uid"], "uid-9");
    h.server.expect_event(NS).await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    h.server.done().await;

    // 3. The claim is bound: the snapshot deleted, Succeeded.
    let object = with_status(&object, &json!({ "status": status }));
    let task = tokio::spawn(reconcile_transfer(transfer(&object), h.ctx.clone()));
    h.server
        .expect(
            "GET",
            &format!("{SNAPSHOTS}/clone-clone"),
            Reply::Ok(
                json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                "metadata": {"name": "clone-clone", "namespace": NS},
                "status": {"readyToUse": true, "restoreSize": "11Gi"}}),
            ),
        )
        .await;
    let mut bound = claim.clone();
    bound["status"] = json!({"phase": "Bound"});
    h.server
        .expect("GET", &format!("{PVCS}/vm-1"), Reply::Ok(bound))
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{SNAPSHOTS}/clone-clone"),
            Reply::Deleted,
        )
        .await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let done = &seen.body["status"];
    assert_eq!(done["phase"], "Succeeded");
    assert_eq!(done["targets"][0]["phase"], "Succeeded");
    assert_eq!(
        done["message"],
        "1 claims restored from VolumeSnapshot clone-clone"
    );
    h.server.expect_event(NS).await;
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

#[tokio::test]
async fn without_a_snapshot_class_it_copies_and_says_why() {
    let mut h = Harness::new(settings());
    let object = transfer_json(None);
    let task = tokio::spawn(reconcile_transfer(transfer(&object), h.ctx.clone()));
    classes_read(&mut h, false).await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = &seen.body["status"];
    assert_eq!(status["cloneStrategy"], "copy");
    assert_eq!(
        status["cloneFallbackReason"],
        "no VolumeSnapshotClass of driver rbd.csi.ceph.com"
    );
    let event = h.server.expect_event(NS).await.body;
    assert_eq!(
        event["note"],
        "copying: no storage clone (no VolumeSnapshotClass of driver rbd.csi.ceph.com)"
    );
    assert_eq!(finish(task).await, Action::requeue(Duration::ZERO));
    h.server.done().await;
}

#[tokio::test]
async fn a_snapshot_the_transfer_insists_on_fails_it_when_impossible() {
    let mut h = Harness::new(settings());
    let mut object = transfer_json(None);
    object["spec"]["cloneStrategy"] = json!("snapshot");
    let task = tokio::spawn(reconcile_transfer(transfer(&object), h.ctx.clone()));
    classes_read(&mut h, false).await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = &seen.body["status"];
    assert_eq!(status["phase"], "Failed");
    assert_eq!(
        status["message"],
        "cloneStrategy snapshot cannot be used: no VolumeSnapshotClass of driver rbd.csi.ceph.com; use cloneStrategy auto or copy"
    );
    h.server.expect_event(NS).await;
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}
