//! A schedule's snapshot taken in a VolumeGroupSnapshot (groupsnapshot.storage.k8s.io)
//! with the other claims of its app, so several volumes of one app are backed up from one
//! instant. The schedules of the app's claims name one `volumeGroup`; at a fire time the
//! first of them creates the group snapshot `<group>-<fire time>` over every claim the
//! selector matches (between its own consistency hooks, when it has any: a schedule that
//! finds the group snapshot made runs none), and once it is ready hands its member
//! snapshots out, as Velero does: the group's content is set to `Retain` first, each
//! member VolumeSnapshot is labelled with the group snapshot and annotated with its claim,
//! and the group snapshot is deleted orphaning its members (the garbage collector drops
//! their owner reference to it, the snapshot controller their group finalizer), then its
//! content. A member lives on as an ordinary VolumeSnapshot of its claim that its
//! schedule takes (an owner reference), backs up from and deletes (or keeps as the next
//! changed-block base) like its own. A schedule takes a labelled snapshot only when its
//! status (which only the snapshot controller writes) names the group snapshot too.
//!
//! Which member is of which claim: the group's content lists pairs of CSI volume and
//! snapshot handles (`volumeSnapshotInfoList`, v1beta2's, or v1beta1's
//! `volumeSnapshotHandlePairList`); a claim's volume handle is its PersistentVolume's, a
//! member's snapshot handle its VolumeSnapshotContent's ([`members_by_claim`]).
//!
//! Where there are no group snapshots (the kind not served, or one not ready
//! [`GROUP_PATIENCE`] after it was made), the claim gets a snapshot of its own; the group
//! snapshot is deleted by the schedule that made it (its `ferry.dev/made-by`
//! annotation). What earlier fires left (a group snapshot the operator made and never
//! handed out, members no schedule took) is deleted by the next hand-out, a content only
//! when it names its group snapshot back.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{
    DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, PropagationPolicy,
};
use kube::{Api, Resource};
use serde_json::{json, Value};

use crate::controller::Error;
use crate::crd::BackupSchedule;

use super::build::{self, GROUP_LABEL, GROUP_SNAPSHOT_LABEL, MEMBER_OF_ANNOTATION};
use super::{consistent, Context};

/// Most claims one group snapshot hands out.
pub const MAX_MEMBERS: usize = 256;

/// Where the schedule's snapshot of a group fire is.
#[derive(Debug)]
pub enum Member {
    /// The claim's member VolumeSnapshot, handed out and claimed by the schedule.
    Ready(Box<DynamicObject>),
    /// Not ready yet: why.
    Pending(String),
    /// The fire cannot have one: why (hooks that failed, a claim outside the group).
    Refused(String),
    /// The cluster or the driver takes no group snapshots: why (the claim then gets a
    /// snapshot of its own).
    Unsupported(String),
}

/// How long a group snapshot may report an error without becoming ready before the
/// schedule takes the claim's own snapshot instead (a driver without group snapshots, a
/// class that does not exist).
pub const GROUP_PATIENCE: std::time::Duration = std::time::Duration::from_secs(300);

