//! S3 endpoint: disk images stored as objects, read with parallel ranged GETs and written
//! as multipart uploads assembled from the engine's out-of-order writes.
//!
//! `s3://bucket/key` names the object. Endpoint URL, region, addressing style and
//! credentials come from the AWS SDK's standard chain (environment such as
//! `AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`; config and credentials files and
//! profiles; web identity tokens in Kubernetes; the instance metadata service), and a job
//! may override each of them with [`S3Options`]. Nothing here is specific to one store: it
//! works with AWS and any S3-compatible server.
//!
//! Objects written by ferry carry `x-amz-meta-ferry-size` (the image size) and, when the
//! block hash is known before the object is created, `x-amz-meta-ferry-blkhash`
//! (blksum-compatible, SHA-256 over 64 KiB blocks, lowercase hex). [`S3Source`] reads them
//! back ([`S3Source::ferry_metadata`]).

mod client;
mod error;
mod metadata;
mod parts;
mod sends;
mod source;
mod target;

use std::time::Duration;

use ferry_core::Secret;

pub use metadata::FerryMetadata;
pub use parts::{default_part_size, part_size_for, MAX_OBJECT_SIZE, MAX_PARTS, MIN_PART_SIZE};
pub use source::S3Source;
pub use target::S3Target;

/// Per-job overrides of the SDK's standard configuration chain. `None` everywhere means:
/// take everything from the environment, config files and profiles.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct S3Options {
    /// The service endpoint, for S3-compatible stores (`AWS_ENDPOINT_URL_S3`/`AWS_ENDPOINT_URL`).
    pub endpoint_url: Option<String>,
    /// The region (`AWS_REGION`). When nothing configures one, `us-east-1` is used, which
    /// is what most S3-compatible stores expect.
    pub region: Option<String>,
    /// Path-style addressing (`https://host/bucket/key`) instead of virtual-hosted style;
    /// most S3-compatible stores need it.
    pub force_path_style: Option<bool>,
    /// Static credentials; both the key id and the secret key are needed to use them.
    pub access_key_id: Option<Secret>,
    pub secret_access_key: Option<Secret>,
    pub session_token: Option<Secret>,
    /// Multipart part size for targets. Default: [`default_part_size`], raised as needed so
    /// the image fits in [`MAX_PARTS`] parts. At least [`MIN_PART_SIZE`] (S3's limit).
    pub part_size: Option<u64>,
    /// Per-part CRC32C checksums on upload (default on). Turn off for stores that reject
    /// the `x-amz-checksum-*` headers.
    pub checksums: Option<bool>,
    /// How long [`S3Target::abort`] keeps retrying to abort a multipart upload while the
    /// server is unreachable (default 60 s).
    pub abort_timeout: Option<Duration>,
}

impl S3Options {
    /// Options with every field from the standard chain.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the endpoint URL.
    pub fn with_endpoint_url(mut self, url: impl Into<String>) -> Self {
        self.endpoint_url = Some(url.into());
        self
    }

    /// Sets the region.
    pub fn with_region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Sets path-style addressing on or off.
    pub fn with_force_path_style(mut self, on: bool) -> Self {
        self.force_path_style = Some(on);
        self
    }

    /// Sets static credentials.
    pub fn with_credentials(
        mut self,
        access_key_id: Secret,
        secret_access_key: Secret,
        session_token: Option<Secret>,
    ) -> Self {
        self.access_key_id = Some(access_key_id);
        self.secret_access_key = Some(secret_access_key);
        self.session_token = session_token;
        self
    }

    /// Sets the multipart part size.
    pub fn with_part_size(mut self, part_size: u64) -> Self {
        self.part_size = Some(part_size);
        self
    }

    /// Turns per-part checksums on or off.
    pub fn with_checksums(mut self, on: bool) -> Self {
        self.checksums = Some(on);
        self
    }

    /// Sets how long an abort keeps retrying.
    pub fn with_abort_timeout(mut self, timeout: Duration) -> Self {
        self.abort_timeout = Some(timeout);
        self
    }
}

pub use source::open_source;
pub use target::open_target;

/// The `x-amz-checksum-crc32c` value of `data`, sent with an upload instead of the
/// SDK's default trailing checksum, which needs the body re-framed (aws-chunked).
pub fn crc32c_header(data: &[u8]) -> String {
    let mut crc = aws_smithy_checksums::ChecksumAlgorithm::Crc32c.into_impl();
    crc.update(data);
    crc.header_value()
        .to_str()
        .expect("base64 is ASCII")
        .to_string()
}

/// An AWS SDK S3 client configured from the standard chain and `options`, exactly as the
/// S3 endpoint builds its own: other crates that store objects (the backup repository)
/// use it so that endpoint, region and credentials behave the same everywhere.
pub async fn client(options: &S3Options) -> aws_sdk_s3::Client {
    client::build(options).await
}

/// Turns a failed SDK request on `bucket`/`key` into a ferry error: a kind that decides
/// retries and a message that says what to do. Credentials never reach the message.
pub fn sdk_error<E>(
    err: aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
    bucket: &str,
    key: &str,
) -> ferry_core::Error
where
    E: aws_sdk_s3::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    error::from_sdk(err, error::Subject { bucket, key })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SourceOptions, TargetOptions};

    /// Options end up in job logs and error reports through `{:?}`: the credentials must
    /// show as `***` there, whatever struct carries them.
    #[test]
    fn formatting_options_never_shows_the_credentials() {
        let s3 = S3Options::new()
            .with_endpoint_url("http://127.0.0.1:9000")
            .with_region("eu-west-3")
            .with_force_path_style(true)
            .with_credentials(
                Secret::new("AKIDSECRETKEYID"),
                Secret::new("wJalrXUtnFEMI-secret-access-key"),
                Some(Secret::new("session-token-value")),
            );
        let source = SourceOptions {
            s3: s3.clone(),
            ..SourceOptions::default()
        };
        let target = TargetOptions {
            s3: s3.clone(),
            ..TargetOptions::default()
        };
        for text in [
            format!("{s3:?}"),
            format!("{s3:#?}"),
            format!("{source:?}"),
            format!("{target:#?}"),
        ] {
            for secret in [
                "AKIDSECRETKEYID",
                "wJalrXUtnFEMI-secret-access-key",
                "session-token-value",
            ] {
                assert!(!text.contains(secret), "{secret} shown in {text}");
            }
            assert!(text.contains("***"), "{text}");
            assert!(text.contains("http://127.0.0.1:9000"), "{text}");
            assert!(text.contains("eu-west-3"), "{text}");
        }
        assert_eq!(
            s3.secret_access_key.as_ref().map(Secret::expose),
            Some("wJalrXUtnFEMI-secret-access-key")
        );
    }
}
