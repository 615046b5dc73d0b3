//! Which claims the populator serves: those whose `spec.dataSourceRef` names a
//! `ferry.dev` `VolumeImageSource` (an image to copy, or a repository's newest backup of
//! a source), `Backup` (a snapshot to restore) or `BackupSchedule` (the newest snapshot
//! of its claim). Every other claim is ignored before any request.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Resource;

use crate::crd::{Backup, BackupSchedule, VolumeImageSource, GROUP};

/// What a claim is filled from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// A VolumeImageSource: a Transfer copies the image.
    Image,
    /// A Backup: a Restore writes its snapshot.
    Backup,
    /// A BackupSchedule: a Restore writes the newest snapshot of its claim.
    Schedule,
}

impl SourceKind {
    /// The kind's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Image => "VolumeImageSource",
            Self::Backup => "Backup",
            Self::Schedule => "BackupSchedule",
        }
    }
}

/// The source a claim names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRef {
    /// Its kind.
    pub kind: SourceKind,
    /// Its name.
    pub name: String,
    /// The namespace the reference gives, when it gives one (cross-namespace references
    /// are not served).
    pub namespace: Option<String>,
}

/// The source `pvc` asks to be populated from, if it names one of ferry's.
pub fn of(pvc: &PersistentVolumeClaim) -> Option<SourceRef> {
    let r = pvc.spec.as_ref()?.data_source_ref.as_ref()?;
    if r.api_group.as_deref() != Some(GROUP) {
        return None;
    }
    let kind = if r.kind == VolumeImageSource::kind(&()) {
        SourceKind::Image
    } else if r.kind == Backup::kind(&()) {
        SourceKind::Backup
    } else if r.kind == BackupSchedule::kind(&()) {
        SourceKind::Schedule
    } else {
        return None;
    };
    Some(SourceRef {
        kind,
        name: r.name.clone(),
        namespace: r.namespace.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(source: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(
            json!({"metadata": {"name": "d"}, "spec": {"dataSourceRef": source}}),
        )
        .unwrap()
    }

    #[test]
    fn only_ferry_volume_image_sources_are_served() {
        let ours =
            claim(json!({"apiGroup": "ferry.dev", "kind": "VolumeImageSource", "name": "f"}));
        assert_eq!(
            of(&ours),
            Some(SourceRef {
                kind: SourceKind::Image,
                name: "f".into(),
                namespace: None
            })
        );
        let backup = claim(json!({"apiGroup": "ferry.dev", "kind": "Backup", "name": "b"}));
        assert_eq!(of(&backup).map(|s| s.kind), Some(SourceKind::Backup));
        let snapshot = claim(json!({"apiGroup": "snapshot.storage.k8s.io",
                                    "kind": "VolumeSnapshot", "name": "f"}));
        assert_eq!(of(&snapshot), None);
        let other_group = claim(json!({"apiGroup": "cdi.kubevirt.io",
                                       "kind": "VolumeImageSource", "name": "f"}));
        assert_eq!(of(&other_group), None);
        let core = claim(json!({"kind": "PersistentVolumeClaim", "name": "f"}));
        assert_eq!(of(&core), None);
        assert_eq!(of(&PersistentVolumeClaim::default()), None);
    }
}
