//! A Transfer that fans out, against a mocked API server: five generated claims of a
//! WaitForFirstConsumer class over two nodes whose CSI driver attaches 3 volumes each
//! (one already attached on node-a): the nodes, CSINodes, VolumeAttachments and classes
//! read once, two groups planned (3 on node-b, 2 on node-a) and recorded, one child
//! Transfer per group created (its claims' templates, its mover placed on the node,
//! strategy copy, owned by the parent), and the parent's status summed from the
//! children's until every group succeeded; a cluster without room waits and says why.

use crate::support;

use std::time::Duration;

use ferry_operator::clone::reconcile::reconcile_transfer;
use kube::runtime::controller::Action;
use serde_json::{json, Value};

use support::{settings, with_status, Harness, Reply};

const NS: &str = "vms";
const T_STATUS: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers/rollout/status";
const TRANSFERS: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers";
const DRIVER: &str = "local.csi.example.com";

fn transfer_json() -> Value {
    json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {
            "name": "rollout", "namespace": NS, "uid": "uid-r", "generation": 1,
            "resourceVersion": "7", "finalizers": ["ferry.dev/cancel"],
        },
        "spec": {
            "source": {"url": "https://images.example.com/golden.qcow2"},
            "pvcTemplates": {"namePrefix": "disk-", "count": 5, "size": "10Gi",
                             "storageClassName": "local", "volumeMode": "Block"},
        },
    })
}

fn transfer(v: &Value) -> std::sync::Arc<ferry_operator::crd::Transfer> {
    std::sync::Arc::new(serde_json::from_value(v.clone()).unwrap())
}

fn list(kind: &str, items: Value) -> Reply {
    Reply::Ok(json!({"apiVersion": "v1", "kind": format!("{kind}List"),
                     "metadata": {"resourceVersion": "1"}, "items": items}))
}

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
           "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
}

fn csinode(name: &str, count: u32) -> Value {
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": name},
           "spec": {"drivers": [{"name": DRIVER, "nodeID": name, "allocatable": {"count": count}}]}})
}

