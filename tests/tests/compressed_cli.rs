//! Compressed raw images (.gz, .xz, .zst) end to end through the binary, made by the real
//! tools (gzip, xz, zstd, pzstd): every copy compared with the original by `qemu-img
//! compare` and checked for sparseness; concatenated members, streams and frames; zstd
//! frames read in parallel (sizes recorded, or pzstd's measured by a prescan); the size
//! options; `ferry info`; and the clear failures
//! (truncated and corrupt streams, a wrong `--source-format`, a wrong size, qcow2 inside a
//! stream). Streams whose size is learned at their end: `stream_sizes.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;

use ferry_tests::check::{assert_allocated_about, require_tool};
use ferry_tests::{ferry, scratch_dir};

const MIB: u64 = 1 << 20;
const SIZE: u64 = 64 * MIB;
/// The non-zero bytes [`make_raw`] writes.
const DATA: u64 = 3 * MIB + MIB + 100 * 1024;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs a tool from Debian package `package`; returns its stdout.
fn sh(package: &str, program: &str, args: &[&str]) -> Vec<u8> {
    require_tool(program, package);
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A 64 MiB sparse raw image: data at 0 (3 MiB), 5 MiB (1 MiB) and 60 MiB (100 KiB), 2 MiB
/// of zeroes written as data at 10 MiB, holes elsewhere.
fn make_raw(path: &Path) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::File::create(path).unwrap();
    f.set_len(SIZE).unwrap();
    let run = |seed: u32, len: u64| -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8 | 1)
            .collect()
    };
    for (offset, len, seed) in [
        (0, 3 * MIB, 1),
        (5 * MIB, MIB, 2),
        (60 * MIB, 100 * 1024, 3),
    ] {
        f.seek(SeekFrom::Start(offset)).unwrap();
        f.write_all(&run(seed, len)).unwrap();
    }
    // Zeroes written as data: the copy must still leave them as a hole.
    f.seek(SeekFrom::Start(10 * MIB)).unwrap();
    f.write_all(&vec![0u8; 2 * MIB as usize]).unwrap();
}

fn compare(a: &Path, b: &Path) {
    sh(
        "qemu-utils",
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", s(a), s(b)],
    );
}

/// Compresses `raw` with `program args` into `out` (the tool writes to stdout).
fn compress(package: &str, program: &str, args: &[&str], raw: &Path, out: &Path) -> PathBuf {
    let mut all = args.to_vec();
    all.extend(["-c", s(raw)]);
    std::fs::write(out, sh(package, program, &all)).unwrap();
    out.to_path_buf()
}

struct Images {
    _dir: tempfile::TempDir,
    root: PathBuf,
    raw: PathBuf,
}

fn images() -> Images {
    let dir = scratch_dir();
    let root = dir.path().to_path_buf();
    let raw = root.join("disk.raw");
    make_raw(&raw);
    Images {
        _dir: dir,
        root,
        raw,
    }
}

/// Copies `image` (with `extra` options) and checks the copy is the raw image, sparse.
fn copy_and_check(i: &Images, image: &Path, extra: &[&str]) {
    let out = i.root.join(format!(
        "{}.out",
        image.file_name().unwrap().to_str().unwrap()
    ));
    let mut args = vec!["copy", s(image), s(&out)];
    args.extend_from_slice(extra);
    ferry!().run(&args).assert_success();
    assert_eq!(std::fs::metadata(&out).unwrap().len(), SIZE);
    compare(&i.raw, &out);
    assert_allocated_about(&out, DATA);
}

#[test]
fn copies_of_gz_xz_and_zst_images_are_the_raw_image_and_sparse() {
    let i = images();
    let xz = compress(
        "xz-utils",
        "xz",
        &["-1", "-T1"],
        &i.raw,
        &i.root.join("disk.raw.xz"),
    );
    copy_and_check(&i, &xz, &[]);
    let zst = compress(
        "zstd",
        "zstd",
        &["-q", "-3"],
        &i.raw,
        &i.root.join("disk.raw.zst"),
    );
    copy_and_check(&i, &zst, &["--verify"]);
    let gz = compress("gzip", "gzip", &["-1"], &i.raw, &i.root.join("disk.raw.gz"));
    copy_and_check(&i, &gz, &["--prescan"]);
    let gz2 = i.root.join("sized.raw.gz");
    std::fs::copy(&gz, &gz2).unwrap();
    copy_and_check(&i, &gz2, &["--source-size", "64M"]);
}

