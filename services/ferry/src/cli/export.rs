//! `ferry export SRC --listen HOST:PORT`: serve any image ferry can read as a read-only
//! NBD export until SIGTERM or Ctrl-C.
//!
//! The source is opened as `ferry copy` opens it (the endpoint, then the image format:
//! a qcow2 or compressed image is served decoded), so `qemu-img convert nbd://...`,
//! nbdcopy or a VM can read an image that lives on S3 or behind HTTP. The URI to connect
//! to is printed on stdout as soon as the socket listens (with the port chosen when
//! `:0` was asked), one line, so scripts and tests can read it.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use ferry_core::EndpointSpec;
use ferry_endpoints::export::{Export, ExportListen, ExportOptions, ExportTls};

use super::image::{self, FormatArgs};
use crate::cli::options::Cache;

/// Arguments of `ferry export`.
#[derive(Debug, Clone, Args)]
#[command(after_help = super::HTTP_SOURCE_HELP)]
pub struct ExportArgs {
    /// Image to serve (read-only): a path, file:///path, nbd://..., nfs://..., iscsi://...,
    /// s3://bucket/key, http(s)://host/path
    #[arg(value_name = "SRC")]
    pub source: String,
    /// Where to listen: HOST:PORT ([IPV6]:PORT; port 0 picks one), unix:PATH or a socket
    /// path (nbd+unix).
    #[arg(long, value_name = "ADDRESS", value_parser = parse_listen)]
    pub listen: ExportListen,
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
    /// writeback: through the page cache; none: direct I/O (O_DIRECT).
    #[arg(long, value_enum, default_value_t = Cache::Writeback)]
    pub cache: Cache,
    #[command(flatten)]
    pub format: FormatArgs,
}

fn parse_listen(text: &str) -> Result<ExportListen, String> {
    ExportListen::parse(text).map_err(|e| e.to_string())
}

/// Runs `ferry export`: returns once SIGTERM or Ctrl-C stopped the server.
pub async fn run(args: ExportArgs) -> anyhow::Result<ExitCode> {
    // rustls warns on every connection of a client that sends an IP address as the TLS
    // server name (libnbd does): harmless, so only its errors are shown by default.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,rustls=error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let spec = EndpointSpec::parse(&args.source).map_err(|e| super::failed(e, "invalid source"))?;
    let name = spec.to_string();
    let mut source_options = super::source_options_from_env()?;
    source_options.cache = args.cache.into();
    let format = args.format.open_options(&source_options);
    let (source, _) = image::open(&spec, &source_options, &format)
        .await
        .map_err(|e| super::named(e, &name, "cannot open the source"))?;
    if !source.size_known() {
        let _ = source.close().await;
        anyhow::bail!(
            "{name}: the size of this stream is not known before it is read, and an NBD \
             export must state it: give it with --source-size, or count it with --prescan"
        );
    }
    let tls = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => Some(ExportTls {
            cert,
            key,
            client_ca: args.tls_ca,
        }),
        _ => None,
    };
    let options = ExportOptions {
        listen: args.listen,
        name: args.name,
        description: Some(name.clone()),
        tls,
    };
    let export = Export::bind(source.clone(), &options)
        .await
        .map_err(|e| super::failed(e, "cannot export"))?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", export.uri())?;
        out.flush()?;
    }
    eprintln!(
        "ferry: serving {name} read-only at {} until SIGTERM",
        export.uri()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    export
        .serve(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        })
        .await;
    let _ = source.close().await;
    Ok(ExitCode::SUCCESS)
}
