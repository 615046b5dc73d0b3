//! The populator's state machine for one user claim, re-entered from the top on every
//! reconcile (every step is idempotent, so a restarted operator continues where the last
//! one stopped):
//! 1. a claim that does not name a VolumeImageSource is ignored, with no request;
//! 2. a claim with a volume is finished: [`super::rebind::finish`] cleans up;
//! 3. wait for the VolumeImageSource (a Pending event while it is missing);
//! 4. create the prime claim, after the storage class allows it (WaitForFirstConsumer:
//!    once the scheduler picked a node, and pinned there);
//! 5. create the Transfer filling the prime claim; tell its progress on the claim;
//! 6. once it succeeded, [`super::rebind::rebind`] hands the prime's volume over.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::Api;

use crate::crd::{Backup, BackupSchedule, Phase, Restore, Transfer, VolumeImageSource};

use super::build::{self, ClaimIds};
use super::context::Context;
use super::error::Error;
use super::mirror::{self, Filler};
use super::plan::{self, Placement};
use super::source::SourceKind;
use super::{clone, names, rebind, source};

/// How long a claim waits before looking again at what no watch reports (a storage
/// class, a volume, a conflicting Transfer someone else owns).
pub const RECHECK: Duration = Duration::from_secs(60);

/// A step's result: go on with this, or stop here and come back as the action says.
enum Step<T> {
    Go(T),
    Wait(Action),
}

/// Reconciles one claim (see the module docs).
pub async fn reconcile(
    pvc: Arc<PersistentVolumeClaim>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let Some(source) = source::of(&pvc) else {
        return Ok(Action::await_change());
    };
    let ids = ClaimIds::of(&pvc).ok_or(Error::NotStored)?;
    if pvc.metadata.deletion_timestamp.is_some() {
        // The prime claim and the Transfer are owned by the claim: the garbage collector
        // removes them.
        ctx.forget(&ids.uid);
        return Ok(Action::await_change());
    }
    if let Some(other) = source
        .namespace
        .as_deref()
        .filter(|ns| *ns != ids.namespace)
    {
        let kind = source.kind.name();
        let note = format!(
            "{kind} {other}/{} is in another namespace: ferry populates only from a {kind} in the claim's namespace ({})",
            source.name, ids.namespace
        );
        ctx.event(&pvc, true, "CrossNamespaceSource", &note).await;
        return Ok(Action::await_change());
    }
    if pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty())
    {
        return rebind::finish(&ctx, &pvc, &ids).await;
    }
    match source.kind {
        SourceKind::Image => populate(&ctx, &pvc, &ids, &source.name).await,
        SourceKind::Backup => restore_backup(&ctx, &pvc, &ids, &source.name).await,
        SourceKind::Schedule => restore_schedule(&ctx, &pvc, &ids, &source.name).await,
    }
}

/// A claim naming a Backup: once the Backup succeeded, a Restore of its snapshot.
async fn restore_backup(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
    backup_name: &str,
) -> Result<Action, Error> {
    let backups: Api<Backup> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    let found = backups.get_opt(backup_name).await?;
    if let Some(note) = plan::backup_problem(backup_name, &ids.namespace, found.as_ref()) {
        ctx.event(pvc, note.warning, note.reason, &note.text).await;
        // The watch of Backups wakes the claim when it appears or ends.
        return Ok(Action::await_change());
    }
    let Some(backup) = found else {
        return Ok(Action::await_change());
    };
    restore(ctx, pvc, ids, &build::restore(ids, &backup), backup_name).await
}

/// A claim naming a BackupSchedule: once the schedule made a successful backup, a
/// Restore of the newest snapshot of its claim (as its mover finds it).
async fn restore_schedule(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
    name: &str,
) -> Result<Action, Error> {
    let schedules: Api<BackupSchedule> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    let found = schedules.get_opt(name).await?;
    let Some(latest) = (match plan::schedule_source(name, &ids.namespace, found.as_ref()) {
        Ok(latest) => Some(latest),
        Err(note) => {
            ctx.event(pvc, note.warning, note.reason, &note.text).await;
            None
        }
    }) else {
        // Schedules are not watched: look again.
        return Ok(Action::requeue(RECHECK));
    };
    let mover = found.and_then(|s| s.spec.mover);
    let restore_of = build::restore_latest(ids, &latest, mover);
    restore(ctx, pvc, ids, &restore_of, name).await
}

