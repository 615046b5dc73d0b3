//! `ferry backup protect` / `unprotect` end to end, on a directory repository and on the
//! in-process S3 server: a protected backup is listed as protected, kept by prune with
//! the reason "protected" (in `--json`), still restores byte for byte after a GC, and is
//! pruned like any other once unprotected.

use std::path::Path;
use std::process::Stdio;

use ferry_tests::bin::{wait_with_deadline, Run, DEFAULT_DEADLINE};
use ferry_tests::images::{self, Pattern};
use ferry_tests::s3_server::S3Server;
use ferry_tests::{ferry, scratch_dir};
use serde_json::{json, Value};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn parse(run: &Run) -> Value {
    serde_json::from_str(run.stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {run}"))
}

async fn run(server: Option<&S3Server>, args: &[&str]) -> Run {
    let mut cmd = ferry!().command(args);
    if let Some(server) = server {
        server.sdk_env(&mut cmd);
    }
    cmd.env_remove("FERRY_BACKUP_KEY_FILE").stdin(Stdio::null());
    let description = format!("{cmd:?}");
    let child = cmd.spawn().unwrap();
    tokio::task::spawn_blocking(move || wait_with_deadline(child, DEFAULT_DEADLINE, description))
        .await
        .unwrap()
}

/// `(id, protected)` of every backup, oldest first.
async fn listed(server: Option<&S3Server>, repo: &str) -> Vec<(String, bool)> {
    let list = run(server, &["backup", "list", "--json", repo]).await;
    list.assert_success();
    parse(&list)
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["id"].as_str().unwrap().to_string(),
                e["protected"].as_bool().unwrap(),
            )
        })
        .collect()
}

async fn protected_backups_survive_prune(server: Option<&S3Server>, repo: &str, dir: &Path) {
    let image = images::make(&dir.join("disk.img"), Pattern::HalfData, 2 << 20, 5).unwrap();
    run(server, &["backup", "init", "--chunk-size", "256K", repo])
        .await
        .assert_success();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let made = run(
            server,
            &[
                "backup",
                "create",
                "--no-progress",
                "--json",
                s(&image.path),
                repo,
            ],
        )
        .await;
        made.assert_success();
        ids.push(parse(&made)["id"].as_str().unwrap().to_string());
        // Backup ids name the second.
        std::thread::sleep(std::time::Duration::from_millis(1100));
    }
    let oldest = ids[0].clone();
    let protect = run(server, &["backup", "protect", repo, &oldest]).await;
    protect.assert_success();
    assert!(protect.stdout.contains("is protected"), "{protect}");
    let again = run(server, &["backup", "protect", repo, &oldest]).await;
    again.assert_success();
    assert!(again.stdout.contains("already protected"), "{again}");
    let line = run(
        server,
        &["backup", "protect", repo, "20200101T000000Z-00000000"],
    )
    .await
    .assert_clean_failure()
    .to_string();
    assert!(line.contains("does not exist"), "{line}");
    assert_eq!(
        listed(server, repo).await,
        [
            (ids[0].clone(), true),
            (ids[1].clone(), false),
            (ids[2].clone(), false)
        ]
    );

    let pruned = run(
        server,
        &["backup", "prune", "--json", "--keep-last", "1", repo],
    )
    .await;
    pruned.assert_success();
    let pruned = parse(&pruned);
    let reasons = |id: &str| {
        pruned["keep"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == id)
            .map(|e| e["reasons"].clone())
    };
    assert_eq!(reasons(&oldest), Some(json!(["protected"])), "{pruned}");
    assert_eq!(reasons(&ids[2]), Some(json!(["last snapshot"])), "{pruned}");
    assert_eq!(pruned["deleted"], json!([ids[1]]), "{pruned}");
    run(server, &["backup", "gc", "--grace", "0", repo])
        .await
        .assert_success();
    let out = dir.join("restored.img");
    run(
        server,
        &["backup", "restore", "--no-progress", repo, &oldest, s(&out)],
    )
    .await
    .assert_success();
    assert!(std::fs::read(&image.path).unwrap() == std::fs::read(&out).unwrap());

    let unprotect = run(server, &["backup", "unprotect", repo, &oldest]).await;
    unprotect.assert_success();
    assert!(
        unprotect.stdout.contains("no longer protected"),
        "{unprotect}"
    );
    assert_eq!(
        listed(server, repo).await,
        [(ids[0].clone(), false), (ids[2].clone(), false)]
    );
    let pruned = run(
        server,
        &["backup", "prune", "--json", "--keep-last", "1", repo],
    )
    .await;
    pruned.assert_success();
    assert_eq!(parse(&pruned)["deleted"], json!([oldest]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_backups_on_a_directory_repository() {
    let dir = scratch_dir();
    let repo = dir.path().join("repo");
    protected_backups_survive_prune(None, s(&repo), dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_backups_on_an_s3_repository() {
    let server = S3Server::start().await;
    server.create_bucket("backups");
    let dir = scratch_dir();
    protected_backups_survive_prune(Some(&server), "s3://backups/site-a", dir.path()).await;
}
