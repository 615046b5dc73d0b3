//! The source read once: in a fan-out of several groups, one group's mover reads the
//! origin and serves what it writes (a relay, `ferry_endpoints::relay`), and the other
//! groups read the image from relays over the pod network, so the origin (an HTTP server,
//! S3, a registry) serves about one image's bytes however many groups and nodes the
//! rollout has.
//!
//! The plan names the roles once ([`roles`]): the groups form a tree of relays, each
//! serving at most [`READERS_PER_RELAY`] others (`spec.relay.serve`, `spec.relay.from`),
//! so no mover's network sends the image more than a few times. A reading group decides
//! where to read each time it starts a mover ([`decide`]): through its parent's relay
//! while that mover runs its copy (`nbds://<pod IP>:10810/`, raw, mutual TLS with the
//! movers' own certificates, the server's name checked), recorded in
//! `status.sourceRelay` for that mover; from the origin once the parent group has ended
//! (a late group, or a retry after the relay went away), so a relay can slow a group down
//! but never fail the rollout. Every group still reports the digest of what it read: the
//! parent fails when two differ (see [`super::children::summarize`]).
//!
//! A serving group's relay waits a while for readers that start late; once every group
//! that reads from it has ended, the operator tells its mover that no reader is still to
//! come ([`end_served_out`]), so it ends without waiting.
//!
//! What a relay needs from the cluster: the movers' mutual TLS (an operator without its
//! CA relays nothing), the serving mover's NetworkPolicy admitting the fan-out's movers on
//! the relay's port ([`crate::mover::network_policy`]), and pod-to-pod traffic across
//! nodes.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::Api;

use crate::clone::reconcile::Resolved;
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::kind::{write_status, Ids};
use crate::controller::life::HasLife;
use crate::controller::plan as mover_plan;
use crate::crd::status::condition::{reason, RUNNING};
use std::collections::BTreeMap;

use crate::crd::{
    Endpoint, FanOutStatus, GroupRelay, ImageFormat, NbdOptions, Phase, Transfer, TransferSpec,
};
use crate::mover::layout::RELAY_PORT;
use crate::mover::tls::mover_server_name;

use super::children::target_at;

/// How often a group waiting for its relay looks again.
const WAIT: Duration = Duration::from_secs(5);

/// The Pending reason of a group waiting for the relay's mover.
pub const WAITING_FOR_RELAY: &str = "WaitingForRelay";

/// How many groups read from one relay at most: the groups form a tree of this degree, so
/// no mover sends the image more than this many times however large the rollout.
pub const READERS_PER_RELAY: usize = 4;

/// Each group's part in reading the source once, by group index, when the fan-out relays:
/// several groups, a source that is not a claim (a claim is read from the storage by each
/// group), not turned off (`fanOut.relay: false`), the movers' mutual TLS available
/// (`tls`), and a group with a claim target (what a relay serves from).
///
/// The groups with a claim target form a tree in plan order, [`READERS_PER_RELAY`] readers
/// per relay: the first reads the origin and serves, each other one reads the relay of its
/// parent and serves those after it. The planner puts earlier groups in earlier rounds, so
/// a parent starts no later than its readers. Groups without a claim (only URLs) read the
/// root's relay and serve nothing.
pub fn roles(spec: &TransferSpec, planned: &FanOutStatus, tls: bool) -> Vec<Option<GroupRelay>> {
    let mut parts = vec![None; planned.groups.len()];
    let off = spec.fan_out.as_ref().and_then(|f| f.relay) == Some(false);
    let from_claim = spec.source.pvc.is_some() || spec.source.golden_image.is_some();
    if off || from_claim || !tls || planned.groups.len() < 2 {
        return parts;
    }
    let claim = |g: &crate::crd::GroupStatus| {
        g.indices().any(|i| {
            target_at(spec, i).is_some_and(|t| t.pvc_template.is_some() || t.endpoint.pvc.is_some())
        })
    };
    let servers: Vec<usize> = (0..planned.groups.len())
        .filter(|&i| claim(&planned.groups[i]))
        .collect();
    let Some(&root) = servers.first() else {
        return parts;
    };
    let name = |i: usize| planned.groups[i].name.clone();
    for (position, &group) in servers.iter().enumerate() {
        let from = (position > 0).then(|| name(servers[(position - 1) / READERS_PER_RELAY]));
        let serve = servers.len() > position * READERS_PER_RELAY + 1;
        parts[group] = (serve || from.is_some()).then_some(GroupRelay { serve, from });
    }
    for (i, part) in parts.iter_mut().enumerate() {
        if part.is_none() && !servers.contains(&i) {
            *part = Some(GroupRelay {
                serve: false,
                from: Some(name(root)),
            });
        }
    }
    parts
}

