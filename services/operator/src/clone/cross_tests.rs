//! The pure parts of a clone across namespaces against exact JSON: the child Transfer,
//! the SubjectAccessReview, the denial's message and each hand-over step.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use serde_json::{json, Value};

use super::cross::{access_review, child_transfer, denied_message, templates};
use super::handover::{next, volume_of, Observed, Step};
use crate::admission::stamp::Requester;
use crate::controller::kind::Ids;
use crate::crd::Transfer;

fn parent() -> Transfer {
    serde_json::from_value(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "vm", "namespace": "vms", "uid": "u-1"},
        "spec": {
            "source": {"pvc": {"name": "golden", "namespace": "images"}},
            "targets": [{"pvcTemplate": {"name": "vm-disk", "size": "10Gi", "storageClassName": "rbd"}}],
            "cloneStrategy": "snapshot",
            "claimRetention": "Retain",
        },
    }))
    .unwrap()
}

fn ids() -> Ids {
    Ids {
        namespace: "vms".into(),
        name: "vm".into(),
        uid: "u-1".into(),
    }
}

/// The creator's mover settings stay in its own namespace: the child's mover in the
/// source namespace runs with the operator's defaults.
#[test]
fn the_child_takes_no_mover_settings_from_the_parent() {
    let mut p = parent();
    p.spec.mover = serde_json::from_value(json!({
        "serviceAccountName": "privileged", "nodeName": "node-x",
        "tolerations": [{"operator": "Exists"}],
    }))
    .unwrap();
    let child = child_transfer(&p, &ids(), "images");
    assert_eq!(child.spec.mover, None);
    assert_eq!(child.spec.clone_strategy, p.spec.clone_strategy);
}

#[test]
fn the_child_transfer_fills_temporary_claims_in_the_source_namespace() {
    let child = child_transfer(&parent(), &ids(), "images");
    assert_eq!(
        serde_json::to_value(&child).unwrap(),
        json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {
                "name": "xns-u-1", "namespace": "images",
                "labels": {"app.kubernetes.io/managed-by": "ferry-operator", "ferry.dev/clone-of": "u-1"},
                "annotations": {"ferry.dev/clone-for": "vms/vm"},
            },
            "spec": {
                "source": {"pvc": {"name": "golden"}},
                "targets": [{"pvcTemplate": {"name": "xns-u-1-0", "size": "10Gi", "storageClassName": "rbd"}}],
                "cloneStrategy": "snapshot",
                "claimRetention": "Delete",
            },
        })
    );
    child.spec.validate().unwrap();
}

#[test]
fn the_review_asks_whether_the_creator_may_clone_the_claim() {
    let requester = Requester {
        user: "alice".into(),
        uid: Some("a-1".into()),
        groups: vec!["devs".into()],
        extra: [("scopes".to_string(), vec!["x".to_string()])].into(),
    };
    assert_eq!(
        serde_json::to_value(access_review(&requester, "images", "golden")).unwrap(),
        json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "metadata": {},
            "spec": {
                "user": "alice", "uid": "a-1", "groups": ["devs"], "extra": {"scopes": ["x"]},
                "resourceAttributes": {"namespace": "images", "verb": "create",
                                       "group": "ferry.dev", "resource": "transfers",
                                       "subresource": "source", "name": "golden"},
            },
        })
    );
    assert_eq!(
        denied_message("bob", "images", "golden", Some("")),
        "user bob may not clone persistentvolumeclaim golden of namespace images: a clone from another namespace needs `create` on `transfers/source` (API group ferry.dev) there, as CDI's clones need `datavolumes/source`. Grant it with a Role in namespace images with the rule {apiGroups: [ferry.dev], resources: [transfers/source], resourceNames: [golden], verbs: [create]} and a RoleBinding of it to user bob, then create the Transfer again"
    );
}

fn pvc(v: Value) -> PersistentVolumeClaim {
    serde_json::from_value(v).unwrap()
}

