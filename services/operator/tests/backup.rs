//! Backup scenarios against the mocked API server (every request checked in order and
//! against the operator's RBAC) and the fake mover link: a Backup's mover backs up and
//! then prunes, a failed backup says why, a missing repository is an invalid spec, a
//! BackupRepository reports whether it can be used, and BackupSchedules fire on a clock
//! the test drives (no overlap, paused, copyMethod Snapshot, invalid cron) and delete the
//! Backups they no longer keep (pruned snapshots, listed or missing from a prune's kept
//! list, failed ones past the history limit), going on firing when a delete is refused.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ferry_operator::controller::backup::reconcile_backup;
use ferry_operator::controller::repository::reconcile_repository;
use ferry_operator::controller::restore::reconcile_restore;
use ferry_operator::controller::{
    BackupSummary, JobFailure, JobRequest, JobState, PruneSummary, SyncSummary,
};
use ferry_operator::crd::{Backup, BackupRepository, BackupSchedule, Restore, VolumeMode};
use ferry_operator::mover::{backup_pod, restore_pod, MoverPodInput, ResolvedPvc};
use ferry_operator::schedule::{self, Clock};
use kube::runtime::controller::Action;
use parking_lot::Mutex;
use serde_json::{json, Value};

use support::{job_id, ready, report, settings, with_status, ApiServer, Call, Harness, Reply};

const NS: &str = "vms";
const B_STATUS: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/ferrybackups/web1-now/status";
const BACKUPS: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/ferrybackups";
const REPO: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/backuprepositories/site-a";
const S_STATUS: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/backupschedules/nightly/status";
const SNAPSHOTS: &str = "/apis/snapshot.storage.k8s.io/v1/namespaces/vms/volumesnapshots";
const PVCS: &str = "/api/v1/namespaces/vms/persistentvolumeclaims";
const PODS: &str = "/api/v1/namespaces/vms/pods";
const SECRETS: &str = "/api/v1/namespaces/vms/secrets";
const NETPOLS: &str = "/apis/networking.k8s.io/v1/namespaces/vms/networkpolicies";
const MIB: u64 = 1 << 20;

fn repository_json() -> Value {
    json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "BackupRepository",
        "metadata": {"name": "site-a", "namespace": NS, "uid": "uid-r", "generation": 1},
        "spec": {
            "url": "s3://backups/site-a",
            "s3": {"endpointUrl": "http://minio:9000", "forcePathStyle": true,
                   "accessKeyId": {"name": "s3", "key": "id"},
                   "secretAccessKey": {"name": "s3", "key": "secret"}},
            "encryption": {"keySecretRef": {"name": "backup-key", "key": "passphrase"}},
            "initialize": true,
        },
    })
}

fn secret(name: &str, keys: &[&str]) -> Value {
    let data: serde_json::Map<String, Value> = keys
        .iter()
        .map(|k| (k.to_string(), json!("c2VjcmV0")))
        .collect();
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
           "data": data})
}

/// Backup `web1-now` of the Block claim `web1` into `site-a`, pruning to 7 dailies.
fn backup_json(status: Option<Value>) -> Value {
    let mut b = json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Backup",
        "metadata": {"name": "web1-now", "namespace": NS, "uid": "uid-b", "generation": 1,
                     "resourceVersion": "5", "finalizers": ["ferry.dev/cancel"]},
        "spec": {"sourcePVC": "web1", "repository": "site-a", "tags": {"vm": "web1"},
                 "retain": {"daily": 7}},
    });
    if let Some(status) = status {
        b["status"] = status;
    }
    b
}

/// The next Event, which must be a Warning of `reason`.
async fn warning(server: &mut ApiServer, reason: &str) -> Value {
    let event = server.expect_event(NS).await.body;
    assert_eq!(
        (event["type"].clone(), event["reason"].clone()),
        (json!("Warning"), json!(reason)),
        "{event}"
    );
    event
}

