//! [`open_source`] and [`open_target`]: from an [`EndpointSpec`] to a [`Source`] or [`Target`].
//!
//! The one place that knows which endpoint serves which scheme.

use std::sync::Arc;

use ferry_core::{EndpointSpec, Error, Result, Source, Target};

use crate::file::{FileSource, FileTarget};
use crate::{SourceOptions, TargetOptions};

/// Opens the image `spec` names for reading.
pub async fn open_source(spec: &EndpointSpec, options: &SourceOptions) -> Result<Arc<dyn Source>> {
    match spec {
        EndpointSpec::File(path) => Ok(Arc::new(FileSource::open(path, options).await?)),
        EndpointSpec::Nbd(nbd) => Ok(Arc::new(
            crate::nbd::NbdSource::open(nbd, &crate::nbd::NbdOptions::default()).await?,
        )),
        EndpointSpec::Nfs(nfs) => {
            crate::nfs::open_source(nfs, &crate::nfs::NfsOptions::default()).await
        }
        EndpointSpec::S3(s3) => crate::s3::open_source(s3, &options.s3).await,
        EndpointSpec::Http(http) => crate::http::open_source(http, &options.http).await,
        EndpointSpec::Registry(registry) => {
            crate::registry::open_source(registry, &options.registry).await
        }
        EndpointSpec::Iscsi(iscsi) => Ok(Arc::new(
            crate::iscsi::IscsiSource::open(iscsi, &crate::iscsi::IscsiOptions::default()).await?,
        )),
        other => Err(not_yet(other)),
    }
}

/// Opens the image `spec` names for writing `size` bytes. A missing file is created with
/// that size; an existing target smaller than `size` is an error.
pub async fn open_target(
    spec: &EndpointSpec,
    size: u64,
    options: &TargetOptions,
) -> Result<Arc<dyn Target>> {
    match spec {
        EndpointSpec::File(path) => Ok(Arc::new(FileTarget::open(path, size, options).await?)),
        EndpointSpec::Nbd(nbd) => Ok(Arc::new(
            crate::nbd::NbdTarget::open(nbd, size, &crate::nbd::NbdOptions::default()).await?,
        )),
        EndpointSpec::Nfs(nfs) => {
            crate::nfs::open_target(nfs, size, &crate::nfs::NfsOptions::default()).await
        }
        EndpointSpec::S3(s3) => crate::s3::open_target(s3, size, &options.s3).await,
        EndpointSpec::Iscsi(iscsi) => Ok(Arc::new(
            crate::iscsi::IscsiTarget::open(iscsi, size, &crate::iscsi::IscsiOptions::default())
                .await?,
        )),
        EndpointSpec::Http(_) => Err(Error::unsupported(format!(
            "{spec} is an HTTP URL: HTTP endpoints are read-only sources, not targets"
        ))
        .with_operation("open")),
        EndpointSpec::Registry(_) => Err(Error::unsupported(format!(
            "{spec} is a registry image: registry endpoints are read-only sources, not targets"
        ))
        .with_operation("open")),
        other => Err(not_yet(other)),
    }
}

fn not_yet(spec: &EndpointSpec) -> Error {
    Error::unsupported(format!(
        "{}:// endpoints are not supported yet",
        spec.kind()
    ))
    .with_operation("open")
    .with_endpoint(spec.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::ErrorKind;

    /// Every scheme has an endpoint now; a version=4 NFS URL reaches the NFSv4
    /// endpoint, which names the session it could not start (nothing listens on port 1).
    #[tokio::test]
    async fn nfs_v4_urls_reach_the_nfs_v4_endpoint() {
        let spec = EndpointSpec::parse("nfs://127.0.0.1/export/x?version=4&nfsport=1").unwrap();
        let err = open_source(&spec, &SourceOptions::default())
            .await
            .err()
            .unwrap();
        assert_eq!(err.kind(), ErrorKind::Disconnected);
        assert!(err.message().contains("NFSv4 session"), "{err}");
        let err = open_target(&spec, 1, &TargetOptions::default())
            .await
            .err()
            .unwrap();
        assert_eq!(err.kind(), ErrorKind::Disconnected);
        assert!(err.message().contains("NFSv4 session"), "{err}");
    }
}
