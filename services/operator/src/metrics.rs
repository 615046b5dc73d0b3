//! Prometheus metrics of the operator, in their own registry (the binary serves its
//! text exposition on the operator's metrics port):
//!
//! - `ferry_operator_reconciles_total{kind}` and `ferry_operator_reconcile_errors_total{kind}`,
//!   counted by the reconcilers;
//! - `ferry_operator_movers_running` and `ferry_operator_resources{kind,phase}`, sampled
//!   from the controllers' watched stores when the metrics are read (so they are exact at
//!   every scrape and cost nothing per reconcile);
//! - `ferry_operator_leader`, 1 while this replica holds the lease.
//!
//! Labels are bounded sets: the resource kind and its phase.

use parking_lot::Mutex;
use prometheus::{Encoder, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::Store;

use crate::controller::life::HasLife;
use crate::controller::MoverKind;
use crate::crd::{Backup, Checksum, Phase, Restore, Transfer};

const PHASES: [Phase; 5] = [
    Phase::Pending,
    Phase::Running,
    Phase::Succeeded,
    Phase::Failed,
    Phase::Cancelled,
];

fn phase_label(phase: Phase) -> &'static str {
    match phase {
        Phase::Pending => "Pending",
        Phase::Running => "Running",
        Phase::Succeeded => "Succeeded",
        Phase::Failed => "Failed",
        Phase::Cancelled => "Cancelled",
    }
}

/// A mover pod that is neither finished nor being deleted.
fn is_running(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// Fills the sampled gauges just before the metrics are read.
pub type Sampler = Box<dyn Fn(&OperatorMetrics) + Send + Sync>;

/// Every metric of the operator.
pub struct OperatorMetrics {
    registry: Registry,
    /// Reconciles started, by kind.
    pub reconciles: IntCounterVec,
    /// Reconciles that failed (and were requeued), by kind.
    pub reconcile_errors: IntCounterVec,
    /// Mover pods that are neither finished nor being deleted.
    pub movers_running: IntGauge,
    /// Resources by kind and phase.
    pub resources: IntGaugeVec,
    /// 1 while this replica is the leader.
    pub leader: IntGauge,
    sampler: Mutex<Option<Sampler>>,
}

impl std::fmt::Debug for OperatorMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorMetrics").finish_non_exhaustive()
    }
}

fn register<M: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    // The names and labels are constants of this module and unique in its own registry:
    // only a programming error makes this fail, and every test would see it.
    registry
        .register(Box::new(metric.clone()))
        .expect("unique operator metric");
    metric
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl OperatorMetrics {
    /// Every metric, registered in a fresh registry; the counters of both kinds start at
    /// zero (so a rate is defined from the first scrape).
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| {
            let c = IntCounterVec::new(Opts::new(name, help), &["kind"]).expect("valid metric");
            register(&registry, c)
        };
        let reconciles = counter(
            "ferry_operator_reconciles_total",
            "Reconciles started, by resource kind.",
        );
        let reconcile_errors = counter(
            "ferry_operator_reconcile_errors_total",
            "Reconciles that failed and were requeued, by resource kind.",
        );
        for kind in [Transfer::KIND, Checksum::KIND, Backup::KIND, Restore::KIND] {
            reconciles.with_label_values(&[kind]);
            reconcile_errors.with_label_values(&[kind]);
        }
        let gauge = |name: &str, help: &str| {
            register(&registry, IntGauge::new(name, help).expect("valid metric"))
        };
        let movers_running = gauge(
            "ferry_operator_movers_running",
            "Mover pods neither finished nor being deleted.",
        );
        let leader = gauge(
            "ferry_operator_leader",
            "1 while this replica holds the leader lease.",
        );
        let resources = IntGaugeVec::new(
            Opts::new(
                "ferry_operator_resources",
                "Transfers, Checksums, Backups and Restores by kind and phase.",
            ),
            &["kind", "phase"],
        )
        .expect("valid metric");
        let resources = register(&registry, resources);
        Self {
            registry,
            reconciles,
            reconcile_errors,
            movers_running,
            resources,
            leader,
            sampler: Mutex::new(None),
        }
    }

    /// A reconcile of `kind` started.
    pub fn reconciled(&self, kind: &str) {
        self.reconciles.with_label_values(&[kind]).inc();
    }

    /// A reconcile of `kind` failed.
    pub fn failed(&self, kind: &str) {
        self.reconcile_errors.with_label_values(&[kind]).inc();
    }

    /// Sets `ferry_operator_resources{kind=K}` from a store of the kind: every phase,
    /// zero included (so a phase that emptied reads 0, not its last count).
    pub fn sample_resources<K: MoverKind>(&self, store: &Store<K>) {
        let mut counts = [0i64; PHASES.len()];
        for obj in store.state() {
            let phase = obj.status().map_or(Phase::Pending, |s| s.life().phase);
            if let Some(i) = PHASES.iter().position(|p| *p == phase) {
                counts[i] += 1;
            }
        }
        for (phase, count) in PHASES.iter().zip(counts) {
            self.resources
                .with_label_values(&[K::KIND, phase_label(*phase)])
                .set(count);
        }
    }

    /// Sets `ferry_operator_movers_running` from the store of mover pods.
    pub fn sample_movers(&self, pods: &Store<Pod>) {
        let running = pods.state().iter().filter(|p| is_running(p)).count();
        self.movers_running
            .set(i64::try_from(running).unwrap_or(i64::MAX));
    }

    /// Sets what fills the sampled gauges before each read (replacing any earlier one).
    pub fn set_sampler(&self, sampler: Sampler) {
        *self.sampler.lock() = Some(sampler);
    }

    /// The text exposition format, with the sampled gauges filled first.
    pub fn encode(&self) -> String {
        if let Some(sample) = self.sampler.lock().as_ref() {
            sample(self);
        }
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "cannot encode the operator metrics");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::OperatorMetrics;

    #[test]
    fn the_sampler_runs_before_each_read() {
        let m = OperatorMetrics::new();
        m.set_sampler(Box::new(|m| m.movers_running.set(3)));
        assert!(m.encode().contains("ferry_operator_movers_running 3\n"));
    }
}
