//! Pruning: which backups a retention policy keeps, with restic's semantics, and
//! removing the others.
//!
//! [`plan`] is a pure function: snapshots, policy and the current time in, a decision
//! with reasons for each snapshot out. Snapshots are grouped by source identity and each
//! group is judged alone, newest first:
//!
//! - `keep-last N` keeps the N newest; `keep-hourly/daily/weekly/monthly/yearly N` keep
//!   the newest snapshot of each of the N most recent hours/days/ISO weeks/months/years
//!   that have one ([`Keep::All`]: of every such period). Periods are in UTC.
//! - While a rule still has count left when the oldest snapshot is reached, the oldest
//!   is kept too (the longest history the counts allow).
//! - `keep-within 1y2m3d4h` keeps every snapshot newer than that duration before the
//!   group's newest snapshot (not before now: a source that stopped being backed up
//!   keeps its last history). Snapshots dated after `now` are not "newest" for this.
//! - A snapshot kept by any rule is kept. An empty policy keeps everything (and
//!   [`Repository::prune`] refuses it).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Datelike, Duration, NaiveDate, Timelike, Utc};
use ferry_core::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::manifest::{BackupId, Manifest};
use crate::repository::Repository;

/// How many periods a rule keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Keep {
    /// The N most recent.
    Count(u32),
    /// Every one.
    All,
}

/// A duration in calendar units, as restic writes it: `1y2m3d4h` (any subset, in that
/// order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalendarDuration {
    pub years: u32,
    pub months: u32,
    pub days: u32,
    pub hours: u32,
}

impl CalendarDuration {
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }

    /// `t` minus this duration, with Go's calendar arithmetic (restic's): years and
    /// months move the month, an overflowing day rolls into the next month (March 31
    /// minus one month is March 3 in a common year), then days and hours are subtracted.
    /// `None` when out of the representable range.
    pub fn before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let month0 = i64::from(t.year()) * 12 + i64::from(t.month0())
            - i64::from(self.years) * 12
            - i64::from(self.months);
        let year = i32::try_from(month0.div_euclid(12)).ok()?;
        let month = u32::try_from(month0.rem_euclid(12)).ok()? + 1;
        let first = NaiveDate::from_ymd_opt(year, month, 1)?;
        let date = first.checked_add_signed(Duration::days(
            i64::from(t.day()) - 1 - i64::from(self.days),
        ))?;
        let shifted = date.and_time(t.time()).and_utc();
        shifted.checked_sub_signed(Duration::hours(i64::from(self.hours)))
    }
}

impl FromStr for CalendarDuration {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::invalid_input(format!(
                "'{s}' is not a duration like 1y2m3d4h (years, months, days, hours)"
            ))
        };
        let mut out = Self::default();
        let mut number = String::new();
        let mut order = 0;
        for c in s.chars() {
            if c.is_ascii_digit() {
                number.push(c);
                continue;
            }
            let value: u32 = number.parse().map_err(|_| bad())?;
            number.clear();
            let (slot, rank) = match c {
                'y' => (&mut out.years, 1),
                'm' => (&mut out.months, 2),
                'd' => (&mut out.days, 3),
                'h' => (&mut out.hours, 4),
                _ => return Err(bad()),
            };
            if rank <= order {
                return Err(bad());
            }
            order = rank;
            *slot = value;
        }
        if !number.is_empty() || order == 0 {
            return Err(bad());
        }
        Ok(out)
    }
}

impl fmt::Display for CalendarDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut any = false;
        for (v, unit) in [
            (self.years, 'y'),
            (self.months, 'm'),
            (self.days, 'd'),
            (self.hours, 'h'),
        ] {
            if v > 0 {
                write!(f, "{v}{unit}")?;
                any = true;
            }
        }
        if !any {
            f.write_str("0h")?;
        }
        Ok(())
    }
}

/// A retention policy. Rules left `None` (or `Count(0)`) are off.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct KeepPolicy {
    pub last: Option<Keep>,
    pub hourly: Option<Keep>,
    pub daily: Option<Keep>,
    pub weekly: Option<Keep>,
    pub monthly: Option<Keep>,
    pub yearly: Option<Keep>,
    pub within: Option<CalendarDuration>,
}

impl KeepPolicy {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_last(mut self, keep: Keep) -> Self {
        self.last = Some(keep);
        self
    }

    pub fn with_hourly(mut self, keep: Keep) -> Self {
        self.hourly = Some(keep);
        self
    }

    pub fn with_daily(mut self, keep: Keep) -> Self {
        self.daily = Some(keep);
        self
    }

    pub fn with_weekly(mut self, keep: Keep) -> Self {
        self.weekly = Some(keep);
        self
    }

    pub fn with_monthly(mut self, keep: Keep) -> Self {
        self.monthly = Some(keep);
        self
    }

    pub fn with_yearly(mut self, keep: Keep) -> Self {
        self.yearly = Some(keep);
        self
    }

