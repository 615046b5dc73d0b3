//! Between the wire and the domain: validates requests into what a job needs (checked
//! endpoints, confined paths, bounded options), turns job records into `ferry.v1.Job`, and
//! turns request options into engine and endpoint options.

use std::collections::BTreeMap;

use ferry_core::{EndpointSpec, Error, ErrorKind, Result};
use ferry_endpoints::s3::S3Options;
use ferry_endpoints::{CacheMode, Preallocation, SourceOptions, TargetOptions};
use ferry_engine::{ChecksumOptions, CommitOrder, CopyOptions, HashAlgorithm};
use prost::Message;
use sha2::{Digest as _, Sha256};

use super::jobs::model::{
    DigestRecord, JobKind, JobPlan, JobRecord, JobState, ResolvedEndpoint, ResultRecord,
};
use super::proto;
use super::secrets::SecretResolver;
use super::security::AllowRoots;

/// Bounds on what one request may ask for.
pub const MAX_KEY_BYTES: usize = 256;
pub const MAX_LABELS: usize = 64;
pub const MAX_LABEL_KEY_BYTES: usize = 63;
pub const MAX_LABEL_VALUE_BYTES: usize = 256;
pub const MAX_URL_BYTES: usize = 4096;
pub const MAX_WORKERS: u32 = 256;
pub const MAX_REQUEST_SIZE: u64 = 64 * 1024 * 1024;
pub const DEFAULT_GROW_STEP: u64 = 64 * 1024 * 1024;

/// What validation needs from the server.
#[derive(Debug, Clone)]
pub struct Validator {
    pub roots: AllowRoots,
    pub secrets: SecretResolver,
}

/// A request that passed validation.
#[derive(Debug, Clone)]
pub struct Accepted {
    pub kind: JobKind,
    pub request: Vec<u8>,
    pub fingerprint: String,
    pub plan: JobPlan,
    pub idempotency_key: String,
    pub labels: BTreeMap<String, String>,
    pub priority: i32,
    pub refuse_if_target_busy: bool,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::invalid_input(msg)
}

fn fingerprint(bytes: &[u8]) -> String {
    super::jobs::model::hex_bytes::encode(&Sha256::digest(bytes))
}

fn check_meta(key: &str, labels: &BTreeMap<String, String>) -> Result<()> {
    if key.len() > MAX_KEY_BYTES {
        return Err(invalid(format!(
            "idempotency_key is {} bytes: at most {MAX_KEY_BYTES}",
            key.len()
        )));
    }
    if labels.len() > MAX_LABELS {
        return Err(invalid(format!(
            "{} labels: at most {MAX_LABELS}",
            labels.len()
        )));
    }
    for (k, v) in labels {
        if k.is_empty() || k.len() > MAX_LABEL_KEY_BYTES {
            return Err(invalid(format!(
                "label key '{k}' must have 1 to {MAX_LABEL_KEY_BYTES} bytes"
            )));
        }
        if v.len() > MAX_LABEL_VALUE_BYTES {
            return Err(invalid(format!(
                "label '{k}' value has {} bytes: at most {MAX_LABEL_VALUE_BYTES}",
                v.len()
            )));
        }
    }
    Ok(())
}

/// Whether the URL carries a password in its authority (`user:pw@`, libiscsi's `user%pw@`).
fn has_inline_password(url: &str) -> bool {
    let Some((_, rest)) = url.split_once("://") else {
        return false;
    };
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    authority
        .rsplit_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':') || userinfo.contains('%'))
}

/// A validated endpoint: what to open and how to label it.
struct Checked {
    resolved: ResolvedEndpoint,
    key: String,
    host: Option<String>,
    kind: &'static str,
}

