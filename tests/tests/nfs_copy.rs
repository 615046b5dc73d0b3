//! Copies through the NFS endpoints with the real engine, against nfs-ganesha started
//! here, each run for NFSv3 and NFSv4 (`name::v3`, `name::v4`): file->nfs, nfs->file,
//! nfs->nbd and nbd->nfs (qemu-nbd), unaligned sizes, new and existing targets; then
//! faults: the server restarted mid-copy (reads go on; UNSTABLE writes made before the
//! restart are reported lost by the COMMIT verifier check instead of passing), and for
//! NFSv3 the server stopped mid-copy (a clear error within the reconnect window). What
//! only NFSv4 does (SEEK, DEALLOCATE, sessions, recovery) is tested in nfs_v4.rs.
//!
//! Every copy is checked with `qemu-img compare` against the file behind the export and
//! with the block hash, and new NFS targets for sparseness.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{ErrorKind, Source, Target};
use ferry_endpoints::nfs::{Nfs4Source, Nfs4Target, NfsOptions, NfsSource, NfsTarget};
use ferry_engine::{CopyOptions, CopyReport};
use ferry_tests::check::{assert_allocated_about, blkhash_file, qemu_img_compare};
use ferry_tests::copying::{blkhash_of, copy_urls, run, source, target};
use ferry_tests::images::{self, Image, Pattern};
use ferry_tests::nbd_servers::{NbdServer, QemuNbd};
use ferry_tests::nfs_server::{nfs_spec as spec, Ganesha};
use ferry_tests::{nfs_versions, scratch_dir};

/// A copy with the default options.
async fn run_copy(src: &str, dst: &str) -> ferry_core::Result<CopyReport> {
    copy_urls(src, dst, &CopyOptions::default()).await
}

const MIB: u64 = 1 << 20;
/// 12 data runs of 1 MiB in 24 MiB, and a tail that is not a multiple of any block size.
const SIZE: u64 = 24 * MIB + 12_345;

fn half_data(path: &Path, seed: u64) -> Image {
    images::make(path, Pattern::HalfData, SIZE, seed).unwrap()
}

nfs_versions!(
    file_to_nfs_new_target_is_exact_and_sparse,
    nfs_to_file_is_exact_and_sparse,
    nfs_to_nbd_and_nbd_to_nfs,
    unaligned_sizes_copy_exactly_both_ways,
    source_server_restarted_mid_copy_is_survived,
    target_server_restarted_before_commit_reports_lost_writes,
);

async fn file_to_nfs_new_target_is_exact_and_sparse(version: u8) {
    let server = Ganesha::start();
    let dir = scratch_dir();
    let image = half_data(&dir.path().join("src.raw"), 1);
    let report = run_copy(
        image.path.to_str().unwrap(),
        &server.url_for(version, "dst.raw"),
    )
    .await
    .unwrap();
    assert_eq!(report.size, SIZE);
    let backing = server.path("dst.raw");
    assert_eq!(std::fs::metadata(&backing).unwrap().len(), SIZE);
    qemu_img_compare(&image.path, &backing);
    // Zero ranges were skipped on the new target: only the data is allocated.
    assert_allocated_about(&backing, image.nonzero_block_bytes);
    assert_eq!(
        blkhash_of(&server.url_for(version, "dst.raw")).await,
        blkhash_file(&image.path)
    );
}

async fn nfs_to_file_is_exact_and_sparse(version: u8) {
    let server = Ganesha::start();
    let dir = scratch_dir();
    let image = half_data(&server.path("src.raw"), 2);
    let out = dir.path().join("dst.raw");
    let report = run_copy(&server.url_for(version, "src.raw"), out.to_str().unwrap())
        .await
        .unwrap();
    assert_eq!(report.size, SIZE);
    assert!(
        report.zero_bytes >= SIZE / 3,
        "zero blocks were found in the data read: {report:?}"
    );
    qemu_img_compare(&image.path, &out);
    assert_allocated_about(&out, image.nonzero_block_bytes);
    assert_eq!(blkhash_file(&out), blkhash_file(&image.path));
}

