//! Volume populator scenarios against a mocked API server: each step calls the
//! populator's reconcile directly, with its stores filled as the watches would fill them,
//! and checks every request it makes (method, path, the important body fields), in
//! order, and that no other request follows.

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
const VIS: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/volumeimagesources/fedora";
const SC: &str = "/apis/storage.k8s.io/v1/storageclasses/fast";
const PVCS: &str = "/api/v1/namespaces/vms/persistentvolumeclaims";
const TRANSFERS: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers";
const PV: &str = "/api/v1/persistentvolumes/pv-7";

/// The user's claim `disk`, 20Gi of class `fast`, Block, populated from `fedora`.
fn claim() -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "disk", "namespace": NS, "uid": UID, "resourceVersion": "40"},
        "spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "fast", "volumeMode": "Block",
            "resources": {"requests": {"storage": "20Gi"}},
            "dataSourceRef": {"apiGroup": "ferry.dev", "kind": "VolumeImageSource", "name": "fedora"},
        },
        "status": {"phase": "Pending"},
    })
}

fn source() -> Value {
    json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "VolumeImageSource",
        "metadata": {"name": "fedora", "namespace": NS, "uid": "vis-1"},
        "spec": {
            "source": {"url": "s3://images/fedora.raw", "s3": {"region": "eu-west-1"}},
            "options": {"workers": 4},
            "expectedDigest": format!("sha256:{}", "ab".repeat(32)),
        },
    })
}

fn storage_class(mode: &str) -> Value {
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
           "metadata": {"name": "fast"}, "provisioner": "csi.example.com",
           "volumeBindingMode": mode})
}

fn owner() -> Value {
    json!([{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "disk", "uid": UID,
            "controller": true}])
}

fn labels() -> Value {
    json!({"app.kubernetes.io/component": "populator",
           "app.kubernetes.io/managed-by": "ferry-operator",
           "ferry.dev/populated-claim": UID,
           "velero.io/exclude-from-backup": "true"})
}

/// The prime claim as the API server has it, Bound to pv-7 when `bound`.
fn prime_claim(bound: bool) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": PRIME, "namespace": NS, "uid": "prime-uid",
                     "labels": labels(), "ownerReferences": owner()},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                 "volumeMode": "Block", "resources": {"requests": {"storage": "20Gi"}}},
        "status": {"phase": "Pending"},
    });
    if bound {
        p["spec"]["volumeName"] = json!("pv-7");
        p["status"]["phase"] = json!("Bound");
    }
    p
}

/// The populator's Transfer as the API server has it, with this status.
fn transfer(status: Value) -> Value {
    json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "disk", "namespace": NS, "uid": "t-1",
                     "labels": labels(), "ownerReferences": owner()},
        "spec": {"source": {"url": "s3://images/fedora.raw"}, "targets": [{"pvc": {"name": PRIME}}]},
        "status": status,
    })
}

fn pv(claim_uid: &str, claim_name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-7"},
        "spec": {"capacity": {"storage": "20Gi"}, "persistentVolumeReclaimPolicy": "Delete",
                 "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                              "namespace": NS, "name": claim_name, "uid": claim_uid,
                              "resourceVersion": "12"}},
    })
}

fn pvc(v: &Value) -> Arc<PersistentVolumeClaim> {
    Arc::new(serde_json::from_value(v.clone()).unwrap())
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
    assert_eq!(event.body["regarding"]["kind"], "PersistentVolumeClaim");
    assert_eq!(event.body["regarding"]["name"], "disk");
    assert_eq!(event.body["regarding"]["uid"], UID);
    event.body["note"].as_str().unwrap().to_string()
}

