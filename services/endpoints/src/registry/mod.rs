//! Registry endpoint: `docker://HOST[:PORT]/REPO[:TAG|@sha256:DIGEST]` (and `oci://`),
//! a containerDisk's layer blob read through ferry-registry.
//!
//! Opening resolves the tag to a digest once (the manifest or index digest is pinned:
//! every later request names digests, so a tag re-pushed during the copy cannot mix two
//! images), picks the platform from an index (linux/amd64 unless told) and the layer
//! holding the disk. The [`RegistrySource`] is that layer's bytes: read by ranged GETs
//! in parallel when the layer is an uncompressed tar and the registry serves ranges,
//! otherwise as one stream read front to back. Either way the blob's sha256 is checked:
//! as a stream it is hashed as it passes and [`Source::finish`] reads and hashes what
//! the copy did not need; read by ranges, the ranges read are hashed in order as they
//! arrive ([`hashing`]: a bounded buffer holds what arrives ahead, the source asks the
//! engine for small work units so the readers stay close) and `finish` fetches only what
//! no read covered or the buffer could not hold. A mismatch (or a blob shorter or longer
//! than its descriptor) is `corrupt`.
//!
//! The image in the layer (a tar, perhaps compressed, holding `/disk/*`) is opened by
//! ferry-formats (`OpenOptions::container_layer`).

mod blob;
mod hashing;
mod options;

pub use blob::{RegistryInfo, RegistrySource};
pub use options::RegistryOptions;

use std::sync::Arc;

use ferry_core::{Error, ErrorKind, RegistrySpec, Result, Source};

/// Maps a client error to ferry's kinds.
pub(crate) fn error(e: ferry_registry::Error) -> Error {
    use ferry_registry::ErrorKind as K;
    let kind = match e.kind() {
        K::InvalidInput => ErrorKind::InvalidInput,
        K::NotFound => ErrorKind::NotFound,
        K::Denied => ErrorKind::PermissionDenied,
        K::Protocol => ErrorKind::Protocol,
        K::Corrupt => ErrorKind::Corrupt,
        K::Unsupported => ErrorKind::Unsupported,
        K::Disconnected => ErrorKind::Disconnected,
        K::Timeout => ErrorKind::Timeout,
        K::Server => ErrorKind::Io,
    };
    Error::new(kind, e.message().to_string())
}

/// Opens the disk layer of the image `spec` names.
pub async fn open_source(
    spec: &RegistrySpec,
    options: &RegistryOptions,
) -> Result<Arc<dyn Source>> {
    Ok(Arc::new(RegistrySource::open(spec, options).await?))
}
