//! `ferry copy SRC DST1 DST2 ...`: one pass writes every target. Real endpoints: files and
//! an nbdkit export; a target that fails (nbdkit's error filter failing every write) is
//! reported while the others are written whole; `--verify` reads every target back, and a
//! target that loses its writes (nbdkit null) fails verification alone.

use std::fs;
use std::path::Path;

use ferry_tests::check::{assert_allocated_about, qemu_img_compare};
use ferry_tests::images::{make, Image, Pattern};
use ferry_tests::nbd_servers::{NbdServer, Nbdkit};
use ferry_tests::{ferry, scratch_dir};

const MIB: u64 = 1 << 20;

fn image(dir: &Path) -> Image {
    make(&dir.join("source.img"), Pattern::HalfData, 48 * MIB, 31).expect("make the image")
}

fn check(image: &Image, target: &Path) {
    assert_eq!(fs::metadata(target).unwrap().len(), image.size);
    qemu_img_compare(&image.path, target);
    assert_allocated_about(target, image.nonzero_block_bytes);
}

#[test]
fn one_pass_fills_files_and_an_nbd_export_verified() {
    let dir = scratch_dir();
    let image = image(dir.path());
    let exported = dir.path().join("exported.img");
    fs::File::create(&exported)
        .unwrap()
        .set_len(image.size)
        .unwrap();
    let server = NbdServer::nbdkit(&["file", exported.to_str().unwrap()], &Nbdkit::default());
    let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
    let run = ferry!().run([
        "copy".as_ref(),
        "--verify".as_ref(),
        "--json".as_ref(),
        image.path.as_os_str(),
        a.as_os_str(),
        server.uri().as_ref(),
        b.as_os_str(),
    ]);
    run.assert_success();
    check(&image, &a);
    check(&image, &b);
    qemu_img_compare(&image.path, &exported);
    let summary: serde_json::Value = serde_json::from_str(run.stdout.trim()).expect("JSON");
    let target = summary["target"].as_str().unwrap();
    assert!(
        target.contains("a.img") && target.contains("b.img"),
        "{target}"
    );
    assert!(summary["digests"]["target"].is_string(), "{summary}");
    assert!(summary.get("failed_targets").is_none(), "{summary}");
}

#[test]
fn a_failing_target_is_reported_and_the_others_are_written() {
    let dir = scratch_dir();
    let image = image(dir.path());
    let broken = NbdServer::nbdkit(
        &[
            "memory",
            &format!("size={}", image.size),
            "error-pwrite=EIO",
            "error-pwrite-rate=100%",
        ],
        &Nbdkit {
            filters: vec!["error".into()],
            ..Nbdkit::default()
        },
    );
    let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
    let run = ferry!().run([
        "copy".as_ref(),
        image.path.as_os_str(),
        a.as_os_str(),
        broken.uri().as_ref(),
        b.as_os_str(),
    ]);
    assert_eq!(run.status.code(), Some(1), "some targets failed: {run}");
    assert!(!run.panicked(), "{run}");
    check(&image, &a);
    check(&image, &b);
    let port = format!(":{}", broken.port().expect("a TCP export"));
    let failed_line = run
        .stderr
        .lines()
        .find(|l| l.contains(&port))
        .unwrap_or_else(|| panic!("no line names the failed target: {run}"));
    assert!(failed_line.contains("write"), "what failed: {failed_line}");
    assert!(run.stdout.starts_with("copied "), "{run}");
    assert!(
        !run.stdout.contains(&port),
        "only the written targets: {run}"
    );
}

#[test]
fn verify_fails_only_the_target_that_lost_its_writes() {
    let dir = scratch_dir();
    let image = image(dir.path());
    let null = NbdServer::nbdkit(
        &["null", &format!("size={}", image.size)],
        &Nbdkit::default(),
    );
    let a = dir.path().join("a.img");
    let run = ferry!().run([
        "copy".as_ref(),
        "--verify".as_ref(),
        image.path.as_os_str(),
        null.uri().as_ref(),
        a.as_os_str(),
    ]);
    assert_eq!(run.status.code(), Some(1), "{run}");
    check(&image, &a);
    let port = format!(":{}", null.port().expect("a TCP export"));
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains("verify failed"))
        .unwrap_or_else(|| panic!("no verify failure: {run}"));
    assert!(line.contains(&port), "{line}");
}

#[test]
fn every_target_failing_is_a_clean_failure() {
    let dir = scratch_dir();
    let image = image(dir.path());
    let servers: Vec<NbdServer> = (0..2)
        .map(|_| {
            NbdServer::nbdkit(
                &[
                    "memory",
                    &format!("size={}", image.size),
                    "error-pwrite=EIO",
                    "error-pwrite-rate=100%",
                ],
                &Nbdkit {
                    filters: vec!["error".into()],
                    ..Nbdkit::default()
                },
            )
        })
        .collect();
    let run = ferry!().run([
        "copy".to_string(),
        image.path.display().to_string(),
        servers[0].uri(),
        servers[1].uri(),
    ]);
    let line = run.assert_clean_failure();
    assert!(line.contains("every one of the 2 targets failed"), "{line}");
    assert!(run.stdout.is_empty(), "{run}");
}
