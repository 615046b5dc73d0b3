//! Real NBD servers for tests: qemu-nbd and nbdkit on loopback, on ports chosen at run
//! time (or on Unix sockets), with pid files, stopped when dropped.
//!
//! A missing server binary fails the test with the install command. TLS certificates
//! (a CA, a server certificate for localhost/127.0.0.1 and a client certificate) are
//! made here with rcgen, in the directory layout qemu, nbdkit and libnbd share.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::check::require_tool;
use crate::process::{free_port, listens_on, read_pid, signal, wait_gone};

/// The Debian packages that hold the NBD servers and tools the tests use.
pub const NBD_PACKAGES: &str = "nbdkit libnbd-bin";

/// Fails the test unless `tool` is installed.
pub fn require(tool: &str) {
    let package = match tool {
        "qemu-nbd" | "qemu-img" => "qemu-utils",
        _ => NBD_PACKAGES,
    };
    require_tool(tool, package);
}

/// Where a server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Tcp(u16),
    Unix(PathBuf),
}

/// A running NBD server, stopped (SIGTERM, then SIGKILL) when dropped.
#[derive(Debug)]
pub struct NbdServer {
    pub listen: Listen,
    pub export: String,
    pub tls: bool,
    pid: Option<i32>,
    dir: tempfile::TempDir,
    what: String,
}

/// Options of [`NbdServer::qemu_nbd`].
#[derive(Debug, Clone, Default)]
pub struct QemuNbd {
    /// `raw` or `qcow2` (default raw).
    pub format: Option<String>,
    pub export: String,
    /// `-A`: the qemu:allocation-depth context.
    pub allocation_depth: bool,
    /// `-B NAME`: the qemu:dirty-bitmap:NAME context.
    pub bitmap: Option<String>,
    /// Serve TLS with the certificates in this directory (server-cert.pem, ...).
    pub tls: Option<PathBuf>,
    /// With TLS, require a client certificate signed by the CA.
    pub tls_verify_client: bool,
    pub read_only: bool,
    pub unix: bool,
    /// `--cache` mode, for example `none` or `writeback`.
    pub cache: Option<String>,
    pub extra: Vec<String>,
}

/// Options of [`NbdServer::nbdkit`].
#[derive(Debug, Clone, Default)]
pub struct Nbdkit {
    /// `--filter=NAME` arguments, in order.
    pub filters: Vec<String>,
    pub tls: Option<PathBuf>,
    pub unix: bool,
    /// Export name clients use (nbdkit serves any name; this only shapes the URI).
    pub export: String,
    pub read_only: bool,
}

impl NbdServer {
    /// `qemu-nbd --fork --persistent --shared=16` serving `image`.
    pub fn qemu_nbd(image: &Path, opts: &QemuNbd) -> Self {
        require("qemu-nbd");
        Self::start(
            "qemu-nbd",
            opts.unix,
            opts.tls.is_some(),
            &opts.export,
            |listen, pid_file| {
                let mut cmd = Command::new("qemu-nbd");
                cmd.args(["--fork", "--persistent", "--shared=16"]);
                cmd.arg(format!("--pid-file={}", pid_file.display()));
                cmd.args(["-f", opts.format.as_deref().unwrap_or("raw")]);
                cmd.args(["-x", &opts.export]);
                match listen {
                    Listen::Tcp(port) => {
                        cmd.args(["-b", "127.0.0.1", "-p", &port.to_string()]);
                    }
                    Listen::Unix(sock) => {
                        cmd.arg("-k").arg(sock);
                    }
                }
                if opts.allocation_depth {
                    cmd.arg("-A");
                }
                if let Some(bitmap) = &opts.bitmap {
                    cmd.args(["-B", bitmap]);
                }
                if opts.read_only {
                    cmd.arg("-r");
                }
                if let Some(cache) = &opts.cache {
                    cmd.arg(format!("--cache={cache}"));
                }
                if let Some(dir) = &opts.tls {
                    cmd.arg("--object").arg(format!(
                        "tls-creds-x509,id=tls0,endpoint=server,verify-peer=off,dir={}",
                        dir.display()
                    ));
                    cmd.args(["--tls-creds", "tls0"]);
                }
                cmd.args(&opts.extra);
                cmd.arg(image);
                cmd
            },
        )
    }

