//! Test support for the reconciler scenarios: a mocked API server (a kube `Client` over
//! `tower_test::mock::pair`, as kube-rs/controller-rs test their reconcilers) that checks
//! each request in order and answers it, and a fake `MoverLink` that records calls and
//! plays scripted job reports. The server records every request it answers, and at the
//! end of the scenario (when it is dropped) each must be allowed by the operator's RBAC in
//! deploy/operator (see rbac.rs). The populator's scenarios use the same server
//! (populator.rs adds their context).

#![allow(dead_code)]

pub mod populator;
pub mod rbac;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferry_operator::controller::{
    Context, JobReport, JobRequest, JobState, LinkError, MoverAddress, MoverLink, OperatorSettings,
    ReportStream,
};
use ferry_operator::crd::{Checkpoint, Progress};
use ferry_operator::mover::MoverDefaults;
use futures::StreamExt;
use http::{Request, Response};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::client::Body;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use kube::Client;
use parking_lot::Mutex;
use serde_json::{json, Value};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// One request the operator sent.
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
    /// Requests answered so far.
    pub count: usize,
    /// Method, path and query of each request answered, for the RBAC check.
    answered: Vec<(String, String, String)>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        // A failing scenario already says what went wrong; a second panic would abort.
        if !std::thread::panicking() {
            rbac::assert_allowed(&self.answered);
        }
    }
}

/// How to answer a request.
pub enum Reply {
    /// 200 with this JSON.
    Ok(Value),
    /// 200 with the request's own body (a create or a patch of a whole object).
    Echo,
    /// 200 with this object, its status replaced by the one of the request (an apply
    /// patch of the status subresource).
    ApplyStatus(Value),
    /// 404 Not Found.
    NotFound,
    /// 200 with a delete's Status.
    Deleted,
    /// 409 Conflict (a stale resourceVersion, or a create of an existing object).
    Conflict,
    /// A failure Status with this code (403 Forbidden, 404 NotFound, 409 AlreadyExists,
    /// others InternalError).
    Fail(u16),
    /// A failure Status with this code and the server's message (an admission refusal).
    Refuse(u16, &'static str),
}

fn status_json(code: u16, reason: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Status", "metadata": {},
        "status": if code < 300 { "Success" } else { "Failure" },
        "reason": reason, "code": code, "message": reason,
    })
}

fn failure_reason(code: u16) -> &'static str {
    match code {
        403 => "Forbidden",
        404 => "NotFound",
        409 => "AlreadyExists",
        _ => "InternalError",
    }
}

