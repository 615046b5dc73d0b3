//! The service's configuration: embedded defaults, overridden by a config file (TOML or
//! YAML), overridden by environment (FERRY_*) and flags (see [`super::serve`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ferry_core::{Error, Result, Secret};
use serde::Deserialize;

use super::jobs::ManagerConfig;
use super::schedules::ScheduleConfig;
use super::security::TlsFiles;

/// Default gRPC address (loopback: exposing the service is a deliberate choice).
pub const DEFAULT_GRPC_LISTEN: &str = "127.0.0.1:50051";
/// Default metrics address.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9090";
/// Default largest gRPC message.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Everything a running service needs.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub grpc_listen: SocketAddr,
    /// None: no metrics endpoint.
    pub metrics_listen: Option<SocketAddr>,
    pub data_dir: PathBuf,
    pub allow_roots: Vec<PathBuf>,
    pub secrets_dir: Option<PathBuf>,
    pub manager: ManagerConfig,
    pub schedules: ScheduleConfig,
    /// How long a SIGTERM waits for running jobs to checkpoint and stop.
    pub shutdown_timeout: Duration,
    pub tls: Option<TlsFiles>,
    pub auth_token: Option<Secret>,
    pub max_message_bytes: usize,
}

impl ServiceConfig {
    /// The embedded defaults with this data directory.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            grpc_listen: DEFAULT_GRPC_LISTEN.parse().expect("valid default"),
            metrics_listen: Some(DEFAULT_METRICS_LISTEN.parse().expect("valid default")),
            data_dir: data_dir.into(),
            allow_roots: Vec::new(),
            secrets_dir: None,
            manager: ManagerConfig::default(),
            schedules: ScheduleConfig::default(),
            shutdown_timeout: Duration::from_secs(30),
            tls: None,
            auth_token: None,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        }
    }
}

/// The default data directory: $XDG_STATE_HOME/ferry, else ~/.local/state/ferry, else
/// ./ferry-data.
pub fn default_data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("ferry");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(home).join(".local/state/ferry");
    }
    PathBuf::from("ferry-data")
}

/// A config file: every key optional, same names as the flags with `_` for `-`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub grpc_listen: Option<SocketAddr>,
    /// "off" disables the metrics endpoint.
    pub metrics_listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub allow_root: Option<Vec<PathBuf>>,
    pub secrets_dir: Option<PathBuf>,
    pub max_running_jobs: Option<usize>,
    pub max_jobs_per_host: Option<usize>,
    pub max_queued_jobs: Option<usize>,
    pub max_attempts: Option<u32>,
    pub retry_base: Option<String>,
    pub retry_max: Option<String>,
    pub checkpoint_interval: Option<String>,
    pub shutdown_timeout: Option<String>,
    pub history_max_age: Option<String>,
    pub history_max_count: Option<usize>,
    pub max_schedules: Option<usize>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
    /// A file holding the bearer token (never the token itself).
    pub auth_token_file: Option<PathBuf>,
    pub max_message_bytes: Option<usize>,
    pub log_format: Option<String>,
    pub log_filter: Option<String>,
}

impl FileConfig {
    /// Reads a TOML file, or YAML when the name ends in .yaml or .yml.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("cannot read config file {}", path.display()), e))?;
        let yaml = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        );
        let parsed = if yaml {
            serde_yaml::from_str(&text).map_err(|e| e.to_string())
        } else {
            toml::from_str(&text).map_err(|e| e.to_string())
        };
        parsed.map_err(|e| Error::invalid_input(format!("config file {}: {e}", path.display())))
    }
}

/// Parses "250ms", "5s", "10m", "2h", "7d" (a bare number is seconds).
pub fn parse_duration(text: &str) -> Result<Duration> {
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| Error::invalid_input(format!("'{text}' is not a duration like 5s")))?;
    let scale = match unit.trim() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        other => {
            return Err(Error::invalid_input(format!(
                "duration unit '{other}' in '{text}': use ms, s, m, h or d"
            )))
        }
    };
    Duration::try_from_secs_f64(value * scale)
        .map_err(|_| Error::invalid_input(format!("duration '{text}' is out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("5").unwrap(), Duration::from_secs(5));
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86400)
        );
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn toml_and_yaml_files() {
        let dir = tempfile::tempdir().unwrap();
        let toml_path = dir.path().join("ferry.toml");
        std::fs::write(
            &toml_path,
            "grpc_listen = \"127.0.0.1:6000\"\nallow_root = [\"/srv\"]\nmax_running_jobs = 3\ncheckpoint_interval = \"2s\"\n",
        )
        .unwrap();
        let c = FileConfig::load(&toml_path).unwrap();
        assert_eq!(c.grpc_listen, Some("127.0.0.1:6000".parse().unwrap()));
        assert_eq!(c.allow_root, Some(vec![PathBuf::from("/srv")]));
        assert_eq!(c.max_running_jobs, Some(3));
        let yaml_path = dir.path().join("ferry.yaml");
        std::fs::write(&yaml_path, "metrics_listen: \"off\"\nmax_queued_jobs: 7\n").unwrap();
        let c = FileConfig::load(&yaml_path).unwrap();
        assert_eq!(c.metrics_listen.as_deref(), Some("off"));
        assert_eq!(c.max_queued_jobs, Some(7));
        std::fs::write(&yaml_path, "no_such_key: 1\n").unwrap();
        assert!(FileConfig::load(&yaml_path).is_err());
    }
}
