//! VMDK images: a hosted sparse extent on its own (monolithicSparse, streamOptimized), or
//! a text descriptor naming extent files beside it (monolithicFlat, twoGbMaxExtentSparse,
//! twoGbMaxExtentFlat), read as one guest disk.
//!
//! Extent files are opened through the caller's [`BackingOpener`] (for file images: the
//! directory of the descriptor), and only by plain names ([`descriptor::check_extent_name`]).

pub mod descriptor;
pub mod sparse;

use std::sync::Arc;

use ferry_core::{Error, Result, Source};

use crate::composite::{ConcatSource, SliceSource, ZeroSource};
use crate::mapped::{corrupt, read_meta};
use crate::open::BackingOpener;
use descriptor::ExtentKind;

/// What was learnt opening a VMDK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmdkInfo {
    /// `createType`: monolithicSparse, streamOptimized, monolithicFlat, ...
    pub subformat: String,
    /// Grain size in bytes (sparse extents).
    pub grain_size: Option<u64>,
    /// Extent files (descriptor images).
    pub extents: Vec<String>,
}

/// Opens the VMDK in `file`; a descriptor's extent files through `opener`.
pub async fn open_vmdk(
    file: Arc<dyn Source>,
    opener: Option<&dyn BackingOpener>,
) -> Result<(Arc<dyn Source>, VmdkInfo)> {
    let head = read_meta(file.as_ref(), 0, file.size().min(512), "VMDK header").await?;
    if head.len() >= 4 && mapped_magic(&head) {
        let header = sparse::read_header(file.as_ref()).await?;
        let embedded = embedded_descriptor(file.as_ref(), &header).await?;
        let (image, header) = sparse::open_sparse(file, None).await?;
        let fallback = if header.compressed() {
            "streamOptimized"
        } else {
            "monolithicSparse"
        };
        return Ok((
            image,
            VmdkInfo {
                subformat: embedded.unwrap_or_else(|| fallback.to_owned()),
                grain_size: Some(header.grain_sectors * 512),
                extents: Vec::new(),
            },
        ));
    }
    if file.size() > descriptor::MAX_DESCRIPTOR {
        return Err(corrupt(format!(
            "the VMDK descriptor file is larger than {} bytes",
            descriptor::MAX_DESCRIPTOR
        )));
    }
    let text = read_meta(file.as_ref(), 0, file.size(), "VMDK descriptor").await?;
    let desc = descriptor::parse(&text)?;
    let Some(opener) = opener else {
        return Err(Error::unsupported(format!(
            "the VMDK descriptor ({}) names extent files; they are read only for file images",
            desc.create_type
        )));
    };
    let image_name = file.describe();
    let mut parts: Vec<Arc<dyn Source>> = Vec::with_capacity(desc.extents.len());
    let mut grain_size = None;
    let mut names = Vec::new();
    for extent in &desc.extents {
        let len = extent.sectors * 512;
        let Some(name) = &extent.file else {
            parts.push(Arc::new(ZeroSource(len)));
            continue;
        };
        let bytes = opener
            .open_backing(&image_name, name)
            .await
            .map_err(|e| e.with_operation("open VMDK extent"))?;
        names.push(name.clone());
        match extent.kind {
            ExtentKind::Flat => {
                let start = extent.offset * 512;
                if start.checked_add(len).is_none_or(|end| end > bytes.size()) {
                    return Err(corrupt(format!(
                        "the flat VMDK extent {name:?} holds {} bytes, less than the {} the \
                         descriptor gives it (from offset {start}): the extent is truncated",
                        bytes.size(),
                        len
                    )));
                }
                let describe = bytes.describe();
                parts.push(Arc::new(SliceSource::new(bytes, start, len, describe)));
            }
            ExtentKind::Sparse => {
                let (part, header) = sparse::open_sparse(bytes, Some(len)).await?;
                grain_size = Some(header.grain_sectors * 512);
                parts.push(part);
            }
            ExtentKind::Zero => unreachable!("zero extents have no file"),
        }
    }
    Ok((
        Arc::new(ConcatSource::new(parts, image_name)),
        VmdkInfo {
            subformat: desc.create_type,
            grain_size,
            extents: names,
        },
    ))
}

/// The createType of the descriptor a sparse extent embeds (bounded; a parent refused).
async fn embedded_descriptor(
    file: &dyn Source,
    header: &sparse::SparseHeader,
) -> Result<Option<String>> {
    if header.descriptor_offset == 0 || header.descriptor_size == 0 {
        return Ok(None);
    }
    let len = header
        .descriptor_size
        .saturating_mul(512)
        .min(descriptor::MAX_DESCRIPTOR);
    let at = header
        .descriptor_offset
        .checked_mul(512)
        .ok_or_else(|| corrupt("the VMDK descriptor offset overflows"))?;
    let text = read_meta(file, at, len, "VMDK embedded descriptor").await?;
    descriptor::embedded(&text)
}

fn mapped_magic(head: &[u8]) -> bool {
    u32::from_le_bytes([head[0], head[1], head[2], head[3]]) == sparse::MAGIC
}
