//! [`S3Options`]: what a job may override of the SDK's standard configuration chain. One
//! type for every S3 user (image objects and backup repositories), so a setting means the
//! same wherever it is given.

use std::time::Duration;

use ferry_core::Secret;

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
    /// Multipart part size for S3 targets (ferry-endpoints' `S3Target`). Default: its
    /// `default_part_size`, raised as needed so the image fits in `MAX_PARTS` parts. At
    /// least `MIN_PART_SIZE` (S3's limit).
    pub part_size: Option<u64>,
    /// Per-part CRC32C checksums on upload (default on). Turn off for stores that reject
    /// the `x-amz-checksum-*` headers.
    pub checksums: Option<bool>,
    /// How long `S3Target::abort` (ferry-endpoints) keeps retrying to abort a multipart
    /// upload while the server is unreachable (default 60 s).
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Options end up in job logs and error reports through `{:?}`: the credentials must
    /// show as `***` there. (ferry-endpoints checks the structs that carry these options.)
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
        for text in [format!("{s3:?}"), format!("{s3:#?}")] {
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
