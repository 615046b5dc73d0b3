//! Reconciler scenarios against a mocked API server and a fake mover link: each step
//! calls the reconcile function directly and checks every request it makes (method,
//! path, the important body fields), in order, and how many there were.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use ferry_api::proto;
use ferry_operator::controller::{reconcile, JobFailure, JobRequest, JobState, TargetReport};
use ferry_operator::crd::VolumeMode;
use ferry_operator::crd::{Checksum, Transfer};
use ferry_operator::mover::{transfer_pod, MoverPodInput, ResolvedPvc};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::Action;
use serde_json::{json, Value};

use support::{
    job_id, ready, report, settings, with_checkpoint, with_status, Call, Harness, Reply,
};

const NS: &str = "vms";
const T: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers/import";
const T_STATUS: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers/import/status";
const PVCS: &str = "/api/v1/namespaces/vms/persistentvolumeclaims";
const PODS: &str = "/api/v1/namespaces/vms/pods";
const SECRETS: &str = "/api/v1/namespaces/vms/secrets";
const NETPOLS: &str = "/apis/networking.k8s.io/v1/namespaces/vms/networkpolicies";
const MIB: u64 = 1 << 20;

fn digest() -> String {
    format!("sha256:{}", "ab".repeat(32))
}

/// Transfer `import`: a Block claim `golden` into a new Filesystem claim `copy`.
fn transfer_json(status: Option<Value>) -> Value {
    let mut t = json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {
            "name": "import", "namespace": NS, "uid": "uid-1", "generation": 1,
            "resourceVersion": "7", "finalizers": ["ferry.dev/cancel"],
        },
        "spec": {
            "source": {"pvc": {"name": "golden"}},
            "targets": [{"pvcTemplate": {"name": "copy", "size": "10Gi", "storageClassName": "fast"}}],
        },
    });
    if let Some(status) = status {
        t["status"] = status;
    }
    t
}

fn transfer(v: &Value) -> Arc<Transfer> {
    Arc::new(serde_json::from_value(v.clone()).unwrap())
}

fn golden_pvc() -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "golden", "namespace": NS}, "spec": {"volumeMode": "Block"}})
}

fn copy_pvc() -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "copy", "namespace": NS,
                        "ownerReferences": [{"apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
                                             "name": "import", "uid": "uid-1", "controller": true}]},
           "spec": {"volumeMode": "Filesystem"}})
}

fn token_secret(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
           "data": {"token": "c2VjcmV0LXRva2Vu"}})
}