#[test]
fn multi_block_xz_pzstd_frames_and_concatenated_members() {
    let i = images();
    // xz -T2 writes a stream of several blocks: the threaded decoder reads it.
    let xz = compress(
        "xz-utils",
        "xz",
        &["-1", "-T2", "--block-size=4MiB"],
        &i.raw,
        &i.root.join("blocks.raw.xz"),
    );
    copy_and_check(&i, &xz, &[]);
    // pzstd writes independent frames that do not record their size: --prescan measures
    // them (in parallel), then they are decompressed in parallel.
    let pz = compress(
        "zstd",
        "pzstd",
        &["-q", "-p", "2"],
        &i.raw,
        &i.root.join("frames.raw.zst"),
    );
    // Without it the size is not known before the stream is read.
    let run = ferry!().run(["info", "--json", s(&pz)]);
    run.assert_success();
    let json: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert!(json["virtual_size"].is_null(), "{run}");
    let info = ferry!().run(["info", "--json", "--prescan", s(&pz)]);
    info.assert_success();
    let json: serde_json::Value = serde_json::from_str(&info.stdout).unwrap();
    assert_eq!(json["format"], "zst", "{info}");
    assert_eq!(json["virtual_size"], SIZE, "{info}");
    assert!(json["parallel_frames"].as_u64().unwrap_or(0) >= 2, "{info}");
    copy_and_check(&i, &pz, &["--prescan", "--verify"]);
    let pz2 = i.root.join("sized-frames.raw.zst");
    std::fs::copy(&pz, &pz2).unwrap();
    copy_and_check(&i, &pz2, &["--source-size", "64M"]);

    // The halves compressed apart and concatenated, as `cat a.gz b.gz` does.
    let half = |n: u64| {
        let p = i.root.join(format!("half{n}.raw"));
        let all = std::fs::read(&i.raw).unwrap();
        std::fs::write(
            &p,
            &all[(n * SIZE / 2) as usize..((n + 1) * SIZE / 2) as usize],
        )
        .unwrap();
        p
    };
    let (a, b) = (half(0), half(1));
    for (package, program, ext, args) in [
        ("gzip", "gzip", "gz", vec!["-1"]),
        ("xz-utils", "xz", "xz", vec!["-0", "-T1"]),
        ("zstd", "zstd", "zst", vec!["-q"]),
    ] {
        let mut both = Vec::new();
        for half in [&a, &b] {
            let mut all = args.clone();
            all.extend(["-c", s(half)]);
            both.extend(sh(package, program, &all));
        }
        let joined = i.root.join(format!("joined.raw.{ext}"));
        std::fs::write(&joined, both).unwrap();
        // gzip's size is learned at the end of the second member.
        copy_and_check(&i, &joined, &[]);
        if ext == "zst" {
            // Two frames that record their size: read in parallel without a prescan.
            let info = ferry!().run(["info", "--json", s(&joined)]);
            info.assert_success();
            let json: serde_json::Value = serde_json::from_str(&info.stdout).unwrap();
            assert_eq!(json["parallel_frames"], 2, "{info}");
        }
    }
}

