//! `ferry copy` file to file, end to end: every image kind in both commit orders and with
//! several worker counts, each target checked byte for byte with `qemu-img compare`, for
//! its size, and for sparseness; plus the options that change how a copy writes.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ferry_tests::bin::{wait_with_deadline, Ferry};
use ferry_tests::check::{allocated_bytes, assert_allocated_about, blkhash_file, qemu_img_compare};
use ferry_tests::images::{make, Image, Pattern, BLOCK};
use ferry_tests::nbd_servers::{NbdServer, Nbdkit};
use ferry_tests::{ferry, scratch_dir};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Copies `image` with each order and worker count into fresh targets and checks each.
fn copy_matrix(ferry: &Ferry, image: &Image, dir: &Path, workers: &[usize]) {
    let runs: Vec<(&str, usize)> = ["--in-order", "--out-of-order"]
        .into_iter()
        .flat_map(|order| workers.iter().map(move |&n| (order, n)))
        .collect();
    copy_each(ferry, image, dir, &runs);
}

/// Copies `image` once for each (order, workers) into a fresh target and checks each.
fn copy_each(ferry: &Ferry, image: &Image, dir: &Path, runs: &[(&str, usize)]) {
    for &(order, n) in runs {
        let target = dir.join(format!("target{order}-{n}.img"));
        let run = ferry.run([
            "copy".as_ref(),
            "--workers".as_ref(),
            n.to_string().as_ref(),
            order.as_ref(),
            image.path.as_os_str(),
            target.as_os_str(),
        ]);
        run.assert_success();
        check_copy(image, &target);
        assert!(
            run.stdout.starts_with("copied "),
            "no summary on stdout: {run}"
        );
        fs::remove_file(&target).unwrap();
    }
}

/// The target has the source's size and bytes, and allocates about its non-zero blocks.
fn check_copy(image: &Image, target: &Path) {
    assert_eq!(
        fs::metadata(target).unwrap().len(),
        image.size,
        "{} has the wrong size",
        target.display()
    );
    qemu_img_compare(&image.path, target);
    assert_allocated_about(target, image.nonzero_block_bytes);
}

fn image(dir: &Path, pattern: Pattern, size: u64, seed: u64) -> Image {
    make(
        &dir.join(format!("source-{pattern:?}-{size}.img")),
        pattern,
        size,
        seed,
    )
    .unwrap()
}

#[test]
fn copies_an_empty_image() {
    let dir = scratch_dir();
    let image = image(dir.path(), Pattern::Empty, 64 * MIB, 1);
    copy_matrix(&ferry!(), &image, dir.path(), &[1, 3, 8]);
}

#[test]
fn copies_a_half_data_image() {
    let dir = scratch_dir();
    let image = image(dir.path(), Pattern::HalfData, 96 * MIB, 2);
    copy_matrix(&ferry!(), &image, dir.path(), &[1, 3, 8]);
}

#[test]
fn copies_a_random_image() {
    let dir = scratch_dir();
    let image = image(dir.path(), Pattern::Random, 48 * MIB + 4 * BLOCK, 3);
    copy_matrix(&ferry!(), &image, dir.path(), &[1, 3, 8]);
}

/// The largest image of the suite: 1 GiB + 4097 bytes, half data, with an unaligned tail
/// of data, once in each order (the smaller images cover the worker counts); also checks
/// the target's block hash against the independent implementation.
#[test]
fn copies_an_unaligned_one_gib_image() {
    let dir = scratch_dir();
    let image = image(dir.path(), Pattern::HalfData, GIB + 4097, 4);
    let ferry = ferry!();
    copy_each(
        &ferry,
        &image,
        dir.path(),
        &[("--in-order", 3), ("--out-of-order", 8)],
    );

    // Default options with --verify: the digests are the independent block hash.
    let target = dir.path().join("verified.img");
    let run = ferry.run([
        "copy".as_ref(),
        "--verify".as_ref(),
        "--json".as_ref(),
        image.path.as_os_str(),
        target.as_os_str(),
    ]);
    run.assert_success();
    let json: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    let expected = blkhash_file(&image.path);
    assert_eq!(json["digests"]["source"], expected.as_str(), "{json}");
    assert_eq!(json["digests"]["target"], expected.as_str(), "{json}");
    assert_allocated_about(&target, image.nonzero_block_bytes);
}

