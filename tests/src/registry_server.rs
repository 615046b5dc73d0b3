//! A real OCI registry for the tests: Debian's `docker-registry` (the reference
//! distribution registry) on loopback, with TLS from a test CA made by `openssl` and
//! htpasswd basic auth; and containerDisk images built with `buildah` (`FROM scratch`,
//! the disk under `/disk/`) and pushed with `buildah push`.
//!
//! Also, for the tests of what buildah cannot make:
//! - [`Auth::Token`]: the registry trusts only bearer tokens (its `auth: token:`
//!   configuration); the token service is an nginx on TLS that checks the user's basic
//!   credentials and hands out a JWT minted here (RS256, signed by `openssl` with a test
//!   key whose self-signed certificate is the registry's `rootcertbundle`, sent in `x5c`);
//! - [`Registry::push_image`]: an OCI image (layer, config, manifest) pushed with the
//!   registry's HTTP API (`curl`), for uncompressed layers and hand-built (broken) tars;
//!   [`tar_entry`] and [`tar_end`] build those tars;
//! - [`Registry::range_refusing_proxy`]: an nginx in front of the registry that strips
//!   `Range` and answers every blob with 200 and the whole body;
//! - [`Registry::counting_proxy`]: an nginx in front of the registry that logs the bytes
//!   of every answer ([`Front::blob_bytes_served`]).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sha2::{Digest as _, Sha256};

use crate::check::require_tool;
use crate::process::{free_port, listens_on};

pub const USER: &str = "ferry";
pub const PASSWORD: &str = "s3cret-registry-pw";
/// The token service's name (the JWT's audience) and issuer.
pub const TOKEN_SERVICE: &str = "ferry-test-registry";
pub const TOKEN_ISSUER: &str = "ferry-test-token-issuer";

/// How the registry checks its clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// htpasswd basic auth ([`USER`], [`PASSWORD`]).
    Htpasswd,
    /// Bearer tokens only, from a token service that grants pull and push on
    /// `repositories` to [`USER`] with [`PASSWORD`].
    Token { repositories: Vec<String> },
    /// Anyone pulls and pushes, over plain HTTP (a public registry reached with
    /// `insecure`): what an operator that reads no credentials can ask.
    AnonymousPlain,
}

/// A running registry; stopped when dropped.
#[derive(Debug)]
pub struct Registry {
    child: Child,
    dir: PathBuf,
    pub port: u16,
    /// The token service, with [`Auth::Token`].
    token_service: Option<Front>,
    /// Plain HTTP ([`Auth::AnonymousPlain`]).
    plain: bool,
}

/// An nginx in front of (or beside) the registry; stopped when dropped.
#[derive(Debug)]
pub struct Front {
    child: Child,
    dir: PathBuf,
    pub port: u16,
}