fn conditions(running: (&str, &str), ready: (&str, &str), message: &str) -> Value {
    json!([
        {"type": "Running", "status": running.0, "reason": running.1, "message": message,
         "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1},
        {"type": "Ready", "status": ready.0, "reason": ready.1, "message": message,
         "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1},
    ])
}

/// The status of attempt `attempt` running on node-a, with 1 MiB committed.
fn running_status(attempt: u32) -> Value {
    let pod = format!("import-ft-{attempt}");
    json!({
        "phase": "Running", "attempts": attempt, "moverPod": pod, "node": "node-a",
        "observedGeneration": 1, "startTime": "2026-01-01T00:00:00Z",
        "checkpoint": {"size": 4 * MIB, "committed": [[0, MIB]]},
        "conditions": conditions(("True", "MoverRunning"), ("False", "MoverRunning"),
                                 &format!("mover pod {pod} runs on node node-a")),
    })
}

/// The mover pod of attempt `attempt`, as the operator builds it.
fn mover_pod(t: &Transfer, attempt: u32) -> Pod {
    let name = format!("import-ft-{attempt}");
    let secret = format!("{name}-token");
    let pvcs = [
        ResolvedPvc::new("golden", VolumeMode::Block),
        ResolvedPvc::new("copy", VolumeMode::Filesystem),
    ];
    transfer_pod(
        t,
        &MoverPodInput {
            pod_name: &name,
            token_secret: &secret,
            pvcs: &pvcs,
            defaults: &settings().mover,
            assigned_ids: false,
            tls: true,
        },
    )
    .unwrap()
}

/// Answers the look-ups of both claims of the Transfer as they exist.
async fn claims_found(server: &mut support::ApiServer) {
    server
        .expect("GET", &format!("{PVCS}/golden"), Reply::Ok(golden_pvc()))
        .await;
    server
        .expect("GET", &format!("{PVCS}/copy"), Reply::Ok(copy_pvc()))
        .await;
}

fn status_of(seen: &support::Seen) -> &Value {
    assert!(
        seen.query.contains("fieldManager=ferry-operator"),
        "{}",
        seen.query
    );
    assert!(seen.query.contains("force=true"), "{}", seen.query);
    assert_eq!(seen.body["apiVersion"], "ferry.dev/v1alpha1");
    assert_eq!(seen.body["kind"], "Transfer");
    assert_eq!(
        seen.body["metadata"],
        json!({"resourceVersion": "7"}),
        "every status write is guarded by the version it was decided on"
    );
    &seen.body["status"]
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
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

/// New Transfer -> finalizer; then the claim, the token Secret, the right pod and a
/// Running status; then, once the pod is ready, the jobs, progress, Succeeded with
/// digests and the mover removed. The whole life costs 16 API requests.
#[tokio::test]
async fn a_new_transfer_runs_to_success() {
    let mut h = Harness::new(settings());

    // 1. The finalizer first, nothing else.
    let mut fresh = transfer_json(None);
    fresh["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("finalizers");
    let task = tokio::spawn(reconcile(transfer(&fresh), h.ctx.clone()));
    let seen = h
        .server
        .expect("PATCH", T, Reply::Ok(transfer_json(None)))
        .await;
    assert_eq!(
        seen.body,
        json!({"metadata": {"finalizers": ["ferry.dev/cancel"], "resourceVersion": "7"}})
    );
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;

    // 2. Claims, the created claim, the token Secret, the pod, Running.
    let object = transfer_json(None);
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    h.server
        .expect("GET", &format!("{PVCS}/golden"), Reply::Ok(golden_pvc()))
        .await;
    h.server
        .expect("GET", &format!("{PVCS}/copy"), Reply::NotFound)
        .await;
    let pvc = h.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(pvc["metadata"]["name"], "copy");
    // Retained (the default): labelled with the Transfer, not owned, so deleting the
    // Transfer keeps it.
    assert_eq!(pvc["metadata"]["labels"]["ferry.dev/owner-uid"], "uid-1");
    assert!(pvc["metadata"].get("ownerReferences").is_none(), "{pvc}");
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "10Gi");
    assert_eq!(pvc["spec"]["storageClassName"], "fast");
    assert_eq!(pvc["spec"]["volumeMode"], "Filesystem");
    assert_eq!(pvc["spec"]["accessModes"], json!(["ReadWriteOnce"]));
    let event = h.server.expect_event(NS).await.body;
    assert_eq!(event["reason"], "ClaimCreated");
    let secret = h.server.expect("POST", SECRETS, Reply::Echo).await.body;
    h.server.expect("POST", NETPOLS, Reply::Echo).await;
    assert_eq!(secret["metadata"]["name"], "import-ft-1-token");
    assert_eq!(secret["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    let token = secret["stringData"]["token"].as_str().unwrap().to_string();
    assert_eq!(token.len(), 64);
    // Mutual TLS: the mover's own certificate and key, and the CA it takes clients of.
    let data = &secret["stringData"];
    assert_eq!(data["ca.crt"], support::mover_ca().cert_pem());
    assert!(data["tls.crt"]
        .as_str()
        .unwrap()
        .starts_with("-----BEGIN CERTIFICATE"));
    assert!(data["tls.key"].as_str().unwrap().contains("PRIVATE KEY"));
    let pod = h.server.expect("POST", PODS, Reply::Echo).await.body;
    assert_eq!(pod["metadata"]["name"], "import-ft-1");
    assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    assert_eq!(pod["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/component"],
        "mover"
    );
    let spec = &pod["spec"];
    assert_eq!(spec["restartPolicy"], "Never");
    assert_eq!(spec["automountServiceAccountToken"], false);
    let volumes = spec["volumes"].as_array().unwrap();
    let claim = |name: &str| {
        volumes
            .iter()
            .find(|v| v["persistentVolumeClaim"]["claimName"] == name)
            .unwrap_or_else(|| panic!("no volume of pvc/{name}"))
    };
    assert_eq!(claim("golden")["persistentVolumeClaim"]["readOnly"], true);
    assert!(claim("copy")["persistentVolumeClaim"]
        .get("readOnly")
        .is_none());
    assert!(volumes
        .iter()
        .any(|v| v["secret"]["secretName"] == "import-ft-1-token"));
    let container = &spec["containers"][0];
    assert_eq!(
        container["volumeDevices"],
        json!([{"name": claim("golden")["name"], "devicePath": "/dev/ferry/golden"}])
    );
    assert!(container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["mountPath"] == "/var/run/ferry/volumes/copy"
            && m["name"] == claim("copy")["name"]));
    // A Block claim: non-root all the same (the runtime gives it the device, see
    // mover/pod.rs).
    assert_eq!(spec["securityContext"]["runAsUser"], 65532);
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(container["command"], json!(["/ferry"]));
    assert_eq!(
        container["terminationMessagePolicy"],
        "FallbackToLogsOnError"
    );
    let sc = &container["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert!(
        !pod.to_string().contains(&token),
        "the token is only in the Secret"
    );
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = status_of(&seen).clone();
    assert_eq!(
        status["phase"], "Pending",
        "Running only once the mover is ready"
    );
    assert_eq!(status["attempts"], 1);
    assert_eq!(status["moverPod"], "import-ft-1");
    assert!(status["startTime"].is_string());
    assert_eq!(condition(&status, "Running")["reason"], "MoverStarting");
    assert_eq!(
        h.server.expect_event(NS).await.body["reason"],
        "MoverCreated"
    );
    finish(task).await;
    h.server.done().await;
    assert_eq!(h.server.count, 10);

    // 3. The pod is ready: Running on its node, the job started and followed.
    let object = with_status(&transfer_json(None), &json!({ "status": status }));
    let pod: Pod = serde_json::from_value(pod).unwrap();
    h.pod_seen(ready(pod.clone(), "node-a"));
    let id = job_id("uid-1/0");
    let done = report(&id, JobState::Succeeded, 4 * MIB);
    let mut done = with_checkpoint(done, &[(0, 4 * MIB)]);
    done.source_digest = Some(digest());
    done.target_digest = Some(digest());
    h.link.script(
        &id,
        vec![
            with_checkpoint(report(&id, JobState::Running, 2 * MIB), &[(0, MIB)]),
            // More bytes, the same checkpoint, within the progress interval: not written.
            with_checkpoint(report(&id, JobState::Running, 3 * MIB), &[(0, MIB)]),
            done,
        ],
    );
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = status_of(&seen).clone();
    assert_eq!(status["node"], "node-a");
    assert_eq!(condition(&status, "Running")["status"], "True");
    assert_eq!(condition(&status, "Running")["reason"], "MoverRunning");
    assert_eq!(
        h.server.expect_event(NS).await.body["reason"],
        "MoverRunning"
    );
    finish(task).await;
    // The follow task: the new checkpoint at once, then the end.
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let progress = status_of(&seen).clone();
    assert_eq!(
        progress["checkpoint"],
        json!({"size": 4 * MIB, "committed": [[0, MIB]]})
    );
    assert_eq!(progress["progress"]["doneBytes"], 2 * MIB);
    assert_eq!(progress["progress"]["committedBytes"], MIB);
    assert_eq!(progress["targets"][0]["name"], "pvc/copy");
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let end = status_of(&seen).clone();
    assert_eq!(end["phase"], "Succeeded");
    assert_eq!(end["digests"]["source"], digest());
    assert_eq!(end["digests"]["targets"]["pvc/copy"], digest());
    assert_eq!(end["targets"][0]["phase"], "Succeeded");
    assert_eq!(end["targets"][0]["digest"], digest());
    assert!(end["completionTime"].is_string());
    assert_eq!(condition(&end, "Ready")["status"], "True");
    h.server
        .expect("DELETE", &format!("{PODS}/import-ft-1"), Reply::Deleted)
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{SECRETS}/import-ft-1-token"),
            Reply::Deleted,
        )
        .await;
    h.server
        .expect("DELETE", &format!("{NETPOLS}/import-ft-1"), Reply::Deleted)
        .await;
    assert_eq!(h.server.expect_event(NS).await.body["reason"], "Succeeded");
    let watch = h.ctx.take_watch("uid-1").expect("a follow task");
    watch.task.await.unwrap();
    h.server.done().await;
    let calls = h.link.calls();
    let Call::Start(JobRequest::Transfer(request)) = &calls[0] else {
        panic!("{calls:?}")
    };
    assert_eq!(request.source.as_ref().unwrap().url, "/dev/ferry/golden");
    assert_eq!(
        request.target.as_ref().unwrap().url,
        "/var/run/ferry/volumes/copy/disk.img"
    );
    assert_eq!(request.idempotency_key, "uid-1/0");
    assert_eq!(
        request.resume_from, None,
        "the first attempt has no checkpoint yet"
    );
    assert_eq!(calls[1], Call::Watch(id));
    assert!(h.link.tokens.lock().iter().all(|t| *t == token));

    // 4. Succeeded is final: a reconcile costs nothing.
    let object = with_status(&object, &json!({ "status": end }));
    h.pod_gone(ready(pod, "node-a"));
    let action = reconcile(transfer(&object), h.ctx.clone()).await.unwrap();
    assert_eq!(action, Action::await_change());
    h.server.done().await;
    // The reconcile cost of one Transfer from creation to success: 18 API requests (7 of
    // them events; 2 the mover's NetworkPolicy), none of them while the mover copied.
    assert_eq!(h.server.count, 18, "requests for one Transfer");
}

/// An evicted mover is recorded as lost and removed; the replacement is attempt 2 and
/// its job resumes from the checkpoint in the status.
#[tokio::test]
async fn a_killed_mover_is_replaced_and_resumes_from_the_checkpoint() {
    let mut h = Harness::new(settings());
    let object = transfer_json(Some(running_status(1)));
    let t = transfer(&object);
    let mut evicted = mover_pod(&t, 1);
    evicted.status = Some(
        serde_json::from_value(json!({"phase": "Failed", "reason": "Evicted",
                                      "message": "The node was low on resource: memory."}))
        .unwrap(),
    );
    h.pod_seen(evicted.clone());

    // 1. Lost: recorded, pod and Secret removed.
    let task = tokio::spawn(reconcile(t.clone(), h.ctx.clone()));
    h.server
        .expect("DELETE", &format!("{PODS}/import-ft-1"), Reply::Deleted)
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{SECRETS}/import-ft-1-token"),
            Reply::NotFound,
        )
        .await;
    h.server
        .expect("DELETE", &format!("{NETPOLS}/import-ft-1"), Reply::NotFound)
        .await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let lost = status_of(&seen).clone();
    assert_eq!(condition(&lost, "Running")["reason"], "MoverLost");
    assert_eq!(
        lost["message"],
        "mover pod import-ft-1 stopped: Evicted (The node was low on resource: memory.)"
    );
    assert_eq!(
        lost["checkpoint"],
        json!({"size": 4 * MIB, "committed": [[0, MIB]]})
    );
    assert_eq!(h.server.expect_event(NS).await.body["reason"], "MoverLost");
    assert_eq!(finish(task).await, Action::requeue(Duration::ZERO));
    h.server.done().await;
    h.pod_gone(evicted);

    // 2. After the backoff: attempt 2.
    let object = with_status(&object, &json!({ "status": lost }));
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    h.server
        .expect("GET", &format!("{PODS}/import-ft-1"), Reply::NotFound)
        .await;
    claims_found(&mut h.server).await;
    let secret = h.server.expect("POST", SECRETS, Reply::Echo).await.body;
    h.server.expect("POST", NETPOLS, Reply::Echo).await;
    assert_eq!(secret["metadata"]["name"], "import-ft-2-token");
    let pod = h.server.expect("POST", PODS, Reply::Echo).await.body;
    assert_eq!(pod["metadata"]["name"], "import-ft-2");
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let second = status_of(&seen).clone();
    assert_eq!(second["attempts"], 2);
    assert_eq!(second["moverPod"], "import-ft-2");
    assert_eq!(second["phase"], "Running");
    assert_eq!(
        second["startTime"], "2026-01-01T00:00:00Z",
        "the first start is kept"
    );
    assert_eq!(
        second["checkpoint"],
        json!({"size": 4 * MIB, "committed": [[0, MIB]]})
    );
    assert_eq!(
        h.server.expect_event(NS).await.body["reason"],
        "MoverCreated"
    );
    finish(task).await;
    h.server.done().await;

    // 3. The replacement is ready on another node: the job resumes from the checkpoint.
    *h.link.hold.lock() = true;
    let object = with_status(&object, &json!({ "status": second }));
    let pod: Pod = serde_json::from_value(pod).unwrap();
    h.pod_seen(ready(pod, "node-b"));
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(status_of(&seen)["node"], "node-b");
    h.server.expect_event(NS).await;
    finish(task).await;
    h.server.done().await;
    let calls = h.link.calls();
    let Call::Start(JobRequest::Transfer(request)) = &calls[0] else {
        panic!("{calls:?}")
    };
    assert_eq!(
        request.resume_from,
        Some(proto::Checkpoint {
            size: 4 * MIB,
            committed: vec![proto::Range { start: 0, end: MIB }],
        })
    );
    h.ctx.stop_watch("uid-1");
    assert!(h.server.count <= 15, "{} requests", h.server.count);
}

/// A ready mover the operator cannot reach (a default-deny NetworkPolicy, a firewall) is
/// named in the status with the likely cause, once, then replaced after the start timeout;
/// it never passes for a running mover.
#[tokio::test]
async fn an_unreachable_mover_is_named_then_replaced() {
    let mut s = settings();
    s.mover_unreachable_grace = Duration::ZERO;
    s.mover_start_timeout = Duration::from_millis(300);
    let mut h = Harness::new(s);
    *h.link.unreachable.lock() = true;
    let object = transfer_json(Some(running_status(1)));
    let t = transfer(&object);
    let pod = ready(mover_pod(&t, 1), "node-a");
    h.pod_seen(pod);
    let task = tokio::spawn(reconcile(t, h.ctx.clone()));
    h.server
        .expect(
            "GET",
            &format!("{SECRETS}/import-ft-1-token"),
            Reply::Ok(token_secret("import-ft-1-token")),
        )
        .await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let named = status_of(&seen).clone();
    let running = condition(&named, "Running");
    assert_eq!(running["status"], "False");
    assert_eq!(running["reason"], "MoverUnreachable");
    let message = named["message"].as_str().unwrap();
    for part in [
        "cannot reach mover pod import-ft-1",
        "connection timed out",
        "NetworkPolicy in namespace vms",
        "namespace ferry-system",
        "NetworkPolicy import-ft-1",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
    let event = h.server.expect_event(NS).await.body;
    assert_eq!(event["reason"], "MoverUnreachable");
    assert_eq!(event["type"], "Warning");
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    h.server.done().await;

    // Still unreachable: nothing written again until the start timeout passes.
    let object = with_status(&object, &json!({ "status": named }));
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    h.server.done().await;
    finish(task).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    h.server
        .expect("DELETE", &format!("{PODS}/import-ft-1"), Reply::Deleted)
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{SECRETS}/import-ft-1-token"),
            Reply::Deleted,
        )
        .await;
    h.server
        .expect("DELETE", &format!("{NETPOLS}/import-ft-1"), Reply::Deleted)
        .await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let lost = status_of(&seen);
    assert_eq!(condition(lost, "Running")["reason"], "MoverLost");
    assert!(lost["message"]
        .as_str()
        .unwrap()
        .contains("cannot reach mover pod import-ft-1"));
    assert_eq!(h.server.expect_event(NS).await.body["reason"], "MoverLost");
    finish(task).await;
    h.server.done().await;
}

/// A permanent job failure (the target claim is too small): Failed with the kind and
/// the mover's message, the mover removed.
#[tokio::test]
async fn a_permanent_failure_fails_with_its_kind() {
    let mut h = Harness::new(settings());
    let object = transfer_json(Some(running_status(1)));
    let t = transfer(&object);
    h.pod_seen(ready(mover_pod(&t, 1), "node-a"));
    let id = job_id("uid-1/0");
    let mut failed = report(&id, JobState::Failed, MIB);
    failed.error = Some(JobFailure {
        kind: "no_space".into(),
        message: "the target is 1 GiB, the source 4 GiB: make the claim at least 4 GiB".into(),
    });
    h.link.script(&id, vec![failed]);
    let task = tokio::spawn(reconcile(t, h.ctx.clone()));
    // The status already says Running on node-a: no write; the token is read once.
    h.server
        .expect(
            "GET",
            &format!("{SECRETS}/import-ft-1-token"),
            Reply::Ok(token_secret("import-ft-1-token")),
        )
        .await;
    finish(task).await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let end = status_of(&seen).clone();
    assert_eq!(end["phase"], "Failed");
    let message =
        "pvc/copy: no_space: the target is 1 GiB, the source 4 GiB: make the claim at least 4 GiB";
    assert_eq!(end["message"], message);
    assert_eq!(condition(&end, "Ready")["reason"], "Failed");
    assert_eq!(end["targets"][0]["phase"], "Failed");
    h.server
        .expect("DELETE", &format!("{PODS}/import-ft-1"), Reply::Deleted)
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{SECRETS}/import-ft-1-token"),
            Reply::Deleted,
        )
        .await;
    h.server
        .expect("DELETE", &format!("{NETPOLS}/import-ft-1"), Reply::Deleted)
        .await;
    let event = h.server.expect_event(NS).await.body;
    assert_eq!(
        (event["type"].as_str(), event["note"].as_str()),
        (Some("Warning"), Some(message))
    );
    h.ctx.take_watch("uid-1").unwrap().task.await.unwrap();
    h.server.done().await;
    assert_eq!(*h.link.tokens.lock(), vec!["secret-token".to_string(); 2]);
    assert_eq!(h.server.count, 6);
}

/// Deleting a running Transfer: its jobs cancelled, the mover removed, Cancelled, the
/// finalizer removed.
#[tokio::test]
async fn deletion_cancels_and_removes_the_finalizer() {
    let mut h = Harness::new(settings());
    let mut object = transfer_json(Some(running_status(1)));
    object["metadata"]["deletionTimestamp"] = json!("2026-01-01T01:00:00Z");
    let t = transfer(&object);
    h.pod_seen(ready(mover_pod(&t, 1), "node-a"));
    let task = tokio::spawn(reconcile(t, h.ctx.clone()));
    h.server
        .expect(
            "GET",
            &format!("{SECRETS}/import-ft-1-token"),
            Reply::Ok(token_secret("import-ft-1-token")),
        )
        .await;
    h.server
        .expect("DELETE", &format!("{PODS}/import-ft-1"), Reply::Deleted)
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{SECRETS}/import-ft-1-token"),
            Reply::Deleted,
        )
        .await;
    h.server
        .expect("DELETE", &format!("{NETPOLS}/import-ft-1"), Reply::Deleted)
        .await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let end = status_of(&seen).clone();
    assert_eq!(end["phase"], "Cancelled");
    assert_eq!(condition(&end, "Ready")["reason"], "Cancelled");
    h.server.expect_event(NS).await;
    let seen = h
        .server
        .expect("PATCH", T, Reply::Ok(transfer_json(None)))
        .await;
    assert_eq!(seen.body["metadata"]["finalizers"], json!([]));
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
    assert_eq!(h.link.calls(), vec![Call::Cancel("uid-1".into())]);
    assert_eq!(h.server.count, 7);
}

