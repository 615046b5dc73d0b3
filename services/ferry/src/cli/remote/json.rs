//! The `--json` shapes of the clients: a job, its result, a schedule and a snapshot as one
//! JSON object each, built from the ferry-api messages in one place (scripts read these
//! shapes; docs/SERVICE.md shows them).

use ferry_api::names::{
    job_kind_name, job_state_name, missed_run_policy_name, schedule_run_result_name,
    target_state_name,
};
use ferry_api::proto;

use super::schedule::{endpoints, template_kind, time, zone};

/// A job as JSON (the shape `ferry job --json` prints).
pub fn job_json(j: &proto::Job) -> serde_json::Value {
    let p = j.progress.unwrap_or_default();
    let result = match &j.result {
        Some(proto::job::Result::TransferResult(r)) => serde_json::json!({
            "size": r.size, "data_bytes": r.data_bytes, "zero_bytes": r.zero_bytes,
            "seconds": r.seconds, "throughput_bytes_per_second": r.throughput_bytes_per_second,
            "resumed_bytes": r.resumed_bytes,
            "source_digest": digest_json(&r.source_digest), "target_digest": digest_json(&r.target_digest),
        }),
        Some(proto::job::Result::ChecksumResult(r)) => serde_json::json!({
            "size": r.size, "seconds": r.seconds,
            "throughput_bytes_per_second": r.throughput_bytes_per_second,
            "digest": digest_json(&r.digest),
        }),
        Some(r) => result_json(r).unwrap_or(serde_json::Value::Null),
        None => serde_json::Value::Null,
    };
    serde_json::json!({
        "id": j.id,
        "kind": job_kind_name(j.kind),
        "state": job_state_name(j.state),
        "idempotency_key": j.idempotency_key,
        "labels": j.labels,
        "priority": j.priority,
        "attempt": j.attempt,
        "progress": {
            "total_bytes": p.total_bytes, "done_bytes": p.done_bytes, "data_bytes": p.data_bytes,
            "zero_bytes": p.zero_bytes, "resumed_bytes": p.resumed_bytes,
            "committed_bytes": p.committed_bytes, "bytes_per_second": p.bytes_per_second,
        },
        "result": result,
        "error": j.error.as_ref().map(|e| serde_json::json!({"kind": e.kind, "message": e.message})),
        "message": j.message,
        "checkpoint": checkpoint_json(&j.checkpoint),
        "targets": j.targets.iter().map(target_json).collect::<Vec<_>>(),
    })
}

fn target_json(t: &proto::TargetOutcome) -> serde_json::Value {
    serde_json::json!({
        "target": t.target,
        "state": target_state_name(t.state),
        "error": t.error.as_ref().map(|e| serde_json::json!({"kind": e.kind, "message": e.message})),
        "digest": digest_json(&t.digest),
        "done_bytes": t.done_bytes,
        "resumable": t.resumable,
    })
}

fn digest_json(d: &Option<proto::Digest>) -> serde_json::Value {
    match d {
        Some(d) => serde_json::json!({
            "algorithm": ferry_api::options::hash_algorithm(d.algorithm).unwrap_or_default().as_str(),
            "hex": d.hex,
        }),
        None => serde_json::Value::Null,
    }
}

pub fn checkpoint_json(c: &Option<proto::Checkpoint>) -> serde_json::Value {
    match c {
        Some(c) => serde_json::json!({
            "size": c.size,
            "committed": c.committed.iter().map(|r| [r.start, r.end]).collect::<Vec<_>>(),
        }),
        None => serde_json::Value::Null,
    }
}

