//! The volume populator: a claim whose `spec.dataSourceRef` names a `ferry.dev`
//! `VolumeImageSource` is created already holding the image (or one naming a `Backup`
//! holding the backup's snapshot, restored by a `Restore` where a Transfer copies an
//! image), the way
//! kubernetes-csi/lib-volume-populator and CDI's populators do it.
//!
//! The provisioner leaves such a claim unbound (it does not know the data source), so
//! the populator creates a **prime claim** `ferry-prime-<claim uid>` beside it (same
//! class, size, access and volume modes; on WaitForFirstConsumer classes pinned to the
//! node the scheduler picked for the claim) and a `Transfer` named after the claim that
//! copies the image into it. The Transfer reconciler runs the mover, resumes and retries;
//! the populator tells its progress as events on the user's claim. Once the Transfer
//! succeeded and the prime claim is Bound, the volume's `claimRef` is pointed at the
//! user's claim, the PV controller binds it, and the prime claim and the Transfer are
//! deleted. A failed Transfer leaves the prime claim for inspection; deleting the
//! Transfer starts again. Both are owned by the user's claim, so deleting the claim
//! deletes them; every name is derived from the claim, so every step may repeat.
//!
//! An image that is itself in a claim (`pvc`, or a GoldenImage's current claim) is cloned
//! by the storage where it can be ([`clone`]): the prime claim is created from a
//! VolumeSnapshot of it or as a CSI clone of it, and no Transfer runs.
//!
//! The Kubernetes calls: claims list/watch/create/patch/delete, persistentvolumes
//! get/patch, storageclasses get/list, storageclassprofiles and volumesnapshotclasses
//! list, volumesnapshots get/create/delete, goldenimages get, volumeimagesources
//! get/list/watch, transfers list/watch/create/get/delete, backups get/list/watch,
//! restores list/watch/create/get/delete, events create/patch.

pub mod build;
pub mod clone;
pub mod context;
pub mod error;
pub mod mirror;
pub mod names;
pub mod plan;
pub mod rebind;
pub mod reconcile;
pub mod source;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client};

use crate::crd::{Backup, Restore, Transfer, VolumeImageSource};

pub use context::Context;
pub use error::Error;
pub use reconcile::reconcile;

