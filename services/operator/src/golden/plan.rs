//! A GoldenImage's steps as pure functions of its status, the time and what was observed:
//! when to poll, what a poll's version means (nothing new, or an import: its Transfer),
//! and what an import's end records (the newest import current, the oldest beyond
//! `importsToKeep` to delete).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use kube::api::{DynamicObject, ObjectMeta};
use kube::Resource;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::controller::life::Life;
use crate::crd::{
    ClaimRetention, GoldenImage, GoldenImageStatus, ImportRecord, Importing, Phase, PvcTemplate,
    Transfer, TransferSpec, TransferTarget,
};
use crate::mover::pod::labels;
use crate::schedule::build::volume_snapshot_api;
use crate::schedule::reconcile::from_time;
pub(crate) use crate::schedule::reconcile::to_time;

/// The label naming an import's GoldenImage by uid.
pub const GOLDEN_IMAGE_UID: &str = "ferry.dev/golden-image";

/// Condition types and reasons.
pub mod condition {
    /// An import is current.
    pub const READY: &str = "Ready";
    /// An import runs.
    pub const PROGRESSING: &str = "Progressing";
    /// The newest version is imported.
    pub const UP_TO_DATE: &str = "UpToDate";
    /// An import of a new version runs.
    pub const IMPORTING: &str = "Importing";
    /// Nothing imported yet.
    pub const NO_IMPORT: &str = "NoImport";
    /// The last import failed.
    pub const IMPORT_FAILED: &str = "ImportFailed";
    /// The source could not be asked for its version.
    pub const POLL_FAILED: &str = "PollFailed";
    /// The spec is not valid.
    pub const INVALID_SPEC: &str = "InvalidSpec";
}

/// What holds a GoldenImage's current import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Current {
    /// A claim (`keepAs: Claim`): consumers read or clone it.
    Claim(String),
    /// A VolumeSnapshot (`keepAs: Snapshot`): consumers restore a claim from it.
    Snapshot(String),
}

impl Current {
    /// As messages name it: `pvc/NAME` or `VolumeSnapshot NAME`.
    pub fn shown(&self) -> String {
        match self {
            Self::Claim(c) => format!("pvc/{c}"),
            Self::Snapshot(s) => format!("VolumeSnapshot {s}"),
        }
    }
}

/// The current import of a GoldenImage whose status is `status`: its claim or its
/// snapshot; None before the first import succeeded.
pub fn current(status: &GoldenImageStatus) -> Option<Current> {
    if let Some(s) = &status.current_snapshot {
        return Some(Current::Snapshot(s.clone()));
    }
    status.current_claim.clone().map(Current::Claim)
}

/// Something an import left that is to be deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// A claim.
    Claim(String),
    /// A VolumeSnapshot.
    Snapshot(String),
}

/// What to do now.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Look at the import under way.
    Follow(Importing),
    /// Ask the source for its version.
    Poll,
    /// Nothing until then.
    Wait(DateTime<Utc>),
}

/// The next step: an import under way is followed; a poll is due when none was made or
/// the next poll time passed.
pub fn next(status: &GoldenImageStatus, now: DateTime<Utc>) -> Step {
    if let Some(importing) = &status.importing {
        return Step::Follow(importing.clone());
    }
    match status.next_poll_time.as_ref().map(from_time) {
        Some(at) if at > now => Step::Wait(at),
        _ => Step::Poll,
    }
}

/// The claim (and Transfer) name of an import of `version` (or, for a source without a
/// version, of the poll at `now`): `<name>-<8 hex of its hash>`.
pub fn import_name(name: &str, version: Option<&str>, now: DateTime<Utc>) -> String {
    let seed = version.map_or_else(
        || format!("time:{}", now.timestamp_nanos_opt().unwrap_or_default()),
        str::to_string,
    );
    let digest = Sha256::digest(seed.as_bytes());
    let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    let keep = 253 - hex.len() - 1;
    format!("{}-{hex}", &name[..name.len().min(keep)])
}

