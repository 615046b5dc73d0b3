//! Verify-after-copy into a target larger than the image (an existing disk, a volume
//! bigger than the image: the usual case in a cluster), through the job service and
//! through `ferry copy --verify`, into a larger file and a larger block device (a loop
//! device: these tests need root and `losetup`). Both front doors take the engine's one
//! copy-then-verify path, which hashes the target's first `image size` bytes, read back
//! after the flush. A target that loses its writes still fails verification, and the
//! bytes past the image stay as they were.
//!
//! Also here: the service confines NBD Unix sockets to the allowed roots like files.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ferry_api::proto::{self, JobState};
use ferry_server::config::ServiceConfig;
use ferry_server::server::RunningService;
use ferry_testkit::files::LoopDevice;
use ferry_tests::check::blkhash_file;
use ferry_tests::ferry;
use ferry_tests::nbd_servers::{NbdServer, Nbdkit, QemuNbd};
use ferry_tests::service_support::*;
use tonic::Code;

const MIB: u64 = 1 << 20;
/// The image of the issue: 64 MiB into an existing 128 MiB target.
const IMAGE: u64 = 64 * MIB;
const TARGET: u64 = 128 * MIB;
/// What the larger target holds before the copy: not zero, so a hash of the whole target
/// could never match the image's.
const FILL: u8 = 0xa5;
const LIMIT: Duration = Duration::from_secs(300);

/// A file of `size` bytes of [`FILL`].
fn filled(path: &Path, size: u64) -> PathBuf {
    let chunk = vec![FILL; MIB as usize];
    let mut file = std::fs::File::create(path).expect("create the target");
    for _ in 0..size / MIB {
        std::io::Write::write_all(&mut file, &chunk).expect("fill the target");
    }
    file.sync_all().expect("sync the target");
    path.to_path_buf()
}

/// Fails unless `target` starts with the bytes of `image` and holds only [`FILL`] after
/// them, up to `size`.
fn assert_image_then_fill(image: &Path, target: &Path, size: u64) {
    let mut want = std::fs::File::open(image).expect("open the image");
    let mut have = std::fs::File::open(target).expect("open the target");
    let (mut a, mut b) = (vec![0u8; MIB as usize], vec![0u8; MIB as usize]);
    let mut offset = 0u64;
    while offset < size {
        have.read_exact(&mut b)
            .unwrap_or_else(|e| panic!("read {} at {offset}: {e}", target.display()));
        if offset < IMAGE {
            want.read_exact(&mut a).expect("read the image");
            assert!(
                a == b,
                "{} differs from the image in the MiB at {offset}",
                target.display()
            );
        } else {
            assert!(
                b.iter().all(|&x| x == FILL),
                "{} changed past the image, in the MiB at {offset}",
                target.display()
            );
        }
        offset += MIB;
    }
}

struct Env {
    dir: tempfile::TempDir,
    root: PathBuf,
    service: RunningService,
    client: Client,
}

async fn env_with(configure: impl FnOnce(&mut ServiceConfig)) -> Env {
    let dir = ferry_tests::scratch_dir();
    let root = dir.path().join("images");
    std::fs::create_dir(&root).unwrap();
    let mut cfg = test_config(&dir.path().join("data"), &root);
    configure(&mut cfg);
    let service = start_in_process(cfg).await;
    let client = connect(service.grpc_addr()).await;
    Env {
        dir,
        root,
        service,
        client,
    }
}

/// Runs a verified transfer from `src` to the target `url` through the service.
async fn verified_transfer(e: &mut Env, src: &Path, url: &str) -> proto::Job {
    let mut req = transfer(src, Path::new(url));
    req.options.as_mut().unwrap().verify = true;
    let job = e.client.start_transfer(req).await.unwrap().into_inner();
    wait_terminal(&mut e.client, &job.id, LIMIT).await
}

/// Fails unless the job succeeded with equal digests that are the image's block hash.
fn assert_verified(job: &proto::Job, image: &Path) {
    assert_eq!(state(job), JobState::Succeeded, "{:?}", job.error);
    let Some(proto::job::Result::TransferResult(r)) = &job.result else {
        panic!("no transfer result: {job:?}")
    };
    assert_eq!(r.size, IMAGE);
    let (s, t) = (
        r.source_digest.clone().unwrap(),
        r.target_digest.clone().unwrap(),
    );
    assert_eq!(s, t);
    assert_eq!(s.hex, blkhash_file(image));
}

/// The case: a 64 MiB image copied with verify into an existing 128 MiB file.
#[tokio::test]
async fn service_verifies_a_copy_into_a_larger_file() {
    let mut e = env_with(|_| {}).await;
    let src = make_image(&e.root.join("src.img"), IMAGE, 7);
    let dst = filled(&e.root.join("disk.img"), TARGET);
    let job = verified_transfer(&mut e, &src, dst.to_str().unwrap()).await;
    assert_verified(&job, &src);
    assert_eq!(std::fs::metadata(&dst).unwrap().len(), TARGET);
    assert_image_then_fill(&src, &dst, TARGET);
    e.service.shutdown().await;
}

