//! The GoldenImage controller. One reconcile does one step of [`super::plan::next`]:
//!
//! - an import under way: its Transfer read; once it ended, the status records it (the
//!   newest import current, or the failure), the Transfer is deleted (its claim stays),
//!   and the claims of imports beyond `importsToKeep` (or of the failed import) deleted;
//!   an import kept as a snapshot waits for its VolumeSnapshot, saying what the snapshot
//!   controller reports, and fails past [`plan::snapshot_deadline`];
//! - a poll due: the source's version asked ([`super::probe`]; only an HTTP(S) URL
//!   without `http` options is asked: the operator reads no Secret values), and a changed
//!   or unknown version starts an import Transfer into a new claim;
//! - otherwise nothing until the next fire.
//!
//! The GoldenImage owns its import Transfers (their changes wake it); the claims outlive
//! them and the GoldenImage (delete them with kubectl when no longer wanted).

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, DynamicObject, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::kind::apply_status;
use crate::crd::{GoldenImage, GoldenImageStatus, Importing, KeepAs, Transfer};
use crate::schedule::build::{snapshot_state, volume_snapshot_api, SnapshotState};

use super::plan::{self, condition, AfterPoll, Current, Ended, Kept, NotReady, SnapshotWait, Step};
use super::probe;
use super::probe_pod::{self, Asker, Seen};
use super::report::Probed;

/// How often an import under way is looked at when nothing wakes it.
const FOLLOW_AGAIN: Duration = Duration::from_secs(60);
/// How often an import's VolumeSnapshot is looked at until it is ready (snapshots are not
/// watched).
const SNAPSHOT_LOOK: Duration = Duration::from_secs(5);

/// Runs the GoldenImage controller (in `namespace`, or all) until a termination signal.
pub async fn run(client: Client, ctx: Arc<Context>, namespace: Option<String>) {
    let (images, transfers, pods): (Api<GoldenImage>, Api<Transfer>, Api<Pod>) = match &namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client, ns),
        ),
        None => (
            Api::all(client.clone()),
            Api::all(client.clone()),
            Api::all(client),
        ),
    };
    let probes = format!(
        "{}={}",
        crate::mover::pod::labels::COMPONENT,
        crate::mover::pod::PROBE_COMPONENT
    );
    Controller::new(images, watcher::Config::default())
        .owns(
            transfers,
            watcher::Config::default().labels(plan::GOLDEN_IMAGE_UID),
        )
        .owns(pods, watcher::Config::default().labels(&probes))
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "GoldenImage controller");
            }
        })
        .await;
}

