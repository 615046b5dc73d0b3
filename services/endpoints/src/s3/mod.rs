//! S3 endpoint: disk images stored as objects, read with parallel ranged GETs and written
//! as multipart uploads assembled from the engine's out-of-order writes.
//!
//! `s3://bucket/key` names the object. Endpoint URL, region, addressing style and
//! credentials come from the AWS SDK's standard chain (environment such as
//! `AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`; config and credentials files and
//! profiles; web identity tokens in Kubernetes; the instance metadata service), and a job
//! may override each of them with [`S3Options`]. Nothing here is specific to one store: it
//! works with AWS and any S3-compatible server. The client, its options and the mapping of
//! SDK errors to ferry errors come from ferry-s3, which the backup repository shares.
//!
//! Objects written by ferry carry `x-amz-meta-ferry-size` (the image size) and, when the
//! block hash is known before the object is created, `x-amz-meta-ferry-blkhash`
//! (blksum-compatible, SHA-256 over 64 KiB blocks, lowercase hex). [`S3Source`] reads them
//! back ([`S3Source::ferry_metadata`]).

mod metadata;
mod parts;
mod sends;
mod source;
mod target;

pub use metadata::FerryMetadata;
pub use parts::{default_part_size, part_size_for, MAX_OBJECT_SIZE, MAX_PARTS, MIN_PART_SIZE};
pub use source::{open_source, S3Source};
pub use target::{open_target, S3Target};

/// The endpoint's options (`SourceOptions::s3`, `TargetOptions::s3`), from ferry-s3, the S3
/// client the endpoint shares with the backup repository.
pub use ferry_s3::S3Options;

#[cfg(test)]
mod tests {
    use ferry_core::Secret;

    use super::*;
    use crate::{SourceOptions, TargetOptions};

    /// Options end up in job logs and error reports through `{:?}`: the credentials must
    /// show as `***` there, whatever struct carries them. (ferry-s3 checks `S3Options`
    /// itself.)
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
        for text in [format!("{source:?}"), format!("{target:#?}")] {
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
    }
}
