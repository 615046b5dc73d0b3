//! The webhook's answers against exact JSON, and one review over real HTTPS.

use base64::Engine;
use serde_json::{json, Value};

use super::review::{answer, PATH};
use super::server::{self, service_names};
use super::stamp::{Claim, Requester, StampKey, REQUESTER};

fn key() -> StampKey {
    StampKey::from_ca_key("the CA key")
}

fn transfer(source_ns: Option<&str>, annotations: Option<Value>) -> Value {
    let mut pvc = json!({"name": "golden"});
    if let Some(ns) = source_ns {
        pvc["namespace"] = json!(ns);
    }
    let mut t = json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "disk", "namespace": "vms"},
        "spec": {"source": {"pvc": pvc},
                 "targets": [{"pvcTemplate": {"name": "disk", "size": "10Gi"}}]},
    });
    if let Some(a) = annotations {
        t["metadata"]["annotations"] = a;
    }
    t
}

fn review(operation: &str, user: &str, object: &Value, old: Option<&Value>) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "req-1",
            "kind": {"group": "ferry.dev", "version": "v1alpha1", "kind": "Transfer"},
            "resource": {"group": "ferry.dev", "version": "v1alpha1", "resource": "transfers"},
            "name": "disk", "namespace": "vms", "operation": operation,
            "userInfo": {"username": user, "uid": format!("{user}-uid"),
                         "groups": ["devs", "system:authenticated"],
                         "extra": {"scopes": ["vm-admin"]}},
            "object": object, "oldObject": old, "dryRun": false,
        },
    }))
    .unwrap()
}

fn stamp_of(user: &str, source: &str) -> String {
    key().sign(Claim {
        requester: Requester {
            user: user.into(),
            uid: Some(format!("{user}-uid")),
            groups: vec!["devs".into(), "system:authenticated".into()],
            extra: [("scopes".to_string(), vec!["vm-admin".to_string()])].into(),
        },
        transfer: "vms/disk".into(),
        source: source.into(),
    })
}

/// The response, with its patch decoded.
fn respond(body: &[u8]) -> (Value, Option<Value>) {
    let out = answer(body, &key());
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(out["kind"], "AdmissionReview");
    let mut response = out["response"].clone();
    let patch = response.get("patch").cloned().map(|p| {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(p.as_str().unwrap())
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    });
    if let Some(r) = response.as_object_mut() {
        r.remove("patch");
    }
    (response, patch)
}

const PATCHED: &str = "/metadata/annotations/ferry.dev~1requester";

#[test]
fn a_create_from_another_namespace_is_stamped_with_its_creator() {
    let (response, patch) = respond(&review(
        "CREATE",
        "alice",
        &transfer(Some("images"), None),
        None,
    ));
    assert_eq!(
        response,
        json!({"uid": "req-1", "allowed": true, "patchType": "JSONPatch"})
    );
    assert_eq!(
        patch.unwrap(),
        json!([{"op": "add", "path": "/metadata/annotations",
                "value": {REQUESTER: stamp_of("alice", "images/golden")}}])
    );
    // With annotations already there, the one key is added.
    let t = transfer(Some("images"), Some(json!({"team": "a"})));
    let (_, patch) = respond(&review("CREATE", "alice", &t, None));
    assert_eq!(
        patch.unwrap(),
        json!([{"op": "add", "path": PATCHED, "value": stamp_of("alice", "images/golden")}])
    );
}

#[test]
fn a_stamp_written_by_the_user_is_replaced() {
    let forged = stamp_of("admin", "images/golden").replace("admin", "root");
    let t = transfer(Some("images"), Some(json!({REQUESTER: forged})));
    let (response, patch) = respond(&review("CREATE", "mallory", &t, None));
    assert_eq!(response["allowed"], true);
    assert_eq!(
        patch.unwrap(),
        json!([{"op": "add", "path": PATCHED, "value": stamp_of("mallory", "images/golden")}])
    );
}

