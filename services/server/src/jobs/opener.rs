//! How jobs open endpoints: through ferry-endpoints in the service, through fakes in unit
//! tests of the runner (failures on demand, slow reads); and how a source's bytes become
//! the image they hold ([`open_image`]: raw, qcow2, gz, xz or zst, as the request says).

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{EndpointSpec, Result, Source, Target};
use ferry_endpoints::registry::RegistrySource;
use ferry_endpoints::{SourceOptions, TargetOptions};
use ferry_formats::{Backing, BackingOpener, Detected, ExtentFiles, OpenOptions, StreamOptions};

use super::metered::MeteredSource;
use crate::convert::ImageSpec;
use crate::metrics::Metrics;
use crate::security::AllowRoots;

/// Opens endpoints for jobs.
#[async_trait]
pub trait Opener: Send + Sync + Debug + 'static {
    async fn open_source(
        &self,
        spec: &EndpointSpec,
        options: &SourceOptions,
    ) -> Result<Arc<dyn Source>>;

    async fn open_target(
        &self,
        spec: &EndpointSpec,
        size: u64,
        options: &TargetOptions,
    ) -> Result<Arc<dyn Target>>;
}

/// The real endpoints.
#[derive(Debug, Clone, Copy, Default)]
pub struct Endpoints;

#[async_trait]
impl Opener for Endpoints {
    async fn open_source(
        &self,
        spec: &EndpointSpec,
        options: &SourceOptions,
    ) -> Result<Arc<dyn Source>> {
        ferry_endpoints::open_source(spec, options).await
    }

    async fn open_target(
        &self,
        spec: &EndpointSpec,
        size: u64,
        options: &TargetOptions,
    ) -> Result<Arc<dyn Target>> {
        ferry_endpoints::open_target(spec, size, options).await
    }
}

/// Opens a job's source bytes through `opener`; a registry image's bytes are its disk
/// layer, opened here (it needs no fake), and how that layer is compressed comes back with
/// them.
pub(super) async fn open_bytes(
    opener: &Arc<dyn Opener>,
    spec: &EndpointSpec,
    options: &SourceOptions,
) -> Result<(Arc<dyn Source>, Option<Detected>)> {
    let EndpointSpec::Registry(registry) = spec else {
        return Ok((opener.open_source(spec, options).await?, None));
    };
    let layer = RegistrySource::open(registry, &options.registry).await?;
    let compression = match layer.info().compression {
        "gzip" => Detected::Gzip,
        "zstd" => Detected::Zstd,
        _ => Detected::Raw,
    };
    Ok((Arc::new(layer), Some(compression)))
}

/// Opens the image held in a job's source bytes as `image` says (`opened`: the bytes, and
/// when they are a registry image's layer, its compression: the disk is under /disk/). A qcow2 backing file is
/// followed only when the request allows it, and only to a file under the server's
/// allowed roots, opened through the job's opener. Both the byte source (by endpoint
/// `kind`) and the image (by format as well) are metered.
pub(super) async fn open_image(
    opened: (Arc<dyn Source>, Option<Detected>),
    image: &ImageSpec,
    opener: &Arc<dyn Opener>,
    options: &SourceOptions,
    roots: &AllowRoots,
    metrics: &Metrics,
    kind: &'static str,
) -> Result<Arc<dyn Source>> {
    let (bytes, layer) = opened;
    let backing = if image.allow_backing {
        Backing::Open(Arc::new(RootedBacking {
            opener: opener.clone(),
            options: options.clone(),
            roots: roots.clone(),
        }))
    } else {
        Backing::Refuse
    };
    // A VMDK descriptor's extent files: plain names beside it, under the allowed roots.
    let extents = ExtentFiles(Some(Arc::new(RootedBacking {
        opener: opener.clone(),
        options: options.clone(),
        roots: roots.clone(),
    })));
    let open = OpenOptions {
        format: image.format,
        backing,
        extents,
        stream: StreamOptions {
            size: image.size,
            prescan: image.prescan,
        },
        disk: image.disk,
        container_layer: layer,
        ..OpenOptions::default()
    };
    let bytes = MeteredSource::wrap(bytes, metrics, kind);
    let (image, info) = ferry_formats::open_image(bytes, &open).await?;
    Ok(MeteredSource::wrap_image(
        image,
        metrics,
        kind,
        info.format.as_str(),
    ))
}

/// Backing files of a job's image: next to the image, confined to the allowed roots.
#[derive(Debug)]
struct RootedBacking {
    opener: Arc<dyn Opener>,
    options: SourceOptions,
    roots: AllowRoots,
}

#[async_trait]
impl BackingOpener for RootedBacking {
    async fn open_backing(&self, image: &str, name: &str) -> Result<Arc<dyn Source>> {
        let path = ferry_formats::backing_path(image, name)?;
        let confined = self.roots.confine(&path)?;
        self.opener
            .open_source(&EndpointSpec::File(confined), &self.options)
            .await
    }
}