/// How the groups read the source, for render and events: "the origin is read once, by
/// `root`, ..." or by every group.
pub fn describe(planned: &FanOutStatus, parts: &[Option<GroupRelay>]) -> String {
    let root = parts
        .iter()
        .position(|p| p.as_ref().is_some_and(|p| p.serve && p.from.is_none()));
    match root {
        Some(root) => {
            let relays = parts.iter().flatten().filter(|p| p.serve).count();
            format!(
                "the origin is read once, by {}, and relayed to the other {} groups by {relays} relays ({READERS_PER_RELAY} readers each)",
                planned.groups[root].name,
                planned.groups.len() - 1
            )
        }
        None => format!("the origin is read by {} movers", planned.groups.len()),
    }
}

/// The serving groups whose mover runs and whose readers (the groups reading `from` them)
/// have all ended: their relays need wait for nobody.
pub fn served_out<'a>(children: &BTreeMap<String, &'a Transfer>) -> Vec<&'a Transfer> {
    let serving = children.iter().filter(|(_, c)| {
        let status = c.status.as_ref();
        c.spec.relay.as_ref().is_some_and(|r| r.serve)
            && status.is_some_and(|s| s.phase == Phase::Running && s.mover_pod.is_some())
    });
    serving
        .filter(|(name, _)| {
            children
                .values()
                .filter(|r| r.spec.relay.as_ref().and_then(|p| p.from.as_ref()) == Some(*name))
                .all(|r| r.status.as_ref().is_some_and(|s| s.phase.is_final()))
        })
        .map(|(_, c)| *c)
        .collect()
}

/// Tells the movers of [`served_out`] groups that no reader is still to come, once per
/// mover; a mover that cannot be told now is told on a later look.
pub async fn end_served_out(ctx: &Context, children: &BTreeMap<String, &Transfer>) {
    for seed in served_out(children) {
        let Ok(ids) = Ids::of(seed) else { continue };
        let Some(pod_name) = seed.status.as_ref().and_then(|s| s.mover_pod.clone()) else {
            continue;
        };
        if !ctx.relay_ending(&ids.uid, &pod_name) {
            continue;
        }
        let key = ObjectRef::new(&pod_name).within(&ids.namespace);
        let told = match ctx.pods.get(&key) {
            Some(pod) => match crate::controller::pods::address(ctx, &ids, &pod).await {
                Ok(mover) => ctx
                    .link
                    .end_relay(&mover, &ids.uid)
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            },
            None => Err("its pod is not in the store yet".to_string()),
        };
        match told {
            Ok(()) => tracing::info!(group = %ids.name, "every reader is done: the relay ends"),
            Err(e) => {
                tracing::warn!(group = %ids.name, error = %e, "the relay could not be told its readers are done");
                ctx.relay_not_ended(&ids.uid, &pod_name);
            }
        }
    }
}

/// Where a reading group's next mover reads the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Through the relay at this URL.
    Relay(String),
    /// Not yet: the serving group's mover has not started its copy.
    Wait(String),
    /// From the origin, and why.
    Origin(String),
}

