//! Schedules on the wire: `ferry.v1.Schedule` from a record, and the wire's policies and
//! run results as the domain's.

use ferry_core::{Error, Result};

use super::template::Template;
use crate::convert::output::show_urls;
use crate::model::schedule::{MissedPolicy, RunRecord, RunResult, ScheduleRecord};
use ferry_api::proto;

fn timestamp(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// The domain policy of a wire policy (UNSPECIFIED is RUN_ONCE).
pub fn missed_from_proto(v: i32) -> Result<MissedPolicy> {
    match proto::MissedRunPolicy::try_from(v) {
        Ok(proto::MissedRunPolicy::Unspecified | proto::MissedRunPolicy::RunOnce) => {
            Ok(MissedPolicy::RunOnce)
        }
        Ok(proto::MissedRunPolicy::Skip) => Ok(MissedPolicy::Skip),
        Err(_) => Err(Error::invalid_input(format!(
            "missed_run_policy {v} is not a MissedRunPolicy"
        ))),
    }
}

pub fn missed_to_proto(p: MissedPolicy) -> proto::MissedRunPolicy {
    match p {
        MissedPolicy::RunOnce => proto::MissedRunPolicy::RunOnce,
        MissedPolicy::Skip => proto::MissedRunPolicy::Skip,
    }
}

pub fn result_to_proto(r: RunResult) -> proto::ScheduleRunResult {
    match r {
        RunResult::Running => proto::ScheduleRunResult::Running,
        RunResult::Succeeded => proto::ScheduleRunResult::Succeeded,
        RunResult::Failed => proto::ScheduleRunResult::Failed,
        RunResult::Cancelled => proto::ScheduleRunResult::Cancelled,
    }
}

fn run_to_proto(r: &RunRecord) -> proto::ScheduleRun {
    proto::ScheduleRun {
        job_id: r.job_id.clone(),
        fire_time: Some(timestamp(r.fire_ms)),
        start_time: Some(timestamp(r.started_ms)),
        result: result_to_proto(r.result) as i32,
        message: r.message.clone(),
        manual: r.manual,
    }
}

/// A template as the service shows it: endpoint URLs without secrets.
fn shown_template(mut template: proto::JobTemplate) -> proto::JobTemplate {
    use proto::job_template::Request;
    let endpoints: Vec<&mut proto::Endpoint> = match &mut template.request {
        Some(Request::Transfer(t)) => t
            .source
            .iter_mut()
            .chain(t.target.iter_mut())
            .chain(t.more_targets.iter_mut())
            .collect(),
        Some(Request::Checksum(c)) => c.source.iter_mut().collect(),
        Some(Request::Backup(b)) => b.source.iter_mut().collect(),
        _ => Vec::new(),
    };
    show_urls(endpoints);
    template
}

/// The wire form of a schedule.
pub fn schedule_to_proto(r: &ScheduleRecord) -> proto::Schedule {
    proto::Schedule {
        id: r.id.clone(),
        name: r.name.clone(),
        cron: r.cron.clone(),
        time_zone: r.time_zone.clone(),
        paused: r.paused,
        missed_run_policy: missed_to_proto(r.missed) as i32,
        template: Template::from_record(&r.template)
            .ok()
            .map(|t| shown_template(t.to_proto())),
        labels: r.labels.clone(),
        create_time: Some(timestamp(r.created_ms)),
        update_time: Some(timestamp(r.updated_ms)),
        status: Some(proto::ScheduleStatus {
            next_run_time: r.next_run_ms.map(timestamp),
            last_run: r.last_run.as_ref().map(run_to_proto),
            last_success_time: r.last_success_ms.map(timestamp),
            runs_started: r.runs_started,
            runs_skipped: r.runs_skipped,
            runs_missed: r.runs_missed,
            consecutive_failures: r.consecutive_failures,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_round_trip_and_unknown_values_are_refused() {
        assert_eq!(missed_from_proto(0).unwrap(), MissedPolicy::RunOnce);
        for p in [MissedPolicy::RunOnce, MissedPolicy::Skip] {
            assert_eq!(missed_from_proto(missed_to_proto(p) as i32).unwrap(), p);
        }
        let e = missed_from_proto(42).unwrap_err();
        assert!(e.to_string().contains("missed_run_policy 42"), "{e}");
    }

    #[test]
    fn a_template_is_shown_without_the_query_of_an_http_url() {
        let endpoint = |url: &str| proto::Endpoint {
            url: url.to_string(),
            ..Default::default()
        };
        let template = proto::JobTemplate {
            request: Some(proto::job_template::Request::Transfer(
                proto::StartTransferRequest {
                    source: Some(endpoint("https://example.com/disk.img?X-Amz-Signature=abc")),
                    target: Some(endpoint("/images/disk.img")),
                    ..Default::default()
                },
            )),
        };
        let shown = format!("{:?}", shown_template(template));
        assert!(!shown.contains("X-Amz-Signature=abc"), "{shown}");
        assert!(shown.contains("https://example.com/disk.img"), "{shown}");
        assert!(shown.contains("/images/disk.img"), "{shown}");
    }
}