fn backup(v: &Value) -> Arc<Backup> {
    Arc::new(serde_json::from_value(v.clone()).unwrap())
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

async fn finish<E: std::fmt::Debug>(task: tokio::task::JoinHandle<Result<Action, E>>) -> Action {
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the reconcile did not finish")
        .unwrap()
        .unwrap()
}

/// The mover pod of the Backup's first attempt, as the operator builds it.
fn mover_pod(object: &Value) -> k8s_openapi::api::core::v1::Pod {
    let mut b = (*backup(object)).clone();
    let repo: BackupRepository = serde_json::from_value(repository_json()).unwrap();
    b.spec.resolved_repository = Some(repo.spec);
    if b.spec.secondary.is_some() {
        let second: BackupRepository = serde_json::from_value(secondary_repository_json()).unwrap();
        b.spec.resolved_secondary = Some(second.spec);
    }
    backup_pod(
        &b,
        &MoverPodInput {
            pod_name: "web1-now-fbk-1",
            token_secret: "web1-now-fbk-1-token",
            pvcs: &[ResolvedPvc::new("web1", VolumeMode::Block)],
            defaults: &settings().mover,
            assigned_ids: false,
            tls: true,
        },
    )
    .unwrap()
}

fn running_status() -> Value {
    let message = "mover pod web1-now-fbk-1 runs on node node-a";
    json!({
        "phase": "Running", "attempts": 1, "moverPod": "web1-now-fbk-1", "node": "node-a",
        "observedGeneration": 1, "startTime": "2026-01-01T00:00:00Z",
        "conditions": [
            {"type": "Running", "status": "True", "reason": "MoverRunning", "message": message,
             "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1},
            {"type": "Ready", "status": "False", "reason": "MoverRunning", "message": message,
             "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1},
        ],
    })
}

fn summary() -> BackupSummary {
    BackupSummary {
        snapshot_id: "20261202T030000Z-0a1b2c3d".into(),
        parent_id: String::new(),
        bytes_read: 4 * MIB,
        bytes_new: 3 * MIB,
        bytes_reused: MIB,
        block_hash: format!("blkhash:{}", "ab".repeat(32)),
        changed_block_tracking: String::new(),
        full_reason: String::new(),
    }
}

/// A new Backup: its repository looked up, the claim and every referenced Secret key
/// checked, a mover with the claim and the keys; once ready the backup job, the snapshot
/// recorded, then the prune on the same mover, then Succeeded and the mover removed.
#[tokio::test]
async fn a_backup_backs_up_then_prunes_on_one_mover() {
    let mut h = Harness::new(settings());

    // 1. The repository, the claim, the Secrets, the token, the pod, Running.
    let object = backup_json(None);
    let task = tokio::spawn(reconcile_backup(backup(&object), h.ctx.clone()));
    h.server
        .expect("GET", REPO, Reply::Ok(repository_json()))
        .await;
    h.server
        .expect(
            "GET",
            &format!("{PVCS}/web1"),
            Reply::Ok(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                             "metadata": {"name": "web1", "namespace": NS},
                             "spec": {"volumeMode": "Block"}})),
        )
        .await;
    h.server
        .expect(
            "GET",
            &format!("{SECRETS}/backup-key"),
            Reply::Ok(secret("backup-key", &["passphrase"])),
        )
        .await;
    h.server
        .expect(
            "GET",
            &format!("{SECRETS}/s3"),
            Reply::Ok(secret("s3", &["id", "secret"])),
        )
        .await;
    let token = h.server.expect("POST", SECRETS, Reply::Echo).await.body;
    h.server.expect("POST", NETPOLS, Reply::Echo).await;
    assert_eq!(token["metadata"]["name"], "web1-now-fbk-1-token");
    let pod = h.server.expect("POST", PODS, Reply::Echo).await.body;
    assert_eq!(pod["metadata"]["name"], "web1-now-fbk-1");
    assert_eq!(pod["metadata"]["labels"]["ferry.dev/owner-kind"], "Backup");
    let container = &pod["spec"]["containers"][0];
    assert_eq!(
        container["volumeDevices"][0]["devicePath"],
        "/dev/ferry/web1"
    );
    let volumes = pod["spec"]["volumes"].as_array().unwrap();
    let web1 = volumes
        .iter()
        .find(|v| v["persistentVolumeClaim"]["claimName"] == "web1")
        .unwrap();
    assert_eq!(web1["persistentVolumeClaim"]["readOnly"], true);
    let projected: Vec<String> = volumes.iter().find(|v| v["name"] == "secrets").unwrap()
        ["projected"]["sources"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["secret"]["items"].as_array().unwrap().clone())
        .map(|i| i["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        projected,
        ["backup-key/passphrase", "s3/id", "s3/secret"],
        "the key and the S3 credentials, as files"
    );
    let seen = h
        .server
        .expect("PATCH", B_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(seen.body["kind"], "Backup");
    let status = seen.body["status"].clone();
    assert_eq!(status["phase"], "Pending");
    assert_eq!(status["moverPod"], "web1-now-fbk-1");
    assert_eq!(
        h.server.expect_event(NS).await.body["reason"],
        "MoverCreated"
    );
    finish(task).await;
    h.server.done().await;

    // 2. Ready: the backup job; its snapshot recorded; the mover stays.
    let object = with_status(&backup_json(None), &json!({ "status": status }));
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod).unwrap();
    h.pod_seen(ready(pod.clone(), "node-a"));
    let id = job_id("uid-b/backup");
    let mut done = report(&id, JobState::Succeeded, 4 * MIB);
    done.backup = Some(summary());
    h.link.script(&id, vec![done]);
    let task = tokio::spawn(reconcile_backup(backup(&object), h.ctx.clone()));
    h.server
        .expect("GET", REPO, Reply::Ok(repository_json()))
        .await;
    let seen = h
        .server
        .expect("PATCH", B_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(condition(&status, "Running")["reason"], "MoverRunning");
    h.server.expect_event(NS).await;
    finish(task).await;
    let seen = h
        .server
        .expect("PATCH", B_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let step = seen.body["status"].clone();
    assert_eq!(step["phase"], "Running", "the prune is still to run");
    assert_eq!(step["snapshotId"], "20261202T030000Z-0a1b2c3d");
    assert_eq!(step["bytesNew"], 3 * MIB);
    assert_eq!(step["bytesReused"], MIB);
    assert_eq!(step["bytesRead"], 4 * MIB);
    assert_eq!(step["blockHash"], format!("blkhash:{}", "ab".repeat(32)));
    assert_eq!(step["progress"]["doneBytes"], 4 * MIB);
    assert_eq!(
        h.server.expect_event(NS).await.body["reason"],
        "StepSucceeded"
    );
    h.ctx.take_watch("uid-b").unwrap().task.await.unwrap();
    h.server.done().await;

    // 3. The prune on the same mover, then Succeeded and the mover removed.
    let object = with_status(&object, &json!({ "status": step }));
    let id = job_id("uid-b/prune");
    let mut pruned = report(&id, JobState::Succeeded, 0);
    pruned.prune = Some(PruneSummary {
        kept: 2,
        removed: 2,
        removed_ids: vec![
            "20261125T030000Z-00000001".into(),
            "20261126T030000Z-00000002".into(),
        ],
        kept_ids: vec![
            "20261201T030000Z-00000003".into(),
            "20261202T030000Z-0a1b2c3d".into(),
        ],
    });
    h.link.script(&id, vec![pruned]);
    let task = tokio::spawn(reconcile_backup(backup(&object), h.ctx.clone()));
    h.server
        .expect("GET", REPO, Reply::Ok(repository_json()))
        .await;
    finish(task).await;
    let seen = h
        .server
        .expect("PATCH", B_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let end = seen.body["status"].clone();
    assert_eq!(end["phase"], "Succeeded");
    assert_eq!(end["snapshotId"], "20261202T030000Z-0a1b2c3d");
    assert_eq!(
        (end["pruned"].clone(), end["kept"].clone()),
        (json!(2), json!(2))
    );
    assert_eq!(
        end["prunedSnapshots"],
        json!(["20261125T030000Z-00000001", "20261126T030000Z-00000002"]),
        "the removed snapshots, for the schedule that made the Backup"
    );
    assert_eq!(
        end["keptSnapshots"],
        json!(["20261201T030000Z-00000003", "20261202T030000Z-0a1b2c3d"]),
        "the kept snapshots, for the schedule that made the Backup"
    );
    assert_eq!(
        end["progress"]["doneBytes"],
        4 * MIB,
        "the backup's progress stays"
    );
    assert_eq!(condition(&end, "Ready")["status"], "True");
    mover_removed(&mut h).await;
    assert_eq!(h.server.expect_event(NS).await.body["reason"], "Succeeded");
    h.ctx.take_watch("uid-b").unwrap().task.await.unwrap();
    h.server.done().await;

    let calls = h.link.calls();
    assert_eq!(calls.len(), 4, "{calls:?}");
    let Call::Start(JobRequest::Backup(request)) = &calls[0] else {
        panic!("{calls:?}")
    };
    assert_eq!(request.source.as_ref().unwrap().url, "/dev/ferry/web1");
    assert_eq!(
        request.repository.as_ref().unwrap().url,
        "s3://backups/site-a"
    );
    assert!(request.init_if_missing.is_some());
    assert_eq!(request.source_id, "vms/web1");
    assert_eq!(request.parent, "auto");
    assert_eq!(request.tags["vm"], "web1");
    assert_eq!(request.idempotency_key, "uid-b/backup");
    assert_eq!(calls[1], Call::Watch(job_id("uid-b/backup")));
    let Call::Start(JobRequest::Prune(prune)) = &calls[2] else {
        panic!("{calls:?}")
    };
    assert_eq!(prune.retention.as_ref().unwrap().keep_daily, 7);
    assert_eq!(prune.source_id, "vms/web1");
    assert_eq!(
        prune.repository.as_ref().unwrap().url,
        "s3://backups/site-a"
    );
    assert_eq!(calls[3], Call::Watch(job_id("uid-b/prune")));

    // 4. Succeeded is final: no repository lookup, no request.
    let object = with_status(&object, &json!({ "status": end }));
    h.pod_gone(ready(pod, "node-a"));
    let action = reconcile_backup(backup(&object), h.ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    h.server.done().await;
}

/// A backup the mover fails: Failed with the error's kind and message, the mover removed.
#[tokio::test]
async fn a_failed_backup_says_why() {
    let mut h = Harness::new(settings());
    let object = backup_json(Some(running_status()));
    h.pod_seen(ready(mover_pod(&object), "node-a"));
    let id = job_id("uid-b/backup");
    let mut failed = report(&id, JobState::Failed, MIB);
    failed.error = Some(JobFailure {
        kind: "permission_denied".into(),
        message: "s3://backups/site-a: access denied (check the key's policy)".into(),
    });
    h.link.script(&id, vec![failed]);
    let task = tokio::spawn(reconcile_backup(backup(&object), h.ctx.clone()));
    h.server
        .expect("GET", REPO, Reply::Ok(repository_json()))
        .await;
    h.server
        .expect(
            "GET",
            &format!("{SECRETS}/web1-now-fbk-1-token"),
            Reply::Ok(secret("web1-now-fbk-1-token", &["token"])),
        )
        .await;
    finish(task).await;
    let seen = h
        .server
        .expect("PATCH", B_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let end = &seen.body["status"];
    assert_eq!(end["phase"], "Failed");
    assert_eq!(
        end["message"],
        "backup permission_denied: s3://backups/site-a: access denied (check the key's policy)"
    );
    assert!(end.get("snapshotId").is_none());
    assert_eq!(condition(end, "Ready")["reason"], "Failed");
    mover_removed(&mut h).await;
    warning(&mut h.server, "Failed").await;
    h.ctx.take_watch("uid-b").unwrap().task.await.unwrap();
    h.server.done().await;
    assert_eq!(h.link.calls().len(), 2, "no prune after a failed backup");
}

/// A prune that fails after the backup was written: the Backup Succeeded all the same
/// (its snapshot is in the repository and restorable), with the prune's error recorded.
#[tokio::test]
async fn a_failed_prune_keeps_the_backup_succeeded() {
    let mut h = Harness::new(settings());
    let mut status = running_status();
    status["snapshotId"] = json!("20261202T030000Z-0a1b2c3d");
    let object = backup_json(Some(status));
    h.pod_seen(ready(mover_pod(&object), "node-a"));
    let id = job_id("uid-b/prune");
    let mut failed = report(&id, JobState::Failed, 0);
    failed.error = Some(JobFailure {
        kind: "invalid_input".into(),
        message: "the retention keeps nothing".into(),
    });
    h.link.script(&id, vec![failed]);
    let task = tokio::spawn(reconcile_backup(backup(&object), h.ctx.clone()));
    h.server
        .expect("GET", REPO, Reply::Ok(repository_json()))
        .await;
    h.server
        .expect(
            "GET",
            &format!("{SECRETS}/web1-now-fbk-1-token"),
            Reply::Ok(secret("web1-now-fbk-1-token", &["token"])),
        )
        .await;
    finish(task).await;
    let seen = h
        .server
        .expect("PATCH", B_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let end = &seen.body["status"];
    assert_eq!(end["phase"], "Succeeded");
    assert_eq!(end["snapshotId"], "20261202T030000Z-0a1b2c3d");
    assert_eq!(
        end["pruneError"],
        "prune invalid_input: the retention keeps nothing"
    );
    mover_removed(&mut h).await;
    assert_eq!(h.server.expect_event(NS).await.body["reason"], "Succeeded");
    h.ctx.take_watch("uid-b").unwrap().task.await.unwrap();
    h.server.done().await;
}

const REPO_B: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/backuprepositories/site-b";

/// The secondary repository: another bucket, its own credentials and key, created by the
/// first copy.
fn secondary_repository_json() -> Value {
    json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "BackupRepository",
        "metadata": {"name": "site-b", "namespace": NS, "uid": "uid-r2", "generation": 1},
        "spec": {
            "url": "s3://far-away/site-b",
            "s3": {"endpointUrl": "https://s3.far-away.example", "region": "eu-north-1",
                   "accessKeyId": {"name": "s3-b", "key": "id"},
                   "secretAccessKey": {"name": "s3-b", "key": "secret"}},
            "encryption": {"keySecretRef": {"name": "backup-key-b", "key": "passphrase"}},
            "initialize": true,
        },
    })
}

/// Backup `web1-now` after its backup and prune, with a secondary that keeps 12 monthly
/// snapshots, copied at 10 MiB/s at most on weekdays' office hours.
fn secondary_backup_json(status: Value) -> Value {
    let mut b = backup_json(Some(status));
    b["spec"]["secondary"] = json!({
        "repository": "site-b", "retain": {"monthly": 12},
        "rateLimit": 10 * MIB,
        "rateLimitWindows": [{"days": ["mon", "tue", "wed", "thu", "fri"],
                              "start": "08:00", "end": "18:00", "timeZone": "Europe/Oslo"}],
    });
    b
}

fn pruned_status() -> Value {
    let mut status = running_status();
    status["snapshotId"] = json!("20261202T030000Z-0a1b2c3d");
    status["pruned"] = json!(0);
    status["kept"] = json!(1);
    status
}

/// A reconcile of a Backup whose mover runs: both repositories looked up, the mover's
/// token read (by the `first` reconcile of this operator), then the scripted job followed
/// to the status write it ends in.
async fn secondary_step(h: &mut Harness, object: &Value, first: bool) -> Value {
    let task = tokio::spawn(reconcile_backup(backup(object), h.ctx.clone()));
    h.server
        .expect("GET", REPO, Reply::Ok(repository_json()))
        .await;
    h.server
        .expect("GET", REPO_B, Reply::Ok(secondary_repository_json()))
        .await;
    if first {
        h.server
            .expect(
                "GET",
                &format!("{SECRETS}/web1-now-fbk-1-token"),
                Reply::Ok(secret("web1-now-fbk-1-token", &["token"])),
            )
            .await;
    }
    finish(task).await;
    h.server
        .expect("PATCH", B_STATUS, Reply::ApplyStatus(object.clone()))
        .await
        .body["status"]
        .clone()
}

/// The mover removed at the end: its pod, token and NetworkPolicy.
async fn mover_removed(h: &mut Harness) {
    h.server
        .expect("DELETE", &format!("{PODS}/web1-now-fbk-1"), Reply::Deleted)
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{SECRETS}/web1-now-fbk-1-token"),
            Reply::Deleted,
        )
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{NETPOLS}/web1-now-fbk-1"),
            Reply::Deleted,
        )
        .await;
}

/// After the backup and its prune, the same mover copies the source's snapshots into the
/// secondary repository (created from the primary, the selection and the bandwidth
/// windows as the spec says), then prunes the secondary by its own rules; the status
/// says what each did.
#[tokio::test]
async fn a_backup_copies_into_its_secondary_then_prunes_there() {
    let mut h = Harness::new(settings());
    let object = secondary_backup_json(pruned_status());
    let pod = mover_pod(&object);
    let json = serde_json::to_value(&pod).unwrap();
    let projected: Vec<&str> = json["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "secrets")
        .unwrap()["projected"]["sources"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["secret"]["items"].as_array().unwrap())
        .map(|i| i["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        projected,
        [
            "backup-key/passphrase",
            "backup-key-b/passphrase",
            "s3/id",
            "s3/secret",
            "s3-b/id",
            "s3-b/secret"
        ],
        "both repositories' keys and credentials, as files"
    );
    h.pod_seen(ready(pod, "node-a"));
    let id = job_id("uid-b/sync");
    let mut synced = report(&id, JobState::Succeeded, 0);
    synced.sync = Some(SyncSummary {
        copied: 2,
        present: 1,
        chunks_copied: 40,
        bytes_copied: 9 * MIB,
        removed: 0,
    });
    h.link.script(&id, vec![synced]);
    let step = secondary_step(&mut h, &object, true).await;
    assert_eq!(
        step["phase"], "Running",
        "the secondary's prune is still to run"
    );
    assert_eq!(
        step["secondary"],
        json!({"repository": "site-b", "snapshotsCopied": 2, "snapshotsPresent": 1,
               "chunksCopied": 40, "bytesCopied": 9 * MIB, "snapshotsRemoved": 0})
    );
    let event = h.server.expect_event(NS).await.body;
    assert_eq!(event["reason"], "StepSucceeded");
    assert_eq!(
        event["note"],
        "sync copied 2 snapshots (40 chunks, 9437184 bytes); pruning the secondary repository site-b"
    );
    h.ctx.take_watch("uid-b").unwrap().task.await.unwrap();
    h.server.done().await;

    let object = with_status(&object, &json!({ "status": step }));
    let id = job_id("uid-b/prune-secondary");
    let mut pruned = report(&id, JobState::Succeeded, 0);
    pruned.prune = Some(PruneSummary {
        kept: 12,
        removed: 3,
        removed_ids: Vec::new(),
        kept_ids: Vec::new(),
    });
    h.link.script(&id, vec![pruned]);
    let end = secondary_step(&mut h, &object, false).await;
    assert_eq!(end["phase"], "Succeeded");
    assert_eq!(end["secondary"]["pruned"], 3);
    assert_eq!(end["pruned"], 0, "the primary's prune stays as it was");
    assert!(end["prunedSnapshots"].is_null(), "{end}");
    mover_removed(&mut h).await;
    assert_eq!(h.server.expect_event(NS).await.body["reason"], "Succeeded");
    h.ctx.take_watch("uid-b").unwrap().task.await.unwrap();
    h.server.done().await;

    let calls = h.link.calls();
    let Call::Start(JobRequest::Sync(sync)) = &calls[0] else {
        panic!("{calls:?}")
    };
    let (src, dst) = (
        sync.source.as_ref().unwrap(),
        sync.destination.as_ref().unwrap(),
    );
    assert_eq!(src.url, "s3://backups/site-a");
    assert_eq!(dst.url, "s3://far-away/site-b");
    assert_eq!(dst.s3.as_ref().unwrap().region, "eu-north-1");
    assert!(
        format!("{:?}", dst.key).contains("backup-key-b/passphrase"),
        "the secondary's key, as a file: {:?}",
        dst.key
    );
    assert_eq!(sync.source_id, "vms/web1");
    assert_eq!(sync.retention.as_ref().unwrap().keep_monthly, 12);
    assert_eq!(sync.rate_limit, 10 * MIB);
    assert_eq!(sync.rate_limit_windows.len(), 1);
    assert_eq!(sync.rate_limit_windows[0].time_zone, "Europe/Oslo");
    assert_eq!(sync.rate_limit_windows[0].days.len(), 5);
    assert!(sync.init_destination_if_missing && !sync.remove_vanished);
    assert_eq!(sync.idempotency_key, "uid-b/sync");
    let Call::Start(JobRequest::Prune(prune)) = &calls[2] else {
        panic!("{calls:?}")
    };
    assert_eq!(
        prune.repository.as_ref().unwrap().url,
        "s3://far-away/site-b"
    );
    assert_eq!(prune.retention.as_ref().unwrap().keep_monthly, 12);
    assert_eq!(prune.idempotency_key, "uid-b/prune-secondary");
    assert_eq!(calls.len(), 4, "{calls:?}");
}

/// The secondary unreachable: the Backup Succeeded all the same (its snapshot is in the
/// primary), the copy's error recorded, no prune of the secondary, no new mover.
#[tokio::test]
async fn a_failed_copy_into_the_secondary_keeps_the_backup_succeeded() {
    let mut h = Harness::new(settings());
    let object = secondary_backup_json(pruned_status());
    h.pod_seen(ready(mover_pod(&object), "node-a"));
    let id = job_id("uid-b/sync");
    let mut failed = report(&id, JobState::Failed, 0);
    failed.error = Some(JobFailure {
        kind: "timeout".into(),
        message: "s3://far-away/site-b: no answer in 30 s".into(),
    });
    h.link.script(&id, vec![failed]);
    let end = secondary_step(&mut h, &object, true).await;
    assert_eq!(end["phase"], "Succeeded");
    assert_eq!(
        end["secondary"]["error"],
        "sync timeout: s3://far-away/site-b: no answer in 30 s"
    );
    assert!(end["secondary"]["pruned"].is_null());
    mover_removed(&mut h).await;
    assert_eq!(h.server.expect_event(NS).await.body["reason"], "Succeeded");
    h.ctx.take_watch("uid-b").unwrap().task.await.unwrap();
    h.server.done().await;
    assert_eq!(h.link.calls().len(), 2, "{:?}", h.link.calls());
}

/// A failed prune of the primary does not keep the copy from running.
#[tokio::test]
async fn a_failed_prune_still_copies_into_the_secondary() {
    let mut h = Harness::new(settings());
    let mut status = pruned_status();
    status.as_object_mut().unwrap().remove("pruned");
    status.as_object_mut().unwrap().remove("kept");
    let object = secondary_backup_json(status);
    h.pod_seen(ready(mover_pod(&object), "node-a"));
    let id = job_id("uid-b/prune");
    let mut failed = report(&id, JobState::Failed, 0);
    failed.error = Some(JobFailure {
        kind: "invalid_input".into(),
        message: "the repository is locked by another prune".into(),
    });
    h.link.script(&id, vec![failed]);
    let step = secondary_step(&mut h, &object, true).await;
    assert_eq!(step["phase"], "Running");
    assert_eq!(
        step["pruneError"],
        "prune invalid_input: the repository is locked by another prune"
    );
    let event = h.server.expect_event(NS).await.body;
    assert_eq!(
        event["note"],
        "prune invalid_input: the repository is locked by another prune; copying the snapshots into the secondary repository site-b"
    );
    h.ctx.take_watch("uid-b").unwrap().task.await.unwrap();
    h.server.done().await;
}

/// A secondary that names no existing repository: InvalidSpec, before any mover.
#[tokio::test]
async fn a_missing_secondary_repository_is_an_invalid_spec() {
    let mut h = Harness::new(settings());
    let mut object = secondary_backup_json(json!({}));
    object.as_object_mut().unwrap().remove("status");
    let task = tokio::spawn(reconcile_backup(backup(&object), h.ctx.clone()));
    h.server
        .expect("GET", REPO, Reply::Ok(repository_json()))
        .await;
    h.server.expect("GET", REPO_B, Reply::NotFound).await;
    let seen = h
        .server
        .expect("PATCH", B_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let failed = &seen.body["status"];
    assert_eq!(failed["phase"], "Failed");
    assert_eq!(condition(failed, "Ready")["reason"], "InvalidSpec");
    assert_eq!(
        failed["message"],
        "spec.secondary.repository: BackupRepository 'site-b' does not exist in this namespace: create it, or fix the name: fix the spec and create the Backup again"
    );
    h.server.expect_event(NS).await;
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
    assert!(h.link.calls().is_empty());
}

/// A Backup naming no existing repository, and one whose repository has a password in
/// its URL: Failed (InvalidSpec) with what to fix, the password never repeated.
#[tokio::test]
async fn a_missing_or_invalid_repository_is_an_invalid_spec() {
    let mut h = Harness::new(settings());
    let object = backup_json(None);
    let task = tokio::spawn(reconcile_backup(backup(&object), h.ctx.clone()));
    h.server.expect("GET", REPO, Reply::NotFound).await;
    let seen = h
        .server
        .expect("PATCH", B_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let failed = &seen.body["status"];
    assert_eq!(failed["phase"], "Failed");
    assert_eq!(condition(failed, "Ready")["reason"], "InvalidSpec");
    assert_eq!(
        failed["message"],
        "spec.repository: BackupRepository 'site-a' does not exist in this namespace: create it, or fix the name: fix the spec and create the Backup again"
    );
    h.server.expect_event(NS).await;
    assert_eq!(finish(task).await, Action::await_change());

    let mut h = Harness::new(settings());
    let mut repo = repository_json();
    repo["spec"]["url"] = json!("s3://AKIAEXAMPLE:hunter2@backups/site-a");
    let task = tokio::spawn(reconcile_backup(backup(&object), h.ctx.clone()));
    h.server.expect("GET", REPO, Reply::Ok(repo)).await;
    let seen = h
        .server
        .expect("PATCH", B_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let message = seen.body["status"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("password inside the URL"), "{message}");
    let event = h.server.expect_event(NS).await;
    for text in [seen.body.to_string(), event.body.to_string()] {
        assert!(!text.contains("hunter2"), "{text}");
    }
    finish(task).await;
    h.server.done().await;
    assert!(h.link.calls().is_empty());
}

/// A repository with its Secrets is Ready; with a key missing it says which.
#[tokio::test]
async fn a_repository_reports_whether_it_can_be_used() {
    let mut h = Harness::new(settings());
    let object = repository_json();
    let repo: Arc<BackupRepository> = Arc::new(serde_json::from_value(object.clone()).unwrap());
    let task = tokio::spawn(reconcile_repository(repo.clone(), h.ctx.clone()));
    h.server
        .expect(
            "GET",
            &format!("{SECRETS}/backup-key"),
            Reply::Ok(secret("backup-key", &["passphrase"])),
        )
        .await;
    h.server
        .expect(
            "GET",
            &format!("{SECRETS}/s3"),
            Reply::Ok(secret("s3", &["id"])),
        )
        .await;
    let path = "/apis/ferry.dev/v1alpha1/namespaces/vms/backuprepositories/site-a/status";
    let seen = h
        .server
        .expect("PATCH", path, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(status["encrypted"], true);
    let ready = condition(&status, "Ready");
    assert_eq!(
        (ready["status"].clone(), ready["reason"].clone()),
        (json!("False"), json!("SecretMissing"))
    );
    assert_eq!(
        status["message"],
        "secret/s3 has no key 'secret': add it, or fix the secretKeyRef's key"
    );
    h.server.expect_event(NS).await;
    finish(task).await;

    let object = with_status(&object, &json!({ "status": status }));
    let repo: Arc<BackupRepository> = Arc::new(serde_json::from_value(object.clone()).unwrap());
    let task = tokio::spawn(reconcile_repository(repo, h.ctx.clone()));
    h.server
        .expect(
            "GET",
            &format!("{SECRETS}/backup-key"),
            Reply::Ok(secret("backup-key", &["passphrase"])),
        )
        .await;
    h.server
        .expect(
            "GET",
            &format!("{SECRETS}/s3"),
            Reply::Ok(secret("s3", &["id", "secret"])),
        )
        .await;
    let seen = h
        .server
        .expect("PATCH", path, Reply::ApplyStatus(object.clone()))
        .await;
    let ready = condition(&seen.body["status"], "Ready").clone();
    assert_eq!(
        (ready["status"].clone(), ready["reason"].clone()),
        (json!("True"), json!("Valid"))
    );
    finish(task).await;
    h.server.done().await;
}

/// A Restore of a Backup: the Backup's repository and snapshot looked up, the restore job
/// on the mover with the target claim, Succeeded with the snapshot id.
#[tokio::test]
async fn a_restore_writes_the_backups_snapshot_into_the_claim() {
    let mut h = Harness::new(settings());
    let mut status = running_status();
    status["moverPod"] = json!("web1-copy-frs-1");
    let object = json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Restore",
        "metadata": {"name": "web1-copy", "namespace": NS, "uid": "uid-r1", "generation": 1,
                     "resourceVersion": "9", "finalizers": ["ferry.dev/cancel"]},
        "spec": {"backup": "web1-now", "targetPVC": "web1-copy"},
        "status": status,
    });
    let restore: Arc<Restore> = Arc::new(serde_json::from_value(object.clone()).unwrap());
    let repo: BackupRepository = serde_json::from_value(repository_json()).unwrap();
    let pod = restore_pod(
        restore.as_ref(),
        "Restore",
        &repo.spec,
        "web1-copy",
        None,
        &MoverPodInput {
            pod_name: "web1-copy-frs-1",
            token_secret: "web1-copy-frs-1-token",
            pvcs: &[ResolvedPvc::new("web1-copy", VolumeMode::Filesystem)],
            defaults: &settings().mover,
            assigned_ids: false,
            tls: true,
        },
    )
    .unwrap();
    let volumes = serde_json::to_value(&pod.spec.as_ref().unwrap().volumes).unwrap();
    assert!(
        volumes.to_string().contains("backup-key/passphrase"),
        "{volumes}"
    );
    h.pod_seen(ready(pod, "node-a"));
    let id = job_id("uid-r1/restore");
    h.link
        .script(&id, vec![report(&id, JobState::Succeeded, 4 * MIB)]);
    let task = tokio::spawn(reconcile_restore(restore, h.ctx.clone()));
    let mut done = backup_json(None);
    done["status"] = json!({"phase": "Succeeded", "snapshotId": "20261202T030000Z-0a1b2c3d"});
    h.server
        .expect("GET", &format!("{BACKUPS}/web1-now"), Reply::Ok(done))
        .await;
    h.server
        .expect("GET", REPO, Reply::Ok(repository_json()))
        .await;
    let path = "/apis/ferry.dev/v1alpha1/namespaces/vms/ferryrestores/web1-copy/status";
    let seen = h
        .server
        .expect("PATCH", path, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(seen.body["status"]["moverPod"], "web1-copy-frs-1");
    h.server.expect_event(NS).await;
    h.server
        .expect(
            "GET",
            &format!("{SECRETS}/web1-copy-frs-1-token"),
            Reply::Ok(secret("web1-copy-frs-1-token", &["token"])),
        )
        .await;
    finish(task).await;
    let seen = h
        .server
        .expect("PATCH", path, Reply::ApplyStatus(object.clone()))
        .await;
    let end = &seen.body["status"];
    assert_eq!(end["phase"], "Succeeded");
    assert_eq!(end["snapshotId"], "20261202T030000Z-0a1b2c3d");
    h.server
        .expect("DELETE", &format!("{PODS}/web1-copy-frs-1"), Reply::Deleted)
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{SECRETS}/web1-copy-frs-1-token"),
            Reply::Deleted,
        )
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{NETPOLS}/web1-copy-frs-1"),
            Reply::Deleted,
        )
        .await;
    assert_eq!(h.server.expect_event(NS).await.body["reason"], "Succeeded");
    h.ctx.take_watch("uid-r1").unwrap().task.await.unwrap();
    h.server.done().await;
    let calls = h.link.calls();
    let Call::Start(JobRequest::Restore(request)) = &calls[0] else {
        panic!("{calls:?}")
    };
    assert_eq!(request.snapshot_id, "20261202T030000Z-0a1b2c3d");
    assert_eq!(
        request.target.as_ref().unwrap().url,
        "/var/run/ferry/volumes/web1-copy/disk.img"
    );
    assert_eq!(
        request.repository.as_ref().unwrap().url,
        "s3://backups/site-a"
    );
    assert_eq!(request.idempotency_key, "uid-r1/restore");
}

// ---- schedules ----

/// A clock the test sets.
#[derive(Debug)]
struct TestClock(Mutex<DateTime<Utc>>);

impl Clock for TestClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock()
    }
}

fn at(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .with_timezone(&Utc)
}

struct Sched {
    server: ApiServer,
    clock: Arc<TestClock>,
    ctx: Arc<schedule::Context>,
}

impl Sched {
    fn new(now: &str) -> Self {
        let (client, server) = ApiServer::new();
        let clock = Arc::new(TestClock(Mutex::new(at(now))));
        let ctx = Arc::new(schedule::Context::new(client, clock.clone()));
        Self { server, clock, ctx }
    }

    fn set(&self, now: &str) {
        *self.clock.0.lock() = at(now);
    }
}

/// Schedule `nightly`: web1 at 03:00 UTC, 7 dailies kept.
fn schedule_json(status: Option<Value>) -> Value {
    let mut s = json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "BackupSchedule",
        "metadata": {"name": "nightly", "namespace": NS, "uid": "uid-s", "generation": 1},
        "spec": {"sourcePVC": "web1", "repository": "site-a",
                 "trigger": {"schedule": "0 3 * * *"}, "retain": {"daily": 7}},
    });
    if let Some(status) = status {
        s["status"] = status;
    }
    s
}

fn sched(v: &Value) -> Arc<BackupSchedule> {
    Arc::new(serde_json::from_value(v.clone()).unwrap())
}

fn list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "BackupList", "metadata": {},
           "items": items})
}

