//! `ferry copy` and `ferry checksum` with NBD URLs, end to end through the binary.

use ferry_tests::check::{assert_allocated_about, blkhash_file, qemu_img_compare};
use ferry_tests::images::{make, Pattern};
use ferry_tests::nbd_servers::{NbdServer, Nbdkit, QemuNbd};
use ferry_tests::{ferry, scratch_dir};

const MIB: u64 = 1 << 20;

#[test]
fn copy_nbd_to_file_and_back_and_checksum() {
    let dir = scratch_dir();
    let src = dir.path().join("src.raw");
    let image = make(&src, Pattern::HalfData, 24 * MIB + 4096, 31).unwrap();
    let mut server = NbdServer::qemu_nbd(
        &src,
        &QemuNbd {
            export: "disk".into(),
            read_only: true,
            ..QemuNbd::default()
        },
    );
    let out = dir.path().join("out.raw");
    ferry!()
        .run(["copy".as_ref(), server.uri().as_ref(), out.as_os_str()])
        .assert_success();

    let run = ferry!().run(["checksum", server.uri().as_str()]);
    run.assert_success();
    let digest = run.stdout.split_whitespace().next().unwrap_or_default();
    assert_eq!(digest, blkhash_file(&src), "{run}");
    server.stop();
    qemu_img_compare(&src, &out);
    assert_allocated_about(&out, image.nonzero_block_bytes);

    // And back into an nbdkit export over a Unix socket.
    let back = dir.path().join("back.raw");
    std::fs::File::create(&back)
        .unwrap()
        .set_len(image.size)
        .unwrap();
    let mut kit = NbdServer::nbdkit(
        &["file", back.to_str().unwrap()],
        &Nbdkit {
            unix: true,
            ..Nbdkit::default()
        },
    );
    assert!(kit.uri().starts_with("nbd+unix:///"), "{}", kit.uri());
    ferry!()
        .run(["copy".as_ref(), out.as_os_str(), kit.uri().as_ref()])
        .assert_success();
    kit.stop();
    qemu_img_compare(&src, &back);
}

#[test]
fn a_missing_export_is_a_clean_failure_naming_the_exports() {
    let dir = scratch_dir();
    let src = dir.path().join("src.raw");
    make(&src, Pattern::Empty, MIB, 1).unwrap();
    let server = NbdServer::qemu_nbd(
        &src,
        &QemuNbd {
            export: "disk".into(),
            ..QemuNbd::default()
        },
    );
    let wrong = server.uri().replace("/disk", "/dsik");
    let out = dir.path().join("out.raw");
    let run = ferry!().run(["copy".as_ref(), wrong.as_ref(), out.as_os_str()]);
    let line = run.assert_clean_failure();
    assert!(
        line.contains("no such export 'dsik'") && line.contains("'disk'"),
        "{line}"
    );
}

#[test]
fn nothing_listening_is_a_clean_failure() {
    let dir = scratch_dir();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = dir.path().join("out.raw");
    let url = format!("nbd://127.0.0.1:{port}/x");
    let run = ferry!().run(["copy".as_ref(), url.as_ref(), out.as_os_str()]);
    let line = run.assert_clean_failure();
    assert!(line.contains("cannot connect"), "{line}");
}
