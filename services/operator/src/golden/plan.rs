//! A GoldenImage's steps as pure functions of its status, the time and what was observed:
//! when to poll, what a poll's version means (nothing new, or an import: its Transfer),
//! and what an import's end records (the newest import current, the oldest beyond
//! `importsToKeep` to delete).

use std::collections::{BTreeMap, BTreeSet};

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
use crate::schedule::reconcile::duration_text;
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
    /// An import's VolumeSnapshot is not ready and the snapshot controller says why.
    pub const SNAPSHOT_NOT_READY: &str = "SnapshotNotReady";
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

/// The longest name of an import's objects: a DNS label (a Transfer's name is a label
/// value on its mover's pods and jobs).
const NAME_MAX: usize = 63;

/// The name of the import (its Transfer, claim and VolumeSnapshot) a poll of `golden`,
/// whose status is `status`, starts for `version` (None: a source without a version):
/// `<name>-<8 hex>`, the hex of a hash of the GoldenImage's uid, the version and the
/// poll before this one (`status.lastPollTime`, which every poll moves). So every import
/// has a name of its own (a version imported again, after the source rolled back, is
/// not the earlier import's objects), while a reconcile that repeats this very poll (a
/// crash between the Transfer's create and the status write, a read of a stale copy)
/// names the same import and adopts what it left. A name the current import, a kept
/// import or the import under way holds is never given (the hash is salted until it
/// differs). At most [`NAME_MAX`] characters, dots as dashes: a DNS label.
pub fn import_name(
    golden: &GoldenImage,
    status: &GoldenImageStatus,
    version: Option<&str>,
) -> String {
    let name = golden.metadata.name.clone().unwrap_or_default();
    let keep = NAME_MAX - 9;
    let prefix = name[..name.len().min(keep)].replace('.', "-");
    let uid = golden.metadata.uid.clone().unwrap_or_default();
    let version = version.map_or_else(|| "none".to_string(), |v| format!("version:{v}"));
    let run = status
        .last_poll_time
        .as_ref()
        .map_or_else(|| "first".to_string(), |t| from_time(t).to_rfc3339());
    let taken = held(status);
    (0u32..)
        .map(|salt| {
            let seed = format!("{uid}\n{version}\n{run}\n{salt}");
            let digest = Sha256::digest(seed.as_bytes());
            let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
            format!("{prefix}-{hex}")
        })
        .find(|n| !taken.contains(n.as_str()))
        .unwrap_or_default()
}

/// Every name `status` holds: its current claim and snapshot, its kept imports' claims
/// and snapshots, the import under way's.
fn held(status: &GoldenImageStatus) -> BTreeSet<&str> {
    let mut names: BTreeSet<&str> = BTreeSet::new();
    names.extend(status.current_claim.as_deref());
    names.extend(status.current_snapshot.as_deref());
    for r in &status.imports {
        names.insert(&r.claim);
        names.extend(r.snapshot.as_deref());
    }
    if let Some(i) = &status.importing {
        names.insert(&i.claim);
        names.insert(&i.transfer);
        names.extend(i.snapshot.as_deref());
    }
    names
}

