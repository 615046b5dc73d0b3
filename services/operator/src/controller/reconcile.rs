//! The reconciler of Transfers and Checksums: a state machine driven by the status and
//! the observed world, each step one small function. One reconcile does one step:
//!
//! 1. deleted -> cancel the jobs, delete the mover, Cancelled, finalizer removed;
//! 2. no finalizer -> add it;
//! 3. final phase -> nothing (a mover pod left behind is deleted);
//! 4. invalid spec -> Failed (InvalidSpec), never retried;
//! 5. by the mover pod of the status:
//!    - none: claims resolved and referenced Secret keys present (missing -> Pending,
//!      backoff), a slot (else Queued), the token Secret and the pod of the next
//!      attempt created -> Running, MoverStarting;
//!    - starting: wait for the pod's own events; why it cannot start (unschedulable, an
//!      image that cannot be pulled) goes into the MoverStarting condition's message;
//!    - ready: Running/MoverRunning with the node, the jobs started (resuming from the
//!      checkpoint) and followed by a task ([`super::follow`]);
//!    - lost (deleted, evicted, failed, or removed by a retry): recorded as MoverLost
//!      and the pod deleted; after a backoff doubling per attempt a new attempt, until
//!      the operator's limit of attempts -> Failed.
//!
//! Every status write goes through [`write_status`] only when the status changes, so a
//! waiting resource costs no write per look; a running one costs no request at all.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;

use crate::crd::status::condition::{reason, READY, RUNNING};
use crate::crd::Phase;

use super::attachments;
use super::claims;
use super::context::Context;
use super::error::Error;
use super::finalizer;
use super::follow::{self, Follow};
use super::kind::{write_status, Ids, MoverKind};
use super::life::{now, same_status, HasLife, Life};
use super::limits::{self, Slot};
use super::link::{LinkError, MoverAddress};
use super::plan::{self, Attempt, Plan};
use super::pods::{self, Created, PodState};

/// One reconcile of a Transfer or a Checksum.
pub async fn reconcile<K: MoverKind>(obj: Arc<K>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciled(K::KIND);
    let ids = Ids::of(obj.as_ref())?;
    if obj.meta().deletion_timestamp.is_some() {
        return on_delete(&ctx, obj.as_ref(), &ids).await;
    }
    if !finalizer::has(obj.as_ref()) {
        finalizer::add(&ctx, obj.as_ref(), &ids).await?;
        return Ok(Action::await_change());
    }
    let status = obj.status().cloned().unwrap_or_default();
    let life = status.life();
    if life.phase.is_final() {
        return leftover(&ctx, &ids, &life).await;
    }
    if let Err(e) = obj.validate() {
        let message = format!("{e}: fix the spec and create the {} again", K::KIND);
        return fail(
            &ctx,
            obj.as_ref(),
            &ids,
            &status,
            reason::INVALID_SPEC,
            &message,
        )
        .await;
    }
    match pods::observe(&ctx, &ids, life.mover_pod.as_deref()).await? {
        PodState::Absent => start_attempt(&ctx, obj.as_ref(), &ids, &status).await,
        PodState::Starting { why, created, pod } => {
            starting(&ctx, obj.as_ref(), &ids, &status, why, created, &pod).await
        }
        PodState::Ready(pod) => run_jobs(&ctx, &obj, &ids, &status, &pod).await,
        PodState::Lost(why) => lost(&ctx, obj.as_ref(), &ids, &status, &why).await,
    }
}

