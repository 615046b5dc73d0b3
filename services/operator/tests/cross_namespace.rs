//! Clones from a claim in another namespace, against the stand-in: the Transfer's
//! creator is stamped by the operator's webhook code (the stand-in has no admission, so
//! the test sends the AdmissionReview the API server would and applies the patch), the
//! operator asks a SubjectAccessReview (answered from the Roles and bindings in the
//! stand-in) before anything happens in the source namespace, a child Transfer there
//! fills a temporary claim (here by a copy: the stand-in has no snapshot class), and its
//! volume is handed over to the target claim.

use base64::Engine;
use ferry_operator::admission::review::answer;
use ferry_operator::admission::stamp::{StampKey, REQUESTER};
use ferry_operator::clone::cross::{child_name, CLONE_OF, NOT_AUTHORIZED};
use ferry_operator::clone::handover::RECLAIM_POLICY;
use ferry_operator::controller::mover_ca;
use serde_json::{json, Value};

use super::support::settings;
use super::{assert_no_refusal, cluster, phase_of, start, transfers, until, NS};
use ferry_testkit::kube::Cluster;
use kube::api::{DynamicObject, PostParams};

const SOURCE_NS: &str = "images";

/// The golden claim in `images`, bound (an Immediate class).
fn cluster_with_golden() -> Cluster {
    let c = cluster();
    c.add_namespace(SOURCE_NS, &[], &[]);
    c.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "golden", "namespace": SOURCE_NS},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "ceph-rbd",
                 "resources": {"requests": {"storage": "4Mi"}}}}));
    c
}

/// `user` may clone the claim `golden` of `images` (a Role and a RoleBinding).
fn grant_read(cluster: &Cluster, user: &str) {
    cluster.create(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "golden-reader", "namespace": SOURCE_NS},
        "rules": [{"apiGroups": ["ferry.dev"], "resources": ["transfers/source"],
                   "resourceNames": ["golden"], "verbs": ["create"]}]}),
    );
    cluster.create(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "golden-reader", "namespace": SOURCE_NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "golden-reader"},
        "subjects": [{"kind": "User", "name": user}]}));
}

fn transfer(name: &str) -> Value {
    json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"source": {"pvc": {"name": "golden", "namespace": SOURCE_NS}},
                 "targets": [{"pvcTemplate": {"name": format!("{name}-disk"), "size": "4Mi",
                                              "storageClassName": "ceph-rbd"}}]},
    })
}

/// What the API server does with the operator's webhook on a CREATE by `user`: the
/// AdmissionReview sent, the JSON patch of the answer applied.
fn admitted(object: Value, user: &str, key: &StampKey) -> Value {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "r-1",
            "kind": {"group": "ferry.dev", "version": "v1alpha1", "kind": "Transfer"},
            "resource": {"group": "ferry.dev", "version": "v1alpha1", "resource": "transfers"},
            "name": object["metadata"]["name"], "namespace": NS, "operation": "CREATE",
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
            "object": object, "dryRun": false,
        },
    });
    let out = answer(&serde_json::to_vec(&review).unwrap(), key);
    assert_eq!(out["response"]["allowed"], true, "{out}");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(out["response"]["patch"].as_str().expect("a patch"))
        .unwrap();
    let patch: Value = serde_json::from_slice(&patch).unwrap();
    assert_eq!(patch[0]["op"], "add");
    assert_eq!(patch[0]["path"], "/metadata/annotations");
    let mut object = object;
    object["metadata"]["annotations"] = patch[0]["value"].clone();
    object
}

async fn create(cluster: &Cluster, object: Value) {
    let t: DynamicObject = serde_json::from_value(object).unwrap();
    transfers(cluster)
        .create(&PostParams::default(), &t)
        .await
        .unwrap();
}

/// The stamp key of the operator's CA (made here first, as the binary makes it).
async fn operator_key(cluster: &Cluster) -> StampKey {
    let ca = mover_ca::load_or_create(&cluster.client(), "ferry-system")
        .await
        .unwrap();
    StampKey::from_ca_key(&ca.key_pem())
}

