//! RBAC as the API server's authorizer applies it, read from a manifest file of Roles,
//! ClusterRoles and their bindings: a request is mapped to the verb, API group, resource
//! and subresource the authorizer checks ([`access`]), and is allowed when a rule bound to
//! the ServiceAccount grants it ([`Rules::allows`]). The stand-in checks every request of
//! a client made with [`super::Cluster::client_as`] this way and refuses the others with
//! the API server's 403; the operator's scripted scenarios check what they answered with
//! the same code.

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

use serde_yaml::Value;

use super::path::{is_watch, ResourcePath};

/// One request as the authorizer sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Access {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// The API group ("" for the core group).
    pub group: String,
    /// `resource` or `resource/subresource`.
    pub resource: String,
    /// None for a cluster-wide request (a list or watch across all namespaces, or a
    /// cluster-scoped object).
    pub namespace: Option<String>,
    /// The object's name, when the request names one.
    pub name: Option<String>,
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

/// Maps a request to what the API server authorizes: GET is get with a name, list without,
/// watch with `watch=true`; POST create, PUT update, PATCH patch, DELETE delete
/// (deletecollection without a name).
pub fn access(method: &str, path: &str, query: &str) -> Result<Access, String> {
    let p = ResourcePath::parse(path)?;
    let verb = match (method, &p.name) {
        ("GET", _) if is_watch(query) => "watch",
        ("GET", Some(_)) => "get",
        ("GET", None) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", Some(_)) => "delete",
        ("DELETE", None) => "deletecollection",
        _ => return Err(format!("no RBAC verb for {method} {path}")),
    };
    Ok(Access {
        verb: verb.into(),
        group: p.group.clone(),
        resource: p.rbac_resource(),
        namespace: p.namespace.clone(),
        name: p.name.clone(),
    })
}

/// The message of the API server's 403 for a denied access by `user`.
pub fn forbidden_message(user: &str, a: &Access) -> String {
    let base = a.resource.split('/').next().unwrap_or_default();
    let qualified = if a.group.is_empty() {
        base.to_string()
    } else {
        format!("{base}.{}", a.group)
    };
    let subject = match &a.name {
        Some(name) => format!("{qualified} \"{name}\""),
        None => qualified,
    };
    let scope = match &a.namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_string(),
    };
    format!(
        "{subject} is forbidden: User \"{user}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
        a.verb, a.resource, a.group
    )
}

/// One rule of a role bound to the subject; `namespace` is set for a Role's rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rule {
    /// The role's name.
    pub role: String,
    /// The Role's namespace (None: a ClusterRole bound cluster-wide).
    pub namespace: Option<String>,
    /// `apiGroups`.
    pub groups: Vec<String>,
    /// `resources`.
    pub resources: Vec<String>,
    /// `verbs`.
    pub verbs: Vec<String>,
    /// `resourceNames` (empty: every name).
    pub resource_names: Vec<String>,
}

fn has(list: &[String], item: &str) -> bool {
    list.iter().any(|x| x == item || x == "*")
}

impl Rule {
    /// Whether this rule allows the access.
    pub fn allows(&self, a: &Access) -> bool {
        let in_scope = match (&self.namespace, &a.namespace) {
            (None, _) => true,
            (Some(role_ns), Some(ns)) => role_ns == ns,
            (Some(_), None) => false,
        };
        let named = self.resource_names.is_empty()
            || a.name
                .as_ref()
                .is_some_and(|n| self.resource_names.contains(n));
        in_scope
            && named
            && has(&self.groups, &a.group)
            && has(&self.resources, &a.resource)
            && has(&self.verbs, &a.verb)
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

/// Who a binding may name: a user and the groups it is in (a ServiceAccount is the user
/// `system:serviceaccount:NS:NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    /// The user name.
    pub user: String,
    /// Its groups.
    pub groups: Vec<String>,
}

impl Subject {
    /// The ServiceAccount `(namespace, name)`, with the groups the API server gives it.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Self {
            user: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
        }
    }

    fn named_by(&self, s: &serde_json::Value) -> bool {
        match s["kind"].as_str() {
            Some("ServiceAccount") => {
                self.user
                    == format!(
                        "system:serviceaccount:{}:{}",
                        s["namespace"].as_str().unwrap_or_default(),
                        s["name"].as_str().unwrap_or_default()
                    )
            }
            Some("User") => s["name"].as_str() == Some(self.user.as_str()),
            Some("Group") => s["name"]
                .as_str()
                .is_some_and(|g| self.groups.iter().any(|x| x == g)),
            _ => false,
        }
    }
}

