//! Render's look at the claims the volume populator fills (a `dataSourceRef` naming a
//! VolumeImageSource, a Backup or a BackupSchedule): the populator's decisions ([`plan`]) and objects
//! ([`build`]): the prime claim, and the Transfer or Restore that fills it, which render
//! then plans like any resource. The user's claim itself is not written (its waits are
//! events on a cluster, the summary's lines here).

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::clone::reconcile as clone_reconcile;
use crate::clone::strategy::{self, Decision};
use crate::crd::VolumeImageSource;
use crate::golden::Current;
use crate::populator::build::{self, ClaimIds};
use crate::populator::clone;
use crate::populator::plan::{self, Placement};
use crate::populator::source::{self, SourceKind};

use super::input::namespace_of;
use super::{made_up_uid, Resource, World};

/// Plans every claim of the file the populator serves; one summary line each.
pub(crate) fn populate(world: &mut World<'_>) -> Vec<String> {
    let cluster = world.cluster;
    let mut notes = Vec::new();
    for (i, pvc) in cluster.claims.values().enumerate() {
        let Some(source) = source::of(pvc) else {
            continue;
        };
        let namespace = namespace_of(&pvc.metadata);
        let ids = ClaimIds {
            namespace: namespace.clone(),
            name: pvc.metadata.name.clone().unwrap_or_default(),
            uid: pvc
                .metadata
                .uid
                .clone()
                .unwrap_or_else(|| made_up_uid(2, i)),
        };
        let title = format!("PersistentVolumeClaim {namespace}/{}:", ids.name);
        let bound = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .is_some_and(|v| !v.is_empty());
        if bound {
            notes.push(format!("{title} has a volume: nothing to populate"));
            continue;
        }
        let kind = source.kind.name();
        if let Some(other) = source.namespace.as_deref().filter(|ns| *ns != namespace) {
            notes.push(format!(
                "{title} {kind} {other}/{} is in another namespace: ferry populates only from a {kind} in the claim's namespace ({namespace})",
                source.name
            ));
            continue;
        }
        let key = (namespace.clone(), source.name.clone());
        let problem = match source.kind {
            SourceKind::Image => {
                plan::image_source_problem(&source.name, &namespace, cluster.sources.get(&key))
            }
            SourceKind::Backup => {
                plan::backup_problem(&source.name, &namespace, cluster.backups.get(&key))
            }
            SourceKind::Schedule => plan::schedule_source(
                &source.name,
                &namespace,
                schedule_named(cluster, &namespace, &source.name),
            )
            .err(),
        };
        if let Some(note) = problem {
            notes.push(format!(
                "{title} {} ({}): {}",
                level(note.warning),
                note.reason,
                note.text
            ));
            continue;
        }
        let class = plan::class_of(pvc).map(|name| cluster.classes.get(name));
        let node = match plan::placement(pvc, class) {
            Placement::Anywhere => None,
            Placement::Node(node) => Some(node),
            Placement::NoClass(note) => {
                notes.push(format!(
                    "{title} {} ({}): {}",
                    level(note.warning),
                    note.reason,
                    note.text
                ));
                continue;
            }
            Placement::NoNode => {
                notes.push(format!(
                    "{title} waiting for the scheduler to pick a node for it (its StorageClass binds on first consumer): a pod using it must be scheduled"
                ));
                continue;
            }
        };
        let place = node
            .as_ref()
            .map(|n| format!(" on node {n}"))
            .unwrap_or_default();
        let mut fallback = String::new();
        if source.kind == SourceKind::Image {
            match storage_clone(world, &ids, pvc, &cluster.sources[&key]) {
                StorageClone::Copy(why) => fallback = why,
                StorageClone::Refused(why) => {
                    notes.push(format!("{title} Warning (InvalidSource): {why}"));
                    continue;
                }
                StorageClone::Clone(recorded) => {
                    if let clone::Recorded::Clone {
                        snapshot: true,
                        class,
                        source: from,
                    } = &recorded
                    {
                        world.create(&clone::volume_snapshot(&ids, from, class));
                    }
                    let prime = clone::prime_claim(pvc, &ids, node.as_deref(), &recorded, None);
                    world.create_claim(&prime);
                    let made = match recorded {
                        clone::Recorded::Clone {
                            snapshot: true,
                            source: from,
                            ..
                        } => format!(
                            "restored from VolumeSnapshot {} of pvc/{from}",
                            clone::snapshot_name(&ids.uid)
                        ),
                        clone::Recorded::Clone { source: from, .. } => {
                            format!("a CSI clone of pvc/{from}")
                        }
                        clone::Recorded::Restore { snapshot } => {
                            format!("restored from the GoldenImage's VolumeSnapshot {snapshot}")
                        }
                        _ => continue,
                    };
                    notes.push(format!(
                        "{title} populating from {kind} {}: prime claim pvc/{}{place}, {made} (no mover)",
                        source.name,
                        crate::populator::names::prime(&ids.uid),
                    ));
                    continue;
                }
            }
        }
        let default_class = crate::class_defaults::default_class(cluster.classes.values());
        let profile = crate::class_defaults::profile_among(
            &cluster.profiles,
            default_class.as_deref(),
            plan::class_of(pvc),
        );
        let overhead = crate::class_defaults::overhead_ppm(profile.as_ref());
        let prime = build::prime_claim_sized(pvc, &ids, node.as_deref(), Some(overhead));
        let prime_name = prime.metadata.name.clone().unwrap_or_default();
        world.create_claim(&prime);
        let filler = match source.kind {
            SourceKind::Image => match build::image_filler(&ids, &cluster.sources[&key]) {
                build::ImageFiller::Transfer(mut t) => {
                    t.metadata.uid = Some(made_up_uid(3, i));
                    Resource::Transfer(t)
                }
                build::ImageFiller::Restore(mut r) => {
                    r.metadata.uid = Some(made_up_uid(3, i));
                    Resource::Restore(r)
                }
            },
            SourceKind::Backup => {
                let mut r = build::restore(&ids, &cluster.backups[&key]);
                r.metadata.uid = Some(made_up_uid(3, i));
                Resource::Restore(Box::new(r))
            }
            SourceKind::Schedule => {
                let schedule = schedule_named(cluster, &namespace, &source.name);
                let Ok(latest) = plan::schedule_source(&source.name, &namespace, schedule) else {
                    continue;
                };
                let mover = schedule.and_then(|s| s.spec.mover.clone());
                let mut r = build::restore_latest(&ids, &latest, mover);
                r.metadata.uid = Some(made_up_uid(3, i));
                Resource::Restore(Box::new(r))
            }
        };
        notes.push(format!(
            "{title} populating from {kind} {}: prime claim pvc/{prime_name}{place} and {} created{fallback}",
            source.name,
            filler.title().trim_end_matches(':'),
        ));
        world.spawned.push(filler);
    }
    notes
}

