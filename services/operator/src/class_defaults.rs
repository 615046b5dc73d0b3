//! What a `StorageClassProfile` says of the claims ferry makes in its class where their
//! template does not (CDI's StorageProfile `claimPropertySets` and `filesystemOverhead`):
//! a `pvcTemplate` (or a `pvcTemplates` generator) without `volumeMode` or `accessModes`
//! takes its class's (the cluster's default class when it names none), and a prime claim
//! the populator fills with an image file grows by its class's file-system overhead.
//!
//! The profiles and the classes' metadata are watched into stores, so that filling a
//! template costs no request; the same pure functions serve `ferry operator render` with
//! the objects of its file. A template that says its modes keeps them.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};

use crate::crd::golden_image::ImportClaim;
use crate::crd::{
    AccessMode, PvcTemplate, PvcTemplates, StorageClassProfile, StorageClassProfileSpec, Transfer,
    VolumeMode,
};
use crate::fanout::facts::DEFAULT_CLASS;

/// How long a starting operator waits for the profiles to be listed.
pub const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// The profiles and which class is the cluster's default, as watched (empty until
/// [`ClassDefaults::watch`]: no template is filled).
#[derive(Clone)]
pub struct ClassDefaults {
    profiles: Store<StorageClassProfile>,
    classes: Store<PartialObjectMeta<StorageClass>>,
}

impl std::fmt::Debug for ClassDefaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClassDefaults")
            .field("profiles", &self.profiles.len())
            .field("classes", &self.classes.len())
            .finish()
    }
}

impl Default for ClassDefaults {
    fn default() -> Self {
        Self::from_stores(reflector::store().0, reflector::store().0)
    }
}

impl ClassDefaults {
    /// Defaults read from these stores (a test fills them by hand).
    pub fn from_stores(
        profiles: Store<StorageClassProfile>,
        classes: Store<PartialObjectMeta<StorageClass>>,
    ) -> Self {
        Self { profiles, classes }
    }

    /// Starts the watches of the profiles and of the classes' metadata and waits (at
    /// most [`READY_WAIT`]) until both have listed, so that the first claims made after a
    /// restart get their profile's modes; returns the defaults they fill and their tasks.
    pub async fn watch_ready(client: &Client) -> (Self, Vec<tokio::task::JoinHandle<()>>) {
        let (defaults, tasks) = Self::watch(client);
        let ready = async {
            let _ = defaults.profiles.wait_until_ready().await;
            let _ = defaults.classes.wait_until_ready().await;
        };
        if tokio::time::timeout(READY_WAIT, ready).await.is_err() {
            tracing::warn!(
                "the StorageClassProfiles were not listed within {} s (is the CRD installed, the operator allowed to watch it?): claims made until they are get no profile's modes",
                READY_WAIT.as_secs()
            );
        }
        (defaults, tasks)
    }

    /// Starts the watches of the profiles and of the classes' metadata; returns the
    /// defaults they fill and their tasks. Not waited for: until they have listed, a
    /// template without modes gets Filesystem and ReadWriteOnce, as without a profile.
    pub fn watch(client: &Client) -> (Self, Vec<tokio::task::JoinHandle<()>>) {
        let (profiles, writer) = reflector::store();
        let profile_watch = reflector::reflector(
            writer,
            watcher(
                Api::<StorageClassProfile>::all(client.clone()),
                watcher::Config::default(),
            ),
        )
        .default_backoff()
        .for_each(|_| std::future::ready(()));
        let (classes, writer) = reflector::store();
        let class_watch = reflector::reflector(
            writer,
            watcher(
                Api::<PartialObjectMeta<StorageClass>>::all(client.clone()),
                watcher::Config::default(),
            ),
        )
        .default_backoff()
        .for_each(|_| std::future::ready(()));
        (
            Self { profiles, classes },
            vec![tokio::spawn(profile_watch), tokio::spawn(class_watch)],
        )
    }

    /// The profile of `class` (the cluster's default class when None).
    pub fn profile(&self, class: Option<&str>) -> Option<StorageClassProfileSpec> {
        profile_of(
            class,
            || {
                self.classes
                    .state()
                    .iter()
                    .find(|c| is_default(&c.metadata))
                    .and_then(|c| c.metadata.name.clone())
            },
            // By key: every Transfer's reconcile asks, the store need not be copied for it.
            |name| {
                self.profiles
                    .get(&kube::runtime::reflector::ObjectRef::new(name))
                    .map(|p| p.spec.clone())
            },
        )
    }

