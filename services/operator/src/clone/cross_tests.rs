//! The pure parts of a clone across namespaces against exact JSON: the child Transfer,
//! the SubjectAccessReview, the denial's message and each hand-over step.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use serde_json::{json, Value};

use super::cross::{
    access_review, changed, child_transfer, denied_message, made_from, recorded, templates,
};
use super::handover::{next, release, unbound_target, volume_of, Observed, Step};
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
                "annotations": {"ferry.dev/clone-for": "vms/vm",
                                "ferry.dev/clone-made-from": made_from(&parent(), "images")},
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
                                                       "ferry.dev/handed-over-for": "u-1",
                                                       "ferry.dev/claim-before": "images/xns-u-1-0/t-1"},
                                       "labels": {"ferry.dev/handed-over-for": "u-1"}},
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
            patch: json!({"metadata": {"annotations": {"ferry.dev/reclaim-policy": null,
                                                       "ferry.dev/claim-before": null},
                                       "labels": {"ferry.dev/handed-over-for": null}},
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

/// A volume taken for `u-1` (policy Retain, Delete saved, from `images/xns-u-1-0` uid
/// `t-1`), now referring to `claim`.
fn taken(claim: (&str, &str, Option<&str>)) -> PersistentVolume {
    let mut pv = volume("Retain", Some("Delete"), claim);
    let meta = &mut pv.metadata;
    meta.annotations
        .get_or_insert_with(Default::default)
        .insert(
            "ferry.dev/claim-before".into(),
            "images/xns-u-1-0/t-1".into(),
        );
    meta.labels = Some([("ferry.dev/handed-over-for".to_string(), "u-1".to_string())].into());
    pv
}

const UNMARKED: &str = r#"{"annotations": {"ferry.dev/reclaim-policy": null, "ferry.dev/claim-before": null},
                           "labels": {"ferry.dev/handed-over-for": null}}"#;

/// An unfinished hand-over is undone: the policy back always; the claim it came from back
/// unless a claim holds it (its uid in the reference): the temporary claim still, or a
/// target that bound. Never cleared (it would be Available to any claim of its class).
#[test]
fn an_unfinished_hand_over_gives_the_volume_back() {
    let unmarked: Value = serde_json::from_str(UNMARKED).unwrap();
    let back = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                      "namespace": "images", "name": "xns-u-1-0", "uid": "t-1",
                      "resourceVersion": null});
    // Still the temporary claim's (Retain set, nothing else yet): only the policy; the
    // temporary claim's deletion then reclaims it, or the controller releases it if it is
    // gone already.
    let tmp = temporary(Some("pv-1"));
    for claimant in [Some(&tmp), None] {
        let pv = taken(("images", "xns-u-1-0", Some("t-1")));
        assert_eq!(
            release(&pv, claimant),
            json!({"metadata": unmarked, "spec": {"persistentVolumeReclaimPolicy": "Delete"}})
        );
    }
    // Pointed at a target that does not exist, or exists and has not bound (no uid):
    // back to the temporary claim, by its uid.
    let waiting = target(false);
    for claimant in [None, Some(&waiting)] {
        let pv = taken(("vms", "vm-disk", None));
        assert_eq!(
            release(&pv, claimant),
            json!({"metadata": unmarked,
                   "spec": {"persistentVolumeReclaimPolicy": "Delete", "claimRef": back}})
        );
    }
    // Pointed at a target by a uid that is not the claim's (deleted and made again).
    let mut other = target(true);
    other.metadata.uid = Some("someone".into());
    let pv = taken(("vms", "vm-disk", Some("x")));
    assert_eq!(
        release(&pv, Some(&other))["spec"]["claimRef"],
        back,
        "a claim of that name is not the one that bound"
    );
    // A target bound to it (the last step, the policy, not taken yet): the user's; the
    // policy back, the reference kept.
    let mut bound = target(true);
    bound.metadata.uid = Some("x".into());
    assert_eq!(
        release(&pv, Some(&bound)),
        json!({"metadata": unmarked, "spec": {"persistentVolumeReclaimPolicy": "Delete"}})
    );
    // A volume an older operator marked (no record of its claim): the policy alone.
    let mut old = taken(("vms", "vm-disk", None));
    if let Some(a) = old.metadata.annotations.as_mut() {
        a.remove("ferry.dev/claim-before");
    }
    assert_eq!(
        release(&old, None),
        json!({"metadata": unmarked, "spec": {"persistentVolumeReclaimPolicy": "Delete"}})
    );
    // A Retain volume stays Retain.
    let mut kept = taken(("images", "xns-u-1-0", Some("t-1")));
    if let Some(a) = kept.metadata.annotations.as_mut() {
        a.insert("ferry.dev/reclaim-policy".into(), "Retain".into());
    }
    assert_eq!(
        release(&kept, None)["spec"]["persistentVolumeReclaimPolicy"],
        "Retain"
    );
}

