//! Render's look at a Transfer from a claim in another namespace, through the reconciler's
//! pure parts ([`crate::clone::cross`]): the SubjectAccessReview it would ask (render
//! cannot know the creator's rights: it says so and plans as if allowed), the child
//! Transfer in the source namespace (created and then planned like any Transfer: its
//! strategy, claims, mover), and the hand-over of each temporary claim's volume.

use crate::clone::cross::{self, CLONING};
use crate::controller::finalizer::FINALIZER;
use crate::controller::kind::Ids;
use crate::controller::plan;
use crate::crd::status::condition::RUNNING;
use crate::crd::Transfer;

use super::{made_up_uid, Look, Resource, World};

/// The look at `t` when its source claim is in another namespace (None: it is not).
pub(crate) fn look(t: &mut Transfer, world: &mut World<'_>) -> Option<(Look, String)> {
    let namespace = t.metadata.namespace.clone().unwrap_or_default();
    let source_namespace = t.spec.source_namespace(&namespace)?.to_string();
    let status = t.status.clone().unwrap_or_default();
    if status.phase.is_final()
        || t.metadata.deletion_timestamp.is_some()
        || t.spec.validate().is_err()
    {
        return None;
    }
    if let Some(child) = &status.clone_transfer {
        let note = format!(
            "{:?}: cloned in namespace {source_namespace} by Transfer {child}: nothing new to plan",
            status.phase
        );
        return Some((Look::Settled, note));
    }
    let finalizers = t.metadata.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == FINALIZER) {
        finalizers.push(FINALIZER.to_string());
    }
    let ids = Ids {
        namespace: namespace.clone(),
        name: t.metadata.name.clone().unwrap_or_default(),
        uid: t.metadata.uid.clone().unwrap_or_default(),
    };
    let source = t
        .spec
        .source
        .pvc
        .as_ref()
        .map(|p| p.name.clone())
        .unwrap_or_default();
    let mut child = cross::child_transfer(t, &ids, &source_namespace);
    world.create(&child);
    child.metadata.uid = Some(made_up_uid(7, world.spawned.len()));
    world.spawned.push(Resource::Transfer(Box::new(child)));
    let child_name = cross::child_name(&ids.uid);
    let targets: Vec<String> = cross::templates(t)
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!(
                "pvc/{} <- pvc/{}",
                p.name,
                cross::temporary_claim(&ids.uid, i)
            )
        })
        .collect();
    let message = format!(
        "created Transfer {source_namespace}/{child_name} to fill {} claims from pvc/{source} in its namespace",
        targets.len()
    );
    let mut next = status.clone();
    next.clone_transfer = Some(format!("{source_namespace}/{child_name}"));
    let running = plan::with_life(t, &next, |l| {
        l.phase = crate::crd::Phase::Running;
        l.set_condition(RUNNING, true, CLONING, &message);
    });
    t.status = Some(running);
    let note = format!(
        "Running (across namespaces): first a SubjectAccessReview: may the creator the webhook recorded get pvc/{source} in namespace {source_namespace}? (render cannot know; planned as allowed, else Failed {}); {message}; once it succeeded each volume is handed over (reclaim policy Retain, claimRef to the target, the target created with volumeName, the temporary claim deleted, the policy restored): {}",
        cross::NOT_AUTHORIZED,
        targets.join(", ")
    );
    Some((Look::Started, note))
}

#[cfg(test)]
mod tests {
    use crate::controller::OperatorSettings;
    use crate::mover::MoverDefaults;
    use crate::render::{render, Cluster, Options};

    const FILE: &str = "
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: rbd}
provisioner: rbd.csi.ceph.com
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {name: rbd-snap}
driver: rbd.csi.ceph.com
deletionPolicy: Delete
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: golden, namespace: images}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: rbd
  resources: {requests: {storage: 10Gi}}
---
apiVersion: ferry.dev/v1alpha1
kind: Transfer
metadata: {name: vm, namespace: vms, uid: u-1}
spec:
  source: {pvc: {name: golden, namespace: images}}
  targets:
    - pvcTemplate: {name: vm-disk, size: 10Gi, storageClassName: rbd}
";

    /// The child Transfer in the source namespace is created and planned (a snapshot
    /// there), and the parent's note says the review and the hand-over.
    #[test]
    fn render_plans_the_child_in_the_source_namespace_and_the_hand_over() {
        let cluster = Cluster::parse(FILE).unwrap();
        let options = Options {
            settings: OperatorSettings::new(MoverDefaults {
                image: "ghcr.io/ferry-project/ferry:0.1.0".into(),
                image_pull_policy: None,
                resources: None,
                node_selector: Default::default(),
                tolerations: vec![],
                priority_class_name: None,
                service_account_name: None,
                image_pull_secrets: vec![],
            }),
            tls: true,
        };
        let rendered = render(&cluster, &options).unwrap();
        let objects = rendered.objects();
        let child = objects
            .iter()
            .find(|o| {
                o["kind"] == "Transfer"
                    && o["metadata"]["name"] == "xns-u-1"
                    && o["status"].is_null()
            })
            .unwrap_or_else(|| panic!("{objects:#?}"));
        assert_eq!(child["metadata"]["namespace"], "images");
        assert_eq!(
            child["spec"]["source"],
            serde_json::json!({"pvc": {"name": "golden"}})
        );
        let snapshot = objects
            .iter()
            .find(|o| o["kind"] == "VolumeSnapshot")
            .unwrap_or_else(|| panic!("{objects:#?}"));
        assert_eq!(snapshot["metadata"]["namespace"], "images");
        assert_eq!(
            snapshot["spec"]["source"]["persistentVolumeClaimName"],
            "golden"
        );
        let temporary = objects
            .iter()
            .find(|o| o["kind"] == "PersistentVolumeClaim" && o["metadata"]["name"] == "xns-u-1-0")
            .unwrap_or_else(|| panic!("{objects:#?}"));
        assert_eq!(temporary["metadata"]["namespace"], "images");
        assert_eq!(temporary["spec"]["dataSource"]["kind"], "VolumeSnapshot");
        let parent = objects
            .iter()
            .find(|o| o["kind"] == "Transfer" && o["metadata"]["name"] == "vm")
            .unwrap();
        assert_eq!(parent["status"]["cloneTransfer"], "images/xns-u-1");
        let summary = rendered.summary.join("\n");
        assert!(summary.contains("SubjectAccessReview"), "{summary}");
        assert!(
            summary.contains("pvc/vm-disk <- pvc/xns-u-1-0"),
            "{summary}"
        );
        assert!(summary.contains("Succeeded (snapshot)"), "{summary}");
    }
}
