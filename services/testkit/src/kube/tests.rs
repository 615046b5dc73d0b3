//! The stand-in against kube's own client: what the operator relies on behaves as the API
//! server does (the scenario tests of the operator run its controllers on top).

use std::time::Duration;

use ::kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use ::kube::core::PartialObjectMeta;
use ::kube::runtime::{watcher, WatchStreamExt};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use serde_json::{json, Value};

use super::{Cluster, Sim};

fn cm(name: &str, labels: Value) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"a": "1"}}),
    )
    .unwrap()
}

fn api_error(e: ::kube::Error) -> ::kube::core::Status {
    match e {
        ::kube::Error::Api(e) => *e,
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn objects_get_metadata_and_writes_check_their_resource_version() {
    let cluster = Cluster::new();
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let made = api
        .create(&PostParams::default(), &cm("one", json!({})))
        .await
        .unwrap();
    let meta = &made.metadata;
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, Some(1));
    let rv: u64 = meta.resource_version.as_deref().unwrap().parse().unwrap();
    let again = api
        .create(&PostParams::default(), &cm("one", json!({})))
        .await
        .unwrap_err();
    let again = api_error(again);
    assert_eq!((again.code, again.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(again.message, "configmaps \"one\" already exists");

    let mut changed = made.clone();
    changed.data = Some([("a".to_string(), "2".to_string())].into());
    let written = api
        .replace("one", &PostParams::default(), &changed)
        .await
        .unwrap();
    let rv2: u64 = written
        .metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv2 > rv);
    assert_eq!(
        written.metadata.generation,
        Some(2),
        "a change beyond metadata bumps the generation"
    );
    // The same write again is based on a stale resourceVersion.
    let stale = api_error(
        api.replace("one", &PostParams::default(), &changed)
            .await
            .unwrap_err(),
    );
    assert_eq!((stale.code, stale.reason.as_str()), (409, "Conflict"));
    // A write that changes nothing writes nothing.
    let same = api
        .replace("one", &PostParams::default(), &written)
        .await
        .unwrap();
    assert_eq!(
        same.metadata.resource_version,
        written.metadata.resource_version
    );

    let mut generated = cm("", json!({}));
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("gen-".into());
    let g = api
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    assert!(g.metadata.name.as_deref().unwrap().starts_with("gen-"));
    assert_eq!(g.metadata.name.as_deref().unwrap().len(), 9);

    let missing = api_error(api.get("nope").await.unwrap_err());
    assert_eq!(
        (missing.code, missing.message.as_str()),
        (404, "configmaps \"nope\" not found")
    );
    let elsewhere: Api<ConfigMap> = Api::namespaced(cluster.client(), "no-such-namespace");
    let refused = api_error(
        elsewhere
            .create(&PostParams::default(), &cm("x", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (refused.code, refused.message.as_str()),
        (404, "namespaces \"no-such-namespace\" not found")
    );
}

#[tokio::test]
async fn lists_select_by_labels_and_fields_across_namespaces_and_pages() {
    let cluster = Cluster::new();
    cluster.add_namespace("vms", &[], &[]);
    for (ns, name, app) in [
        ("default", "a", "mover"),
        ("vms", "b", "mover"),
        ("vms", "c", "web"),
    ] {
        let api: Api<ConfigMap> = Api::namespaced(cluster.client(), ns);
        api.create(&PostParams::default(), &cm(name, json!({"app": app})))
            .await
            .unwrap();
    }
    let all: Api<ConfigMap> = Api::all(cluster.client());
    let names = |l: ::kube::core::ObjectList<ConfigMap>| {
        l.items
            .into_iter()
            .map(|c| c.metadata.name.unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            all.list(&ListParams::default().labels("app=mover"))
                .await
                .unwrap()
        ),
        ["a", "b"]
    );
    assert_eq!(
        names(
            all.list(&ListParams::default().labels("app in (web)"))
                .await
                .unwrap()
        ),
        ["c"]
    );
    assert_eq!(
        names(
            all.list(&ListParams::default().fields("metadata.namespace=vms,metadata.name!=b"))
                .await
                .unwrap()
        ),
        ["c"]
    );
    let vms: Api<ConfigMap> = Api::namespaced(cluster.client(), "vms");
    assert_eq!(
        names(vms.list(&ListParams::default()).await.unwrap()),
        ["b", "c"]
    );
    let bad = api_error(
        all.list(&ListParams::default().fields("data.a=1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (bad.code, bad.message.as_str()),
        (400, "field label not supported: data.a")
    );
    let first = all.list(&ListParams::default().limit(2)).await.unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    assert_eq!(names(first), ["a", "b"]);
    let rest = all
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert!(rest.metadata.continue_.is_none());
    assert_eq!(names(rest), ["c"]);
}

#[tokio::test]
async fn patches_merge_json_and_apply_and_the_status_subresource_is_apart() {
    let cluster = Cluster::new();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client(), "default");
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "disk"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound"}}))
    .unwrap();
    let made = api.create(&PostParams::default(), &pvc).await.unwrap();
    assert_eq!(
        made.status.unwrap().phase.as_deref(),
        Some("Pending"),
        "a create sets no status"
    );

    let pp = PatchParams::default();
    let merged = api
        .patch(
            "disk",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}, "status": {"phase": "Lost"}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.metadata.labels.unwrap()["a"], "b");
    assert_eq!(
        merged.status.unwrap().phase.as_deref(),
        Some("Pending"),
        "the object's write keeps its status"
    );
    assert_eq!(
        merged.metadata.generation,
        Some(1),
        "metadata is no spec change"
    );

    let status = api
        .patch_status(
            "disk",
            &pp,
            &Patch::Merge(json!({"status": {"phase": "Bound"}, "spec": {"volumeName": "x"}})),
        )
        .await
        .unwrap();
    assert_eq!(status.status.unwrap().phase.as_deref(), Some("Bound"));
    assert!(
        status.spec.unwrap().volume_name.is_none(),
        "the status write keeps the spec"
    );

    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/labels/a", "value": "b"},
        {"op": "replace", "path": "/metadata/labels/a", "value": "c"}]))
    .unwrap();
    let patched = api
        .patch("disk", &pp, &Patch::Json::<()>(ops))
        .await
        .unwrap();
    assert_eq!(patched.metadata.labels.unwrap()["a"], "c");

    let stale = json!({"metadata": {"resourceVersion": "1", "labels": {"a": "d"}}});
    let conflict = api_error(
        api.patch("disk", &pp, &Patch::Merge(stale))
            .await
            .unwrap_err(),
    );
    assert_eq!(conflict.code, 409);

    let apply = PatchParams::apply("tester").force();
    let applied = api
        .patch(
            "fresh",
            &apply,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "fresh"}, "spec": {"accessModes": ["ReadWriteMany"]}})),
        )
        .await
        .unwrap();
    assert_eq!(
        applied.metadata.generation,
        Some(1),
        "an apply of a missing object creates it"
    );
    let applied = api
        .patch(
            "fresh",
            &apply,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "fresh"}, "spec": {"volumeMode": "Block"}})),
        )
        .await
        .unwrap();
    let spec = applied.spec.unwrap();
    assert_eq!(
        (spec.volume_mode.as_deref(), applied.metadata.generation),
        (Some("Block"), Some(2))
    );
    assert!(
        spec.access_modes.is_none(),
        "a field the manager stopped applying is removed"
    );
    let no_manager = api_error(
        api.patch(
            "fresh",
            &PatchParams::default(),
            &Patch::Apply(json!({"metadata": {"name": "fresh"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(no_manager.code, 422);
}

#[tokio::test]
async fn finalizers_hold_a_deletion_and_owners_take_their_dependents() {
    let cluster = Cluster::new();
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let mut owner = cm("owner", json!({}));
    owner.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    let owner = api.create(&PostParams::default(), &owner).await.unwrap();
    let reference = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                            "uid": owner.metadata.uid, "controller": true}]);
    for name in ["dep", "orphan-to-be"] {
        let mut d = cm(name, json!({}));
        d.metadata.owner_references = Some(serde_json::from_value(reference.clone()).unwrap());
        api.create(&PostParams::default(), &d).await.unwrap();
    }
    api.delete("owner", &DeleteParams::default()).await.unwrap();
    let held = api.get("owner").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(
        api.get("dep").await.is_ok(),
        "dependents stay while the owner is there"
    );
    let adding = api
        .patch(
            "owner",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold", "x/y"]}})),
        )
        .await
        .unwrap_err();
    assert_eq!(
        api_error(adding).code,
        422,
        "no new finalizer on an object being deleted"
    );
    // Orphan one dependent first (as a delete with propagationPolicy Orphan would).
    let mut keep = api.get("orphan-to-be").await.unwrap();
    keep.metadata.owner_references = None;
    api.replace("orphan-to-be", &PostParams::default(), &keep)
        .await
        .unwrap();
    api.patch(
        "owner",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_error(api.get("owner").await.unwrap_err()).code, 404);
    assert_eq!(
        api_error(api.get("dep").await.unwrap_err()).code,
        404,
        "collected with its owner"
    );
    assert!(api.get("orphan-to-be").await.is_ok());
    let precondition = DeleteParams {
        preconditions: Some(::kube::api::Preconditions {
            uid: Some("other".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(
        api_error(api.delete("orphan-to-be", &precondition).await.unwrap_err()).code,
        409
    );
}

#[tokio::test]
async fn watches_stream_changes_resume_from_a_version_and_expire() {
    let cluster = Cluster::new();
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    api.create(&PostParams::default(), &cm("a", json!({"app": "x"})))
        .await
        .unwrap();
    let rv = cluster.resource_version().to_string();
    let mut stream = api
        .watch(&WatchParams::default().labels("app=x"), &rv)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &cm("b", json!({"app": "x"})))
        .await
        .unwrap();
    api.create(&PostParams::default(), &cm("other", json!({"app": "y"})))
        .await
        .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "y"}}})),
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Added(c) => seen.push(format!("ADDED {}", c.metadata.name.unwrap())),
            WatchEvent::Modified(c) => seen.push(format!("MODIFIED {}", c.metadata.name.unwrap())),
            WatchEvent::Deleted(c) => seen.push(format!("DELETED {}", c.metadata.name.unwrap())),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(
        seen,
        ["ADDED b", "DELETED a"],
        "a label change out of the selector is a deletion to the watch"
    );

    cluster.compact();
    let mut expired = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match expired.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("{other:?}"),
    }

    // kube's watcher (list, then watch with bookmarks) and its metadata-only form.
    let cms: Vec<String> = watcher(api.clone(), watcher::Config::default().labels("app=y"))
        .applied_objects()
        .take(2)
        .map(|c| c.unwrap().metadata.name.unwrap())
        .collect()
        .await;
    assert_eq!(cms, ["a", "other"]);
    let pods: Api<Pod> = Api::all(cluster.client());
    let metas = Api::<PartialObjectMeta<ConfigMap>>::all(cluster.client());
    let list = metas.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 3);
    let first: PartialObjectMeta<ConfigMap> = watcher(metas.clone(), watcher::Config::default())
        .applied_objects()
        .boxed()
        .try_next()
        .await
        .unwrap()
        .unwrap();
    assert!(first.metadata.name.is_some());
    assert!(pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
}

