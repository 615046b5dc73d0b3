//! The operator's settings (flags of `ferry operator`): mover defaults, limits, retries
//! and how often progress is written.

use std::time::Duration;

use crate::mover::MoverDefaults;

/// How the reconcilers behave.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorSettings {
    /// What mover pods get when a resource does not say.
    pub mover: MoverDefaults,
    /// Most mover pods at once in the cluster (0: no limit).
    pub max_movers: usize,
    /// Most mover pods at once on one node (0: no limit).
    pub max_movers_per_node: usize,
    /// Most mover pods one resource may start before it fails.
    pub max_attempts: u32,
    /// A mover pod not ready this long after its creation (unschedulable, its volumes not
    /// attaching or mounting, its image not pulled) fails its attempt, with the pod's last
    /// warning events in the status.
    pub mover_start_timeout: Duration,
    /// A ready mover the operator cannot reach this long is named in the status (a
    /// NetworkPolicy the usual cause); after `mover_start_timeout` it is replaced.
    pub mover_unreachable_grace: Duration,
    /// First wait before a lost mover is replaced; doubles per attempt.
    pub retry_backoff: Duration,
    /// First wait before a resource waiting for a claim looks again; doubles per look.
    pub pending_backoff: Duration,
    /// Longest wait of either backoff, and the requeue of a queued resource.
    pub max_backoff: Duration,
    /// Progress is written at most this often (a new checkpoint is written at once).
    pub progress_interval: Duration,
    /// Reconcile of a running resource when nothing happened (costs no API request
    /// while the mover's job stream is followed).
    pub resync: Duration,
    /// Only resources and mover pods of this namespace are watched (None: all
    /// namespaces; the mover limits then count this namespace's movers only).
    pub watch_namespace: Option<String>,
    /// The operator's own namespace: the movers' NetworkPolicies admit its pods.
    pub operator_namespace: String,
    /// Whether each mover gets a NetworkPolicy admitting the operator to its gRPC port
    /// (see [`crate::mover::network_policy`]).
    pub mover_network_policy: bool,
}

impl OperatorSettings {
    /// The defaults of `ferry operator`, with this mover image.
    pub fn new(mover: MoverDefaults) -> Self {
        Self {
            mover,
            max_movers: 0,
            max_movers_per_node: 0,
            max_attempts: 5,
            mover_start_timeout: Duration::from_secs(600),
            mover_unreachable_grace: Duration::from_secs(30),
            retry_backoff: Duration::from_secs(10),
            pending_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(300),
            progress_interval: Duration::from_secs(10),
            resync: Duration::from_secs(300),
            watch_namespace: None,
            operator_namespace: "ferry-system".to_string(),
            mover_network_policy: true,
        }
    }

    /// `base * 2^step`, capped at `max_backoff`.
    pub fn backoff(&self, base: Duration, step: u32) -> Duration {
        let factor = 1u32.checked_shl(step.min(16)).unwrap_or(u32::MAX);
        base.saturating_mul(factor).min(self.max_backoff)
    }
}
