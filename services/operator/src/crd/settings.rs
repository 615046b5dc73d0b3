//! Per-resource settings of the mover pod (resources, placement, identity, pod security
//! context); what is left out comes from the operator's defaults.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodSecurityContext, ResourceRequirements, Toleration};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How the mover pod of a resource runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MoverSettings {
    /// CPU and memory of the mover container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Nodes the mover may run on (merged over the operator's default selector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// The node the mover runs on (a Transfer that fans out places each group's mover
    /// so; a claim in use on another node is then an error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Taints the mover tolerates (added to the operator's default tolerations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Priority class of the mover pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Pod security context; replaces the operator's (non-root, fsGroup) when given. The
    /// container itself always runs without privilege escalation, capabilities or a
    /// writable root filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<PodSecurityContext>,
    /// Service account of the mover pod (default: the operator's mover account).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
}
