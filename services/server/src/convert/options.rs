//! The typed options a job runs with ([`JobSpec`]): a request's options turned into engine
//! and endpoint options once, when the request is accepted (or when a restarted server
//! takes over a stored job), so the runner never decodes or converts a request itself.
//! Secrets stay references here and are read at every open ([`EndpointAccess::open`]).

use std::time::Duration;

use ferry_core::{EndpointSpec, Error, Result};
use ferry_endpoints::export::{ExportListen, ExportOptions, ExportTls};
use ferry_endpoints::http::HttpOptions;
use ferry_endpoints::registry::RegistryOptions;
use ferry_endpoints::relay::{RelayOptions, DEFAULT_LINGER, DEFAULT_WAIT};
use ferry_endpoints::s3::S3Options;
use ferry_endpoints::{CacheMode, Preallocation, SourceOptions, TargetOptions};
use ferry_engine::{Checkpoint, ChecksumOptions, CopyOptions};
use ferry_formats::SourceFormat;
use prost::Message;

use super::backup::{BackupSpec, GcSpec, PruneSpec, RestoreSpec, VerifySpec};
use super::checkpoint::checkpoint_from_proto;
use super::sync::SyncSpec;
use super::validation::{has_inline_password, invalid, MAX_URL_BYTES};
use crate::model::job::{JobKind, JobPlan, JobRecord, ResolvedEndpoint};
use crate::secrets::SecretResolver;
use ferry_api::options;
use ferry_api::proto;

/// Most workers (or hashing threads) a request may ask for.
pub const MAX_WORKERS: u32 = 256;
/// Largest request (and sparse) size a request may ask for.
pub const MAX_REQUEST_SIZE: u64 = 64 * 1024 * 1024;

/// What a job does, with its options typed.
#[derive(Debug, Clone)]
pub enum JobSpec {
    Transfer(Box<TransferSpec>),
    Checksum(Box<ChecksumSpec>),
    Backup(Box<BackupSpec>),
    Restore(Box<RestoreSpec>),
    RepositoryVerify(Box<VerifySpec>),
    Prune(Box<PruneSpec>),
    Gc(Box<GcSpec>),
    Sync(Box<SyncSpec>),
}

impl JobSpec {
    /// The spec of a stored job, from the request and plan its record keeps (a restarted
    /// server takes over queued and running jobs with this).
    pub fn from_record(record: &JobRecord) -> Result<Self> {
        let undecodable =
            |e: prost::DecodeError| Error::internal(format!("stored request does not decode: {e}"));
        Ok(match record.kind {
            JobKind::Transfer => {
                let req = proto::StartTransferRequest::decode(record.request.as_slice())
                    .map_err(undecodable)?;
                Self::Transfer(Box::new(TransferSpec::new(&req, &record.plan)?))
            }
            JobKind::Checksum => {
                let req = proto::StartChecksumRequest::decode(record.request.as_slice())
                    .map_err(undecodable)?;
                Self::Checksum(Box::new(ChecksumSpec::new(&req, &record.plan)?))
            }
            JobKind::Backup => {
                let req = proto::StartBackupRequest::decode(record.request.as_slice())
                    .map_err(undecodable)?;
                Self::Backup(Box::new(BackupSpec::new(&req, &record.plan)?))
            }
            JobKind::Restore => {
                let req = proto::StartRestoreRequest::decode(record.request.as_slice())
                    .map_err(undecodable)?;
                Self::Restore(Box::new(RestoreSpec::new(&req, &record.plan)?))
            }
            JobKind::RepositoryVerify => {
                let req = proto::StartRepositoryVerifyRequest::decode(record.request.as_slice())
                    .map_err(undecodable)?;
                Self::RepositoryVerify(Box::new(VerifySpec::new(&req, &record.plan)?))
            }
            JobKind::Prune => {
                let req = proto::StartPruneRequest::decode(record.request.as_slice())
                    .map_err(undecodable)?;
                Self::Prune(Box::new(PruneSpec::new(&req, &record.plan)?))
            }
            JobKind::Gc => {
                let req = proto::StartGcRequest::decode(record.request.as_slice())
                    .map_err(undecodable)?;
                Self::Gc(Box::new(GcSpec::new(&req, &record.plan)?))
            }
            JobKind::Sync => {
                let req = proto::StartSyncRequest::decode(record.request.as_slice())
                    .map_err(undecodable)?;
                Self::Sync(Box::new(SyncSpec::new(&req, &record.plan)?))
            }
        })
    }
}

