//! Copies and checksums through the NBD endpoint with the real engine, against qemu-nbd
//! and nbdkit started here: nbd->file, file->nbd, nbd->nbd both ways, qcow2 behind
//! qemu-nbd, fault injection (nbdkit error and delay filters), unusual block sizes
//! (blocksize and blocksize-policy filters), and a server killed mid-copy.
//!
//! Every copy is checked with `qemu-img compare` after the servers stopped, and for
//! sparseness by the target file's allocated blocks.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{EndpointSpec, ErrorKind, IoBuf, Source, Target, ZeroMode};
use ferry_endpoints::nbd::{NbdOptions, NbdSource, NbdTarget};
use ferry_engine::{
    checksum, copy, CancellationToken, ChecksumOptions, CopyOptions, CopyReport, Progress,
};
use ferry_tests::check::{
    allocated_bytes, assert_allocated_about, blkhash_file, qemu_img_compare, require_tool,
};
use ferry_tests::copying::{self, copy_urls, source, target};
use ferry_tests::images::{self, Image, Pattern};
use ferry_tests::nbd_servers::{nbd_data_bytes, NbdServer, Nbdkit, QemuNbd, TlsCerts};
use ferry_tests::scratch_dir;

/// A copy with the default options.
async fn run_copy(src: &str, dst: &str) -> ferry_core::Result<CopyReport> {
    copy_urls(src, dst, &CopyOptions::default()).await
}

/// A copy between endpoints already open, with the default options.
async fn copy_endpoints(s: Arc<dyn Source>, t: Arc<dyn Target>) -> ferry_core::Result<CopyReport> {
    copying::run(s, t, &CopyOptions::default()).await
}

const MIB: u64 = 1 << 20;
/// Test images: 16 data runs of 1 MiB in 32 MiB, plus an unaligned tail.
const SIZE: u64 = 32 * MIB + 3 * 4096;

fn half_data(dir: &Path, name: &str, seed: u64) -> Image {
    images::make(&dir.join(name), Pattern::HalfData, SIZE, seed).unwrap()
}

fn file_plugin(path: &Path, filters: &[&str], params: &[&str]) -> NbdServer {
    let mut args = vec!["file", path.to_str().unwrap()];
    args.extend_from_slice(params);
    NbdServer::nbdkit(
        &args,
        &Nbdkit {
            filters: filters.iter().map(|s| s.to_string()).collect(),
            ..Nbdkit::default()
        },
    )
}

fn qemu_raw(path: &Path) -> NbdServer {
    NbdServer::qemu_nbd(
        path,
        &QemuNbd {
            export: "disk".into(),
            ..QemuNbd::default()
        },
    )
}

#[tokio::test]
async fn qemu_nbd_to_file_is_exact_and_sparse() {
    let dir = scratch_dir();
    let image = half_data(dir.path(), "src.raw", 1);
    let out = dir.path().join("dst.raw");
    let mut server = qemu_raw(&image.path);
    let report = run_copy(&server.uri(), out.to_str().unwrap())
        .await
        .unwrap();
    assert_eq!(report.size, SIZE);
    assert!(report.zero_bytes > 0, "holes were reported as zero extents");
    server.stop();
    qemu_img_compare(&image.path, &out);
    assert_allocated_about(&out, image.nonzero_block_bytes);
}

#[tokio::test]
async fn file_to_nbdkit_file_is_exact_and_sparse() {
    let dir = scratch_dir();
    let image = half_data(dir.path(), "src.raw", 2);
    let backing = dir.path().join("dst.raw");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(SIZE)
        .unwrap();
    let mut server = file_plugin(&backing, &[], &[]);
    run_copy(image.path.to_str().unwrap(), &server.uri())
        .await
        .unwrap();
    let mapped = nbd_data_bytes(&server.uri());
    assert!(
        mapped <= image.nonzero_block_bytes + MIB,
        "nbdinfo --map reports {mapped} data bytes"
    );
    server.stop();
    qemu_img_compare(&image.path, &backing);
    assert_allocated_about(&backing, image.nonzero_block_bytes);
}

