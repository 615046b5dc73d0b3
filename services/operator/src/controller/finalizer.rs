//! The `ferry.dev/cancel` finalizer: added before anything is created, so deleting a
//! running resource cancels its mover first; removed once that is done. Both writes are
//! merge patches carrying the resource version, so a concurrent change of the finalizer
//! list makes the write fail (and the reconcile retry) instead of dropping someone
//! else's finalizer.

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};

use super::context::{Context, MANAGER};
use super::error::Error;
use super::kind::{Ids, MoverKind};

/// The finalizer's name.
pub const FINALIZER: &str = "ferry.dev/cancel";

/// Whether the resource has the finalizer.
pub fn has<K: Resource>(obj: &K) -> bool {
    obj.meta()
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
}

async fn write<K: MoverKind>(
    ctx: &Context,
    obj: &K,
    ids: &Ids,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    let patch = serde_json::json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": obj.meta().resource_version,
        }
    });
    let params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    api.patch(&ids.name, &params, &Patch::Merge(patch)).await?;
    Ok(())
}

/// Adds the finalizer.
pub async fn add<K: MoverKind>(ctx: &Context, obj: &K, ids: &Ids) -> Result<(), Error> {
    let mut finalizers = obj.meta().finalizers.clone().unwrap_or_default();
    finalizers.push(FINALIZER.to_string());
    write(ctx, obj, ids, finalizers).await
}

/// Removes the finalizer.
pub async fn remove<K: MoverKind>(ctx: &Context, obj: &K, ids: &Ids) -> Result<(), Error> {
    let finalizers = obj
        .meta()
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    write(ctx, obj, ids, finalizers).await
}