impl Validator {
    fn endpoint(&self, what: &str, ep: Option<&proto::Endpoint>) -> Result<Checked> {
        let ep = ep.ok_or_else(|| invalid(format!("{what} is missing")))?;
        if ep.url.is_empty() {
            return Err(invalid(format!(
                "{what}.url is empty: give a path or a URL"
            )));
        }
        if ep.url.len() > MAX_URL_BYTES {
            return Err(invalid(format!(
                "{what}.url is longer than {MAX_URL_BYTES} bytes"
            )));
        }
        if has_inline_password(&ep.url) {
            return Err(invalid(format!(
                "{what}.url carries a password: give credentials by reference in the \
                 endpoint options (an environment variable or a file under --secrets-dir)"
            )));
        }
        let spec = EndpointSpec::parse(&ep.url)
            .map_err(|e| Error::new(e.kind(), format!("{what}.url: {}", e.message())))?;
        use proto::endpoint::Options;
        match (&spec, &ep.options) {
            (_, None) => {}
            (EndpointSpec::Iscsi(_), Some(Options::Iscsi(o))) => {
                if let Some(p) = &o.password {
                    self.secrets.check(&format!("{what}.iscsi.password"), p)?;
                }
            }
            (EndpointSpec::S3(_), Some(Options::S3(o))) => {
                // Checks the settings and resolves the references, so that a bad one
                // fails the request; the values are dropped here and read again when
                // the job opens the endpoint.
                s3_options(what, o, &self.secrets)?;
            }
            (EndpointSpec::Nbd(_), Some(Options::Nbd(o))) => {
                if !o.tls_certificates_dir.is_empty() {
                    self.roots
                        .confine(std::path::Path::new(&o.tls_certificates_dir))?;
                }
            }
            (spec, Some(_)) => {
                return Err(invalid(format!(
                    "{what}: the options given do not belong to {}:// endpoints",
                    spec.kind()
                )))
            }
        }
        if let EndpointSpec::Nbd(n) = &spec {
            if let Some(dir) = &n.tls_certificates {
                self.roots.confine(dir)?;
            }
        }
        let kind = spec.kind();
        let mut host = spec.host();
        // The same bucket and key on another store is another image (a copy between two
        // stores is allowed) and another host for the per-host limit.
        let store = match &ep.options {
            Some(Options::S3(o)) if !o.endpoint_url.is_empty() => Some(&o.endpoint_url),
            _ => None,
        };
        if let (Some(store), Some(h)) = (store, &mut host) {
            *h = format!("{h}@{store}");
        }
        Ok(match spec {
            EndpointSpec::File(path) => {
                let canonical = self
                    .roots
                    .confine(&path)
                    .map_err(|e| Error::new(e.kind(), format!("{what}: {}", e.message())))?;
                Checked {
                    key: canonical.display().to_string(),
                    resolved: ResolvedEndpoint::File(canonical),
                    host,
                    kind,
                }
            }
            other => Checked {
                key: match store {
                    Some(store) => format!("{other} at {store}"),
                    None => other.to_string(),
                },
                resolved: ResolvedEndpoint::Url(ep.url.clone()),
                host,
                kind,
            },
        })
    }

    /// Validates a StartTransfer request.
    pub fn transfer(&self, req: &proto::StartTransferRequest) -> Result<Accepted> {
        check_meta(&req.idempotency_key, &req.labels)?;
        let source = self.endpoint("source", req.source.as_ref())?;
        let target = self.endpoint("target", req.target.as_ref())?;
        if source.key == target.key {
            return Err(invalid(format!(
                "source and target are the same image ({}): choose another target",
                source.key
            )));
        }
        let options = req.options.unwrap_or_default();
        copy_options(&options)?;
        cache_mode(options.cache)?;
        preallocation(&options)?;
        if options.verify {
            hash_algorithm(options.verify_algorithm)?;
        }
        let request = req.encode_to_vec();
        let hosts = [source.host, target.host.clone()]
            .into_iter()
            .flatten()
            .collect();
        Ok(Accepted {
            kind: JobKind::Transfer,
            fingerprint: fingerprint(&request),
            request,
            plan: JobPlan {
                source: source.resolved,
                target: Some(target.resolved),
                target_key: Some(target.key),
                hosts,
                source_kind: source.kind.to_string(),
                target_kind: Some(target.kind.to_string()),
            },
            idempotency_key: req.idempotency_key.clone(),
            labels: req.labels.clone(),
            priority: req.priority,
            refuse_if_target_busy: req.refuse_if_target_busy,
        })
    }

