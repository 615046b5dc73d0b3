//! A tgtd (Linux SCSI target framework) the iSCSI tests start on loopback: a portal on
//! 127.0.0.1 with a port chosen at run time, its own management channel, targets with
//! LUNs backed by files (thick, or thin with `thin_provisioning=1`) and CHAP accounts.
//! Dropping it deletes the targets with `--force` and then the system, which ends tgtd.

use crate::process::{free_port, listens_on};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Fails the test unless tgtd and tgtadm are installed.
pub fn require_tgt() {
    for tool in ["tgtd", "tgtadm"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(found, "{tool} is not installed: apt-get install -y tgt");
    }
}

/// A LUN to create.
#[derive(Debug, Clone)]
pub struct Lun {
    pub backing: PathBuf,
    pub thin: bool,
}

/// A running tgtd.
#[derive(Debug)]
pub struct Tgtd {
    child: Option<Child>,
    port: u16,
    control: u16,
    targets: Vec<u32>,
    log: PathBuf,
}

/// A management channel number for tgtd (1024..=32767), spread by the portal port, the
/// process and the attempt so that parallel tests rarely pick the same one.
fn control_port(port: u16, attempt: u32) -> u16 {
    let mut h = u64::from(port) ^ (u64::from(std::process::id()) << 16) ^ u64::from(attempt) << 40;
    h = h.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^= h >> 29;
    1024 + (h % (32767 - 1024 + 1)) as u16
}

impl Tgtd {
    /// Starts tgtd with a portal on a free loopback port. The management channel is a
    /// unix socket named by a "control port" that tgtd limits to 1..=32767 and locks; a
    /// number another tgtd holds makes ours exit at once, so a clash is retried.
    pub fn start() -> Self {
        require_tgt();
        let mut last_log = String::new();
        for attempt in 0..20u32 {
            let port = free_port();
            let control = control_port(port, attempt);
            match Self::try_start(port, control) {
                Ok(t) => return t,
                Err(log) => last_log = log,
            }
        }
        panic!("tgtd did not start in 20 attempts; its last log:\n{last_log}");
    }

    /// One attempt: Err(log) when tgtd exited (a port or control channel clash).
    fn try_start(port: u16, control: u16) -> Result<Self, String> {
        let log = std::env::temp_dir().join(format!("ferry-tgtd-{port}-{control}.log"));
        let child = Command::new("tgtd")
            .args(["-f", "-C", &control.to_string(), "--iscsi"])
            .arg(format!("portal=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(&log)
                    .map(Stdio::from)
                    .unwrap_or(Stdio::null()),
            )
            .spawn()
            .expect("start tgtd");
        let mut t = Self {
            child: Some(child),
            port,
            control,
            targets: Vec::new(),
            log: log.clone(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(Ok(Some(_))) = t.child.as_mut().map(|c| c.try_wait()) {
                t.child = None;
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let _ = std::fs::remove_file(&log);
                return Err(text);
            }
            let ok = Command::new("tgtadm")
                .args([
                    "-C",
                    &control.to_string(),
                    "--lld",
                    "iscsi",
                    "--mode",
                    "system",
                    "--op",
                    "show",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            let pid = t.child.as_ref().map_or(0, |c| c.id() as i32);
            if ok
                && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                && listens_on(pid, port)
            {
                return Ok(t);
            }
            assert!(
                Instant::now() < deadline,
                "tgtd did not come up on port {port}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// tgtd's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// host:port of the portal.
    pub fn portal(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Runs tgtadm against this tgtd; panics with its output on failure.
    pub fn tgtadm(&self, args: &[&str]) -> String {
        let out = Command::new("tgtadm")
            .args(["-C", &self.control.to_string(), "--lld", "iscsi"])
            .args(args)
            .output()
            .expect("run tgtadm");
        assert!(
            out.status.success(),
            "tgtadm {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Creates target `tid` named `iqn` with `luns` (numbered from 1), open to 127.0.0.1.
    pub fn add_target(&mut self, tid: u32, iqn: &str, luns: &[Lun]) {
        let t = tid.to_string();
        self.tgtadm(&[
            "--mode",
            "target",
            "--op",
            "new",
            "--tid",
            &t,
            "--targetname",
            iqn,
        ]);
        self.targets.push(tid);
        for (i, lun) in luns.iter().enumerate() {
            let n = (i + 1).to_string();
            let backing = lun.backing.to_str().expect("UTF-8 path");
            self.tgtadm(&[
                "--mode",
                "logicalunit",
                "--op",
                "new",
                "--tid",
                &t,
                "--lun",
                &n,
                "--bstype",
                "rdwr",
                "--backing-store",
                backing,
            ]);
            if lun.thin {
                self.tgtadm(&[
                    "--mode",
                    "logicalunit",
                    "--op",
                    "update",
                    "--tid",
                    &t,
                    "--lun",
                    &n,
                    "--params",
                    "thin_provisioning=1",
                ]);
            }
        }
        self.tgtadm(&[
            "--mode",
            "target",
            "--op",
            "bind",
            "--tid",
            &t,
            "--initiator-address",
            "127.0.0.1",
        ]);
    }

    /// Sets a target parameter (for example MaxRecvDataSegmentLength).
    pub fn set_param(&self, tid: u32, name: &str, value: &str) {
        self.tgtadm(&[
            "--mode",
            "target",
            "--op",
            "update",
            "--tid",
            &tid.to_string(),
            "--name",
            name,
            "--value",
            value,
        ]);
    }

    /// Requires CHAP `user`/`password` for target `tid`; `outgoing` makes it the
    /// target's own account for mutual CHAP.
    pub fn add_chap(&self, tid: u32, user: &str, password: &str, outgoing: bool) {
        self.bind_account(Some(tid), user, password, outgoing);
    }

    /// Requires CHAP `user`/`password` for discovery sessions (SendTargets) on this portal;
    /// `outgoing` makes it the portal's own account for mutual CHAP in discovery. tgtd keeps
    /// discovery accounts apart from every target's: an account bound with no `--tid`.
    pub fn add_discovery_chap(&self, user: &str, password: &str, outgoing: bool) {
        self.bind_account(None, user, password, outgoing);
    }

    /// Creates the account and binds it to target `tid`, or to discovery when None.
    fn bind_account(&self, tid: Option<u32>, user: &str, password: &str, outgoing: bool) {
        self.tgtadm(&[
            "--mode",
            "account",
            "--op",
            "new",
            "--user",
            user,
            "--password",
            password,
        ]);
        let t = tid.map(|tid| tid.to_string());
        let mut args = vec!["--mode", "account", "--op", "bind", "--user", user];
        if let Some(t) = &t {
            args.extend(["--tid", t.as_str()]);
        }
        if outgoing {
            args.push("--outgoing");
        }
        self.tgtadm(&args);
    }

    /// Stops tgtd: targets deleted with --force, then the system.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let c = self.control.to_string();
        for tid in std::mem::take(&mut self.targets) {
            let _ = Command::new("tgtadm")
                .args([
                    "-C", &c, "--lld", "iscsi", "--mode", "target", "--op", "delete", "--force",
                    "--tid",
                ])
                .arg(tid.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = Command::new("tgtadm")
            .args([
                "-C", &c, "--lld", "iscsi", "--op", "delete", "--mode", "system",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                let _ = std::fs::remove_file(&self.log);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_file(&self.log);
    }

    /// Kills tgtd with SIGKILL at once (a target that dies mid-transfer).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.targets.clear();
        let _ = std::fs::remove_file(&self.log);
    }

    /// What tgtd logged so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Tgtd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Allocated bytes of a file (st_blocks * 512).
pub fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0)
}