fn events_of(cluster: &Cluster, name: &str) -> Vec<(String, String, String)> {
    cluster
        .list("events.k8s.io", "events")
        .iter()
        .filter(|e| e["regarding"]["name"] == name && e["regarding"]["namespace"] == NS)
        .map(|e| {
            let s = |f: &str| e[f].as_str().unwrap_or_default().to_string();
            (s("type"), s("reason"), s("note"))
        })
        .collect()
}

fn in_source_namespace(cluster: &Cluster, group: &str, resource: &str) -> Vec<String> {
    cluster
        .list(group, resource)
        .iter()
        .filter(|o| o["metadata"]["namespace"] == SOURCE_NS)
        .map(|o| {
            o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

/// Allowed: the child Transfer fills a temporary claim in `images` (a copy, with the
/// fallback reason), its volume is handed over to the target in `vms` (Bound to the same
/// PersistentVolume, its reclaim policy back to Delete), and the child and temporary
/// claim are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_from_another_namespace_the_creator_may_read_is_handed_over() {
    let cluster = cluster_with_golden();
    grant_read(&cluster, "alice");
    let key = operator_key(&cluster).await;
    let _operator = start(&cluster, settings());
    create(&cluster, admitted(transfer("vm"), "alice", &key)).await;
    let t = cluster.get("ferry.dev", "transfers", NS, "vm").unwrap();
    let uid = t["metadata"]["uid"].as_str().unwrap().to_string();
    let child = child_name(&uid);
    until(20, "the child Transfer in the source namespace", || {
        cluster
            .get("ferry.dev", "transfers", SOURCE_NS, &child)
            .is_some()
    })
    .await;
    let made = cluster
        .get("ferry.dev", "transfers", SOURCE_NS, &child)
        .unwrap();
    assert_eq!(made["metadata"]["labels"][CLONE_OF], uid.as_str());
    assert_eq!(made["spec"]["source"], json!({"pvc": {"name": "golden"}}));
    let temporary = format!("xns-{uid}-0");
    assert_eq!(made["spec"]["targets"][0]["pvcTemplate"]["name"], temporary);
    // The temporary claim's volume, before the hand-over.
    until(30, "the temporary claim to bind", || {
        cluster
            .get("", "persistentvolumeclaims", SOURCE_NS, &temporary)
            .is_some_and(|c| c["status"]["phase"] == "Bound")
    })
    .await;
    let volume = cluster
        .get("", "persistentvolumeclaims", SOURCE_NS, &temporary)
        .unwrap()["spec"]["volumeName"]
        .as_str()
        .unwrap()
        .to_string();
    until(60, "the Transfer to succeed", || {
        phase_of(&cluster, "vm").as_deref() == Some("Succeeded")
    })
    .await;

    let t = cluster.get("ferry.dev", "transfers", NS, "vm").unwrap();
    let status = &t["status"];
    assert_eq!(status["cloneStrategy"], "copy", "{status}");
    assert!(
        status["cloneFallbackReason"]
            .as_str()
            .is_some_and(|r| r.contains("no VolumeSnapshotClass")),
        "{status}"
    );
    assert_eq!(status["cloneTransfer"], format!("{SOURCE_NS}/{child}"));
    assert_eq!(status["targets"][0]["name"], "pvc/vm-disk");
    assert_eq!(status["targets"][0]["phase"], "Succeeded");
    let target = cluster
        .get("", "persistentvolumeclaims", NS, "vm-disk")
        .unwrap();
    assert_eq!(target["status"]["phase"], "Bound");
    assert_eq!(target["spec"]["volumeName"], volume.as_str());
    let pv = cluster.get("", "persistentvolumes", "", &volume).unwrap();
    assert_eq!(pv["spec"]["claimRef"]["namespace"], NS);
    assert_eq!(pv["spec"]["claimRef"]["name"], "vm-disk");
    assert_eq!(pv["spec"]["claimRef"]["uid"], target["metadata"]["uid"]);
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Delete");
    assert!(
        pv["metadata"]["annotations"][RECLAIM_POLICY].is_null(),
        "{pv}"
    );
    until(10, "the child and the temporary claim to go", || {
        cluster
            .get("ferry.dev", "transfers", SOURCE_NS, &child)
            .is_none()
            && cluster
                .get("", "persistentvolumeclaims", SOURCE_NS, &temporary)
                .is_none()
    })
    .await;
    // The volume stayed: the temporary claim's deletion did not take it.
    assert!(cluster.get("", "persistentvolumes", "", &volume).is_some());
    let events = events_of(&cluster, "vm");
    assert!(events.iter().any(|e| e.1 == "CloneStarted"), "{events:?}");
    assert_no_refusal(&cluster);
}

/// Not allowed: Failed with CloneNotAuthorized saying who may not read what and how to
/// grant it, a Warning event, and nothing made in the source namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_from_a_claim_the_creator_may_not_read_fails_and_touches_nothing() {
    let cluster = cluster_with_golden();
    grant_read(&cluster, "alice");
    let key = operator_key(&cluster).await;
    let _operator = start(&cluster, settings());
    create(&cluster, admitted(transfer("vm"), "bob", &key)).await;
    until(20, "the Transfer to fail", || {
        phase_of(&cluster, "vm").as_deref() == Some("Failed")
    })
    .await;
    let t = cluster.get("ferry.dev", "transfers", NS, "vm").unwrap();
    let message = t["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message
            .starts_with("user bob may not clone persistentvolumeclaim golden of namespace images"),
        "{message}"
    );
    assert!(
        message.contains("resources: [transfers/source], resourceNames: [golden], verbs: [create]"),
        "{message}"
    );
    let reasons: Vec<&str> = t["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["reason"].as_str())
        .collect();
    assert!(reasons.contains(&NOT_AUTHORIZED), "{reasons:?}");
    until(5, "the Warning event", || {
        events_of(&cluster, "vm")
            .iter()
            .any(|e| e.0 == "Warning" && e.1 == NOT_AUTHORIZED)
    })
    .await;
    assert!(in_source_namespace(&cluster, "ferry.dev", "transfers").is_empty());
    assert_eq!(
        in_source_namespace(&cluster, "", "persistentvolumeclaims"),
        ["golden"]
    );
    assert!(in_source_namespace(&cluster, "", "pods").is_empty());
    assert!(cluster
        .get("", "persistentvolumeclaims", NS, "vm-disk")
        .is_none());
    assert_no_refusal(&cluster);
}

/// A stamp the operator did not sign (another key, an edited user) or none at all (the
/// webhook bypassed) is refused like a denied review, even for a user who may read the
/// claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_or_missing_stamp_is_refused() {
    let cluster = cluster_with_golden();
    grant_read(&cluster, "alice");
    let key = operator_key(&cluster).await;
    let _operator = start(&cluster, settings());
    create(
        &cluster,
        admitted(
            transfer("other-key"),
            "alice",
            &StampKey::from_ca_key("not the CA"),
        ),
    )
    .await;
    let mut edited = admitted(transfer("edited"), "bob", &key);
    let stamp = edited["metadata"]["annotations"][REQUESTER]
        .as_str()
        .unwrap()
        .replace("\"bob\"", "\"alice\"");
    edited["metadata"]["annotations"][REQUESTER] = json!(stamp);
    create(&cluster, edited).await;
    create(&cluster, transfer("unstamped")).await;
    for (name, says) in [
        ("other-key", "not signed by this operator"),
        ("edited", "not signed by this operator"),
        ("unstamped", "has no ferry.dev/requester annotation"),
    ] {
        until(20, "the Transfer to fail", || {
            phase_of(&cluster, name).as_deref() == Some("Failed")
        })
        .await;
        let t = cluster.get("ferry.dev", "transfers", NS, name).unwrap();
        let message = t["status"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{name}: {message}");
        let condition = t["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["reason"] == NOT_AUTHORIZED);
        assert!(condition, "{name}: {t}");
    }
    assert!(in_source_namespace(&cluster, "ferry.dev", "transfers").is_empty());
    assert_no_refusal(&cluster);
}

/// The child's failure is the Transfer's (here a strategy the source's storage cannot
/// do: no VolumeSnapshotClass), with the child's reason in the message; the child goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_fails_fails_the_transfer_with_its_reason() {
    let cluster = cluster_with_golden();
    grant_read(&cluster, "alice");
    let key = operator_key(&cluster).await;
    let _operator = start(&cluster, settings());
    let mut t = transfer("vm");
    t["spec"]["cloneStrategy"] = json!("snapshot");
    create(&cluster, admitted(t, "alice", &key)).await;
    until(20, "the Transfer to fail", || {
        phase_of(&cluster, "vm").as_deref() == Some("Failed")
    })
    .await;
    let t = cluster.get("ferry.dev", "transfers", NS, "vm").unwrap();
    let message = t["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("which fills the claims in the source namespace, failed")
            && message.contains("cloneStrategy snapshot cannot be used: no VolumeSnapshotClass"),
        "{message}"
    );
    until(10, "the child to go", || {
        in_source_namespace(&cluster, "ferry.dev", "transfers").is_empty()
    })
    .await;
    assert!(cluster
        .get("", "persistentvolumeclaims", NS, "vm-disk")
        .is_none());
    assert_no_refusal(&cluster);
}

/// Deleting the Transfer while its child works deletes the child (and with it its
/// temporary claims): owner references cannot cross namespaces, the finalizer does it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_transfer_deletes_its_child_in_the_source_namespace() {
    let cluster = cluster_with_golden();
    grant_read(&cluster, "alice");
    let key = operator_key(&cluster).await;
    // Movers that take a long time: the child is still running when the parent goes.
    let _operator = super::start_with(&cluster, settings(), std::time::Duration::from_secs(600));
    create(&cluster, admitted(transfer("vm"), "alice", &key)).await;
    let uid = cluster.get("ferry.dev", "transfers", NS, "vm").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    until(20, "the child's temporary claim", || {
        cluster
            .get(
                "",
                "persistentvolumeclaims",
                SOURCE_NS,
                &format!("xns-{uid}-0"),
            )
            .is_some()
    })
    .await;
    transfers(&cluster)
        .delete("vm", &Default::default())
        .await
        .unwrap();
    until(
        20,
        "the Transfer, its child and the temporary claim to go",
        || {
            cluster.get("ferry.dev", "transfers", NS, "vm").is_none()
                && in_source_namespace(&cluster, "ferry.dev", "transfers").is_empty()
                && in_source_namespace(&cluster, "", "persistentvolumeclaims") == ["golden"]
        },
    )
    .await;
    assert_no_refusal(&cluster);
}

/// The operator (through its RBAC) puts its CA into the caBundle of the shipped
/// MutatingWebhookConfiguration, and leaves it alone when it is already there.
#[tokio::test]
async fn the_operator_sets_the_webhooks_ca_bundle() {
    use ferry_operator::admission::install::{set_ca_bundle, WEBHOOK_CONFIGURATION};
    let cluster = cluster();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/operator/50-webhook.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let config = serde_yaml::Deserializer::from_str(&text)
        .map(|d| <serde_json::Value as serde::Deserialize>::deserialize(d).unwrap())
        .find(|d| d["kind"] == "MutatingWebhookConfiguration")
        .unwrap();
    assert_eq!(config["metadata"]["name"], WEBHOOK_CONFIGURATION);
    cluster.create(config);
    let client = cluster.client_as(
        &super::support::rbac::rbac_file(),
        super::support::rbac::SERVICE_ACCOUNT,
    );
    let ca = mover_ca::load_or_create(&client, "ferry-system")
        .await
        .unwrap();
    set_ca_bundle(&client, WEBHOOK_CONFIGURATION, ca.cert_pem())
        .await
        .unwrap();
    let stored = cluster
        .get(
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            "",
            WEBHOOK_CONFIGURATION,
        )
        .unwrap();
    let bundle = base64::engine::general_purpose::STANDARD
        .decode(
            stored["webhooks"][0]["clientConfig"]["caBundle"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
    assert_eq!(String::from_utf8(bundle).unwrap(), ca.cert_pem());
    let version = stored["metadata"]["resourceVersion"].clone();
    set_ca_bundle(&client, WEBHOOK_CONFIGURATION, ca.cert_pem())
        .await
        .unwrap();
    let again = cluster
        .get(
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            "",
            WEBHOOK_CONFIGURATION,
        )
        .unwrap();
    assert_eq!(
        again["metadata"]["resourceVersion"], version,
        "no write when it is set"
    );
    assert_no_refusal(&cluster);
}

/// An operator that watches one namespace cannot follow a child in another: the
/// Transfer fails saying so, before anything is made there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_watching_one_namespace_refuses_a_clone_from_another() {
    let cluster = cluster_with_golden();
    grant_read(&cluster, "alice");
    let key = operator_key(&cluster).await;
    let mut one = settings();
    one.watch_namespace = Some(NS.to_string());
    let _operator = start(&cluster, one);
    create(&cluster, admitted(transfer("vm"), "alice", &key)).await;
    until(20, "the Transfer to fail", || {
        phase_of(&cluster, "vm").as_deref() == Some("Failed")
    })
    .await;
    let t = cluster.get("ferry.dev", "transfers", NS, "vm").unwrap();
    let message = t["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("the operator watches only namespace vms"),
        "{message}"
    );
    assert!(in_source_namespace(&cluster, "ferry.dev", "transfers").is_empty());
}

/// The Transfer `name` from `images/golden` into the claims `targets` (each 4Mi of
/// `class`), with `extra` merged into its spec.
fn transfer_into(name: &str, targets: &[&str], class: &str, extra: Value) -> Value {
    let mut t = transfer(name);
    t["spec"]["targets"] = targets
        .iter()
        .map(|n| json!({"pvcTemplate": {"name": n, "size": "4Mi", "storageClassName": class}}))
        .collect();
    if let (Some(spec), Some(extra)) = (t["spec"].as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    t
}

/// Every PersistentVolume: name, reclaim policy, the claim it refers to (`ns/name`).
fn volumes(cluster: &Cluster) -> Vec<(String, String, String)> {
    cluster
        .list("", "persistentvolumes")
        .iter()
        .map(|pv| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&pv["metadata"]["name"]),
                s(&pv["spec"]["persistentVolumeReclaimPolicy"]),
                format!(
                    "{}/{}",
                    s(&pv["spec"]["claimRef"]["namespace"]),
                    s(&pv["spec"]["claimRef"]["name"])
                ),
            )
        })
        .collect()
}

