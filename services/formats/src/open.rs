//! [`open_image`]: from the bytes an endpoint gives to the image they hold.
//!
//! Detects (or takes the caller's word for) the format, opens qcow2, VMDK, OVA, VHD,
//! VHDX, VDI or a compressed stream over the bytes, opens a VMDK descriptor's extent
//! files through the caller's [`ExtentFiles`] opener, and follows a backing chain (a
//! qcow2 backing file, a VHD or VHDX differencing image's parent) only through the
//! caller's [`BackingOpener`]: a backing name comes from the image, so it is untrusted;
//! the opener decides how (and whether) a name resolves, this module bounds the chain's
//! depth, refuses loops, and checks that a differencing image's parent is the image it
//! was made from.

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Error, ErrorKind, Result, Source, UNKNOWN_SIZE};

use crate::detect::{detect, detect_tail, Detected, SourceFormat, MAGIC_LEN};
use crate::ova::OvaDisk;
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

/// How a VMDK descriptor's extent files are opened: through this opener (which must
/// resolve a plain name beside the descriptor), or not at all.
#[derive(Clone, Default)]
pub struct ExtentFiles(pub Option<Arc<dyn BackingOpener>>);

impl std::fmt::Debug for ExtentFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Open" } else { "Refuse" })
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
    /// The disk of an OVA to read (numbered from 0); `None`: the only one.
    pub disk: Option<usize>,
    /// Opens a VMDK descriptor's extent files.
    pub extents: ExtentFiles,
    /// The bytes are a container image layer (a registry's containerDisk): a tar holding
    /// the disk under `/disk/`, compressed as this says (`Raw`: a plain tar, `Gzip`,
    /// `Zstd`). None: the bytes are the image itself.
    pub container_layer: Option<Detected>,
}

/// What `ferry info` reports about an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    pub format: Detected,
    /// The image's size; [`UNKNOWN_SIZE`] for a stream whose size shows only at its end
    /// (see [`ImageInfo::size_known`]).
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
    /// The variant of the format: a VMDK's createType (monolithicSparse,
    /// streamOptimized, ...), VHD's fixed or dynamic, VDI's static or dynamic; for an OVA,
    /// the chosen disk's format and variant.
    pub subformat: Option<String>,
    /// An OVA's disks, in archive order.
    pub disks: Vec<OvaDisk>,
    /// The OVA disk read (an index into `disks`).
    pub disk: Option<usize>,
    /// For a container layer: the disk file read in it (`disk/fedora.qcow2`).
    pub layer_file: Option<String>,
    /// For a container layer: how the layer is compressed (none, gzip, zstd).
    pub layer_compression: Option<&'static str>,
}

impl ImageInfo {
    /// Whether the image's size is known before it is read.
    pub fn size_known(&self) -> bool {
        self.virtual_size != UNKNOWN_SIZE
    }

    /// What is known of any image: its format and sizes.
    pub fn plain(format: Detected, virtual_size: u64, file_size: u64) -> Self {
        Self {
            format,
            virtual_size,
            file_size,
            cluster_size: None,
            version: None,
            extended_l2: false,
            compression: None,
            backing_chain: Vec::new(),
            parallel_frames: None,
            subformat: None,
            disks: Vec::new(),
            disk: None,
            layer_file: None,
            layer_compression: None,
        }
    }
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
    if let Some(compression) = options.container_layer {
        return crate::container::open_container_layer(bytes, compression, options, &mut seen)
            .await;
    }
    open_layer(bytes, options.format, options, &mut seen).await
}

async fn sniff(bytes: &dyn Source) -> Result<Detected> {
    if !bytes.size_known() {
        // A stream whose size shows at its end (an HTTP answer without Content-Length):
        // its first bytes, however few there are.
        let head = bytes
            .read_some(0, ferry_core::IoBuf::new(MAGIC_LEN))
            .await?;
        return Ok(detect(&head));
    }
    let size = bytes.size();
    let len = size.min(MAGIC_LEN as u64) as usize;
    if len == 0 {
        return Ok(Detected::Raw);
    }
    let head = crate::qcow2::read_bytes(bytes, 0, len as u64).await?;
    let found = detect(&head);
    // A fixed VHD has only a footer; a compressed stream cannot be read from its end.
    if found == Detected::Raw && size >= 1024 && !bytes.caps().sequential_read {
        let tail = crate::qcow2::read_bytes(bytes, size - 512, 512).await?;
        if detect_tail(&tail) {
            return Ok(Detected::Vhd);
        }
    }
    Ok(found)
}