/// Decides from the serving group (`seed`, the Transfer named `name`) and its mover pod.
pub fn decide(name: &str, seed: Option<&Transfer>, pod: Option<&Pod>) -> Decision {
    let Some(seed) = seed else {
        return Decision::Origin(format!("the relay's group {name} does not exist"));
    };
    let status = seed.status.clone().unwrap_or_default();
    if status.phase.is_final() {
        return Decision::Origin(format!(
            "the relay's group {name} has ended ({:?})",
            status.phase
        ));
    }
    let waiting = || {
        Decision::Wait(format!(
            "waiting for group {name}'s mover to serve the image"
        ))
    };
    // The job (and its relay, which binds as the job opens its targets) starts right
    // after MoverRunning is written; a reader's own mover takes longer than that to start.
    let copying = status.phase == Phase::Running
        && status
            .conditions
            .iter()
            .any(|c| c.type_ == RUNNING && c.status == "True" && c.reason == reason::MOVER_RUNNING);
    let Some(pod) = pod.filter(|_| copying) else {
        return waiting();
    };
    let pod_status = pod.status.clone().unwrap_or_default();
    let ready = pod_status.phase.as_deref() == Some("Running")
        && pod_status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
    let (Some(ip), Some(pod_name), Some(namespace), true) = (
        pod_status.pod_ip.as_deref(),
        pod.metadata.name.as_deref(),
        pod.metadata.namespace.as_deref(),
        ready,
    ) else {
        return waiting();
    };
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    Decision::Relay(format!(
        "nbds://{host}:{RELAY_PORT}/?tls-hostname={}",
        mover_server_name(pod_name, namespace)
    ))
}

/// The source of a group reading through the relay at `url`: the image raw (the relay
/// serves it decoded), the mover's own certificate.
pub fn through(url: &str) -> Endpoint {
    Endpoint {
        url: Some(url.to_string()),
        format: Some(ImageFormat::Raw),
        nbd: Some(NbdOptions {
            tls_secret_name: None,
            mover_certificate: Some(true),
        }),
        ..Endpoint::default()
    }
}

/// `obj` as its mover should see it: its source through the relay recorded in its status.
pub fn with_relay(obj: &Transfer) -> Transfer {
    let mut t = obj.clone();
    if let Some(url) = obj.status.as_ref().and_then(|s| s.source_relay.as_deref()) {
        t.spec.source = through(url);
    }
    t
}