/// The facts the plan reads, in the reconciler's order: `nodes` whose driver attaches
/// `limit` volumes each, one volume attached on node-a, the WaitForFirstConsumer class.
async fn facts_read(h: &mut Harness, nodes: &[&str], limit: u32) {
    let (ready, csinodes): (Vec<Value>, Vec<Value>) =
        nodes.iter().map(|n| (node(n), csinode(n, limit))).unzip();
    h.server
        .expect("GET", "/api/v1/nodes", list("Node", json!(ready)))
        .await;
    h.server
        .expect(
            "GET",
            "/apis/storage.k8s.io/v1/csinodes",
            list("CSINode", json!(csinodes)),
        )
        .await;
    h.server
        .expect(
            "GET",
            "/apis/storage.k8s.io/v1/volumeattachments",
            list(
                "VolumeAttachment",
                json!([{"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                "metadata": {"name": "va-1"},
                "spec": {"attacher": DRIVER, "nodeName": "node-a",
                         "source": {"persistentVolumeName": "pv-other"}}}]),
            ),
        )
        .await;
    h.server
        .expect(
            "GET",
            "/apis/storage.k8s.io/v1/storageclasses",
            list(
                "StorageClass",
                json!([{"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": "local"}, "provisioner": DRIVER,
                "volumeBindingMode": "WaitForFirstConsumer"}]),
            ),
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

/// A child as the store would show it, with a status.
fn child_with(created: &Value, status: Value) -> Value {
    let mut c = created.clone();
    c["metadata"]["uid"] = json!(format!("uid-{}", c["metadata"]["name"].as_str().unwrap()));
    c["status"] = status;
    c
}

#[tokio::test]
async fn a_rollout_is_planned_by_attach_room_and_its_groups_become_child_transfers() {
    let mut h = Harness::new(settings());
    let object = transfer_json();

    // 1. The plan: node-b has 3 free slots, node-a 2 (one attached): 3 + 2.
    let task = tokio::spawn(reconcile_transfer(transfer(&object), h.ctx.clone()));
    facts_read(&mut h, &["node-a", "node-b"], 3).await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(status["phase"], "Running");
    assert_eq!(status["cloneStrategy"], "copy");
    assert_eq!(
        status["fanOut"]["groups"],
        json!([
            {"name": "rollout-g0", "node": "node-b", "targets": [[0, 3]], "phase": "Pending"},
            {"name": "rollout-g1", "node": "node-a", "targets": [[3, 5]], "phase": "Pending"},
        ])
    );
    assert_eq!(status["fanOut"]["targets"], 5);
    let running = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Running")
        .unwrap()
        .clone();
    assert_eq!(running["reason"], "FanningOut");
    assert_eq!(
        running["message"],
        "5 targets in 2 mover groups over 2 nodes"
    );
    let event = h.server.expect_event(NS).await;
    assert_eq!(event.body["reason"], "FanOutPlanned");
    assert_eq!(finish(task).await, Action::requeue(Duration::ZERO));
    h.server.done().await;

    // 2. The children: none yet, both created.
    let object = with_status(&object, &json!({ "status": status }));
    let task = tokio::spawn(reconcile_transfer(transfer(&object), h.ctx.clone()));
    let listed = h
        .server
        .expect("GET", TRANSFERS, list("Transfer", json!([])))
        .await;
    assert!(
        listed
            .query
            .contains("labelSelector=ferry.dev%2Ffan-out-of%3Duid-r"),
        "{}",
        listed.query
    );
    let g0 = h.server.expect("POST", TRANSFERS, Reply::Echo).await.body;
    let g1 = h.server.expect("POST", TRANSFERS, Reply::Echo).await.body;
    assert_eq!(
        finish(task).await,
        Action::requeue(Duration::from_millis(100))
    );
    h.server.done().await;
    assert_eq!(g0["metadata"]["name"], "rollout-g0");
    assert_eq!(g0["metadata"]["labels"]["ferry.dev/fan-out-of"], "uid-r");
    assert_eq!(g0["metadata"]["ownerReferences"][0]["uid"], "uid-r");
    assert_eq!(g0["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(
        g0["spec"],
        json!({
            "source": {"url": "https://images.example.com/golden.qcow2"},
            "targets": [
                {"pvcTemplate": {"name": "disk-0", "storageClassName": "local", "size": "10Gi", "volumeMode": "Block"}},
                {"pvcTemplate": {"name": "disk-1", "storageClassName": "local", "size": "10Gi", "volumeMode": "Block"}},
                {"pvcTemplate": {"name": "disk-2", "storageClassName": "local", "size": "10Gi", "volumeMode": "Block"}},
            ],
            "mover": {"nodeName": "node-b"},
            "cloneStrategy": "copy",
            "relay": {"serve": true},
        })
    );
    assert_eq!(g1["spec"]["mover"], json!({"nodeName": "node-a"}));
    assert_eq!(g1["spec"]["relay"], json!({"from": "rollout-g0"}));
    let names: Vec<&str> = g1["spec"]["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["pvcTemplate"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["disk-3", "disk-4"]);

    // 3. One group done, the other writing: the counts and bytes summed.
    let done = json!({"phase": "Succeeded",
        "progress": {"totalBytes": 100, "doneBytes": 100, "resumedBytes": 0, "committedBytes": 100},
        "digests": {"source": "sha256:aa"}});
    let writing = json!({"phase": "Running",
        "progress": {"totalBytes": 100, "doneBytes": 40, "resumedBytes": 0, "committedBytes": 0},
        "targets": [{"name": "pvc/disk-3", "phase": "Succeeded", "doneBytes": 100},
                    {"name": "pvc/disk-4", "phase": "Running", "doneBytes": 40}]});
    let task = tokio::spawn(reconcile_transfer(transfer(&object), h.ctx.clone()));
    h.server
        .expect(
            "GET",
            TRANSFERS,
            list(
                "Transfer",
                json!([child_with(&g0, done.clone()), child_with(&g1, writing)]),
            ),
        )
        .await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(status["phase"], "Running");
    assert_eq!(status["fanOut"]["groups"][0]["phase"], "Succeeded");
    assert_eq!(status["fanOut"]["groups"][1]["phase"], "Running");
    assert_eq!(status["fanOut"]["targetsSucceeded"], 4);
    assert_eq!(status["fanOut"]["groupsSucceeded"], 1);
    assert_eq!(status["fanOut"]["groupsRunning"], 1);
    assert_eq!(status["progress"]["totalBytes"], 200);
    assert_eq!(status["progress"]["doneBytes"], 140);
    assert_eq!(finish(task).await, Action::requeue(settings().resync));
    h.server.done().await;

    // 4. Both done: Succeeded, the source's digest kept, an event.
    let object = with_status(&object, &json!({ "status": status }));
    let task = tokio::spawn(reconcile_transfer(transfer(&object), h.ctx.clone()));
    h.server
        .expect(
            "GET",
            TRANSFERS,
            list(
                "Transfer",
                json!([child_with(&g0, done.clone()), child_with(&g1, done)]),
            ),
        )
        .await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = seen.body["status"].clone();
    assert_eq!(status["phase"], "Succeeded");
    assert_eq!(status["message"], "5 targets written by 2 mover groups");
    assert_eq!(status["digests"]["source"], "sha256:aa");
    assert_eq!(status["fanOut"]["targetsSucceeded"], 5);
    let event = h.server.expect_event(NS).await;
    assert_eq!(event.body["reason"], "Succeeded");
    assert_eq!(finish(task).await, Action::await_change());
    h.server.done().await;
}

#[tokio::test]
async fn without_attach_room_the_rollout_waits_and_says_why() {
    let mut h = Harness::new(settings());
    let object = transfer_json();
    let task = tokio::spawn(reconcile_transfer(transfer(&object), h.ctx.clone()));
    // node-a's one slot is taken: the claims can attach nowhere.
    facts_read(&mut h, &["node-a"], 1).await;
    let seen = h
        .server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    let status = &seen.body["status"];
    assert_eq!(status["phase"], "Pending");
    assert_eq!(
        status["message"],
        "no schedulable node can attach another volume: free attach slots or add nodes"
    );
    assert!(status.get("fanOut").is_none(), "{status}");
    assert_eq!(finish(task).await, Action::requeue(Duration::from_secs(30)));
    h.server.done().await;
}

/// The serving group's relay is told, once, that no reader is still to come when every
/// group reading from it has ended (through its mover's link, with its token); not while
/// one still runs.
#[tokio::test]
async fn a_relay_whose_readers_have_ended_is_told_so_once() {
    let mut h = Harness::new(settings());
    let planned = json!({"phase": "Running", "fanOut": {"targets": 5, "targetsSucceeded": 0,
        "targetsFailed": 0, "groupsRunning": 2, "groupsSucceeded": 0, "groupsFailed": 0,
        "groups": [
        {"name": "rollout-g0", "node": "node-b", "targets": [[0, 3]], "phase": "Running"},
        {"name": "rollout-g1", "node": "node-a", "targets": [[3, 5]], "phase": "Running"},
    ]}});
    let object = with_status(&transfer_json(), &json!({ "status": planned }));
    let child = |name: &str, relay: Value, status: Value| {
        json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
               "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"),
                            "labels": {"ferry.dev/fan-out-of": "uid-r"}},
               "spec": {"source": {"url": "https://images.example.com/golden.qcow2"},
                        "targets": [], "relay": relay},
               "status": status})
    };
    let serving = child(
        "rollout-g0",
        json!({"serve": true}),
        json!({"phase": "Running", "moverPod": "rollout-g0-ft-1", "attempts": 1}),
    );
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "rollout-g0-ft-1", "namespace": NS},
        "status": {"phase": "Running", "podIP": "10.0.0.7"},
    }))
    .unwrap();
    h.pod_seen(pod);
    let reading = |phase: &str| {
        child(
            "rollout-g1",
            json!({"from": "rollout-g0"}),
            json!({"phase": phase}),
        )
    };
    let relay_ends = |h: &Harness| {
        h.link
            .calls
            .lock()
            .iter()
            .filter(|c| matches!(c, support::Call::EndRelay(uid) if uid == "uid-rollout-g0"))
            .count()
    };

    // A reader still runs: nothing said.
    let task = tokio::spawn(reconcile_transfer(transfer(&object), h.ctx.clone()));
    h.server
        .expect(
            "GET",
            TRANSFERS,
            list("Transfer", json!([serving.clone(), reading("Running")])),
        )
        .await;
    h.server
        .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
        .await;
    assert_eq!(finish(task).await, Action::requeue(settings().resync));
    h.server.done().await;
    assert_eq!(relay_ends(&h), 0);

    // Every reader ended: the serving mover is told, with its own token.
    for round in 0..2 {
        let task = tokio::spawn(reconcile_transfer(transfer(&object), h.ctx.clone()));
        h.server
            .expect(
                "GET",
                TRANSFERS,
                list("Transfer", json!([serving.clone(), reading("Succeeded")])),
            )
            .await;
        if round == 0 {
            h.server
                .expect(
                    "GET",
                    "/api/v1/namespaces/vms/secrets/rollout-g0-ft-1-token",
                    Reply::Ok(json!({"apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": "rollout-g0-ft-1-token", "namespace": NS},
                        "data": {"token": "c2VjcmV0LXRva2Vu"}})),
                )
                .await;
        }
        h.server
            .expect("PATCH", T_STATUS, Reply::ApplyStatus(object.clone()))
            .await;
        finish(task).await;
        h.server.done().await;
        assert_eq!(relay_ends(&h), 1, "round {round}");
    }
    assert!(h.link.tokens.lock().iter().all(|t| t == "secret-token"));
}
