use serde_json::{json, Value};

use super::*;
use crate::controller::finalizer::FINALIZER;
use crate::mover::MoverDefaults;

fn options(max_movers: usize) -> Options {
    let mut settings = OperatorSettings::new(MoverDefaults {
        image: "ghcr.io/ferry-project/ferry:0.1.0".into(),
        image_pull_policy: None,
        resources: None,
        node_selector: Default::default(),
        tolerations: vec![],
        priority_class_name: None,
        service_account_name: None,
        image_pull_secrets: vec![],
    });
    settings.max_movers = max_movers;
    Options {
        settings,
        tls: true,
    }
}

fn run(yaml: &str, max_movers: usize) -> Rendered {
    let cluster = Cluster::parse(yaml).unwrap();
    render(&cluster, &options(max_movers)).unwrap()
}

/// (kind, name) of every object, in order.
fn listed(rendered: &Rendered) -> Vec<(String, String)> {
    rendered
        .objects()
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap().to_string(),
                o["metadata"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn object(rendered: &Rendered, kind: &str, name: &str) -> Value {
    rendered
        .objects()
        .into_iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {:?}", listed(rendered)))
}

const GOLDEN: &str = "
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: golden, namespace: vms}
spec:
  accessModes: [ReadOnlyMany]
  volumeMode: Block
  resources: {requests: {storage: 10Gi}}
";

/// A Checksum of a claim that a Transfer later in the file creates: the Transfer's plan
/// creates the claim, and the next pass starts the Checksum. Every object the operator
/// writes, in its order; the token Secrets redacted; every pod `restricted`.
#[test]
fn a_claim_one_resource_creates_is_what_another_waits_for() {
    let yaml = format!(
        "{GOLDEN}---
apiVersion: ferry.dev/v1alpha1
kind: Checksum
metadata: {{name: verify, namespace: vms}}
spec:
  source: {{pvc: {{name: fedora}}}}
---
apiVersion: ferry.dev/v1alpha1
kind: Transfer
metadata: {{name: import, namespace: vms, uid: 6d1c2b1e-0000-4000-8000-00000000beef}}
spec:
  source: {{pvc: {{name: golden}}}}
  targets:
    - pvcTemplate: {{name: fedora, size: 20Gi, volumeMode: Block}}
"
    );
    let rendered = run(&yaml, 0);
    let names: Vec<(&str, &str)> = vec![
        ("PersistentVolumeClaim", "fedora"),
        ("Secret", "import-ft-1-token"),
        ("NetworkPolicy", "import-ft-1"),
        ("Pod", "import-ft-1"),
        ("Secret", "verify-fcs-1-token"),
        ("NetworkPolicy", "verify-fcs-1"),
        ("Pod", "verify-fcs-1"),
        ("Checksum", "verify"),
        ("Transfer", "import"),
    ];
    let expected: Vec<(String, String)> = names
        .iter()
        .map(|(k, n)| (k.to_string(), n.to_string()))
        .collect();
    assert_eq!(listed(&rendered), expected);
    let claim = object(&rendered, "PersistentVolumeClaim", "fedora");
    assert_eq!(
        claim["metadata"]["labels"]["ferry.dev/owner-uid"],
        "6d1c2b1e-0000-4000-8000-00000000beef"
    );
    assert!(claim.get("status").is_none(), "{claim}");
    for name in ["import-ft-1-token", "verify-fcs-1-token"] {
        let secret = object(&rendered, "Secret", name);
        let data = secret["stringData"].as_object().unwrap();
        let keys: Vec<&str> = data.keys().map(String::as_str).collect();
        assert_eq!(keys, ["ca.crt", "tls.crt", "tls.key", "token"]);
        assert!(data.values().all(|v| v == REDACTED), "{secret}");
    }
    for name in ["import-ft-1", "verify-fcs-1"] {
        let pod = object(&rendered, "Pod", name);
        let violations = ferry_testkit::pod_security::restricted_violations(&pod);
        assert!(violations.is_empty(), "{name}: {violations:?}");
    }
    let import = object(&rendered, "Transfer", "import");
    assert_eq!(import["metadata"]["finalizers"], json!([FINALIZER]));
    assert_eq!(import["status"]["phase"], "Running");
    assert_eq!(import["status"]["moverPod"], "import-ft-1");
    assert_eq!(
        rendered.summary,
        [
            "Checksum vms/verify: Running: mover pod verify-fcs-1 runs on node (unknown) (render starts no job)",
            "Transfer vms/import: Running: mover pod import-ft-1 runs on node (unknown) (render starts no job)",
        ]
    );
}

/// What waits says why in its status, as the reconciler writes it: a missing claim, a
/// missing Secret key, the operator's mover limit; a template's claim someone else owns
/// and an invalid spec fail.
#[test]
fn what_cannot_start_says_why_in_its_status() {
    let yaml = format!(
        "{GOLDEN}---
apiVersion: v1
kind: Secret
metadata: {{name: s3, namespace: vms}}
data: {{AWS_ACCESS_KEY_ID: eA==}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: taken, namespace: vms}}
spec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}
---
apiVersion: ferry.dev/v1alpha1
kind: Transfer
metadata: {{name: first, namespace: vms}}
spec:
  source: {{pvc: {{name: golden}}}}
  targets: [{{pvcTemplate: {{name: out-1, size: 10Gi}}}}]
---
apiVersion: ferry.dev/v1alpha1
kind: Transfer
metadata: {{name: queued, namespace: vms}}
spec:
  source: {{pvc: {{name: golden}}}}
  targets: [{{pvcTemplate: {{name: out-2, size: 10Gi}}}}]
---
apiVersion: ferry.dev/v1alpha1
kind: Checksum
metadata: {{name: missing-claim, namespace: vms}}
spec:
  source: {{pvc: {{name: nowhere}}}}
---
apiVersion: ferry.dev/v1alpha1
kind: Checksum
metadata: {{name: missing-key, namespace: vms}}
spec:
  source:
    url: s3://bucket/disk.raw
    s3:
      accessKeyId: {{name: s3, key: AWS_ACCESS_KEY_ID}}
      secretAccessKey: {{name: s3, key: AWS_SECRET_ACCESS_KEY}}
---
apiVersion: ferry.dev/v1alpha1
kind: Transfer
metadata: {{name: conflict, namespace: vms}}
spec:
  source: {{pvc: {{name: golden}}}}
  targets: [{{pvcTemplate: {{name: taken, size: 1Gi}}}}]
---
apiVersion: ferry.dev/v1alpha1
kind: Checksum
metadata: {{name: invalid, namespace: vms}}
spec:
  source: {{url: 'iscsi://admin:hunter2@san/iqn.2024-01.dev.ferry:disk/0'}}
"
    );
    let rendered = run(&yaml, 1);
    let summary = rendered.summary.join("\n");
    assert!(!summary.contains("hunter2"), "{summary}");
    let lines: Vec<&str> = rendered.summary.iter().map(String::as_str).collect();
    assert_eq!(lines[0], "Transfer vms/first: Running: mover pod first-ft-1 runs on node (unknown) (render starts no job)");
    assert_eq!(lines[1], "Transfer vms/queued: Pending (Queued): 1 movers run, the operator's limit is 1: waiting for one to finish");
    // The limit is checked first, as the reconciler does: every other resource is
    // Queued too, except one whose spec is invalid.
    assert!(
        lines[2].starts_with("Checksum vms/missing-claim: Pending (Queued)"),
        "{}",
        lines[2]
    );
    assert!(
        lines[3].starts_with("Checksum vms/missing-key: Pending (Queued)"),
        "{}",
        lines[3]
    );
    assert!(
        lines[4].starts_with("Transfer vms/conflict: Pending (Queued)"),
        "{}",
        lines[4]
    );
    assert!(
        lines[5].starts_with("Checksum vms/invalid: Failed (InvalidSpec): spec.source.url: "),
        "{}",
        lines[5]
    );
    let queued = object(&rendered, "Transfer", "queued");
    assert_eq!(queued["status"]["phase"], "Pending");
    assert_eq!(queued["status"]["conditions"][0]["reason"], "Queued");

    // Without the limit, each says its own reason.
    let rendered = run(&yaml, 0);
    let lines: Vec<&str> = rendered.summary.iter().map(String::as_str).collect();
    assert!(
        lines[1].starts_with("Transfer vms/queued: Running"),
        "{}",
        lines[1]
    );
    assert_eq!(lines[2], "Checksum vms/missing-claim: Pending (Pending): pvc/nowhere does not exist in namespace vms: create it, or fix the name in the spec");
    assert_eq!(lines[3], "Checksum vms/missing-key: Pending (Pending): secret/s3 has no key 'AWS_SECRET_ACCESS_KEY': add it, or fix the secretKeyRef's key");
    assert_eq!(lines[4], "Transfer vms/conflict: Failed (Failed): pvc/taken already exists and was not created by this Transfer: choose another pvcTemplate name, or name the claim with pvc to write into it");
    assert!(
        !listed(&rendered)
            .iter()
            .any(|(k, n)| k == "PersistentVolumeClaim" && n == "taken"),
        "a claim in conflict is not created"
    );
}