/// New claim naming a VolumeImageSource -> the prime claim (the user's spec, no data
/// source, owned and labelled) and the Transfer from the source into it; then the
/// Transfer's progress is told on the claim, once per change.
#[tokio::test]
async fn a_new_claim_gets_a_prime_claim_and_a_transfer() {
    let mut h = Harness::new();
    let task = tokio::spawn(reconcile(pvc(&claim()), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(source())).await;
    h.server
        .expect("GET", SC, Reply::Ok(storage_class("Immediate")))
        .await;
    let prime = h.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(
        prime,
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": PRIME, "namespace": NS, "labels": labels(),
                         "ownerReferences": owner()},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                     "volumeMode": "Block", "resources": {"requests": {"storage": "20Gi"}}},
        })
    );
    let note = on_claim(&h.server.expect_event(NS).await, "Normal", "PrimeCreated");
    assert_eq!(
        note,
        format!("created prime claim pvc/{PRIME} to fill with the image")
    );
    let t = h.server.expect("POST", TRANSFERS, Reply::Echo).await.body;
    assert_eq!(
        t,
        json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": "disk", "namespace": NS, "labels": labels(),
                         "ownerReferences": owner()},
            "spec": {
                "source": {"url": "s3://images/fedora.raw", "s3": {"region": "eu-west-1"}},
                "targets": [{"pvc": {"name": PRIME}}],
                "options": {"workers": 4},
                "expectedDigest": format!("sha256:{}", "ab".repeat(32)),
            },
        })
    );
    on_claim(
        &h.server.expect_event(NS).await,
        "Normal",
        "TransferCreated",
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    // The watches saw both; the Transfer runs: one event, and none for the same state.
    h.claim_seen(&prime_claim(false));
    let running = json!({"phase": "Running", "moverPod": "disk-ft-1", "node": "node-a",
                         "progress": {"totalBytes": 1000, "doneBytes": 500}});
    h.transfer_seen(&transfer(running));
    for round in 0..2 {
        let task = tokio::spawn(reconcile(pvc(&claim()), h.ctx.clone()));
        h.server.expect("GET", VIS, Reply::Ok(source())).await;
        if round == 0 {
            let note = on_claim(
                &h.server.expect_event(NS).await,
                "Normal",
                "PopulatorRunning",
            );
            expect_progress(&mut h.server, "50%").await;
            assert_eq!(
                note,
                format!("Transfer disk copies the image into pvc/{PRIME}: 500 of 1000 bytes (50%) by mover pod disk-ft-1 on node node-a")
            );
        }
        assert_eq!(finish(task).await, Action::await_change());
        h.server.done().await;
    }
}

/// The claim's progress annotation patched to `percent`.
async fn expect_progress(server: &mut support::ApiServer, percent: &str) {
    let seen = server
        .expect("PATCH", &format!("{PVCS}/disk"), Reply::Ok(claim()))
        .await;
    assert_eq!(seen.content_type, "application/merge-patch+json");
    assert_eq!(
        seen.body,
        json!({"metadata": {"annotations": {"ferry.dev/populator-progress": percent}}})
    );
}