impl ApiServer {
    /// A client and the server behind it.
    pub fn new() -> (Client, Self) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        (
            Client::new(service, "default"),
            Self {
                handle,
                count: 0,
                answered: Vec::new(),
            },
        )
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
        if method_seen == "POST" && path_seen.ends_with("/pods") {
            let violations = ferry_testkit::pod_security::restricted_violations(&body);
            assert!(
                violations.is_empty(),
                "a pod the Pod Security Standard `restricted` refuses: {violations:?}\n{body}"
            );
        }
        self.count += 1;
        self.answered
            .push((method_seen.clone(), path_seen.clone(), query.clone()));
        let (code, answer) = match reply {
            Reply::Ok(v) => (200, v),
            Reply::Echo => (200, body.clone()),
            Reply::ApplyStatus(object) => (200, with_status(&object, &body)),
            Reply::NotFound => (404, status_json(404, "NotFound")),
            Reply::Deleted => (200, status_json(200, "Deleted")),
            Reply::Conflict => (409, status_json(409, "Conflict")),
            Reply::Fail(code) => (code, status_json(code, failure_reason(code))),
            Reply::Refuse(code, message) => {
                let mut status = status_json(code, failure_reason(code));
                status["message"] = json!(message);
                (code, status)
            }
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

    /// The path and query of each of the next requests that come within `wait` of each
    /// other, up to `most`: a list is answered with an empty list of its kind, a watch is
    /// left unanswered (the client sees the connection end and backs off).
    pub async fn lists(&mut self, most: usize, wait: Duration) -> Vec<(String, String)> {
        let mut seen = Vec::new();
        while seen.len() < most {
            let Ok(Some((request, send))) =
                tokio::time::timeout(wait, self.handle.next_request()).await
            else {
                break;
            };
            let path = request.uri().path().to_string();
            let query = request.uri().query().unwrap_or("").to_string();
            if !query.contains("watch=") {
                // Lists only: which watches start before the test ends is a race, and the
                // least-privilege check needs what a scenario asks to be the same each run.
                self.answered
                    .push((request.method().to_string(), path.clone(), query.clone()));
                let kind = path.rsplit('/').next().unwrap_or_default().to_string();
                let list = json!({"apiVersion": "v1", "kind": format!("{kind}List"),
                                  "metadata": {"resourceVersion": "1"}, "items": []});
                let response = Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&list).unwrap()))
                    .unwrap();
                send.send_response(response);
            }
            seen.push((path, query));
        }
        seen
    }

    /// Answers an event (`events.k8s.io`) and returns it.
    pub async fn expect_event(&mut self, namespace: &str) -> Seen {
        let path = format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events");
        self.expect("POST", &path, Reply::Echo).await
    }

    /// Answers an event that repeats an earlier one: a PATCH of its series (kube's
    /// recorder counts repeats instead of creating an event each time).
    pub async fn expect_event_series(&mut self, namespace: &str) -> Seen {
        let next = tokio::time::timeout(Duration::from_secs(10), self.handle.next_request())
            .await
            .expect("no event came");
        let (request, send) = next.expect("the client went away");
        let prefix = format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events/");
        let path = request.uri().path().to_string();
        assert!(
            request.method() == "PATCH" && path.starts_with(&prefix),
            "expected the PATCH of an event series, got {} {path}",
            request.method()
        );
        let bytes = request.into_body().collect_bytes().await.unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        self.count += 1;
        self.answered
            .push(("PATCH".to_string(), path.clone(), String::new()));
        let response = Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap();
        send.send_response(response);
        Seen {
            method: "PATCH".into(),
            path,
            query: String::new(),
            content_type: "application/merge-patch+json".into(),
            body,
        }
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

/// A call the operator made on the fake link.
// A few records per test: their size does not matter, matching on them does.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    Start(JobRequest),
    Watch(String),
    Cancel(String),
    EndRelay(String),
}

/// A fake mover: records calls; `start` answers Running; `watch` plays the reports
/// scripted for the job id (and then stays open when `hold` is set).
#[derive(Default)]
pub struct FakeLink {
    pub calls: Mutex<Vec<Call>>,
    pub scripts: Mutex<HashMap<String, Vec<JobReport>>>,
    pub hold: Mutex<bool>,
    pub tokens: Mutex<Vec<String>>,
    /// When set, `start` fails as a connection to a mover that cannot be reached.
    pub unreachable: Mutex<bool>,
}

impl FakeLink {
    pub fn script(&self, id: &str, reports: Vec<JobReport>) {
        self.scripts.lock().insert(id.to_string(), reports);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().clone()
    }
}

/// The job id the fake gives a request.
pub fn job_id(key: &str) -> String {
    format!("job-{key}")
}

#[async_trait]
impl MoverLink for FakeLink {
    async fn start(&self, mover: &MoverAddress, job: &JobRequest) -> Result<JobReport, LinkError> {
        self.calls.lock().push(Call::Start(job.clone()));
        self.tokens.lock().push(mover.token.clone());
        if *self.unreachable.lock() {
            return Err(LinkError::Unavailable(format!(
                "{}: transport error: connection timed out",
                mover.pod
            )));
        }
        Ok(report(&job_id(job.idempotency_key()), JobState::Running, 0))
    }

    async fn watch(&self, mover: &MoverAddress, job_id: &str) -> Result<ReportStream, LinkError> {
        self.calls.lock().push(Call::Watch(job_id.to_string()));
        self.tokens.lock().push(mover.token.clone());
        let reports = self.scripts.lock().get(job_id).cloned().unwrap_or_default();
        let played = futures::stream::iter(reports.into_iter().map(Ok));
        if *self.hold.lock() {
            Ok(played.chain(futures::stream::pending()).boxed())
        } else {
            Ok(played.boxed())
        }
    }

    async fn cancel(&self, mover: &MoverAddress, owner_uid: &str) -> Result<(), LinkError> {
        self.calls.lock().push(Call::Cancel(owner_uid.to_string()));
        self.tokens.lock().push(mover.token.clone());
        Ok(())
    }

