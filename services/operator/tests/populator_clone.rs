//! The populator cloning an image that is in a claim, against a mocked API server: the
//! strategy decided from the classes and recorded on the user's claim, a VolumeSnapshot
//! of the source, the prime claim restored from it, the snapshot deleted once the prime
//! is Bound, the volume handed over; a CSI clone of a GoldenImage's current claim; a
//! fallback to a copy saying why; a strategy the classes cannot do refused.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use ferry_operator::populator::reconcile;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::controller::Action;
use serde_json::{json, Value};
use support::populator::Harness;
use support::{Reply, Seen};

const NS: &str = "vms";
const UID: &str = "u-1";
const PRIME: &str = "ferry-prime-u-1";
const SNAPSHOT: &str = "ferry-clone-u-1";
const VIS: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/volumeimagesources/golden";
const SC: &str = "/apis/storage.k8s.io/v1/storageclasses/rbd";
const PVCS: &str = "/api/v1/namespaces/vms/persistentvolumeclaims";
const CLASSES: &str = "/apis/storage.k8s.io/v1/storageclasses";
const PROFILES: &str = "/apis/ferry.dev/v1alpha1/storageclassprofiles";
const SNAPSHOT_CLASSES: &str = "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses";
const SNAPSHOTS: &str = "/apis/snapshot.storage.k8s.io/v1/namespaces/vms/volumesnapshots";
const GOLDEN: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/goldenimages/fedora";
const PV: &str = "/api/v1/persistentvolumes/pv-7";

/// The user's claim `disk`: 20Gi of class `rbd`, Filesystem, from VolumeImageSource
/// `golden`; with these annotations.
fn claim(annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "disk", "namespace": NS, "uid": UID, "resourceVersion": "40",
                     "annotations": annotations},
        "spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "rbd",
            "volumeMode": "Filesystem", "resources": {"requests": {"storage": "20Gi"}},
            "dataSourceRef": {"apiGroup": "ferry.dev", "kind": "VolumeImageSource", "name": "golden"},
        },
        "status": {"phase": "Pending"},
    })
}

fn source(image: Value) -> Value {
    json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "VolumeImageSource",
        "metadata": {"name": "golden", "namespace": NS, "uid": "vis-1"},
        "spec": {"source": image},
    })
}

fn pvc(v: &Value) -> Arc<PersistentVolumeClaim> {
    Arc::new(serde_json::from_value(v.clone()).unwrap())
}

fn list(kind: &str, items: Value) -> Reply {
    Reply::Ok(json!({"apiVersion": "v1", "kind": format!("{kind}List"),
                     "metadata": {"resourceVersion": "1"}, "items": items}))
}

/// What a decision reads: the classes, the profiles, the snapshot classes, and the source
/// claim `name` (10Gi of `rbd`, Filesystem).
async fn facts_read(h: &mut Harness, snapshot_class: bool, name: &str) {
    classes_read(h, snapshot_class).await;
    h.server
        .expect(
            "GET",
            &format!("{PVCS}/{name}"),
            Reply::Ok(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "namespace": NS},
                "spec": {"storageClassName": "rbd", "volumeMode": "Filesystem",
                         "resources": {"requests": {"storage": "10Gi"}}},
                "status": {"phase": "Bound", "capacity": {"storage": "10Gi"}}})),
        )
        .await;
}