#[test]
fn an_update_that_keeps_the_source_keeps_the_old_stamp() {
    let stamped = json!({REQUESTER: stamp_of("alice", "images/golden")});
    let old = transfer(Some("images"), Some(stamped.clone()));
    // The operator adds its finalizer: the stamp stays as it is, no patch.
    let mut new = old.clone();
    new["metadata"]["finalizers"] = json!(["ferry.dev/cancel"]);
    let (response, patch) = respond(&review(
        "UPDATE",
        "system:serviceaccount:ferry-system:ferry-operator",
        &new,
        Some(&old),
    ));
    assert_eq!(response, json!({"uid": "req-1", "allowed": true}));
    assert_eq!(patch, None);
    // Someone else puts their own value in: the old one is put back.
    let mut new = old.clone();
    new["metadata"]["annotations"][REQUESTER] = json!(stamp_of("bob", "images/golden"));
    let (_, patch) = respond(&review("UPDATE", "bob", &new, Some(&old)));
    assert_eq!(
        patch.unwrap(),
        json!([{"op": "add", "path": PATCHED, "value": stamp_of("alice", "images/golden")}])
    );
    // Or removes it: put back too.
    let mut new = old.clone();
    new["metadata"]["annotations"] = json!({"team": "b"});
    let (_, patch) = respond(&review("UPDATE", "bob", &new, Some(&old)));
    assert_eq!(
        patch.unwrap(),
        json!([{"op": "add", "path": PATCHED, "value": stamp_of("alice", "images/golden")}])
    );
}

#[test]
fn an_update_that_changes_the_source_is_stamped_again() {
    let old = transfer(
        Some("images"),
        Some(json!({REQUESTER: stamp_of("alice", "images/golden")})),
    );
    let mut new = old.clone();
    new["spec"]["source"]["pvc"]["namespace"] = json!("base-images");
    let (_, patch) = respond(&review("UPDATE", "bob", &new, Some(&old)));
    assert_eq!(
        patch.unwrap(),
        json!([{"op": "add", "path": PATCHED, "value": stamp_of("bob", "base-images/golden")}])
    );
}

#[test]
fn other_requests_pass_untouched_and_bad_ones_are_refused() {
    // Same namespace (given or not): nothing to stamp.
    for t in [transfer(None, None), transfer(Some("vms"), None)] {
        let (response, patch) = respond(&review("CREATE", "alice", &t, None));
        assert_eq!(response, json!({"uid": "req-1", "allowed": true}));
        assert_eq!(patch, None);
    }
    // A name to be generated cannot be bound.
    let mut t = transfer(Some("images"), None);
    t["metadata"] = json!({"generateName": "disk-", "namespace": "vms"});
    let mut body: Value = serde_json::from_slice(&review("CREATE", "alice", &t, None)).unwrap();
    body["request"]["name"] = json!("");
    let (response, patch) = respond(&serde_json::to_vec(&body).unwrap());
    assert_eq!(response["allowed"], false);
    assert!(response["status"]["message"]
        .as_str()
        .unwrap()
        .contains("generateName"));
    assert_eq!(patch, None);
    let (response, _) = respond(b"{not json");
    assert_eq!(response["allowed"], false);
    assert!(response["status"]["message"]
        .as_str()
        .unwrap()
        .starts_with("the AdmissionReview cannot be read"));
}