    /// `nbdkit` (forking into the background) with `plugin_args` (plugin and its
    /// parameters, for example `["file", "/path"]` or `["memory", "1G"]`).
    pub fn nbdkit(plugin_args: &[&str], opts: &Nbdkit) -> Self {
        require("nbdkit");
        Self::start(
            "nbdkit",
            opts.unix,
            opts.tls.is_some(),
            &opts.export,
            |listen, pid_file| {
                let mut cmd = Command::new("nbdkit");
                cmd.arg("-P").arg(pid_file);
                match listen {
                    Listen::Tcp(port) => {
                        cmd.args(["-i", "127.0.0.1", "-p", &port.to_string()]);
                    }
                    Listen::Unix(sock) => {
                        cmd.arg("-U").arg(sock);
                    }
                }
                if let Some(dir) = &opts.tls {
                    cmd.args(["--tls=require"]);
                    cmd.arg(format!("--tls-certificates={}", dir.display()));
                }
                if opts.read_only {
                    cmd.arg("-r");
                }
                for f in &opts.filters {
                    cmd.arg(format!("--filter={f}"));
                }
                cmd.args(plugin_args);
                cmd
            },
        )
    }

    /// Starts a forking server, retrying on another port if the chosen one was taken.
    fn start(
        name: &str,
        unix: bool,
        tls: bool,
        export: &str,
        build: impl Fn(&Listen, &Path) -> Command,
    ) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ferry-nbd-server-")
            .tempdir()
            .expect("server run directory");
        let pid_file = dir.path().join("server.pid");
        let mut last_error = String::new();
        for _ in 0..5 {
            let listen = if unix {
                Listen::Unix(dir.path().join("nbd.sock"))
            } else {
                Listen::Tcp(free_port())
            };
            let mut cmd = build(&listen, &pid_file);
            let what = format!("{cmd:?}");
            let out = cmd
                .output()
                .unwrap_or_else(|e| panic!("cannot run {name}: {e}"));
            if !out.status.success() {
                last_error = format!(
                    "{what} failed ({}): {}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                continue;
            }
            // The forking parent exits once the server listens; the pid file may trail.
            let deadline = Instant::now() + Duration::from_secs(10);
            let pid = loop {
                if let Some(pid) = read_pid(&pid_file) {
                    break pid;
                }
                assert!(
                    Instant::now() < deadline,
                    "{name} wrote no pid file: {what}"
                );
                std::thread::sleep(Duration::from_millis(10));
            };
            if let Listen::Tcp(port) = listen {
                // Both servers listen before they write the pid file: a port another
                // test's server holds means ours lost the bind.
                if !listens_on(pid, port) {
                    signal(pid, libc::SIGKILL);
                    wait_gone(pid, Duration::from_secs(10));
                    last_error = format!("{what}: port {port} is held by another process");
                    continue;
                }
            }
            return Self {
                listen,
                export: export.to_string(),
                tls,
                pid: Some(pid),
                dir,
                what,
            };
        }
        panic!("could not start {name}: {last_error}");
    }

    /// The server's URI (nbd://, nbd+unix://, nbds:// with TLS), with `query` options
    /// (for example `tls-certificates=DIR`) appended.
    pub fn uri_with(&self, query: &[String]) -> String {
        let scheme = if self.tls { "nbds" } else { "nbd" };
        let mut params: Vec<String> = Vec::new();
        let base = match &self.listen {
            Listen::Tcp(port) => format!("{scheme}://127.0.0.1:{port}/{}", self.export),
            Listen::Unix(sock) => {
                params.push(format!("socket={}", sock.display()));
                format!("{scheme}+unix:///{}", self.export)
            }
        };
        params.extend(query.iter().cloned());
        if params.is_empty() {
            base
        } else {
            format!("{base}?{}", params.join("&"))
        }
    }