/// How a job reads its source's bytes as an image: the endpoint's `format`,
/// `allow_backing`, `image_size`, `prescan` and `disk`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageSpec {
    pub format: SourceFormat,
    pub allow_backing: bool,
    pub size: Option<u64>,
    pub prescan: bool,
    /// The OVA disk to read (None: the only one).
    pub disk: Option<usize>,
}

impl ImageSpec {
    /// The image options of a source endpoint.
    pub fn source(ep: Option<&proto::Endpoint>) -> Result<Self> {
        let Some(ep) = ep else {
            return Ok(Self::default());
        };
        Ok(Self {
            format: options::source_format(ep.format)
                .map_err(|e| invalid(format!("source.format: {}", e.message())))?,
            allow_backing: ep.allow_backing,
            size: ep.image_size,
            prescan: ep.prescan,
            disk: ep.disk.map(|d| d as usize),
        })
    }

    /// A target endpoint is written raw: the image options must be left unset.
    pub fn check_target(ep: Option<&proto::Endpoint>) -> Result<()> {
        let Some(ep) = ep else { return Ok(()) };
        let raw = matches!(
            proto::ImageFormat::try_from(ep.format),
            Ok(proto::ImageFormat::Auto | proto::ImageFormat::Raw)
        );
        if !raw || ep.allow_backing || ep.image_size.is_some() || ep.prescan || ep.disk.is_some() {
            return Err(invalid(
                "target: format, allow_backing, image_size, prescan and disk apply to sources \
                 only (targets are written raw)",
            ));
        }
        Ok(())
    }
}

/// A transfer's endpoints and options.
#[derive(Debug, Clone)]
pub struct TransferSpec {
    pub source: EndpointAccess,
    /// How the source's bytes are read as an image.
    pub image: ImageSpec,
    pub target: EndpointAccess,
    /// The targets after the first of a fan-out, in request order.
    pub more_targets: Vec<EndpointAccess>,
    /// Engine options (the runner sets the checkpoint interval and what to resume).
    pub copy: CopyOptions,
    pub cache: CacheMode,
    pub preallocation: Preallocation,
    /// Present when the request asks to verify the copy.
    pub verify: Option<ChecksumOptions>,
    /// The caller's checkpoint to start from (`resume_from`), checked except for its size.
    pub resume_from: Option<Checkpoint>,
    /// The relay a target asks for (`Endpoint.relay`): the target's index and options.
    pub relay: Option<(usize, RelayOptions)>,
}

impl TransferSpec {
    /// Checks and converts a transfer request's options; `plan` is what validation
    /// resolved its endpoints to.
    pub fn new(req: &proto::StartTransferRequest, plan: &JobPlan) -> Result<Self> {
        let o = req.options.unwrap_or_default();
        let target = plan
            .target
            .as_ref()
            .ok_or_else(|| Error::internal("transfer job without a target"))?;
        let mut copy = copy_options(&o)?;
        let cache = options::cache_mode(o.cache)?;
        let preallocation =
            options::preallocation_from_proto(o.preallocation, o.preallocation_step)?;
        copy.zero_mode = preallocation.zero_mode();
        let verify = if o.verify {
            let mut checksum = ChecksumOptions {
                algorithm: options::hash_algorithm(o.verify_algorithm)?,
                ..ChecksumOptions::default()
            };
            if o.workers > 0 {
                checksum.workers = o.workers as usize;
            }
            Some(checksum)
        } else {
            None
        };
        let resume_from = req
            .resume_from
            .as_ref()
            .map(|c| checkpoint_from_proto("resume_from", c))
            .transpose()?;
        if resume_from.is_some() && matches!(plan.source_kind.as_str(), "http" | "https") {
            return Err(Error::invalid_input(
                "resume_from cannot be used with an HTTP source: a checkpoint does not name \
                 the object's version, so the bytes of a changed object could mix with those \
                 already copied (start the copy without resume_from)",
            ));
        }
        ImageSpec::check_target(req.target.as_ref())?;
        for target in &req.more_targets {
            ImageSpec::check_target(Some(target))?;
        }
        if plan.more_targets.len() != req.more_targets.len() {
            return Err(Error::internal(
                "the plan of a fan-out does not match its request",
            ));
        }
        let more_targets = plan
            .more_targets
            .iter()
            .zip(&req.more_targets)
            .map(|(p, ep)| EndpointAccess::new(&p.resolved, Some(ep), "more_targets"))
            .collect();
        Ok(Self {
            source: EndpointAccess::new(&plan.source, req.source.as_ref(), "source"),
            image: ImageSpec::source(req.source.as_ref())?,
            target: EndpointAccess::new(target, req.target.as_ref(), "target"),
            more_targets,
            copy,
            cache,
            preallocation,
            verify,
            resume_from,
            relay: relay_of(req)?,
        })
    }