#[tokio::test]
async fn a_service_account_gets_the_api_servers_403_outside_its_roles() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rbac.yaml");
    std::fs::write(
        &file,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: r}\nrules:\n  - apiGroups: [\"\"]\n    resources: [configmaps]\n    verbs: [get, list]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: r}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: r}\nsubjects: [{kind: ServiceAccount, name: op, namespace: sys}]\n",
    )
    .unwrap();
    let cluster = Cluster::new();
    let api: Api<ConfigMap> = Api::namespaced(cluster.client_as(&file, ("sys", "op")), "default");
    assert!(api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
    let refused = api_error(
        api.create(&PostParams::default(), &cm("x", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!((refused.code, refused.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        refused.message,
        "configmaps is forbidden: User \"system:serviceaccount:sys:op\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"default\""
    );
    assert_eq!(cluster.denied(), [refused.message]);
    assert_eq!(
        cluster
            .requests()
            .iter()
            .map(|r| r.code)
            .collect::<Vec<_>>(),
        [200, 403]
    );
}

fn pod(name: &str, claims: &[&str], extra: Value) -> Value {
    let volumes: Vec<Value> = claims
        .iter()
        .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
        .collect();
    let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], "volumes": volumes}});
    super::patch::merge(&mut p, &extra);
    p
}

