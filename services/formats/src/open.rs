//! [`open_image`]: from the bytes an endpoint gives to the image they hold.
//!
//! Detects (or takes the caller's word for) the format, opens qcow2 or a compressed
//! stream over the bytes, and follows a backing chain only through the caller's
//! [`BackingOpener`]: a backing name comes from the image, so it is untrusted; the opener
//! decides how (and whether) a name resolves, this module bounds the chain's depth and
//! refuses loops.

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Error, ErrorKind, IoBuf, Result, Source};

use crate::detect::{detect, Detected, SourceFormat, MAGIC_LEN};
use crate::qcow2::{Qcow2Options, Qcow2Source};
use crate::stream::{open_stream, StreamOptions};

/// The longest backing chain followed (the image itself not counted).
pub const MAX_BACKING_DEPTH: usize = 16;

/// Opens the byte source a backing file name refers to.
#[async_trait]
pub trait BackingOpener: Send + Sync {
    /// Opens `name`, as found in the image `image` (its [`Source::describe`]), resolved
    /// relative to that image's location.
    async fn open_backing(&self, image: &str, name: &str) -> Result<Arc<dyn Source>>;
}

/// What to do with a backing file the image names.
#[derive(Clone, Default)]
pub enum Backing {
    /// Refuse the image (the default: a backing path is untrusted input).
    #[default]
    Refuse,
    /// Record the name and read unallocated ranges as zeroes (`ferry info` only: the
    /// bytes are not the image's).
    NameOnly,
    /// Follow the chain through this opener.
    Open(Arc<dyn BackingOpener>),
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Refuse => "Refuse",
            Self::NameOnly => "NameOnly",
            Self::Open(_) => "Open",
        })
    }
}

/// How to open an image.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    pub format: SourceFormat,
    pub qcow2: Qcow2Options,
    pub backing: Backing,
    /// Size and prescan of compressed streams.
    pub stream: StreamOptions,
}

/// What `ferry info` reports about an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    pub format: Detected,
    pub virtual_size: u64,
    /// The image file's own size in bytes.
    pub file_size: u64,
    pub cluster_size: Option<u64>,
    /// qcow2 version (2 or 3).
    pub version: Option<u32>,
    pub extended_l2: bool,
    /// How compressed clusters are compressed (`zlib`, `zstd`), for qcow2.
    pub compression: Option<&'static str>,
    /// Backing file names, nearest first, as the images name them.
    pub backing_chain: Vec<String>,
    /// For a zstd image read frame by frame in parallel: how many frames.
    pub parallel_frames: Option<u64>,
}

/// Where the backing file `name` of the file image `image` (its [`Source::describe`])
/// is: next to the image, or where an absolute name says. Backing files are followed for
/// file images only, and only to paths (a name with `://` is refused).
pub fn backing_path(image: &str, name: &str) -> Result<std::path::PathBuf> {
    if name.contains("://") {
        return Err(Error::unsupported(format!(
            "backing file {name:?} is not a path; only file backing files are followed"
        )));
    }
    let ferry_core::EndpointSpec::File(path) = ferry_core::EndpointSpec::parse(image)? else {
        return Err(Error::unsupported(format!(
            "backing file {name:?}: backing files are followed only for file images"
        )));
    };
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    Ok(dir.join(name))
}

/// Opens the image held in `bytes` as `options.format` says; returns the image as a
/// [`Source`] and what was found out about it.
pub async fn open_image(
    bytes: Arc<dyn Source>,
    options: &OpenOptions,
) -> Result<(Arc<dyn Source>, ImageInfo)> {
    let mut seen = vec![bytes.describe()];
    open_layer(bytes, options.format, options, &mut seen).await
}

async fn sniff(bytes: &dyn Source) -> Result<Detected> {
    let len = bytes.size().min(MAGIC_LEN as u64) as usize;
    if len == 0 {
        return Ok(Detected::Raw);
    }
    let head = bytes.read_at(0, IoBuf::new(len)).await?;
    Ok(detect(&head))
}

fn raw_info(bytes: &dyn Source) -> ImageInfo {
    ImageInfo {
        format: Detected::Raw,
        virtual_size: bytes.size(),
        file_size: bytes.size(),
        cluster_size: None,
        version: None,
        extended_l2: false,
        compression: None,
        backing_chain: Vec::new(),
        parallel_frames: None,
    }
}

