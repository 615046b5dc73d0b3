//! A Transfer from a claim in another namespace, carried out ([`super::cross`] plans it):
//! the creator's stamp verified and a SubjectAccessReview asked before anything is read
//! or made in the source namespace; then the child Transfer there, followed until it is
//! done; then each temporary claim's volume handed over ([`super::handover`]), one step
//! per target per look; then the child deleted and the Transfer Succeeded. A refusal
//! fails the Transfer at once with [`super::cross::NOT_AUTHORIZED`] and a Warning event.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};

use crate::admission::stamp::{StampKey, REQUESTER};
use crate::controller::claims::{self, created_by};
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::kind::Ids;
use crate::controller::plan as mover_plan;
use crate::controller::pods::Created;
use crate::controller::reconcile::update;
use crate::crd::status::condition::{reason, RUNNING};
use crate::crd::{Phase, TargetStatus, Transfer, TransferStatus};

use super::cross::{self, CLONING, HANDING_OVER, NOT_AUTHORIZED};
use super::handover::{self, Observed, Step};

/// How often a clone across namespaces is looked at while the child works.
const LOOK_AGAIN: Duration = Duration::from_secs(2);
/// How soon the next hand-over step is taken.
const NEXT_STEP: Duration = Duration::from_millis(200);

fn final_phase(t: &Transfer) -> Phase {
    t.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

/// Deletes the child Transfer `namespace/name` of the Transfer `parent_uid` (the
/// parent's finalizer, or a parent that is done); whether one was there. Read first: see
/// [`remove_child`].
pub async fn delete_child(
    ctx: &Context,
    namespace: &str,
    name: &str,
    parent_uid: &str,
) -> Result<bool, Error> {
    let api: Api<Transfer> = Api::namespaced(ctx.client.clone(), namespace);
    match api.get_opt(name).await? {
        Some(child) => remove_child(ctx, &child, parent_uid).await,
        None => Ok(false),
    }
}

/// Deletes `child`, as read, when it is the Transfer `parent_uid`'s child: only a
/// Transfer labelled so, and only that very object (its uid a precondition): a name read
/// from a status is never enough to delete by. Whether it was deleted.
async fn remove_child(ctx: &Context, child: &Transfer, parent_uid: &str) -> Result<bool, Error> {
    let namespace = child.namespace().unwrap_or_default();
    let name = child.name_any();
    let ours = child.labels().get(cross::CLONE_OF).map(String::as_str) == Some(parent_uid);
    if !ours {
        tracing::warn!(%namespace, %name, parent_uid, "not deleting a Transfer that is not this Transfer's child");
        return Ok(false);
    }
    let api: Api<Transfer> = Api::namespaced(ctx.client.clone(), &namespace);
    let params = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: child.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(&name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Undoes every unfinished hand-over of the Transfer `uid` (namespace `namespace`): each
/// volume labelled for it gets its reclaim policy and, unless a claim holds it, its old
/// claim back ([`handover::release`]), and the target claims made on those volumes that
/// never bound are deleted. Run before a failure is written and when the Transfer goes;
/// how many volumes were given back.
pub async fn release_volumes(ctx: &Context, namespace: &str, uid: &str) -> Result<usize, Error> {
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let marked = volumes
        .list(&ListParams::default().labels(&format!("{}={uid}", handover::HANDED_OVER_FOR)))
        .await?;
    let mut held = Vec::new();
    for pv in &marked.items {
        let Some(name) = pv.metadata.name.as_deref() else {
            continue;
        };
        let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        let claimant = match claim_ref
            .and_then(|r| Some((r.namespace.as_deref()?, r.name.as_deref()?)))
        {
            Some((ns, claim)) => {
                let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
                claims.get_opt(claim).await?
            }
            None => None,
        };
        let mut patch = handover::release(pv, claimant.as_ref());
        // Decided on what was read: a volume the PV controller changed meanwhile (a target
        // just bound) is read and decided again (409, retried).
        patch["metadata"]["resourceVersion"] = serde_json::json!(pv.metadata.resource_version);
        if patch["spec"]["claimRef"].is_null() {
            if let Some(c) = &claimant {
                held.push((c.metadata.namespace.clone(), c.metadata.name.clone()));
            }
        }
        match volumes
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    // Also when no volume is marked any more: a deletion of targets that failed after
    // their volumes were given back is retried.
    let targets: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let made = targets
        .list(
            &ListParams::default()
                .labels(&format!("{}={uid}", crate::mover::pod::labels::OWNER_UID)),
        )
        .await?;
    for pvc in made
        .items
        .iter()
        .filter(|p| handover::unbound_target(p, uid))
    {
        let key = (pvc.metadata.namespace.clone(), pvc.metadata.name.clone());
        if held.contains(&key) {
            continue;
        }
        let name = pvc.metadata.name.as_deref().unwrap_or_default();
        match targets.delete(name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(marked.items.len())
}

/// Fails `obj` with `why` and `message` (and a Warning event, once), after undoing the
/// hand-overs that did not finish.
async fn fail(
    ctx: &Context,
    obj: &Transfer,
    ids: &Ids,
    status: &TransferStatus,
    why: &str,
    message: &str,
) -> Result<Action, Error> {
    release_volumes(ctx, &ids.namespace, &ids.uid).await?;
    let next = mover_plan::failed(obj, status, why, message);
    if update(ctx, ids, obj, status, &next).await?.is_some() {
        ctx.event(obj, true, why, message).await;
    }
    ctx.forget(&ids.uid);
    Ok(Action::await_change())
}

/// Running with `why` and `message`.
async fn running(
    ctx: &Context,
    obj: &Transfer,
    ids: &Ids,
    status: &TransferStatus,
    next: TransferStatus,
    why: &str,
    message: &str,
) -> Result<(), Error> {
    let next = mover_plan::with_life(obj, &next, |l| {
        l.phase = Phase::Running;
        l.start_time
            .get_or_insert_with(crate::controller::life::now);
        l.message = None;
        l.set_condition(RUNNING, true, why, message);
    });
    update(ctx, ids, obj, status, &next).await?;
    Ok(())
}

/// Whether the Transfer's creator may read the source claim: None when allowed, else
/// why not.
async fn authorize(
    ctx: &Context,
    obj: &Transfer,
    ids: &Ids,
    source_namespace: &str,
    source: &str,
) -> Result<Option<String>, Error> {
    let Some(ca) = ctx.mover_ca() else {
        return Ok(Some(
            "the operator has no key to check who created this Transfer (it runs without the movers' CA)".into(),
        ));
    };
    let key = StampKey::from_ca_key(&ca.key_pem());
    let stamp = obj
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REQUESTER))
        .map(String::as_str);
    let requester = match key.verify(
        stamp,
        &format!("{}/{}", ids.namespace, ids.name),
        &format!("{source_namespace}/{source}"),
    ) {
        Ok(r) => r,
        Err(e) => return Ok(Some(format!("{e}: the creator of a clone from another namespace is recorded by the operator's admission webhook"))),
    };
    let review = cross::access_review(&requester, source_namespace, source);
    let api: Api<SubjectAccessReview> = Api::all(ctx.client.clone());
    let answer = match api.create(&PostParams::default(), &review).await {
        Ok(a) => a,
        Err(kube::Error::Api(e)) if claims::refused(e.code) => {
            return Ok(Some(format!(
                "the API server refused the operator's SubjectAccessReview: {}",
                e.message
            )))
        }
        Err(e) => return Err(e.into()),
    };
    let status = answer.status.unwrap_or_default();
    if status.allowed && status.denied != Some(true) {
        return Ok(None);
    }
    Ok(Some(cross::denied_message(
        &requester.user,
        source_namespace,
        source,
        status.reason.as_deref(),
    )))
}

/// One reconcile of a Transfer from a claim in another namespace, or of one that recorded
/// a child there (`status.cloneTransfer`) whatever its spec says now (not final, not
/// being deleted, valid, with its finalizer). The child is looked up by that record:
/// once it exists the source and targets cannot change, and a Transfer whose spec did is
/// failed and its child deleted.
pub async fn reconcile(obj: Arc<Transfer>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ids = Ids::of(obj.as_ref())?;
    let status = obj.status.clone().unwrap_or_default();
    let source = obj
        .spec
        .source
        .pvc
        .as_ref()
        .map(|p| p.name.clone())
        .unwrap_or_default();
    let wanted = obj.spec.source_namespace(&ids.namespace).map(String::from);
    let recorded = cross::recorded(status.clone_transfer.as_deref(), &ids.uid);
    let (source_namespace, child_name) = match (&recorded, &wanted) {
        (Some((namespace, name)), _) => (namespace.clone(), name.clone()),
        (None, Some(namespace)) => (namespace.clone(), cross::child_name(&ids.uid)),
        (None, None) => return Ok(Action::await_change()),
    };
    let children: Api<Transfer> = Api::namespaced(ctx.client.clone(), &source_namespace);
    let child = children.get_opt(&child_name).await?;
    if recorded.is_some() {
        if let Some(why) = cross::changed(
            &obj,
            wanted.as_deref(),
            &source_namespace,
            &child_name,
            child.as_ref(),
        ) {
            release_volumes(&ctx, &ids.namespace, &ids.uid).await?;
            if let Some(child) = &child {
                remove_child(&ctx, child, &ids.uid).await?;
            }
            return fail(&ctx, &obj, &ids, &status, cross::SPEC_CHANGED, &why).await;
        }
    }
    let templates = cross::templates(&obj);
    let mut next = status.clone();
    next.clone_transfer = Some(format!("{source_namespace}/{child_name}"));
    let Some(child) = child else {
        if recorded.is_some() {
            // Made before: done and deleted (the status write that follows was lost), or
            // deleted by someone before it was done.
            let done = all_handed_over(&ctx, &ids, &templates).await?;
            if done {
                // Every target is bound: any volume whose last step (its policy back) was
                // not taken gets it now, the target keeping it.
                release_volumes(&ctx, &ids.namespace, &ids.uid).await?;
                return succeed(&ctx, &obj, &ids, &status, next, &templates, None).await;
            }
            let text = format!(
                "Transfer {source_namespace}/{child_name}, which fills the claims in the source namespace, was deleted before it was done: create this Transfer again"
            );
            return fail(&ctx, &obj, &ids, &status, reason::FAILED, &text).await;
        }
        if let Some(watched) = ctx.settings.watch_namespace.as_deref() {
            let text = format!(
                "the operator watches only namespace {watched}: a clone from namespace {source_namespace} needs an operator that watches every namespace"
            );
            return fail(&ctx, &obj, &ids, &status, reason::INVALID_SPEC, &text).await;
        }
        if let Some(why) = authorize(&ctx, &obj, &ids, &source_namespace, &source).await? {
            return fail(&ctx, &obj, &ids, &status, NOT_AUTHORIZED, &why).await;
        }
        let made = cross::child_transfer(&obj, &ids, &source_namespace);
        match children.create(&PostParams::default(), &made).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(kube::Error::Api(e)) if claims::refused(e.code) => {
                let text = format!(
                    "the API server refused to create Transfer {source_namespace}/{child_name}: {}",
                    e.message
                );
                let waiting = mover_plan::waiting(obj.as_ref(), &status, reason::REFUSED, &text);
                update(&ctx, &ids, obj.as_ref(), &status, &waiting).await?;
                return Ok(Action::requeue(LOOK_AGAIN));
            }
            Err(e) => return Err(e.into()),
        }
        let text = format!(
            "created Transfer {source_namespace}/{child_name} to fill {} claims from pvc/{source} in its namespace",
            templates.len()
        );
        ctx.event(obj.as_ref(), false, "CloneStarted", &text).await;
        next.targets = target_statuses(&templates, Phase::Running);
        running(&ctx, &obj, &ids, &status, next, CLONING, &text).await?;
        return Ok(Action::requeue(LOOK_AGAIN));
    };
    let child_status = child.status.clone().unwrap_or_default();
    next.clone_strategy = child_status.clone_strategy.clone();
    next.clone_fallback_reason = child_status.clone_fallback_reason.clone();
    match final_phase(&child) {
        Phase::Failed | Phase::Cancelled => {
            let why = child_status
                .message
                .clone()
                .unwrap_or_else(|| "no message".into());
            let text = format!(
                "Transfer {source_namespace}/{child_name}, which fills the claims in the source namespace, failed: {why}"
            );
            release_volumes(&ctx, &ids.namespace, &ids.uid).await?;
            remove_child(&ctx, &child, &ids.uid).await?;
            let next = mover_plan::failed(obj.as_ref(), &next, reason::FAILED, &text);
            if update(&ctx, &ids, obj.as_ref(), &status, &next)
                .await?
                .is_some()
            {
                ctx.event(obj.as_ref(), true, reason::FAILED, &text).await;
            }
            ctx.forget(&ids.uid);
            Ok(Action::await_change())
        }
        Phase::Succeeded => hand_over(&ctx, &obj, &ids, &status, next, &templates, &child).await,
        _ => {
            let what = child_status
                .conditions
                .iter()
                .find(|c| c.type_ == RUNNING)
                .map(|c| c.message.clone())
                .or(child_status.message.clone())
                .unwrap_or_else(|| "starting".into());
            let text = format!("in namespace {source_namespace}, Transfer {child_name}: {what}");
            next.targets = target_statuses(&templates, Phase::Running);
            running(&ctx, &obj, &ids, &status, next, CLONING, &text).await?;
            Ok(Action::requeue(LOOK_AGAIN))
        }
    }
}

/// One hand-over step for every target not yet done from the claims `child` (succeeded)
/// filled; Succeeded when all are.
async fn hand_over(
    ctx: &Context,
    obj: &Transfer,
    ids: &Ids,
    status: &TransferStatus,
    next: TransferStatus,
    templates: &[crate::crd::PvcTemplate],
    child: &Transfer,
) -> Result<Action, Error> {
    let source_namespace = child.namespace().unwrap_or_default();
    let source_namespace = source_namespace.as_str();
    let temporaries: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), source_namespace);
    let targets: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let mut waiting = Vec::new();
    for (i, template) in templates.iter().enumerate() {
        let temporary_name = cross::temporary_claim(&ids.uid, i);
        let temporary = temporaries.get_opt(&temporary_name).await?;
        let target = targets.get_opt(&template.name).await?;
        let volume = match handover::volume_of(temporary.as_ref(), target.as_ref()) {
            Some(name) => volumes.get_opt(name).await?,
            None => None,
        };
        let observed = Observed {
            temporary: temporary.as_ref(),
            volume: volume.as_ref(),
            target: target.as_ref(),
        };
        let step = handover::next(
            obj,
            ids,
            template,
            source_namespace,
            &temporary_name,
            &observed,
        );
        match step {
            Step::Done(_) => continue,
            Step::Conflict(text) => {
                return fail(ctx, obj, ids, status, reason::INVALID_SPEC, &text).await
            }
            Step::Wait(why) => waiting.push(why),
            Step::PatchVolume { name, patch } => {
                volumes
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                waiting.push(format!(
                    "pvc/{}: volume {name} being handed over",
                    template.name
                ));
            }
            Step::CreateTarget(pvc) => {
                if let Created::Refused(why) = claims::create(ctx, &pvc).await? {
                    let text = format!(
                        "the API server refused to create pvc/{}: {why}",
                        template.name
                    );
                    let w = mover_plan::waiting(obj, status, reason::REFUSED, &text);
                    update(ctx, ids, obj, status, &w).await?;
                    return Ok(Action::requeue(LOOK_AGAIN));
                }
                let text = format!(
                    "created pvc/{} on the volume filled in namespace {source_namespace}",
                    template.name
                );
                ctx.event(obj, false, "ClaimCreated", &text).await;
                waiting.push(text);
            }
            Step::DeleteTemporary(namespace, name) => {
                match temporaries.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
                waiting.push(format!("pvc/{name} in namespace {namespace} deleted"));
            }
        }
    }
    if waiting.is_empty() {
        return succeed(ctx, obj, ids, status, next, templates, Some(child)).await;
    }
    let mut next = next;
    next.targets = target_statuses(templates, Phase::Running);
    running(
        ctx,
        obj,
        ids,
        status,
        next,
        HANDING_OVER,
        &waiting.join("; "),
    )
    .await?;
    Ok(Action::requeue(NEXT_STEP))
}

/// Whether every target exists, was made by this Transfer and is bound.
async fn all_handed_over(
    ctx: &Context,
    ids: &Ids,
    templates: &[crate::crd::PvcTemplate],
) -> Result<bool, Error> {
    let targets: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    for t in templates {
        let Some(pvc) = targets.get_opt(&t.name).await? else {
            return Ok(false);
        };
        let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        if !bound || !created_by(&pvc, &ids.uid) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Succeeded: the child (when it is still there) deleted.
async fn succeed(
    ctx: &Context,
    obj: &Transfer,
    ids: &Ids,
    status: &TransferStatus,
    mut next: TransferStatus,
    templates: &[crate::crd::PvcTemplate],
    child: Option<&Transfer>,
) -> Result<Action, Error> {
    if let Some(child) = child {
        remove_child(ctx, child, &ids.uid).await?;
    }
    let text = format!(
        "{} claims filled in the source namespace ({}) and handed over",
        templates.len(),
        next.clone_strategy.as_deref().unwrap_or("copy")
    );
    next.targets = target_statuses(templates, Phase::Succeeded);
    let done = mover_plan::with_life(obj, &next, |l| {
        l.start_time
            .get_or_insert_with(crate::controller::life::now);
        l.finish(Phase::Succeeded, reason::SUCCEEDED, Some(&text));
    });
    if update(ctx, ids, obj, status, &done).await?.is_some() {
        ctx.event(obj, false, reason::SUCCEEDED, &text).await;
    }
    ctx.forget(&ids.uid);
    Ok(Action::await_change())
}

fn target_statuses(templates: &[crate::crd::PvcTemplate], phase: Phase) -> Vec<TargetStatus> {
    templates
        .iter()
        .map(|t| TargetStatus {
            name: format!("pvc/{}", t.name),
            phase,
            ..TargetStatus::default()
        })
        .collect()
}
