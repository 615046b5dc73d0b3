//! `ferry backup ...` end to end through the binary: a directory repository through its
//! whole life (init, create, list --json, show, restore, prune --dry-run, prune, gc), an
//! encrypted repository on the in-process S3 server configured from the environment (the
//! passphrase never printed; wrong and missing keys), a restore into a too-small target,
//! and `kill -9` of a running backup followed by a rerun.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ferry_tests::bin::{wait_with_deadline, Run, DEFAULT_DEADLINE};
use ferry_tests::check::{blkhash_file, qemu_img_compare};
use ferry_tests::images::{self, Pattern};
use ferry_tests::nbd_servers::{NbdServer, Nbdkit};
use ferry_tests::s3_server::{S3Server, SECRET_KEY};
use ferry_tests::{ferry, scratch_dir};
use serde_json::Value;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn json(run: &Run) -> Value {
    serde_json::from_str(run.stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {run}"))
}

/// Objects under `dir` (recursively; the directory store's temporary files left out).
fn count_files(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| !e.file_name().to_string_lossy().starts_with(".tmp-"))
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                count_files(&p)
            } else {
                1
            }
        })
        .sum()
}

#[test]
fn directory_repository_lifecycle() {
    let dir = scratch_dir();
    let repo = dir.path().join("repo");
    let img = images::make(
        &dir.path().join("disk.img"),
        Pattern::HalfData,
        16 * 1024 * 1024,
        11,
    )
    .unwrap();
    let ferry = ferry!();
    ferry
        .run(["backup", "init", "--chunk-size", "256K", s(&repo)])
        .assert_success();
    // A second init refuses to overwrite.
    ferry
        .run(["backup", "init", s(&repo)])
        .assert_clean_failure();

    let first = ferry.run([
        "backup",
        "create",
        "--no-progress",
        "--json",
        "--tag",
        "vm=web1",
        s(&img.path),
        s(&repo),
    ]);
    first.assert_success();
    let first = json(&first);
    assert_eq!(first["block_hash"], blkhash_file(&img.path).as_str());
    assert_eq!(first["tags"]["vm"], "web1");
    assert!(
        first["full_reason"]
            .as_str()
            .unwrap()
            .contains("no earlier backup"),
        "{first}"
    );

    // Change 8 KiB of a chunk that holds data, back up again: the parent is found by
    // source, and the chunk's old version becomes garbage once the first backup goes.
    {
        use std::os::unix::fs::FileExt;
        let bytes = std::fs::read(&img.path).unwrap();
        let chunk = bytes
            .chunks(256 * 1024)
            .position(|c| c.iter().any(|&b| b != 0))
            .unwrap();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&img.path)
            .unwrap();
        f.write_all_at(&[0xab; 8192], chunk as u64 * 256 * 1024)
            .unwrap();
    }
    let second = ferry.run([
        "backup",
        "create",
        "--no-progress",
        "--json",
        s(&img.path),
        s(&repo),
    ]);
    second.assert_success();
    let second = json(&second);
    assert_eq!(second["parent"], first["id"]);
    assert_eq!(second["chunks_new"], 1, "{second}");
    assert!(second["full_reason"].is_null());

    let list = ferry.run(["backup", "list", "--json", s(&repo)]);
    list.assert_success();
    let list = json(&list);
    let entries = list.as_array().expect("an array");
    assert_eq!(entries.len(), 2);
    for key in ["id", "time", "size", "source", "parent", "new_bytes"] {
        assert!(
            entries.iter().all(|e| e.get(key).is_some()),
            "{key} missing: {list}"
        );
    }
    assert_eq!(entries[1]["id"], second["id"]);
    assert_eq!(entries[1]["parent"], first["id"]);
    assert_eq!(entries[0]["size"], img.size);
    assert_eq!(entries[0]["source"], s(&img.path));

    let id2 = second["id"].as_str().unwrap();
    let show = ferry.run(["backup", "show", s(&repo), id2]);
    show.assert_success();
    assert_eq!(json(&show)["id"], id2);

    let out = dir.path().join("restored.img");
    let restored = ferry.run([
        "backup",
        "restore",
        "--no-progress",
        "--json",
        s(&repo),
        id2,
        s(&out),
    ]);
    restored.assert_success();
    assert_eq!(json(&restored)["verified"], true);
    qemu_img_compare(&img.path, &out);

    let dry = ferry.run([
        "backup",
        "prune",
        "--keep-last",
        "1",
        "--dry-run",
        "--json",
        s(&repo),
    ]);
    dry.assert_success();
    let dry = json(&dry);
    assert_eq!(dry["remove"][0]["id"], first["id"], "{dry}");
    assert_eq!(dry["keep"][0]["id"], second["id"], "{dry}");
    assert_eq!(dry["deleted"].as_array().unwrap().len(), 0);
    let still = json(&ferry.run(["backup", "list", "--json", s(&repo)]));
    assert_eq!(
        still.as_array().unwrap().len(),
        2,
        "a dry run deletes nothing"
    );

    ferry
        .run(["backup", "prune", "--keep-last", "1", s(&repo)])
        .assert_success();
    let left = json(&ferry.run(["backup", "list", "--json", s(&repo)]));
    assert_eq!(left.as_array().unwrap().len(), 1);
    assert!(!repo
        .join("blockdigests")
        .join(first["id"].as_str().unwrap())
        .exists());

    // The GC's clock has whole seconds: let the unused chunk be older than its start.
    std::thread::sleep(Duration::from_millis(1100));
    let chunks_before = count_files(&repo.join("chunks"));
    let gc = ferry.run(["backup", "gc", "--grace", "0", "--json", s(&repo)]);
    gc.assert_success();
    let gc = json(&gc);
    assert_eq!(
        gc["chunks_removed"], 1,
        "the first backup's version of the changed chunk: {gc}"
    );
    assert_eq!(count_files(&repo.join("chunks")), chunks_before - 1);
    // What is left still restores, here with direct I/O.
    let again = dir.path().join("again.img");
    ferry
        .run([
            "backup",
            "restore",
            "--no-progress",
            "--cache",
            "none",
            s(&repo),
            id2,
            s(&again),
        ])
        .assert_success();
    qemu_img_compare(&img.path, &again);
    ferry.run(["backup", "verify", s(&repo)]).assert_success();
}