fn strings(v: &serde_json::Value, what: &str) -> Vec<String> {
    match v {
        serde_json::Value::Null => Vec::new(),
        _ => v
            .as_array()
            .unwrap_or_else(|| panic!("{what} is not a list: {v:?}"))
            .iter()
            .map(|s| {
                s.as_str()
                    .unwrap_or_else(|| panic!("{what}: {s:?}"))
                    .to_string()
            })
            .collect(),
    }
}

/// The rules bound to one ServiceAccount, read from a manifest file.
#[derive(Debug, Clone)]
pub struct Rules {
    /// The user the API server names in a 403: `system:serviceaccount:NS:NAME`.
    pub user: String,
    /// The rules.
    pub rules: Vec<Rule>,
}

impl Rules {
    /// The rules of every ClusterRole and Role in `file` that a binding grants to the
    /// ServiceAccount `(namespace, name)`. Panics when the file cannot be read, as a test
    /// assertion does.
    pub fn load(file: &Path, service_account: (&str, &str)) -> Self {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let docs: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&text)
            .map(|d| <Value as serde::Deserialize>::deserialize(d).expect("a YAML document"))
            .map(|d| serde_json::to_value(d).expect("YAML as JSON"))
            .collect();
        Self::bound(
            &docs,
            &Subject::service_account(service_account.0, service_account.1),
        )
    }

    /// The rules of every ClusterRole and Role among `docs` (objects of any kind; only
    /// roles and bindings count) that a binding grants to `subject`.
    pub fn bound(docs: &[serde_json::Value], subject: &Subject) -> Self {
        let bound: BTreeSet<(String, Option<String>)> = docs
            .iter()
            .filter(|d| {
                matches!(
                    d["kind"].as_str(),
                    Some("ClusterRoleBinding" | "RoleBinding")
                )
            })
            .filter(|d| {
                d["subjects"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|s| subject.named_by(s)))
            })
            .map(|d| {
                // A RoleBinding grants its role (Role or ClusterRole) in its namespace only.
                let ns = match d["kind"].as_str() {
                    Some("RoleBinding") => d["metadata"]["namespace"].as_str().map(String::from),
                    _ => None,
                };
                let role = d["roleRef"]["name"].as_str().unwrap_or("").to_string();
                let cluster_role = d["roleRef"]["kind"].as_str() == Some("ClusterRole");
                (
                    format!("{}/{role}", if cluster_role { "C" } else { "R" }),
                    ns,
                )
            })
            .collect();
        let mut rules = Vec::new();
        for d in docs {
            let (tag, role_ns) = match d["kind"].as_str() {
                Some("ClusterRole") => ("C", None),
                Some("Role") => ("R", d["metadata"]["namespace"].as_str().map(String::from)),
                _ => continue,
            };
            let role = d["metadata"]["name"].as_str().unwrap_or("").to_string();
            let key = format!("{tag}/{role}");
            for (bound_role, binding_ns) in &bound {
                if *bound_role != key {
                    continue;
                }
                // A Role only counts when bound in its own namespace.
                if tag == "R" && binding_ns != &role_ns {
                    continue;
                }
                for r in d["rules"].as_array().into_iter().flatten() {
                    rules.push(Rule {
                        role: role.clone(),
                        namespace: binding_ns.clone(),
                        groups: strings(&r["apiGroups"], "apiGroups"),
                        resources: strings(&r["resources"], "resources"),
                        verbs: strings(&r["verbs"], "verbs"),
                        resource_names: strings(&r["resourceNames"], "resourceNames"),
                    });
                }
            }
        }
        Self {
            user: subject.user.clone(),
            rules,
        }
    }

    /// Whether any rule allows the access.
    pub fn allows(&self, a: &Access) -> bool {
        self.rules.iter().any(|r| r.allows(a))
    }

    /// The accesses no rule allows, each named as the rule it would need, with `file`
    /// (where the rules came from) in the message.
    pub fn denied(&self, file: &Path, accesses: &[Access]) -> Vec<String> {
        let mut missing: Vec<String> = accesses
            .iter()
            .filter(|a| !self.allows(a))
            .map(|a| format!("no rule in {} allows {a}", file.display()))
            .collect();
        missing.sort();
        missing.dedup();
        missing
    }
}

