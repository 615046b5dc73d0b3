//! [`S3Store`]: a repository under a prefix of an S3 bucket (AWS or any S3-compatible
//! store), through the same SDK client and options as ferry's S3 endpoint (ferry-s3).
//!
//! Create-only writes use `If-None-Match: *` and lease replacement `If-Match: <ETag>`
//! (both answered with 412 when the condition fails); `touch` copies an object onto
//! itself with `MetadataDirective=REPLACE`, which S3 allows and which renews
//! `Last-Modified`. Retries are the SDK's.
//!
//! With a [`Retention`] (an immutable repository on a bucket with Object Lock), every
//! PUT carries `x-amz-object-lock-mode` and `-retain-until-date`, `touch` extends the
//! retention of the current version (PutObjectRetention) instead of writing a new one,
//! and a delete without a version id leaves a delete marker, as on any versioned
//! bucket. Versions are listed, read, destroyed and brought back by their ids for the
//! garbage collector and `undelete`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::{ByteStream, DateTime};
use aws_sdk_s3::types::{
    ChecksumAlgorithm, MetadataDirective, ObjectLockEnabled, ObjectLockMode, ObjectLockRetention,
    ObjectLockRetentionMode,
};
use aws_sdk_s3::Client;
use bytes::Bytes;
use ferry_core::{Error, ErrorKind, Result};
use ferry_s3::{crc32c_header, sdk_error, S3Options};

use super::{
    check_name, too_large, whole_seconds, LockMode, ObjectMeta, ObjectStore, ObjectVersion, Put,
    PutMode, Retention, Version,
};

/// A repository in `s3://bucket/prefix`.
#[derive(Debug, Clone)]
pub struct S3Store {
    client: Client,
    bucket: String,
    /// Empty, or the prefix without a trailing `/`.
    prefix: String,
    /// Whether uploads carry a CRC32C checksum (S3Options::checksums).
    checksums: bool,
    /// The Object Lock retention every write carries (an immutable repository).
    retention: Option<Retention>,
}

impl S3Store {
    /// A store over an existing client.
    pub fn new(client: Client, bucket: impl Into<String>, prefix: &str) -> Self {
        Self {
            client,
            bucket: bucket.into(),
            prefix: prefix.trim_matches('/').to_string(),
            checksums: true,
            retention: None,
        }
    }

    /// Whether uploads carry a CRC32C checksum (default on; some S3-compatible stores
    /// refuse checksum headers).
    pub fn with_checksums(mut self, on: bool) -> Self {
        self.checksums = on;
        self
    }

    /// A store with a client built from `options` and the SDK's standard chain.
    pub async fn connect(bucket: impl Into<String>, prefix: &str, options: &S3Options) -> Self {
        Self::new(ferry_s3::client(options).await, bucket, prefix)
            .with_checksums(options.checksums.unwrap_or(true))
    }