/// The CSI (volume handle, snapshot handle) pairs a group snapshot's content lists.
pub fn handle_pairs(content: &Value) -> Vec<(String, String)> {
    let status = &content["status"];
    let list = status["volumeSnapshotInfoList"]
        .as_array()
        .or_else(|| status["volumeSnapshotHandlePairList"].as_array());
    list.into_iter()
        .flatten()
        .take(MAX_MEMBERS)
        .filter_map(|p| {
            Some((
                p["volumeHandle"].as_str()?.to_string(),
                p["snapshotHandle"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// Claim name -> member VolumeSnapshot name, from the content's handle pairs, the claims'
/// volume handles (claim, handle) and the members' snapshot handles (snapshot, handle).
/// A claim or member whose handle is not paired is left out.
pub fn members_by_claim(
    pairs: &[(String, String)],
    claims: &[(String, String)],
    members: &[(String, String)],
) -> BTreeMap<String, String> {
    let snapshot_of_volume: BTreeMap<&str, &str> = pairs
        .iter()
        .map(|(v, s)| (v.as_str(), s.as_str()))
        .collect();
    let member_of_snapshot: BTreeMap<&str, &str> = members
        .iter()
        .map(|(m, s)| (s.as_str(), m.as_str()))
        .collect();
    claims
        .iter()
        .filter_map(|(claim, volume)| {
            let snapshot = snapshot_of_volume.get(volume.as_str())?;
            let member = member_of_snapshot.get(snapshot)?;
            Some((claim.clone(), member.to_string()))
        })
        .collect()
}

fn not_found<T>(r: Result<T, kube::Error>) -> Result<Option<T>, Error> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The schedule's member snapshot of the group snapshot `name` (see the module docs).
pub async fn member(ctx: &Context, schedule: &BackupSchedule, name: &str) -> Result<Member, Error> {
    let namespace = schedule.metadata.namespace.clone().unwrap_or_default();
    let claim = schedule.spec.source_pvc.as_str();
    if let Some(mine) = handed_out(ctx, &namespace, name, claim).await? {
        return Ok(Member::Ready(Box::new(claimed(ctx, schedule, mine).await?)));
    }
    let groups: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &namespace,
        &build::volume_group_snapshot_api(),
    );
    let group = match groups.get_opt(name).await? {
        Some(group) => group,
        None => {
            // Handed out (and deleted) by another schedule between the look above and the
            // get: its labels were written before the deletion, so they show now.
            if let Some(mine) = handed_out(ctx, &namespace, name, claim).await? {
                return Ok(Member::Ready(Box::new(claimed(ctx, schedule, mine).await?)));
            }
            // A kind the API server does not serve answers a list with 404: no hooks run
            // and no app is frozen around a create that cannot work.
            match groups.list(&ListParams::default().limit(1)).await {
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    return Ok(Member::Unsupported(format!(
                        "the API server serves no VolumeGroupSnapshots (groupsnapshot.storage.k8s.io/v1beta1: {})",
                        e.message
                    )))
                }
                Err(e) => return Err(e.into()),
                Ok(_) => {}
            }
            let Some(object) = build::volume_group_snapshot(schedule, name) else {
                return Ok(Member::Refused("the schedule names no volumeGroup".into()));
            };
            if consistent::wanted(schedule) {
                let outcome =
                    consistent::take(ctx, schedule, &build::volume_group_snapshot_api(), &object)
                        .await?;
                if let Some(why) = outcome.failed {
                    // Made before what failed after it (by this schedule only: another
                    // schedule of the group may have made it, and waits on it).
                    delete_if_made_by(ctx, schedule, &namespace, name).await?;
                    return Ok(Member::Refused(why));
                }
                if !outcome.warnings.is_empty() {
                    let note = outcome.warnings.join("; ");
                    ctx.event(schedule, true, "ConsistencyWarning", &note).await;
                }
                match outcome.snapshot {
                    Some(group) => group,
                    None => {
                        return Ok(Member::Pending(format!(
                            "VolumeGroupSnapshot {name} is being made"
                        )))
                    }
                }
            } else {
                match groups.create(&PostParams::default(), &object).await {
                    Ok(created) => created,
                    Err(kube::Error::Api(e)) if e.code == 409 => groups.get(name).await?,
                    Err(e) => return Err(e.into()),
                }
            }
        }
    };
    let status = &group.data["status"];
    if status["readyToUse"].as_bool() != Some(true) {
        let error = status["error"]["message"].as_str();
        let made = group
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(i64::MAX, |t| t.0.as_millisecond());
        let waited = ctx.clock.now().timestamp_millis().saturating_sub(made);
        let patience = i64::try_from(GROUP_PATIENCE.as_millis()).unwrap_or(i64::MAX);
        if waited > patience {
            delete_if_made_by(ctx, schedule, &namespace, name).await?;
            let why = error.map_or_else(
                || "no snapshot controller has taken it up (are group snapshots on in the snapshot controller?)".to_string(),
                |e| format!("the snapshot controller says: {e}"),
            );
            return Ok(Member::Unsupported(format!(
                "VolumeGroupSnapshot {name} is not ready after {} s: {why}",
                GROUP_PATIENCE.as_secs()
            )));
        }
        let mut why =
            format!("VolumeGroupSnapshot {name} is not ready yet: the backup starts once it is");
        if let Some(error) = error {
            why.push_str(&format!(" (the snapshot controller says: {error})"));
        }
        return Ok(Member::Pending(why));
    }
    if let Err(why) = hand_out(ctx, schedule, &namespace, &group).await? {
        return Ok(Member::Pending(why));
    }
    retire_older(ctx, schedule, &namespace, name).await?;
    match handed_out(ctx, &namespace, name, claim).await? {
        Some(mine) => Ok(Member::Ready(Box::new(claimed(ctx, schedule, mine).await?))),
        None => Ok(Member::Refused(format!(
            "VolumeGroupSnapshot {name} holds no snapshot of pvc/{claim}: label the claim with spec.volumeGroup.selector's labels (the group's snapshots are taken over the claims that carry them)"
        ))),
    }
}

/// Deletes the group snapshot `name` when this schedule made it (its annotation says so).
async fn delete_if_made_by(
    ctx: &Context,
    schedule: &BackupSchedule,
    namespace: &str,
    name: &str,
) -> Result<(), Error> {
    let groups: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        namespace,
        &build::volume_group_snapshot_api(),
    );
    let Some(group) = groups.get_opt(name).await? else {
        return Ok(());
    };
    let uid = schedule.metadata.uid.as_deref().unwrap_or_default();
    let mine = group
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(build::MADE_BY_ANNOTATION))
        .is_some_and(|by| by == uid);
    if mine {
        not_found(groups.delete(name, &DeleteParams::default()).await)?;
    }
    Ok(())
}

/// The member of group snapshot `name` handed out for `claim`, if any.
async fn handed_out(
    ctx: &Context,
    namespace: &str,
    name: &str,
    claim: &str,
) -> Result<Option<DynamicObject>, Error> {
    let snapshots: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), namespace, &build::volume_snapshot_api());
    let members = snapshots
        .list(&ListParams::default().labels(&format!("{GROUP_SNAPSHOT_LABEL}={name}")))
        .await?
        .items;
    // The status (written only by the snapshot controller) must agree with the label:
    // a labelled snapshot of anyone else's is no member.
    Ok(members.into_iter().find(|m| {
        m.data["status"]["volumeGroupSnapshotName"].as_str() == Some(name)
            && m.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(MEMBER_OF_ANNOTATION))
                .is_some_and(|c| c == claim)
    }))
}

