//! `ferry copy ... --relay-listen HOST:PORT`: while the copy writes its targets, serve the
//! image written so far over NBD, so other movers copy `nbd://HOST:PORT/NAME` from this
//! one instead of reading the origin again (the origin is read once for a whole rollout).
//!
//! The relay serves from the copy's first local target (a file or block device); reads
//! of ranges not written yet wait for them (`--relay-wait`), and fail with EIO once the
//! copy fails. After the copy, the finished image is served until every client has
//! disconnected, at most `--relay-linger` seconds. The data side is
//! [`ferry_endpoints::relay`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use ferry_core::{EndpointSpec, Source, Target};
use ferry_endpoints::export::{ExportListen, ExportOptions, ExportTls};
use ferry_endpoints::relay::{Relay, RelayOptions, DEFAULT_LINGER, DEFAULT_WAIT};

/// The relay's arguments of `ferry copy`.
#[derive(Debug, Clone, Args)]
pub struct RelayArgs {
    /// While copying, serve the image written so far over NBD from the first local target
    /// (a file or block device): HOST:PORT ([IPV6]:PORT), unix:PATH or a socket path.
    #[arg(long, value_name = "ADDRESS", value_parser = parse_listen)]
    pub relay_listen: Option<ExportListen>,
    /// The relay's export name [default: "", which clients get by default].
    #[arg(long, value_name = "NAME", requires = "relay_listen")]
    pub relay_name: Option<String>,
    /// Serve the relay over TLS with this certificate chain (PEM) and require it (nbds://).
    #[arg(long, value_name = "FILE", requires_all = ["relay_listen", "relay_tls_key"])]
    pub relay_tls_cert: Option<PathBuf>,
    /// The private key of --relay-tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "relay_tls_cert")]
    pub relay_tls_key: Option<PathBuf>,
    /// Accept only relay clients with a certificate this CA signed (PEM).
    #[arg(long, value_name = "FILE", requires = "relay_tls_cert")]
    pub relay_tls_ca: Option<PathBuf>,
    /// After the copy, serve the finished image until every client has disconnected, at
    /// most this many seconds [default: 300].
    #[arg(long, value_name = "SECS", requires = "relay_listen")]
    pub relay_linger: Option<u64>,
    /// How long a client's read of a range the copy has not written yet waits for it
    /// before it fails, in seconds [default: 60].
    #[arg(long, value_name = "SECS", requires = "relay_listen")]
    pub relay_wait: Option<u64>,
    /// After the copy, keep serving this many seconds with no client connected, for
    /// clients that start late (bounded by --relay-linger) [default: 0].
    #[arg(long, value_name = "SECS", requires = "relay_listen")]
    pub relay_idle: Option<u64>,
}

fn parse_listen(text: &str) -> Result<ExportListen, String> {
    ExportListen::parse(text).map_err(|e| e.to_string())
}

impl RelayArgs {
    /// The relay's options, when `--relay-listen` asks for one.
    pub fn options(&self, description: &str) -> Option<RelayOptions> {
        let listen = self.relay_listen.clone()?;
        let tls = match (&self.relay_tls_cert, &self.relay_tls_key) {
            (Some(cert), Some(key)) => Some(ExportTls {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.relay_tls_ca.clone(),
            }),
            _ => None,
        };
        Some(RelayOptions {
            export: ExportOptions {
                listen,
                name: self.relay_name.clone().unwrap_or_default(),
                description: Some(description.to_string()),
                tls,
            },
            wait: self.relay_wait.map_or(DEFAULT_WAIT, Duration::from_secs),
            linger: self
                .relay_linger
                .map_or(DEFAULT_LINGER, Duration::from_secs),
            idle: Duration::from_secs(self.relay_idle.unwrap_or(0)),
        })
    }
}

/// The relay's backing, when `--relay-listen` asks for one: the first local target (a
/// file or block device) and its index. Checked before any target is opened.
pub(super) fn backing(
    args: &RelayArgs,
    specs: &[EndpointSpec],
) -> anyhow::Result<Option<(usize, PathBuf)>> {
    if args.relay_listen.is_none() {
        return Ok(None);
    }
    let found = specs.iter().enumerate().find_map(|(i, s)| match s {
        EndpointSpec::File(path) => Some((i, path.clone())),
        _ => None,
    });
    if found.is_none() {
        let names: Vec<String> = specs.iter().map(ToString::to_string).collect();
        anyhow::bail!(
            "--relay-listen serves the image from the copy's first local target (a file or \
             block device), and none of the targets is one: {}",
            names.join(", ")
        );
    }
    Ok(found)
}

/// Starts the relay on its backing target (which it then watches), when asked for.
pub(super) async fn start(
    args: &RelayArgs,
    backing: Option<(usize, PathBuf)>,
    source: &Arc<dyn Source>,
    source_name: &str,
    targets: &mut [Arc<dyn Target>],
) -> anyhow::Result<Option<Relay>> {
    let (Some(options), Some((index, path))) = (args.options(source_name), backing) else {
        return Ok(None);
    };
    if !source.size_known() {
        anyhow::bail!(
            "{source_name}: the size of this stream is not known before it is read, and a \
             relay must state it: give it with --source-size, or count it with --prescan"
        );
    }
    let relay = Relay::start(&path, source.size(), &options)
        .await
        .map_err(|e| super::failed(e, "cannot start the relay"))?;
    targets[index] = relay.wrap(targets[index].clone());
    eprintln!(
        "ferry: relaying {source_name} at {} from {} while it is copied",
        relay.uri(),
        path.display()
    );
    Ok(Some(relay))
}

/// After the copy: serves the finished image to the clients still reading it (or fails
/// their reads when the copy did not finish), then closes the relay.
pub(super) async fn end(relay: Relay) {
    let clients = relay.clients();
    if relay.is_complete() && clients > 0 {
        eprintln!(
            "ferry: the copy is done; the relay serves it to {clients} connected client(s) \
             until they disconnect (at most {}s)",
            relay.linger().as_secs()
        );
    }
    relay.end().await;
}
