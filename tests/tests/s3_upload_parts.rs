//! S3 uploads must never stall and never lose a part.
//!
//! Stalls: many workers, a request size that does not divide the part size, work units
//! that are not whole parts, reads that complete out of order and a store that answers
//! some UploadPart calls late. Every copy must finish well within its deadline, the target
//! must never warn (an older design broke a stall after a second by granting a buffer
//! beyond its budget, with a warning), and the stored object must hold exactly the
//! source's bytes.
//!
//! Lost parts: the copy flushes the target at every checkpoint and drops that flush when
//! its workers end, then finishes; a flush dropped (or running beside another wait) while
//! a part is on its way must leave `finish` waiting for that part.
//!
//! The store is s3s-fs in process, behind a wrapper that delays every third UploadPart
//! (parts 1, 4, 7, ...), so part buffers stay busy while the copy runs ahead.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use ferry_core::spec::S3Spec;
use ferry_core::{Caps, Extent, IoBuf, Result, Secret, Source, Target};
use ferry_endpoints::s3::{S3Options, S3Target, MIN_PART_SIZE};
use ferry_engine::{CancellationToken, CommitOrder, CopyOptions, Progress};
use ferry_testkit::MemSource;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use parking_lot::Mutex;
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, S3};
use tokio::net::TcpListener;

const BUCKET: &str = "stall";
const ACCESS_KEY: &str = "ferry-stall-access-key";
const SECRET_KEY: &str = "ferry-stall-secret-key-0123456789";
const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
/// A stalled copy in the old design took a second per stall; a deadlock never ends.
const DEADLINE: Duration = Duration::from_secs(120);

/// s3s-fs, with every third UploadPart answered late (out-of-order completion).
struct SlowParts {
    fs: s3s_fs::FileSystem,
    delay: Duration,
}

#[async_trait]
impl S3 for SlowParts {
    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.fs.head_bucket(req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.fs.create_multipart_upload(req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        if req.input.part_number % 3 == 1 {
            tokio::time::sleep(self.delay).await;
        }
        self.fs.upload_part(req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        self.fs.complete_multipart_upload(req).await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.fs.abort_multipart_upload(req).await
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        self.fs.put_object(req).await
    }
}

struct Store {
    root: tempfile::TempDir,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Store {
    async fn start(delay: Duration) -> Self {
        let root = tempfile::tempdir().expect("store directory");
        std::fs::create_dir(root.path().join(BUCKET)).expect("bucket directory");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let fs = s3s_fs::FileSystem::new(root.path()).expect("s3s-fs store");
        let service = {
            let mut b = s3s::service::S3ServiceBuilder::new(SlowParts { fs, delay });
            b.set_auth(s3s::auth::SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
            b.build()
        };
        let task = tokio::spawn(async move {
            let http = ConnBuilder::new(TokioExecutor::new());
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                let conn = http
                    .serve_connection(TokioIo::new(socket), service.clone())
                    .into_owned();
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
        });
        Self { root, addr, task }
    }

    fn options(&self) -> S3Options {
        S3Options::new()
            .with_endpoint_url(format!("http://{}", self.addr))
            .with_region("us-east-1")
            .with_force_path_style(true)
            .with_credentials(Secret::new(ACCESS_KEY), Secret::new(SECRET_KEY), None)
            .with_part_size(MIN_PART_SIZE)
    }

    fn object(&self, key: &str) -> Vec<u8> {
        std::fs::read(self.root.path().join(BUCKET).join(key)).expect("stored object")
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A source whose reads take 0 to 11 ms, depending on the offset: neighbouring requests
/// complete out of order.
#[derive(Debug, Clone)]
struct Jittery(MemSource);

#[async_trait]
impl Source for Jittery {
    fn describe(&self) -> String {
        "jittery".into()
    }

    fn size(&self) -> u64 {
        self.0.len()
    }

    fn caps(&self) -> Caps {
        self.0.caps_value()
    }

    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.0.extents(offset, len).await
    }

    async fn read_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        let ms = (offset / (4 * KIB)).wrapping_mul(2_654_435_761) % 12;
        tokio::time::sleep(Duration::from_millis(ms)).await;
        self.0.read_at(offset, buf).await
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(self.clone()))
    }
}

/// Warnings from every test of this binary (each test looks for its own object key).
fn warnings() -> &'static Arc<Mutex<Vec<u8>>> {
    static CAPTURED: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let captured = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&captured);
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || Sink(Arc::clone(&sink)))
            .init();
        captured
    })
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Data runs and holes of 64 KiB to 1.6 MiB, the data with some all-zero 4 KiB blocks
/// (zero runs found by scanning, not by extents), crossing part edges everywhere.
fn image(size: u64, seed: u64) -> MemSource {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut data: Vec<u8> = (0..size).map(|_| (next() % 255 + 1) as u8).collect();
    let mut holes = Vec::new();
    let mut at = 0;
    while at < size {
        let run = 64 * KIB + next() % (1600 * KIB);
        let end = (at + run).min(size);
        if next().is_multiple_of(2) {
            holes.push((at, end));
        } else {
            for block in (at.div_ceil(4 * KIB) * 4 * KIB..end.saturating_sub(4 * KIB))
                .step_by(4 * KIB as usize)
            {
                if next().is_multiple_of(5) {
                    data[block as usize..(block + 4 * KIB) as usize].fill(0);
                }
            }
        }
        at = end;
    }
    MemSource::new(data).with_holes(&holes)
}

