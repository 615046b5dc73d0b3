//! The Pod Security Standard `restricted`, as a check of a pod's JSON: what a namespace
//! labelled `pod-security.kubernetes.io/enforce: restricted` would refuse, so tests can
//! hold every pod the operator creates to it without an API server.
//!
//! The rules are those of Kubernetes' pod-security-admission (`policy/check_*.go`, latest
//! version), the baseline checks included: host namespaces, privileged, capabilities,
//! host paths and ports, probe hosts, AppArmor, SELinux, `/proc` mount, seccomp, sysctls,
//! Windows host processes, and for `restricted` the volume types, privilege escalation,
//! dropped capabilities, non-root and seccomp profile rules. Every container counts: init,
//! regular and ephemeral.

use serde_json::Value;

/// Volume types `restricted` allows.
const VOLUME_TYPES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
];
/// Sysctls any profile allows.
const SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];
const SELINUX_TYPES: &[&str] = &[
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];
const PROFILE_TYPES: &[&str] = &["RuntimeDefault", "Localhost"];

/// Every way `pod` (a Pod object, or its spec) breaks `restricted`, one line each; empty
/// when a `restricted` namespace admits it.
pub fn restricted_violations(pod: &Value) -> Vec<String> {
    let spec = pod.get("spec").unwrap_or(pod);
    let mut found = Vec::new();
    let pod_sc = &spec["securityContext"];
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[field] == Value::Bool(true) {
            found.push(format!("spec.{field} is true"));
        }
    }
    volumes(spec, &mut found);
    sysctls(pod_sc, &mut found);
    security_options("spec.securityContext", pod_sc, &mut found);
    if pod_sc["runAsNonRoot"] == Value::Bool(false) {
        found.push("spec.securityContext.runAsNonRoot is false".into());
    }
    if pod_sc["runAsUser"] == 0 {
        found.push("spec.securityContext.runAsUser is 0".into());
    }
    if !pod_sc["seccompProfile"].is_null() && !allowed_profile(&pod_sc["seccompProfile"]) {
        found.push(
            "spec.securityContext.seccompProfile.type is not RuntimeDefault or Localhost".into(),
        );
    }
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            let name = format!("{list}[{}]", c["name"].as_str().unwrap_or("?"));
            container(&name, c, pod_sc, &mut found);
        }
    }
    found
}

fn volumes(spec: &Value, found: &mut Vec<String>) {
    for v in spec["volumes"].as_array().into_iter().flatten() {
        let name = v["name"].as_str().unwrap_or("?");
        let kinds: Vec<&String> = v
            .as_object()
            .into_iter()
            .flat_map(|o| o.keys())
            .filter(|k| *k != "name")
            .collect();
        for kind in kinds {
            if !VOLUME_TYPES.contains(&kind.as_str()) {
                found.push(format!("volume {name} is of type {kind}"));
            }
        }
    }
}

fn sysctls(pod_sc: &Value, found: &mut Vec<String>) {
    for s in pod_sc["sysctls"].as_array().into_iter().flatten() {
        let name = s["name"].as_str().unwrap_or("?");
        if !SYSCTLS.contains(&name) {
            found.push(format!("sysctl {name} is not allowed"));
        }
    }
}

fn allowed_profile(profile: &Value) -> bool {
    profile["type"]
        .as_str()
        .is_some_and(|t| PROFILE_TYPES.contains(&t))
}

/// SELinux, AppArmor and Windows host-process rules, the same at pod and container level.
fn security_options(at: &str, sc: &Value, found: &mut Vec<String>) {
    let selinux = &sc["seLinuxOptions"];
    if let Some(t) = selinux["type"].as_str() {
        if !SELINUX_TYPES.contains(&t) {
            found.push(format!("{at}.seLinuxOptions.type is {t}"));
        }
    }
    for field in ["user", "role"] {
        if selinux[field].as_str().is_some_and(|v| !v.is_empty()) {
            found.push(format!("{at}.seLinuxOptions.{field} is set"));
        }
    }
    if !sc["appArmorProfile"].is_null() && !allowed_profile(&sc["appArmorProfile"]) {
        found.push(format!(
            "{at}.appArmorProfile.type is not RuntimeDefault or Localhost"
        ));
    }
    if sc["windowsOptions"]["hostProcess"] == Value::Bool(true) {
        found.push(format!("{at}.windowsOptions.hostProcess is true"));
    }
}