#[test]
fn copies_tiny_images() {
    let dir = scratch_dir();
    let ferry = ferry!();
    for (pattern, size) in [
        (Pattern::Random, 1),
        (Pattern::HalfData, 1),
        (Pattern::Empty, 1),
        (Pattern::Empty, 0),
        (Pattern::Random, 4097),
        (Pattern::HalfData, 3 * MIB + 511),
    ] {
        let image = image(dir.path(), pattern, size, 5);
        copy_matrix(&ferry, &image, dir.path(), &[1, 3]);
    }
}

#[test]
fn copies_with_direct_io() {
    let dir = scratch_dir();
    let ferry = ferry!();
    for (pattern, size) in [
        (Pattern::HalfData, 24 * MIB),
        (Pattern::Random, 5 * MIB + 4097),
        (Pattern::HalfData, 1),
    ] {
        let image = image(dir.path(), pattern, size, 6);
        for workers in ["1", "8"] {
            let target = dir.path().join(format!("direct-{workers}.img"));
            ferry
                .run([
                    "copy".as_ref(),
                    "--cache".as_ref(),
                    "none".as_ref(),
                    "--workers".as_ref(),
                    workers.as_ref(),
                    image.path.as_os_str(),
                    target.as_os_str(),
                ])
                .assert_success();
            check_copy(&image, &target);
            fs::remove_file(&target).unwrap();
        }
    }
}

/// An existing target full of other bytes: every zero of the source must be written.
#[test]
fn overwrites_an_existing_target() {
    let dir = scratch_dir();
    let image = image(dir.path(), Pattern::HalfData, 32 * MIB + 4097, 7);
    let garbage = make(
        &dir.path().join("target.img"),
        Pattern::Random,
        image.size,
        99,
    )
    .unwrap();
    let run = ferry!().run([
        "copy".as_ref(),
        image.path.as_os_str(),
        garbage.path.as_os_str(),
    ]);
    run.assert_success();
    check_copy(&image, &garbage.path);
}

/// A larger existing target is written over the source's length only.
#[test]
fn leaves_the_rest_of_a_larger_target_alone() {
    let dir = scratch_dir();
    let image = image(dir.path(), Pattern::HalfData, 8 * MIB + 100, 8);
    let target = make(
        &dir.path().join("target.img"),
        Pattern::Random,
        12 * MIB,
        98,
    )
    .unwrap();
    let tail_before = read_range(&target.path, image.size, 12 * MIB - image.size);
    ferry!()
        .run([
            "copy".as_ref(),
            "--verify".as_ref(),
            image.path.as_os_str(),
            target.path.as_os_str(),
        ])
        .assert_success();
    assert_eq!(fs::metadata(&target.path).unwrap().len(), 12 * MIB);
    let head = dir.path().join("head.img");
    fs::write(&head, read_range(&target.path, 0, image.size)).unwrap();
    qemu_img_compare(&image.path, &head);
    assert!(
        read_range(&target.path, image.size, 12 * MIB - image.size) == tail_before,
        "the bytes past the source's end changed"
    );
}

#[test]
fn target_is_zero_skips_zeroes_and_stays_sparse() {
    let dir = scratch_dir();
    let image = image(dir.path(), Pattern::HalfData, 40 * MIB, 9);
    let target = dir.path().join("zero.img");
    fs::File::create(&target)
        .unwrap()
        .set_len(image.size)
        .unwrap();
    let run = ferry!().run([
        "copy".as_ref(),
        "--target-is-zero".as_ref(),
        "--json".as_ref(),
        image.path.as_os_str(),
        target.as_os_str(),
    ]);
    run.assert_success();
    check_copy(&image, &target);
}

#[test]
fn sparse_size_zero_keeps_everything_allocated() {
    let dir = scratch_dir();
    let image = image(dir.path(), Pattern::HalfData, 16 * MIB + 4096, 10);
    let target = dir.path().join("full.img");
    ferry!()
        .run([
            "copy".as_ref(),
            "--sparse-size".as_ref(),
            "0".as_ref(),
            image.path.as_os_str(),
            target.as_os_str(),
        ])
        .assert_success();
    qemu_img_compare(&image.path, &target);
    assert_allocated_about(&target, image.size);
}

