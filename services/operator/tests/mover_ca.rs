//! The movers' CA Secret against the mocked API server: made when absent, read when
//! present, the other replica's taken when both race, an unusable one named.

use crate::support;

use base64::Engine;
use ferry_operator::controller::mover_ca::{load_or_create, CA_SECRET};
use ferry_operator::controller::Error;
use serde_json::{json, Value};
use support::{ApiServer, Reply};

const SECRETS: &str = "/api/v1/namespaces/ferry-system/secrets";

fn secret_path() -> String {
    format!("{SECRETS}/{CA_SECRET}")
}

/// The Secret as the API server returns what was created (stringData becomes data).
fn stored(created: &Value) -> Value {
    let b64 = |v: &Value| base64::engine::general_purpose::STANDARD.encode(v.as_str().unwrap());
    let data = &created["stringData"];
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": created["metadata"],
        "type": "Opaque",
        "data": {"ca.crt": b64(&data["ca.crt"]), "ca.key": b64(&data["ca.key"])},
    })
}

#[tokio::test]
async fn an_absent_ca_is_made_stored_and_read_back_by_the_next_start() {
    let (client, mut server) = ApiServer::new();
    let task = tokio::spawn(async move { load_or_create(&client, "ferry-system").await });
    server.expect("GET", &secret_path(), Reply::NotFound).await;
    let created = server.expect("POST", SECRETS, Reply::Echo).await.body;
    let made = task.await.unwrap().unwrap();
    assert_eq!(created["metadata"]["name"], CA_SECRET);
    assert_eq!(created["immutable"], true);
    assert_eq!(created["stringData"]["ca.crt"], made.cert_pem());
    assert!(created["stringData"]["ca.key"]
        .as_str()
        .unwrap()
        .contains("PRIVATE KEY"));

    let (client, mut server) = ApiServer::new();
    let task = tokio::spawn(async move { load_or_create(&client, "ferry-system").await });
    server
        .expect("GET", &secret_path(), Reply::Ok(stored(&created)))
        .await;
    let read = task.await.unwrap().unwrap();
    assert_eq!(read.cert_pem(), made.cert_pem());
    assert_eq!(read.key_pem(), made.key_pem());
    server.done().await;
}

#[tokio::test]
async fn a_replica_that_loses_the_race_takes_the_winners_ca() {
    let winner = ferry_operator::mover::tls::MoverCa::generate().unwrap();
    let theirs = stored(&json!({
        "metadata": {"name": CA_SECRET, "namespace": "ferry-system"},
        "stringData": {"ca.crt": winner.cert_pem(), "ca.key": winner.key_pem()},
    }));
    let (client, mut server) = ApiServer::new();
    let task = tokio::spawn(async move { load_or_create(&client, "ferry-system").await });
    server.expect("GET", &secret_path(), Reply::NotFound).await;
    server.expect("POST", SECRETS, Reply::Fail(409)).await;
    server
        .expect("GET", &secret_path(), Reply::Ok(theirs))
        .await;
    let ca = task.await.unwrap().unwrap();
    assert_eq!(ca.cert_pem(), winner.cert_pem());
    server.done().await;
}

#[tokio::test]
async fn a_ca_secret_without_its_key_is_named() {
    let (client, mut server) = ApiServer::new();
    let task = tokio::spawn(async move { load_or_create(&client, "ferry-system").await });
    let broken = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": CA_SECRET, "namespace": "ferry-system"}, "data": {}});
    server
        .expect("GET", &secret_path(), Reply::Ok(broken))
        .await;
    let e = task.await.unwrap().unwrap_err();
    assert!(matches!(e, Error::BadCa(_)), "{e:?}");
    assert!(e.to_string().contains(CA_SECRET), "{e}");
}