/// What a poll that found `version` leads to.
#[derive(Debug, Clone)]
pub enum AfterPoll {
    /// The current import holds it: only the poll times change.
    Unchanged(GoldenImageStatus),
    /// A new import: its Transfer, and the status that records it.
    Import(Box<Transfer>, GoldenImageStatus),
}

/// The status after a poll at `now` whose next fire is `next_fire`.
pub fn after_poll(
    golden: &GoldenImage,
    status: &GoldenImageStatus,
    version: Option<&str>,
    unversioned_why: Option<&str>,
    now: DateTime<Utc>,
    next_fire: Option<DateTime<Utc>>,
) -> AfterPoll {
    let mut next = status.clone();
    next.observed_generation = golden.metadata.generation;
    next.last_poll_time = Some(to_time(now));
    next.next_poll_time = next_fire.map(to_time);
    if version.is_some() && version == status.current_version.as_deref() {
        let held = current(status).map(|c| c.shown()).unwrap_or_default();
        set(
            &mut next,
            condition::READY,
            true,
            condition::UP_TO_DATE,
            &format!(
                "{held} holds the source's version {}",
                version.unwrap_or_default()
            ),
        );
        set(
            &mut next,
            condition::PROGRESSING,
            false,
            condition::UP_TO_DATE,
            "",
        );
        return AfterPoll::Unchanged(next);
    }
    let name = golden.metadata.name.clone().unwrap_or_default();
    let claim = import_name(&name, version, now);
    let transfer = import_transfer(golden, &claim);
    next.importing = Some(Importing {
        transfer: claim.clone(),
        claim: claim.clone(),
        version: version.unwrap_or_default().to_string(),
        snapshot: None,
    });
    let why = match (version, unversioned_why) {
        (Some(v), _) => format!("importing version {v} into pvc/{claim}"),
        (None, Some(why)) => format!("importing into pvc/{claim} ({why}: every fire imports)"),
        (None, None) => format!("importing into pvc/{claim}"),
    };
    set(
        &mut next,
        condition::PROGRESSING,
        true,
        condition::IMPORTING,
        &why,
    );
    if current(&next).is_none() {
        set(
            &mut next,
            condition::READY,
            false,
            condition::NO_IMPORT,
            &why,
        );
    }
    AfterPoll::Import(Box::new(transfer), next)
}

/// The status after a failed poll: the reason, the next poll time.
pub fn poll_failed(
    golden: &GoldenImage,
    status: &GoldenImageStatus,
    why: &str,
    now: DateTime<Utc>,
    next_fire: Option<DateTime<Utc>>,
) -> GoldenImageStatus {
    let mut next = status.clone();
    next.observed_generation = golden.metadata.generation;
    next.last_poll_time = Some(to_time(now));
    next.next_poll_time = next_fire.map(to_time);
    let ready = current(&next).is_some();
    set(
        &mut next,
        condition::READY,
        ready,
        condition::POLL_FAILED,
        why,
    );
    next
}

/// The Transfer of an import into the claim `claim`, owned by the GoldenImage; the claim
/// outlives it (`claimRetention: Retain`).
pub fn import_transfer(golden: &GoldenImage, claim: &str) -> Transfer {
    let spec = &golden.spec;
    Transfer {
        metadata: ObjectMeta {
            name: Some(claim.to_string()),
            namespace: golden.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([
                (labels::MANAGED_BY.to_string(), "ferry-operator".to_string()),
                (
                    GOLDEN_IMAGE_UID.to_string(),
                    golden.metadata.uid.clone().unwrap_or_default(),
                ),
            ])),
            owner_references: golden.controller_owner_ref(&()).map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        spec: TransferSpec {
            source: spec.source.clone(),
            targets: vec![TransferTarget {
                endpoint: Default::default(),
                pvc_template: Some(PvcTemplate {
                    name: claim.to_string(),
                    storage_class_name: spec.claim.storage_class_name.clone(),
                    size: spec.claim.size.clone(),
                    volume_mode: spec.claim.volume_mode,
                    access_modes: spec.claim.access_modes.clone(),
                }),
            }],
            options: spec.options.clone(),
            expected_digest: None,
            mover: spec.mover.clone(),
            claim_retention: Some(ClaimRetention::Retain),
            clone_strategy: None,
            pvc_templates: None,
            fan_out: None,
            relay: None,
        },
        status: None,
    }
}