fn error_policy(obj: Arc<GoldenImage>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(name = %obj.name_any(), %error, "GoldenImage reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

/// One reconcile of a GoldenImage.
pub async fn reconcile(obj: Arc<GoldenImage>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = obj.namespace().unwrap_or_default();
    let status = obj.status.clone().unwrap_or_default();
    let cron = match obj.spec.validate() {
        Ok(cron) => cron,
        Err(e) => {
            let mut next = status.clone();
            next.observed_generation = obj.metadata.generation;
            let text = format!("{e}: fix the spec");
            plan::set(
                &mut next,
                condition::READY,
                false,
                condition::INVALID_SPEC,
                &text,
            );
            write(&ctx, &obj, &status, &next).await?;
            return Ok(Action::await_change());
        }
    };
    let now = Utc::now();
    let transfers: Api<Transfer> = Api::namespaced(ctx.client.clone(), &namespace);
    match plan::next(&status, now) {
        Step::Wait(at) => {
            let wait = (at - now).to_std().unwrap_or_default();
            Ok(Action::requeue(wait.max(Duration::from_secs(1))))
        }
        Step::Follow(importing) => {
            let snapshots: Api<DynamicObject> =
                Api::namespaced_with(ctx.client.clone(), &namespace, &volume_snapshot_api());
            let mut transfer_left = false;
            let end = match &importing.snapshot {
                // The copy is done; the import ends when its snapshot is ready.
                Some(name) => {
                    let looked =
                        look_at_snapshot(&ctx, &obj, &status, &importing, &snapshots, name, now);
                    match looked.await? {
                        Ok(end) => end,
                        Err(action) => return Ok(action),
                    }
                }
                None => {
                    let transfer = transfers.get_opt(&importing.transfer).await?;
                    let end = plan::ended(transfer.as_ref());
                    if end == Ended::Running {
                        return Ok(Action::requeue(FOLLOW_AGAIN));
                    }
                    transfer_left = transfer.is_some();
                    if end == Ended::Succeeded && obj.spec.keep_as() == KeepAs::Snapshot {
                        let snapshot = plan::import_snapshot(&obj, &importing.claim);
                        match make_snapshot(&snapshots, &obj, &snapshot, &importing.claim).await? {
                            None => {
                                let next = plan::snapshotting(&obj, &status, &importing);
                                write(&ctx, &obj, &status, &next).await?;
                                delete_transfer(&transfers, &importing.transfer).await?;
                                ctx.event(obj.as_ref(), false, "Snapshotting", &progressing(&next))
                                    .await;
                                return Ok(Action::requeue(SNAPSHOT_LOOK));
                            }
                            Some(refused) => Ended::Failed(refused),
                        }
                    } else {
                        end
                    }
                }
            };
            let (next, delete) = plan::after_import(&obj, &status, &importing, &end, now);
            let claims: Api<PersistentVolumeClaim> =
                Api::namespaced(ctx.client.clone(), &namespace);
            for kept in &delete {
                match kept {
                    Kept::Claim(c) => gone(claims.delete(c, &DeleteParams::default()).await)?,
                    Kept::Snapshot(s) => gone(snapshots.delete(s, &DeleteParams::default()).await)?,
                }
            }
            if transfer_left {
                delete_transfer(&transfers, &importing.transfer).await?;
            }
            write(&ctx, &obj, &status, &next).await?;
            let (warning, reason) = match end {
                Ended::Succeeded => (false, "Imported"),
                _ => (true, condition::IMPORT_FAILED),
            };
            ctx.event(obj.as_ref(), warning, reason, &progressing(&next))
                .await;
            Ok(Action::requeue(Duration::ZERO))
        }
        Step::Poll => {
            let next_fire = cron.next_after(now);
            let (version, unversioned) = match ask(&obj, &ctx, &namespace, now).await? {
                Asked::Waiting(action) => return Ok(action),
                Asked::Version(v) => (Some(v), None),
                Asked::Unversioned(why) => (None, Some(why)),
                Asked::Failed(text) => {
                    let next = plan::poll_failed(&obj, &status, &text, now, next_fire);
                    write(&ctx, &obj, &status, &next).await?;
                    ctx.event(obj.as_ref(), true, condition::POLL_FAILED, &text)
                        .await;
                    return Ok(Action::requeue(Duration::ZERO));
                }
            };
            // An unchanged version whose import is gone (deleted by hand) is imported again.
            let mut held = status.clone();
            if version.is_some() && version == status.current_version {
                if let Some(lost) = current_gone(&ctx, &namespace, &status).await? {
                    let note = format!("{lost} is gone: importing the source's version again");
                    ctx.event(obj.as_ref(), true, "CurrentGone", &note).await;
                    held.current_version = None;
                }
            }
            match plan::after_poll(
                &obj,
                &held,
                version.as_deref(),
                unversioned.as_deref(),
                now,
                next_fire,
            ) {
                AfterPoll::Unchanged(next) => {
                    write(&ctx, &obj, &status, &next).await?;
                }
                AfterPoll::Import(transfer, next) => {
                    if let Some(refused) = make_transfer(&transfers, &obj, &transfer).await? {
                        let next = plan::poll_failed(&obj, &status, &refused, now, next_fire);
                        write(&ctx, &obj, &status, &next).await?;
                        ctx.event(obj.as_ref(), true, condition::POLL_FAILED, &refused)
                            .await;
                        return Ok(Action::requeue(Duration::ZERO));
                    }
                    write(&ctx, &obj, &status, &next).await?;
                    ctx.event(
                        obj.as_ref(),
                        false,
                        condition::IMPORTING,
                        &progressing(&next),
                    )
                    .await;
                }
            }
            Ok(Action::requeue(Duration::ZERO))
        }
    }
}

/// What asking the source for its version gave.
enum Asked {
    /// The version.
    Version(String),
    /// No version (every fire imports), and why.
    Unversioned(String),
    /// The source could not be asked: the condition's message.
    Failed(String),
    /// A probe pod runs: look again then.
    Waiting(Action),
}

/// Asks `obj`'s source for its version: the operator itself, anonymously, or a probe pod
/// with the source's credentials ([`probe_pod::asker`]; an S3 store that refuses the
/// anonymous request is asked by a pod too).
async fn ask(
    obj: &GoldenImage,
    ctx: &Context,
    namespace: &str,
    now: chrono::DateTime<Utc>,
) -> Result<Asked, Error> {
    let failed = |e: &dyn std::fmt::Display| {
        Asked::Failed(format!("asking the source for its version: {e}"))
    };
    match probe_pod::asker(&obj.spec.source) {
        Asker::Nobody => Ok(Asked::Unversioned(
            "the version of this kind of URL is not asked".into(),
        )),
        Asker::Pod => ask_by_pod(obj, ctx, namespace, now).await,
        Asker::Operator => match probe::version_of(&obj.spec.source).await {
            Ok(Some(v)) => Ok(Asked::Version(v)),
            Ok(None) => Ok(Asked::Unversioned(
                "the server gives no ETag or Last-Modified".into(),
            )),
            Err(e) if e.denied() && probe_pod::is_s3(&obj.spec.source) => {
                ask_by_pod(obj, ctx, namespace, now).await
            }
            Err(e) => Ok(failed(&e)),
        },
    }
}

/// How often a running probe pod is looked at when nothing wakes the GoldenImage.
const PROBE_LOOK: Duration = Duration::from_secs(5);

/// Asks by the probe pod: creates it when there is none, reads what it reported once it
/// ended and deletes it.
async fn ask_by_pod(
    obj: &GoldenImage,
    ctx: &Context,
    namespace: &str,
    now: chrono::DateTime<Utc>,
) -> Result<Asked, Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let name = probe_pod::pod_name(&obj.name_any());
    let args = probe_pod::args(&obj.spec.source);
    let Some(pod) = pods.get_opt(&name).await? else {
        // The object read may lag behind the status this operator wrote (a poll that just
        // ended): only a poll still due when read afresh makes a pod.
        let images: Api<GoldenImage> = Api::namespaced(ctx.client.clone(), namespace);
        let fresh = images.get_opt(&obj.name_any()).await?;
        let fresh = fresh.and_then(|g| g.status).unwrap_or_default();
        if !matches!(plan::next(&fresh, now), Step::Poll)
            || fresh.last_poll_time != obj.status.clone().unwrap_or_default().last_poll_time
        {
            return Ok(Asked::Waiting(Action::requeue(Duration::from_secs(1))));
        }
        let pod = match probe_pod::pod(obj, &ctx.settings.mover, ctx.assigns_ids(namespace)) {
            Ok(pod) => pod,
            Err(e) => {
                return Ok(Asked::Failed(format!(
                    "the version probe pod cannot be made: {e}"
                )))
            }
        };
        match pods.create(&PostParams::default(), &pod).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        return Ok(Asked::Waiting(Action::requeue(PROBE_LOOK)));
    };
    let due = obj
        .status
        .as_ref()
        .and_then(|s| s.next_poll_time.as_ref())
        .map(crate::schedule::reconcile::from_time);
    let seen = probe_pod::observe(&pod, &args, due, now);
    if seen == Seen::Running {
        return Ok(Asked::Waiting(Action::requeue(PROBE_LOOK)));
    }
    gone(pods.delete(&name, &DeleteParams::background()).await)?;
    Ok(match seen {
        Seen::Running | Seen::Stale => Asked::Waiting(Action::requeue(Duration::ZERO)),
        Seen::Ended(Probed::Version(Some(v))) => Asked::Version(v),
        Seen::Ended(Probed::Version(None)) => Asked::Unversioned(
            "the source names no version (no strong ETag or Last-Modified)".into(),
        ),
        Seen::Ended(Probed::Failed(why)) => Asked::Failed(format!(
            "asking the source for its version (pod {name}): {why}"
        )),
    })
}

/// Looks at the VolumeSnapshot `name` of the import `importing`: how the import ended
/// (ready; deleted; not ready past its deadline, [`plan::snapshot_not_ready`]), or, while
/// it waits, Err(when to look again) once the status says what the snapshot controller
/// reports (and a Warning event says a new error).
async fn look_at_snapshot(
    ctx: &Context,
    obj: &GoldenImage,
    status: &GoldenImageStatus,
    importing: &Importing,
    snapshots: &Api<DynamicObject>,
    name: &str,
    now: chrono::DateTime<Utc>,
) -> Result<Result<Ended, Action>, Error> {
    let Some(snapshot) = snapshots.get_opt(name).await? else {
        return Ok(Ok(Ended::Failed(format!(
            "its VolumeSnapshot {name} was deleted before it was ready"
        ))));
    };
    let error = match snapshot_state(&snapshot) {
        SnapshotState::Ready(_) => return Ok(Ok(Ended::Succeeded)),
        SnapshotState::Pending(error) => error,
    };
    let seen = not_ready(&snapshot, error);
    match plan::snapshot_not_ready(obj, status, importing, &seen, now) {
        SnapshotWait::Expired(why) => Ok(Ok(Ended::Failed(why))),
        SnapshotWait::Waiting(next, warning) => {
            write(ctx, obj, status, &next).await?;
            if let Some(text) = warning {
                ctx.event(obj, true, condition::SNAPSHOT_NOT_READY, &text)
                    .await;
            }
            Ok(Err(Action::requeue(plan::snapshot_look(&seen, now))))
        }
    }
}

/// Whether `meta` carries `obj`'s uid as its [`plan::GOLDEN_IMAGE_UID`] label: an object
/// this GoldenImage made.
fn made_by(meta: &kube::api::ObjectMeta, obj: &GoldenImage) -> bool {
    let uid = obj.metadata.uid.as_deref().unwrap_or_default();
    meta.labels
        .as_ref()
        .and_then(|l| l.get(plan::GOLDEN_IMAGE_UID))
        .is_some_and(|v| !uid.is_empty() && v == uid)
}

/// Creates an import's Transfer. One of that name already there is this very import's
/// when this GoldenImage made it (a poll repeated after a crash, or on a stale read:
/// [`plan::import_name`] gives each import a name of its own and never a kept import's),
/// and is adopted; one made by anything else is never used: Some(why).
async fn make_transfer(
    transfers: &Api<Transfer>,
    obj: &GoldenImage,
    transfer: &Transfer,
) -> Result<Option<String>, Error> {
    match transfers.create(&PostParams::default(), transfer).await {
        Ok(_) => Ok(None),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let name = transfer.metadata.name.clone().unwrap_or_default();
            match transfers.get_opt(&name).await? {
                Some(t) if made_by(&t.metadata, obj) => Ok(None),
                _ => Ok(Some(format!(
                    "cannot start an import: Transfer {name} exists and was not made by this GoldenImage (no label {}={}); the next poll imports under another name",
                    plan::GOLDEN_IMAGE_UID,
                    obj.metadata.uid.clone().unwrap_or_default()
                ))),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Creates an import's VolumeSnapshot of `claim`. One of that name already there is
/// adopted only when this GoldenImage made it of that claim (the import's own, left by
/// a crash before the status recorded it); else Some(why the import fails) and it is
/// left alone.
async fn make_snapshot(
    snapshots: &Api<DynamicObject>,
    obj: &GoldenImage,
    snapshot: &DynamicObject,
    claim: &str,
) -> Result<Option<String>, Error> {
    let name = snapshot.metadata.name.clone().unwrap_or_default();
    // Twice: one that exists at the create and is gone at the read was deleted meanwhile.
    for _ in 0..2 {
        match snapshots.create(&PostParams::default(), snapshot).await {
            Ok(_) => return Ok(None),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let Some(found) = snapshots.get_opt(&name).await? else {
                    continue;
                };
                let ours = made_by(&found.metadata, obj)
                    && found.data["spec"]["source"]["persistentVolumeClaimName"].as_str()
                        == Some(claim);
                return Ok((!ours).then(|| {
                    format!("VolumeSnapshot {name} exists and is not this import's snapshot of pvc/{claim}: it is left alone")
                }));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(format!(
        "VolumeSnapshot {name} was there at each create and gone at each read: something deletes it"
    )))
}

/// What `snapshot`, not ready, shows: its creation, whether a content is bound to it,
/// the snapshot controller's `error` and since when (`status.error.time`).
fn not_ready(snapshot: &DynamicObject, error: Option<String>) -> NotReady {
    let error_since = snapshot.data["status"]["error"]["time"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc));
    NotReady {
        created: snapshot
            .metadata
            .creation_timestamp
            .as_ref()
            .map(crate::schedule::reconcile::from_time),
        cut: snapshot.data["status"]["boundVolumeSnapshotContentName"]
            .as_str()
            .is_some_and(|c| !c.is_empty()),
        error,
        error_since,
    }
}

/// The current import's object, shown, when it is gone (or being deleted).
async fn current_gone(
    ctx: &Context,
    namespace: &str,
    status: &GoldenImageStatus,
) -> Result<Option<String>, Error> {
    let deleted = |meta: &kube::api::ObjectMeta| meta.deletion_timestamp.is_some();
    let Some(current) = plan::current(status) else {
        return Ok(None);
    };
    let gone = match &current {
        Current::Claim(name) => {
            let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
            claims
                .get_opt(name)
                .await?
                .is_none_or(|c| deleted(&c.metadata))
        }
        Current::Snapshot(name) => {
            let snapshots: Api<DynamicObject> =
                Api::namespaced_with(ctx.client.clone(), namespace, &volume_snapshot_api());
            snapshots
                .get_opt(name)
                .await?
                .is_none_or(|s| deleted(&s.metadata))
        }
    };
    Ok(gone.then(|| current.shown()))
}

/// Deletes an import's Transfer (its claim stays: `claimRetention: Retain`).
async fn delete_transfer(transfers: &Api<Transfer>, name: &str) -> Result<(), Error> {
    gone(transfers.delete(name, &DeleteParams::background()).await)
}

/// A delete whose object is already gone succeeded.
fn gone<T>(result: Result<T, kube::Error>) -> Result<(), Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Writes `next` when it differs from `before`.
async fn write(
    ctx: &Context,
    obj: &GoldenImage,
    before: &GoldenImageStatus,
    next: &GoldenImageStatus,
) -> Result<(), Error> {
    if crate::controller::life::same_status(before, next) {
        return Ok(());
    }
    let namespace = obj.namespace().unwrap_or_default();
    apply_status::<GoldenImage>(ctx, &namespace, &obj.name_any(), obj, next).await?;
    Ok(())
}

/// The Progressing condition's message (what an event repeats).
fn progressing(status: &GoldenImageStatus) -> String {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::PROGRESSING)
        .map(|c| c.message.clone())
        .unwrap_or_default()
}