/// A namespace that assigns user IDs (OpenShift) gets movers without runAsUser and
/// fsGroup, as the reconciler makes them there.
#[test]
fn an_openshift_namespace_gets_movers_without_fixed_ids() {
    let yaml = format!(
        "apiVersion: v1
kind: Namespace
metadata:
  name: vms
  annotations: {{openshift.io/sa.scc.uid-range: 1000680000/10000}}
---
{GOLDEN}---
apiVersion: ferry.dev/v1alpha1
kind: Checksum
metadata: {{name: verify, namespace: vms}}
spec:
  source: {{pvc: {{name: golden}}}}
"
    );
    let rendered = run(&yaml, 0);
    let pod = object(&rendered, "Pod", "verify-fcs-1");
    let security = &pod["spec"]["securityContext"];
    assert!(security.get("runAsUser").is_none(), "{security}");
    assert!(security.get("fsGroup").is_none(), "{security}");
    let without = run(
        &yaml.replace("openshift.io/sa.scc.uid-range", "example.com/other"),
        0,
    );
    let pod = object(&without, "Pod", "verify-fcs-1");
    assert!(pod["spec"]["securityContext"].get("runAsUser").is_some());
}

/// A resource that already has a mover, or has finished, plans nothing; nor does one
/// being deleted.
#[test]
fn resources_with_a_mover_or_an_end_plan_nothing() {
    let yaml = format!(
        "{GOLDEN}---
apiVersion: ferry.dev/v1alpha1
kind: Checksum
metadata: {{name: running, namespace: vms}}
spec: {{source: {{pvc: {{name: golden}}}}}}
status: {{phase: Running, moverPod: running-fcs-1, attempts: 1}}
---
apiVersion: ferry.dev/v1alpha1
kind: Checksum
metadata: {{name: done, namespace: vms}}
spec: {{source: {{pvc: {{name: golden}}}}}}
status: {{phase: Succeeded}}
"
    );
    let rendered = run(&yaml, 0);
    assert_eq!(
        listed(&rendered),
        [
            ("Checksum".to_string(), "running".to_string()),
            ("Checksum".to_string(), "done".to_string())
        ]
    );
    assert_eq!(
        rendered.summary,
        [
            "Checksum vms/running: Running: mover pod running-fcs-1 exists already: nothing new to plan",
            "Checksum vms/done: Succeeded: nothing to plan",
        ]
    );
}

