//! The source read once: in a fan-out of several groups, one group's mover serves what it
//! writes (a relay, `ferry_endpoints::relay`) and the other groups read the image from it
//! over the pod network, so the origin (an HTTP server, S3, a registry) serves about one
//! image's bytes however many groups and nodes the rollout has.
//!
//! The plan names the roles once ([`roles`]): the first group with a claim target serves
//! (`spec.relay.serve`), every other group reads through it (`spec.relay.from`). A
//! reading group decides where to read each time it starts a mover ([`decide`]): through
//! the relay while the serving group's mover runs its copy (`nbds://<pod IP>:10810/`,
//! raw, mutual TLS with the movers' own certificates, the server's name checked), and
//! recorded in `status.sourceRelay` for that mover; from the origin once the serving
//! group has ended (a late group, or a retry after the relay went away), so a relay can
//! slow a group down but never fail the rollout. Every group still reports the digest of
//! what it read: the parent fails when two differ (see [`super::children::summarize`]).
//!
//! What a relay needs from the cluster: the movers' mutual TLS (an operator without its
//! CA relays nothing), the seed's NetworkPolicy admitting the fan-out's movers on the
//! relay's port ([`crate::mover::network_policy`]), and pod-to-pod traffic across nodes.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::Action;
use kube::Api;

use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::kind::{write_status, Ids};
use crate::controller::life::HasLife;
use crate::controller::plan as mover_plan;
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

/// The index of the group that serves the relay, when the fan-out relays: several groups,
/// a source that is not a claim (a claim is read from the storage by each group), not
/// turned off (`fanOut.relay: false`), the movers' mutual TLS available (`tls`), and a
/// group with a claim target (what the relay serves from).
pub fn roles(spec: &TransferSpec, planned: &FanOutStatus, tls: bool) -> Option<usize> {
    let off = spec.fan_out.as_ref().and_then(|f| f.relay) == Some(false);
    let from_claim = spec.source.pvc.is_some() || spec.source.golden_image.is_some();
    if off || from_claim || !tls || planned.groups.len() < 2 {
        return None;
    }
    planned.groups.iter().position(|g| {
        g.indices().any(|i| {
            target_at(spec, i).is_some_and(|t| t.pvc_template.is_some() || t.endpoint.pvc.is_some())
        })
    })
}

/// The relay part of group `index` when `seed` serves (named `seed_name`).
pub fn part(index: usize, seed: Option<usize>, seed_name: &str) -> Option<GroupRelay> {
    let seed = seed?;
    Some(if index == seed {
        GroupRelay {
            serve: true,
            from: None,
        }
    } else {
        GroupRelay {
            serve: false,
            from: Some(seed_name.to_string()),
        }
    })
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
    let copying = status.phase == Phase::Running && status.progress.is_some();
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

/// The Transfer as the reconciler should see it.
#[derive(Debug)]
pub enum Resolved {
    /// Reconcile this.
    Ready(Arc<Transfer>),
    /// Done for now.
    Done(Action),
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
    let seed = Api::<Transfer>::namespaced(ctx.client.clone(), &ids.namespace)
        .get_opt(&from)
        .await?;
    let pod_name = seed
        .as_ref()
        .and_then(|s| s.status.as_ref())
        .and_then(|s| s.mover_pod.clone());
    let pod = match pod_name {
        Some(name) => {
            Api::<Pod>::namespaced(ctx.client.clone(), &ids.namespace)
                .get_opt(&name)
                .await?
        }
        None => None,
    };
    let (relay, message) = match decide(&from, seed.as_ref(), pod.as_ref()) {
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
