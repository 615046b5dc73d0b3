//! The VMDK, OVA, VHD, VHDX and VDI readers against images made by qemu-img (and an OVA by
//! tar): every byte compared with the raw image they were made from, through a plain file
//! and through one that reads whole 4 KiB blocks only (as an iSCSI LUN does); zero
//! extents where the raw image has holes; and the error kinds of damaged images.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Error, ErrorKind, ExtentKind, IoBuf, Result, Source};
use ferry_formats::{open_image, Detected, OpenOptions, SourceFormat};

const MIB: u64 = 1 << 20;

/// A file as a byte source that takes only reads of whole `block`s.
#[derive(Debug)]
struct FileBytes {
    path: PathBuf,
    file: std::fs::File,
    block: u32,
}

impl FileBytes {
    fn open(path: &Path, block: u32) -> Arc<dyn Source> {
        Arc::new(Self {
            path: path.to_path_buf(),
            file: std::fs::File::open(path).unwrap(),
            block,
        })
    }
}

#[async_trait]
impl Source for FileBytes {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn size(&self) -> u64 {
        self.file.metadata().unwrap().len()
    }

    fn caps(&self) -> ferry_core::Caps {
        let mut caps = ferry_core::Caps::default();
        caps.block.minimum = self.block;
        caps
    }

    async fn read_at(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let block = u64::from(self.block);
        let end = offset + buf.len() as u64;
        if !offset.is_multiple_of(block) || !(end.is_multiple_of(block) || end == self.size()) {
            return Err(Error::invalid_input(format!(
                "read of {} bytes at {offset} is not on {block}-byte blocks",
                buf.len()
            )));
        }
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| Error::io("pread", e))?;
        Ok(buf)
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(FileBytes::open(&self.path, self.block))
    }
}

fn sh(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} did not start ({e}): apt-get install -y qemu-utils"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// An 8 MiB raw image: a run at the start, one across the 6 MiB mark, one at the end.
fn make_raw(dir: &Path) -> PathBuf {
    let raw = dir.join("src.raw");
    sh("qemu-img", &["create", "-q", "-f", "raw", s(&raw), "8M"]);
    for cmd in [
        "write -P 0x11 0 1M",
        "write -P 0x22 5632k 1M",
        "write -P 0x33 8000k 192k",
    ] {
        sh("qemu-io", &["-f", "raw", "-c", cmd, s(&raw)]);
    }
    raw
}

fn convert(dir: &Path, raw: &Path, format: &str, options: &str, name: &str) -> PathBuf {
    let out = dir.join(name);
    sh(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            format,
            "-o",
            options,
            s(raw),
            s(&out),
        ],
    );
    out
}

async fn open(
    path: &Path,
    block: u32,
    format: SourceFormat,
) -> Result<(Arc<dyn Source>, Detected)> {
    let options = OpenOptions {
        format,
        ..OpenOptions::default()
    };
    let (image, info) = open_image(FileBytes::open(path, block), &options).await?;
    Ok((image, info.format))
}

/// Reads the whole image in 1 MiB requests.
async fn read_all(image: &dyn Source) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < image.size() {
        let len = MIB.min(image.size() - offset);
        let buf = image.read_at(offset, IoBuf::new(len as usize)).await?;
        out.extend_from_slice(&buf);
        offset += len;
    }
    Ok(out)
}

const IMAGES: &[(&str, &str, &str, Detected)] = &[
    (
        "a.vmdk",
        "vmdk",
        "subformat=monolithicSparse",
        Detected::Vmdk,
    ),
    (
        "b.vmdk",
        "vmdk",
        "subformat=streamOptimized",
        Detected::Vmdk,
    ),
    (
        "c.vhd",
        "vpc",
        "subformat=dynamic,force_size=on",
        Detected::Vhd,
    ),
    (
        "d.vhd",
        "vpc",
        "subformat=fixed,force_size=on",
        Detected::Vhd,
    ),
    (
        "e.vhdx",
        "vhdx",
        "subformat=dynamic,block_size=1M",
        Detected::Vhdx,
    ),
    ("f.vdi", "vdi", "static=off", Detected::Vdi),
];

#[tokio::test]
async fn every_byte_matches_the_raw_image_and_holes_are_zero_extents() {
    let dir = tempfile::tempdir().unwrap();
    let raw = make_raw(dir.path());
    let expected = std::fs::read(&raw).unwrap();
    for &(name, qemu, options, format) in IMAGES {
        let image = convert(dir.path(), &raw, qemu, options, name);
        for block in [1, 4096] {
            let (img, found) = open(&image, block, SourceFormat::Auto).await.unwrap();
            assert_eq!(found, format, "{name}");
            assert_eq!(img.size(), 8 * MIB, "{name}");
            let bytes = read_all(img.as_ref()).await.unwrap();
            assert!(bytes == expected, "{name} (block {block}): bytes differ");
            // An odd read across block and grain boundaries.
            let odd = img.read_at(6 * MIB - 777, IoBuf::new(5000)).await.unwrap();
            let at = (6 * MIB - 777) as usize;
            assert_eq!(&odd[..], &expected[at..at + 5000], "{name}");
        }
        // The hole between the first two runs is a zero extent (2-4 MiB: a whole block
        // of every format, VHD's 2 MiB ones included); a fixed VHD is all data.
        if name == "d.vhd" {
            continue;
        }
        let (img, _) = open(&image, 1, SourceFormat::Auto).await.unwrap();
        let extents = img.extents(2 * MIB, 2 * MIB).await.unwrap();
        assert!(
            extents.iter().all(|e| e.kind == ExtentKind::Zero),
            "{name}: {extents:?}"
        );
    }
}

#[tokio::test]
async fn damaged_images_fail_with_the_right_kind() {
    let dir = tempfile::tempdir().unwrap();
    let raw = make_raw(dir.path());
    for &(name, qemu, options, format) in IMAGES {
        let image = convert(dir.path(), &raw, qemu, options, name);
        let mut bytes = std::fs::read(&image).unwrap();
        bytes.truncate(bytes.len() / 2);
        let cut = dir.path().join(format!("cut-{name}"));
        std::fs::write(&cut, bytes).unwrap();
        let forced: SourceFormat = format.as_str().parse().unwrap();
        let err = match open(&cut, 1, forced).await {
            Err(e) => e,
            Ok((img, _)) => read_all(img.as_ref()).await.unwrap_err(),
        };
        let kind = if name == "d.vhd" {
            ErrorKind::InvalidInput // no footer left: not a VHD at all
        } else {
            ErrorKind::Corrupt
        };
        assert_eq!(err.kind(), kind, "{name}: {err}");
    }
}
