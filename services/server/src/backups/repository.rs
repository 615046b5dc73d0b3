//! Repositories as requests name them (`ferry.v1.Repository`): checked when a request is
//! accepted (a directory confined to the allowed roots, S3 options only for s3://, secret
//! references that resolve) and opened when a job runs, with the key and the S3
//! credentials read from their references just then, never stored.

use std::path::Path;

use ferry_backup::{Immutability, InitOptions, KdfParams, LockMode, Repository, RepositoryUrl};
use ferry_core::{Error, ErrorKind, Result, Secret};
use ferry_endpoints::s3::S3Options;

use crate::convert::options::s3_options;
use crate::convert::validation::{has_inline_password, invalid, MAX_URL_BYTES};
use crate::model::job::ResolvedEndpoint;
use crate::secrets::SecretResolver;
use crate::security::AllowRoots;
use ferry_api::proto;

/// The object that makes a location a repository.
const CONFIG: &str = "config";
/// The object that says a sync created this destination and still owes it its own key.
const KEY_OWED: &str = "init-from-key-owed";

/// The settings of a repository a job creates when there is none (`init_if_missing`),
/// or InitRepository creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitSettings {
    pub chunk_size: u32,
    pub zstd_level: Option<i32>,
    /// An immutable repository's retention (S3 Object Lock).
    pub immutable: Option<Immutability>,
}

/// Longest retention of an immutable repository, in days (as `ferry backup init`).
pub const MAX_IMMUTABLE_DAYS: u32 = 36_500;

/// The retention a request's `immutable_days` and `immutable_mode` ask for.
fn immutability(what: &str, o: &proto::RepositoryInit) -> Result<Option<Immutability>> {
    let mode = match proto::ImmutableMode::try_from(o.immutable_mode) {
        Ok(proto::ImmutableMode::Unspecified | proto::ImmutableMode::Compliance) => {
            LockMode::Compliance
        }
        Ok(proto::ImmutableMode::Governance) => LockMode::Governance,
        Err(_) => {
            return Err(invalid(format!(
                "{what}.immutable_mode {} is not an ImmutableMode",
                o.immutable_mode
            )))
        }
    };
    match o.immutable_days {
        0 if o.immutable_mode != 0 => Err(invalid(format!(
            "{what}.immutable_mode needs {what}.immutable_days (the retention in days)"
        ))),
        0 => Ok(None),
        d if d > MAX_IMMUTABLE_DAYS => Err(invalid(format!(
            "{what}.immutable_days {d}: at most {MAX_IMMUTABLE_DAYS}"
        ))),
        d => Ok(Some(Immutability::days(mode, d))),
    }
}

impl InitSettings {
    /// Checks a request's settings (`what` names the field in errors).
    pub fn from_proto(what: &str, o: &proto::RepositoryInit) -> Result<Self> {
        let chunk_size = match o.chunk_size {
            0 => ferry_backup::DEFAULT_CHUNK_SIZE,
            n if n.is_power_of_two()
                && (u64::from(ferry_backup::MIN_CHUNK_SIZE)
                    ..=u64::from(ferry_backup::MAX_CHUNK_SIZE))
                    .contains(&n) =>
            {
                n as u32
            }
            n => {
                return Err(invalid(format!(
                    "{what}.chunk_size {n}: a power of two from {} to {} bytes (0: the default)",
                    ferry_backup::MIN_CHUNK_SIZE,
                    ferry_backup::MAX_CHUNK_SIZE
                )))
            }
        };
        let zstd_level = match o.zstd_level {
            None => Some(ferry_backup::DEFAULT_ZSTD_LEVEL),
            Some(0) => None,
            Some(l) if (1..=22).contains(&l) => Some(l),
            Some(l) => {
                return Err(invalid(format!(
                    "{what}.zstd_level {l}: 1 to 22, or 0 for no compression"
                )))
            }
        };
        Ok(Self {
            chunk_size,
            zstd_level,
            immutable: immutability(what, o)?,
        })
    }

    /// Refuses immutability for a directory (only S3 Object Lock retains versions), naming
    /// the field `what`.
    pub fn check_for(&self, what: &str, repository: &ResolvedEndpoint) -> Result<()> {
        if self.immutable.is_some() && matches!(repository, ResolvedEndpoint::File(_)) {
            return Err(invalid(format!(
                "{what}.immutable_days: only an s3:// repository (in a bucket with Object Lock \
                 enabled) can be immutable, not a directory"
            )));
        }
        Ok(())
    }

