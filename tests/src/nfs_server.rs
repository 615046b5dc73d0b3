//! A real NFS server for tests: nfs-ganesha (VFS) on loopback, serving a scratch export
//! over NFSv3 and v4, with rpcbind (which ganesha needs to start).
//!
//! Ports are chosen at run time, so tests run in parallel with one ganesha each; clients
//! use `nfsport=` and `mountport=` in the URL, because every instance registers with the
//! one rpcbind on port 111 and the last one to start or stop wins there. rpcbind is a
//! system daemon: it is started when missing and left running. Each server has its own
//! run directory (config, log, pid file, recovery directory, export) and is stopped,
//! SIGTERM then SIGKILL, when dropped.

use std::fs;
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ferry_core::spec::NfsSpec;
use ferry_core::EndpointSpec;

use crate::check::require_tool;
use crate::process::{alive, listens_on, read_pid, signal, wait_gone};

/// The Debian packages the NFS tests need (libnfs-utils: nfs-cp and nfs-ls, the peers).
pub const NFS_PACKAGES: &str = "nfs-ganesha nfs-ganesha-vfs rpcbind libnfs-utils";

/// Fails the test unless the NFS server binaries are installed.
pub fn require() {
    let install = "nfs-ganesha nfs-ganesha-vfs rpcbind";
    require_tool("ganesha.nfsd", install);
    if !Path::new("/usr/lib/x86_64-linux-gnu/ganesha/libfsalvfs.so").exists()
        && !Path::new("/usr/lib/ganesha/libfsalvfs.so").exists()
        && !Path::new("/usr/lib64/ganesha/libfsalvfs.so").exists()
    {
        panic!(
            "nfs-ganesha's VFS backend is not installed: run `apt-get update && apt-get install -y --no-install-recommends {install}`"
        );
    }
    if !Path::new("/usr/sbin/rpcbind").exists() {
        require_tool("rpcbind", install);
    }
}

