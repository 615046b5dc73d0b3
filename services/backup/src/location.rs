//! Repository URLs: `s3://bucket/prefix`, `file:///path` or a plain directory path, and
//! opening the [`ObjectStore`] they name.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use ferry_core::{Error, Result};
use ferry_s3::S3Options;

use crate::store::{check_name, LocalStore, ObjectStore, S3Store};

/// Where a repository lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepositoryUrl {
    /// A directory (local disk or an NFS mount).
    Local(PathBuf),
    /// A prefix of an S3 bucket (empty: the whole bucket).
    S3 { bucket: String, prefix: String },
}

impl RepositoryUrl {
    /// Parses `s3://bucket[/prefix]`, `file:///path`, or a path.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        if let Some(rest) = text.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let prefix = prefix.trim_matches('/');
            if bucket.is_empty()
                || !bucket
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
            {
                return Err(Error::invalid_input(format!(
                    "'{text}' does not name an S3 bucket: use s3://BUCKET/PREFIX"
                )));
            }
            if !prefix.is_empty() && check_name(prefix).is_err() {
                return Err(Error::invalid_input(format!(
                    "the prefix of '{text}' may only hold letters, digits, '.', '_', '-' and '/'"
                )));
            }
            return Ok(Self::S3 {
                bucket: bucket.to_string(),
                prefix: prefix.to_string(),
            });
        }
        if let Some(path) = text.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(Error::invalid_input(format!(
                    "'{text}' is not an absolute file URL: use file:///path"
                )));
            }
            return Ok(Self::Local(PathBuf::from(path)));
        }
        if text.contains("://") {
            return Err(Error::unsupported(format!(
                "'{text}': a repository is a directory path, file:///path or s3://bucket/prefix"
            )));
        }
        if text.is_empty() {
            return Err(Error::invalid_input("the repository location is empty"));
        }
        Ok(Self::Local(PathBuf::from(text)))
    }

    /// Opens the store; `s3` configures the client for S3 locations, as for the S3 endpoint.
    pub async fn open(&self, s3: &S3Options) -> Arc<dyn ObjectStore> {
        match self {
            Self::Local(path) => Arc::new(LocalStore::new(path.clone())),
            Self::S3 { bucket, prefix } => {
                Arc::new(S3Store::connect(bucket.clone(), prefix, s3).await)
            }
        }
    }
}

impl fmt::Display for RepositoryUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Local(path) => write!(f, "{}", path.display()),
            Self::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            Self::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_forms() {
        assert_eq!(
            RepositoryUrl::parse("s3://backups/vm/disks/").unwrap(),
            RepositoryUrl::S3 {
                bucket: "backups".into(),
                prefix: "vm/disks".into()
            }
        );
        assert_eq!(
            RepositoryUrl::parse("s3://backups").unwrap(),
            RepositoryUrl::S3 {
                bucket: "backups".into(),
                prefix: String::new()
            }
        );
        assert_eq!(
            RepositoryUrl::parse("file:///srv/repo").unwrap(),
            RepositoryUrl::Local("/srv/repo".into())
        );
        assert_eq!(
            RepositoryUrl::parse("/mnt/nfs/repo").unwrap(),
            RepositoryUrl::Local("/mnt/nfs/repo".into())
        );
        assert_eq!(
            RepositoryUrl::parse("s3://b/p").unwrap().to_string(),
            "s3://b/p"
        );
    }

    #[test]
    fn refuses_what_it_cannot_open() {
        for bad in [
            "",
            "s3://",
            "s3:///x",
            "s3://b/../x",
            "file://relative",
            "nbd://host/export",
        ] {
            assert!(RepositoryUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
