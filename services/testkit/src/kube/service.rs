//! The stand-in's HTTP side: a `tower::Service` that a `kube::Client` sends its requests
//! to (no network). Each request is authorized (for a client with RBAC rules), routed by
//! its REST path to the resource, and answered as the API server answers: objects and
//! lists as JSON (`PartialObjectMetadata` when the client asks for metadata only), watches
//! as a stream of JSON lines (`ADDED`/`MODIFIED`/`DELETED`, `BOOKMARK` when asked, an
//! `ERROR` 410 for a compacted resourceVersion), failures as a `Status`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use super::patch::PatchType;
use super::path::{is_watch, ResourcePath};
use super::rbac::{access, forbidden_message, Rules};
use super::selector::{FieldSelector, LabelSelector};
use super::shared::{Recorded, Shared};
use super::state::{DeleteOptions, Target};
use super::status::ApiError;
use super::store::{ChangeType, Filter, Sent};

/// The body of the stand-in's responses.
pub type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

/// How often a watch that allows bookmarks gets one.
const BOOKMARK_EVERY: Duration = Duration::from_secs(1);

/// Who sends the requests of a client.
#[derive(Debug)]
pub enum Identity {
    /// Everything is allowed (the test's own client, a cluster administrator).
    Admin,
    /// Only what these rules allow.
    Account(Rules),
}

impl Identity {
    fn user(&self) -> &str {
        match self {
            Self::Admin => "system:admin",
            Self::Account(r) => &r.user,
        }
    }
}

/// The service behind a `kube::Client`.
#[derive(Debug, Clone)]
pub struct ApiService {
    pub(super) shared: Arc<Shared>,
    pub(super) identity: Arc<Identity>,
}

impl tower_service::Service<Request<::kube::client::Body>> for ApiService {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<::kube::client::Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.handle(request).await) })
    }
}

fn respond(code: u16, body: &Value) -> Response<ResponseBody> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body).unwrap_or_default())).boxed_unsync())
        .expect("a valid response")
}

fn failure(e: &ApiError) -> Response<ResponseBody> {
    respond(e.code, &e.to_status())
}

/// The query's parameters.
fn params(query: &str) -> Vec<(String, String)> {
    url::form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect()
}

fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The object as `PartialObjectMetadata`.
fn partial(o: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": o["metadata"]})
}

/// How the client wants objects: whole, or metadata only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Whole,
    Metadata,
}

fn form(accept: &str) -> Form {
    if accept.contains("as=PartialObjectMetadata") {
        Form::Metadata
    } else {
        Form::Whole
    }
}

fn shaped(o: &Value, form: Form, api_version: &str) -> Value {
    match form {
        Form::Metadata => partial(o),
        Form::Whole => {
            let mut o = o.clone();
            o["apiVersion"] = json!(api_version);
            o
        }
    }
}