/// A Backup of the schedule in `phase`.
fn scheduled_backup(name: &str, phase: &str, extra: Value) -> Value {
    let mut b = json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Backup",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"),
                     "labels": {"ferry.dev/schedule": "nightly"},
                     "ownerReferences": [{"apiVersion": "ferry.dev/v1alpha1",
                                          "kind": "BackupSchedule", "name": "nightly",
                                          "uid": "uid-s", "controller": true}],
                     "creationTimestamp": "2026-12-02T03:00:01Z"},
        "spec": {"sourcePVC": "web1", "repository": "site-a"},
        "status": {"phase": phase},
    });
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            b["status"][k] = v;
        }
    }
    b
}

async fn looked_up(s: &mut Sched, backups: Vec<Value>) {
    s.server
        .expect("GET", REPO, Reply::Ok(repository_json()))
        .await;
    let seen = s
        .server
        .expect("GET", BACKUPS, Reply::Ok(list(backups)))
        .await;
    assert!(
        seen.query
            .contains("labelSelector=ferry.dev%2Fschedule%3Dnightly"),
        "{}",
        seen.query
    );
}

fn synchronizing(status: &Value) -> (String, String) {
    let c = condition(status, "Synchronizing");
    (
        c["status"].as_str().unwrap().to_string(),
        c["reason"].as_str().unwrap().to_string(),
    )
}

/// The schedule waits for its fire time, fires one Backup (retain copied into it, so its
/// mover prunes after the backup), fires nothing while that Backup runs even past the
/// next fire time, records how it ended, then fires the missed fire once.
#[tokio::test]
async fn a_schedule_fires_without_overlap_and_records_each_backup() {
    let mut s = Sched::new("2026-12-02T02:30:00Z");

    // 1. Before the first fire: nextSyncTime, waiting.
    let object = schedule_json(None);
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![]).await;
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(status["nextSyncTime"], "2026-12-02T03:00:00Z");
    assert_eq!(
        synchronizing(&status),
        ("False".into(), "WaitingForSchedule".into())
    );
    assert_eq!(
        finish(task).await,
        Action::requeue(Duration::from_secs(1800))
    );
    s.server.done().await;

    // 2. The fire time passed: one Backup, owned by the schedule.
    s.set("2026-12-02T03:00:05Z");
    let object = schedule_json(Some(status));
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![]).await;
    let created = s.server.expect("POST", BACKUPS, Reply::Echo).await.body;
    assert_eq!(created["metadata"]["name"], "nightly-20261202030000");
    assert_eq!(
        created["metadata"]["labels"]["ferry.dev/schedule"],
        "nightly"
    );
    assert_eq!(created["metadata"]["ownerReferences"][0]["uid"], "uid-s");
    assert_eq!(
        created["metadata"]["ownerReferences"][0]["controller"],
        true
    );
    assert_eq!(created["spec"]["sourcePVC"], "web1");
    assert_eq!(created["spec"]["sourceId"], "vms/web1");
    assert_eq!(created["spec"]["retain"], json!({"daily": 7}));
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(status["lastBackup"], "nightly-20261202030000");
    assert_eq!(status["nextSyncTime"], "2026-12-03T03:00:00Z");
    assert_eq!(
        synchronizing(&status),
        ("True".into(), "BackupRunning".into())
    );
    let event = s.server.expect_event(NS).await.body;
    assert_eq!(event["reason"], "BackupCreated");
    // kube's recorder sends a repeat of the same reason on the same object as a patch.
    let repeat = format!(
        "/apis/events.k8s.io/v1/namespaces/vms/events/{}",
        event["metadata"]["name"].as_str().unwrap()
    );
    let wait = finish(task).await;
    assert_eq!(wait, Action::requeue(Duration::from_secs(3600)));
    s.server.done().await;

    // 3. Past the next fire time while the Backup still runs: nothing fires.
    s.set("2026-12-03T03:00:10Z");
    let object = schedule_json(Some(status));
    let running = scheduled_backup("nightly-20261202030000", "Running", json!({}));
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![running]).await;
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(
        synchronizing(&status),
        ("True".into(), "BackupRunning".into())
    );
    assert!(condition(&status, "Synchronizing")["message"]
        .as_str()
        .unwrap()
        .contains("the next fire waits for it"));
    finish(task).await;
    s.server.done().await;

    // 4. It succeeded: recorded; the missed fire fires once, now.
    s.set("2026-12-03T03:20:00Z");
    let object = schedule_json(Some(status));
    let done = scheduled_backup(
        "nightly-20261202030000",
        "Succeeded",
        json!({"snapshotId": "20261202T030002Z-0a1b2c3d",
               "startTime": "2026-12-02T03:00:02Z", "completionTime": "2026-12-03T04:01:05Z"}),
    );
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![done]).await;
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "BackupSucceeded"
    );
    let created = s.server.expect("POST", BACKUPS, Reply::Echo).await.body;
    assert_eq!(created["metadata"]["name"], "nightly-20261203030000");
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(status["lastSnapshot"], "20261202T030002Z-0a1b2c3d");
    assert_eq!(status["lastSyncTime"], "2026-12-03T04:01:05Z");
    assert_eq!(status["lastSyncDuration"], "25h1m3s");
    assert_eq!(status["lastBackup"], "nightly-20261203030000");
    assert_eq!(status["nextSyncTime"], "2026-12-04T03:00:00Z");
    s.server.expect("PATCH", &repeat, Reply::Echo).await;
    finish(task).await;
    s.server.done().await;
}

/// A schedule's secondary goes into each Backup it fires; a Backup whose copy failed is
/// a warning and the schedule's secondaryError, a later one that copied clears it and
/// becomes lastSecondarySnapshot.
#[tokio::test]
async fn a_schedule_copies_into_its_secondary_and_reports_failed_copies() {
    let mut s = Sched::new("2026-12-02T03:00:05Z");
    let secondary = json!({"repository": "site-b", "removeVanished": true});
    let mut object = schedule_json(Some(json!({"nextSyncTime": "2026-12-02T03:00:00Z",
                                                "observedGeneration": 1})));
    object["spec"]["secondary"] = secondary.clone();
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![]).await;
    let created = s.server.expect("POST", BACKUPS, Reply::Echo).await.body;
    assert_eq!(created["spec"]["secondary"], secondary);
    let status = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await
        .body["status"]
        .clone();
    s.server.expect_event(NS).await;
    finish(task).await;
    s.server.done().await;

    // It succeeded, but its copy failed: a warning, the schedule's secondaryError.
    s.set("2026-12-02T03:30:00Z");
    let object = with_status(&object, &json!({ "status": status }));
    let failed_copy = json!({"repository": "site-b", "snapshotsCopied": 0,
                             "error": "sync timeout: s3://far-away/site-b: no answer in 30 s"});
    let done = scheduled_backup(
        "nightly-20261202030000",
        "Succeeded",
        json!({"snapshotId": "20261202T030002Z-0a1b2c3d", "secondary": failed_copy,
               "completionTime": "2026-12-02T03:10:00Z"}),
    );
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![done]).await;
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "BackupSucceeded"
    );
    let event = warning(&mut s.server, "SecondaryCopyFailed").await;
    assert_eq!(
        event["note"],
        "Backup nightly-20261202030000's copy into the secondary repository: sync timeout: s3://far-away/site-b: no answer in 30 s"
    );
    let status = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await
        .body["status"]
        .clone();
    assert_eq!(
        status["secondaryError"],
        "sync timeout: s3://far-away/site-b: no answer in 30 s"
    );
    assert!(status["lastSecondarySnapshot"].is_null(), "{status}");
    finish(task).await;
    s.server.done().await;

    // A later one (run by hand) copied (its own snapshot and the one before): the error cleared.
    let object = with_status(&object, &json!({ "status": status }));
    let next = scheduled_backup(
        "nightly-20261202033000",
        "Succeeded",
        json!({"snapshotId": "20261202T033002Z-0b1b2c3d",
               "secondary": {"repository": "site-b", "snapshotsCopied": 2},
               "completionTime": "2026-12-02T03:35:00Z"}),
    );
    // A new operator: kube's recorder would send this BackupSucceeded as a series patch.
    let mut s = Sched::new("2026-12-02T03:40:00Z");
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![next]).await;
    s.server.expect_event(NS).await;
    let status = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await
        .body["status"]
        .clone();
    assert!(status["secondaryError"].is_null(), "{status}");
    assert_eq!(status["lastSecondarySnapshot"], "20261202T033002Z-0b1b2c3d");
    finish(task).await;
    s.server.done().await;
}