/// The classes (`rbd` of the Ceph driver, expandable, and `other` of another driver), the
/// profiles, the snapshot classes (one of the Ceph driver when `snapshot_class`).
async fn classes_read(h: &mut Harness, snapshot_class: bool) {
    let class = |name: &str, driver: &str| {
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
               "metadata": {"name": name}, "provisioner": driver,
               "allowVolumeExpansion": true, "volumeBindingMode": "Immediate"})
    };
    h.server
        .expect(
            "GET",
            CLASSES,
            list(
                "StorageClass",
                json!([
                    class("rbd", "rbd.csi.ceph.com"),
                    class("other", "ebs.csi.aws.com")
                ]),
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
}

async fn finish(
    task: tokio::task::JoinHandle<Result<Action, ferry_operator::populator::Error>>,
) -> Action {
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the reconcile did not finish")
        .unwrap()
        .unwrap()
}

/// Checks an event published on the user's claim; returns its note.
fn on_claim(event: &Seen, type_: &str, reason: &str) -> String {
    assert_eq!(event.body["reason"], reason, "{}", event.body);
    assert_eq!(event.body["type"], type_, "{}", event.body);
    assert_eq!(event.body["regarding"]["name"], "disk");
    event.body["note"].as_str().unwrap().to_string()
}

/// The decision's patch of the user's claim; returns the annotations it sets.
async fn expect_recorded(h: &mut Harness, claim_after: Value) -> Value {
    let seen = h
        .server
        .expect("PATCH", &format!("{PVCS}/disk"), Reply::Ok(claim_after))
        .await;
    assert_eq!(seen.content_type, "application/merge-patch+json");
    seen.body["metadata"]["annotations"].clone()
}

fn recorded_snapshot() -> Value {
    json!({"ferry.dev/clone-strategy": "snapshot", "ferry.dev/clone-source": "base",
           "ferry.dev/clone-snapshot-class": "rbd-snap", "ferry.dev/clone-decided-for": UID})
}

/// The source claim `name` asked for before anything is made from it.
async fn source_read(h: &mut Harness, name: &str) {
    h.server
        .expect(
            "GET",
            &format!("{PVCS}/{name}"),
            Reply::Ok(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "namespace": NS},
                "status": {"phase": "Bound"}})),
        )
        .await;
}