/// A final resource: the operator's memory of it dropped; a mover pod still there (the
/// operator stopped between the final status and the pod's deletion) deleted. Read from
/// the store, so a final resource costs no request.
async fn leftover(ctx: &Context, ids: &Ids, life: &Life) -> Result<Action, Error> {
    ctx.forget(&ids.uid);
    let Some(name) = life.mover_pod.as_deref() else {
        return Ok(Action::await_change());
    };
    let key = kube::runtime::reflector::ObjectRef::new(name).within(&ids.namespace);
    let present = ctx
        .pods
        .get(&key)
        .is_some_and(|p| p.metadata.deletion_timestamp.is_none());
    // A crashed last mover stays for its logs (see `lost`).
    if present && !ctx.is_watching(&ids.uid, life.attempts) && !pods::crashed(ctx, ids, name) {
        pods::delete_mover(ctx, ids, name).await?;
    }
    Ok(Action::await_change())
}

/// Writes `next` when it differs from `before` (the status of `obj`); returns the
/// resource as written when it did.
pub(crate) async fn update<K: MoverKind>(
    ctx: &Context,
    ids: &Ids,
    obj: &K,
    before: &K::Status,
    next: &K::Status,
) -> Result<Option<K>, Error> {
    if same_status(before, next) {
        return Ok(None);
    }
    Ok(Some(write_status(ctx, ids, obj, next).await?))
}

/// A final failure.
async fn fail<K: MoverKind>(
    ctx: &Context,
    obj: &K,
    ids: &Ids,
    status: &K::Status,
    why: &str,
    message: &str,
) -> Result<Action, Error> {
    let next = plan::failed(obj, status, why, message);
    if update(ctx, ids, obj, status, &next).await?.is_some() {
        ctx.event(obj, true, why, message).await;
    }
    ctx.done_waiting(&ids.uid);
    Ok(Action::await_change())
}

/// Pending with a reason (a missing claim, no mover slot), looked at again after a
/// backoff. The lost pod of an earlier attempt is forgotten: the next look starts anew.
async fn wait<K: MoverKind>(
    ctx: &Context,
    obj: &K,
    ids: &Ids,
    status: &K::Status,
    why: &str,
    message: &str,
) -> Result<Action, Error> {
    let step = ctx.waited(&ids.uid);
    if why == reason::QUEUED {
        ctx.queue(K::KIND, ids);
    }
    let next = plan::waiting(obj, status, why, message);
    if update(ctx, ids, obj, status, &next).await?.is_some() {
        ctx.event(obj, why != reason::QUEUED, why, message).await;
    }
    let settings = &ctx.settings;
    if why == reason::QUEUED {
        // A freed slot wakes the longest queued at once, but the mover store may lag the
        // wake; a queued resource looks again at the first backoff, never a longer one
        // (the look reads the store only).
        return Ok(Action::requeue(settings.pending_backoff));
    }
    Ok(Action::requeue(
        settings.backoff(settings.pending_backoff, step),
    ))
}

/// A slot, the claims, the token Secret and the pod of the next attempt. The cluster limit
/// is checked before any claim is created (a queued resource provisions nothing); the
/// node limit once the claims say where the mover must run.
async fn start_attempt<K: MoverKind>(
    ctx: &Context,
    obj: &K,
    ids: &Ids,
    status: &K::Status,
) -> Result<Action, Error> {
    if let Slot::Queued(message) = ctx.slot(&ids.uid, None) {
        return wait(ctx, obj, ids, status, reason::QUEUED, &message).await;
    }
    let observed = plan::observe(ctx, obj, ids).await?;
    let setup = plan::Setup {
        settings: &ctx.settings,
        tls: ctx.mover_ca().is_some(),
    };
    let attempt = match plan::attempt(obj, ids, status, &observed, setup)? {
        Plan::Wait { reason, message } => {
            return wait(ctx, obj, ids, status, reason, &message).await
        }
        Plan::Fail { reason, message } => {
            return fail(ctx, obj, ids, status, reason, &message).await
        }
        Plan::Start(attempt) => attempt,
    };
    if let Slot::Queued(message) = ctx.take_slot(&ids.uid, limits::pinned_node(&attempt.pod)) {
        return wait(ctx, obj, ids, status, reason::QUEUED, &message).await;
    }
    if let Some(message) = create_claims(ctx, obj, &attempt).await? {
        ctx.release_slot(&ids.uid);
        return wait(ctx, obj, ids, status, reason::REFUSED, &message).await;
    }
    if let Some(message) = create_mover(ctx, obj, ids, &attempt).await? {
        ctx.release_slot(&ids.uid);
        pods::delete_mover(ctx, ids, attempt.pod_name()).await?;
        return wait(ctx, obj, ids, status, reason::REFUSED, &message).await;
    }
    ctx.done_waiting(&ids.uid);
    let (next, message) = plan::starting(obj, status, &attempt);
    write_status(ctx, ids, obj, &next).await?;
    ctx.event(obj, false, "MoverCreated", &message).await;
    Ok(Action::requeue(ctx.settings.resync))
}

