//! nginx on loopback for HTTP(S) source tests: a plain and a TLS port (a test CA made with
//! rcgen), a basic-auth location, a location without range requests, redirects, and an
//! optional rate limit for benchmarks. Runs as the current user (`master_process off`),
//! with every path (pid, logs, temporary files) inside its own directory.
//!
//! Locations (all serving [`Nginx::root`]):
//! - `/NAME`: ranges, ETag, Last-Modified, as nginx serves static files;
//! - `/private/NAME`: basic authentication ([`USER`], [`PASSWORD`]), files under
//!   `root/private/`;
//! - `/noranges/NAME`: `max_ranges 0` (whole-object answers only);
//! - `/chunked/NAME`: whole-object answers, chunked, without Content-Length, ETag or
//!   Last-Modified (a no-op `sub_filter` makes nginx drop them, as a dynamic answer has
//!   none): an object whose size shows only at its end;
//! - `/redirect/NAME`: 302 to `/NAME`; `/loop/NAME`: redirects forever;
//! - `/to-http/NAME`: 302 to `http://127.0.0.1:PORT/NAME` (a downgrade when asked over TLS).

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::check::require_tool;
use crate::nbd_servers::TlsCerts;
use crate::process::{free_port, listens_on};

/// The basic-auth user of `/private/`.
pub const USER: &str = "ferry";
/// Its password.
pub const PASSWORD: &str = "s3cret-http-pw";

/// Options of one nginx.
#[derive(Debug, Clone, Default)]
pub struct NginxOptions {
    /// nginx's `limit_rate` per connection, like `200m` (benchmarks).
    pub limit_rate: Option<String>,
    /// Log every request with the body bytes sent ([`Nginx::body_bytes_sent`]).
    pub access_log: bool,
}

/// A running nginx, stopped when dropped.
#[derive(Debug)]
pub struct Nginx {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
    tls_port: u16,
    certs: TlsCerts,
}

fn htpasswd_line() -> String {
    require_tool("openssl", "openssl");
    let out = Command::new("openssl")
        .args(["passwd", "-apr1", PASSWORD])
        .output()
        .expect("run openssl passwd");
    assert!(out.status.success(), "openssl passwd failed: {out:?}");
    format!("{USER}:{}\n", String::from_utf8_lossy(&out.stdout).trim())
}

impl Nginx {
    /// Starts nginx with default options.
    pub fn start() -> Self {
        Self::start_with(&NginxOptions::default())
    }

    /// Starts nginx; fails the test when nginx is not installed.
    pub fn start_with(options: &NginxOptions) -> Self {
        require_tool("nginx", "nginx");
        let dir = crate::scratch_dir();
        let d = dir.path();
        let root = d.join("root");
        std::fs::create_dir_all(root.join("private")).expect("create the document root");
        std::fs::create_dir_all(d.join("tmp")).expect("create nginx's temporary directory");
        std::fs::write(d.join("htpasswd"), htpasswd_line()).expect("write htpasswd");
        let certs = TlsCerts::generate();
        let port = free_port();
        let tls_port = free_port();
        let limit = options
            .limit_rate
            .as_ref()
            .map(|r| format!("limit_rate {r};"))
            .unwrap_or_default();
        let p = |s: &str| d.join(s).display().to_string();
        let access_log = if options.access_log {
            format!(
                "log_format sent '$body_bytes_sent $status $request'; access_log {} sent;",
                p("access.log")
            )
        } else {
            "access_log off;".to_string()
        };
        let conf = format!(
            r#"
master_process off;
worker_processes 1;
pid {pid};
error_log {log} warn;
events {{ worker_connections 512; }}
http {{
    {access_log}
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    default_type application/octet-stream;
    sendfile on;
    keepalive_requests 100000;
    server {{
        listen 127.0.0.1:{port};
        listen 127.0.0.1:{tls_port} ssl;
        server_name localhost;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        root {root};
        {limit}
        location /private/ {{
            auth_basic "ferry";
            auth_basic_user_file {htpasswd};
        }}
        location /noranges/ {{
            alias {root}/;
            max_ranges 0;
        }}
        location /chunked/ {{
            alias {root}/;
            sub_filter_types *;
            sub_filter 'ferry-never-matches' '';
        }}
        location /redirect/ {{
            rewrite ^/redirect/(.*)$ /$1 redirect;
        }}
        location /loop/ {{
            rewrite ^/loop/(.*)$ /loop/$1 redirect;
        }}
        location /to-http/ {{
            rewrite ^/to-http/(.*)$ http://127.0.0.1:{port}/$1 redirect;
        }}
    }}
}}
"#,
            pid = p("nginx.pid"),
            log = p("error.log"),
            tmp = p("tmp"),
            cert = certs.dir().join("server-cert.pem").display(),
            key = certs.dir().join("server-key.pem").display(),
            root = root.display(),
            htpasswd = p("htpasswd"),
        );
        let conf_path = d.join("nginx.conf");
        std::fs::write(&conf_path, conf).expect("write nginx.conf");
        let child = Command::new("nginx")
            .arg("-c")
            .arg(&conf_path)
            .arg("-p")
            .arg(d)
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start nginx");
        let mut server = Self {
            child,
            dir,
            port,
            tls_port,
            certs,
        };
        server.wait_ready();
        server
    }

    fn wait_ready(&mut self) {
        let started = Instant::now();
        loop {
            let plain = TcpStream::connect(("127.0.0.1", self.port)).is_ok();
            let tls = TcpStream::connect(("127.0.0.1", self.tls_port)).is_ok();
            let pid = self.child.id() as i32;
            if plain && tls && listens_on(pid, self.port) && listens_on(pid, self.tls_port) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                let log =
                    std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default();
                let mut stderr = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut stderr);
                }
                panic!("nginx exited with {status}: {stderr}\n{log}");
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "nginx did not listen on ports {} and {} within 10 s",
                self.port,
                self.tls_port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The body bytes nginx sent, summed over its access log (started with
    /// [`NginxOptions::access_log`]), and the requests logged.
    pub fn body_bytes_sent(&self) -> (u64, usize) {
        let log = std::fs::read_to_string(self.dir.path().join("access.log"))
            .expect("nginx's access log (start it with NginxOptions::access_log)");
        let bytes = log
            .lines()
            .map(|l| {
                let first = l.split_whitespace().next().unwrap_or("0");
                first
                    .parse::<u64>()
                    .unwrap_or_else(|_| panic!("access log line without a byte count: {l}"))
            })
            .sum();
        (bytes, log.lines().count())
    }

    /// The document root: files put here are served.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// `http://127.0.0.1:PORT/PATH`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }

    /// `https://localhost:PORT/PATH` (the certificate names localhost and 127.0.0.1).
    pub fn https_url(&self, path: &str) -> String {
        format!("https://localhost:{}/{path}", self.tls_port)
    }

    /// The test CA's certificate (PEM file).
    pub fn ca_file(&self) -> PathBuf {
        self.certs.dir().join("ca-cert.pem")
    }

    /// nginx's error log, for failure messages.
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    /// The directory nginx runs in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