/// A missing source claim: Pending with a reason naming it, looked at again with a
/// growing backoff and without writing the same status twice.
#[tokio::test]
async fn a_missing_claim_waits_with_its_name() {
    let mut h = Harness::new(settings());
    let object = transfer_json(None);
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    h.server
        .expect("GET", &format!("{PVCS}/golden"), Reply::NotFound)
        .await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let pending = status_of(&seen).clone();
    assert_eq!(pending["phase"], "Pending");
    let message =
        "pvc/golden does not exist in namespace vms: create it, or fix the name in the spec";
    assert_eq!(pending["message"], message);
    assert_eq!(condition(&pending, "Ready")["reason"], "Pending");
    let event = h.server.expect_event(NS).await.body;
    assert_eq!(
        (event["type"].as_str(), event["note"].as_str()),
        (Some("Warning"), Some(message))
    );
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    h.server.done().await;

    // Still missing: one GET, no write, a longer wait.
    let object = with_status(&object, &json!({ "status": pending }));
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    h.server
        .expect("GET", &format!("{PVCS}/golden"), Reply::NotFound)
        .await;
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(10)));
    h.server.done().await;
    assert_eq!(h.server.count, 4);
}

/// The API server refuses the mover pod (here PodSecurity): the token Secret is removed,
/// the Transfer is Pending with reason Refused and the server's message, a Warning event
/// says the same, and the next look comes after a growing backoff.
#[tokio::test]
async fn a_refused_mover_pod_waits_with_the_server_message() {
    const REFUSAL: &str = "pods \"import-ft-1\" is forbidden: violates PodSecurity \"restricted:latest\": runAsNonRoot != true";
    let mut h = Harness::new(settings());
    let object = transfer_json(None);
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    claims_found(&mut h.server).await;
    h.server.expect("POST", SECRETS, Reply::Echo).await;
    h.server.expect("POST", NETPOLS, Reply::Echo).await;
    h.server
        .expect("POST", PODS, Reply::Refuse(403, REFUSAL))
        .await;
    h.server
        .expect("DELETE", &format!("{PODS}/import-ft-1"), Reply::NotFound)
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{SECRETS}/import-ft-1-token"),
            Reply::Deleted,
        )
        .await;
    h.server
        .expect("DELETE", &format!("{NETPOLS}/import-ft-1"), Reply::Deleted)
        .await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let pending = status_of(&seen).clone();
    let message = format!("the API server refused mover pod import-ft-1: {REFUSAL}");
    assert_eq!(pending["phase"], "Pending");
    assert_eq!(pending["message"], message.as_str());
    assert_eq!(condition(&pending, "Ready")["reason"], "Refused");
    assert!(
        pending.get("moverPod").is_none_or(Value::is_null),
        "{pending}"
    );
    let event = h.server.expect_event(NS).await.body;
    assert_eq!(
        (
            event["type"].as_str(),
            event["reason"].as_str(),
            event["note"].as_str()
        ),
        (Some("Warning"), Some("Refused"), Some(message.as_str()))
    );
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    h.server.done().await;
}

/// A template's claim the API server refuses (a ResourceQuota): Pending, saying so.
#[tokio::test]
async fn a_refused_claim_waits_with_the_server_message() {
    const REFUSAL: &str = "persistentvolumeclaims \"copy\" is forbidden: exceeded quota: storage, requested: requests.storage=10Gi, used: requests.storage=95Gi, limited: requests.storage=100Gi";
    let mut h = Harness::new(settings());
    let object = transfer_json(None);
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    h.server
        .expect("GET", &format!("{PVCS}/golden"), Reply::Ok(golden_pvc()))
        .await;
    h.server
        .expect("GET", &format!("{PVCS}/copy"), Reply::NotFound)
        .await;
    h.server
        .expect("POST", PVCS, Reply::Refuse(403, REFUSAL))
        .await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let pending = status_of(&seen).clone();
    let message = format!("the API server refused to create pvc/copy: {REFUSAL}");
    assert_eq!(pending["phase"], "Pending");
    assert_eq!(pending["message"], message.as_str());
    assert_eq!(condition(&pending, "Ready")["reason"], "Refused");
    let event = h.server.expect_event(NS).await.body;
    assert_eq!(
        (event["type"].as_str(), event["note"].as_str()),
        (Some("Warning"), Some(message.as_str()))
    );
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    h.server.done().await;
}