fn claim(name: &str, class: &str, mode: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": "default"},
           "spec": {"accessModes": [mode], "storageClassName": class, "resources": {"requests": {"storage": "1Gi"}}}})
}

fn phase(cluster: &Cluster, resource: &str, name: &str) -> String {
    let o = cluster.get("", resource, "default", name).unwrap();
    o["status"]["phase"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn claims_bind_immediately_or_on_the_first_consumers_node() {
    let cluster = Cluster::new();
    cluster.simulate(&Sim::ALL);
    cluster.add_node("n1", &[]);
    cluster.add_node("n2", &[]);
    cluster.add_storage_class("fast", "fast.csi", false, true);
    cluster.add_storage_class("local", "local.csi", true, false);
    cluster.create(claim("now", "fast", "ReadWriteOnce"));
    cluster.create(claim("later", "local", "ReadWriteOnce"));
    cluster.settle();
    assert_eq!(phase(&cluster, "persistentvolumeclaims", "now"), "Bound");
    let later = cluster
        .get("", "persistentvolumeclaims", "default", "later")
        .unwrap();
    assert_eq!(later["status"]["phase"], "Pending");
    let events = cluster.events_of("", "persistentvolumeclaims", "default", "later");
    assert_eq!(events[0].1, "WaitForFirstConsumer");
    cluster.create(pod(
        "user",
        &["later"],
        json!({"spec": {"nodeName": null, "nodeSelector": {"kubernetes.io/hostname": "n2"}}}),
    ));
    cluster.settle();
    let later = cluster
        .get("", "persistentvolumeclaims", "default", "later")
        .unwrap();
    assert_eq!(
        later["metadata"]["annotations"]["volume.kubernetes.io/selected-node"],
        "n2"
    );
    assert_eq!(later["status"]["phase"], "Bound");
    let pv = cluster
        .get(
            "",
            "persistentvolumes",
            "",
            later["spec"]["volumeName"].as_str().unwrap(),
        )
        .unwrap();
    assert_eq!(
        pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
            ["values"],
        json!(["n2"])
    );
    let user = cluster.get("", "pods", "default", "user").unwrap();
    assert_eq!(
        (
            user["spec"]["nodeName"].as_str(),
            user["status"]["phase"].as_str()
        ),
        (Some("n2"), Some("Running"))
    );
    assert!(user["status"]["podIP"].is_string());
    // The claim's volume is tied to n2 now: a second pod using it must go there too.
    cluster.create(pod("second", &["later"], json!({})));
    cluster.settle();
    assert_eq!(
        cluster.get("", "pods", "default", "second").unwrap()["spec"]["nodeName"],
        "n2"
    );
    // Deleting the claim waits for its users (pvc-protection); its volume goes with it.
    assert!(cluster.delete("", "persistentvolumeclaims", "default", "later"));
    cluster.settle();
    assert!(cluster
        .get("", "persistentvolumeclaims", "default", "later")
        .is_some());
    cluster.delete("", "pods", "default", "user");
    cluster.delete("", "pods", "default", "second");
    cluster.settle();
    assert!(cluster.get("", "pods", "default", "user").is_none());
    assert!(cluster
        .get("", "persistentvolumeclaims", "default", "later")
        .is_none());
    assert!(cluster
        .get(
            "",
            "persistentvolumes",
            "",
            pv["metadata"]["name"].as_str().unwrap()
        )
        .is_none());
}

#[tokio::test]
async fn the_scheduler_honours_affinity_and_attach_limits_and_says_why_not() {
    let cluster = Cluster::new();
    cluster.simulate(&Sim::ALL);
    cluster.add_node("n1", &[("zone", "a")]);
    cluster.add_node("n2", &[("zone", "b")]);
    cluster.add_storage_class("fast", "fast.csi", false, true);
    let pinned = json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}}}}});
    cluster.create(pod("pinned", &[], pinned));
    let zone = json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["b"]}]}]}}}}});
    cluster.create(pod("zoned", &[], zone));
    let nowhere = json!({"spec": {"nodeSelector": {"zone": "c"}}});
    cluster.create(pod("nowhere", &[], nowhere));
    cluster.settle();
    let node =
        |name: &str| cluster.get("", "pods", "default", name).unwrap()["spec"]["nodeName"].clone();
    assert_eq!(
        (node("pinned"), node("zoned"), node("nowhere")),
        (json!("n2"), json!("n1"), Value::Null)
    );
    let events = cluster.events_of("", "pods", "default", "nowhere");
    assert_eq!(events.len(), 1);
    assert_eq!(
        (events[0].0.as_str(), events[0].1.as_str()),
        ("Warning", "FailedScheduling")
    );
    assert!(
        events[0].2.starts_with(
            "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."
        ),
        "{}",
        events[0].2
    );

    // n1 attaches one volume of fast.csi at most.
    cluster.put(
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": "n1"},
        "spec": {"drivers": [{"name": "fast.csi", "nodeID": "n1", "allocatable": {"count": 1}}]}}),
    );
    cluster.put(
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": "n2"},
        "spec": {"drivers": [{"name": "fast.csi", "nodeID": "n2", "allocatable": {"count": 0}}]}}),
    );
    for c in ["v1", "v2"] {
        cluster.create(claim(c, "fast", "ReadWriteOnce"));
    }
    cluster.settle();
    cluster.create(pod("first", &["v1"], json!({})));
    cluster.settle();
    assert_eq!(node("first"), json!("n1"));
    cluster.create(pod("full", &["v2"], json!({})));
    cluster.settle();
    assert_eq!(node("full"), Value::Null);
    let why = &cluster.events_of("", "pods", "default", "full")[0].2;
    assert!(why.contains("2 node(s) exceed max volume count"), "{why}");
}