    /// Validates a StartChecksum request.
    pub fn checksum(&self, req: &proto::StartChecksumRequest) -> Result<Accepted> {
        check_meta(&req.idempotency_key, &req.labels)?;
        let source = self.endpoint("source", req.source.as_ref())?;
        checksum_options(&req.options.unwrap_or_default())?;
        let request = req.encode_to_vec();
        Ok(Accepted {
            kind: JobKind::Checksum,
            fingerprint: fingerprint(&request),
            request,
            plan: JobPlan {
                source: source.resolved,
                target: None,
                target_key: None,
                hosts: source.host.into_iter().collect(),
                source_kind: source.kind.to_string(),
                target_kind: None,
            },
            idempotency_key: req.idempotency_key.clone(),
            labels: req.labels.clone(),
            priority: req.priority,
            refuse_if_target_busy: false,
        })
    }
}

fn cache_mode(v: i32) -> Result<CacheMode> {
    match proto::CacheMode::try_from(v) {
        Ok(proto::CacheMode::PageCache) => Ok(CacheMode::PageCache),
        Ok(proto::CacheMode::None) => Ok(CacheMode::Direct),
        Err(_) => Err(invalid(format!("cache mode {v} is not a CacheMode"))),
    }
}

/// The digest algorithm of a request.
pub fn hash_algorithm(v: i32) -> Result<HashAlgorithm> {
    match proto::HashAlgorithm::try_from(v) {
        Ok(proto::HashAlgorithm::Blkhash) => Ok(HashAlgorithm::Blkhash),
        Ok(proto::HashAlgorithm::Sha256) => Ok(HashAlgorithm::Sha256),
        Err(_) => Err(invalid(format!("algorithm {v} is not a HashAlgorithm"))),
    }
}

fn proto_algorithm(name: &str) -> i32 {
    match name {
        "sha256" => proto::HashAlgorithm::Sha256 as i32,
        _ => proto::HashAlgorithm::Blkhash as i32,
    }
}

/// Engine copy options for a request (the checkpoint interval and resume are the
/// runner's to set).
pub fn copy_options(o: &proto::TransferOptions) -> Result<CopyOptions> {
    let mut c = CopyOptions::default();
    if o.workers > MAX_WORKERS {
        return Err(invalid(format!(
            "workers {}: at most {MAX_WORKERS}",
            o.workers
        )));
    }
    if o.workers > 0 {
        c.workers = o.workers as usize;
    }
    if o.request_size > MAX_REQUEST_SIZE {
        return Err(invalid(format!(
            "request_size {}: at most {MAX_REQUEST_SIZE}",
            o.request_size
        )));
    }
    if o.request_size > 0 {
        c.request_size = Some(o.request_size as usize);
    }
    c.order = match proto::CommitOrder::try_from(o.order) {
        Ok(proto::CommitOrder::Auto) => CommitOrder::Auto,
        Ok(proto::CommitOrder::InOrder) => CommitOrder::InOrder,
        Ok(proto::CommitOrder::OutOfOrder) => CommitOrder::OutOfOrder,
        Err(_) => return Err(invalid(format!("order {} is not a CommitOrder", o.order))),
    };
    if let Some(s) = o.sparse_size {
        if s > MAX_REQUEST_SIZE {
            return Err(invalid(format!(
                "sparse_size {s}: at most {MAX_REQUEST_SIZE}"
            )));
        }
        c.sparse_size = s as usize;
    }
    c.target_is_zero = o.target_is_zero;
    c.rate_limit = (o.rate_limit > 0).then_some(o.rate_limit);
    Ok(c)
}

/// Endpoint options for reading an endpoint: the request's cache mode and the endpoint's
/// S3 settings from [`open_spec`] (a parameter, so no caller can open an S3 endpoint
/// without the job's own endpoint URL, region and credentials).
pub fn source_options(cache: i32, s3: S3Options) -> Result<SourceOptions> {
    let mut s = SourceOptions::default();
    s.cache = cache_mode(cache)?;
    s.s3 = s3;
    Ok(s)
}