fn temporary(volume: Option<&str>) -> PersistentVolumeClaim {
    pvc(
        json!({"metadata": {"name": "xns-u-1-0", "namespace": "images", "uid": "t-1"},
               "spec": {"volumeName": volume}, "status": {"phase": "Bound"}}),
    )
}

fn volume(
    policy: &str,
    saved: Option<&str>,
    claim: (&str, &str, Option<&str>),
) -> PersistentVolume {
    let mut v = json!({"metadata": {"name": "pv-1"},
        "spec": {"persistentVolumeReclaimPolicy": policy,
                 "claimRef": {"namespace": claim.0, "name": claim.1, "uid": claim.2}}});
    if let Some(s) = saved {
        v["metadata"]["annotations"] =
            json!({"ferry.dev/reclaim-policy": s, "ferry.dev/handed-over-for": "u-1"});
    }
    serde_json::from_value(v).unwrap()
}

/// A volume taken for the hand-over whose policy was put back.
fn restored() -> PersistentVolume {
    let mut pv = volume("Delete", None, ("vms", "vm-disk", Some("x")));
    pv.metadata.annotations =
        Some([("ferry.dev/handed-over-for".to_string(), "u-1".to_string())].into());
    pv
}

fn target(bound: bool) -> PersistentVolumeClaim {
    pvc(json!({"metadata": {"name": "vm-disk", "namespace": "vms",
                            "labels": {"ferry.dev/owner-uid": "u-1"}},
               "spec": {"volumeName": "pv-1"},
               "status": {"phase": if bound { "Bound" } else { "Pending" }}}))
}

fn step(observed: &Observed) -> Step {
    let parent = parent();
    let template = &templates(&parent)[0];
    next(&parent, &ids(), template, "images", "xns-u-1-0", observed)
}

