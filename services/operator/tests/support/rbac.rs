//! The operator's RBAC (deploy/operator/10-rbac.yaml) checked against what the operator
//! really asks the API server: every request a scenario's mocked API server answers is
//! mapped to the verb, API group, resource and subresource the API server's authorizer
//! would check, and must be allowed by a rule bound to the operator's ServiceAccount.
//! Run over all the scenarios of a test binary, the other way round too: a rule no
//! scenario uses is more privilege than the operator needs (unless exempted with a reason).
//! How a request maps to an access and how rules are read and matched is the test kit's
//! (`ferry_testkit::kube::rbac`), the same code the stateful API stand-in enforces.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub use ferry_testkit::kube::rbac::{access, Access, Rule, Rules};

/// The ServiceAccount the operator runs as (deploy/operator/10-rbac.yaml).
pub const SERVICE_ACCOUNT: (&str, &str) = ("ferry-system", "ferry-operator");

/// Where a scenario binary writes the accesses of each scenario when this is set (the
/// least-privilege test runs the scenarios in a child process with it).
pub const RECORD_ENV: &str = "FERRY_RBAC_RECORD_DIR";

/// The repository's deploy/operator directory.
pub fn rbac_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/operator/10-rbac.yaml")
}

/// The rules of every ClusterRole and Role in the file that a binding grants to the
/// operator's ServiceAccount (read as the stand-in's authorizer reads them).
pub fn operator_rules(file: &Path) -> Vec<Rule> {
    Rules::load(file, SERVICE_ACCOUNT).rules
}

/// The accesses no rule allows, each named as the rule it would need.
pub fn denied(rules: &[Rule], accesses: &[Access]) -> Vec<String> {
    let rules = Rules {
        user: String::new(),
        rules: rules.to_vec(),
    };
    rules.denied(&rbac_file(), accesses)
}

/// Panics naming each request of a scenario the operator's roles do not allow.
pub fn assert_allowed(requests: &[(String, String, String)]) {
    let rules = operator_rules(&rbac_file());
    let accesses: Vec<Access> = requests
        .iter()
        .map(|(m, p, q)| access(m, p, q).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let missing = denied(&rules, &accesses);
    assert!(
        missing.is_empty(),
        "the operator made requests its RBAC does not allow:\n{}",
        missing.join("\n")
    );
    if let Some(dir) = std::env::var_os(RECORD_ENV) {
        record(Path::new(&dir), &accesses);
    }
}

/// One line per access: `verb group resource`, the form the least-privilege test reads.
fn record(dir: &Path, accesses: &[Access]) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let lines: String = accesses
        .iter()
        .map(|a| format!("{} {} {}\n", a.verb, a.group, a.resource))
        .collect();
    let file = dir.join(format!("{}-{n}.txt", std::process::id()));
    std::fs::write(&file, lines).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
}

/// Grants no scenario of this binary exercises, with the reason each is still needed.
/// Each names the test that covers it elsewhere, or why no mocked scenario can.
pub const UNUSED_WITH_REASON: &[(&str, &str, &str, &str)] = &[
    (
        "create",
        "",
        "pods/exec",
        "a hook's exec is a websocket GET, authorized as get (the scenarios check that); \
        since Kubernetes 1.35 (AuthorizePodWebsocketUpgradeCreatePermission) the API server \
        also requires create on pods/exec, which no mocked request can show",
    ),
    ("watch", "ferry.dev", "transfers", WATCHES),
    ("list", "ferry.dev", "goldenimages", WATCHES),
    ("watch", "ferry.dev", "goldenimages", WATCHES),
    ("list", "ferry.dev", "checksums", WATCHES),
    ("watch", "ferry.dev", "checksums", WATCHES),
    ("watch", "", "pods", WATCHES),
    ("list", "", "namespaces", WATCHES),
    ("watch", "storage.k8s.io", "storageclasses", WATCHES),
    ("watch", "ferry.dev", "storageclassprofiles", WATCHES),
    ("watch", "", "namespaces", WATCHES),
    (
        "patch",
        "ferry.dev",
        "checksums",
        "the finalizer of a Checksum (controller/finalizer.rs, the same code as a \
        Transfer's): the checksum scenario starts with it in place and ends before a deletion",
    ),
    ("watch", "ferry.dev", "volumeimagesources", WATCHES),
    ("watch", "", "persistentvolumeclaims", WATCHES),
    ("list", "ferry.dev", "backuprepositories", WATCHES),
    ("watch", "ferry.dev", "backuprepositories", WATCHES),
    ("watch", "ferry.dev", "ferrybackups", WATCHES),
    (
        "patch",
        "ferry.dev",
        "ferrybackups",
        "the finalizer of a Backup (controller/finalizer.rs, the same code as a \
        Transfer's): the backup scenarios start with it in place",
    ),
    ("list", "ferry.dev", "backupschedules", WATCHES),
    ("watch", "ferry.dev", "backupschedules", WATCHES),
    ("get", "ferry.dev", "ferryrestores", POPULATOR),
    ("watch", "ferry.dev", "ferryrestores", WATCHES),
    (
        "patch",
        "ferry.dev",
        "ferryrestores",
        "the finalizer of a Restore (controller/finalizer.rs, the same code as a \
        Transfer's): the restore scenario starts with it in place",
    ),
    (
        "create",
        "authorization.k8s.io",
        "subjectaccessreviews",
        "a clone from another namespace asks whether its creator may read the claim: \
        tests/standin.rs's cross-namespace scenarios make that request through these rules",
    ),
    (
        "list",
        "",
        "persistentvolumes",
        "a clone from another namespace that fails or is deleted part-way through its \
        hand-over finds the volumes to give back by label: tests/standin.rs's \
        cross-namespace scenarios make that request through these rules",
    ),
    (
        "get",
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        WEBHOOK,
    ),
    (
        "update",
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        WEBHOOK,
    ),
];