    pub fn with_within(mut self, within: CalendarDuration) -> Self {
        self.within = Some(within);
        self
    }

    /// Whether no rule is on.
    pub fn is_empty(&self) -> bool {
        let off = |k: &Option<Keep>| matches!(k, None | Some(Keep::Count(0)));
        [
            &self.last,
            &self.hourly,
            &self.daily,
            &self.weekly,
            &self.monthly,
            &self.yearly,
        ]
        .into_iter()
        .all(off)
            && self.within.is_none_or(|w| w.is_zero())
    }
}

/// Why a snapshot is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeepReason {
    Last,
    Hourly,
    Daily,
    Weekly,
    Monthly,
    Yearly,
    Within(CalendarDuration),
    /// No rule is on.
    EmptyPolicy,
    /// Protected (`ferry backup protect`): never removed by a prune.
    Protected,
}

impl fmt::Display for KeepReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Last => f.write_str("last snapshot"),
            Self::Hourly => f.write_str("hourly snapshot"),
            Self::Daily => f.write_str("daily snapshot"),
            Self::Weekly => f.write_str("weekly snapshot"),
            Self::Monthly => f.write_str("monthly snapshot"),
            Self::Yearly => f.write_str("yearly snapshot"),
            Self::Within(d) => write!(f, "within {d} of the newest"),
            Self::EmptyPolicy => f.write_str("policy is empty"),
            Self::Protected => f.write_str("protected"),
        }
    }
}

/// What the policy needs to know of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRef {
    pub id: BackupId,
    pub time: DateTime<Utc>,
    pub source: String,
    /// Protected backups are kept (reason [`KeepReason::Protected`]) and set aside
    /// before the rules count, as in Proxmox Backup Server.
    pub protected: bool,
}

impl From<&Manifest> for SnapshotRef {
    fn from(m: &Manifest) -> Self {
        Self {
            id: m.id.clone(),
            time: m.time,
            source: m.source.clone(),
            protected: false,
        }
    }
}

/// The verdict on one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub snapshot: SnapshotRef,
    /// Empty when the snapshot is to be forgotten.
    pub reasons: Vec<KeepReason>,
}

impl Decision {
    pub fn keep(&self) -> bool {
        !self.reasons.is_empty()
    }
}

/// Every snapshot's verdict: grouped by source (sorted), newest first in each group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrunePlan {
    pub decisions: Vec<Decision>,
}

impl PrunePlan {
    /// The snapshots kept.
    pub fn kept(&self) -> impl Iterator<Item = &SnapshotRef> {
        self.decisions
            .iter()
            .filter(|d| d.keep())
            .map(|d| &d.snapshot)
    }

    /// The snapshots to forget.
    pub fn forgotten(&self) -> impl Iterator<Item = &SnapshotRef> {
        self.decisions
            .iter()
            .filter(|d| !d.keep())
            .map(|d| &d.snapshot)
    }
}

type Bucker = fn(DateTime<Utc>, usize) -> i64;

fn bucket_last(_: DateTime<Utc>, nr: usize) -> i64 {
    nr as i64
}
fn bucket_hour(t: DateTime<Utc>, _: usize) -> i64 {
    bucket_day(t, 0) * 100 + i64::from(t.hour())
}
fn bucket_day(t: DateTime<Utc>, _: usize) -> i64 {
    bucket_month(t, 0) * 100 + i64::from(t.day())
}
fn bucket_week(t: DateTime<Utc>, _: usize) -> i64 {
    let w = t.iso_week();
    i64::from(w.year()) * 100 + i64::from(w.week())
}
fn bucket_month(t: DateTime<Utc>, _: usize) -> i64 {
    i64::from(t.year()) * 100 + i64::from(t.month())
}
fn bucket_year(t: DateTime<Utc>, _: usize) -> i64 {
    i64::from(t.year())
}

struct Rule {
    /// Periods left; `None` for all.
    left: Option<u32>,
    bucker: Bucker,
    last: Option<i64>,
    reason: KeepReason,
}

/// Judges every snapshot against `policy` (see the module docs).
pub fn plan(snapshots: &[SnapshotRef], policy: &KeepPolicy, now: DateTime<Utc>) -> PrunePlan {
    let mut groups: BTreeMap<&str, Vec<&SnapshotRef>> = BTreeMap::new();
    for s in snapshots {
        groups.entry(s.source.as_str()).or_default().push(s);
    }
    let mut decisions = Vec::with_capacity(snapshots.len());
    for (_, mut group) in groups {
        group.sort_by(|a, b| b.time.cmp(&a.time).then_with(|| b.id.cmp(&a.id)));
        decisions.extend(plan_group(&group, policy, now));
    }
    PrunePlan { decisions }
}

