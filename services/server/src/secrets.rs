//! Credentials by reference: a request names an environment variable of the server or a
//! file under `--secrets-dir` (a mounted Kubernetes Secret); the value is read only when
//! the job opens its endpoint and never stored, logged or echoed.

use std::path::{Component, Path, PathBuf};

use ferry_core::{Error, ErrorKind, Result, Secret};

use ferry_api::proto::{secret_ref, SecretRef};

/// Longest secret file read (a password or key, not a blob).
const MAX_SECRET_BYTES: u64 = 64 * 1024;

/// Resolves secret references.
#[derive(Debug, Clone, Default)]
pub struct SecretResolver {
    dir: Option<PathBuf>,
}

impl SecretResolver {
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self { dir }
    }

    /// Checks a reference's form and that it resolves now, without keeping the value.
    pub fn check(&self, what: &str, r: &SecretRef) -> Result<()> {
        self.resolve(what, r).map(|_| ())
    }

    /// Reads the secret a reference names.
    pub fn resolve(&self, what: &str, r: &SecretRef) -> Result<Secret> {
        match &r.source {
            None => Err(Error::invalid_input(format!(
                "{what}: the secret reference names neither env nor file"
            ))),
            Some(secret_ref::Source::Env(name)) => {
                if !valid_env_name(name) {
                    return Err(Error::invalid_input(format!(
                        "{what}: '{name}' is not an environment variable name"
                    )));
                }
                match std::env::var(name) {
                    Ok(v) if !v.is_empty() => Ok(Secret::new(v)),
                    _ => Err(Error::invalid_input(format!(
                        "{what}: environment variable {name} is not set on the server"
                    ))),
                }
            }
            Some(secret_ref::Source::File(name)) => {
                let path = self.file_path(what, name)?;
                let meta = std::fs::metadata(&path).map_err(|e| {
                    Error::new(
                        ErrorKind::InvalidInput,
                        format!("{what}: secret file '{name}' cannot be read: {e}"),
                    )
                })?;
                if !meta.is_file() || meta.len() > MAX_SECRET_BYTES {
                    return Err(Error::invalid_input(format!(
                        "{what}: secret file '{name}' must be a regular file of at most {MAX_SECRET_BYTES} bytes"
                    )));
                }
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    Error::new(
                        ErrorKind::InvalidInput,
                        format!("{what}: secret file '{name}' cannot be read: {e}"),
                    )
                })?;
                let value = text.trim_end_matches(['\n', '\r']);
                if value.is_empty() {
                    return Err(Error::invalid_input(format!(
                        "{what}: secret file '{name}' is empty"
                    )));
                }
                Ok(Secret::new(value))
            }
        }
    }

    fn file_path(&self, what: &str, name: &str) -> Result<PathBuf> {
        let Some(dir) = &self.dir else {
            return Err(Error::invalid_input(format!(
                "{what}: secret files need the server to run with --secrets-dir"
            )));
        };
        let rel = Path::new(name);
        if name.is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(Error::new(
                ErrorKind::PermissionDenied,
                format!("{what}: secret file '{name}' must be a relative name under --secrets-dir, without '..'"),
            ));
        }
        let path = dir.join(rel);
        // A mounted Kubernetes Secret is a symlink farm inside the directory; links that
        // leave it are refused.
        if let (Ok(real), Ok(root)) = (std::fs::canonicalize(&path), std::fs::canonicalize(dir)) {
            if !real.starts_with(&root) {
                return Err(Error::new(
                    ErrorKind::PermissionDenied,
                    format!("{what}: secret file '{name}' points outside --secrets-dir"),
                ));
            }
        }
        Ok(path)
    }
}

fn valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 256
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> SecretRef {
        SecretRef {
            source: Some(secret_ref::Source::Env(name.into())),
        }
    }

    fn file(name: &str) -> SecretRef {
        SecretRef {
            source: Some(secret_ref::Source::File(name.into())),
        }
    }

    #[test]
    fn env_and_file_references() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), "s3cret\n").unwrap();
        std::fs::write(dir.path().join("empty"), "").unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("x"), "other").unwrap();
        std::os::unix::fs::symlink(outside.path().join("x"), dir.path().join("link")).unwrap();
        let r = SecretResolver::new(Some(dir.path().into()));
        assert_eq!(r.resolve("t", &file("pw")).unwrap().expose(), "s3cret");
        for bad in ["../pw", "/etc/passwd", "", "link", "empty", "missing"] {
            let err = r.resolve("t", &file(bad)).unwrap_err();
            assert!(!err.to_string().contains("other"), "{err}");
        }
        assert_eq!(
            r.resolve("t", &file("link")).unwrap_err().kind(),
            ErrorKind::PermissionDenied
        );
        std::env::set_var("FERRY_TEST_SECRET_RESOLVER", "v4lue");
        let v = r.resolve("t", &env("FERRY_TEST_SECRET_RESOLVER")).unwrap();
        assert_eq!(v.expose(), "v4lue");
        assert!(!format!("{v:?}").contains("v4lue"));
        assert!(r.resolve("t", &env("FERRY_TEST_UNSET_VARIABLE")).is_err());
        assert!(r.resolve("t", &env("1BAD")).is_err());
        assert!(SecretResolver::new(None).resolve("t", &file("pw")).is_err());
        assert!(r.resolve("t", &SecretRef { source: None }).is_err());
    }
}
