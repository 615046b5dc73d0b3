//! Which claims the populator serves: those whose `spec.dataSourceRef` names a
//! `ferry.dev` `VolumeImageSource`. Every other claim is ignored before any request.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Resource;

use crate::crd::{VolumeImageSource, GROUP};

/// The VolumeImageSource a claim names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRef {
    /// Its name.
    pub name: String,
    /// The namespace the reference gives, when it gives one (cross-namespace references
    /// are not served).
    pub namespace: Option<String>,
}

/// The VolumeImageSource `pvc` asks to be populated from, if it names one.
pub fn of(pvc: &PersistentVolumeClaim) -> Option<SourceRef> {
    let r = pvc.spec.as_ref()?.data_source_ref.as_ref()?;
    let ours = r.api_group.as_deref() == Some(GROUP) && r.kind == VolumeImageSource::kind(&());
    ours.then(|| SourceRef {
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
                name: "f".into(),
                namespace: None
            })
        );
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