#[tokio::test]
async fn a_claim_of_an_image_in_a_claim_is_restored_from_a_snapshot_of_it() {
    let mut h = Harness::new();
    let image = source(json!({"pvc": {"name": "base"}}));

    // 1. Decided and recorded on the claim.
    let task = tokio::spawn(reconcile(pvc(&claim(json!({}))), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image.clone())).await;
    facts_read(&mut h, true, "base").await;
    let annotations = expect_recorded(&mut h, claim(recorded_snapshot())).await;
    assert_eq!(
        annotations,
        json!({"ferry.dev/clone-strategy": "snapshot", "ferry.dev/clone-source": "base",
               "ferry.dev/clone-fallback-reason": null,
               "ferry.dev/clone-source-snapshot": null,
               "ferry.dev/clone-snapshot-class": "rbd-snap",
               "ferry.dev/clone-decided-for": UID})
    );
    let note = on_claim(&h.server.expect_event(NS).await, "Normal", "CloneStrategy");
    assert_eq!(note, "cloning pvc/base by the storage (snapshot)");
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    // 2. The snapshot of the source, in the recorded class of its driver (no class read
    // again).
    let decided = claim(recorded_snapshot());
    let task = tokio::spawn(reconcile(pvc(&decided), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image.clone())).await;
    h.server
        .expect("GET", &format!("{SNAPSHOTS}/{SNAPSHOT}"), Reply::NotFound)
        .await;
    source_read(&mut h, "base").await;
    let created = h.server.expect("POST", SNAPSHOTS, Reply::Echo).await.body;
    assert_eq!(
        created["spec"],
        json!({"source": {"persistentVolumeClaimName": "base"},
               "volumeSnapshotClassName": "rbd-snap"})
    );
    assert_eq!(created["metadata"]["ownerReferences"][0]["uid"], UID);
    assert_eq!(
        created["metadata"]["labels"]["ferry.dev/populated-claim"],
        UID
    );
    on_claim(
        &h.server.expect_event(NS).await,
        "Normal",
        "SnapshotCreated",
    );
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    h.server.done().await;

    // 3. Not ready, with the snapshot controller's error: said, looked at again.
    let task = tokio::spawn(reconcile(pvc(&decided), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image.clone())).await;
    let pending = json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": {"name": SNAPSHOT, "namespace": NS},
        "status": {"readyToUse": false, "error": {"message": "driver busy"}}});
    h.server
        .expect(
            "GET",
            &format!("{SNAPSHOTS}/{SNAPSHOT}"),
            Reply::Ok(pending),
        )
        .await;
    let note = on_claim(
        &h.server.expect_event(NS).await,
        "Warning",
        "SnapshotPending",
    );
    assert_eq!(
        note,
        format!("VolumeSnapshot {SNAPSHOT} is not ready: driver busy")
    );
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    h.server.done().await;

    // 4. Ready: the prime claim restored from it, the user's size (no overhead), larger
    // than the snapshot.
    let task = tokio::spawn(reconcile(pvc(&decided), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image.clone())).await;
    let ready = json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": {"name": SNAPSHOT, "namespace": NS},
        "status": {"readyToUse": true, "restoreSize": "10Gi"}});
    h.server
        .expect("GET", &format!("{SNAPSHOTS}/{SNAPSHOT}"), Reply::Ok(ready))
        .await;
    h.server
        .expect(
            "GET",
            SC,
            Reply::Ok(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": "rbd"}, "provisioner": "rbd.csi.ceph.com",
                "volumeBindingMode": "Immediate"}),
            ),
        )
        .await;
    let prime = h.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(prime["metadata"]["name"], PRIME);
    assert_eq!(
        prime["spec"],
        json!({"accessModes": ["ReadWriteOnce"], "storageClassName": "rbd",
               "volumeMode": "Filesystem", "resources": {"requests": {"storage": "20Gi"}},
               "dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
                              "name": SNAPSHOT}})
    );
    let note = on_claim(&h.server.expect_event(NS).await, "Normal", "PrimeCreated");
    assert_eq!(
        note,
        format!("created prime claim pvc/{PRIME}, restored from VolumeSnapshot {SNAPSHOT}")
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    // 5. The prime is Bound: the snapshot goes, the volume is handed over.
    let mut bound = prime.clone();
    bound["metadata"]["uid"] = json!("prime-uid");
    bound["spec"]["volumeName"] = json!("pv-7");
    bound["status"] = json!({"phase": "Bound"});
    h.claim_seen(&bound);
    let task = tokio::spawn(reconcile(pvc(&decided), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image.clone())).await;
    h.server
        .expect(
            "DELETE",
            &format!("{SNAPSHOTS}/{SNAPSHOT}"),
            Reply::Ok(json!({})),
        )
        .await;
    let pv = json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-7"},
        "spec": {"claimRef": {"namespace": NS, "name": PRIME, "uid": "prime-uid"}}});
    h.server.expect("GET", PV, Reply::Ok(pv.clone())).await;
    let patch = h.server.expect("PATCH", PV, Reply::Ok(pv)).await.body;
    assert_eq!(patch["spec"]["claimRef"]["uid"], UID);
    assert_eq!(patch["spec"]["claimRef"]["name"], "disk");
    on_claim(&h.server.expect_event(NS).await, "Normal", "Rebinding");
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    // 6. Another claim decided alike whose source is gone before its snapshot was made:
    // undone, decided again.
    let mut other = claim(recorded_snapshot());
    other["metadata"]["uid"] = json!("u-4");
    other["metadata"]["annotations"]["ferry.dev/clone-decided-for"] = json!("u-4");
    let task = tokio::spawn(reconcile(pvc(&other), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image)).await;
    h.server
        .expect(
            "GET",
            &format!("{SNAPSHOTS}/ferry-clone-u-4"),
            Reply::NotFound,
        )
        .await;
    h.server
        .expect("GET", &format!("{PVCS}/base"), Reply::NotFound)
        .await;
    let annotations = expect_recorded(&mut h, claim(json!({}))).await;
    assert_eq!(annotations["ferry.dev/clone-strategy"], Value::Null);
    assert_eq!(annotations["ferry.dev/clone-decided-for"], Value::Null);
    let note = on_claim(&h.server.expect_event(NS).await, "Warning", "SourceGone");
    assert_eq!(
        note,
        "pvc/base, the clone's source, is gone: deciding again"
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

#[tokio::test]
async fn a_goldenimages_current_claim_is_cloned_by_the_csi_driver_when_asked() {
    let mut h = Harness::new();
    let image = source(json!({"goldenImage": {"name": "fedora"}}));
    let mut image = image;
    image["spec"]["cloneStrategy"] = json!("csi-clone");

    let task = tokio::spawn(reconcile(pvc(&claim(json!({}))), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image.clone())).await;
    h.server
        .expect(
            "GET",
            GOLDEN,
            Reply::Ok(
                json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "GoldenImage",
                "metadata": {"name": "fedora", "namespace": NS},
                "spec": {"source": {"url": "https://h/f.qcow2"},
                         "trigger": {"schedule": "@daily"},
                         "claim": {"size": "10Gi", "storageClassName": "rbd"}},
                "status": {"currentClaim": "fedora-1a2b"}}),
            ),
        )
        .await;
    facts_read(&mut h, false, "fedora-1a2b").await;
    let recorded = json!({"ferry.dev/clone-strategy": "csi-clone",
                          "ferry.dev/clone-source": "fedora-1a2b",
                          "ferry.dev/clone-decided-for": UID});
    let annotations = expect_recorded(&mut h, claim(recorded.clone())).await;
    assert_eq!(annotations["ferry.dev/clone-strategy"], "csi-clone");
    assert_eq!(annotations["ferry.dev/clone-source"], "fedora-1a2b");
    on_claim(&h.server.expect_event(NS).await, "Normal", "CloneStrategy");
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    // The prime claim is a clone of the recorded claim (asked for first): the GoldenImage
    // is not read again.
    let task = tokio::spawn(reconcile(pvc(&claim(recorded.clone())), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image.clone())).await;
    h.server
        .expect(
            "GET",
            SC,
            Reply::Ok(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": "rbd"}, "provisioner": "rbd.csi.ceph.com",
                "volumeBindingMode": "Immediate"}),
            ),
        )
        .await;
    source_read(&mut h, "fedora-1a2b").await;
    let prime = h.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(
        prime["spec"]["dataSource"],
        json!({"kind": "PersistentVolumeClaim", "name": "fedora-1a2b"})
    );
    let note = on_claim(&h.server.expect_event(NS).await, "Normal", "PrimeCreated");
    assert_eq!(
        note,
        format!("created prime claim pvc/{PRIME}, a CSI clone of pvc/fedora-1a2b")
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    // Another claim decided alike whose recorded claim the GoldenImage pruned before its
    // prime claim was made (it waited for a first consumer): undone, decided again.
    let mut other = claim(recorded.clone());
    other["metadata"]["uid"] = json!("u-2");
    other["metadata"]["annotations"]["ferry.dev/clone-decided-for"] = json!("u-2");
    let task = tokio::spawn(reconcile(pvc(&other), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image.clone())).await;
    h.server
        .expect(
            "GET",
            SC,
            Reply::Ok(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": "rbd"}, "provisioner": "rbd.csi.ceph.com",
                "volumeBindingMode": "Immediate"}),
            ),
        )
        .await;
    h.server
        .expect("GET", &format!("{PVCS}/fedora-1a2b"), Reply::NotFound)
        .await;
    let annotations = expect_recorded(&mut h, claim(json!({}))).await;
    assert!(
        annotations
            .as_object()
            .unwrap()
            .values()
            .all(Value::is_null),
        "{annotations}"
    );
    assert_eq!(annotations.as_object().unwrap().len(), 6, "{annotations}");
    let note = on_claim(&h.server.expect_event(NS).await, "Warning", "SourceGone");
    assert_eq!(
        note,
        "pvc/fedora-1a2b, the clone's source, is gone: deciding again"
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    // A claim whose manifest was copied from the first one (its annotations with it) is
    // decided afresh, never filled from the first claim's record.
    let mut copied = claim(recorded);
    copied["metadata"]["uid"] = json!("u-3");
    let task = tokio::spawn(reconcile(pvc(&copied), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image)).await;
    h.server
        .expect(
            "GET",
            GOLDEN,
            Reply::Ok(
                json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "GoldenImage",
                "metadata": {"name": "fedora", "namespace": NS},
                "spec": {"source": {"url": "https://h/f.qcow2"},
                         "trigger": {"schedule": "@daily"},
                         "claim": {"size": "10Gi", "storageClassName": "rbd"}},
                "status": {"currentClaim": "fedora-3c4d"}}),
            ),
        )
        .await;
    facts_read(&mut h, false, "fedora-3c4d").await;
    let annotations = expect_recorded(&mut h, claim(json!({}))).await;
    assert_eq!(annotations["ferry.dev/clone-source"], "fedora-3c4d");
    assert_eq!(annotations["ferry.dev/clone-decided-for"], "u-3");
    on_claim(&h.server.expect_event(NS).await, "Normal", "CloneStrategy");
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