#[test]
fn larger_sparse_size_writes_small_zero_blocks_as_data() {
    let dir = scratch_dir();
    let image = image(dir.path(), Pattern::HalfData, 16 * MIB, 11);
    let target = dir.path().join("sparse64k.img");
    ferry!()
        .run([
            "copy".as_ref(),
            "--sparse-size".as_ref(),
            "64K".as_ref(),
            image.path.as_os_str(),
            target.as_os_str(),
        ])
        .assert_success();
    qemu_img_compare(&image.path, &target);
    // The 4 KiB zero blocks inside the data runs are now written, the holes still are not.
    let allocated = allocated_bytes(&target);
    assert!(
        allocated > image.nonzero_block_bytes && allocated < image.size / 2 + 2 * MIB,
        "allocated {allocated}, data blocks {}, size {}",
        image.nonzero_block_bytes,
        image.size
    );
}

#[test]
fn preallocation_modes() {
    let dir = scratch_dir();
    let image = image(dir.path(), Pattern::HalfData, 20 * MIB + 4097, 12);
    let ferry = ferry!();
    let allocated_size = image.size.div_ceil(BLOCK) * BLOCK;
    for mode in ["off", "falloc", "full", "grow", "grow=4M"] {
        let target = dir.path().join(format!("prealloc-{mode}.img"));
        ferry
            .run([
                "copy".as_ref(),
                "--preallocation".as_ref(),
                mode.as_ref(),
                image.path.as_os_str(),
                target.as_os_str(),
            ])
            .assert_success();
        assert_eq!(
            fs::metadata(&target).unwrap().len(),
            image.size,
            "{mode}: the target must have the source's size (grow trims)"
        );
        qemu_img_compare(&image.path, &target);
        match mode {
            "off" => assert_allocated_about(&target, image.nonzero_block_bytes),
            "falloc" | "full" => assert_allocated_about(&target, allocated_size),
            _ => {
                let allocated = allocated_bytes(&target);
                assert!(
                    allocated >= image.nonzero_block_bytes && allocated <= allocated_size + MIB,
                    "{mode}: allocated {allocated}"
                );
            }
        }
    }
}

#[test]
fn verify_and_json_summary() {
    let dir = scratch_dir();
    let image = image(dir.path(), Pattern::HalfData, 24 * MIB + 4097, 13);
    let target = dir.path().join("verified.img");
    let run = ferry!().run([
        "copy".as_ref(),
        "--verify".as_ref(),
        "--json".as_ref(),
        image.path.as_os_str(),
        target.as_os_str(),
    ]);
    run.assert_success();
    check_copy(&image, &target);
    let json: serde_json::Value = serde_json::from_str(run.stdout.trim())
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {run}"));
    let field = |name: &str| {
        json[name]
            .as_u64()
            .unwrap_or_else(|| panic!("no integer '{name}' in {json}"))
    };
    assert_eq!(field("size"), image.size);
    assert_eq!(
        field("bytes_copied") + field("zero_bytes"),
        image.size,
        "{json}"
    );
    assert!(
        field("bytes_copied") >= image.nonzero_block_bytes - BLOCK
            && field("bytes_copied") <= image.written_bytes,
        "bytes_copied should be the data that was written: {json}"
    );
    assert!(json["seconds"].as_f64().unwrap() >= 0.0, "{json}");
    assert!(
        json["throughput_bytes_per_second"].as_f64().is_some(),
        "{json}"
    );
    let expected = blkhash_file(&image.path);
    assert_eq!(json["digests"]["algorithm"], "blkhash", "{json}");
    assert_eq!(json["digests"]["source"], expected.as_str(), "{json}");
    assert_eq!(json["digests"]["target"], expected.as_str(), "{json}");

    // Without --verify there are no digests; the human summary is one line.
    let plain = ferry!().run([
        "copy".as_ref(),
        image.path.as_os_str(),
        dir.path().join("plain.img").as_os_str(),
    ]);
    plain.assert_success();
    assert_eq!(plain.stdout.lines().count(), 1, "{plain}");
    assert!(plain.stderr.trim().is_empty(), "stderr not quiet: {plain}");
}