/// A file render cannot read is refused, saying which document and why.
#[test]
fn a_bad_file_says_which_document_is_wrong() {
    let cases = [
        ("a: [", "document 1: not YAML"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}", "document 1: ConfigMap (v1) is not a kind render reads"),
        ("---\nfoo: bar\n", "document 1: no apiVersion and kind"),
        (GOLDEN, ""),
        (
            &format!("{GOLDEN}---{GOLDEN}"),
            "document 2: PersistentVolumeClaim vms/golden is given twice",
        ),
        (
            "apiVersion: ferry.dev/v1alpha1\nkind: Checksum\nmetadata: {name: c}\nspec: {source: {pvc: golden}}",
            "document 1: Checksum c: invalid type",
        ),
    ];
    for (text, expected) in cases {
        match Cluster::parse(text) {
            Ok(_) => assert!(expected.is_empty(), "{text} was read"),
            Err(e) => {
                let e = e.to_string();
                assert!(
                    !expected.is_empty() && e.starts_with(expected),
                    "{text}: {e}"
                );
            }
        }
    }
    let twice = "apiVersion: ferry.dev/v1alpha1\nkind: Checksum\nmetadata: {name: c}\nspec: {source: {url: 'https://x/y'}}\n";
    let cluster = Cluster::parse(&format!("{twice}---\n{twice}")).unwrap();
    let e = render(&cluster, &options(0)).unwrap_err().to_string();
    assert_eq!(e, "Checksum default/c is given twice");
}

/// `kind: List` (what `kubectl get -o yaml` writes) is read item by item.
#[test]
fn a_list_is_read_item_by_item() {
    let list = json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            serde_yaml::from_str::<Value>(GOLDEN).unwrap(),
            {"apiVersion": "ferry.dev/v1alpha1", "kind": "Checksum",
             "metadata": {"name": "c", "namespace": "vms"},
             "spec": {"source": {"pvc": {"name": "golden"}}}}
        ]
    });
    let rendered = run(&list.to_string(), 0);
    assert!(
        rendered.summary[0].starts_with("Checksum vms/c: Running"),
        "{:?}",
        rendered.summary
    );
}

const IMAGE_SOURCE: &str = "
apiVersion: ferry.dev/v1alpha1
kind: VolumeImageSource
metadata: {name: ubuntu, namespace: vms}
spec:
  source: {url: 'nbd://images.example.com:10809/ubuntu'}
";

fn populated_claim(name: &str, class: &str, node: Option<&str>) -> String {
    let annotations = node
        .map(|n| format!("\n  annotations: {{volume.kubernetes.io/selected-node: {n}}}"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}
  namespace: vms{annotations}
spec:
  storageClassName: {class}
  volumeMode: Block
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: 40Gi}}}}
  dataSourceRef: {{apiGroup: ferry.dev, kind: VolumeImageSource, name: ubuntu}}
"
    )
}

