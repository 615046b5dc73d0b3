//! The conformance suite (ferry-testkit) against every endpoint, each a test against its
//! real server: a file, a block device (a loop device), NBD (qemu-nbd), NFSv3 and NFSv4
//! (nfs-ganesha), iSCSI (tgtd, thin and thick LUNs), S3 (the in-process s3s-fs server) and,
//! as a source only, HTTP (nginx). One body, [`conforms`]; only the constructors differ.
//! Where an endpoint differs (NFSv3, block devices and thick LUNs report no extents), the
//! suite follows its caps; the caps each endpoint must report are asserted here.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferry_core::spec::S3Spec;
use ferry_core::{ExtentKind, Source, Target};
use ferry_endpoints::s3::{S3Source, S3Target, MIN_PART_SIZE};
use ferry_testkit::conformance::{self, Image, TargetFixture};
use ferry_testkit::files::{write_sparse, LoopDevice};
use ferry_testkit::BackedFixture;
use ferry_tests::copying::{source, target};
use ferry_tests::iscsi_server::{Lun, Tgtd};
use ferry_tests::nbd_servers::{NbdServer, Nbdkit, QemuNbd};
use ferry_tests::nfs_server::Ganesha;
use ferry_tests::s3_server::S3Server;
use ferry_tests::scratch_dir;
use parking_lot::Mutex;

const MIB: u64 = 1 << 20;
/// Images that end inside a block and inside a 4 KiB page.
const SIZE: u64 = 3 * MIB + 4097;
/// Sources over a device or LUN hold whole 512-byte blocks: 3 MiB and seven blocks.
const BLOCK_SIZE: u64 = 3 * MIB + 7 * 512;

/// The one body: `source` must hold `image`; targets from `targets` of `target_size`
/// bytes must store what is written to them.
async fn conforms(
    image: &Image,
    source: Arc<dyn Source>,
    targets: &dyn TargetFixture,
    target_size: u64,
) {
    conformance::check_source(source, &image.data).await;
    conformance::check_target(targets, target_size).await;
}

fn image(size: u64) -> Image {
    conformance::test_image(size, 7)
}

fn url(path: &Path) -> String {
    path.to_str().expect("a UTF-8 scratch path").to_string()
}

