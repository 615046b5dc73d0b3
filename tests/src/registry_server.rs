//! A real OCI registry for the tests: Debian's `docker-registry` (the reference
//! distribution registry) on loopback, with TLS from a test CA made by `openssl` and
//! htpasswd basic auth; and containerDisk images built with `buildah` (`FROM scratch`,
//! the disk under `/disk/`) and pushed with `buildah push`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::check::require_tool;
use crate::process::{free_port, listens_on};

pub const USER: &str = "ferry";
pub const PASSWORD: &str = "s3cret-registry-pw";

/// A running registry; stopped when dropped.
#[derive(Debug)]
pub struct Registry {
    child: Child,
    dir: PathBuf,
    pub port: u16,
}

fn run(program: &str, args: &[&str], package: &str) -> String {
    require_tool(program, package);
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

impl Registry {
    /// Starts a registry in `dir` (its CA, certificate, htpasswd, storage and config).
    pub fn start(dir: &Path) -> Self {
        require_tool("docker-registry", "docker-registry");
        require_tool("htpasswd", "apache2-utils");
        let dir = dir.to_path_buf();
        let f = |n: &str| dir.join(n);
        run(
            "openssl",
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                s(&f("ca.key")),
                "-out",
                s(&f("ca.pem")),
                "-days",
                "2",
                "-subj",
                "/CN=ferry test registry CA",
            ],
            "openssl",
        );
        run(
            "openssl",
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                s(&f("srv.key")),
                "-out",
                s(&f("srv.csr")),
                "-subj",
                "/CN=127.0.0.1",
            ],
            "openssl",
        );
        std::fs::write(f("ext.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
        run(
            "openssl",
            &[
                "x509",
                "-req",
                "-in",
                s(&f("srv.csr")),
                "-CA",
                s(&f("ca.pem")),
                "-CAkey",
                s(&f("ca.key")),
                "-CAcreateserial",
                "-out",
                s(&f("srv.pem")),
                "-days",
                "2",
                "-extfile",
                s(&f("ext.cnf")),
            ],
            "openssl",
        );
        let htpasswd = run("htpasswd", &["-Bbn", USER, PASSWORD], "apache2-utils");
        std::fs::write(f("htpasswd"), htpasswd).unwrap();
        std::fs::create_dir_all(f("certs")).unwrap();
        std::fs::copy(f("ca.pem"), f("certs/ca.crt")).unwrap();
        let port = free_port();
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  \
             delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n  tls:\n    certificate: {}\n    \
             key: {}\nauth:\n  htpasswd:\n    realm: ferry\n    path: {}\n",
            s(&f("data")),
            s(&f("srv.pem")),
            s(&f("srv.key")),
            s(&f("htpasswd"))
        );
        std::fs::write(f("config.yml"), config).unwrap();
        let log = std::fs::File::create(f("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .args(["serve", s(&f("config.yml"))])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        let registry = Self { child, dir, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !listens_on(registry.child.id() as i32, port) {
            assert!(
                Instant::now() < deadline,
                "docker-registry did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::fs::write(
            registry.auth_file(),
            format!(
                "{{\"auths\":{{\"127.0.0.1:{port}\":{{\"auth\":\"{}\"}}}}}}",
                base64(&format!("{USER}:{PASSWORD}"))
            ),
        )
        .unwrap();
        registry
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `docker://127.0.0.1:PORT/REPO` (append `:tag` or `@digest`).
    pub fn url(&self, repo: &str) -> String {
        format!("docker://{}/{repo}", self.host())
    }

    /// The docker config.json with the registry's credentials.
    pub fn auth_file(&self) -> PathBuf {
        self.dir.join("auth.json")
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Where the registry keeps the bytes of blob `digest` (`sha256:HEX`).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    fn buildah(&self, args: &[&str]) -> String {
        let root = self.dir.join("buildah");
        let mut all = vec![
            "--root",
            s(&root),
            "--runroot",
            s(&root),
            "--storage-driver",
            "vfs",
        ];
        all.extend_from_slice(args);
        let root_run = root.join("run");
        let _ = std::fs::create_dir_all(&root_run);
        run("buildah", &all, "buildah")
    }

    /// Builds a containerDisk image `name` (`FROM scratch`, `disk` added as `/disk/NAME`)
    /// for `arch`.
    pub fn build(&self, name: &str, disk: &Path, arch: &str) {
        let ctx = self.dir.join(format!("ctx-{name}"));
        std::fs::create_dir_all(&ctx).unwrap();
        let file = disk.file_name().unwrap().to_str().unwrap();
        std::fs::copy(disk, ctx.join(file)).unwrap();
        std::fs::write(
            ctx.join("Containerfile"),
            format!("FROM scratch\nADD {file} /disk/\n"),
        )
        .unwrap();
        self.buildah(&[
            "bud",
            "--isolation",
            "chroot",
            "-q",
            "--arch",
            arch,
            "-t",
            name,
            s(&ctx),
        ]);
    }

    /// Pushes image `name` to `repo:tag` with `compression` (gzip, zstd, or none).
    pub fn push(&self, name: &str, repo_tag: &str, compression: &str) {
        let dest = format!("docker://{}/{repo_tag}", self.host());
        let certs = self.dir.join("certs");
        let auth = self.auth_file();
        let mut args = vec!["push", "--authfile", s(&auth), "--cert-dir", s(&certs)];
        match compression {
            "none" => args.push("--disable-compression"),
            other => args.extend(["--compression-format", other]),
        }
        args.extend([name, dest.as_str()]);
        self.buildah(&args);
    }

    /// Makes a manifest list of `images` and pushes it (with the images) to `repo_tag`.
    pub fn push_index(&self, list: &str, images: &[&str], repo_tag: &str) {
        self.buildah(&["manifest", "create", list]);
        for image in images {
            self.buildah(&["manifest", "add", list, image]);
        }
        let dest = format!("docker://{}/{repo_tag}", self.host());
        let certs = self.dir.join("certs");
        let auth = self.auth_file();
        self.buildah(&[
            "manifest",
            "push",
            "--all",
            "--authfile",
            s(&auth),
            "--cert-dir",
            s(&certs),
            list,
            &dest,
        ]);
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn base64(text: &str) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = text.as_bytes();
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