/// `delete` without what `status` still holds: its current claim or snapshot and the
/// claims and snapshots of the imports it keeps (an import kept as a snapshot holds no
/// claim: its claim was deleted once the snapshot was ready).
fn not_held(status: &GoldenImageStatus, delete: Vec<Kept>) -> Vec<Kept> {
    let claims: BTreeSet<&str> = status
        .imports
        .iter()
        .filter(|r| r.snapshot.is_none())
        .map(|r| r.claim.as_str())
        .chain(status.current_claim.as_deref())
        .collect();
    let snapshots: BTreeSet<&str> = status
        .imports
        .iter()
        .filter_map(|r| r.snapshot.as_deref())
        .chain(status.current_snapshot.as_deref())
        .collect();
    delete
        .into_iter()
        .filter(|k| match k {
            Kept::Claim(c) => !claims.contains(c.as_str()),
            Kept::Snapshot(s) => !snapshots.contains(s.as_str()),
        })
        .collect()
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
    let claim = import_name(golden, status, version);
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

/// How long an import's VolumeSnapshot may go on reporting an error before its cut (no
/// VolumeSnapshotContent bound yet: a wrong `volumeSnapshotClassName`, no default class
/// for the driver, a driver that cannot snapshot; the snapshot controller's
/// `status.error`, since its `time`) before the import fails. Errors after the cut (a
/// driver's CreateSnapshot timing out while the snapshot is made) are retried by the
/// snapshot controller and bounded only by the GoldenImage's `snapshotTimeoutSeconds`;
/// errors the controller clears meanwhile fail nothing.
pub const SNAPSHOT_ERROR_DEADLINE: chrono::TimeDelta = chrono::TimeDelta::minutes(10);

/// What the cluster shows of an import's VolumeSnapshot that is not ready yet.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NotReady {
    /// When it was created.
    pub created: Option<DateTime<Utc>>,
    /// Whether a VolumeSnapshotContent is bound to it (the driver was asked to cut it).
    pub cut: bool,
    /// The snapshot controller's error, if it reports one.
    pub error: Option<String>,
    /// Since when it reports that error (`status.error.time`).
    pub error_since: Option<DateTime<Utc>>,
}

/// What an import whose VolumeSnapshot is not ready comes to.
#[derive(Debug, Clone, PartialEq)]
pub enum SnapshotWait {
    /// It waits: its status (the snapshot controller's error, if any, in the Progressing
    /// condition with the time the import fails at), and the text of a Warning event
    /// when that error is new.
    Waiting(Box<GoldenImageStatus>, Option<String>),
    /// The deadline passed: why the import failed (its claim and snapshot are deleted
    /// and the next fire imports again, [`after_import`]).
    Expired(String),
}

/// The deadline of an import's snapshot that is `seen` not ready: `timeout` (the
/// GoldenImage's `snapshotTimeoutSeconds`) after its creation, or sooner
/// [`SNAPSHOT_ERROR_DEADLINE`] after an error before its cut first showed (else after its
/// creation); None when the API gave no time to count from.
pub fn snapshot_deadline(seen: &NotReady, timeout: chrono::TimeDelta) -> Option<DateTime<Utc>> {
    let made = seen.created.map(|t| t + timeout);
    [made, error_deadline(seen)].into_iter().flatten().min()
}

/// [`SNAPSHOT_ERROR_DEADLINE`] after the error `seen` shows before its cut first showed
/// (else after the snapshot's creation); None without such an error.
fn error_deadline(seen: &NotReady) -> Option<DateTime<Utc>> {
    seen.error.as_ref().filter(|_| !seen.cut)?;
    seen.error_since
        .or(seen.created)
        .map(|t| t + SNAPSHOT_ERROR_DEADLINE)
}

/// How long until an import's VolumeSnapshot that is `seen` not ready at `now` is looked
/// at again: every 5 s in its first minute, then a tenth of its age, at most a minute (a
/// snapshot that takes hours is not asked for thousands of times).
pub fn snapshot_look(seen: &NotReady, now: DateTime<Utc>) -> std::time::Duration {
    const FIRST: std::time::Duration = std::time::Duration::from_secs(5);
    const MOST: std::time::Duration = std::time::Duration::from_secs(60);
    let age = seen
        .created
        .and_then(|c| (now - c).to_std().ok())
        .unwrap_or_default();
    (age / 10).clamp(FIRST, MOST)
}

/// The longest snapshot controller's error a condition quotes.
const MAX_SNAPSHOT_ERROR: usize = 1024;

