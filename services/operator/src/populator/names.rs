//! Names, labels and annotations of what the populator creates for a claim. Everything is
//! derived from the user's claim (its uid, its name), so a reconcile that repeats itself,
//! or a restarted operator, finds what was created instead of creating it twice.

use std::collections::BTreeMap;

/// The annotation of a claim being populated telling how far its filler is (`40%`), as
/// CDI's `cdi.kubevirt.io/storage.populator.progress`.
pub const PROGRESS: &str = "ferry.dev/populator-progress";

/// The annotation the scheduler sets on a WaitForFirstConsumer claim once a pod using it
/// has a node; the prime claim carries the same, so its volume is provisioned there.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// On a rebound volume: the `<namespace>/<name>` of the VolumeImageSource it was filled
/// from (as lib-volume-populator's `populated-from`).
pub const POPULATED_FROM: &str = "ferry.dev/populated-from";
/// On a prime claim and a populator Transfer: the uid of the user's claim they serve.
pub const CLAIM_UID: &str = "ferry.dev/populated-claim";

const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
const COMPONENT: &str = "app.kubernetes.io/component";
const MANAGER: &str = crate::events::REPORTER;
const POPULATOR: &str = "populator";

/// The prime claim of the user's claim `uid`: `ferry-prime-<uid>`.
pub fn prime(uid: &str) -> String {
    format!("ferry-prime-{uid}")
}

/// The Transfer that fills the prime claim: named after the user's claim.
pub fn transfer(claim: &str) -> String {
    claim.to_string()
}

/// The labels of a prime claim or populator Transfer serving the claim `uid`.
pub fn labels(uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.to_string(), MANAGER.to_string()),
        (COMPONENT.to_string(), POPULATOR.to_string()),
        (CLAIM_UID.to_string(), uid.to_string()),
        (
            crate::mover::pod::labels::VELERO_EXCLUDE.to_string(),
            "true".to_string(),
        ),
    ])
}

/// The label selector of every prime claim and populator Transfer.
pub fn selector() -> String {
    format!("{COMPONENT}={POPULATOR},{MANAGED_BY}={MANAGER}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_claim_and_labels_match_the_selector() {
        assert_eq!(prime("0b0e-11"), "ferry-prime-0b0e-11");
        assert_eq!(transfer("disk"), "disk");
        let labels = labels("0b0e-11");
        for pair in selector().split(',') {
            let (k, v) = pair.split_once('=').unwrap();
            assert_eq!(labels.get(k).map(String::as_str), Some(v), "{pair}");
        }
        assert_eq!(labels[CLAIM_UID], "0b0e-11");
    }
}