impl Front {
    /// Starts nginx with one TLS `server` on a free port; `body` is the server's
    /// directives after `listen` and the certificate.
    fn start(dir: &Path, name: &str, cert: &Path, key: &Path, body: &str) -> Self {
        require_tool("nginx", "nginx");
        let dir = dir.join(name);
        std::fs::create_dir_all(dir.join("tmp")).unwrap();
        let port = free_port();
        let p = |n: &str| dir.join(n).display().to_string();
        let conf = format!(
            "master_process off;\nworker_processes 1;\npid {pid};\nerror_log {log} warn;\n\
             events {{ worker_connections 256; }}\nhttp {{\n  access_log {access};\n  \
             client_body_temp_path {tmp}/body;\n  proxy_temp_path {tmp}/proxy;\n  \
             fastcgi_temp_path {tmp}/fastcgi;\n  uwsgi_temp_path {tmp}/uwsgi;\n  \
             scgi_temp_path {tmp}/scgi;\n  server {{\n    listen 127.0.0.1:{port} ssl;\n    \
             ssl_certificate {cert};\n    ssl_certificate_key {key};\n{body}\n  }}\n}}\n",
            pid = p("nginx.pid"),
            log = p("error.log"),
            access = p("access.log"),
            tmp = p("tmp"),
            cert = s(cert),
            key = s(key),
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let child = Command::new("nginx")
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .arg("-p")
            .arg(&dir)
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx");
        let mut front = Self { child, dir, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !listens_on(front.child.id() as i32, port) {
            if let Ok(Some(status)) = front.child.try_wait() {
                panic!(
                    "nginx ({name}) exited with {status}: {}",
                    std::fs::read_to_string(front.dir.join("error.log")).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "nginx ({name}) did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        front
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// nginx's access log so far (one line a request, nginx's combined format).
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("access.log")).unwrap_or_default()
    }

    /// Body bytes a [`Registry::counting_proxy`] sent in answers to GETs of the blob
    /// `digest`, and how many such GETs it answered.
    pub fn blob_bytes_served(&self, digest: &str) -> (u64, usize) {
        // nginx's default (combined) format: `... "GET URI HTTP/1.1" STATUS BYTES ...`.
        let blob = format!("/blobs/{digest} ");
        self.access_log()
            .lines()
            .filter(|l| l.contains("\"GET /v2/") && l.contains(&blob))
            .filter_map(|l| {
                let (_, after) = l.split_once("\" ")?;
                after.split(' ').nth(1)?.parse::<u64>().ok()
            })
            .fold((0, 0), |(sum, n), b| (sum + b, n + 1))
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
        Self::start_with(dir, &Auth::Htpasswd)
    }

    /// Starts a registry in `dir` checking its clients by `auth`.
    pub fn start_with(dir: &Path, auth: &Auth) -> Self {
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
        let (auth_config, token_service) = match auth {
            Auth::Htpasswd => (
                format!(
                    "auth:\n  htpasswd:\n    realm: ferry\n    path: {}\n",
                    s(&f("htpasswd"))
                ),
                None,
            ),
            Auth::Token { repositories } => {
                let service = start_token_service(&dir, repositories);
                let config = format!(
                    "auth:\n  token:\n    realm: https://{}/token\n    service: {TOKEN_SERVICE}\n    \
                     issuer: {TOKEN_ISSUER}\n    rootcertbundle: {}\n",
                    service.host(),
                    s(&f("token.pem"))
                );
                (config, Some(service))
            }
            Auth::AnonymousPlain => (String::new(), None),
        };
        let plain = *auth == Auth::AnonymousPlain;
        let tls = if plain {
            String::new()
        } else {
            format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                s(&f("srv.pem")),
                s(&f("srv.key"))
            )
        };
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  \
             delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{tls}{auth_config}",
            s(&f("data")),
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
        let registry = Self {
            child,
            dir,
            port,
            token_service,
            plain,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !listens_on(registry.child.id() as i32, port) {
            assert!(
                Instant::now() < deadline,
                "docker-registry did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        write_auth_file(&registry.auth_file(), &registry.host(), PASSWORD);
        registry
    }

    /// The token service's access log (`GET /token?... 200` lines), with [`Auth::Token`].
    pub fn token_log(&self) -> String {
        self.token_service
            .as_ref()
            .map(Front::access_log)
            .unwrap_or_default()
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
        if self.plain {
            args.push("--tls-verify=false");
        }
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

/// Writes a docker config.json at `path` giving [`USER`] and `password` for `host`.
pub fn write_auth_file(path: &Path, host: &str, password: &str) {
    std::fs::write(
        path,
        format!(
            "{{\"auths\":{{\"{host}\":{{\"auth\":\"{}\"}}}}}}",
            base64(format!("{USER}:{password}").as_bytes())
        ),
    )
    .unwrap();
}

/// Makes the token signing key and its certificate (`token.key`, `token.pem` in `dir`),
/// mints a JWT granting pull and push on `repositories`, and starts the token service:
/// nginx on TLS answering `GET /token` with `{"token": JWT}` to [`USER`] with
/// [`PASSWORD`] (basic auth), 401 to anyone else.
fn start_token_service(dir: &Path, repositories: &[String]) -> Front {
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
            s(&f("token.key")),
            "-out",
            s(&f("token.pem")),
            "-days",
            "2",
            "-subj",
            "/CN=ferry test token issuer",
        ],
        "openssl",
    );
    let der = Command::new("openssl")
        .args(["x509", "-in", s(&f("token.pem")), "-outform", "DER"])
        .output()
        .expect("run openssl x509");
    assert!(der.status.success(), "openssl x509 -outform DER failed");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "x5c": [base64(&der.stdout)]});
    let access: Vec<_> = repositories
        .iter()
        .map(|r| serde_json::json!({"type": "repository", "name": r, "actions": ["pull", "push"]}))
        .collect();
    let claims = serde_json::json!({
        "iss": TOKEN_ISSUER, "sub": USER, "aud": TOKEN_SERVICE,
        "exp": now + 3600, "nbf": now - 60, "iat": now - 60,
        "jti": format!("ferry-{now}"), "access": access,
    });
    let signing_input = format!(
        "{}.{}",
        base64url(header.to_string().as_bytes()),
        base64url(claims.to_string().as_bytes())
    );
    std::fs::write(f("jwt-input"), &signing_input).unwrap();
    let sig = Command::new("openssl")
        .args([
            "dgst",
            "-sha256",
            "-sign",
            s(&f("token.key")),
            s(&f("jwt-input")),
        ])
        .output()
        .expect("run openssl dgst");
    assert!(sig.status.success(), "openssl dgst -sign failed");
    let jwt = format!("{signing_input}.{}", base64url(&sig.stdout));
    let line = run("openssl", &["passwd", "-apr1", PASSWORD], "openssl");
    std::fs::write(f("token-htpasswd"), format!("{USER}:{}\n", line.trim())).unwrap();
    // A file, not `return`: nginx's `return` runs before auth_basic would refuse.
    std::fs::write(f("token.json"), format!("{{\"token\":\"{jwt}\"}}")).unwrap();
    let body = format!(
        "    location = /token {{\n      auth_basic \"ferry token service\";\n      \
         auth_basic_user_file {};\n      default_type application/json;\n      \
         alias {};\n    }}",
        s(&f("token-htpasswd")),
        s(&f("token.json"))
    );
    Front::start(dir, "token-service", &f("srv.pem"), &f("srv.key"), &body)
}

/// One tar entry (a ustar header and its data padded to 512 bytes) of a regular file
/// `name` whose header says `declared_size` bytes (a lie when it differs from `data`).
pub fn tar_entry(name: &str, declared_size: u64, data: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..108].copy_from_slice(b"0000644\0");
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    h[124..136].copy_from_slice(format!("{declared_size:011o}\0").as_bytes());
    h[136..148].copy_from_slice(b"00000000000\0");
    h[148..156].copy_from_slice(b"        ");
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut out = h.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

/// The end of a tar archive: two zero blocks.
pub fn tar_end() -> Vec<u8> {
    vec![0u8; 1024]
}

/// `bytes` compressed by `gzip -n`.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    require_tool("gzip", "gzip");
    let mut child = Command::new("gzip")
        .args(["-n", "-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run gzip");
    let mut stdin = child.stdin.take().unwrap();
    let input = bytes.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "gzip failed");
    out.stdout
}

/// `sha256:HEX` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

impl Registry {
    /// `curl -sS -f` with the test CA and the registry's credentials; returns its stdout.
    pub fn curl(&self, args: &[&str]) -> String {
        require_tool("curl", "curl");
        let ca = self.ca_file();
        let auth = format!("{USER}:{PASSWORD}");
        let mut all = vec!["-sS", "-f", "--cacert", s(&ca), "-u", auth.as_str()];
        all.extend_from_slice(args);
        run("curl", &all, "curl")
    }

    /// Uploads `bytes` as a blob of `repo` (POST, then PUT with the digest); returns its
    /// digest.
    pub fn push_blob(&self, repo: &str, bytes: &[u8]) -> String {
        let digest = sha256_digest(bytes);
        let host = self.host();
        let location = self.curl(&[
            "-X",
            "POST",
            "-o",
            "/dev/null",
            "-w",
            "%header{location}",
            &format!("https://{host}/v2/{repo}/blobs/uploads/"),
        ]);
        let location = location.trim();
        let location = if location.starts_with('/') {
            format!("https://{host}{location}")
        } else {
            location.to_string()
        };
        let sep = if location.contains('?') { '&' } else { '?' };
        let file = self.dir.join(format!("upload-{}", &digest[7..19]));
        std::fs::write(&file, bytes).unwrap();
        self.curl(&[
            "-X",
            "PUT",
            "-o",
            "/dev/null",
            "-H",
            "Content-Type: application/octet-stream",
            "--data-binary",
            &format!("@{}", s(&file)),
            &format!("{location}{sep}digest={digest}"),
        ]);
        let _ = std::fs::remove_file(&file);
        digest
    }

    /// Pushes an OCI image of one layer (`layer`: the blob as pushed, `tar`: its
    /// uncompressed tar for the config's diff_id, `media_type`: the layer's) as
    /// `repo:tag`; returns the manifest's digest.
    pub fn push_image(
        &self,
        repo: &str,
        tag: &str,
        tar: &[u8],
        layer: &[u8],
        media_type: &str,
    ) -> String {
        let layer_digest = self.push_blob(repo, layer);
        let config = serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [sha256_digest(tar)]},
        })
        .to_string();
        let config_digest = self.push_blob(repo, config.as_bytes());
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": config.len()},
            "layers": [{"mediaType": media_type, "digest": layer_digest, "size": layer.len()}],
        })
        .to_string();
        let file = self.dir.join(format!("manifest-{tag}.json"));
        std::fs::write(&file, &manifest).unwrap();
        let host = self.host();
        self.curl(&[
            "-X",
            "PUT",
            "-o",
            "/dev/null",
            "-H",
            "Content-Type: application/vnd.oci.image.manifest.v1+json",
            "--data-binary",
            &format!("@{}", s(&file)),
            &format!("https://{host}/v2/{repo}/manifests/{tag}"),
        ]);
        sha256_digest(manifest.as_bytes())
    }

    /// Starts an nginx on TLS in front of the registry that strips `Range` (and
    /// `If-Range`) from every request and serves no ranges itself: every blob comes back
    /// 200 with its whole body, as from a registry or CDN that refuses ranges.
    pub fn range_refusing_proxy(&self) -> Front {
        self.proxy(
            "range-refusing-proxy",
            "    max_ranges 0;\n",
            "      proxy_set_header Range \"\";\n      proxy_set_header If-Range \"\";\n      \
             proxy_hide_header Accept-Ranges;\n",
        )
    }

    /// Starts an nginx on TLS in front of the registry that passes every request as it
    /// is (ranges too) and logs the body bytes of each answer: see
    /// [`blob_bytes_served`].
    pub fn counting_proxy(&self) -> Front {
        self.proxy("counting-proxy", "", "")
    }

    /// An nginx proxy to the registry: `server` directives and `location` ones added.
    fn proxy(&self, name: &str, server: &str, location: &str) -> Front {
        let body = format!(
            "    client_max_body_size 0;\n{server}    location / {{\n      \
             proxy_pass https://127.0.0.1:{};\n      proxy_set_header Host $http_host;\n\
             {location}      proxy_buffering off;\n      proxy_ssl_verify off;\n    }}",
            self.port
        );
        Front::start(
            &self.dir,
            name,
            &self.dir.join("srv.pem"),
            &self.dir.join("srv.key"),
            &body,
        )
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// base64url without padding (JWT's encoding).
fn base64url(bytes: &[u8]) -> String {
    base64(bytes)
        .trim_end_matches('=')
        .replace('+', "-")
        .replace('/', "_")
}

fn base64(b: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
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
