//! S3 copies through the engine against a real S3 server (s3s + s3s-fs in process, SigV4
//! checked): file to S3 and back, S3 to NBD and back, single PUT and multipart, unaligned
//! sizes, empty and all-zero images, each verified by block hash on both sides (the
//! engine's and an independent one of the stored object file) and, for copies to files,
//! by `qemu-img compare`.

// Until tests/src/lib.rs exports it as ferry_tests::s3_server.

use std::path::Path;
use std::sync::Arc;

use ferry_core::spec::S3Spec;
use ferry_core::{EndpointSpec, Source, Target};
use ferry_endpoints::s3::{S3Options, S3Source, S3Target, MIN_PART_SIZE};
use ferry_endpoints::{SourceOptions, TargetOptions};
use ferry_engine::{CancellationToken, ChecksumOptions, CopyOptions, Progress};
use ferry_tests::check::{blkhash_bytes, blkhash_file, qemu_img_compare};
use ferry_tests::images::{self, Pattern};
use ferry_tests::nbd_servers::{NbdServer, QemuNbd};
use ferry_tests::s3_server::S3Server;
use ferry_tests::scratch_dir;

const BUCKET: &str = "images";
const MIB: u64 = 1024 * 1024;

fn spec(key: &str) -> S3Spec {
    S3Spec {
        bucket: BUCKET.to_string(),
        key: key.to_string(),
    }
}

async fn server() -> S3Server {
    let server = S3Server::start().await;
    server.create_bucket(BUCKET);
    server
}

async fn file_source(path: &Path) -> Arc<dyn Source> {
    ferry_endpoints::open_source(&EndpointSpec::File(path.into()), &SourceOptions::default())
        .await
        .expect("open the file source")
}

async fn file_target(path: &Path, size: u64) -> Arc<dyn Target> {
    ferry_endpoints::open_target(
        &EndpointSpec::File(path.into()),
        size,
        &TargetOptions::default(),
    )
    .await
    .expect("open the file target")
}

async fn copy(source: Arc<dyn Source>, target: Arc<dyn Target>) {
    let report = ferry_engine::copy(
        source,
        target,
        &CopyOptions::default(),
        &Progress::new(),
        &CancellationToken::new(),
    )
    .await
    .expect("copy");
    assert_eq!(report.data_bytes + report.zero_bytes, report.size);
}

async fn engine_blkhash(source: Arc<dyn Source>) -> String {
    ferry_engine::checksum(
        source,
        &ChecksumOptions::default(),
        &Progress::new(),
        &CancellationToken::new(),
    )
    .await
    .expect("checksum")
    .hex()
}

