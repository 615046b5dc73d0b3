//! What the service lets callers touch and who may call it: file paths confined to the
//! `--allow-root` directories, an optional bearer token, and TLS / mutual TLS (rustls).

use std::path::{Component, Path, PathBuf};

use ferry_core::{Error, ErrorKind, Result, Secret};
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic::{Request, Status};

/// Directories file endpoints must stay inside.
#[derive(Debug, Clone, Default)]
pub struct AllowRoots {
    roots: Vec<PathBuf>,
}

impl AllowRoots {
    /// Canonicalizes each root; each must be an existing directory.
    pub fn new(roots: &[PathBuf]) -> Result<Self> {
        let mut canonical = Vec::new();
        for root in roots {
            let c = std::fs::canonicalize(root).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "--allow-root {shown} does not exist: create it first \
                         (mkdir -p {shown}) or allow another directory",
                        shown = root.display()
                    ),
                ),
                _ => Error::io(
                    format!("--allow-root {} cannot be resolved", root.display()),
                    e,
                ),
            })?;
            if !c.is_dir() {
                return Err(Error::invalid_input(format!(
                    "--allow-root {} is not a directory",
                    root.display()
                )));
            }
            canonical.push(c);
        }
        Ok(Self { roots: canonical })
    }

    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// The canonical path for `path`, or PERMISSION_DENIED when it is (or leads through a
    /// symlink) outside every root. A path that does not exist yet (a new target) is
    /// resolved through its parent directory, which must exist.
    pub fn confine(&self, path: &Path) -> Result<PathBuf> {
        let shown = path.display();
        if !path.is_absolute() {
            return Err(Error::invalid_input(format!(
                "file path '{shown}' must be absolute"
            )));
        }
        if path.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(Error::new(
                ErrorKind::PermissionDenied,
                format!("file path '{shown}' contains '..': give a path without it"),
            ));
        }
        if self.roots.is_empty() {
            return Err(Error::new(
                ErrorKind::PermissionDenied,
                format!(
                    "file path '{shown}' is not allowed: the server allows no files \
                     (start ferry serve with --allow-root DIR)"
                ),
            ));
        }
        let resolved = match std::fs::canonicalize(path) {
            Ok(p) => p,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if std::fs::symlink_metadata(path).is_ok() {
                    // A dangling symlink: whatever it names is not checked, refuse it.
                    return Err(Error::new(
                        ErrorKind::PermissionDenied,
                        format!("file path '{shown}' is a dangling symlink"),
                    ));
                }
                let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                    return Err(Error::invalid_input(format!(
                        "file path '{shown}' names no file"
                    )));
                };
                let parent = std::fs::canonicalize(parent).map_err(|e| {
                    Error::io(
                        format!("directory of '{shown}' cannot be resolved (create it first)"),
                        e,
                    )
                })?;
                parent.join(name)
            }
            Err(e) => {
                return Err(Error::io(
                    format!("file path '{shown}' cannot be resolved"),
                    e,
                ))
            }
        };
        if self.roots.iter().any(|r| resolved.starts_with(r)) {
            Ok(resolved)
        } else {
            let roots: Vec<_> = self.roots.iter().map(|r| r.display().to_string()).collect();
            Err(Error::new(
                ErrorKind::PermissionDenied,
                format!(
                    "file path '{shown}' resolves to {} which is outside the allowed roots ({}): \
                     use a file under one of them or add a --allow-root",
                    resolved.display(),
                    roots.join(", ")
                ),
            ))
        }
    }
}

/// Requires `authorization: Bearer <token>` on every call it guards.
#[derive(Debug, Clone)]
pub struct BearerAuth {
    expected: Option<Secret>,
}

impl BearerAuth {
    /// No token: every call passes.
    pub fn new(token: Option<Secret>) -> Self {
        Self { expected: token }
    }
}

