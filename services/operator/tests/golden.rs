//! GoldenImages against a mocked API server: a poll of a source whose version is not
//! asked (an `nbd://` URL) starts an import Transfer into a new claim and records it; the
//! import's end makes its claim current and deletes the Transfer; a Transfer from
//! `source: {goldenImage}` records the current claim first, and waits, saying why, while
//! the GoldenImage holds none. A source with credentials is asked by a probe pod (an
//! unchanged version imports nothing, a failed probe is PollFailed, a stale pod is
//! deleted); an import kept as a snapshot is snapshotted, its claim deleted once the
//! snapshot is ready, the oldest snapshot pruned; a Transfer from such a GoldenImage
//! restores the snapshot into its own claim once, as large as its `restoreSize`. A
//! version imported again (a rollback) is an import of its own and the current snapshot
//! survives pruning; a Transfer or snapshot of an import's name is adopted only when it
//! is this GoldenImage's own; a snapshot that never becomes ready says why and fails the
//! import at its deadline. (tests/tests/golden_image.rs runs the whole loop against
//! nginx with the real controllers.)

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use ferry_operator::clone::reconcile::reconcile_transfer;
use ferry_operator::crd::{GoldenImage, Transfer};
use ferry_operator::golden::reconcile::reconcile;
use kube::runtime::controller::Action;
use serde_json::{json, Value};

use support::{settings, with_status, Harness, Reply};

const NS: &str = "vms";
const GI_STATUS: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/goldenimages/fedora/status";
const GI: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/goldenimages/fedora";
const TRANSFERS: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers";
const PVCS: &str = "/api/v1/namespaces/vms/persistentvolumeclaims";

fn golden_json() -> Value {
    json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "GoldenImage",
        "metadata": {"name": "fedora", "namespace": NS, "uid": "gi-1", "generation": 1,
                     "resourceVersion": "3"},
        "spec": {
            "source": {"url": "nbd://images.example.com:10809/fedora"},
            "trigger": {"schedule": "0 */6 * * *"},
            "importsToKeep": 1,
            "claim": {"size": "10Gi", "volumeMode": "Block"},
        },
    })
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
async fn a_poll_imports_and_the_imports_end_makes_its_claim_current() {
    let mut h = Harness::new(settings());
    let object = golden_json();
    let gi: Arc<GoldenImage> = Arc::new(serde_json::from_value(object.clone()).unwrap());

    // 1. The first poll: no version to ask of nbd://, so an import.
    let task = tokio::spawn(reconcile(gi, h.ctx.clone()));
    let created = h.server.expect("POST", TRANSFERS, Reply::Echo).await.body;
    let name = created["metadata"]["name"].as_str().unwrap().to_string();
    assert!(name.starts_with("fedora-"), "{name}");
    assert_eq!(created["metadata"]["ownerReferences"][0]["uid"], "gi-1");
    assert_eq!(
        created["spec"]["targets"][0]["pvcTemplate"]["name"],
        name.as_str()
    );
    assert_eq!(created["spec"]["claimRetention"], "Retain");
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(status["importing"]["claim"], name.as_str());
    let progressing = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Progressing")
        .unwrap()
        .clone();
    assert_eq!(progressing["reason"], "Importing");
    assert!(
        progressing["message"]
            .as_str()
            .unwrap()
            .contains("the version of this kind of URL is not asked: every fire imports"),
        "{progressing}"
    );
    let event = h.server.expect_event(NS).await;
    assert_eq!(event.body["reason"], "Importing");
    assert_eq!(finish(task).await, Action::requeue(Duration::ZERO));
    h.server.done().await;

    // 2. The import succeeded: its claim current, the Transfer deleted, the claim kept.
    let object = with_status(&object, &json!({ "status": status }));
    let gi: Arc<GoldenImage> = Arc::new(serde_json::from_value(object.clone()).unwrap());
    let task = tokio::spawn(reconcile(gi, h.ctx.clone()));
    let mut done = created.clone();
    done["status"] = json!({"phase": "Succeeded"});
    h.server
        .expect("GET", &format!("{TRANSFERS}/{name}"), Reply::Ok(done))
        .await;
    h.server
        .expect("DELETE", &format!("{TRANSFERS}/{name}"), Reply::Deleted)
        .await;
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(status["currentClaim"], name.as_str());
    assert!(status.get("importing").is_none(), "{status}");
    assert_eq!(status["imports"][0]["claim"], name.as_str());
    let event = h.server.expect_event(NS).await;
    assert_eq!(event.body["reason"], "Imported");
    assert_eq!(finish(task).await, Action::requeue(Duration::ZERO));
    h.server.done().await;

    // 3. The next fire imports again (nbd:// has no version asked); once it succeeded the
    // first claim goes (importsToKeep 1).
    let mut status = status;
    status["nextPollTime"] = json!("2000-01-01T00:00:00Z");
    let object = with_status(&object, &json!({ "status": status }));
    let gi: Arc<GoldenImage> = Arc::new(serde_json::from_value(object.clone()).unwrap());
    let task = tokio::spawn(reconcile(gi, h.ctx.clone()));
    let second = h.server.expect("POST", TRANSFERS, Reply::Echo).await.body;
    let second_name = second["metadata"]["name"].as_str().unwrap().to_string();
    assert_ne!(second_name, name);
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    // The second Importing event joins the first one's series (kube's recorder).
    let series = h.server.expect_event_series(NS).await;
    assert_eq!(series.body["reason"], "Importing");
    finish(task).await;
    h.server.done().await;
    let object = with_status(&object, &json!({ "status": status }));
    let gi: Arc<GoldenImage> = Arc::new(serde_json::from_value(object.clone()).unwrap());
    let task = tokio::spawn(reconcile(gi, h.ctx.clone()));
    let mut done = second.clone();
    done["status"] = json!({"phase": "Succeeded"});
    h.server
        .expect(
            "GET",
            &format!("{TRANSFERS}/{second_name}"),
            Reply::Ok(done),
        )
        .await;
    h.server
        .expect("DELETE", &format!("{PVCS}/{name}"), Reply::Deleted)
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{TRANSFERS}/{second_name}"),
            Reply::Deleted,
        )
        .await;
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(seen.body["status"]["currentClaim"], second_name.as_str());
    assert_eq!(seen.body["status"]["imports"].as_array().unwrap().len(), 1);
    let series = h.server.expect_event_series(NS).await;
    assert_eq!(series.body["reason"], "Imported");
    finish(task).await;
    h.server.done().await;
}