fn port_open(port: u16) -> bool {
    TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

const NFS_PROGRAM: u32 = 100_003;
const MOUNT_PROGRAM: u32 = 100_005;

/// Whether `program` answers an RPC NULL call on `port`: the server is serving, not only
/// listening (a ganesha that has just started can reset the first connections it
/// accepts).
fn rpc_answers(port: u16, program: u32, version: u32) -> bool {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    // Record mark, xid, CALL, RPC version 2, program, version, NULL, AUTH_NONE twice.
    let words = [0x8000_0000 | 40, 1, 0, 2, program, version, 0, 0, 0, 0, 0];
    let call: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
    let mut reply = [0u8; 28];
    if s.write_all(&call).is_err() || s.read_exact(&mut reply).is_err() {
        return false;
    }
    let word = |i: usize| u32::from_be_bytes([reply[i], reply[i + 1], reply[i + 2], reply[i + 3]]);
    // REPLY, MSG_ACCEPTED, an empty verifier, SUCCESS.
    word(8) == 1 && word(12) == 0 && word(20) == 0 && word(24) == 0
}

/// Starts rpcbind unless something already answers on port 111.
pub fn ensure_rpcbind() {
    if port_open(111) {
        return;
    }
    fs::create_dir_all("/run/rpcbind").ok();
    let rpcbind = if Path::new("/usr/sbin/rpcbind").exists() {
        "/usr/sbin/rpcbind"
    } else {
        "rpcbind"
    };
    // rpcbind forks into the background; a second one racing us just fails to bind.
    let _ = Command::new(rpcbind).status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !port_open(111) {
        assert!(
            Instant::now() < deadline,
            "rpcbind did not start listening on port 111"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A port free for both TCP and UDP on 127.0.0.1 (ganesha binds both).
fn free_port() -> u16 {
    loop {
        let tcp = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = tcp.local_addr().expect("local address").port();
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A running nfs-ganesha exporting `export_dir()` (real path, used by NFSv3) as `/export`
/// (its NFSv4 pseudo path; NFSv4.0, 4.1 and 4.2 are enabled).
#[derive(Debug)]
pub struct Ganesha {
    dir: tempfile::TempDir,
    pub nfs_port: u16,
    pub mount_port: u16,
    pid: Option<i32>,
    /// Settings of ganesha's NFSV4 block beyond the defaults here.
    nfsv4: &'static str,
}

impl Ganesha {
    /// Starts a server with an empty export.
    pub fn start() -> Self {
        Self::start_with_nfsv4("Minor_Versions = 0, 1, 2;")
    }

    /// Starts a server with these settings in its NFSV4 block, for example
    /// `"Minor_Versions = 0, 1;"` (a server without NFSv4.2) or `"Lease_Lifetime = 5;"`.
    pub fn start_with_nfsv4(nfsv4: &'static str) -> Self {
        require();
        ensure_rpcbind();
        let dir = crate::scratch_dir();
        fs::create_dir_all(dir.path().join("export")).expect("export directory");
        fs::create_dir_all(dir.path().join("recov")).expect("recovery directory");
        let mut server = Self {
            dir,
            nfs_port: 0,
            mount_port: 0,
            pid: None,
            nfsv4,
        };
        let mut last = String::new();
        for _ in 0..5 {
            server.nfs_port = free_port();
            server.mount_port = free_port();
            match server.launch() {
                Ok(()) => return server,
                Err(e) => last = e,
            }
        }
        panic!("could not start nfs-ganesha: {last}");
    }

    fn config(&self) -> String {
        let r = self.dir.path().display();
        format!(
            "NFS_CORE_PARAM {{ Bind_addr = 127.0.0.1; Protocols = 3, 4; NFS_Port = {}; MNT_Port = {}; \
             Enable_NLM = false; Enable_RQUOTA = false; }}\n\
             NFSV4 {{ Graceless = true; RecoveryRoot = {r}/recov; Allow_Numeric_Owners = true; Only_Numeric_Owners = true; {} }}\n\
             NFS_KRB5 {{ Active_krb5 = false; }}\n\
             EXPORT {{ Export_Id = 1; Path = {r}/export; Pseudo = /export; Access_Type = RW; \
             Squash = No_Root_Squash; SecType = sys; Protocols = 3, 4; Transports = TCP; FSAL {{ Name = VFS; }} }}\n",
            self.nfs_port, self.mount_port, self.nfsv4
        )
    }

    fn launch(&mut self) -> Result<(), String> {
        let conf = self.dir.path().join("ganesha.conf");
        let pid_file = self.dir.path().join("ganesha.pid");
        let _ = fs::remove_file(&pid_file);
        fs::write(&conf, self.config()).map_err(|e| format!("write config: {e}"))?;
        let mut launcher = Command::new("ganesha.nfsd")
            .arg("-f")
            .arg(&conf)
            .arg("-L")
            .arg(self.log_path())
            .arg("-p")
            .arg(&pid_file)
            .spawn()
            .map_err(|e| format!("cannot run ganesha.nfsd: {e}"))?;
        // ganesha.nfsd forks the server and exits; a launcher that hangs is killed, not
        // waited for without end.
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            match launcher.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    let _ = launcher.kill();
                    let _ = launcher.wait();
                    return Err(format!(
                        "ganesha.nfsd did not return within 30 s: {}",
                        self.log_tail()
                    ));
                }
                Err(e) => return Err(format!("cannot wait for ganesha.nfsd: {e}")),
            }
        };
        if !status.success() {
            return Err(format!(
                "ganesha.nfsd exited with {status}: {}",
                self.log_tail()
            ));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let pid = read_pid(&pid_file);
            if let Some(pid) = pid {
                self.pid = Some(pid);
                if !alive(pid) {
                    self.pid = None;
                    return Err(format!("ganesha.nfsd died at start: {}", self.log_tail()));
                }
                if rpc_answers(self.nfs_port, NFS_PROGRAM, 3)
                    && rpc_answers(self.mount_port, MOUNT_PROGRAM, 3)
                    && listens_on(pid, self.nfs_port)
                    && listens_on(pid, self.mount_port)
                {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                self.stop();
                return Err(format!(
                    "ganesha.nfsd did not listen on ports {} and {} within 30 s: {}",
                    self.nfs_port,
                    self.mount_port,
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The exported directory (the real path NFSv3 clients use).
    pub fn export_dir(&self) -> PathBuf {
        self.dir.path().join("export")
    }

    /// The file behind `name` in the export, to check what the server stored.
    pub fn path(&self, name: &str) -> PathBuf {
        self.export_dir().join(name)
    }

    /// `nfs://127.0.0.1/<export>/<name>?nfsport=..&mountport=..` plus `extra` options.
    pub fn url_with(&self, name: &str, extra: &str) -> String {
        let mut url = format!(
            "nfs://127.0.0.1{}/{name}?nfsport={}&mountport={}",
            self.export_dir().display(),
            self.nfs_port,
            self.mount_port
        );
        if !extra.is_empty() {
            url.push('&');
            url.push_str(extra);
        }
        url
    }

    pub fn url(&self, name: &str) -> String {
        self.url_with(name, "")
    }

    /// `nfs://127.0.0.1/export/<name>?nfsport=..&version=4`: the NFSv4 pseudo path.
    pub fn url_v4(&self, name: &str) -> String {
        format!(
            "nfs://127.0.0.1/export/{name}?nfsport={}&version=4",
            self.nfs_port
        )
    }

    /// [`Ganesha::url`] for version 3, [`Ganesha::url_v4`] for version 4: tests that run
    /// for both versions (see [`crate::nfs_versions`]) name their files with this.
    pub fn url_for(&self, version: u8, name: &str) -> String {
        match version {
            3 => self.url(name),
            4 => self.url_v4(name),
            _ => panic!("NFS version {version}: the tests know versions 3 and 4"),
        }
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("ganesha.log")
    }

    /// The end of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| !l.contains(":DBUS :") && !l.contains("krb5"))
            .collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    pub fn pid(&self) -> Option<i32> {
        self.pid
    }

    /// Stops the server (SIGTERM, SIGKILL after 15 s) and waits until it is gone.
    pub fn stop(&mut self) {
        if let Some(pid) = self.pid.take() {
            signal(pid, libc::SIGTERM);
            if !wait_gone(pid, Duration::from_secs(15)) {
                signal(pid, libc::SIGKILL);
                wait_gone(pid, Duration::from_secs(10));
            }
        }
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(pid) = self.pid.take() {
            signal(pid, libc::SIGKILL);
            wait_gone(pid, Duration::from_secs(10));
        }
    }

    /// Starts the server again on the same ports with the same export (a restart: new
    /// boot time, so a new write verifier).
    pub fn restart(&mut self) {
        self.stop();
        let mut last = String::new();
        for _ in 0..20 {
            match self.launch() {
                Ok(()) => return,
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("could not restart nfs-ganesha: {last}");
    }
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The NFS spec of `url`, for opening `ferry_endpoints::nfs` sources and targets directly.
pub fn nfs_spec(url: &str) -> NfsSpec {
    match EndpointSpec::parse(url) {
        Ok(EndpointSpec::Nfs(s)) => s,
        other => panic!("{url} parsed as {other:?}"),
    }
}