/// Resolves a reading group's source: while a mover runs, what its status recorded; before
/// the next mover starts, decided again (and recorded when it changed).
pub async fn resolve(obj: Arc<Transfer>, ctx: &Context) -> Result<Resolved, Error> {
    let Some(from) = obj.spec.relay.as_ref().and_then(|r| r.from.clone()) else {
        return Ok(Resolved::Ready(obj));
    };
    let status = obj.status.clone().unwrap_or_default();
    if status.mover_pod.is_some()
        || obj.metadata.deletion_timestamp.is_some()
        || status.phase.is_final()
        || obj.spec.validate().is_err()
    {
        return Ok(Resolved::Ready(Arc::new(with_relay(&obj))));
    }
    let ids = Ids::of(obj.as_ref())?;
    // From the controller's stores (the Transfers', the mover pods'): hundreds of waiting
    // groups look every few seconds; an API read only where no store was set.
    let seed_key = ObjectRef::new(&from).within(&ids.namespace);
    let seed = match ctx.transfers() {
        Some(store) => store.get(&seed_key),
        None => Api::<Transfer>::namespaced(ctx.client.clone(), &ids.namespace)
            .get_opt(&from)
            .await?
            .map(Arc::new),
    };
    let pod_name = seed
        .as_ref()
        .and_then(|s| s.status.as_ref())
        .and_then(|s| s.mover_pod.clone());
    let pod = pod_name.and_then(|name| ctx.pods.get(&ObjectRef::new(&name).within(&ids.namespace)));
    let (relay, message) = match decide(&from, seed.as_deref(), pod.as_deref()) {
        Decision::Wait(why) => {
            let next = mover_plan::waiting(obj.as_ref(), &status, WAITING_FOR_RELAY, &why);
            if next.life() != status.life() {
                write_status(ctx, &ids, obj.as_ref(), &next).await?;
            }
            return Ok(Resolved::Done(Action::requeue(WAIT)));
        }
        Decision::Relay(url) => (Some(url), None),
        Decision::Origin(why) => (None, Some(why)),
    };
    if status.source_relay != relay {
        let mut next = status.clone();
        next.source_relay = relay;
        write_status(ctx, &ids, obj.as_ref(), &next).await?;
        if let Some(why) = message {
            let text = format!("reading the source itself: {why}");
            ctx.event(obj.as_ref(), false, "RelayEnded", &text).await;
        }
        return Ok(Resolved::Done(Action::requeue(Duration::ZERO)));
    }
    Ok(Resolved::Ready(Arc::new(with_relay(&obj))))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::crd::GroupStatus;

    fn group(name: &str, relay: serde_json::Value, status: serde_json::Value) -> Transfer {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": name, "namespace": "vms", "uid": format!("u-{name}")},
            "spec": {"source": {"url": "https://h/i.qcow2"}, "targets": [], "relay": relay},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_relay_is_served_out_when_every_group_reading_it_has_ended() {
        let running = json!({"phase": "Running", "moverPod": "p"});
        let tree = |g1: &str, g3: &str| {
            vec![
                group("g0", json!({"serve": true}), running.clone()),
                group(
                    "g1",
                    json!({"serve": true, "from": "g0"}),
                    json!({"phase": g1, "moverPod": "p1"}),
                ),
                group("g2", json!({"from": "g0"}), json!({"phase": "Succeeded"})),
                group("g3", json!({"from": "g1"}), json!({"phase": g3})),
                // Serving, but its mover has not started: nothing to tell.
                group("g4", json!({"serve": true}), json!({"phase": "Pending"})),
            ]
        };
        let served_out_of = |groups: &[Transfer]| {
            let views: BTreeMap<String, &Transfer> = groups
                .iter()
                .map(|g| (g.metadata.name.clone().unwrap(), g))
                .collect();
            served_out(&views)
                .into_iter()
                .map(|g| g.metadata.name.clone().unwrap())
                .collect::<Vec<_>>()
        };
        assert!(served_out_of(&tree("Running", "Running")).is_empty());
        assert_eq!(served_out_of(&tree("Running", "Failed")), ["g1"]);
        // g1 ended: g0's readers are all done (g1's own relay ended with it).
        assert_eq!(served_out_of(&tree("Succeeded", "Succeeded")), ["g0"]);
    }

    fn parent(source: serde_json::Value, fan_out: serde_json::Value) -> Transfer {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": "fleet", "namespace": "vms", "uid": "p-1"},
            "spec": {
                "source": source,
                "targets": [{"url": "nbd://backup.example.com/golden"}],
                "pvcTemplates": {"namePrefix": "vm-", "count": 4, "size": "10Gi"},
                "fanOut": fan_out,
            },
        }))
        .unwrap()
    }

    fn groups(ranges: &[[u32; 2]]) -> FanOutStatus {
        FanOutStatus {
            groups: ranges
                .iter()
                .enumerate()
                .map(|(i, r)| GroupStatus {
                    name: format!("fleet-g{i}"),
                    node: Some(format!("node-{i}")),
                    targets: vec![*r],
                    phase: Phase::Pending,
                })
                .collect(),
            ..FanOutStatus::default()
        }
    }

    #[test]
    fn the_groups_with_claims_form_a_tree_of_relays_unless_the_source_is_a_claim_or_relay_is_off() {
        let url = json!({"url": "https://images.example.com/golden.qcow2"});
        let p = parent(url.clone(), json!({}));
        // Group 0 writes only the URL target (index 0); groups 1 to 6 write claims.
        let planned = groups(&[[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7]]);
        let part = |serve: bool, from: Option<&str>| {
            Some(GroupRelay {
                serve,
                from: from.map(String::from),
            })
        };
        let mut p7 = p.clone();
        p7.spec.pvc_templates.as_mut().unwrap().count = 6;
        assert_eq!(
            roles(&p7.spec, &planned, true),
            [
                part(false, Some("fleet-g1")),
                part(true, None),
                part(true, Some("fleet-g1")),
                part(false, Some("fleet-g1")),
                part(false, Some("fleet-g1")),
                part(false, Some("fleet-g1")),
                part(false, Some("fleet-g2")),
            ]
        );
        assert_eq!(
            describe(&planned, &roles(&p7.spec, &planned, true)),
            "the origin is read once, by fleet-g1, and relayed to the other 6 groups by 2 relays (4 readers each)"
        );
        // Without the movers' TLS, with one group, turned off, or from a claim: none.
        let none = vec![None; 7];
        assert_eq!(roles(&p7.spec, &planned, false), none);
        assert_eq!(roles(&p.spec, &groups(&[[0, 5]]), true), [None]);
        let off = parent(url, json!({"relay": false}));
        assert_eq!(roles(&off.spec, &planned, true), none);
        let claim = parent(json!({"pvc": {"name": "golden"}}), json!({}));
        assert_eq!(roles(&claim.spec, &planned, true), none);
        assert_eq!(describe(&planned, &none), "the origin is read by 7 movers");
    }

    fn seed(phase: &str, mover: Option<&str>, running: bool) -> Transfer {
        let mut status = json!({"phase": phase});
        if let Some(m) = mover {
            status["moverPod"] = json!(m);
        }
        if running {
            status["conditions"] = json!([{"type": "Running", "status": "True",
                "reason": "MoverRunning", "message": "", "lastTransitionTime": "2026-12-06T08:00:00Z"}]);
        }
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": "fleet-g1", "namespace": "vms"},
            "spec": {"source": {"url": "https://x/y"}, "targets": [{"url": "nbd://h/e"}],
                     "relay": {"serve": true}},
            "status": status,
        }))
        .unwrap()
    }

    fn pod(ip: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "fleet-g1-ft-1", "namespace": "vms"},
            "status": {
                "phase": "Running", "podIP": ip,
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_group_reads_the_relay_only_while_the_seed_copies() {
        let running = seed("Running", Some("fleet-g1-ft-1"), true);
        assert_eq!(
            decide("fleet-g1", Some(&running), Some(&pod("10.1.2.3", true))),
            Decision::Relay(
                "nbds://10.1.2.3:10810/?tls-hostname=fleet-g1-ft-1.vms.mover.ferry.dev".into()
            )
        );
        assert_eq!(
            decide("fleet-g1", Some(&running), Some(&pod("fd00::7", true))),
            Decision::Relay(
                "nbds://[fd00::7]:10810/?tls-hostname=fleet-g1-ft-1.vms.mover.ferry.dev".into()
            )
        );
        let wait = Decision::Wait("waiting for group fleet-g1's mover to serve the image".into());
        assert_eq!(
            decide("fleet-g1", Some(&running), Some(&pod("10.1.2.3", false))),
            wait
        );
        let starting = seed("Running", Some("fleet-g1-ft-1"), false);
        assert_eq!(
            decide("fleet-g1", Some(&starting), Some(&pod("10.1.2.3", true))),
            wait
        );
        assert_eq!(
            decide("fleet-g1", Some(&seed("Pending", None, false)), None),
            wait
        );
        assert_eq!(
            decide("fleet-g1", Some(&seed("Succeeded", None, true)), None),
            Decision::Origin("the relay's group fleet-g1 has ended (Succeeded)".into())
        );
        assert_eq!(
            decide("fleet-g1", None, None),
            Decision::Origin("the relay's group fleet-g1 does not exist".into())
        );
    }

    #[test]
    fn the_recorded_relay_becomes_a_raw_source_with_the_movers_certificate() {
        let mut t = seed("Running", Some("g2-ft-1"), true);
        t.spec.relay = Some(GroupRelay {
            serve: false,
            from: Some("fleet-g1".into()),
        });
        assert_eq!(with_relay(&t).spec.source, t.spec.source);
        t.status.as_mut().unwrap().source_relay = Some("nbds://10.1.2.3:10810/".into());
        let source = serde_json::to_value(with_relay(&t).spec.source).unwrap();
        assert_eq!(
            source,
            json!({"url": "nbds://10.1.2.3:10810/", "format": "raw",
                   "nbd": {"moverCertificate": true}})
        );
        with_relay(&t).spec.validate().unwrap();
    }
}