fn transfer_json() -> Value {
    json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "vm-1", "namespace": NS, "uid": "t-1", "generation": 1,
                     "resourceVersion": "5", "finalizers": ["ferry.dev/cancel"]},
        "spec": {"source": {"goldenImage": {"name": "fedora"}},
                 "targets": [{"pvcTemplate": {"name": "vm-1-disk", "size": "10Gi"}}]},
    })
}

#[tokio::test]
async fn a_transfer_from_a_golden_image_records_its_current_claim_or_waits() {
    let mut h = Harness::new(settings());
    let object = transfer_json();
    let t: Arc<Transfer> = Arc::new(serde_json::from_value(object.clone()).unwrap());
    let task = tokio::spawn(reconcile_transfer(t, h.ctx.clone()));
    let mut empty = golden_json();
    empty["status"] = json!({});
    h.server.expect("GET", GI, Reply::Ok(empty)).await;
    let seen = h
        .server
        .expect(
            "PATCH",
            "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers/vm-1/status",
            Reply::ApplyStatus(object.clone()),
        )
        .await;
    assert_eq!(seen.body["status"]["phase"], "Pending");
    assert_eq!(
        seen.body["status"]["message"],
        "waiting for GoldenImage fedora to hold an image: create it, or wait for its first import"
    );
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(10)));
    h.server.done().await;

    let task = tokio::spawn(reconcile_transfer(
        Arc::new(serde_json::from_value(object.clone()).unwrap()),
        h.ctx.clone(),
    ));
    let mut ready = golden_json();
    ready["status"] = json!({"currentClaim": "fedora-0a1b2c3d"});
    h.server.expect("GET", GI, Reply::Ok(ready)).await;
    let seen = h
        .server
        .expect(
            "PATCH",
            "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers/vm-1/status",
            Reply::ApplyStatus(object.clone()),
        )
        .await;
    assert_eq!(seen.body["status"]["sourceClaim"], "fedora-0a1b2c3d");
    assert_eq!(finish(task).await, Action::requeue(Duration::ZERO));
    h.server.done().await;
}

// ---- Sources with credentials: asked by a probe pod ----

const PODS: &str = "/api/v1/namespaces/vms/pods";
const PROBE: &str = "/api/v1/namespaces/vms/pods/fedora-version";

/// A GoldenImage of an HTTPS source behind basic authentication (a Secret the operator
/// never reads).
fn private_json() -> Value {
    let mut g = golden_json();
    g["spec"]["source"] = json!({
        "url": "https://images.example.com/private/fedora.qcow2",
        "http": {"user": "ferry", "password": {"name": "web", "key": "password"}},
    });
    g
}