#[tokio::test]
async fn without_a_snapshot_class_the_image_is_copied_and_the_claim_says_why() {
    let mut h = Harness::new();
    let image = source(json!({"pvc": {"name": "base"}}));
    let task = tokio::spawn(reconcile(pvc(&claim(json!({}))), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image.clone())).await;
    facts_read(&mut h, false, "base").await;
    let why = "no VolumeSnapshotClass of driver rbd.csi.ceph.com";
    let recorded = json!({"ferry.dev/clone-strategy": "copy", "ferry.dev/clone-source": "base",
                          "ferry.dev/clone-fallback-reason": why,
                          "ferry.dev/clone-decided-for": UID});
    let annotations = expect_recorded(&mut h, claim(recorded.clone())).await;
    let mut written = recorded.clone();
    written["ferry.dev/clone-source-snapshot"] = Value::Null;
    written["ferry.dev/clone-snapshot-class"] = Value::Null;
    assert_eq!(annotations, written);
    let note = on_claim(&h.server.expect_event(NS).await, "Normal", "CloneFallback");
    assert_eq!(note, format!("copying: no storage clone ({why})"));
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    // Recorded a copy: the prime claim (5.5% larger, a Filesystem volume) and a Transfer
    // from the claim, as for any image; no class is read again.
    let task = tokio::spawn(reconcile(pvc(&claim(recorded)), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image)).await;
    h.server
        .expect(
            "GET",
            SC,
            Reply::Ok(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": "rbd"}, "provisioner": "rbd.csi.ceph.com",
                "volumeBindingMode": "Immediate"}),
            ),
        )
        .await;
    let prime = h.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert!(prime["spec"].get("dataSource").is_none(), "{prime}");
    assert_eq!(prime["spec"]["resources"]["requests"]["storage"], "21672Mi");
    on_claim(&h.server.expect_event(NS).await, "Normal", "PrimeCreated");
    let transfer = h
        .server
        .expect(
            "POST",
            "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers",
            Reply::Echo,
        )
        .await
        .body;
    assert_eq!(transfer["spec"]["source"], json!({"pvc": {"name": "base"}}));
    assert_eq!(
        transfer["spec"]["targets"],
        json!([{"pvc": {"name": PRIME}}])
    );
    on_claim(
        &h.server.expect_event(NS).await,
        "Normal",
        "TransferCreated",
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

#[tokio::test]
async fn a_strategy_the_classes_cannot_do_is_refused_without_recording() {
    let mut h = Harness::new();
    let mut image = source(json!({"pvc": {"name": "base"}}));
    image["spec"]["cloneStrategy"] = json!("csi-clone");
    let mut other_class = claim(json!({}));
    other_class["spec"]["storageClassName"] = json!("other");
    let task = tokio::spawn(reconcile(pvc(&other_class), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image)).await;
    facts_read(&mut h, true, "base").await;
    let note = on_claim(&h.server.expect_event(NS).await, "Warning", "InvalidSource");
    assert_eq!(
        note,
        "cloneStrategy csi-clone cannot be used: pvc/ferry-prime-u-1 is of driver ebs.csi.aws.com and the source of rbd.csi.ceph.com: storage clones stay with one driver; use cloneStrategy auto or copy"
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

/// A copied image's prime claim grows by its class's profile's file-system overhead
/// (10% here, not CDI's 5.5%).
#[tokio::test]
async fn a_copys_prime_claim_grows_by_the_classs_profile_overhead() {
    use ferry_operator::class_defaults::ClassDefaults;
    use ferry_operator::crd::StorageClassProfile;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;

    let mut profiles = Writer::<StorageClassProfile>::default();
    let profile: StorageClassProfile = serde_json::from_value(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "StorageClassProfile",
        "metadata": {"name": "rbd"}, "spec": {"filesystemOverhead": "0.1"},
    }))
    .unwrap();
    profiles.apply_watcher_event(&Event::Apply(profile));
    let defaults = ClassDefaults::from_stores(profiles.as_reader(), Writer::default().as_reader());
    let mut h = Harness::with_class_defaults(defaults);
    let image = source(json!({"url": "https://images.example.com/fedora.raw"}));
    let task = tokio::spawn(reconcile(pvc(&claim(json!({}))), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image)).await;
    h.server
        .expect(
            "GET",
            SC,
            Reply::Ok(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": "rbd"}, "provisioner": "rbd.csi.ceph.com",
                "volumeBindingMode": "Immediate"}),
            ),
        )
        .await;
    let prime = h.server.expect("POST", PVCS, Reply::Echo).await.body;
    // 20 GiB / 0.9 = 22,755.56 MiB, rounded up.
    assert_eq!(prime["spec"]["resources"]["requests"]["storage"], "22756Mi");
    on_claim(&h.server.expect_event(NS).await, "Normal", "PrimeCreated");
    h.server
        .expect(
            "POST",
            "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers",
            Reply::Echo,
        )
        .await;
    on_claim(
        &h.server.expect_event(NS).await,
        "Normal",
        "TransferCreated",
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

/// A GoldenImage whose imports are kept as VolumeSnapshots: its current snapshot restored
/// into the prime claim (no snapshot of ferry's own, nothing deleted); a snapshot pruned
/// before the prime claim was made undoes the decision.
#[tokio::test]
async fn a_snapshot_kept_goldenimage_is_restored_into_the_prime_claim() {
    let mut h = Harness::new();
    let image = source(json!({"goldenImage": {"name": "fedora"}}));
    let golden = json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "GoldenImage",
        "metadata": {"name": "fedora", "namespace": NS},
        "spec": {"source": {"url": "https://h/f.qcow2"}, "trigger": {"schedule": "@daily"},
                 "keepAs": "Snapshot",
                 "claim": {"size": "10Gi", "storageClassName": "rbd"}},
        "status": {"currentSnapshot": "fedora-1a2b"}});
    let ready = json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": {"name": "fedora-1a2b", "namespace": NS},
        "status": {"readyToUse": true, "restoreSize": "10Gi"}});
    let golden_snapshot = format!("{SNAPSHOTS}/fedora-1a2b");

    let task = tokio::spawn(reconcile(pvc(&claim(json!({}))), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image.clone())).await;
    h.server
        .expect("GET", GOLDEN, Reply::Ok(golden.clone()))
        .await;
    h.server
        .expect("GET", &golden_snapshot, Reply::Ok(ready.clone()))
        .await;
    classes_read(&mut h, true).await;
    let recorded = json!({"ferry.dev/clone-strategy": "snapshot",
                          "ferry.dev/clone-source-snapshot": "fedora-1a2b",
                          "ferry.dev/clone-decided-for": UID});
    let annotations = expect_recorded(&mut h, claim(recorded.clone())).await;
    assert_eq!(
        annotations,
        json!({"ferry.dev/clone-strategy": "snapshot", "ferry.dev/clone-source": null,
               "ferry.dev/clone-source-snapshot": "fedora-1a2b",
               "ferry.dev/clone-fallback-reason": null,
               "ferry.dev/clone-snapshot-class": null, "ferry.dev/clone-decided-for": UID})
    );
    let note = on_claim(&h.server.expect_event(NS).await, "Normal", "CloneStrategy");
    assert_eq!(
        note,
        "restoring the GoldenImage's VolumeSnapshot fedora-1a2b by the storage"
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    // Recorded: the prime claim restored from the GoldenImage's snapshot.
    let task = tokio::spawn(reconcile(pvc(&claim(recorded.clone())), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image.clone())).await;
    h.server
        .expect("GET", &golden_snapshot, Reply::Ok(ready))
        .await;
    h.server
        .expect(
            "GET",
            SC,
            Reply::Ok(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": "rbd"}, "provisioner": "rbd.csi.ceph.com",
                "volumeBindingMode": "Immediate"}),
            ),
        )
        .await;
    let prime = h.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(
        prime["spec"]["dataSource"],
        json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
               "name": "fedora-1a2b"})
    );
    assert_eq!(prime["spec"]["resources"]["requests"]["storage"], "20Gi");
    let note = on_claim(&h.server.expect_event(NS).await, "Normal", "PrimeCreated");
    assert_eq!(
        note,
        format!("created prime claim pvc/{PRIME}, restored from the GoldenImage's VolumeSnapshot fedora-1a2b")
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    // Bound: handed over; the GoldenImage's snapshot is not ferry's to delete.
    let mut bound = prime.clone();
    bound["metadata"]["uid"] = json!("prime-uid");
    bound["spec"]["volumeName"] = json!("pv-7");
    bound["status"] = json!({"phase": "Bound"});
    h.claim_seen(&bound);
    let task = tokio::spawn(reconcile(pvc(&claim(recorded.clone())), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image.clone())).await;
    let pv = json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-7"},
        "spec": {"claimRef": {"namespace": NS, "name": PRIME, "uid": "prime-uid"}}});
    h.server.expect("GET", PV, Reply::Ok(pv.clone())).await;
    h.server.expect("PATCH", PV, Reply::Ok(pv)).await;
    on_claim(&h.server.expect_event(NS).await, "Normal", "Rebinding");
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    // Another claim whose recorded snapshot was pruned before its prime claim: undone.
    let mut other = claim(recorded);
    other["metadata"]["uid"] = json!("u-2");
    other["metadata"]["annotations"]["ferry.dev/clone-decided-for"] = json!("u-2");
    let task = tokio::spawn(reconcile(pvc(&other), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image.clone())).await;
    h.server
        .expect("GET", &golden_snapshot, Reply::NotFound)
        .await;
    let annotations = expect_recorded(&mut h, claim(json!({}))).await;
    assert_eq!(
        annotations,
        json!({"ferry.dev/clone-strategy": null, "ferry.dev/clone-source": null,
               "ferry.dev/clone-source-snapshot": null,
               "ferry.dev/clone-fallback-reason": null,
               "ferry.dev/clone-snapshot-class": null, "ferry.dev/clone-decided-for": null})
    );
    let note = on_claim(&h.server.expect_event(NS).await, "Warning", "SourceGone");
    assert!(note.contains("fedora-1a2b is gone"), "{note}");
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    // Deciding while the GoldenImage's current snapshot is gone (deleted by hand): nothing
    // recorded (it would be undone at once), looked at again later.
    let mut undecided = claim(json!({}));
    undecided["metadata"]["uid"] = json!("u-3");
    let task = tokio::spawn(reconcile(pvc(&undecided), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(image)).await;
    h.server.expect("GET", GOLDEN, Reply::Ok(golden)).await;
    h.server
        .expect("GET", &golden_snapshot, Reply::NotFound)
        .await;
    let note = on_claim(&h.server.expect_event(NS).await, "Warning", "SourceGone");
    assert_eq!(
        note,
        "waiting for GoldenImage fedora: its current VolumeSnapshot fedora-1a2b is gone (deleted by hand?); its next poll imports it again"
    );
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(60)));
    h.server.done().await;
}