/// The prime claim and `restore_of` writing into it; then the same hand-over as for an
/// image (`source_name`: what the claim names, for the events).
async fn restore(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
    restore_of: &Restore,
    source_name: &str,
) -> Result<Action, Error> {
    let prime_name = names::prime(&ids.uid);
    let prime = match ctx.claim(&ids.namespace, &prime_name) {
        Some(prime) => prime,
        None => match create_prime(ctx, pvc, ids).await? {
            Step::Go(prime) => Arc::new(prime),
            Step::Wait(action) => return Ok(action),
        },
    };
    let restore = match ensure_restore(ctx, pvc, ids, restore_of).await? {
        Step::Go(restore) => restore,
        Step::Wait(action) => return Ok(action),
    };
    tell(ctx, pvc, ids, restore.as_ref(), &prime_name).await?;
    match restore.status.as_ref().map(|s| s.phase) {
        Some(Phase::Succeeded) => rebind::rebind(ctx, pvc, ids, &prime, source_name).await,
        _ => Ok(Action::await_change()),
    }
}

/// The claim's Restore, as [`ensure_transfer`] finds or creates a Transfer.
async fn ensure_restore(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
    restore_of: &Restore,
) -> Result<Step<Arc<Restore>>, Error> {
    let name = names::transfer(&ids.name);
    let existing = match ctx.restore(&ids.namespace, &name) {
        Some(r) => Some(r),
        None => {
            let api: Api<Restore> = Api::namespaced(ctx.client.clone(), &ids.namespace);
            match api.create(&PostParams::default(), restore_of).await {
                Ok(_) => {
                    let note = format!(
                        "created Restore {name} to restore the backup into pvc/{}",
                        names::prime(&ids.uid)
                    );
                    ctx.event(pvc, false, "RestoreCreated", &note).await;
                    return Ok(Step::Wait(Action::await_change()));
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    api.get_opt(&name).await?.map(Arc::new)
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    match existing {
        Some(r) if build::owned_by(r.as_ref(), &ids.uid) => Ok(Step::Go(r)),
        _ => {
            let note = format!(
                "Restore {name} exists and does not fill this claim: delete or rename it; the claim waits"
            );
            ctx.event(pvc, true, "RestoreConflict", &note).await;
            Ok(Step::Wait(Action::requeue(RECHECK)))
        }
    }
}

async fn populate(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
    source_name: &str,
) -> Result<Action, Error> {
    let sources: Api<VolumeImageSource> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    let found = sources.get_opt(source_name).await?;
    if let Some(note) = plan::image_source_problem(source_name, &ids.namespace, found.as_ref()) {
        ctx.event(pvc, note.warning, note.reason, &note.text).await;
        // The watch of VolumeImageSources wakes the claim when it appears or changes.
        return Ok(Action::await_change());
    }
    let Some(source) = found else {
        return Ok(Action::await_change());
    };
    if let Some(action) = clone::populate(ctx, pvc, ids, &source, source_name).await? {
        return Ok(action);
    }
    let transfer_of = match build::image_filler(ids, &source) {
        build::ImageFiller::Transfer(transfer) => transfer,
        build::ImageFiller::Restore(restore_of) => {
            return restore(ctx, pvc, ids, &restore_of, source_name).await
        }
    };
    let prime_name = names::prime(&ids.uid);
    let prime = match ctx.claim(&ids.namespace, &prime_name) {
        Some(prime) => prime,
        None => match create_prime(ctx, pvc, ids).await? {
            Step::Go(prime) => Arc::new(prime),
            Step::Wait(action) => return Ok(action),
        },
    };
    let transfer = match ensure_transfer(ctx, pvc, ids, &transfer_of).await? {
        Step::Go(transfer) => transfer,
        Step::Wait(action) => return Ok(action),
    };
    tell(ctx, pvc, ids, transfer.as_ref(), &prime_name).await?;
    match transfer.status.as_ref().map(|s| s.phase) {
        Some(Phase::Succeeded) => rebind::rebind(ctx, pvc, ids, &prime, source_name).await,
        // Failed or Cancelled: the prime claim stays for inspection; the Transfer retried
        // as its own policy says. Deleting it makes the next reconcile create a new one.
        _ => Ok(Action::await_change()),
    }
}

/// Where the prime claim of `pvc` may be provisioned: its storage class read, then
/// [`plan::placement`].
async fn placement(ctx: &Context, pvc: &PersistentVolumeClaim) -> Result<Placement, Error> {
    let Some(class) = plan::class_of(pvc) else {
        return Ok(plan::placement(pvc, None));
    };
    let classes: Api<StorageClass> = Api::all(ctx.client.clone());
    let found = classes.get_opt(class).await?;
    Ok(plan::placement(pvc, Some(found.as_ref())))
}

/// The node the prime claim of `pvc` is pinned to (None: anywhere), or the action while
/// it may not be created yet (an event says why when the user must act).
pub(super) async fn prime_placement(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
) -> Result<Result<Option<String>, Action>, Error> {
    Ok(match placement(ctx, pvc).await? {
        Placement::Anywhere => Ok(None),
        Placement::Node(node) => Ok(Some(node)),
        Placement::NoClass(note) => {
            ctx.event(pvc, note.warning, note.reason, &note.text).await;
            Err(Action::requeue(RECHECK))
        }
        // The scheduler annotates the claim once a pod using it has a node; that update
        // wakes the claim.
        Placement::NoNode => Err(Action::await_change()),
    })
}

/// Creates the prime claim, or says how long to wait before it may be.
async fn create_prime(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
) -> Result<Step<PersistentVolumeClaim>, Error> {
    let node = match prime_placement(ctx, pvc).await? {
        Ok(node) => node,
        Err(action) => return Ok(Step::Wait(action)),
    };
    let overhead = ctx.class_defaults.overhead_ppm(plan::class_of(pvc));
    let prime = build::prime_claim_sized(pvc, ids, node.as_deref(), Some(overhead));
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    match api.create(&PostParams::default(), &prime).await {
        Ok(created) => {
            let name = names::prime(&ids.uid);
            let place = node.map(|n| format!(" on node {n}")).unwrap_or_default();
            let note = format!("created prime claim pvc/{name}{place} to fill with the image");
            ctx.event(pvc, false, "PrimeCreated", &note).await;
            Ok(Step::Go(created))
        }
        // Created by an earlier reconcile the store has not seen yet.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Step::Go(prime)),
        Err(e) => Err(e.into()),
    }
}

/// The claim's Transfer, or what to do while there is none to follow: just created
/// (its watch wakes the claim) or a Transfer of that name that belongs to something else.
async fn ensure_transfer(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
    transfer_of: &Transfer,
) -> Result<Step<Arc<Transfer>>, Error> {
    let name = names::transfer(&ids.name);
    let existing = match ctx.transfer(&ids.namespace, &name) {
        Some(t) => Some(t),
        None => {
            let api: Api<Transfer> = Api::namespaced(ctx.client.clone(), &ids.namespace);
            match api.create(&PostParams::default(), transfer_of).await {
                Ok(_) => {
                    let note = format!(
                        "created Transfer {name} to copy the image into pvc/{}",
                        names::prime(&ids.uid)
                    );
                    ctx.event(pvc, false, "TransferCreated", &note).await;
                    return Ok(Step::Wait(Action::await_change()));
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    api.get_opt(&name).await?.map(Arc::new)
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    match existing {
        Some(t) if build::owned_by(t.as_ref(), &ids.uid) => Ok(Step::Go(t)),
        _ => {
            let note = format!(
                "Transfer {name} exists and does not fill this claim: delete or rename it; the claim waits"
            );
            ctx.event(pvc, true, "TransferConflict", &note).await;
            Ok(Step::Wait(Action::requeue(RECHECK)))
        }
    }
}

/// Tells the filler's news on the user's claim: an event, and the claim's progress
/// annotation ([`names::PROGRESS`], tenths, as CDI's populators annotate their claims) when
/// it changed.
async fn tell<F: Filler>(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
    filler: &F,
    prime: &str,
) -> Result<(), Error> {
    let Some(note) = ctx.news(&ids.uid, filler, prime) else {
        return Ok(());
    };
    ctx.event(pvc, note.warning, note.reason, &note.text).await;
    let progress = mirror::progress_text(filler);
    let shown = pvc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::PROGRESS));
    if shown == Some(&progress) {
        return Ok(());
    }
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    let patch = serde_json::json!({"metadata": {"annotations": {names::PROGRESS: progress}}});
    api.patch(&ids.name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}