/// A pvcTemplate that leaves its volume and access modes out gets its class's
/// StorageClassProfile's (a given mode stays); the claim is created with them.
#[tokio::test]
async fn a_template_without_modes_takes_its_classs_profile() {
    use ferry_operator::class_defaults::ClassDefaults;
    use ferry_operator::crd::StorageClassProfile;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;

    let mut profiles = Writer::<StorageClassProfile>::default();
    let profile: StorageClassProfile = serde_json::from_value(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "StorageClassProfile",
        "metadata": {"name": "fast"},
        "spec": {"volumeMode": "Block", "accessModes": ["ReadWriteMany"]},
    }))
    .unwrap();
    profiles.apply_watcher_event(&Event::Apply(profile));
    let classes = Writer::default();
    let defaults = ClassDefaults::from_stores(profiles.as_reader(), classes.as_reader());
    let mut h = Harness::with_class_defaults(settings(), defaults);
    let mut object = transfer_json(None);
    object["spec"]["source"] = json!({"url": "https://images.example.com/fedora.raw"});
    let task = tokio::spawn(ferry_operator::clone::reconcile::reconcile_transfer(
        transfer(&object),
        h.ctx.clone(),
    ));
    h.server
        .expect("GET", &format!("{PVCS}/copy"), Reply::NotFound)
        .await;
    let created = h
        .server
        .expect("POST", PVCS, Reply::Refuse(403, "quota"))
        .await
        .body;
    assert_eq!(
        created["spec"],
        json!({"accessModes": ["ReadWriteMany"], "storageClassName": "fast",
               "volumeMode": "Block", "resources": {"requests": {"storage": "10Gi"}}})
    );
    h.server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    h.server.expect_event(NS).await;
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    h.server.done().await;
}

/// An invalid spec (a password inside the URL): Failed with what to fix, the password
/// never repeated; a Failed resource costs nothing more.
#[tokio::test]
async fn an_invalid_spec_fails_without_repeating_the_secret() {
    let mut h = Harness::new(settings());
    let mut object = transfer_json(None);
    object["spec"]["source"] =
        json!({"url": "iscsi://admin:hunter2@san/iqn.2024-01.dev.ferry:disk/0"});
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let failed = status_of(&seen).clone();
    assert_eq!(failed["phase"], "Failed");
    assert_eq!(condition(&failed, "Ready")["reason"], "InvalidSpec");
    let message = failed["message"].as_str().unwrap();
    assert!(message.starts_with("spec.source.url: "), "{message}");
    assert!(message.contains("remove it"), "{message}");
    let event = h.server.expect_event(NS).await;
    assert_eq!(finish(task).await, Action::await_change());
    for text in [seen.body.to_string(), event.body.to_string()] {
        assert!(!text.contains("hunter2"), "{text}");
    }
    let object = with_status(&object, &json!({ "status": failed }));
    let action = reconcile(transfer(&object), h.ctx.clone()).await.unwrap();
    assert_eq!(action, Action::await_change());
    h.server.done().await;
    assert_eq!(h.server.count, 2);
}

/// The cluster limit reached: Pending with reason Queued, looked at again later; a
/// mover pinned to a full node waits the same way.
#[tokio::test]
async fn over_the_limit_the_transfer_is_queued() {
    let mut s = settings();
    s.max_movers = 1;
    s.max_movers_per_node = 1;
    let mut h = Harness::new(s);
    let mut other: Pod = serde_json::from_value(json!({
        "metadata": {"name": "other-ft-1", "namespace": "other",
                     "labels": {"ferry.dev/owner-uid": "uid-9"}},
        "spec": {"containers": []},
    }))
    .unwrap();
    other = ready(other, "node-a");
    h.pod_seen(other.clone());
    // Queued before any claim is looked up or created.
    let object = transfer_json(None);
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let queued = status_of(&seen).clone();
    assert_eq!(queued["phase"], "Pending");
    assert_eq!(condition(&queued, "Running")["reason"], "Queued");
    assert_eq!(
        queued["message"],
        "1 movers run, the operator's limit is 1: waiting for one to finish"
    );
    let event = h.server.expect_event(NS).await.body;
    assert_eq!(
        (event["type"].as_str(), event["reason"].as_str()),
        (Some("Normal"), Some("Queued"))
    );
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    h.server.done().await;
    // Woken at once when a mover goes, not at the end of its backoff.
    assert_eq!(h.ctx.to_wake("Transfer", &other), vec![]);
    let mut finished = other.clone();
    finished.status.as_mut().unwrap().phase = Some("Succeeded".into());
    assert_eq!(
        h.ctx.to_wake("Transfer", &finished),
        vec![("vms".to_string(), "import".to_string())]
    );
    assert_eq!(h.ctx.to_wake("Checksum", &finished), vec![]);
    // A long queue: a freed slot wakes the few longest waiting, in queue order, not all.
    for i in 0..6 {
        let ids = ferry_operator::controller::kind::Ids {
            namespace: NS.into(),
            name: format!("later-{i}"),
            uid: format!("uid-later-{i}"),
        };
        h.ctx.queue("Transfer", &ids);
    }
    let woken: Vec<String> = h
        .ctx
        .to_wake("Transfer", &finished)
        .into_iter()
        .map(|(_, name)| name)
        .collect();
    assert_eq!(woken, ["import", "later-0", "later-1", "later-2"]);
    for i in 0..6 {
        h.ctx.done_waiting(&format!("uid-later-{i}"));
    }

    // Per node: the other mover's node is full; a Transfer pinned to it waits.
    h.ctx.done_waiting("uid-1");
    assert_eq!(h.ctx.to_wake("Transfer", &finished), vec![]);
    let mut s = settings();
    s.max_movers_per_node = 1;
    let mut h2 = Harness::new(s);
    h2.pod_seen(other);
    let mut object = transfer_json(None);
    object["spec"]["mover"] = json!({"nodeSelector": {"kubernetes.io/hostname": "node-a"}});
    let task = tokio::spawn(reconcile(transfer(&object), h2.ctx.clone()));
    claims_found(&mut h2.server).await;
    let seen = h2
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let queued = status_of(&seen).clone();
    assert_eq!(condition(&queued, "Running")["reason"], "Queued");
    assert!(queued["message"].as_str().unwrap().contains("node node-a"));
    h2.server.expect_event(NS).await;
    finish(task).await;
    h2.server.done().await;

    // Unpinned, it may start: the scheduler places it, never kept off a node (a node
    // affinity could strand it where only a full node can attach its volume).
    let object = transfer_json(None);
    let task = tokio::spawn(reconcile(transfer(&object), h2.ctx.clone()));
    claims_found(&mut h2.server).await;
    h2.server.expect("POST", SECRETS, Reply::Echo).await;
    h2.server.expect("POST", NETPOLS, Reply::Echo).await;
    let pod = h2.server.expect("POST", PODS, Reply::Echo).await.body;
    assert!(pod["spec"].get("affinity").is_none(), "{pod}");
    h2.server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    h2.server.expect_event(NS).await;
    finish(task).await;
    h2.server.done().await;
}

/// The last slot taken by a mover the pod watch has not seen yet is not given again:
/// with a limit of one, a second Transfer reconciled right after the first is queued.
#[tokio::test]
async fn a_slot_taken_is_held_until_the_pod_is_seen() {
    let mut s = settings();
    s.max_movers = 1;
    let mut h = Harness::new(s);
    let object = transfer_json(None);
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    claims_found(&mut h.server).await;
    h.server.expect("POST", SECRETS, Reply::Echo).await;
    h.server.expect("POST", NETPOLS, Reply::Echo).await;
    h.server.expect("POST", PODS, Reply::Echo).await;
    h.server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    h.server.expect_event(NS).await;
    finish(task).await;

    let mut second = transfer_json(None);
    second["metadata"]["uid"] = json!("uid-2");
    let task = tokio::spawn(reconcile(transfer(&second), h.ctx.clone()));
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(second.clone()))
        .await;
    let queued = status_of(&seen).clone();
    assert_eq!(condition(&queued, "Running")["reason"], "Queued");
    assert_eq!(
        queued["message"],
        "1 movers run, the operator's limit is 1: waiting for one to finish"
    );
    h.server.expect_event(NS).await;
    finish(task).await;
    h.server.done().await;
}

