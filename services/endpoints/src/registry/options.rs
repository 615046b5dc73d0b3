//! [`RegistryOptions`]: credentials (a docker config.json), extra CAs, plain HTTP and the
//! platform, from the job or from the `FERRY_REGISTRY_*` environment:
//!
//! | variable | meaning |
//! |---|---|
//! | `FERRY_REGISTRY_AUTH_FILE` | a docker config.json with the registry's credentials (as podman and skopeo take it) |
//! | `FERRY_REGISTRY_CA_FILE` | extra trusted CA certificates (PEM) |
//! | `FERRY_REGISTRY_INSECURE=1` | plain HTTP (never the default) |
//! | `FERRY_REGISTRY_PLATFORM` | `os/arch[/variant]` to pick from an index (default linux/amd64) |

use ferry_core::{Error, Result};
use ferry_registry::{DockerConfig, Platform};

/// Largest auth or CA file read.
const MAX_FILE: u64 = 1 << 20;

/// Settings of a `docker://` source. Credentials never show in `Debug`.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RegistryOptions {
    pub auth: Option<DockerConfig>,
    pub ca_pem: Option<String>,
    pub insecure: bool,
    pub platform: Option<Platform>,
    /// The digest a resumed job started from: opening fails when the tag moved since.
    pub expect_digest: Option<String>,
}

fn read_file(var: &str, path: &str) -> Result<Vec<u8>> {
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::invalid_input(format!("{var}: cannot read {path}: {e}")))?;
    if !meta.is_file() || meta.len() > MAX_FILE {
        return Err(Error::invalid_input(format!(
            "{var}: {path} must be a regular file of at most {MAX_FILE} bytes"
        )));
    }
    std::fs::read(path).map_err(|e| Error::invalid_input(format!("{var}: cannot read {path}: {e}")))
}

impl RegistryOptions {
    /// Options from the `FERRY_REGISTRY_*` environment.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(&|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// [`RegistryOptions::from_env`] over any variable lookup.
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        let mut o = Self::default();
        if let Some(path) = get("FERRY_REGISTRY_AUTH_FILE") {
            let text = read_file("FERRY_REGISTRY_AUTH_FILE", &path)?;
            o.auth = Some(DockerConfig::parse(&text).map_err(|e| {
                Error::invalid_input(format!("FERRY_REGISTRY_AUTH_FILE: {}", e.message()))
            })?);
        }
        if let Some(path) = get("FERRY_REGISTRY_CA_FILE") {
            let pem = read_file("FERRY_REGISTRY_CA_FILE", &path)?;
            o.ca_pem = Some(String::from_utf8(pem).map_err(|_| {
                Error::invalid_input("FERRY_REGISTRY_CA_FILE: the file is not PEM text")
            })?);
        }
        if let Some(v) = get("FERRY_REGISTRY_INSECURE") {
            o.insecure = match v.as_str() {
                "1" | "true" | "yes" => true,
                "0" | "false" | "no" => false,
                other => {
                    return Err(Error::invalid_input(format!(
                        "FERRY_REGISTRY_INSECURE={other}: expected 1 or 0"
                    )))
                }
            };
        }
        if let Some(p) = get("FERRY_REGISTRY_PLATFORM") {
            o.platform = Some(p.parse().map_err(|e: ferry_registry::Error| {
                Error::invalid_input(e.message().to_string())
            })?);
        }
        Ok(o)
    }

    /// Options from a job's settings: a docker config.json and a CA file by path (the
    /// caller has confined them), plain HTTP, and a platform. Errors name the file, never
    /// its content.
    pub fn from_settings(
        auth_file: Option<&std::path::Path>,
        ca_file: Option<&std::path::Path>,
        insecure: bool,
        platform: Option<&str>,
    ) -> Result<Self> {
        let mut o = Self {
            insecure,
            ..Self::default()
        };
        if let Some(path) = auth_file {
            let text = read_file("auth_file", &path.display().to_string())?;
            o.auth = Some(
                DockerConfig::parse(&text)
                    .map_err(|e| Error::invalid_input(format!("auth_file: {}", e.message())))?,
            );
        }
        if let Some(path) = ca_file {
            let pem = read_file("ca_file", &path.display().to_string())?;
            o.ca_pem = Some(
                String::from_utf8(pem)
                    .map_err(|_| Error::invalid_input("ca_file: the file is not PEM text"))?,
            );
        }
        match platform {
            Some(p) => o.with_platform(p),
            None => Ok(o),
        }
    }

    /// Picks `platform` (`os/arch[/variant]`) from an image index.
    pub fn with_platform(mut self, platform: &str) -> Result<Self> {
        self.platform =
            Some(platform.parse().map_err(|e: ferry_registry::Error| {
                Error::invalid_input(e.message().to_string())
            })?);
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn environment() {
        let dir = tempfile::tempdir().unwrap();
        let auth = dir.path().join("auth.json");
        std::fs::write(&auth, r#"{"auths":{"reg.io":{"auth":"dTpzM2NyM3Q="}}}"#).unwrap();
        let vars: HashMap<&str, String> = [
            ("FERRY_REGISTRY_AUTH_FILE", auth.display().to_string()),
            ("FERRY_REGISTRY_INSECURE", "1".to_string()),
            ("FERRY_REGISTRY_PLATFORM", "linux/arm64/v8".to_string()),
        ]
        .into();
        let o = RegistryOptions::from_vars(&|n| vars.get(n).cloned()).unwrap();
        assert!(o.insecure);
        assert_eq!(o.platform.as_ref().unwrap().to_string(), "linux/arm64/v8");
        assert_eq!(
            o.auth.as_ref().unwrap().credentials("reg.io").unwrap().user,
            "u"
        );
        assert!(!format!("{o:?}").contains("s3cr3t"));
        let bad: HashMap<&str, String> = [("FERRY_REGISTRY_INSECURE", "maybe".to_string())].into();
        assert!(RegistryOptions::from_vars(&|n| bad.get(n).cloned()).is_err());
    }
}
