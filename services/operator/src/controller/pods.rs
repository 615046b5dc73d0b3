//! The mover pod of an attempt: what state it is in (read from the store of mover pods,
//! confirmed by one GET only when the store does not have it), its token Secret, its
//! creation and deletion, and the address the link talks to.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::Api;

use crate::crd::VolumeMode;
use crate::mover::layout::{CLIENT_CA_KEY, GRPC_PORT, TLS_CERT_KEY, TLS_KEY_KEY, TOKEN_KEY};
use crate::mover::ResolvedPvc;

use super::claims;
use super::context::Context;
use super::error::Error;
use super::kind::{Ids, MoverKind};
use super::link::MoverAddress;
use super::names;
use super::plan;

/// What became of the mover pod the status names.
#[derive(Debug, Clone)]
pub enum PodState {
    /// The status names no pod.
    Absent,
    /// Created, not ready yet.
    Starting {
        /// Why, when Kubernetes says it cannot start.
        why: Option<String>,
        /// When the API server created it (None: not seen from the API yet).
        created: Option<Timestamp>,
        /// The pod as last seen.
        pod: Arc<Pod>,
    },
    /// Ready to take jobs.
    Ready(Arc<Pod>),
    /// Gone, failed, evicted or being deleted: why.
    Lost(String),
}

/// The state of the pod `name` (the status's `moverPod`).
pub async fn observe(ctx: &Context, ids: &Ids, name: Option<&str>) -> Result<PodState, Error> {
    let Some(name) = name else {
        return Ok(PodState::Absent);
    };
    let key = ObjectRef::new(name).within(&ids.namespace);
    let pod = match ctx.pods.get(&key) {
        Some(pod) => pod,
        // The store may not have seen a pod created a moment ago: ask once.
        None => match pods(ctx, ids).get_opt(name).await? {
            Some(pod) => Arc::new(pod),
            None => return Ok(PodState::Lost(format!("mover pod {name} was deleted"))),
        },
    };
    Ok(classify(pod))
}

/// A pod's state from its status.
pub fn classify(pod: Arc<Pod>) -> PodState {
    let name = pod.metadata.name.clone().unwrap_or_default();
    if pod.metadata.deletion_timestamp.is_some() {
        return PodState::Lost(format!("mover pod {name} is being deleted"));
    }
    let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let Some(status) = pod.status.as_ref() else {
        return PodState::Starting {
            why: None,
            created,
            pod,
        };
    };
    match status.phase.as_deref() {
        Some("Failed") | Some("Succeeded") => {
            let why = status
                .reason
                .clone()
                .or_else(|| terminated_reason(&pod))
                .unwrap_or_else(|| "it exited".into());
            let mut text = format!("mover pod {name} stopped: {why}");
            if let Some(message) = &status.message {
                text.push_str(&format!(" ({message})"));
            }
            if let Some(last) = termination_message(&pod) {
                text.push_str(&format!(": {last}"));
            }
            PodState::Lost(text)
        }
        _ => {
            let ready = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if ready && status.pod_ip.is_some() {
                PodState::Ready(pod)
            } else {
                PodState::Starting {
                    why: why_not_started(&pod),
                    created,
                    pod,
                }
            }
        }
    }
}

/// Container waiting reasons that need someone to act (the others pass by themselves).
const STUCK: [&str; 5] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
];

/// Why a pod that is not ready cannot start: unschedulable, or its container stuck.
fn why_not_started(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let unschedulable = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    });
    if let Some(c) = unschedulable {
        return Some(format!(
            "Unschedulable: {}",
            c.message.as_deref().unwrap_or("no node fits")
        ));
    }
    status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
        .find(|w| w.reason.as_deref().is_some_and(|r| STUCK.contains(&r)))
        .map(|w| {
            format!(
                "{}: {}",
                w.reason.as_deref().unwrap_or_default(),
                w.message.as_deref().unwrap_or("")
            )
        })
}

