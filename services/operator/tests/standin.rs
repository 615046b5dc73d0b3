//! The operator's real controllers (`controller::run`, unchanged) against the stateful API
//! stand-in of the test kit, with its simulated PVC binding, scheduler, attach/detach and
//! kubelet switched on, and a fake mover link that finishes every job after a moment.
//! Where the scripted scenarios (tests/scenarios.rs) check each request in order, these
//! check what a cluster would show: objects, their states over time, Events, and that the
//! operator's RBAC (deploy/operator) allowed every request it made.

mod support;

mod cross_namespace;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferry_operator::controller::{
    self, mover_ca, mover_selector, JobReport, JobRequest, JobState, LinkError, MoverAddress,
    MoverLink, OperatorSettings, ReportStream,
};
use ferry_operator::metrics::OperatorMetrics;
use ferry_testkit::kube::{ChangeType, Cluster, Sent, Sim};
use futures::StreamExt;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use support::rbac::{rbac_file, SERVICE_ACCOUNT};
use support::{job_id, report, settings};

const NS: &str = "vms";

/// A mover that takes every job and finishes it `after` a moment, the whole image done.
struct DoneLink {
    after: Duration,
}

#[async_trait]
impl MoverLink for DoneLink {
    async fn start(&self, _mover: &MoverAddress, job: &JobRequest) -> Result<JobReport, LinkError> {
        Ok(report(&job_id(job.idempotency_key()), JobState::Running, 0))
    }

    async fn watch(&self, _mover: &MoverAddress, job_id: &str) -> Result<ReportStream, LinkError> {
        let done = report(job_id, JobState::Succeeded, 4 << 20);
        let after = self.after;
        Ok(futures::stream::once(async move {
            tokio::time::sleep(after).await;
            Ok(done)
        })
        .boxed())
    }

    async fn cancel(&self, _mover: &MoverAddress, _owner_uid: &str) -> Result<(), LinkError> {
        Ok(())
    }

    async fn end_relay(&self, _mover: &MoverAddress, _owner_uid: &str) -> Result<(), LinkError> {
        Ok(())
    }
}

/// A cluster of two nodes, a default WaitForFirstConsumer class (local-path, as on kind)
/// and an Immediate one of network storage, the operator's namespace and `vms`.
fn cluster() -> Cluster {
    let c = Cluster::new();
    c.simulate(&Sim::ALL);
    c.add_namespace("ferry-system", &[], &[]);
    c.add_namespace(NS, &[], &[]);
    c.add_node("node-a", &[]);
    c.add_node("node-b", &[]);
    c.add_storage_class("local-path", "rancher.io/local-path", true, true);
    c.add_storage_class("ceph-rbd", "rbd.csi.ceph.com", false, false);
    c
}

/// The operator's controllers, running as its ServiceAccount, until dropped.
struct Operator(tokio::task::JoinHandle<()>);

impl Drop for Operator {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn start(cluster: &Cluster, settings: OperatorSettings) -> Operator {
    start_with(cluster, settings, Duration::from_millis(300))
}

/// The operator with movers whose jobs take `after`.
fn start_with(cluster: &Cluster, settings: OperatorSettings, after: Duration) -> Operator {
    let client = cluster.client_as(&rbac_file(), SERVICE_ACCOUNT);
    let link = Arc::new(DoneLink { after });
    let metrics = Arc::new(OperatorMetrics::new());
    Operator(tokio::spawn(async move {
        // The movers' CA, made and stored as the binary does (its Secret in the
        // operator's namespace, through the operator's RBAC).
        let ca = mover_ca::load_or_create(&client, "ferry-system")
            .await
            .expect("the movers' CA");
        controller::run(client, settings, link, Some(Arc::new(ca)), metrics)
            .await
            .expect("the controllers run");
    }))
}

fn transfers(cluster: &Cluster) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("ferry.dev", "v1alpha1", "Transfer");
    Api::namespaced_with(cluster.client(), NS, &ApiResource::from_gvk(&gvk))
}

async fn apply_transfer(cluster: &Cluster, name: &str, spec: Value) {
    let t: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": name, "namespace": NS}, "spec": spec,
    }))
    .unwrap();
    transfers(cluster)
        .create(&PostParams::default(), &t)
        .await
        .unwrap();
}

