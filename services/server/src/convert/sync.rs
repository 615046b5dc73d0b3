//! Sync requests (StartSync): two repositories checked as a backup's is (a directory
//! confined to the allowed roots, secret references that resolve), the selection (source
//! identity, keep rules) and the bandwidth limit with its time windows, typed into the
//! [`SyncSpec`] the job runs with.
//!
//! The destination's key is a secret reference like the source's (a file under the
//! server's `--secrets-dir` or a variable); unset, the source's opens it (a destination
//! made with `ferry backup init DST --from SRC` shares the source's keys).

use std::sync::Arc;

use chrono::{DateTime, Datelike, Timelike, Utc};
use ferry_backup::{FixedRate, KeepPolicy, RatePolicy};
use ferry_core::{Error, Result};
use ferry_cron::Tz;
use prost::Message;

use super::backup::MAX_SOURCE_ID_BYTES;
use super::options::JobSpec;
use super::validation::{check_meta, invalid, Accepted, Meta, Validator};
use crate::backups::repository::{check_repository, RepoAccess};
use crate::model::job::{JobKind, JobPlan, ResolvedEndpoint};
use ferry_api::options::retention_from_proto;
use ferry_api::proto;

/// Most rate limit windows of one sync.
pub const MAX_WINDOWS: usize = 16;
const MINUTES_PER_DAY: u32 = 24 * 60;
const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// A sync's repositories and options.
#[derive(Debug, Clone)]
pub struct SyncSpec {
    pub source: RepoAccess,
    pub destination: RepoAccess,
    pub source_id: Option<String>,
    /// Empty: every backup.
    pub keep: KeepPolicy,
    pub remove_vanished: bool,
    /// The bandwidth limit (None: unlimited).
    pub rate: Option<Arc<dyn RatePolicy>>,
}

/// When a limit applies: on some days of the week, from a time of day to another, in a
/// time zone.
#[derive(Debug, Clone, PartialEq)]
pub struct RateWindow {
    /// Monday first.
    days: [bool; 7],
    /// Minutes after midnight; `end <= start` runs past midnight into the next day.
    start: u32,
    end: u32,
    zone: Tz,
}

impl RateWindow {
    fn from_proto(what: &str, w: &proto::RateLimitWindow) -> Result<Self> {
        let mut days = [w.days.is_empty(); 7];
        for d in &w.days {
            let at = DAYS
                .iter()
                .position(|n| n.eq_ignore_ascii_case(d.trim()))
                .ok_or_else(|| {
                    invalid(format!(
                        "{what}.days: '{d}' is not a day (mon, tue, wed, thu, fri, sat, sun)"
                    ))
                })?;
            days[at] = true;
        }
        let start = time_of_day(&format!("{what}.start"), &w.start, false)?;
        let end = time_of_day(&format!("{what}.end"), &w.end, true)?;
        let zone = ferry_cron::parse_zone(&w.time_zone)
            .map_err(|e| invalid(format!("{what}.{}", e.message())))?;
        Ok(Self {
            days,
            start,
            end,
            zone,
        })
    }

    /// Whether `now` is inside the window. A window past midnight belongs to the day it
    /// starts on.
    pub fn contains(&self, now: DateTime<Utc>) -> bool {
        let local = now.with_timezone(&self.zone);
        let day = local.weekday().num_days_from_monday() as usize;
        let minute = local.hour() * 60 + local.minute();
        if self.start < self.end {
            return self.days[day] && (self.start..self.end).contains(&minute);
        }
        let yesterday = (day + 6) % 7;
        (self.days[day] && minute >= self.start) || (self.days[yesterday] && minute < self.end)
    }
}

/// `HH:MM` as minutes after midnight; `24:00` only as an end.
fn time_of_day(what: &str, text: &str, end: bool) -> Result<u32> {
    let bad = || {
        invalid(format!(
            "{what} '{text}' is not a time of day: give HH:MM, like 08:00"
        ))
    };
    let (h, m) = text.trim().split_once(':').ok_or_else(bad)?;
    if h.is_empty() || h.len() > 2 || m.len() != 2 {
        return Err(bad());
    }
    let (h, m): (u32, u32) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    let minutes = h * 60 + m;
    if m >= 60 || minutes > MINUTES_PER_DAY || (minutes == MINUTES_PER_DAY && !end) {
        return Err(bad());
    }
    Ok(minutes)
}

/// A rate that applies inside its windows only (unlimited outside).
#[derive(Debug)]
pub struct WindowedRate {
    rate: u64,
    windows: Vec<RateWindow>,
}

impl RatePolicy for WindowedRate {
    fn rate_now(&self) -> Option<u64> {
        let now = Utc::now();
        self.windows
            .iter()
            .any(|w| w.contains(now))
            .then_some(self.rate)
    }
}