/// Why the mover container ended (`OOMKilled`, `Error`), when it did.
fn terminated_reason(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.terminated.as_ref()?.reason.clone())
}

/// Warning events of a pod taken into a status, at most.
const LAST_WARNINGS: usize = 3;
/// Most characters of one event's note taken into a status.
const WARNING_CHARS: usize = 300;

/// The pod's last warning events (`FailedScheduling`, `FailedAttachVolume`, `FailedMount`,
/// ...), oldest first, each as `reason: message`: what kept it from starting.
pub async fn last_warnings(ctx: &Context, ids: &Ids, pod: &str) -> Result<Vec<String>, Error> {
    let api: Api<Event> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    let params = ListParams::default().fields(&format!(
        "involvedObject.kind=Pod,involvedObject.name={pod}"
    ));
    let mut warnings: Vec<Event> = api
        .list(&params)
        .await?
        .items
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .collect();
    warnings.sort_by_key(|e| {
        e.last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or(e.event_time.as_ref().map(|t| t.0))
            .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))
    });
    let skip = warnings.len().saturating_sub(LAST_WARNINGS);
    Ok(warnings
        .iter()
        .skip(skip)
        .map(|e| {
            let note: String = e
                .message
                .as_deref()
                .unwrap_or("")
                .trim()
                .chars()
                .take(WARNING_CHARS)
                .collect();
            format!("{}: {note}", e.reason.as_deref().unwrap_or("Warning"))
        })
        .collect())
}

/// Most characters of a mover's termination message taken into a status.
const TERMINATION_MESSAGE_CHARS: usize = 512;

/// The last thing the mover said before it ended: the last line of its termination message
/// (with `FallbackToLogsOnError`, the end of its log when it wrote no message), the message
/// field of a JSON log line, at most [`TERMINATION_MESSAGE_CHARS`] characters.
fn termination_message(pod: &Pod) -> Option<String> {
    let text = pod
        .status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())?;
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?.trim();
    let said = serde_json::from_str::<serde_json::Value>(line)
        .ok()
        .and_then(|v| {
            let message = v["fields"]["message"].as_str().or(v["message"].as_str())?;
            let error = v["fields"]["error"].as_str();
            Some(match error {
                Some(error) => format!("{message}: {error}"),
                None => message.to_string(),
            })
        })
        .unwrap_or_else(|| line.to_string());
    let mut chars = said.chars();
    let mut bounded: String = chars.by_ref().take(TERMINATION_MESSAGE_CHARS).collect();
    if chars.next().is_some() {
        bounded.push('…');
    }
    Some(bounded)
}

/// The claims attached to a mover pod, with the mode the pod attaches them in: what the
/// job requests need, without looking the claims up again.
pub fn attached_pvcs(pod: &Pod) -> Vec<ResolvedPvc> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let devices: Vec<&str> = spec
        .containers
        .iter()
        .flat_map(|c| c.volume_devices.iter().flatten())
        .map(|d| d.name.as_str())
        .collect();
    spec.volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            let claim = v.persistent_volume_claim.as_ref()?;
            let mode = if devices.contains(&v.name.as_str()) {
                VolumeMode::Block
            } else {
                VolumeMode::Filesystem
            };
            Some(ResolvedPvc::new(claim.claim_name.clone(), mode))
        })
        .collect()
}

fn pods(ctx: &Context, ids: &Ids) -> Api<Pod> {
    Api::namespaced(ctx.client.clone(), &ids.namespace)
}

fn secrets(ctx: &Context, ids: &Ids) -> Api<Secret> {
    Api::namespaced(ctx.client.clone(), &ids.namespace)
}

fn policies(ctx: &Context, ids: &Ids) -> Api<NetworkPolicy> {
    Api::namespaced(ctx.client.clone(), &ids.namespace)
}