fn claim(name: &str, class: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": name, "namespace": NS},
           "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                    "resources": {"requests": {"storage": "4Mi"}}}})
}

fn pod_using(name: &str, claim: &str, node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
           "spec": {"nodeName": node, "containers": [{"name": "main", "image": "vm"}],
                    "volumes": [{"name": "disk", "persistentVolumeClaim": {"claimName": claim}}]}})
}

/// Waits until `f` holds (checked every 20 ms), or fails after `secs` naming `what`.
async fn until(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn phase_of(cluster: &Cluster, name: &str) -> Option<String> {
    let t = cluster.get("ferry.dev", "transfers", NS, name)?;
    t["status"]["phase"].as_str().map(String::from)
}

/// Every change received so far.
fn drain(rx: &mut UnboundedReceiver<Sent>) -> Vec<Sent> {
    let mut out = Vec::new();
    while let Ok(s) = rx.try_recv() {
        out.push(s);
    }
    out
}

fn name_of(o: &Value) -> String {
    o["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The operator made no request its roles refuse.
fn assert_no_refusal(cluster: &Cluster) {
    let denied = cluster.denied();
    assert!(
        denied.is_empty(),
        "the API server refused the operator: {denied:#?}"
    );
}

/// A PVC-to-PVC Transfer on a local-path cluster: the source was written on one node by a
/// pod that has ended, so its volume lives there; the mover is scheduled there, the new
/// claim (WaitForFirstConsumer) is provisioned there, the job runs, the Transfer
/// Succeeded, and the mover and its token go.
#[tokio::test]
async fn a_pvc_to_pvc_transfer_runs_to_succeeded_on_the_node_of_its_volumes() {
    let cluster = cluster();
    cluster.create(claim("golden", "local-path"));
    // Scheduled (a WaitForFirstConsumer claim is only provisioned for a scheduled pod).
    let mut writer = pod_using("writer", "golden", "node-b");
    writer["spec"]["nodeName"] = Value::Null;
    writer["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": "node-b"});
    cluster.create(writer);
    until(5, "the writer to run", || {
        cluster.get("", "pods", NS, "writer").unwrap()["status"]["phase"] == "Running"
    })
    .await;
    assert!(cluster.exit_pod(NS, "writer", 0));
    let mut movers = cluster.changes("", "pods", &mover_selector());
    let _operator = start(&cluster, settings());
    apply_transfer(
        &cluster,
        "import",
        json!({"source": {"pvc": {"name": "golden"}},
               "targets": [{"pvcTemplate": {"name": "copy", "size": "4Mi"}}]}),
    )
    .await;
    until(20, "the Transfer to succeed", || {
        phase_of(&cluster, "import").as_deref() == Some("Succeeded")
    })
    .await;

    let transfer = cluster.get("ferry.dev", "transfers", NS, "import").unwrap();
    assert_eq!(transfer["status"]["node"], "node-b", "{transfer}");
    let seen = drain(&mut movers);
    let running: Vec<&Value> = seen
        .iter()
        .map(|(_, pod, _)| pod)
        .filter(|pod| pod["status"]["phase"] == "Running")
        .collect();
    let mover = running.last().expect("the mover ran");
    assert_eq!(mover["spec"]["nodeName"], "node-b");
    assert!(mover["status"]["podIP"].is_string());
    let violations = ferry_testkit::pod_security::restricted_violations(mover);
    assert!(violations.is_empty(), "{violations:?}");
    let copy = cluster
        .get("", "persistentvolumeclaims", NS, "copy")
        .unwrap();
    assert_eq!(copy["status"]["phase"], "Bound");
    assert_eq!(
        copy["metadata"]["annotations"]["volume.kubernetes.io/selected-node"],
        "node-b"
    );
    let events = cluster.events_of("", "persistentvolumeclaims", NS, "copy");
    assert!(
        events.iter().any(|e| e.1 == "ProvisioningSucceeded"),
        "{events:?}"
    );
    // Done: the mover pod and its token Secret go.
    let pod = name_of(mover);
    until(10, "the mover to go", || {
        cluster.get("", "pods", NS, &pod).is_none()
    })
    .await;
    until(5, "the token Secret to go", || {
        cluster
            .list("", "secrets")
            .iter()
            .all(|s| s["metadata"]["namespace"] != NS)
    })
    .await;
    assert!(transfer["status"]["conditions"].is_array());
    assert_no_refusal(&cluster);
}

/// Twenty Transfers applied at once with a limit of five movers: never more than five
/// mover pods exist at once (counted from every change the stand-in stored), and every
/// Transfer Succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_transfers_never_run_more_movers_than_the_limit() {
    let cluster = cluster();
    let mut movers = cluster.changes("", "pods", &mover_selector());
    let mut s = settings();
    s.max_movers = 5;
    let _operator = start(&cluster, s);
    let names: Vec<String> = (0..20).map(|i| format!("import-{i:02}")).collect();
    for name in &names {
        apply_transfer(
            &cluster,
            name,
            json!({"source": {"url": "s3://images/fedora.raw"},
                   "targets": [{"pvcTemplate": {"name": format!("disk-{name}"), "size": "4Mi",
                                                "storageClassName": "ceph-rbd"}}]}),
        )
        .await;
    }
    let all_done = || {
        names
            .iter()
            .all(|n| phase_of(&cluster, n).as_deref() == Some("Succeeded"))
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !all_done() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !all_done() {
        let states: Vec<String> = names
            .iter()
            .map(|n| {
                let t = cluster.get("ferry.dev", "transfers", NS, n).unwrap();
                format!("{n}: {}", t["status"])
            })
            .collect();
        let pods: Vec<String> = cluster
            .list("", "pods")
            .iter()
            .map(|p| {
                format!(
                    "{} {} {}",
                    name_of(p),
                    p["status"]["phase"],
                    p["metadata"]["deletionTimestamp"]
                )
            })
            .collect();
        panic!(
            "not every Transfer succeeded:\n{}\npods: {pods:#?}",
            states.join("\n")
        );
    }
    let mut live = BTreeSet::new();
    let mut most = 0;
    let mut created = 0;
    for (kind, pod, _) in drain(&mut movers) {
        match kind {
            ChangeType::Added => {
                created += 1;
                live.insert(name_of(&pod));
            }
            ChangeType::Deleted => {
                live.remove(&name_of(&pod));
            }
            ChangeType::Modified => {}
        }
        most = most.max(live.len());
    }
    assert_eq!(created, 20, "one mover per Transfer");
    assert!(
        most <= 5,
        "{most} mover pods existed at once; the limit is 5"
    );
    assert_eq!(most, 5, "the limit was used to the full");
    assert_no_refusal(&cluster);
}

/// A Transfer from a ReadWriteOnce claim a running VM uses on node-b: the mover is pinned
/// to node-b (its volume is attached there) instead of landing on the emptier node-a and
/// waiting on a Multi-Attach error.
#[tokio::test]
async fn a_mover_of_a_claim_in_use_lands_on_the_node_of_its_user() {
    let cluster = cluster();
    cluster.create(claim("vm-disk", "ceph-rbd"));
    // The VM reads the disk (mounted read-only); one that writes it makes a copy wait
    // (tests/reconcile.rs).
    let mut vm = pod_using("virt-launcher-vm1", "vm-disk", "node-b");
    vm["spec"]["volumes"][0]["persistentVolumeClaim"]["readOnly"] = json!(true);
    cluster.create(vm);
    until(5, "the VM to run", || {
        cluster.get("", "pods", NS, "virt-launcher-vm1").unwrap()["status"]["phase"] == "Running"
    })
    .await;
    let mut movers = cluster.changes("", "pods", &mover_selector());
    let _operator = start(&cluster, settings());
    apply_transfer(
        &cluster,
        "backup-disk",
        json!({"source": {"pvc": {"name": "vm-disk"}},
               "targets": [{"pvcTemplate": {"name": "vm-disk-copy", "size": "4Mi",
                                            "storageClassName": "ceph-rbd"}}]}),
    )
    .await;
    until(20, "the Transfer to succeed", || {
        phase_of(&cluster, "backup-disk").as_deref() == Some("Succeeded")
    })
    .await;
    let seen = drain(&mut movers);
    let (_, created, _) = seen
        .iter()
        .find(|(kind, _, _)| *kind == ChangeType::Added)
        .expect("a mover was created");
    let pinned = &created["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchFields"]
        [0];
    assert_eq!(
        pinned,
        &json!({"key": "metadata.name", "operator": "In", "values": ["node-b"]})
    );
    let ran = seen
        .iter()
        .map(|(_, pod, _)| pod)
        .find(|pod| pod["status"]["phase"] == "Running")
        .expect("the mover ran");
    assert_eq!(ran["spec"]["nodeName"], "node-b");
    let attach_errors: Vec<_> = seen
        .iter()
        .flat_map(|(_, pod, _)| cluster.events_of("", "pods", NS, &name_of(pod)))
        .filter(|e| e.1 == "FailedAttachVolume")
        .collect();
    assert!(attach_errors.is_empty(), "{attach_errors:?}");
    assert_no_refusal(&cluster);
}

/// A rollout into ten new claims on three nodes whose driver attaches four volumes each:
/// one mover could never attach them all; the Transfer fans out into three groups (4, 3
/// and 3 claims), each a child Transfer whose mover is placed on its node and whose claims
/// are provisioned there; every group and the Transfer succeed, and no pod ever waits on
/// the attach limit. The origin is read once: the first group serves a relay (its
/// NetworkPolicy admits the rollout's movers on the relay's port), the others wait for it
/// to copy and read it at its pod's IP with their own certificates (each job takes 6 s, so
/// the relay still serves when they look, every 5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_over_the_attach_limit_fans_out_over_nodes_and_succeeds() {
    let cluster = cluster();
    cluster.add_node("node-c", &[]);
    for node in ["node-a", "node-b", "node-c"] {
        cluster.put(json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
            "metadata": {"name": node},
            "spec": {"drivers": [{"name": "rancher.io/local-path", "nodeID": node,
                                  "allocatable": {"count": 4}}]}}));
    }
    let mut movers = cluster.changes("", "pods", &mover_selector());
    let mut policies = cluster.changes("networking.k8s.io", "networkpolicies", &mover_selector());
    let _operator = start_with(&cluster, settings(), Duration::from_secs(6));
    apply_transfer(
        &cluster,
        "rollout",
        json!({"source": {"url": "https://images.example.com/golden.img"},
               "pvcTemplates": {"namePrefix": "vm-", "count": 10, "size": "4Mi"}}),
    )
    .await;
    until(60, "the rollout to succeed", || {
        phase_of(&cluster, "rollout").as_deref() == Some("Succeeded")
    })
    .await;
    let seen = drain(&mut movers);
    let seed_pod = seen
        .iter()
        .map(|(_, pod, _)| pod)
        .find(|pod| {
            pod["metadata"]["annotations"]["ferry.dev/owner-name"] == "rollout-g0"
                && pod["status"]["podIP"].is_string()
        })
        .expect("the serving group's mover ran")
        .clone();
    let relay_url = format!(
        "nbds://{}:10810/?tls-hostname={}.{NS}.mover.ferry.dev",
        seed_pod["status"]["podIP"].as_str().unwrap(),
        name_of(&seed_pod)
    );
    let policy = drain(&mut policies)
        .into_iter()
        .map(|(_, policy, _)| policy)
        .find(|p| name_of(p) == name_of(&seed_pod))
        .expect("the serving mover's NetworkPolicy");
    assert_eq!(
        policy["spec"]["ingress"][1]["ports"],
        json!([{"port": 10810, "protocol": "TCP"}])
    );
    for (group, relay) in [
        ("rollout-g0", json!({"serve": true})),
        ("rollout-g1", json!({"from": "rollout-g0"})),
        ("rollout-g2", json!({"from": "rollout-g0"})),
    ] {
        let child = cluster.get("ferry.dev", "transfers", NS, group).unwrap();
        assert_eq!(child["spec"]["relay"], relay, "{group}");
        if group != "rollout-g0" {
            assert_eq!(
                child["status"]["sourceRelay"],
                relay_url.as_str(),
                "{group}"
            );
            let pod = seen
                .iter()
                .map(|(_, pod, _)| pod)
                .find(|pod| pod["metadata"]["annotations"]["ferry.dev/owner-name"] == group)
                .expect("the reading group's mover");
            let volumes = pod["spec"]["volumes"].as_array().unwrap();
            assert!(volumes.iter().any(|v| v["name"] == "relay-tls"), "{group}");
        }
    }
    let rollout = cluster
        .get("ferry.dev", "transfers", NS, "rollout")
        .unwrap();
    let fan_out = &rollout["status"]["fanOut"];
    assert_eq!(
        fan_out["groups"],
        json!([
            {"name": "rollout-g0", "node": "node-a", "targets": [[0, 4]], "phase": "Succeeded"},
            {"name": "rollout-g1", "node": "node-b", "targets": [[4, 7]], "phase": "Succeeded"},
            {"name": "rollout-g2", "node": "node-c", "targets": [[7, 10]], "phase": "Succeeded"},
        ])
    );
    assert_eq!(fan_out["targetsSucceeded"], 10);
    assert_eq!(
        rollout["status"]["message"],
        "10 targets written by 3 mover groups"
    );
    for (group, node, claims) in [
        (0, "node-a", 0..4),
        (1, "node-b", 4..7),
        (2, "node-c", 7..10),
    ] {
        let child = cluster
            .get("ferry.dev", "transfers", NS, &format!("rollout-g{group}"))
            .unwrap();
        assert_eq!(child["status"]["phase"], "Succeeded");
        assert_eq!(child["metadata"]["ownerReferences"][0]["name"], "rollout");
        assert_eq!(child["status"]["node"], node);
        for i in claims {
            let claim = cluster
                .get("", "persistentvolumeclaims", NS, &format!("vm-{i}"))
                .unwrap();
            assert_eq!(claim["status"]["phase"], "Bound", "vm-{i}");
            assert_eq!(
                claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"], node,
                "vm-{i}"
            );
        }
    }
    let mut seen = seen;
    seen.extend(drain(&mut movers));
    let mut ran: Vec<(String, String)> = seen
        .iter()
        .map(|(_, pod, _)| pod)
        .filter(|pod| pod["status"]["phase"] == "Running")
        .map(|pod| {
            let owner = pod["metadata"]["ownerReferences"][0]["name"]
                .as_str()
                .unwrap_or_default();
            (
                owner.to_string(),
                pod["spec"]["nodeName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    ran.sort();
    ran.dedup();
    assert_eq!(
        ran,
        [
            ("rollout-g0".to_string(), "node-a".to_string()),
            ("rollout-g1".to_string(), "node-b".to_string()),
            ("rollout-g2".to_string(), "node-c".to_string()),
        ]
    );
    let waits: Vec<_> = seen
        .iter()
        .flat_map(|(_, pod, _)| cluster.events_of("", "pods", NS, &name_of(pod)))
        .filter(|e| e.2.contains("exceed max volume count") || e.1 == "FailedAttachVolume")
        .collect();
    assert!(waits.is_empty(), "{waits:?}");
    assert_no_refusal(&cluster);
}

/// Deleting a finished Transfer keeps the claim it created by default (`claimRetention:
/// Retain`) and deletes it with `Delete` (garbage-collected as the Transfer's dependent,
/// its volume reclaimed).
#[tokio::test]
async fn deleting_a_transfer_keeps_or_deletes_its_claims_as_its_retention_says() {
    let cluster = cluster();
    let _operator = start(&cluster, settings());
    for (name, retention) in [("keep", None), ("drop", Some("Delete"))] {
        let mut spec = json!({"source": {"url": "s3://images/fedora.raw"},
            "targets": [{"pvcTemplate": {"name": format!("disk-{name}"), "size": "4Mi",
                                         "storageClassName": "ceph-rbd"}}]});
        if let Some(r) = retention {
            spec["claimRetention"] = json!(r);
        }
        apply_transfer(&cluster, name, spec).await;
    }
    until(20, "both Transfers to succeed", || {
        ["keep", "drop"]
            .iter()
            .all(|n| phase_of(&cluster, n).as_deref() == Some("Succeeded"))
    })
    .await;
    let dropped_pv = cluster
        .get("", "persistentvolumeclaims", NS, "disk-drop")
        .unwrap()["spec"]["volumeName"]
        .as_str()
        .unwrap()
        .to_string();
    for name in ["keep", "drop"] {
        transfers(&cluster)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    until(10, "both Transfers to go", || {
        cluster.list("ferry.dev", "transfers").is_empty()
    })
    .await;
    until(10, "the Delete claim and its volume to go", || {
        cluster
            .get("", "persistentvolumeclaims", NS, "disk-drop")
            .is_none()
            && cluster
                .get("", "persistentvolumes", "", &dropped_pv)
                .is_none()
    })
    .await;
    let kept = cluster
        .get("", "persistentvolumeclaims", NS, "disk-keep")
        .expect("the Retain claim stays");
    assert!(kept["metadata"]["deletionTimestamp"].is_null());
    assert_eq!(kept["status"]["phase"], "Bound");
    assert_no_refusal(&cluster);
}

/// The reconciler reads mover pods from one watch's store and is woken by another watch
/// (the controller's own watch of the pods it owns). On a real cluster the two streams
/// deliver a change in either order; here the store's watch lags 300 ms and a pod takes a
/// second to start, so the trigger of "the mover is ready" comes while the store still
/// holds it as Pending. The jobs must start anyway, within seconds, not at the next resync
/// (five minutes).
#[tokio::test]
async fn a_mover_store_behind_the_controllers_trigger_still_starts_the_jobs() {
    let cluster = cluster();
    cluster.pod_start_delay(Duration::from_secs(1));
    cluster.lag_watches("", "pods", &mover_selector(), Duration::from_millis(300));
    let _operator = start(&cluster, settings());
    apply_transfer(
        &cluster,
        "import",
        json!({"source": {"url": "s3://images/fedora.raw"},
               "targets": [{"pvcTemplate": {"name": "disk", "size": "4Mi",
                                            "storageClassName": "ceph-rbd"}}]}),
    )
    .await;
    until(20, "the Transfer to succeed", || {
        phase_of(&cluster, "import").as_deref() == Some("Succeeded")
    })
    .await;
    assert_no_refusal(&cluster);
}

/// A freed mover slot is used within seconds even when the store of mover pods lags: a
/// mover created, run and deleted before the store showed it must not leave its slot
/// reserved (the reservation is only dropped when the store shows the pod, else after a
/// minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_transfers_take_freed_slots_while_the_mover_store_lags() {
    let cluster = cluster();
    cluster.lag_watches("", "pods", &mover_selector(), Duration::from_millis(300));
    let mut s = settings();
    s.max_movers = 2;
    let _operator = start(&cluster, s);
    let names: Vec<String> = (0..6).map(|i| format!("queued-{i}")).collect();
    let begun = std::time::Instant::now();
    for name in &names {
        apply_transfer(
            &cluster,
            name,
            json!({"source": {"url": "s3://images/fedora.raw"},
                   "targets": [{"pvcTemplate": {"name": format!("disk-{name}"), "size": "4Mi",
                                                "storageClassName": "ceph-rbd"}}]}),
        )
        .await;
    }
    until(20, "every Transfer to succeed", || {
        names
            .iter()
            .all(|n| phase_of(&cluster, n).as_deref() == Some("Succeeded"))
    })
    .await;
    // Three waves of two movers of ~0.3 s each, the store 0.3 s behind: seconds, where a
    // slot held by a mover the store never showed stayed taken for a minute.
    assert!(
        begun.elapsed() < Duration::from_secs(15),
        "{:?}",
        begun.elapsed()
    );
    assert_no_refusal(&cluster);
}

/// `ferry operator render` plans what the operator creates: the same cluster objects
/// given to render, its mover pod (pinned to the node of the claim's user), its
/// NetworkPolicy, its template claim and its token Secret's keys are those the real
/// controllers created on the stand-in.
#[tokio::test]
async fn render_plans_the_objects_the_operator_creates() {
    let cluster = cluster();
    cluster.create(claim("vm-disk", "ceph-rbd"));
    // The VM reads the disk (mounted read-only); one that writes it makes a copy wait
    // (tests/reconcile.rs).
    let mut vm = pod_using("virt-launcher-vm1", "vm-disk", "node-b");
    vm["spec"]["volumes"][0]["persistentVolumeClaim"]["readOnly"] = json!(true);
    cluster.create(vm);
    until(5, "the VM to run", || {
        cluster.get("", "pods", NS, "virt-launcher-vm1").unwrap()["status"]["phase"] == "Running"
    })
    .await;
    let mut movers = cluster.changes("", "pods", &mover_selector());
    let mut policies = cluster.changes("networking.k8s.io", "networkpolicies", "");
    let _operator = start(&cluster, settings());
    apply_transfer(
        &cluster,
        "backup-disk",
        json!({"source": {"pvc": {"name": "vm-disk"}},
               "targets": [{"pvcTemplate": {"name": "vm-disk-copy", "size": "4Mi",
                                            "storageClassName": "ceph-rbd"}}]}),
    )
    .await;
    let mut transfer = cluster
        .get("ferry.dev", "transfers", NS, "backup-disk")
        .unwrap();
    until(20, "the Transfer to succeed", || {
        phase_of(&cluster, "backup-disk").as_deref() == Some("Succeeded")
    })
    .await;
    let seen = drain(&mut movers);
    let (_, created, _) = seen
        .iter()
        .find(|(kind, _, _)| *kind == ChangeType::Added)
        .expect("a mover was created");

    // What render was given: the objects as they were before the operator acted.
    transfer.as_object_mut().unwrap().remove("status");
    let file: Vec<Value> = vec![
        cluster.get("", "namespaces", "", NS).unwrap(),
        cluster
            .get("", "persistentvolumeclaims", NS, "vm-disk")
            .unwrap(),
        cluster.get("", "pods", NS, "virt-launcher-vm1").unwrap(),
        transfer,
    ];
    let text: String = file
        .iter()
        .map(|o| format!("---\n{}", serde_yaml::to_string(o).unwrap()))
        .collect();
    let options = ferry_operator::render::Options {
        settings: settings(),
        tls: true,
    };
    let input = ferry_operator::render::Cluster::parse(&text).unwrap();
    let rendered = ferry_operator::render::render(&input, &options).unwrap();
    let planned = |kind: &str| {
        rendered
            .objects()
            .iter()
            .find(|o| o["kind"] == kind)
            .unwrap_or_else(|| panic!("render planned no {kind}: {:?}", rendered.summary))
            .clone()
    };

    let pod = planned("Pod");
    let mut spec = created["spec"].clone();
    spec.as_object_mut().unwrap().remove("nodeName");
    assert_eq!(pod["spec"], spec);
    for field in ["name", "labels", "ownerReferences"] {
        assert_eq!(
            pod["metadata"][field], created["metadata"][field],
            "{field}"
        );
    }
    let mover = name_of(created);
    let policy = planned("NetworkPolicy");
    let made_policies = drain(&mut policies);
    let (_, made_policy, _) = made_policies
        .iter()
        .find(|(kind, p, _)| *kind == ChangeType::Added && name_of(p) == mover)
        .expect("the mover's NetworkPolicy was created");
    assert_eq!(policy["spec"], made_policy["spec"]);
    assert_eq!(
        policy["metadata"]["labels"],
        made_policy["metadata"]["labels"]
    );
    let claim = planned("PersistentVolumeClaim");
    let made = cluster
        .get("", "persistentvolumeclaims", NS, "vm-disk-copy")
        .unwrap();
    for field in ["accessModes", "resources", "storageClassName", "volumeMode"] {
        assert_eq!(claim["spec"][field], made["spec"][field], "{field}");
    }
    assert_eq!(claim["metadata"]["labels"], made["metadata"]["labels"]);
    let secret = planned("Secret");
    let keys: Vec<&String> = secret["stringData"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["ca.crt", "tls.crt", "tls.key", "token"]);
    assert_eq!(name_of(&secret), format!("{mover}-token"));
}