#[tokio::test]
async fn a_single_node_claim_in_use_elsewhere_waits_on_multi_attach_and_pods_end_on_command() {
    let cluster = Cluster::new();
    cluster.simulate(&Sim::ALL);
    cluster.add_node("n1", &[]);
    cluster.add_node("n2", &[]);
    cluster.add_storage_class("fast", "fast.csi", false, true);
    cluster.create(claim("disk", "fast", "ReadWriteOnce"));
    cluster.create(pod("vm", &["disk"], json!({"spec": {"nodeName": "n1"}})));
    cluster.settle();
    assert_eq!(phase(&cluster, "pods", "vm"), "Running");
    cluster.create(pod(
        "reader",
        &["disk"],
        json!({"spec": {"nodeName": "n2"}}),
    ));
    cluster.settle();
    assert_eq!(phase(&cluster, "pods", "reader"), "Pending");
    let events = cluster.events_of("", "pods", "default", "reader");
    let attach = events.iter().find(|e| e.1 == "FailedAttachVolume").unwrap();
    assert!(
        attach.2.starts_with("Multi-Attach error for volume \"pvc-"),
        "{}",
        attach.2
    );
    assert!(
        attach.2.ends_with("Volume is already used by pod(s) vm"),
        "{}",
        attach.2
    );
    // The VM ends: its volume detaches and the reader starts.
    assert!(cluster.exit_pod("default", "vm", 0));
    cluster.settle();
    assert_eq!(phase(&cluster, "pods", "vm"), "Succeeded");
    assert_eq!(phase(&cluster, "pods", "reader"), "Running");
    assert!(cluster.exit_pod_with("default", "reader", 137, Some("OOMKilled"), None));
    let reader = cluster.get("", "pods", "default", "reader").unwrap();
    assert_eq!(reader["status"]["phase"], "Failed");
    assert_eq!(
        reader["status"]["containerStatuses"][0]["state"]["terminated"]["reason"],
        "OOMKilled"
    );
}