#[test]
fn restore_into_a_too_small_target_fails_before_writing() {
    let dir = scratch_dir();
    let repo = dir.path().join("repo");
    let img = images::make(
        &dir.path().join("disk.img"),
        Pattern::Random,
        2 * 1024 * 1024,
        4,
    )
    .unwrap();
    let ferry = ferry!();
    ferry.run(["backup", "init", s(&repo)]).assert_success();
    let made = json(
        ferry
            .run([
                "backup",
                "create",
                "--no-progress",
                "--json",
                s(&img.path),
                s(&repo),
            ])
            .assert_success(),
    );
    let small = dir.path().join("small.img");
    std::fs::write(&small, vec![7u8; 4096]).unwrap();
    let line = ferry
        .run([
            "backup",
            "restore",
            "--no-progress",
            s(&repo),
            made["id"].as_str().unwrap(),
            s(&small),
        ])
        .assert_clean_failure()
        .to_string();
    assert!(line.contains("small.img"), "{line}");
    assert_eq!(
        std::fs::read(&small).unwrap(),
        vec![7u8; 4096],
        "nothing written"
    );
}

/// Runs ferry with the S3 server in the SDK's standard environment and `key` (a key file
/// path) as FERRY_BACKUP_KEY_FILE when given.
async fn run_s3(server: &S3Server, key: Option<&Path>, args: &[&str]) -> Run {
    let mut cmd = ferry!().command(args);
    server.sdk_env(&mut cmd);
    cmd.env_remove("FERRY_BACKUP_KEY_FILE").stdin(Stdio::null());
    if let Some(key) = key {
        cmd.env("FERRY_BACKUP_KEY_FILE", key);
    }
    let description = format!("{cmd:?}");
    let child = cmd.spawn().unwrap();
    tokio::task::spawn_blocking(move || wait_with_deadline(child, DEFAULT_DEADLINE, description))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_s3_repository_never_prints_the_passphrase() {
    const PASSPHRASE: &str = "Tr0ub4dor&3-never-print-me";
    let server = S3Server::start().await;
    server.create_bucket("backups");
    let dir = scratch_dir();
    let key = dir.path().join("key");
    std::fs::write(&key, format!("{PASSPHRASE}\nsecond line ignored\n")).unwrap();
    let wrong = dir.path().join("wrong-key");
    std::fs::write(&wrong, "not-the-passphrase\n").unwrap();
    let img = images::make(
        &dir.path().join("disk.img"),
        Pattern::HalfData,
        8 * 1024 * 1024 + 512,
        6,
    )
    .unwrap();
    let repo = "s3://backups/site-a";
    let mut runs = Vec::new();

    let init = run_s3(&server, Some(&key), &["backup", "init", repo]).await;
    init.assert_success();
    assert!(init.stdout.contains("encrypted"), "{init}");
    let made = run_s3(
        &server,
        Some(&key),
        &[
            "backup",
            "create",
            "--no-progress",
            "--json",
            s(&img.path),
            repo,
        ],
    )
    .await;
    made.assert_success();
    let id = json(&made)["id"].as_str().unwrap().to_string();
    let out = dir.path().join("back.img");
    let restored = run_s3(
        &server,
        Some(&key),
        &["backup", "restore", "--no-progress", repo, &id, s(&out)],
    )
    .await;
    restored.assert_success();
    qemu_img_compare(&img.path, &out);
    runs.extend([init, made, restored]);

    let with_wrong = run_s3(&server, Some(&wrong), &["backup", "list", repo]).await;
    let line = with_wrong.assert_clean_failure();
    assert!(
        line.contains("wrong key") || line.contains("passphrase"),
        "{line}"
    );
    let without = run_s3(&server, None, &["backup", "list", repo]).await;
    let line = without.assert_clean_failure();
    assert!(line.contains("FERRY_BACKUP_KEY_FILE"), "{line}");
    runs.extend([with_wrong, without]);
    for run in &runs {
        assert!(
            !run.stdout.contains(PASSPHRASE) && !run.stderr.contains(PASSPHRASE),
            "{run}"
        );
        assert!(!run.stderr.contains(SECRET_KEY), "{run}");
    }
    // Nothing stored in the bucket holds the passphrase either.
    let mut stack = vec![server.object_path("backups", "site-a")];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else {
            let bytes = std::fs::read(&p).unwrap();
            assert!(
                !bytes
                    .windows(PASSPHRASE.len())
                    .any(|w| w == PASSPHRASE.as_bytes()),
                "{}",
                p.display()
            );
        }
    }
}