/// The target claims a failed hand-over deletes: made by it (labelled with the uid,
/// annotated with where the volume came from) and not bound.
#[test]
fn only_made_targets_that_never_bound_go() {
    let mut made = target(false);
    made.metadata.annotations = Some(
        [(
            "ferry.dev/handed-over-from".to_string(),
            "images/xns-u-1-0".to_string(),
        )]
        .into(),
    );
    assert!(unbound_target(&made, "u-1"));
    assert!(!unbound_target(&made, "u-2"), "another Transfer's");
    let mut bound = made.clone();
    bound.status = target(true).status;
    assert!(!unbound_target(&bound, "u-1"), "bound: the user's");
    assert!(
        !unbound_target(&target(false), "u-1"),
        "not made by a hand-over (a copy's target)"
    );
}

/// What a child was made from is recorded; a Transfer whose source namespace, source
/// claim or targets differ from it has changed, anything else has not.
#[test]
fn a_changed_source_or_target_list_is_told_from_the_childs_record() {
    let p = parent();
    let child = child_transfer(&p, &ids(), "images");
    assert_eq!(
        recorded(Some("images/xns-u-1"), "u-1"),
        Some(("images".into(), "xns-u-1".into()))
    );
    assert_eq!(recorded(Some("images"), "u-1"), None);
    assert_eq!(recorded(None, "u-1"), None);
    // A record naming anything but this Transfer's own child (written by whoever may
    // write its status) is not taken.
    assert_eq!(recorded(Some("prod/db-restore"), "u-1"), None);
    assert_eq!(recorded(Some("images/xns-u-2"), "u-1"), None);
    assert_eq!(
        changed(&p, Some("images"), "images", "xns-u-1", Some(&child)),
        None
    );
    // Options, the strategy, modes: not part of the record.
    let mut other = p.clone();
    other.spec.clone_strategy = None;
    other.spec.pvc_templates = None;
    assert_eq!(
        changed(&other, Some("images"), "images", "xns-u-1", Some(&child)),
        None
    );
    let message = changed(&p, Some("other"), "images", "xns-u-1", Some(&child)).unwrap();
    assert!(
        message.starts_with("spec.source.pvc.namespace changed from images to namespace other after the clone started: Transfer images/xns-u-1 fills"),
        "{message}"
    );
    let message = changed(&p, None, "images", "xns-u-1", None).unwrap();
    assert!(
        message.contains("changed from images to the Transfer's own namespace"),
        "{message}"
    );
    let mut renamed = p.clone();
    if let Some(pvc) = renamed.spec.source.pvc.as_mut() {
        pvc.name = "golden-2".into();
    }
    let mut added = p.clone();
    added.spec.targets.push(added.spec.targets[0].clone());
    if let Some(t) = added.spec.targets[1].pvc_template.as_mut() {
        t.name = "vm-disk-2".into();
    }
    let mut grown = p.clone();
    if let Some(t) = grown.spec.targets[0].pvc_template.as_mut() {
        t.size = k8s_openapi::apimachinery::pkg::api::resource::Quantity("20Gi".into());
    }
    for edited in [renamed, added, grown] {
        let message =
            changed(&edited, Some("images"), "images", "xns-u-1", Some(&child)).expect("changed");
        assert!(
            message.starts_with("spec.source or the targets changed after the clone started"),
            "{message}"
        );
    }
    // A child made by an older operator has no record: not told.
    let mut old = child.clone();
    old.metadata.annotations = None;
    let mut grown = p.clone();
    if let Some(t) = grown.spec.targets[0].pvc_template.as_mut() {
        t.size = k8s_openapi::apimachinery::pkg::api::resource::Quantity("20Gi".into());
    }
    assert_eq!(
        changed(&grown, Some("images"), "images", "xns-u-1", Some(&old)),
        None
    );
}