/// Whether a change the stand-in recorded set a volume's policy to Retain for a
/// hand-over (the scenario reached it).
fn some_volume_was_taken(
    changes: &mut tokio::sync::mpsc::UnboundedReceiver<ferry_testkit::kube::Sent>,
) -> bool {
    let mut taken = false;
    while let Ok((_, pv, _)) = changes.try_recv() {
        taken |= pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain";
    }
    taken
}

/// Target `vm-b` is taken by a claim the Transfer did not make: the hand-over fails on it
/// after target `vm-a`'s volume was set to Retain. That volume gets its policy (Delete)
/// and its claim back, so when the child and its temporary claims go it goes too: no
/// volume is left behind with Retain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_part_way_through_the_hand_over_gives_every_volume_back() {
    let cluster = cluster_with_golden();
    grant_read(&cluster, "alice");
    let key = operator_key(&cluster).await;
    let mut foreign = super::claim("vm-b", "ceph-rbd");
    foreign["metadata"]["name"] = json!("vm-b");
    cluster.create(foreign);
    let mut taken = cluster.changes("", "persistentvolumes", "ferry.dev/handed-over-for");
    let _operator = start(&cluster, settings());
    let t = transfer_into("vm", &["vm-a", "vm-b"], "ceph-rbd", json!({}));
    create(&cluster, admitted(t, "alice", &key)).await;
    until(60, "the Transfer to fail", || {
        phase_of(&cluster, "vm").as_deref() == Some("Failed")
    })
    .await;
    let t = cluster.get("ferry.dev", "transfers", NS, "vm").unwrap();
    let message = t["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("pvc/vm-b already exists and was not created by this Transfer"),
        "{message}"
    );
    assert!(
        some_volume_was_taken(&mut taken),
        "vm-a's volume was never set to Retain"
    );
    let kept = |cluster: &Cluster| {
        let mut claims: Vec<String> = volumes(cluster).into_iter().map(|v| v.2).collect();
        claims.sort();
        claims
    };
    until(20, "only the golden's and vm-b's volumes", || {
        kept(&cluster) == [format!("{SOURCE_NS}/golden"), format!("{NS}/vm-b")]
    })
    .await;
    let left = volumes(&cluster);
    assert!(left.iter().all(|v| v.1 == "Delete"), "{left:?}");
    assert!(cluster
        .list("", "persistentvolumes")
        .iter()
        .all(|pv| pv["metadata"]["labels"]["ferry.dev/handed-over-for"].is_null()));
    until(10, "the child and its temporary claims to go", || {
        in_source_namespace(&cluster, "ferry.dev", "transfers").is_empty()
            && in_source_namespace(&cluster, "", "persistentvolumeclaims") == ["golden"]
    })
    .await;
    assert!(cluster
        .get("", "persistentvolumeclaims", NS, "vm-a")
        .is_none());
    assert_no_refusal(&cluster);
}