/// How an import ended, as its Transfer shows it.
#[derive(Debug, Clone, PartialEq)]
pub enum Ended {
    /// Still running (or pending).
    Running,
    /// Succeeded.
    Succeeded,
    /// Failed or cancelled, with its message; or gone.
    Failed(String),
}

/// What an import's Transfer says.
pub fn ended(transfer: Option<&Transfer>) -> Ended {
    let Some(t) = transfer else {
        return Ended::Failed("its Transfer was deleted".into());
    };
    let status = t.status.clone().unwrap_or_default();
    match status.phase {
        Phase::Succeeded => Ended::Succeeded,
        Phase::Failed | Phase::Cancelled => Ended::Failed(
            status
                .message
                .unwrap_or_else(|| format!("{:?}", status.phase)),
        ),
        _ => Ended::Running,
    }
}

/// The VolumeSnapshot of an import's claim (`keepAs: Snapshot`), named like it and
/// labelled with the GoldenImage's uid; like the claims, it outlives the GoldenImage.
pub fn import_snapshot(golden: &GoldenImage, claim: &str) -> DynamicObject {
    let mut object = DynamicObject::new(claim, &volume_snapshot_api());
    object.metadata.namespace = golden.metadata.namespace.clone();
    object.metadata.labels = Some(BTreeMap::from([
        (labels::MANAGED_BY.to_string(), "ferry-operator".to_string()),
        (
            GOLDEN_IMAGE_UID.to_string(),
            golden.metadata.uid.clone().unwrap_or_default(),
        ),
    ]));
    let mut spec = json!({"source": {"persistentVolumeClaimName": claim}});
    if let Some(class) = &golden.spec.volume_snapshot_class_name {
        spec["volumeSnapshotClassName"] = json!(class);
    }
    object.data = json!({ "spec": spec });
    object
}

/// The status once the import `importing` copied its image and its claim's snapshot was
/// made: the import waits for the snapshot to be ready.
pub fn snapshotting(
    golden: &GoldenImage,
    status: &GoldenImageStatus,
    importing: &Importing,
) -> GoldenImageStatus {
    let mut next = status.clone();
    next.observed_generation = golden.metadata.generation;
    next.importing = Some(Importing {
        snapshot: Some(importing.claim.clone()),
        ..importing.clone()
    });
    set(
        &mut next,
        condition::PROGRESSING,
        true,
        condition::IMPORTING,
        &format!(
            "copied into pvc/{0}; waiting for its VolumeSnapshot {0} to be ready",
            importing.claim
        ),
    );
    next
}