/// Creates the templates' claims of `attempt`; returns the API server's refusal of one,
/// as the status message.
async fn create_claims<K: MoverKind>(
    ctx: &Context,
    obj: &K,
    attempt: &Attempt,
) -> Result<Option<String>, Error> {
    for pvc in &attempt.new_claims {
        let name = pvc.metadata.name.as_deref().unwrap_or_default();
        if let Created::Refused(why) = claims::create(ctx, pvc).await? {
            return Ok(Some(format!(
                "the API server refused to create pvc/{name}: {why}"
            )));
        }
        ctx.event(obj, false, "ClaimCreated", &format!("created pvc/{name}"))
            .await;
    }
    Ok(None)
}

/// Creates the mover of `attempt` in order: the token Secret, the NetworkPolicy, the pod.
/// Returns the API server's refusal of one, as the status message.
async fn create_mover<K: MoverKind>(
    ctx: &Context,
    obj: &K,
    ids: &Ids,
    attempt: &Attempt,
) -> Result<Option<String>, Error> {
    let pod_name = attempt.pod_name();
    pods::create_token(ctx, obj, ids, &attempt.token_secret, pod_name).await?;
    if let Some(policy) = &attempt.network_policy {
        if let Created::Refused(why) = pods::create_network_policy(ctx, ids, policy).await? {
            return Ok(Some(format!(
                "the API server refused the NetworkPolicy of mover pod {pod_name}: {why}"
            )));
        }
    }
    Ok(match pods::create_pod(ctx, ids, &attempt.pod).await? {
        Created::Refused(why) => Some(format!(
            "the API server refused mover pod {pod_name}: {why}"
        )),
        Created::Yes => None,
    })
}

/// The pod is not ready yet: when Kubernetes says why, the status says it too. Not ready
/// within the start timeout, the attempt fails as a lost mover, with the pod's last
/// warning events.
async fn starting<K: MoverKind>(
    ctx: &Context,
    obj: &K,
    ids: &Ids,
    status: &K::Status,
    why: Option<String>,
    created: Option<Timestamp>,
    mover: &k8s_openapi::api::core::v1::Pod,
) -> Result<Action, Error> {
    let life = status.life();
    let attempt = life.attempts;
    if ctx.is_watching(&ids.uid, attempt) {
        // It was ready and its jobs run: a passing readiness blip is not a new state.
        return Ok(Action::requeue(ctx.settings.resync));
    }
    let waited = created.map(age_of);
    let why = match why {
        None if waited.is_some_and(|w| w >= attachments::CHECK_AFTER) => {
            let pod_uid = mover.metadata.uid.clone().unwrap_or_default();
            match ctx.attachment_check(&pod_uid) {
                Some(said) => said,
                None => {
                    let said = attachments::check(&ctx.client, &ids.namespace, mover).await?;
                    ctx.remember_attachment_check(&pod_uid, said.clone());
                    said
                }
            }
        }
        why => why,
    };
    let pod = life.mover_pod.as_deref().unwrap_or_default();
    let timeout = ctx.settings.mover_start_timeout;
    let left = created.map(|created| time_left(created, timeout));
    if left == Some(std::time::Duration::ZERO) {
        let message = not_started(
            pod,
            attempt,
            timeout,
            why.as_deref(),
            &pods::last_warnings(ctx, ids, pod).await?,
        );
        return lost(ctx, obj, ids, status, &message).await;
    }
    let message = match &why {
        Some(why) => format!("mover pod {pod} (attempt {attempt}) cannot start yet: {why}"),
        None => format!("mover pod {pod} (attempt {attempt}) is starting"),
    };
    let next = plan::with_life(obj, status, |l| {
        l.message = why.is_some().then(|| message.clone());
        l.set_condition(RUNNING, false, reason::MOVER_STARTING, &message);
        l.set_condition(READY, false, reason::MOVER_STARTING, &message);
    });
    if update(ctx, ids, obj, status, &next).await?.is_some() && why.is_some() {
        ctx.event(obj, true, reason::MOVER_STARTING, &message).await;
    }
    // Look again soon (the store costs no request): the watch that wakes this reconcile
    // and the store of mover pods are two streams, and the one saying the pod is ready
    // may come first; waiting for the resync would leave a ready mover idle for minutes.
    let look = ctx.settings.resync.min(ctx.settings.pending_backoff);
    Ok(Action::requeue(left.map_or(look, |left| left.min(look))))
}