/// A transient failure (the source went away): the status records it with the
/// checkpoint, the mover is removed; at the operator's limit of attempts it fails.
#[tokio::test]
async fn a_transient_failure_retries_until_the_limit() {
    let mut h = Harness::new(settings());
    let object = transfer_json(Some(running_status(1)));
    let t = transfer(&object);
    h.pod_seen(ready(mover_pod(&t, 1), "node-a"));
    h.ctx.remember_token("import-ft-1-token", "secret-token");
    let id = job_id("uid-1/0");
    let mut failed = with_checkpoint(report(&id, JobState::Failed, 3 * MIB), &[(0, 3 * MIB)]);
    failed.error = Some(JobFailure {
        kind: "disconnected".into(),
        message: "the source closed the connection".into(),
    });
    h.link.script(&id, vec![failed]);
    let task = tokio::spawn(reconcile(t, h.ctx.clone()));
    finish(task).await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let retry = status_of(&seen).clone();
    assert_eq!(retry["phase"], "Running");
    assert_eq!(condition(&retry, "Running")["reason"], "Retrying");
    assert_eq!(
        retry["checkpoint"],
        json!({"size": 4 * MIB, "committed": [[0, 3 * MIB]]})
    );
    h.server
        .expect("DELETE", &format!("{PODS}/import-ft-1"), Reply::Deleted)
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{SECRETS}/import-ft-1-token"),
            Reply::Deleted,
        )
        .await;
    h.server
        .expect("DELETE", &format!("{NETPOLS}/import-ft-1"), Reply::Deleted)
        .await;
    assert_eq!(h.server.expect_event(NS).await.body["reason"], "Retrying");
    h.ctx.take_watch("uid-1").unwrap().task.await.unwrap();
    h.server.done().await;

    // At the limit (3 attempts in these settings) the next loss is final.
    let mut at_limit = retry.clone();
    at_limit["attempts"] = json!(3);
    at_limit["moverPod"] = json!("import-ft-3");
    let object = with_status(&object, &json!({ "status": at_limit }));
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    h.server
        .expect("GET", &format!("{PODS}/import-ft-3"), Reply::NotFound)
        .await;
    h.server
        .expect("DELETE", &format!("{PODS}/import-ft-3"), Reply::NotFound)
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{SECRETS}/import-ft-3-token"),
            Reply::NotFound,
        )
        .await;
    h.server
        .expect("DELETE", &format!("{NETPOLS}/import-ft-3"), Reply::NotFound)
        .await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let end = status_of(&seen).clone();
    assert_eq!(end["phase"], "Failed");
    let message = end["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "pvc/copy: disconnected: the source closed the connection; gave up after 3 mover pods"
        ),
        "{message}"
    );
    h.server.expect_event(NS).await;
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

/// A Checksum: the job started on its ready mover, the digest in the status.
#[tokio::test]
async fn a_checksum_writes_its_digest() {
    let mut h = Harness::new(settings());
    let object = json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Checksum",
        "metadata": {"name": "golden-sum", "namespace": NS, "uid": "uid-c", "generation": 1,
                     "resourceVersion": "3", "finalizers": ["ferry.dev/cancel"]},
        "spec": {"source": {"pvc": {"name": "golden"}}, "options": {"algorithm": "sha256"}},
        "status": {"phase": "Running", "attempts": 1, "moverPod": "golden-sum-fcs-1",
                   "observedGeneration": 1,
                   "conditions": conditions(("False", "MoverStarting"), ("False", "MoverStarting"),
                                            "mover pod golden-sum-fcs-1 (attempt 1) is starting")},
    });
    let checksum: Arc<Checksum> = Arc::new(serde_json::from_value(object.clone()).unwrap());
    let pod = ferry_operator::mover::checksum_pod(
        &checksum,
        &MoverPodInput {
            pod_name: "golden-sum-fcs-1",
            token_secret: "golden-sum-fcs-1-token",
            pvcs: &[ResolvedPvc::new("golden", VolumeMode::Filesystem)],
            defaults: &settings().mover,
            assigned_ids: false,
            tls: true,
        },
    )
    .unwrap();
    h.pod_seen(ready(pod, "node-c"));
    let id = job_id("uid-c");
    let mut done = report(&id, JobState::Succeeded, 4 * MIB);
    done.source_digest = Some(digest());
    h.link.script(&id, vec![done]);
    let path = "/apis/ferry.dev/v1alpha1/namespaces/vms/checksums/golden-sum/status";
    let task = tokio::spawn(reconcile(checksum, h.ctx.clone()));
    let seen = h
        .server
        .expect("PATCH", path, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(seen.body["kind"], "Checksum");
    assert_eq!(seen.body["status"]["node"], "node-c");
    h.server.expect_event(NS).await;
    h.server
        .expect(
            "GET",
            &format!("{SECRETS}/golden-sum-fcs-1-token"),
            Reply::Ok(token_secret("golden-sum-fcs-1-token")),
        )
        .await;
    finish(task).await;
    let seen = h
        .server
        .expect("PATCH", path, Reply::ApplyStatus(object.clone()))
        .await;
    let end = &seen.body["status"];
    assert_eq!(end["phase"], "Succeeded");
    assert_eq!(end["digest"], digest());
    assert_eq!(end["progress"]["totalBytes"], 4 * MIB);
    h.server
        .expect(
            "DELETE",
            &format!("{PODS}/golden-sum-fcs-1"),
            Reply::Deleted,
        )
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{SECRETS}/golden-sum-fcs-1-token"),
            Reply::Deleted,
        )
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{NETPOLS}/golden-sum-fcs-1"),
            Reply::Deleted,
        )
        .await;
    assert_eq!(h.server.expect_event(NS).await.body["reason"], "Succeeded");
    h.ctx.take_watch("uid-c").unwrap().task.await.unwrap();
    h.server.done().await;
    let calls = h.link.calls();
    let Call::Start(JobRequest::Checksum(request)) = &calls[0] else {
        panic!("{calls:?}")
    };
    assert_eq!(
        request.source.as_ref().unwrap().url,
        "/var/run/ferry/volumes/golden/disk.img"
    );
    assert_eq!(request.idempotency_key, "uid-c");
    assert_eq!(h.server.count, 8);
}

/// A Transfer of two targets with its mover ready (`pvc/copy` and `pvc/other`).
fn fan_out(h: &mut Harness) -> (Value, Arc<Transfer>) {
    let mut object = transfer_json(Some(running_status(1)));
    object["spec"]["targets"]
        .as_array_mut()
        .unwrap()
        .push(json!({"pvc": {"name": "other"}}));
    let t = transfer(&object);
    let pvcs = [
        ResolvedPvc::new("golden", VolumeMode::Block),
        ResolvedPvc::new("copy", VolumeMode::Filesystem),
        ResolvedPvc::new("other", VolumeMode::Block),
    ];
    let pod = transfer_pod(
        &t,
        &MoverPodInput {
            pod_name: "import-ft-1",
            token_secret: "import-ft-1-token",
            pvcs: &pvcs,
            defaults: &settings().mover,
            assigned_ids: false,
            tls: true,
        },
    )
    .unwrap();
    h.pod_seen(ready(pod, "node-a"));
    h.ctx.remember_token("import-ft-1-token", "secret-token");
    (object, t)
}

/// A target outcome of a fan-out job.
fn outcome(index: usize, state: JobState, error: Option<(&str, &str)>) -> TargetReport {
    TargetReport {
        index,
        state,
        done_bytes: if state == JobState::Succeeded {
            4 * MIB
        } else {
            MIB
        },
        digest: (state == JobState::Succeeded).then(digest),
        error: error.map(|(kind, message)| JobFailure {
            kind: kind.into(),
            message: message.into(),
        }),
        resumable: state != JobState::Failed,
    }
}

/// The mover removed and the event of the end, after the final status.
async fn mover_removed(h: &mut Harness) -> Value {
    h.server
        .expect("DELETE", &format!("{PODS}/import-ft-1"), Reply::Deleted)
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{SECRETS}/import-ft-1-token"),
            Reply::Deleted,
        )
        .await;
    h.server
        .expect("DELETE", &format!("{NETPOLS}/import-ft-1"), Reply::Deleted)
        .await;
    let event = h.server.expect_event(NS).await.body;
    h.ctx.take_watch("uid-1").unwrap().task.await.unwrap();
    h.server.done().await;
    event
}

/// The transfer requests the mover got: (idempotency key, target URLs).
fn started(h: &Harness) -> Vec<(String, Vec<String>)> {
    h.link
        .calls()
        .iter()
        .filter_map(|c| match c {
            Call::Start(JobRequest::Transfer(request)) => Some((
                request.idempotency_key.clone(),
                request
                    .target
                    .iter()
                    .chain(&request.more_targets)
                    .map(|t| t.url.clone())
                    .collect(),
            )),
            _ => None,
        })
        .collect()
}