/// A claim populated from an image: the prime claim (pinned to the node the scheduler
/// picked, on a WaitForFirstConsumer class), the Transfer filling it, and that Transfer's
/// mover; a claim whose class does not exist, or whose node is not picked yet, waits.
#[test]
fn a_claim_from_an_image_gets_its_prime_claim_transfer_and_mover() {
    let yaml = format!(
        "{IMAGE_SOURCE}---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: local}}
provisioner: rancher.io/local-path
volumeBindingMode: WaitForFirstConsumer
---
{}---
{}---
{}",
        populated_claim("root-a", "local", Some("node-3")),
        populated_claim("root-b", "local", None),
        populated_claim("root-c", "fast-rbd", None),
    );
    let rendered = run(&yaml, 0);
    let objects = rendered.objects();
    let kinds: Vec<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "PersistentVolumeClaim",
            "Secret",
            "NetworkPolicy",
            "Pod",
            "Transfer"
        ]
    );
    let objects = rendered.objects();
    let prime = &objects[0];
    let prime_name = prime["metadata"]["name"].as_str().unwrap();
    assert!(prime_name.starts_with("ferry-prime-"), "{prime_name}");
    assert!(prime["spec"].get("dataSourceRef").is_none(), "{prime}");
    assert_eq!(prime["metadata"]["ownerReferences"][0]["name"], "root-a");
    let transfer = &objects[4];
    assert_eq!(
        transfer["spec"]["targets"][0]["pvc"]["name"].as_str(),
        Some(prime_name)
    );
    assert_eq!(transfer["status"]["phase"], "Running");
    let pod = &objects[3];
    let claims: Vec<&str> = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["persistentVolumeClaim"]["claimName"].as_str())
        .collect();
    assert_eq!(claims, [prime_name]);
    let summary = rendered.summary.join("\n");
    assert!(summary.contains(&format!(
        "PersistentVolumeClaim vms/root-a: populating from VolumeImageSource ubuntu: prime claim pvc/{prime_name} on node node-3 and Transfer vms/"
    )), "{summary}");
    assert!(
        summary
            .contains("PersistentVolumeClaim vms/root-b: waiting for the scheduler to pick a node"),
        "{summary}"
    );
    assert!(summary.contains("PersistentVolumeClaim vms/root-c: waiting (Pending): waiting for StorageClass fast-rbd: it does not exist"), "{summary}");
}

/// A claim from a GoldenImage whose imports are kept as VolumeSnapshots is planned as the
/// populator restores it: the prime claim from the GoldenImage's snapshot, no mover.
#[test]
fn a_claim_from_a_snapshot_kept_golden_image_restores_its_snapshot() {
    let yaml = "
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: rbd}
provisioner: rbd.csi.ceph.com
allowVolumeExpansion: true
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {name: rbd-snap}
driver: rbd.csi.ceph.com
deletionPolicy: Delete
---
apiVersion: ferry.dev/v1alpha1
kind: GoldenImage
metadata: {name: fedora, namespace: vms}
spec:
  source: {url: https://images.example.com/fedora.qcow2}
  trigger: {schedule: '@daily'}
  keepAs: Snapshot
  claim: {size: 10Gi, storageClassName: rbd, volumeMode: Block}
status:
  currentSnapshot: fedora-1a2b
---
apiVersion: ferry.dev/v1alpha1
kind: VolumeImageSource
metadata: {name: base, namespace: vms}
spec:
  source: {goldenImage: {name: fedora}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: vm-1, namespace: vms, uid: 0d1c2b1e-0000-4000-8000-0000000000a2}
spec:
  storageClassName: rbd
  volumeMode: Block
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 10Gi}}
  dataSourceRef: {apiGroup: ferry.dev, kind: VolumeImageSource, name: base}
";
    let uid = "0d1c2b1e-0000-4000-8000-0000000000a2";
    let rendered = run(yaml, 0);
    assert_eq!(
        listed(&rendered),
        [(
            "PersistentVolumeClaim".to_string(),
            format!("ferry-prime-{uid}")
        )]
    );
    let prime = object(
        &rendered,
        "PersistentVolumeClaim",
        &format!("ferry-prime-{uid}"),
    );
    assert_eq!(
        prime["spec"]["dataSource"],
        serde_json::json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
                           "name": "fedora-1a2b"})
    );
    let summary = rendered.summary.join("\n");
    assert!(summary.contains(&format!(
        "PersistentVolumeClaim vms/vm-1: populating from VolumeImageSource base: prime claim pvc/ferry-prime-{uid}, restored from the GoldenImage's VolumeSnapshot fedora-1a2b (no mover)"
    )), "{summary}");

    // A Transfer from it reads its own claim restored from the snapshot.
    let with_transfer = format!(
        "{yaml}---
apiVersion: ferry.dev/v1alpha1
kind: Transfer
metadata: {{name: copy-it, namespace: vms}}
spec:
  source: {{goldenImage: {{name: fedora}}}}
  targets:
    - pvcTemplate: {{name: vm-2, size: 10Gi, storageClassName: rbd, volumeMode: Block}}
"
    );
    let rendered = run(&with_transfer, 0);
    let restored = object(&rendered, "PersistentVolumeClaim", "copy-it-golden");
    assert_eq!(restored["spec"]["dataSource"]["name"], "fedora-1a2b");
    let status = &object(&rendered, "Transfer", "copy-it")["status"];
    assert_eq!(status["sourceClaim"], "copy-it-golden", "{status}");
    assert_ne!(status["phase"], "Pending", "{status}");
}