#[tokio::test]
async fn service_verifies_a_copy_into_a_larger_block_device() {
    let mut e = env_with(|cfg| cfg.allow_roots.push(PathBuf::from("/dev"))).await;
    let src = make_image(&e.root.join("src.img"), IMAGE, 8);
    let backing = filled(&e.dir.path().join("device.img"), TARGET);
    let device = LoopDevice::attach(&backing);
    let job = verified_transfer(&mut e, &src, device.path.to_str().unwrap()).await;
    assert_verified(&job, &src);
    assert_image_then_fill(&src, &device.path, TARGET);
    e.service.shutdown().await;
}

/// A larger target that loses every write (nbdkit's null plugin reads back zeroes): the
/// copy cannot notice, the verification must, and the job fails as corrupt.
#[tokio::test]
async fn service_fails_a_larger_target_that_loses_writes() {
    let mut e = env_with(|_| {}).await;
    let src = make_image(&e.root.join("src.img"), IMAGE, 9);
    let server = NbdServer::nbdkit(&["null", &format!("size={TARGET}")], &Nbdkit::default());
    let job = verified_transfer(&mut e, &src, &server.uri()).await;
    assert_eq!(state(&job), JobState::Failed, "{job:?}");
    let error = job.error.expect("an error");
    assert_eq!(error.kind, "corrupt", "{error:?}");
    assert!(error.message.contains("verify failed"), "{error:?}");
    assert!(error.message.contains(&blkhash_file(&src)), "{error:?}");
    e.service.shutdown().await;
}

/// An `nbd+unix://` URL names a socket on the server's host: only sockets under an
/// allowed root are accepted (PERMISSION_DENIED otherwise, like files); one under a root
/// copies like any NBD export.
#[tokio::test]
async fn service_confines_nbd_unix_sockets_to_the_allowed_roots() {
    let images = ferry_tests::scratch_dir();
    let src = make_image(&images.path().join("src.img"), 4 * MIB, 10);
    let mut e = env_with(|_| {}).await;
    let server = NbdServer::qemu_nbd(
        &src,
        &QemuNbd {
            unix: true,
            read_only: true,
            ..QemuNbd::default()
        },
    );
    let dst = e.root.join("dst.img");
    for url in [
        "nbd+unix:///?socket=/run/some.sock".to_string(),
        server.uri(),
    ] {
        let req = StartTransferRequest {
            source: endpoint(url.clone()),
            ..transfer(&src, &dst)
        };
        let status = e.client.start_transfer(req).await.unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied, "{url}: {status:?}");
        assert!(status.message().contains("NBD socket"), "{status:?}");
    }
    e.service.shutdown().await;

    let socket_dir = server.dir().to_path_buf();
    let mut e = env_with(|cfg| cfg.allow_roots.push(socket_dir)).await;
    let dst = e.root.join("dst.img");
    let req = StartTransferRequest {
        source: endpoint(server.uri()),
        ..transfer(&src, &dst)
    };
    let job = e.client.start_transfer(req).await.unwrap().into_inner();
    let done = wait_terminal(&mut e.client, &job.id, LIMIT).await;
    assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
    assert_same_image(&src, &dst);
    e.service.shutdown().await;
}

/// `ferry copy --verify --json SRC DST`: succeeds with the image's block hash on both
/// sides, or fails with one line.
fn cli_verified_copy(src: &Path, dst: &str) -> serde_json::Value {
    let run = ferry!().run([
        "copy".as_ref(),
        "--verify".as_ref(),
        "--json".as_ref(),
        src.as_os_str(),
        dst.as_ref(),
    ]);
    run.assert_success();
    let summary: serde_json::Value = serde_json::from_str(run.stdout.trim()).expect("JSON");
    let digests = &summary["digests"];
    assert_eq!(digests["source"], digests["target"], "{summary}");
    assert_eq!(digests["source"], blkhash_file(src).as_str(), "{summary}");
    assert_eq!(summary["size"], IMAGE, "{summary}");
    summary
}

#[test]
fn cli_verifies_a_copy_into_a_larger_file() {
    let dir = ferry_tests::scratch_dir();
    let src = make_image(&dir.path().join("src.img"), IMAGE, 11);
    let dst = filled(&dir.path().join("disk.img"), TARGET);
    cli_verified_copy(&src, dst.to_str().unwrap());
    assert_eq!(std::fs::metadata(&dst).unwrap().len(), TARGET);
    assert_image_then_fill(&src, &dst, TARGET);
}

#[test]
fn cli_verifies_a_copy_into_a_larger_block_device() {
    let dir = ferry_tests::scratch_dir();
    let src = make_image(&dir.path().join("src.img"), IMAGE, 12);
    let backing = filled(&dir.path().join("device.img"), TARGET);
    let device = LoopDevice::attach(&backing);
    cli_verified_copy(&src, device.path.to_str().unwrap());
    assert_image_then_fill(&src, &device.path, TARGET);
}

#[test]
fn cli_fails_a_larger_target_that_loses_writes() {
    let dir = ferry_tests::scratch_dir();
    let src = make_image(&dir.path().join("src.img"), IMAGE, 13);
    let server = NbdServer::nbdkit(&["null", &format!("size={TARGET}")], &Nbdkit::default());
    let uri = server.uri();
    let run = ferry!().run([
        "copy".as_ref(),
        "--verify".as_ref(),
        src.as_os_str(),
        uri.as_ref(),
    ]);
    let line = run.assert_clean_failure();
    assert!(line.contains("verify failed"), "{line}");
    assert!(line.contains(&blkhash_file(&src)), "{line}");
}