/// Endpoint options of a transfer's target, with the target's S3 settings from
/// [`open_spec`] (see [`source_options`]).
pub fn target_options(o: &proto::TransferOptions, s3: S3Options) -> Result<TargetOptions> {
    let mut t = TargetOptions::default();
    t.cache = cache_mode(o.cache)?;
    t.preallocation = preallocation(o)?;
    t.s3 = s3;
    Ok(t)
}

/// The request's target preallocation.
fn preallocation(o: &proto::TransferOptions) -> Result<Preallocation> {
    Ok(match proto::Preallocation::try_from(o.preallocation) {
        Ok(proto::Preallocation::Off) => Preallocation::Off,
        Ok(proto::Preallocation::Falloc) => Preallocation::Falloc,
        Ok(proto::Preallocation::Full) => Preallocation::Full,
        Ok(proto::Preallocation::Grow) => Preallocation::Grow {
            step: if o.preallocation_step == 0 {
                DEFAULT_GROW_STEP
            } else {
                o.preallocation_step
            },
        },
        Err(_) => {
            return Err(invalid(format!(
                "preallocation {} is not a Preallocation",
                o.preallocation
            )))
        }
    })
}

/// Engine checksum options for a request.
pub fn checksum_options(o: &proto::ChecksumOptions) -> Result<ChecksumOptions> {
    let mut c = ChecksumOptions {
        algorithm: hash_algorithm(o.algorithm)?,
        ..ChecksumOptions::default()
    };
    if o.workers > MAX_WORKERS || o.threads > MAX_WORKERS {
        return Err(invalid(format!(
            "workers and threads: at most {MAX_WORKERS}"
        )));
    }
    if o.workers > 0 {
        c.workers = o.workers as usize;
    }
    if o.threads > 0 {
        c.threads = o.threads as usize;
    }
    if o.request_size > MAX_REQUEST_SIZE {
        return Err(invalid(format!(
            "request_size {}: at most {MAX_REQUEST_SIZE}",
            o.request_size
        )));
    }
    if o.request_size > 0 {
        c.request_size = o.request_size as usize;
    }
    cache_mode(o.cache)?;
    Ok(c)
}

/// What a job opens for one endpoint: the confined path or the URL with credentials
/// resolved from their references just now, and the endpoint's per-job S3 settings (the
/// SDK's standard chain alone when the request has none). Called at every start of a job,
/// including its resumption after a restart, because secrets are never stored.
pub fn open_spec(
    resolved: &ResolvedEndpoint,
    endpoint: Option<&proto::Endpoint>,
    secrets: &SecretResolver,
    what: &str,
) -> Result<(EndpointSpec, S3Options)> {
    let mut spec = match resolved {
        ResolvedEndpoint::File(p) => EndpointSpec::File(p.clone()),
        ResolvedEndpoint::Url(u) => EndpointSpec::parse(u)?,
    };
    let mut s3 = S3Options::new();
    use proto::endpoint::Options;
    match (&mut spec, endpoint.and_then(|e| e.options.as_ref())) {
        (EndpointSpec::Iscsi(s), Some(Options::Iscsi(o))) => {
            if !o.user.is_empty() {
                s.user = Some(o.user.clone());
            }
            if let Some(p) = &o.password {
                s.password = Some(secrets.resolve(&format!("{what}.iscsi.password"), p)?);
            }
        }
        (EndpointSpec::Nbd(s), Some(Options::Nbd(o))) if !o.tls_certificates_dir.is_empty() => {
            s.tls_certificates = Some(o.tls_certificates_dir.clone().into());
        }
        (EndpointSpec::S3(_), Some(Options::S3(o))) => s3 = s3_options(what, o, secrets)?,
        _ => {}
    }
    Ok((spec, s3))
}

/// Longest region name accepted (AWS's are about 15 bytes; other stores pick their own).
const MAX_REGION_BYTES: usize = 64;

