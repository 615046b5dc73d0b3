//! `ferry backup serve REPO ID --listen ADDRESS`: one backup's image served read-only over
//! NBD until SIGTERM or Ctrl-C (instant access: a VM, `qemu-img convert` or nbdcopy reads
//! it at once, without a restore first).
//!
//! The image is a [`BackupImage`] (chunks fetched on demand into a bounded cache,
//! read-ahead for sequential readers, zero chunks as holes) served by `ferry export`'s
//! server ([`Export`]). The URI is printed on stdout as soon as the socket listens, as
//! `ferry export` prints it. [`ExportServing`] is also what `ferry backup restore
//! --while-serving` serves the backup with during a live restore.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::bail;
use clap::Args;
use ferry_backup::{BackupId, Repository};
use ferry_core::size::format_size;
use ferry_endpoints::export::{Export, ExportListen, ExportOptions, ExportTls};
use ferry_image_backup::{BackupImage, ChunkCache, DEFAULT_CACHE_BYTES, DEFAULT_READ_AHEAD};

use super::args;
use super::backup::{backup_id, open_repository};

/// Arguments of `ferry backup serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[arg(value_name = "REPO")]
    pub repo: String,
    #[arg(value_name = "ID", value_parser = backup_id)]
    pub id: BackupId,
    /// Where to listen: HOST:PORT ([IPV6]:PORT; port 0 picks one), unix:PATH or a socket
    /// path (nbd+unix).
    #[arg(long, value_name = "ADDRESS", value_parser = parse_listen)]
    pub listen: ExportListen,
    #[command(flatten)]
    pub export: ExportServing,
}

/// How a backup is exported: the same name and TLS options as `ferry export`, and the
/// chunk cache.
#[derive(Debug, Clone, Args)]
pub struct ExportServing {
    /// The export name clients ask for [default: "", which clients get by default].
    #[arg(long, value_name = "NAME", default_value = "")]
    pub name: String,
    /// Serve TLS with this certificate chain (PEM) and require it (nbds://).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Accept only clients with a certificate this CA signed (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// Decoded chunks kept in memory for the clients, at most [default: 128M].
    #[arg(long, value_name = "SIZE", value_parser = args::size)]
    pub cache_size: Option<u64>,
    #[arg(long, value_name = "CHUNKS", value_parser = read_ahead,
          help = format!("Chunks fetched ahead of clients reading front to back, for all together; 0 turns it off (at most half the chunks the cache holds) [default: {DEFAULT_READ_AHEAD}]"))]
    pub read_ahead: Option<usize>,
}

fn parse_listen(text: &str) -> Result<ExportListen, String> {
    ExportListen::parse(text).map_err(|e| e.to_string())
}

fn read_ahead(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if n <= 1024 => Ok(n),
        _ => Err(format!("'{text}' is not a number of chunks from 0 to 1024")),
    }
}

/// A backup exported: bound and ready, its URI known.
#[derive(Debug)]
pub struct Serving {
    pub export: Export,
    pub cache: Arc<ChunkCache>,
    pub image: BackupImage,
}

impl ExportServing {
    /// Opens backup `id` of `repo` as an image read through a new cache, and binds its
    /// export at `listen` (nothing is served until [`Export::serve`]).
    pub async fn bind(
        &self,
        repo: &Repository,
        id: &BackupId,
        listen: &ExportListen,
    ) -> anyhow::Result<Serving> {
        let capacity = self.cache_size.unwrap_or(DEFAULT_CACHE_BYTES);
        let chunk_size = u64::from(repo.chunk_size());
        if capacity < chunk_size {
            bail!(
                "--cache-size {} is smaller than one chunk of the repository ({}): give at least {}",
                args::show_size(capacity),
                args::show_size(chunk_size),
                args::show_size(chunk_size)
            );
        }
        let cache = ChunkCache::new(repo.clone(), capacity);
        let image = BackupImage::open(
            cache.clone(),
            id,
            self.read_ahead.unwrap_or(DEFAULT_READ_AHEAD),
        )
        .await
        .map_err(|e| super::failed(e, &format!("cannot read backup {id}")))?;
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(ExportTls {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_ca.clone(),
            }),
            _ => None,
        };
        let options = ExportOptions {
            listen: listen.clone(),
            name: self.name.clone(),
            description: Some(format!("backup {id}")),
            tls,
        };
        let export = Export::bind(Arc::new(image.clone()), &options)
            .await
            .map_err(|e| super::failed(e, "cannot export"))?;
        Ok(Serving {
            export,
            cache,
            image,
        })
    }
}

impl Serving {
    /// Prints the URI on stdout (one line, flushed) and what is served on stderr.
    pub fn announce(&self, id: &BackupId) -> anyhow::Result<()> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", self.export.uri())?;
        out.flush()?;
        eprintln!(
            "ferry: serving backup {id} read-only at {} (cache {}, read-ahead {} chunks) until SIGTERM",
            self.export.uri(),
            format_size(self.cache.capacity()),
            self.image.read_ahead()
        );
        Ok(())
    }
}

/// Completes on SIGTERM or Ctrl-C.
pub async fn terminated() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    })
}

/// Runs `ferry backup serve`: returns once SIGTERM or Ctrl-C stopped the server.
pub async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let repo = open_repository(&args.repo).await?;
    let serving = args.export.bind(&repo, &args.id, &args.listen).await?;
    let stop = terminated().await?;
    serving.announce(&args.id)?;
    let Serving { export, cache, .. } = serving;
    export.serve(stop).await;
    let stats = cache.stats();
    tracing::info!(
        hits = stats.hits,
        misses = stats.misses,
        "backup export stopped"
    );
    Ok(ExitCode::SUCCESS)
}