/// The member with the schedule among its owners (so deleting the schedule deletes it).
async fn claimed(
    ctx: &Context,
    schedule: &BackupSchedule,
    member: DynamicObject,
) -> Result<DynamicObject, Error> {
    let Some(owner) = schedule.controller_owner_ref(&()) else {
        return Err(Error::NotStored("BackupSchedule"));
    };
    let owners = member.metadata.owner_references.clone().unwrap_or_default();
    if owners.iter().any(|o| o.uid == owner.uid) {
        return Ok(member);
    }
    let mut all = owners;
    all.push(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            controller: None,
            block_owner_deletion: None,
            ..owner
        },
    );
    let namespace = member.metadata.namespace.clone().unwrap_or_default();
    let name = member.metadata.name.clone().unwrap_or_default();
    let snapshots: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &namespace,
        &build::volume_snapshot_api(),
    );
    let patch = json!({"metadata": {
        "ownerReferences": all,
        "resourceVersion": member.metadata.resource_version,
    }});
    Ok(snapshots
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?)
}

/// Labels every member of the ready group snapshot with it and its claim, frees it from
/// the group, and sets the group's content to `Retain`. Err: why it cannot yet (the
/// content or a member not bound yet).
async fn hand_out(
    ctx: &Context,
    schedule: &BackupSchedule,
    namespace: &str,
    group: &DynamicObject,
) -> Result<Result<(), String>, Error> {
    let name = group.metadata.name.clone().unwrap_or_default();
    let Some(content_name) = group.data["status"]["boundVolumeGroupSnapshotContentName"].as_str()
    else {
        return Ok(Err(format!(
            "VolumeGroupSnapshot {name} is bound to no content yet"
        )));
    };
    let contents: Api<DynamicObject> = Api::all_with(
        ctx.client.clone(),
        &build::volume_group_snapshot_content_api(),
    );
    let Some(content) = not_found(contents.get(content_name).await)? else {
        return Ok(Err(format!(
            "VolumeGroupSnapshotContent {content_name} of {name} does not exist yet"
        )));
    };
    if !points_back(&content, namespace, &name) {
        return Ok(Err(format!(
            "VolumeGroupSnapshotContent {content_name} does not name VolumeGroupSnapshot {namespace}/{name}: not handed out"
        )));
    }
    // Retain first: should the group snapshot go now, its members' storage stays.
    contents
        .patch(
            content_name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"deletionPolicy": "Retain"}})),
        )
        .await?;
    let pairs = handle_pairs(&content.data);
    let claims = claim_handles(ctx, schedule, namespace).await?;
    let snapshots: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), namespace, &build::volume_snapshot_api());
    let members: Vec<DynamicObject> = snapshots
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|s| s.data["status"]["volumeGroupSnapshotName"].as_str() == Some(name.as_str()))
        .take(MAX_MEMBERS)
        .collect();
    let snapshot_contents: Api<DynamicObject> =
        Api::all_with(ctx.client.clone(), &build::volume_snapshot_content_api());
    let mut member_handles = Vec::with_capacity(members.len());
    for m in &members {
        let member = m.metadata.name.clone().unwrap_or_default();
        let Some(bound) = m.data["status"]["boundVolumeSnapshotContentName"].as_str() else {
            return Ok(Err(format!(
                "member VolumeSnapshot {member} of {name} is bound to no content yet"
            )));
        };
        let Some(c) = not_found(snapshot_contents.get(bound).await)? else {
            return Ok(Err(format!(
                "VolumeSnapshotContent {bound} of {member} does not exist yet"
            )));
        };
        let handle = c.data["status"]["snapshotHandle"]
            .as_str()
            .or_else(|| c.data["spec"]["source"]["snapshotHandle"].as_str());
        if let Some(handle) = handle {
            member_handles.push((member, handle.to_string()));
        }
    }
    let by_claim = members_by_claim(&pairs, &claims, &member_handles);
    for m in &members {
        let member = m.metadata.name.clone().unwrap_or_default();
        let Some((claim, _)) = by_claim.iter().find(|(_, s)| **s == member) else {
            continue;
        };
        let owners: Vec<_> = m
            .metadata
            .owner_references
            .iter()
            .flatten()
            .filter(|o| o.kind != "VolumeGroupSnapshot")
            .cloned()
            .collect();
        let group_name = schedule
            .spec
            .volume_group
            .as_ref()
            .map(|g| g.name.clone())
            .unwrap_or_default();
        let patch = json!({"metadata": {
            "labels": {GROUP_SNAPSHOT_LABEL: name, GROUP_LABEL: group_name},
            "annotations": {MEMBER_OF_ANNOTATION: claim},
            "ownerReferences": owners,
            "resourceVersion": m.metadata.resource_version,
        }});
        snapshots
            .patch(&member, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    // Handed out: the group snapshot goes (its dependents orphaned, not deleted: the
    // garbage collector drops their owner reference to it, and the snapshot controller
    // their group finalizer), then its content (Retain: the members' storage stays).
    let groups: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        namespace,
        &build::volume_group_snapshot_api(),
    );
    let orphan = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..DeleteParams::default()
    };
    not_found(groups.delete(&name, &orphan).await)?;
    not_found(
        contents
            .delete(content_name, &DeleteParams::default())
            .await,
    )?;
    Ok(Ok(()))
}