/// The form of a request's S3 settings, before any secret is read.
fn check_s3_settings(what: &str, o: &proto::S3Options) -> Result<()> {
    let url = &o.endpoint_url;
    if !url.is_empty() {
        if url.len() > MAX_URL_BYTES {
            return Err(invalid(format!(
                "{what}.s3.endpoint_url is longer than {MAX_URL_BYTES} bytes"
            )));
        }
        if has_inline_password(url) {
            return Err(invalid(format!(
                "{what}.s3.endpoint_url carries a password: give credentials by reference \
                 in access_key_id and secret_access_key"
            )));
        }
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"));
        if rest
            .is_none_or(|r| r.is_empty() || r.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(invalid(format!(
                "{what}.s3.endpoint_url is not an http:// or https:// URL"
            )));
        }
    }
    let region = &o.region;
    if region.len() > MAX_REGION_BYTES
        || !region
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(invalid(format!(
            "{what}.s3.region must be at most {MAX_REGION_BYTES} letters, digits, '-', '_' or '.'"
        )));
    }
    if o.access_key_id.is_some() != o.secret_access_key.is_some() {
        return Err(invalid(format!(
            "{what}.s3: access_key_id and secret_access_key go together"
        )));
    }
    if o.session_token.is_some() && o.access_key_id.is_none() {
        return Err(invalid(format!(
            "{what}.s3: session_token needs access_key_id and secret_access_key"
        )));
    }
    Ok(())
}

/// A request's S3 settings as endpoint options, with the credentials read from their
/// references. Errors name the reference (`source.s3.secret_access_key`, the variable or
/// the file), never a value.
fn s3_options(what: &str, o: &proto::S3Options, secrets: &SecretResolver) -> Result<S3Options> {
    check_s3_settings(what, o)?;
    let mut s3 = S3Options::new();
    if !o.endpoint_url.is_empty() {
        s3 = s3.with_endpoint_url(o.endpoint_url.clone());
    }
    if !o.region.is_empty() {
        s3 = s3.with_region(o.region.clone());
    }
    // proto3 bool: false leaves addressing to the SDK (path style for IP endpoints).
    if o.force_path_style {
        s3 = s3.with_force_path_style(true);
    }
    let resolve = |name: &str, r: &Option<proto::SecretRef>| {
        r.as_ref()
            .map(|r| secrets.resolve(&format!("{what}.s3.{name}"), r))
            .transpose()
    };
    let key_id = resolve("access_key_id", &o.access_key_id)?;
    let secret_key = resolve("secret_access_key", &o.secret_access_key)?;
    let token = resolve("session_token", &o.session_token)?;
    if let (Some(key_id), Some(secret_key)) = (key_id, secret_key) {
        s3 = s3.with_credentials(key_id, secret_key, token);
    }
    Ok(s3)
}

fn timestamp(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

fn state(s: JobState) -> proto::JobState {
    match s {
        JobState::Queued => proto::JobState::Queued,
        JobState::Running => proto::JobState::Running,
        JobState::Succeeded => proto::JobState::Succeeded,
        JobState::Failed => proto::JobState::Failed,
        JobState::Cancelled => proto::JobState::Cancelled,
    }
}

/// The domain state of a wire state (None for UNSPECIFIED and unknown values).
pub fn state_from_proto(v: i32) -> Option<JobState> {
    match proto::JobState::try_from(v).ok()? {
        proto::JobState::Unspecified => None,
        proto::JobState::Queued => Some(JobState::Queued),
        proto::JobState::Running => Some(JobState::Running),
        proto::JobState::Succeeded => Some(JobState::Succeeded),
        proto::JobState::Failed => Some(JobState::Failed),
        proto::JobState::Cancelled => Some(JobState::Cancelled),
    }
}

fn digest(d: &DigestRecord) -> proto::Digest {
    proto::Digest {
        algorithm: proto_algorithm(&d.algorithm),
        hex: d.hex.clone(),
    }
}

fn throughput(size: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        size as f64 / seconds
    } else {
        0.0
    }
}

