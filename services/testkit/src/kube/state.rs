//! What the API server does with each verb, on the [`Store`]: the metadata it owns (uid,
//! creationTimestamp, resourceVersion, generation bumped when anything but metadata and
//! status changes), optimistic concurrency (a write naming a stale resourceVersion is a
//! 409), `generateName`, the `status` subresource (a write of the object keeps its status,
//! a write of the status keeps the rest), finalizers (a deletion only sets
//! deletionTimestamp while any remain; the object goes when the last one is removed),
//! `stringData` of Secrets, no-op writes that change nothing (no new resourceVersion), and
//! garbage collection of dependents whose owners are all gone ([`State::collect`]).

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use super::patch::{self, PatchType};
use super::resources::{ResourceInfo, Resources};
use super::sim::Sims;
use super::status::ApiError;
use super::store::{Key, Store};

/// The target of a request: the resource, the version of the path, and the names.
#[derive(Debug, Clone)]
pub struct Target {
    /// The resource.
    pub info: ResourceInfo,
    /// The version the path named.
    pub version: String,
    /// The namespace (None: cluster-scoped, or all namespaces).
    pub namespace: Option<String>,
    /// The object's name.
    pub name: Option<String>,
    /// The subresource.
    pub sub: Option<String>,
}

impl Target {
    fn key(&self, name: &str) -> Key {
        Key::new(
            &self.info.group,
            &self.info.plural,
            self.namespace.as_deref().unwrap_or_default(),
            name,
        )
    }

    fn not_found(&self, name: &str) -> ApiError {
        ApiError::not_found(
            &self.info.qualified(),
            &self.info.group,
            &self.info.plural,
            name,
        )
    }

    fn conflict(&self, name: &str, why: &str) -> ApiError {
        ApiError::conflict(
            &self.info.qualified(),
            &self.info.group,
            &self.info.plural,
            name,
            why,
        )
    }
}

/// Options of a DELETE.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// Orphan dependents instead of deleting them.
    pub orphan: bool,
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
    /// `gracePeriodSeconds`.
    pub grace: Option<i64>,
}

/// The API server's state.
#[derive(Debug)]
pub struct State {
    /// Objects and watches.
    pub store: Store,
    /// Served kinds.
    pub resources: Resources,
    /// The simulated controllers and what they remember.
    pub sims: Sims,
    seq: u64,
    /// What each field manager last applied to each object (uid, manager, subresource):
    /// a field it applied before and leaves out now is removed, as server-side apply does
    /// for fields only that manager owned.
    applied: std::collections::HashMap<(String, String, String), Value>,
    /// When a kubelet began starting each pod (by uid).
    pub starting: std::collections::HashMap<String, std::time::Instant>,
    /// The claims removed when the binder last looked for volumes to reclaim.
    pub claims_removed_seen: u64,
}

/// Now, to the second, as metadata timestamps are written.
pub fn now() -> String {
    let secs = k8s_openapi::jiff::Timestamp::now().as_second();
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The object without what a "spec change" does not count: metadata and status.
fn spec_part(o: &Value, has_status: bool) -> Value {
    let mut o = o.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("apiVersion");
        m.remove("kind");
        if has_status {
            m.remove("status");
        }
    }
    o
}

fn meta_str<'a>(o: &'a Value, field: &str) -> Option<&'a str> {
    o["metadata"][field].as_str()
}

