//! ferry-s3: the one S3 client of ferry, shared by the S3 endpoint (ferry-endpoints'
//! `S3Source` and `S3Target`, disk images as objects) and the backup repository's S3 store
//! (ferry-backup's `S3Store`, chunks and manifests as objects).
//!
//! Both talk to the same stores with the same job settings, so everything that decides how
//! a request reaches the store and what its failure means lives here, once: the client
//! builder ([`client`]: the AWS SDK's standard chain for endpoint URL, region, credentials
//! and profiles, a rustls (ring) HTTP client, ferry's connect and read timeouts, a fallback
//! region for S3-compatible stores, path-style addressing), the per-job overrides of that
//! chain ([`S3Options`]), the mapping of a failed SDK request to a ferry error
//! ([`sdk_error`]: a kind that decides retries, a message that names the bucket or object
//! and says what to do), and the CRC32C checksum header of an upload ([`crc32c_header`]).
//! A setting or an error therefore behaves the same whether it concerns an image or a
//! repository, and the repository links the SDK without linking the NBD, NFS, iSCSI and
//! HTTP clients that come with the endpoints.
//!
//! What each user does with objects stays with it: multipart uploads assembled from the
//! engine's writes, ranged reads and ferry's object metadata in ferry-endpoints; conditional
//! writes, listing and leases in ferry-backup.
//!
//! Credentials never leave the client: no SDK error is attached as a source and no request
//! is printed, so they cannot reach a log through an error, and [`S3Options`] shows them
//! as `***` when formatted.

#![forbid(unsafe_code)]

mod checksum;
mod client;
mod error;
mod options;

pub use checksum::crc32c_header;
pub use client::max_attempts;
pub use options::S3Options;

/// An AWS SDK S3 client configured from the standard chain and `options`. Every user of S3
/// in ferry (the S3 endpoint, the backup repository) builds its client here, so that
/// endpoint, region and credentials behave the same everywhere. Cheap to clone: every
/// clone shares the connection pool.
pub async fn client(options: &S3Options) -> aws_sdk_s3::Client {
    client::build(options).await
}

/// Turns a failed SDK request on `bucket`/`key` into a ferry error: a kind that decides
/// retries and a message that says what to do. Credentials never reach the message. `key`
/// is empty for bucket-level requests.
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
