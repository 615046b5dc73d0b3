//! ferry-formats: image formats read over any byte source.
//!
//! Endpoints give bytes (a file, an NBD export, an S3 object, ...); an image in those
//! bytes may be raw, qcow2, VMDK (or an OVA holding one), VHD, VHDX, VDI, or a raw image
//! compressed with gzip, xz or zstd. This crate
//! detects which ([`detect`]) and turns a byte [`ferry_core::Source`] into the
//! guest-visible image ([`open_image`]), so the engine copies a qcow2 over HTTP or a
//! .raw.xz from S3 exactly as it copies a raw file, never knowing the difference.

#![forbid(unsafe_code)]

mod composite;
pub mod container;
mod detect;
pub mod diff;
mod mapped;
mod open;
pub mod ova;
pub mod qcow2;
pub mod stream;
pub mod tar;
pub mod vdi;
pub mod vhd;
pub mod vhdx;
pub mod vmdk;

pub use detect::{detect, detect_tail, Detected, SourceFormat};
pub use open::{
    backing_path, open_image, Backing, BackingOpener, ExtentFiles, ImageInfo, OpenOptions,
    MAX_BACKING_DEPTH,
};
pub use ova::OvaDisk;
pub use qcow2::{Qcow2Options, Qcow2Source};
pub use stream::{open_stream, FramesSource, StreamLayout, StreamOptions, StreamSource};

/// The capabilities of a source that reads any byte range of `inner` (widening reads off
/// its blocks onto them itself), with or without extents of its own.
pub(crate) fn widened_caps(inner: ferry_core::Caps, extents: bool) -> ferry_core::Caps {
    ferry_core::Caps {
        extents,
        block: ferry_core::BlockSizes {
            minimum: 1,
            ..inner.block
        },
        ..inner
    }
}
