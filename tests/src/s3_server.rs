//! A real S3 server for tests, in process: s3s with the s3s-fs file-system backend on
//! 127.0.0.1 (port chosen at run time), checking SigV4 signatures against one key pair.
//!
//! The server can be stopped and started again on the same address to test a store that
//! goes away mid-copy. s3s-fs lacks ListMultipartUploads, so [`S3Server::pending_uploads`]
//! reads its bookkeeping files instead (`.upload-<id>.json` per open upload and
//! `.upload_id-<id>.part-<n>` per stored part, both in the root directory).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ferry_core::Secret;
use ferry_endpoints::s3::{S3Options, MIN_PART_SIZE};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
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
        };
        server.serve(listener);
        server
    }

    /// `http://127.0.0.1:PORT`, for `S3Options::endpoint_url` or `AWS_ENDPOINT_URL`.
    pub fn endpoint_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Options that reach this server with its credentials, path-style, and the smallest
    /// part size S3 allows (5 MiB), so multipart tests stay small.
    pub fn options(&self) -> S3Options {
        S3Options::new()
            .with_endpoint_url(self.endpoint_url())
            .with_region("us-east-1")
            .with_force_path_style(true)
            .with_credentials(Secret::new(ACCESS_KEY), Secret::new(SECRET_KEY), None)
            .with_part_size(MIN_PART_SIZE)
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
        let service = {
            let mut b = S3ServiceBuilder::new(fs);
            b.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
            b.build()
        };
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