    /// Every target, the first one first.
    pub fn targets(&self) -> impl Iterator<Item = &EndpointAccess> {
        std::iter::once(&self.target).chain(&self.more_targets)
    }

    /// Options to open the target with, given its settings from [`EndpointAccess::open`].
    pub fn target_options(&self, settings: EndpointSettings) -> TargetOptions {
        let mut t = TargetOptions::default();
        t.cache = self.cache;
        t.preallocation = self.preallocation;
        t.keep_cached = self.verify.is_some();
        t.s3 = settings.s3;
        t
    }
}

/// The relay a transfer's targets ask for (at most one; validation checked the rest):
/// the target's index and how to serve.
fn relay_of(req: &proto::StartTransferRequest) -> Result<Option<(usize, RelayOptions)>> {
    let mut found = None;
    for (index, ep) in req.target.iter().chain(&req.more_targets).enumerate() {
        let Some(r) = &ep.relay else { continue };
        if found.is_some() {
            return Err(invalid("only one target of a transfer can have a relay"));
        }
        let listen = ExportListen::parse(&r.listen)?;
        let tls = (!r.tls_cert.is_empty()).then(|| ExportTls {
            cert: r.tls_cert.clone().into(),
            key: r.tls_key.clone().into(),
            client_ca: (!r.tls_ca.is_empty()).then(|| r.tls_ca.clone().into()),
        });
        let seconds = |s: u32, default: Duration| {
            if s == 0 {
                default
            } else {
                Duration::from_secs(u64::from(s))
            }
        };
        found = Some((
            index,
            RelayOptions {
                export: ExportOptions {
                    listen,
                    name: r.name.clone(),
                    description: None,
                    tls,
                },
                wait: seconds(r.wait_seconds, DEFAULT_WAIT),
                linger: seconds(r.linger_seconds, DEFAULT_LINGER),
                idle: Duration::from_secs(u64::from(r.idle_seconds)),
            },
        ));
    }
    Ok(found)
}

/// A checksum's endpoint and options.
#[derive(Debug, Clone)]
pub struct ChecksumSpec {
    pub source: EndpointAccess,
    /// How the source's bytes are read as an image.
    pub image: ImageSpec,
    pub checksum: ChecksumOptions,
    pub cache: CacheMode,
}

impl ChecksumSpec {
    /// Checks and converts a checksum request's options.
    pub fn new(req: &proto::StartChecksumRequest, plan: &JobPlan) -> Result<Self> {
        let o = req.options.unwrap_or_default();
        Ok(Self {
            source: EndpointAccess::new(&plan.source, req.source.as_ref(), "source"),
            image: ImageSpec::source(req.source.as_ref())?,
            checksum: checksum_options(&o)?,
            cache: options::cache_mode(o.cache)?,
        })
    }
}

/// An endpoint's per-job settings, with credentials read from their references: S3
/// settings over the SDK's standard chain, HTTP authentication, headers and TLS, a
/// registry's credentials file, CA file, plain HTTP and platform.
#[derive(Debug, Clone, Default)]
pub struct EndpointSettings {
    pub s3: S3Options,
    pub http: HttpOptions,
    pub registry: RegistryOptions,
}

