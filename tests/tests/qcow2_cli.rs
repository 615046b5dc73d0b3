//! qcow2 sources end to end through the binary: `ferry copy` of qcow2 images (plain,
//! zstd-compressed, with a backing chain, over NBD as raw bytes) into raw files checked with
//! `qemu-img compare` against the qcow2 itself, sparseness of the target, `--source-format
//! raw`, and `ferry info` on a qcow2 and a raw image.

use std::path::Path;
use std::process::Command;

use ferry_tests::check::{assert_allocated_about, blkhash_file, require_tool};
use ferry_tests::nbd_servers::{NbdServer, QemuNbd};
use ferry_tests::{ferry, scratch_dir};

const MIB: u64 = 1 << 20;
/// The bytes [`make_qcow2`] writes as data (no zero cluster among them).
const DATA: u64 = 3 * MIB + 192 * 1024;

fn sh(program: &str, args: &[&str]) {
    require_tool(program, "qemu-utils");
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A 64 MiB qcow2 with data, a zero cluster range and holes (64 KiB clusters).
fn make_qcow2(path: &Path, options: &str) {
    sh(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", "-o", options, s(path), "64M"],
    );
    for cmd in [
        "write -P 0x11 0 3M",
        "write -z 1M 1M",
        "write -P 0x22 5M 1M",
        "write -P 0x33 7M 12k",
        "write -P 0x44 60M 100k",
        "write -z 60M 4k",
    ] {
        sh("qemu-io", &["-f", "qcow2", "-c", cmd, s(path)]);
    }
}

/// `qemu-img compare` of a qcow2 image with a raw copy of it.
fn compare_with_qcow2(qcow2: &Path, raw: &Path) {
    sh(
        "qemu-img",
        &["compare", "-f", "qcow2", "-F", "raw", s(qcow2), s(raw)],
    );
}

#[test]
fn copy_qcow2_to_raw_keeps_holes_and_verifies() {
    let dir = scratch_dir();
    let img = dir.path().join("img.qcow2");
    make_qcow2(&img, "compat=1.1");
    let out = dir.path().join("out.raw");
    ferry!()
        .run(["copy", s(&img), s(&out), "--verify"])
        .assert_success();
    assert_eq!(std::fs::metadata(&out).unwrap().len(), 64 * MIB);
    compare_with_qcow2(&img, &out);
    assert_allocated_about(&out, DATA);
}

#[test]
fn copy_zstd_compressed_qcow2() {
    let dir = scratch_dir();
    let plain = dir.path().join("plain.qcow2");
    make_qcow2(&plain, "compat=1.1");
    let packed = dir.path().join("packed.qcow2");
    sh(
        "qemu-img",
        &[
            "convert",
            "-c",
            "-O",
            "qcow2",
            "-o",
            "compression_type=zstd",
            s(&plain),
            s(&packed),
        ],
    );
    let out = dir.path().join("out.raw");
    ferry!().run(["copy", s(&packed), s(&out)]).assert_success();
    compare_with_qcow2(&plain, &out);
}

#[test]
fn backing_chain_needs_allow_backing() {
    let dir = scratch_dir();
    let base = dir.path().join("base.qcow2");
    make_qcow2(&base, "compat=1.1");
    let top = dir.path().join("top.qcow2");
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
            s(&top),
        ],
    );
    sh(
        "qemu-io",
        &["-f", "qcow2", "-c", "write -P 0x55 2M 2M", s(&top)],
    );
    let out = dir.path().join("out.raw");
    let run = ferry!().run(["copy", s(&top), s(&out)]);
    let line = run.assert_clean_failure();
    assert!(
        line.contains("--allow-backing") && line.contains("base.qcow2"),
        "{line}"
    );

    ferry!()
        .run(["copy", "--allow-backing", s(&top), s(&out)])
        .assert_success();
    compare_with_qcow2(&top, &out);

    let run = ferry!().run(["info", "--json", s(&top)]);
    run.assert_success();
    let json: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(
        json["backing_chain"],
        serde_json::json!(["base.qcow2"]),
        "{run}"
    );
}

#[test]
fn source_format_raw_copies_the_qcow2_file_itself() {
    let dir = scratch_dir();
    let img = dir.path().join("img.qcow2");
    make_qcow2(&img, "compat=1.1");
    let out = dir.path().join("out.bin");
    ferry!()
        .run(["copy", "--source-format", "raw", s(&img), s(&out)])
        .assert_success();
    assert!(std::fs::read(&img).unwrap() == std::fs::read(&out).unwrap());
}

#[test]
fn qcow2_served_as_raw_bytes_by_qemu_nbd_is_read_as_qcow2() {
    let dir = scratch_dir();
    let img = dir.path().join("img.qcow2");
    make_qcow2(&img, "compat=1.1,cluster_size=4096");
    let mut server = NbdServer::qemu_nbd(
        &img,
        &QemuNbd {
            export: "disk".into(),
            read_only: true,
            ..QemuNbd::default()
        },
    );
    let out = dir.path().join("out.raw");
    ferry!()
        .run(["copy", server.uri().as_str(), s(&out)])
        .assert_success();
    let run = ferry!().run(["checksum", server.uri().as_str()]);
    run.assert_success();
    server.stop();
    compare_with_qcow2(&img, &out);
    let digest = run.stdout.split_whitespace().next().unwrap_or_default();
    assert_eq!(digest, blkhash_file(&out), "{run}");
}

#[test]
fn info_on_a_qcow2_and_a_raw_image() {
    let dir = scratch_dir();
    let img = dir.path().join("img.qcow2");
    make_qcow2(&img, "compat=1.1");
    let run = ferry!().run(["info", s(&img)]);
    run.assert_success();
    for line in [
        "file format: qcow2",
        "virtual size: 64.00 MiB (67108864 bytes)",
        "allocated: 3.19 MiB (3342336 bytes)",
        "cluster_size: 65536",
        "compression type: zlib",
    ] {
        assert!(run.stdout.contains(line), "{line}: {run}");
    }
    let run = ferry!().run(["info", "--json", s(&img)]);
    run.assert_success();
    let json: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(json["format"], "qcow2");
    assert_eq!(json["virtual_size"], 64 * MIB);
    assert_eq!(json["allocated_bytes"], DATA);
    assert_eq!(json["backing_chain"], serde_json::json!([]));

    let raw = dir.path().join("img.raw");
    sh("qemu-img", &["convert", "-O", "raw", s(&img), s(&raw)]);
    let run = ferry!().run(["info", "--json", s(&raw)]);
    run.assert_success();
    let json: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(json["format"], "raw");
    assert_eq!(json["virtual_size"], 64 * MIB);
    assert_eq!(json["cluster_size"], serde_json::Value::Null);
    // qemu-img convert writes sparse: the data is at least what was written.
    assert!(
        json["allocated_bytes"].as_u64().unwrap() >= 3 * MIB,
        "{run}"
    );
}

#[test]
fn encrypted_qcow2_is_a_clean_failure() {
    let dir = scratch_dir();
    let img = dir.path().join("enc.qcow2");
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
            s(&img),
            "1M",
        ],
    );
    let out = dir.path().join("out.raw");
    let run = ferry!().run(["copy", s(&img), s(&out)]);
    let line = run.assert_clean_failure();
    assert!(line.contains("encrypted"), "{line}");
}
