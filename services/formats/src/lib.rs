//! ferry-formats: image formats read over any byte source.
//!
//! Endpoints give bytes (a file, an NBD export, an S3 object, ...); an image in those
//! bytes may be raw, qcow2, or a raw image compressed with gzip, xz or zstd. This crate
//! detects which ([`detect`]) and turns a byte [`ferry_core::Source`] into the
//! guest-visible image ([`open_image`]), so the engine copies a qcow2 over HTTP or a
//! .raw.xz from S3 exactly as it copies a raw file, never knowing the difference.

#![forbid(unsafe_code)]

mod detect;
mod open;
pub mod qcow2;
pub mod stream;

pub use detect::{detect, Detected, SourceFormat};
pub use open::{
    backing_path, open_image, Backing, BackingOpener, ImageInfo, OpenOptions, MAX_BACKING_DEPTH,
};
pub use qcow2::{Qcow2Options, Qcow2Source};
pub use stream::{open_stream, FramesSource, StreamLayout, StreamOptions, StreamSource};