/// qemu-nbd -> nbdkit over a target full of garbage: the holes must be zeroed (and
/// punched), then nbdkit -> qemu-nbd over a fresh sparse target.
#[tokio::test]
async fn nbd_to_nbd_both_orders() {
    let dir = scratch_dir();
    let image = half_data(dir.path(), "src.raw", 3);
    let garbage = images::make(&dir.path().join("mid.raw"), Pattern::Random, SIZE, 99).unwrap();
    let mut from = qemu_raw(&image.path);
    let mut to = file_plugin(&garbage.path, &[], &[]);
    run_copy(&from.uri(), &to.uri()).await.unwrap();
    from.stop();
    to.stop();
    qemu_img_compare(&image.path, &garbage.path);
    assert_allocated_about(&garbage.path, image.nonzero_block_bytes);

    let last = dir.path().join("last.raw");
    std::fs::File::create(&last).unwrap().set_len(SIZE).unwrap();
    let mut from = file_plugin(&garbage.path, &[], &[]);
    let mut to = qemu_raw(&last);
    run_copy(&from.uri(), &to.uri()).await.unwrap();
    from.stop();
    to.stop();
    qemu_img_compare(&image.path, &last);
    assert_allocated_about(&last, image.nonzero_block_bytes);
}

#[tokio::test]
async fn qcow2_through_qemu_nbd_to_file() {
    require_tool("qemu-img", "qemu-utils");
    let dir = scratch_dir();
    let image = half_data(dir.path(), "src.raw", 4);
    let qcow2 = dir.path().join("src.qcow2");
    let status = Command::new("qemu-img")
        .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
        .arg(&image.path)
        .arg(&qcow2)
        .status()
        .unwrap();
    assert!(status.success());
    let mut server = NbdServer::qemu_nbd(
        &qcow2,
        &QemuNbd {
            format: Some("qcow2".into()),
            read_only: true,
            ..QemuNbd::default()
        },
    );
    let out = dir.path().join("dst.raw");
    run_copy(&server.uri(), out.to_str().unwrap())
        .await
        .unwrap();
    server.stop();
    let cmp = Command::new("qemu-img")
        .args(["compare", "-f", "qcow2", "-F", "raw"])
        .arg(&qcow2)
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        cmp.status.success(),
        "{}",
        String::from_utf8_lossy(&cmp.stdout)
    );
    assert_allocated_about(&out, image.nonzero_block_bytes);
}

