//! The test kit's stand-in of the CSI SnapshotMetadata sidecar as a process, for the
//! changed-block tracking benchmark (tests/bench/cases/backup_cbt.py) and for trying
//! `ferry backup create --snapshot-metadata` by hand.
//!
//!     ferry-snapshot-metadata-server --ca-out CA.pem --token-file TOKEN --namespace NS
//!         --snapshot NAME=HANDLE=PATH... [--delta BASE_HANDLE=TARGET_NAME=RANGES]...
//!
//! Serves on a free loopback port over TLS with a fresh test CA (its certificate written
//! to CA.pem), accepts the token in TOKEN for the audience `ferry-bench`, and prints its
//! URL (`https://127.0.0.1:PORT`) as the first line of stdout. A `--delta` names a file of
//! `OFFSET LENGTH` lines the delta is read from instead of comparing two files. It runs
//! until stdin closes or it is killed.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use ferry_testkit::snapshot_metadata::{KnownDelta, MetadataServer, MetadataServerConfig};

fn usage(problem: &str) -> ExitCode {
    eprintln!("ferry-snapshot-metadata-server: {problem}");
    eprintln!(
        "usage: ferry-snapshot-metadata-server --ca-out CA.pem --token-file TOKEN --namespace NS \
         --snapshot NAME=HANDLE=PATH... [--delta BASE_HANDLE=TARGET_NAME=RANGES]..."
    );
    ExitCode::from(2)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut ca_out, mut token, mut namespace) = (None, None, None);
    let mut snapshots: Vec<(String, String, PathBuf)> = Vec::new();
    let mut deltas = Vec::new();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let Some(value) = it.next() else {
            return usage(&format!("{flag} needs a value"));
        };
        let parts: Vec<&str> = value.splitn(3, '=').collect();
        match flag.as_str() {
            "--ca-out" => ca_out = Some(PathBuf::from(value)),
            "--token-file" => match std::fs::read_to_string(value) {
                Ok(t) => token = Some(t.trim().to_string()),
                Err(e) => return usage(&format!("cannot read {value}: {e}")),
            },
            "--namespace" => namespace = Some(value.clone()),
            "--snapshot" if parts.len() == 3 => {
                snapshots.push((parts[0].to_string(), parts[1].to_string(), parts[2].into()))
            }
            "--delta" if parts.len() == 3 => deltas.push(KnownDelta {
                base_handle: parts[0].into(),
                target: parts[1].into(),
                ranges: parts[2].into(),
            }),
            _ => return usage(&format!("unknown flag or value: {flag} {value}")),
        }
    }
    let (Some(ca_out), Some(token), Some(namespace)) = (ca_out, token, namespace) else {
        return usage("--ca-out, --token-file and --namespace are required");
    };
    let mut config = MetadataServerConfig::new("ferry-bench", &token, &namespace);
    for (name, handle, path) in snapshots {
        config = config.with_snapshot(&name, &handle, path);
    }
    config.deltas = deltas;
    let server = match MetadataServer::start(config).await {
        Ok(server) => server,
        Err(e) => return usage(&format!("cannot start: {e}")),
    };
    if let Err(e) = std::fs::write(&ca_out, server.ca_pem()) {
        return usage(&format!("cannot write {}: {e}", ca_out.display()));
    }
    println!("{}", server.url());
    // Until stdin closes (the harness holds it open while the server is needed).
    let _ = tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    })
    .await;
    drop(server);
    ExitCode::SUCCESS
}