/// How long ago `created` was.
fn age_of(created: Timestamp) -> std::time::Duration {
    let age_ms = Timestamp::now().as_millisecond() - created.as_millisecond();
    std::time::Duration::from_millis(u64::try_from(age_ms).unwrap_or(0))
}

/// How much of `timeout` from `created` is left (zero once it has passed).
fn time_left(created: Timestamp, timeout: std::time::Duration) -> std::time::Duration {
    timeout.saturating_sub(age_of(created))
}

/// Why an attempt whose mover never became ready failed.
fn not_started(
    pod: &str,
    attempt: u32,
    timeout: std::time::Duration,
    why: Option<&str>,
    warnings: &[String],
) -> String {
    let mut message = format!(
        "mover pod {pod} (attempt {attempt}) was not ready {}s after its creation",
        timeout.as_secs()
    );
    if let Some(why) = why {
        message.push_str(&format!(": {why}"));
    }
    if !warnings.is_empty() {
        message.push_str(&format!("; its last warnings: {}", warnings.join("; ")));
    }
    message
}

/// The pod is ready: Running on its node, the jobs started and followed.
async fn run_jobs<K: MoverKind>(
    ctx: &Arc<Context>,
    obj: &Arc<K>,
    ids: &Ids,
    status: &K::Status,
    pod: &Arc<k8s_openapi::api::core::v1::Pod>,
) -> Result<Action, Error> {
    let attempt = status.life().attempts;
    if ctx.is_watching(&ids.uid, attempt) {
        return Ok(Action::requeue(ctx.settings.resync));
    }
    let (next, message) = plan::running(obj.as_ref(), status, pod);
    // Once the mover was found unreachable, Running is written only when it answers:
    // the status must not flap between the two.
    let was_unreachable = status.life().running_reason() == reason::MOVER_UNREACHABLE;
    let mut latest = obj.clone();
    if !was_unreachable {
        latest = mark_running(ctx, obj, ids, status, &next, &message).await?;
    }
    let mover = pods::address(ctx, ids, pod).await?;
    let jobs = obj.jobs(&next, &pods::attached_pvcs(pod))?;
    let mut reports = Vec::with_capacity(jobs.len());
    for job in &jobs {
        match ctx.link.start(&mover, job).await {
            Ok(report) => reports.push(report),
            Err(LinkError::Unavailable(e)) => {
                let written = if was_unreachable { status } else { &next };
                return unreachable(ctx, latest.as_ref(), ids, written, &mover, &e).await;
            }
            Err(LinkError::Rejected(e)) => {
                let message = format!("the mover refused the job: {e}");
                return fail(ctx, latest.as_ref(), ids, &next, reason::FAILED, &message).await;
            }
        }
    }
    ctx.reached(&ids.uid);
    if was_unreachable {
        latest = mark_running(ctx, obj, ids, status, &next, &message).await?;
    }
    let follow = Follow {
        obj: latest,
        ids: ids.clone(),
        status: next,
        mover,
        reports,
    };
    follow::spawn(ctx, attempt, follow);
    Ok(Action::requeue(ctx.settings.resync))
}