/// The API group of RBAC objects.
pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
/// The REST path of SubjectAccessReviews.
pub const SUBJECT_ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

/// The answer to a SubjectAccessReview (`spec.user`, `spec.groups`,
/// `spec.resourceAttributes`) by the RBAC objects `docs`, as the API server gives it: the
/// review with its `status` (`allowed`, and `reason` naming the role that allowed it).
/// A review of a non-resource URL is not simulated (denied, saying so).
pub fn review(docs: &[serde_json::Value], sar: &serde_json::Value) -> serde_json::Value {
    let spec = &sar["spec"];
    let subject = Subject {
        user: spec["user"].as_str().unwrap_or_default().to_string(),
        groups: spec["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g.as_str().map(String::from))
            .collect(),
    };
    let attributes = &spec["resourceAttributes"];
    let mut out = sar.clone();
    if !attributes.is_object() {
        out["status"] = serde_json::json!({"allowed": false,
            "reason": "the stand-in reviews resource attributes only"});
        return out;
    }
    let text = |k: &str| {
        attributes[k]
            .as_str()
            .filter(|v| !v.is_empty())
            .map(String::from)
    };
    let resource = match text("subresource") {
        Some(sub) => format!("{}/{sub}", text("resource").unwrap_or_default()),
        None => text("resource").unwrap_or_default(),
    };
    let access = Access {
        verb: text("verb").unwrap_or_default(),
        group: text("group").unwrap_or_default(),
        resource,
        namespace: text("namespace"),
        name: text("name"),
    };
    let rules = Rules::bound(docs, &subject);
    out["status"] = match rules.rules.iter().find(|r| r.allows(&access)) {
        Some(rule) => serde_json::json!({"allowed": true, "reason": format!(
            "RBAC: allowed by {} {}", if rule.namespace.is_some() { "RoleBinding of" } else { "ClusterRoleBinding of" }, rule.role)}),
        None => serde_json::json!({"allowed": false}),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROLES: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: reader}
rules:
  - apiGroups: [""]
    resources: [pods]
    verbs: [get, list, watch]
  - apiGroups: [ferry.dev]
    resources: [transfers/status]
    verbs: [patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reader}
subjects: [{kind: ServiceAccount, name: op, namespace: sys}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: leader, namespace: sys}
rules:
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    resourceNames: [op-lock]
    verbs: [get, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: leader, namespace: sys}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: leader}
subjects: [{kind: ServiceAccount, name: op, namespace: sys}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: unbound}
rules:
  - apiGroups: [""]
    resources: [secrets]
    verbs: [get]
"#;

    fn rules() -> Rules {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("rbac.yaml");
        std::fs::write(&file, ROLES).unwrap();
        Rules::load(&file, ("sys", "op"))
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
    fn only_bound_rules_grant_and_roles_stay_in_their_namespace_and_names() {
        let r = rules();
        assert_eq!(r.user, "system:serviceaccount:sys:op");
        let ok = |m, p| r.allows(&access(m, p, "").unwrap());
        assert!(ok("GET", "/api/v1/namespaces/x/pods/p"));
        assert!(ok(
            "PATCH",
            "/apis/ferry.dev/v1alpha1/namespaces/x/transfers/t/status"
        ));
        assert!(!ok(
            "PATCH",
            "/apis/ferry.dev/v1alpha1/namespaces/x/transfers/t"
        ));
        assert!(
            !ok("GET", "/api/v1/namespaces/x/secrets/s"),
            "its role is not bound"
        );
        assert!(ok(
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/sys/leases/op-lock"
        ));
        assert!(!ok(
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/sys/leases/other"
        ));
        assert!(!ok(
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/vms/leases/op-lock"
        ));
        let denied = r.denied(
            Path::new("f.yaml"),
            &[access("DELETE", "/api/v1/namespaces/x/pods/p", "").unwrap()],
        );
        assert_eq!(
            denied,
            ["no rule in f.yaml allows delete \"\" pods in namespace x"]
        );
    }

    #[test]
    fn a_subject_access_review_is_answered_by_the_bindings_of_its_user_and_groups() {
        let docs: Vec<serde_json::Value> = serde_json::from_value(serde_json::json!([
            {"kind": "Role", "metadata": {"name": "claim-reader", "namespace": "images"},
             "rules": [{"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get"]}]},
            {"kind": "RoleBinding", "metadata": {"name": "alice", "namespace": "images"},
             "roleRef": {"kind": "Role", "name": "claim-reader"},
             "subjects": [{"kind": "User", "name": "alice"}]},
            {"kind": "ClusterRole", "metadata": {"name": "view"},
             "rules": [{"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "list"]}]},
            {"kind": "RoleBinding", "metadata": {"name": "devs", "namespace": "base"},
             "roleRef": {"kind": "ClusterRole", "name": "view"},
             "subjects": [{"kind": "Group", "name": "devs"}]},
        ]))
        .unwrap();
        let sar = |user: &str, groups: &[&str], ns: &str, verb: &str| {
            let out = review(
                &docs,
                &serde_json::json!({"spec": {"user": user, "groups": groups,
                    "resourceAttributes": {"namespace": ns, "verb": verb, "resource": "persistentvolumeclaims", "name": "golden"}}}),
            );
            out["status"].clone()
        };
        assert_eq!(
            sar("alice", &[], "images", "get"),
            serde_json::json!({"allowed": true, "reason": "RBAC: allowed by RoleBinding of claim-reader"})
        );
        assert_eq!(
            sar("alice", &[], "images", "delete"),
            serde_json::json!({"allowed": false})
        );
        assert_eq!(
            sar("alice", &[], "base", "get"),
            serde_json::json!({"allowed": false})
        );
        assert_eq!(
            sar("bob", &[], "images", "get"),
            serde_json::json!({"allowed": false})
        );
        assert_eq!(sar("bob", &["devs"], "base", "get")["allowed"], true);
        assert_eq!(sar("bob", &["devs"], "images", "get")["allowed"], false);
    }

    #[test]
    fn the_forbidden_message_is_the_api_servers() {
        let a = access(
            "PATCH",
            "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers/t",
            "",
        )
        .unwrap();
        assert_eq!(
            forbidden_message("system:serviceaccount:sys:op", &a),
            "transfers.ferry.dev \"t\" is forbidden: User \"system:serviceaccount:sys:op\" cannot patch resource \"transfers\" in API group \"ferry.dev\" in the namespace \"vms\""
        );
        let a = access("GET", "/api/v1/nodes", "").unwrap();
        assert_eq!(
            forbidden_message("u", &a),
            "nodes is forbidden: User \"u\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
        );
    }
}
