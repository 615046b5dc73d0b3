//! The populator's decisions as pure functions of what it read: whether a claim's source
//! can fill it yet (and, when not, the event that says why), and where its prime claim may
//! be provisioned. The reconciler reads and writes; `ferry operator render` asks the same
//! functions about objects from a file.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;

use crate::crd::{Backup, BackupSchedule, LatestBackupRef, Phase, VolumeImageSource};

use super::names;

/// An event on the user's claim saying why it waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// A Warning (the user must act), or Normal.
    pub warning: bool,
    /// The event's reason.
    pub reason: &'static str,
    /// What it says.
    pub text: String,
}

impl Note {
    fn new(warning: bool, reason: &'static str, text: String) -> Self {
        Self {
            warning,
            reason,
            text,
        }
    }
}

/// Why a claim naming `name` in `namespace` cannot be filled from the VolumeImageSource
/// `found` (None: it does not exist); None when it can.
pub fn image_source_problem(
    name: &str,
    namespace: &str,
    found: Option<&VolumeImageSource>,
) -> Option<Note> {
    let Some(source) = found else {
        return Some(Note::new(
            false,
            "Pending",
            format!(
                "waiting for VolumeImageSource {name} in namespace {namespace}: create it, or fix spec.dataSourceRef"
            ),
        ));
    };
    let e = source.spec.validate().err()?;
    Some(Note::new(
        true,
        "InvalidSource",
        format!("VolumeImageSource {name}: {e}"),
    ))
}

/// Why a claim naming the Backup `name` in `namespace` cannot be filled from `found` (None:
/// it does not exist) yet, or ever; None when it can (it succeeded).
pub fn backup_problem(name: &str, namespace: &str, found: Option<&Backup>) -> Option<Note> {
    let Some(backup) = found else {
        return Some(Note::new(
            false,
            "Pending",
            format!(
                "waiting for Backup {name} in namespace {namespace}: create it, or fix spec.dataSourceRef"
            ),
        ));
    };
    match backup.status.as_ref().map(|s| s.phase) {
        Some(Phase::Succeeded) => None,
        Some(phase @ (Phase::Failed | Phase::Cancelled)) => Some(Note::new(
            true,
            "InvalidSource",
            format!(
                "Backup {name} ended {phase:?}: it has no snapshot to restore; name another Backup in spec.dataSourceRef"
            ),
        )),
        _ => Some(Note::new(
            false,
            "Pending",
            format!("waiting for Backup {name} to succeed"),
        )),
    }
}

/// The newest backup a claim naming the BackupSchedule `name` in `namespace` is filled
/// from (`found`: None when the schedule does not exist), or why it cannot be yet: a
/// schedule without a successful backup has nothing to restore.
pub fn schedule_source(
    name: &str,
    namespace: &str,
    found: Option<&BackupSchedule>,
) -> Result<LatestBackupRef, Note> {
    let Some(schedule) = found else {
        return Err(Note::new(
            false,
            "Pending",
            format!(
                "waiting for BackupSchedule {name} in namespace {namespace}: create it, or fix spec.dataSourceRef"
            ),
        ));
    };
    if schedule
        .status
        .as_ref()
        .and_then(|s| s.last_snapshot.as_ref())
        .is_none()
    {
        return Err(Note::new(
            false,
            "NoBackupYet",
            format!("waiting for the first successful backup of BackupSchedule {name}"),
        ));
    }
    Ok(LatestBackupRef {
        repository: schedule.spec.repository.clone(),
        source_id: schedule.spec.source_id_in(namespace),
        restore_as_of: None,
    })
}

/// The storage class a claim names, if any.
pub fn class_of(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .filter(|c| !c.is_empty())
}

/// Where the prime claim may be provisioned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Wherever the provisioner likes (Immediate binding, or no class).
    Anywhere,
    /// On the node the scheduler picked for the user's claim.
    Node(String),
    /// Not until the storage class exists: the event saying so.
    NoClass(Note),
    /// Not until the scheduler picks a node for the user's claim (WaitForFirstConsumer);
    /// that update wakes the claim.
    NoNode,
}

/// Where the prime claim of `pvc` may be provisioned, given its storage class as found
/// (`class`: None when the claim names none; `Some(None)` when it does not exist).
pub fn placement(pvc: &PersistentVolumeClaim, class: Option<Option<&StorageClass>>) -> Placement {
    let Some(found) = class else {
        return Placement::Anywhere;
    };
    let Some(sc) = found else {
        let name = class_of(pvc).unwrap_or_default();
        return Placement::NoClass(Note::new(
            false,
            "Pending",
            format!("waiting for StorageClass {name}: it does not exist"),
        ));
    };
    if sc.volume_binding_mode.as_deref() != Some("WaitForFirstConsumer") {
        return Placement::Anywhere;
    }
    let node = pvc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::SELECTED_NODE));
    match node {
        Some(node) => Placement::Node(node.clone()),
        None => Placement::NoNode,
    }
}