    async fn end_relay(&self, mover: &MoverAddress, owner_uid: &str) -> Result<(), LinkError> {
        self.calls
            .lock()
            .push(Call::EndRelay(owner_uid.to_string()));
        self.tokens.lock().push(mover.token.clone());
        Ok(())
    }
}

/// A job report.
pub fn report(id: &str, state: JobState, done: u64) -> JobReport {
    JobReport {
        progress: Progress {
            total_bytes: 4 << 20,
            done_bytes: done,
            resumed_bytes: 0,
            committed_bytes: 0,
        },
        ..JobReport::new(id, state)
    }
}

/// A report with committed ranges.
pub fn with_checkpoint(mut r: JobReport, ranges: &[(u64, u64)]) -> JobReport {
    r.checkpoint = Some(Checkpoint::new(4 << 20, ranges.iter().copied()));
    r
}

/// Operator settings for the scenarios: no waiting between retries.
pub fn settings() -> OperatorSettings {
    let mut s = OperatorSettings::new(MoverDefaults {
        image: "ghcr.io/ferry-project/ferry:0.1.0".into(),
        image_pull_policy: Some("IfNotPresent".into()),
        resources: None,
        node_selector: Default::default(),
        tolerations: vec![],
        priority_class_name: None,
        service_account_name: Some("ferry-mover".into()),
        image_pull_secrets: vec![],
    });
    s.retry_backoff = Duration::ZERO;
    s.max_attempts = 3;
    s
}

/// One movers' CA for every scenario (making one costs a key generation).
pub fn mover_ca() -> Arc<ferry_operator::mover::tls::MoverCa> {
    static CA: std::sync::OnceLock<Arc<ferry_operator::mover::tls::MoverCa>> =
        std::sync::OnceLock::new();
    CA.get_or_init(|| Arc::new(ferry_operator::mover::tls::MoverCa::generate().unwrap()))
        .clone()
}

/// Everything a scenario needs.
pub struct Harness {
    pub server: ApiServer,
    pub ctx: Arc<Context>,
    pub link: Arc<FakeLink>,
    pub pods: Writer<Pod>,
    pub namespaces: Writer<PartialObjectMeta<Namespace>>,
}

impl Harness {
    pub fn new(settings: OperatorSettings) -> Self {
        Self::with_class_defaults(settings, Default::default())
    }

    /// A harness whose templates are filled from these StorageClassProfiles.
    pub fn with_class_defaults(
        settings: OperatorSettings,
        defaults: ferry_operator::class_defaults::ClassDefaults,
    ) -> Self {
        let (client, server) = ApiServer::new();
        let link = Arc::new(FakeLink::default());
        let pods = Writer::<Pod>::default();
        let namespaces = Writer::<PartialObjectMeta<Namespace>>::default();
        let ctx = Arc::new(
            Context::new(client, settings, link.clone(), pods.as_reader())
                .with_namespaces(namespaces.as_reader())
                .with_mover_ca(mover_ca())
                .with_class_defaults(defaults),
        );
        Self {
            server,
            ctx,
            link,
            pods,
            namespaces,
        }
    }

    /// The watch of namespaces saw `name` with these annotations.
    pub fn namespace_seen(&mut self, name: &str, annotations: &[(&str, &str)]) {
        let mut meta = PartialObjectMeta::<Namespace>::default();
        meta.metadata.name = Some(name.to_string());
        meta.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        self.namespaces
            .apply_watcher_event(&watcher::Event::Apply(meta));
    }

    /// The watch of mover pods saw this pod.
    pub fn pod_seen(&mut self, pod: Pod) {
        self.pods.apply_watcher_event(&watcher::Event::Apply(pod));
    }

    /// The watch of mover pods saw this pod go.
    pub fn pod_gone(&mut self, pod: Pod) {
        self.pods.apply_watcher_event(&watcher::Event::Delete(pod));
    }
}

/// The pod as the API server would have it once it runs and is ready on `node`.
pub fn ready(mut pod: Pod, node: &str) -> Pod {
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.node_name = Some(node.into());
    pod.status = Some(
        serde_json::from_value(json!({
            "phase": "Running",
            "podIP": "10.1.2.3",
            "conditions": [{"type": "Ready", "status": "True"}],
        }))
        .unwrap(),
    );
    pod
}

/// A JSON object with `status` replaced by the one in an apply patch body.
pub fn with_status(object: &Value, patch: &Value) -> Value {
    let mut o = object.clone();
    o["status"] = patch["status"].clone();
    o
}