fn raw_info(bytes: &dyn Source) -> ImageInfo {
    ImageInfo::plain(Detected::Raw, bytes.size(), bytes.size())
}

/// Opens one layer of the chain; `seen` names every layer above it.
pub(crate) async fn open_layer(
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
    if !bytes.size_known() && detected != Detected::Raw && !detected.is_compressed_stream() {
        return Err(ctx(Error::unsupported(format!(
            "the image is {detected}, which is read by its tables, but its size is not known \
             (the server sends no Content-Length and no ranges): serve it from a server that \
             does, or copy it to a file first"
        ))));
    }
    match detected {
        Detected::Raw => {
            let info = raw_info(bytes.as_ref());
            Ok((bytes, info))
        }
        Detected::Qcow2 => Box::pin(open_qcow2(bytes, options, seen)).await,
        Detected::Vhd | Detected::Vhdx => {
            Box::pin(open_differencing_capable(bytes, detected, options, seen))
                .await
                .map_err(ctx)
        }
        Detected::Vmdk | Detected::Vdi => {
            open_vm_format(bytes, detected, options.extents.0.as_deref())
                .await
                .map_err(ctx)
        }
        Detected::Ova => Box::pin(open_ova(bytes, options, seen)).await.map_err(ctx),
        compressed => open_compressed(bytes, compressed, &options.stream)
            .await
            .map_err(ctx),
    }
}

/// A VHD or VHDX image; a differencing one over its parent, when `options.backing`
/// allows it.
async fn open_differencing_capable(
    bytes: Arc<dyn Source>,
    kind: Detected,
    options: &OpenOptions,
    seen: &mut Vec<String>,
) -> Result<(Arc<dyn Source>, ImageInfo)> {
    let file_size = bytes.size();
    let (opened, subformat, cluster_size) = if kind == Detected::Vhd {
        let (opened, info) = crate::vhd::open_vhd(bytes.clone()).await?;
        let opened = match opened {
            crate::diff::Opened::Image(image) => Ok(image),
            crate::diff::Opened::Differencing(diff) => Err(diff),
        };
        (opened, info.footer.subformat(), info.block_size)
    } else {
        let (opened, layout) = crate::vhdx::open_vhdx(bytes.clone()).await?;
        let opened = match opened {
            crate::diff::Opened::Image(image) => Ok(image),
            crate::diff::Opened::Differencing(diff) => Err(diff),
        };
        let subformat = if layout.has_parent {
            "differencing"
        } else {
            layout.subformat
        };
        (opened, subformat, Some(layout.block_size))
    };
    let (image, chain) = match opened {
        Ok(image) => (image, Vec::new()),
        Err(diff) => Box::pin(open_parent_of(&bytes, diff, kind, options, seen)).await?,
    };
    let mut info = ImageInfo::plain(kind, image.size(), file_size);
    info.cluster_size = cluster_size;
    info.subformat = Some(subformat.into());
    info.backing_chain = chain;
    Ok((image, info))
}