async fn upload(key: &str, size: u64, options: CopyOptions) {
    let captured = warnings();
    let store = Store::start(Duration::from_millis(150)).await;
    let source = image(size, size ^ options.workers as u64);
    let spec = S3Spec {
        bucket: BUCKET.to_string(),
        key: key.to_string(),
    };
    let target = S3Target::open(&spec, size, &store.options())
        .await
        .expect("open the S3 target");
    let (progress, cancel) = (Progress::new(), CancellationToken::new());
    let copy = ferry_engine::copy(
        Arc::new(Jittery(source.clone())),
        Arc::new(target),
        &options,
        &progress,
        &cancel,
    );
    let report = tokio::time::timeout(DEADLINE, copy)
        .await
        .unwrap_or_else(|_| panic!("{key}: the upload did not finish in {DEADLINE:?}"))
        .expect("copy");
    assert_eq!(report.data_bytes + report.zero_bytes, size);
    let text = String::from_utf8_lossy(&captured.lock()).into_owned();
    let ours: Vec<&str> = text.lines().filter(|l| l.contains(key)).collect();
    assert!(ours.is_empty(), "{key}: the S3 target warned: {ours:#?}");
    let stored = store.object(key);
    assert_eq!(stored.len() as u64, size, "{key}: object size");
    if let Some(at) = stored.iter().zip(source.data()).position(|(a, b)| a != b) {
        panic!("{key}: the stored object differs from the source at byte {at}");
    }
}

fn options(workers: usize, request: u64, unit: u64, order: CommitOrder) -> CopyOptions {
    CopyOptions {
        workers,
        request_size: Some(request as usize),
        work_unit: unit,
        order,
        ..CopyOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_workers_default_units_out_of_order() {
    let opts = options(8, 96 * KIB, 64 * MIB, CommitOrder::OutOfOrder);
    upload("default-units.img", 26 * MIN_PART_SIZE + 333 * KIB, opts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_workers_units_across_parts_out_of_order() {
    let opts = options(12, 96 * KIB, 7 * MIB, CommitOrder::OutOfOrder);
    upload("small-units.img", 24 * MIN_PART_SIZE + 4095, opts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn few_workers_units_of_several_parts_out_of_order() {
    let opts = options(2, 160 * KIB, 23 * MIB, CommitOrder::OutOfOrder);
    upload("few-workers.img", 20 * MIN_PART_SIZE + 1, opts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_workers_in_order() {
    let opts = options(16, 96 * KIB, 3 * MIB, CommitOrder::InOrder);
    upload("in-order.img", 18 * MIN_PART_SIZE + 77 * KIB, opts).await;
}

/// Writes a whole image of three parts at once (each part complete, part 1 slow to store),
/// drops a flush that waits for part 1, and finishes beside a second flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_flush_loses_no_part() {
    let store = Store::start(Duration::from_millis(600)).await;
    let size = 3 * MIN_PART_SIZE;
    let source = image(size, 7);
    let spec = S3Spec {
        bucket: BUCKET.to_string(),
        key: "dropped-flush.img".to_string(),
    };
    let target = S3Target::open(&spec, size, &store.options())
        .await
        .expect("open the S3 target");
    let mut buf = IoBuf::new(size as usize);
    buf.copy_from_slice(source.data());
    target.write_at(0, buf).await.expect("write the image");
    let dropped = tokio::time::timeout(Duration::from_millis(50), target.flush()).await;
    assert!(dropped.is_err(), "part 1 was still being stored");
    let (flushed, finished) = tokio::join!(target.flush(), target.finish());
    flushed.expect("a flush beside the finish");
    finished.expect("finish waits for the part the dropped flush was waiting for");
    let stored = store.object("dropped-flush.img");
    assert_eq!(stored.len() as u64, size, "object size");
    assert!(
        stored == source.data(),
        "the stored object differs from the source"
    );
}