/// nfs -> nbd into a target full of garbage (zeroes must be written: with NFSv4 the holes
/// SEEK reports), then nbd -> nfs over an existing NFS file full of garbage (the NFS
/// target's write_zeroes path).
async fn nfs_to_nbd_and_nbd_to_nfs(version: u8) {
    let server = Ganesha::start();
    let dir = scratch_dir();
    let image = half_data(&server.path("src.raw"), 3);
    let mid = images::make(&dir.path().join("mid.raw"), Pattern::Random, SIZE, 9).unwrap();
    let mut nbd = NbdServer::qemu_nbd(
        &mid.path,
        &QemuNbd {
            export: "disk".into(),
            ..QemuNbd::default()
        },
    );
    let report = run_copy(&server.url_for(version, "src.raw"), &nbd.uri())
        .await
        .unwrap();
    assert!(report.zero_bytes >= SIZE / 3, "{report:?}");
    nbd.stop();
    qemu_img_compare(&image.path, &mid.path);
    assert_eq!(blkhash_file(&mid.path), blkhash_file(&image.path));

    // qemu-nbd serves whole 512-byte sectors: the source is SIZE rounded up.
    let served = SIZE.div_ceil(512) * 512;
    let garbage = images::make(&server.path("back.raw"), Pattern::Random, served, 10).unwrap();
    let mut nbd = NbdServer::qemu_nbd(
        &mid.path,
        &QemuNbd {
            export: "disk".into(),
            read_only: true,
            ..QemuNbd::default()
        },
    );
    let t = target(&server.url_for(version, "back.raw"), served)
        .await
        .unwrap();
    assert!(!t.is_zero(), "an existing NFS file is not known to be zero");
    let s = source(&nbd.uri()).await.unwrap();
    run(s, t, &CopyOptions::default()).await.unwrap();
    nbd.stop();
    // The image plus the zeroed tail of the last sector.
    qemu_img_compare(&image.path, &garbage.path);
    assert_eq!(
        blkhash_of(&server.url_for(version, "back.raw")).await,
        blkhash_file(&garbage.path)
    );
}

/// A slow copy (rate limited) whose server goes away; short timeouts for the test.
fn fault_options() -> NfsOptions {
    NfsOptions {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
        reconnect_timeout: Duration::from_secs(3),
        privileged_port: None,
    }
}

/// Short timeouts, with a reconnect window that covers a restart.
fn restart_options() -> NfsOptions {
    NfsOptions {
        reconnect_timeout: Duration::from_secs(30),
        ..fault_options()
    }
}

fn slow() -> CopyOptions {
    CopyOptions {
        rate_limit: Some(4 * MIB),
        // Checkpoint (flush) only at the end, so writes stay uncommitted until then.
        checkpoint_interval: Duration::ZERO,
        ..CopyOptions::default()
    }
}

#[tokio::test]
async fn server_stopped_mid_copy_fails_clearly_within_the_timeout() {
    let mut server = Ganesha::start();
    let dir = scratch_dir();
    let image = half_data(&dir.path().join("src.raw"), 4);
    let s = source(image.path.to_str().unwrap()).await.unwrap();
    let t: Arc<dyn Target> = Arc::new(
        NfsTarget::open(&spec(&server.url("dst.raw")), SIZE, &fault_options())
            .await
            .unwrap(),
    );
    let copying = tokio::spawn(async move { run(s, t, &slow()).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !copying.is_finished(),
        "the copy must still run when the server stops"
    );
    let stopped = Instant::now();
    tokio::task::spawn_blocking(move || {
        server.stop();
        server
    })
    .await
    .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(30), copying)
        .await
        .expect("the copy must fail within the reconnect window, not hang")
        .unwrap()
        .expect_err("a copy to a stopped server cannot succeed");
    let waited = stopped.elapsed();
    assert!(
        waited < Duration::from_secs(15),
        "failed only after {waited:?}"
    );
    assert!(
        matches!(err.kind(), ErrorKind::Disconnected | ErrorKind::Timeout),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("nfs://127.0.0.1"),
        "names the endpoint: {text}"
    );
    assert!(
        text.contains("connect") || text.contains("connection"),
        "says the connection failed: {text}"
    );
}

