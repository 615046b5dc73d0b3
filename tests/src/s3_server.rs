//! A real S3 server for tests, in process: s3s with the s3s-fs file-system backend on
//! 127.0.0.1 (port chosen at run time), checking SigV4 signatures against one key pair.
//!
//! The server can be stopped and started again on the same address to test a store that
//! goes away mid-copy. s3s-fs lacks ListMultipartUploads, so [`S3Server::pending_uploads`]
//! reads its bookkeeping files instead (`.upload-<id>.json` per open upload and
//! `.upload_id-<id>.part-<n>` per stored part, both in the root directory).
//!
//! A server started with [`S3Server::start_with_delete_gate`] can hold DeleteObject
//! requests ([`DeleteGate`]), so that a test can kill a client in the middle of its
//! deletions (a prune or a garbage collection) at a point it chooses.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferry_core::Secret;
use ferry_endpoints::s3::{S3Options, MIN_PART_SIZE};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::dto::*;
use s3s::service::S3ServiceBuilder;
use s3s::{S3Request, S3Response, S3Result, S3};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// The access key id the server accepts.
pub const ACCESS_KEY: &str = "ferry-test-access-key";
/// The secret key the server accepts.
pub const SECRET_KEY: &str = "ferry-test-secret-key-0123456789";

/// A running (or stopped) in-process S3 server. Dropping it stops it and deletes its data.
#[derive(Debug)]
pub struct S3Server {
    root: tempfile::TempDir,
    addr: SocketAddr,
    task: Option<JoinHandle<()>>,
    gate: Option<Arc<DeleteGate>>,
}

/// S3 client options for a test server on loopback: its endpoint, path-style requests,
/// region us-east-1, the key pair it accepts, and the smallest part size.
pub fn loopback_options(endpoint_url: String, access_key: &str, secret_key: &str) -> S3Options {
    S3Options::new()
        .with_endpoint_url(endpoint_url)
        .with_region("us-east-1")
        .with_force_path_style(true)
        .with_credentials(Secret::new(access_key), Secret::new(secret_key), None)
        .with_part_size(MIN_PART_SIZE)
}

impl S3Server {
    /// Starts a server with an empty store on a free loopback port.
    pub async fn start() -> Self {
        let root = tempfile::tempdir().expect("temporary directory for the S3 store");
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let mut server = Self {
            root,
            addr,
            task: None,
            gate: None,
        };
        server.serve(listener);
        server
    }

    /// Starts a server whose DeleteObject requests pass through a [`DeleteGate`] (open
    /// until [`DeleteGate::hold_from`] is called).
    pub async fn start_with_delete_gate() -> Self {
        let mut server = Self::start().await;
        server.gate = Some(Arc::new(DeleteGate::default()));
        server.restart().await;
        server
    }

    /// The delete gate of a server started with [`S3Server::start_with_delete_gate`].
    pub fn delete_gate(&self) -> &Arc<DeleteGate> {
        self.gate
            .as_ref()
            .expect("the server was started with S3Server::start_with_delete_gate")
    }

    /// `http://127.0.0.1:PORT`, for `S3Options::endpoint_url` or `AWS_ENDPOINT_URL`.
    pub fn endpoint_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Options that reach this server with its credentials, path-style, and the smallest
    /// part size S3 allows (5 MiB), so multipart tests stay small.
    pub fn options(&self) -> S3Options {
        loopback_options(self.endpoint_url(), ACCESS_KEY, SECRET_KEY)
    }

    /// Points a child process (the ferry binary) at this server through the AWS SDK's
    /// standard environment, with its credentials and no shared config or profile.
    pub fn sdk_env(&self, cmd: &mut std::process::Command) {
        let empty = self.root().join("empty-aws-config");
        std::fs::write(&empty, "").expect("write an empty AWS config file");
        cmd.env("AWS_ENDPOINT_URL", self.endpoint_url())
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_CONFIG_FILE", &empty)
            .env("AWS_SHARED_CREDENTIALS_FILE", &empty)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("AWS_PROFILE");
    }

    /// The directory holding the buckets (one directory each) and the upload bookkeeping.
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Creates a bucket (a directory of the store).
    pub fn create_bucket(&self, bucket: &str) {
        std::fs::create_dir(self.root().join(bucket)).expect("create bucket directory");
    }

    /// Where the store keeps an object's bytes.
    pub fn object_path(&self, bucket: &str, key: &str) -> PathBuf {
        self.root().join(bucket).join(key)
    }

    /// Multipart uploads that were started and neither completed nor aborted, and parts
    /// stored for them: the names of their bookkeeping files, sorted.
    pub fn pending_uploads(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.root())
            .expect("read the store root")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".upload-") || n.starts_with(".upload_id-"))
            .collect();
        names.sort();
        names
    }

    /// Stops accepting and drops every open connection, as a crashed server would.
    pub async fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Serves again on the same address and store after [`S3Server::stop`].
    pub async fn restart(&mut self) {
        self.stop().await;
        let listener = TcpListener::bind(self.addr)
            .await
            .expect("bind the same address again");
        self.serve(listener);
    }

    fn serve(&mut self, listener: TcpListener) {
        let fs = s3s_fs::FileSystem::new(self.root()).expect("s3s-fs store");
        let mut b = match &self.gate {
            Some(gate) => S3ServiceBuilder::new(Gated {
                fs,
                gate: Arc::clone(gate),
            }),
            None => S3ServiceBuilder::new(fs),
        };
        b.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        let service = b.build();
        self.task = Some(tokio::spawn(async move {
            let http = ConnBuilder::new(TokioExecutor::new());
            // Owned here so that aborting this task drops every connection with it.
            let mut connections = JoinSet::new();
            loop {
                let (socket, _) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(_) => continue,
                };
                let conn = http
                    .serve_connection(TokioIo::new(socket), service.clone())
                    .into_owned();
                connections.spawn(async move {
                    let _ = conn.await;
                });
                while connections.try_join_next().is_some() {}
            }
        }));
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Counts DeleteObject requests and holds those from a chosen one on until released.
#[derive(Debug)]
pub struct DeleteGate {
    /// The 1-based number of the first delete to hold; 0 holds none.
    hold_from: AtomicU64,
    seen: AtomicU64,
    held: AtomicU64,
    /// Deletes received and not yet answered (or dropped with their connection).
    in_flight: Arc<AtomicU64>,
    state: tokio::sync::watch::Sender<Gate>,
}

