//! The qcow2 reader against real images made by qemu-img and qemu-io: every byte compared
//! with `qemu-img convert -O raw` of the same image, extents checked against the layout.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Error, ErrorKind, ExtentKind, IoBuf, Result, Source};
use ferry_formats::{
    open_image, Backing, BackingOpener, Detected, OpenOptions, Qcow2Options, SourceFormat,
    MAX_BACKING_DEPTH,
};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// A plain file as a byte source (the formats crate knows no endpoints), optionally one
/// that, like an iSCSI LUN, takes only reads starting on its blocks.
#[derive(Debug)]
struct FileBytes {
    path: PathBuf,
    file: std::fs::File,
    block: u32,
}

impl FileBytes {
    fn open(path: &Path) -> Arc<dyn Source> {
        Self::with_block(path, 1)
    }

    fn with_block(path: &Path, block: u32) -> Arc<dyn Source> {
        let file = std::fs::File::open(path).unwrap();
        Arc::new(Self {
            path: path.to_path_buf(),
            file,
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
        if !offset.is_multiple_of(u64::from(self.block)) {
            return Err(Error::invalid_input(format!("unaligned read at {offset}")));
        }
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| Error::io("pread", e))?;
        Ok(buf)
    }
    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(FileBytes::with_block(&self.path, self.block))
    }
}

/// Resolves backing names relative to the directory of the image naming them.
struct DirOpener;

#[async_trait]
impl BackingOpener for DirOpener {
    async fn open_backing(&self, image: &str, name: &str) -> Result<Arc<dyn Source>> {
        let dir = Path::new(image).parent().unwrap();
        let path = std::fs::canonicalize(dir.join(name))
            .map_err(|e| Error::io(format!("backing file {name}"), e))?;
        Ok(FileBytes::open(&path))
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

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Writes data, zero clusters (`write -z`) and holes into a fresh qcow2 image.
fn make_qcow2(path: &Path, size: u64, options: &str) {
    sh(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-o",
            options,
            path_str(path),
            &size.to_string(),
        ],
    );
    let io = |cmd: &str| sh("qemu-io", &["-f", "qcow2", "-c", cmd, path_str(path)]);
    io("write -P 0x11 0 3M");
    io("write -P 0x22 5M 1M");
    io("write -z 1M 1M");
    io("write -P 0x33 7M 12k");
    io("write -P 0x44 9437184 100k");
    io("write -z 9437184 4k");
}

fn to_raw(image: &Path) -> Vec<u8> {
    let raw = image.with_extension("raw");
    sh(
        "qemu-img",
        &["convert", "-O", "raw", path_str(image), path_str(&raw)],
    );
    std::fs::read(raw).unwrap()
}

/// Reads the whole image in reads of `chunk` bytes (odd sizes cross clusters).
async fn read_all(image: &dyn Source, chunk: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < image.size() {
        let n = chunk.min(image.size() - offset) as usize;
        let buf = image.read_at(offset, IoBuf::new(n)).await.unwrap();
        out.extend_from_slice(&buf);
        offset += n as u64;
    }
    out
}

/// The data extents of the whole image.
async fn data_bytes(image: &dyn Source) -> u64 {
    let (mut offset, mut data) = (0, 0);
    while offset < image.size() {
        let extents = image.extents(offset, image.size() - offset).await.unwrap();
        for e in extents {
            assert_eq!(e.offset, offset);
            if e.kind == ExtentKind::Data {
                data += e.len;
            }
            offset = e.end();
        }
    }
    data
}

async fn check_image(options: &str, expect_data: u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("img.qcow2");
    make_qcow2(&path, 12 * MIB + 512, options);
    let raw = to_raw(&path);
    let (image, info) = open_image(FileBytes::open(&path), &OpenOptions::default())
        .await
        .unwrap();
    assert_eq!(info.format, Detected::Qcow2);
    assert_eq!(image.size(), raw.len() as u64);
    for chunk in [MIB, 3 * 4096 + 17] {
        assert!(
            read_all(image.as_ref(), chunk).await == raw,
            "{options}: chunk {chunk}"
        );
    }
    let other = image.connect().await.unwrap();
    assert!(
        read_all(other.as_ref(), 8 * MIB).await == raw,
        "{options}: second handle"
    );
    assert_eq!(data_bytes(image.as_ref()).await, expect_data, "{options}");
}

/// Data of [`make_qcow2`] in 64 KiB clusters: 0..1M, 2M..3M, 5M..6M, one cluster at 7M
/// and two at 9M (the 4k zeroed there is part of a cluster, so it stays data).
const DATA_64K: u64 = 3 * MIB + 192 * KIB;

#[tokio::test]
async fn v3_with_holes_and_zero_clusters() {
    check_image("compat=1.1", DATA_64K).await;
}

#[tokio::test]
async fn v2_with_holes_and_zero_clusters() {
    // v2 has no zero flag: qemu-io's write -z deallocates (a hole, no backing).
    check_image("compat=0.10", DATA_64K).await;
}

#[tokio::test]
async fn cluster_sizes_512_4k_and_2m() {
    let data_4k = 3 * MIB - MIB + MIB + 12 * KIB + 100 * KIB - 4 * KIB;
    check_image("cluster_size=512", data_4k).await;
    check_image("cluster_size=4096", data_4k).await;
    // 2 MiB clusters: clusters 0 (0..2M), 1 (2M..4M: partly), 2 (4M..6M), 3 (6M..8M), 4 (8M..10M).
    check_image("cluster_size=2M", 5 * 2 * MIB).await;
}

#[tokio::test]
async fn extended_l2_subclusters() {
    // 64 KiB clusters, 2 KiB subclusters: the zeroed 4k is two zero subclusters.
    let data = 3 * MIB - MIB + MIB + 12 * KIB + 100 * KIB - 4 * KIB;
    check_image("extended_l2=on,cluster_size=64k", data).await;
}

async fn check_compressed(options: &[&str], compression: &str) {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.qcow2");
    make_qcow2(&plain, 12 * MIB, "compat=1.1");
    let packed = dir.path().join("packed.qcow2");
    let mut args = vec!["convert", "-c", "-O", "qcow2"];
    args.extend_from_slice(options);
    args.extend_from_slice(&[path_str(&plain), path_str(&packed)]);
    sh("qemu-img", &args);
    let raw = to_raw(&packed);
    let (image, info) = open_image(FileBytes::open(&packed), &OpenOptions::default())
        .await
        .unwrap();
    assert_eq!(info.compression, Some(compression));
    assert!(
        read_all(image.as_ref(), MIB + 4096).await == raw,
        "{compression}"
    );
    // A small cache (one table) reads the same.
    let small = OpenOptions {
        qcow2: Qcow2Options { l2_cache_bytes: 1 },
        ..OpenOptions::default()
    };
    let (image, _) = open_image(FileBytes::open(&packed), &small).await.unwrap();
    assert!(read_all(image.as_ref(), 5000).await == raw, "{compression}");
    // Over a byte source of 512-byte blocks, compressed clusters (at any byte offset)
    // are read from the block they start in.
    let (image, _) = open_image(FileBytes::with_block(&packed, 512), &OpenOptions::default())
        .await
        .unwrap();
    assert!(
        read_all(image.as_ref(), MIB).await == raw,
        "{compression}: 512-byte blocks"
    );
}

#[tokio::test]
async fn compressed_deflate_clusters() {
    check_compressed(&[], "zlib").await;
}

#[tokio::test]
async fn compressed_zstd_clusters() {
    check_compressed(&["-o", "compression_type=zstd"], "zstd").await;
}

fn backing_chain(dir: &Path) -> (PathBuf, Vec<u8>) {
    let base = dir.join("base.qcow2");
    make_qcow2(&base, 12 * MIB, "compat=1.1");
    let top = dir.join("top.qcow2");
    sh(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-b",
            "base.qcow2",
            "-F",
            "qcow2",
            path_str(&top),
        ],
    );
    sh(
        "qemu-io",
        &[
            "-f",
            "qcow2",
            "-c",
            "write -P 0x55 2560k 1M",
            "-c",
            "write -z 0 64k",
            path_str(&top),
        ],
    );
    let raw = to_raw(&top);
    (top, raw)
}