#[tokio::test]
async fn a_lagging_watch_delivers_late_and_a_slow_kubelet_starts_pods_late() {
    let cluster = Cluster::new();
    cluster.simulate(&Sim::ALL);
    cluster.add_node("n1", &[]);
    cluster.lag_watches("", "configmaps", "slow=yes", Duration::from_millis(300));
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let rv = cluster.resource_version().to_string();
    let mut slow = api
        .watch(&WatchParams::default().labels("slow=yes"), &rv)
        .await
        .unwrap()
        .boxed();
    let begun = std::time::Instant::now();
    api.create(&PostParams::default(), &cm("late", json!({"slow": "yes"})))
        .await
        .unwrap();
    match slow.try_next().await.unwrap().unwrap() {
        WatchEvent::Added(c) => assert_eq!(c.metadata.name.as_deref(), Some("late")),
        other => panic!("{other:?}"),
    }
    assert!(
        begun.elapsed() >= Duration::from_millis(300),
        "{:?}",
        begun.elapsed()
    );

    cluster.pod_start_delay(Duration::from_millis(400));
    cluster.create(pod("slow", &[], json!({"spec": {"nodeName": "n1"}})));
    cluster.settle();
    assert_eq!(phase(&cluster, "pods", "slow"), "Pending");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(phase(&cluster, "pods", "slow"), "Running");
}