/// A real TLS client (rustls, trusting only the movers' CA, checking the Service's DNS
/// name) posts an AdmissionReview to the webhook server and gets the stamp back.
#[tokio::test]
async fn the_webhook_answers_over_https_with_a_certificate_from_the_ca() {
    use std::sync::Arc;

    use rustls::pki_types::ServerName;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let ca = Arc::new(crate::mover::tls::MoverCa::generate().unwrap());
    let tls = server::tls_config(
        ca.clone(),
        service_names("ferry-operator-webhook", "ferry-system"),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = tokio::spawn(server::serve(listener, tls, Arc::new(key())));

    let connector = client_for(&ca);
    let name = ServerName::try_from("ferry-operator-webhook.ferry-system.svc").unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut stream = connector.connect(name, tcp).await.unwrap();
    let (body, request) = review_request(true);
    stream.write_all(&request).await.unwrap();
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    let json_body = text.split("\r\n\r\n").nth(1).unwrap();
    let got: Value = serde_json::from_str(json_body).unwrap();
    assert_eq!(got, answer(&body, &key()));
    assert_eq!(got["response"]["patchType"], "JSONPatch");

    // A client that does not trust the CA is refused at the handshake.
    let other = crate::mover::tls::MoverCa::generate().unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("ferry-operator-webhook.ferry-system.svc").unwrap();
    assert!(client_for(&other).connect(name, tcp).await.is_err());
    serving.abort();
}

/// Once the clone started (the old object records its child), an update that changes the
/// source (also into the Transfer's own namespace, where the source no longer names
/// another one) or the targets is refused saying why; other updates are not.
#[test]
fn a_started_clone_refuses_a_changed_source_or_targets() {
    let stamped = transfer(
        Some("images"),
        Some(json!({REQUESTER: stamp_of("alice", "images/golden")})),
    );
    let mut started = stamped.clone();
    started["status"] = json!({"cloneTransfer": "images/xns-u-1", "phase": "Running"});
    let mut moved = stamped.clone();
    moved["spec"]["source"]["pvc"] = json!({"name": "golden"});
    let mut grown = stamped.clone();
    grown["spec"]["targets"]
        .as_array_mut()
        .unwrap()
        .push(json!({"pvcTemplate": {"name": "disk-2", "size": "10Gi"}}));
    for (edited, what) in [(&moved, "spec.source"), (&grown, "spec.targets")] {
        let (response, patch) = respond(&review("UPDATE", "alice", edited, Some(&started)));
        assert_eq!(response["allowed"], false, "{response}");
        assert_eq!(response["status"]["code"], 422);
        assert_eq!(
            response["status"]["message"],
            format!("{what} of a Transfer from a claim in another namespace cannot change once its clone started (its child Transfer images/xns-u-1 fills the claims of the spec it was made from): create a new Transfer instead")
        );
        assert!(patch.is_none());
        // Before the child exists, the same edit is allowed.
        let (response, _) = respond(&review("UPDATE", "alice", edited, Some(&stamped)));
        assert_eq!(response["allowed"], true, "{response}");
    }
    let mut labelled = started.clone();
    labelled["metadata"]["labels"] = json!({"team": "a"});
    let (response, patch) = respond(&review("UPDATE", "alice", &labelled, Some(&started)));
    assert_eq!(response, json!({"uid": "req-1", "allowed": true}));
    assert!(patch.is_none());
}

/// A TLS client trusting only `ca`, for the webhook's Service name.
fn client_for(ca: &crate::mover::tls::MoverCa) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.cert_pem().as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

/// An AdmissionReview of a CREATE by alice, and the HTTP request posting it (asking to
/// close the connection after the answer when `close`).
fn review_request(close: bool) -> (Vec<u8>, Vec<u8>) {
    let body = review("CREATE", "alice", &transfer(Some("images"), None), None);
    let connection = if close { "connection: close\r\n" } else { "" };
    let mut request = format!(
        "POST {PATH} HTTP/1.1\r\nHost: ferry-operator-webhook.ferry-system.svc\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{connection}\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    (body, request)
}

/// One AdmissionReview posted over a new connection: the response's status line.
async fn post_review(connector: &tokio_rustls::TlsConnector, addr: std::net::SocketAddr) -> String {
    use rustls::pki_types::ServerName;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let name = ServerName::try_from("ferry-operator-webhook.ferry-system.svc").unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut stream = connector.connect(name, tcp).await.unwrap();
    stream.write_all(&review_request(true).1).await.unwrap();
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    text.lines().next().unwrap_or_default().to_string()
}

/// How long until the server closes `stream` (which sends nothing): the read ends with
/// EOF or a reset.
async fn closed_after<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> std::time::Duration {
    use tokio::io::AsyncReadExt;
    let start = std::time::Instant::now();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server kept a silent connection for 10 s");
    start.elapsed()
}

/// A client that opens a TCP connection and sends nothing, and one that completes the
/// TLS handshake and sends no request, are both dropped once their timeout passes, while
/// a real request on another connection is answered; with one connection allowed, a
/// silent client holds the slot only until its timeout.
#[tokio::test]
async fn silent_connections_are_dropped_and_bounded_while_requests_are_answered() {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use rustls::pki_types::ServerName;

    let ca = Arc::new(crate::mover::tls::MoverCa::generate().unwrap());
    let tls = server::tls_config(
        ca.clone(),
        service_names("ferry-operator-webhook", "ferry-system"),
    )
    .unwrap();
    let connector = client_for(&ca);
    let timeout = Duration::from_millis(400);
    let limits = server::Limits {
        handshake: timeout,
        headers: timeout,
        body: timeout,
        life: Duration::from_millis(1500),
        connections: 8,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = tokio::spawn(server::serve_with(
        listener,
        tls.clone(),
        Arc::new(key()),
        limits,
    ));
    let mut silent_tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("ferry-operator-webhook.ferry-system.svc").unwrap();
    let mut silent_tls = connector.connect(name, tcp).await.unwrap();
    // A client that sends a request's headers and only part of its body.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("ferry-operator-webhook.ferry-system.svc").unwrap();
    let mut stalled = connector.connect(name, tcp).await.unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let head = format!(
            "POST {PATH} HTTP/1.1\r\nHost: ferry-operator-webhook.ferry-system.svc\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"apiVersion\""
        );
        stalled.write_all(head.as_bytes()).await.unwrap();
        stalled.flush().await.unwrap();
    }
    let started = Instant::now();
    assert_eq!(post_review(&connector, addr).await, "HTTP/1.1 200 OK");
    assert!(
        started.elapsed() < timeout,
        "answered while the silent ones wait"
    );
    let stalled_answer = async {
        use tokio::io::AsyncReadExt;
        let start = Instant::now();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), stalled.read_to_end(&mut out)).await;
        (start.elapsed(), String::from_utf8_lossy(&out).to_string())
    };
    let (tcp_after, tls_after, (body_after, answer)) = tokio::join!(
        closed_after(&mut silent_tcp),
        closed_after(&mut silent_tls),
        stalled_answer
    );
    assert!(
        answer.starts_with("HTTP/1.1 408 Request Timeout"),
        "{answer}"
    );
    for (what, after) in [("tcp", tcp_after), ("tls", tls_after), ("body", body_after)] {
        assert!(
            after < timeout + Duration::from_secs(2),
            "{what} kept {after:?}"
        );
    }

    // A client that keeps its connection after an answer, sending nothing more, loses it
    // at the end of the connection's life.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("ferry-operator-webhook.ferry-system.svc").unwrap();
    let mut idle = connector.connect(name, tcp).await.unwrap();
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        idle.write_all(&review_request(false).1).await.unwrap();
        let mut first = [0u8; 12];
        idle.read_exact(&mut first).await.unwrap();
        assert_eq!(&first, b"HTTP/1.1 200");
    }
    let kept = closed_after(&mut idle).await;
    assert!(
        kept < Duration::from_millis(1500) + Duration::from_secs(2),
        "idle kept {kept:?}"
    );
    serving.abort();

    // One connection at a time: a silent client holds it until its handshake times out,
    // then the request waiting in the backlog is answered.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = tokio::spawn(server::serve_with(
        listener,
        tls,
        Arc::new(key()),
        server::Limits {
            connections: 1,
            ..limits
        },
    ));
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    // Accepted (and holding the slot) before the request connects.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    assert_eq!(post_review(&connector, addr).await, "HTTP/1.1 200 OK");
    let waited = started.elapsed();
    assert!(
        waited >= timeout - Duration::from_millis(150),
        "served at once ({waited:?}): the bound did not hold"
    );
    closed_after(&mut silent).await;
    serving.abort();
}