#[tokio::test]
async fn backing_chain_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let (top, raw) = backing_chain(dir.path());
    let options = OpenOptions {
        backing: Backing::Open(Arc::new(DirOpener)),
        ..OpenOptions::default()
    };
    let (image, info) = open_image(FileBytes::open(&top), &options).await.unwrap();
    assert_eq!(info.backing_chain, vec!["base.qcow2".to_string()]);
    assert!(read_all(image.as_ref(), MIB - 512).await == raw);
    // Data from either layer is data; the top's zero cluster hides the base's data.
    assert_eq!(
        data_bytes(image.as_ref()).await,
        DATA_64K + MIB - 64 * KIB - 512 * KIB
    );
}

#[tokio::test]
async fn backing_chain_refused_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let (top, _) = backing_chain(dir.path());
    let err = open_image(FileBytes::open(&top), &OpenOptions::default())
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(
        err.to_string().contains("base.qcow2") && err.to_string().contains("--allow-backing"),
        "{err}"
    );
    let names = OpenOptions {
        backing: Backing::NameOnly,
        ..OpenOptions::default()
    };
    let (_, info) = open_image(FileBytes::open(&top), &names).await.unwrap();
    assert_eq!(info.backing_chain, vec!["base.qcow2".to_string()]);
}

#[tokio::test]
async fn backing_loops_and_deep_chains_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let create = |name: &str, backing: &str| {
        sh(
            "qemu-img",
            &[
                "create",
                "-q",
                "-u",
                "-f",
                "qcow2",
                "-b",
                backing,
                "-F",
                "qcow2",
                path_str(&d.join(name)),
                "1M",
            ],
        );
    };
    create("a.qcow2", "b.qcow2");
    create("b.qcow2", "a.qcow2");
    let options = OpenOptions {
        backing: Backing::Open(Arc::new(DirOpener)),
        ..OpenOptions::default()
    };
    let a = std::fs::canonicalize(d.join("a.qcow2")).unwrap();
    let err = open_image(FileBytes::open(&a), &options)
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("loops"), "{err}");

    sh(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            path_str(&d.join("l0.qcow2")),
            "1M",
        ],
    );
    for i in 1..=MAX_BACKING_DEPTH + 1 {
        create(&format!("l{i}.qcow2"), &format!("l{}.qcow2", i - 1));
    }
    let ok = std::fs::canonicalize(d.join(format!("l{MAX_BACKING_DEPTH}.qcow2"))).unwrap();
    let (_, info) = open_image(FileBytes::open(&ok), &options).await.unwrap();
    assert_eq!(info.backing_chain.len(), MAX_BACKING_DEPTH);
    let deep = std::fs::canonicalize(d.join(format!("l{}.qcow2", MAX_BACKING_DEPTH + 1))).unwrap();
    let err = open_image(FileBytes::open(&deep), &options)
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("longer than 16"), "{err}");
}

