//! Sync requests (StartSync): two repositories checked as a backup's is (a directory
//! confined to the allowed roots, secret references that resolve), the selection (source
//! identity, keep rules) and the bandwidth limit with its time windows, typed into the
//! [`SyncSpec`] the job runs with.
//!
//! The destination's key is a secret reference like the source's (a file under the
//! server's `--secrets-dir` or a variable); unset, the source's opens it (a destination
//! made with `ferry backup init DST --from SRC` shares the source's keys).

use std::sync::Arc;

use chrono::Utc;
use ferry_backup::{FixedRate, KeepPolicy, RatePolicy};
use ferry_core::{Error, Result};
use ferry_cron::WeeklyWindow;
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

/// A sync's repositories and options.
#[derive(Debug, Clone)]
pub struct SyncSpec {
    pub source: RepoAccess,
    pub destination: RepoAccess,
    pub source_id: Option<String>,
    /// Empty: every backup.
    pub keep: KeepPolicy,
    pub remove_vanished: bool,
    /// Create the destination from the source when it holds no repository.
    pub init_destination: bool,
    /// The bandwidth limit (None: unlimited).
    pub rate: Option<Arc<dyn RatePolicy>>,
}

/// A window of a request: its days, times and zone, as ferry-cron parses them.
fn window(what: &str, w: &proto::RateLimitWindow) -> Result<WeeklyWindow> {
    WeeklyWindow::parse(what, &w.days, &w.start, &w.end, &w.time_zone)
}

/// A rate that applies inside its windows only (unlimited outside).
#[derive(Debug)]
pub struct WindowedRate {
    rate: u64,
    windows: Vec<WeeklyWindow>,
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
        .map(|(i, w)| window(&format!("rate_limit_windows[{i}]"), w))
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
            init_destination: req.init_destination_if_missing,
            rate: rate(req)?,
        })
    }
}

/// Whether two repositories are one place (`s3://b/p` and `s3://b/p/` are).
fn same_location(a: &ResolvedEndpoint, b: &ResolvedEndpoint) -> bool {
    match (a, b) {
        (ResolvedEndpoint::Url(a), ResolvedEndpoint::Url(b)) => {
            a.trim_end_matches('/') == b.trim_end_matches('/')
        }
        _ => a == b,
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
        if same_location(&source, &destination) {
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
    use ferry_core::ErrorKind;

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
        let s3 = |url: &str| {
            Some(proto::Repository {
                url: url.into(),
                ..Default::default()
            })
        };
        let mut r = req.clone();
        r.source = s3("s3://bucket/site-a");
        r.destination = s3("s3://bucket/site-a/");
        assert!(
            v.sync(&r)
                .unwrap_err()
                .to_string()
                .contains("same repository"),
            "a trailing slash is the same place"
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
