//! VMDK, OVA, VHD, VHDX and VDI sources end to end through the binary, on images made by
//! their real producer (`qemu-img convert`; an OVA made with `tar`): `ferry copy` from a
//! file, over HTTP (nginx) and over NBD (qemu-nbd serving the image file's bytes), each
//! output compared with `qemu-img compare` against the image as qemu reads it and its
//! sparseness checked; `ferry info`; and the faults: truncated files, a block table entry
//! past the end, a dirty VHDX log, a descriptor naming `..`.

use std::path::{Path, PathBuf};
use std::process::Command;

use ferry_tests::check::{assert_allocated_about, qemu_img_compare, require_tool};
use ferry_tests::http_server::Nginx;
use ferry_tests::nbd_servers::{NbdServer, QemuNbd};
use ferry_tests::{ferry, scratch_dir};

const MIB: u64 = 1 << 20;
/// The data bytes of [`make_raw`]'s image (none of them zero).
const DATA: u64 = 4 * MIB + 112 * 1024;

pub(crate) fn sh(program: &str, args: &[&str]) {
    require_tool(program, "qemu-utils");
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(crate) fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A 64 MiB raw image: data runs and holes, from the start to near the end.
pub(crate) fn make_raw(dir: &Path) -> PathBuf {
    let raw = dir.join("src.raw");
    sh("qemu-img", &["create", "-q", "-f", "raw", s(&raw), "64M"]);
    for cmd in [
        "write -P 0x11 0 3M",
        "write -P 0x22 5M 1M",
        "write -P 0x33 7M 12k",
        "write -P 0x44 60M 100k",
    ] {
        sh("qemu-io", &["-f", "raw", "-c", cmd, s(&raw)]);
    }
    raw
}

/// `qemu-img convert -O FORMAT -o OPTIONS raw NAME` in `dir`.
fn convert(dir: &Path, raw: &Path, format: &str, options: &str, name: &str) -> PathBuf {
    let out = dir.join(name);
    let mut args = vec!["convert", "-f", "raw", "-O", format];
    if !options.is_empty() {
        args.extend(["-o", options]);
    }
    args.extend([s(raw), s(&out)]);
    sh("qemu-img", &args);
    out
}

/// The copy has the image's bytes (as qemu reads the image) and only its data allocated.
fn check_copy(image: &Path, qemu_format: &str, out: &Path) {
    sh(
        "qemu-img",
        &["compare", "-f", qemu_format, "-F", "raw", s(image), s(out)],
    );
    assert_allocated_about(out, DATA);
}

fn copy_and_check(source: &str, image: &Path, qemu_format: &str, out: &Path) {
    let _ = std::fs::remove_file(out);
    ferry!().run(["copy", source, s(out)]).assert_success();
    check_copy(image, qemu_format, out);
}

fn info_json(source: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["info", "--json"];
    args.extend(extra);
    args.push(source);
    let run = ferry!().run(args);
    run.assert_success();
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {run}"))
}

/// Every image a test makes: (file name, qemu-img format, options, ferry format, subformat).
const IMAGES: &[(&str, &str, &str, &str, &str)] = &[
    (
        "sparse.vmdk",
        "vmdk",
        "subformat=monolithicSparse",
        "vmdk",
        "monolithicSparse",
    ),
    (
        "stream.vmdk",
        "vmdk",
        "subformat=streamOptimized",
        "vmdk",
        "streamOptimized",
    ),
    (
        "flat.vmdk",
        "vmdk",
        "subformat=monolithicFlat",
        "vmdk",
        "monolithicFlat",
    ),
    (
        "split.vmdk",
        "vmdk",
        "subformat=twoGbMaxExtentSparse",
        "vmdk",
        "twoGbMaxExtentSparse",
    ),
    ("dynamic.vhd", "vpc", "subformat=dynamic", "vhd", "dynamic"),
    ("fixed.vhd", "vpc", "subformat=fixed", "vhd", "fixed"),
    ("dynamic.vhdx", "vhdx", "", "vhdx", "dynamic"),
    ("fixed.vhdx", "vhdx", "subformat=fixed", "vhdx", "fixed"),
    ("dynamic.vdi", "vdi", "static=off", "vdi", "dynamic"),
    ("static.vdi", "vdi", "static=on", "vdi", "static"),
];

#[test]
fn every_producer_subformat_copies_from_a_file() {
    let dir = scratch_dir();
    let raw = make_raw(dir.path());
    let out = dir.path().join("out.raw");
    for &(name, qemu, options, format, subformat) in IMAGES {
        let image = convert(dir.path(), &raw, qemu, options, name);
        copy_and_check(s(&image), &image, qemu, &out);
        let json = info_json(s(&image), &[]);
        assert_eq!(json["format"], format, "{name}: {json}");
        if !subformat.is_empty() {
            assert_eq!(json["subformat"], subformat, "{name}: {json}");
        }
        // --source-format insists: the right name works, another fails clearly.
        let _ = std::fs::remove_file(&out);
        ferry!()
            .run(["copy", "--source-format", format, s(&image), s(&out)])
            .assert_success();
        check_copy(&image, qemu, &out);
        let wrong = if format == "vdi" { "vhdx" } else { "vdi" };
        let run = ferry!().run(["copy", "--source-format", wrong, s(&image), s(&out)]);
        let line = run.assert_clean_failure();
        assert!(line.contains("--source-format"), "{name}: {line}");
    }
}

#[test]
fn images_copy_over_http_and_nbd() {
    let nginx = Nginx::start();
    let dir = scratch_dir();
    let raw = make_raw(dir.path());
    let out = dir.path().join("out.raw");
    for &(name, qemu, options, _, _) in IMAGES {
        if qemu == "vmdk" && !options.contains("stream") && !options.contains("monolithicSparse") {
            continue; // descriptor images: extents are read beside file images only
        }
        let image = convert(&nginx.root(), &raw, qemu, options, name);
        copy_and_check(&nginx.url(name), &image, qemu, &out);
    }
    for &(name, qemu, options, _, _) in &[IMAGES[1], IMAGES[6], IMAGES[8]] {
        let image = convert(dir.path(), &raw, qemu, options, name);
        let mut server = NbdServer::qemu_nbd(
            &image,
            &QemuNbd {
                export: "disk".into(),
                read_only: true,
                ..QemuNbd::default()
            },
        );
        copy_and_check(&server.uri(), &image, qemu, &out);
        server.stop();
    }
}

/// An OVA as VirtualBox and VMware export one: the OVF first, then the disks.
fn make_ova(dir: &Path, raw: &Path, disks: &[&str]) -> PathBuf {
    require_tool("tar", "tar");
    let ovf = dir.join("vm.ovf");
    let mut refs = String::new();
    for (i, d) in disks.iter().enumerate() {
        refs += &format!("    <File ovf:href=\"{d}\" ovf:id=\"file{i}\"/>\n");
        convert(dir, raw, "vmdk", "subformat=streamOptimized", d);
    }
    std::fs::write(
        &ovf,
        format!(
            "<?xml version=\"1.0\"?>\n<Envelope xmlns:ovf=\"http://schemas.dmtf.org/ovf/envelope/1\">\n  <References>\n{refs}  </References>\n</Envelope>\n"
        ),
    )
    .unwrap();
    let ova = dir.join(format!("vm{}.ova", disks.len()));
    let mut args = vec!["-C", s(dir), "-cf", s(&ova), "vm.ovf"];
    args.extend(disks);
    let status = Command::new("tar").args(&args).status().unwrap();
    assert!(status.success());
    ova
}

#[test]
fn an_ova_copies_its_disk_from_a_file_and_over_http() {
    let nginx = Nginx::start();
    let dir = scratch_dir();
    let raw = make_raw(dir.path());
    let out = dir.path().join("out.raw");
    let ova = make_ova(&nginx.root(), &raw, &["disk1.vmdk"]);
    copy_and_check(s(&ova), &raw, "raw", &out);
    copy_and_check(&nginx.url("vm1.ova"), &raw, "raw", &out);
    let json = info_json(s(&ova), &[]);
    assert_eq!(json["format"], "ova", "{json}");
    assert_eq!(json["subformat"], "vmdk streamOptimized", "{json}");
    assert_eq!(json["virtual_size"], 64 * MIB, "{json}");
    assert_eq!(json["disks"][0]["name"], "disk1.vmdk", "{json}");
    // A tar that does not start with an OVF is no OVA: it is copied as its bytes.
    let tar = dir.path().join("plain.tar");
    let status = Command::new("tar")
        .args(["-C", s(dir.path()), "-cf", s(&tar), "src.raw"])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(info_json(s(&tar), &[])["format"], "raw");
    let _ = std::fs::remove_file(&out);
    ferry!().run(["copy", s(&tar), s(&out)]).assert_success();
    qemu_img_compare(&tar, &out);
}

#[test]
fn an_ova_with_two_disks_needs_disk_n() {
    let dir = scratch_dir();
    let raw = make_raw(dir.path());
    let out = dir.path().join("out.raw");
    let ova = make_ova(dir.path(), &raw, &["a.vmdk", "b.vmdk"]);
    let line = ferry!()
        .run(["copy", s(&ova), s(&out)])
        .assert_clean_failure()
        .to_owned();
    assert!(
        line.contains("2 disks") && line.contains("1: b.vmdk") && line.contains("--disk"),
        "{line}"
    );
    let _ = std::fs::remove_file(&out);
    ferry!()
        .run(["copy", "--disk", "1", s(&ova), s(&out)])
        .assert_success();
    qemu_img_compare(&raw, &out);
    assert_allocated_about(&out, DATA);
    let json = info_json(s(&ova), &["--disk", "1"]);
    assert_eq!(json["disks"].as_array().map(Vec::len), Some(2), "{json}");
    assert_eq!(json["disk"], 1, "{json}");
    let line = ferry!()
        .run(["copy", "--disk", "2", s(&ova), s(&out)])
        .assert_clean_failure()
        .to_owned();
    assert!(line.contains("numbered from 0"), "{line}");
}

/// Runs `ferry copy ARGS... IMAGE out` and returns its one error line.
fn copy_fails(dir: &Path, image: &Path, args: &[&str]) -> String {
    let out = dir.join("fail.raw");
    let _ = std::fs::remove_file(&out);
    let mut all = vec!["copy"];
    all.extend(args);
    all.extend([s(image), s(&out)]);
    ferry!().run(all).assert_clean_failure().to_owned()
}

fn truncated(image: &Path, keep: u64) -> PathBuf {
    let path = image.with_extension(format!(
        "cut.{}",
        image.extension().unwrap().to_str().unwrap()
    ));
    let mut bytes = std::fs::read(image).unwrap();
    bytes.truncate(keep as usize);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn truncated_images_fail_clearly() {
    let dir = scratch_dir();
    let raw = make_raw(dir.path());
    for &(name, qemu, options, format, _) in IMAGES {
        if options.contains("Flat") || options.contains("twoGb") || name == "fixed.vhdx" {
            continue;
        }
        let image = convert(dir.path(), &raw, qemu, options, name);
        let len = std::fs::metadata(&image).unwrap().len();
        // Cut inside the data (a fixed VHD without its footer is raw: insist on vhd).
        let cut = truncated(&image, len / 2);
        let line = copy_fails(dir.path(), &cut, &["--source-format", format]);
        // A fixed VHD cut short has lost its footer, so it is no VHD at all.
        let expected = if name == "fixed.vhd" {
            "is not vhd"
        } else {
            "past the end"
        };
        assert!(line.contains(expected), "{name}: {line}");
    }
    let ova = make_ova(dir.path(), &raw, &["disk1.vmdk"]);
    let len = std::fs::metadata(&ova).unwrap().len();
    let line = copy_fails(dir.path(), &truncated(&ova, len / 2), &[]);
    assert!(line.contains("past the end of the archive"), "{line}");
}

fn patch(path: &Path, at: u64, bytes: &[u8]) {
    let mut data = std::fs::read(path).unwrap();
    data[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
    std::fs::write(path, data).unwrap();
}

#[test]
fn block_table_entries_past_the_end_are_corrupt() {
    let dir = scratch_dir();
    let raw = make_raw(dir.path());
    // VDI: the block map is at the header's offset_bmap; entry 0 -> a far block.
    let vdi = convert(dir.path(), &raw, "vdi", "static=off", "far.vdi");
    let data = std::fs::read(&vdi).unwrap();
    let bmap = u32::from_le_bytes(data[0x154..0x158].try_into().unwrap());
    let blocks = u32::from_le_bytes(data[0x180..0x184].try_into().unwrap());
    patch(&vdi, u64::from(bmap), &(blocks - 1).to_le_bytes());
    let line = copy_fails(dir.path(), &vdi, &[]);
    assert!(line.contains("past the end of the image file"), "{line}");
    // VHD: BAT entry 0 -> a sector far past the end.
    let vhd = convert(dir.path(), &raw, "vpc", "subformat=dynamic", "far.vhd");
    let data = std::fs::read(&vhd).unwrap();
    let header = u64::from_be_bytes(data[16..24].try_into().unwrap());
    let bat = u64::from_be_bytes(
        data[header as usize + 16..header as usize + 24]
            .try_into()
            .unwrap(),
    );
    patch(&vhd, bat, &0x00ff_0000u32.to_be_bytes());
    let line = copy_fails(dir.path(), &vhd, &[]);
    assert!(line.contains("past the end of the image file"), "{line}");
    // VMDK: grain table entry 0 -> a sector far past the end.
    let vmdk = convert(
        dir.path(),
        &raw,
        "vmdk",
        "subformat=monolithicSparse",
        "far.vmdk",
    );
    let data = std::fs::read(&vmdk).unwrap();
    let gd = u64::from_le_bytes(data[56..64].try_into().unwrap()) * 512;
    let gt = u64::from(u32::from_le_bytes(
        data[gd as usize..gd as usize + 4].try_into().unwrap(),
    )) * 512;
    patch(&vmdk, gt, &0x00ff_0000u32.to_le_bytes());
    let line = copy_fails(dir.path(), &vmdk, &[]);
    // The redundant grain table still holds the old entry: the two disagree.
    assert!(line.contains("redundant copy disagree"), "{line}");
}

#[test]
fn a_dirty_vhdx_log_is_refused() {
    let dir = scratch_dir();
    let raw = make_raw(dir.path());
    let vhdx = convert(dir.path(), &raw, "vhdx", "", "dirty.vhdx");
    let mut data = std::fs::read(&vhdx).unwrap();
    // Make the current header (the higher sequence number) name a log, and put an entry
    // of that log at the log's offset, as a writer that crashed mid-update leaves them.
    let seq = |at: usize| u64::from_le_bytes(data[at + 8..at + 16].try_into().unwrap());
    let current = if seq(64 << 10) > seq(128 << 10) {
        64 << 10
    } else {
        128 << 10
    };
    let guid = [0x5au8; 16];
    data[current + 48..current + 64].copy_from_slice(&guid);
    let log = u64::from_le_bytes(data[current + 72..current + 80].try_into().unwrap()) as usize;
    data[log..log + 4].copy_from_slice(b"loge");
    data[log + 32..log + 48].copy_from_slice(&guid);
    data[current + 4..current + 8].fill(0);
    let crc = crc32c::crc32c(&data[current..current + 4096]);
    data[current + 4..current + 8].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&vhdx, data).unwrap();
    let line = copy_fails(dir.path(), &vhdx, &[]);
    assert!(line.contains("dirty log"), "{line}");
    let run = ferry!().run(["info", s(&vhdx)]);
    assert!(run.assert_clean_failure().contains("dirty log"), "{run}");
}

#[test]
fn a_descriptor_extent_outside_its_directory_is_refused() {
    let dir = scratch_dir();
    let raw = make_raw(dir.path());
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    convert(
        dir.path(),
        &raw,
        "vmdk",
        "subformat=monolithicFlat",
        "flat.vmdk",
    );
    let text = std::fs::read_to_string(dir.path().join("flat.vmdk")).unwrap();
    assert!(text.contains("\"flat-flat.vmdk\""), "{text}");
    let evil = sub.join("evil.vmdk");
    std::fs::write(
        &evil,
        text.replace("\"flat-flat.vmdk\"", "\"../flat-flat.vmdk\""),
    )
    .unwrap();
    let line = copy_fails(dir.path(), &evil, &[]);
    assert!(line.contains("only files beside the descriptor"), "{line}");
}

#[test]
fn a_vmdk_snapshot_delta_is_refused_not_read_without_its_parent() {
    let dir = scratch_dir();
    let base = dir.path().join("base.vmdk");
    let top = dir.path().join("top.vmdk");
    sh("qemu-img", &["create", "-q", "-f", "vmdk", s(&base), "16M"]);
    sh(
        "qemu-io",
        &["-f", "vmdk", "-c", "write -P 0x11 0 1M", s(&base)],
    );
    sh(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "vmdk",
            "-b",
            "base.vmdk",
            "-F",
            "vmdk",
            s(&top),
        ],
    );
    sh(
        "qemu-io",
        &["-f", "vmdk", "-c", "write -P 0x22 4M 1M", s(&top)],
    );
    let line = copy_fails(dir.path(), &top, &[]);
    assert!(line.contains("parent"), "{line}");
    let out = dir.path().join("base.raw");
    ferry!().run(["copy", s(&base), s(&out)]).assert_success();
    sh(
        "qemu-img",
        &["compare", "-f", "vmdk", "-F", "raw", s(&base), s(&out)],
    );
}

/// Where [`scattered_images_on_a_tmpfs_copy_and_stay_sparse`] puts its images.
const TMPFS: &str = "/dev/shm";

/// A raw image of `runs` 1 MiB data runs, each followed by 1 MiB never written (on the
/// scratch dir's file system); returns it with its data bytes.
fn make_scattered_raw(dir: &Path, runs: u64) -> (PathBuf, u64) {
    use std::os::unix::fs::FileExt;
    let raw = dir.join("scattered.raw");
    let file = std::fs::File::create(&raw).unwrap();
    file.set_len(2 * runs * MIB).unwrap();
    for k in 0..runs {
        let run = vec![(k % 250 + 1) as u8; MIB as usize];
        file.write_all_at(&run, 2 * k * MIB).unwrap();
    }
    (raw, runs * MIB)
}

/// Dynamic VDI and VHDX images of many data runs read from a tmpfs, where SEEK_HOLE walks
/// a file's pages one by one up to the next hole. The readers once asked the image file's
/// extents per run of allocated blocks, O(file) each for a file without holes (a 2 GiB
/// VDI took minutes of CPU): the copies finish within the run's deadline, match qemu and
/// stay sparse. The VHDX with its default 8 MiB blocks has holes inside allocated blocks,
/// which must still come out as zeroes that are not written.
#[test]
fn scattered_images_on_a_tmpfs_copy_and_stay_sparse() {
    assert!(
        Path::new(TMPFS).is_dir(),
        "this test needs a tmpfs at {TMPFS} (mount -t tmpfs tmpfs {TMPFS})"
    );
    let dir = tempfile::Builder::new()
        .prefix("ferry-e2e-")
        .tempdir_in(TMPFS)
        .expect("create a scratch directory on the tmpfs");
    let (raw, data) = make_scattered_raw(dir.path(), 256);
    let out = dir.path().join("out.raw");
    for (name, qemu, options) in [
        ("scattered.vdi", "vdi", "static=off"),
        ("scattered-1m.vhdx", "vhdx", "block_size=1M"),
        ("scattered.vhdx", "vhdx", ""),
    ] {
        let image = convert(dir.path(), &raw, qemu, options, name);
        let _ = std::fs::remove_file(&out);
        ferry!().run(["copy", s(&image), s(&out)]).assert_success();
        sh(
            "qemu-img",
            &["compare", "-f", qemu, "-F", "raw", s(&image), s(&out)],
        );
        assert_allocated_about(&out, data);
        std::fs::remove_file(&image).unwrap();
    }
}