    fn options(&self, passphrase: Option<Secret>) -> InitOptions {
        let mut o = InitOptions::new()
            .with_chunk_size(self.chunk_size)
            .with_zstd_level(self.zstd_level);
        if let Some(p) = passphrase {
            o = o.with_passphrase(p);
        }
        if let Some(imm) = self.immutable {
            o = o.with_immutability(imm);
        }
        o
    }
}

/// The passphrase a reference names: the first line of the secret (as `ferry backup`
/// reads its key file), read now; `what` names the field in errors.
pub fn passphrase_of(
    secrets: &SecretResolver,
    what: &str,
    key: &proto::SecretRef,
) -> Result<Secret> {
    let secret = secrets.resolve(what, key)?;
    let line = secret.expose().lines().next().unwrap_or_default();
    if line.is_empty() {
        return Err(invalid(format!(
            "{what}: the secret is empty (its first line is the passphrase)"
        )));
    }
    Ok(Secret::new(line))
}

/// A checked repository: where it is (a canonical directory or an s3:// URL) and the
/// request's message with its references.
#[derive(Debug, Clone)]
pub struct RepoAccess {
    resolved: ResolvedEndpoint,
    repository: proto::Repository,
    /// The request's field, named in errors (`repository`, `destination`, ...).
    field: &'static str,
}

/// Checks a request's repository (`what` names the field in errors): PERMISSION_DENIED
/// for a directory outside the allowed roots, INVALID_ARGUMENT for the rest.
pub fn check_repository(
    roots: &AllowRoots,
    secrets: &SecretResolver,
    what: &str,
    r: Option<&proto::Repository>,
) -> Result<ResolvedEndpoint> {
    let r = r.ok_or_else(|| {
        invalid(format!(
            "{what} is missing: give its url (a directory or s3://bucket/prefix)"
        ))
    })?;
    if r.url.trim().is_empty() {
        return Err(invalid(format!(
            "{what}.url is empty: give a directory or s3://bucket/prefix"
        )));
    }
    if r.url.len() > MAX_URL_BYTES {
        return Err(invalid(format!(
            "{what}.url is longer than {MAX_URL_BYTES} bytes"
        )));
    }
    if has_inline_password(&r.url) {
        return Err(invalid(format!(
            "{what}.url carries credentials: give them by reference in {what}.s3"
        )));
    }
    let url = RepositoryUrl::parse(&r.url)
        .map_err(|e| invalid(format!("{what}.url: {}", e.message())))?;
    if let Some(key) = &r.key {
        secrets.check(&format!("{what}.key"), key)?;
    }
    Ok(match url {
        RepositoryUrl::Local(path) => {
            if r.s3.is_some() {
                return Err(invalid(format!(
                    "{what}.s3 applies to s3:// repositories only, not to a directory"
                )));
            }
            let canonical = roots.confine(Path::new(&path)).map_err(|e| {
                Error::new(
                    e.kind(),
                    format!("{what}: repository directory {}", e.message()),
                )
            })?;
            ResolvedEndpoint::File(canonical)
        }
        s3 @ RepositoryUrl::S3 { .. } => {
            if let Some(o) = &r.s3 {
                s3_options(what, o, secrets)?;
            }
            ResolvedEndpoint::Url(s3.to_string())
        }
    })
}

impl RepoAccess {
    pub fn new(resolved: &ResolvedEndpoint, repository: Option<&proto::Repository>) -> Self {
        Self::field(resolved, repository, "repository")
    }

    /// A repository the request names in `field`.
    pub fn field(
        resolved: &ResolvedEndpoint,
        repository: Option<&proto::Repository>,
        field: &'static str,
    ) -> Self {
        Self {
            resolved: resolved.clone(),
            repository: repository.cloned().unwrap_or_default(),
            field,
        }
    }

    /// Without a key of its own, opened with `other`'s (a sync's destination that
    /// shares the source's keys; an unencrypted repository ignores a key).
    pub fn with_key_of(mut self, other: &RepoAccess) -> Self {
        if self.repository.key.is_none() {
            self.repository.key = other.repository.key.clone();
        }
        self
    }

    /// The repository as it is shown in job records, errors and metric labels: its
    /// directory or s3:// URL (which hold no credentials).
    pub fn resolved(&self) -> &ResolvedEndpoint {
        &self.resolved
    }

    pub fn name(&self) -> String {
        match &self.resolved {
            ResolvedEndpoint::File(p) => p.display().to_string(),
            ResolvedEndpoint::Url(u) => ferry_core::spec::redact_userinfo(u),
        }
    }