#[tokio::test]
async fn over_a_socket_a_client_in_another_process_gets_the_same_api() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rbac.yaml");
    std::fs::write(
        &file,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: r}\nrules:\n  - apiGroups: [\"\"]\n    resources: [configmaps]\n    verbs: [get, list, watch, create]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: r}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: r}\nsubjects: [{kind: ServiceAccount, name: op, namespace: sys}]\n",
    )
    .unwrap();
    let cluster = Cluster::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = cluster.serve(
        listener,
        super::Identity::Account(super::rbac::Rules::load(&file, ("sys", "op"))),
    );
    let client = ::kube::Client::try_from(::kube::Config::new(url.parse().unwrap())).unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let rv = cluster.resource_version().to_string();
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let made = api
        .create(&PostParams::default(), &cm("one", json!({})))
        .await
        .unwrap();
    assert_eq!(made.data.unwrap()["a"], "1");
    let event = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        matches!(&event, WatchEvent::Added(c) if c.metadata.name.as_deref() == Some("one")),
        "{event:?}"
    );
    // The identity is the ServiceAccount's: RBAC holds over the socket too.
    let refused = api_error(
        api.delete("one", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!((refused.code, refused.reason.as_str()), (403, "Forbidden"));
    assert!(cluster
        .requests()
        .iter()
        .all(|r| r.user == "system:serviceaccount:sys:op"));
    server.abort();
}