/// A fan-out: two targets, ONE job in the one mover writing both in one pass; the
/// status has one entry per target, from the job's per-target outcomes.
#[tokio::test]
async fn a_fan_out_runs_as_one_job() {
    let mut h = Harness::new(settings());
    let (object, t) = fan_out(&mut h);
    let id = job_id("uid-1/0,1");
    let mut done = with_checkpoint(report(&id, JobState::Succeeded, 4 * MIB), &[(0, 4 * MIB)]);
    done.targets = vec![
        outcome(0, JobState::Succeeded, None),
        outcome(1, JobState::Succeeded, None),
    ];
    h.link.script(&id, vec![done]);
    let task = tokio::spawn(reconcile(t, h.ctx.clone()));
    finish(task).await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let end = status_of(&seen).clone();
    assert_eq!(end["phase"], "Succeeded");
    let names: Vec<&str> = end["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["pvc/copy", "pvc/other"]);
    assert_eq!(end["targets"][1]["phase"], "Succeeded");
    assert_eq!(end["checkpoint"]["committed"], json!([[0, 4 * MIB]]));
    assert_eq!(end["digests"]["targets"]["pvc/copy"], digest());
    assert_eq!(end["digests"]["targets"]["pvc/other"], digest());
    mover_removed(&mut h).await;
    assert_eq!(
        started(&h),
        [(
            "uid-1/0,1".to_string(),
            vec![
                "/var/run/ferry/volumes/copy/disk.img".to_string(),
                "/dev/ferry/other".to_string()
            ]
        )]
    );
}

/// One target of a fan-out fails for good (no space) while the other gets the image:
/// that target Failed, the other Succeeded with its digest, the Transfer Failed with a
/// message naming the failed target and where the image is.
#[tokio::test]
async fn a_fan_out_with_a_failed_target_fails_naming_it() {
    let mut h = Harness::new(settings());
    let (object, t) = fan_out(&mut h);
    let id = job_id("uid-1/0,1");
    let mut failed = with_checkpoint(report(&id, JobState::Failed, 4 * MIB), &[(0, 4 * MIB)]);
    let full = "no space left on the device";
    failed.error = Some(JobFailure {
        kind: "no_space".into(),
        message: format!("1 of 2 targets failed: /dev/ferry/other (no_space: {full})"),
    });
    failed.targets = vec![
        outcome(0, JobState::Succeeded, None),
        outcome(1, JobState::Failed, Some(("no_space", full))),
    ];
    h.link.script(&id, vec![failed]);
    let task = tokio::spawn(reconcile(t, h.ctx.clone()));
    finish(task).await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let end = status_of(&seen).clone();
    assert_eq!(end["phase"], "Failed");
    let message =
        format!("1 of 2 targets failed: pvc/other: no_space: {full}; the image is on pvc/copy");
    assert_eq!(end["message"], message.as_str());
    assert_eq!(end["targets"][0]["phase"], "Succeeded");
    assert_eq!(end["targets"][0]["digest"], digest());
    assert_eq!(end["targets"][1]["phase"], "Failed");
    assert_eq!(
        end["targets"][1]["message"],
        format!("no_space: {full}").as_str()
    );
    assert_eq!(condition(&end, "Ready")["reason"], "Failed");
    let event = mover_removed(&mut h).await;
    assert_eq!(event["note"], message.as_str());
}

/// A transient failure of one target of a fan-out: the Transfer retries, and the next
/// mover's job writes only that target, from the beginning (it was dropped while the
/// copy went on, so the checkpoint does not hold for it).
#[tokio::test]
async fn a_transient_target_failure_retries_only_that_target() {
    let mut h = Harness::new(settings());
    let (object, t) = fan_out(&mut h);
    let id = job_id("uid-1/0,1");
    let mut failed = with_checkpoint(report(&id, JobState::Failed, 4 * MIB), &[(0, 4 * MIB)]);
    failed.error = Some(JobFailure {
        kind: "disconnected".into(),
        message: "1 of 2 targets failed".into(),
    });
    failed.targets = vec![
        outcome(0, JobState::Succeeded, None),
        outcome(
            1,
            JobState::Failed,
            Some(("disconnected", "the server went away")),
        ),
    ];
    h.link.script(&id, vec![failed]);
    let task = tokio::spawn(reconcile(t, h.ctx.clone()));
    finish(task).await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let retry = status_of(&seen).clone();
    assert_eq!(retry["phase"], "Running");
    assert_eq!(condition(&retry, "Running")["reason"], "Retrying");
    assert_eq!(retry["targets"][0]["phase"], "Succeeded");
    assert_eq!(retry["targets"][1]["phase"], "Failed");
    assert!(retry.get("checkpoint").is_none(), "{retry}");
    assert_eq!(mover_removed(&mut h).await["reason"], "Retrying");

    // The next mover (attempt 2) gets one job for the target not done yet.
    let mut again = retry.clone();
    again["attempts"] = json!(2);
    again["moverPod"] = json!("import-ft-2");
    let object = with_status(&object, &json!({ "status": again }));
    let t = transfer(&object);
    let pvcs = [
        ResolvedPvc::new("golden", VolumeMode::Block),
        ResolvedPvc::new("copy", VolumeMode::Filesystem),
        ResolvedPvc::new("other", VolumeMode::Block),
    ];
    let status: ferry_operator::crd::TransferStatus =
        serde_json::from_value(again.clone()).unwrap();
    let jobs = ferry_operator::controller::MoverKind::jobs(t.as_ref(), &status, &pvcs).unwrap();
    let [JobRequest::Transfer(request)] = jobs.as_slice() else {
        panic!("{jobs:?}")
    };
    assert_eq!(request.idempotency_key, "uid-1/1");
    assert_eq!(request.target.as_ref().unwrap().url, "/dev/ferry/other");
    assert!(request.more_targets.is_empty());
    assert_eq!(request.resume_from, None);
}

/// `expectedDigest`: the jobs verify with its algorithm, and a different digest fails
/// the Transfer with DigestMismatch.
#[tokio::test]
async fn a_digest_mismatch_fails_the_transfer() {
    let mut h = Harness::new(settings());
    let mut object = transfer_json(Some(running_status(1)));
    let expected = format!("sha256:{}", "cd".repeat(32));
    object["spec"]["expectedDigest"] = json!(expected);
    let t = transfer(&object);
    h.pod_seen(ready(mover_pod(&t, 1), "node-a"));
    h.ctx.remember_token("import-ft-1-token", "secret-token");
    let id = job_id("uid-1/0");
    let mut done = report(&id, JobState::Succeeded, 4 * MIB);
    done.source_digest = Some(digest());
    done.target_digest = Some(digest());
    h.link.script(&id, vec![done]);
    let task = tokio::spawn(reconcile(t, h.ctx.clone()));
    finish(task).await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let end = status_of(&seen).clone();
    assert_eq!(end["phase"], "Failed");
    assert_eq!(condition(&end, "Ready")["reason"], "DigestMismatch");
    assert!(end["message"].as_str().unwrap().contains(&expected));
    h.server
        .expect("DELETE", &format!("{PODS}/import-ft-1"), Reply::Deleted)
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{SECRETS}/import-ft-1-token"),
            Reply::Deleted,
        )
        .await;
    h.server
        .expect("DELETE", &format!("{NETPOLS}/import-ft-1"), Reply::Deleted)
        .await;
    h.server.expect_event(NS).await;
    h.ctx.take_watch("uid-1").unwrap().task.await.unwrap();
    h.server.done().await;
    let calls = h.link.calls();
    let Call::Start(JobRequest::Transfer(request)) = &calls[0] else {
        panic!("{calls:?}")
    };
    let options = request.options.as_ref().unwrap();
    assert!(options.verify);
    assert_eq!(
        options.verify_algorithm,
        proto::HashAlgorithm::Sha256 as i32
    );
}

