//! The version of a source with credentials, asked by a short-lived pod rather than the
//! operator, which never reads a Secret's value (and may not): the pod is built like the
//! source's import mover (the same Secret keys and registry files projected, the same
//! image, security context and placement; [`crate::mover::pod::probe_pod`]) and runs
//! `ferry source version --endpoint-json SOURCE` once, which opens the source as a copy
//! does and writes its version, or the error, as the container's termination message
//! ([`super::report`]). The operator reads that back from the pod's status, deletes the
//! pod, and goes on as with a version it asked itself.
//!
//! Who asks ([`asker`]): an HTTP(S) source with `http` options, a registry source with a
//! `secretRef` or `certConfigMap`, and an S3 source with credentials are asked by a pod;
//! the others by the operator, an S3 source without credentials anonymously (a public
//! bucket) and by a pod when the store refuses that (the pod has the movers'
//! ServiceAccount, and so their workload identity).

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;

use super::report::{self, Probed};
use crate::crd::{Endpoint, GoldenImage};
use crate::mover::layout;
use crate::mover::pod::{probe_pod, MoverDefaults, PROBE_DEADLINE_SECONDS};
use crate::mover::MoverError;
use crate::schedule::reconcile::from_time;

/// Where the probe writes its report: the kubelet's default `terminationMessagePath`
/// (writable whatever the root filesystem).
pub const MESSAGE_PATH: &str = "/dev/termination-log";
/// A probe pod that has not ended this long after its creation (unschedulable, its image
/// not pulled, a Secret missing) is a failed poll.
pub const TIMEOUT_SECONDS: i64 = PROBE_DEADLINE_SECONDS + 60;

/// Who asks a source for its version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// The operator, anonymously.
    Operator,
    /// A probe pod, with the source's credentials.
    Pod,
    /// Nobody: this kind of URL has no version (every fire imports).
    Nobody,
}

/// Who asks `source` for its version.
pub fn asker(source: &Endpoint) -> Asker {
    let url = source.url.as_deref().unwrap_or_default();
    let scheme = url
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    let registry = source.registry.clone().unwrap_or_default();
    let s3 = source.s3.clone().unwrap_or_default();
    let (private, asked) = match scheme.as_str() {
        "http" | "https" => (source.http.is_some(), true),
        "docker" | "oci" => (
            registry.secret_ref.is_some() || registry.cert_config_map.is_some(),
            true,
        ),
        "s3" => (
            s3.access_key_id.is_some() || s3.session_token.is_some(),
            true,
        ),
        _ => (false, false),
    };
    match (asked, private) {
        (false, _) => Asker::Nobody,
        (true, true) => Asker::Pod,
        (true, false) => Asker::Operator,
    }
}

/// Whether `source` is an `s3://` URL.
pub fn is_s3(source: &Endpoint) -> bool {
    source
        .url
        .as_deref()
        .and_then(|u| u.split_once("://"))
        .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("s3"))
}

/// The probe pod of the GoldenImage `name`: `<name>-version`.
pub fn pod_name(name: &str) -> String {
    let keep = 253 - "-version".len();
    format!("{}-version", &name[..name.len().min(keep)])
}

/// The probe's arguments: the source as the GoldenImage names it (Secret references,
/// never values), the mover's secrets directory, the termination message file.
pub fn args(source: &Endpoint) -> Vec<String> {
    vec![
        "source".into(),
        "version".into(),
        "--endpoint-json".into(),
        serde_json::to_string(source).unwrap_or_default(),
        "--secrets-dir".into(),
        layout::SECRETS_DIR.into(),
        "--termination-message-path".into(),
        MESSAGE_PATH.into(),
    ]
}

