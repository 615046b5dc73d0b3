//! A fake mover link for running the operator's real controllers against the API
//! stand-in: every job is taken, reports progress every `every` if set, and succeeds
//! after `run`, the whole image done. No bytes move: what it stands in for is the gRPC
//! link to real mover pods, which the stand-in's pods cannot serve.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use ferry_operator::controller::{
    JobReport, JobRequest, JobState, LinkError, MoverAddress, MoverLink, ReportStream,
};
use ferry_operator::crd::Progress;
use futures::StreamExt;

/// A mover that finishes each job after `run`, reporting progress every `every` if set.
#[derive(Debug)]
pub struct FakeMover {
    /// How long each job runs.
    pub run: Duration,
    /// Progress reports this often (None: only the end).
    pub every: Option<Duration>,
}

/// A report of job `id`.
pub fn report(id: &str, state: JobState, done: u64) -> JobReport {
    JobReport {
        progress: Progress {
            total_bytes: 1 << 30,
            done_bytes: done,
            resumed_bytes: 0,
            committed_bytes: 0,
        },
        ..JobReport::new(id, state)
    }
}

#[async_trait]
impl MoverLink for FakeMover {
    async fn start(&self, _: &MoverAddress, job: &JobRequest) -> Result<JobReport, LinkError> {
        Ok(report(
            &format!("job-{}", job.idempotency_key()),
            JobState::Running,
            0,
        ))
    }

    async fn watch(&self, _: &MoverAddress, id: &str) -> Result<ReportStream, LinkError> {
        let (run, every, id) = (self.run, self.every, id.to_string());
        let stream = async_stream(run, every, id);
        Ok(stream.boxed())
    }

    async fn cancel(&self, _: &MoverAddress, _: &str) -> Result<(), LinkError> {
        Ok(())
    }

    async fn end_relay(&self, _: &MoverAddress, _: &str) -> Result<(), LinkError> {
        Ok(())
    }
}

fn async_stream(
    run: Duration,
    every: Option<Duration>,
    id: String,
) -> impl futures::Stream<Item = Result<JobReport, LinkError>> {
    let started = Instant::now();
    futures::stream::unfold(0u64, move |step| {
        let id = id.clone();
        async move {
            if step == u64::MAX {
                return None;
            }
            let left = run.saturating_sub(started.elapsed());
            match every {
                Some(every) if left > every => {
                    tokio::time::sleep(every).await;
                    let done = (step + 1) << 20;
                    Some((Ok(report(&id, JobState::Running, done)), step + 1))
                }
                _ => {
                    tokio::time::sleep(left).await;
                    Some((Ok(report(&id, JobState::Succeeded, 1 << 30)), u64::MAX))
                }
            }
        }
    })
}