/// The wire form of a job.
pub fn job_to_proto(r: &JobRecord) -> proto::Job {
    let request = match r.kind {
        JobKind::Transfer => proto::StartTransferRequest::decode(r.request.as_slice())
            .ok()
            .map(proto::job::Request::Transfer),
        JobKind::Checksum => proto::StartChecksumRequest::decode(r.request.as_slice())
            .ok()
            .map(proto::job::Request::Checksum),
    };
    let result = r.result.as_ref().map(|res| match res {
        ResultRecord::Transfer {
            size,
            data_bytes,
            zero_bytes,
            seconds,
            source_digest,
            target_digest,
            resumed_bytes,
        } => proto::job::Result::TransferResult(proto::TransferResult {
            size: *size,
            data_bytes: *data_bytes,
            zero_bytes: *zero_bytes,
            seconds: *seconds,
            throughput_bytes_per_second: throughput(*size, *seconds),
            source_digest: source_digest.as_ref().map(digest),
            target_digest: target_digest.as_ref().map(digest),
            resumed_bytes: *resumed_bytes,
        }),
        ResultRecord::Checksum {
            digest: d,
            size,
            seconds,
        } => proto::job::Result::ChecksumResult(proto::ChecksumResult {
            digest: Some(digest(d)),
            size: *size,
            seconds: *seconds,
            throughput_bytes_per_second: throughput(*size, *seconds),
        }),
    });
    let p = &r.progress;
    proto::Job {
        id: r.id.clone(),
        kind: match r.kind {
            JobKind::Transfer => proto::JobKind::Transfer as i32,
            JobKind::Checksum => proto::JobKind::Checksum as i32,
        },
        state: state(r.state) as i32,
        idempotency_key: r.idempotency_key.clone(),
        labels: r.labels.clone(),
        priority: r.priority,
        create_time: Some(timestamp(r.created_ms)),
        start_time: r.started_ms.map(timestamp),
        end_time: r.ended_ms.map(timestamp),
        progress: Some(proto::Progress {
            total_bytes: p.total,
            done_bytes: p.done,
            data_bytes: p.data,
            zero_bytes: p.zero,
            resumed_bytes: p.resumed,
            committed_bytes: p.committed,
            bytes_per_second: p.bytes_per_second,
        }),
        attempt: r.attempt,
        request,
        result,
        error: r.error.as_ref().map(|e| proto::JobError {
            kind: e.kind.clone(),
            message: e.message.clone(),
        }),
        message: r.message.clone(),
    }
}

