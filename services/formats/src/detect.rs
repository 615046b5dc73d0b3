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
    Vmdk,
    Ova,
    Vhd,
    Vhdx,
    Vdi,
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
            Self::Vmdk => "vmdk",
            Self::Ova => "ova",
            Self::Vhd => "vhd",
            Self::Vhdx => "vhdx",
            Self::Vdi => "vdi",
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

/// The number of leading bytes [`detect`] looks at (a tar's magic is at 257, VDI's at 64).
pub const MAGIC_LEN: usize = 512;

/// Names the format of an image from its first bytes (at least [`MAGIC_LEN`] when the
/// image has that many); anything unrecognised is raw. A fixed VHD has no header: see
/// [`detect_tail`].
pub fn detect(head: &[u8]) -> Detected {
    if head.starts_with(b"QFI\xfb") {
        Detected::Qcow2
    } else if head.starts_with(b"KDMV") || crate::vmdk::descriptor::looks_like_descriptor(head) {
        Detected::Vmdk
    } else if head.starts_with(crate::vhdx::header::FILE_SIGNATURE) {
        Detected::Vhdx
    } else if head.starts_with(crate::vhd::FOOTER_COOKIE) {
        Detected::Vhd
    } else if head.len() >= 0x44 && head[0x40..0x44] == crate::vdi::SIGNATURE.to_le_bytes() {
        Detected::Vdi
    } else if crate::tar::looks_like_ova(head) {
        Detected::Ova
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

/// Whether the last 512 bytes of an image are a VHD footer (a fixed VHD).
pub fn detect_tail(tail: &[u8]) -> bool {
    tail.starts_with(crate::vhd::FOOTER_COOKIE)
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
    /// Insist on VMDK (sparse, streamOptimized, or a descriptor with its extents).
    Vmdk,
    /// Insist on an OVA (a tar with an OVF and disks).
    Ova,
    /// Insist on VHD (fixed or dynamic).
    Vhd,
    /// Insist on VHDX.
    Vhdx,
    /// Insist on VDI.
    Vdi,
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
            Self::Vmdk => Some(Detected::Vmdk),
            Self::Ova => Some(Detected::Ova),
            Self::Vhd => Some(Detected::Vhd),
            Self::Vhdx => Some(Detected::Vhdx),
            Self::Vdi => Some(Detected::Vdi),
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
            "vmdk" => Ok(Self::Vmdk),
            "ova" => Ok(Self::Ova),
            "vhd" | "vpc" => Ok(Self::Vhd),
            "vhdx" => Ok(Self::Vhdx),
            "vdi" => Ok(Self::Vdi),
            other => Err(format!(
                "unknown format {other:?}: expected auto, raw, qcow2, gz, xz, zst, vmdk, ova, \
                 vhd, vhdx or vdi"
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
    fn detects_the_virtual_machine_formats() {
        assert_eq!(detect(b"KDMV\x01\0\0\0"), Detected::Vmdk);
        assert_eq!(
            detect(b"# Disk DescriptorFile\nversion=1\n"),
            Detected::Vmdk
        );
        assert_eq!(detect(b"vhdxfile\0\0"), Detected::Vhdx);
        assert_eq!(detect(b"conectix\0\0"), Detected::Vhd);
        let mut vdi = vec![0u8; 512];
        vdi[0x40..0x44].copy_from_slice(&[0x7f, 0x10, 0xda, 0xbe]);
        assert_eq!(detect(&vdi), Detected::Vdi);
        let mut tar = vec![0u8; 512];
        tar[257..263].copy_from_slice(b"ustar\0");
        assert_eq!(
            detect(&tar),
            Detected::Raw,
            "a tar without an OVF first stays raw"
        );
        tar[..6].copy_from_slice(b"vm.ovf");
        assert_eq!(detect(&tar), Detected::Ova);
        assert!(detect_tail(b"conectix\0\0\0\x02"));
        assert!(!detect_tail(b"connectix"));
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
        assert!("vmdk4".parse::<SourceFormat>().is_err());
        assert_eq!("vpc".parse(), Ok(SourceFormat::Vhd));
        for name in [
            "auto", "raw", "qcow2", "gz", "xz", "zst", "vmdk", "ova", "vhd", "vhdx", "vdi",
        ] {
            assert_eq!(name.parse::<SourceFormat>().unwrap().as_str(), name);
        }
    }
}