/// A claim whose image is in a claim is planned as the populator decides it: the prime
/// claim restored from a VolumeSnapshot of the image's claim, no mover; a copy saying why
/// when no snapshot class of its driver exists.
#[test]
fn a_claim_from_an_image_in_a_claim_is_planned_as_a_storage_clone() {
    let base = "
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: rbd}
provisioner: rbd.csi.ceph.com
allowVolumeExpansion: true
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: golden, namespace: vms}
spec:
  storageClassName: rbd
  volumeMode: Block
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 10Gi}}
---
apiVersion: ferry.dev/v1alpha1
kind: VolumeImageSource
metadata: {name: base, namespace: vms}
spec:
  source: {pvc: {name: golden}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: vm-1, namespace: vms, uid: 0d1c2b1e-0000-4000-8000-0000000000a1}
spec:
  storageClassName: rbd
  volumeMode: Block
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 10Gi}}
  dataSourceRef: {apiGroup: ferry.dev, kind: VolumeImageSource, name: base}
";
    let with_class = format!(
        "{base}---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {{name: rbd-snap}}
driver: rbd.csi.ceph.com
deletionPolicy: Delete
"
    );
    let uid = "0d1c2b1e-0000-4000-8000-0000000000a1";
    let rendered = run(&with_class, 0);
    assert_eq!(
        listed(&rendered),
        [
            ("VolumeSnapshot".to_string(), format!("ferry-clone-{uid}")),
            ("PersistentVolumeClaim".into(), format!("ferry-prime-{uid}")),
        ]
    );
    let prime = object(
        &rendered,
        "PersistentVolumeClaim",
        &format!("ferry-prime-{uid}"),
    );
    assert_eq!(
        prime["spec"]["dataSource"],
        serde_json::json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
                           "name": format!("ferry-clone-{uid}")})
    );
    let snapshot = object(&rendered, "VolumeSnapshot", &format!("ferry-clone-{uid}"));
    assert_eq!(snapshot["spec"]["volumeSnapshotClassName"], "rbd-snap");
    let summary = rendered.summary.join("\n");
    assert!(summary.contains(&format!(
        "PersistentVolumeClaim vms/vm-1: populating from VolumeImageSource base: prime claim pvc/ferry-prime-{uid}, restored from VolumeSnapshot ferry-clone-{uid} of pvc/golden (no mover)"
    )), "{summary}");

    let rendered = run(base, 0);
    let kinds: Vec<String> = listed(&rendered).into_iter().map(|(k, _)| k).collect();
    assert!(kinds.contains(&"Pod".to_string()), "{kinds:?}");
    let summary = rendered.summary.join("\n");
    assert!(
        summary.contains(
            "(copy: no storage clone: no VolumeSnapshotClass of driver rbd.csi.ceph.com)"
        ),
        "{summary}"
    );
}

const SCHEDULE: &str = "
apiVersion: ferry.dev/v1alpha1
kind: BackupRepository
metadata: {name: site-a, namespace: vms}
spec: {url: 's3://backups/site-a', initialize: true}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: web1-root, namespace: vms}
spec:
  accessModes: [ReadWriteOnce]
  volumeMode: Block
  resources: {requests: {storage: 10Gi}}
---
apiVersion: ferry.dev/v1alpha1
kind: BackupSchedule
metadata: {name: nightly, namespace: vms}
spec:
  sourcePVC: web1-root
  repository: site-a
  trigger: {schedule: '30 2 * * *'}
  retain: {daily: 7}
  copyMethod: Snapshot
";