/// Targets opened by URL, the `n`-th at `url_of(n)`, read back from `path_of(n)`.
fn url_fixture(
    path_of: impl Fn(usize) -> PathBuf + Send + Sync,
    url_of: impl Fn(usize) -> String + Send + Sync,
) -> impl TargetFixture {
    BackedFixture::new(path_of, move |n, size| {
        let url = url_of(n);
        Box::pin(async move { target(&url, size).await })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file() {
    let dir = scratch_dir();
    let image = image(SIZE);
    let src = dir.path().join("src.img");
    write_sparse(&src, &image);
    let s = source(&url(&src)).await.unwrap();
    assert!(s.caps().extents, "a file reports holes: {:?}", s.caps());
    let dst = |n: usize| dir.path().join(format!("dst-{n}.img"));
    conforms(&image, s, &url_fixture(dst, |n| url(&dst(n))), SIZE).await;
}

/// A loop device (root and `losetup` are required, as for the file endpoint's own
/// block-device tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_device() {
    let dir = scratch_dir();
    let image = image(BLOCK_SIZE);
    let src = dir.path().join("src.img");
    write_sparse(&src, &image);
    let src_dev = LoopDevice::attach(&src);
    let s = source(&url(&src_dev.path)).await.unwrap();
    assert!(!s.caps().extents, "a block device cannot report holes");
    let dst = dir.path().join("dst.img");
    std::fs::File::create(&dst)
        .unwrap()
        .set_len(SIZE.div_ceil(512) * 512)
        .unwrap();
    let dst_dev = LoopDevice::attach(&dst);
    let targets = url_fixture(|_| dst_dev.path.clone(), |_| url(&dst_dev.path));
    conforms(&image, s, &targets, SIZE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbd() {
    let dir = scratch_dir();
    let image = image(SIZE);
    let src = dir.path().join("src.img");
    write_sparse(&src, &image);
    // nbdkit serves the file's exact size (qemu-nbd rounds an export up to 512 bytes).
    let file = format!("file={}", src.display());
    let server = NbdServer::nbdkit(&["file", &file], &Nbdkit::default());
    let s = source(&server.uri()).await.unwrap();
    let caps = s.caps();
    assert!(caps.extents && caps.multi_conn, "{caps:?}");
    // One qemu-nbd per target, serving a new file of the target's size.
    let servers = Mutex::new(Vec::new());
    let dst = |n: usize| dir.path().join(format!("dst-{n}.img"));
    let targets = BackedFixture::new(dst, |n, size| {
        std::fs::File::create(dst(n))
            .unwrap()
            .set_len(size)
            .unwrap();
        let server = NbdServer::qemu_nbd(&dst(n), &QemuNbd::default());
        let uri = server.uri();
        servers.lock().push(server);
        Box::pin(async move { target(&uri, size).await })
    });
    conforms(&image, s, &targets, SIZE).await;
}

/// NFS through ganesha, version 3 or 4. The source image is written whole (not sparse):
/// its zero runs are allocated zeroes, so NFSv4.2 SEEK finds only data.
async fn nfs(version: u8) {
    let server = Ganesha::start();
    let url_of = |name: &str| match version {
        3 => server.url(name),
        _ => server.url_v4(name),
    };
    let image = image(SIZE);
    std::fs::write(server.path("src.img"), &image.data).unwrap();
    let s = source(&url_of("src.img")).await.unwrap();
    let caps = s.caps();
    match version {
        3 => assert!(!caps.extents, "NFSv3 cannot report holes"),
        _ => assert!(caps.extents, "NFSv4.2 SEEK reports holes"),
    }
    assert!(caps.multi_conn);
    assert!(caps.block.maximum >= 64 * 1024, "{caps:?}");
    // Each open makes a new file: ganesha caches directory entries, so a file removed
    // behind its back would still be found by name for a while.
    let dst = |n: usize| format!("dst-{n}.img");
    let targets = url_fixture(|n| server.path(&dst(n)), |n| url_of(&dst(n)));
    conforms(&image, s, &targets, SIZE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nfs_v3() {
    nfs(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nfs_v4() {
    nfs(4).await;
}

const IQN: &str = "iqn.2024-01.io.ferry:conformance";

fn iscsi_url(tgt: &Tgtd, iqn: &str) -> String {
    format!("iscsi://127.0.0.1:{}/{iqn}/1", tgt.port())
}

/// iSCSI through tgtd, a thin LUN (it reports holes as zero extents and trims) or a
/// thick one. Each target is a new iSCSI target with one new LUN of the image's size
/// rounded up to whole blocks.
async fn iscsi(thin: bool) {
    let dir = scratch_dir();
    let image = image(BLOCK_SIZE);
    let src = dir.path().join("src.img");
    write_sparse(&src, &image);
    let tgt = Mutex::new(Tgtd::start());
    let url = {
        let mut tgt = tgt.lock();
        let lun = Lun { backing: src, thin };
        tgt.add_target(1, IQN, &[lun]);
        iscsi_url(&tgt, IQN)
    };
    let s = source(&url).await.unwrap();
    let caps = s.caps();
    assert!(caps.multi_conn, "{caps:?}");
    assert_eq!(caps.block.minimum, 512, "{caps:?}");
    if thin {
        assert!(caps.extents, "{caps:?}");
        let extents = s.extents(0, BLOCK_SIZE).await.unwrap();
        assert!(
            extents.iter().any(|e| e.kind == ExtentKind::Zero),
            "a thin LUN reports the holes as zero extents: {extents:?}"
        );
    } else {
        assert!(!caps.extents, "a thick LUN has no extents");
    }

    let backing = |n: usize| dir.path().join(format!("lun-{n}.img"));
    let targets = BackedFixture::new(backing, |n, size| {
        let lun = Lun {
            backing: backing(n),
            thin,
        };
        std::fs::File::create(&lun.backing)
            .unwrap()
            .set_len(size.div_ceil(512) * 512)
            .unwrap();
        let iqn = format!("{IQN}-{n}");
        let mut tgt = tgt.lock();
        tgt.add_target(n as u32 + 1, &iqn, &[lun]);
        let url = iscsi_url(&tgt, &iqn);
        Box::pin(async move {
            let t = target(&url, size).await?;
            assert_eq!(t.caps().trim, thin, "{url}: {:?}", t.caps());
            Ok(t)
        })
    });
    conforms(&image, s, &targets, SIZE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iscsi_thin() {
    iscsi(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iscsi_thick() {
    iscsi(false).await;
}

const BUCKET: &str = "images";

fn s3_spec(key: &str) -> S3Spec {
    S3Spec {
        bucket: BUCKET.to_string(),
        key: key.to_string(),
    }
}

/// S3 against s3s-fs. Its targets are larger than two parts, so each is a multipart
/// upload; one is never finished before every byte was written (is_zero is false).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3() {
    let server = S3Server::start().await;
    server.create_bucket(BUCKET);
    let options = server.options();
    let image = image(SIZE);
    // The store keeps an object as a file: put the image there.
    std::fs::write(server.object_path(BUCKET, "src.img"), &image.data).unwrap();
    let s = S3Source::open(&s3_spec("src.img"), &options).await.unwrap();
    let key = |n: usize| format!("dst-{n}.img");
    let targets = BackedFixture::new(
        |n| server.object_path(BUCKET, &key(n)),
        |n, size| {
            let (spec, options) = (s3_spec(&key(n)), options.clone());
            Box::pin(async move {
                let t = S3Target::open(&spec, size, &options).await?;
                Ok(Arc::new(t) as Arc<dyn Target>)
            })
        },
    );
    conforms(&image, Arc::new(s), &targets, 2 * MIN_PART_SIZE + 4097).await;
}

/// HTTP is a source only: the source half of the suite against nginx, with ranges
/// (parallel reads) and without (one stream, restarted for reads behind it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_source() {
    let nginx = ferry_tests::http_server::Nginx::start();
    let image = image(SIZE);
    std::fs::write(nginx.root().join("src.img"), &image.data).unwrap();
    let ranged = source(&nginx.url("src.img")).await.unwrap();
    let caps = ranged.caps();
    assert!(
        caps.multi_conn && !caps.sequential_read && !caps.extents,
        "{caps:?}"
    );
    conformance::check_source(ranged, &image.data).await;
    let stream = source(&nginx.url("noranges/src.img")).await.unwrap();
    let caps = stream.caps();
    assert!(caps.sequential_read && !caps.multi_conn, "{caps:?}");
    conformance::check_source(stream, &image.data).await;
}
