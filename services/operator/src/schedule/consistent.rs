//! A consistent snapshot of a running app: a schedule's pre hooks, a KubeVirt guest
//! freeze, the VolumeSnapshot cut, the unfreeze, the post hooks, in that order.
//!
//! Hooks are the schedule's own (`consistency.pre`/`post`) and, unless turned off, the
//! ones Velero's annotations declare on the running pods that use the claim
//! (`pre.hook.backup.velero.io/command` as a JSON array, `/container`, `/on-error`
//! `Fail|Continue`, `/timeout` like `30s`; Velero's defaults: the first container, 30 s,
//! Fail). A hook is an exec through the API server (`pods/exec`, as `kubectl exec`): it
//! succeeds when the command exits 0 within its timeout. The freeze is KubeVirt's
//! `virtualmachineinstances/freeze` subresource (the guest agent's fsfreeze), with an
//! unfreeze timeout after which KubeVirt thaws the guest by itself, should the operator
//! die in between.
//!
//! Once a pre hook ran, the unfreeze and every post hook run whatever failed after it (a
//! pre hook that locks a database needs its post hook). A failure whose policy is Fail
//! (a pre hook, the freeze) skips the snapshot; a post hook's failure, or any with
//! Continue, is a warning: the snapshot was cut consistently all the same.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    ApiResource, AttachParams, DynamicObject, GroupVersionKind, ListParams, PostParams,
};
use kube::Api;
use serde_json::json;

use crate::controller::error::api_text;
use crate::crd::{BackupSchedule, Hook, OnError};

use super::Context;

/// How long a hook runs unless it says otherwise (Velero's default).
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(30);
/// KubeVirt's own unfreeze after this long, unless the schedule says otherwise.
pub const DEFAULT_UNFREEZE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the cut of the snapshot is waited for (its `creationTime`) while frozen.
pub const CUT_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the snapshot is looked at while waiting for its cut.
const CUT_POLL: Duration = Duration::from_millis(500);
/// Velero's annotation prefixes.
const VELERO_PRE: &str = "pre.hook.backup.velero.io";
const VELERO_POST: &str = "post.hook.backup.velero.io";

/// The annotation with which a pod lets a BackupSchedule's own hooks run in it: a
/// schedule's author is not trusted with an exec into any pod of the namespace (Velero's
/// annotations need none: the pod's owner wrote them).
pub const ALLOW_HOOKS_ANNOTATION: &str = "ferry.dev/allow-backup-hooks";

/// A hook to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedHook {
    pub pod: String,
    pub container: Option<String>,
    pub command: Vec<String>,
    pub timeout: Duration,
    pub on_error: OnError,
    /// Where it was declared, for messages.
    pub from: &'static str,
    /// Why it may not run (it then fails, as its policy says).
    pub refused: Option<String>,
}

/// A pod's first container: the one a hook runs in unless it names one.
fn first_container(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone())
}

impl PlannedHook {
    /// The schedule's own `hook`, to run in one of `using` (the running pods of its
    /// claim), which must allow it.
    fn of(hook: &Hook, using: &[&Pod], claim: &str) -> Self {
        let pod = using
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(hook.pod.as_str()));
        let refused = match pod {
            None => Some(format!(
                "pod {} is not a running pod that uses pvc/{claim}: a schedule's hooks run only there",
                hook.pod
            )),
            Some(p)
                if p.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(ALLOW_HOOKS_ANNOTATION))
                    .map(String::as_str)
                    != Some("true") =>
            {
                Some(format!(
                    "pod {} does not allow a BackupSchedule's hooks: its owner annotates it {ALLOW_HOOKS_ANNOTATION}=true",
                    hook.pod
                ))
            }
            Some(_) => None,
        };
        Self {
            pod: hook.pod.clone(),
            container: hook
                .container
                .clone()
                .or_else(|| pod.and_then(|p| first_container(p))),
            command: hook.command.clone(),
            timeout: hook
                .timeout_seconds
                .map_or(DEFAULT_HOOK_TIMEOUT, |s| Duration::from_secs(s.into())),
            on_error: hook.on_error.unwrap_or_default(),
            from: "spec.consistency",
            refused,
        }
    }

    fn describe(&self) -> String {
        let container = self.container.as_deref().unwrap_or("no container");
        format!(
            "hook {:?} in pod {} ({container}, from {})",
            self.command.join(" "),
            self.pod,
            self.from
        )
    }
}