/// How the populator fills a claim from a VolumeImageSource, as
/// [`crate::populator::clone`] decides it.
enum StorageClone {
    /// A copy; the summary's addition saying why not a clone (empty: none was possible).
    Copy(String),
    /// Refused: why.
    Refused(String),
    /// A storage clone.
    Clone(clone::Recorded),
}

fn storage_clone(
    world: &World<'_>,
    ids: &ClaimIds,
    pvc: &PersistentVolumeClaim,
    vis: &VolumeImageSource,
) -> StorageClone {
    let source = match clone::claim_source(vis) {
        clone::ClaimSource::None => return StorageClone::Copy(String::new()),
        clone::ClaimSource::Claim(source) => source,
        clone::ClaimSource::Golden(name) => {
            let key = (ids.namespace.clone(), name);
            let golden = world.cluster.golden_images.get(&key);
            match golden.and_then(crate::golden::current_import) {
                Some(Current::Claim(claim)) => crate::crd::PvcRef::named(claim),
                Some(Current::Snapshot(snapshot)) => {
                    let claim = golden.map(|g| g.spec.claim.clone());
                    return restore(world, ids, pvc, vis, snapshot, claim);
                }
                None => return StorageClone::Copy(String::new()),
            }
        }
    };
    let claims = world.claims_in(&ids.namespace);
    let classes: Vec<_> = world.cluster.classes.values().cloned().collect();
    let facts = clone_reconcile::facts(
        claims.get(&source.name),
        &classes,
        &world.cluster.profiles,
        &world.cluster.snapshot_classes,
    );
    if facts.source.is_none() {
        return StorageClone::Copy(String::new());
    }
    let decision = strategy::decide(&clone::as_transfer(ids, vis, &source, pvc), &facts);
    planned(decision, |d| clone::Recorded::Clone {
        snapshot: matches!(d, Decision::Snapshot { .. }),
        class: match d {
            Decision::Snapshot { class } => class.clone(),
            _ => String::new(),
        },
        source: source.name.clone(),
    })
}

/// A decision as render plans it: a storage clone recorded by `record`, else a copy (its
/// summary's addition saying why) or a refusal.
fn planned(decision: Decision, record: impl FnOnce(&Decision) -> clone::Recorded) -> StorageClone {
    match decision {
        Decision::Copy { fallback } => StorageClone::Copy(
            fallback
                .map(|why| format!(" (copy: no storage clone: {why})"))
                .unwrap_or_default(),
        ),
        Decision::Refused(why) => StorageClone::Refused(why),
        decision => StorageClone::Clone(record(&decision)),
    }
}

/// A GoldenImage's VolumeSnapshot `snapshot` (of a claim as `claim` describes) restored
/// into the prime claim, when the strategy allows it.
fn restore(
    world: &World<'_>,
    ids: &ClaimIds,
    pvc: &PersistentVolumeClaim,
    vis: &VolumeImageSource,
    snapshot: String,
    claim: Option<crate::crd::golden_image::ImportClaim>,
) -> StorageClone {
    let classes: Vec<_> = world.cluster.classes.values().cloned().collect();
    let mut facts = clone_reconcile::facts(
        None,
        &classes,
        &world.cluster.profiles,
        &world.cluster.snapshot_classes,
    );
    let profile = |c: &crate::crd::golden_image::ImportClaim| {
        crate::class_defaults::profile_among(
            &world.cluster.profiles,
            facts.default_class.as_deref(),
            c.storage_class_name.as_deref(),
        )
    };
    facts.source = claim.map(|c| strategy::ClaimFacts {
        unbound_until_used: false,
        mode: c
            .volume_mode
            .or(profile(&c).and_then(|p| p.volume_mode))
            .unwrap_or(crate::crd::VolumeMode::Filesystem),
        class: c.storage_class_name.or(facts.default_class.clone()),
        bytes: None,
    });
    let source = crate::crd::PvcRef::named(snapshot.clone());
    let decision = strategy::decide(&clone::as_transfer(ids, vis, &source, pvc), &facts);
    planned(decision, |_| clone::Recorded::Restore { snapshot })
}

/// The BackupSchedule `name` of `namespace` in the file, if any.
fn schedule_named<'a>(
    cluster: &'a super::input::Cluster,
    namespace: &str,
    name: &str,
) -> Option<&'a crate::crd::BackupSchedule> {
    cluster.schedules.iter().find(|s| {
        s.metadata.name.as_deref() == Some(name) && namespace_of(&s.metadata) == namespace
    })
}

fn level(warning: bool) -> &'static str {
    if warning {
        "Warning"
    } else {
        "waiting"
    }
}
