//! Validation of start requests: bounded metadata, endpoints checked (no inline
//! passwords, options that belong to the URL, secret references that resolve), paths
//! confined to the allowed roots (files, NBD Unix sockets, TLS certificate directories),
//! and options turned into the typed [`JobSpec`] the job runs with.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use ferry_core::spec::NbdAddress;
use ferry_core::{EndpointSpec, Error, Result};
use ferry_endpoints::export::ExportListen;
use prost::Message;
use sha2::{Digest as _, Sha256};

use super::options::{
    http_options, registry_platform, s3_options, ChecksumSpec, JobSpec, TransferSpec,
};
use crate::model::job::{JobKind, JobPlan, PlannedTarget, ResolvedEndpoint};
use crate::secrets::SecretResolver;
use crate::security::AllowRoots;
use ferry_api::proto;

/// Bounds on what one request may ask for.
pub const MAX_KEY_BYTES: usize = 256;
pub const MAX_LABELS: usize = 64;
pub const MAX_LABEL_KEY_BYTES: usize = 63;
pub const MAX_LABEL_VALUE_BYTES: usize = 256;
pub const MAX_URL_BYTES: usize = 4096;
/// Most targets of one transfer (`target` and `more_targets`).
pub const MAX_TARGETS: usize = 64;

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
    /// The request as received, prost-encoded: the store keeps it (the API echoes it),
    /// and a restarted server decodes it into the [`JobSpec`] again.
    pub request: Vec<u8>,
    /// What the job runs with, typed.
    pub spec: Arc<JobSpec>,
    pub fingerprint: String,
    pub plan: JobPlan,
    pub idempotency_key: String,
    pub labels: BTreeMap<String, String>,
    pub priority: i32,
    pub refuse_if_target_busy: bool,
}

/// What every start request has besides its own fields.
pub(super) struct Meta<'a> {
    pub key: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub priority: i32,
    pub refuse_if_target_busy: bool,
}

impl Accepted {
    /// A request of `kind` (`request`: as received, encoded) accepted to run as `spec`.
    pub(super) fn new(
        kind: JobKind,
        request: Vec<u8>,
        spec: JobSpec,
        plan: JobPlan,
        m: Meta<'_>,
    ) -> Self {
        Self {
            kind,
            fingerprint: fingerprint(&request),
            request,
            spec: Arc::new(spec),
            plan,
            idempotency_key: m.key.to_string(),
            labels: m.labels.clone(),
            priority: m.priority,
            refuse_if_target_busy: m.refuse_if_target_busy,
        }
    }
}

pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::invalid_input(msg)
}

pub(super) fn fingerprint(bytes: &[u8]) -> String {
    crate::model::job::hex_bytes::encode(&Sha256::digest(bytes))
}

/// Checks the idempotency key and the labels of a request against their bounds.
pub(crate) fn check_meta(key: &str, labels: &BTreeMap<String, String>) -> Result<()> {
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
pub(crate) fn has_inline_password(url: &str) -> bool {
    let Some((_, rest)) = url.split_once("://") else {
        return false;
    };
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    authority
        .rsplit_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':') || userinfo.contains('%'))
}

/// A validated endpoint: what to open and how to label it.
pub(super) struct Checked {
    pub resolved: ResolvedEndpoint,
    pub key: String,
    pub host: Option<String>,
    pub kind: &'static str,
}

/// The URL of an endpoint, checked for size and inline passwords, and parsed.
fn parse_url(what: &str, ep: &proto::Endpoint) -> Result<EndpointSpec> {
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
    EndpointSpec::parse(&ep.url)
        .map_err(|e| Error::new(e.kind(), format!("{what}.url: {}", e.message())))
}

/// The per-job host of an endpoint and the identity of its image. The same bucket and
/// key on another store is another image (a copy between two stores is allowed) and
/// another host for the per-host limit.
fn identity(spec: &EndpointSpec, ep: &proto::Endpoint) -> (Option<String>, String) {
    let store = match &ep.options {
        Some(proto::endpoint::Options::S3(o)) if !o.endpoint_url.is_empty() => {
            Some(&o.endpoint_url)
        }
        _ => None,
    };
    let mut host = spec.host();
    if let (Some(store), Some(h)) = (store, &mut host) {
        *h = format!("{h}@{store}");
    }
    let key = match store {
        Some(store) => format!("{spec} at {store}"),
        None => spec.to_string(),
    };
    (host, key)
}