fn finalizers(o: &Value) -> Vec<String> {
    o["metadata"]["finalizers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Base64 of bytes (Secret data).
fn b64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

impl State {
    /// An empty cluster serving `resources`, with the namespaces `default` and
    /// `kube-system`.
    pub fn new(resources: Resources) -> Self {
        let mut s = Self {
            store: Store::default(),
            resources,
            sims: Sims::default(),
            seq: 0,
            applied: Default::default(),
            starting: Default::default(),
            claims_removed_seen: 0,
        };
        for ns in ["default", "kube-system"] {
            s.create_object(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            )
            .expect("a new cluster takes its namespaces");
        }
        s
    }

    /// A fresh number (uids, generated names, IPs).
    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn new_uid(&mut self) -> String {
        let n = self.next_seq();
        format!("0000f3e7-5a1d-4c0e-9b1a-{n:012x}")
    }

    fn random_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut n = self.next_seq().wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (0..5)
            .map(|_| {
                let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
                n /= ALPHABET.len() as u64;
                c
            })
            .collect()
    }

    /// The target of a whole object (its apiVersion and kind), for writes the stand-in's
    /// own controllers and the tests make.
    pub fn target_of(&self, object: &Value) -> Result<Target, ApiError> {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        let info = self
            .resources
            .by_kind(api_version, kind)
            .ok_or_else(|| {
                ApiError::bad_request(format!("no kind {kind} in {api_version} is served"))
            })?
            .clone();
        let version = api_version
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let namespace = if info.namespaced {
            Some(
                meta_str(object, "namespace")
                    .unwrap_or("default")
                    .to_string(),
            )
        } else {
            None
        };
        Ok(Target {
            info,
            version,
            namespace,
            name: meta_str(object, "name").map(String::from),
            sub: None,
        })
    }

    /// Creates a whole object (as an administrator would).
    pub fn create_object(&mut self, object: Value) -> Result<Value, ApiError> {
        let mut t = self.target_of(&object)?;
        t.name = None;
        self.create(&t, object)
    }

    /// One object.
    pub fn get(&self, t: &Target) -> Result<Value, ApiError> {
        let name = t.name.as_deref().unwrap_or_default();
        self.store
            .get(&t.key(name))
            .cloned()
            .ok_or_else(|| t.not_found(name))
    }

    /// POST.
    pub fn create(&mut self, t: &Target, mut body: Value) -> Result<Value, ApiError> {
        if t.sub.is_some() || t.name.is_some() {
            return Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            ));
        }
        if !body.is_object() {
            return Err(ApiError::bad_request("the body is not an object"));
        }
        let info = &t.info;
        let namespace = if info.namespaced {
            let Some(ns) = t.namespace.clone() else {
                return Err(ApiError::method_not_allowed(
                    "a namespaced resource is created in a namespace",
                ));
            };
            if let Some(given) = meta_str(&body, "namespace") {
                if given != ns {
                    return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
                }
            }
            if self
                .store
                .get(&Key::new("", "namespaces", "", &ns))
                .is_none()
            {
                return Err(ApiError::not_found("namespaces", "", "namespaces", &ns));
            }
            Some(ns)
        } else {
            None
        };
        let name = match (meta_str(&body, "name"), meta_str(&body, "generateName")) {
            (Some(n), _) if !n.is_empty() => n.to_string(),
            (_, Some(prefix)) => format!("{prefix}{}", self.random_suffix()),
            _ => {
                return Err(ApiError::invalid(
                    &info.kind,
                    "",
                    "metadata.name: Required value: name or generateName is required",
                ))
            }
        };
        let key = t.key(&name);
        if self.store.get(&key).is_some() {
            return Err(ApiError::already_exists(
                &info.qualified(),
                &info.group,
                &info.plural,
                &name,
            ));
        }
        body["apiVersion"] = json!(info.api_version(&t.version));
        body["kind"] = json!(info.kind);
        let uid = self.new_uid();
        let meta = body["metadata"]
            .as_object_mut()
            .expect("an object's metadata");
        meta.insert("name".into(), json!(name));
        if let Some(ns) = &namespace {
            meta.insert("namespace".into(), json!(ns));
        }
        meta.insert("uid".into(), json!(uid));
        meta.insert("creationTimestamp".into(), json!(now()));
        meta.insert("generation".into(), json!(1));
        for owned in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
            "managedFields",
        ] {
            meta.remove(owned);
        }
        if info.status {
            let initial = match (info.group.as_str(), info.plural.as_str()) {
                ("", "pods") => Some(json!({"phase": "Pending", "qosClass": "BestEffort"})),
                ("", "persistentvolumeclaims") => Some(json!({"phase": "Pending"})),
                ("", "persistentvolumes") => Some(json!({"phase": "Pending"})),
                ("", "namespaces") => Some(json!({"phase": "Active"})),
                _ => None,
            };
            match initial {
                Some(s) => body["status"] = s,
                None => {
                    body.as_object_mut().map(|o| o.remove("status"));
                }
            }
        }
        if info.group.is_empty() && info.plural == "secrets" {
            secret_string_data(&mut body);
        }
        if info.group.is_empty() && info.plural == "persistentvolumeclaims" && self.sims.binding {
            // The StorageObjectInUseProtection admission plugin's finalizer.
            let f = body["metadata"]["finalizers"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if !f.iter().any(|f| f == super::sim::binding::PVC_PROTECTION) {
                let mut f = f;
                f.push(json!(super::sim::binding::PVC_PROTECTION));
                body["metadata"]["finalizers"] = json!(f);
            }
        }
        Ok(self.store.put(key, body))
    }

    /// PUT.
    pub fn update(&mut self, t: &Target, body: Value) -> Result<Value, ApiError> {
        let name = t.name.clone().unwrap_or_default();
        if meta_str(&body, "name").is_some_and(|n| n != name) {
            return Err(ApiError::bad_request(
                "the name of the object does not match the name on the URL",
            ));
        }
        let old = self.get(t)?;
        if let Some(rv) = meta_str(&body, "resourceVersion") {
            if Some(rv) != meta_str(&old, "resourceVersion") {
                return Err(t.conflict(&name, ApiError::MODIFIED));
            }
        }
        self.write(t, old, body)
    }

    /// PATCH.
    pub fn patch(
        &mut self,
        t: &Target,
        kind: PatchType,
        body: Value,
        field_manager: Option<&str>,
    ) -> Result<Value, ApiError> {
        let name = t.name.clone().unwrap_or_default();
        if kind == PatchType::Apply && field_manager.is_none_or(str::is_empty) {
            return Err(ApiError::invalid(
                "PatchOptions.meta.k8s.io",
                "",
                "fieldManager: Required value: is required for apply patch",
            ));
        }
        let old = match self.store.get(&t.key(&name)) {
            Some(o) => o.clone(),
            None if kind == PatchType::Apply && t.sub.is_none() => {
                let mut create = t.clone();
                create.name = None;
                let mut body = body;
                body["metadata"]["name"] = json!(name);
                let created = self.create(&create, body.clone())?;
                let uid = meta_str(&created, "uid").unwrap_or_default().to_string();
                let manager = field_manager.unwrap_or_default().to_string();
                self.applied.insert((uid, manager, String::new()), body);
                return Ok(created);
            }
            None => return Err(t.not_found(&name)),
        };
        if kind != PatchType::Json {
            if let Some(rv) = meta_str(&body, "resourceVersion") {
                if Some(rv) != meta_str(&old, "resourceVersion") {
                    return Err(t.conflict(&name, ApiError::MODIFIED));
                }
            }
        }
        let mut base = old.clone();
        let applied_key = (
            meta_str(&old, "uid").unwrap_or_default().to_string(),
            field_manager.unwrap_or_default().to_string(),
            t.sub.clone().unwrap_or_default(),
        );
        if kind == PatchType::Apply {
            if let Some(before) = self.applied.get(&applied_key) {
                remove_stale(&mut base, before, &body);
            }
            self.applied.insert(applied_key, body.clone());
        }
        let new = patch::apply(kind, &base, &body)
            .map_err(|e| ApiError::invalid(&t.info.kind, &name, &e))?;
        if meta_str(&new, "resourceVersion") != meta_str(&old, "resourceVersion")
            && new["metadata"].get("resourceVersion").is_some()
        {
            return Err(t.conflict(&name, ApiError::MODIFIED));
        }
        self.write(t, old, new)
    }

    /// The common part of PUT and PATCH: `new` replaces `old`, within what the subresource
    /// may change.
    fn write(&mut self, t: &Target, old: Value, mut new: Value) -> Result<Value, ApiError> {
        let name = t.name.clone().unwrap_or_default();
        let info = &t.info;
        match t.sub.as_deref() {
            None => {
                if info.status {
                    match old.get("status") {
                        Some(s) => new["status"] = s.clone(),
                        None => {
                            new.as_object_mut().map(|o| o.remove("status"));
                        }
                    }
                }
            }
            Some("status") if info.status => {
                let status = new.get("status").cloned();
                new = old.clone();
                match status {
                    Some(s) => new["status"] = s,
                    None => {
                        new.as_object_mut().map(|o| o.remove("status"));
                    }
                }
            }
            Some(_) => return Err(ApiError::no_resource()),
        }
        if !new.is_object() || !new["metadata"].is_object() {
            return Err(ApiError::bad_request("the object has no metadata"));
        }
        // What the server owns stays as it was.
        for owned in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            let m = new["metadata"].as_object_mut().expect("checked");
            match old["metadata"].get(owned) {
                Some(v) => {
                    m.insert(owned.into(), v.clone());
                }
                None => {
                    m.remove(owned);
                }
            }
        }
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        new["apiVersion"] = old["apiVersion"].clone();
        new["kind"] = old["kind"].clone();
        if info.group.is_empty() && info.plural == "secrets" {
            secret_string_data(&mut new);
        }
        if old["metadata"].get("deletionTimestamp").is_some() {
            let before: BTreeSet<String> = finalizers(&old).into_iter().collect();
            if finalizers(&new).iter().any(|f| !before.contains(f)) {
                return Err(ApiError::invalid(
                    &info.kind,
                    &name,
                    "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted",
                ));
            }
        }
        if new == old {
            return Ok(old); // a no-op write: no new resourceVersion, no event
        }
        if spec_part(&new, info.status) != spec_part(&old, info.status) {
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
            new["metadata"]["generation"] = json!(generation);
        }
        let key = t.key(&name);
        let written = self.store.put(key.clone(), new);
        if written["metadata"].get("deletionTimestamp").is_some() && finalizers(&written).is_empty()
        {
            return Ok(self.remove(&key).unwrap_or(written));
        }
        Ok(written)
    }

    /// DELETE of one object.
    pub fn delete(&mut self, t: &Target, options: &DeleteOptions) -> Result<Value, ApiError> {
        let name = t.name.clone().unwrap_or_default();
        let old = self.get(t)?;
        if options
            .uid
            .as_deref()
            .is_some_and(|u| Some(u) != meta_str(&old, "uid"))
        {
            return Err(t.conflict(
                &name,
                "Precondition failed: UID in precondition does not match the UID of the object",
            ));
        }
        if options
            .resource_version
            .as_deref()
            .is_some_and(|rv| Some(rv) != meta_str(&old, "resourceVersion"))
        {
            return Err(t.conflict(&name, ApiError::MODIFIED));
        }
        let key = t.key(&name);
        if options.orphan {
            if let Some(uid) = meta_str(&old, "uid") {
                self.orphan(uid);
            }
        }
        Ok(self.delete_key(&key, options.grace).unwrap_or(old))
    }

    /// Deletes the object at `key`: marked (deletionTimestamp) while finalizers remain or
    /// while a running pod's kubelet must stop it; removed otherwise.
    pub fn delete_key(&mut self, key: &Key, grace: Option<i64>) -> Option<Value> {
        let old = self.store.get(key)?.clone();
        let graceful = self.sims.pod_needs_kubelet_stop(key, &old) && grace != Some(0);
        if !finalizers(&old).is_empty() || graceful {
            if old["metadata"].get("deletionTimestamp").is_some() {
                return Some(old);
            }
            let mut marked = old;
            marked["metadata"]["deletionTimestamp"] = json!(now());
            marked["metadata"]["deletionGracePeriodSeconds"] =
                json!(if graceful { grace.unwrap_or(30) } else { 0 });
            return Some(self.store.put(key.clone(), marked));
        }
        self.remove(key)
    }

    /// Removes the object at `key` and collects what depended on it.
    pub fn remove(&mut self, key: &Key) -> Option<Value> {
        let gone = self.store.remove(key)?;
        if meta_str(&gone, "uid").is_some_and(|uid| self.store.has_dependents(uid)) {
            self.collect();
        }
        Some(gone)
    }

    fn orphan(&mut self, owner_uid: &str) {
        let dependents: Vec<(Key, Value)> = self
            .store
            .all()
            .filter(|(_, v)| owner_uids(v).iter().any(|u| u == owner_uid))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (key, mut v) in dependents {
            retain_owners(&mut v, |u| u != owner_uid);
            self.store.put(key, v);
        }
    }

    /// The garbage collector: a dependent all of whose owners are gone is deleted (and
    /// what depended on it, in turn); one with an owner left loses the references to the
    /// gone ones. Dependents go right after their owner, in the same request (background
    /// propagation without its delay; foreground is treated as background).
    pub fn collect(&mut self) {
        loop {
            let (uids, dangling) = {
                let present: BTreeSet<&str> = self
                    .store
                    .all()
                    .filter_map(|(_, v)| meta_str(v, "uid"))
                    .collect();
                let dangling: Vec<(Key, Value)> = self
                    .store
                    .all()
                    .filter(|(_, v)| {
                        v["metadata"]["ownerReferences"]
                            .as_array()
                            .is_some_and(|refs| {
                                refs.iter().any(|r| {
                                    r["uid"].as_str().is_some_and(|u| !present.contains(u))
                                })
                            })
                    })
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if dangling.is_empty() {
                    return;
                }
                let uids: BTreeSet<String> = present.into_iter().map(String::from).collect();
                (uids, dangling)
            };
            let mut changed = false;
            for (key, mut v) in dangling {
                let owners = owner_uids(&v);
                if owners.iter().all(|u| !uids.contains(u)) {
                    if v["metadata"].get("deletionTimestamp").is_none() {
                        changed |= self.delete_key_no_collect(&key);
                    }
                } else {
                    retain_owners(&mut v, |u| uids.contains(u));
                    self.store.put(key, v);
                    changed = true;
                }
            }
            if !changed {
                return;
            }
        }
    }

    fn delete_key_no_collect(&mut self, key: &Key) -> bool {
        let Some(old) = self.store.get(key).cloned() else {
            return false;
        };
        if !finalizers(&old).is_empty() || self.sims.pod_needs_kubelet_stop(key, &old) {
            let mut marked = old;
            marked["metadata"]["deletionTimestamp"] = json!(now());
            marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            self.store.put(key.clone(), marked);
        } else {
            self.store.remove(key);
        }
        true
    }
}