/// The status after the import `importing` ended at `now`, and what to delete: on
/// success the imports beyond `keep` (their snapshots, or their claims) and, for an
/// import kept as a snapshot, its claim; on failure the failed import's claim and
/// snapshot.
pub fn after_import(
    golden: &GoldenImage,
    status: &GoldenImageStatus,
    importing: &Importing,
    end: &Ended,
    now: DateTime<Utc>,
) -> (GoldenImageStatus, Vec<Kept>) {
    let mut next = status.clone();
    next.observed_generation = golden.metadata.generation;
    next.importing = None;
    let record_of = |r: ImportRecord| match r.snapshot {
        Some(s) => Kept::Snapshot(s),
        None => Kept::Claim(r.claim),
    };
    match end {
        Ended::Running => (next, Vec::new()),
        Ended::Succeeded => {
            next.imports.retain(|r| r.claim != importing.claim);
            next.imports.insert(
                0,
                ImportRecord {
                    claim: importing.claim.clone(),
                    snapshot: importing.snapshot.clone(),
                    version: importing.version.clone(),
                    imported_at: to_time(now),
                },
            );
            let mut dropped: Vec<Kept> = next
                .imports
                .split_off(golden.spec.keep().min(next.imports.len()))
                .into_iter()
                .map(record_of)
                .collect();
            let held = match &importing.snapshot {
                Some(s) => {
                    dropped.insert(0, Kept::Claim(importing.claim.clone()));
                    Current::Snapshot(s.clone())
                }
                None => Current::Claim(importing.claim.clone()),
            };
            next.current_claim = match &held {
                Current::Claim(c) => Some(c.clone()),
                Current::Snapshot(_) => None,
            };
            next.current_snapshot = match &held {
                Current::Snapshot(s) => Some(s.clone()),
                Current::Claim(_) => None,
            };
            next.current_version =
                (!importing.version.is_empty()).then(|| importing.version.clone());
            let text = format!("{} holds the newest import", held.shown());
            set(
                &mut next,
                condition::READY,
                true,
                condition::UP_TO_DATE,
                &text,
            );
            set(
                &mut next,
                condition::PROGRESSING,
                false,
                condition::UP_TO_DATE,
                &text,
            );
            (next, dropped)
        }
        Ended::Failed(why) => {
            let text = format!("the import into pvc/{} failed: {why}", importing.claim);
            let ready = current(&next).is_some();
            set(
                &mut next,
                condition::READY,
                ready,
                condition::IMPORT_FAILED,
                &text,
            );
            set(
                &mut next,
                condition::PROGRESSING,
                false,
                condition::IMPORT_FAILED,
                &text,
            );
            let mut delete = vec![Kept::Claim(importing.claim.clone())];
            delete.extend(importing.snapshot.clone().map(Kept::Snapshot));
            (next, delete)
        }
    }
}