/// The probe pod of `object` as it was created, ended with `message` as its termination
/// message.
fn probe_ended(created: &Value, message: &str) -> Value {
    let mut pod = created.clone();
    pod["metadata"]["creationTimestamp"] = json!("2026-12-06T10:00:00Z");
    pod["status"] = json!({"phase": "Succeeded", "containerStatuses": [{
        "name": "probe", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": message}}}]});
    pod
}

fn condition_of(status: &Value, type_: &str) -> (String, String) {
    let c = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .cloned()
        .unwrap_or_default();
    (
        c["reason"].as_str().unwrap_or_default().to_string(),
        c["message"].as_str().unwrap_or_default().to_string(),
    )
}

#[tokio::test]
async fn a_credentialed_source_is_asked_by_a_probe_pod_and_only_a_new_version_imports() {
    let mut h = Harness::new(settings());
    let object = private_json();
    let gi: Arc<GoldenImage> = Arc::new(serde_json::from_value(object.clone()).unwrap());

    // 1. No probe pod yet: one is made, with the Secret key projected, never read.
    let task = tokio::spawn(reconcile(gi.clone(), h.ctx.clone()));
    h.server.expect("GET", PROBE, Reply::NotFound).await;
    // The GoldenImage read afresh: the poll is still due.
    h.server.expect("GET", GI, Reply::Ok(object.clone())).await;
    let created = h.server.expect("POST", PODS, Reply::Echo).await.body;
    assert_eq!(
        created["metadata"]["labels"]["app.kubernetes.io/component"],
        "version-probe"
    );
    assert_eq!(created["metadata"]["ownerReferences"][0]["uid"], "gi-1");
    let args = created["spec"]["containers"][0]["args"].clone();
    assert_eq!(args[0], "source");
    assert_eq!(args[1], "version");
    let source: Value = serde_json::from_str(args[3].as_str().unwrap()).unwrap();
    assert_eq!(source, object["spec"]["source"]);
    let secrets = created["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "secrets")
        .unwrap()
        .clone();
    assert_eq!(
        secrets["projected"]["sources"][0]["secret"],
        json!({"name": "web", "optional": false, "items": [{"key": "password", "path": "web/password"}]})
    );
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    h.server.done().await;

    // 2. It ended with a version: the pod goes, the version imports.
    let task = tokio::spawn(reconcile(gi.clone(), h.ctx.clone()));
    h.server
        .expect(
            "GET",
            PROBE,
            Reply::Ok(probe_ended(&created, r#"{"version":"etag:\"v1\""}"#)),
        )
        .await;
    h.server.expect("DELETE", PROBE, Reply::Deleted).await;
    let transfer = h.server.expect("POST", TRANSFERS, Reply::Echo).await.body;
    assert_eq!(transfer["spec"]["source"], object["spec"]["source"]);
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(status["importing"]["version"], "etag:\"v1\"");
    assert_eq!(h.server.expect_event(NS).await.body["reason"], "Importing");
    assert_eq!(finish(task).await, Action::requeue(Duration::ZERO));
    h.server.done().await;

    // 3. The same version at the next fire: nothing imports.
    let name = status["importing"]["claim"].as_str().unwrap().to_string();
    let current = json!({"status": {
        "currentClaim": name, "currentVersion": "etag:\"v1\"",
        "imports": [{"claim": name, "version": "etag:\"v1\"", "importedAt": "2026-12-06T10:00:00Z"}],
        "nextPollTime": "2000-01-01T00:00:00Z"}});
    let object = with_status(&object, &current);
    let gi: Arc<GoldenImage> = Arc::new(serde_json::from_value(object.clone()).unwrap());
    let task = tokio::spawn(reconcile(gi.clone(), h.ctx.clone()));
    h.server
        .expect(
            "GET",
            PROBE,
            Reply::Ok(probe_ended(&created, r#"{"version":"etag:\"v1\""}"#)),
        )
        .await;
    h.server.expect("DELETE", PROBE, Reply::Deleted).await;
    // Its claim is asked for: still there.
    let claim_path = format!("{PVCS}/{name}");
    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NS}, "status": {"phase": "Bound"}});
    h.server.expect("GET", &claim_path, Reply::Ok(claim)).await;
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(seen.body["status"]["currentClaim"], name.as_str());
    assert!(seen.body["status"].get("importing").is_none());
    assert_eq!(condition_of(&seen.body["status"], "Ready").0, "UpToDate");
    assert_eq!(finish(task).await, Action::requeue(Duration::ZERO));
    h.server.done().await;

    // 3b. The same version, its claim deleted by hand: imported again, under a new name.
    let task = tokio::spawn(reconcile(gi.clone(), h.ctx.clone()));
    h.server
        .expect(
            "GET",
            PROBE,
            Reply::Ok(probe_ended(&created, r#"{"version":"etag:\"v1\""}"#)),
        )
        .await;
    h.server.expect("DELETE", PROBE, Reply::Deleted).await;
    h.server.expect("GET", &claim_path, Reply::NotFound).await;
    let event = h.server.expect_event(NS).await;
    assert_eq!(event.body["reason"], "CurrentGone");
    assert_eq!(event.body["type"], "Warning");
    assert_eq!(
        event.body["note"],
        format!("pvc/{name} is gone: importing the source's version again")
    );
    let again = h.server.expect("POST", TRANSFERS, Reply::Echo).await.body;
    assert_ne!(again["metadata"]["name"], name.as_str());
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(seen.body["status"]["importing"]["version"], "etag:\"v1\"");
    let importing = h.server.expect_event_series(NS).await;
    assert_eq!(importing.body["reason"], "Importing");
    assert_eq!(finish(task).await, Action::requeue(Duration::ZERO));
    h.server.done().await;

    // 4. A probe that failed (bad credentials): PollFailed with what it said, no import.
    let task = tokio::spawn(reconcile(gi.clone(), h.ctx.clone()));
    let said = r#"{"error":"cannot ask the source for its version: https://images.example.com/private/fedora.qcow2: the server answered 401 Unauthorized"}"#;
    h.server
        .expect("GET", PROBE, Reply::Ok(probe_ended(&created, said)))
        .await;
    h.server.expect("DELETE", PROBE, Reply::Deleted).await;
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let (reason, message) = condition_of(&seen.body["status"], "Ready");
    assert_eq!(reason, "PollFailed");
    assert!(
        message.contains("(pod fedora-version)") && message.contains("401"),
        "{message}"
    );
    assert_eq!(seen.body["status"]["currentClaim"], name.as_str());
    let event = h.server.expect_event(NS).await;
    assert_eq!(event.body["reason"], "PollFailed");
    assert_eq!(event.body["type"], "Warning");
    finish(task).await;
    h.server.done().await;

    // 5. A pod of an earlier spec (other arguments) is deleted, never read.
    let mut stale = probe_ended(&created, r#"{"version":"etag:\"v9\""}"#);
    stale["spec"]["containers"][0]["args"][3] = json!("{\"url\":\"https://old.example.com/x\"}");
    let task = tokio::spawn(reconcile(gi.clone(), h.ctx.clone()));
    h.server.expect("GET", PROBE, Reply::Ok(stale)).await;
    h.server.expect("DELETE", PROBE, Reply::Deleted).await;
    assert_eq!(finish(task).await, Action::requeue(Duration::ZERO));
    h.server.done().await;

    // 6. A reconcile of a stale copy (the cache behind the status just written): the
    // GoldenImage read afresh was polled meanwhile, so no pod is made.
    let task = tokio::spawn(reconcile(gi, h.ctx.clone()));
    h.server.expect("GET", PROBE, Reply::NotFound).await;
    let mut polled = object.clone();
    polled["status"]["lastPollTime"] = json!("2026-12-06T10:00:00Z");
    polled["status"]["nextPollTime"] = json!("2999-01-01T00:00:00Z");
    h.server.expect("GET", GI, Reply::Ok(polled)).await;
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(1)));
    h.server.done().await;
}

// ---- keepAs: Snapshot ----

const SNAPSHOTS: &str = "/apis/snapshot.storage.k8s.io/v1/namespaces/vms/volumesnapshots";

#[tokio::test]
async fn an_import_kept_as_a_snapshot_is_snapshotted_then_its_claim_goes() {
    let mut h = Harness::new(settings());
    let mut object = golden_json();
    object["spec"]["keepAs"] = json!("Snapshot");
    object["spec"]["volumeSnapshotClassName"] = json!("rbd-snaps");
    let object = with_status(
        &object,
        &json!({"status": {
            "currentSnapshot": "fedora-old", "currentVersion": "etag:\"v0\"",
            "imports": [{"claim": "fedora-old", "snapshot": "fedora-old", "version": "etag:\"v0\"",
                         "importedAt": "2026-12-05T10:00:00Z"}],
            "importing": {"transfer": "fedora-new", "claim": "fedora-new", "version": "etag:\"v1\""}}}),
    );
    let gi: Arc<GoldenImage> = Arc::new(serde_json::from_value(object.clone()).unwrap());

    // 1. The copy succeeded: the claim is snapshotted, the Transfer goes.
    let task = tokio::spawn(reconcile(gi, h.ctx.clone()));
    h.server
        .expect(
            "GET",
            &format!("{TRANSFERS}/fedora-new"),
            Reply::Ok(json!({
                "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
                "metadata": {"name": "fedora-new", "namespace": NS},
                "spec": {"source": {"url": "s3://images/fedora.raw"}, "targets": []},
                "status": {"phase": "Succeeded"}})),
        )
        .await;
    let snapshot = h.server.expect("POST", SNAPSHOTS, Reply::Echo).await.body;
    assert_eq!(snapshot["metadata"]["name"], "fedora-new");
    assert_eq!(
        snapshot["spec"],
        json!({"source": {"persistentVolumeClaimName": "fedora-new"},
               "volumeSnapshotClassName": "rbd-snaps"})
    );
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(status["importing"]["snapshot"], "fedora-new");
    assert_eq!(status["currentSnapshot"], "fedora-old");
    h.server
        .expect("DELETE", &format!("{TRANSFERS}/fedora-new"), Reply::Deleted)
        .await;
    assert_eq!(
        h.server.expect_event(NS).await.body["reason"],
        "Snapshotting"
    );
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    h.server.done().await;

    // 2. Not ready yet: nothing changes.
    let object = with_status(&object, &json!({ "status": status }));
    let gi: Arc<GoldenImage> = Arc::new(serde_json::from_value(object.clone()).unwrap());
    let task = tokio::spawn(reconcile(gi.clone(), h.ctx.clone()));
    let mut pending = snapshot.clone();
    pending["status"] = json!({"readyToUse": false});
    h.server
        .expect(
            "GET",
            &format!("{SNAPSHOTS}/fedora-new"),
            Reply::Ok(pending),
        )
        .await;
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    h.server.done().await;

    // 3. Ready: the claim goes, the snapshot is current, the oldest snapshot goes.
    let task = tokio::spawn(reconcile(gi, h.ctx.clone()));
    let mut ready = snapshot.clone();
    ready["status"] = json!({"readyToUse": true, "restoreSize": "10Gi"});
    h.server
        .expect("GET", &format!("{SNAPSHOTS}/fedora-new"), Reply::Ok(ready))
        .await;
    h.server
        .expect("DELETE", &format!("{PVCS}/fedora-new"), Reply::Deleted)
        .await;
    h.server
        .expect("DELETE", &format!("{SNAPSHOTS}/fedora-old"), Reply::Deleted)
        .await;
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = &seen.body["status"];
    assert_eq!(status["currentSnapshot"], "fedora-new");
    assert!(status.get("currentClaim").is_none(), "{status}");
    assert_eq!(status["currentVersion"], "etag:\"v1\"");
    assert_eq!(
        status["imports"],
        json!([{"claim": "fedora-new", "snapshot": "fedora-new", "version": "etag:\"v1\"",
                "importedAt": status["imports"][0]["importedAt"]}])
    );
    assert_eq!(
        condition_of(status, "Ready").1,
        "VolumeSnapshot fedora-new holds the newest import"
    );
    assert_eq!(h.server.expect_event(NS).await.body["reason"], "Imported");
    finish(task).await;
    h.server.done().await;
}

#[tokio::test]
async fn a_transfer_from_a_snapshot_kept_golden_image_restores_its_own_claim_once() {
    let mut h = Harness::new(settings());
    let object = transfer_json();
    let mut image = golden_json();
    image["spec"]["keepAs"] = json!("Snapshot");
    image["spec"]["claim"]["storageClassName"] = json!("rbd");
    image["status"] = json!({"currentSnapshot": "fedora-0a1b2c3d"});
    const TRANSFER_STATUS: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers/vm-1/status";

    // 1. The claim restored from the snapshot is made; the Transfer waits for it.
    let task = tokio::spawn(reconcile_transfer(
        Arc::new(serde_json::from_value(object.clone()).unwrap()),
        h.ctx.clone(),
    ));
    h.server.expect("GET", GI, Reply::Ok(image.clone())).await;
    h.server
        .expect("GET", &format!("{PVCS}/vm-1-golden"), Reply::NotFound)
        .await;
    // The snapshot is read for its restoreSize: the driver rounded the 10Gi volume up.
    h.server
        .expect(
            "GET",
            &format!("{SNAPSHOTS}/fedora-0a1b2c3d"),
            Reply::Ok(ready_snapshot("fedora-0a1b2c3d", "10752Mi")),
        )
        .await;
    let claim = h.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(
        claim["spec"],
        json!({"accessModes": ["ReadWriteOnce"], "volumeMode": "Block", "storageClassName": "rbd",
               "resources": {"requests": {"storage": "10752Mi"}},
               "dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
                              "name": "fedora-0a1b2c3d"}})
    );
    assert_eq!(claim["metadata"]["ownerReferences"][0]["uid"], "t-1");
    assert_eq!(claim["metadata"]["ownerReferences"][0]["kind"], "Transfer");
    h.server
        .expect(
            "GET",
            "/apis/storage.k8s.io/v1/storageclasses/rbd",
            Reply::Ok(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": "rbd"}, "provisioner": "rbd.csi.ceph.com",
                "volumeBindingMode": "Immediate"}),
            ),
        )
        .await;
    let seen = h
        .server
        .expect("PATCH", TRANSFER_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(seen.body["status"]["phase"], "Pending");
    assert_eq!(
        seen.body["status"]["message"],
        "restoring GoldenImage fedora's VolumeSnapshot fedora-0a1b2c3d into pvc/vm-1-golden: waiting for it to be bound"
    );
    assert!(seen.body["status"].get("sourceClaim").is_none());
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(10)));
    h.server.done().await;

    // 2. Bound: recorded as the source claim; a newer snapshot meanwhile changes nothing
    // (the claim already exists, restored from the first).
    image["status"] = json!({"currentSnapshot": "fedora-99999999"});
    let task = tokio::spawn(reconcile_transfer(
        Arc::new(serde_json::from_value(object.clone()).unwrap()),
        h.ctx.clone(),
    ));
    h.server.expect("GET", GI, Reply::Ok(image)).await;
    let mut bound = claim.clone();
    bound["status"] = json!({"phase": "Bound"});
    h.server
        .expect("GET", &format!("{PVCS}/vm-1-golden"), Reply::Ok(bound))
        .await;
    let seen = h
        .server
        .expect("PATCH", TRANSFER_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(seen.body["status"]["sourceClaim"], "vm-1-golden");
    assert_eq!(finish(task).await, Action::requeue(Duration::ZERO));
    h.server.done().await;

    // 3. A class that binds at the first consumer: recorded unbound (the copy's mover
    // binds it).
    let mut image = golden_json();
    image["spec"]["keepAs"] = json!("Snapshot");
    image["spec"]["claim"]["storageClassName"] = json!("local");
    image["status"] = json!({"currentSnapshot": "fedora-0a1b2c3d"});
    let task = tokio::spawn(reconcile_transfer(
        Arc::new(serde_json::from_value(object.clone()).unwrap()),
        h.ctx.clone(),
    ));
    h.server.expect("GET", GI, Reply::Ok(image)).await;
    h.server
        .expect("GET", &format!("{PVCS}/vm-1-golden"), Reply::NotFound)
        .await;
    h.server
        .expect(
            "GET",
            &format!("{SNAPSHOTS}/fedora-0a1b2c3d"),
            Reply::Ok(ready_snapshot("fedora-0a1b2c3d", "10Gi")),
        )
        .await;
    let claim = h.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "10Gi");
    h.server
        .expect(
            "GET",
            "/apis/storage.k8s.io/v1/storageclasses/local",
            Reply::Ok(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": "local"}, "provisioner": "local.csi",
                "volumeBindingMode": "WaitForFirstConsumer"}),
            ),
        )
        .await;
    let seen = h
        .server
        .expect("PATCH", TRANSFER_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(seen.body["status"]["sourceClaim"], "vm-1-golden");
    assert_eq!(finish(task).await, Action::requeue(Duration::ZERO));
    h.server.done().await;
    // 4. A claim of that name made by someone else is never read: the Transfer waits,
    // saying so.
    let mut image = golden_json();
    image["spec"]["keepAs"] = json!("Snapshot");
    image["status"] = json!({"currentSnapshot": "fedora-0a1b2c3d"});
    let task = tokio::spawn(reconcile_transfer(
        Arc::new(serde_json::from_value(object.clone()).unwrap()),
        h.ctx.clone(),
    ));
    h.server.expect("GET", GI, Reply::Ok(image)).await;
    let users = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "vm-1-golden", "namespace": NS},
        "status": {"phase": "Bound"}});
    h.server
        .expect("GET", &format!("{PVCS}/vm-1-golden"), Reply::Ok(users))
        .await;
    let seen = h
        .server
        .expect("PATCH", TRANSFER_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(seen.body["status"]["phase"], "Pending");
    assert!(
        seen.body["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("pvc/vm-1-golden exists and was not restored for this Transfer"),
        "{}",
        seen.body["status"]
    );
    assert!(seen.body["status"].get("sourceClaim").is_none());
    finish(task).await;
    h.server.done().await;

    // 5. The GoldenImage's snapshot is gone (deleted by hand): no claim that could never
    // bind; the Transfer waits for the next import, saying so.
    let mut image = golden_json();
    image["spec"]["keepAs"] = json!("Snapshot");
    image["status"] = json!({"currentSnapshot": "fedora-0a1b2c3d"});
    let task = tokio::spawn(reconcile_transfer(
        Arc::new(serde_json::from_value(object.clone()).unwrap()),
        h.ctx.clone(),
    ));
    h.server.expect("GET", GI, Reply::Ok(image)).await;
    h.server
        .expect("GET", &format!("{PVCS}/vm-1-golden"), Reply::NotFound)
        .await;
    h.server
        .expect(
            "GET",
            &format!("{SNAPSHOTS}/fedora-0a1b2c3d"),
            Reply::NotFound,
        )
        .await;
    let seen = h
        .server
        .expect("PATCH", TRANSFER_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(
        seen.body["status"]["message"],
        "GoldenImage fedora's VolumeSnapshot fedora-0a1b2c3d is gone: waiting for the GoldenImage's next import"
    );
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(10)));
    h.server.done().await;
}