/// A paused schedule fires nothing, even past its fire time, and shows no next time.
#[tokio::test]
async fn a_paused_schedule_does_not_fire() {
    let mut s = Sched::new("2026-12-02T05:00:00Z");
    let mut object = schedule_json(Some(json!({"nextSyncTime": "2026-12-02T03:00:00Z",
                                                "observedGeneration": 1})));
    object["spec"]["paused"] = json!(true);
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![]).await;
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = &seen.body["status"];
    assert!(status.get("nextSyncTime").is_none(), "{status}");
    assert_eq!(synchronizing(status), ("False".into(), "Paused".into()));
    assert_eq!(finish(task).await, Action::await_change());
    s.server.done().await;
}

/// The schedule's source claim: Block, 20Gi of class fast.
fn web1_claim() -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "web1", "namespace": NS},
           "spec": {"volumeMode": "Block", "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "fast",
                    "resources": {"requests": {"storage": "20Gi"}}}})
}

const GROUPS: &str =
    "/apis/groupsnapshot.storage.k8s.io/v1beta1/namespaces/vms/volumegroupsnapshots";
const GROUP_CONTENTS: &str =
    "/apis/groupsnapshot.storage.k8s.io/v1beta1/volumegroupsnapshotcontents";
const SNAPSHOT_CONTENTS: &str = "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents";
const PVS: &str = "/api/v1/persistentvolumes";

/// Schedule `name` of claim `claim` in the volume group `db` (claims labelled app=db).
fn group_schedule_json(name: &str, uid: &str, claim: &str) -> Value {
    let mut object = schedule_json(Some(json!({"nextSyncTime": "2026-12-02T03:00:00Z",
                                                "observedGeneration": 1})));
    object["metadata"]["name"] = json!(name);
    object["metadata"]["uid"] = json!(uid);
    object["spec"]["sourcePVC"] = json!(claim);
    object["spec"]["copyMethod"] = json!("Snapshot");
    object["spec"]["volumeGroup"] = json!({"name": "db", "selector": {"app": "db"},
                                           "volumeGroupSnapshotClassName": "csi-group"});
    object
}

fn db_claim(name: &str, volume: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": name, "namespace": NS, "labels": {"app": "db"}},
           "spec": {"volumeMode": "Block", "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "fast", "volumeName": volume,
                    "resources": {"requests": {"storage": "20Gi"}}}})
}

fn csi_volume(name: &str, handle: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
           "spec": {"csi": {"driver": "hostpath.csi.k8s.io", "volumeHandle": handle}}})
}

/// A member VolumeSnapshot of group snapshot `group`, as the snapshot controller makes it.
fn member_snapshot(name: &str, group: &str, content: &str) -> Value {
    json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
           "metadata": {"name": name, "namespace": NS, "resourceVersion": "7",
                        "finalizers": ["snapshot.storage.kubernetes.io/volumesnapshot-bound-protection",
                                       "snapshot.storage.kubernetes.io/volumesnapshot-in-group-protection"],
                        "ownerReferences": [{"apiVersion": "groupsnapshot.storage.k8s.io/v1beta1",
                                             "kind": "VolumeGroupSnapshot", "name": group,
                                             "uid": "uid-g"}]},
           "spec": {"source": {"volumeSnapshotContentName": content}},
           "status": {"volumeGroupSnapshotName": group, "boundVolumeSnapshotContentName": content,
                      "readyToUse": true, "restoreSize": "21Gi"}})
}

fn snapshot_list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotList",
           "metadata": {}, "items": items})
}

/// The start of a group schedule's fire pass: its repository, Backups and claim read, no
/// own snapshot of an earlier fallback, no member of `group` handed out yet.
async fn group_pass_start(s: &mut Sched, claim: &str, volume: &str, group: &str) {
    s.server
        .expect("GET", REPO, Reply::Ok(repository_json()))
        .await;
    s.server
        .expect("GET", BACKUPS, Reply::Ok(list(vec![])))
        .await;
    s.server
        .expect(
            "GET",
            &format!("{PVCS}/{claim}"),
            Reply::Ok(db_claim(claim, volume)),
        )
        .await;
    s.server
        .expect(
            "GET",
            &format!("{SNAPSHOTS}/{claim}-20261202030000"),
            Reply::NotFound,
        )
        .await;
    let seen = s
        .server
        .expect("GET", SNAPSHOTS, Reply::Ok(snapshot_list(vec![])))
        .await;
    let by_group = format!("labelSelector=ferry.dev%2Fvolume-group-snapshot%3D{group}");
    assert!(seen.query.contains(&by_group), "{}", seen.query);
}

fn group_list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1beta1",
           "kind": "VolumeGroupSnapshotList", "metadata": {}, "items": items})
}

/// volumeGroup: the first schedule of the group to fire creates the VolumeGroupSnapshot
/// over the app's claims; once ready, it sets the group's content to Retain, matches each
/// member to its claim through the CSI handles, hands every member out (labelled), deletes
/// the group snapshot (orphaning its members) and its content, retires what an earlier
/// fire left, and backs its claim up from its member; the other claim's schedule finds its
/// member handed out and backs up from it: one instant for both.
#[tokio::test]
async fn schedules_of_a_volume_group_back_up_from_one_group_snapshot() {
    let mut s = Sched::new("2026-12-02T03:00:05Z");
    let data = group_schedule_json("db-data", "uid-d", "db-data");
    let group_name = "db-20261202030000";
    let data_status = "/apis/ferry.dev/v1alpha1/namespaces/vms/backupschedules/db-data/status";

    // 1. No group snapshot yet: the kind is served; created over the selector, marked
    //    with its maker; not ready: pending.
    let task = tokio::spawn(schedule::reconcile(sched(&data), s.ctx.clone()));
    group_pass_start(&mut s, "db-data", "pv-1", group_name).await;
    s.server
        .expect("GET", &format!("{GROUPS}/{group_name}"), Reply::NotFound)
        .await;
    s.server
        .expect("GET", SNAPSHOTS, Reply::Ok(snapshot_list(vec![])))
        .await;
    s.server
        .expect("GET", GROUPS, Reply::Ok(group_list(vec![])))
        .await;
    let group = s.server.expect("POST", GROUPS, Reply::Echo).await.body;
    assert_eq!(group["metadata"]["name"], group_name);
    assert_eq!(group["metadata"]["labels"]["ferry.dev/volume-group"], "db");
    assert_eq!(
        group["metadata"]["annotations"]["ferry.dev/made-by"],
        "uid-d"
    );
    assert!(
        group["metadata"].get("ownerReferences").is_none(),
        "shared by the group's schedules"
    );
    assert_eq!(
        group["spec"],
        json!({"source": {"selector": {"matchLabels": {"app": "db"}}},
               "volumeGroupSnapshotClassName": "csi-group"})
    );
    let pending = s
        .server
        .expect("PATCH", data_status, Reply::ApplyStatus(data.clone()))
        .await
        .body["status"]
        .clone();
    assert_eq!(
        synchronizing(&pending),
        ("True".into(), "SnapshotPending".into())
    );
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    s.server.done().await;

    // 2. Ready: its content set to Retain, the members matched and handed out, the group
    //    snapshot and its content deleted, the last fire's leftovers retired, then the
    //    temporary claim from this claim's member and the Backup.
    let data = with_status(&data, &json!({ "status": pending }));
    let task = tokio::spawn(schedule::reconcile(sched(&data), s.ctx.clone()));
    group_pass_start(&mut s, "db-data", "pv-1", group_name).await;
    let mut ready = group.clone();
    ready["metadata"]["creationTimestamp"] = json!("2026-12-02T03:00:05Z");
    ready["status"] = json!({"readyToUse": true, "creationTime": "2026-12-02T03:00:06Z",
                             "boundVolumeGroupSnapshotContentName": "groupcontent-1"});
    s.server
        .expect("GET", &format!("{GROUPS}/{group_name}"), Reply::Ok(ready))
        .await;
    s.server
        .expect(
            "GET",
            &format!("{GROUP_CONTENTS}/groupcontent-1"),
            Reply::Ok(json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1beta1",
                             "kind": "VolumeGroupSnapshotContent",
                             "metadata": {"name": "groupcontent-1"},
                             "spec": {"volumeGroupSnapshotRef": {"namespace": NS, "name": group_name}},
                             "status": {"volumeSnapshotHandlePairList": [
                                 {"volumeHandle": "h-wal", "snapshotHandle": "s-wal"},
                                 {"volumeHandle": "h-data", "snapshotHandle": "s-data"}]}})),
        )
        .await;
    let retain = s
        .server
        .expect(
            "PATCH",
            &format!("{GROUP_CONTENTS}/groupcontent-1"),
            Reply::Echo,
        )
        .await
        .body;
    assert_eq!(
        retain,
        json!({"spec": {"deletionPolicy": "Retain"}}),
        "first"
    );
    let seen = s
        .server
        .expect(
            "GET",
            PVCS,
            Reply::Ok(
                json!({"apiVersion": "v1", "kind": "PersistentVolumeClaimList",
                             "metadata": {},
                             "items": [db_claim("db-data", "pv-1"), db_claim("db-wal", "pv-2")]}),
            ),
        )
        .await;
    assert!(
        seen.query.contains("labelSelector=app%3Ddb"),
        "{}",
        seen.query
    );
    s.server
        .expect(
            "GET",
            &format!("{PVS}/pv-1"),
            Reply::Ok(csi_volume("pv-1", "h-data")),
        )
        .await;
    s.server
        .expect(
            "GET",
            &format!("{PVS}/pv-2"),
            Reply::Ok(csi_volume("pv-2", "h-wal")),
        )
        .await;
    let other = json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                       "metadata": {"name": "someone-elses", "namespace": NS},
                       "status": {"readyToUse": true}});
    s.server
        .expect(
            "GET",
            SNAPSHOTS,
            Reply::Ok(snapshot_list(vec![
                member_snapshot("snapshot-wal", group_name, "vsc-wal"),
                other,
                member_snapshot("snapshot-data", group_name, "vsc-data"),
            ])),
        )
        .await;
    for (content, handle) in [("vsc-wal", "s-wal"), ("vsc-data", "s-data")] {
        s.server
            .expect(
                "GET",
                &format!("{SNAPSHOT_CONTENTS}/{content}"),
                Reply::Ok(json!({"apiVersion": "snapshot.storage.k8s.io/v1",
                                 "kind": "VolumeSnapshotContent", "metadata": {"name": content},
                                 "status": {"snapshotHandle": handle}})),
            )
            .await;
    }
    for (member, claim) in [("snapshot-wal", "db-wal"), ("snapshot-data", "db-data")] {
        let patch = s
            .server
            .expect("PATCH", &format!("{SNAPSHOTS}/{member}"), Reply::Echo)
            .await
            .body;
        assert_eq!(
            patch["metadata"]["labels"],
            json!({"ferry.dev/volume-group": "db", "ferry.dev/volume-group-snapshot": group_name})
        );
        assert_eq!(
            patch["metadata"]["annotations"]["ferry.dev/snapshot-of"],
            claim
        );
        assert_eq!(patch["metadata"]["ownerReferences"], json!([]));
        assert!(
            patch["metadata"].get("finalizers").is_none(),
            "the snapshot controller's to remove: {patch}"
        );
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
    }
    let deleted = s
        .server
        .expect("DELETE", &format!("{GROUPS}/{group_name}"), Reply::Deleted)
        .await;
    assert!(
        deleted.body.to_string().contains("Orphan") || deleted.query.contains("Orphan"),
        "the members orphaned, not deleted: {} {}",
        deleted.query,
        deleted.body
    );
    s.server
        .expect(
            "DELETE",
            &format!("{GROUP_CONTENTS}/groupcontent-1"),
            Reply::Deleted,
        )
        .await;
    // What the fire before left: a group snapshot never handed out (deleted with its
    // content, which names it back), one not made by the operator (kept), and an
    // unclaimed member (deleted).
    let older = "db-20261201030000";
    let seen = s
        .server
        .expect(
            "GET",
            GROUPS,
            Reply::Ok(group_list(vec![
                json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1beta1",
                       "kind": "VolumeGroupSnapshot",
                       "metadata": {"name": older, "namespace": NS,
                                    "annotations": {"ferry.dev/made-by": "uid-w"}},
                       "status": {"boundVolumeGroupSnapshotContentName": "groupcontent-0"}}),
                json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1beta1",
                       "kind": "VolumeGroupSnapshot",
                       "metadata": {"name": "db-20261130030000", "namespace": NS}}),
            ])),
        )
        .await;
    assert!(
        seen.query
            .contains("labelSelector=ferry.dev%2Fvolume-group%3Ddb"),
        "{}",
        seen.query
    );
    s.server
        .expect("DELETE", &format!("{GROUPS}/{older}"), Reply::Deleted)
        .await;
    s.server
        .expect(
            "GET",
            &format!("{GROUP_CONTENTS}/groupcontent-0"),
            Reply::Ok(json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1beta1",
                             "kind": "VolumeGroupSnapshotContent",
                             "metadata": {"name": "groupcontent-0"},
                             "spec": {"volumeGroupSnapshotRef": {"namespace": NS, "name": older}}})),
        )
        .await;
    s.server
        .expect(
            "DELETE",
            &format!("{GROUP_CONTENTS}/groupcontent-0"),
            Reply::Deleted,
        )
        .await;
    let mut claimed_before = member_snapshot("snapshot-old-data", older, "vsc-o1");
    claimed_before["metadata"]["labels"] =
        json!({"ferry.dev/volume-group": "db", "ferry.dev/volume-group-snapshot": older});
    claimed_before["metadata"]["ownerReferences"] = json!([{"apiVersion": "ferry.dev/v1alpha1", "kind": "BackupSchedule",
                "name": "db-data", "uid": "uid-d"}]);
    let mut unclaimed = member_snapshot("snapshot-old-logs", older, "vsc-o2");
    unclaimed["metadata"]["labels"] = claimed_before["metadata"]["labels"].clone();
    unclaimed["metadata"]["ownerReferences"] = json!([]);
    let seen = s
        .server
        .expect(
            "GET",
            SNAPSHOTS,
            Reply::Ok(snapshot_list(vec![claimed_before, unclaimed])),
        )
        .await;
    assert!(
        seen.query
            .contains("labelSelector=ferry.dev%2Fvolume-group%3Ddb"),
        "{}",
        seen.query
    );
    s.server
        .expect(
            "DELETE",
            &format!("{SNAPSHOTS}/snapshot-old-logs"),
            Reply::Deleted,
        )
        .await;
    // Its own member, now handed out: claimed (the schedule among its owners). A
    // snapshot labelled as a member whose status says otherwise is not taken.
    let handed = |name: &str, claim: &str| {
        let mut m = member_snapshot(name, group_name, "vsc");
        m["metadata"]["ownerReferences"] = json!([]);
        m["metadata"]["annotations"] = json!({"ferry.dev/snapshot-of": claim});
        m
    };
    let mut forged = handed("forged", "db-data");
    forged["status"]["volumeGroupSnapshotName"] = json!("elsewhere");
    let data_member = handed("snapshot-data", "db-data");
    let wal_member = handed("snapshot-wal", "db-wal");
    s.server
        .expect(
            "GET",
            SNAPSHOTS,
            Reply::Ok(snapshot_list(vec![
                forged,
                wal_member.clone(),
                data_member.clone(),
            ])),
        )
        .await;
    let mut owned = data_member.clone();
    owned["metadata"]["ownerReferences"] = json!([{"apiVersion": "ferry.dev/v1alpha1", "kind": "BackupSchedule",
                "name": "db-data", "uid": "uid-d"}]);
    let patch = s
        .server
        .expect(
            "PATCH",
            &format!("{SNAPSHOTS}/snapshot-data"),
            Reply::Ok(owned),
        )
        .await
        .body;
    assert_eq!(patch["metadata"]["ownerReferences"][0]["uid"], "uid-d");
    assert!(patch["metadata"]["ownerReferences"][0]
        .get("controller")
        .is_none());
    let claim = s.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(claim["metadata"]["name"], "db-data-20261202030000-src");
    assert_eq!(
        claim["spec"]["dataSource"],
        json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
               "name": "snapshot-data"})
    );
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "21Gi");
    let created = s.server.expect("POST", BACKUPS, Reply::Echo).await.body;
    assert_eq!(created["spec"]["sourcePVC"], "db-data-20261202030000-src");
    assert_eq!(created["spec"]["volumeSnapshot"], "snapshot-data");
    assert_eq!(
        created["metadata"]["annotations"]["ferry.dev/volume-snapshot"],
        "snapshot-data"
    );
    s.server
        .expect("PATCH", data_status, Reply::ApplyStatus(data.clone()))
        .await;
    s.server.expect_event(NS).await;
    finish(task).await;
    s.server.done().await;

    // 3. The other claim's schedule: its member handed out already, no second group
    //    snapshot.
    let wal = group_schedule_json("db-wal", "uid-w", "db-wal");
    let wal_status = "/apis/ferry.dev/v1alpha1/namespaces/vms/backupschedules/db-wal/status";
    let task = tokio::spawn(schedule::reconcile(sched(&wal), s.ctx.clone()));
    s.server
        .expect("GET", REPO, Reply::Ok(repository_json()))
        .await;
    s.server
        .expect("GET", BACKUPS, Reply::Ok(list(vec![])))
        .await;
    s.server
        .expect(
            "GET",
            &format!("{PVCS}/db-wal"),
            Reply::Ok(db_claim("db-wal", "pv-2")),
        )
        .await;
    s.server
        .expect(
            "GET",
            &format!("{SNAPSHOTS}/db-wal-20261202030000"),
            Reply::NotFound,
        )
        .await;
    s.server
        .expect(
            "GET",
            SNAPSHOTS,
            Reply::Ok(snapshot_list(vec![wal_member.clone(), data_member])),
        )
        .await;
    let mut owned = wal_member;
    owned["metadata"]["ownerReferences"] = json!([{"apiVersion": "ferry.dev/v1alpha1", "kind": "BackupSchedule",
                "name": "db-wal", "uid": "uid-w"}]);
    s.server
        .expect(
            "PATCH",
            &format!("{SNAPSHOTS}/snapshot-wal"),
            Reply::Ok(owned.clone()),
        )
        .await;
    let claim = s.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(claim["spec"]["dataSource"]["name"], "snapshot-wal");
    let created = s.server.expect("POST", BACKUPS, Reply::Echo).await.body;
    assert_eq!(created["spec"]["volumeSnapshot"], "snapshot-wal");
    s.server
        .expect("PATCH", wal_status, Reply::ApplyStatus(wal.clone()))
        .await;
    s.server.expect_event(NS).await;
    finish(task).await;
    s.server.done().await;

    // 4. Its Backup ended: the temporary claim and its member deleted (the member is the
    //    schedule's: its owner reference says so).
    wal_backup_recorded(owned, true).await;
}