#[tokio::test]
async fn checksum_over_nbd_equals_the_file_behind_it() {
    let dir = scratch_dir();
    let image = half_data(dir.path(), "src.raw", 5);
    let expected = blkhash_file(&image.path);
    for server in [qemu_raw(&image.path), file_plugin(&image.path, &[], &[])] {
        let s = source(&server.uri()).await.unwrap();
        let digest = checksum(
            s,
            &ChecksumOptions::default(),
            &Progress::new(),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        assert_eq!(digest.hex(), expected, "{}", server.command_line());
    }
}

#[tokio::test]
async fn server_write_errors_name_the_operation_and_offset() {
    let dir = scratch_dir();
    let image = half_data(dir.path(), "src.raw", 6);
    let backing = dir.path().join("dst.raw");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(SIZE)
        .unwrap();
    let server = file_plugin(
        &backing,
        &["error"],
        &["error=EIO", "error-pwrite-rate=100%"],
    );
    let err = run_copy(image.path.to_str().unwrap(), &server.uri())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert_eq!(err.context().operation, Some("write"), "{err}");
    assert!(err.context().offset.is_some(), "{err}");
    let text = err.to_string();
    assert!(text.contains("EIO"), "{text}");
    assert!(text.contains(&server.uri()), "{text}");
}

#[tokio::test]
async fn server_read_errors_name_the_operation_and_offset() {
    let dir = scratch_dir();
    let image = half_data(dir.path(), "src.raw", 7);
    let server = file_plugin(
        &image.path,
        &["error"],
        &["error=EIO", "error-pread-rate=100%"],
    );
    let out = dir.path().join("dst.raw");
    let err = run_copy(&server.uri(), out.to_str().unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert_eq!(err.context().operation, Some("read"), "{err}");
    let offset = err.context().offset.expect("an offset");
    assert!(offset < SIZE);
    assert!(err.to_string().contains("EIO"), "{err}");
}

#[tokio::test]
async fn delayed_servers_still_copy_exactly() {
    let dir = scratch_dir();
    let image = half_data(dir.path(), "src.raw", 8);
    let backing = dir.path().join("dst.raw");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(SIZE)
        .unwrap();
    let mut from = file_plugin(
        &image.path,
        &["delay"],
        &["rdelay=3ms", "delay-extents=5ms"],
    );
    let mut to = file_plugin(&backing, &["delay"], &["wdelay=3ms", "delay-zero=3ms"]);
    run_copy(&from.uri(), &to.uri()).await.unwrap();
    from.stop();
    to.stop();
    qemu_img_compare(&image.path, &backing);
    assert_allocated_about(&backing, image.nonzero_block_bytes);
}

/// Unusual limits the client must honour (the policy filter fails every request that
/// breaks them), over a plugin that can only take small odd-sized requests.
#[tokio::test]
async fn unusual_block_sizes_still_copy_exactly() {
    let dir = scratch_dir();
    let image = half_data(dir.path(), "src.raw", 9);
    let policy = [
        "blocksize-minimum=4096",
        "blocksize-preferred=16384",
        "blocksize-maximum=20480",
        "blocksize-error-policy=error",
        "minblock=4096",
        "maxdata=12288",
    ];
    let mut from = file_plugin(&image.path, &["blocksize-policy", "blocksize"], &policy);
    let s = source(&from.uri()).await.unwrap();
    let caps = s.caps();
    assert_eq!(caps.block.minimum, 4096);
    assert_eq!(caps.block.maximum, 20480);
    drop(s);
    let backing = dir.path().join("dst.raw");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(SIZE)
        .unwrap();
    let mut to = file_plugin(&backing, &["blocksize-policy", "blocksize"], &policy);
    run_copy(&from.uri(), &to.uri()).await.unwrap();
    from.stop();
    to.stop();
    qemu_img_compare(&image.path, &backing);
}

#[tokio::test]
async fn killing_the_server_mid_copy_fails_promptly() {
    let dir = scratch_dir();
    let image = images::make(&dir.path().join("src.raw"), Pattern::Random, SIZE, 10).unwrap();
    // One request at a time, 100 ms each: the copy takes seconds, the kill lands mid-way.
    let mut server = file_plugin(
        &image.path,
        &["noparallel", "delay"],
        &["serialize=all-requests", "rdelay=100ms"],
    );
    let spec = nbd_spec(&server.uri());
    let options = NbdOptions {
        request_timeout: Some(Duration::from_secs(20)),
        ..NbdOptions::default()
    };
    let s: Arc<dyn Source> = Arc::new(NbdSource::open(&spec, &options).await.unwrap());
    let out = dir.path().join("dst.raw");
    let t = target(out.to_str().unwrap(), SIZE).await.unwrap();
    let progress = Progress::new();
    let task = tokio::spawn({
        let progress = progress.clone();
        async move {
            copy(
                s,
                t,
                &CopyOptions::default(),
                &progress,
                &CancellationToken::new(),
            )
            .await
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while progress.snapshot().done == 0 {
        assert!(Instant::now() < deadline, "the copy made no progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let killed = Instant::now();
    server.kill();
    let result = tokio::time::timeout(Duration::from_secs(25), task)
        .await
        .expect("the copy hung after the server was killed")
        .unwrap();
    let err = result.expect_err("the copy cannot succeed without its server");
    assert_eq!(err.kind(), ErrorKind::Disconnected, "{err}");
    assert!(err.to_string().contains("closed the connection"), "{err}");
    assert!(killed.elapsed() < Duration::from_secs(25));
}

/// nbds:// with tls-certificates=DIR, through open_source, the engine and back.
#[tokio::test]
async fn copy_over_tls_from_a_url() {
    let certs = TlsCerts::generate();
    let dir = scratch_dir();
    let image = half_data(dir.path(), "src.raw", 11);
    let mut server = NbdServer::qemu_nbd(
        &image.path,
        &QemuNbd {
            export: "secure".into(),
            tls: Some(certs.dir().to_path_buf()),
            read_only: true,
            ..QemuNbd::default()
        },
    );
    let uri = server.uri_with(&[format!("tls-certificates={}", certs.dir().display())]);
    assert!(uri.starts_with("nbds://"), "{uri}");
    let out = dir.path().join("dst.raw");
    run_copy(&uri, out.to_str().unwrap()).await.unwrap();
    // Without certificates the error says what to do.
    let plain = uri.replace("nbds://", "nbd://");
    let plain = plain.split('?').next().unwrap();
    let err = run_copy(plain, out.to_str().unwrap()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains("requires TLS"), "{err}");
    server.stop();
    qemu_img_compare(&image.path, &out);
}

/// A server without CAN_MULTI_CONN: every worker shares the one connection.
#[tokio::test]
async fn single_connection_servers_are_shared_by_all_workers() {
    let dir = scratch_dir();
    let image = half_data(dir.path(), "src.raw", 12);
    let backing = dir.path().join("dst.raw");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(SIZE)
        .unwrap();
    let single = ["multi-conn-mode=disable"];
    let mut from = file_plugin(&image.path, &["multi-conn"], &single);
    let mut to = file_plugin(&backing, &["multi-conn"], &single);
    let s = source(&from.uri()).await.unwrap();
    assert!(!s.caps().multi_conn);
    let t = target(&to.uri(), SIZE).await.unwrap();
    assert!(!t.caps().multi_conn);
    copy_endpoints(s, t).await.unwrap();
    from.stop();
    to.stop();
    qemu_img_compare(&image.path, &backing);
}

/// ZeroMode::Allocate sends NO_HOLE: the target stays fully allocated.
#[tokio::test]
async fn allocate_mode_keeps_the_target_allocated() {
    let dir = scratch_dir();
    let image = half_data(dir.path(), "src.raw", 13);
    let garbage = images::make(&dir.path().join("dst.raw"), Pattern::Random, SIZE, 77).unwrap();
    let mut from = qemu_raw(&image.path);
    let mut to = file_plugin(&garbage.path, &[], &[]);
    let s = source(&from.uri()).await.unwrap();
    let t = target(&to.uri(), SIZE).await.unwrap();
    let options = CopyOptions {
        zero_mode: ZeroMode::Allocate,
        ..CopyOptions::default()
    };
    copy(s, t, &options, &Progress::new(), &CancellationToken::new())
        .await
        .unwrap();
    from.stop();
    to.stop();
    qemu_img_compare(&image.path, &garbage.path);
    let allocated = allocated_bytes(&garbage.path);
    assert!(
        allocated >= SIZE - 4096,
        "NO_HOLE zeroing left holes: {allocated} of {SIZE} bytes allocated"
    );
}

fn nbd_spec(uri: &str) -> ferry_core::spec::NbdSpec {
    match EndpointSpec::parse(uri).unwrap() {
        EndpointSpec::Nbd(spec) => spec,
        other => panic!("not an NBD URL: {other:?}"),
    }
}

/// The target flushes in the background while the copy runs, not only at the end.
#[tokio::test]
async fn targets_flush_in_the_background_during_the_copy() {
    let dir = scratch_dir();
    let image = half_data(dir.path(), "src.raw", 14);
    let backing = dir.path().join("dst.raw");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(SIZE)
        .unwrap();
    let log = dir.path().join("nbdkit.log");
    let logfile = format!("logfile={}", log.display());
    let mut server = file_plugin(&backing, &["log"], &[&logfile]);
    let options = NbdOptions {
        background_flush: 2 * MIB,
        ..NbdOptions::default()
    };
    let s = source(image.path.to_str().unwrap()).await.unwrap();
    let t: Arc<dyn Target> = Arc::new(
        NbdTarget::open(&nbd_spec(&server.uri()), SIZE, &options)
            .await
            .unwrap(),
    );
    copy_endpoints(s, t).await.unwrap();
    server.stop();
    qemu_img_compare(&image.path, &backing);
    let log = std::fs::read_to_string(&log).unwrap();
    let flushes = log.lines().filter(|l| l.contains(" Flush id=")).count();
    // 16 MiB of data in 2 MiB steps: several background flushes plus the final one.
    assert!(
        flushes >= 3,
        "{flushes} flushes logged, expected background flushes too:\n{log}"
    );
}

/// A background flush that fails makes the final flush fail, even when the server's
/// answer to the final FLUSH itself is success.
#[tokio::test]
async fn a_failed_background_flush_fails_the_final_flush() {
    let dir = scratch_dir();
    let trigger = dir.path().join("fail-flush");
    let ran = dir.path().join("flush-ran");
    let size = 8 * MIB;
    let get_size = format!("get_size=echo {size}");
    let flush = format!(
        "flush=touch '{}'; if [ -f '{}' ]; then echo 'EIO injected flush failure' >&2; exit 1; fi",
        ran.display(),
        trigger.display()
    );
    let mut server = NbdServer::nbdkit(
        &[
            "eval",
            &get_size,
            "pread=head -c $3 /dev/zero",
            "pwrite=cat >/dev/null",
            &flush,
        ],
        &Nbdkit::default(),
    );
    let options = NbdOptions {
        background_flush: MIB,
        ..NbdOptions::default()
    };
    let t = NbdTarget::open(&nbd_spec(&server.uri()), size, &options)
        .await
        .unwrap();
    std::fs::write(&trigger, b"").unwrap();
    let mut buf = IoBuf::new(2 * MIB as usize);
    buf.set_len(2 * MIB as usize);
    buf.fill(7);
    t.write_at(0, buf).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ran.exists() {
        assert!(
            Instant::now() < deadline,
            "no background flush reached the server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::fs::remove_file(&trigger).unwrap();
    let err = t.flush().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert_eq!(err.context().operation, Some("flush"), "{err}");
    assert!(err.to_string().contains("EIO"), "{err}");
    // Reported once: the next flush is the server's own answer.
    t.flush().await.unwrap();
    drop(t);
    server.stop();
}