/// A VolumeSnapshot of the GoldenImage `fedora` (uid gi-1), ready, of `restore_size`.
fn ready_snapshot(name: &str, restore_size: &str) -> Value {
    json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
           "metadata": {"name": name, "namespace": NS,
                        "labels": {"ferry.dev/golden-image": "gi-1"}},
           "spec": {"source": {"persistentVolumeClaimName": name}},
           "status": {"readyToUse": true, "restoreSize": restore_size}})
}

// ---- An earlier version imported again; a snapshot that never becomes ready ----

/// The probe pod of `object`'s source (made before the poll was due), ended saying
/// `version`.
fn probe_said(object: &Value, version: &str) -> Value {
    let gi: GoldenImage = serde_json::from_value(object.clone()).unwrap();
    let args = ferry_operator::golden::probe_pod::args(&gi.spec.source);
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "fedora-version", "namespace": NS},
        "spec": {"containers": [{"name": "probe", "image": "i", "args": args}]}});
    probe_ended(&pod, &json!({ "version": version }).to_string())
}

/// Answers an event of `reason`: created the first time, a series after (kube's recorder
/// counts repeats of a reason).
async fn expect_reason(h: &mut Harness, seen: &mut Vec<String>, reason: &str) -> Value {
    let event = if seen.iter().any(|r| r == reason) {
        h.server.expect_event_series(NS).await
    } else {
        seen.push(reason.to_string());
        h.server.expect_event(NS).await
    };
    assert_eq!(event.body["reason"], reason, "{}", event.body);
    event.body
}