/// A backup job's result as JSON (the shape `ferry job --json` prints), None for others.
pub fn result_json(r: &proto::job::Result) -> Option<serde_json::Value> {
    use proto::job::Result as R;
    Some(match r {
        R::BackupResult(b) => serde_json::json!({
            "snapshot_id": b.snapshot_id, "parent_id": b.parent_id, "full_reason": b.full_reason,
            "source_id": b.source_id, "size": b.size, "bytes_read": b.bytes_read,
            "bytes_new": b.bytes_new, "bytes_reused": b.bytes_reused, "bytes_zero": b.bytes_zero,
            "chunks_new": b.chunks_new, "chunks_reused": b.chunks_reused,
            "chunks_zero": b.chunks_zero, "seconds": b.seconds,
            "block_hash": b.digest.as_ref().map(|d| d.hex.clone()),
            "pruned": b.prune.as_ref().map(|p| p.removed.iter().map(|s| s.id.clone()).collect::<Vec<_>>()),
            "prune_error": b.prune_error.as_ref().map(|e| e.message.clone()),
        }),
        R::RestoreResult(r) => serde_json::json!({
            "snapshot_id": r.snapshot_id, "size": r.size, "data_bytes": r.data_bytes,
            "zero_bytes": r.zero_bytes, "verified": r.verified, "seconds": r.seconds,
            "block_hash": r.digest.as_ref().map(|d| d.hex.clone()),
        }),
        R::RepositoryVerifyResult(v) => serde_json::json!({
            "ok": v.ok, "snapshots_checked": v.snapshots_checked,
            "chunks_checked": v.chunks_checked, "chunks_bad": v.chunks_bad,
            "broken_snapshots": v.broken_snapshots,
        }),
        R::PruneResult(p) => serde_json::json!({
            "kept": p.kept.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
            "removed": p.removed.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
            "dry_run": p.dry_run,
        }),
        R::GcResult(g) => serde_json::json!({
            "chunks_removed": g.chunks_removed, "bytes_removed": g.bytes_removed,
            "chunks_referenced": g.chunks_referenced, "chunks_recent": g.chunks_recent,
            "bytes_kept": g.bytes_kept, "seconds": g.seconds,
        }),
        R::SyncResult(s) => super::sync::result_json(s),
        R::TransferResult(_) | R::ChecksumResult(_) => return None,
    })
}

pub fn snapshot_json(s: &proto::Snapshot) -> serde_json::Value {
    serde_json::json!({
        "id": s.id, "time": s.time.as_ref().map(|t| t.seconds), "source_id": s.source_id,
        "parent_id": s.parent_id, "tags": s.tags, "size": s.size, "chunk_size": s.chunk_size,
        "block_hash": s.digest.as_ref().map(|d| d.hex.clone()), "bytes_new": s.bytes_new,
        "bytes_reused": s.bytes_reused, "bytes_zero": s.bytes_zero,
    })
}

/// A schedule as JSON (the shape `ferry schedule --json` prints).
pub fn schedule_json(s: &proto::Schedule) -> serde_json::Value {
    let status = s.status.clone().unwrap_or_default();
    let (source, target) = endpoints(s);
    let last_run = status.last_run.as_ref().map(|r| {
        serde_json::json!({
            "job_id": r.job_id,
            "fire_time": time_json(&r.fire_time),
            "start_time": time_json(&r.start_time),
            "result": schedule_run_result_name(r.result),
            "message": r.message,
            "manual": r.manual,
        })
    });
    serde_json::json!({
        "id": s.id,
        "name": s.name,
        "cron": s.cron,
        "time_zone": zone(s),
        "paused": s.paused,
        "missed_run_policy": missed_run_policy_name(s.missed_run_policy),
        "kind": template_kind(s),
        "source": source,
        "target": target,
        "labels": s.labels,
        "next_run_time": time_json(&status.next_run_time),
        "last_run": last_run,
        "last_success_time": time_json(&status.last_success_time),
        "runs_started": status.runs_started,
        "runs_skipped": status.runs_skipped,
        "runs_missed": status.runs_missed,
        "consecutive_failures": status.consecutive_failures,
    })
}

fn time_json(t: &Option<prost_types::Timestamp>) -> serde_json::Value {
    match t {
        Some(_) => serde_json::Value::String(time(t)),
        None => serde_json::Value::Null,
    }
}
