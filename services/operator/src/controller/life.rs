//! The status fields Transfer, Checksum and Backup share (phase, conditions, times, attempts,
//! mover pod and node, message, progress), as one value the reconciler steps work on,
//! and the condition bookkeeping Kubernetes expects (a transition time that changes only
//! when the condition's status does).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::crd::status::condition;
use crate::crd::{BackupStatus, ChecksumStatus, Phase, Progress, RestoreStatus, TransferStatus};

/// The shared part of a status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Life {
    pub phase: Phase,
    pub progress: Option<Progress>,
    pub conditions: Vec<Condition>,
    pub start_time: Option<Time>,
    pub completion_time: Option<Time>,
    pub attempts: u32,
    pub mover_pod: Option<String>,
    pub node: Option<String>,
    pub message: Option<String>,
    pub observed_generation: Option<i64>,
}

/// A status with the shared part.
pub trait HasLife: Clone + Default + PartialEq + Send + Sync + 'static {
    /// The shared part.
    fn life(&self) -> Life;
    /// Replaces the shared part.
    fn set_life(&mut self, life: Life);
}

macro_rules! has_life {
    ($status:ty) => {
        impl HasLife for $status {
            fn life(&self) -> Life {
                Life {
                    phase: self.phase,
                    progress: self.progress,
                    conditions: self.conditions.clone(),
                    start_time: self.start_time.clone(),
                    completion_time: self.completion_time.clone(),
                    attempts: self.attempts,
                    mover_pod: self.mover_pod.clone(),
                    node: self.node.clone(),
                    message: self.message.clone(),
                    observed_generation: self.observed_generation,
                }
            }

            fn set_life(&mut self, life: Life) {
                self.phase = life.phase;
                self.progress = life.progress;
                self.conditions = life.conditions;
                self.start_time = life.start_time;
                self.completion_time = life.completion_time;
                self.attempts = life.attempts;
                self.mover_pod = life.mover_pod;
                self.node = life.node;
                self.message = life.message;
                self.observed_generation = life.observed_generation;
            }
        }
    };
}

has_life!(TransferStatus);
has_life!(ChecksumStatus);
has_life!(BackupStatus);
has_life!(RestoreStatus);

/// Now, as Kubernetes writes times.
pub fn now() -> Time {
    Time(Timestamp::now())
}

impl Life {
    /// Sets a condition; its transition time changes only when its status does.
    pub fn set_condition(&mut self, type_: &str, status: bool, reason: &str, message: &str) {
        let status = if status { "True" } else { "False" }.to_string();
        let generation = self.observed_generation;
        match self.conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => {
                if c.status != status {
                    c.last_transition_time = now();
                }
                c.status = status;
                c.reason = reason.to_string();
                c.message = message.to_string();
                c.observed_generation = generation;
            }
            None => self.conditions.push(Condition {
                type_: type_.to_string(),
                status,
                reason: reason.to_string(),
                message: message.to_string(),
                last_transition_time: now(),
                observed_generation: generation,
            }),
        }
    }

    /// The condition of this type.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// The reason of the Running condition ("" when there is none).
    pub fn running_reason(&self) -> &str {
        self.condition(condition::RUNNING)
            .map(|c| c.reason.as_str())
            .unwrap_or("")
    }

    /// Waiting (phase Pending): Ready and Running False with `reason`.
    pub fn pending(&mut self, reason: &str, message: &str) {
        self.phase = Phase::Pending;
        self.message = Some(message.to_string());
        self.set_condition(condition::READY, false, reason, message);
        self.set_condition(condition::RUNNING, false, reason, message);
    }

    /// A final phase with its reason; Running turns False.
    pub fn finish(&mut self, phase: Phase, reason: &str, message: Option<&str>) {
        self.phase = phase;
        self.message = message.map(str::to_string);
        self.completion_time = Some(now());
        let text = message.unwrap_or("");
        self.set_condition(condition::READY, phase == Phase::Succeeded, reason, text);
        self.set_condition(condition::RUNNING, false, reason, text);
    }
}

/// Equal apart from the conditions' transition times (what decides whether a status
/// write would change anything).
pub fn same_status<S: serde::Serialize>(a: &S, b: &S) -> bool {
    let strip = |s: &S| {
        let mut v = serde_json::to_value(s).unwrap_or_default();
        if let Some(conditions) = v.get_mut("conditions").and_then(|c| c.as_array_mut()) {
            for c in conditions {
                if let Some(c) = c.as_object_mut() {
                    c.remove("lastTransitionTime");
                }
            }
        }
        v
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_changes_only_with_the_status() {
        let mut life = Life::default();
        life.set_condition(condition::RUNNING, false, "Pending", "waiting");
        let first = life.conditions[0].last_transition_time.clone();
        life.set_condition(condition::RUNNING, false, "Queued", "queued");
        assert_eq!(life.conditions[0].last_transition_time, first);
        assert_eq!(life.conditions[0].reason, "Queued");
        assert_eq!(life.running_reason(), "Queued");
        let before = TransferStatus::default();
        let mut after = before.clone();
        after.set_life(life.clone());
        assert!(!same_status(&before, &after));
        let mut again = after.clone();
        again.conditions[0].last_transition_time = Time(Timestamp::UNIX_EPOCH);
        assert!(same_status(&after, &again));
        assert_eq!(after.life(), life);
    }
}