#[test]
fn info_shows_format_and_both_sizes() {
    let i = images();
    let xz = compress(
        "xz-utils",
        "xz",
        &["-1", "-T1"],
        &i.raw,
        &i.root.join("disk.raw.xz"),
    );
    let run = ferry!().run(["info", s(&xz)]);
    run.assert_success();
    let file_size = std::fs::metadata(&xz).unwrap().len();
    for line in [
        "file format: xz\n".to_string(),
        "virtual size: 64.00 MiB (67108864 bytes)\n".to_string(),
        format!("({file_size} bytes)"),
    ] {
        assert!(run.stdout.contains(&line), "{line}: {run}");
    }
    let gz = compress("gzip", "gzip", &["-1"], &i.raw, &i.root.join("disk.raw.gz"));
    let run = ferry!().run(["info", "--json", "--prescan", s(&gz)]);
    run.assert_success();
    let json: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(json["format"], "gz");
    assert_eq!(json["virtual_size"], SIZE);
    assert_eq!(json["file_size"], std::fs::metadata(&gz).unwrap().len());
}

#[test]
fn broken_streams_and_wrong_options_fail_clearly() {
    let i = images();
    let zst = compress(
        "zstd",
        "zstd",
        &["-q"],
        &i.raw,
        &i.root.join("disk.raw.zst"),
    );
    let xz = compress(
        "xz-utils",
        "xz",
        &["-1", "-T1"],
        &i.raw,
        &i.root.join("disk.raw.xz"),
    );
    let gz = compress("gzip", "gzip", &["-1"], &i.raw, &i.root.join("disk.raw.gz"));
    let out = i.root.join("out.raw");
    let fails = |args: &[&str], words: &[&str]| {
        let run = ferry!().run(args);
        let line = run.assert_clean_failure().to_string();
        for w in words {
            assert!(line.contains(w), "{w:?} not in {line:?}");
        }
    };

    // Truncated: the zstd file cut in the middle of its frame.
    let bytes = std::fs::read(&zst).unwrap();
    let cut = i.root.join("cut.raw.zst");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    fails(
        &["copy", s(&cut), s(&out), "--source-size", "64M"],
        &["zst", "truncated"],
    );
    // Corrupt: a flipped byte in the middle of the xz data (the index is intact).
    let mut bytes = std::fs::read(&xz).unwrap();
    let middle = bytes.len() / 3;
    bytes[middle] ^= 0x55;
    let bad = i.root.join("bad.raw.xz");
    std::fs::write(&bad, &bytes).unwrap();
    fails(&["copy", s(&bad), s(&out)], &["xz", "does not decompress"]);
    // A truncated xz has no index to read the size from.
    let cut_xz = i.root.join("cut.raw.xz");
    std::fs::write(&cut_xz, &bytes[..bytes.len() - 100]).unwrap();
    fails(&["copy", s(&cut_xz), s(&out)], &["xz"]);

    // A size that is not the stream's.
    fails(
        &["copy", s(&gz), s(&out), "--source-size", "32M"],
        &["more than"],
    );
    // A fresh target: the failed copies above left a 64 MiB one, smaller than 65M.
    let out65 = i.root.join("out65.raw");
    fails(
        &["copy", s(&gz), s(&out65), "--source-size", "65M"],
        &["ends after"],
    );
    fails(
        &["copy", s(&xz), s(&out), "--source-size", "1M"],
        &["disagrees"],
    );

    // A wrong --source-format.
    fails(
        &["copy", "--source-format", "xz", s(&zst), s(&out)],
        &["--source-format xz", "zst"],
    );
    fails(
        &["copy", "--source-format", "gz", s(&i.raw), s(&out)],
        &["not gz"],
    );
    // raw copies the compressed bytes as they are.
    let as_raw = i.root.join("as-raw.bin");
    ferry!()
        .run(["copy", "--source-format", "raw", s(&zst), s(&as_raw)])
        .assert_success();
    assert!(std::fs::read(&zst).unwrap() == std::fs::read(&as_raw).unwrap());

    // qcow2 inside a compressed stream is refused by name.
    let qcow2 = i.root.join("disk.qcow2");
    sh(
        "qemu-utils",
        "qemu-img",
        &["convert", "-f", "raw", "-O", "qcow2", s(&i.raw), s(&qcow2)],
    );
    let packed = compress(
        "zstd",
        "zstd",
        &["-q"],
        &qcow2,
        &i.root.join("disk.qcow2.zst"),
    );
    fails(&["copy", s(&packed), s(&out)], &["qcow2 inside"]);
}
