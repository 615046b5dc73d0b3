//! The BackupRepository reconciler: says on the repository whether Backups can use it as
//! written (Ready: the spec is valid and every Secret key it references exists), so a
//! mistake shows on the repository before a backup fails on it. It runs no mover: the
//! repository itself is reached (and created, with `initialize`) by the first Backup.

use std::sync::Arc;

use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::Api;

use crate::crd::status::condition::{reason, READY};
use crate::crd::BackupRepository;

use super::context::{Context, MANAGER};
use super::error::Error;
use super::kind::Ids;
use super::life::{same_status, Life};
use super::secrets;

/// Ready's reason when the repository can be used.
pub const VALID: &str = "Valid";
/// Ready's reason when a referenced Secret or key is missing.
pub const SECRET_MISSING: &str = "SecretMissing";

/// One reconcile of a BackupRepository.
pub async fn reconcile_repository(
    obj: Arc<BackupRepository>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let meta = &obj.metadata;
    let (Some(namespace), Some(name), Some(uid)) = (&meta.namespace, &meta.name, &meta.uid) else {
        return Err(Error::NotStored("BackupRepository"));
    };
    if meta.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ids = Ids {
        namespace: namespace.clone(),
        name: name.clone(),
        uid: uid.clone(),
    };
    let before = obj.status.clone().unwrap_or_default();
    let mut next = before.clone();
    next.observed_generation = meta.generation;
    next.encrypted = obj.spec.encryption.is_some();
    let (ready, why, message, action) = match obj.spec.validate() {
        Err(e) => (
            false,
            reason::INVALID_SPEC,
            Some(format!("{e}: fix the spec")),
            Action::await_change(),
        ),
        Ok(()) => {
            let keys = obj.spec.secret_refs();
            let present = secrets::observe(&ctx, &ids.namespace, &[], &keys).await?;
            match secrets::missing(&present, &ids.namespace, &[], &keys) {
                Some(message) => (
                    false,
                    SECRET_MISSING,
                    Some(message),
                    Action::requeue(ctx.settings.resync),
                ),
                None => (true, VALID, None, Action::requeue(ctx.settings.resync)),
            }
        }
    };
    let text = message
        .clone()
        .unwrap_or_else(|| "the repository can be used".into());
    let mut life = Life {
        conditions: std::mem::take(&mut next.conditions),
        observed_generation: next.observed_generation,
        ..Life::default()
    };
    life.set_condition(READY, ready, why, &text);
    next.conditions = life.conditions;
    next.message = message;
    if !same_status(&before, &next) {
        let api: Api<BackupRepository> = Api::namespaced(ctx.client.clone(), namespace);
        let body = serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1",
            "kind": "BackupRepository",
            "status": next,
        });
        api.patch_status(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(body),
        )
        .await?;
        if !ready {
            ctx.event(obj.as_ref(), true, why, &text).await;
        }
    }
    Ok(action)
}
