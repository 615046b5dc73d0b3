//! GoldenImages against a mocked API server: a poll of a source whose version is not
//! asked (an `s3://` URL) starts an import Transfer into a new claim and records it; the
//! import's end makes its claim current and deletes the Transfer; a Transfer from
//! `source: {goldenImage}` records the current claim first, and waits, saying why, while
//! the GoldenImage holds none. (tests/tests/golden_image.rs runs the whole loop against
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
            "source": {"url": "s3://images/fedora.raw"},
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

    // 1. The first poll: no version to ask of s3://, so an import.
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

    // 3. The next fire imports again (s3:// has no version asked); once it succeeded the
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
