//! The task that follows a mover's jobs while they run: it merges the job streams,
//! writes progress and the checkpoint into the status (a new checkpoint at once, other
//! progress at most every `progress_interval`), and when every job has ended writes how
//! the resource ended and removes the mover. It is the only writer of the status while
//! it runs, and the API is not polled: the mover pushes every change.
//!
//! When the link breaks (an error, a stream that ends early, a mover silent past the
//! link's keepalive) the task stops and asks for a reconcile of its resource at once,
//! which starts it again (job starts are idempotent, so the mover answers with the jobs
//! it already runs) or, if the mover stays unreachable, replaces it.

use std::sync::Arc;

use futures::StreamExt;
use tokio::time::Instant;

use crate::crd::status::condition::{reason, RUNNING};
use crate::crd::Phase;

use super::context::{Context, Watch};
use super::error::Error;
use super::kind::{write_status, Ids, MoverKind, Outcome};
use super::life::{same_status, HasLife};
use super::link::{JobReport, MoverAddress};
use super::pods;

/// What the task needs.
#[derive(Debug)]
pub struct Follow<K: MoverKind> {
    /// The resource as last written (its version guards the task's writes).
    pub obj: Arc<K>,
    /// Its ids.
    pub ids: Ids,
    /// The status as last written.
    pub status: K::Status,
    /// The mover.
    pub mover: MoverAddress,
    /// The jobs as started, in request order.
    pub reports: Vec<JobReport>,
}

/// Starts the task for the resource's current attempt.
pub fn spawn<K: MoverKind>(ctx: &Arc<Context>, attempt: u32, follow: Follow<K>) {
    let uid = follow.ids.uid.clone();
    let task_ctx = ctx.clone();
    let task = tokio::spawn(async move {
        let ids = follow.ids.clone();
        match run(&task_ctx, follow).await {
            Ok(Followed::ToTheEnd) => {}
            Ok(Followed::Broken) => task_ctx.relink(K::KIND, &ids),
            Err(e) => {
                tracing::warn!(kind = K::KIND, name = %ids.name, error = %e, "stopped following the mover's jobs");
                task_ctx.relink(K::KIND, &ids);
            }
        }
    });
    ctx.set_watch(&uid, Watch { attempt, task });
}

fn all_ended(reports: &[JobReport]) -> bool {
    reports.iter().all(|r| r.state.is_terminal())
}

/// How a follow ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Followed {
    /// Every job ended and the resource's status says how.
    ToTheEnd,
    /// The mover closed its streams before its jobs ended.
    Broken,
}

/// Follows the jobs to their end (see the module comment).
pub async fn run<K: MoverKind>(ctx: &Context, f: Follow<K>) -> Result<Followed, Error> {
    let Follow {
        mut obj,
        ids,
        mut status,
        mover,
        mut reports,
    } = f;
    if !all_ended(&reports) {
        let mut streams = Vec::with_capacity(reports.len());
        for (i, r) in reports.iter().enumerate() {
            if !r.state.is_terminal() {
                let s = ctx.link.watch(&mover, &r.id).await?;
                streams.push(s.map(move |item| (i, item)));
            }
        }
        let mut merged = futures::stream::select_all(streams);
        let mut last_write = Instant::now();
        while let Some((i, item)) = merged.next().await {
            reports[i] = item?;
            if all_ended(&reports) {
                break;
            }
            let mut next = status.clone();
            obj.observe(&mut next, &reports);
            let due = last_write.elapsed() >= ctx.settings.progress_interval
                || K::checkpoint_changed(&status, &next);
            if due && !same_status(&status, &next) {
                obj = Arc::new(write_status(ctx, &ids, obj.as_ref(), &next).await?);
                status = next;
                last_write = Instant::now();
            }
        }
        if !all_ended(&reports) {
            // The streams ended early: the mover went away; its pod's state decides.
            return Ok(Followed::Broken);
        }
    }
    finish(ctx, obj.as_ref(), &ids, status, &reports).await?;
    Ok(Followed::ToTheEnd)
}

/// Writes how the resource ended and removes the mover (for a retry too: the reconciler
/// replaces it after a backoff).
async fn finish<K: MoverKind>(
    ctx: &Context,
    obj: &K,
    ids: &Ids,
    mut status: K::Status,
    reports: &[JobReport],
) -> Result<(), Error> {
    obj.observe(&mut status, reports);
    let outcome = obj.outcome(&status, reports);
    if matches!(outcome, Outcome::Succeeded | Outcome::Continue { .. }) {
        obj.succeed(&mut status, reports);
    }

    let mut life = status.life();
    let (warning, event_reason, note) = match &outcome {
        Outcome::Succeeded => {
            let bytes = life.progress.map(|p| p.total_bytes).unwrap_or(0);
            let note = format!("{} succeeded: {bytes} bytes", K::KIND);
            life.finish(Phase::Succeeded, reason::SUCCEEDED, None);
            (false, reason::SUCCEEDED, note)
        }
        Outcome::Failed { reason, message } => {
            life.finish(Phase::Failed, reason, Some(message));
            (true, *reason, message.clone())
        }
        Outcome::Retry { message } => {
            life.message = Some(message.clone());
            life.set_condition(RUNNING, false, reason::RETRYING, message);
            (true, reason::RETRYING, message.clone())
        }
        Outcome::Continue { message } => {
            // The mover stays for the next step; the status write wakes the reconciler.
            status.set_life(life);
            write_status(ctx, ids, obj, &status).await?;
            ctx.event(obj, false, "StepSucceeded", message).await;
            return Ok(());
        }
    };
    let pod = life.mover_pod.clone();
    status.set_life(life);
    write_status(ctx, ids, obj, &status).await?;
    if let Some(pod) = pod {
        pods::delete_mover(ctx, ids, &pod).await?;
    }
    ctx.event(obj, warning, event_reason, &note).await;
    Ok(())
}
