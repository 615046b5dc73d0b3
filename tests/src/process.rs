//! Processes and ports of the servers the tests start: picking a free loopback port,
//! proving that the process a test started is the one listening on it, and stopping it.
//!
//! A free port is only free when it is picked: two tests can pick the same one, and the
//! server that loses the bind may run for a while before it exits (nfs-ganesha about a
//! second). A readiness check that only connects would then hand the test the other
//! test's server, which goes away when that test ends. [`listens_on`] closes the gap.

use std::fs;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// A TCP port on 127.0.0.1 that nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

/// Whether process `pid` holds a socket listening on TCP `port` (IPv4 or IPv6).
pub fn listens_on(pid: i32, port: u16) -> bool {
    const LISTEN: &str = "0A";
    let mut sockets = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let local_port = local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if *state == LISTEN && local_port == Some(port) {
                sockets.push(format!("socket:[{inode}]"));
            }
        }
    }
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        fs::read_link(fd.path())
            .map(|target| sockets.iter().any(|s| target.as_os_str() == s.as_str()))
            .unwrap_or(false)
    })
}

/// The process id in a pid file, once the server has written it.
pub fn read_pid(path: &Path) -> Option<i32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Whether process `pid` exists.
pub fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Sends `sig` to `pid`.
pub fn signal(pid: i32, sig: i32) {
    // SAFETY: sending a signal to a process this test started.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Waits up to `limit` for `pid` to exit; whether it did.
pub fn wait_gone(pid: i32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// A server process the test started that prints lines on stdout (its URI first): read
/// line by line, stopped by SIGTERM (also when dropped).
#[derive(Debug)]
pub struct Serving {
    child: Option<Child>,
    lines: Receiver<String>,
}

impl Serving {
    /// Starts `cmd` (stdout piped) and returns once it printed its first line.
    pub fn start(mut cmd: Command) -> (Self, String) {
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("start ferry");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut running = Self {
            child: Some(child),
            lines,
        };
        let first = running.next_line(Duration::from_secs(60));
        (running, first.trim().to_string())
    }

    /// The next line on stdout; fails the test after `limit`.
    pub fn next_line(&mut self, limit: Duration) -> String {
        match self.lines.recv_timeout(limit) {
            Ok(line) => line,
            Err(_) => {
                if let Some(mut child) = self.child.take() {
                    let _ = child.kill();
                    let status = child.wait();
                    panic!("ferry printed no line within {limit:?} ({status:?})");
                }
                panic!("ferry printed no line");
            }
        }
    }

    /// SIGTERM; returns whether it exited 0 within 10 s.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        signal(child.id() as i32, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.success();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_this_process_listener_and_not_a_free_port() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = std::process::id() as i32;
        assert!(listens_on(me, port));
        drop(listener);
        assert!(!listens_on(me, port));
        assert!(!listens_on(me, free_port()));
    }
}