/// The Transfer deleted while its volumes are being handed over (claims deleted with it:
/// `claimRetention: Delete`): whatever step each was at, every volume gets its policy
/// back and goes with its claim; none is left Released with Retain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_transfer_during_the_hand_over_leaves_no_volume_behind() {
    let cluster = cluster_with_golden();
    grant_read(&cluster, "alice");
    let key = operator_key(&cluster).await;
    let _operator = start(&cluster, settings());
    let t = transfer_into(
        "vm",
        &["vm-a", "vm-b"],
        "ceph-rbd",
        json!({"claimRetention": "Delete"}),
    );
    create(&cluster, admitted(t, "alice", &key)).await;
    until(60, "a volume taken for the hand-over", || {
        cluster.list("", "persistentvolumes").iter().any(|pv| {
            pv["metadata"]["labels"]["ferry.dev/handed-over-for"].is_string()
                && pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
        })
    })
    .await;
    transfers(&cluster)
        .delete("vm", &Default::default())
        .await
        .unwrap();
    until(
        30,
        "the Transfer, its child, claims and volumes to go",
        || {
            cluster.get("ferry.dev", "transfers", NS, "vm").is_none()
                && in_source_namespace(&cluster, "ferry.dev", "transfers").is_empty()
                && in_source_namespace(&cluster, "", "persistentvolumeclaims") == ["golden"]
                && volumes(&cluster).len() == 1
        },
    )
    .await;
    let left = volumes(&cluster);
    assert_eq!(left[0].2, format!("{SOURCE_NS}/golden"), "{left:?}");
    assert_eq!(left[0].1, "Delete");
    assert_no_refusal(&cluster);
}