/// Opens `name` as a source of the version's own endpoint, so NFSv4 can be asked how
/// it recovered.
async fn open_source(
    server: &Ganesha,
    version: u8,
    name: &str,
) -> (Arc<dyn Source>, Option<Arc<Nfs4Source>>) {
    let spec = spec(&server.url_for(version, name));
    match version {
        3 => {
            let s = NfsSource::open(&spec, &restart_options()).await.unwrap();
            (Arc::new(s), None)
        }
        _ => {
            let s = Arc::new(Nfs4Source::open(&spec, &restart_options()).await.unwrap());
            (s.clone(), Some(s))
        }
    }
}

/// [`open_source`] for a target of `size` bytes.
async fn open_target(
    server: &Ganesha,
    version: u8,
    name: &str,
    size: u64,
) -> (Arc<dyn Target>, Option<Arc<Nfs4Target>>) {
    let spec = spec(&server.url_for(version, name));
    match version {
        3 => {
            let t = NfsTarget::open(&spec, size, &restart_options())
                .await
                .unwrap();
            (Arc::new(t), None)
        }
        _ => {
            let t = Arc::new(
                Nfs4Target::open(&spec, size, &restart_options())
                    .await
                    .unwrap(),
            );
            (t.clone(), Some(t))
        }
    }
}

async fn source_server_restarted_mid_copy_is_survived(version: u8) {
    let mut server = Ganesha::start();
    let dir = scratch_dir();
    let image = half_data(&server.path("src.raw"), 5);
    let out = dir.path().join("dst.raw");
    let (s, v4) = open_source(&server, version, "src.raw").await;
    let t = target(out.to_str().unwrap(), SIZE).await.unwrap();
    let copying = tokio::spawn(async move { run(s, t, &slow()).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !copying.is_finished(),
        "the copy must still run at the restart"
    );
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    copying.await.unwrap().unwrap();
    if let Some(opened) = v4 {
        assert_eq!(opened.recoveries(), (0, 1), "the open was recovered once");
    }
    qemu_img_compare(&image.path, &out);
    assert_eq!(blkhash_file(&out), blkhash_file(&image.path));
    drop(server);
}

async fn target_server_restarted_before_commit_reports_lost_writes(version: u8) {
    let mut server = Ganesha::start();
    let dir = scratch_dir();
    let image = half_data(&dir.path().join("src.raw"), 6);
    let s = source(image.path.to_str().unwrap()).await.unwrap();
    let (t, v4) = open_target(&server, version, "dst.raw", SIZE).await;
    let copying = tokio::spawn(async move { run(s, t, &slow()).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !copying.is_finished(),
        "the copy must still run at the restart"
    );
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    let err = copying
        .await
        .unwrap()
        .expect_err("writes made before the restart were never committed");
    let text = err.to_string();
    assert!(text.contains("restarted"), "{text}");
    assert!(text.contains("write verifier"), "{text}");
    assert_eq!(err.kind(), ErrorKind::Disconnected, "{err}");
    if let Some(opened) = v4 {
        // The writes after the restart went on through the recovered open: the failure
        // is the verifier check's, not a lost session's.
        assert_eq!(opened.recoveries(), (0, 1));
    }
    drop(server);
}

async fn unaligned_sizes_copy_exactly_both_ways(version: u8) {
    let server = Ganesha::start();
    let dir = scratch_dir();
    let size = 3 * MIB + 4097;
    let image = images::make(&dir.path().join("odd.raw"), Pattern::Random, size, 5).unwrap();
    run_copy(
        image.path.to_str().unwrap(),
        &server.url_for(version, "odd.raw"),
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::metadata(server.path("odd.raw")).unwrap().len(),
        size
    );
    qemu_img_compare(&image.path, &server.path("odd.raw"));
    let back = dir.path().join("back.raw");
    run_copy(&server.url_for(version, "odd.raw"), back.to_str().unwrap())
        .await
        .unwrap();
    qemu_img_compare(&image.path, &back);
    assert_eq!(blkhash_file(&back), blkhash_file(&image.path));
    let tiny = images::make(&server.path("tiny.raw"), Pattern::Random, 1000, 6).unwrap();
    let out = dir.path().join("tiny.out");
    run_copy(&server.url_for(version, "tiny.raw"), out.to_str().unwrap())
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(&tiny.path).unwrap()
    );
}