/// Uploads `image` to `key`, checks the stored object, downloads it again and checks that.
async fn round_trip(server: &S3Server, image: &Path, key: &str, options: &S3Options) {
    let size = std::fs::metadata(image).unwrap().len();
    let expected = blkhash_file(image);
    assert_eq!(engine_blkhash(file_source(image).await).await, expected);

    let target = S3Target::open(&spec(key), size, options)
        .await
        .expect("open S3 target");
    let multipart = target.upload_id().is_some();
    assert_eq!(
        multipart,
        size > target.part_size(),
        "single PUT only up to one part"
    );
    copy(file_source(image).await, Arc::new(target)).await;
    assert!(
        server.pending_uploads().is_empty(),
        "uploads left behind: {:?}",
        server.pending_uploads()
    );
    // The object as the store keeps it on disk, hashed independently of ferry.
    assert_eq!(
        blkhash_file(&server.object_path(BUCKET, key)),
        expected,
        "stored object"
    );

    let source = S3Source::open(&spec(key), options)
        .await
        .expect("open S3 source");
    assert_eq!(source.size(), size);
    assert_eq!(
        source.ferry_metadata().size,
        Some(size),
        "x-amz-meta-ferry-size"
    );
    assert_eq!(
        engine_blkhash(Arc::new(source.clone())).await,
        expected,
        "S3 source"
    );

    let scratch = scratch_dir();
    let back = scratch.path().join("back.img");
    copy(Arc::new(source), file_target(&back, size).await).await;
    assert_eq!(blkhash_file(&back), expected, "downloaded image");
    qemu_img_compare(image, &back);
    assert_eq!(std::fs::metadata(&back).unwrap().len(), size);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multipart_unaligned_half_data_round_trip() {
    let server = server().await;
    let scratch = scratch_dir();
    // 4 full 5 MiB parts and an unaligned tail, holes and data runs crossing part edges.
    let size = 4 * MIN_PART_SIZE + 3 * MIB + 4095;
    let img = images::make(&scratch.path().join("a.img"), Pattern::HalfData, size, 7).unwrap();
    round_trip(&server, &img.path, "vm/disk-half.img", &server.options()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multipart_random_round_trip_with_default_part_size() {
    let server = server().await;
    let scratch = scratch_dir();
    // Above the default 16 MiB part: two parts, all data.
    let size = 16 * MIB + 12345;
    let img = images::make(&scratch.path().join("r.img"), Pattern::Random, size, 3).unwrap();
    let mut options = server.options();
    options.part_size = None;
    round_trip(&server, &img.path, "random.img", &options).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_put_unaligned_round_trip() {
    let server = server().await;
    let scratch = scratch_dir();
    let size = 3 * MIB + 333;
    let img = images::make(&scratch.path().join("s.img"), Pattern::Random, size, 11).unwrap();
    round_trip(&server, &img.path, "small.img", &server.options()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_zero_multipart_round_trip() {
    let server = server().await;
    let scratch = scratch_dir();
    // Every part is uploaded from the shared zero buffer.
    let size = 3 * MIN_PART_SIZE + 17;
    let img = images::make(&scratch.path().join("z.img"), Pattern::Empty, size, 0).unwrap();
    round_trip(&server, &img.path, "zero.img", &server.options()).await;
    let stored = std::fs::read(server.object_path(BUCKET, "zero.img")).unwrap();
    assert!(stored.iter().all(|&b| b == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_image_round_trip() {
    let server = server().await;
    let scratch = scratch_dir();
    let img = images::make(&scratch.path().join("e.img"), Pattern::Empty, 0, 0).unwrap();
    round_trip(&server, &img.path, "empty.img", &server.options()).await;
    assert_eq!(blkhash_file(&img.path), blkhash_bytes(&[]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_hash_recorded_in_metadata() {
    let server = server().await;
    let scratch = scratch_dir();
    for (key, size) in [
        ("hashed-small.img", 2 * MIB + 1),
        ("hashed-multi.img", 2 * MIN_PART_SIZE + 5),
    ] {
        let img = images::make(&scratch.path().join(key), Pattern::HalfData, size, 5).unwrap();
        let hash = blkhash_file(&img.path);
        let target = S3Target::open(&spec(key), size, &server.options())
            .await
            .unwrap();
        target.set_block_hash(&hash).unwrap();
        assert!(target.set_block_hash("not-a-hash").is_err());
        copy(file_source(&img.path).await, Arc::new(target)).await;
        let source = S3Source::open(&spec(key), &server.options()).await.unwrap();
        assert_eq!(source.block_hash(), Some(hash.as_str()), "{key}");
        assert_eq!(source.ferry_metadata().size, Some(size), "{key}");
        assert_eq!(
            blkhash_file(&server.object_path(BUCKET, key)),
            hash,
            "{key}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_to_nbd_and_nbd_to_s3() {
    let server = server().await;
    let scratch = scratch_dir();
    let size = 3 * MIN_PART_SIZE + 2 * MIB + 512;
    let img = images::make(&scratch.path().join("src.img"), Pattern::HalfData, size, 21).unwrap();
    let expected = blkhash_file(&img.path);
    let options = server.options();

    // file -> S3, then S3 -> NBD (qemu-nbd serving an empty file of the same size).
    let target = S3Target::open(&spec("nbd/in.img"), size, &options)
        .await
        .unwrap();
    copy(file_source(&img.path).await, Arc::new(target)).await;
    let nbd_img = scratch.path().join("nbd.img");
    std::fs::File::create(&nbd_img)
        .unwrap()
        .set_len(size)
        .unwrap();
    let nbd = NbdServer::qemu_nbd(
        &nbd_img,
        &QemuNbd {
            export: "disk".into(),
            ..Default::default()
        },
    );
    let nbd_spec = EndpointSpec::parse(&nbd.uri()).unwrap();
    let source = S3Source::open(&spec("nbd/in.img"), &options).await.unwrap();
    let nbd_target = ferry_endpoints::open_target(&nbd_spec, size, &TargetOptions::default())
        .await
        .expect("open NBD target");
    copy(Arc::new(source), nbd_target).await;
    let nbd_source = ferry_endpoints::open_source(&nbd_spec, &SourceOptions::default())
        .await
        .expect("open NBD source");
    assert_eq!(
        engine_blkhash(nbd_source.clone()).await,
        expected,
        "NBD export"
    );

    // NBD -> S3 (another key), checked on the stored object and through the S3 source.
    let target = S3Target::open(&spec("nbd/out.img"), size, &options)
        .await
        .unwrap();
    copy(nbd_source, Arc::new(target)).await;
    drop(nbd);
    assert_eq!(
        blkhash_file(&server.object_path(BUCKET, "nbd/out.img")),
        expected
    );
    let source = S3Source::open(&spec("nbd/out.img"), &options)
        .await
        .unwrap();
    assert_eq!(engine_blkhash(Arc::new(source)).await, expected);
    qemu_img_compare(&img.path, &nbd_img);
    assert!(
        server.pending_uploads().is_empty(),
        "{:?}",
        server.pending_uploads()
    );
}
