//! A second repository a Backup's snapshots are copied into after the backup (and its
//! prune), as Proxmox Backup Server's sync jobs and VolSync's replication keep a copy at
//! another site: the mover runs the job service's sync, which sends only the chunks the
//! secondary lacks, checks each one's digest on the way and writes a backup's index and
//! manifest last, so the secondary never shows a backup it cannot restore. A
//! BackupSchedule's `secondary` goes into every Backup it makes.
//!
//! The copies keep their snapshot ids: a Restore (or a claim populated from a backup)
//! names the secondary repository and the same id. A secondary the operator creates
//! (its BackupRepository says `initialize: true`) shares the primary's keys, so chunks are
//! copied as stored; its own encryption key, when it names one, is added as one more key.

use ferry_cron::WeeklyWindow;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::backup::Retention;
use super::backup_repository::{named_repository, BackupRepositorySpec};
use super::validate::{check_pvc_name, invalid, ValidationError};

/// Most bandwidth windows of a secondary.
pub const MAX_RATE_LIMIT_WINDOWS: usize = 16;

/// Where and what to copy after each backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Secondary {
    /// A BackupRepository of this namespace other than the primary (another site, bucket
    /// or region; not kept in the primary's or the backed-up claim).
    #[schemars(length(min = 1, max = 253))]
    pub repository: String,
    /// Which of the source's snapshots to copy (the prune rules, applied to the
    /// primary's snapshots), and, after the copy, a prune of the secondary by the same
    /// rules, so the secondary may keep more (or fewer) than the primary. Left out: every
    /// snapshot is copied and none pruned there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain: Option<Retention>,
    /// Remove the secondary's snapshots of this source that the primary no longer has
    /// (pruned there): a mirror. Protected snapshots stay. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remove_vanished: Option<bool>,
    /// Bytes per second the copy sends at most (default: unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub rate_limit: Option<u64>,
    /// When set, `rateLimit` applies only inside these windows (at most 16), unlimited
    /// outside them; checked as the copy goes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub rate_limit_windows: Vec<RateLimitWindow>,
}

/// Some days of the week, from a time of day to another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitWindow {
    /// `mon` to `sun` (left out: every day).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    pub days: Vec<String>,
    /// `HH:MM` (24-hour clock), inclusive.
    #[schemars(length(min = 4, max = 5))]
    pub start: String,
    /// `HH:MM`, exclusive; at or before the start it runs past midnight (22:00 to 06:00
    /// is the night); `24:00` is the end of the day.
    #[schemars(length(min = 4, max = 5))]
    pub end: String,
    /// The IANA time zone of the times (default UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: Option<String>,
}

/// What the copy into the secondary did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecondaryStatus {
    /// The secondary BackupRepository.
    pub repository: String,
    /// Snapshots copied (this backup's and any earlier one the secondary lacked).
    #[serde(default)]
    pub snapshots_copied: u64,
    /// Selected snapshots the secondary had already.
    #[serde(default)]
    pub snapshots_present: u64,
    /// Chunks sent (the secondary lacked them).
    #[serde(default)]
    pub chunks_copied: u64,
    /// Bytes sent, as the secondary stores them.
    #[serde(default)]
    pub bytes_copied: u64,
    /// Snapshots removed from the secondary (`removeVanished`).
    #[serde(default)]
    pub snapshots_removed: u64,
    /// Snapshots the prune of the secondary removed (`retain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pruned: Option<u64>,
    /// Why the copy failed (the backup in the primary is written and restorable all the
    /// same; the next backup's copy sends what this one did not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why the prune of the secondary failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prune_error: Option<String>,
}

impl SecondaryStatus {
    /// Whether the copy or the prune after it failed.
    pub fn failure(&self) -> Option<&str> {
        self.error.as_deref().or(self.prune_error.as_deref())
    }
}

impl Secondary {
    /// Checks the rules and windows, and, given what the operator looked up, that the
    /// repository exists, is valid and is neither the primary nor kept in the primary's
    /// or the backed-up claim (`field` is this secondary's path).
    pub fn validate(
        &self,
        field: &str,
        primary: &str,
        source_pvc: &str,
        looked_up: Option<(Option<&BackupRepositorySpec>, Option<&BackupRepositorySpec>)>,
    ) -> Result<(), ValidationError> {
        let repo_field = format!("{field}.repository");
        check_pvc_name(&repo_field, &self.repository)?;
        if self.repository == primary {
            return Err(invalid(
                &repo_field,
                "the secondary is the primary repository: name another BackupRepository",
            ));
        }
        if let Some(retain) = &self.retain {
            retain.validate(&format!("{field}.retain"))?;
        }
        self.validate_rate(field)?;
        let Some((secondary, primary_spec)) = looked_up else {
            return Ok(());
        };
        let secondary = named_repository(&repo_field, &self.repository, secondary)?;
        let Some(claim) = &secondary.pvc else {
            let place = |url: Option<&String>| url.map(|u| u.trim_end_matches('/').to_string());
            if secondary.url.is_some()
                && place(secondary.url.as_ref()) == place(primary_spec.and_then(|p| p.url.as_ref()))
            {
                return Err(invalid(
                    &repo_field,
                    &format!(
                        "BackupRepository '{}' has the primary's URL: a copy needs another place",
                        self.repository
                    ),
                ));
            }
            return Ok(());
        };
        let primary_claim = primary_spec.and_then(|p| p.pvc.as_ref()).map(|p| &p.name);
        if claim.name == source_pvc || Some(&claim.name) == primary_claim {
            return Err(invalid(
                &repo_field,
                &format!(
                    "BackupRepository '{}' is kept in claim '{}', which the backup reads or the primary is kept in: a copy there survives nothing the primary does not; keep it in another claim or in S3",
                    self.repository, claim.name
                ),
            ));
        }
        Ok(())
    }