#[test]
fn a_volume_is_handed_over_step_by_step() {
    let tmp = temporary(Some("pv-1"));
    // Its policy kept, Retain set.
    let pv = volume("Delete", None, ("images", "xns-u-1-0", Some("t-1")));
    let obs = Observed {
        temporary: Some(&tmp),
        volume: Some(&pv),
        target: None,
    };
    assert_eq!(
        step(&obs),
        Step::PatchVolume {
            name: "pv-1".into(),
            patch: json!({"metadata": {"annotations": {"ferry.dev/reclaim-policy": "Delete",
                                                       "ferry.dev/handed-over-for": "u-1"}},
                          "spec": {"persistentVolumeReclaimPolicy": "Retain"}}),
        }
    );
    // Pointed at the target, with no uid.
    let pv = volume(
        "Retain",
        Some("Delete"),
        ("images", "xns-u-1-0", Some("t-1")),
    );
    let obs = Observed {
        temporary: Some(&tmp),
        volume: Some(&pv),
        target: None,
    };
    assert_eq!(
        step(&obs),
        Step::PatchVolume {
            name: "pv-1".into(),
            patch: json!({"spec": {"claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "namespace": "vms", "name": "vm-disk", "uid": null, "resourceVersion": null}}}),
        }
    );
    // The target made on the volume.
    let pv = volume("Retain", Some("Delete"), ("vms", "vm-disk", None));
    let obs = Observed {
        temporary: Some(&tmp),
        volume: Some(&pv),
        target: None,
    };
    let Step::CreateTarget(made) = step(&obs) else {
        panic!("{:?}", step(&obs))
    };
    assert_eq!(
        serde_json::to_value(made.as_ref()).unwrap(),
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "vm-disk", "namespace": "vms",
                "labels": {"app.kubernetes.io/managed-by": "ferry-operator", "ferry.dev/owner-uid": "u-1"},
                "annotations": {"ferry.dev/handed-over-from": "images/xns-u-1-0"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "rbd",
                     "volumeMode": "Filesystem", "volumeName": "pv-1",
                     "resources": {"requests": {"storage": "10Gi"}}},
        })
    );
    // The temporary claim deleted.
    let waiting = target(false);
    let obs = Observed {
        temporary: Some(&tmp),
        volume: Some(&pv),
        target: Some(&waiting),
    };
    assert_eq!(
        step(&obs),
        Step::DeleteTemporary("images".into(), "xns-u-1-0".into())
    );
    // Binding.
    let obs = Observed {
        temporary: None,
        volume: Some(&pv),
        target: Some(&waiting),
    };
    assert_eq!(
        step(&obs),
        Step::Wait("pvc/vm-disk is binding to volume pv-1".into())
    );
    // Bound: the old policy back.
    let bound = target(true);
    let obs = Observed {
        temporary: None,
        volume: Some(&pv),
        target: Some(&bound),
    };
    assert_eq!(
        step(&obs),
        Step::PatchVolume {
            name: "pv-1".into(),
            patch: json!({"metadata": {"annotations": {"ferry.dev/reclaim-policy": null}},
                          "spec": {"persistentVolumeReclaimPolicy": "Delete"}}),
        }
    );
    let pv = restored();
    let obs = Observed {
        temporary: None,
        volume: Some(&pv),
        target: Some(&bound),
    };
    assert_eq!(step(&obs), Step::Done("pv-1".into()));
}

/// Only the temporary claim's own volume (bound to it by uid) is ever taken: a target
/// claim made beforehand naming someone's volume, or a temporary claim swapped for one
/// holding another volume, takes nothing and fails the Transfer.
#[test]
fn a_volume_that_is_not_the_temporary_claims_is_never_taken() {
    let victim = volume("Delete", None, ("team-b", "data", Some("v-9")));
    let planted = target(false);
    let obs = Observed {
        temporary: None,
        volume: Some(&victim),
        target: Some(&planted),
    };
    assert!(
        matches!(step(&obs), Step::Conflict(m) if m.contains("is not the volume of pvc/xns-u-1-0")),
        "{:?}",
        step(&obs)
    );
    let swapped = temporary(Some("pv-1"));
    let other_uid = volume(
        "Delete",
        None,
        ("images", "xns-u-1-0", Some("someone-else")),
    );
    let obs = Observed {
        temporary: Some(&swapped),
        volume: Some(&other_uid),
        target: None,
    };
    assert!(matches!(step(&obs), Step::Conflict(_)), "{:?}", step(&obs));
    // A bound target on an unmarked volume is not "done" either.
    let bound = target(true);
    let obs = Observed {
        temporary: None,
        volume: Some(&victim),
        target: Some(&bound),
    };
    assert!(matches!(step(&obs), Step::Conflict(_)), "{:?}", step(&obs));
}

#[test]
fn a_hand_over_finds_its_volume_and_refuses_a_claim_it_did_not_make() {
    let tmp = temporary(Some("pv-1"));
    let lost = pvc(
        json!({"metadata": {"name": "xns-u-1-0"}, "spec": {"volumeName": "pv-1"},
                          "status": {"phase": "Lost"}}),
    );
    assert_eq!(volume_of(Some(&tmp), None), Some("pv-1"));
    assert_eq!(volume_of(Some(&lost), None), Some("pv-1"));
    assert_eq!(volume_of(None, Some(&target(false))), Some("pv-1"));
    assert_eq!(volume_of(Some(&temporary(None)), None), None);
    let pending = temporary(None);
    let obs = Observed {
        temporary: Some(&pending),
        volume: None,
        target: None,
    };
    assert_eq!(
        step(&obs),
        Step::Wait("pvc/xns-u-1-0 in namespace images is not bound yet".into())
    );
    let foreign = pvc(json!({"metadata": {"name": "vm-disk", "namespace": "vms"}}));
    let obs = Observed {
        temporary: Some(&tmp),
        volume: None,
        target: Some(&foreign),
    };
    assert!(matches!(step(&obs), Step::Conflict(m) if m.contains("not created by this Transfer")));
}