/// Options to read an endpoint with: the job's cache mode and the endpoint's settings
/// from [`EndpointAccess::open`] (a parameter, so no caller can open an S3 or HTTP
/// endpoint without the job's own credentials).
pub fn source_options(cache: CacheMode, settings: EndpointSettings) -> SourceOptions {
    let mut s = SourceOptions::default();
    s.cache = cache;
    s.s3 = settings.s3;
    s.http = settings.http;
    s.registry = settings.registry;
    s
}

/// How a job opens one endpoint: what validation resolved (a confined path or a URL
/// without secrets) and the request's endpoint options, whose credentials are references.
#[derive(Debug, Clone)]
pub struct EndpointAccess {
    resolved: ResolvedEndpoint,
    endpoint: Option<proto::Endpoint>,
    what: &'static str,
}

impl EndpointAccess {
    pub fn new(
        resolved: &ResolvedEndpoint,
        endpoint: Option<&proto::Endpoint>,
        what: &'static str,
    ) -> Self {
        Self {
            resolved: resolved.clone(),
            endpoint: endpoint.cloned(),
            what,
        }
    }

    /// The endpoint as the request named it, without user information or an HTTP query
    /// (what job records and errors show).
    pub fn name(&self) -> String {
        match &self.endpoint {
            Some(e) if !e.url.is_empty() => shown_url(&e.url),
            _ => match &self.resolved {
                ResolvedEndpoint::File(p) => p.display().to_string(),
                ResolvedEndpoint::Url(u) => ferry_core::spec::redact_userinfo(u),
            },
        }
    }

    /// The spec to open, with credentials read from their references just now, and the
    /// endpoint's settings (see [`open_spec`]).
    pub fn open(&self, secrets: &SecretResolver) -> Result<(EndpointSpec, EndpointSettings)> {
        open_spec(&self.resolved, self.endpoint.as_ref(), secrets, self.what)
    }
}

/// Engine copy options for a request (the checkpoint interval, resume and zero mode are
/// set by the caller).
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
    c.order = options::commit_order(o.order)?;
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

/// Engine checksum options for a request.
pub fn checksum_options(o: &proto::ChecksumOptions) -> Result<ChecksumOptions> {
    let mut c = ChecksumOptions {
        algorithm: options::hash_algorithm(o.algorithm)?,
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
    options::cache_mode(o.cache)?;
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
) -> Result<(EndpointSpec, EndpointSettings)> {
    let mut spec = match resolved {
        ResolvedEndpoint::File(p) => EndpointSpec::File(p.clone()),
        ResolvedEndpoint::Url(u) => EndpointSpec::parse(u)?,
    };
    let mut settings = EndpointSettings::default();
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
        (EndpointSpec::S3(_), Some(Options::S3(o))) => settings.s3 = s3_options(what, o, secrets)?,
        (EndpointSpec::Http(_), Some(Options::Http(o))) => {
            settings.http = http_options(what, o, secrets)?
        }
        (EndpointSpec::Registry(_), Some(Options::Registry(o))) => {
            settings.registry = registry_options(what, o)?
        }
        _ => {}
    }
    Ok((spec, settings))
}

/// The platform a request's registry options pick, checked.
pub(super) fn registry_platform(what: &str, o: &proto::RegistryOptions) -> Result<()> {
    if o.platform.is_empty() {
        return Ok(());
    }
    RegistryOptions::default()
        .with_platform(&o.platform)
        .map(|_| ())
        .map_err(|e| invalid(format!("{what}.registry.platform: {}", e.message())))
}

/// A request's registry settings as endpoint options: the credentials and CA files (paths
/// validation confined to the allowed roots) read now. Errors name the field and the
/// path, never the file's content.
fn registry_options(what: &str, o: &proto::RegistryOptions) -> Result<RegistryOptions> {
    let given = |v: &str| (!v.is_empty()).then(|| v.to_owned());
    RegistryOptions::from_settings(
        given(&o.auth_file).as_deref().map(std::path::Path::new),
        given(&o.ca_file).as_deref().map(std::path::Path::new),
        o.insecure,
        given(&o.platform).as_deref(),
    )
    .map_err(|e| Error::new(e.kind(), format!("{what}.registry: {}", e.message())))
}