/// (claim, CSI volume handle) of every bound claim the group's selector matches.
async fn claim_handles(
    ctx: &Context,
    schedule: &BackupSchedule,
    namespace: &str,
) -> Result<Vec<(String, String)>, Error> {
    let Some(group) = &schedule.spec.volume_group else {
        return Ok(Vec::new());
    };
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let mut handles = Vec::new();
    let matched = claims
        .list(&ListParams::default().labels(&group.selector_query()))
        .await?
        .items;
    for claim in matched.into_iter().take(MAX_MEMBERS) {
        let name = claim.metadata.name.clone().unwrap_or_default();
        let Some(volume) = claim.spec.and_then(|s| s.volume_name) else {
            continue;
        };
        let handle = not_found(volumes.get(&volume).await)?
            .and_then(|pv| pv.spec)
            .and_then(|s| s.csi)
            .map(|c| c.volume_handle);
        if let Some(handle) = handle {
            handles.push((name, handle));
        }
    }
    Ok(handles)
}

/// Whether a group snapshot content names `namespace/name` as its group snapshot.
fn points_back(content: &DynamicObject, namespace: &str, name: &str) -> bool {
    let r = &content.data["spec"]["volumeGroupSnapshotRef"];
    r["namespace"].as_str() == Some(namespace) && r["name"].as_str() == Some(name)
}