/// `claimRetention: Delete`: the created claim is owned by the Transfer (deleted with it);
/// a claim the Transfer labelled as its own is taken as created on the next look.
#[tokio::test]
async fn claims_of_a_delete_retention_are_owned_by_the_transfer() {
    let mut h = Harness::new(settings());
    let mut object = transfer_json(None);
    object["spec"]["claimRetention"] = json!("Delete");
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    h.server
        .expect("GET", &format!("{PVCS}/golden"), Reply::Ok(golden_pvc()))
        .await;
    h.server
        .expect("GET", &format!("{PVCS}/copy"), Reply::NotFound)
        .await;
    let pvc = h.server.expect("POST", PVCS, Reply::Echo).await.body;
    assert_eq!(pvc["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    assert_eq!(pvc["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(pvc["metadata"]["labels"]["ferry.dev/owner-uid"], "uid-1");
    task.abort();

    let mut h = Harness::new(settings());
    let object = transfer_json(None);
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    h.server
        .expect("GET", &format!("{PVCS}/golden"), Reply::Ok(golden_pvc()))
        .await;
    let mut labelled = copy_pvc();
    labelled["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("ownerReferences");
    labelled["metadata"]["labels"] = json!({"ferry.dev/owner-uid": "uid-1"});
    h.server
        .expect("GET", &format!("{PVCS}/copy"), Reply::Ok(labelled))
        .await;
    // Taken as its own: on to the token Secret.
    let secret = h.server.expect("POST", SECRETS, Reply::Echo).await.body;
    h.server.expect("POST", NETPOLS, Reply::Echo).await;
    assert_eq!(secret["metadata"]["name"], "import-ft-1-token");
    task.abort();
}

/// The users of the source claim (Bound, ReadWriteOnce): `web` uses another claim;
/// `virt-launcher-vm1` on node-b mounts it, writable unless `read_only`.
fn pods_using_golden(read_only: bool) -> Reply {
    Reply::Ok(json!({
        "apiVersion": "v1", "kind": "PodList", "metadata": {},
        "items": [
            {"metadata": {"name": "web", "namespace": NS},
             "spec": {"nodeName": "node-a", "containers": [],
                      "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "other"}}]},
             "status": {"phase": "Running"}},
            {"metadata": {"name": "virt-launcher-vm1", "namespace": NS},
             "spec": {"nodeName": "node-b", "containers": [],
                      "tolerations": [{"key": "kubevirt.io/drain", "operator": "Exists", "effect": "NoSchedule"}],
                      "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "golden", "readOnly": read_only}}]},
             "status": {"phase": "Running"}}
        ]
    }))
}

/// A source claim a running VM writes: the copy waits (SourceInUse), naming the pod,
/// instead of reading an image being written.
#[tokio::test]
async fn a_source_claim_a_pod_writes_is_not_copied() {
    let mut h = Harness::new(settings());
    let object = transfer_json(None);
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    let mut golden = golden_pvc();
    golden["status"] = json!({"phase": "Bound", "accessModes": ["ReadWriteOnce"]});
    h.server
        .expect("GET", &format!("{PVCS}/golden"), Reply::Ok(golden))
        .await;
    h.server
        .expect("GET", &format!("{PVCS}/copy"), Reply::Ok(copy_pvc()))
        .await;
    h.server.expect("GET", PODS, pods_using_golden(false)).await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = &seen.body["status"];
    assert_eq!(status["phase"], "Pending");
    assert_eq!(status["conditions"][0]["reason"], "SourceInUse");
    assert_eq!(
        status["message"],
        "pvc/golden is in use by pod virt-launcher-vm1, which may write it: a copy would read an image being written; stop the pod (or clone it by snapshot: cloneStrategy snapshot)"
    );
    let event = h.server.expect_event(NS).await.body;
    assert_eq!(event["reason"], "SourceInUse");
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(5)));
    h.server.done().await;
}

/// A source claim a running VM reads (mounted read-only, Bound, ReadWriteOnce): the mover
/// runs on the VM's node with its tolerations, not wherever the scheduler would put it
/// (and hang on Multi-Attach).
#[tokio::test]
async fn a_mover_of_a_claim_in_use_runs_on_its_users_node() {
    let mut h = Harness::new(settings());
    let object = transfer_json(None);
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    let mut golden = golden_pvc();
    golden["status"] = json!({"phase": "Bound", "accessModes": ["ReadWriteOnce"]});
    h.server
        .expect("GET", &format!("{PVCS}/golden"), Reply::Ok(golden))
        .await;
    h.server
        .expect("GET", &format!("{PVCS}/copy"), Reply::Ok(copy_pvc()))
        .await;
    h.server.expect("GET", PODS, pods_using_golden(true)).await;
    h.server.expect("POST", SECRETS, Reply::Echo).await;
    h.server.expect("POST", NETPOLS, Reply::Echo).await;
    let pod = h.server.expect("POST", PODS, Reply::Echo).await.body;
    assert_eq!(
        pod["spec"]["affinity"],
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["node-b"]}
            ]}]
        }}})
    );
    assert_eq!(
        pod["spec"]["tolerations"],
        json!([{"key": "kubevirt.io/drain", "operator": "Exists", "effect": "NoSchedule"}])
    );
    h.server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    h.server.expect_event(NS).await;
    finish(task).await;
    h.server.done().await;
}

/// On OpenShift (the namespace has a UID range), the mover names no user, group or
/// fsGroup: restricted-v2 assigns them from the range and refuses any other.
#[tokio::test]
async fn a_namespace_with_a_uid_range_gets_movers_without_ids() {
    let mut h = Harness::new(settings());
    h.namespace_seen(NS, &[("openshift.io/sa.scc.uid-range", "1000650000/10000")]);
    let object = transfer_json(None);
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    claims_found(&mut h.server).await;
    h.server.expect("POST", SECRETS, Reply::Echo).await;
    h.server.expect("POST", NETPOLS, Reply::Echo).await;
    let pod = h.server.expect("POST", PODS, Reply::Echo).await.body;
    assert_eq!(
        pod["spec"]["securityContext"],
        json!({
            "runAsNonRoot": true,
            "fsGroupChangePolicy": "OnRootMismatch",
            "supplementalGroups": [107],
            "seccompProfile": {"type": "RuntimeDefault"}
        })
    );
    h.server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    h.server.expect_event(NS).await;
    finish(task).await;
    h.server.done().await;
}

/// A pvcTemplate naming a claim someone else created: Failed, saying what to change.
#[tokio::test]
async fn a_template_claim_owned_by_someone_else_fails() {
    let mut h = Harness::new(settings());
    let object = transfer_json(None);
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    h.server
        .expect("GET", &format!("{PVCS}/golden"), Reply::Ok(golden_pvc()))
        .await;
    let mut foreign = copy_pvc();
    foreign["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("ownerReferences");
    h.server
        .expect("GET", &format!("{PVCS}/copy"), Reply::Ok(foreign))
        .await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let end = status_of(&seen).clone();
    assert_eq!(end["phase"], "Failed");
    assert!(end["message"]
        .as_str()
        .unwrap()
        .starts_with("pvc/copy already exists and was not created by this Transfer"));
    h.server.expect_event(NS).await;
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

/// A referenced Secret key that does not exist: Pending, naming the Secret and the key
/// (never a value), before any pod would hang on mounting it.
#[tokio::test]
async fn a_missing_secret_key_waits_with_its_name() {
    let mut h = Harness::new(settings());
    let mut object = transfer_json(None);
    object["spec"]["source"] = json!({
        "url": "s3://images/fedora.raw",
        "s3": {"accessKeyId": {"name": "s3-creds", "key": "id"},
               "secretAccessKey": {"name": "s3-creds", "key": "secret"}},
    });
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    h.server
        .expect("GET", &format!("{PVCS}/copy"), Reply::Ok(copy_pvc()))
        .await;
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": "s3-creds", "namespace": NS},
                        "data": {"id": "QUtJQUVYQU1QTEU="}});
    h.server
        .expect("GET", &format!("{SECRETS}/s3-creds"), Reply::Ok(secret))
        .await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let pending = status_of(&seen).clone();
    assert_eq!(pending["phase"], "Pending");
    assert_eq!(
        pending["message"],
        "secret/s3-creds has no key 'secret': add it, or fix the secretKeyRef's key"
    );
    let event = h.server.expect_event(NS).await;
    for text in [seen.body.to_string(), event.body.to_string()] {
        assert!(!text.contains("QUtJQUVYQU1QTEU"), "{text}");
    }
    finish(task).await;
    h.server.done().await;
}

/// A mover pod that cannot be scheduled: the status says why; the same reason again
/// writes nothing.
#[tokio::test]
async fn an_unschedulable_mover_is_reported() {
    let mut h = Harness::new(settings());
    let message = "mover pod import-ft-1 (attempt 1) is starting";
    let status = json!({
        "phase": "Running", "attempts": 1, "moverPod": "import-ft-1", "observedGeneration": 1,
        "startTime": "2026-01-01T00:00:00Z",
        "conditions": conditions(("False", "MoverStarting"), ("False", "MoverStarting"), message),
    });
    let object = transfer_json(Some(status));
    let t = transfer(&object);
    let mut pod = mover_pod(&t, 1);
    pod.status = Some(
        serde_json::from_value(json!({"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity."}]}))
        .unwrap(),
    );
    h.pod_seen(pod);
    let task = tokio::spawn(reconcile(t, h.ctx.clone()));
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let stuck = status_of(&seen).clone();
    let why = "mover pod import-ft-1 (attempt 1) cannot start yet: Unschedulable: 0/3 nodes are available: 3 node(s) didn't match Pod's node affinity.";
    assert_eq!(stuck["message"], why);
    assert_eq!(condition(&stuck, "Running")["message"], why);
    assert_eq!(h.server.expect_event(NS).await.body["type"], "Warning");
    finish(task).await;
    let object = with_status(&object, &json!({ "status": stuck }));
    reconcile(transfer(&object), h.ctx.clone()).await.unwrap();
    h.server.done().await;
    assert_eq!(h.server.count, 2);
}