/// A fresh bearer token: 32 random bytes as hex.
fn new_token() -> Result<String, Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::NoToken(format!("(no randomness for a new token: {e})")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Creates the token Secret of a mover pod (owned by the resource, so it goes with it),
/// or reads the token of the one an earlier reconcile created.
pub async fn create_token<K: MoverKind>(
    ctx: &Context,
    obj: &K,
    ids: &Ids,
    secret_name: &str,
    pod_name: &str,
) -> Result<(), Error> {
    let token = new_token()?;
    let mut data = BTreeMap::from([(TOKEN_KEY.to_string(), token.clone())]);
    if let Some(ca) = ctx.mover_ca() {
        let issued = ca.issue_mover(pod_name, &ids.namespace)?;
        data.insert(TLS_CERT_KEY.to_string(), issued.cert_pem);
        data.insert(TLS_KEY_KEY.to_string(), issued.key_pem);
        data.insert(CLIENT_CA_KEY.to_string(), ca.cert_pem().to_string());
    }
    let secret = plan::token_secret(obj, ids, secret_name, data);
    match secrets(ctx, ids)
        .create(&PostParams::default(), &secret)
        .await
    {
        Ok(_) => {
            ctx.remember_token(secret_name, &token);
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            read_token(ctx, ids, secret_name).await.map(|_| ())
        }
        Err(e) => Err(e.into()),
    }
}

/// The token of a mover, from memory or its Secret.
pub async fn read_token(ctx: &Context, ids: &Ids, secret_name: &str) -> Result<String, Error> {
    if let Some(token) = ctx.token(secret_name) {
        return Ok(token);
    }
    let secret = secrets(ctx, ids).get(secret_name).await?;
    let token = secret
        .data
        .as_ref()
        .and_then(|d| d.get(TOKEN_KEY))
        .and_then(|ByteString(bytes)| String::from_utf8(bytes.clone()).ok())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Error::NoToken(secret_name.to_string()))?;
    ctx.remember_token(secret_name, &token);
    Ok(token)
}

/// Creates the pod (an existing pod of the same name is the one an earlier reconcile
/// created: names include the attempt). A refusal by admission or validation is returned
/// with the server's message, for the resource's status: only a change to the namespace
/// or the resource cures it.
pub async fn create_pod(ctx: &Context, ids: &Ids, pod: &Pod) -> Result<Created, Error> {
    match pods(ctx, ids).create(&PostParams::default(), pod).await {
        Ok(_) => Ok(Created::Yes),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Created::Yes),
        Err(kube::Error::Api(e)) if claims::refused(e.code) => Ok(Created::Refused(e.message)),
        Err(e) => Err(e.into()),
    }
}

/// Creates the NetworkPolicy admitting the operator to a mover, before the pod: the link
/// can connect as soon as the pod is ready.
pub async fn create_network_policy(
    ctx: &Context,
    ids: &Ids,
    policy: &NetworkPolicy,
) -> Result<Created, Error> {
    match policies(ctx, ids)
        .create(&PostParams::default(), policy)
        .await
    {
        Ok(_) => Ok(Created::Yes),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Created::Yes),
        Err(kube::Error::Api(e)) if claims::refused(e.code) => Ok(Created::Refused(e.message)),
        Err(e) => Err(e.into()),
    }
}

/// Whether the API server took a mover pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// Created (or it existed already under its name).
    Yes,
    /// Refused by admission or validation, with the server's message.
    Refused(String),
}

/// Deletes a mover pod, its token Secret and its NetworkPolicy (any may be gone already).
pub async fn delete_mover(ctx: &Context, ids: &Ids, pod: &str) -> Result<(), Error> {
    let delete = DeleteParams::default();
    gone(pods(ctx, ids).delete(pod, &delete).await.map(|_| ()))?;
    retire_mover(ctx, ids, pod).await
}

/// Whether the mover pod `name` ended in failure (its container exited non-zero): the pod
/// the last attempt of a failed resource keeps, for `kubectl logs`.
pub fn crashed(ctx: &Context, ids: &Ids, name: &str) -> bool {
    let key = ObjectRef::new(name).within(&ids.namespace);
    ctx.pods.get(&key).is_some_and(|p| {
        p.metadata.deletion_timestamp.is_none()
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
            && p.status
                .as_ref()
                .and_then(|s| s.reason.as_deref())
                .is_none()
    })
}

