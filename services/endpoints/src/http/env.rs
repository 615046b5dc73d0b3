//! [`HttpOptions::from_env`]: the command line's way to give an HTTP source its
//! credentials and TLS files, as environment variables naming files (so that no secret
//! sits in a command line or in shell history).
//!
//! | variable | meaning |
//! |---|---|
//! | `FERRY_HTTP_USER` | basic authentication user |
//! | `FERRY_HTTP_PASSWORD_FILE` (or `FERRY_HTTP_PASSWORD`) | its password |
//! | `FERRY_HTTP_TOKEN_FILE` (or `FERRY_HTTP_TOKEN`) | a bearer token |
//! | `FERRY_HTTP_HEADERS_FILE` | extra headers, one `Name: value` a line |
//! | `FERRY_HTTP_CA_FILE` | extra trusted CA certificates (PEM) |
//! | `FERRY_HTTP_CLIENT_CERT_FILE`, `FERRY_HTTP_CLIENT_KEY_FILE` | a client certificate and key (PEM) |
//! | `FERRY_HTTP_CONNECT_TIMEOUT`, `FERRY_HTTP_READ_TIMEOUT` | seconds |
//! | `FERRY_HTTP_ATTEMPTS` | attempts per request |

use std::path::Path;
use std::time::Duration;

use ferry_core::{Error, Result, Secret};

use super::HttpOptions;

/// Largest credential or certificate file read.
const MAX_FILE: u64 = 1024 * 1024;
/// Most extra headers accepted.
const MAX_HEADERS: usize = 64;

fn read_file(var: &str, path: &str) -> Result<String> {
    let path = Path::new(path);
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::invalid_input(format!("{var}: cannot read {}: {e}", path.display())))?;
    if !meta.is_file() || meta.len() > MAX_FILE {
        return Err(Error::invalid_input(format!(
            "{var}: {} must be a regular file of at most {MAX_FILE} bytes",
            path.display()
        )));
    }
    std::fs::read_to_string(path)
        .map_err(|e| Error::invalid_input(format!("{var}: cannot read {}: {e}", path.display())))
}

/// A secret from `NAME_FILE` (preferred) or `NAME`; trailing newlines dropped.
fn secret(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Option<Secret>> {
    let file_var = format!("{name}_FILE");
    let value = match get(&file_var) {
        Some(path) => read_file(&file_var, &path)?,
        None => match get(name) {
            Some(v) => v,
            None => return Ok(None),
        },
    };
    let value = value.trim_end_matches(['\n', '\r']);
    if value.is_empty() {
        return Err(Error::invalid_input(format!("{name}: the secret is empty")));
    }
    Ok(Some(Secret::new(value)))
}

fn seconds(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Option<Duration>> {
    get(name)
        .map(|v| {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| Error::invalid_input(format!("{name}={v}: expected seconds")))
        })
        .transpose()
}

/// Parses a headers file: `Name: value` lines; blank lines and `#` comments skipped.
/// Errors name the line, never its value.
pub fn parse_headers(text: &str) -> Result<Vec<(String, Secret)>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(Error::invalid_input(format!(
                "headers file line {}: expected 'Name: value'",
                i + 1
            )));
        };
        if out.len() == MAX_HEADERS {
            return Err(Error::invalid_input(format!(
                "headers file: more than {MAX_HEADERS} headers"
            )));
        }
        out.push((name.trim().to_string(), Secret::new(value.trim())));
    }
    Ok(out)
}

impl HttpOptions {
    /// Options from the `FERRY_HTTP_*` environment (see the module documentation).
    pub fn from_env() -> Result<Self> {
        Self::from_vars(&|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// [`HttpOptions::from_env`] over any variable lookup.
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        let mut o = Self {
            user: get("FERRY_HTTP_USER"),
            password: secret(get, "FERRY_HTTP_PASSWORD")?,
            bearer_token: secret(get, "FERRY_HTTP_TOKEN")?,
            ..Self::default()
        };
        if let Some(path) = get("FERRY_HTTP_HEADERS_FILE") {
            o.headers = parse_headers(&read_file("FERRY_HTTP_HEADERS_FILE", &path)?)?;
        }
        if let Some(path) = get("FERRY_HTTP_CA_FILE") {
            o.ca_pem = Some(read_file("FERRY_HTTP_CA_FILE", &path)?);
        }
        if let Some(path) = get("FERRY_HTTP_CLIENT_CERT_FILE") {
            o.client_cert_pem = Some(read_file("FERRY_HTTP_CLIENT_CERT_FILE", &path)?);
        }
        if let Some(path) = get("FERRY_HTTP_CLIENT_KEY_FILE") {
            o.client_key_pem = Some(Secret::new(read_file("FERRY_HTTP_CLIENT_KEY_FILE", &path)?));
        }
        o.connect_timeout = seconds(get, "FERRY_HTTP_CONNECT_TIMEOUT")?;
        o.read_timeout = seconds(get, "FERRY_HTTP_READ_TIMEOUT")?;
        if let Some(v) = get("FERRY_HTTP_ATTEMPTS") {
            let n: u32 = v
                .trim()
                .parse()
                .ok()
                .filter(|n| (1..=100).contains(n))
                .ok_or_else(|| {
                    Error::invalid_input(format!("FERRY_HTTP_ATTEMPTS={v}: expected 1 to 100"))
                })?;
            o.attempts = Some(n);
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn variables_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "s3cret\n").unwrap();
        let headers = dir.path().join("h");
        std::fs::write(&headers, "# comment\nX-Api-Key: k3y\n\nX-Other:  v \n").unwrap();
        let vars: HashMap<&str, String> = [
            ("FERRY_HTTP_USER", "alice".to_string()),
            ("FERRY_HTTP_PASSWORD_FILE", pw.display().to_string()),
            ("FERRY_HTTP_HEADERS_FILE", headers.display().to_string()),
            ("FERRY_HTTP_READ_TIMEOUT", "2.5".to_string()),
            ("FERRY_HTTP_ATTEMPTS", "3".to_string()),
        ]
        .into();
        let o = HttpOptions::from_vars(&|n| vars.get(n).cloned()).unwrap();
        assert_eq!(o.user.as_deref(), Some("alice"));
        assert_eq!(o.password.as_ref().map(Secret::expose), Some("s3cret"));
        assert_eq!(o.headers.len(), 2);
        assert_eq!(o.headers[1].0, "X-Other");
        assert_eq!(o.headers[1].1.expose(), "v");
        assert_eq!(o.read_timeout, Some(Duration::from_millis(2500)));
        assert_eq!(o.attempts, Some(3));

        let bad: HashMap<&str, String> = [("FERRY_HTTP_ATTEMPTS", "0".to_string())].into();
        assert!(HttpOptions::from_vars(&|n| bad.get(n).cloned()).is_err());
        let err = parse_headers("X-Key s3cr3t-value").unwrap_err();
        assert!(!err.to_string().contains("s3cr3t"), "{err}");
    }
}
