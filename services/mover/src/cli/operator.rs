//! `ferry operator`: the Kubernetes side of ferry. `ferry operator crds` prints the
//! CustomResourceDefinitions generated from ferry-operator's types (deploy/crds.yaml is
//! exactly this output).

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;

/// Arguments of `ferry operator`.
#[derive(Debug, clap::Args)]
pub struct OperatorArgs {
    #[command(subcommand)]
    command: OperatorCommand,
}

#[derive(Debug, clap::Subcommand)]
enum OperatorCommand {
    /// Print the CustomResourceDefinitions as one multi-document YAML stream
    /// (kubectl apply -f - installs them).
    Crds,
}

/// Runs `ferry operator ...`.
pub async fn run(args: OperatorArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        OperatorCommand::Crds => {
            let yaml = ferry_operator::crd::crds_yaml()?;
            std::io::stdout()
                .lock()
                .write_all(yaml.as_bytes())
                .context("cannot write the CRDs to stdout")?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
