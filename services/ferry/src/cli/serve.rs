//! `ferry serve`: runs the job service on embedded defaults, overridden by a config file
//! (--config, TOML or YAML), then environment (FERRY_*), then flags; stops gracefully on
//! SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use ferry_core::Secret;

use ferry_server::config::{self, parse_duration, FileConfig, ServiceConfig};
use ferry_server::jobs::ManagerConfig;
use ferry_server::security::TlsFiles;
use ferry_server::server;
use ferry_server::telemetry::{self, LogFormat};

/// Run the gRPC job service.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Config file (TOML, or YAML when it ends in .yaml/.yml); flags and FERRY_* override it.
    #[arg(long, env = "FERRY_CONFIG")]
    pub config: Option<PathBuf>,
    /// gRPC address [default: 127.0.0.1:50051].
    #[arg(long, env = "FERRY_GRPC_LISTEN")]
    pub grpc_listen: Option<SocketAddr>,
    /// Metrics address, or "off" [default: 127.0.0.1:9090].
    #[arg(long, env = "FERRY_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Where jobs and checkpoints persist [default: $XDG_STATE_HOME/ferry, ~/.local/state/ferry or ./ferry-data].
    #[arg(long, env = "FERRY_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// A directory file endpoints may use (repeat for several; FERRY_ALLOW_ROOT takes a
    /// colon-separated list). Without any, file endpoints are refused.
    #[arg(long = "allow-root", env = "FERRY_ALLOW_ROOT", value_delimiter = ':')]
    pub allow_root: Vec<PathBuf>,
    /// Directory that secret file references are relative to (e.g. a mounted Secret).
    #[arg(long, env = "FERRY_SECRETS_DIR")]
    pub secrets_dir: Option<PathBuf>,
    /// Jobs running at once [default: 4].
    #[arg(long, env = "FERRY_MAX_RUNNING_JOBS")]
    pub max_running_jobs: Option<usize>,
    /// Jobs running at once against one endpoint host [default: 2].
    #[arg(long, env = "FERRY_MAX_JOBS_PER_HOST")]
    pub max_jobs_per_host: Option<usize>,
    /// Jobs waiting in the queue before StartTransfer is refused [default: 10000].
    #[arg(long, env = "FERRY_MAX_QUEUED_JOBS")]
    pub max_queued_jobs: Option<usize>,
    /// Attempts per job when errors are transient [default: 5].
    #[arg(long, env = "FERRY_MAX_ATTEMPTS")]
    pub max_attempts: Option<u32>,
    /// First retry delay, doubled per retry [default: 1s].
    #[arg(long, env = "FERRY_RETRY_BASE")]
    pub retry_base: Option<String>,
    /// Longest retry delay [default: 60s].
    #[arg(long, env = "FERRY_RETRY_MAX")]
    pub retry_max: Option<String>,
    /// How often running copies flush and persist a checkpoint [default: 5s].
    #[arg(long, env = "FERRY_CHECKPOINT_INTERVAL")]
    pub checkpoint_interval: Option<String>,
    /// How long SIGTERM waits for running jobs to checkpoint [default: 30s].
    #[arg(long, env = "FERRY_SHUTDOWN_TIMEOUT")]
    pub shutdown_timeout: Option<String>,
    /// Finished jobs older than this are pruned [default: 7d].
    #[arg(long, env = "FERRY_HISTORY_MAX_AGE")]
    pub history_max_age: Option<String>,
    /// Finished jobs kept at most [default: 10000].
    #[arg(long, env = "FERRY_HISTORY_MAX_COUNT")]
    pub history_max_count: Option<usize>,
    /// Schedules the server holds at most [default: 1000].
    #[arg(long, env = "FERRY_MAX_SCHEDULES")]
    pub max_schedules: Option<usize>,
    /// Test hook: cron expressions may have a leading seconds field, so tests fire every
    /// few seconds. Hidden: not for production use.
    #[arg(long, hide = true)]
    pub test_cron_seconds: bool,
    /// PEM certificate chain: serve gRPC over TLS.
    #[arg(long, env = "FERRY_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "FERRY_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle: require client certificates it signed (mutual TLS).
    #[arg(long, env = "FERRY_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// File with the bearer token callers must send (the FERRY_AUTH_TOKEN variable works too).
    #[arg(long, env = "FERRY_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Largest gRPC message in bytes [default: 4 MiB].
    #[arg(long, env = "FERRY_MAX_MESSAGE_BYTES")]
    pub max_message_bytes: Option<usize>,
    /// Log format [default: text].
    #[arg(long, env = "FERRY_LOG_FORMAT", value_parser = log_format)]
    pub log_format: Option<LogFormat>,
    /// Log filter (tracing EnvFilter syntax) [default: info].
    #[arg(long, env = "FERRY_LOG")]
    pub log_filter: Option<String>,
}

