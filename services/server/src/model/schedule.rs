//! Schedule records: what the schedule manager keeps in memory, the store persists (as
//! JSON, so a record stays readable and can gain fields) and the API converts to
//! `ferry.v1.Schedule`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::job::{hex_bytes, JobKind, JobState};

/// What to do about fire times that passed while the server was down.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissedPolicy {
    /// One run at start when one or more fire times were missed.
    #[default]
    RunOnce,
    /// No run for missed fire times.
    Skip,
}

/// The job a schedule starts: a start request of one job kind, prost-encoded as the
/// service stores job requests. Another job kind is another variant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TemplateRecord {
    /// A StartTransferRequest.
    Transfer {
        #[serde(with = "hex_bytes")]
        request: Vec<u8>,
    },
    /// A StartChecksumRequest.
    Checksum {
        #[serde(with = "hex_bytes")]
        request: Vec<u8>,
    },
    /// A StartBackupRequest.
    Backup {
        #[serde(with = "hex_bytes")]
        request: Vec<u8>,
    },
    /// A StartRepositoryVerifyRequest.
    RepositoryVerify {
        #[serde(with = "hex_bytes")]
        request: Vec<u8>,
    },
    /// A StartPruneRequest.
    Prune {
        #[serde(with = "hex_bytes")]
        request: Vec<u8>,
    },
    /// A StartGcRequest.
    Gc {
        #[serde(with = "hex_bytes")]
        request: Vec<u8>,
    },
    /// A StartSyncRequest.
    Sync {
        #[serde(with = "hex_bytes")]
        request: Vec<u8>,
    },
}

impl TemplateRecord {
    pub fn kind(&self) -> JobKind {
        match self {
            Self::Transfer { .. } => JobKind::Transfer,
            Self::Checksum { .. } => JobKind::Checksum,
            Self::Backup { .. } => JobKind::Backup,
            Self::RepositoryVerify { .. } => JobKind::RepositoryVerify,
            Self::Prune { .. } => JobKind::Prune,
            Self::Gc { .. } => JobKind::Gc,
            Self::Sync { .. } => JobKind::Sync,
        }
    }
}

/// How a run ended, or that it has not yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunResult {
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl RunResult {
    /// The result of a job in this state.
    pub fn of(state: JobState) -> Self {
        match state {
            JobState::Queued | JobState::Running => Self::Running,
            JobState::Succeeded => Self::Succeeded,
            JobState::Failed => Self::Failed,
            JobState::Cancelled => Self::Cancelled,
        }
    }

    /// A stable name, used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// One run of a schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Empty when the job could not be started.
    pub job_id: String,
    pub fire_ms: u64,
    pub started_ms: u64,
    pub result: RunResult,
    pub message: String,
    pub manual: bool,
}

/// A fire recorded before its job is started: after a crash, the next start submits it
/// again under the same idempotency key, which finds the job if it had been created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingFire {
    pub fire_ms: u64,
    pub manual: bool,
}

impl PendingFire {
    /// The idempotency key of the run of this fire.
    pub fn key(&self, schedule_id: &str) -> String {
        if self.manual {
            format!("schedule/{schedule_id}/now/{}", self.fire_ms)
        } else {
            format!("schedule/{schedule_id}/{}", self.fire_ms)
        }
    }
}

/// A schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleRecord {
    pub id: String,
    pub name: String,
    pub cron: String,
    /// IANA name; empty is UTC.
    pub time_zone: String,
    pub paused: bool,
    pub missed: MissedPolicy,
    pub template: TemplateRecord,
    pub labels: BTreeMap<String, String>,
    pub created_ms: u64,
    pub updated_ms: u64,
    /// The next fire time (None while paused, or when the expression never fires again).
    pub next_run_ms: Option<u64>,
    pub pending: Option<PendingFire>,
    pub last_run: Option<RunRecord>,
    pub last_success_ms: Option<u64>,
    pub runs_started: u64,
    pub runs_skipped: u64,
    pub runs_missed: u64,
    pub consecutive_failures: u32,
}

impl ScheduleRecord {
    /// The job of the latest run while it may still be queued or running.
    pub fn active_job(&self) -> Option<&str> {
        self.last_run
            .as_ref()
            .filter(|r| r.result == RunResult::Running && !r.job_id.is_empty())
            .map(|r| r.job_id.as_str())
    }

    /// Records how the run of `job_id` ended (no change when another run is the latest).
    /// True when the record changed.
    pub fn run_ended(
        &mut self,
        job_id: &str,
        result: RunResult,
        ended_ms: u64,
        message: &str,
    ) -> bool {
        let Some(run) = self.last_run.as_mut() else {
            return false;
        };
        if run.job_id != job_id || run.result != RunResult::Running || result == RunResult::Running
        {
            return false;
        }
        run.result = result;
        run.message = message.to_string();
        if result == RunResult::Succeeded {
            self.consecutive_failures = 0;
            self.last_success_ms = Some(ended_ms);
        } else {
            self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> ScheduleRecord {
        ScheduleRecord {
            id: "s1".into(),
            name: "nightly".into(),
            cron: "@daily".into(),
            time_zone: String::new(),
            paused: false,
            missed: MissedPolicy::RunOnce,
            template: TemplateRecord::Transfer {
                request: vec![1, 2],
            },
            labels: BTreeMap::new(),
            created_ms: 1,
            updated_ms: 1,
            next_run_ms: Some(10),
            pending: None,
            last_run: None,
            last_success_ms: None,
            runs_started: 0,
            runs_skipped: 0,
            runs_missed: 0,
            consecutive_failures: 0,
        }
    }

    #[test]
    fn json_round_trip() {
        let mut r = record();
        r.pending = Some(PendingFire {
            fire_ms: 5,
            manual: true,
        });
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("\"kind\":\"transfer\""), "{text}");
        assert!(text.contains("\"request\":\"0102\""), "{text}");
        let back: ScheduleRecord = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn keys_differ_by_fire_and_kind_of_fire() {
        let a = PendingFire {
            fire_ms: 5,
            manual: false,
        };
        let b = PendingFire {
            fire_ms: 5,
            manual: true,
        };
        assert_eq!(a.key("s1"), "schedule/s1/5");
        assert_ne!(a.key("s1"), b.key("s1"));
        assert_ne!(a.key("s1"), a.key("s2"));
    }

    #[test]
    fn failures_count_until_a_success() {
        let mut r = record();
        for (i, job) in ["j1", "j2"].iter().enumerate() {
            r.last_run = Some(RunRecord {
                job_id: job.to_string(),
                fire_ms: i as u64,
                started_ms: i as u64,
                result: RunResult::Running,
                message: String::new(),
                manual: false,
            });
            assert_eq!(r.active_job(), Some(*job));
            assert!(!r.run_ended("other", RunResult::Failed, 9, "x"));
            assert!(r.run_ended(job, RunResult::Failed, 9, "boom"));
            assert!(!r.run_ended(job, RunResult::Failed, 9, "boom"), "only once");
            assert_eq!(r.active_job(), None);
        }
        assert_eq!(r.consecutive_failures, 2);
        r.last_run.as_mut().unwrap().result = RunResult::Running;
        assert!(r.run_ended("j2", RunResult::Succeeded, 42, ""));
        assert_eq!(r.consecutive_failures, 0);
        assert_eq!(r.last_success_ms, Some(42));
    }
}