    pub fn uri(&self) -> String {
        self.uri_with(&[])
    }

    /// The port, for TCP servers.
    pub fn port(&self) -> Option<u16> {
        match self.listen {
            Listen::Tcp(p) => Some(p),
            Listen::Unix(_) => None,
        }
    }

    pub fn socket(&self) -> Option<&Path> {
        match &self.listen {
            Listen::Unix(p) => Some(p),
            Listen::Tcp(_) => None,
        }
    }

    pub fn pid(&self) -> Option<i32> {
        self.pid
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(pid) = self.pid.take() {
            signal(pid, libc::SIGKILL);
            wait_gone(pid, Duration::from_secs(10));
        }
    }

    /// Stops the server (SIGTERM, SIGKILL after 10 s) and waits until it is gone, so the
    /// image behind it can be inspected without locks.
    pub fn stop(&mut self) {
        if let Some(pid) = self.pid.take() {
            signal(pid, libc::SIGTERM);
            if !wait_gone(pid, Duration::from_secs(10)) {
                signal(pid, libc::SIGKILL);
                wait_gone(pid, Duration::from_secs(10));
            }
        }
    }

    /// The command line the server was started with.
    pub fn command_line(&self) -> &str {
        &self.what
    }

    /// The server's run directory (pid file, socket).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// X.509 certificates for TLS tests, in the layout qemu, nbdkit and libnbd use.
#[derive(Debug)]
pub struct TlsCerts {
    dir: tempfile::TempDir,
}

impl TlsCerts {
    /// A CA, a server certificate for `localhost` and `127.0.0.1`, and a client
    /// certificate, all signed by the CA.
    pub fn generate() -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        let dir = tempfile::Builder::new()
            .prefix("ferry-nbd-tls-")
            .tempdir()
            .expect("certificate directory");
        let write = |name: &str, text: String| {
            std::fs::write(dir.path().join(name), text).expect("write certificate");
        };
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "ferry test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().expect("CA key");
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
        write("ca-cert.pem", ca_cert.pem());
        let issuer = Issuer::new(ca, ca_key);

        let leaf = |names: Vec<String>, cn: &str, purpose: ExtendedKeyUsagePurpose| {
            let mut params = CertificateParams::new(names).expect("leaf parameters");
            params.distinguished_name.push(DnType::CommonName, cn);
            params.extended_key_usages = vec![purpose];
            params.use_authority_key_identifier_extension = true;
            let key = KeyPair::generate().expect("leaf key");
            let cert = params.signed_by(&key, &issuer).expect("leaf certificate");
            (cert.pem(), key.serialize_pem())
        };
        let (cert, key) = leaf(
            vec!["localhost".into(), "127.0.0.1".into()],
            "localhost",
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        write("server-cert.pem", cert);
        write("server-key.pem", key);
        let (cert, key) = leaf(
            vec!["client.ferry.test".into()],
            "client.ferry.test",
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        write("client-cert.pem", cert);
        write("client-key.pem", key);
        Self { dir }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// `nbdinfo --map URI`: the allocation map as `(offset, length, description)` lines.
pub fn nbdinfo_map(uri: &str) -> Vec<(u64, u64, String)> {
    require("nbdinfo");
    let out = Command::new("nbdinfo")
        .args(["--map", uri])
        .output()
        .expect("run nbdinfo");
    assert!(
        out.status.success(),
        "nbdinfo --map {uri} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let offset = words.next()?.parse().ok()?;
            let len = words.next()?.parse().ok()?;
            let _flags = words.next()?;
            Some((offset, len, words.collect::<Vec<_>>().join(" ")))
        })
        .collect()
}

/// Bytes `nbdinfo --map` reports as data (not hole, not zero).
pub fn nbd_data_bytes(uri: &str) -> u64 {
    nbdinfo_map(uri)
        .iter()
        .filter(|(_, _, what)| what == "data")
        .map(|(_, len, _)| len)
        .sum()
}
