//! The mover pod the operator builds for a Checksum of one claim, for the tests that run
//! a pod spec for real (its command, user, groups, volumes) instead of reading it.

use ferry_operator::crd::{Checksum, ChecksumSpec, Endpoint, VolumeMode};
use ferry_operator::mover::{checksum_pod, MoverDefaults, MoverPodInput, ResolvedPvc};
use k8s_openapi::api::core::v1::Pod;

/// The operator's mover defaults with this image and nothing else set.
pub fn defaults(image: &str) -> MoverDefaults {
    MoverDefaults {
        image: image.into(),
        image_pull_policy: None,
        resources: None,
        node_selector: Default::default(),
        tolerations: vec![],
        priority_class_name: None,
        service_account_name: None,
        image_pull_secrets: vec![],
    }
}

/// The Checksum `sum` (namespace `vms`) of the claim `claim` in `mode`, the claims it
/// resolves to, and its mover pod `sum-fcs-1` (mutual TLS on) as the operator builds it.
pub fn checksum_mover(
    claim: &str,
    mode: VolumeMode,
    image: &str,
) -> (Checksum, Vec<ResolvedPvc>, Pod) {
    let mut checksum = Checksum::new(
        "sum",
        ChecksumSpec {
            source: Endpoint::pvc(claim),
            options: None,
            mover: None,
        },
    );
    checksum.metadata.namespace = Some("vms".into());
    checksum.metadata.uid = Some("uid-1".into());
    let pvcs = vec![ResolvedPvc::new(claim, mode)];
    let defaults = defaults(image);
    let pod = checksum_pod(
        &checksum,
        &MoverPodInput {
            pod_name: "sum-fcs-1",
            token_secret: "sum-fcs-1-token",
            pvcs: &pvcs,
            defaults: &defaults,
            assigned_ids: false,
            tls: true,
        },
    )
    .expect("the operator builds the Checksum's mover pod");
    (checksum, pvcs, pod)
}
