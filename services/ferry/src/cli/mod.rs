//! The `ferry` subcommands: those that run the data path in this process (`copy`,
//! `checksum`, `info`, `backup`), `serve` and `operator`, and the clients of a running
//! service ([`remote`]).
//!
//! Each subcommand parses its arguments with clap, opens the endpoints, runs the engine
//! with a progress display and Ctrl-C cancellation, and prints its result. Errors travel
//! up as `anyhow` errors that `app::main` prints as one `ferry: ...` line.

pub mod args;
pub mod backup;
pub mod backup_create;
pub mod backup_keys;
pub mod backup_maintain;
pub mod backup_restore;
pub mod backup_serve;
pub mod backup_sync;
pub mod backup_undelete;
pub mod checksum;
pub mod copy;
pub mod export;
pub mod fan_out;
pub mod image;
pub mod info;
pub mod operator;
pub mod options;
pub mod progress;
pub mod relay;
pub mod remote;
pub mod retention;
pub mod serve;
pub mod snapshot_metadata;
pub mod source;
pub mod summary;

use std::process::ExitCode;

use ferry_engine::CancellationToken;

/// Exit code of a command stopped by Ctrl-C (128 + SIGINT), as shells expect.
pub const EXIT_INTERRUPTED: u8 = 130;

/// Sends tracing output to stderr, filtered by `RUST_LOG` (default: warnings and errors).
/// Does nothing when a subscriber is already installed.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Cancels `token` on the first Ctrl-C (SIGINT). The returned token tells whether that
/// happened, so the command can say "interrupted" rather than report a generic failure.
pub fn cancel_on_ctrl_c(token: &CancellationToken) -> CancellationToken {
    let interrupted = CancellationToken::new();
    let cancel = token.clone();
    let flag = interrupted.clone();
    tokio::spawn(async move {
        tokio::select! {
            signal = tokio::signal::ctrl_c() => {
                if signal.is_ok() {
                    flag.cancel();
                    cancel.cancel();
                }
            }
            () = cancel.cancelled() => {}
        }
    });
    interrupted
}

/// The `--help` text on HTTP(S) sources, shared by every command that reads one.
pub const HTTP_SOURCE_HELP: &str = "\
HTTP(S) sources (read-only): http://host[:port]/path or https://...; the server's ranges
are read in parallel, a server without ranges is read as one stream. Credentials never go
in the URL; they come from the environment:
  FERRY_HTTP_USER, FERRY_HTTP_PASSWORD_FILE   basic authentication (user, password file)
  FERRY_HTTP_TOKEN_FILE                       bearer token file
  FERRY_HTTP_HEADERS_FILE                     extra headers, one 'Name: value' a line
  FERRY_HTTP_CA_FILE                          extra trusted CA certificates (PEM)
  FERRY_HTTP_CLIENT_CERT_FILE, _KEY_FILE      client certificate and key (PEM)
  FERRY_HTTP_CONNECT_TIMEOUT, _READ_TIMEOUT   seconds [default: 10, 30]
  FERRY_HTTP_ATTEMPTS                         attempts per request [default: 5]

Registry sources (read-only): docker://HOST[:PORT]/REPO[:TAG] or docker://HOST/REPO@sha256:DIGEST
(also oci://), a containerDisk whose layer holds /disk/<image> (qcow2 or raw):
  FERRY_REGISTRY_AUTH_FILE                    a docker config.json with the credentials
  FERRY_REGISTRY_CA_FILE                      extra trusted CA certificates (PEM)
  FERRY_REGISTRY_INSECURE=1                   plain HTTP (never the default)
  --platform OS/ARCH[/VARIANT]                the image of an index to read [default: linux/amd64]";

/// Source options from the environment: `http(s)://` sources take their credentials and
/// TLS files from the `FERRY_HTTP_*` variables (see `ferry copy --help`).
pub fn source_options_from_env() -> anyhow::Result<ferry_endpoints::SourceOptions> {
    let mut options = ferry_endpoints::SourceOptions::default();
    options.http = ferry_endpoints::http::HttpOptions::from_env()
        .map_err(|e| failed(e, "invalid HTTP settings"))?;
    options.registry = ferry_endpoints::registry::RegistryOptions::from_env()
        .map_err(|e| failed(e, "invalid registry settings"))?;
    Ok(options)
}

/// An endpoint error with the endpoint named (unless it already is) and `what` in front.
pub fn named(error: ferry_core::Error, endpoint: &str, what: &str) -> anyhow::Error {
    failed(error.with_endpoint(endpoint), what)
}

/// A data-path error with `what` in front. The error's own text already ends with its
/// cause, so it becomes a message rather than an anyhow source (which would print the
/// cause twice).
pub fn failed(error: ferry_core::Error, what: &str) -> anyhow::Error {
    anyhow::anyhow!("{what}: {error}")
}

/// Handles a command line clap could not parse: help and version are printed as clap
/// prints them (exit 0); a mistake becomes one line, `ferry: ...`, and exit code 2.
pub fn usage_error(error: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match error.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = error.print();
            ExitCode::from(if error.use_stderr() { 2 } else { 0 })
        }
        _ => {
            eprintln!("ferry: {} (see 'ferry --help')", usage_error_line(&error));
            ExitCode::from(2)
        }
    }
}

/// The first paragraph of clap's message (what was wrong, with any list it gives, such as
/// the missing arguments) as one line, without the `error: ` prefix and the usage text.
fn usage_error_line(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let first = rendered.split("\n\n").next().unwrap_or_default();
    let line = first
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    line.strip_prefix("error: ").unwrap_or(&line).to_string()
}

/// Prints the interruption message and gives the exit code for it.
pub fn interrupted(what: &str) -> ExitCode {
    eprintln!("ferry: interrupted: {what}");
    ExitCode::from(EXIT_INTERRUPTED)
}
