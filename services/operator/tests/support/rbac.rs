//! The operator's RBAC (deploy/operator/10-rbac.yaml) checked against what the operator
//! really asks the API server: every request a scenario's mocked API server answers is
//! mapped to the verb, API group, resource and subresource the API server's authorizer
//! would check, and must be allowed by a rule bound to the operator's ServiceAccount.
//! Run over all the scenarios of a test binary, the other way round too: a rule no
//! scenario uses is more privilege than the operator needs (unless exempted with a reason).

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_yaml::Value;

/// The ServiceAccount the operator runs as (deploy/operator/10-rbac.yaml).
pub const SERVICE_ACCOUNT: (&str, &str) = ("ferry-system", "ferry-operator");

/// Where a scenario binary writes the accesses of each scenario when this is set (the
/// least-privilege test runs the scenarios in a child process with it).
pub const RECORD_ENV: &str = "FERRY_RBAC_RECORD_DIR";

/// One request as the authorizer sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Access {
    pub verb: String,
    pub group: String,
    /// `resource` or `resource/subresource`.
    pub resource: String,
    /// None for a cluster-wide request (a list or watch across all namespaces).
    pub namespace: Option<String>,
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            "\"\"" // the core group, as a Role writes it
        } else {
            &self.group
        };
        write!(f, "{} {} {}", self.verb, group, self.resource)?;
        match &self.namespace {
            Some(ns) => write!(f, " in namespace {ns}"),
            None => write!(f, " (all namespaces)"),
        }
    }
}

fn watch_query(query: &str) -> bool {
    query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1")
}

/// Maps a request to what the API server authorizes, as its request-info resolver does:
/// `/api/v1/...` is the core group, `/apis/GROUP/VERSION/...` a named one; then an
/// optional `namespaces/NS/`, the resource, its name, and a subresource. GET is get with a
/// name, list without, watch with `watch=true`; POST create, PUT update, PATCH patch,
/// DELETE delete (deletecollection without a name).
pub fn access(method: &str, path: &str, query: &str) -> Result<Access, String> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return Err(format!("not a resource path: {path}")),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let (resource, name, sub) = match rest {
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some(*name), None),
        [resource, name, sub] => (*resource, Some(*name), Some(*sub)),
        _ => return Err(format!("not a resource path: {path}")),
    };
    let verb = match (method, name) {
        ("GET", _) if watch_query(query) => "watch",
        ("GET", Some(_)) => "get",
        ("GET", None) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", Some(_)) => "delete",
        ("DELETE", None) => "deletecollection",
        _ => return Err(format!("no RBAC verb for {method} {path}")),
    };
    let resource = match sub {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_string(),
    };
    Ok(Access {
        verb: verb.into(),
        group: group.into(),
        resource,
        namespace,
    })
}

/// One rule of a role bound to the operator; `namespace` is set for a Role's rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rule {
    pub role: String,
    pub namespace: Option<String>,
    pub groups: Vec<String>,
    pub resources: Vec<String>,
    pub verbs: Vec<String>,
}

impl Rule {
    /// Whether this rule allows the access (no wildcards: the operator's roles name
    /// everything, and a wildcard would fail the least-privilege test anyway).
    pub fn allows(&self, a: &Access) -> bool {
        let in_scope = match (&self.namespace, &a.namespace) {
            (None, _) => true,
            (Some(role_ns), Some(ns)) => role_ns == ns,
            (Some(_), None) => false,
        };
        in_scope
            && self.groups.contains(&a.group)
            && self.resources.contains(&a.resource)
            && self.verbs.contains(&a.verb)
    }

    /// Each (verb, group, resource) this rule grants.
    pub fn grants(&self) -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        for g in &self.groups {
            for r in &self.resources {
                for v in &self.verbs {
                    out.push((v.clone(), g.clone(), r.clone()));
                }
            }
        }
        out
    }
}

fn strings(v: &Value, what: &str) -> Vec<String> {
    v.as_sequence()
        .unwrap_or_else(|| panic!("{what} is not a list: {v:?}"))
        .iter()
        .map(|s| {
            s.as_str()
                .unwrap_or_else(|| panic!("{what}: {s:?}"))
                .to_string()
        })
        .collect()
}

/// The repository's deploy/operator directory.
pub fn rbac_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/operator/10-rbac.yaml")
}

