//! Test support for the populator scenarios: a mocked API server (a kube `Client` over
//! `tower_test::mock::pair`) that checks each request in order and answers it, and the
//! populator's context over stores the test fills by hand (as the watches would).

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use ferry_operator::crd::Transfer;
use ferry_operator::populator::Context;
use http::{Request, Response};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::client::Body;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use kube::Client;
use serde_json::{json, Value};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// One request the populator sent.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Value,
}

/// The mocked API server.
pub struct ApiServer {
    handle: Handle,
}

/// How to answer a request.
pub enum Reply {
    /// 200 with this JSON.
    Ok(Value),
    /// 200 with the request's own body (a create).
    Echo,
    /// A failure Status with this code (404, 409).
    Fail(u16),
    /// 200 with a delete's Status.
    Deleted,
}

fn status_json(code: u16) -> Value {
    let reason = match code {
        404 => "NotFound",
        409 => "AlreadyExists",
        200 => "Deleted",
        _ => "InternalError",
    };
    json!({
        "apiVersion": "v1", "kind": "Status", "metadata": {},
        "status": if code < 300 { "Success" } else { "Failure" },
        "reason": reason, "code": code, "message": reason,
    })
}

impl ApiServer {
    /// A client and the server behind it.
    pub fn new() -> (Client, Self) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        (Client::new(service, "default"), Self { handle })
    }

    /// Waits for the next request, checks its method and path, answers it and returns it.
    pub async fn expect(&mut self, method: &str, path: &str, reply: Reply) -> Seen {
        let next = tokio::time::timeout(Duration::from_secs(10), self.handle.next_request())
            .await
            .unwrap_or_else(|_| panic!("no request came; expected {method} {path}"));
        let (request, send) = next.expect("the client went away");
        let method_seen = request.method().to_string();
        let path_seen = request.uri().path().to_string();
        let query = request.uri().query().unwrap_or("").to_string();
        let content_type = request
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let bytes = request.into_body().collect_bytes().await.unwrap();
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        assert_eq!(
            (method_seen.as_str(), path_seen.as_str()),
            (method, path),
            "unexpected request; its body: {body}"
        );
        let (code, answer) = match reply {
            Reply::Ok(v) => (200, v),
            Reply::Echo => (201, body.clone()),
            Reply::Fail(code) => (code, status_json(code)),
            Reply::Deleted => (200, status_json(200)),
        };
        let response = Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&answer).unwrap()))
            .unwrap();
        send.send_response(response);
        Seen {
            method: method_seen,
            path: path_seen,
            query,
            content_type,
            body,
        }
    }

    /// Answers an event (`events.k8s.io`) and returns it.
    pub async fn expect_event(&mut self, namespace: &str) -> Seen {
        let path = format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events");
        self.expect("POST", &path, Reply::Echo).await
    }

    /// Asserts that no further request comes.
    pub async fn done(&mut self) {
        let extra =
            tokio::time::timeout(Duration::from_millis(200), self.handle.next_request()).await;
        if let Ok(Some((request, _))) = extra {
            panic!("unexpected request {} {}", request.method(), request.uri());
        }
    }
}

/// Everything a scenario needs: the server, the context, and the writers of its stores.
pub struct Harness {
    pub server: ApiServer,
    pub ctx: Arc<Context>,
    pub claims: Writer<PersistentVolumeClaim>,
    pub transfers: Writer<Transfer>,
}

impl Harness {
    pub fn new() -> Self {
        let (client, server) = ApiServer::new();
        let claims = Writer::<PersistentVolumeClaim>::default();
        let transfers = Writer::<Transfer>::default();
        let ctx = Arc::new(Context::new(
            client,
            claims.as_reader(),
            transfers.as_reader(),
        ));
        Self {
            server,
            ctx,
            claims,
            transfers,
        }
    }

    /// The watch of claims saw this claim.
    pub fn claim_seen(&mut self, pvc: &Value) {
        let pvc: PersistentVolumeClaim = serde_json::from_value(pvc.clone()).unwrap();
        self.claims.apply_watcher_event(&watcher::Event::Apply(pvc));
    }

    /// The watch of populator Transfers saw this Transfer.
    pub fn transfer_seen(&mut self, transfer: &Value) {
        let t: Transfer = serde_json::from_value(transfer.clone()).unwrap();
        self.transfers
            .apply_watcher_event(&watcher::Event::Apply(t));
    }
}