fn rate(req: &proto::StartSyncRequest) -> Result<Option<Arc<dyn RatePolicy>>> {
    if req.rate_limit_windows.len() > MAX_WINDOWS {
        return Err(invalid(format!(
            "{} rate_limit_windows: at most {MAX_WINDOWS}",
            req.rate_limit_windows.len()
        )));
    }
    let windows = req
        .rate_limit_windows
        .iter()
        .enumerate()
        .map(|(i, w)| RateWindow::from_proto(&format!("rate_limit_windows[{i}]"), w))
        .collect::<Result<Vec<_>>>()?;
    Ok(match (req.rate_limit, windows.is_empty()) {
        (0, true) => None,
        (0, false) => {
            return Err(invalid(
                "rate_limit_windows need a rate_limit: the limit that applies inside them",
            ))
        }
        (rate, true) => Some(Arc::new(FixedRate(rate))),
        (rate, false) => Some(Arc::new(WindowedRate { rate, windows })),
    })
}

impl SyncSpec {
    pub fn new(req: &proto::StartSyncRequest, plan: &JobPlan) -> Result<Self> {
        if req.source_id.len() > MAX_SOURCE_ID_BYTES || req.source_id.chars().any(char::is_control)
        {
            return Err(invalid(format!(
                "source_id must be at most {MAX_SOURCE_ID_BYTES} bytes without control characters"
            )));
        }
        let source = plan
            .repository
            .as_ref()
            .ok_or_else(|| Error::internal("sync job without a source repository"))?;
        let destination = plan
            .target
            .as_ref()
            .ok_or_else(|| Error::internal("sync job without a destination repository"))?;
        let source = RepoAccess::field(source, req.source.as_ref(), "source");
        let destination = RepoAccess::field(destination, req.destination.as_ref(), "destination")
            .with_key_of(&source);
        let keep = match &req.retention {
            None => KeepPolicy::new(),
            Some(r) => retention_from_proto("retention", Some(r))?,
        };
        Ok(Self {
            source,
            destination,
            source_id: (!req.source_id.is_empty()).then(|| req.source_id.clone()),
            keep,
            remove_vanished: req.remove_vanished,
            rate: rate(req)?,
        })
    }
}

/// The one-writer identity of a repository a sync writes.
fn target_key(r: &ResolvedEndpoint) -> String {
    match r {
        ResolvedEndpoint::File(p) => format!("repository:{}", p.display()),
        ResolvedEndpoint::Url(u) => format!("repository:{u}"),
    }
}