/// `30s`, `2m`, `1h30m` (Go's durations as Velero writes them; whole units only).
pub fn go_duration(text: &str) -> Option<Duration> {
    let mut total = 0u64;
    let mut digits = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let n: u64 = digits.parse().ok()?;
        digits.clear();
        total = total.checked_add(n.checked_mul(match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        })?)?;
    }
    (digits.is_empty() && total > 0).then(|| Duration::from_secs(total))
}

/// The hook Velero's annotations of `phase` (`pre` or `post`) declare on `pod`: none
/// without a command; an error naming the annotation for one that cannot be read.
pub fn velero_hook(pod: &Pod, phase: &str) -> Result<Option<PlannedHook>, String> {
    let prefix = if phase == "pre" {
        VELERO_PRE
    } else {
        VELERO_POST
    };
    let name = pod.metadata.name.clone().unwrap_or_default();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let get = |key: &str| annotations.get(&format!("{prefix}/{key}"));
    let Some(command) = get("command") else {
        return Ok(None);
    };
    let bad = |key: &str, why: &str| format!("pod {name}: annotation {prefix}/{key} {why}");
    // Velero takes a JSON array, or one word.
    let command: Vec<String> = if command.trim_start().starts_with('[') {
        serde_json::from_str(command)
            .map_err(|e| bad("command", &format!("is not a JSON array of strings: {e}")))?
    } else {
        vec![command.clone()]
    };
    if command.is_empty() || command.len() > 64 || command[0].is_empty() {
        return Err(bad("command", "names no command"));
    }
    let on_error = match get("on-error").map(String::as_str) {
        None | Some("Fail") => OnError::Fail,
        Some("Continue") => OnError::Continue,
        Some(other) => {
            return Err(bad(
                "on-error",
                &format!("is '{other}', not Fail or Continue"),
            ))
        }
    };
    let timeout = match get("timeout") {
        None => DEFAULT_HOOK_TIMEOUT,
        Some(t) => go_duration(t)
            .filter(|d| *d <= Duration::from_secs(3600))
            .ok_or_else(|| {
                bad(
                    "timeout",
                    &format!("is '{t}', not a duration like 30s or 2m (at most 1h)"),
                )
            })?,
    };
    Ok(Some(PlannedHook {
        pod: name,
        container: get("container").cloned().or_else(|| first_container(pod)),
        command,
        timeout,
        on_error,
        from: if phase == "pre" {
            "a pre.hook.backup.velero.io annotation"
        } else {
            "a post.hook.backup.velero.io annotation"
        },
        refused: None,
    }))
}

/// The running pods of `pods` that mount `claim`.
pub fn pods_using<'a>(pods: &'a [Pod], claim: &str) -> Vec<&'a Pod> {
    pods.iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter(|p| {
            p.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .any(|v| {
                    v.persistent_volume_claim
                        .as_ref()
                        .is_some_and(|c| c.claim_name == claim)
                })
        })
        .collect()
}