/// One poll of the GoldenImage `object` (kept as snapshots, its source asked by a probe
/// pod) that finds `version`, imported to success: the import's name and the object
/// with its status after it (its next poll due). `pruned`: the snapshot the end deletes.
async fn import_as_snapshot(
    h: &mut Harness,
    events: &mut Vec<String>,
    object: &Value,
    version: &str,
    pruned: Option<&str>,
) -> (String, Value) {
    // The poll: the probe said `version`; an import Transfer.
    let gi: Arc<GoldenImage> = Arc::new(serde_json::from_value(object.clone()).unwrap());
    let task = tokio::spawn(reconcile(gi, h.ctx.clone()));
    h.server
        .expect("GET", PROBE, Reply::Ok(probe_said(object, version)))
        .await;
    h.server.expect("DELETE", PROBE, Reply::Deleted).await;
    let created = h.server.expect("POST", TRANSFERS, Reply::Echo).await.body;
    let name = created["metadata"]["name"].as_str().unwrap().to_string();
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let object = with_status(object, &json!({"status": seen.body["status"]}));
    expect_reason(h, events, "Importing").await;
    finish(task).await;
    h.server.done().await;

    // The copy succeeded: the claim is snapshotted.
    let gi: Arc<GoldenImage> = Arc::new(serde_json::from_value(object.clone()).unwrap());
    let task = tokio::spawn(reconcile(gi, h.ctx.clone()));
    let mut done = created.clone();
    done["status"] = json!({"phase": "Succeeded"});
    h.server
        .expect("GET", &format!("{TRANSFERS}/{name}"), Reply::Ok(done))
        .await;
    let snapshot = h.server.expect("POST", SNAPSHOTS, Reply::Echo).await.body;
    assert_eq!(snapshot["metadata"]["name"], name.as_str());
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let object = with_status(&object, &json!({"status": seen.body["status"]}));
    h.server
        .expect("DELETE", &format!("{TRANSFERS}/{name}"), Reply::Deleted)
        .await;
    expect_reason(h, events, "Snapshotting").await;
    finish(task).await;
    h.server.done().await;

    // Ready: the claim goes, the snapshot is current, `pruned` goes.
    let gi: Arc<GoldenImage> = Arc::new(serde_json::from_value(object.clone()).unwrap());
    let task = tokio::spawn(reconcile(gi, h.ctx.clone()));
    h.server
        .expect(
            "GET",
            &format!("{SNAPSHOTS}/{name}"),
            Reply::Ok(ready_snapshot(&name, "10Gi")),
        )
        .await;
    h.server
        .expect("DELETE", &format!("{PVCS}/{name}"), Reply::Deleted)
        .await;
    if let Some(pruned) = pruned {
        h.server
            .expect("DELETE", &format!("{SNAPSHOTS}/{pruned}"), Reply::Deleted)
            .await;
    }
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let mut status = seen.body["status"].clone();
    assert_eq!(status["currentSnapshot"], name.as_str());
    assert_eq!(status["currentVersion"], version);
    expect_reason(h, events, "Imported").await;
    finish(task).await;
    h.server.done().await;
    status["nextPollTime"] = json!("2000-01-01T00:00:00Z");
    (name, with_status(&object, &json!({ "status": status })))
}

