//! A second S3 implementation for tests: moto's standalone server (Python; `pip install
//! 'moto[server]'`), on 127.0.0.1 at a free port, as a child process stopped on drop.
//!
//! The in-process s3s-fs server is the main S3 server of the tests; moto is a different
//! implementation of the same API (its own XML, listing, pagination and conditional
//! requests), so code that passes on both does not lean on one server's habits. moto keeps
//! objects in memory and does not check signatures: tests that damage stored files, or
//! that need a signature refused, run on s3s-fs only.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferry_endpoints::s3::S3Options;

use crate::process::{free_port, listens_on};
use crate::s3_server::loopback_options;

/// The command that installs moto's server, as the test command does.
pub const MOTO_INSTALL: &str = "python3 -m pip install 'moto[server]==5.2.1'";

/// A running moto server; dropping it stops it (and its objects are gone).
#[derive(Debug)]
pub struct MotoServer {
    child: Child,
    port: u16,
}

impl MotoServer {
    /// Starts moto on a free loopback port; fails the test, naming the install command,
    /// when moto's server is not installed.
    pub fn start() -> Self {
        let installed = Command::new("python3")
            .args(["-c", "import moto.server"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            installed,
            "moto's S3 server is not installed: run `{MOTO_INSTALL}` \
             (or the project's test command, which installs everything the tests need)"
        );
        let port = free_port();
        let child = Command::new("python3")
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start python3 -m moto.server");
        let mut server = Self { child, port };
        server.wait_ready();
        server
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let pid = self.child.id() as i32;
        while !listens_on(pid, self.port) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("moto's server exited before it listened: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "moto's server did not listen on port {} within 30 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Options for ferry's S3 clients: path-style requests to this server, with a key pair
    /// (moto takes any).
    pub fn options(&self) -> S3Options {
        loopback_options(self.endpoint_url(), "moto-access-key", "moto-secret-key")
    }

    /// Creates `bucket` (moto answers an unsigned CreateBucket).
    pub fn create_bucket(&self, bucket: &str) {
        self.create(bucket, "");
    }

    /// Creates `bucket` with S3 Object Lock enabled (and so versioning).
    pub fn create_locked_bucket(&self, bucket: &str) {
        self.create(bucket, "x-amz-bucket-object-lock-enabled: true\r\n");
    }

    /// Points the AWS SDK of a ferry process at this server.
    pub fn sdk_env(&self, cmd: &mut std::process::Command, scratch: &std::path::Path) {
        let empty = scratch.join("empty-aws-config");
        std::fs::write(&empty, "").expect("write an empty AWS config file");
        cmd.env("AWS_ENDPOINT_URL", self.endpoint_url())
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "moto-access-key")
            .env("AWS_SECRET_ACCESS_KEY", "moto-secret-key")
            .env("AWS_CONFIG_FILE", &empty)
            .env("AWS_SHARED_CREDENTIALS_FILE", &empty)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("AWS_PROFILE");
    }

    fn create(&self, bucket: &str, headers: &str) {
        let mut stream =
            TcpStream::connect(("127.0.0.1", self.port)).expect("connect to moto's server");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("set a read timeout");
        write!(
            stream,
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )
        .expect("send CreateBucket");
        let mut reply = String::new();
        stream
            .read_to_string(&mut reply)
            .expect("read CreateBucket's reply");
        assert!(
            reply.starts_with("HTTP/1.1 200"),
            "moto refused to create bucket {bucket}: {reply}"
        );
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
