//! The BackupRepository reconciler: says on the repository whether Backups can use it as
//! written (Ready: the spec is valid and every Secret key it references exists), so a
//! mistake shows on the repository before a backup fails on it. It runs no mover: the
//! repository itself is reached (and created, with `initialize`) by the first Backup.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::Api;

use crate::crd::status::condition::{reason, READY};
use crate::crd::{BackupRepository, BackupRepositoryStatus};

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
    let keys = obj.spec.secret_refs();
    let present = match obj.spec.validate() {
        Ok(()) => secrets::observe(&ctx, &ids.namespace, &[], &keys).await?,
        Err(_) => Default::default(),
    };
    let (next, ready) = status(&obj, &present);
    let action = match ready {
        Ready::Invalid => Action::await_change(),
        Ready::SecretMissing | Ready::Yes => Action::requeue(ctx.settings.resync),
    };
    let ready = ready == Ready::Yes;
    let condition = next.conditions.iter().find(|c| c.type_ == READY);
    let why = condition.map(|c| c.reason.clone()).unwrap_or_default();
    let text = condition.map(|c| c.message.clone()).unwrap_or_default();
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
            ctx.event(obj.as_ref(), true, &why, &text).await;
        }
    }
    Ok(action)
}

/// What the Ready condition of a repository says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// Backups can use it.
    Yes,
    /// Its spec is invalid.
    Invalid,
    /// A Secret or key it references is missing.
    SecretMissing,
}

/// The status of `obj` given the Secrets of its namespace that it references (`present`:
/// name -> keys), and what Ready says.
pub fn status(
    obj: &BackupRepository,
    present: &BTreeMap<String, BTreeSet<String>>,
) -> (BackupRepositoryStatus, Ready) {
    let before = obj.status.clone().unwrap_or_default();
    let namespace = obj.metadata.namespace.as_deref().unwrap_or_default();
    let mut next = before.clone();
    next.observed_generation = obj.metadata.generation;
    next.encrypted = obj.spec.encryption.is_some();
    let (ready, why, message) = match obj.spec.validate() {
        Err(e) => (
            Ready::Invalid,
            reason::INVALID_SPEC,
            Some(format!("{e}: fix the spec")),
        ),
        Ok(()) => {
            let keys = obj.spec.secret_refs();
            match secrets::missing(present, namespace, &[], &keys) {
                Some(message) => (Ready::SecretMissing, SECRET_MISSING, Some(message)),
                None => (Ready::Yes, VALID, None),
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
    life.set_condition(READY, ready == Ready::Yes, why, &text);
    next.conditions = life.conditions;
    next.message = message;
    (next, ready)
}