    fn url(&self) -> RepositoryUrl {
        match &self.resolved {
            ResolvedEndpoint::File(p) => RepositoryUrl::Local(p.clone()),
            ResolvedEndpoint::Url(u) => {
                RepositoryUrl::parse(u).unwrap_or_else(|_| RepositoryUrl::Local(u.into()))
            }
        }
    }

    /// The passphrase, read from its reference now: the first line of the secret (as
    /// `ferry backup` reads its key file).
    fn passphrase(&self, secrets: &SecretResolver) -> Result<Option<Secret>> {
        let Some(key) = &self.repository.key else {
            return Ok(None);
        };
        passphrase_of(secrets, &format!("{}.key", self.field), key).map(Some)
    }

    async fn store(
        &self,
        secrets: &SecretResolver,
    ) -> Result<std::sync::Arc<dyn ferry_backup::ObjectStore>> {
        let s3 = match &self.repository.s3 {
            Some(o) => s3_options(self.field, o, secrets)?,
            None => S3Options::new(),
        };
        Ok(self.url().open(&s3).await)
    }

    /// Opens the repository; with `init`, creates it first when there is none.
    pub async fn open(
        &self,
        secrets: &SecretResolver,
        init: Option<&InitSettings>,
    ) -> Result<Repository> {
        let passphrase = self.passphrase(secrets)?;
        let store = self.store(secrets).await?;
        let e = match Repository::open(store.clone(), passphrase.as_ref()).await {
            Err(e) if e.kind() == ErrorKind::NotFound => e,
            other => return other,
        };
        let Some(init) = init else {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "{} (create it with InitRepository, or set init_if_missing)",
                    e.message()
                ),
            ));
        };
        match Repository::init(store.clone(), init.options(passphrase.clone())).await {
            Ok(repo) => Ok(repo),
            Err(e) => {
                // Another job may have created it meanwhile.
                if store.head(CONFIG).await.ok().flatten().is_some() {
                    Repository::open(store, passphrase.as_ref()).await
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Opens a sync's destination, created first when there is none sharing `source`'s
    /// keys (StartSyncRequest.init_destination_if_missing), with its own passphrase added
    /// as one more key. A marker object written before the creation and removed after the
    /// key's addition says the addition is still owed: after a crash between the two the
    /// next attempt finishes it. A destination without the marker that its own passphrase
    /// does not open is refused (a wrong passphrase is never added as a key).
    pub async fn open_or_init_from(
        &self,
        secrets: &SecretResolver,
        source: &RepoAccess,
    ) -> Result<Repository> {
        let store = self.store(secrets).await?;
        if store.head(CONFIG).await?.is_none() {
            store
                .put(
                    KEY_OWED,
                    Default::default(),
                    ferry_backup::PutMode::Overwrite,
                )
                .await?;
            let from = source.store(secrets).await?;
            if let Err(e) = Repository::init_from(store.clone(), from.as_ref(), None).await {
                // Another job may have created it meanwhile.
                if store.head(CONFIG).await?.is_none() {
                    return Err(e);
                }
            }
        }
        let owed = store.head(KEY_OWED).await?.is_some();
        let own = self.passphrase(secrets)?;
        let refused = match Repository::open(store.clone(), own.as_ref()).await {
            Ok(repo) => {
                if owed {
                    store.delete(KEY_OWED).await?;
                }
                return Ok(repo);
            }
            Err(e) if e.kind() == ErrorKind::PermissionDenied && owed => e,
            Err(e) => return Err(e),
        };
        let (Some(own), Some(theirs)) = (own, source.passphrase(secrets)?) else {
            return Err(refused);
        };
        let Ok(shared) = Repository::open(store.clone(), Some(&theirs)).await else {
            return Err(refused);
        };
        shared.add_key(&own, &KdfParams::default()).await?;
        store.delete(KEY_OWED).await?;
        Ok(shared)
    }

    /// Creates the repository; ALREADY_EXISTS-worthy when one is there (returned as
    /// `Ok(None)`), also when another creator won a race for it: the config, the object
    /// that makes a location a repository, is written whole and create-only, so of two
    /// racing creators exactly one succeeds and the other finds the winner's config.
    pub async fn init(
        &self,
        secrets: &SecretResolver,
        init: &InitSettings,
    ) -> Result<Option<Repository>> {
        let passphrase = self.passphrase(secrets)?;
        let store = self.store(secrets).await?;
        if store.head(CONFIG).await?.is_some() {
            return Ok(None);
        }
        match Repository::init(store.clone(), init.options(passphrase)).await {
            Ok(repo) => Ok(Some(repo)),
            Err(e) => match store.head(CONFIG).await {
                Ok(Some(_)) => Ok(None),
                _ => Err(e),
            },
        }
    }
}