/// Writes the Running status (and its event) unless the status says it already.
async fn mark_running<K: MoverKind>(
    ctx: &Context,
    obj: &Arc<K>,
    ids: &Ids,
    status: &K::Status,
    next: &K::Status,
    message: &str,
) -> Result<Arc<K>, Error> {
    Ok(match update(ctx, ids, obj.as_ref(), status, next).await? {
        Some(written) => {
            ctx.event(obj.as_ref(), false, "MoverRunning", message)
                .await;
            Arc::new(written)
        }
        None => obj.clone(),
    })
}

/// The ready mover did not answer: ask again soon; after the settings' grace (its server
/// starting, a NetworkPolicy being programmed) say so in the status, naming what usually
/// causes it; after the start timeout replace it.
async fn unreachable<K: MoverKind>(
    ctx: &Context,
    obj: &K,
    ids: &Ids,
    status: &K::Status,
    mover: &MoverAddress,
    error: &str,
) -> Result<Action, Error> {
    let life = status.life();
    let waited = ctx.unreachable_for(&ids.uid, life.attempts);
    tracing::info!(kind = K::KIND, name = %ids.name, error = %error, ?waited, "mover not reachable");
    if waited < ctx.settings.mover_unreachable_grace {
        return Ok(Action::requeue(ctx.settings.pending_backoff));
    }
    let message = unreachable_message(mover, waited, error, &ctx.settings.operator_namespace);
    if waited >= ctx.settings.mover_start_timeout {
        ctx.reached(&ids.uid);
        return lost(ctx, obj, ids, status, &message).await;
    }
    if life.running_reason() != reason::MOVER_UNREACHABLE {
        let next = plan::with_life(obj, status, |l| {
            l.message = Some(message.clone());
            l.set_condition(RUNNING, false, reason::MOVER_UNREACHABLE, &message);
        });
        write_status(ctx, ids, obj, &next).await?;
        ctx.event(obj, true, reason::MOVER_UNREACHABLE, &message)
            .await;
    }
    Ok(Action::requeue(ctx.settings.pending_backoff))
}

/// What the status says of a mover the operator cannot reach.
fn unreachable_message(
    mover: &MoverAddress,
    waited: std::time::Duration,
    error: &str,
    operator_namespace: &str,
) -> String {
    format!(
        "the operator cannot reach mover pod {} at {}:{} (for {}s: {error}); \
         a NetworkPolicy in namespace {} may deny ingress from the operator's pods in \
         namespace {operator_namespace}: the operator creates NetworkPolicy {} to allow it \
         (unless run with --mover-network-policy=false), check that no other policy or \
         firewall drops the traffic",
        mover.pod,
        mover.ip,
        mover.port,
        waited.as_secs(),
        mover.namespace,
        mover.pod,
    )
}

/// Milliseconds since the Running condition last changed.
fn since_running_changed(life: &Life) -> i64 {
    life.condition(RUNNING).map_or(i64::MAX, |c| {
        Timestamp::now().as_millisecond() - c.last_transition_time.0.as_millisecond()
    })
}