impl Interceptor for BearerAuth {
    fn call(&mut self, request: Request<()>) -> std::result::Result<Request<()>, Status> {
        let Some(expected) = &self.expected else {
            return Ok(request);
        };
        let given = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match given {
            Some(token) if constant_time_eq(token.as_bytes(), expected.expose().as_bytes()) => {
                Ok(request)
            }
            Some(_) => Err(Status::unauthenticated("the bearer token is not valid")),
            None => Err(Status::unauthenticated(
                "this server requires 'authorization: Bearer <token>' (ferry job --token-file)",
            )),
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// TLS files of the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// PEM CA bundle: when set, clients must present a certificate it signed (mTLS).
    pub client_ca: Option<PathBuf>,
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::io(format!("cannot read {what} {}", path.display()), e))
}

impl TlsFiles {
    pub fn server_config(&self) -> Result<ServerTlsConfig> {
        let identity = Identity::from_pem(
            read(&self.cert, "TLS certificate")?,
            read(&self.key, "TLS key")?,
        );
        let mut config = ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &self.client_ca {
            config = config.client_ca_root(Certificate::from_pem(read(ca, "client CA")?));
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confinement() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir(r.join("sub")).unwrap();
        std::fs::write(r.join("sub/a.img"), b"x").unwrap();
        std::fs::write(outside.path().join("secret.img"), b"x").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret.img"), r.join("escape.img"))
            .unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("outdir")).unwrap();
        std::os::unix::fs::symlink(r.join("sub/a.img"), r.join("inside.img")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("nope"), r.join("dangling")).unwrap();
        let roots = AllowRoots::new(&[r.to_path_buf()]).unwrap();
        let canon = std::fs::canonicalize(r).unwrap();

        assert_eq!(
            roots.confine(&r.join("sub/a.img")).unwrap(),
            canon.join("sub/a.img")
        );
        assert_eq!(
            roots.confine(&r.join("new.img")).unwrap(),
            canon.join("new.img")
        );
        assert_eq!(
            roots.confine(&r.join("inside.img")).unwrap(),
            canon.join("sub/a.img")
        );
        for bad in [
            r.join("sub/../sub/a.img"),
            r.join("escape.img"),
            r.join("outdir/secret.img"),
            r.join("outdir/new.img"),
            r.join("dangling"),
            outside.path().join("secret.img"),
            PathBuf::from("/etc/passwd"),
        ] {
            let err = roots.confine(&bad).unwrap_err();
            assert_eq!(
                err.kind(),
                ErrorKind::PermissionDenied,
                "{}: {err}",
                bad.display()
            );
        }
        assert_eq!(
            roots.confine(Path::new("rel/a.img")).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            AllowRoots::default()
                .confine(&r.join("sub/a.img"))
                .unwrap_err()
                .kind(),
            ErrorKind::PermissionDenied
        );
    }

    /// A missing root names the fix, once.
    #[test]
    fn a_missing_root_says_to_create_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("images");
        let err = AllowRoots::new(std::slice::from_ref(&missing)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        let text = err.to_string();
        assert!(
            text.contains(&format!("mkdir -p {}", missing.display())),
            "{text}"
        );
        assert_eq!(text.matches("does not exist").count(), 1, "{text}");
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let err = AllowRoots::new(&[file]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }

    #[test]
    fn bearer_tokens() {
        use ferry_api::auth::BearerToken;
        let mut auth = BearerAuth::new(Some(Secret::new("t0ken")));
        assert_eq!(
            auth.call(Request::new(())).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        let mut good = BearerToken::new(Some(&Secret::new("t0ken"))).unwrap();
        assert!(auth.call(good.call(Request::new(())).unwrap()).is_ok());
        let mut bad = BearerToken::new(Some(&Secret::new("t0kem"))).unwrap();
        let err = auth.call(bad.call(Request::new(())).unwrap()).unwrap_err();
        assert!(!err.message().contains("t0k"));
        assert!(BearerAuth::new(None).call(Request::new(())).is_ok());
    }
}