/// The VolumeImageSource does not exist (yet) -> a Pending event, no prime claim.
#[tokio::test]
async fn a_missing_source_leaves_the_claim_pending() {
    let mut h = Harness::new();
    let task = tokio::spawn(reconcile(pvc(&claim()), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Fail(404)).await;
    let note = on_claim(&h.server.expect_event(NS).await, "Normal", "Pending");
    assert_eq!(
        note,
        "waiting for VolumeImageSource fedora in namespace vms: create it, or fix spec.dataSourceRef"
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

/// WaitForFirstConsumer without a selected node -> nothing yet; once the scheduler
/// picked one, the prime claim is pinned there.
#[tokio::test]
async fn wait_for_first_consumer_waits_for_the_node_and_pins_the_prime() {
    let mut h = Harness::new();
    let task = tokio::spawn(reconcile(pvc(&claim()), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(source())).await;
    h.server
        .expect("GET", SC, Reply::Ok(storage_class("WaitForFirstConsumer")))
        .await;
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    let mut scheduled = claim();
    scheduled["metadata"]["annotations"] = json!({"volume.kubernetes.io/selected-node": "node-b"});
    let task = tokio::spawn(reconcile(pvc(&scheduled), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(source())).await;
    h.server
        .expect("GET", SC, Reply::Ok(storage_class("WaitForFirstConsumer")))
        .await;
    let prime = h.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(
        prime["metadata"]["annotations"],
        json!({"volume.kubernetes.io/selected-node": "node-b"})
    );
    assert_eq!(prime["metadata"]["name"], PRIME);
    let note = on_claim(&h.server.expect_event(NS).await, "Normal", "PrimeCreated");
    assert!(
        note.ends_with("on node node-b to fill with the image"),
        "{note}"
    );
    h.server.expect("POST", TRANSFERS, Reply::Echo).await;
    on_claim(
        &h.server.expect_event(NS).await,
        "Normal",
        "TransferCreated",
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

/// Transfer Succeeded: nothing until the prime claim is Bound; then its volume's
/// claimRef is patched to the user's claim; a repeat finds it handed over.
#[tokio::test]
async fn a_succeeded_transfer_hands_the_volume_to_the_claim() {
    let mut h = Harness::new();
    h.claim_seen(&prime_claim(false));
    h.transfer_seen(&transfer(json!({"phase": "Succeeded"})));
    let task = tokio::spawn(reconcile(pvc(&claim()), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(source())).await;
    on_claim(&h.server.expect_event(NS).await, "Normal", "ImageCopied");
    expect_progress(&mut h.server, "100%").await;
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    h.claim_seen(&prime_claim(true));
    let task = tokio::spawn(reconcile(pvc(&claim()), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(source())).await;
    h.server
        .expect("GET", PV, Reply::Ok(pv("prime-uid", PRIME)))
        .await;
    let patch = h
        .server
        .expect("PATCH", PV, Reply::Ok(pv(UID, "disk")))
        .await;
    assert_eq!(patch.content_type, "application/merge-patch+json");
    assert_eq!(
        patch.body,
        json!({
            "metadata": {"annotations": {"ferry.dev/populated-from": "vms/fedora"}},
            "spec": {"claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                  "namespace": NS, "name": "disk", "uid": UID,
                                  "resourceVersion": "40"}},
        })
    );
    let note = on_claim(&h.server.expect_event(NS).await, "Normal", "Rebinding");
    assert_eq!(
        note,
        "volume pv-7 holds the image: handed over to this claim"
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    // Again before the PV controller bound the claim: the volume is already ours.
    let task = tokio::spawn(reconcile(pvc(&claim()), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(source())).await;
    h.server.expect("GET", PV, Reply::Ok(pv(UID, "disk"))).await;
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

/// A volume whose claimRef names neither the prime nor the user's claim is left alone.
#[tokio::test]
async fn a_volume_claimed_by_someone_else_is_not_taken() {
    let mut h = Harness::new();
    h.claim_seen(&prime_claim(true));
    h.transfer_seen(&transfer(json!({"phase": "Succeeded"})));
    let task = tokio::spawn(reconcile(pvc(&claim()), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(source())).await;
    on_claim(&h.server.expect_event(NS).await, "Normal", "ImageCopied");
    expect_progress(&mut h.server, "100%").await;
    h.server
        .expect("GET", PV, Reply::Ok(pv("x-9", "other")))
        .await;
    let note = on_claim(&h.server.expect_event(NS).await, "Warning", "VolumeTaken");
    assert!(note.contains("claimed by vms/other"), "{note}");
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

/// The user's claim Bound to the volume -> the prime claim and the Transfer are deleted;
/// after that the claim costs no request.
#[tokio::test]
async fn a_bound_claim_deletes_the_prime_and_the_transfer() {
    let mut h = Harness::new();
    h.claim_seen(&prime_claim(true));
    h.transfer_seen(&transfer(json!({"phase": "Succeeded"})));
    let mut bound = claim();
    bound["spec"]["volumeName"] = json!("pv-7");
    // Named but not yet Bound: wait.
    let task = tokio::spawn(reconcile(pvc(&bound), h.ctx.clone()));
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    bound["status"]["phase"] = json!("Bound");
    let task = tokio::spawn(reconcile(pvc(&bound), h.ctx.clone()));
    let seen = h
        .server
        .expect("DELETE", &format!("{PVCS}/{PRIME}"), Reply::Deleted)
        .await;
    assert_eq!(seen.body["propagationPolicy"], "Background");
    let note = on_claim(&h.server.expect_event(NS).await, "Normal", "Populated");
    assert_eq!(
        note,
        format!("populated: bound to volume pv-7; prime claim pvc/{PRIME} deleted")
    );
    h.server
        .expect("DELETE", &format!("{TRANSFERS}/disk"), Reply::Deleted)
        .await;
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    // The watches saw both go.
    let mut h2 = Harness::new();
    let task = tokio::spawn(reconcile(pvc(&bound), h2.ctx.clone()));
    assert_eq!(finish(task).await, Action::await_change());
    h2.server.done().await;
}

/// A failed Transfer -> a warning on the claim; the prime claim stays, nothing else.
#[tokio::test]
async fn a_failed_transfer_warns_and_keeps_the_prime() {
    let mut h = Harness::new();
    h.claim_seen(&prime_claim(true));
    h.transfer_seen(&transfer(
        json!({"phase": "Failed", "message": "source: s3://images/fedora.raw does not exist"}),
    ));
    let task = tokio::spawn(reconcile(pvc(&claim()), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(source())).await;
    let note = on_claim(
        &h.server.expect_event(NS).await,
        "Warning",
        "PopulatorFailed",
    );
    expect_progress(&mut h.server, "0%").await;
    assert_eq!(
        note,
        format!("Transfer disk failed: source: s3://images/fedora.raw does not exist; pvc/{PRIME} is kept for inspection; delete Transfer disk to try again")
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

/// A Transfer named after the claim that someone else owns -> a warning, no takeover.
#[tokio::test]
async fn a_foreign_transfer_of_the_same_name_is_a_conflict() {
    let mut h = Harness::new();
    h.claim_seen(&prime_claim(false));
    let task = tokio::spawn(reconcile(pvc(&claim()), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(source())).await;
    h.server.expect("POST", TRANSFERS, Reply::Fail(409)).await;
    let mut foreign = transfer(json!({"phase": "Running"}));
    foreign["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("ownerReferences");
    h.server
        .expect("GET", &format!("{TRANSFERS}/disk"), Reply::Ok(foreign))
        .await;
    on_claim(
        &h.server.expect_event(NS).await,
        "Warning",
        "TransferConflict",
    );
    assert_eq!(
        finish(task).await,
        Action::requeue(ferry_operator::populator::reconcile::RECHECK)
    );
    h.server.done().await;
}

/// Claims whose dataSourceRef is another kind (or none) -> ignored, no request.
#[tokio::test]
async fn other_data_sources_are_ignored() {
    let mut h = Harness::new();
    let mut snapshot = claim();
    snapshot["spec"]["dataSourceRef"] =
        json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "fedora"});
    let mut plain = claim();
    plain["spec"]
        .as_object_mut()
        .unwrap()
        .remove("dataSourceRef");
    for c in [snapshot, plain] {
        let task = tokio::spawn(reconcile(pvc(&c), h.ctx.clone()));
        assert_eq!(finish(task).await, Action::await_change());
        h.server.done().await;
    }
}

/// A prime claim an earlier reconcile created but the store has not seen yet (409) ->
/// taken as created; the Transfer follows.
#[tokio::test]
async fn a_prime_claim_created_before_is_not_created_twice() {
    let mut h = Harness::new();
    let task = tokio::spawn(reconcile(pvc(&claim()), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(source())).await;
    h.server
        .expect("GET", SC, Reply::Ok(storage_class("Immediate")))
        .await;
    h.server.expect("POST", PVCS, Reply::Fail(409)).await;
    h.server.expect("POST", TRANSFERS, Reply::Echo).await;
    on_claim(
        &h.server.expect_event(NS).await,
        "Normal",
        "TransferCreated",
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

/// A source in another namespace, or one that fails its checks -> a warning, nothing
/// created.
#[tokio::test]
async fn foreign_and_invalid_sources_are_refused_with_a_warning() {
    let mut h = Harness::new();
    let mut foreign = claim();
    foreign["spec"]["dataSourceRef"]["namespace"] = json!("images");
    let task = tokio::spawn(reconcile(pvc(&foreign), h.ctx.clone()));
    let note = on_claim(
        &h.server.expect_event(NS).await,
        "Warning",
        "CrossNamespaceSource",
    );
    assert!(
        note.starts_with("VolumeImageSource images/fedora is in another namespace"),
        "{note}"
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    let mut invalid = source();
    invalid["spec"]["source"]["url"] = json!("s3://user:pw@images/fedora.raw");
    let task = tokio::spawn(reconcile(pvc(&claim()), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(invalid)).await;
    let note = on_claim(&h.server.expect_event(NS).await, "Warning", "InvalidSource");
    assert!(note.contains("password inside the URL"), "{note}");
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

const BACKUP: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/ferrybackups/web1-nightly";
const RESTORES: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/ferryrestores";

/// The user's claim `disk` populated from the Backup `web1-nightly`.
fn restore_claim(volume: bool) -> Value {
    let mut c = claim();
    c["spec"]["dataSourceRef"] = json!({"apiGroup": "ferry.dev", "kind": "Backup",
                                        "name": "web1-nightly"});
    if volume {
        c["spec"]["volumeName"] = json!("pv-7");
        c["status"]["phase"] = json!("Bound");
    }
    c
}

fn backup(phase: &str) -> Value {
    json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Backup",
        "metadata": {"name": "web1-nightly", "namespace": NS, "uid": "b-1"},
        "spec": {"sourcePVC": "web1", "repository": "site-a",
                 "mover": {"priorityClassName": "backups"}},
        "status": {"phase": phase, "snapshotId": "20261202T030000Z-0a1b2c3d"},
    })
}

fn restore(status: Value) -> Value {
    json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Restore",
        "metadata": {"name": "disk", "namespace": NS, "uid": "r-1",
                     "labels": labels(), "ownerReferences": owner()},
        "spec": {"backup": "web1-nightly", "targetPVC": PRIME},
        "status": status,
    })
}

/// A claim naming a Backup: it waits for the Backup to succeed; then the prime claim and
/// a Restore of the Backup into it; once the Restore succeeded and the prime is Bound,
/// the volume is handed over; once the claim is Bound, the prime and the Restore go.
#[tokio::test]
async fn a_claim_naming_a_backup_is_restored_and_bound() {
    let mut h = Harness::new();
    let task = tokio::spawn(reconcile(pvc(&restore_claim(false)), h.ctx.clone()));
    h.server
        .expect("GET", BACKUP, Reply::Ok(backup("Running")))
        .await;
    let note = on_claim(&h.server.expect_event(NS).await, "Normal", "Pending");
    assert_eq!(note, "waiting for Backup web1-nightly to succeed");
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    let task = tokio::spawn(reconcile(pvc(&restore_claim(false)), h.ctx.clone()));
    h.server
        .expect("GET", BACKUP, Reply::Ok(backup("Succeeded")))
        .await;
    h.server
        .expect("GET", SC, Reply::Ok(storage_class("Immediate")))
        .await;
    let prime = h.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(prime["metadata"]["name"], PRIME);
    on_claim(&h.server.expect_event(NS).await, "Normal", "PrimeCreated");
    let r = h.server.expect("POST", RESTORES, Reply::Echo).await.body;
    assert_eq!(
        r,
        json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Restore",
            "metadata": {"name": "disk", "namespace": NS, "labels": labels(),
                         "ownerReferences": owner()},
            "spec": {"backup": "web1-nightly", "targetPVC": PRIME,
                     "mover": {"priorityClassName": "backups"}},
        })
    );
    on_claim(&h.server.expect_event(NS).await, "Normal", "RestoreCreated");
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    // Restored and the prime Bound: the volume handed over.
    h.claim_seen(&prime_claim(true));
    h.restore_seen(&restore(json!({"phase": "Succeeded"})));
    let task = tokio::spawn(reconcile(pvc(&restore_claim(false)), h.ctx.clone()));
    h.server
        .expect("GET", BACKUP, Reply::Ok(backup("Succeeded")))
        .await;
    let note = on_claim(&h.server.expect_event(NS).await, "Normal", "ImageCopied");
    expect_progress(&mut h.server, "100%").await;
    assert!(
        note.starts_with("Restore disk restored the backup into pvc/ferry-prime-u-1"),
        "{note}"
    );
    h.server
        .expect("GET", PV, Reply::Ok(pv("prime-uid", PRIME)))
        .await;
    let patch = h
        .server
        .expect("PATCH", PV, Reply::Ok(pv(UID, "disk")))
        .await;
    assert_eq!(
        patch.body["metadata"]["annotations"]["ferry.dev/populated-from"],
        "vms/web1-nightly"
    );
    assert_eq!(patch.body["spec"]["claimRef"]["uid"], UID);
    on_claim(&h.server.expect_event(NS).await, "Normal", "Rebinding");
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    // Bound: the prime claim and the Restore are deleted.
    let task = tokio::spawn(reconcile(pvc(&restore_claim(true)), h.ctx.clone()));
    h.server
        .expect("DELETE", &format!("{PVCS}/{PRIME}"), Reply::Deleted)
        .await;
    on_claim(&h.server.expect_event(NS).await, "Normal", "Populated");
    h.server
        .expect("DELETE", &format!("{RESTORES}/disk"), Reply::Deleted)
        .await;
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

/// A claim naming a failed Backup: a warning, nothing created.
#[tokio::test]
async fn a_failed_backup_is_not_restored() {
    let mut h = Harness::new();
    let task = tokio::spawn(reconcile(pvc(&restore_claim(false)), h.ctx.clone()));
    h.server
        .expect("GET", BACKUP, Reply::Ok(backup("Failed")))
        .await;
    let note = on_claim(&h.server.expect_event(NS).await, "Warning", "InvalidSource");
    assert!(note.contains("has no snapshot to restore"), "{note}");
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

/// With a watched namespace, the populator lists and watches only there: under a Role in
/// that namespace, a cluster-wide watch would be refused and the populator never start.
#[tokio::test]
async fn the_populator_watches_only_the_watched_namespace() {
    let (client, mut server) = support::ApiServer::new();
    let run = tokio::spawn(ferry_operator::populator::run(client, Some(NS.into())));
    let seen = server.lists(16, Duration::from_secs(2)).await;
    run.abort();
    let paths: Vec<&str> = seen.iter().map(|(p, _)| p.as_str()).collect();
    for kind in [
        "transfers",
        "ferryrestores",
        "persistentvolumeclaims",
        "ferrybackups",
        "volumeimagesources",
    ] {
        assert!(
            paths.iter().any(|p| p.ends_with(&format!("/{kind}"))),
            "no request for {kind}: {paths:?}"
        );
    }
    // The cluster-scoped kinds are read through the operator's ClusterRole in any mode.
    let cluster_scoped = [
        "/apis/storage.k8s.io/v1/storageclasses",
        "/apis/ferry.dev/v1alpha1/storageclassprofiles",
    ];
    for path in &paths {
        assert!(
            path.contains("/namespaces/vms/") || cluster_scoped.contains(path),
            "{path} is not in namespace vms: {paths:?}"
        );
    }
}

const SCHEDULE: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/backupschedules/nightly";

/// The prime claim and the Restore filling it created for a claim of class `fast`
/// (Immediate binding), each with its event: their bodies as sent.
async fn prime_and_restore(h: &mut Harness) -> (Value, Value) {
    h.server
        .expect("GET", SC, Reply::Ok(storage_class("Immediate")))
        .await;
    let prime = h.server.expect("POST", PVCS, Reply::Echo).await.body;
    on_claim(&h.server.expect_event(NS).await, "Normal", "PrimeCreated");
    let restore = h.server.expect("POST", RESTORES, Reply::Echo).await.body;
    on_claim(&h.server.expect_event(NS).await, "Normal", "RestoreCreated");
    (prime, restore)
}

/// A claim naming the VolumeImageSource `fedora` whose `backup` is the newest backup of a
/// source: the prime claim and a Restore of that source's newest snapshot (at or before
/// the time given), with the source's mover settings; no Transfer.
#[tokio::test]
async fn a_source_naming_a_repositorys_latest_backup_is_restored() {
    let mut h = Harness::new();
    let mut vis = source();
    vis["spec"] = json!({
        "backup": {"repository": "site-a", "sourceId": "vms/web1",
                   "restoreAsOf": "2026-12-02T03:00:00Z"},
        "mover": {"priorityClassName": "restores"},
    });
    let task = tokio::spawn(reconcile(pvc(&claim()), h.ctx.clone()));
    h.server.expect("GET", VIS, Reply::Ok(vis)).await;
    let (prime, r) = prime_and_restore(&mut h).await;
    assert_eq!(prime["metadata"]["name"], PRIME);
    assert_eq!(
        r["spec"],
        json!({"repository": "site-a", "sourceId": "vms/web1",
               "restoreAsOf": "2026-12-02T03:00:00Z", "targetPVC": PRIME,
               "mover": {"priorityClassName": "restores"}})
    );
    assert_eq!(r["metadata"]["ownerReferences"], owner());
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

/// A claim naming a BackupSchedule: it waits (looking again, schedules are not watched)
/// until the schedule has a successful backup; then a Restore of the newest snapshot of
/// the schedule's claim in its repository.
#[tokio::test]
async fn a_claim_naming_a_schedule_restores_its_newest_backup() {
    let mut h = Harness::new();
    let mut c = claim();
    c["spec"]["dataSourceRef"] = json!({"apiGroup": "ferry.dev", "kind": "BackupSchedule",
                                        "name": "nightly"});
    let mut schedule = json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "BackupSchedule",
        "metadata": {"name": "nightly", "namespace": NS, "uid": "s-1"},
        "spec": {"sourcePVC": "web1", "repository": "site-a",
                 "trigger": {"schedule": "0 3 * * *"}},
        "status": {},
    });
    let task = tokio::spawn(reconcile(pvc(&c), h.ctx.clone()));
    h.server.expect("GET", SCHEDULE, Reply::NotFound).await;
    let note = on_claim(&h.server.expect_event(NS).await, "Normal", "Pending");
    assert!(
        note.starts_with("waiting for BackupSchedule nightly"),
        "{note}"
    );
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(60)));
    h.server.done().await;

    let task = tokio::spawn(reconcile(pvc(&c), h.ctx.clone()));
    h.server
        .expect("GET", SCHEDULE, Reply::Ok(schedule.clone()))
        .await;
    let note = on_claim(&h.server.expect_event(NS).await, "Normal", "NoBackupYet");
    assert_eq!(
        note,
        "waiting for the first successful backup of BackupSchedule nightly"
    );
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(60)));
    h.server.done().await;

    schedule["status"] = json!({"lastSnapshot": "20261202T030000Z-0a1b2c3d"});
    let task = tokio::spawn(reconcile(pvc(&c), h.ctx.clone()));
    h.server.expect("GET", SCHEDULE, Reply::Ok(schedule)).await;
    let (_, r) = prime_and_restore(&mut h).await;
    assert_eq!(
        r["spec"],
        json!({"repository": "site-a", "sourceId": "vms/web1", "targetPVC": PRIME})
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}