impl Validator {
    /// Confines a path a request names to the allowed roots, naming the endpoint and the
    /// kind of path in the error.
    fn confine(&self, what: &str, kind: &str, path: &Path) -> Result<std::path::PathBuf> {
        self.roots
            .confine(path)
            .map_err(|e| Error::new(e.kind(), format!("{what}: {kind}{}", e.message())))
    }

    /// The endpoint options: they must belong to the URL's kind, and their secret
    /// references must resolve (the values are dropped here and read again when the job
    /// opens the endpoint).
    fn check_options(&self, what: &str, spec: &EndpointSpec, ep: &proto::Endpoint) -> Result<()> {
        use proto::endpoint::Options;
        match (spec, &ep.options) {
            (_, None) => {}
            (EndpointSpec::Iscsi(_), Some(Options::Iscsi(o))) => {
                if let Some(p) = &o.password {
                    self.secrets.check(&format!("{what}.iscsi.password"), p)?;
                }
            }
            (EndpointSpec::S3(_), Some(Options::S3(o))) => {
                s3_options(what, o, &self.secrets)?;
            }
            (EndpointSpec::Http(_), Some(Options::Http(o))) => {
                http_options(what, o, &self.secrets)?;
            }
            (EndpointSpec::Nbd(_), Some(Options::Nbd(o))) => {
                if !o.tls_certificates_dir.is_empty() {
                    self.roots.confine(Path::new(&o.tls_certificates_dir))?;
                }
            }
            (EndpointSpec::Registry(_), Some(Options::Registry(o))) => {
                for (field, path) in [("auth_file", &o.auth_file), ("ca_file", &o.ca_file)] {
                    if !path.is_empty() {
                        self.confine(what, &format!("registry.{field}: "), Path::new(path))?;
                    }
                }
                registry_platform(what, o)?;
            }
            (spec, Some(_)) => {
                return Err(invalid(format!(
                    "{what}: the options given do not belong to {}:// endpoints",
                    spec.kind()
                )))
            }
        }
        Ok(())
    }

    /// A relay only on a transfer's file or block-device target, with an address that
    /// parses and its files (and Unix socket) under the allowed roots.
    fn check_relay(&self, what: &str, spec: &EndpointSpec, ep: &proto::Endpoint) -> Result<()> {
        let Some(r) = &ep.relay else {
            return Ok(());
        };
        if !(what == "target" || what.starts_with("more_targets")) {
            return Err(invalid(format!(
                "{what}.relay: only a transfer's target can be relayed"
            )));
        }
        if !matches!(spec, EndpointSpec::File(_)) {
            return Err(invalid(format!(
                "{what}.relay: a relay serves from a file or block device target, and {spec} \
                 is not one"
            )));
        }
        let listen = ExportListen::parse(&r.listen)
            .map_err(|e| invalid(format!("{what}.relay.listen: {}", e.message())))?;
        if let ExportListen::Unix(path) = &listen {
            let dir = path.parent().unwrap_or(path);
            self.confine(&format!("{what}.relay.listen"), "socket directory ", dir)?;
        }
        if r.tls_cert.is_empty() != r.tls_key.is_empty() {
            return Err(invalid(format!(
                "{what}.relay: tls_cert and tls_key go together"
            )));
        }
        if !r.tls_ca.is_empty() && r.tls_cert.is_empty() {
            return Err(invalid(format!(
                "{what}.relay.tls_ca needs tls_cert and tls_key"
            )));
        }
        for (field, file) in [
            ("tls_cert", &r.tls_cert),
            ("tls_key", &r.tls_key),
            ("tls_ca", &r.tls_ca),
        ] {
            if !file.is_empty() {
                self.confine(&format!("{what}.relay.{field}"), "", Path::new(file))?;
            }
        }
        Ok(())
    }

    /// What an NBD URL names on the server's host, its Unix socket and its TLS
    /// certificate directory, must be under the allowed roots like files.
    fn confine_nbd(&self, what: &str, spec: &EndpointSpec) -> Result<()> {
        let EndpointSpec::Nbd(n) = spec else {
            return Ok(());
        };
        if let NbdAddress::Unix { socket } = &n.address {
            self.confine(what, "NBD socket: ", socket)?;
        }
        if let Some(dir) = &n.tls_certificates {
            self.roots.confine(dir)?;
        }
        Ok(())
    }

    /// An endpoint of a backup job, checked as transfers check theirs.
    pub(super) fn checked_endpoint(
        &self,
        what: &str,
        ep: Option<&proto::Endpoint>,
    ) -> Result<Checked> {
        self.endpoint(what, ep)
    }