#[tokio::test]
async fn a_rolled_back_version_is_imported_anew_and_the_current_snapshot_survives_pruning() {
    let mut h = Harness::new(settings());
    let mut events = Vec::new();
    let mut object = private_json();
    object["spec"]["keepAs"] = json!("Snapshot");
    object["spec"]["importsToKeep"] = json!(2);

    // The source's tag goes A -> B -> A (a rollback upstream).
    let a = "etag:\"A\"";
    let (first, object) = import_as_snapshot(&mut h, &mut events, &object, a, None).await;
    let (second, object) =
        import_as_snapshot(&mut h, &mut events, &object, "etag:\"B\"", None).await;
    // A again: an import of its own (not the first import's objects), and the pruned
    // import is the first A, never the snapshot now current.
    let (third, object) = import_as_snapshot(&mut h, &mut events, &object, a, Some(&first)).await;
    assert_ne!(third, first);
    assert_ne!(third, second);
    let status = &object["status"];
    assert_eq!(status["currentSnapshot"], third.as_str());
    let kept: Vec<&str> = status["imports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["snapshot"].as_str().unwrap())
        .collect();
    assert_eq!(kept, [third.as_str(), second.as_str()]);

    // A consumer still resolves: a Transfer from the GoldenImage restores the current
    // snapshot.
    let transfer = transfer_json();
    let task = tokio::spawn(reconcile_transfer(
        Arc::new(serde_json::from_value(transfer.clone()).unwrap()),
        h.ctx.clone(),
    ));
    h.server.expect("GET", GI, Reply::Ok(object.clone())).await;
    h.server
        .expect("GET", &format!("{PVCS}/vm-1-golden"), Reply::NotFound)
        .await;
    h.server
        .expect(
            "GET",
            &format!("{SNAPSHOTS}/{third}"),
            Reply::Ok(ready_snapshot(&third, "10Gi")),
        )
        .await;
    let claim = h.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(claim["spec"]["dataSource"]["name"], third.as_str());
    let seen = h
        .server
        .expect(
            "PATCH",
            "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers/vm-1/status",
            Reply::ApplyStatus(transfer.clone()),
        )
        .await;
    assert!(
        seen.body["status"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("VolumeSnapshot {third} into pvc/vm-1-golden")),
        "{}",
        seen.body["status"]
    );
    finish(task).await;
    h.server.done().await;
}

#[tokio::test]
async fn an_import_transfer_left_by_this_golden_image_is_adopted_and_another_one_is_not() {
    let mut h = Harness::new(settings());
    let object = golden_json();

    // The create meets a Transfer this GoldenImage made (the same poll, repeated after
    // a crash before the status was written): adopted.
    let gi: Arc<GoldenImage> = Arc::new(serde_json::from_value(object.clone()).unwrap());
    let task = tokio::spawn(reconcile(gi.clone(), h.ctx.clone()));
    let refused = h
        .server
        .expect("POST", TRANSFERS, Reply::Conflict)
        .await
        .body;
    let name = refused["metadata"]["name"].as_str().unwrap().to_string();
    h.server
        .expect(
            "GET",
            &format!("{TRANSFERS}/{name}"),
            Reply::Ok(refused.clone()),
        )
        .await;
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(seen.body["status"]["importing"]["claim"], name.as_str());
    assert_eq!(h.server.expect_event(NS).await.body["reason"], "Importing");
    finish(task).await;
    h.server.done().await;

    // One of that name made by anything else is never followed: the poll failed, saying
    // so, and nothing of it is deleted.
    let task = tokio::spawn(reconcile(gi, h.ctx.clone()));
    let refused = h
        .server
        .expect("POST", TRANSFERS, Reply::Conflict)
        .await
        .body;
    assert_eq!(refused["metadata"]["name"], name.as_str());
    let mut foreign = refused.clone();
    foreign["metadata"]["labels"] = json!({"app": "mine"});
    h.server
        .expect("GET", &format!("{TRANSFERS}/{name}"), Reply::Ok(foreign))
        .await;
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert!(seen.body["status"].get("importing").is_none());
    let (reason, message) = condition_of(&seen.body["status"], "Ready");
    assert_eq!(reason, "PollFailed");
    assert_eq!(
        message,
        format!("cannot start an import: Transfer {name} exists and was not made by this GoldenImage (no label ferry.dev/golden-image=gi-1); the next poll imports under another name")
    );
    let event = h.server.expect_event(NS).await;
    assert_eq!(event.body["reason"], "PollFailed");
    assert_eq!(event.body["type"], "Warning");
    finish(task).await;
    h.server.done().await;
}

#[tokio::test]
async fn a_snapshot_that_never_becomes_ready_says_why_and_fails_the_import_at_its_deadline() {
    let mut h = Harness::new(settings());
    let mut object = private_json();
    object["spec"]["keepAs"] = json!("Snapshot");
    object["spec"]["volumeSnapshotClassName"] = json!("rbd-snaps");
    let object = with_status(
        &object,
        &json!({"status": {
            "currentSnapshot": "fedora-old", "currentVersion": "etag:\"v0\"",
            "imports": [{"claim": "fedora-old", "snapshot": "fedora-old", "version": "etag:\"v0\"",
                         "importedAt": "2026-12-05T10:00:00Z"}],
            "importing": {"transfer": "fedora-new", "claim": "fedora-new",
                          "version": "etag:\"v1\"", "snapshot": "fedora-new"},
            "lastPollTime": "2026-12-06T10:00:00Z",
            "nextPollTime": "2000-01-01T00:00:00Z"}}),
    );
    let now = chrono::Utc::now();
    let stamp = |minutes_ago: i64| {
        (now - chrono::Duration::minutes(minutes_ago))
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    };
    let error = "Failed to get snapshot class with error volumesnapshotclass.snapshot.storage.k8s.io \"rbd-snaps\" not found";
    let pending = |since: i64| {
        json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
               "metadata": {"name": "fedora-new", "namespace": NS, "creationTimestamp": stamp(12)},
               "spec": {"source": {"persistentVolumeClaimName": "fedora-new"},
                        "volumeSnapshotClassName": "rbd-snaps"},
               "status": {"readyToUse": false, "error": {"message": error, "time": stamp(since)}}})
    };
    let snapshot = format!("{SNAPSHOTS}/fedora-new");

    // 1. The snapshot controller's error: in the Progressing condition, and a Warning.
    let gi: Arc<GoldenImage> = Arc::new(serde_json::from_value(object.clone()).unwrap());
    let task = tokio::spawn(reconcile(gi, h.ctx.clone()));
    h.server
        .expect("GET", &snapshot, Reply::Ok(pending(1)))
        .await;
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    let (reason, message) = condition_of(&status, "Progressing");
    assert_eq!(reason, "SnapshotNotReady");
    let fails_at = (now - chrono::Duration::minutes(1) + chrono::Duration::minutes(10))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert_eq!(
        message,
        format!("copied into pvc/fedora-new; its VolumeSnapshot fedora-new is not ready: {error} (the import fails at {fails_at} if it is still not ready)")
    );
    assert_eq!(status["currentSnapshot"], "fedora-old");
    let event = h.server.expect_event(NS).await;
    assert_eq!(event.body["reason"], "SnapshotNotReady");
    assert_eq!(event.body["type"], "Warning");
    assert_eq!(event.body["note"], message.as_str());
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(60)));
    h.server.done().await;

    // 2. The same error at the next look: nothing written, no second event.
    let object = with_status(&object, &json!({ "status": status }));
    let gi: Arc<GoldenImage> = Arc::new(serde_json::from_value(object.clone()).unwrap());
    let task = tokio::spawn(reconcile(gi.clone(), h.ctx.clone()));
    h.server
        .expect("GET", &snapshot, Reply::Ok(pending(1)))
        .await;
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(60)));
    h.server.done().await;

    // 3. Ten minutes of that error: the import failed, its claim and snapshot deleted,
    // the current snapshot kept.
    let task = tokio::spawn(reconcile(gi, h.ctx.clone()));
    h.server
        .expect("GET", &snapshot, Reply::Ok(pending(11)))
        .await;
    h.server
        .expect("DELETE", &format!("{PVCS}/fedora-new"), Reply::Deleted)
        .await;
    h.server.expect("DELETE", &snapshot, Reply::Deleted).await;
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert!(status.get("importing").is_none(), "{status}");
    assert_eq!(status["currentSnapshot"], "fedora-old");
    let (reason, message) = condition_of(&status, "Ready");
    assert_eq!(reason, "ImportFailed");
    assert_eq!(
        message,
        format!("the import into pvc/fedora-new failed: its VolumeSnapshot fedora-new was not ready 10m0s after the snapshot controller reported: {error}")
    );
    assert_eq!(condition_of(&status, "Progressing").0, "ImportFailed");
    let event = h.server.expect_event(NS).await;
    assert_eq!(event.body["reason"], "ImportFailed");
    assert_eq!(event.body["type"], "Warning");
    assert_eq!(finish(task).await, Action::requeue(Duration::ZERO));
    h.server.done().await;

    // 4. The next fire tries the version again, as a new import.
    let object = with_status(&object, &json!({ "status": status }));
    let gi: Arc<GoldenImage> = Arc::new(serde_json::from_value(object.clone()).unwrap());
    let task = tokio::spawn(reconcile(gi, h.ctx.clone()));
    h.server
        .expect("GET", PROBE, Reply::Ok(probe_said(&object, "etag:\"v1\"")))
        .await;
    h.server.expect("DELETE", PROBE, Reply::Deleted).await;
    let created = h.server.expect("POST", TRANSFERS, Reply::Echo).await.body;
    assert_ne!(created["metadata"]["name"], "fedora-new");
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(seen.body["status"]["importing"]["version"], "etag:\"v1\"");
    assert_eq!(h.server.expect_event(NS).await.body["reason"], "Importing");
    finish(task).await;
    h.server.done().await;
}

