//! The short names of the wire enums (`transfer`, `running`, `skip`, ...) as clients print
//! them and as the service's JSON, metric labels and records spell them; the service checks
//! in its tests that its records name themselves the same way.

use crate::proto::{JobKind, JobState, MissedRunPolicy, ScheduleRunResult, TargetState};

/// The name of a wire `JobKind` value (`unknown` for one this build does not know).
pub fn job_kind_name(v: i32) -> &'static str {
    match JobKind::try_from(v) {
        Ok(JobKind::Transfer) => "transfer",
        Ok(JobKind::Checksum) => "checksum",
        Ok(JobKind::Backup) => "backup",
        Ok(JobKind::Restore) => "restore",
        Ok(JobKind::RepositoryVerify) => "repository_verify",
        Ok(JobKind::Prune) => "prune",
        Ok(JobKind::Gc) => "gc",
        Ok(JobKind::Sync) => "sync",
        Ok(JobKind::Unspecified) | Err(_) => "unknown",
    }
}

/// The name of a wire `JobState` value (`unknown` for one this build does not know).
pub fn job_state_name(v: i32) -> &'static str {
    match JobState::try_from(v) {
        Ok(JobState::Queued) => "queued",
        Ok(JobState::Running) => "running",
        Ok(JobState::Succeeded) => "succeeded",
        Ok(JobState::Failed) => "failed",
        Ok(JobState::Cancelled) => "cancelled",
        Ok(JobState::Unspecified) | Err(_) => "unknown",
    }
}

/// The name of a wire `TargetState` value.
pub fn target_state_name(v: i32) -> &'static str {
    match TargetState::try_from(v) {
        Ok(TargetState::Running) => "running",
        Ok(TargetState::Succeeded) => "succeeded",
        Ok(TargetState::Failed) => "failed",
        _ => "unknown",
    }
}

/// The name of a wire `ScheduleRunResult` value.
pub fn schedule_run_result_name(v: i32) -> &'static str {
    match ScheduleRunResult::try_from(v) {
        Ok(ScheduleRunResult::Running) => "running",
        Ok(ScheduleRunResult::Succeeded) => "succeeded",
        Ok(ScheduleRunResult::Failed) => "failed",
        Ok(ScheduleRunResult::Cancelled) => "cancelled",
        _ => "unknown",
    }
}

/// The name of a wire `MissedRunPolicy` value (unset means `run_once`, the default).
pub fn missed_run_policy_name(v: i32) -> &'static str {
    match MissedRunPolicy::try_from(v) {
        Ok(MissedRunPolicy::Skip) => "skip",
        _ => "run_once",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_values_have_a_name() {
        assert_eq!(job_kind_name(JobKind::Gc as i32), "gc");
        assert_eq!(job_state_name(JobState::Running as i32), "running");
        assert_eq!(job_kind_name(0), "unknown");
        assert_eq!(job_state_name(99), "unknown");
    }
}