/// The kind of a wire JobKind filter (None: any).
pub fn kind_from_proto(v: i32) -> Result<Option<JobKind>> {
    match proto::JobKind::try_from(v) {
        Ok(proto::JobKind::Unspecified) => Ok(None),
        Ok(proto::JobKind::Transfer) => Ok(Some(JobKind::Transfer)),
        Ok(proto::JobKind::Checksum) => Ok(Some(JobKind::Checksum)),
        Err(_) => Err(Error::new(
            ErrorKind::InvalidInput,
            format!("kind {v} is not a JobKind"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validator(root: &std::path::Path) -> Validator {
        Validator {
            roots: AllowRoots::new(&[root.to_path_buf()]).unwrap(),
            secrets: SecretResolver::new(None),
        }
    }

    fn endpoint(url: &str) -> Option<proto::Endpoint> {
        Some(proto::Endpoint {
            url: url.into(),
            options: None,
        })
    }

    #[test]
    fn transfer_validation() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("a.img");
        std::fs::write(&src, b"x").unwrap();
        let v = validator(dir.path());
        let mut req = proto::StartTransferRequest {
            source: endpoint(src.to_str().unwrap()),
            target: endpoint(&format!("file://{}/b.img", dir.path().display())),
            ..Default::default()
        };
        req.labels.insert("team".into(), "a".into());
        let ok = v.transfer(&req).unwrap();
        assert_eq!(ok.plan.hosts, Vec::<String>::new());
        assert!(ok.plan.target_key.as_deref().unwrap().ends_with("/b.img"));
        assert_eq!(ok.fingerprint, v.transfer(&req).unwrap().fingerprint);

        let mut same = req.clone();
        same.target = same.source.clone();
        assert_eq!(
            v.transfer(&same).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );

        let mut outside = req.clone();
        outside.target = endpoint("/etc/ferry-nope.img");
        assert_eq!(
            v.transfer(&outside).unwrap_err().kind(),
            ErrorKind::PermissionDenied
        );

        let mut inline = req.clone();
        inline.source = endpoint("iscsi://u%pw@127.0.0.1/iqn.x:y/1");
        let err = v.transfer(&inline).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(!err.to_string().contains("pw@"), "{err}");

        let mut bad_opts = req.clone();
        bad_opts.options = Some(proto::TransferOptions {
            workers: 100_000,
            ..Default::default()
        });
        assert_eq!(
            v.transfer(&bad_opts).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );

        let mut bad_enum = req.clone();
        bad_enum.options = Some(proto::TransferOptions {
            order: 42,
            ..Default::default()
        });
        assert!(v.transfer(&bad_enum).is_err());

        let mut mismatched = req.clone();
        mismatched.source = Some(proto::Endpoint {
            url: src.to_str().unwrap().into(),
            options: Some(proto::endpoint::Options::S3(Default::default())),
        });
        assert!(v.transfer(&mismatched).is_err());

        let mut missing = req.clone();
        missing.source = None;
        assert!(v
            .transfer(&missing)
            .unwrap_err()
            .to_string()
            .contains("source"));
    }

    fn secret_env(name: &str) -> Option<proto::SecretRef> {
        Some(proto::SecretRef {
            source: Some(proto::secret_ref::Source::Env(name.into())),
        })
    }

    fn secret_file(name: &str) -> Option<proto::SecretRef> {
        Some(proto::SecretRef {
            source: Some(proto::secret_ref::Source::File(name.into())),
        })
    }

    /// Per-job S3 settings pass validation only in a sound form with references that
    /// resolve; the job then gets them with the credentials read from the references, and
    /// no error or formatted option shows a secret.
    #[test]
    fn s3_options_are_checked_then_resolved_for_the_job() {
        let dir = tempfile::tempdir().unwrap();
        let secrets = dir.path().join("secrets");
        std::fs::create_dir(&secrets).unwrap();
        std::fs::write(secrets.join("s3-secret"), "file-s3cret-value\n").unwrap();
        std::env::set_var("FERRY_TEST_CONVERT_KEY_ID", "env-key-id-value");
        let v = Validator {
            roots: AllowRoots::new(&[dir.path().to_path_buf()]).unwrap(),
            secrets: SecretResolver::new(Some(secrets.clone())),
        };
        let s3 = proto::S3Options {
            endpoint_url: "http://127.0.0.1:9000".into(),
            region: "eu-west-3".into(),
            access_key_id: secret_env("FERRY_TEST_CONVERT_KEY_ID"),
            secret_access_key: secret_file("s3-secret"),
            session_token: None,
            force_path_style: true,
        };
        let req = |s3: proto::S3Options| proto::StartChecksumRequest {
            source: Some(proto::Endpoint {
                url: "s3://bucket/disk.img".into(),
                options: Some(proto::endpoint::Options::S3(s3)),
            }),
            ..Default::default()
        };
        let ok = v.checksum(&req(s3.clone())).unwrap();
        assert_eq!(ok.plan.hosts, ["s3:bucket@http://127.0.0.1:9000"]);
        // The same object on another store is another image; on the same store it is not.
        let copy = |target_store: &str| proto::StartTransferRequest {
            source: req(s3.clone()).source,
            target: req(proto::S3Options {
                endpoint_url: target_store.into(),
                ..s3.clone()
            })
            .source,
            ..Default::default()
        };
        let between = v.transfer(&copy("https://other-store.example")).unwrap();
        assert_eq!(
            between.plan.target_key.as_deref(),
            Some("s3://bucket/disk.img at https://other-store.example")
        );
        let err = v.transfer(&copy("http://127.0.0.1:9000")).unwrap_err();
        assert!(err.to_string().contains("same image"), "{err}");
        let request = req(s3.clone());
        let (spec, options) = open_spec(
            &ok.plan.source,
            request.source.as_ref(),
            &v.secrets,
            "source",
        )
        .unwrap();
        assert_eq!(spec.to_string(), "s3://bucket/disk.img");
        assert_eq!(
            options.endpoint_url.as_deref(),
            Some("http://127.0.0.1:9000")
        );
        assert_eq!(options.region.as_deref(), Some("eu-west-3"));
        assert_eq!(options.force_path_style, Some(true));
        assert_eq!(
            options.access_key_id.as_ref().unwrap().expose(),
            "env-key-id-value"
        );
        assert_eq!(
            options.secret_access_key.as_ref().unwrap().expose(),
            "file-s3cret-value"
        );
        assert!(options.session_token.is_none());
        let shown = format!("{options:?} {ok:?}");
        assert!(
            !shown.contains("env-key-id-value") && !shown.contains("file-s3cret"),
            "{shown}"
        );

        // No settings: the SDK's standard chain alone.
        let bare = proto::S3Options::default();
        let (_, options) = open_spec(
            &ok.plan.source,
            req(bare).source.as_ref(),
            &v.secrets,
            "source",
        )
        .unwrap();
        assert_eq!(options, S3Options::new());

        let bad = [
            (
                proto::S3Options {
                    secret_access_key: secret_env("FERRY_TEST_CONVERT_UNSET"),
                    ..s3.clone()
                },
                "source.s3.secret_access_key: environment variable FERRY_TEST_CONVERT_UNSET",
            ),
            (
                proto::S3Options {
                    access_key_id: secret_file("missing"),
                    ..s3.clone()
                },
                "source.s3.access_key_id: secret file 'missing'",
            ),
            (
                proto::S3Options {
                    secret_access_key: None,
                    ..s3.clone()
                },
                "go together",
            ),
            (
                proto::S3Options {
                    access_key_id: None,
                    secret_access_key: None,
                    session_token: secret_env("FERRY_TEST_CONVERT_KEY_ID"),
                    ..s3.clone()
                },
                "session_token needs",
            ),
            (
                proto::S3Options {
                    endpoint_url: "ftp://store".into(),
                    ..s3.clone()
                },
                "endpoint_url is not an http",
            ),
            (
                proto::S3Options {
                    endpoint_url: "http://user:pw@store".into(),
                    ..s3.clone()
                },
                "carries a password",
            ),
            (
                proto::S3Options {
                    region: "us east".into(),
                    ..s3.clone()
                },
                "source.s3.region",
            ),
        ];
        for (o, expected) in bad {
            let err = v.checksum(&req(o)).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
            let text = err.to_string();
            assert!(text.contains(expected), "{text}");
            for value in ["env-key-id-value", "file-s3cret-value", "pw@"] {
                assert!(!text.contains(value), "{text}");
            }
        }
    }

    #[test]
    fn record_round_trip_to_proto() {
        let dir = tempfile::tempdir().unwrap();
        let v = validator(dir.path());
        let req = proto::StartChecksumRequest {
            source: endpoint(dir.path().join("x.img").to_str().unwrap()),
            ..Default::default()
        };
        let acc = v.checksum(&req).unwrap();
        let rec = JobRecord {
            id: "j".into(),
            seq: 1,
            kind: acc.kind,
            state: JobState::Succeeded,
            idempotency_key: String::new(),
            fingerprint: acc.fingerprint,
            labels: Default::default(),
            priority: 0,
            created_ms: 1500,
            started_ms: Some(2000),
            ended_ms: Some(4000),
            request: acc.request,
            plan: acc.plan,
            attempt: 1,
            progress: Default::default(),
            result: Some(ResultRecord::Checksum {
                digest: DigestRecord {
                    algorithm: "sha256".into(),
                    hex: "ab".into(),
                },
                size: 100,
                seconds: 2.0,
            }),
            error: None,
            message: String::new(),
        };
        let job = job_to_proto(&rec);
        assert_eq!(job.state, proto::JobState::Succeeded as i32);
        assert_eq!(job.create_time.unwrap().nanos, 500_000_000);
        let Some(proto::job::Request::Checksum(echo)) = job.request else {
            panic!("no request echo")
        };
        assert_eq!(echo, req);
        let Some(proto::job::Result::ChecksumResult(r)) = job.result else {
            panic!()
        };
        assert_eq!(r.throughput_bytes_per_second, 50.0);
        assert_eq!(
            r.digest.unwrap().algorithm,
            proto::HashAlgorithm::Sha256 as i32
        );
    }
}