impl ApiService {
    pub(super) async fn handle(
        &self,
        request: Request<::kube::client::Body>,
    ) -> Response<ResponseBody> {
        let (parts, body) = request.into_parts();
        let method = parts.method.to_string();
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().unwrap_or("").to_string();
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        };
        let content_type = header("content-type");
        let accept = header("accept");
        drop(parts);
        let body = match body.collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return failure(&ApiError::bad_request(format!("cannot read the body: {e}"))),
        };
        let response = self.answer(&method, &path, &query, &content_type, &accept, &body);
        self.shared.record(Recorded {
            user: self.identity.user().to_string(),
            method,
            path,
            query,
            code: response.status().as_u16(),
        });
        response
    }

    fn answer(
        &self,
        method: &str,
        path: &str,
        query: &str,
        content_type: &str,
        accept: &str,
        body: &[u8],
    ) -> Response<ResponseBody> {
        let Ok(p) = ResourcePath::parse(path) else {
            return failure(&ApiError::no_resource());
        };
        if let Identity::Account(rules) = self.identity.as_ref() {
            if let Ok(a) = access(method, path, query) {
                if !rules.allows(&a) {
                    let message = forbidden_message(&rules.user, &a);
                    self.shared.deny(message.clone());
                    let base = a.resource.split('/').next().unwrap_or_default().to_string();
                    return failure(&ApiError::forbidden(
                        message,
                        a.name.as_deref(),
                        &a.group,
                        &base,
                    ));
                }
            }
        }
        if method == "POST" && path == super::rbac::SUBJECT_ACCESS_REVIEWS {
            return self.subject_access_review(body);
        }
        let params = params(query);
        let target = {
            let state = self.shared.state.lock();
            let Some(info) = state.resources.get(&p.group, &p.version, &p.resource) else {
                return failure(&ApiError::no_resource());
            };
            if !info.namespaced && p.namespace.is_some() {
                return failure(&ApiError::no_resource());
            }
            Target {
                info: info.clone(),
                version: p.version.clone(),
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                sub: p.subresource.clone(),
            }
        };
        let body: Value = if body.is_empty() {
            Value::Null
        } else {
            match serde_json::from_slice(body).or_else(|_| serde_yaml::from_slice(body)) {
                Ok(v) => v,
                Err(e) => {
                    return failure(&ApiError::bad_request(format!("the body is not JSON: {e}")))
                }
            }
        };
        let api_version = target.info.api_version(&target.version);
        let form = form(accept);
        let result = match (method, &target.name) {
            ("GET", Some(_)) if !is_watch(query) => {
                let state = self.shared.state.lock();
                state
                    .get(&target)
                    .map(|o| (200, shaped(&o, form, &api_version)))
            }
            ("GET", _) if is_watch(query) => return self.watch(&target, &params, form),
            ("GET", None) => self.list(&target, &params, form),
            ("POST", None) => self
                .write(|s| s.create(&target, body))
                .map(|o| (201, shaped(&o, Form::Whole, &api_version))),
            ("PUT", Some(_)) => self
                .write(|s| s.update(&target, body))
                .map(|o| (200, shaped(&o, Form::Whole, &api_version))),
            ("PATCH", Some(_)) => match PatchType::of(content_type) {
                Some(kind) => self
                    .write(|s| s.patch(&target, kind, body, param(&params, "fieldManager")))
                    .map(|o| (200, shaped(&o, Form::Whole, &api_version))),
                None => Err(ApiError::unsupported_media(content_type)),
            },
            ("DELETE", Some(_)) => {
                let options = delete_options(&body, &params);
                self.write(|s| s.delete(&target, &options))
                    .map(|o| (200, shaped(&o, Form::Whole, &api_version)))
            }
            ("DELETE", None) => self.delete_collection(&target, &body, &params),
            _ => Err(ApiError::method_not_allowed(format!(
                "{method} is not allowed on {path}"
            ))),
        };
        match result {
            Ok((code, v)) => respond(code, &v),
            Err(e) => failure(&e),
        }
    }

    /// A SubjectAccessReview, answered from the RBAC objects the stand-in holds.
    fn subject_access_review(&self, body: &[u8]) -> Response<ResponseBody> {
        let sar: Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => return failure(&ApiError::bad_request(format!("the body is not JSON: {e}"))),
        };
        let state = self.shared.state.lock();
        let mut docs = Vec::new();
        for plural in [
            "roles",
            "rolebindings",
            "clusterroles",
            "clusterrolebindings",
        ] {
            docs.extend(
                state
                    .objects_where(super::rbac::RBAC_GROUP, plural, |_| true)
                    .into_iter()
                    .map(|(_, v)| v),
            );
        }
        drop(state);
        let mut answer = super::rbac::review(&docs, &sar);
        answer["apiVersion"] = json!("authorization.k8s.io/v1");
        answer["kind"] = json!("SubjectAccessReview");
        respond(201, &answer)
    }

    /// Runs a write under the lock, then wakes the simulated controllers.
    fn write<T>(
        &self,
        f: impl FnOnce(&mut super::state::State) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let result = f(&mut self.shared.state.lock());
        self.shared.wake();
        result
    }

    fn filter(target: &Target, params: &[(String, String)]) -> Result<Filter, ApiError> {
        let labels = LabelSelector::parse(param(params, "labelSelector").unwrap_or(""))
            .map_err(ApiError::bad_request)?;
        let fields = FieldSelector::parse(
            param(params, "fieldSelector").unwrap_or(""),
            &target.info.group,
            &target.info.plural,
        )
        .map_err(ApiError::bad_request)?;
        Ok(Filter {
            group: target.info.group.clone(),
            resource: target.info.plural.clone(),
            namespace: target.namespace.clone(),
            labels,
            fields,
        })
    }

    fn list(
        &self,
        target: &Target,
        params: &[(String, String)],
        form: Form,
    ) -> Result<(u16, Value), ApiError> {
        let filter = Self::filter(target, params)?;
        let limit = param(params, "limit")
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|l| *l > 0);
        let after = param(params, "continue")
            .filter(|c| !c.is_empty())
            .map(decode_continue)
            .transpose()?;
        let state = self.shared.state.lock();
        let api_version = target.info.api_version(&target.version);
        let mut items = Vec::new();
        let mut more = false;
        for (key, o) in state.store.list(
            &target.info.group,
            &target.info.plural,
            target.namespace.as_deref(),
        ) {
            if !filter.selects(o) {
                continue;
            }
            let at = (key.namespace.clone(), key.name.clone());
            if after.as_ref().is_some_and(|a| &at <= a) {
                continue;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                more = true;
                break;
            }
            items.push((at, shaped(o, form, &api_version)));
        }
        let mut metadata = json!({"resourceVersion": state.store.rv().to_string()});
        if more {
            if let Some((at, _)) = items.last() {
                metadata["continue"] = json!(encode_continue(at));
            }
        }
        let (api_version, kind) = match form {
            Form::Metadata => (
                "meta.k8s.io/v1".to_string(),
                "PartialObjectMetadataList".to_string(),
            ),
            Form::Whole => (api_version, format!("{}List", target.info.kind)),
        };
        let items: Vec<Value> = items.into_iter().map(|(_, v)| v).collect();
        Ok((
            200,
            json!({"apiVersion": api_version, "kind": kind, "metadata": metadata, "items": items}),
        ))
    }

    fn delete_collection(
        &self,
        target: &Target,
        body: &Value,
        params: &[(String, String)],
    ) -> Result<(u16, Value), ApiError> {
        let filter = Self::filter(target, params)?;
        let options = delete_options(body, params);
        let names: Vec<String> = {
            let state = self.shared.state.lock();
            state
                .store
                .list(
                    &target.info.group,
                    &target.info.plural,
                    target.namespace.as_deref(),
                )
                .filter(|(_, o)| filter.selects(o))
                .map(|(k, _)| k.name.clone())
                .collect()
        };
        for name in names {
            let mut one = target.clone();
            one.name = Some(name);
            let _ = self.write(|s| s.delete(&one, &options));
        }
        Ok((
            200,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
        ))
    }

    fn watch(
        &self,
        target: &Target,
        params: &[(String, String)],
        form: Form,
    ) -> Response<ResponseBody> {
        let filter = match Self::filter(target, params) {
            Ok(f) => f,
            Err(e) => return failure(&e),
        };
        let initial_events = param(params, "sendInitialEvents") == Some("true");
        let since = match param(params, "resourceVersion") {
            _ if initial_events => None,
            None | Some("") | Some("0") => None,
            Some(rv) => match rv.parse::<u64>() {
                Ok(rv) => Some(rv),
                Err(_) => {
                    return failure(&ApiError::bad_request(format!(
                        "invalid resource version: {rv}"
                    )))
                }
            },
        };
        let bookmarks = param(params, "allowWatchBookmarks") == Some("true");
        let timeout = param(params, "timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .map_or(Duration::from_secs(1800), Duration::from_secs);
        let api_version = target.info.api_version(&target.version);
        let kind = target.info.kind.clone();
        let lag = self.shared.lag(
            &target.info.group,
            &target.info.plural,
            param(params, "labelSelector").unwrap_or(""),
        );
        let opened = self.shared.state.lock().store.watch(filter, since);
        let rx = match opened {
            Ok(rx) => rx,
            Err(gone) => {
                let e = ApiError::gone(since.unwrap_or_default(), gone.oldest);
                let frame = Ok(http_body::Frame::data(line("ERROR", &e.to_status())));
                return Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(StreamBody::new(futures::stream::iter([frame])).boxed_unsync())
                    .expect("a valid response");
            }
        };
        // A lagging watch cannot say safely how far it is: no bookmarks.
        let bookmarks = bookmarks && lag.is_none();
        let mut rx = match lag {
            Some(lag) => lagged(rx, lag),
            None => rx,
        };
        let shared = Arc::downgrade(&self.shared);
        let mut initial_end = initial_events;
        let deadline = tokio::time::Instant::now() + timeout;
        let stream = async_stream(move |mut emit| async move {
            let mut tick = tokio::time::interval(BOOKMARK_EVERY);
            tick.tick().await;
            loop {
                if initial_end {
                    // The initial events are queued already: once they are sent, say so.
                    initial_end = false;
                    let Some(s) = shared.upgrade() else { return };
                    let state = s.state.lock();
                    while let Ok(sent) = rx.try_recv() {
                        emit(event_line(&sent, form, &api_version));
                    }
                    let mut b = bookmark(&api_version, &kind, state.store.rv(), form);
                    drop(state);
                    b["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
                    emit(line("BOOKMARK", &b));
                    continue;
                }
                tokio::select! {
                    sent = rx.recv() => match sent {
                        Some(sent) => emit(event_line(&sent, form, &api_version)),
                        None => return,
                    },
                    _ = tick.tick(), if bookmarks => {
                        let Some(s) = shared.upgrade() else { return };
                        // Under the lock no change is sent to this watch: a bookmark's
                        // version is only safe once everything before it went out.
                        let state = s.state.lock();
                        match rx.try_recv() {
                            Ok(sent) => emit(event_line(&sent, form, &api_version)),
                            Err(_) => emit(line("BOOKMARK", &bookmark(&api_version, &kind, state.store.rv(), form))),
                        }
                    }
                    _ = tokio::time::sleep_until(deadline) => return,
                }
            }
        });
        let body = StreamBody::new(futures::StreamExt::map(stream, |b| {
            Ok::<_, Infallible>(http_body::Frame::data(b))
        }));
        Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(body.boxed_unsync())
            .expect("a valid response")
    }
}

/// The changes of `rx`, each delivered `lag` after it happened (a slow watch connection).
fn lagged(mut rx: UnboundedReceiver<Sent>, lag: Duration) -> UnboundedReceiver<Sent> {
    let (stamped_tx, mut stamped_rx) = tokio::sync::mpsc::unbounded_channel();
    let (out_tx, out_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(sent) = rx.recv().await {
            if stamped_tx
                .send((tokio::time::Instant::now() + lag, sent))
                .is_err()
            {
                return;
            }
        }
    });
    tokio::spawn(async move {
        while let Some((at, sent)) = stamped_rx.recv().await {
            tokio::time::sleep_until(at).await;
            if out_tx.send(sent).is_err() {
                return;
            }
        }
    });
    out_rx
}