/// A delete's result, a 404 (gone already) counted as done.
fn gone(result: Result<(), kube::Error>) -> Result<(), Error> {
    match result {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes what a mover pod needed to run, its token Secret and its NetworkPolicy, and
/// leaves the pod (an ended pod holds no volume and no mover slot).
pub async fn retire_mover(ctx: &Context, ids: &Ids, pod: &str) -> Result<(), Error> {
    let secret = names::token_secret(pod);
    let delete = DeleteParams::default();
    let mut results = vec![secrets(ctx, ids).delete(&secret, &delete).await.map(|_| ())];
    if ctx.settings.mover_network_policy {
        results.push(policies(ctx, ids).delete(pod, &delete).await.map(|_| ()));
    }
    for result in results {
        gone(result)?;
    }
    ctx.forget_token(&secret);
    // Its slot is no longer reserved: the store counts the pod while it is there, and a
    // mover deleted before the store ever showed it would otherwise hold the slot until
    // the reservation expires.
    ctx.release_slot(&ids.uid);
    Ok(())
}

/// Where the link reaches a ready mover pod.
pub async fn address(ctx: &Context, ids: &Ids, pod: &Pod) -> Result<MoverAddress, Error> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let token = read_token(ctx, ids, &names::token_secret(&name)).await?;
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default();
    Ok(MoverAddress {
        namespace: ids.namespace.clone(),
        pod: name,
        ip,
        port: GRPC_PORT as u16,
        token,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(status: serde_json::Value) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": "m-ft-1"}, "status": status}))
                .unwrap(),
        )
    }

    #[test]
    fn pod_states() {
        let oom = pod(json!({"phase": "Failed", "containerStatuses": [{
            "name": "mover", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}));
        assert!(
            matches!(classify(oom), PodState::Lost(why) if why == "mover pod m-ft-1 stopped: OOMKilled")
        );
        let pulling = pod(json!({"phase": "Pending", "containerStatuses": [{
            "name": "mover", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}));
        assert!(matches!(
            classify(pulling),
            PodState::Starting { why: Some(why), .. } if why == "ImagePullBackOff: Back-off pulling image"
        ));
        let creating = pod(json!({"phase": "Pending", "containerStatuses": [{
            "name": "mover", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}}}]}));
        assert!(matches!(
            classify(creating),
            PodState::Starting {
                why: None,
                created: None,
                ..
            }
        ));
        let crashed = pod(json!({"phase": "Failed", "containerStatuses": [{
            "name": "mover", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "reason": "Error", "message":
                "{\"level\":\"INFO\",\"fields\":{\"message\":\"serving\"}}\n{\"level\":\"ERROR\",\"fields\":{\"message\":\"cannot open the data directory\",\"error\":\"/var/lib/ferry: permission denied\"}}\n"}}}]}));
        assert!(matches!(
            classify(crashed),
            PodState::Lost(why) if why == "mover pod m-ft-1 stopped: Error: cannot open the data directory: /var/lib/ferry: permission denied"
        ));
        let long = "x".repeat(2000);
        let plain = pod(json!({"phase": "Failed", "containerStatuses": [{
            "name": "mover", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 2, "reason": "Error", "message": long}}}]}));
        match classify(plain) {
            PodState::Lost(why) => {
                assert!(
                    why.starts_with("mover pod m-ft-1 stopped: Error: xxx"),
                    "{why}"
                );
                assert_eq!(
                    why.chars().filter(|c| *c == 'x').count(),
                    TERMINATION_MESSAGE_CHARS
                );
                assert!(why.ends_with('…'), "{why}");
            }
            other => panic!("{other:?}"),
        }
        let ready_without_ip = pod(json!({"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}]}));
        assert!(matches!(
            classify(ready_without_ip),
            PodState::Starting { why: None, .. }
        ));
    }
}