/// Removes from `target` the fields `before` (an earlier apply) had and `now` (this
/// apply) has not; lists count as one field.
fn remove_stale(target: &mut Value, before: &Value, now: &Value) {
    let (Value::Object(b), Value::Object(t)) = (before, target) else {
        return;
    };
    for (k, bv) in b {
        match now.get(k) {
            None => {
                t.remove(k);
            }
            Some(nv) if bv.is_object() && nv.is_object() => {
                if let Some(tv) = t.get_mut(k) {
                    remove_stale(tv, bv, nv);
                }
            }
            Some(_) => {}
        }
    }
}

fn owner_uids(v: &Value) -> Vec<String> {
    v["metadata"]["ownerReferences"]
        .as_array()
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r["uid"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn retain_owners(v: &mut Value, keep: impl Fn(&str) -> bool) {
    if let Some(refs) = v["metadata"]["ownerReferences"].as_array_mut() {
        refs.retain(|r| r["uid"].as_str().is_some_and(&keep));
        if refs.is_empty() {
            v["metadata"]
                .as_object_mut()
                .map(|m| m.remove("ownerReferences"));
        }
    }
}

/// A Secret's `stringData` moved into `data`, base64-encoded, as the API server does.
fn secret_string_data(secret: &mut Value) {
    let Some(string_data) = secret.as_object_mut().and_then(|o| o.remove("stringData")) else {
        return;
    };
    let Value::Object(entries) = string_data else {
        return;
    };
    if !secret["data"].is_object() {
        secret["data"] = Value::Object(Map::new());
    }
    for (k, v) in entries {
        let text = v.as_str().unwrap_or_default();
        secret["data"][k] = json!(b64(text.as_bytes()));
    }
}

impl State {
    /// Writes an object as a controller of the cluster does (no subresource rules): the
    /// object goes when it is being deleted and has no finalizer left.
    pub fn replace(&mut self, key: &Key, new: Value) -> Value {
        if self.store.get(key) == Some(&new) {
            return new;
        }
        let written = self.store.put(key.clone(), new);
        if written["metadata"].get("deletionTimestamp").is_some() && finalizers(&written).is_empty()
        {
            return self.remove(key).unwrap_or(written);
        }
        written
    }

    /// The objects of a resource, cloned (what a controller's pass reads).
    pub fn objects(&self, group: &str, resource: &str) -> Vec<(Key, Value)> {
        self.objects_where(group, resource, |_| true)
    }

    /// Copies of the objects of one resource, in every namespace, that `wanted` picks
    /// (the rest are not copied: a simulated controller's pass looks at every object).
    pub fn objects_where(
        &self,
        group: &str,
        resource: &str,
        wanted: impl Fn(&Value) -> bool,
    ) -> Vec<(Key, Value)> {
        self.store
            .list(group, resource, None)
            .filter(|(_, v)| wanted(v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}