/// Schedule db-wal recording its Backup that ended, whose snapshot annotation names
/// `snapshot` (as the API returns it): the temporary claim deleted, then the snapshot
/// only when `deleted`.
async fn wal_backup_recorded(snapshot: Value, deleted: bool) {
    let mut s = Sched::new("2026-12-02T03:30:00Z");
    let name = snapshot["metadata"]["name"].as_str().unwrap().to_string();
    let mut done = scheduled_backup(
        "db-wal-20261202030000",
        "Succeeded",
        json!({"snapshotId": "20261202T030002Z-0a1b2c3d", "completionTime": "2026-12-02T03:20:00Z"}),
    );
    done["metadata"]["labels"]["ferry.dev/schedule"] = json!("db-wal");
    done["metadata"]["ownerReferences"][0]["name"] = json!("db-wal");
    done["metadata"]["ownerReferences"][0]["uid"] = json!("uid-w");
    done["metadata"]["annotations"] = json!({"ferry.dev/volume-snapshot": name});
    let wal = with_status(
        &group_schedule_json("db-wal", "uid-w", "db-wal"),
        &json!({"status": {"nextSyncTime": "2026-12-03T03:00:00Z",
                           "lastBackup": "db-wal-20261202030000", "observedGeneration": 1}}),
    );
    let task = tokio::spawn(schedule::reconcile(sched(&wal), s.ctx.clone()));
    s.server
        .expect("GET", REPO, Reply::Ok(repository_json()))
        .await;
    s.server
        .expect("GET", BACKUPS, Reply::Ok(list(vec![done])))
        .await;
    s.server
        .expect(
            "DELETE",
            &format!("{PVCS}/db-wal-20261202030000-src"),
            Reply::Deleted,
        )
        .await;
    let path = format!("{SNAPSHOTS}/{name}");
    s.server.expect("GET", &path, Reply::Ok(snapshot)).await;
    if deleted {
        s.server.expect("DELETE", &path, Reply::Deleted).await;
    }
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "BackupSucceeded"
    );
    s.server
        .expect(
            "PATCH",
            "/apis/ferry.dev/v1alpha1/namespaces/vms/backupschedules/db-wal/status",
            Reply::ApplyStatus(wal.clone()),
        )
        .await;
    finish(task).await;
    s.server.done().await;
}

/// A cluster that serves no VolumeGroupSnapshots: the claim gets a snapshot of its own,
/// with a warning saying why; the group snapshot is not asked for again on the next pass
/// of the fire.
#[tokio::test]
async fn without_group_snapshots_a_claim_gets_its_own_snapshot_and_a_warning() {
    let mut s = Sched::new("2026-12-02T03:00:05Z");
    let data = group_schedule_json("db-data", "uid-d", "db-data");
    let status = "/apis/ferry.dev/v1alpha1/namespaces/vms/backupschedules/db-data/status";
    let own_name = format!("{SNAPSHOTS}/db-data-20261202030000");
    let task = tokio::spawn(schedule::reconcile(sched(&data), s.ctx.clone()));
    s.server
        .expect("GET", REPO, Reply::Ok(repository_json()))
        .await;
    s.server
        .expect("GET", BACKUPS, Reply::Ok(list(vec![])))
        .await;
    s.server
        .expect(
            "GET",
            &format!("{PVCS}/db-data"),
            Reply::Ok(db_claim("db-data", "pv-1")),
        )
        .await;
    s.server.expect("GET", &own_name, Reply::NotFound).await;
    s.server
        .expect("GET", SNAPSHOTS, Reply::Ok(snapshot_list(vec![])))
        .await;
    s.server
        .expect(
            "GET",
            &format!("{GROUPS}/db-20261202030000"),
            Reply::NotFound,
        )
        .await;
    s.server
        .expect("GET", SNAPSHOTS, Reply::Ok(snapshot_list(vec![])))
        .await;
    s.server.expect("GET", GROUPS, Reply::NotFound).await;
    let event = warning(&mut s.server, "GroupSnapshotUnavailable").await;
    assert!(
        event["note"].as_str().unwrap().starts_with(
            "no group snapshot for pvc/db-data: the API server serves no VolumeGroupSnapshots"
        ),
        "{event}"
    );
    let own = s.server.expect("POST", SNAPSHOTS, Reply::Echo).await.body;
    assert_eq!(own["metadata"]["name"], "db-data-20261202030000");
    assert_eq!(
        own["spec"]["source"]["persistentVolumeClaimName"],
        "db-data"
    );
    let pending = s
        .server
        .expect("PATCH", status, Reply::ApplyStatus(data.clone()))
        .await
        .body["status"]
        .clone();
    assert_eq!(
        synchronizing(&pending),
        ("True".into(), "SnapshotPending".into())
    );
    finish(task).await;
    s.server.done().await;

    // The next pass: its own snapshot is there, so no group snapshot is asked for.
    let data = with_status(&data, &json!({ "status": pending }));
    let task = tokio::spawn(schedule::reconcile(sched(&data), s.ctx.clone()));
    s.server
        .expect("GET", REPO, Reply::Ok(repository_json()))
        .await;
    s.server
        .expect("GET", BACKUPS, Reply::Ok(list(vec![])))
        .await;
    s.server
        .expect(
            "GET",
            &format!("{PVCS}/db-data"),
            Reply::Ok(db_claim("db-data", "pv-1")),
        )
        .await;
    let mut ready = own.clone();
    ready["status"] = json!({"readyToUse": true, "restoreSize": "20Gi"});
    s.server.expect("GET", &own_name, Reply::Ok(ready)).await;
    let claim = s.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(
        claim["spec"]["dataSource"]["name"],
        "db-data-20261202030000"
    );
    s.server.expect("POST", BACKUPS, Reply::Echo).await;
    s.server
        .expect("PATCH", status, Reply::ApplyStatus(data.clone()))
        .await;
    s.server.expect_event(NS).await;
    finish(task).await;
    s.server.done().await;
}

/// A group snapshot no snapshot controller ever takes up (no status 5 minutes on): the
/// schedule that made it deletes it and takes the claim's own snapshot, saying why.
#[tokio::test]
async fn a_group_snapshot_nobody_takes_up_gives_way_to_the_claims_own() {
    let mut s = Sched::new("2026-12-02T03:10:05Z");
    let data = group_schedule_json("db-data", "uid-d", "db-data");
    let group_name = "db-20261202030000";
    let task = tokio::spawn(schedule::reconcile(sched(&data), s.ctx.clone()));
    group_pass_start(&mut s, "db-data", "pv-1", group_name).await;
    let stuck = json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1beta1",
                       "kind": "VolumeGroupSnapshot",
                       "metadata": {"name": group_name, "namespace": NS,
                                    "creationTimestamp": "2026-12-02T03:00:05Z",
                                    "annotations": {"ferry.dev/made-by": "uid-d"}},
                       "spec": {"source": {"selector": {"matchLabels": {"app": "db"}}}}});
    let path = format!("{GROUPS}/{group_name}");
    s.server
        .expect("GET", &path, Reply::Ok(stuck.clone()))
        .await;
    s.server.expect("GET", &path, Reply::Ok(stuck)).await;
    s.server.expect("DELETE", &path, Reply::Deleted).await;
    let event = s.server.expect_event(NS).await.body;
    assert_eq!(event["reason"], "GroupSnapshotUnavailable");
    assert!(
        event["note"]
            .as_str()
            .unwrap()
            .contains("is not ready after 300 s: no snapshot controller has taken it up"),
        "{event}"
    );
    let own = s.server.expect("POST", SNAPSHOTS, Reply::Echo).await.body;
    assert_eq!(own["metadata"]["name"], "db-data-20261202030000");
    s.server
        .expect(
            "PATCH",
            "/apis/ferry.dev/v1alpha1/namespaces/vms/backupschedules/db-data/status",
            Reply::ApplyStatus(data.clone()),
        )
        .await;
    finish(task).await;
    s.server.done().await;
}

/// A schedule with consistency hooks on a cluster without group snapshots: no hooks
/// around a group snapshot that cannot be made; the claim's own snapshot is cut (between
/// the hooks: here none) and backed up.
#[tokio::test]
async fn with_hooks_and_no_group_snapshots_the_claims_own_snapshot_is_cut() {
    let mut s = Sched::new("2026-12-02T03:00:05Z");
    let mut data = group_schedule_json("db-data", "uid-d", "db-data");
    data["spec"]["consistency"] = json!({"veleroAnnotations": false});
    let task = tokio::spawn(schedule::reconcile(sched(&data), s.ctx.clone()));
    group_pass_start(&mut s, "db-data", "pv-1", "db-20261202030000").await;
    s.server
        .expect(
            "GET",
            &format!("{GROUPS}/db-20261202030000"),
            Reply::NotFound,
        )
        .await;
    s.server
        .expect("GET", SNAPSHOTS, Reply::Ok(snapshot_list(vec![])))
        .await;
    s.server.expect("GET", GROUPS, Reply::NotFound).await;
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "GroupSnapshotUnavailable"
    );
    let own_path = format!("{SNAPSHOTS}/db-data-20261202030000");
    s.server.expect("GET", &own_path, Reply::NotFound).await;
    let mut cut = json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                         "metadata": {"name": "db-data-20261202030000", "namespace": NS},
                         "status": {"creationTime": "2026-12-02T03:00:06Z",
                                    "readyToUse": true, "restoreSize": "20Gi"}});
    let posted = s
        .server
        .expect("POST", SNAPSHOTS, Reply::Ok(cut.clone()))
        .await
        .body;
    assert_eq!(
        posted["spec"]["source"]["persistentVolumeClaimName"],
        "db-data"
    );
    cut["spec"] = posted["spec"].clone();
    let claim = s.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(
        claim["spec"]["dataSource"]["name"],
        "db-data-20261202030000"
    );
    s.server.expect("POST", BACKUPS, Reply::Echo).await;
    s.server
        .expect(
            "PATCH",
            "/apis/ferry.dev/v1alpha1/namespaces/vms/backupschedules/db-data/status",
            Reply::ApplyStatus(data.clone()),
        )
        .await;
    s.server.expect_event(NS).await;
    finish(task).await;
    s.server.done().await;
}

/// A Backup whose snapshot annotation names a VolumeSnapshot the schedule does not own
/// (someone edited it): the schedule does not delete that snapshot.
#[tokio::test]
async fn a_schedule_deletes_no_snapshot_it_does_not_own() {
    let precious = json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                          "metadata": {"name": "precious", "namespace": NS}});
    wal_backup_recorded(precious, false).await;
}