/// The import `importing` whose VolumeSnapshot is `seen` not ready at `now`: it waits,
/// saying what the snapshot controller says, or it failed once the snapshot's deadline
/// ([`snapshot_deadline`]) passed.
pub fn snapshot_not_ready(
    golden: &GoldenImage,
    status: &GoldenImageStatus,
    importing: &Importing,
    seen: &NotReady,
    now: DateTime<Utc>,
) -> SnapshotWait {
    let name = importing.snapshot.clone().unwrap_or_default();
    let error = seen
        .error
        .as_deref()
        .map(|e| crate::events::within(e.trim(), MAX_SNAPSHOT_ERROR).to_string());
    let timeout = golden.spec.snapshot_timeout();
    let deadline = snapshot_deadline(seen, timeout);
    if deadline.is_some_and(|d| d <= now) {
        let on_error = error_deadline(seen).is_some_and(|d| d <= now);
        let waited = match &error {
            Some(e) if on_error => format!(
                "its VolumeSnapshot {name} was not ready {} after the snapshot controller reported: {e}",
                duration_text(SNAPSHOT_ERROR_DEADLINE)
            ),
            Some(e) => format!(
                "its VolumeSnapshot {name} was not ready {} after it was made; the snapshot controller reports: {e}",
                duration_text(timeout)
            ),
            None => format!(
                "its VolumeSnapshot {name} was not ready {} after it was made (the snapshot controller reported no error)",
                duration_text(timeout)
            ),
        };
        return SnapshotWait::Expired(waited);
    }
    let fails = deadline
        .map(|d| {
            let at = d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            format!(" (the import fails at {at} if it is still not ready)")
        })
        .unwrap_or_default();
    let text = match &error {
        Some(e) => format!(
            "copied into pvc/{}; its VolumeSnapshot {name} is not ready: {e}{fails}",
            importing.claim
        ),
        None => format!(
            "copied into pvc/{}; waiting for its VolumeSnapshot {name} to be ready{fails}",
            importing.claim
        ),
    };
    let before = status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::PROGRESSING)
        .map(|c| c.message.as_str());
    let warning = (error.is_some() && before != Some(text.as_str())).then(|| text.clone());
    let mut next = status.clone();
    next.observed_generation = golden.metadata.generation;
    let reason = match error {
        Some(_) => condition::SNAPSHOT_NOT_READY,
        None => condition::IMPORTING,
    };
    set(&mut next, condition::PROGRESSING, true, reason, &text);
    SnapshotWait::Waiting(Box::new(next), warning)
}