    fn key(&self, name: &str) -> Result<String> {
        check_name(name)?;
        Ok(if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.prefix)
        })
    }

    fn name_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        if self.prefix.is_empty() {
            Some(key)
        } else {
            key.strip_prefix(self.prefix.as_str())?.strip_prefix('/')
        }
    }

    fn error<E>(&self, err: SdkError<E, HttpResponse>, key: &str) -> Error
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        sdk_error(err, &self.bucket, key)
    }

    fn full_prefix(&self, prefix: &str) -> String {
        if self.prefix.is_empty() {
            prefix.to_string()
        } else {
            format!("{}/{prefix}", self.prefix)
        }
    }

    async fn write(&self, name: &str, data: Bytes, mode: PutMode, shared: bool) -> Result<Put> {
        let key = self.key(name)?;
        // The checksum is sent as a header and the payload left unsigned: the SDK's
        // defaults (a signed payload, a trailing checksum in an aws-chunked body) hash
        // every byte once more on both sides.
        let crc = self.checksums.then(|| crc32c_header(&data));
        let mut request = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(&key)
            .content_length(data.len() as i64)
            .body(ByteStream::from(data));
        if let Some(crc) = crc {
            request = request
                .checksum_algorithm(ChecksumAlgorithm::Crc32C)
                .checksum_crc32_c(crc);
        }
        if let Some(r) = &self.retention {
            let period = if shared {
                r.period + r.shared_extra
            } else {
                r.period
            };
            request = request
                .object_lock_mode(match r.mode {
                    LockMode::Compliance => ObjectLockMode::Compliance,
                    LockMode::Governance => ObjectLockMode::Governance,
                })
                .object_lock_retain_until_date(date_of(SystemTime::now() + period));
        }
        match &mode {
            PutMode::Overwrite => {}
            PutMode::CreateOnly => request = request.if_none_match("*"),
            PutMode::ReplaceIf(version) => request = request.if_match(version.0.clone()),
        }
        match request.customize().disable_payload_signing().send().await {
            Ok(_) => Ok(Put::Written),
            // 412: the condition failed; 409: a concurrent conditional write won.
            Err(err)
                if mode != PutMode::Overwrite && matches!(status_of(&err), Some(412 | 409)) =>
            {
                Ok(Put::Conflict)
            }
            // If-Match on an object that is gone.
            Err(err) if matches!(mode, PutMode::ReplaceIf(_)) && is_not_found(&err) => {
                Ok(Put::Conflict)
            }
            Err(err) => Err(self.error(err, &key)),
        }
    }

    async fn head_key(&self, name: &str, version_id: Option<&str>) -> Result<Option<ObjectMeta>> {
        let key = self.key(name)?;
        match self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(&key)
            .set_version_id(version_id.map(str::to_string))
            .send()
            .await
        {
            Ok(out) => Ok(Some(ObjectMeta {
                name: name.to_string(),
                size: out.content_length().unwrap_or(0).max(0) as u64,
                modified: time_of(out.last_modified()),
                retain_until: out
                    .object_lock_retain_until_date()
                    .map(|t| time_of(Some(t))),
            })),
            // A version id that names a delete marker answers 405.
            Err(err) if is_not_found(&err) || status_of(&err) == Some(405) => Ok(None),
            Err(err) => Err(self.error(err, &key)),
        }
    }

    async fn read(
        &self,
        name: &str,
        max_len: u64,
        mut data: Vec<u8>,
        version_id: Option<&str>,
    ) -> Result<Option<(Vec<u8>, Option<String>)>> {
        let key = self.key(name)?;
        let out = match self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&key)
            .set_version_id(version_id.map(str::to_string))
            .send()
            .await
        {
            Ok(out) => out,
            Err(err) if is_not_found(&err) || status_of(&err) == Some(405) => return Ok(None),
            Err(err) => return Err(self.error(err, &key)),
        };
        let size = out.content_length().unwrap_or(0).max(0) as u64;
        if size > max_len {
            return Err(too_large(&self.location(), name, size, max_len));
        }
        let etag = out.e_tag().map(str::to_string);
        let mut body = out.body;
        data.clear();
        data.reserve(size as usize);
        loop {
            match body.try_next().await {
                Ok(Some(bytes)) => {
                    if (data.len() + bytes.len()) as u64 > max_len {
                        return Err(too_large(
                            &self.location(),
                            name,
                            (data.len() + bytes.len()) as u64,
                            max_len,
                        ));
                    }
                    data.extend_from_slice(&bytes);
                }
                Ok(None) => break,
                Err(err) => return Err(body_error(&self.bucket, &key, &err)),
            }
        }
        Ok(Some((data, etag)))
    }
}

fn status_of<E>(err: &SdkError<E, HttpResponse>) -> Option<u16> {
    match err {
        SdkError::ServiceError(service) => Some(service.raw().status().as_u16()),
        _ => None,
    }
}

fn is_not_found<E: ProvideErrorMetadata>(err: &SdkError<E, HttpResponse>) -> bool {
    status_of(err) == Some(404) && err.code() != Some("NoSuchBucket")
}

/// A broken response body: a failed checksum means the stored bytes are not the ones
/// written (kind Corrupt); anything else is a lost connection.
fn body_error(bucket: &str, key: &str, err: &dyn std::error::Error) -> Error {
    let detail = DisplayErrorContext(err).to_string();
    let kind = if detail.to_ascii_lowercase().contains("checksum") {
        ErrorKind::Corrupt
    } else {
        ErrorKind::Disconnected
    };
    Error::new(
        kind,
        format!("reading s3://{bucket}/{key} failed: {detail}"),
    )
}