/// A URL as job records and errors show it: no user information, and for HTTP(S) no
/// query (a presigned signature or token).
pub fn shown_url(url: &str) -> String {
    match EndpointSpec::parse(url) {
        Ok(spec @ EndpointSpec::Http(_)) => spec.to_string(),
        _ => match url.split_once("://") {
            Some((scheme, _))
                if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") =>
            {
                let base = url.split(['?', '#']).next().unwrap_or_default();
                ferry_core::spec::redact_userinfo(base)
            }
            _ => ferry_core::spec::redact_userinfo(url),
        },
    }
}

/// Most extra headers of an HTTP source.
const MAX_HTTP_HEADERS: usize = 64;
/// Longest HTTP user name.
const MAX_HTTP_USER_BYTES: usize = 256;

/// A request's HTTP settings as endpoint options, with the credentials, headers and
/// certificates read from their references. Errors name the reference, never a value.
pub(super) fn http_options(
    what: &str,
    o: &proto::HttpOptions,
    secrets: &SecretResolver,
) -> Result<HttpOptions> {
    if o.user.len() > MAX_HTTP_USER_BYTES || o.user.contains(':') {
        return Err(invalid(format!(
            "{what}.http.user must be at most {MAX_HTTP_USER_BYTES} bytes without ':'"
        )));
    }
    if o.password.is_some() && o.user.is_empty() {
        return Err(invalid(format!("{what}.http.password needs a user")));
    }
    if o.bearer_token.is_some() && (o.password.is_some() || !o.user.is_empty()) {
        return Err(invalid(format!(
            "{what}.http: give either user and password or bearer_token"
        )));
    }
    if o.client_certificate.is_some() != o.client_key.is_some() {
        return Err(invalid(format!(
            "{what}.http: client_certificate and client_key go together"
        )));
    }
    if o.headers.len() > MAX_HTTP_HEADERS {
        return Err(invalid(format!(
            "{what}.http: at most {MAX_HTTP_HEADERS} headers"
        )));
    }
    let resolve = |name: &str, r: &Option<proto::SecretRef>| {
        r.as_ref()
            .map(|r| secrets.resolve(&format!("{what}.http.{name}"), r))
            .transpose()
    };
    let mut h = HttpOptions::new();
    if !o.user.is_empty() {
        h.user = Some(o.user.clone());
    }
    h.password = resolve("password", &o.password)?;
    h.bearer_token = resolve("bearer_token", &o.bearer_token)?;
    for (i, header) in o.headers.iter().enumerate() {
        if header.name.is_empty() || header.name.len() > 256 {
            return Err(invalid(format!(
                "{what}.http.headers[{i}].name must have 1 to 256 bytes"
            )));
        }
        if ferry_core::http_headers::is_reserved_header(&header.name) {
            return Err(invalid(format!(
                "{what}.http.headers[{i}].name: '{}' is set by ferry itself and cannot be given",
                header.name
            )));
        }
        let value = header
            .value
            .as_ref()
            .ok_or_else(|| invalid(format!("{what}.http.headers[{i}].value is missing")))?;
        let value = secrets.resolve(&format!("{what}.http.headers[{i}].value"), value)?;
        h.headers.push((header.name.clone(), value));
    }
    h.ca_pem = resolve("ca_certificates", &o.ca_certificates)?.map(|s| s.expose().to_string());
    h.client_cert_pem =
        resolve("client_certificate", &o.client_certificate)?.map(|s| s.expose().to_string());
    h.client_key_pem = resolve("client_key", &o.client_key)?;
    if o.connect_timeout_seconds > 0 {
        h.connect_timeout = Some(std::time::Duration::from_secs(
            o.connect_timeout_seconds.min(3600).into(),
        ));
    }
    if o.read_timeout_seconds > 0 {
        h.read_timeout = Some(std::time::Duration::from_secs(
            o.read_timeout_seconds.min(3600).into(),
        ));
    }
    Ok(h)
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
pub(crate) fn s3_options(
    what: &str,
    o: &proto::S3Options,
    secrets: &SecretResolver,
) -> Result<S3Options> {
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