/// Every hook of `phase` for the schedule: its own, then Velero's of `pods` (the pods
/// using its claim). An annotation that cannot be read is a Fail hook that fails.
pub fn plan(
    schedule: &BackupSchedule,
    pods: &[Pod],
    phase: &str,
) -> (Vec<PlannedHook>, Vec<String>) {
    let Some(c) = &schedule.spec.consistency else {
        return (Vec::new(), Vec::new());
    };
    let own = if phase == "pre" { &c.pre } else { &c.post };
    let claim = &schedule.spec.source_pvc;
    let using = pods_using(pods, claim);
    let mut hooks: Vec<PlannedHook> = own
        .iter()
        .map(|h| PlannedHook::of(h, &using, claim))
        .collect();
    let mut unreadable = Vec::new();
    if c.velero_annotations != Some(false) {
        for pod in using {
            match velero_hook(pod, phase) {
                Ok(Some(hook)) => hooks.push(hook),
                Ok(None) => {}
                Err(why) => unreadable.push(why),
            }
        }
    }
    (hooks, unreadable)
}

/// Whether the schedule asks for anything around its snapshot (its own hooks, a freeze,
/// or Velero's annotations, which need a look at the pods).
pub fn wanted(schedule: &BackupSchedule) -> bool {
    schedule.spec.consistency.is_some()
}

/// Runs a hook; Err says why it failed.
async fn run(ctx: &Context, namespace: &str, hook: &PlannedHook) -> Result<(), String> {
    if let Some(why) = &hook.refused {
        return Err(why.clone());
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    // No stdout: unread, it would fill kube's pipe and stall the command.
    let mut params = AttachParams::default()
        .stdin(false)
        .stdout(false)
        .stderr(true);
    if let Some(c) = &hook.container {
        params = params.container(c.clone());
    }
    let exec = async {
        let mut process = pods
            .exec(&hook.pod, hook.command.clone(), &params)
            .await
            .map_err(|e| format!("cannot exec: {}", api_text(&e)))?;
        let status = process.take_status();
        let stderr = process.stderr();
        let tail = async move {
            use tokio::io::AsyncReadExt;
            let mut text = String::new();
            if let Some(mut stderr) = stderr {
                let mut buf = Vec::new();
                let _ = (&mut stderr).take(4096).read_to_end(&mut buf).await;
                // Read to the end: a full pipe would stall the command.
                let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
                text = String::from_utf8_lossy(&buf).trim().to_string();
            }
            text
        };
        let (status, stderr) = tokio::join!(
            async {
                match status {
                    Some(s) => s.await,
                    None => None,
                }
            },
            tail
        );
        let _ = process.join().await;
        match status {
            Some(s) if s.status.as_deref() == Some("Success") => Ok(()),
            Some(s) => Err(format!(
                "it failed: {}{}",
                s.message.unwrap_or_else(|| "no message".into()),
                if stderr.is_empty() {
                    String::new()
                } else {
                    format!(" (stderr: {stderr})")
                }
            )),
            None => Err("the exec ended without a status".into()),
        }
    };
    match tokio::time::timeout(hook.timeout, exec).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "it did not end within {} s",
            hook.timeout.as_secs()
        )),
    }
}

/// A KubeVirt subresource call (`freeze` or `unfreeze`) of a VirtualMachineInstance.
async fn kubevirt(
    ctx: &Context,
    namespace: &str,
    vmi: &str,
    what: &str,
    body: serde_json::Value,
) -> Result<(), String> {
    let url = format!(
        "/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/virtualmachineinstances/{vmi}/{what}"
    );
    let request = http::Request::put(url)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap_or_default())
        .map_err(|e| e.to_string())?;
    ctx.client
        .request_text(request)
        .await
        .map(|_| ())
        .map_err(|e| api_text(&e))
}

/// Whether the VirtualMachineInstance `vmi` has `claim` among its disks: a schedule's
/// author may freeze only the VM whose disk it backs up.
async fn vmi_uses(ctx: &Context, namespace: &str, vmi: &str, claim: &str) -> Result<(), String> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        namespace,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachineInstance"),
            "virtualmachineinstances",
        ),
    );
    let object = api.get(vmi).await.map_err(|e| api_text(&e))?;
    if volumes_name(&object.data, claim) {
        Ok(())
    } else {
        Err(format!(
            "it has no disk on pvc/{claim}: a schedule freezes only the VM whose disk it backs up"
        ))
    }
}

