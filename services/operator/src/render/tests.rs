use serde_json::{json, Value};

use super::*;
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
        .objects
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap().to_string(),
                o["metadata"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn object<'a>(rendered: &'a Rendered, kind: &str, name: &str) -> &'a Value {
    rendered
        .objects
        .iter()
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
        let violations = ferry_testkit::pod_security::restricted_violations(pod);
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