fn plan_group(group: &[&SnapshotRef], policy: &KeepPolicy, now: DateTime<Utc>) -> Vec<Decision> {
    let (protected, group): (Vec<&SnapshotRef>, Vec<&SnapshotRef>) =
        group.iter().partition(|s| s.protected);
    let mut decisions: Vec<Decision> = protected
        .into_iter()
        .map(|s| Decision {
            snapshot: s.clone(),
            reasons: vec![KeepReason::Protected],
        })
        .collect();
    decisions.extend(plan_rules(&group, policy, now));
    decisions
}

/// The rules' decisions for the unprotected snapshots of one group, newest first.
fn plan_rules(group: &[&SnapshotRef], policy: &KeepPolicy, now: DateTime<Utc>) -> Vec<Decision> {
    if policy.is_empty() {
        return group
            .iter()
            .map(|s| Decision {
                snapshot: (*s).clone(),
                reasons: vec![KeepReason::EmptyPolicy],
            })
            .collect();
    }
    let mut rules: Vec<Rule> = [
        (policy.last, bucket_last as Bucker, KeepReason::Last),
        (policy.hourly, bucket_hour, KeepReason::Hourly),
        (policy.daily, bucket_day, KeepReason::Daily),
        (policy.weekly, bucket_week, KeepReason::Weekly),
        (policy.monthly, bucket_month, KeepReason::Monthly),
        (policy.yearly, bucket_year, KeepReason::Yearly),
    ]
    .into_iter()
    .filter_map(|(keep, bucker, reason)| {
        let left = match keep? {
            Keep::Count(0) => return None,
            Keep::Count(n) => Some(n),
            Keep::All => None,
        };
        Some(Rule {
            left,
            bucker,
            last: None,
            reason,
        })
    })
    .collect();
    let newest = group.iter().map(|s| s.time).filter(|t| *t < now).max();
    // Snapshots newer than this are kept by `within`; `None` keeps them all.
    let within = policy
        .within
        .filter(|w| !w.is_zero())
        .map(|w| (w, newest.and_then(|n| w.before(n))));

    let oldest = group.len().saturating_sub(1);
    group
        .iter()
        .enumerate()
        .map(|(nr, s)| {
            let mut reasons = Vec::new();
            if let Some((w, threshold)) = within {
                if threshold.is_none_or(|t| s.time > t) {
                    reasons.push(KeepReason::Within(w));
                }
            }
            for rule in &mut rules {
                if rule.left == Some(0) {
                    continue;
                }
                let val = (rule.bucker)(s.time, nr);
                if rule.last != Some(val) || nr == oldest {
                    rule.last = Some(val);
                    if let Some(left) = &mut rule.left {
                        *left -= 1;
                    }
                    reasons.push(rule.reason);
                }
            }
            Decision {
                snapshot: (*s).clone(),
                reasons,
            }
        })
        .collect()
}

/// What a prune did (or, in a dry run, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub plan: PrunePlan,
    /// The backups deleted (empty in a dry run).
    pub deleted: Vec<BackupId>,
}

impl Repository {
    /// Applies `policy` to every backup: plans, and unless `dry_run` deletes what the plan
    /// forgets (each manifest first, then its index). Chunks are freed by the next GC.
    /// On an immutable repository a deletion records the prune (`pruned/<id>`) and hides
    /// the backup; its versions are destroyed by a GC once their retention has passed.
    pub async fn prune(
        &self,
        policy: &KeepPolicy,
        now: DateTime<Utc>,
        dry_run: bool,
    ) -> Result<PruneReport> {
        self.prune_source(policy, None, now, dry_run).await
    }

    /// [`Repository::prune`] of the backups of one source identity only (`None`: every
    /// source, each on its own): the others are neither planned nor deleted.
    pub async fn prune_source(
        &self,
        policy: &KeepPolicy,
        source: Option<&str>,
        now: DateTime<Utc>,
        dry_run: bool,
    ) -> Result<PruneReport> {
        if policy.is_empty() {
            return Err(Error::invalid_input(
                "the retention policy keeps nothing explicitly (no keep rule is set): refusing to remove every backup",
            ));
        }
        let protected = self.protected_backups().await?;
        let mut refs = Vec::new();
        for id in self.list_snapshots().await? {
            let manifest = self.load_manifest(&id).await.map_err(|e| {
                Error::new(
                    e.kind(),
                    format!("prune stopped before removing anything: {}", e.message()),
                )
            })?;
            if source.is_none_or(|s| s == manifest.source) {
                let mut snapshot = SnapshotRef::from(&manifest);
                snapshot.protected = protected.contains(&id);
                refs.push(snapshot);
            }
        }
        let plan = plan(&refs, policy, now);
        let mut deleted = Vec::new();
        if !dry_run {
            for snapshot in plan.forgotten() {
                self.refuse_if_protected(&snapshot.id).await?;
                self.record_pruned(&snapshot.id).await?;
                self.delete_snapshot(&snapshot.id).await?;
                deleted.push(snapshot.id.clone());
            }
        }
        Ok(PruneReport { plan, deleted })
    }
}

#[cfg(test)]
mod tests;