/// The probe pod of `golden`, owned by it.
pub fn pod(
    golden: &GoldenImage,
    defaults: &MoverDefaults,
    assigned_ids: bool,
) -> Result<Pod, MoverError> {
    let name = golden.metadata.name.clone().unwrap_or_default();
    probe_pod(
        golden,
        "GoldenImage",
        &golden.spec.source,
        golden.spec.mover.as_ref(),
        &pod_name(&name),
        args(&golden.spec.source),
        defaults,
        assigned_ids,
    )
}

/// What a probe pod shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Not ended yet.
    Running,
    /// Ended: what it found.
    Ended(Probed),
    /// A pod of an earlier spec (other arguments): to delete, and ask again.
    Stale,
}

/// What `pod` shows at `now`, when it should run `args` for the poll due at `due`: a
/// pod of other arguments, or made before the poll was due (left by an earlier poll), is
/// stale.
pub fn observe(pod: &Pod, args: &[String], due: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Seen {
    let spec = pod.spec.clone().unwrap_or_default();
    if spec.containers.first().and_then(|c| c.args.as_deref()) != Some(args) {
        return Seen::Stale;
    }
    let created = pod.metadata.creation_timestamp.as_ref().map(from_time);
    if let (Some(created), Some(due)) = (created, due) {
        if created < due {
            return Seen::Stale;
        }
    }
    let status = pod.status.clone().unwrap_or_default();
    let container = status
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .next();
    let state = container.and_then(|c| c.state).unwrap_or_default();
    if let Some(t) = &state.terminated {
        let probed = report::parse(t.message.as_deref().unwrap_or_default());
        return Seen::Ended(match probed {
            Probed::Failed(why) if t.exit_code != 0 => Probed::Failed(format!(
                "{why} (exit code {}{})",
                t.exit_code,
                t.reason
                    .as_deref()
                    .map(|r| format!(", {r}"))
                    .unwrap_or_default()
            )),
            other => other,
        });
    }
    let said = |reason: Option<String>, message: Option<String>| {
        [reason, message]
            .into_iter()
            .flatten()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(": ")
    };
    if status.phase.as_deref() == Some("Failed") {
        return Seen::Ended(Probed::Failed(format!(
            "the version probe pod failed: {}",
            said(status.reason.clone(), status.message.clone())
        )));
    }
    let age = created.map(|t| (now - t).num_seconds()).unwrap_or_default();
    if age > TIMEOUT_SECONDS {
        let waiting = state
            .waiting
            .map(|w| said(w.reason, w.message))
            .or_else(|| {
                status
                    .conditions
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                    .map(|c| said(c.reason, c.message))
            })
            .filter(|s| !s.is_empty())
            .map(|s| format!(": {s}"))
            .unwrap_or_default();
        return Seen::Ended(Probed::Failed(format!(
            "the version probe pod did not finish within {TIMEOUT_SECONDS} s{waiting}"
        )));
    }
    Seen::Running
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    fn golden() -> GoldenImage {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "GoldenImage",
            "metadata": {"name": "fedora", "namespace": "vms", "uid": "gi-1"},
            "spec": {
                "source": {
                    "url": "s3://images/fedora.raw",
                    "s3": {
                        "endpointUrl": "http://minio.storage:9000",
                        "accessKeyId": {"name": "s3-creds", "key": "id"},
                        "secretAccessKey": {"name": "s3-creds", "key": "secret"},
                        "forcePathStyle": true,
                    },
                },
                "trigger": {"schedule": "@daily"},
                "claim": {"size": "10Gi"},
                "mover": {"nodeSelector": {"pool": "storage"}},
            },
        }))
        .unwrap()
    }

    fn defaults() -> MoverDefaults {
        MoverDefaults {
            image: "ghcr.io/ferry-project/ferry:0.1.0".into(),
            image_pull_policy: Some("IfNotPresent".into()),
            resources: None,
            node_selector: BTreeMap::from([("kubernetes.io/os".to_string(), "linux".to_string())]),
            tolerations: vec![],
            priority_class_name: None,
            service_account_name: Some("ferry-mover".into()),
            image_pull_secrets: vec![],
        }
    }

    #[test]
    fn who_asks_depends_on_the_credentials_the_source_needs() {
        let e = |v: serde_json::Value| -> Endpoint { serde_json::from_value(v).unwrap() };
        assert_eq!(
            asker(&e(json!({"url": "https://h/a.img"}))),
            Asker::Operator
        );
        assert_eq!(
            asker(&e(json!({"url": "https://h/a.img",
                "http": {"user": "u", "password": {"name": "s", "key": "p"}}}))),
            Asker::Pod
        );
        assert_eq!(asker(&e(json!({"url": "docker://r/i:t"}))), Asker::Operator);
        assert_eq!(
            asker(&e(
                json!({"url": "docker://r/i:t", "registry": {"secretRef": "pull"}})
            )),
            Asker::Pod
        );
        assert_eq!(
            asker(&e(
                json!({"url": "oci://r/i:t", "registry": {"certConfigMap": "ca"}})
            )),
            Asker::Pod
        );
        assert_eq!(asker(&e(json!({"url": "s3://b/k"}))), Asker::Operator);
        assert_eq!(asker(&golden().spec.source), Asker::Pod);
        assert_eq!(asker(&e(json!({"url": "nbd://h/e"}))), Asker::Nobody);
    }

    #[test]
    fn the_probe_pod_is_a_mover_pod_that_runs_the_version_command_once() {
        let g = golden();
        let pod = pod(&g, &defaults(), false).unwrap();
        let source = serde_json::to_string(&g.spec.source).unwrap();
        assert!(!source.contains("minio-secret-value"));
        assert_eq!(
            serde_json::to_value(&pod).unwrap(),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": "fedora-version",
                    "namespace": "vms",
                    "labels": {
                        "app.kubernetes.io/name": "ferry",
                        "app.kubernetes.io/component": "version-probe",
                        "app.kubernetes.io/managed-by": "ferry-operator",
                        "ferry.dev/owner-kind": "GoldenImage",
                        "ferry.dev/owner-uid": "gi-1",
                        "velero.io/exclude-from-backup": "true",
                    },
                    "annotations": {"ferry.dev/owner-name": "fedora"},
                    "ownerReferences": [{
                        "apiVersion": "ferry.dev/v1alpha1", "kind": "GoldenImage",
                        "name": "fedora", "uid": "gi-1",
                        "controller": true,
                    }],
                },
                "spec": {
                    "activeDeadlineSeconds": 300,
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "restartPolicy": "Never",
                    "serviceAccountName": "ferry-mover",
                    "nodeSelector": {"kubernetes.io/os": "linux", "pool": "storage"},
                    "securityContext": {
                        "runAsUser": 65532, "runAsGroup": 65532, "runAsNonRoot": true,
                        "fsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [{
                        "name": "probe",
                        "image": "ghcr.io/ferry-project/ferry:0.1.0",
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["/ferry"],
                        "args": [
                            "source", "version", "--endpoint-json", source,
                            "--secrets-dir", "/var/run/ferry/secrets",
                            "--termination-message-path", "/dev/termination-log",
                        ],
                        "securityContext": {
                            "allowPrivilegeEscalation": false, "privileged": false,
                            "readOnlyRootFilesystem": true,
                            "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "terminationMessagePolicy": "FallbackToLogsOnError",
                        "volumeMounts": [
                            {"name": "tmp", "mountPath": "/tmp"},
                            {"name": "secrets", "mountPath": "/var/run/ferry/secrets", "readOnly": true},
                        ],
                    }],
                    "volumes": [
                        {"name": "tmp", "emptyDir": {}},
                        {"name": "secrets", "projected": {"defaultMode": 288, "sources": [
                            {"secret": {"name": "s3-creds", "optional": false, "items": [
                                {"key": "id", "path": "s3-creds/id"},
                                {"key": "secret", "path": "s3-creds/secret"},
                            ]}},
                        ]}},
                    ],
                },
            })
        );
        assert_eq!(
            observe(&pod, &args(&g.spec.source), None, Utc::now()),
            Seen::Running
        );
    }

    fn terminated(args: &[String], message: &str, exit_code: i32) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "fedora-version", "creationTimestamp": "2026-12-06T10:00:00Z"},
            "spec": {"containers": [{"name": "probe", "args": args}]},
            "status": {"phase": if exit_code == 0 { "Succeeded" } else { "Failed" },
                "containerStatuses": [{"name": "probe", "image": "i", "imageID": "", "ready": false,
                    "restartCount": 0, "state": {"terminated": {
                        "exitCode": exit_code, "reason": "Error", "message": message}}}]},
        }))
        .unwrap()
    }

    #[test]
    fn an_ended_probe_says_its_version_or_why_not() {
        let args = args(&golden().spec.source);
        let now: DateTime<Utc> = "2026-12-06T10:01:00Z".parse().unwrap();
        let ok = terminated(&args, r#"{"version":"etag:\"v1\""}"#, 0);
        assert_eq!(
            observe(&ok, &args, None, now),
            Seen::Ended(Probed::Version(Some("etag:\"v1\"".into())))
        );
        let denied = terminated(
            &args,
            r#"{"error":"s3://images/fedora.raw: access denied"}"#,
            0,
        );
        assert_eq!(
            observe(&denied, &args, None, now),
            Seen::Ended(Probed::Failed(
                "s3://images/fedora.raw: access denied".into()
            ))
        );
        let crashed = terminated(&args, "thread 'main' panicked", 101);
        assert_eq!(
            observe(&crashed, &args, None, now),
            Seen::Ended(Probed::Failed(
                "the version probe ended without a report it could read: thread 'main' panicked (exit code 101, Error)".into()
            ))
        );
        // Another spec's pod is not read, nor one an earlier poll left.
        assert_eq!(observe(&ok, &args[..2], None, now), Seen::Stale);
        let due: DateTime<Utc> = "2026-12-06T10:00:01Z".parse().unwrap();
        assert_eq!(observe(&ok, &args, Some(due), now), Seen::Stale);
        let due: DateTime<Utc> = "2026-12-06T10:00:00Z".parse().unwrap();
        assert!(matches!(
            observe(&ok, &args, Some(due), now),
            Seen::Ended(_)
        ));
    }

    #[test]
    fn a_probe_that_never_ends_fails_with_what_the_pod_waits_for() {
        let args = args(&golden().spec.source);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "fedora-version", "creationTimestamp": "2026-12-06T10:00:00Z"},
            "spec": {"containers": [{"name": "probe", "args": args}]},
            "status": {"phase": "Pending", "containerStatuses": [{"name": "probe", "image": "i",
                "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {
                    "reason": "CreateContainerConfigError", "message": "secret \"s3-creds\" not found"}}}]},
        }))
        .unwrap();
        let soon: DateTime<Utc> = "2026-12-06T10:05:00Z".parse().unwrap();
        assert_eq!(observe(&pod, &args, None, soon), Seen::Running);
        let late: DateTime<Utc> = "2026-12-06T10:06:01Z".parse().unwrap();
        assert_eq!(
            observe(&pod, &args, None, late),
            Seen::Ended(Probed::Failed(
                "the version probe pod did not finish within 360 s: CreateContainerConfigError: secret \"s3-creds\" not found".into()
            ))
        );
        let mut deadline = pod.clone();
        let status = deadline.status.as_mut().unwrap();
        status.phase = Some("Failed".into());
        status.reason = Some("DeadlineExceeded".into());
        status.message =
            Some("Pod was active on the node longer than the specified deadline".into());
        assert_eq!(
            observe(&deadline, &args, None, soon),
            Seen::Ended(Probed::Failed(
                "the version probe pod failed: DeadlineExceeded: Pod was active on the node longer than the specified deadline".into()
            ))
        );
    }
}
