//! The image format options every command that reads a source shares, and the opener
//! that follows a qcow2 backing chain (or a differencing VHD/VHDX image's parents) when
//! `--allow-backing` asks for it.
//!
//! Endpoints give bytes; this turns them into the image those bytes hold (raw, qcow2,
//! VMDK, an OVA's disk, VHD, VHDX, VDI, or a raw image compressed with gzip, xz or zstd), so `ferry copy image.qcow2 disk.raw`
//! copies the guest's disk, not the qcow2 file, and `ferry copy disk.raw.xz disk.raw`
//! decompresses.

use std::sync::Arc;

use async_trait::async_trait;
use clap::Args;
use ferry_core::{EndpointSpec, Error, Result, Source};
use ferry_endpoints::registry::{RegistryInfo, RegistrySource};
use ferry_endpoints::{open_source, SourceOptions};
use ferry_formats::{
    Backing, BackingOpener, Detected, ExtentFiles, ImageInfo, OpenOptions, SourceFormat,
    StreamOptions,
};

/// `--source-format`, `--allow-backing`, `--source-size` and `--prescan`.
#[derive(Debug, Clone, Args)]
pub struct FormatArgs {
    /// Format of the source image: auto (detected by magic), raw, qcow2, vmdk, ova, vhd,
    /// vhdx, vdi, or a raw image compressed with gz, xz or zst. `raw` copies an image as
    /// its bytes even when they look like another format.
    #[arg(long, value_name = "FORMAT", default_value = "auto", value_parser = parse_format)]
    pub source_format: SourceFormat,
    /// The decompressed size of a compressed source that does not record it (gzip; zstd
    /// compressed from a pipe), checked against the stream as it is read. Without it the
    /// size is learned at the stream's end. Binary suffixes K, M, G, T (4G, 10GiB) are
    /// accepted.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub source_size: Option<u64>,
    /// Count the decompressed size of a compressed source that does not record it with
    /// a full decompression pass before the copy (to size the target up front, or to
    /// copy it to several targets).
    #[arg(long)]
    pub prescan: bool,
    /// Follow a qcow2 image's backing file (resolved relative to the image, for file
    /// images only; at most 16 deep), and read a differencing VHD or VHDX over its parent
    /// (a plain file name beside the image, its id checked). Off by default: the name
    /// comes from the image.
    #[arg(long)]
    pub allow_backing: bool,
    /// The disk of an OVA to read, numbered from 0 as `ferry info` lists them (needed
    /// when the OVA holds more than one).
    #[arg(long, value_name = "N")]
    pub disk: Option<usize>,
    /// The platform to read from a registry image index (OS/ARCH[/VARIANT]; default
    /// linux/amd64, or FERRY_REGISTRY_PLATFORM).
    #[arg(long, value_name = "PLATFORM")]
    pub platform: Option<String>,
}

fn parse_format(text: &str) -> std::result::Result<SourceFormat, String> {
    text.parse()
}

fn parse_size(text: &str) -> std::result::Result<u64, String> {
    ferry_core::size::parse_size(text).map_err(|e| e.to_string())
}

impl FormatArgs {
    /// Applies `--platform` to the registry options.
    pub fn apply_platform(&self, source: &mut SourceOptions) -> Result<()> {
        if let Some(p) = &self.platform {
            source.registry = source.registry.clone().with_platform(p)?;
        }
        Ok(())
    }

    pub fn open_options(&self, source: &SourceOptions) -> OpenOptions {
        OpenOptions {
            format: self.source_format,
            backing: if self.allow_backing {
                Backing::Open(Arc::new(FileBackingOpener {
                    options: source.clone(),
                }))
            } else {
                Backing::Refuse
            },
            stream: StreamOptions {
                size: self.source_size,
                prescan: self.prescan,
            },
            disk: self.disk,
            // A VMDK descriptor's extents are plain names beside it (checked by the reader).
            extents: ExtentFiles(Some(Arc::new(FileBackingOpener {
                options: source.clone(),
            }))),
            ..OpenOptions::default()
        }
    }
}

/// Opens `spec` and the image its bytes hold.
pub async fn open(
    spec: &EndpointSpec,
    source: &SourceOptions,
    options: &OpenOptions,
) -> Result<(Arc<dyn Source>, ImageInfo)> {
    if let EndpointSpec::Registry(registry) = spec {
        let (image, info, _) = open_registry(registry, source, options).await?;
        return Ok((image, info));
    }
    let bytes = open_source(spec, source).await?;
    ferry_formats::open_image(bytes, options).await
}

/// Opens a registry image's disk layer and the disk in it.
pub async fn open_registry(
    spec: &ferry_core::RegistrySpec,
    source: &SourceOptions,
    options: &OpenOptions,
) -> Result<(Arc<dyn Source>, ImageInfo, RegistryInfo)> {
    let layer = RegistrySource::open(spec, &source.registry).await?;
    let found = layer.info().clone();
    let compression = match found.compression {
        "gzip" => Detected::Gzip,
        "zstd" => Detected::Zstd,
        _ => Detected::Raw,
    };
    let options = OpenOptions {
        container_layer: Some(compression),
        ..options.clone()
    };
    let (image, info) = ferry_formats::open_image(Arc::new(layer), &options).await?;
    Ok((image, info, found))
}

/// Resolves a backing name against the directory of the file image that names it.
struct FileBackingOpener {
    options: SourceOptions,
}

#[async_trait]
impl BackingOpener for FileBackingOpener {
    async fn open_backing(&self, image: &str, name: &str) -> Result<Arc<dyn Source>> {
        let path = ferry_formats::backing_path(image, name)?;
        let path = std::fs::canonicalize(&path)
            .map_err(|e| Error::io(format!("backing file {}", path.display()), e))?;
        open_source(&EndpointSpec::File(path), &self.options).await
    }
}