/// The mover pod is gone: record it, then replace it after a backoff.
async fn lost<K: MoverKind>(
    ctx: &Context,
    obj: &K,
    ids: &Ids,
    status: &K::Status,
    why: &str,
) -> Result<Action, Error> {
    ctx.stop_watch(&ids.uid);
    let life = status.life();
    let settings = &ctx.settings;
    let recorded = matches!(life.running_reason(), reason::MOVER_LOST | reason::RETRYING);
    if life.attempts >= settings.max_attempts {
        // The last mover's pod stays when it crashed, for `kubectl logs` (it holds no
        // volume and no slot once ended; it goes with the resource).
        let mut kept = None;
        if let Some(pod) = &life.mover_pod {
            if pods::crashed(ctx, ids, pod) {
                pods::retire_mover(ctx, ids, pod).await?;
                kept = Some(pod.clone());
            } else {
                pods::delete_mover(ctx, ids, pod).await?;
            }
        }
        let mut message = format!(
            "{}; gave up after {} mover pods (the operator's limit of attempts): {}",
            life.message.as_deref().unwrap_or(why),
            life.attempts,
            "check the events of the mover pods and the endpoints, then create the resource again"
        );
        if let Some(pod) = kept {
            message.push_str(&format!(
                "; the last mover's pod is kept for its logs: kubectl -n {} logs {pod}",
                ids.namespace
            ));
        }
        return fail(ctx, obj, ids, status, reason::FAILED, &message).await;
    }
    let wait = settings.backoff(settings.retry_backoff, life.attempts.saturating_sub(1));
    if !recorded {
        if let Some(pod) = &life.mover_pod {
            pods::delete_mover(ctx, ids, pod).await?;
        }
        let next = plan::with_life(obj, status, |l| {
            l.message = Some(why.to_string());
            l.set_condition(RUNNING, false, reason::MOVER_LOST, why);
            if let Some(c) = l.conditions.iter_mut().find(|c| c.type_ == RUNNING) {
                c.last_transition_time = now();
            }
        });
        write_status(ctx, ids, obj, &next).await?;
        ctx.event(obj, true, reason::MOVER_LOST, why).await;
        return Ok(Action::requeue(wait));
    }
    let waited = u64::try_from(since_running_changed(&life)).unwrap_or(0);
    let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
    if waited < wait_ms {
        return Ok(Action::requeue(std::time::Duration::from_millis(
            wait_ms - waited,
        )));
    }
    start_attempt(ctx, obj, ids, status).await
}

/// Deleted: cancel the jobs, delete the mover, Cancelled, finalizer removed.
async fn on_delete<K: MoverKind>(ctx: &Context, obj: &K, ids: &Ids) -> Result<Action, Error> {
    if !finalizer::has(obj) {
        return Ok(Action::await_change());
    }
    ctx.stop_watch(&ids.uid);
    ctx.forget(&ids.uid);
    let status = obj.status().cloned().unwrap_or_default();
    let life = status.life();
    let mut latest = None;
    if !life.phase.is_final() {
        if let Some(pod_name) = &life.mover_pod {
            cancel_jobs(ctx, ids, pod_name).await?;
            pods::delete_mover(ctx, ids, pod_name).await?;
        }
        let message =
            "deleted while it ran: the mover was stopped; what it had committed stays written";
        let next = plan::with_life(obj, &status, |l| {
            l.finish(Phase::Cancelled, reason::CANCELLED, Some(message));
        });
        latest = Some(write_status(ctx, ids, obj, &next).await?);
        ctx.event(obj, false, reason::CANCELLED, message).await;
    }
    finalizer::remove(ctx, latest.as_ref().unwrap_or(obj), ids).await?;
    Ok(Action::await_change())
}

/// Asks a ready mover to cancel the resource's jobs (best effort: the pod is deleted
/// next either way, which stops them too).
async fn cancel_jobs(ctx: &Context, ids: &Ids, pod_name: &str) -> Result<(), Error> {
    if let PodState::Ready(pod) = pods::observe(ctx, ids, Some(pod_name)).await? {
        let mover = pods::address(ctx, ids, &pod).await?;
        if let Err(e) = ctx.link.cancel(&mover, &ids.uid).await {
            tracing::warn!(name = %ids.name, error = %e, "cannot cancel the mover's jobs; deleting the mover");
        }
    }
    Ok(())
}