fn bookmark(api_version: &str, kind: &str, rv: u64, form: Form) -> Value {
    let (api_version, kind) = match form {
        Form::Metadata => ("meta.k8s.io/v1", "PartialObjectMetadata"),
        Form::Whole => (api_version, kind),
    };
    json!({"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": rv.to_string()}})
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

fn event_line(sent: &Sent, form: Form, api_version: &str) -> Bytes {
    let (kind, object, _) = sent;
    let t = match kind {
        ChangeType::Added => "ADDED",
        ChangeType::Modified => "MODIFIED",
        ChangeType::Deleted => "DELETED",
    };
    line(t, &shaped(object, form, api_version))
}

fn delete_options(body: &Value, params: &[(String, String)]) -> DeleteOptions {
    let policy = body["propagationPolicy"]
        .as_str()
        .or_else(|| param(params, "propagationPolicy"))
        .unwrap_or("Background");
    DeleteOptions {
        orphan: policy == "Orphan" || body["orphanDependents"] == true,
        uid: body["preconditions"]["uid"].as_str().map(String::from),
        resource_version: body["preconditions"]["resourceVersion"]
            .as_str()
            .map(String::from),
        grace: body["gracePeriodSeconds"]
            .as_i64()
            .or_else(|| param(params, "gracePeriodSeconds").and_then(|g| g.parse().ok())),
    }
}

fn encode_continue(at: &(String, String)) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&json!([at.0, at.1])).unwrap_or_default())
}

fn decode_continue(token: &str) -> Result<(String, String), ApiError> {
    use base64::Engine;
    let bad = || ApiError::bad_request("invalid continue token");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let v: (String, String) = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    Ok(v)
}

/// A stream fed by an async function through an `emit` callback (a channel under the
/// hood), ended when the function returns.
fn async_stream<F, Fut>(f: F) -> impl futures::Stream<Item = Bytes> + Send + 'static
where
    F: FnOnce(Box<dyn FnMut(Bytes) + Send>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    let emit: Box<dyn FnMut(Bytes) + Send> = Box::new(move |b| {
        let _ = tx.send(b);
    });
    let task = tokio::spawn(f(emit));
    let abort = AbortOnDrop(task);
    futures::stream::unfold((rx, abort), |(mut rx, abort)| async move {
        rx.recv().await.map(|b| (b, (rx, abort)))
    })
}

/// Stops the task feeding a watch when the client drops the watch.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