impl Validator {
    /// Validates a StartSync request.
    pub fn sync(&self, req: &proto::StartSyncRequest) -> Result<Accepted> {
        check_meta(&req.idempotency_key, &req.labels)?;
        let source = check_repository(&self.roots, &self.secrets, "source", req.source.as_ref())?;
        let destination = check_repository(
            &self.roots,
            &self.secrets,
            "destination",
            req.destination.as_ref(),
        )?;
        if source == destination {
            return Err(invalid(
                "source and destination are the same repository: a sync copies into another one",
            ));
        }
        let plan = JobPlan {
            source: source.clone(),
            target_key: Some(target_key(&destination)),
            target: Some(destination),
            hosts: Vec::new(),
            source_kind: "repository".into(),
            target_kind: Some("repository".into()),
            more_targets: Vec::new(),
            repository: Some(source),
        };
        let spec = JobSpec::Sync(Box::new(SyncSpec::new(req, &plan)?));
        let meta = Meta {
            key: &req.idempotency_key,
            labels: &req.labels,
            priority: req.priority,
            refuse_if_target_busy: false,
        };
        Ok(Accepted::new(
            JobKind::Sync,
            req.encode_to_vec(),
            spec,
            plan,
            meta,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::SecretResolver;
    use crate::security::AllowRoots;
    use chrono::TimeZone;
    use ferry_core::ErrorKind;

    fn window(days: &[&str], start: &str, end: &str, zone: &str) -> Result<RateWindow> {
        RateWindow::from_proto(
            "w",
            &proto::RateLimitWindow {
                days: days.iter().map(|d| d.to_string()).collect(),
                start: start.into(),
                end: end.into(),
                time_zone: zone.into(),
            },
        )
    }

    fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
    }

    #[test]
    fn windows_hold_their_days_and_hours_in_their_time_zone() {
        // 2026-12-07 is a Monday.
        let office = window(&["mon", "tue", "wed", "thu", "fri"], "08:00", "18:00", "").unwrap();
        assert!(office.contains(at(2026, 12, 7, 8, 0)));
        assert!(office.contains(at(2026, 12, 7, 17, 59)));
        assert!(!office.contains(at(2026, 12, 7, 18, 0)));
        assert!(!office.contains(at(2026, 12, 7, 7, 59)));
        assert!(!office.contains(at(2026, 12, 6, 12, 0)), "a Sunday");
        // The night from Friday: Friday 22:00 to Saturday 06:00, not Sunday night.
        let night = window(&["fri"], "22:00", "06:00", "").unwrap();
        assert!(night.contains(at(2026, 12, 11, 23, 0)));
        assert!(night.contains(at(2026, 12, 12, 5, 59)));
        assert!(!night.contains(at(2026, 12, 12, 6, 0)));
        assert!(!night.contains(at(2026, 12, 13, 23, 0)));
        // In Oslo (UTC+1 in December) 08:00 is 07:00 UTC.
        let oslo = window(&[], "08:00", "24:00", "Europe/Oslo").unwrap();
        assert!(oslo.contains(at(2026, 12, 6, 7, 0)));
        assert!(!oslo.contains(at(2026, 12, 6, 6, 59)));
        assert!(oslo.contains(at(2026, 12, 6, 22, 59)));
        assert!(!oslo.contains(at(2026, 12, 6, 23, 0)));
        // Every day, the whole day.
        assert!(window(&[], "00:00", "24:00", "")
            .unwrap()
            .contains(Utc::now()));
    }

    #[test]
    fn bad_windows_are_refused_naming_the_field() {
        for (days, start, end, zone, what) in [
            (&["someday"][..], "08:00", "18:00", "", "w.days"),
            (&[][..], "8", "18:00", "", "w.start"),
            (&[][..], "24:00", "18:00", "", "w.start"),
            (&[][..], "08:00", "18:60", "", "w.end"),
            (&[][..], "08:00", "25:00", "", "w.end"),
            (&[][..], "08:00", "18:00", "Mars/Olympus", "w.time_zone"),
        ] {
            let e = window(days, start, end, zone).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput);
            assert!(e.to_string().contains(what), "{what}: {e}");
        }
    }

    fn validator(root: &std::path::Path) -> Validator {
        Validator {
            roots: AllowRoots::new(&[root.to_path_buf()]).unwrap(),
            secrets: SecretResolver::new(None),
        }
    }

    fn repo(path: &std::path::Path) -> Option<proto::Repository> {
        Some(proto::Repository {
            url: path.display().to_string(),
            ..Default::default()
        })
    }

    #[test]
    fn a_sync_is_accepted_and_bad_ones_name_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let v = validator(&root);
        let req = proto::StartSyncRequest {
            source: repo(&root.join("a")),
            destination: repo(&root.join("b")),
            rate_limit: 1000,
            ..Default::default()
        };
        let acc = v.sync(&req).unwrap();
        assert_eq!(acc.kind, JobKind::Sync);
        assert_eq!(
            acc.plan.target_key.as_deref(),
            Some(format!("repository:{}", root.join("b").display()).as_str())
        );
        let JobSpec::Sync(spec) = acc.spec.as_ref() else {
            panic!("not a sync spec")
        };
        assert!(spec.keep.is_empty() && spec.source_id.is_none());
        assert_eq!(spec.rate.as_ref().unwrap().rate_now(), Some(1000));

        let check = |f: &dyn Fn(&mut proto::StartSyncRequest), kind: ErrorKind, what: &str| {
            let mut r = req.clone();
            f(&mut r);
            let e = v.sync(&r).unwrap_err();
            assert_eq!(e.kind(), kind, "{e}");
            assert!(e.to_string().contains(what), "{what}: {e}");
        };
        check(
            &|r| r.destination = repo(std::path::Path::new("/etc/ferry-repo")),
            ErrorKind::PermissionDenied,
            "destination",
        );
        check(
            &|r| r.source = None,
            ErrorKind::InvalidInput,
            "source is missing",
        );
        check(
            &|r| r.destination = r.source.clone(),
            ErrorKind::InvalidInput,
            "same repository",
        );
        check(
            &|r| {
                r.destination.as_mut().unwrap().key = Some(proto::SecretRef {
                    source: Some(proto::secret_ref::Source::Env(
                        "FERRY_TEST_UNSET_KEY_VARIABLE".into(),
                    )),
                })
            },
            ErrorKind::InvalidInput,
            "destination.key",
        );
        check(
            &|r| r.retention = Some(proto::Retention::default()),
            ErrorKind::InvalidInput,
            "retention",
        );
        check(
            &|r| {
                r.rate_limit = 0;
                r.rate_limit_windows = vec![proto::RateLimitWindow {
                    start: "08:00".into(),
                    end: "18:00".into(),
                    ..Default::default()
                }]
            },
            ErrorKind::InvalidInput,
            "need a rate_limit",
        );
        check(
            &|r| {
                r.rate_limit_windows = vec![
                    proto::RateLimitWindow {
                        start: "08:00".into(),
                        end: "18:00".into(),
                        ..Default::default()
                    };
                    MAX_WINDOWS + 1
                ]
            },
            ErrorKind::InvalidInput,
            "at most 16",
        );
    }
}