    fn endpoint(&self, what: &str, ep: Option<&proto::Endpoint>) -> Result<Checked> {
        let ep = ep.ok_or_else(|| invalid(format!("{what} is missing")))?;
        let spec = parse_url(what, ep)?;
        if matches!(spec, EndpointSpec::Registry(_)) && what != "source" {
            return Err(invalid(format!(
                "{what}: {spec} is a registry image; registry endpoints are read-only and can \
                 only be sources"
            )));
        }
        if matches!(spec, EndpointSpec::Http(_)) && what != "source" {
            return Err(invalid(format!(
                "{what}: {spec} is an HTTP URL; HTTP endpoints are read-only and can only be sources"
            )));
        }
        self.check_options(what, &spec, ep)?;
        self.check_relay(what, &spec, ep)?;
        self.confine_nbd(what, &spec)?;
        let kind = spec.kind();
        let (host, key) = identity(&spec, ep);
        Ok(match spec {
            EndpointSpec::File(path) => {
                let canonical = self.confine(what, "", &path)?;
                Checked {
                    key: canonical.display().to_string(),
                    resolved: ResolvedEndpoint::File(canonical),
                    host,
                    kind,
                }
            }
            _ => Checked {
                key,
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
        let more = self.more_targets(req, &source, &target)?;
        let hosts = [source.host, target.host.clone()]
            .into_iter()
            .chain(more.iter().map(|t| t.host.clone()))
            .flatten()
            .collect();
        let plan = JobPlan {
            source: source.resolved,
            target: Some(target.resolved),
            target_key: Some(target.key),
            hosts,
            source_kind: source.kind.to_string(),
            target_kind: Some(target.kind.to_string()),
            more_targets: more
                .into_iter()
                .map(|t| PlannedTarget {
                    resolved: t.resolved,
                    key: t.key,
                    kind: t.kind.to_string(),
                })
                .collect(),
            repository: None,
        };
        let spec = JobSpec::Transfer(Box::new(TransferSpec::new(req, &plan)?));
        let meta = Meta {
            key: &req.idempotency_key,
            labels: &req.labels,
            priority: req.priority,
            refuse_if_target_busy: req.refuse_if_target_busy,
        };
        Ok(Accepted::new(
            JobKind::Transfer,
            req.encode_to_vec(),
            spec,
            plan,
            meta,
        ))
    }

    /// The targets after the first of a fan-out, each checked like `target`, none the
    /// source, none twice.
    fn more_targets(
        &self,
        req: &proto::StartTransferRequest,
        source: &Checked,
        target: &Checked,
    ) -> Result<Vec<Checked>> {
        if req.more_targets.len() >= MAX_TARGETS {
            return Err(invalid(format!(
                "{} targets: at most {MAX_TARGETS} (target and {} more_targets)",
                req.more_targets.len() + 1,
                MAX_TARGETS - 1
            )));
        }
        let mut checked: Vec<Checked> = Vec::with_capacity(req.more_targets.len());
        for (i, ep) in req.more_targets.iter().enumerate() {
            let what = format!("more_targets[{i}]");
            let t = self.endpoint(&what, Some(ep))?;
            if t.key == source.key {
                return Err(invalid(format!(
                    "{what} is the source ({}): a fan-out writes other images than the one \
                     it reads",
                    t.key
                )));
            }
            let earlier = std::iter::once(("target".to_string(), target))
                .chain(
                    checked
                        .iter()
                        .enumerate()
                        .map(|(j, c)| (format!("more_targets[{j}]"), c)),
                )
                .find(|(_, c)| c.key == t.key);
            if let Some((name, _)) = earlier {
                return Err(invalid(format!(
                    "{what} and {name} are the same image ({}): give each target once",
                    t.key
                )));
            }
            checked.push(t);
        }
        Ok(checked)
    }

    /// Validates a StartChecksum request.
    pub fn checksum(&self, req: &proto::StartChecksumRequest) -> Result<Accepted> {
        check_meta(&req.idempotency_key, &req.labels)?;
        let source = self.endpoint("source", req.source.as_ref())?;
        let plan = JobPlan {
            source: source.resolved,
            target: None,
            target_key: None,
            hosts: source.host.into_iter().collect(),
            source_kind: source.kind.to_string(),
            target_kind: None,
            more_targets: Vec::new(),
            repository: None,
        };
        let spec = JobSpec::Checksum(Box::new(ChecksumSpec::new(req, &plan)?));
        let meta = Meta {
            key: &req.idempotency_key,
            labels: &req.labels,
            priority: req.priority,
            refuse_if_target_busy: false,
        };
        Ok(Accepted::new(
            JobKind::Checksum,
            req.encode_to_vec(),
            spec,
            plan,
            meta,
        ))
    }
}
