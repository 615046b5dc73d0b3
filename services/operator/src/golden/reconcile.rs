//! The GoldenImage controller. One reconcile does one step of [`super::plan::next`]:
//!
//! - an import under way: its Transfer read; once it ended, the status records it (the
//!   newest import current, or the failure), the Transfer is deleted (its claim stays),
//!   and the claims of imports beyond `importsToKeep` (or of the failed import) deleted;
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
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::kind::apply_status;
use crate::crd::{GoldenImage, GoldenImageStatus, Transfer};

use super::plan::{self, condition, AfterPoll, Ended, Step};
use super::probe;

/// How often an import under way is looked at when nothing wakes it.
const FOLLOW_AGAIN: Duration = Duration::from_secs(60);

/// Runs the GoldenImage controller (in `namespace`, or all) until a termination signal.
pub async fn run(client: Client, ctx: Arc<Context>, namespace: Option<String>) {
    let (images, transfers): (Api<GoldenImage>, Api<Transfer>) = match &namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client, ns),
        ),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    Controller::new(images, watcher::Config::default())
        .owns(
            transfers,
            watcher::Config::default().labels(plan::GOLDEN_IMAGE_UID),
        )
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
            let transfer = transfers.get_opt(&importing.transfer).await?;
            let end = plan::ended(transfer.as_ref());
            if end == Ended::Running {
                return Ok(Action::requeue(FOLLOW_AGAIN));
            }
            let (next, delete) = plan::after_import(&obj, &status, &importing, &end, now);
            let claims: Api<PersistentVolumeClaim> =
                Api::namespaced(ctx.client.clone(), &namespace);
            for claim in &delete {
                gone(claims.delete(claim, &DeleteParams::default()).await)?;
            }
            if transfer.is_some() {
                gone(
                    transfers
                        .delete(&importing.transfer, &DeleteParams::background())
                        .await,
                )?;
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
            let url = obj.spec.source.url.clone().unwrap_or_default();
            let source = &obj.spec.source;
            let registry = source.registry.clone().unwrap_or_default();
            let private = source.http.is_some()
                || registry.secret_ref.is_some()
                || registry.cert_config_map.is_some();
            let asked = probe::probes(&url) && !private;
            let insecure = registry.insecure.unwrap_or(false);
            let (version, unversioned) = if asked {
                match probe::version(&url, insecure).await {
                    Ok(Some(v)) => (Some(v), None),
                    Ok(None) => (None, Some("the server gives no ETag or Last-Modified")),
                    Err(e) => {
                        let text = format!("asking the source for its version: {e}");
                        let next = plan::poll_failed(&obj, &status, &text, now, next_fire);
                        write(&ctx, &obj, &status, &next).await?;
                        ctx.event(obj.as_ref(), true, condition::POLL_FAILED, &text)
                            .await;
                        return Ok(Action::requeue(Duration::ZERO));
                    }
                }
            } else if probe::probes(&url) {
                (None, Some("the source needs its credentials or certificates, and the operator reads no Secret or ConfigMap values"))
            } else {
                (None, Some("the version of this kind of URL is not asked"))
            };
            match plan::after_poll(
                &obj,
                &status,
                version.as_deref(),
                unversioned,
                now,
                next_fire,
            ) {
                AfterPoll::Unchanged(next) => {
                    write(&ctx, &obj, &status, &next).await?;
                }
                AfterPoll::Import(transfer, next) => {
                    match transfers.create(&PostParams::default(), &transfer).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(e)) if e.code == 409 => {}
                        Err(e) => return Err(e.into()),
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