#[test]
fn kill_9_mid_backup_leaves_no_backup_and_a_rerun_completes() {
    let dir = scratch_dir();
    let repo = dir.path().join("repo");
    // 64 MiB of random data in 256 KiB chunks, read through nbdkit's delay filter so the
    // backup is still running when it is killed.
    let img = images::make(
        &dir.path().join("disk.img"),
        Pattern::Random,
        64 * 1024 * 1024,
        8,
    )
    .unwrap();
    let server = NbdServer::nbdkit(
        &["file", s(&img.path), "rdelay=20ms"],
        &Nbdkit {
            filters: vec!["delay".into()],
            ..Nbdkit::default()
        },
    );
    let uri = server.uri();
    let ferry = ferry!();
    ferry
        .run(["backup", "init", "--chunk-size", "256K", s(&repo)])
        .assert_success();
    let create = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = [
            "backup",
            "create",
            "--no-progress",
            "--json",
            "--source-id",
            "vm-8",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.extend(extra.iter().map(|a| a.to_string()));
        args.extend([uri.clone(), s(&repo).to_string()]);
        args
    };
    let mut child = ferry.command(create(&["--workers", "2"])).spawn().unwrap();
    let chunks: PathBuf = repo.join("chunks");
    let started = Instant::now();
    while count_files(&chunks) < 16 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the backup ended before it could be killed"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the backup stored nothing in 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let stored = count_files(&chunks);

    let list = json(
        ferry
            .run(["backup", "list", "--json", s(&repo)])
            .assert_success(),
    );
    assert_eq!(
        list.as_array().unwrap().len(),
        0,
        "a killed backup is not listed"
    );
    assert_eq!(count_files(&repo.join("snapshots")), 0);

    let rerun = ferry.run(create(&["--workers", "8"]));
    rerun.assert_success();
    let rerun = json(&rerun);
    let reused = rerun["chunks_reused"].as_u64().unwrap();
    assert!(
        reused as usize >= stored,
        "the rerun reuses what the killed run stored ({stored}): {rerun}"
    );
    assert_eq!(
        rerun["chunks_new"].as_u64().unwrap() + reused,
        256,
        "{rerun}"
    );
    assert_eq!(rerun["block_hash"], blkhash_file(&img.path).as_str());
}
