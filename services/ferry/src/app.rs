//! The `ferry` command line: argument parsing and dispatch, shared by the `ferry` binary
//! and the end-to-end tests' copy of it.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::cli;

/// Copy and verify disk images between files, block devices, NBD, NFS, iSCSI and S3, and
/// from HTTP(S).
#[derive(Debug, Parser)]
#[command(name = "ferry", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Copy an image from SRC to DST.
    Copy(cli::copy::CopyArgs),
    /// Print the checksum of an image (blksum-compatible block hash by default).
    Checksum(cli::checksum::ChecksumArgs),
    /// Serve an image read-only over NBD until SIGTERM (nbd://, nbds://, nbd+unix://).
    Export(cli::export::ExportArgs),
    /// Print an image's format, virtual size, allocation and backing chain.
    Info(cli::info::InfoArgs),
    /// Ask a source about itself without reading it: `ferry source version URL`.
    Source(cli::source::SourceArgs),
    /// Deduplicating backups of images into a repository (directory or S3): init, create,
    /// list, show, restore, verify, prune, gc, key, protect.
    Backup(cli::backup::BackupArgs),
    /// Run the gRPC job service.
    Serve(cli::serve::ServeArgs),
    /// Start, watch and cancel jobs on a running service.
    Job(cli::remote::job::JobArgs),
    /// Create, pause, resume, run and delete cron schedules of jobs on a running service.
    Schedule(cli::remote::schedule::ScheduleArgs),
    /// Kubernetes: print the CRDs (`ferry operator crds`).
    Operator(cli::operator::OperatorArgs),
}

/// Runs the `ferry` command line with the process arguments.
pub fn main() -> ExitCode {
    crate::allocator::return_large_buffers_to_the_system();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return cli::usage_error(e),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ferry: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Copy(args) => cli::copy::run(args).await,
            Command::Checksum(args) => cli::checksum::run(args).await,
            Command::Info(args) => cli::info::run(args).await,
            Command::Source(args) => cli::source::run(args).await,
            Command::Export(args) => cli::export::run(args).await,
            Command::Backup(args) => cli::backup::run(args).await,
            Command::Serve(args) => cli::serve::run(args).await,
            Command::Job(args) => cli::remote::job::run(args).await,
            Command::Schedule(args) => cli::remote::schedule::run(args).await,
            Command::Operator(args) => cli::operator::run(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ferry: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, each cause once: ferry's errors already end with
/// the text of their source, which anyhow's `{:#}` would print a second time.
pub fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_is_printed_once() {
        let io = std::io::Error::from_raw_os_error(2);
        let core = ferry_core::Error::io("--allow-root /x cannot be resolved", io);
        let e = anyhow::Error::new(core);
        assert_eq!(
            one_line(&e),
            "--allow-root /x cannot be resolved: No such file or directory (os error 2)"
        );
        let e = anyhow::anyhow!("inner cause").context("what failed");
        assert_eq!(one_line(&e), "what failed: inner cause");
    }
}