/// copyMethod Snapshot: a VolumeSnapshot of the claim; once it is ready, a temporary
/// claim from it (the source's modes, the snapshot's restoreSize), the Backup of that
/// claim under the source's id; once the Backup ended, both are deleted.
#[tokio::test]
async fn copy_method_snapshot_creates_and_cleans_a_snapshot_and_a_claim() {
    let mut s = Sched::new("2026-12-02T03:00:05Z");
    let mut object = schedule_json(Some(json!({"nextSyncTime": "2026-12-02T03:00:00Z",
                                                "observedGeneration": 1})));
    object["spec"]["copyMethod"] = json!("Snapshot");
    object["spec"]["volumeSnapshotClassName"] = json!("csi-snapclass");
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![]).await;
    s.server
        .expect("GET", &format!("{PVCS}/web1"), Reply::Ok(web1_claim()))
        .await;
    let snap = s.server.expect("POST", SNAPSHOTS, Reply::Echo).await.body;
    assert_eq!(snap["apiVersion"], "snapshot.storage.k8s.io/v1");
    assert_eq!(snap["kind"], "VolumeSnapshot");
    assert_eq!(snap["metadata"]["name"], "nightly-20261202030000");
    assert_eq!(snap["metadata"]["ownerReferences"][0]["uid"], "uid-s");
    assert_eq!(
        snap["spec"],
        json!({"source": {"persistentVolumeClaimName": "web1"},
               "volumeSnapshotClassName": "csi-snapclass"})
    );
    // Not ready yet: the schedule says so and looks again soon, creating nothing more.
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let pending = seen.body["status"].clone();
    assert_eq!(
        synchronizing(&pending),
        ("True".into(), "SnapshotPending".into())
    );
    assert!(pending["message"]
        .as_str()
        .unwrap()
        .starts_with("VolumeSnapshot nightly-20261202030000 of pvc/web1 is not ready yet"));
    assert!(pending.get("lastBackup").is_none(), "{pending}");
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    s.server.done().await;

    // Ready, restoring 21Gi (the volume is larger than its claim asked): the temporary
    // claim asks for the snapshot's size.
    let object = with_status(&object, &json!({ "status": pending }));
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![]).await;
    s.server
        .expect("GET", &format!("{PVCS}/web1"), Reply::Ok(web1_claim()))
        .await;
    s.server.expect("POST", SNAPSHOTS, Reply::Fail(409)).await;
    let mut ready = snap.clone();
    ready["status"] = json!({"readyToUse": true, "restoreSize": "21Gi"});
    s.server
        .expect(
            "GET",
            &format!("{SNAPSHOTS}/nightly-20261202030000"),
            Reply::Ok(ready),
        )
        .await;
    let claim = s.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(claim["metadata"]["name"], "nightly-20261202030000-src");
    assert_eq!(
        claim["spec"]["dataSource"],
        json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
               "name": "nightly-20261202030000"})
    );
    assert_eq!(claim["spec"]["volumeMode"], "Block");
    assert_eq!(claim["spec"]["storageClassName"], "fast");
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "21Gi");
    let created = s.server.expect("POST", BACKUPS, Reply::Echo).await.body;
    assert_eq!(created["spec"]["sourcePVC"], "nightly-20261202030000-src");
    assert_eq!(created["spec"]["sourceId"], "vms/web1");
    assert_eq!(
        created["metadata"]["annotations"]["ferry.dev/volume-snapshot"],
        "nightly-20261202030000"
    );
    assert_eq!(
        created["spec"]["volumeSnapshot"], "nightly-20261202030000",
        "the Backup asks the driver's SnapshotMetadata service about it"
    );
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    s.server.expect_event(NS).await;
    finish(task).await;
    s.server.done().await;

    // The Backup failed: recorded, the claim and the snapshot deleted, waiting again.
    s.set("2026-12-02T03:30:00Z");
    let object = with_status(&object, &json!({ "status": status }));
    let mut failed = scheduled_backup(
        "nightly-20261202030000",
        "Failed",
        json!({"message": "backup no_space: the repository's volume is full",
               "completionTime": "2026-12-02T03:10:00Z"}),
    );
    failed["spec"]["sourcePVC"] = json!("nightly-20261202030000-src");
    failed["metadata"]["annotations"] =
        json!({"ferry.dev/volume-snapshot": "nightly-20261202030000"});
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![failed]).await;
    s.server
        .expect(
            "DELETE",
            &format!("{PVCS}/nightly-20261202030000-src"),
            Reply::Deleted,
        )
        .await;
    s.server
        .expect(
            "DELETE",
            &format!("{SNAPSHOTS}/nightly-20261202030000"),
            Reply::NotFound,
        )
        .await;
    let event = s.server.expect_event(NS).await.body;
    assert_eq!(event["reason"], "BackupFailed");
    assert!(event["note"].as_str().unwrap().contains("no_space"));
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = &seen.body["status"];
    assert_eq!(status["lastResult"], "Failed");
    assert!(status.get("lastSnapshot").is_none());
    assert_eq!(
        synchronizing(status),
        ("False".into(), "WaitingForSchedule".into())
    );
    finish(task).await;
    s.server.done().await;
}

/// A bad cron expression and a missing repository: Synchronizing False, InvalidSpec,
/// saying what to fix; nothing fires.
#[tokio::test]
async fn invalid_schedules_say_what_to_fix() {
    let mut s = Sched::new("2026-12-02T03:00:05Z");
    let mut object = schedule_json(None);
    object["spec"]["trigger"]["schedule"] = json!("61 3 * * *");
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = &seen.body["status"];
    assert_eq!(
        synchronizing(status),
        ("False".into(), "InvalidSpec".into())
    );
    let message = status["message"].as_str().unwrap();
    assert!(
        message.starts_with("spec.trigger: cron '61 3 * * *' is not valid"),
        "{message}"
    );
    assert_eq!(s.server.expect_event(NS).await.body["type"], "Warning");
    assert_eq!(finish(task).await, Action::await_change());
    s.server.done().await;

    let mut s = Sched::new("2026-12-02T03:00:05Z");
    let object = schedule_json(None);
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    s.server.expect("GET", REPO, Reply::NotFound).await;
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = &seen.body["status"];
    assert_eq!(
        synchronizing(status),
        ("False".into(), "InvalidSpec".into())
    );
    assert_eq!(
        status["message"],
        "spec.repository: BackupRepository 'site-a' does not exist in namespace vms: create it, or fix the name"
    );
    s.server.expect_event(NS).await;
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(60)));
    s.server.done().await;
}

/// The schedule after its Backup of 12-03 ended and before it is recorded.
fn waiting_schedule(extra_spec: Value) -> Value {
    let mut object = schedule_json(Some(json!({
        "nextSyncTime": "2026-12-04T03:00:00Z", "observedGeneration": 1,
        "lastBackup": "nightly-20261203030000",
    })));
    if let Value::Object(extra) = extra_spec {
        for (k, v) in extra {
            object["spec"][k] = v;
        }
    }
    object
}

/// The second Backup's prune removed the first one's snapshot: the schedule deletes the
/// first Backup (only the object it saw: its uid is the delete's precondition) and keeps
/// the second. A Backup carrying the schedule's label that the schedule does not control
/// is never deleted, though its snapshot was pruned too; nor is a Backup already being
/// deleted deleted again.
#[tokio::test]
async fn a_schedule_deletes_its_backups_whose_snapshots_were_pruned() {
    let mut s = Sched::new("2026-12-03T03:20:00Z");
    let object = waiting_schedule(json!({}));
    let first = scheduled_backup(
        "nightly-20261202030000",
        "Succeeded",
        json!({"snapshotId": "20261202T030002Z-00000001", "pruned": 0, "kept": 1}),
    );
    let second = scheduled_backup(
        "nightly-20261203030000",
        "Succeeded",
        json!({"snapshotId": "20261203T030002Z-00000002", "pruned": 2, "kept": 1,
               "prunedSnapshots": ["20261201T120000Z-00000000", "20261202T030002Z-00000001"],
               "completionTime": "2026-12-03T03:10:00Z"}),
    );
    // Made by hand with the schedule's label (no controller reference), its snapshot
    // pruned by the schedule's prune all the same.
    let mut manual = scheduled_backup(
        "nightly-20261201120000",
        "Succeeded",
        json!({"snapshotId": "20261201T120000Z-00000000"}),
    );
    manual["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("ownerReferences");
    // Another schedule's (same label, another controller): not this one's either.
    let mut foreign = scheduled_backup(
        "nightly-20261201130000",
        "Succeeded",
        json!({"snapshotId": "20261202T030002Z-00000001"}),
    );
    foreign["metadata"]["ownerReferences"][0]["uid"] = json!("uid-other");
    let backups = vec![manual.clone(), foreign.clone(), first, second.clone()];
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, backups).await;
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "BackupSucceeded"
    );
    let deleted = s
        .server
        .expect(
            "DELETE",
            &format!("{BACKUPS}/nightly-20261202030000"),
            Reply::Deleted,
        )
        .await;
    assert_eq!(
        deleted.body["preconditions"]["uid"], "uid-nightly-20261202030000",
        "{}",
        deleted.body
    );
    let event = s.server.expect_event(NS).await.body;
    assert_eq!(event["reason"], "BackupsDeleted");
    assert_eq!(event["type"], "Normal");
    assert_eq!(
        event["note"],
        "deleted Backup nightly-20261202030000 (its snapshot was pruned)"
    );
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(status["lastSnapshot"], "20261203T030002Z-00000002");
    assert_eq!(status["lastResult"], "Succeeded");
    finish(task).await;
    s.server.done().await;

    // The first Backup is being deleted (its finalizer holds it a moment): no second
    // delete, no event; the others stay.
    let object = with_status(&object, &json!({ "status": status }));
    let mut deleting = scheduled_backup(
        "nightly-20261202030000",
        "Succeeded",
        json!({"snapshotId": "20261202T030002Z-00000001"}),
    );
    deleting["metadata"]["deletionTimestamp"] = json!("2026-12-03T03:20:01Z");
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![manual, foreign, deleting, second]).await;
    finish(task).await;
    s.server.done().await;
}

/// Failed Backups beyond `failedBackupsHistoryLimit` are deleted, oldest first; the newest
/// ones stay, and so do a failed Backup whose snapshot was written and one the schedule
/// does not control. A delete that meets another object of the same name (409: the uid
/// precondition failed) leaves it alone.
#[tokio::test]
async fn a_schedule_keeps_only_its_newest_failed_backups() {
    let mut s = Sched::new("2026-12-03T03:20:00Z");
    let object = waiting_schedule(json!({"failedBackupsHistoryLimit": 2}));
    let failed = |name: &str| {
        scheduled_backup(
            name,
            "Failed",
            json!({"message": "backup no_space: the repository's volume is full"}),
        )
    };
    let mut foreign = failed("nightly-20261127030000");
    foreign["metadata"]["ownerReferences"][0]["uid"] = json!("uid-other");
    let written = scheduled_backup(
        "nightly-20261128030000",
        "Failed",
        json!({"snapshotId": "20261128T030002Z-00000001", "message": "prune timeout"}),
    );
    let backups = vec![
        foreign,
        written,
        failed("nightly-20261129030000"),
        failed("nightly-20261130030000"),
        failed("nightly-20261201030000"),
        scheduled_backup(
            "nightly-20261202030000",
            "Succeeded",
            json!({"snapshotId": "20261202T030002Z-00000002"}),
        ),
        failed("nightly-20261203030000"),
    ];
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, backups).await;
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "BackupFailed"
    );
    let first = s
        .server
        .expect(
            "DELETE",
            &format!("{BACKUPS}/nightly-20261129030000"),
            Reply::Deleted,
        )
        .await;
    assert_eq!(
        first.body["preconditions"]["uid"],
        "uid-nightly-20261129030000"
    );
    s.server
        .expect(
            "DELETE",
            &format!("{BACKUPS}/nightly-20261130030000"),
            Reply::Conflict,
        )
        .await;
    let event = s.server.expect_event(NS).await.body;
    assert_eq!(event["reason"], "BackupsDeleted");
    assert_eq!(
        event["note"],
        "deleted Backup nightly-20261129030000 (failed; failedBackupsHistoryLimit is 2)"
    );
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(seen.body["status"]["lastResult"], "Failed");
    finish(task).await;
    s.server.done().await;
}

/// A failed history limit over 100 is an invalid spec: nothing fires, nothing is deleted.
#[tokio::test]
async fn a_failed_history_limit_over_100_is_an_invalid_spec() {
    let mut s = Sched::new("2026-12-03T03:20:00Z");
    let object = waiting_schedule(json!({"failedBackupsHistoryLimit": 101}));
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = &seen.body["status"];
    assert_eq!(
        synchronizing(status),
        ("False".into(), "InvalidSpec".into())
    );
    let message = status["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "spec.failedBackupsHistoryLimit: 101 is more than 100: keep 0 to 100 failed Backups"
        ),
        "{message}"
    );
    assert_eq!(s.server.expect_event(NS).await.body["type"], "Warning");
    assert_eq!(finish(task).await, Action::await_change());
    s.server.done().await;
}

/// A prune that removed more snapshots than its Backup lists: the schedule warns that
/// the Backups of the unlisted ones stay, once, when it records that Backup.
#[tokio::test]
async fn a_prune_listing_fewer_snapshots_than_it_removed_is_a_warning() {
    let mut s = Sched::new("2026-12-03T03:20:00Z");
    let object = waiting_schedule(json!({}));
    let second = scheduled_backup(
        "nightly-20261203030000",
        "Succeeded",
        json!({"snapshotId": "20261203T030002Z-00000002", "pruned": 1500, "kept": 7,
               "prunedSnapshots": ["20261202T030002Z-00000001"]}),
    );
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![second]).await;
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "BackupSucceeded"
    );
    let event = warning(&mut s.server, "PrunedSnapshotsUnlisted").await;
    let note = event["note"].as_str().unwrap();
    assert!(
        note.starts_with(
            "Backup nightly-20261203030000's prune removed 1500 snapshots but lists only the first 1"
        ),
        "{note}"
    );
    s.server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    finish(task).await;
    s.server.done().await;
}

/// Deletes the API server refuses (403: a Role without `delete backups`, left from an
/// older release) never stop the schedule: the Backup it could delete is deleted and
/// said so, the refused one is a Warning event naming it and the error, and the due
/// fire still creates its Backup.
#[tokio::test]
async fn a_refused_delete_does_not_stop_the_schedule() {
    let mut s = Sched::new("2026-12-04T03:00:05Z");
    let object = schedule_json(Some(json!({
        "nextSyncTime": "2026-12-04T03:00:00Z", "observedGeneration": 1,
        "lastBackup": "nightly-20261203030000", "lastResult": "Succeeded",
    })));
    let mut object = object;
    object["spec"]["failedBackupsHistoryLimit"] = json!(0);
    let backups = vec![
        scheduled_backup(
            "nightly-20261202030000",
            "Succeeded",
            json!({"snapshotId": "20261202T030002Z-00000001"}),
        ),
        scheduled_backup(
            "nightly-20261202150000",
            "Failed",
            json!({"message": "backup no_space: the repository's volume is full"}),
        ),
        scheduled_backup(
            "nightly-20261203030000",
            "Succeeded",
            json!({"snapshotId": "20261203T030002Z-00000002", "pruned": 1, "kept": 1,
                   "prunedSnapshots": ["20261202T030002Z-00000001"]}),
        ),
    ];
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, backups).await;
    s.server
        .expect(
            "DELETE",
            &format!("{BACKUPS}/nightly-20261202030000"),
            Reply::Deleted,
        )
        .await;
    s.server
        .expect(
            "DELETE",
            &format!("{BACKUPS}/nightly-20261202150000"),
            Reply::Fail(403),
        )
        .await;
    let event = s.server.expect_event(NS).await.body;
    assert_eq!(
        (event["type"].clone(), event["reason"].clone()),
        (json!("Normal"), json!("BackupsDeleted"))
    );
    assert_eq!(
        event["note"],
        "deleted Backup nightly-20261202030000 (its snapshot was pruned)"
    );
    let event = warning(&mut s.server, "BackupsNotDeleted").await;
    let note = event["note"].as_str().unwrap();
    assert!(
        note.starts_with(
            "cannot delete 1 Backup(s) the schedule no longer keeps; backups go on firing"
        ),
        "{note}"
    );
    assert!(
        note.ends_with("nightly-20261202150000 (403 Forbidden)"),
        "{note}"
    );
    // The fire goes on.
    let created = s.server.expect("POST", BACKUPS, Reply::Echo).await.body;
    assert_eq!(created["metadata"]["name"], "nightly-20261204030000");
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = &seen.body["status"];
    assert_eq!(status["lastBackup"], "nightly-20261204030000");
    assert_eq!(status["nextSyncTime"], "2026-12-05T03:00:00Z");
    assert_eq!(
        synchronizing(status),
        ("True".into(), "BackupRunning".into())
    );
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "BackupCreated"
    );
    assert_eq!(
        finish(task).await,
        Action::requeue(Duration::from_secs(3600))
    );
    s.server.done().await;
}