/// What a held delete waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    Holding,
    /// Held deletes go on; later ones pass.
    Released,
    /// Held deletes fail (500, nothing deleted); later ones pass.
    Failing,
}

/// Counts a delete in flight until dropped.
struct InFlight(Arc<AtomicU64>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Default for DeleteGate {
    fn default() -> Self {
        Self {
            hold_from: AtomicU64::new(0),
            seen: AtomicU64::new(0),
            held: AtomicU64::new(0),
            in_flight: Arc::new(AtomicU64::new(0)),
            state: tokio::sync::watch::channel(Gate::Released).0,
        }
    }
}

impl DeleteGate {
    /// Holds the `n`-th delete from now on (1: the next one) and every later one, until
    /// [`DeleteGate::release`] or [`DeleteGate::fail_held`].
    pub fn hold_from(&self, n: u64) {
        self.state.send_replace(Gate::Holding);
        self.held.store(0, Ordering::SeqCst);
        self.hold_from.store(
            self.seen.load(Ordering::SeqCst) + n.max(1),
            Ordering::SeqCst,
        );
    }

    /// Lets every held delete go on (as a server does with a request whose client
    /// vanished), and every later one pass.
    pub fn release(&self) {
        self.hold_from.store(0, Ordering::SeqCst);
        self.state.send_replace(Gate::Released);
    }

    /// Answers every held delete with an error, deleting nothing (the request never
    /// reached the store), and lets every later one pass.
    pub fn fail_held(&self) {
        self.hold_from.store(0, Ordering::SeqCst);
        self.state.send_replace(Gate::Failing);
    }

    /// DeleteObject requests received so far.
    pub fn seen(&self) -> u64 {
        self.seen.load(Ordering::SeqCst)
    }

    /// Deletes waiting at the gate now or since the last [`DeleteGate::hold_from`].
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
    }

    /// Waits (blocking) until no delete is in flight: those released have been done.
    pub fn wait_idle(&self, limit: std::time::Duration) {
        let started = std::time::Instant::now();
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            assert!(
                started.elapsed() < limit,
                "deletes still in flight after {limit:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    fn enter(&self) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(&self.in_flight))
    }

    /// Whether the delete goes on (false: it fails).
    async fn pass(&self) -> bool {
        let number = self.seen.fetch_add(1, Ordering::SeqCst) + 1;
        let from = self.hold_from.load(Ordering::SeqCst);
        if from == 0 || number < from {
            return true;
        }
        self.held.fetch_add(1, Ordering::SeqCst);
        let mut state = self.state.subscribe();
        let released = match state.wait_for(|s| *s != Gate::Holding).await {
            Ok(s) => *s == Gate::Released,
            Err(_) => false,
        };
        released
    }
}

/// s3s-fs with its deletes passing a [`DeleteGate`]; everything else as s3s-fs does it.
struct Gated {
    fs: s3s_fs::FileSystem,
    gate: Arc<DeleteGate>,
}

/// Implements [`S3`] for [`Gated`]: the delete through the gate, the listed operations
/// (those the repository store and the S3 endpoint use) straight to s3s-fs. Inside a macro
/// so that `async_trait` sees the expanded methods.
macro_rules! gated_s3 {
    ($($name:ident: $input:ty => $output:ty;)*) => {
        #[async_trait::async_trait]
        impl S3 for Gated {
            async fn delete_object(
                &self,
                req: S3Request<DeleteObjectInput>,
            ) -> S3Result<S3Response<DeleteObjectOutput>> {
                let _counted = self.gate.enter();
                if !self.gate.pass().await {
                    return Err(s3s::s3_error!(InternalError, "the test's delete gate failed this delete"));
                }
                self.fs.delete_object(req).await
            }

            $(
                async fn $name(&self, req: S3Request<$input>) -> S3Result<S3Response<$output>> {
                    self.fs.$name(req).await
                }
            )*
        }
    };
}

gated_s3! {
    create_bucket: CreateBucketInput => CreateBucketOutput;
    head_bucket: HeadBucketInput => HeadBucketOutput;
    list_buckets: ListBucketsInput => ListBucketsOutput;
    get_object: GetObjectInput => GetObjectOutput;
    head_object: HeadObjectInput => HeadObjectOutput;
    put_object: PutObjectInput => PutObjectOutput;
    copy_object: CopyObjectInput => CopyObjectOutput;
    list_objects: ListObjectsInput => ListObjectsOutput;
    list_objects_v2: ListObjectsV2Input => ListObjectsV2Output;
    create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
    upload_part: UploadPartInput => UploadPartOutput;
    complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput;
    abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
}