    /// `transfer` with its templates filled (the same `Arc` when none needs it).
    pub fn fill_transfer(&self, transfer: Arc<Transfer>) -> Arc<Transfer> {
        if !needs_filling(&transfer) || self.profiles.is_empty() {
            return transfer;
        }
        let mut filled = transfer.as_ref().clone();
        fill(&mut filled, |class| self.profile(class));
        Arc::new(filled)
    }

    /// The file-system overhead of `class`, in parts per million (CDI's 5.5% when its
    /// profile gives none).
    pub fn overhead_ppm(&self, class: Option<&str>) -> u32 {
        overhead_ppm(self.profile(class).as_ref())
    }

    /// A GoldenImage's import claim with its left-out modes from its class's profile (what
    /// its import Transfer's template was filled with: a snapshot of it has those modes).
    pub fn fill_import_claim(&self, claim: &mut ImportClaim) {
        if let Some(profile) = self.profile(claim.storage_class_name.as_deref()) {
            fill_modes(&mut claim.volume_mode, &mut claim.access_modes, &profile);
        }
    }
}

/// Whether a class's metadata marks it the cluster's default.
fn is_default(meta: &ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(DEFAULT_CLASS))
        .is_some_and(|v| v == "true")
}

/// The file-system overhead a profile gives, else CDI's 5.5%, in parts per million.
pub fn overhead_ppm(profile: Option<&StorageClassProfileSpec>) -> u32 {
    profile
        .and_then(StorageClassProfileSpec::filesystem_overhead_ppm)
        .unwrap_or(crate::populator::build::FILESYSTEM_OVERHEAD_PPM)
}

/// Whether a template of `transfer` leaves out its volume or access modes.
fn needs_filling(transfer: &Transfer) -> bool {
    let spec = &transfer.spec;
    let lacks = |mode: bool, access: bool| !mode || !access;
    spec.targets
        .iter()
        .filter_map(|t| t.pvc_template.as_ref())
        .any(|t| lacks(t.volume_mode.is_some(), t.access_modes.is_some()))
        || spec
            .pvc_templates
            .as_ref()
            .is_some_and(|g| lacks(g.volume_mode.is_some(), g.access_modes.is_some()))
}

/// Fills the templates of `transfer` from `profile_of` their class.
pub fn fill(
    transfer: &mut Transfer,
    profile_of: impl Fn(Option<&str>) -> Option<StorageClassProfileSpec>,
) {
    for t in transfer
        .spec
        .targets
        .iter_mut()
        .filter_map(|t| t.pvc_template.as_mut())
    {
        if let Some(profile) = profile_of(t.storage_class_name.as_deref()) {
            fill_template(t, &profile);
        }
    }
    if let Some(g) = transfer.spec.pvc_templates.as_mut() {
        if let Some(profile) = profile_of(g.storage_class_name.as_deref()) {
            fill_generator(g, &profile);
        }
    }
}

/// A template's left-out modes from `profile`.
pub fn fill_template(t: &mut PvcTemplate, profile: &StorageClassProfileSpec) {
    fill_modes(&mut t.volume_mode, &mut t.access_modes, profile);
}

/// A generator's left-out modes from `profile`.
pub fn fill_generator(g: &mut PvcTemplates, profile: &StorageClassProfileSpec) {
    fill_modes(&mut g.volume_mode, &mut g.access_modes, profile);
}

fn fill_modes(
    mode: &mut Option<VolumeMode>,
    access: &mut Option<Vec<AccessMode>>,
    profile: &StorageClassProfileSpec,
) {
    if mode.is_none() {
        *mode = profile.volume_mode;
    }
    if access.is_none() {
        access.clone_from(&profile.access_modes);
    }
}

/// The cluster's default class among `classes`.
pub fn default_class<'a>(classes: impl IntoIterator<Item = &'a StorageClass>) -> Option<String> {
    classes
        .into_iter()
        .find(|c| is_default(&c.metadata))
        .and_then(|c| c.metadata.name.clone())
}

/// The profile of `class` (`default_class` when None) among `profiles`: the function
/// render fills templates with.
pub fn profile_among(
    profiles: &[StorageClassProfile],
    default_class: Option<&str>,
    class: Option<&str>,
) -> Option<StorageClassProfileSpec> {
    profile_of(
        class,
        || default_class.map(str::to_string),
        |name| {
            profiles
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(name))
                .map(|p| p.spec.clone())
        },
    )
}