/// The status after the import `importing` ended at `now`, and what to delete: on
/// success the imports beyond `keep` (their snapshots, or their claims) and, for an
/// import kept as a snapshot, its claim; on failure the failed import's claim and
/// snapshot. Never what the new status still holds (its current import, a kept one).
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
            let dropped = not_held(&next, dropped);
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
            let delete = not_held(&next, delete);
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
        let claim = import_name(&g, &GoldenImageStatus::default(), Some("etag:\"v1\""));
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
        // A source without a version imports on every fire, under a name of its own.
        let a = import_name(&g, &GoldenImageStatus::default(), None);
        let b = import_name(&g, &status, None);
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

    /// Runs polls of `versions` each imported to success, an hour apart: the names of the
    /// imports, what each one's end deletes, and the last status.
    fn imports(
        g: &GoldenImage,
        versions: &[&str],
    ) -> (Vec<String>, Vec<Vec<Kept>>, GoldenImageStatus) {
        let mut status = GoldenImageStatus::default();
        let (mut names, mut deleted) = (Vec::new(), Vec::new());
        for (i, v) in versions.iter().enumerate() {
            let now = at("2026-12-06T10:00:00Z") + chrono::Duration::hours(i as i64);
            let AfterPoll::Import(_, polled) = after_poll(g, &status, Some(v), None, now, None)
            else {
                panic!("a version that is not the current one imports");
            };
            let mut importing = polled.importing.clone().unwrap();
            let mut polled = polled;
            if g.spec.keep_as() == crate::crd::KeepAs::Snapshot {
                polled = snapshotting(g, &polled, &importing);
                importing = polled.importing.clone().unwrap();
            }
            let (next, dropped) = after_import(g, &polled, &importing, &Ended::Succeeded, now);
            names.push(importing.claim.clone());
            deleted.push(dropped);
            status = next;
        }
        (names, deleted, status)
    }

    #[test]
    fn a_version_imported_again_is_an_import_of_its_own_and_the_current_one_is_never_pruned() {
        // The source rolled back A -> B -> A, importsToKeep 2, kept as claims and as
        // snapshots: the second import of A has its own name; the first one of A is
        // pruned, not the current one.
        for keep_as in [crate::crd::KeepAs::Claim, crate::crd::KeepAs::Snapshot] {
            let mut g = golden(2);
            g.spec.keep_as = Some(keep_as);
            let (names, deleted, status) = imports(&g, &["etag:a", "etag:b", "etag:a"]);
            assert_ne!(names[2], names[0], "{keep_as:?}");
            let held = match keep_as {
                crate::crd::KeepAs::Claim => Current::Claim(names[2].clone()),
                crate::crd::KeepAs::Snapshot => Current::Snapshot(names[2].clone()),
            };
            assert_eq!(current(&status), Some(held));
            let kept: Vec<&str> = status.imports.iter().map(|r| r.claim.as_str()).collect();
            assert_eq!(kept, [names[2].as_str(), names[1].as_str()], "{keep_as:?}");
            let pruned = match keep_as {
                crate::crd::KeepAs::Claim => vec![Kept::Claim(names[0].clone())],
                crate::crd::KeepAs::Snapshot => vec![
                    Kept::Claim(names[2].clone()),
                    Kept::Snapshot(names[0].clone()),
                ],
            };
            assert_eq!(deleted[2], pruned, "{keep_as:?}");
        }
        // keep 3, A -> B -> C -> A: the first A goes once the second is current.
        let (names, deleted, status) =
            imports(&golden(3), &["etag:a", "etag:b", "etag:c", "etag:a"]);
        assert_ne!(names[3], names[0]);
        assert_eq!(deleted[3], [Kept::Claim(names[0].clone())]);
        assert_eq!(status.current_claim.as_deref(), Some(names[3].as_str()));
        assert_eq!(status.imports.len(), 3);
    }

    #[test]
    fn an_import_name_is_the_same_for_a_repeated_poll_and_never_a_held_one() {
        let g = golden(2);
        let polled = GoldenImageStatus {
            last_poll_time: Some(to_time(at("2026-12-06T10:00:00Z"))),
            ..Default::default()
        };
        // The same poll again (a crash before the status was written, a stale read):
        // the same name, so the Transfer it made is adopted.
        let name = import_name(&g, &polled, Some("etag:a"));
        assert_eq!(import_name(&g, &polled, Some("etag:a")), name);
        // Another poll, another version, another GoldenImage: another name.
        let later = GoldenImageStatus {
            last_poll_time: Some(to_time(at("2026-12-06T16:00:00Z"))),
            ..Default::default()
        };
        assert_ne!(import_name(&g, &later, Some("etag:a")), name);
        assert_ne!(import_name(&g, &polled, Some("etag:b")), name);
        assert_ne!(import_name(&g, &polled, None), name);
        let mut other = g.clone();
        other.metadata.uid = Some("gi-2".into());
        assert_ne!(import_name(&other, &polled, Some("etag:a")), name);
        // A name some record holds (a hash that collided) is never given.
        for held in [
            GoldenImageStatus {
                current_claim: Some(name.clone()),
                ..polled.clone()
            },
            GoldenImageStatus {
                current_snapshot: Some(name.clone()),
                ..polled.clone()
            },
            GoldenImageStatus {
                imports: vec![ImportRecord {
                    claim: name.clone(),
                    snapshot: None,
                    version: "etag:a".into(),
                    imported_at: to_time(at("2026-12-05T10:00:00Z")),
                }],
                ..polled.clone()
            },
        ] {
            let other = import_name(&g, &held, Some("etag:a"));
            assert_ne!(other, name);
            assert!(other.starts_with("fedora-") && other.len() == 15, "{other}");
        }
        // A long dotted name: a DNS label of at most 63 characters.
        let mut long = g.clone();
        long.metadata.name = Some(format!("images.{}", "f".repeat(240)));
        let name = import_name(&long, &polled, Some("etag:a"));
        assert_eq!(name.len(), 63);
        assert!(
            name.starts_with("images-fff") && !name.contains('.'),
            "{name}"
        );
    }

    #[test]
    fn a_failed_import_never_deletes_what_the_golden_image_holds() {
        // An import recorded by an earlier operator under the current import's name (the
        // version's hash) fails: the current claim and snapshot stay.
        let mut g = golden(2);
        g.spec.keep_as = Some(crate::crd::KeepAs::Snapshot);
        let status = GoldenImageStatus {
            current_snapshot: Some("fedora-aaaa0000".into()),
            imports: vec![ImportRecord {
                claim: "fedora-aaaa0000".into(),
                snapshot: Some("fedora-aaaa0000".into()),
                version: "etag:a".into(),
                imported_at: to_time(at("2026-12-05T10:00:00Z")),
            }],
            ..Default::default()
        };
        let importing = Importing {
            transfer: "fedora-aaaa0000".into(),
            claim: "fedora-aaaa0000".into(),
            version: "etag:a".into(),
            snapshot: Some("fedora-aaaa0000".into()),
        };
        let end = Ended::Failed("its VolumeSnapshot was deleted before it was ready".into());
        let (after, delete) =
            after_import(&g, &status, &importing, &end, at("2026-12-06T10:00:00Z"));
        // The claim of a snapshot-kept import is gone already: deleting it is harmless.
        assert_eq!(delete, [Kept::Claim("fedora-aaaa0000".into())]);
        assert_eq!(after.current_snapshot.as_deref(), Some("fedora-aaaa0000"));
        // Kept as claims: nothing is deleted.
        g.spec.keep_as = Some(crate::crd::KeepAs::Claim);
        let status = GoldenImageStatus {
            current_claim: Some("fedora-aaaa0000".into()),
            current_snapshot: None,
            imports: vec![ImportRecord {
                snapshot: None,
                ..status.imports[0].clone()
            }],
            ..status
        };
        let importing = Importing {
            snapshot: None,
            ..importing
        };
        let (_, delete) = after_import(&g, &status, &importing, &end, at("2026-12-06T10:00:00Z"));
        assert!(delete.is_empty(), "{delete:?}");
    }

    #[test]
    fn a_snapshot_not_ready_says_why_once_and_fails_the_import_at_its_deadline() {
        let mut g = golden(2);
        g.spec.keep_as = Some(crate::crd::KeepAs::Snapshot);
        let importing = Importing {
            transfer: "fedora-1".into(),
            claim: "fedora-1".into(),
            version: "etag:b".into(),
            snapshot: Some("fedora-1".into()),
        };
        let status = snapshotting(
            &g,
            &GoldenImageStatus {
                current_snapshot: Some("fedora-0".into()),
                ..Default::default()
            },
            &importing,
        );
        let created = at("2026-12-06T10:00:00Z");
        let error = "Failed to get snapshot class with error volumesnapshotclass.snapshot.storage.k8s.io \"rbd-snaps\" not found";
        let failing = NotReady {
            created: Some(created),
            cut: false,
            error: Some(error.into()),
            error_since: Some(created + chrono::Duration::minutes(1)),
        };
        let six_hours = g.spec.snapshot_timeout();
        assert_eq!(six_hours, chrono::TimeDelta::hours(6));
        assert_eq!(
            snapshot_deadline(&failing, six_hours),
            Some(at("2026-12-06T10:11:00Z"))
        );
        // An error after the cut (the driver's CreateSnapshot timing out, retried by the
        // snapshot controller) does not shorten the wait.
        let retried = NotReady {
            cut: true,
            error: Some("rpc error: code = DeadlineExceeded".into()),
            ..failing.clone()
        };
        assert_eq!(
            snapshot_deadline(&retried, six_hours),
            Some(at("2026-12-06T16:00:00Z"))
        );
        assert!(matches!(
            snapshot_not_ready(
                &g,
                &status,
                &importing,
                &retried,
                at("2026-12-06T10:30:00Z")
            ),
            SnapshotWait::Waiting(..)
        ));
        // The error, first seen: in the Progressing condition, and a Warning.
        let now = at("2026-12-06T10:02:00Z");
        let SnapshotWait::Waiting(next, Some(warning)) =
            snapshot_not_ready(&g, &status, &importing, &failing, now)
        else {
            panic!("a new error waits with a warning");
        };
        let text = format!("copied into pvc/fedora-1; its VolumeSnapshot fedora-1 is not ready: {error} (the import fails at 2026-12-06T10:11:00Z if it is still not ready)");
        assert_eq!(warning, text);
        let progressing = next
            .conditions
            .iter()
            .find(|c| c.type_ == "Progressing")
            .unwrap();
        assert_eq!(progressing.message, text);
        assert_eq!(progressing.reason, "SnapshotNotReady");
        assert_eq!(reason(&next, "Ready"), reason(&status, "Ready"));
        // Seen again: the same status, no second warning.
        let later = at("2026-12-06T10:10:59Z");
        assert_eq!(
            snapshot_not_ready(&g, &next, &importing, &failing, later),
            SnapshotWait::Waiting(next.clone(), None)
        );
        // Another error: said again.
        let other = NotReady {
            error: Some("driver timeout".into()),
            ..failing.clone()
        };
        let SnapshotWait::Waiting(_, Some(warning)) =
            snapshot_not_ready(&g, &next, &importing, &other, later)
        else {
            panic!("another error warns again");
        };
        assert!(
            warning.contains("is not ready: driver timeout"),
            "{warning}"
        );
        // Past the deadline: the import failed, saying why, and after_import deletes its
        // claim and snapshot and keeps the current one.
        let SnapshotWait::Expired(why) =
            snapshot_not_ready(&g, &next, &importing, &failing, at("2026-12-06T10:11:00Z"))
        else {
            panic!("the deadline passed");
        };
        assert_eq!(
            why,
            format!("its VolumeSnapshot fedora-1 was not ready 10m0s after the snapshot controller reported: {error}")
        );
        let (after, delete) = after_import(
            &g,
            &next,
            &importing,
            &Ended::Failed(why),
            at("2026-12-06T10:11:00Z"),
        );
        assert_eq!(
            delete,
            [
                Kept::Claim("fedora-1".into()),
                Kept::Snapshot("fedora-1".into())
            ]
        );
        assert!(after.importing.is_none());
        assert_eq!(after.current_snapshot.as_deref(), Some("fedora-0"));
        assert_eq!(reason(&after, "Progressing"), "False ImportFailed");
        // No error: no warning, and six hours from its creation.
        let slow = NotReady {
            created: Some(created),
            ..NotReady::default()
        };
        let SnapshotWait::Waiting(quiet, None) =
            snapshot_not_ready(&g, &status, &importing, &slow, at("2026-12-06T15:59:59Z"))
        else {
            panic!("a slow snapshot without an error waits quietly");
        };
        assert_eq!(reason(&quiet, "Progressing"), "True Importing");
        assert!(matches!(
            snapshot_not_ready(&g, &status, &importing, &slow, at("2026-12-06T16:00:00Z")),
            SnapshotWait::Expired(why) if why.contains("not ready 6h0m0s after it was made")
        ));
        // An error the controller keeps renewing still ends six hours after creation.
        let renewed = NotReady {
            error_since: Some(at("2026-12-06T15:55:00Z")),
            ..failing.clone()
        };
        assert_eq!(
            snapshot_deadline(&renewed, six_hours),
            Some(at("2026-12-06T16:00:00Z"))
        );
        assert!(matches!(
            snapshot_not_ready(&g, &status, &importing, &renewed, at("2026-12-06T16:00:00Z")),
            SnapshotWait::Expired(why) if why.ends_with(&format!("not ready 6h0m0s after it was made; the snapshot controller reports: {error}"))
        ));
        // An error without a time counts from the snapshot's creation; no time at all
        // never expires.
        let untimed = NotReady {
            error_since: None,
            ..failing
        };
        assert_eq!(
            snapshot_deadline(&untimed, six_hours),
            Some(at("2026-12-06T10:10:00Z"))
        );
        assert_eq!(snapshot_deadline(&NotReady::default(), six_hours), None);
        // Looked at every 5 s at first, then less often, at most a minute apart.
        let look = |minutes: i64| {
            snapshot_look(&slow, created + chrono::Duration::minutes(minutes)).as_secs()
        };
        assert_eq!(
            [look(0), look(1), look(5), look(10), look(300)],
            [5, 6, 30, 60, 60]
        );
        assert_eq!(snapshot_look(&NotReady::default(), created).as_secs(), 5);
        // The GoldenImage's own timeout: an hour.
        let mut hasty = g.clone();
        hasty.spec.snapshot_timeout_seconds = Some(3600);
        assert!(matches!(
            snapshot_not_ready(&hasty, &status, &importing, &slow, at("2026-12-06T11:00:00Z")),
            SnapshotWait::Expired(why) if why.contains("not ready 1h0m0s after it was made")
        ));
    }
}