fn time_of(t: Option<&DateTime>) -> SystemTime {
    match t {
        Some(t) if t.secs() >= 0 => {
            whole_seconds(UNIX_EPOCH + Duration::from_secs(t.secs() as u64))
        }
        _ => UNIX_EPOCH,
    }
}

#[async_trait]
impl ObjectStore for S3Store {
    fn location(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }

    async fn put(&self, name: &str, data: Bytes, mode: PutMode) -> Result<Put> {
        self.write(name, data, mode, false).await
    }

    async fn put_batched(&self, name: &str, data: Bytes) -> Result<()> {
        self.write(name, data, PutMode::Overwrite, true)
            .await
            .map(|_| ())
    }

    async fn get_into(&self, name: &str, max_len: u64, buf: Vec<u8>) -> Result<Option<Vec<u8>>> {
        Ok(self
            .read(name, max_len, buf, None)
            .await?
            .map(|(data, _)| data))
    }

    async fn get_versioned(&self, name: &str, max_len: u64) -> Result<Option<(Vec<u8>, Version)>> {
        match self.read(name, max_len, Vec::new(), None).await? {
            None => Ok(None),
            Some((data, Some(etag))) => Ok(Some((data, Version(etag)))),
            Some((_, None)) => Err(Error::unsupported(format!(
                "the S3 store at {} returned {name} without an ETag: conditional writes cannot work there",
                self.location()
            ))),
        }
    }