/// Whether a VirtualMachineInstance's `spec.volumes` name `claim` (a PVC or a DataVolume
/// of that name).
pub fn volumes_name(vmi: &serde_json::Value, claim: &str) -> bool {
    vmi["spec"]["volumes"].as_array().is_some_and(|volumes| {
        volumes.iter().any(|v| {
            v["persistentVolumeClaim"]["claimName"].as_str() == Some(claim)
                || v["dataVolume"]["name"].as_str() == Some(claim)
        })
    })
}

/// What happened around the cut.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The snapshot, as last seen; None when it was not created (a Fail failure).
    pub snapshot: Option<DynamicObject>,
    /// Why the snapshot was not created.
    pub failed: Option<String>,
    /// What failed with Continue, or after the cut.
    pub warnings: Vec<String>,
}

/// Pre hooks, freeze, `snapshot` (a VolumeSnapshot, or a VolumeGroupSnapshot, of `api`)
/// created and waited for until cut, unfreeze, post hooks (see the module docs).
pub async fn take(
    ctx: &Context,
    schedule: &BackupSchedule,
    api: &ApiResource,
    snapshot: &DynamicObject,
) -> Result<Outcome, crate::controller::Error> {
    let name = snapshot.metadata.name.clone().unwrap_or_default();
    let kind = &api.kind;
    let namespace = schedule.metadata.namespace.clone().unwrap_or_default();
    let consistency = schedule.spec.consistency.clone().unwrap_or_default();
    let hooked = !consistency.pre.is_empty() || !consistency.post.is_empty();
    let pods: Vec<Pod> = if hooked || consistency.velero_annotations != Some(false) {
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
        api.list(&ListParams::default()).await?.items
    } else {
        Vec::new()
    };
    let mut outcome = Outcome::default();
    let (pre, unreadable) = plan(schedule, &pods, "pre");
    let (post, unreadable_post) = plan(schedule, &pods, "post");
    if let Some(why) = unreadable.into_iter().chain(unreadable_post).next() {
        outcome.failed = Some(why);
        return Ok(outcome);
    }
    for hook in &pre {
        if let Err(why) = run(ctx, &namespace, hook).await {
            let text = format!("pre {}: {why}", hook.describe());
            match hook.on_error {
                OnError::Continue => outcome.warnings.push(text),
                OnError::Fail => {
                    outcome.failed = Some(text);
                    break;
                }
            }
        }
    }
    let mut frozen = None;
    if outcome.failed.is_none() {
        if let Some(freeze) = &consistency.freeze {
            let vmi = &freeze.virtual_machine_instance;
            let timeout = freeze
                .unfreeze_timeout_seconds
                .map_or(DEFAULT_UNFREEZE_TIMEOUT, |s| Duration::from_secs(s.into()));
            let body = json!({"unfreezeTimeout": format!("{}s", timeout.as_secs())});
            let frozen_claim = match vmi_uses(ctx, &namespace, vmi, &schedule.spec.source_pvc).await
            {
                Ok(()) => kubevirt(ctx, &namespace, vmi, "freeze", body).await,
                Err(why) => Err(why),
            };
            match frozen_claim {
                Ok(()) => frozen = Some(vmi.clone()),
                Err(why) => {
                    let text = format!("cannot freeze VirtualMachineInstance {vmi}: {why}");
                    match freeze.on_error.unwrap_or_default() {
                        OnError::Continue => outcome.warnings.push(text),
                        OnError::Fail => outcome.failed = Some(text),
                    }
                }
            }
        }
    }
    if outcome.failed.is_none() {
        match cut(ctx, &namespace, api, snapshot).await {
            Ok((snapshot, cut)) => {
                if !cut {
                    outcome.warnings.push(format!(
                        "{kind} {name} was not cut within {} s; unfrozen and the post hooks run all the same, so the snapshot may not be consistent",
                        CUT_TIMEOUT.as_secs()
                    ));
                }
                outcome.snapshot = Some(snapshot);
            }
            Err(e) => outcome.failed = Some(format!("cannot create {kind} {name}: {e}")),
        }
    }
    if let Some(vmi) = frozen {
        if let Err(why) = kubevirt(ctx, &namespace, &vmi, "unfreeze", json!({})).await {
            outcome.warnings.push(format!(
                "cannot unfreeze VirtualMachineInstance {vmi}: {why} (KubeVirt thaws it by itself after its unfreeze timeout)"
            ));
        }
    }
    for hook in &post {
        if let Err(why) = run(ctx, &namespace, hook).await {
            outcome
                .warnings
                .push(format!("post {}: {why}", hook.describe()));
        }
    }
    Ok(outcome)
}