#[tokio::test]
async fn an_import_snapshot_of_that_name_is_adopted_only_when_it_is_this_imports_own() {
    let mut h = Harness::new(settings());
    let mut object = golden_json();
    object["spec"]["keepAs"] = json!("Snapshot");
    let object = with_status(
        &object,
        &json!({"status": {
            "currentSnapshot": "fedora-old", "currentVersion": "etag:\"v0\"",
            "imports": [{"claim": "fedora-old", "snapshot": "fedora-old", "version": "etag:\"v0\"",
                         "importedAt": "2026-12-05T10:00:00Z"}],
            "importing": {"transfer": "fedora-new", "claim": "fedora-new", "version": "etag:\"v1\""}}}),
    );
    let done = json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "fedora-new", "namespace": NS},
        "spec": {"source": {"url": "s3://images/fedora.raw"}, "targets": []},
        "status": {"phase": "Succeeded"}});
    let gi: Arc<GoldenImage> = Arc::new(serde_json::from_value(object.clone()).unwrap());

    // 1. Its own snapshot, left by a crash before the status recorded it: adopted.
    let task = tokio::spawn(reconcile(gi.clone(), h.ctx.clone()));
    h.server
        .expect(
            "GET",
            &format!("{TRANSFERS}/fedora-new"),
            Reply::Ok(done.clone()),
        )
        .await;
    h.server.expect("POST", SNAPSHOTS, Reply::Conflict).await;
    let mut ours = ready_snapshot("fedora-new", "10Gi");
    ours["status"] = json!({"readyToUse": false});
    h.server
        .expect("GET", &format!("{SNAPSHOTS}/fedora-new"), Reply::Ok(ours))
        .await;
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(seen.body["status"]["importing"]["snapshot"], "fedora-new");
    h.server
        .expect("DELETE", &format!("{TRANSFERS}/fedora-new"), Reply::Deleted)
        .await;
    assert_eq!(
        h.server.expect_event(NS).await.body["reason"],
        "Snapshotting"
    );
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    h.server.done().await;

    // 2. A snapshot of that name made by someone else (or of another claim): left alone;
    // the import failed, its claim deleted, the current snapshot kept.
    let task = tokio::spawn(reconcile(gi.clone(), h.ctx.clone()));
    h.server
        .expect(
            "GET",
            &format!("{TRANSFERS}/fedora-new"),
            Reply::Ok(done.clone()),
        )
        .await;
    h.server.expect("POST", SNAPSHOTS, Reply::Conflict).await;
    let mut foreign = ready_snapshot("fedora-new", "10Gi");
    foreign["metadata"]["labels"] = json!({"app": "backups"});
    h.server
        .expect(
            "GET",
            &format!("{SNAPSHOTS}/fedora-new"),
            Reply::Ok(foreign),
        )
        .await;
    h.server
        .expect("DELETE", &format!("{PVCS}/fedora-new"), Reply::Deleted)
        .await;
    h.server
        .expect("DELETE", &format!("{TRANSFERS}/fedora-new"), Reply::Deleted)
        .await;
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = &seen.body["status"];
    assert!(status.get("importing").is_none(), "{status}");
    assert_eq!(status["currentSnapshot"], "fedora-old");
    assert_eq!(
        condition_of(status, "Progressing").1,
        "the import into pvc/fedora-new failed: VolumeSnapshot fedora-new exists and is not this import's snapshot of pvc/fedora-new: it is left alone"
    );
    assert_eq!(
        h.server.expect_event(NS).await.body["reason"],
        "ImportFailed"
    );
    finish(task).await;
    h.server.done().await;

    // 3. There at the create, gone at the read (deleted meanwhile): made again.
    let task = tokio::spawn(reconcile(gi, h.ctx.clone()));
    h.server
        .expect("GET", &format!("{TRANSFERS}/fedora-new"), Reply::Ok(done))
        .await;
    h.server.expect("POST", SNAPSHOTS, Reply::Conflict).await;
    h.server
        .expect("GET", &format!("{SNAPSHOTS}/fedora-new"), Reply::NotFound)
        .await;
    let made = h.server.expect("POST", SNAPSHOTS, Reply::Echo).await.body;
    assert_eq!(
        made["spec"]["source"]["persistentVolumeClaimName"],
        "fedora-new"
    );
    let seen = h
        .server
        .expect("PATCH", GI_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(seen.body["status"]["importing"]["snapshot"], "fedora-new");
    h.server
        .expect("DELETE", &format!("{TRANSFERS}/fedora-new"), Reply::Deleted)
        .await;
    assert_eq!(
        h.server.expect_event_series(NS).await.body["reason"],
        "Snapshotting"
    );
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    h.server.done().await;
}