/// A mover pod not ready ten minutes after its creation (its volume never attaches): the
/// attempt fails as a lost mover, the status naming the pod's last warning events, and the
/// pod and its token go.
#[tokio::test]
async fn a_mover_that_never_starts_fails_its_attempt_with_its_events() {
    let mut h = Harness::new(settings());
    let message = "mover pod import-ft-1 (attempt 1) is starting";
    let status = json!({
        "phase": "Pending", "attempts": 1, "moverPod": "import-ft-1", "observedGeneration": 1,
        "startTime": "2026-01-01T00:00:00Z",
        "conditions": conditions(("False", "MoverStarting"), ("False", "MoverStarting"), message),
    });
    let object = transfer_json(Some(status));
    let t = transfer(&object);
    let mut pod = mover_pod(&t, 1);
    pod.metadata.creation_timestamp =
        Some(serde_json::from_value(json!("2026-01-01T00:00:00Z")).unwrap());
    pod.status = Some(
        serde_json::from_value(json!({"phase": "Pending", "containerStatuses": [{
            "name": "mover", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}}}]}))
        .unwrap(),
    );
    h.pod_seen(pod);
    let task = tokio::spawn(reconcile(t, h.ctx.clone()));
    let list = h
        .server
        .expect("GET", &format!("/api/v1/namespaces/{NS}/events"), Reply::Ok(json!({
            "apiVersion": "v1", "kind": "EventList", "metadata": {},
            "items": [
                {"metadata": {"name": "e1", "namespace": NS}, "involvedObject": {"kind": "Pod", "name": "import-ft-1"},
                 "type": "Normal", "reason": "Scheduled", "message": "Successfully assigned vms/import-ft-1 to node-b",
                 "lastTimestamp": "2026-01-01T00:00:01Z"},
                {"metadata": {"name": "e3", "namespace": NS}, "involvedObject": {"kind": "Pod", "name": "import-ft-1"},
                 "type": "Warning", "reason": "FailedMount", "message": "Unable to attach or mount volumes: timed out waiting for the condition",
                 "lastTimestamp": "2026-01-01T00:02:00Z"},
                {"metadata": {"name": "e2", "namespace": NS}, "involvedObject": {"kind": "Pod", "name": "import-ft-1"},
                 "type": "Warning", "reason": "FailedAttachVolume", "message": "Multi-Attach error for volume \"pvc-9\" Volume is already exclusively attached to one node and can't be attached to another",
                 "lastTimestamp": "2026-01-01T00:00:02Z"},
            ]
        })))
        .await;
    assert!(
        list.query.contains(
            "fieldSelector=involvedObject.kind%3DPod%2CinvolvedObject.name%3Dimport-ft-1"
        ),
        "{}",
        list.query
    );
    h.server
        .expect("DELETE", &format!("{PODS}/import-ft-1"), Reply::Deleted)
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{SECRETS}/import-ft-1-token"),
            Reply::Deleted,
        )
        .await;
    h.server
        .expect("DELETE", &format!("{NETPOLS}/import-ft-1"), Reply::Deleted)
        .await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let lost = status_of(&seen).clone();
    let why = "mover pod import-ft-1 (attempt 1) was not ready 600s after its creation; its last warnings: FailedAttachVolume: Multi-Attach error for volume \"pvc-9\" Volume is already exclusively attached to one node and can't be attached to another; FailedMount: Unable to attach or mount volumes: timed out waiting for the condition";
    assert_eq!(lost["message"], why);
    assert_eq!(condition(&lost, "Running")["reason"], "MoverLost");
    let event = h.server.expect_event(NS).await.body;
    assert_eq!(
        (event["type"].as_str(), event["note"].as_str()),
        (Some("Warning"), Some(why))
    );
    finish(task).await;
    h.server.done().await;
}

/// A mover scheduled on node-b that has not started after a minute, its claim's volume
/// still attached to node-a whose kubelet stopped reporting (a failed node): the status
/// names the volume, the node and the remedy, with a Warning event; the next look within
/// half a minute asks the API nothing.
#[tokio::test]
async fn a_mover_waiting_on_a_failed_nodes_attachment_says_so() {
    let mut h = Harness::new(settings());
    let message = "mover pod import-ft-1 (attempt 1) is starting";
    let status = json!({
        "phase": "Pending", "attempts": 1, "moverPod": "import-ft-1", "observedGeneration": 1,
        "startTime": "2026-01-01T00:00:00Z",
        "conditions": conditions(("False", "MoverStarting"), ("False", "MoverStarting"), message),
    });
    let object = transfer_json(Some(status));
    let t = transfer(&object);
    let mut pod = mover_pod(&t, 1);
    let two_minutes_ago =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(120);
    pod.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        two_minutes_ago,
    ));
    pod.spec.as_mut().unwrap().node_name = Some("node-b".into());
    pod.status = Some(
        serde_json::from_value(json!({"phase": "Pending", "containerStatuses": [{
            "name": "mover", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}}}]}))
        .unwrap(),
    );
    h.pod_seen(pod);
    let task = tokio::spawn(reconcile(t, h.ctx.clone()));
    let mut golden = golden_pvc();
    golden["spec"]["volumeName"] = json!("pv-golden");
    h.server
        .expect("GET", &format!("{PVCS}/golden"), Reply::Ok(golden))
        .await;
    let mut copy = copy_pvc();
    copy["spec"]["volumeName"] = json!("pv-copy");
    h.server
        .expect("GET", &format!("{PVCS}/copy"), Reply::Ok(copy))
        .await;
    h.server
        .expect(
            "GET",
            "/apis/storage.k8s.io/v1/volumeattachments",
            Reply::Ok(json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachmentList", "metadata": {},
                "items": [
                    {"metadata": {"name": "csi-1"}, "spec": {"attacher": "rbd.csi.ceph.com",
                        "nodeName": "node-a", "source": {"persistentVolumeName": "pv-golden"}},
                     "status": {"attached": true}},
                    {"metadata": {"name": "csi-2"}, "spec": {"attacher": "rbd.csi.ceph.com",
                        "nodeName": "node-c", "source": {"persistentVolumeName": "pv-other"}},
                     "status": {"attached": true}},
                ],
            })),
        )
        .await;
    h.server
        .expect(
            "GET",
            "/api/v1/nodes/node-a",
            Reply::Ok(json!({
                "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
                "status": {"conditions": [{"type": "Ready", "status": "Unknown",
                    "reason": "NodeStatusUnknown",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
            })),
        )
        .await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let waiting = status_of(&seen).clone();
    let said = waiting["message"].as_str().unwrap();
    assert!(
        said.starts_with(
            "mover pod import-ft-1 (attempt 1) cannot start yet: volume pv-golden of claim \
             golden is still attached to node node-a, which is not ready (Ready=Unknown since \
             2026-01-01T00:00:00Z)"
        ),
        "{said}"
    );
    assert!(said.contains("out-of-service"), "{said}");
    assert_eq!(condition(&waiting, "Running")["reason"], "MoverStarting");
    let event = h.server.expect_event(NS).await.body;
    assert_eq!(event["type"], "Warning");
    finish(task).await;
    h.server.done().await;

    // Looked at again within half a minute: the check's answer is reused, no request.
    let object = with_status(&object, &json!({ "status": waiting }));
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    finish(task).await;
    h.server.done().await;
}

/// The last attempt's mover crashed: the resource fails, and that pod stays (its token
/// and NetworkPolicy go) so that `kubectl logs` shows why; the status says so, and a later
/// reconcile of the final resource leaves it.
#[tokio::test]
async fn a_crashed_last_mover_is_kept_for_its_logs() {
    let mut h = Harness::new(settings());
    let object = transfer_json(Some(running_status(3)));
    let t = transfer(&object);
    let mut crashed = mover_pod(&t, 3);
    crashed.status = Some(
        serde_json::from_value(json!({"phase": "Failed", "containerStatuses": [{
            "name": "mover", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 101, "reason": "Error",
                "message": "thread 'main' panicked at src/main.rs:1:1"}}}]}))
        .unwrap(),
    );
    h.pod_seen(crashed);
    let task = tokio::spawn(reconcile(t, h.ctx.clone()));
    h.server
        .expect(
            "DELETE",
            &format!("{SECRETS}/import-ft-3-token"),
            Reply::Deleted,
        )
        .await;
    h.server
        .expect("DELETE", &format!("{NETPOLS}/import-ft-3"), Reply::Deleted)
        .await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let end = status_of(&seen).clone();
    assert_eq!(end["phase"], "Failed");
    let message = end["message"].as_str().unwrap();
    assert!(
        message.ends_with(
            "the last mover's pod is kept for its logs: kubectl -n vms logs import-ft-3"
        ),
        "{message}"
    );
    assert!(message.contains("panicked"), "{message}");
    h.server.expect_event(NS).await;
    finish(task).await;
    h.server.done().await;

    // Final: a reconcile costs nothing and leaves the pod.
    let object = with_status(&object, &json!({ "status": end }));
    let task = tokio::spawn(reconcile(transfer(&object), h.ctx.clone()));
    h.server.done().await;
    finish(task).await;
}

/// A final Transfer whose mover pod was left behind (the operator stopped between the
/// final status and the deletion) gets it deleted; one without costs nothing.
#[tokio::test]
async fn a_mover_left_behind_by_a_final_transfer_is_deleted() {
    let mut h = Harness::new(settings());
    let mut status = running_status(1);
    status["phase"] = json!("Succeeded");
    let object = transfer_json(Some(status));
    let t = transfer(&object);
    let pod = ready(mover_pod(&t, 1), "node-a");
    h.pod_seen(pod.clone());
    let task = tokio::spawn(reconcile(t.clone(), h.ctx.clone()));
    h.server
        .expect("DELETE", &format!("{PODS}/import-ft-1"), Reply::Deleted)
        .await;
    h.server
        .expect(
            "DELETE",
            &format!("{SECRETS}/import-ft-1-token"),
            Reply::Deleted,
        )
        .await;
    h.server
        .expect("DELETE", &format!("{NETPOLS}/import-ft-1"), Reply::Deleted)
        .await;
    assert_eq!(finish(task).await, Action::await_change());
    h.pod_gone(pod);
    reconcile(t, h.ctx.clone()).await.unwrap();
    h.server.done().await;
    assert_eq!(h.server.count, 3);
}

/// Least privilege: every grant of deploy/operator's roles is asked for by a scenario (or
/// exempted with a reason).
#[test]
fn the_operator_roles_grant_nothing_the_scenarios_do_not_use() {
    support::rbac::check_least_privilege();
}