fn container(name: &str, c: &Value, pod_sc: &Value, found: &mut Vec<String>) {
    let sc = &c["securityContext"];
    let at = format!("{name}.securityContext");
    security_options(&at, sc, found);
    if sc["privileged"] == Value::Bool(true) {
        found.push(format!("{at}.privileged is true"));
    }
    if sc["allowPrivilegeEscalation"] != Value::Bool(false) {
        found.push(format!("{at}.allowPrivilegeEscalation is not false"));
    }
    let caps = &sc["capabilities"];
    let drops_all = caps["drop"]
        .as_array()
        .is_some_and(|d| d.iter().any(|c| c == "ALL"));
    if !drops_all {
        found.push(format!("{at}.capabilities.drop does not hold ALL"));
    }
    for add in caps["add"].as_array().into_iter().flatten() {
        if add != "NET_BIND_SERVICE" {
            found.push(format!("{at}.capabilities.add holds {add}"));
        }
    }
    match &sc["runAsNonRoot"] {
        Value::Bool(true) => {}
        Value::Null if pod_sc["runAsNonRoot"] == Value::Bool(true) => {}
        _ => found.push(format!(
            "{at}.runAsNonRoot is not true (nor set true for the pod)"
        )),
    }
    if sc["runAsUser"] == 0 {
        found.push(format!("{at}.runAsUser is 0"));
    }
    let profile = &sc["seccompProfile"];
    let seccomp_ok = if profile.is_null() {
        allowed_profile(&pod_sc["seccompProfile"])
    } else {
        allowed_profile(profile)
    };
    if !seccomp_ok {
        found.push(format!(
            "{at}.seccompProfile is not RuntimeDefault or Localhost (nor set so for the pod)"
        ));
    }
    if sc["procMount"].as_str().is_some_and(|m| m != "Default") {
        found.push(format!("{at}.procMount is not Default"));
    }
    for port in c["ports"].as_array().into_iter().flatten() {
        if port["hostPort"].as_i64().is_some_and(|p| p != 0) {
            found.push(format!("{name} has a hostPort"));
        }
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        for action in ["httpGet", "tcpSocket"] {
            if c[probe][action]["host"]
                .as_str()
                .is_some_and(|h| !h.is_empty())
            {
                found.push(format!("{name}.{probe}.{action}.host is set"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn good() -> Value {
        json!({
            "spec": {
                "securityContext": {
                    "runAsUser": 65532, "runAsNonRoot": true,
                    "seccompProfile": {"type": "RuntimeDefault"}
                },
                "containers": [{
                    "name": "c",
                    "securityContext": {
                        "allowPrivilegeEscalation": false,
                        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
                    }
                }],
                "volumes": [{"name": "d", "emptyDir": {}}, {"name": "p", "persistentVolumeClaim": {"claimName": "x"}}]
            }
        })
    }

    #[test]
    fn a_restricted_pod_passes() {
        assert_eq!(restricted_violations(&good()), Vec::<String>::new());
    }

    /// A change that breaks a rule.
    type Breaks = Box<dyn Fn(&mut Value)>;

    #[test]
    fn each_broken_rule_is_named() {
        let cases: Vec<(&str, Breaks)> = vec![
            (
                "runAsUser is 0",
                Box::new(|p| p["spec"]["securityContext"]["runAsUser"] = json!(0)),
            ),
            (
                "runAsNonRoot is false",
                Box::new(|p| p["spec"]["securityContext"]["runAsNonRoot"] = json!(false)),
            ),
            (
                "runAsNonRoot is not true",
                Box::new(|p| {
                    p["spec"]["securityContext"]
                        .as_object_mut()
                        .unwrap()
                        .remove("runAsNonRoot");
                }),
            ),
            (
                "seccompProfile is not",
                Box::new(|p| {
                    p["spec"]["securityContext"]
                        .as_object_mut()
                        .unwrap()
                        .remove("seccompProfile");
                }),
            ),
            (
                "allowPrivilegeEscalation is not false",
                Box::new(|p| {
                    p["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] =
                        json!(true);
                }),
            ),
            (
                "drop does not hold ALL",
                Box::new(|p| {
                    p["spec"]["containers"][0]["securityContext"]["capabilities"]["drop"] =
                        json!(["NET_RAW"]);
                }),
            ),
            (
                "add holds \"SYS_ADMIN\"",
                Box::new(|p| {
                    p["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] =
                        json!(["SYS_ADMIN"]);
                }),
            ),
            (
                "privileged is true",
                Box::new(|p| {
                    p["spec"]["containers"][0]["securityContext"]["privileged"] = json!(true);
                }),
            ),
            (
                "volume h is of type hostPath",
                Box::new(|p| {
                    p["spec"]["volumes"]
                        .as_array_mut()
                        .unwrap()
                        .push(json!({"name": "h", "hostPath": {"path": "/"}}));
                }),
            ),
            (
                "hostNetwork is true",
                Box::new(|p| p["spec"]["hostNetwork"] = json!(true)),
            ),
            (
                "has a hostPort",
                Box::new(|p| {
                    p["spec"]["containers"][0]["ports"] =
                        json!([{"containerPort": 1, "hostPort": 1}])
                }),
            ),
            (
                "sysctl kernel.msgmax",
                Box::new(|p| {
                    p["spec"]["securityContext"]["sysctls"] =
                        json!([{"name": "kernel.msgmax", "value": "1"}]);
                }),
            ),
            (
                "seLinuxOptions.type is spc_t",
                Box::new(|p| {
                    p["spec"]["securityContext"]["seLinuxOptions"] = json!({"type": "spc_t"});
                }),
            ),
            (
                "initContainers[i].securityContext.allowPrivilegeEscalation",
                Box::new(|p| {
                    p["spec"]["initContainers"] = json!([{"name": "i", "securityContext": {"capabilities": {"drop": ["ALL"]}}}]);
                }),
            ),
        ];
        for (expected, break_it) in cases {
            let mut pod = good();
            break_it(&mut pod);
            let found = restricted_violations(&pod);
            assert!(
                found.iter().any(|f| f.contains(expected)),
                "expected a violation containing {expected:?}, found {found:?}"
            );
        }
    }
}