    fn validate_rate(&self, field: &str) -> Result<(), ValidationError> {
        if self.rate_limit == Some(0) {
            return Err(invalid(
                &format!("{field}.rateLimit"),
                "0 bytes per second copies nothing: leave rateLimit out for no limit",
            ));
        }
        if self.rate_limit_windows.len() > MAX_RATE_LIMIT_WINDOWS {
            return Err(invalid(
                &format!("{field}.rateLimitWindows"),
                &format!("at most {MAX_RATE_LIMIT_WINDOWS} windows"),
            ));
        }
        if !self.rate_limit_windows.is_empty() && self.rate_limit.is_none() {
            return Err(invalid(
                &format!("{field}.rateLimitWindows"),
                "windows need a rateLimit: the limit that applies inside them",
            ));
        }
        for (i, w) in self.rate_limit_windows.iter().enumerate() {
            let at = format!("{field}.rateLimitWindows[{i}]");
            WeeklyWindow::parse(
                &at,
                &w.days,
                &w.start,
                &w.end,
                w.time_zone.as_deref().unwrap_or(""),
            )
            .map_err(|e| invalid(&at, e.message()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::PvcRef;

    fn secondary() -> Secondary {
        Secondary {
            repository: "site-b".into(),
            retain: Some(Retention {
                monthly: Some(12),
                ..Retention::default()
            }),
            remove_vanished: None,
            rate_limit: Some(10 << 20),
            rate_limit_windows: vec![RateLimitWindow {
                days: vec!["mon".into(), "fri".into()],
                start: "08:00".into(),
                end: "18:00".into(),
                time_zone: Some("Europe/Oslo".into()),
            }],
        }
    }

    fn s3_repo(url: &str) -> BackupRepositorySpec {
        BackupRepositorySpec {
            url: Some(url.into()),
            s3: None,
            pvc: None,
            encryption: None,
            initialize: None,
        }
    }

    fn claim_repo(name: &str) -> BackupRepositorySpec {
        BackupRepositorySpec {
            url: None,
            s3: None,
            pvc: Some(PvcRef {
                name: name.into(),
                path: None,
                namespace: None,
            }),
            encryption: None,
            initialize: None,
        }
    }

    fn check(
        s: &Secondary,
        found: Option<(Option<&BackupRepositorySpec>, Option<&BackupRepositorySpec>)>,
    ) -> Result<(), ValidationError> {
        s.validate("spec.secondary", "site-a", "web1", found)
    }

    #[test]
    fn a_secondary_is_another_place_with_valid_rules_and_windows() {
        let a = s3_repo("s3://backups/site-a");
        let b = s3_repo("s3://far-away/site-b");
        check(&secondary(), None).unwrap();
        check(&secondary(), Some((Some(&b), Some(&a)))).unwrap();
        check(&secondary(), Some((Some(&claim_repo("offsite")), Some(&a)))).unwrap();

        let e = check(&secondary(), Some((None, Some(&a)))).unwrap_err();
        assert_eq!(e.field, "spec.secondary.repository");
        assert!(e.message.contains("'site-b' does not exist"), "{e}");
        let e = check(&secondary(), Some((Some(&a), Some(&a)))).unwrap_err();
        assert!(e.message.contains("primary's URL"), "{e}");
        let slash = s3_repo("s3://backups/site-a/");
        let e = check(&secondary(), Some((Some(&slash), Some(&a)))).unwrap_err();
        assert!(e.message.contains("primary's URL"), "{e}");
        for claim in ["web1", "repo-claim"] {
            let e = check(
                &secondary(),
                Some((Some(&claim_repo(claim)), Some(&claim_repo("repo-claim")))),
            )
            .unwrap_err();
            assert!(e.message.contains(&format!("claim '{claim}'")), "{e}");
        }
        let mut s = secondary();
        s.repository = "site-a".into();
        assert!(check(&s, None)
            .unwrap_err()
            .message
            .contains("is the primary"));
        let mut s = secondary();
        s.retain = Some(Retention::default());
        assert_eq!(check(&s, None).unwrap_err().field, "spec.secondary.retain");
        let mut s = secondary();
        s.rate_limit = Some(0);
        assert_eq!(
            check(&s, None).unwrap_err().field,
            "spec.secondary.rateLimit"
        );
        let mut s = secondary();
        s.rate_limit = None;
        assert!(check(&s, None)
            .unwrap_err()
            .message
            .contains("need a rateLimit"));
        for (day, start, zone, what) in [
            ("someday", "08:00", "UTC", "days"),
            ("mon", "8", "UTC", "start"),
            ("mon", "08:00", "Mars/Base", "time_zone"),
        ] {
            let mut s = secondary();
            s.rate_limit_windows[0] = RateLimitWindow {
                days: vec![day.into()],
                start: start.into(),
                end: "18:00".into(),
                time_zone: Some(zone.into()),
            };
            let e = check(&s, None).unwrap_err();
            assert_eq!(e.field, "spec.secondary.rateLimitWindows[0]");
            assert!(e.message.contains(what), "{what}: {e}");
        }
        let mut s = secondary();
        s.rate_limit_windows = vec![s.rate_limit_windows[0].clone(); 17];
        assert!(check(&s, None).unwrap_err().message.contains("at most 16"));
    }
}
