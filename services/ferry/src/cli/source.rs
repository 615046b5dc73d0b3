//! `ferry source version`: the version of a source, asked of its server without reading
//! the image: an HTTP(S) object's strong ETag or Last-Modified, an S3 object's ETag (and
//! version id on a versioned bucket), a registry image's digest. It is what the endpoints
//! pin a job's retries with ([`ferry_core::Source::version`]): the source is opened as a
//! copy opens it and closed again, so there is one version logic.
//!
//! The operator's GoldenImage runs it in a short-lived probe pod for a source with
//! credentials (the operator never reads a Secret): `--endpoint-json` is the source as
//! the GoldenImage names it, its Secret keys mapped to files under `--secrets-dir` exactly
//! as for the import's mover, and `--termination-message-path` writes the result where
//! the operator reads it back ([`ferry_operator::golden::report`]).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use ferry_core::EndpointSpec;
use ferry_endpoints::SourceOptions;
use ferry_operator::golden::report::{self, Probed};
use ferry_server::convert::options::{open_spec, source_options};
use ferry_server::model::job::ResolvedEndpoint;
use ferry_server::secrets::SecretResolver;

use super::source_options_from_env;

/// `ferry source ...`.
#[derive(Debug, Args)]
pub struct SourceArgs {
    #[command(subcommand)]
    command: SourceCommand,
}

#[derive(Debug, Subcommand)]
enum SourceCommand {
    /// Print a source's version without reading it: `etag:"..."` or `last-modified:...`
    /// (HTTP), `etag:"..."[ version-id:...]` (S3), `digest:sha256:...` (registry).
    Version(VersionArgs),
}

/// `ferry source version`.
#[derive(Debug, Args)]
#[command(after_help = super::HTTP_SOURCE_HELP)]
pub struct VersionArgs {
    /// The source: http(s)://, s3://BUCKET/KEY (AWS_* settings), docker:// or oci://.
    #[arg(required_unless_present = "endpoint_json")]
    url: Option<String>,
    /// The source as a Kubernetes resource names it (a GoldenImage's `spec.source`, JSON):
    /// its Secret keys are read from `--secrets-dir/<secret>/<key>`, a registry's
    /// credentials and CA from the mover's registry directory.
    #[arg(long, conflicts_with = "url")]
    endpoint_json: Option<String>,
    /// Where the Secret keys `--endpoint-json` names are (a mover's `--secrets-dir`).
    #[arg(long, requires = "endpoint_json")]
    secrets_dir: Option<PathBuf>,
    /// Also write the result (the version, or the error) as a container termination
    /// message to this file, at most 4096 bytes; the exit code is then 0 either way.
    #[arg(long)]
    termination_message_path: Option<PathBuf>,
}

/// Runs `ferry source`.
pub async fn run(args: SourceArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        SourceCommand::Version(args) => version(args).await,
    }
}

async fn version(args: VersionArgs) -> anyhow::Result<ExitCode> {
    let result = ask(&args).await;
    if let Some(path) = &args.termination_message_path {
        let probed = match &result {
            Ok(v) => Probed::Version(v.clone()),
            Err(e) => Probed::Failed(crate::app::one_line(e)),
        };
        std::fs::write(path, report::encode(&probed))
            .with_context(|| format!("writing {}", path.display()))?;
        if let Err(e) = &result {
            eprintln!("ferry: {}", crate::app::one_line(e));
            return Ok(ExitCode::SUCCESS);
        }
    }
    match result? {
        Some(v) => println!("{v}"),
        None => eprintln!("ferry: the source names no version (no strong ETag or Last-Modified)"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Opens the source as a copy would, takes its version and closes it.
async fn ask(args: &VersionArgs) -> anyhow::Result<Option<String>> {
    let (spec, options) = match &args.endpoint_json {
        Some(json) => from_resource(json, args.secrets_dir.clone())?,
        None => {
            let url = args.url.clone().unwrap_or_default();
            let spec = EndpointSpec::parse(&url).map_err(|e| super::failed(e, "invalid source"))?;
            (spec, source_options_from_env()?)
        }
    };
    if !matches!(
        spec,
        EndpointSpec::Http(_) | EndpointSpec::S3(_) | EndpointSpec::Registry(_)
    ) {
        anyhow::bail!(
            "{spec}: only http(s)://, s3:// and docker:// (oci://) sources have a version to ask"
        );
    }
    let shown = spec.to_string();
    let source = ferry_endpoints::open_source(&spec, &options)
        .await
        .map_err(|e| super::named(e, &shown, "cannot ask the source for its version"))?;
    let version = source.version();
    let _ = source.close().await;
    Ok(version.map(|v| match spec {
        // The registry endpoint names the digest alone; a GoldenImage's versions name
        // their kind.
        EndpointSpec::Registry(_) if !v.starts_with("digest:") => format!("digest:{v}"),
        _ => v,
    }))
}

/// The spec and options of a resource's endpoint, through the mover's mapping (the
/// operator's `mover::endpoint`) and the job service's (`open_spec`).
fn from_resource(
    json: &str,
    secrets_dir: Option<PathBuf>,
) -> anyhow::Result<(EndpointSpec, SourceOptions)> {
    let endpoint: ferry_operator::crd::Endpoint =
        serde_json::from_str(json).context("--endpoint-json is not an endpoint")?;
    endpoint
        .validate("source")
        .map_err(|e| anyhow::anyhow!("--endpoint-json: {e}"))?;
    if endpoint.url.is_none() {
        anyhow::bail!("--endpoint-json: give a url");
    }
    let wire = ferry_operator::mover::endpoint::endpoint(&endpoint, &[])
        .map_err(|e| anyhow::anyhow!("--endpoint-json: {e}"))?;
    let secrets = SecretResolver::new(secrets_dir);
    let (spec, settings) = open_spec(
        &ResolvedEndpoint::Url(wire.url.clone()),
        Some(&wire),
        &secrets,
        "source",
    )
    .map_err(|e| super::failed(e, "invalid source"))?;
    Ok((spec, source_options(Default::default(), settings)))
}