/// A differencing image over its parent: the parent named by a plain file name beside
/// it, opened through `options.backing`, its identity checked; and the chain's names.
async fn open_parent_of(
    bytes: &Arc<dyn Source>,
    diff: crate::diff::Differencing,
    kind: Detected,
    options: &OpenOptions,
    seen: &mut Vec<String>,
) -> Result<(Arc<dyn Source>, Vec<String>)> {
    let format = kind.as_str().to_uppercase();
    let shown = diff.parent.display_name();
    let what = format!(
        "the image is a differencing {format} whose parent is {}",
        crate::diff::quote(&shown)
    );
    let name = crate::diff::plain_parent_name(&diff.parent, &format);
    // The name recorded without --allow-backing: the one that would be opened.
    let recorded = name.as_ref().map_or(shown, Clone::clone);
    let Some((parent_bytes, name)) =
        follow_backing(bytes.as_ref(), &what, name, options, seen).await?
    else {
        return Ok((diff.alone(), vec![recorded]));
    };
    check_identity(parent_bytes.as_ref(), &diff.parent.identity, &name, &format)
        .await
        .map_err(|e| {
            e.with_operation("open parent")
                .with_endpoint(bytes.describe())
        })?;
    let (parent, parent_info) = open_layer(parent_bytes, SourceFormat::Auto, options, seen).await?;
    if parent_info.format != kind {
        return Err(Error::invalid_input(format!(
            "the parent {name:?} of the differencing {format} opens as {}, not {format}",
            parent_info.format
        ))
        .with_operation("open parent")
        .with_endpoint(bytes.describe()));
    }
    let mut chain = vec![name];
    chain.extend(parent_info.backing_chain);
    Ok((diff.over(parent), chain))
}

/// Checks that `parent` is the image a differencing child was made from.
async fn check_identity(
    parent: &dyn Source,
    identity: &crate::diff::Identity,
    name: &str,
    format: &str,
) -> Result<()> {
    use crate::diff::{format_guid, Identity};
    let context = |e: Error| {
        Error::new(
            e.kind(),
            format!(
                "the parent {name:?} of the differencing {format} is not a {format} image: {e}"
            ),
        )
    };
    let (found, wanted) = match identity {
        Identity::VhdUniqueId(want) => {
            let footer = crate::vhd::read_footer(parent).await.map_err(context)?;
            if footer.unique_id == *want {
                return Ok(());
            }
            (footer.unique_id, vec![*want])
        }
        Identity::VhdxDataWriteGuid(want) => {
            let header = crate::vhdx::header::read_header(parent)
                .await
                .map_err(context)?;
            if want.contains(&header.data_write_guid) {
                return Ok(());
            }
            (header.data_write_guid, want.clone())
        }
    };
    let wanted: Vec<String> = wanted.iter().map(format_guid).collect();
    Err(Error::invalid_input(format!(
        "the parent {name:?} is not the image this differencing {format} was made from: the \
         child expects id {}, the parent has {}; the parent was replaced or written to since \
         (find the right parent, or merge the chain where it was made)",
        wanted.join(" or "),
        format_guid(&found)
    )))
}

/// A VMDK or VDI image.
async fn open_vm_format(
    bytes: Arc<dyn Source>,
    kind: Detected,
    extents: Option<&dyn BackingOpener>,
) -> Result<(Arc<dyn Source>, ImageInfo)> {
    let file_size = bytes.size();
    let (image, subformat, cluster_size): (Arc<dyn Source>, String, Option<u64>) = match kind {
        Detected::Vmdk => {
            let (image, info) = crate::vmdk::open_vmdk(bytes, extents).await?;
            (image, info.subformat, info.grain_size)
        }
        _ => {
            let (image, header) = crate::vdi::open_vdi(bytes).await?;
            (image, header.subformat().into(), Some(header.block_size))
        }
    };
    let mut info = ImageInfo::plain(kind, image.size(), file_size);
    info.cluster_size = cluster_size;
    info.subformat = (!subformat.is_empty()).then_some(subformat);
    Ok((image, info))
}

/// The chosen disk of an OVA, opened as the image it is.
async fn open_ova(
    bytes: Arc<dyn Source>,
    options: &OpenOptions,
    seen: &mut Vec<String>,
) -> Result<(Arc<dyn Source>, ImageInfo)> {
    let file_size = bytes.size();
    let (disk, disks, index) = crate::ova::open_ova(bytes, options.disk).await?;
    // A disk inside the archive has no directory of its own: a descriptor VMDK's extents
    // cannot be resolved, and an OVA inside an OVA is refused.
    let inner_options = OpenOptions {
        extents: ExtentFiles(None),
        ..options.clone()
    };
    let (image, inner) = open_layer(disk, SourceFormat::Auto, &inner_options, seen).await?;
    if matches!(inner.format, Detected::Ova) || inner.format.is_compressed_stream() {
        return Err(Error::unsupported(format!(
            "the OVA's disk {:?} is a {}, which is not read inside an OVA",
            disks[index].name, inner.format
        )));
    }
    let mut info = inner.clone();
    info.format = Detected::Ova;
    info.file_size = file_size;
    info.subformat = Some(match inner.subformat {
        Some(sub) => format!("{} {sub}", inner.format),
        None => inner.format.to_string(),
    });
    info.disks = disks;
    info.disk = Some(index);
    Ok((image, info))
}