/// Deletes what earlier fires of the group left: a group snapshot the operator made (its
/// name and annotation say so) that was never handed out (a fire that failed or was
/// given up), with its content when that names it back, and the handed-out members of
/// earlier fires that no schedule took (a labelled claim without a schedule).
async fn retire_older(
    ctx: &Context,
    schedule: &BackupSchedule,
    namespace: &str,
    current: &str,
) -> Result<(), Error> {
    let Some(group) = &schedule.spec.volume_group else {
        return Ok(());
    };
    let groups: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        namespace,
        &build::volume_group_snapshot_api(),
    );
    let contents: Api<DynamicObject> = Api::all_with(
        ctx.client.clone(),
        &build::volume_group_snapshot_content_api(),
    );
    let snapshots: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), namespace, &build::volume_snapshot_api());
    let older = |n: &str| build::is_group_snapshot_name(&group.name, n) && n < current;
    let left: Vec<DynamicObject> = groups
        .list(&ListParams::default().labels(&format!("{GROUP_LABEL}={}", group.name)))
        .await?
        .items
        .into_iter()
        .filter(|g| g.metadata.name.as_deref().is_some_and(older))
        .filter(|g| {
            g.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(build::MADE_BY_ANNOTATION))
        })
        .collect();
    for old in left {
        let name = old.metadata.name.clone().unwrap_or_default();
        not_found(groups.delete(&name, &DeleteParams::default()).await)?;
        if let Some(content) = old.data["status"]["boundVolumeGroupSnapshotContentName"].as_str() {
            if let Some(c) = not_found(contents.get(content).await)? {
                if points_back(&c, namespace, &name) {
                    not_found(contents.delete(content, &DeleteParams::default()).await)?;
                }
            }
        }
    }
    let unclaimed = snapshots
        .list(&ListParams::default().labels(&format!("{GROUP_LABEL}={}", group.name)))
        .await?
        .items
        .into_iter()
        .filter(|m| {
            let of = m
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(GROUP_SNAPSHOT_LABEL));
            let status_of = m.data["status"]["volumeGroupSnapshotName"].as_str();
            of.is_some_and(|g| older(g) && status_of == Some(g.as_str()))
                && m.metadata
                    .owner_references
                    .as_ref()
                    .is_none_or(Vec::is_empty)
        });
    for m in unclaimed {
        let member = m.metadata.name.clone().unwrap_or_default();
        not_found(snapshots.delete(&member, &DeleteParams::default()).await)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &str) -> Value {
        json!({"status": {list: [
            {"volumeHandle": "vol-a", "snapshotHandle": "snap-a"},
            {"volumeHandle": "vol-b", "snapshotHandle": "snap-b"},
            {"volumeHandle": "vol-c"},
        ]}})
    }

    #[test]
    fn members_are_matched_to_claims_through_the_csi_handles() {
        for list in ["volumeSnapshotInfoList", "volumeSnapshotHandlePairList"] {
            let p = handle_pairs(&pairs(list));
            assert_eq!(
                p,
                [
                    ("vol-a".to_string(), "snap-a".to_string()),
                    ("vol-b".to_string(), "snap-b".to_string())
                ],
                "{list}"
            );
            let claims = [
                ("db-data".to_string(), "vol-a".to_string()),
                ("db-wal".to_string(), "vol-b".to_string()),
                ("other".to_string(), "vol-x".to_string()),
            ];
            let members = [
                ("snapshot-1b2c".to_string(), "snap-b".to_string()),
                ("snapshot-9f8e".to_string(), "snap-a".to_string()),
                ("stray".to_string(), "snap-z".to_string()),
            ];
            let by_claim = members_by_claim(&p, &claims, &members);
            assert_eq!(
                by_claim,
                BTreeMap::from([
                    ("db-data".to_string(), "snapshot-9f8e".to_string()),
                    ("db-wal".to_string(), "snapshot-1b2c".to_string()),
                ])
            );
        }
        assert!(handle_pairs(&json!({"status": {}})).is_empty());
        let many: Vec<Value> = (0..1000)
            .map(|i| json!({"volumeHandle": format!("v{i}"), "snapshotHandle": format!("s{i}")}))
            .collect();
        assert_eq!(
            handle_pairs(&json!({"status": {"volumeSnapshotInfoList": many}})).len(),
            MAX_MEMBERS,
            "bounded: the list comes from the API"
        );
    }
}