/// A new schedule records its next fire; one whose fire is due (its status says so)
/// fires: the VolumeSnapshot, the temporary claim restored from it, the Backup, and the
/// Backup's mover reading that claim.
#[test]
fn a_schedule_waits_for_its_fire_and_a_due_one_fires() {
    let rendered = run(SCHEDULE, 0);
    let schedule = object(&rendered, "BackupSchedule", "nightly");
    assert!(schedule["status"]["nextSyncTime"].is_string(), "{schedule}");
    assert!(
        rendered.summary.iter().any(|l| l.starts_with(
            "BackupSchedule vms/nightly: WaitingForSchedule: the next backup starts at "
        )),
        "{:?}",
        rendered.summary
    );
    let repository = object(&rendered, "BackupRepository", "site-a");
    assert_eq!(repository["status"]["conditions"][0]["reason"], "Valid");

    let due = format!(
        "{SCHEDULE}status: {{nextSyncTime: '2026-01-01T02:30:00Z', observedGeneration: null}}\n"
    );
    let rendered = run(&due, 0);
    let kinds: Vec<(String, String)> = listed(&rendered);
    let backup = "nightly-20260101023000";
    let expected = [
        ("VolumeSnapshot", backup.to_string()),
        ("PersistentVolumeClaim", build_temp(backup)),
        ("Secret", format!("{backup}-fbk-1-token")),
        ("NetworkPolicy", format!("{backup}-fbk-1")),
        ("Pod", format!("{backup}-fbk-1")),
        ("BackupRepository", "site-a".to_string()),
        ("BackupSchedule", "nightly".to_string()),
        ("Backup", backup.to_string()),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(k, n)| (k.to_string(), n.clone()))
        .collect();
    assert_eq!(kinds, expected);
    let schedule = object(&rendered, "BackupSchedule", "nightly");
    assert_eq!(schedule["status"]["lastBackup"], backup);
    let backup_obj = object(&rendered, "Backup", backup);
    assert_eq!(backup_obj["status"]["phase"], "Running");
}

/// Two schedules of one volume group due at once: one VolumeGroupSnapshot for both, each
/// temporary claim restored from the group's snapshot.
#[test]
fn the_schedules_of_a_volume_group_plan_one_group_snapshot() {
    let group = "
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: web1-wal, namespace: vms, labels: {app: web1}}
spec:
  accessModes: [ReadWriteOnce]
  volumeMode: Block
  resources: {requests: {storage: 1Gi}}
---
apiVersion: ferry.dev/v1alpha1
kind: BackupSchedule
metadata: {name: nightly-wal, namespace: vms}
spec:
  sourcePVC: web1-wal
  repository: site-a
  trigger: {schedule: '30 2 * * *'}
  copyMethod: Snapshot
  volumeGroup: {name: web1, selector: {app: web1}}
status: {nextSyncTime: '2026-01-01T02:30:00Z', observedGeneration: null}
";
    let main = SCHEDULE.replace(
        "  copyMethod: Snapshot\n",
        "  copyMethod: Snapshot\n  volumeGroup: {name: web1, selector: {app: web1}}\n",
    );
    let text = format!(
        "{main}status: {{nextSyncTime: '2026-01-01T02:30:00Z', observedGeneration: null}}\n---{group}"
    );
    let rendered = run(&text, 0);
    let kinds = listed(&rendered);
    let groups: Vec<&String> = kinds
        .iter()
        .filter(|(k, _)| k == "VolumeGroupSnapshot")
        .map(|(_, n)| n)
        .collect();
    assert_eq!(groups, ["web1-20260101023000"], "{kinds:?}");
    assert!(
        !kinds.iter().any(|(k, _)| k == "VolumeSnapshot"),
        "{kinds:?}"
    );
    for backup in ["nightly-20260101023000", "nightly-wal-20260101023000"] {
        let claim = object(&rendered, "PersistentVolumeClaim", &build_temp(backup));
        assert_eq!(claim["spec"]["dataSource"]["name"], "web1-20260101023000");
    }
}

fn build_temp(backup: &str) -> String {
    crate::schedule::build::temp_claim_name(backup)
}

/// Every example in deploy/examples renders, with the claims they name given.
#[test]
fn the_examples_render() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples");
    let mut text = String::new();
    let mut files: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for file in files {
        text.push_str("---\n");
        text.push_str(&std::fs::read_to_string(file).unwrap());
    }
    let rendered = run(&text, 0);
    assert!(
        rendered
            .summary
            .iter()
            .any(|l| l.starts_with("Transfer vms/import-fedora: Running")),
        "{:?}",
        rendered.summary
    );
    for object in &rendered.objects() {
        if object["kind"] == "Pod" {
            let violations = ferry_testkit::pod_security::restricted_violations(object);
            assert!(violations.is_empty(), "{violations:?}");
        }
    }
}

/// A Transfer from a claim into new claims is planned as the reconciler decides it: a
/// VolumeSnapshot of the source and each target restored from it when the source's driver
/// has a VolumeSnapshotClass (no mover); a copy saying why when it has none.
#[test]
fn a_clone_is_planned_by_its_strategy() {
    let base = "
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: rbd}
provisioner: rbd.csi.ceph.com
allowVolumeExpansion: true
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: golden, namespace: vms}
spec:
  storageClassName: rbd
  volumeMode: Block
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 10Gi}}
---
apiVersion: ferry.dev/v1alpha1
kind: Transfer
metadata: {name: rollout, namespace: vms, uid: 6d1c2b1e-0000-4000-8000-00000000c10e}
spec:
  source: {pvc: {name: golden}}
  targets:
    - pvcTemplate: {name: vm-1, size: 10Gi, storageClassName: rbd, volumeMode: Block}
    - pvcTemplate: {name: vm-2, size: 10Gi, storageClassName: rbd, volumeMode: Block}