    async fn head(&self, name: &str) -> Result<Option<ObjectMeta>> {
        self.head_key(name, None).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let full = self.full_prefix(prefix);
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(&full)
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|err| self.error(err, &full))?;
            for object in page.contents() {
                let Some(name) = object.key().and_then(|k| self.name_of(k)) else {
                    continue;
                };
                if check_name(name).is_err() {
                    continue;
                }
                out.push(ObjectMeta {
                    name: name.to_string(),
                    size: object.size().unwrap_or(0).max(0) as u64,
                    modified: time_of(object.last_modified()),
                    retain_until: None,
                });
            }
            match page.next_continuation_token() {
                Some(next) if page.is_truncated().unwrap_or(false) => {
                    token = Some(next.to_string())
                }
                _ => break,
            }
        }
        Ok(out)
    }

    async fn delete(&self, name: &str) -> Result<()> {
        let key = self.key(name)?;
        match self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(&key)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(err) if is_not_found(&err) => Ok(()),
            Err(err) => Err(self.error(err, &key)),
        }
    }

    async fn touch(&self, name: &str) -> Result<()> {
        if let Some(r) = self.retention {
            let until = SystemTime::now() + r.period + r.shared_extra;
            return match self.extend_retention(name, until).await? {
                true => Ok(()),
                false => Err(Error::new(
                    ErrorKind::NotFound,
                    format!("{name} is missing from {}", self.location()),
                )),
            };
        }
        let key = self.key(name)?;
        self.client
            .copy_object()
            .bucket(&self.bucket)
            .key(&key)
            .copy_source(format!("{}/{key}", self.bucket))
            .metadata_directive(MetadataDirective::Replace)
            .send()
            .await
            .map(|_| ())
            .map_err(|err| self.error(err, &key))
    }

    async fn object_lock_enabled(&self) -> Result<bool> {
        match self
            .client
            .get_object_lock_configuration()
            .bucket(&self.bucket)
            .send()
            .await
        {
            Ok(out) => Ok(out
                .object_lock_configuration()
                .and_then(|c| c.object_lock_enabled())
                == Some(&ObjectLockEnabled::Enabled)),
            // ObjectLockConfigurationNotFoundError (404), or a store without the API.
            Err(err) if matches!(status_of(&err), Some(404 | 400 | 501)) => Ok(false),
            Err(err) => Err(self.error(err, &self.bucket)),
        }
    }

    fn with_retention(&self, retention: Retention) -> Result<std::sync::Arc<dyn ObjectStore>> {
        if !self.checksums {
            return Err(Error::unsupported(format!(
                "{}: Object Lock writes need a checksum header, and checksums are turned off for this store",
                self.location()
            )));
        }
        let mut store = self.clone();
        store.retention = Some(retention);
        Ok(std::sync::Arc::new(store))
    }

    fn retention(&self) -> Option<Retention> {
        self.retention
    }

    async fn extend_retention(&self, name: &str, until: SystemTime) -> Result<bool> {
        // No head first: the caller has seen the retention end before `until`, and
        // Object Lock itself refuses to shorten one.
        let key = self.key(name)?;
        let mode = match self.retention.map_or(LockMode::Compliance, |r| r.mode) {
            LockMode::Compliance => ObjectLockRetentionMode::Compliance,
            LockMode::Governance => ObjectLockRetentionMode::Governance,
        };
        match self
            .client
            .put_object_retention()
            .bucket(&self.bucket)
            .key(&key)
            .retention(
                ObjectLockRetention::builder()
                    .mode(mode)
                    .retain_until_date(date_of(until))
                    .build(),
            )
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(err) if is_not_found(&err) => Ok(false),
            Err(err) => Err(self.error(err, &key)),
        }
    }

    async fn list_versions(&self, prefix: &str) -> Result<Vec<ObjectVersion>> {
        let full = self.full_prefix(prefix);
        let mut out = Vec::new();
        let (mut key_marker, mut version_marker): (Option<String>, Option<String>) = (None, None);
        loop {
            let page = self
                .client
                .list_object_versions()
                .bucket(&self.bucket)
                .prefix(&full)
                .set_key_marker(key_marker.take())
                .set_version_id_marker(version_marker.take())
                .send()
                .await
                .map_err(|err| self.error(err, &full))?;
            let mut push = |key: Option<&str>,
                            id: Option<&str>,
                            marker: bool,
                            latest: Option<bool>,
                            size: Option<i64>,
                            modified: Option<&DateTime>| {
                let (Some(name), Some(id)) = (key.and_then(|k| self.name_of(k)), id) else {
                    return;
                };
                if check_name(name).is_err() {
                    return;
                }
                out.push(ObjectVersion {
                    name: name.to_string(),
                    version_id: id.to_string(),
                    delete_marker: marker,
                    latest: latest.unwrap_or(false),
                    size: size.unwrap_or(0).max(0) as u64,
                    modified: time_of(modified),
                });
            };
            for v in page.versions() {
                push(
                    v.key(),
                    v.version_id(),
                    false,
                    v.is_latest(),
                    v.size(),
                    v.last_modified(),
                );
            }
            for m in page.delete_markers() {
                push(
                    m.key(),
                    m.version_id(),
                    true,
                    m.is_latest(),
                    None,
                    m.last_modified(),
                );
            }
            if !page.is_truncated().unwrap_or(false) {
                break;
            }
            key_marker = page.next_key_marker().map(str::to_string);
            version_marker = page.next_version_id_marker().map(str::to_string);
            if key_marker.is_none() {
                break;
            }
        }
        Ok(out)
    }

    async fn head_version(&self, name: &str, version_id: &str) -> Result<Option<ObjectMeta>> {
        self.head_key(name, Some(version_id)).await
    }

    async fn get_version(
        &self,
        name: &str,
        version_id: &str,
        max_len: u64,
    ) -> Result<Option<Vec<u8>>> {
        Ok(self
            .read(name, max_len, Vec::new(), Some(version_id))
            .await?
            .map(|(data, _)| data))
    }

    async fn delete_version(&self, name: &str, version_id: &str) -> Result<()> {
        let key = self.key(name)?;
        match self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(&key)
            .version_id(version_id)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(err) if is_not_found(&err) => Ok(()),
            Err(err) => Err(self.error(err, &key)),
        }
    }

    async fn restore_version(&self, name: &str, version_id: &str) -> Result<()> {
        let key = self.key(name)?;
        // Copied without Object Lock headers (a copy sends no checksum header, which
        // S3 requires with them), then retained like any write.
        self.client
            .copy_object()
            .bucket(&self.bucket)
            .key(&key)
            .copy_source(format!("{}/{key}?versionId={version_id}", self.bucket))
            .send()
            .await
            .map_err(|err| self.error(err, &key))?;
        if let Some(r) = &self.retention {
            self.extend_retention(name, SystemTime::now() + r.period + r.shared_extra)
                .await?;
        }
        Ok(())
    }
}

fn date_of(t: SystemTime) -> DateTime {
    DateTime::from_secs(
        t.duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs().min(i64::MAX as u64) as i64),
    )
}