/// A Backup of the schedule's with its times, as a prune judges it.
fn ended_backup(name: &str, snapshot: &str, ended: &str, extra: Value) -> Value {
    let mut status = json!({"snapshotId": snapshot, "completionTime": ended});
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            status[k] = v;
        }
    }
    scheduled_backup(name, "Succeeded", status)
}

/// The prune of 12-04 was killed after it removed snapshot A; its second attempt planned
/// from what was left, removed B and kept C and its own snapshot, so it lists only B as
/// removed. The schedule deletes the Backups of A (not kept: gone) and B (pruned), keeps
/// C's, the pruning Backup and the Backup of 12-05, made after the prune ran (its own
/// prune failed, so it reports nothing). A complete kept list also finds the removed
/// snapshots a prune lists only in part (no warning then). With a kept list over the
/// bound, no Backup is deleted for its snapshot's absence, and a Warning says so.
#[tokio::test]
async fn a_schedule_deletes_the_backups_of_snapshots_a_killed_prune_removed() {
    let mut s = Sched::new("2026-12-05T03:20:00Z");
    let status = |last: &str| {
        json!({"nextSyncTime": "2026-12-06T03:00:00Z", "observedGeneration": 1,
               "lastBackup": last})
    };
    let mut object = schedule_json(Some(status("nightly-20261205030000")));
    object["spec"]["retain"] = json!({"last": 2});
    let a = ended_backup(
        "nightly-20261201030000",
        "20261201T030002Z-0000000a",
        "2026-12-01T03:10:00Z",
        json!({}),
    );
    let b = ended_backup(
        "nightly-20261202030000",
        "20261202T030002Z-0000000b",
        "2026-12-02T03:10:00Z",
        json!({}),
    );
    let c = ended_backup(
        "nightly-20261203030000",
        "20261203T030002Z-0000000c",
        "2026-12-03T03:10:00Z",
        json!({}),
    );
    let pruning = ended_backup(
        "nightly-20261204030000",
        "20261204T030002Z-0000000d",
        "2026-12-04T03:10:00Z",
        json!({"startTime": "2026-12-04T03:00:01Z", "pruned": 1, "kept": 2,
               "prunedSnapshots": ["20261202T030002Z-0000000b"],
               "keptSnapshots": ["20261203T030002Z-0000000c", "20261204T030002Z-0000000d"]}),
    );
    let newer = ended_backup(
        "nightly-20261205030000",
        "20261205T030002Z-0000000e",
        "2026-12-05T03:10:00Z",
        json!({"startTime": "2026-12-05T03:00:01Z",
               "pruneError": "prune unavailable: the repository did not answer"}),
    );
    let all = vec![a.clone(), b.clone(), c.clone(), pruning.clone(), newer];
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, all).await;
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "BackupSucceeded"
    );
    for name in ["nightly-20261201030000", "nightly-20261202030000"] {
        let deleted = s
            .server
            .expect("DELETE", &format!("{BACKUPS}/{name}"), Reply::Deleted)
            .await;
        assert_eq!(deleted.body["preconditions"]["uid"], format!("uid-{name}"));
    }
    let event = s.server.expect_event(NS).await.body;
    assert_eq!(event["reason"], "BackupsDeleted");
    assert_eq!(
        event["note"],
        "deleted Backup nightly-20261201030000 (its snapshot was pruned: Backup nightly-20261204030000's prune did not keep it), nightly-20261202030000 (its snapshot was pruned)"
    );
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(
        seen.body["status"]["lastSnapshot"],
        "20261205T030002Z-0000000e"
    );
    finish(task).await;
    s.server.done().await;

    // A prune that removed more than it lists (1500: A, B and others) but listed all it
    // kept: no PrunedSnapshotsUnlisted warning, the kept list finds the unlisted ones.
    let mut s = Sched::new("2026-12-04T03:20:00Z");
    let mut object = schedule_json(Some(status("nightly-20261204030000")));
    object["spec"]["retain"] = json!({"last": 2});
    let mut many = pruning.clone();
    many["status"]["pruned"] = json!(1500);
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![a.clone(), b.clone(), c.clone(), many]).await;
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "BackupSucceeded"
    );
    for name in ["nightly-20261201030000", "nightly-20261202030000"] {
        s.server
            .expect("DELETE", &format!("{BACKUPS}/{name}"), Reply::Deleted)
            .await;
    }
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "BackupsDeleted"
    );
    s.server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    finish(task).await;
    s.server.done().await;

    // The same prune, its kept list cut at the bound: only the listed removal counts.
    let mut s = Sched::new("2026-12-04T03:20:00Z");
    let mut truncated = pruning;
    truncated["status"]["kept"] = json!(1500);
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![a, b, c, truncated]).await;
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "BackupSucceeded"
    );
    let event = warning(&mut s.server, "KeptSnapshotsUnlisted").await;
    let note = event["note"].as_str().unwrap();
    assert!(
        note.starts_with(
            "Backup nightly-20261204030000's prune kept 1500 snapshots but lists only 2"
        ),
        "{note}"
    );
    s.server
        .expect(
            "DELETE",
            &format!("{BACKUPS}/nightly-20261202030000"),
            Reply::Deleted,
        )
        .await;
    assert_eq!(
        s.server.expect_event(NS).await.body["note"],
        "deleted Backup nightly-20261202030000 (its snapshot was pruned)"
    );
    s.server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    finish(task).await;
    s.server.done().await;
}

const CONTENTS: &str = "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents";
const SMS_BETA: &str = "/apis/cbt.storage.k8s.io/v1beta1/snapshotmetadataservices";
const SMS_ALPHA: &str = "/apis/cbt.storage.k8s.io/v1alpha1/snapshotmetadataservices";
const DRIVER: &str = "hostpath.csi.k8s.io";

/// A schedule's Backup of `snap-src`, restored from the VolumeSnapshot `snap`.
fn snapshot_backup_json(status: Option<Value>) -> Value {
    let mut b = backup_json(status);
    b["spec"]["sourcePVC"] = json!("snap-src");
    b["spec"]["volumeSnapshot"] = json!("snap");
    b["spec"]["sourceId"] = json!("vms/web1");
    b
}

/// The lookups of a Backup's changed-block tracking: the Block claim, the snapshot, its
/// content (driver and handle), then the driver's SnapshotMetadataService (`service`:
/// None for a driver without one).
async fn metadata_lookups(h: &mut Harness, service: Option<Value>) {
    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                       "metadata": {"name": "snap-src", "namespace": NS},
                       "spec": {"volumeMode": "Block",
                                "dataSource": {"apiGroup": "snapshot.storage.k8s.io",
                                               "kind": "VolumeSnapshot", "name": "snap"}}});
    h.server
        .expect("GET", &format!("{PVCS}/snap-src"), Reply::Ok(claim))
        .await;
    let snapshot = json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                          "metadata": {"name": "snap", "namespace": NS},
                          "status": {"boundVolumeSnapshotContentName": "snapcontent-1",
                                     "readyToUse": true}});
    h.server
        .expect("GET", &format!("{SNAPSHOTS}/snap"), Reply::Ok(snapshot))
        .await;
    let content = json!({"apiVersion": "snapshot.storage.k8s.io/v1",
                         "kind": "VolumeSnapshotContent",
                         "metadata": {"name": "snapcontent-1"},
                         "spec": {"driver": DRIVER},
                         "status": {"snapshotHandle": "h-7", "readyToUse": true}});
    h.server
        .expect(
            "GET",
            &format!("{CONTENTS}/snapcontent-1"),
            Reply::Ok(content),
        )
        .await;
    h.server
        .expect("GET", &format!("{SMS_BETA}/{DRIVER}"), Reply::NotFound)
        .await;
    let alpha = match service {
        Some(service) => Reply::Ok(service),
        None => Reply::NotFound,
    };
    h.server
        .expect("GET", &format!("{SMS_ALPHA}/{DRIVER}"), alpha)
        .await;
}

/// The driver's SnapshotMetadataService (v1alpha1: the older sidecar's version).
fn metadata_service() -> Value {
    json!({"apiVersion": "cbt.storage.k8s.io/v1alpha1", "kind": "SnapshotMetadataService",
           "metadata": {"name": DRIVER},
           "spec": {"address": "csi-snapshot-metadata.csi-driver:6443",
                    "audience": "cbt.hostpath.example",
                    // base64 of "-----BEGIN CERTIFICATE-----\n"
                    "caCert": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="}})
}

/// What a Backup of the VolumeSnapshot `snap` did, its driver's service being `service`
/// (None: the driver has none): the mover's token Secret and pod as created, the status
/// once the backup job (reporting `summary`) succeeded, and the request the mover got.
struct TrackedBackup {
    token: Value,
    pod: Value,
    step: Value,
    request: ferry_api::proto::StartBackupRequest,
}

/// Runs a Backup of `snap` through its two reconciles: the lookups, the claim, the
/// Secrets, the mover; then, ready, the lookups again (its job is not followed yet), the
/// backup job reporting `summary`, and its result in the status.
async fn tracked_backup(service: Option<Value>, summary: BackupSummary) -> TrackedBackup {
    let mut h = Harness::new(settings());
    let object = snapshot_backup_json(None);
    let task = tokio::spawn(reconcile_backup(backup(&object), h.ctx.clone()));
    h.server
        .expect("GET", REPO, Reply::Ok(repository_json()))
        .await;
    metadata_lookups(&mut h, service.clone()).await;
    h.server
        .expect(
            "GET",
            &format!("{PVCS}/snap-src"),
            Reply::Ok(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                             "metadata": {"name": "snap-src", "namespace": NS},
                             "spec": {"volumeMode": "Block"}})),
        )
        .await;
    for (name, keys) in [
        ("backup-key", &["passphrase"][..]),
        ("s3", &["id", "secret"]),
    ] {
        h.server
            .expect(
                "GET",
                &format!("{SECRETS}/{name}"),
                Reply::Ok(secret(name, keys)),
            )
            .await;
    }
    let token = h.server.expect("POST", SECRETS, Reply::Echo).await.body;
    h.server.expect("POST", NETPOLS, Reply::Echo).await;
    let pod = h.server.expect("POST", PODS, Reply::Echo).await.body;
    let seen = h
        .server
        .expect("PATCH", B_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    h.server.expect_event(NS).await;
    finish(task).await;
    h.server.done().await;

    let object = with_status(&snapshot_backup_json(None), &json!({ "status": status }));
    let ready_pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod.clone()).unwrap();
    h.pod_seen(ready(ready_pod, "node-a"));
    let id = job_id("uid-b/backup");
    let mut done = report(&id, JobState::Succeeded, summary.bytes_read);
    done.backup = Some(summary);
    h.link.script(&id, vec![done]);
    let task = tokio::spawn(reconcile_backup(backup(&object), h.ctx.clone()));
    h.server
        .expect("GET", REPO, Reply::Ok(repository_json()))
        .await;
    metadata_lookups(&mut h, service).await;
    h.server
        .expect("PATCH", B_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    h.server.expect_event(NS).await;
    finish(task).await;
    let seen = h
        .server
        .expect("PATCH", B_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let step = seen.body["status"].clone();
    h.server.expect_event(NS).await;
    h.ctx.take_watch("uid-b").unwrap().task.await.unwrap();
    h.server.done().await;
    let calls = h.link.calls();
    let Call::Start(JobRequest::Backup(request)) = &calls[0] else {
        panic!("{calls:?}")
    };
    TrackedBackup {
        token,
        pod,
        step,
        request: (**request).clone(),
    }
}

/// A Backup of a VolumeSnapshot whose driver has a SnapshotMetadataService: the operator
/// finds the service through the snapshot's content, gives the mover pod a token of its
/// own ServiceAccount projected for the service's audience (never in a Secret), and
/// sends the mover the service, the snapshot and its CSI handle; the status records how
/// the blocks were found and the handle the schedule keeps the snapshot for.
#[tokio::test]
async fn a_snapshot_backup_asks_the_drivers_snapshot_metadata_service_with_the_pods_token() {
    let TrackedBackup {
        token,
        pod,
        step,
        request,
    } = tracked_backup(
        Some(metadata_service()),
        BackupSummary {
            bytes_read: MIB,
            changed_block_tracking: "SnapshotMetadata".into(),
            ..summary()
        },
    )
    .await;
    assert!(
        !token.to_string().contains("snapshot-metadata"),
        "no token of the service's in a Secret: {token}"
    );
    let sources = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "secrets")
        .unwrap()["projected"]["sources"]
        .clone();
    let projected: Vec<&Value> = sources
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s.get("serviceAccountToken").is_some())
        .collect();
    assert_eq!(
        projected,
        [
            &json!({"serviceAccountToken": {"audience": "cbt.hostpath.example",
                                         "expirationSeconds": 600,
                                         "path": "_snapshot-metadata/token"}})
        ],
        "{sources}"
    );
    assert_eq!(step["changedBlockTracking"], "SnapshotMetadata");
    assert_eq!(step["snapshotHandle"], "h-7");
    assert_eq!(step["bytesRead"], MIB);
    assert!(step.get("fullReason").is_none(), "{step}");
    let asked = request
        .snapshot_metadata
        .as_ref()
        .expect("the service is asked");
    assert_eq!(
        asked.address,
        "https://csi-snapshot-metadata.csi-driver:6443"
    );
    assert_eq!(asked.ca_certificate, b"-----BEGIN CERTIFICATE-----\n");
    assert_eq!(asked.snapshot, "snap");
    assert_eq!(asked.namespace, NS);
    assert_eq!(
        asked.token,
        Some(ferry_api::proto::SecretRef {
            source: Some(ferry_api::proto::secret_ref::Source::File(
                "_snapshot-metadata/token".into()
            )),
        })
    );
    assert_eq!(request.volume_snapshot_handle, "h-7");
    assert_eq!(request.source.as_ref().unwrap().url, "/dev/ferry/snap-src");
}

/// A driver without a SnapshotMetadataService: no token projected, the
/// mover compares change digests, and the Backup's status says why.
#[tokio::test]
async fn without_a_service_for_the_driver_the_backup_says_why_it_read_more() {
    let TrackedBackup {
        token,
        pod,
        step,
        request,
    } = tracked_backup(
        None,
        BackupSummary {
            bytes_read: 4 * MIB,
            parent_id: "20261201T030000Z-00000003".into(),
            changed_block_tracking: "ChangeDigests".into(),
            ..summary()
        },
    )
    .await;
    assert!(
        !token.to_string().contains("snapshot-metadata-token"),
        "{token}"
    );
    assert!(!pod.to_string().contains("serviceAccountToken"), "{pod}");
    assert_eq!(step["changedBlockTracking"], "ChangeDigests");
    assert!(step.get("snapshotHandle").is_none(), "{step}");
    let why = step["fullReason"].as_str().unwrap_or_default();
    assert!(
        why.contains("CSI driver hostpath.csi.k8s.io has no SnapshotMetadataService"),
        "{step}"
    );
    assert_eq!(request.snapshot_metadata, None);
    assert_eq!(request.volume_snapshot_handle, "");
}

/// copyMethod Snapshot with changed-block tracking: the snapshot of the latest successful
/// backup that recorded its CSI handle stays (the next delta is asked since it; its
/// temporary claim goes), and frees the base before it; a failed backup frees its own
/// snapshot and keeps the base.
#[tokio::test]
async fn a_schedule_keeps_its_latest_tracked_snapshot_as_the_next_base() {
    let s_old = "nightly-20261201030000";
    let s_new = "nightly-20261202030000";
    let mut s = Sched::new("2026-12-02T03:30:00Z");
    let mut object = schedule_json(Some(json!({
        "nextSyncTime": "2026-12-03T03:00:00Z", "observedGeneration": 1,
        "lastBackup": s_old, "lastResult": "Succeeded", "baseSnapshot": s_old})));
    object["spec"]["copyMethod"] = json!("Snapshot");
    let tracked = |name: &str, snapshot: &str, ended: &str| {
        let mut b = ended_backup(
            name,
            snapshot,
            ended,
            json!({"snapshotHandle": format!("h-{name}"),
                   "changedBlockTracking": "SnapshotMetadata"}),
        );
        b["spec"]["sourcePVC"] = json!(format!("{name}-src"));
        b["spec"]["volumeSnapshot"] = json!(name);
        b["metadata"]["annotations"] = json!({"ferry.dev/volume-snapshot": name});
        b
    };
    let old = tracked(s_old, "20261201T030000Z-00000001", "2026-12-01T03:10:00Z");
    let new = tracked(s_new, "20261202T030000Z-00000002", "2026-12-02T03:10:00Z");
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![old.clone(), new.clone()]).await;
    s.server
        .expect("DELETE", &format!("{PVCS}/{s_new}-src"), Reply::Deleted)
        .await;
    s.server
        .expect("DELETE", &format!("{SNAPSHOTS}/{s_old}"), Reply::Deleted)
        .await;
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "BackupSucceeded"
    );
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(status["baseSnapshot"], s_new, "{status}");
    assert_eq!(status["lastSnapshot"], "20261202T030000Z-00000002");
    finish(task).await;
    s.server.done().await;

    // A later backup fails: its own snapshot goes, the base stays.
    s.set("2026-12-02T23:00:00Z");
    let object = with_status(&object, &json!({ "status": status }));
    let s_failed = "nightly-20261203030000";
    let mut failed = scheduled_backup(
        s_failed,
        "Failed",
        json!({"message": "backup no_space: full", "completionTime": "2026-12-03T03:10:00Z"}),
    );
    failed["spec"]["sourcePVC"] = json!(format!("{s_failed}-src"));
    failed["metadata"]["annotations"] = json!({"ferry.dev/volume-snapshot": s_failed});
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![old, new, failed]).await;
    s.server
        .expect("DELETE", &format!("{PVCS}/{s_failed}-src"), Reply::Deleted)
        .await;
    s.server
        .expect("DELETE", &format!("{SNAPSHOTS}/{s_failed}"), Reply::Deleted)
        .await;
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "BackupFailed"
    );
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(seen.body["status"]["baseSnapshot"], s_new);
    finish(task).await;
    s.server.done().await;
}