/// What the controller does after a failed reconcile: log it and look again soon (the
/// failure is usually the API server being unreachable for a moment).
pub fn error_policy(pvc: Arc<PersistentVolumeClaim>, error: &Error, _ctx: Arc<Context>) -> Action {
    let name = pvc.metadata.name.as_deref().unwrap_or_default();
    tracing::warn!(%name, %error, "populator reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

/// The claims of the store that name the VolumeImageSource `vis`.
pub fn claims_naming(
    claims: &Store<PersistentVolumeClaim>,
    vis: &VolumeImageSource,
) -> Vec<ObjectRef<PersistentVolumeClaim>> {
    let namespace = vis.metadata.namespace.as_deref();
    let name = vis.metadata.name.as_deref();
    claims
        .state()
        .iter()
        .filter(|pvc| pvc.metadata.namespace.as_deref() == namespace)
        .filter(|pvc| {
            source::of(pvc).is_some_and(|s| {
                s.kind == source::SourceKind::Image && Some(s.name.as_str()) == name
            })
        })
        .map(|pvc| ObjectRef::from_obj(pvc.as_ref()))
        .collect()
}

/// The claims of the store that name the Backup `backup` (to restore it).
pub fn claims_restoring(
    claims: &Store<PersistentVolumeClaim>,
    backup: &Backup,
) -> Vec<ObjectRef<PersistentVolumeClaim>> {
    let namespace = backup.metadata.namespace.as_deref();
    let name = backup.metadata.name.as_deref();
    claims
        .state()
        .iter()
        .filter(|pvc| pvc.metadata.namespace.as_deref() == namespace)
        .filter(|pvc| {
            source::of(pvc).is_some_and(|s| {
                s.kind == source::SourceKind::Backup && Some(s.name.as_str()) == name
            })
        })
        .map(|pvc| ObjectRef::from_obj(pvc.as_ref()))
        .collect()
}

/// The store of populator Transfers went away before it was filled.
#[derive(Debug, thiserror::Error)]
#[error("the watch of populator Transfers stopped before it listed them")]
pub struct RunError;

/// Runs the populator until a termination signal: a controller on every claim (claims
/// that name no VolumeImageSource cost nothing past the watch), woken also by its prime
/// claim, its Transfer and its VolumeImageSource. Start it beside
/// [`crate::controller::run`], which runs the Transfers it creates. With `namespace`, it
/// watches only that namespace (the operator's `--watch-namespace`, whose permissions may
/// be a Role there only).
pub async fn run(client: Client, namespace: Option<String>) -> Result<(), RunError> {
    let ns = &namespace;
    let owned = || watcher::Config::default().labels(&names::selector());
    let (transfers, writer) = reflector::store::<Transfer>();
    let transfer_watch = reflector(writer, watcher(api::<Transfer>(&client, ns), owned()))
        .default_backoff()
        .for_each(|_| std::future::ready(()));
    let transfer_task = tokio::spawn(transfer_watch);
    transfers.wait_until_ready().await.map_err(|_| RunError)?;
    let (restores, writer) = reflector::store::<Restore>();
    let restore_watch = reflector(writer, watcher(api::<Restore>(&client, ns), owned()))
        .default_backoff()
        .for_each(|_| std::future::ready(()));
    let restore_task = tokio::spawn(restore_watch);
    restores.wait_until_ready().await.map_err(|_| RunError)?;
    let controller = Controller::new(
        api::<PersistentVolumeClaim>(&client, ns),
        watcher::Config::default(),
    );
    let claims = controller.store();
    let (class_defaults, class_tasks) =
        crate::class_defaults::ClassDefaults::watch_ready(&client).await;
    let ctx = Arc::new(
        Context::new(client.clone(), claims.clone(), transfers)
            .with_restores(restores)
            .with_class_defaults(class_defaults),
    );
    let restoring = claims.clone();
    controller
        .owns(api::<PersistentVolumeClaim>(&client, ns), owned())
        .owns(api::<Transfer>(&client, ns), owned())
        .owns(api::<Restore>(&client, ns), owned())
        .watches(
            api::<Backup>(&client, ns),
            watcher::Config::default(),
            move |backup| claims_restoring(&restoring, &backup),
        )
        .watches(
            api::<VolumeImageSource>(&client, ns),
            watcher::Config::default(),
            move |vis| claims_naming(&claims, &vis),
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            if let Err(e) = result {
                tracing::warn!(error = %e, "populator");
            }
            std::future::ready(())
        })
        .await;
    transfer_task.abort();
    restore_task.abort();
    class_tasks.iter().for_each(|t| t.abort());
    Ok(())
}

/// The API of `K` in the watched namespace, or in all namespaces.
fn api<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    use super::*;

    fn claim(namespace: &str, name: &str, source: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"dataSourceRef": {"apiGroup": "ferry.dev", "kind": "VolumeImageSource",
                                       "name": source}},
        }))
        .unwrap()
    }

    #[test]
    fn a_source_wakes_the_claims_of_its_namespace_that_name_it() {
        let mut writer = Writer::<PersistentVolumeClaim>::default();
        for c in [
            claim("vms", "a", "fedora"),
            claim("vms", "b", "debian"),
            claim("other", "c", "fedora"),
            claim("vms", "d", "fedora"),
        ] {
            writer.apply_watcher_event(&Event::Apply(c));
        }
        let vis: VolumeImageSource = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "VolumeImageSource",
            "metadata": {"name": "fedora", "namespace": "vms"},
            "spec": {"source": {"url": "s3://b/k"}},
        }))
        .unwrap();
        let mut woken: Vec<String> = claims_naming(&writer.as_reader(), &vis)
            .into_iter()
            .map(|r| r.name)
            .collect();
        woken.sort();
        assert_eq!(woken, ["a", "d"]);
    }
}