/// Opens one layer of the chain; `seen` names every layer above it.
async fn open_layer(
    bytes: Arc<dyn Source>,
    format: SourceFormat,
    options: &OpenOptions,
    seen: &mut Vec<String>,
) -> Result<(Arc<dyn Source>, ImageInfo)> {
    let name = bytes.describe();
    let ctx = |e: Error| e.with_operation("open").with_endpoint(name.clone());
    let detected = match format.forced() {
        Some(Detected::Raw) => Detected::Raw,
        Some(Detected::Qcow2) => Detected::Qcow2,
        Some(forced) => {
            let found = sniff(bytes.as_ref()).await.map_err(ctx)?;
            if found != forced {
                return Err(ctx(Error::invalid_input(format!(
                    "--source-format {forced} was given but the image is not {forced} \
                     (its first bytes say {found}); pass the right format, or auto"
                ))));
            }
            forced
        }
        None => sniff(bytes.as_ref()).await.map_err(ctx)?,
    };
    match detected {
        Detected::Raw => {
            let info = raw_info(bytes.as_ref());
            Ok((bytes, info))
        }
        Detected::Qcow2 => Box::pin(open_qcow2(bytes, options, seen)).await,
        compressed => open_compressed(bytes, compressed, &options.stream)
            .await
            .map_err(ctx),
    }
}

/// A raw image compressed with gzip, xz or zstd.
async fn open_compressed(
    bytes: Arc<dyn Source>,
    kind: Detected,
    options: &StreamOptions,
) -> Result<(Arc<dyn Source>, ImageInfo)> {
    let file_size = bytes.size();
    let (image, layout) = open_stream(bytes, kind, options).await?;
    let info = ImageInfo {
        format: kind,
        virtual_size: layout.size,
        file_size,
        cluster_size: None,
        version: None,
        extended_l2: false,
        compression: None,
        backing_chain: Vec::new(),
        parallel_frames: layout.parallel_frames,
    };
    Ok((image, info))
}

async fn open_qcow2(
    bytes: Arc<dyn Source>,
    options: &OpenOptions,
    seen: &mut Vec<String>,
) -> Result<(Arc<dyn Source>, ImageInfo)> {
    let mut image = Qcow2Source::open(bytes.clone(), &options.qcow2).await?;
    let h = image.header().clone();
    let mut info = ImageInfo {
        format: Detected::Qcow2,
        virtual_size: h.size,
        file_size: bytes.size(),
        cluster_size: Some(h.cluster_size()),
        version: Some(h.version),
        extended_l2: h.extended_l2,
        compression: Some(h.compression.as_str()),
        backing_chain: Vec::new(),
        parallel_frames: None,
    };
    let Some(name) = image.backing_name().map(str::to_owned) else {
        return Ok((Arc::new(image), info));
    };
    let refuse = |message: String| {
        Error::new(ErrorKind::Unsupported, message)
            .with_operation("open backing file")
            .with_endpoint(bytes.describe())
    };
    let opener = match &options.backing {
        Backing::Refuse => {
            return Err(refuse(format!(
                "the image has a backing file ({name:?}); reading backing files must be \
                 allowed explicitly (--allow-backing)"
            )))
        }
        Backing::NameOnly => {
            info.backing_chain.push(name);
            return Ok((Arc::new(image), info));
        }
        Backing::Open(opener) => opener.clone(),
    };
    if seen.len() > MAX_BACKING_DEPTH {
        return Err(refuse(format!(
            "the backing chain is longer than {MAX_BACKING_DEPTH} images"
        )));
    }
    let backing_bytes = opener.open_backing(&bytes.describe(), &name).await?;
    let resolved = backing_bytes.describe();
    if seen.contains(&resolved) {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!("the backing chain loops back to {resolved}"),
        )
        .with_operation("open backing file")
        .with_endpoint(bytes.describe()));
    }
    seen.push(resolved);
    let format = match h.backing_format.as_deref() {
        Some("raw") => SourceFormat::Raw,
        Some("qcow2") => SourceFormat::Qcow2,
        Some(other) => return Err(refuse(format!("backing format {other:?} is not supported"))),
        None => SourceFormat::Auto,
    };
    let (backing, backing_info) = open_layer(backing_bytes, format, options, seen).await?;
    if backing_info.format.is_compressed_stream() {
        return Err(refuse(format!(
            "the backing file {name:?} is a {} stream: compressed backing files are not \
             supported",
            backing_info.format
        )));
    }
    info.backing_chain.push(name);
    info.backing_chain.extend(backing_info.backing_chain);
    image = image.with_backing(backing);
    Ok((Arc::new(image), info))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn backing_names_resolve_next_to_the_image() {
        assert_eq!(
            backing_path("/images/top.qcow2", "base.qcow2").unwrap(),
            PathBuf::from("/images/base.qcow2")
        );
        assert_eq!(
            backing_path("/images/top.qcow2", "/other/base.qcow2").unwrap(),
            PathBuf::from("/other/base.qcow2")
        );
        assert!(backing_path("/images/top.qcow2", "nbd://evil/export").is_err());
        assert!(backing_path("nbd://127.0.0.1/top", "base.qcow2").is_err());
    }
}
