//! Leader election against the mocked API server: each scenario asserts the exact
//! requests (method, path, body) the elector sends and what it concludes.

use crate::support;

use std::time::Duration;

use ferry_operator::leader::{Attempt, Elector, LeaderError, LeaseConfig};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};
use support::{ApiServer, Reply};

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ferry-system/leases";
const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/ferry-system/leases/ferry-operator";
const LONG_AGO: &str = "2020-01-01T00:00:00.000000Z";

fn new_elector() -> (Elector, ApiServer) {
    let (client, server) = ApiServer::new();
    let mut config = LeaseConfig::new("ferry-system", "ferry-operator", "operator-a");
    config.retry_period = Duration::from_millis(10);
    (Elector::new(client, config), server)
}

/// The Lease as the API server holds it.
fn lease(holder: Option<&str>, renewed: &str, transitions: i32, version: &str) -> Value {
    let mut spec = json!({
        "leaseDurationSeconds": 15,
        "acquireTime": LONG_AGO,
        "renewTime": renewed,
        "leaseTransitions": transitions,
    });
    if let Some(h) = holder {
        spec["holderIdentity"] = json!(h);
    }
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "ferry-operator", "namespace": "ferry-system", "resourceVersion": version},
        "spec": spec,
    })
}

fn now() -> String {
    Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

fn time(v: &Value) -> Timestamp {
    v.as_str().unwrap().parse().unwrap()
}

/// A time written by the elector during this test: within the last minute.
fn assert_recent(v: &Value) {
    let age = Timestamp::now().duration_since(time(v));
    assert!(age.as_secs() < 60 && !age.is_negative(), "{v} is not now");
}

#[tokio::test]
async fn an_absent_lease_is_created_and_held() {
    let (elector, mut server) = new_elector();
    let task = tokio::spawn(async move { elector.try_acquire_or_renew().await.unwrap() });
    server.expect("GET", LEASE, Reply::NotFound).await;
    let created = server.expect("POST", LEASES, Reply::Echo).await.body;
    assert_eq!(created["metadata"]["name"], "ferry-operator");
    assert_eq!(created["metadata"]["namespace"], "ferry-system");
    let spec = &created["spec"];
    assert_eq!(spec["holderIdentity"], "operator-a");
    assert_eq!(spec["leaseDurationSeconds"], 15);
    assert_eq!(spec["leaseTransitions"], 0);
    assert_recent(&spec["acquireTime"]);
    assert_eq!(spec["acquireTime"], spec["renewTime"]);
    assert_eq!(task.await.unwrap(), Attempt::Leading);
    server.done().await;
}

#[tokio::test]
async fn a_lease_held_by_a_live_holder_is_left_alone() {
    let (elector, mut server) = new_elector();
    let task = tokio::spawn(async move { elector.try_acquire_or_renew().await.unwrap() });
    let held = lease(Some("operator-b"), &now(), 1, "5");
    server.expect("GET", LEASE, Reply::Ok(held)).await;
    assert_eq!(task.await.unwrap(), Attempt::HeldBy("operator-b".into()));
    server.done().await;
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_with_a_guarded_replace() {
    let (elector, mut server) = new_elector();
    let task = tokio::spawn(async move { elector.try_acquire_or_renew().await.unwrap() });
    let expired = lease(Some("operator-b"), LONG_AGO, 3, "42");
    server.expect("GET", LEASE, Reply::Ok(expired)).await;
    let put = server.expect("PUT", LEASE, Reply::Echo).await.body;
    assert_eq!(put["metadata"]["resourceVersion"], "42");
    let spec = &put["spec"];
    assert_eq!(spec["holderIdentity"], "operator-a");
    assert_eq!(spec["leaseTransitions"], 4);
    assert_eq!(spec["leaseDurationSeconds"], 15);
    assert_recent(&spec["acquireTime"]);
    assert_recent(&spec["renewTime"]);
    assert_eq!(task.await.unwrap(), Attempt::Leading);
    server.done().await;
}

#[tokio::test]
async fn the_leader_renews_without_a_transition() {
    let (elector, mut server) = new_elector();
    let task = tokio::spawn(async move { elector.try_acquire_or_renew().await.unwrap() });
    let renewed_before = now();
    let ours = lease(Some("operator-a"), &renewed_before, 2, "9");
    server.expect("GET", LEASE, Reply::Ok(ours)).await;
    let put = server.expect("PUT", LEASE, Reply::Echo).await.body;
    assert_eq!(put["metadata"]["resourceVersion"], "9");
    let spec = &put["spec"];
    assert_eq!(spec["holderIdentity"], "operator-a");
    assert_eq!(spec["leaseTransitions"], 2);
    assert_eq!(time(&spec["acquireTime"]), time(&json!(LONG_AGO)));
    assert!(time(&spec["renewTime"]) >= time(&json!(renewed_before)));
    assert_eq!(task.await.unwrap(), Attempt::Leading);
    server.done().await;
}

#[tokio::test]
async fn a_lost_race_is_not_leadership() {
    // Two replicas read the same expired Lease; the other one's write came first.
    let (elector, mut server) = new_elector();
    let task = tokio::spawn(async move { elector.try_acquire_or_renew().await.unwrap() });
    let expired = lease(Some("operator-b"), LONG_AGO, 3, "42");
    server.expect("GET", LEASE, Reply::Ok(expired)).await;
    let put = server.expect("PUT", LEASE, Reply::Conflict).await.body;
    assert_eq!(put["metadata"]["resourceVersion"], "42");
    assert_eq!(task.await.unwrap(), Attempt::LostRace);
    server.done().await;

    // Both saw no Lease; the other one created it first.
    let (elector, mut server) = new_elector();
    let task = tokio::spawn(async move { elector.try_acquire_or_renew().await.unwrap() });
    server.expect("GET", LEASE, Reply::NotFound).await;
    server.expect("POST", LEASES, Reply::Conflict).await;
    assert_eq!(task.await.unwrap(), Attempt::LostRace);
    server.done().await;
}

#[tokio::test]
async fn shutdown_releases_the_lease() {
    let (elector, mut server) = new_elector();
    let task = tokio::spawn(async move { elector.release().await.unwrap() });
    let ours = lease(Some("operator-a"), &now(), 2, "11");
    server.expect("GET", LEASE, Reply::Ok(ours)).await;
    let put = server.expect("PUT", LEASE, Reply::Echo).await.body;
    assert_eq!(put["metadata"]["resourceVersion"], "11");
    assert!(put["spec"].get("holderIdentity").is_none(), "{put}");
    assert_eq!(put["spec"]["leaseTransitions"], 2);
    assert!(task.await.unwrap());
    server.done().await;

    // A Lease another replica holds by now is not touched.
    let (elector, mut server) = new_elector();
    let task = tokio::spawn(async move { elector.release().await.unwrap() });
    let theirs = lease(Some("operator-b"), &now(), 3, "12");
    server.expect("GET", LEASE, Reply::Ok(theirs)).await;
    assert!(!task.await.unwrap());
    server.done().await;
}

#[tokio::test]
async fn the_leader_stops_when_another_holds_the_lease() {
    let (elector, mut server) = new_elector();
    let task = tokio::spawn(async move { elector.hold().await });
    let ours = lease(Some("operator-a"), &now(), 2, "9");
    server.expect("GET", LEASE, Reply::Ok(ours)).await;
    server.expect("PUT", LEASE, Reply::Echo).await;
    let theirs = lease(Some("operator-b"), &now(), 3, "10");
    server.expect("GET", LEASE, Reply::Ok(theirs)).await;
    let lost = task.await.unwrap();
    assert!(
        matches!(&lost, LeaderError::TakenBy(h) if h == "operator-b"),
        "{lost}"
    );
    server.done().await;
}
