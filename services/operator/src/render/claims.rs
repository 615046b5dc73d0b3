//! Render's look at the claims the volume populator fills (a `dataSourceRef` naming a
//! VolumeImageSource, a Backup or a BackupSchedule): the populator's decisions ([`plan`]) and objects
//! ([`build`]): the prime claim, and the Transfer or Restore that fills it, which render
//! then plans like any resource. The user's claim itself is not written (its waits are
//! events on a cluster, the summary's lines here).

use crate::populator::build::{self, ClaimIds};
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
        let prime = build::prime_claim(pvc, &ids, node.as_deref());
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
        let place = node.map(|n| format!(" on node {n}")).unwrap_or_default();
        notes.push(format!(
            "{title} populating from {kind} {}: prime claim pvc/{prime_name}{place} and {} created",
            source.name,
            filler.title().trim_end_matches(':'),
        ));
        world.spawned.push(filler);
    }
    notes
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