/// copyMethod Clone (VolSync's): a CSI clone of the claim (its dataSource the claim, as
/// large as the claim's capacity), the Backup of the clone under the source's id; once the
/// Backup ended, the clone is deleted. No VolumeSnapshot is made.
#[tokio::test]
async fn copy_method_clone_backs_up_a_csi_clone_and_deletes_it() {
    let mut s = Sched::new("2026-12-02T03:00:05Z");
    let mut object = schedule_json(Some(json!({"nextSyncTime": "2026-12-02T03:00:00Z",
                                                "observedGeneration": 1})));
    object["spec"]["copyMethod"] = json!("Clone");
    let mut source = web1_claim();
    source["status"] = json!({"phase": "Bound", "capacity": {"storage": "25Gi"}});
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![]).await;
    s.server
        .expect("GET", &format!("{PVCS}/web1"), Reply::Ok(source))
        .await;
    let clone = s.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(clone["metadata"]["name"], "nightly-20261202030000-src");
    assert_eq!(clone["metadata"]["ownerReferences"][0]["uid"], "uid-s");
    assert_eq!(
        clone["spec"]["dataSource"],
        json!({"kind": "PersistentVolumeClaim", "name": "web1"})
    );
    assert_eq!(clone["spec"]["storageClassName"], "fast");
    assert_eq!(clone["spec"]["volumeMode"], "Block");
    assert_eq!(
        clone["spec"]["resources"]["requests"]["storage"], "25Gi",
        "never smaller than the source's capacity"
    );
    let created = s.server.expect("POST", BACKUPS, Reply::Echo).await.body;
    assert_eq!(created["spec"]["sourcePVC"], "nightly-20261202030000-src");
    assert_eq!(created["spec"]["sourceId"], "vms/web1");
    assert!(created["spec"].get("volumeSnapshot").is_none(), "{created}");
    assert_eq!(
        created["metadata"]["annotations"]["ferry.dev/clone-of"],
        "web1"
    );
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "BackupCreated"
    );
    finish(task).await;
    s.server.done().await;

    // The Backup succeeded: recorded, the clone deleted.
    s.set("2026-12-02T03:30:00Z");
    let object = with_status(&object, &json!({ "status": status }));
    let mut done = ended_backup(
        "nightly-20261202030000",
        "20261202T030000Z-00000001",
        "2026-12-02T03:10:00Z",
        json!({}),
    );
    done["spec"]["sourcePVC"] = json!("nightly-20261202030000-src");
    done["metadata"]["annotations"] = json!({"ferry.dev/clone-of": "web1"});
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![done]).await;
    s.server
        .expect(
            "DELETE",
            &format!("{PVCS}/nightly-20261202030000-src"),
            Reply::Deleted,
        )
        .await;
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "BackupSucceeded"
    );
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(
        seen.body["status"]["lastSnapshot"],
        "20261202T030000Z-00000001"
    );
    finish(task).await;
    s.server.done().await;
}

const VMI: &str =
    "/apis/subresources.kubevirt.io/v1/namespaces/vms/virtualmachineinstances/web1-vm";
const VMI_OBJECT: &str = "/apis/kubevirt.io/v1/namespaces/vms/virtualmachineinstances/web1-vm";

/// The pods of the namespace: `db-0` runs on the schedule's claim and allows its hooks
/// (its first container `postgres`, a mesh sidecar beside it); `cache-0` runs on it too
/// but did not opt in.
fn app_pods() -> Value {
    let pod = |name: &str, annotations: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": NS, "annotations": annotations},
               "spec": {"containers": [{"name": "postgres"}, {"name": "istio-proxy"}],
                        "volumes": [{"name": "data",
                                     "persistentVolumeClaim": {"claimName": "web1"}}]},
               "status": {"phase": "Running"}})
    };
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {},
           "items": [pod("db-0", json!({"ferry.dev/allow-backup-hooks": "true"})),
                     pod("cache-0", json!({}))]})
}

/// The VirtualMachineInstance `web1-vm`, its root disk on the schedule's claim.
fn web1_vmi() -> Value {
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
           "metadata": {"name": "web1-vm", "namespace": NS},
           "spec": {"volumes": [{"name": "root",
                                 "persistentVolumeClaim": {"claimName": "web1"}}]}})
}

/// A schedule with consistency hooks and a KubeVirt freeze, firing: the pre hook (an
/// exec the mocked server cannot upgrade, so it fails: Continue, a warning), the guest
/// frozen, the snapshot created and waited for until cut, the guest thawed, the post
/// hook; each failure a Warning event. The exec requests are checked (path, command,
/// container) and, with everything else, against the RBAC.
#[tokio::test]
async fn hooks_and_a_guest_freeze_surround_the_snapshot_cut() {
    let mut s = Sched::new("2026-12-02T03:00:05Z");
    let mut object = schedule_json(Some(json!({"nextSyncTime": "2026-12-02T03:00:00Z",
                                                "observedGeneration": 1})));
    object["spec"]["copyMethod"] = json!("Snapshot");
    object["spec"]["consistency"] = json!({
        "pre": [{"pod": "db-0", "container": "postgres",
                 "command": ["psql", "-c", "CHECKPOINT"], "onError": "Continue"}],
        "post": [{"pod": "db-0", "command": ["/unlock"]}],
        "veleroAnnotations": false,
        "freeze": {"virtualMachineInstance": "web1-vm", "unfreezeTimeoutSeconds": 120},
    });
    let name = "nightly-20261202030000";
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![]).await;
    s.server
        .expect("GET", &format!("{PVCS}/web1"), Reply::Ok(web1_claim()))
        .await;
    s.server
        .expect("GET", &format!("{SNAPSHOTS}/{name}"), Reply::NotFound)
        .await;
    s.server.expect("GET", PODS, Reply::Ok(app_pods())).await;
    let exec = s
        .server
        .expect("GET", &format!("{PODS}/db-0/exec"), Reply::Fail(403))
        .await;
    assert!(
        exec.query
            .contains("command=psql&command=-c&command=CHECKPOINT"),
        "{}",
        exec.query
    );
    assert!(exec.query.contains("container=postgres"), "{}", exec.query);
    assert!(
        !exec.query.contains("stdout=true"),
        "stdout is not asked for: {}",
        exec.query
    );
    s.server
        .expect("GET", VMI_OBJECT, Reply::Ok(web1_vmi()))
        .await;
    let freeze = s
        .server
        .expect("PUT", &format!("{VMI}/freeze"), Reply::Ok(json!({})))
        .await;
    assert_eq!(freeze.body, json!({"unfreezeTimeout": "120s"}));
    s.server.expect("POST", SNAPSHOTS, Reply::Echo).await;
    let mut cut = json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                         "metadata": {"name": name, "namespace": NS}});
    cut["status"] = json!({"creationTime": "2026-12-02T03:00:06Z", "readyToUse": false});
    s.server
        .expect("GET", &format!("{SNAPSHOTS}/{name}"), Reply::Ok(cut))
        .await;
    s.server
        .expect("PUT", &format!("{VMI}/unfreeze"), Reply::Ok(json!({})))
        .await;
    let post = s
        .server
        .expect("GET", &format!("{PODS}/db-0/exec"), Reply::Fail(500))
        .await;
    assert!(post.query.contains("command=%2Funlock"), "{}", post.query);
    assert!(
        post.query.contains("container=postgres"),
        "the pod's first container: {}",
        post.query
    );
    let warning = s.server.expect_event(NS).await.body;
    assert_eq!(warning["reason"], "ConsistencyWarning");
    let note = warning["note"].as_str().unwrap();
    assert!(
        note.starts_with(
            "pre hook \"psql -c CHECKPOINT\" in pod db-0 (postgres, from spec.consistency): cannot exec: 403"
        ) && note.contains("; post hook \"/unlock\" in pod db-0"),
        "{note}"
    );
    // Cut, not ready yet: the schedule waits for it, as without hooks.
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(
        synchronizing(&seen.body["status"]),
        ("True".into(), "SnapshotPending".into())
    );
    finish(task).await;
    s.server.done().await;
}

/// A pre hook that fails with policy Fail skips the fire: no freeze, no snapshot, but the
/// post hooks still run (what the pre hook locked, the post hook unlocks); the next fire
/// is waited for. A snapshot that cannot be created is thawed and post-hooked too.
#[tokio::test]
async fn a_failed_pre_hook_skips_the_fire_and_the_post_hooks_still_run() {
    let mut s = Sched::new("2026-12-02T03:00:05Z");
    let mut object = schedule_json(Some(json!({"nextSyncTime": "2026-12-02T03:00:00Z",
                                                "observedGeneration": 1})));
    object["spec"]["copyMethod"] = json!("Snapshot");
    object["spec"]["consistency"] = json!({
        "pre": [{"pod": "cache-0", "command": ["/lock"]}],
        "post": [{"pod": "db-0", "command": ["/unlock"]}],
        "veleroAnnotations": false,
        "freeze": {"virtualMachineInstance": "web1-vm"},
    });
    let name = "nightly-20261202030000";
    let task = tokio::spawn(schedule::reconcile(sched(&object), s.ctx.clone()));
    looked_up(&mut s, vec![]).await;
    s.server
        .expect("GET", &format!("{PVCS}/web1"), Reply::Ok(web1_claim()))
        .await;
    s.server
        .expect("GET", &format!("{SNAPSHOTS}/{name}"), Reply::NotFound)
        .await;
    s.server.expect("GET", PODS, Reply::Ok(app_pods())).await;
    // cache-0 did not opt in: no exec into it; the post hook runs in db-0 all the same.
    let post = s
        .server
        .expect("GET", &format!("{PODS}/db-0/exec"), Reply::Fail(403))
        .await;
    assert!(post.query.contains("command=%2Funlock"), "{}", post.query);
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "ConsistencyWarning"
    );
    // Nothing made it, but a fire that skips cleans up what it may have made.
    s.server
        .expect("DELETE", &format!("{SNAPSHOTS}/{name}"), Reply::NotFound)
        .await;
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(
        synchronizing(&status),
        ("False".into(), "ConsistencyFailed".into())
    );
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .starts_with("this fire's backup is skipped: pre hook \"/lock\" in pod cache-0"),
        "{status}"
    );
    assert_eq!(status["nextSyncTime"], "2026-12-03T03:00:00Z");
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "BackupSkipped"
    );
    finish(task).await;
    s.server.done().await;

    // The next fire: the hooks pass... here the freeze does, and the snapshot is refused:
    // the guest is thawed and the post hook runs before the fire is skipped.
    // A new operator (its event recorder would fold a repeated warning into a series).
    let mut s = Sched::new("2026-12-03T03:00:05Z");
    let object = with_status(&object, &json!({ "status": status }));
    let mut without_pre = object.clone();
    without_pre["spec"]["consistency"]["pre"] = json!([]);
    let name = "nightly-20261203030000";
    let task = tokio::spawn(schedule::reconcile(sched(&without_pre), s.ctx.clone()));
    looked_up(&mut s, vec![]).await;
    s.server
        .expect("GET", &format!("{PVCS}/web1"), Reply::Ok(web1_claim()))
        .await;
    s.server
        .expect("GET", &format!("{SNAPSHOTS}/{name}"), Reply::NotFound)
        .await;
    s.server.expect("GET", PODS, Reply::Ok(app_pods())).await;
    s.server
        .expect("GET", VMI_OBJECT, Reply::Ok(web1_vmi()))
        .await;
    let freeze = s
        .server
        .expect("PUT", &format!("{VMI}/freeze"), Reply::Ok(json!({})))
        .await;
    assert_eq!(freeze.body, json!({"unfreezeTimeout": "300s"}));
    s.server
        .expect(
            "POST",
            SNAPSHOTS,
            Reply::Refuse(403, "admission webhook denied the request"),
        )
        .await;
    s.server
        .expect("PUT", &format!("{VMI}/unfreeze"), Reply::Ok(json!({})))
        .await;
    s.server
        .expect("GET", &format!("{PODS}/db-0/exec"), Reply::Fail(500))
        .await;
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "ConsistencyWarning"
    );
    s.server
        .expect("DELETE", &format!("{SNAPSHOTS}/{name}"), Reply::NotFound)
        .await;
    let seen = s
        .server
        .expect("PATCH", S_STATUS, Reply::ApplyStatus(without_pre.clone()))
        .await;
    let message = seen.body["status"]["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("cannot create VolumeSnapshot nightly-20261203030000")
            && message.contains("admission webhook denied"),
        "{message}"
    );
    assert_eq!(
        s.server.expect_event(NS).await.body["reason"],
        "BackupSkipped"
    );
    finish(task).await;
    s.server.done().await;
}