/// The source's namespace edited after the child exists (here to the Transfer's own:
/// the webhook no longer sees it): the Transfer fails saying the spec cannot change once
/// the clone started, and the child (found by `status.cloneTransfer`, not the new spec)
/// and its temporary claims go; nothing is cloned from the new source. So does a target
/// added later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_or_targets_changed_after_the_child_exists_fail_the_transfer() {
    let cluster = cluster_with_golden();
    grant_read(&cluster, "alice");
    cluster.create(super::claim("golden", "ceph-rbd"));
    let key = operator_key(&cluster).await;
    // Movers that take a long time: the child is still running when the spec changes.
    let _operator = super::start_with(&cluster, settings(), std::time::Duration::from_secs(600));
    for (name, edit) in [
        (
            "moved",
            json!({"spec": {"source": {"pvc": {"name": "golden", "namespace": null}}}}),
        ),
        (
            "grown",
            json!({"spec": {"targets": [
                {"pvcTemplate": {"name": "grown-disk", "size": "4Mi", "storageClassName": "ceph-rbd"}},
                {"pvcTemplate": {"name": "grown-disk-2", "size": "4Mi", "storageClassName": "ceph-rbd"}}]}}),
        ),
    ] {
        create(&cluster, admitted(transfer(name), "alice", &key)).await;
        let uid = cluster.get("ferry.dev", "transfers", NS, name).unwrap()["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_string();
        until(20, "the child, recorded", || {
            cluster
                .get("ferry.dev", "transfers", SOURCE_NS, &child_name(&uid))
                .is_some()
                && cluster.get("ferry.dev", "transfers", NS, name).unwrap()["status"]
                    ["cloneTransfer"]
                    .is_string()
        })
        .await;
        transfers(&cluster)
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&edit),
            )
            .await
            .unwrap();
        until(20, "the Transfer to fail", || {
            phase_of(&cluster, name).as_deref() == Some("Failed")
        })
        .await;
        let t = cluster.get("ferry.dev", "transfers", NS, name).unwrap();
        let message = t["status"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("after the clone started")
                && message.contains("cannot change its source or targets once it started"),
            "{name}: {message}"
        );
        assert!(
            t["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["reason"] == "CloneSpecChanged"),
            "{name}: {t}"
        );
        until(20, "the child and its temporary claims to go", || {
            in_source_namespace(&cluster, "ferry.dev", "transfers").is_empty()
                && in_source_namespace(&cluster, "", "persistentvolumeclaims") == ["golden"]
        })
        .await;
    }
    // Nothing cloned from the edited source in the Transfer's namespace.
    let made: Vec<Value> = cluster
        .list("", "persistentvolumeclaims")
        .into_iter()
        .filter(|c| c["metadata"]["namespace"] == NS && c["metadata"]["name"] != "golden")
        .collect();
    assert!(made.is_empty(), "{made:?}");
    assert!(cluster.list("ferry.dev", "transfers").len() == 2);
    assert_no_refusal(&cluster);
}