/// `--log-format`: `text` or `json`.
fn log_format(text: &str) -> Result<LogFormat, String> {
    text.parse()
        .map_err(|e: ferry_core::Error| e.message().to_string())
}

fn duration(
    flag: &Option<String>,
    file: &Option<String>,
    default: Duration,
) -> anyhow::Result<Duration> {
    match flag.as_ref().or(file.as_ref()) {
        Some(text) => Ok(parse_duration(text)?),
        None => Ok(default),
    }
}

fn read_token(path: &PathBuf) -> anyhow::Result<Secret> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the auth token file {}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        bail!("the auth token file {} is empty", path.display());
    }
    Ok(Secret::new(token))
}

impl ServeArgs {
    /// The service configuration, and the log settings.
    pub fn resolve(&self) -> anyhow::Result<(ServiceConfig, LogFormat, String)> {
        let file = match &self.config {
            Some(p) => FileConfig::load(p)?,
            None => FileConfig::default(),
        };
        let data_dir = self
            .data_dir
            .clone()
            .or(file.data_dir.clone())
            .unwrap_or_else(config::default_data_dir);
        let mut cfg = ServiceConfig::new(data_dir);
        if let Some(a) = self.grpc_listen.or(file.grpc_listen) {
            cfg.grpc_listen = a;
        }
        if let Some(m) = self
            .metrics_listen
            .as_ref()
            .or(file.metrics_listen.as_ref())
        {
            cfg.metrics_listen = if m == "off" {
                None
            } else {
                Some(
                    m.parse()
                        .with_context(|| format!("--metrics-listen '{m}'"))?,
                )
            };
        }
        cfg.allow_roots = if self.allow_root.is_empty() {
            file.allow_root.clone().unwrap_or_default()
        } else {
            self.allow_root.clone()
        };
        cfg.secrets_dir = self.secrets_dir.clone().or(file.secrets_dir.clone());
        self.resolve_manager(&file, &mut cfg.manager)?;
        if let Some(n) = self.max_schedules.or(file.max_schedules) {
            cfg.schedules.max_schedules = n;
        }
        cfg.schedules.seconds_field = self.test_cron_seconds;
        cfg.shutdown_timeout = duration(
            &self.shutdown_timeout,
            &file.shutdown_timeout,
            cfg.shutdown_timeout,
        )?;
        cfg.tls = self.resolve_tls(&file)?;
        cfg.auth_token = match self
            .auth_token_file
            .as_ref()
            .or(file.auth_token_file.as_ref())
        {
            Some(p) => Some(read_token(p)?),
            None => std::env::var("FERRY_AUTH_TOKEN")
                .ok()
                .filter(|t| !t.trim().is_empty())
                .map(|t| Secret::new(t.trim())),
        };
        if let Some(n) = self.max_message_bytes.or(file.max_message_bytes) {
            cfg.max_message_bytes = n.clamp(64 * 1024, 64 * 1024 * 1024);
        }
        let (format, filter) = self.resolve_log(&file)?;
        Ok((cfg, format, filter))
    }