/// Sets a condition; its transition time changes only when its status does (the mover
/// kinds' bookkeeping, [`Life::set_condition`]).
pub fn set(status: &mut GoldenImageStatus, type_: &str, value: bool, reason: &str, message: &str) {
    let mut life = Life {
        conditions: std::mem::take(&mut status.conditions),
        observed_generation: status.observed_generation,
        ..Life::default()
    };
    life.set_condition(type_, value, reason, message);
    status.conditions = life.conditions;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golden(keep: u32) -> GoldenImage {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "GoldenImage",
            "metadata": {"name": "fedora", "namespace": "vms", "uid": "gi-1", "generation": 2},
            "spec": {
                "source": {"url": "https://images.example.com/fedora.qcow2"},
                "trigger": {"schedule": "0 */6 * * *"},
                "importsToKeep": keep,
                "claim": {"size": "10Gi", "storageClassName": "rbd", "volumeMode": "Block"},
            },
        }))
        .unwrap()
    }

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn reason(status: &GoldenImageStatus, type_: &str) -> String {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| format!("{} {}", c.status, c.reason))
            .unwrap_or_default()
    }

    #[test]
    fn a_poll_is_due_first_and_then_at_the_next_fire() {
        let now = at("2026-12-06T10:00:00Z");
        assert_eq!(next(&GoldenImageStatus::default(), now), Step::Poll);
        let status = GoldenImageStatus {
            next_poll_time: Some(to_time(at("2026-12-06T12:00:00Z"))),
            ..Default::default()
        };
        assert_eq!(next(&status, now), Step::Wait(at("2026-12-06T12:00:00Z")));
        assert_eq!(next(&status, at("2026-12-06T12:00:00Z")), Step::Poll);
    }

    #[test]
    fn a_new_version_is_imported_and_the_same_one_is_not() {
        let g = golden(2);
        let now = at("2026-12-06T10:00:00Z");
        let fire = Some(at("2026-12-06T12:00:00Z"));
        let AfterPoll::Import(transfer, status) = after_poll(
            &g,
            &GoldenImageStatus::default(),
            Some("etag:\"v1\""),
            None,
            now,
            fire,
        ) else {
            panic!("a first poll imports");
        };
        let claim = import_name("fedora", Some("etag:\"v1\""), now);
        assert!(claim.starts_with("fedora-") && claim.len() == "fedora-".len() + 8);
        assert_eq!(transfer.metadata.name.as_deref(), Some(claim.as_str()));
        assert_eq!(
            serde_json::to_value(&transfer.spec).unwrap(),
            json!({
                "source": {"url": "https://images.example.com/fedora.qcow2"},
                "targets": [{"pvcTemplate": {"name": claim, "storageClassName": "rbd", "size": "10Gi", "volumeMode": "Block"}}],
                "claimRetention": "Retain",
            })
        );
        assert_eq!(
            transfer.metadata.owner_references.as_ref().unwrap()[0].uid,
            "gi-1"
        );
        assert_eq!(reason(&status, "Ready"), "False NoImport");
        assert_eq!(reason(&status, "Progressing"), "True Importing");
        let importing = status.importing.clone().unwrap();
        let (status, dropped) = after_import(&g, &status, &importing, &Ended::Succeeded, now);
        assert!(dropped.is_empty());
        assert_eq!(status.current_claim.as_deref(), Some(claim.as_str()));
        assert_eq!(status.current_version.as_deref(), Some("etag:\"v1\""));
        assert_eq!(reason(&status, "Ready"), "True UpToDate");
        // The same version again: nothing imported.
        let later = at("2026-12-06T12:00:00Z");
        let AfterPoll::Unchanged(same) =
            after_poll(&g, &status, Some("etag:\"v1\""), None, later, None)
        else {
            panic!("an unchanged version imports nothing");
        };
        assert_eq!(same.last_poll_time, Some(to_time(later)));
        assert_eq!(same.imports, status.imports);
    }

    #[test]
    fn the_newest_imports_are_kept_and_the_oldest_claims_go() {
        let g = golden(2);
        let mut status = GoldenImageStatus::default();
        let mut names = Vec::new();
        for (i, v) in ["etag:a", "etag:b", "etag:c"].iter().enumerate() {
            let now = at("2026-12-06T10:00:00Z") + chrono::Duration::hours(i as i64);
            let AfterPoll::Import(_, polled) = after_poll(&g, &status, Some(v), None, now, None)
            else {
                panic!("a new version imports");
            };
            let importing = polled.importing.clone().unwrap();
            names.push(importing.claim.clone());
            let (next, dropped) = after_import(&g, &polled, &importing, &Ended::Succeeded, now);
            status = next;
            if i < 2 {
                assert!(dropped.is_empty());
            } else {
                assert_eq!(dropped, [Kept::Claim(names[0].clone())]);
            }
        }
        let kept: Vec<&str> = status.imports.iter().map(|r| r.claim.as_str()).collect();
        assert_eq!(kept, [names[2].as_str(), names[1].as_str()]);
        assert_eq!(status.current_claim.as_deref(), Some(names[2].as_str()));
    }

    #[test]
    fn a_failed_import_keeps_the_current_one_and_deletes_its_own_claim() {
        let g = golden(3);
        let now = at("2026-12-06T10:00:00Z");
        let current = GoldenImageStatus {
            current_claim: Some("fedora-old".into()),
            current_version: Some("etag:a".into()),
            ..Default::default()
        };
        let AfterPoll::Import(_, polled) =
            after_poll(&g, &current, Some("etag:b"), None, now, None)
        else {
            panic!("a new version imports");
        };
        let importing = polled.importing.clone().unwrap();
        let end = Ended::Failed("source: not found".into());
        let (status, delete) = after_import(&g, &polled, &importing, &end, now);
        assert_eq!(delete, [Kept::Claim(importing.claim.clone())]);
        assert_eq!(status.current_claim.as_deref(), Some("fedora-old"));
        assert_eq!(reason(&status, "Ready"), "True ImportFailed");
        assert!(status.importing.is_none());
        // A source without a version imports on every fire, under a name of the time.
        let a = import_name("fedora", None, now);
        let b = import_name("fedora", None, now + chrono::Duration::hours(6));
        assert_ne!(a, b);
    }

    #[test]
    fn imports_kept_as_snapshots_point_at_the_snapshot_and_drop_their_claims() {
        let mut g = golden(1);
        g.spec.keep_as = Some(crate::crd::KeepAs::Snapshot);
        g.spec.volume_snapshot_class_name = Some("rbd-snapshots".into());
        let mut status = GoldenImageStatus::default();
        let mut names: Vec<String> = Vec::new();
        for (i, v) in ["etag:a", "etag:b"].iter().enumerate() {
            let now = at("2026-12-06T10:00:00Z") + chrono::Duration::hours(i as i64);
            let AfterPoll::Import(_, polled) = after_poll(&g, &status, Some(v), None, now, None)
            else {
                panic!("a new version imports");
            };
            let importing = polled.importing.clone().unwrap();
            let snapshot = import_snapshot(&g, &importing.claim);
            assert_eq!(
                snapshot.metadata.name.as_deref(),
                Some(importing.claim.as_str())
            );
            assert_eq!(
                snapshot.data,
                json!({"spec": {"source": {"persistentVolumeClaimName": importing.claim},
                                "volumeSnapshotClassName": "rbd-snapshots"}})
            );
            assert_eq!(
                snapshot.metadata.labels.as_ref().unwrap()[GOLDEN_IMAGE_UID],
                "gi-1"
            );
            let waiting = snapshotting(&g, &polled, &importing);
            assert_eq!(reason(&waiting, "Progressing"), "True Importing");
            let importing = waiting.importing.clone().unwrap();
            assert_eq!(
                importing.snapshot.as_deref(),
                Some(importing.claim.as_str())
            );
            let (next, dropped) = after_import(&g, &waiting, &importing, &Ended::Succeeded, now);
            let mut expected = vec![Kept::Claim(importing.claim.clone())];
            if i == 1 {
                expected.push(Kept::Snapshot(names[0].clone()));
            }
            assert_eq!(dropped, expected);
            assert_eq!(next.current_claim, None);
            assert_eq!(
                next.current_snapshot.as_deref(),
                Some(importing.claim.as_str())
            );
            assert_eq!(
                current(&next),
                Some(Current::Snapshot(importing.claim.clone()))
            );
            assert_eq!(
                next.imports[0].snapshot.as_deref(),
                Some(importing.claim.as_str())
            );
            names.push(importing.claim.clone());
            status = next;
        }
        // Unchanged: the snapshot is named as what holds the version.
        let AfterPoll::Unchanged(same) = after_poll(
            &g,
            &status,
            Some("etag:b"),
            None,
            at("2026-12-06T12:00:00Z"),
            None,
        ) else {
            panic!("the same version imports nothing");
        };
        let ready = same.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(
            ready.message,
            format!(
                "VolumeSnapshot {} holds the source's version etag:b",
                names[1]
            )
        );
        // A failed snapshot deletes both.
        let importing = Importing {
            transfer: "t".into(),
            claim: "c".into(),
            version: "etag:c".into(),
            snapshot: Some("c".into()),
        };
        let (after, delete) = after_import(
            &g,
            &status,
            &importing,
            &Ended::Failed("VolumeSnapshot c failed".into()),
            at("2026-12-06T13:00:00Z"),
        );
        assert_eq!(
            delete,
            [Kept::Claim("c".into()), Kept::Snapshot("c".into())]
        );
        assert_eq!(current(&after), Some(Current::Snapshot(names[1].clone())));
        assert_eq!(reason(&after, "Ready"), "True ImportFailed");
    }
}