";
    let with_class = format!(
        "{base}---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {{name: rbd-snap}}
driver: rbd.csi.ceph.com
deletionPolicy: Delete
"
    );
    let rendered = run(&with_class, 0);
    assert_eq!(
        listed(&rendered),
        [
            ("VolumeSnapshot".to_string(), "rollout-clone".to_string()),
            ("PersistentVolumeClaim".into(), "vm-1".into()),
            ("PersistentVolumeClaim".into(), "vm-2".into()),
            ("Transfer".into(), "rollout".into()),
        ]
    );
    let snapshot = object(&rendered, "VolumeSnapshot", "rollout-clone");
    assert_eq!(snapshot["spec"]["volumeSnapshotClassName"], "rbd-snap");
    assert_eq!(
        object(&rendered, "PersistentVolumeClaim", "vm-2")["spec"]["dataSource"]["name"],
        "rollout-clone"
    );
    let status = &object(&rendered, "Transfer", "rollout")["status"];
    assert_eq!(status["phase"], "Succeeded");
    assert_eq!(status["cloneStrategy"], "snapshot");
    assert_eq!(
        status["message"],
        "2 claims restored from VolumeSnapshot rollout-clone"
    );

    let rendered = run(base, 0);
    let kinds: Vec<String> = listed(&rendered).into_iter().map(|(k, _)| k).collect();
    assert!(kinds.contains(&"Pod".to_string()), "{kinds:?}");
    let status = &object(&rendered, "Transfer", "rollout")["status"];
    assert_eq!(status["cloneStrategy"], "copy");
    assert_eq!(
        status["cloneFallbackReason"],
        "no VolumeSnapshotClass of driver rbd.csi.ceph.com"
    );
}