/// A target that loses every write (nbdkit's null plugin discards writes and reads back
/// zeroes): the copy alone cannot notice, `--verify` must. One line, non-zero exit, nothing
/// reported done.
#[test]
fn verify_catches_a_target_that_loses_writes() {
    let dir = scratch_dir();
    let image = image(dir.path(), Pattern::Random, 4 * MIB, 18);
    let server = NbdServer::nbdkit(
        &["null", &format!("size={}", image.size)],
        &Nbdkit::default(),
    );
    let uri = server.uri();
    let ferry = ferry!();
    ferry
        .run(["copy".as_ref(), image.path.as_os_str(), uri.as_ref()])
        .assert_success();
    let run = ferry.run([
        "copy".as_ref(),
        "--verify".as_ref(),
        image.path.as_os_str(),
        uri.as_ref(),
    ]);
    let line = run.assert_clean_failure();
    assert!(line.contains("verify failed"), "{line}");
    assert!(line.contains(&blkhash_file(&image.path)), "{line}");
}

#[test]
fn file_urls_work_like_paths() {
    let dir = scratch_dir();
    let image = image(dir.path(), Pattern::HalfData, 6 * MIB, 14);
    let target = dir.path().join("url.img");
    ferry!()
        .run([
            "copy".to_string(),
            format!("file://{}", image.path.display()),
            format!("file://{}", target.display()),
        ])
        .assert_success();
    check_copy(&image, &target);
}

/// A rate limit slows the copy down: 6 MiB at 2 MiB/s takes about 3 s, and however large
/// the limiter's first burst may be, not much less than 2 s.
#[test]
fn rate_limit_holds() {
    let dir = scratch_dir();
    let image = image(dir.path(), Pattern::Random, 6 * MIB, 15);
    let target = dir.path().join("slow.img");
    let run = ferry!().run([
        "copy".as_ref(),
        "--rate-limit".as_ref(),
        "2M".as_ref(),
        image.path.as_os_str(),
        target.as_os_str(),
    ]);
    run.assert_success();
    check_copy(&image, &target);
    assert!(
        run.elapsed >= Duration::from_millis(1500),
        "6 MiB at 2 MiB/s took only {:?}",
        run.elapsed
    );
}

/// Ctrl-C stops a copy promptly: exit 130, one line saying so, nothing reported done.
#[test]
fn ctrl_c_cancels_the_copy() {
    let dir = scratch_dir();
    let image = image(dir.path(), Pattern::Random, 32 * MIB, 16);
    let target = dir.path().join("cancelled.img");
    let ferry = ferry!();
    let mut cmd = ferry.command([
        "copy".as_ref(),
        "--rate-limit".as_ref(),
        "4M".as_ref(),
        image.path.as_os_str(),
        target.as_os_str(),
    ]);
    let child = cmd.stdin(Stdio::null()).spawn().unwrap();
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(1500));
    let kill = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let run = wait_with_deadline(child, Duration::from_secs(30), "ferry copy".into());
    assert_eq!(run.status.code(), Some(130), "{run}");
    assert!(
        run.elapsed < Duration::from_secs(5),
        "took {:?} to stop after Ctrl-C",
        run.elapsed
    );
    let line = run.assert_clean_failure();
    assert!(line.contains("interrupted"), "{line}");
}

/// On a terminal the progress bar shows rate and ETA; without one, nothing is drawn.
#[test]
fn progress_bar_on_a_terminal_only() {
    let dir = scratch_dir();
    let image = image(dir.path(), Pattern::Random, 4 * MIB, 17);
    let ferry = ferry!();
    let target = dir.path().join("tty.img");
    ferry_tests::check::require_tool("script", "util-linux");
    let command = format!(
        "{} copy --rate-limit 4M {} {}",
        ferry.path().display(),
        image.path.display(),
        target.display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("ETA"),
        "no progress bar on a terminal: {text}"
    );
    check_copy(&image, &target);

    let quiet = dir.path().join("quiet.img");
    let run = ferry.run(["copy".as_ref(), image.path.as_os_str(), quiet.as_os_str()]);
    run.assert_success();
    assert!(run.stderr.is_empty(), "progress without a terminal: {run}");
}

fn read_range(path: &PathBuf, offset: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize];
    OpenOptions::new()
        .read(true)
        .open(path)
        .unwrap()
        .read_exact_at(&mut buf, offset)
        .unwrap();
    buf
}