/// A target class that binds at its first consumer, whose profile asks for CSI clones:
/// the child's temporary claims would never be provisioned (no pod uses them), so it
/// copies instead, saying why, and the copied volumes are handed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_into_a_class_bound_at_first_use_is_copied_and_handed_over() {
    let cluster = cluster();
    cluster.add_namespace(SOURCE_NS, &[], &[]);
    cluster.add_storage_class("rbd-local", "rbd.csi.ceph.com", true, false);
    cluster.create(
        json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "StorageClassProfile",
        "metadata": {"name": "rbd-local"}, "spec": {"cloneStrategy": "csi-clone"}}),
    );
    // The golden claim, bound on node-a (where a pod once used it).
    cluster.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "golden", "namespace": SOURCE_NS,
                     "annotations": {"volume.kubernetes.io/selected-node": "node-a"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "rbd-local",
                 "resources": {"requests": {"storage": "4Mi"}}}}));
    grant_read(&cluster, "alice");
    let key = operator_key(&cluster).await;
    let _operator = start(&cluster, settings());
    let t = transfer_into("vm", &["vm-disk"], "rbd-local", json!({}));
    create(&cluster, admitted(t, "alice", &key)).await;
    until(60, "the Transfer to succeed", || {
        phase_of(&cluster, "vm").as_deref() == Some("Succeeded")
    })
    .await;
    let t = cluster.get("ferry.dev", "transfers", NS, "vm").unwrap();
    assert_eq!(t["status"]["cloneStrategy"], "copy", "{t}");
    let why = t["status"]["cloneFallbackReason"]
        .as_str()
        .unwrap_or_default();
    assert!(
        why.contains("binds at its first consumer (WaitForFirstConsumer)"),
        "{why}"
    );
    let target = cluster
        .get("", "persistentvolumeclaims", NS, "vm-disk")
        .unwrap();
    assert_eq!(target["status"]["phase"], "Bound");
    assert_no_refusal(&cluster);
}