/// The one rule for the watched stores and render's file alike: the profile named after
/// `class`, or after the cluster's default class (asked only when `class` is None).
fn profile_of(
    class: Option<&str>,
    default_class: impl FnOnce() -> Option<String>,
    named: impl FnOnce(&str) -> Option<StorageClassProfileSpec>,
) -> Option<StorageClassProfileSpec> {
    match class {
        Some(class) => named(class),
        None => named(&default_class()?),
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    use super::*;

    fn profile(name: &str, spec: serde_json::Value) -> StorageClassProfile {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "StorageClassProfile",
            "metadata": {"name": name}, "spec": spec,
        }))
        .unwrap()
    }

    fn class_meta(name: &str, default: bool) -> PartialObjectMeta<StorageClass> {
        let mut meta: PartialObjectMeta<StorageClass> = serde_json::from_value(json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": name},
        }))
        .unwrap();
        if default {
            meta.metadata.annotations =
                Some([(DEFAULT_CLASS.to_string(), "true".to_string())].into());
        }
        meta
    }

    fn defaults() -> ClassDefaults {
        let mut profiles = Writer::<StorageClassProfile>::default();
        profiles.apply_watcher_event(&Event::Apply(profile(
            "rbd",
            json!({"volumeMode": "Block", "accessModes": ["ReadWriteMany"],
                   "filesystemOverhead": "0.1"}),
        )));
        profiles.apply_watcher_event(&Event::Apply(profile(
            "local",
            json!({"accessModes": ["ReadWriteOncePod"]}),
        )));
        let mut classes = Writer::<PartialObjectMeta<StorageClass>>::default();
        classes.apply_watcher_event(&Event::Apply(class_meta("rbd", false)));
        classes.apply_watcher_event(&Event::Apply(class_meta("local", true)));
        ClassDefaults::from_stores(profiles.as_reader(), classes.as_reader())
    }

    #[test]
    fn left_out_modes_come_from_the_classs_profile_and_given_ones_stay() {
        let transfer: Transfer = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": "t", "namespace": "vms"},
            "spec": {
                "source": {"url": "https://h/i.raw"},
                "targets": [
                    {"pvcTemplate": {"name": "a", "size": "1Gi", "storageClassName": "rbd"}},
                    {"pvcTemplate": {"name": "b", "size": "1Gi", "storageClassName": "rbd",
                                     "volumeMode": "Filesystem"}},
                    {"pvcTemplate": {"name": "c", "size": "1Gi"}},
                    {"pvcTemplate": {"name": "d", "size": "1Gi", "storageClassName": "none"}},
                ],
                "pvcTemplates": {"namePrefix": "vm-", "count": 3, "size": "1Gi",
                                 "storageClassName": "rbd"},
            },
        }))
        .unwrap();
        let filled = defaults().fill_transfer(Arc::new(transfer));
        let spec = serde_json::to_value(&filled.spec).unwrap();
        assert_eq!(
            spec["targets"],
            json!([
                {"pvcTemplate": {"name": "a", "size": "1Gi", "storageClassName": "rbd",
                                 "volumeMode": "Block", "accessModes": ["ReadWriteMany"]}},
                {"pvcTemplate": {"name": "b", "size": "1Gi", "storageClassName": "rbd",
                                 "volumeMode": "Filesystem", "accessModes": ["ReadWriteMany"]}},
                {"pvcTemplate": {"name": "c", "size": "1Gi",
                                 "accessModes": ["ReadWriteOncePod"]}},
                {"pvcTemplate": {"name": "d", "size": "1Gi", "storageClassName": "none"}},
            ])
        );
        assert_eq!(spec["pvcTemplates"]["volumeMode"], "Block");
        assert_eq!(
            spec["pvcTemplates"]["accessModes"],
            json!(["ReadWriteMany"])
        );
    }

    #[test]
    fn a_complete_transfer_is_the_same_object_and_no_profiles_fill_nothing() {
        let transfer: Arc<Transfer> = Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
                "metadata": {"name": "t", "namespace": "vms"},
                "spec": {"source": {"url": "https://h/i.raw"},
                         "targets": [{"pvcTemplate": {"name": "a", "size": "1Gi",
                                      "volumeMode": "Block", "accessModes": ["ReadWriteOnce"]}}]},
            }))
            .unwrap(),
        );
        assert!(Arc::ptr_eq(
            &defaults().fill_transfer(transfer.clone()),
            &transfer
        ));
        let mut open = transfer.as_ref().clone();
        open.spec.targets[0]
            .pvc_template
            .as_mut()
            .unwrap()
            .volume_mode = None;
        let open = Arc::new(open);
        assert!(Arc::ptr_eq(
            &ClassDefaults::default().fill_transfer(open.clone()),
            &open
        ));
    }

    #[test]
    fn the_overhead_is_the_profiles_else_cdis() {
        let d = defaults();
        assert_eq!(d.overhead_ppm(Some("rbd")), 100_000);
        assert_eq!(d.overhead_ppm(Some("local")), 55_000);
        assert_eq!(d.overhead_ppm(Some("other")), 55_000);
        assert_eq!(d.overhead_ppm(None), 55_000);
    }
}