    /// Job limits, retries and history: flags over the file over the defaults.
    fn resolve_manager(&self, file: &FileConfig, m: &mut ManagerConfig) -> anyhow::Result<()> {
        if let Some(n) = self.max_running_jobs.or(file.max_running_jobs) {
            m.limits.max_running = n.max(1);
        }
        if let Some(n) = self.max_jobs_per_host.or(file.max_jobs_per_host) {
            m.limits.max_per_host = n.max(1);
        }
        if let Some(n) = self.max_queued_jobs.or(file.max_queued_jobs) {
            m.max_queued = n;
        }
        if let Some(n) = self.max_attempts.or(file.max_attempts) {
            m.max_attempts = n.max(1);
        }
        m.retry_base = duration(&self.retry_base, &file.retry_base, m.retry_base)?;
        m.retry_max = duration(&self.retry_max, &file.retry_max, m.retry_max)?;
        m.checkpoint_interval = duration(
            &self.checkpoint_interval,
            &file.checkpoint_interval,
            m.checkpoint_interval,
        )?;
        m.history_max_age = duration(
            &self.history_max_age,
            &file.history_max_age,
            m.history_max_age,
        )?;
        if let Some(n) = self.history_max_count.or(file.history_max_count) {
            m.history_max_count = n;
        }
        Ok(())
    }

    /// The server's TLS files: none, or a certificate with its key (and a client CA).
    fn resolve_tls(&self, file: &FileConfig) -> anyhow::Result<Option<TlsFiles>> {
        let cert = self.tls_cert.clone().or(file.tls_cert.clone());
        let key = self.tls_key.clone().or(file.tls_key.clone());
        let client_ca = self.tls_client_ca.clone().or(file.tls_client_ca.clone());
        Ok(match (cert, key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert,
                key,
                client_ca,
            }),
            (None, None) if client_ca.is_none() => None,
            _ => bail!(
                "TLS needs both --tls-cert and --tls-key (and --tls-client-ca only with them)"
            ),
        })
    }

    /// The log format and filter.
    fn resolve_log(&self, file: &FileConfig) -> anyhow::Result<(LogFormat, String)> {
        let format = match (self.log_format, file.log_format.as_deref()) {
            (Some(f), _) => f,
            (None, Some(text)) => text.parse()?,
            (None, None) => LogFormat::Text,
        };
        let filter = self
            .log_filter
            .clone()
            .or(file.log_filter.clone())
            .unwrap_or_else(|| "info".to_string());
        Ok((format, filter))
    }
}

/// Runs `ferry serve` until SIGTERM or Ctrl-C.
pub async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let (cfg, format, filter) = args.resolve()?;
    let mut telemetry = telemetry::init(format, &filter)?;
    let service = server::start(cfg).await?;
    // One line on stdout that scripts (and the tests) read to find the ports.
    println!(
        "ferry serve: grpc={} metrics={}",
        service.grpc_addr(),
        service
            .metrics_addr()
            .map_or_else(|| "off".to_string(), |a| a.to_string())
    );
    wait_for_signal().await?;
    service.shutdown().await;
    telemetry.shutdown();
    Ok(ExitCode::SUCCESS)
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot install a SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        r = tokio::signal::ctrl_c() => {
            r.context("cannot wait for Ctrl-C")?;
            tracing::info!("interrupt received");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    #[test]
    fn flags_override_the_file_which_overrides_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ferry.toml");
        std::fs::write(
            &file,
            "max_running_jobs = 3\nmax_jobs_per_host = 9\nmetrics_listen = \"off\"\ncheckpoint_interval = \"2s\"\n",
        )
        .unwrap();
        let cli = Cli::parse_from([
            "x",
            "--config",
            file.to_str().unwrap(),
            "--max-running-jobs",
            "7",
            "--allow-root",
            "/a",
            "--allow-root",
            "/b",
            "--data-dir",
            "/tmp/ferry-x",
        ]);
        let (cfg, format, filter) = cli.serve.resolve().unwrap();
        assert_eq!(cfg.manager.limits.max_running, 7);
        assert_eq!(cfg.manager.limits.max_per_host, 9);
        assert_eq!(cfg.metrics_listen, None);
        assert_eq!(cfg.manager.checkpoint_interval, Duration::from_secs(2));
        assert_eq!(cfg.allow_roots, [PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(
            cfg.grpc_listen,
            config::DEFAULT_GRPC_LISTEN.parse().unwrap()
        );
        assert_eq!(cfg.data_dir, PathBuf::from("/tmp/ferry-x"));
        assert_eq!(format, LogFormat::Text);
        assert_eq!(filter, "info");
    }

    #[test]
    fn tls_needs_cert_and_key() {
        let cli = Cli::try_parse_from(["x", "--tls-cert", "/c"]);
        assert!(cli.is_err());
    }
}