const WEBHOOK: &str = "`ferry operator run --webhook-listen` sets the webhook's caBundle at start \
    (admission::install), before any reconciler runs";
const WATCHES: &str = "controller::run's watchers (list then watch across namespaces); \
    the scenarios call reconcile directly and feed the stores themselves";
const POPULATOR: &str = "steps of the volume populator (services/operator/src/populator) \
    that its scenarios (tests/populator.rs) do not take";

/// The least-privilege check over the scenario binary that calls it: runs every other
/// test of the binary (the reconciler, backup, populator and leader-election scenarios)
/// in a child process that records what each scenario asked, then every grant of the
/// operator's roles must have been asked for, or be exempted with a reason.
pub fn check_least_privilege() {
    if std::env::var_os(RECORD_ENV).is_some() {
        return; // the child run: this test is the parent's
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(&exe)
        .args([
            "--skip",
            "the_operator_roles_grant_nothing",
            "--test-threads",
            "2",
        ])
        .env(RECORD_ENV, dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the scenarios failed in the recording run:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut used = BTreeSet::new();
    let mut files = 0;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        files += 1;
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            if let [verb, group, resource] = parts.as_slice() {
                used.insert((verb.to_string(), group.to_string(), resource.to_string()));
            }
        }
    }
    assert!(files > 0, "no scenario recorded its requests");
    let exempt: BTreeSet<(String, String, String)> = UNUSED_WITH_REASON
        .iter()
        .map(|(v, g, r, _)| (v.to_string(), g.to_string(), r.to_string()))
        .collect();
    let mut unused = Vec::new();
    let mut granted = BTreeSet::new();
    for rule in operator_rules(&rbac_file()) {
        for grant in rule.grants() {
            granted.insert(grant.clone());
            if !used.contains(&grant) && !exempt.contains(&grant) {
                unused.push(format!(
                    "{} {:?} {} (role {})",
                    grant.0, grant.1, grant.2, rule.role
                ));
            }
        }
    }
    assert!(
        unused.is_empty(),
        "grants no scenario uses (remove them, or exempt them with a reason):\n{}",
        unused.join("\n")
    );
    let not_granted: Vec<_> = exempt.difference(&granted).collect();
    assert!(
        not_granted.is_empty(),
        "exempted but no role grants them: drop the exemption {not_granted:?}"
    );
    let stale: Vec<_> = exempt.intersection(&used).collect();
    assert!(
        stale.is_empty(),
        "exempted as unused but a scenario uses them: drop the exemption {stale:?}"
    );
}

#[test]
fn a_request_outside_the_roles_is_denied_naming_the_rule() {
    let rules = operator_rules(&rbac_file());
    assert!(
        !rules.is_empty(),
        "no rule is bound to the operator's ServiceAccount"
    );
    let ok = access(
        "PATCH",
        "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers/t/status",
        "",
    )
    .unwrap();
    let update = access(
        "PUT",
        "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers/t/status",
        "",
    )
    .unwrap();
    let nodes = access("DELETE", "/api/v1/persistentvolumes/pv-1", "").unwrap();
    // The Lease Role is namespaced: a lease elsewhere is not the operator's.
    let lease_here = access(
        "GET",
        "/apis/coordination.k8s.io/v1/namespaces/ferry-system/leases/l",
        "",
    )
    .unwrap();
    let lease_there = access(
        "GET",
        "/apis/coordination.k8s.io/v1/namespaces/vms/leases/l",
        "",
    )
    .unwrap();
    assert!(denied(&rules, &[ok, lease_here]).is_empty());
    let missing = denied(&rules, &[update, nodes, lease_there]);
    assert_eq!(missing.len(), 3, "{missing:?}");
    assert!(
        missing[0].contains("delete \"\" persistentvolumes"),
        "{missing:?}"
    );
    assert!(
        missing[1].contains("get coordination.k8s.io leases in namespace vms"),
        "{missing:?}"
    );
    assert!(
        missing[2].contains("update ferry.dev transfers/status"),
        "{missing:?}"
    );
}