#[tokio::test]
async fn encrypted_image_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("enc.qcow2");
    sh(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "--object",
            "secret,id=sec0,data=123456",
            "-o",
            "encrypt.format=luks,encrypt.key-secret=sec0",
            path_str(&path),
            "1M",
        ],
    );
    let err = open_image(FileBytes::open(&path), &OpenOptions::default())
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("encrypted"), "{err}");
}

#[tokio::test]
async fn raw_format_reads_a_qcow2_as_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("img.qcow2");
    make_qcow2(&path, 12 * MIB, "compat=1.1");
    let bytes = std::fs::read(&path).unwrap();
    let options = OpenOptions {
        format: SourceFormat::Raw,
        ..OpenOptions::default()
    };
    let (image, info) = open_image(FileBytes::open(&path), &options).await.unwrap();
    assert_eq!(info.format, Detected::Raw);
    assert!(read_all(image.as_ref(), MIB).await == bytes);
    // Insisting on qcow2 for a raw file is an error.
    let raw = dir.path().join("img.raw");
    std::fs::write(&raw, vec![0u8; 4096]).unwrap();
    let options = OpenOptions {
        format: SourceFormat::Qcow2,
        ..OpenOptions::default()
    };
    let err = open_image(FileBytes::open(&raw), &options)
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
}

#[tokio::test]
async fn compressed_magic_without_a_stream_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    for (name, magic, kind) in [
        (
            "a.gz",
            &[0x1f, 0x8b, 8, 0, 0, 0][..],
            // Its size is learned at its end, but it does not even start to decompress.
            ErrorKind::Corrupt,
        ),
        (
            "a.xz",
            &[0xfd, 0x37, 0x7a, 0x58, 0x5a, 0][..],
            ErrorKind::Corrupt,
        ),
        (
            "a.zst",
            &[0x28, 0xb5, 0x2f, 0xfd, 0, 0][..],
            ErrorKind::Corrupt,
        ),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, magic).unwrap();
        let err = open_image(FileBytes::open(&path), &OpenOptions::default())
            .await
            .err()
            .unwrap();
        assert_eq!(err.kind(), kind, "{name}: {err}");
        let format = name.rsplit('.').next().unwrap();
        assert!(err.to_string().contains(format), "{err}");
    }
}

/// Corrupts an L2 entry of a real image so that it points past the end of the file.
#[tokio::test]
async fn l2_entry_past_the_end_is_corrupt_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("img.qcow2");
    make_qcow2(&path, 12 * MIB, "compat=1.1");
    let (image, _) = open_image(FileBytes::open(&path), &OpenOptions::default())
        .await
        .unwrap();
    let good = read_all(image.as_ref(), MIB).await;
    drop(image);
    // The first L1 entry names the L2 table; its first entry maps guest cluster 0.
    let bytes = std::fs::read(&path).unwrap();
    let l1 = u64::from_be_bytes(bytes[40..48].try_into().unwrap()) as usize;
    let l2 = (u64::from_be_bytes(bytes[l1..l1 + 8].try_into().unwrap()) & 0x00ff_ffff_ffff_fe00)
        as usize;
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&((1u64 << 63) | (1u64 << 40)).to_be_bytes(), l2 as u64)
        .unwrap();
    let (image, _) = open_image(FileBytes::open(&path), &OpenOptions::default())
        .await
        .unwrap();
    let err = image.read_at(0, IoBuf::new(4096)).await.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    assert!(err.to_string().contains("past the end"), "{err}");
    // Ranges the corrupt entry does not map still read.
    let buf = image
        .read_at(5 * MIB, IoBuf::new(MIB as usize))
        .await
        .unwrap();
    assert!(buf[..] == good[5 * MIB as usize..6 * MIB as usize]);
    // An L1 entry past the end too.
    file.write_all_at(&(1u64 << 40).to_be_bytes(), l1 as u64)
        .unwrap();
    let (image, _) = open_image(FileBytes::open(&path), &OpenOptions::default())
        .await
        .unwrap();
    let err = image.extents(0, MIB).await.err().unwrap();
    assert!(err.to_string().contains("past the end"), "{err}");
}