/// A raw image compressed with gzip, xz or zstd.
async fn open_compressed(
    bytes: Arc<dyn Source>,
    kind: Detected,
    options: &StreamOptions,
) -> Result<(Arc<dyn Source>, ImageInfo)> {
    let file_size = bytes.size();
    let (image, layout) = open_stream(bytes, kind, options).await?;
    let mut info = ImageInfo::plain(kind, layout.size.unwrap_or(UNKNOWN_SIZE), file_size);
    info.parallel_frames = layout.parallel_frames;
    Ok((image, info))
}

async fn open_qcow2(
    bytes: Arc<dyn Source>,
    options: &OpenOptions,
    seen: &mut Vec<String>,
) -> Result<(Arc<dyn Source>, ImageInfo)> {
    let mut image = Qcow2Source::open(bytes.clone(), &options.qcow2).await?;
    let h = image.header().clone();
    let mut info = ImageInfo::plain(Detected::Qcow2, h.size, bytes.size());
    info.cluster_size = Some(h.cluster_size());
    info.version = Some(h.version);
    info.extended_l2 = h.extended_l2;
    info.compression = Some(h.compression.as_str());
    let Some(name) = image.backing_name().map(str::to_owned) else {
        return Ok((Arc::new(image), info));
    };
    let refuse = |message: String| {
        Error::new(ErrorKind::Unsupported, message)
            .with_operation("open backing file")
            .with_endpoint(bytes.describe())
    };
    let what = format!("the image has a backing file ({name:?})");
    let followed = follow_backing(bytes.as_ref(), &what, Ok(name.clone()), options, seen).await?;
    let Some((backing_bytes, _)) = followed else {
        info.backing_chain.push(name);
        return Ok((Arc::new(image), info));
    };
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

/// Opens the bytes of the backing file (or parent) `name` of `image`, as
/// `options.backing` says: refused (naming it: `what`), `None` when only its name is
/// recorded, or its bytes and the name opened. Bounds the chain's depth and refuses a
/// loop; `seen` gains the backing file.
async fn follow_backing(
    image: &dyn Source,
    what: &str,
    name: Result<String>,
    options: &OpenOptions,
    seen: &mut Vec<String>,
) -> Result<Option<(Arc<dyn Source>, String)>> {
    let fail = |kind: ErrorKind, message: String| {
        Error::new(kind, message)
            .with_operation("open backing file")
            .with_endpoint(image.describe())
    };
    let opener = match &options.backing {
        Backing::Refuse => {
            return Err(fail(
                ErrorKind::Unsupported,
                format!(
                    "{what}; reading backing files must be allowed explicitly \
                     (--allow-backing)"
                ),
            ))
        }
        Backing::NameOnly => return Ok(None),
        Backing::Open(opener) => opener.clone(),
    };
    let name = name.map_err(|e| fail(e.kind(), e.to_string()))?;
    if seen.len() > MAX_BACKING_DEPTH {
        return Err(fail(
            ErrorKind::Unsupported,
            format!("the backing chain is longer than {MAX_BACKING_DEPTH} images"),
        ));
    }
    let backing = opener.open_backing(&image.describe(), &name).await?;
    let resolved = backing.describe();
    if seen.contains(&resolved) {
        return Err(fail(
            ErrorKind::Corrupt,
            format!("the backing chain loops back to {resolved}"),
        ));
    }
    seen.push(resolved);
    Ok(Some((backing, name)))
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
