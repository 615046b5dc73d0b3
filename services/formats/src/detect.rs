//! Format detection by magic, as `qemu-img info` and CDI do it.

use std::fmt;
use std::str::FromStr;

/// What the first bytes of an image say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detected {
    Raw,
    Qcow2,
    Gzip,
    Xz,
    Zstd,
}

impl Detected {
    /// The name `ferry info` prints, as qemu-img names formats.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Raw => "raw",
            Self::Qcow2 => "qcow2",
            Self::Gzip => "gz",
            Self::Xz => "xz",
            Self::Zstd => "zst",
        }
    }

    /// Whether this is a compressed stream (of a raw image, usually).
    pub fn is_compressed_stream(self) -> bool {
        matches!(self, Self::Gzip | Self::Xz | Self::Zstd)
    }
}

impl fmt::Display for Detected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The number of leading bytes [`detect`] looks at.
pub const MAGIC_LEN: usize = 6;

/// Names the format of an image from its first bytes (at least [`MAGIC_LEN`] when the
/// image has that many); anything unrecognised is raw.
pub fn detect(head: &[u8]) -> Detected {
    if head.starts_with(b"QFI\xfb") {
        Detected::Qcow2
    } else if head.starts_with(&[0x1f, 0x8b]) {
        Detected::Gzip
    } else if head.starts_with(&[0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00]) {
        Detected::Xz
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) || is_skippable_frame(head) {
        Detected::Zstd
    } else {
        Detected::Raw
    }
}

/// A zstd skippable frame (pzstd's output starts with one).
fn is_skippable_frame(head: &[u8]) -> bool {
    head.len() >= 4 && head[0] & 0xf0 == 0x50 && head[1..4] == [0x2a, 0x4d, 0x18]
}

/// The format the caller wants the source read as (`--source-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SourceFormat {
    /// Detect by magic.
    #[default]
    Auto,
    /// Read the bytes as they are, whatever they look like.
    Raw,
    /// Insist on qcow2 (an image that is not one is an error).
    Qcow2,
    /// Insist on a gzip stream of a raw image.
    Gzip,
    /// Insist on an xz stream of a raw image.
    Xz,
    /// Insist on a zstd stream of a raw image.
    Zstd,
}

impl SourceFormat {
    /// What the format insists on, or None for auto.
    pub fn forced(self) -> Option<Detected> {
        match self {
            Self::Auto => None,
            Self::Raw => Some(Detected::Raw),
            Self::Qcow2 => Some(Detected::Qcow2),
            Self::Gzip => Some(Detected::Gzip),
            Self::Xz => Some(Detected::Xz),
            Self::Zstd => Some(Detected::Zstd),
        }
    }

    /// The name `--source-format` takes.
    pub fn as_str(self) -> &'static str {
        self.forced().map_or("auto", Detected::as_str)
    }
}

impl FromStr for SourceFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "raw" => Ok(Self::Raw),
            "qcow2" => Ok(Self::Qcow2),
            "gz" | "gzip" => Ok(Self::Gzip),
            "xz" => Ok(Self::Xz),
            "zst" | "zstd" => Ok(Self::Zstd),
            other => Err(format!(
                "unknown format {other:?}: expected auto, raw, qcow2, gz, xz or zst"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_each_magic_and_raw_otherwise() {
        assert_eq!(detect(b"QFI\xfb\0\0\0\x03"), Detected::Qcow2);
        assert_eq!(detect(&[0x1f, 0x8b, 8, 0, 0, 0]), Detected::Gzip);
        assert_eq!(detect(&[0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00]), Detected::Xz);
        assert_eq!(detect(&[0x28, 0xb5, 0x2f, 0xfd, 0, 0]), Detected::Zstd);
        assert_eq!(detect(&[0x50, 0x2a, 0x4d, 0x18, 4, 0]), Detected::Zstd);
        assert_eq!(detect(&[0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x01]), Detected::Raw);
        assert_eq!(detect(b"QFI"), Detected::Raw);
        assert_eq!(detect(b""), Detected::Raw);
        assert!(Detected::Zstd.is_compressed_stream());
        assert!(!Detected::Qcow2.is_compressed_stream());
    }

    #[test]
    fn parses_source_format() {
        assert_eq!("auto".parse(), Ok(SourceFormat::Auto));
        assert_eq!("raw".parse(), Ok(SourceFormat::Raw));
        assert_eq!("qcow2".parse(), Ok(SourceFormat::Qcow2));
        assert_eq!("gz".parse(), Ok(SourceFormat::Gzip));
        assert_eq!("gzip".parse(), Ok(SourceFormat::Gzip));
        assert_eq!("xz".parse(), Ok(SourceFormat::Xz));
        assert_eq!("zst".parse(), Ok(SourceFormat::Zstd));
        assert!("vmdk".parse::<SourceFormat>().is_err());
        for name in ["auto", "raw", "qcow2", "gz", "xz", "zst"] {
            assert_eq!(name.parse::<SourceFormat>().unwrap().as_str(), name);
        }
    }
}