/// Creates the snapshot (of `api`) and waits until it is cut (`status.creationTime`, or
/// ready); returns it as last seen and whether it was cut within [`CUT_TIMEOUT`].
async fn cut(
    ctx: &Context,
    namespace: &str,
    api: &ApiResource,
    snapshot: &DynamicObject,
) -> Result<(DynamicObject, bool), kube::Error> {
    let name = snapshot.metadata.name.clone().unwrap_or_default();
    let snapshots: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), namespace, api);
    let mut current = match snapshots.create(&PostParams::default(), snapshot).await {
        Ok(created) => created,
        Err(kube::Error::Api(e)) if e.code == 409 => snapshots.get(&name).await?,
        Err(e) => return Err(e),
    };
    let started = tokio::time::Instant::now();
    loop {
        let status = &current.data["status"];
        if status["creationTime"].is_string() || status["readyToUse"].as_bool() == Some(true) {
            return Ok((current, true));
        }
        if started.elapsed() >= CUT_TIMEOUT {
            return Ok((current, false));
        }
        tokio::time::sleep(CUT_POLL).await;
        current = snapshots.get(&name).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, phase: &str, claim: &str, annotations: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"containers": [{"name": "db"}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn only_a_vm_with_a_disk_on_the_claim_is_frozen() {
        let vmi = json!({"spec": {"volumes": [
            {"name": "root", "persistentVolumeClaim": {"claimName": "web1-root"}},
            {"name": "data", "dataVolume": {"name": "web1-data"}},
            {"name": "init", "cloudInitNoCloud": {}}]}});
        assert!(volumes_name(&vmi, "web1-root"));
        assert!(volumes_name(&vmi, "web1-data"));
        assert!(!volumes_name(&vmi, "db-data"));
        assert!(!volumes_name(&json!({"spec": {}}), "web1-root"));
    }

    #[test]
    fn go_durations_as_velero_writes_them() {
        assert_eq!(go_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(go_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(go_duration("1h30m"), Some(Duration::from_secs(5400)));
        for bad in ["", "30", "0s", "1d", "-1s", "1.5s", "s"] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn velero_annotations_become_hooks_with_velero_defaults() {
        let p = pod(
            "db-0",
            "Running",
            "data",
            json!({"pre.hook.backup.velero.io/command": "[\"/bin/sh\", \"-c\", \"sync\"]",
                   "pre.hook.backup.velero.io/container": "db",
                   "pre.hook.backup.velero.io/timeout": "2m",
                   "pre.hook.backup.velero.io/on-error": "Continue",
                   "post.hook.backup.velero.io/command": "/unlock"}),
        );
        let pre = velero_hook(&p, "pre").unwrap().unwrap();
        assert_eq!(pre.command, ["/bin/sh", "-c", "sync"]);
        assert_eq!(pre.container.as_deref(), Some("db"));
        assert_eq!(pre.timeout, Duration::from_secs(120));
        assert_eq!(pre.on_error, OnError::Continue);
        let post = velero_hook(&p, "post").unwrap().unwrap();
        assert_eq!(post.command, ["/unlock"]);
        assert_eq!(post.container.as_deref(), Some("db"), "the first container");
        assert_eq!(post.timeout, DEFAULT_HOOK_TIMEOUT);
        assert_eq!(post.on_error, OnError::Fail);
        let none = pod("web-0", "Running", "data", json!({}));
        assert_eq!(velero_hook(&none, "pre").unwrap(), None);
        for (key, value, says) in [
            ("command", "[\"/bin/sh\",", "not a JSON array"),
            ("command", "[]", "names no command"),
            ("on-error", "Ignore", "not Fail or Continue"),
            ("timeout", "forever", "not a duration"),
        ] {
            let mut a = json!({"pre.hook.backup.velero.io/command": "[\"/x\"]"});
            a[format!("pre.hook.backup.velero.io/{key}")] = json!(value);
            let why = velero_hook(&pod("db-0", "Running", "data", a), "pre").unwrap_err();
            assert!(why.contains(says) && why.contains(key), "{why}");
        }
    }

    #[test]
    fn only_running_pods_of_the_claim_give_hooks_after_the_schedules_own() {
        let hooked = json!({"pre.hook.backup.velero.io/command": "[\"/lock\"]"});
        let pods = [
            pod("db-0", "Running", "data", hooked.clone()),
            pod("db-1", "Pending", "data", hooked.clone()),
            pod("other", "Running", "logs", hooked.clone()),
            pod(
                "app-0",
                "Running",
                "data",
                json!({ALLOW_HOOKS_ANNOTATION: "true"}),
            ),
            pod("app-1", "Running", "data", json!({})),
        ];
        let running: Vec<_> = pods_using(&pods, "data")
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(running, ["db-0", "app-0", "app-1"]);
        let mut schedule: BackupSchedule = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "BackupSchedule",
            "metadata": {"name": "nightly", "namespace": "vms"},
            "spec": {"sourcePVC": "data", "repository": "r", "trigger": {"schedule": "@daily"},
                     "consistency": {"pre": [{"pod": "app-0", "command": ["/flush"],
                                              "timeoutSeconds": 5}]}},
        }))
        .unwrap();
        let (pre, unreadable) = plan(&schedule, &pods, "pre");
        assert!(unreadable.is_empty());
        let order: Vec<(&str, &str)> = pre
            .iter()
            .map(|h| (h.pod.as_str(), h.command[0].as_str()))
            .collect();
        assert_eq!(order, [("app-0", "/flush"), ("db-0", "/lock")]);
        assert_eq!(pre[0].timeout, Duration::from_secs(5));
        assert_eq!(pre[0].refused, None);
        assert_eq!(
            pre[0].container.as_deref(),
            Some("db"),
            "the first container"
        );
        // A pod that did not opt in, one of another claim, one that is not there: refused.
        for (target, says) in [
            ("app-1", "does not allow a BackupSchedule's hooks"),
            ("other", "is not a running pod that uses pvc/data"),
            ("gone-0", "is not a running pod that uses pvc/data"),
        ] {
            schedule.spec.consistency.as_mut().unwrap().pre[0].pod = target.into();
            let (pre, _) = plan(&schedule, &pods, "pre");
            let why = pre[0].refused.clone().unwrap_or_default();
            assert!(why.contains(says), "{target}: {why}");
        }
        schedule
            .spec
            .consistency
            .as_mut()
            .unwrap()
            .velero_annotations = Some(false);
        schedule.spec.consistency.as_mut().unwrap().pre[0].pod = "app-0".into();
        assert_eq!(plan(&schedule, &pods, "pre").0.len(), 1, "annotations off");
        schedule.spec.consistency = None;
        assert!(plan(&schedule, &pods, "pre").0.is_empty());
        assert!(!wanted(&schedule));
    }
}