/// A file of `nodes` Ready nodes whose EBS driver attaches `limit` volumes each, the
/// default class of that driver, and a Transfer generating `count` claims.
fn rollout_file(nodes: usize, limit: u32, count: u32) -> String {
    let mut out = String::from(
        "apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: ebs
  annotations: {storageclass.kubernetes.io/is-default-class: \"true\"}
provisioner: ebs.csi.aws.com
volumeBindingMode: WaitForFirstConsumer
",
    );
    for i in 0..nodes {
        out.push_str(&format!(
            "---
apiVersion: v1
kind: Node
metadata: {{name: node-{i:03}}}
status: {{conditions: [{{type: Ready, status: \"True\"}}]}}
---
apiVersion: storage.k8s.io/v1
kind: CSINode
metadata: {{name: node-{i:03}}}
spec: {{drivers: [{{name: ebs.csi.aws.com, nodeID: i-{i}, allocatable: {{count: {limit}}}}}]}}
"
        ));
    }
    out.push_str(&format!(
        "---
apiVersion: ferry.dev/v1alpha1
kind: Transfer
metadata: {{name: fleet, namespace: vms}}
spec:
  source: {{url: \"https://images.example.com/golden.qcow2\"}}
  pvcTemplates: {{namePrefix: vm-disk-, count: {count}, size: 20Gi, volumeMode: Block}}
"
    ));
    out
}

#[test]
fn a_rollout_is_planned_as_groups_by_attach_room_each_a_child_with_its_mover() {
    // 600 claims over 40 nodes of 25 slots (one node cordoned): 39 groups of 15 or 16,
    // one per node, each a child Transfer whose mover is pinned to its node.
    let mut file = rollout_file(40, 25, 600);
    file = file.replacen(
        "metadata: {name: node-007}\nstatus:",
        "metadata: {name: node-007}\nspec: {unschedulable: true}\nstatus:",
        1,
    );
    let rendered = run(&file, 0);
    assert_eq!(
        rendered.summary[0],
        "Transfer vms/fleet: Running (copy): 600 targets in 39 mover groups over 39 nodes; the origin is read once, by fleet-g0, and relayed to the other 38 groups by 10 relays (4 readers each)"
    );
    let fleet = object(&rendered, "Transfer", "fleet");
    let groups = fleet["status"]["fanOut"]["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 39);
    assert!(groups.iter().all(|g| g["node"] != "node-007"));
    let sizes: Vec<u64> = groups
        .iter()
        .map(|g| g["targets"][0][1].as_u64().unwrap() - g["targets"][0][0].as_u64().unwrap())
        .collect();
    assert_eq!(sizes.iter().sum::<u64>(), 600);
    assert!(sizes.iter().all(|&s| s == 16 || s == 15), "{sizes:?}");
    let count = |kind: &str| {
        rendered
            .objects()
            .iter()
            .filter(|o| o["kind"] == kind)
            .count()
    };
    assert_eq!(count("PersistentVolumeClaim"), 600);
    assert_eq!(count("Pod"), 39);
    // 39 children created, then the 40 Transfers as patched.
    assert_eq!(count("Transfer"), 39 + 40);
    for (i, group) in groups.iter().enumerate() {
        let name = format!("fleet-g{i}");
        assert_eq!(group["name"], name.as_str());
        let pod = object(&rendered, "Pod", &format!("{name}-ft-1"));
        let pinned = &pod["spec"]["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            ["matchFields"][0]["values"][0];
        assert_eq!(pinned, &group["node"]);
        let first = group["targets"][0][0].as_u64().unwrap();
        let claim = object(
            &rendered,
            "PersistentVolumeClaim",
            &format!("vm-disk-{first}"),
        );
        assert_eq!(
            claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"],
            group["node"]
        );
    }
}

#[test]
fn a_golden_image_source_is_planned_as_its_current_claim() {
    let base = "
apiVersion: ferry.dev/v1alpha1
kind: Transfer
metadata: {name: vm-1, namespace: vms}
spec:
  source: {goldenImage: {name: fedora}}
  targets: [{pvcTemplate: {name: vm-1-disk, size: 10Gi, volumeMode: Block}}]
---
apiVersion: ferry.dev/v1alpha1
kind: GoldenImage
metadata: {name: fedora, namespace: vms}
spec:
  source: {url: \"https://images.example.com/fedora.qcow2\"}
  trigger: {schedule: \"0 */6 * * *\"}
  claim: {size: 10Gi, volumeMode: Block}
";
    let rendered = run(base, 0);
    assert_eq!(
        rendered.summary[0],
        "Transfer vms/vm-1: Pending (Pending): waiting for GoldenImage fedora to hold an image: create it, or wait for its first import"
    );
    assert_eq!(
        listed(&rendered),
        [("Transfer".to_string(), "vm-1".to_string())]
    );
    let imported = format!(
        "{base}status: {{currentClaim: fedora-0a1b2c3d}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: fedora-0a1b2c3d, namespace: vms}}
spec:
  accessModes: [ReadWriteOnce]
  volumeMode: Block
  resources: {{requests: {{storage: 10Gi}}}}
status: {{phase: Bound}}
"
    );
    let rendered = run(&imported, 0);
    let t = object(&rendered, "Transfer", "vm-1");
    assert_eq!(
        t["spec"]["source"],
        json!({"goldenImage": {"name": "fedora"}})
    );
    assert_eq!(t["status"]["sourceClaim"], "fedora-0a1b2c3d");
    let pod = object(&rendered, "Pod", "vm-1-ft-1");
    let claims: Vec<&str> = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["persistentVolumeClaim"]["claimName"].as_str())
        .collect();
    assert!(claims.contains(&"fedora-0a1b2c3d"), "{claims:?}");
    assert!(claims.contains(&"vm-1-disk"), "{claims:?}");
}

#[test]
fn a_claim_populated_from_a_golden_image_reads_its_current_claim() {
    let yaml = format!(
        "apiVersion: ferry.dev/v1alpha1
kind: VolumeImageSource
metadata: {{name: ubuntu, namespace: vms}}
spec:
  source: {{goldenImage: {{name: ubuntu-golden}}}}
---
apiVersion: ferry.dev/v1alpha1
kind: GoldenImage
metadata: {{name: ubuntu-golden, namespace: vms}}
spec:
  source: {{url: \"https://images.example.com/ubuntu.img\"}}
  trigger: {{schedule: \"@daily\"}}
  claim: {{size: 40Gi, volumeMode: Block}}
status: {{currentClaim: ubuntu-golden-1a2b3c4d}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: ubuntu-golden-1a2b3c4d, namespace: vms}}
spec:
  volumeMode: Block
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: 40Gi}}}}
status: {{phase: Bound}}
---
{}",
        populated_claim("root-a", "fast-rbd", None).replace("fast-rbd", "\"\"")
    );
    let rendered = run(&yaml, 0);
    let objects = rendered.objects();
    let transfer = objects
        .iter()
        .rev()
        .find(|o| o["kind"] == "Transfer")
        .unwrap();
    assert_eq!(
        transfer["spec"]["source"],
        json!({"goldenImage": {"name": "ubuntu-golden"}})
    );
    assert_eq!(transfer["status"]["sourceClaim"], "ubuntu-golden-1a2b3c4d");
    let pod = objects.iter().find(|o| o["kind"] == "Pod").unwrap();
    let claims: Vec<&str> = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["persistentVolumeClaim"]["claimName"].as_str())
        .collect();
    assert!(claims.contains(&"ubuntu-golden-1a2b3c4d"), "{claims:?}");
}