/// The rules of every ClusterRole and Role in the file that a binding grants to the
/// operator's ServiceAccount.
pub fn operator_rules(file: &Path) -> Vec<Rule> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).expect("a YAML document"))
        .collect();
    let bound: BTreeSet<(String, Option<String>)> = docs
        .iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some("ClusterRoleBinding" | "RoleBinding")
            )
        })
        .filter(|d| {
            d["subjects"].as_sequence().is_some_and(|s| {
                s.iter().any(|s| {
                    s["kind"].as_str() == Some("ServiceAccount")
                        && s["namespace"].as_str() == Some(SERVICE_ACCOUNT.0)
                        && s["name"].as_str() == Some(SERVICE_ACCOUNT.1)
                })
            })
        })
        .map(|d| {
            let ns = match d["roleRef"]["kind"].as_str() {
                Some("Role") => d["metadata"]["namespace"].as_str().map(String::from),
                _ => None,
            };
            (d["roleRef"]["name"].as_str().unwrap_or("").to_string(), ns)
        })
        .collect();
    let mut rules = Vec::new();
    for d in &docs {
        let namespace = match d["kind"].as_str() {
            Some("ClusterRole") => None,
            Some("Role") => d["metadata"]["namespace"].as_str().map(String::from),
            _ => continue,
        };
        let role = d["metadata"]["name"].as_str().unwrap_or("").to_string();
        if !bound.contains(&(role.clone(), namespace.clone())) {
            continue;
        }
        for r in d["rules"].as_sequence().into_iter().flatten() {
            rules.push(Rule {
                role: role.clone(),
                namespace: namespace.clone(),
                groups: strings(&r["apiGroups"], "apiGroups"),
                resources: strings(&r["resources"], "resources"),
                verbs: strings(&r["verbs"], "verbs"),
            });
        }
    }
    rules
}

/// The accesses no rule allows, each named as the rule it would need.
pub fn denied(rules: &[Rule], accesses: &[Access]) -> Vec<String> {
    let mut missing: Vec<String> = accesses
        .iter()
        .filter(|a| !rules.iter().any(|r| r.allows(a)))
        .map(|a| format!("no rule in {} allows {a}", rbac_file().display()))
        .collect();
    missing.sort();
    missing.dedup();
    missing
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
    ("watch", "ferry.dev", "transfers", WATCHES),
    ("list", "ferry.dev", "checksums", WATCHES),
    ("watch", "ferry.dev", "checksums", WATCHES),
    ("watch", "", "pods", WATCHES),
    ("list", "", "namespaces", WATCHES),
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
    ("patch", "", "persistentvolumeclaims", POPULATOR),
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
];

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
fn requests_map_to_the_verbs_the_api_server_checks() {
    let cases = [
        (
            "GET",
            "/apis/ferry.dev/v1alpha1/transfers",
            "watch=true&resourceVersion=1",
            "watch ferry.dev transfers (all namespaces)",
        ),
        (
            "GET",
            "/apis/ferry.dev/v1alpha1/transfers",
            "",
            "list ferry.dev transfers (all namespaces)",
        ),
        (
            "GET",
            "/api/v1/namespaces/vms/pods",
            "labelSelector=a",
            "list \"\" pods in namespace vms",
        ),
        (
            "GET",
            "/api/v1/namespaces/vms/pods/p",
            "",
            "get \"\" pods in namespace vms",
        ),
        (
            "POST",
            "/api/v1/namespaces/vms/secrets",
            "",
            "create \"\" secrets in namespace vms",
        ),
        (
            "PATCH",
            "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers/t/status",
            "",
            "patch ferry.dev transfers/status in namespace vms",
        ),
        (
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/ferry-system/leases/l",
            "",
            "update coordination.k8s.io leases in namespace ferry-system",
        ),
        (
            "DELETE",
            "/api/v1/namespaces/vms/pods/p",
            "",
            "delete \"\" pods in namespace vms",
        ),
        (
            "DELETE",
            "/api/v1/namespaces/vms/pods",
            "",
            "deletecollection \"\" pods in namespace vms",
        ),
        (
            "GET",
            "/api/v1/namespaces/vms",
            "",
            "get \"\" namespaces (all namespaces)",
        ),
    ];
    for (method, path, query, want) in cases {
        assert_eq!(
            access(method, path, query).unwrap().to_string(),
            want,
            "{method} {path}"
        );
    }
    assert!(access("GET", "/healthz", "").is_err());
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
    let nodes = access("GET", "/api/v1/nodes", "").unwrap();
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
        missing[0].contains("get coordination.k8s.io leases in namespace vms"),
        "{missing:?}"
    );
    assert!(
        missing[1].contains("list \"\" nodes (all namespaces)"),
        "{missing:?}"
    );
    assert!(
        missing[2].contains("update ferry.dev transfers/status"),
        "{missing:?}"
    );
}
