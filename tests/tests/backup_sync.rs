//! `ferry backup sync`: replication between repositories, through the binary. A
//! directory repository into an encrypted S3 one with its own key (chunks re-encrypted),
//! an S3 repository into a directory made with `init --from` (chunks sent as stored);
//! restores from the copies byte-exact; a second sync copying nothing; an incremental
//! backup in the destination on top of a copy; `--remove-vanished`; differing chunk
//! sizes refused; a damaged chunk in the source refused, not copied; `kill -9` mid-sync
//! and a resumed sync that completes; an immutable destination (Object Lock on moto).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferry_backup::ObjectStore;
use ferry_tests::bin::{wait_with_deadline, Run, DEFAULT_DEADLINE};
use ferry_tests::check::qemu_img_compare;
use ferry_tests::images::{make, Pattern};
use ferry_tests::moto_server::MotoServer;
use ferry_tests::s3_server::S3Server;
use ferry_tests::{ferry, scratch_dir};
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn json(run: &Run) -> Value {
    serde_json::from_str(run.stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {run}"))
}

/// The environment of one ferry run: an S3 server (or none) and the key files.
#[derive(Clone, Copy, Default)]
struct Env<'a> {
    s3: Option<&'a S3Server>,
    moto: Option<(&'a MotoServer, &'a Path)>,
    key: Option<&'a Path>,
    dest_key: Option<&'a Path>,
}

impl Env<'_> {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = ferry!().command(args);
        if let Some(server) = self.s3 {
            server.sdk_env(&mut cmd);
        }
        if let Some((moto, scratch)) = self.moto {
            moto.sdk_env(&mut cmd, scratch);
        }
        cmd.env_remove("FERRY_BACKUP_KEY_FILE")
            .env_remove("FERRY_BACKUP_DEST_KEY_FILE")
            .stdin(Stdio::null());
        if let Some(key) = self.key {
            cmd.env("FERRY_BACKUP_KEY_FILE", key);
        }
        if let Some(key) = self.dest_key {
            cmd.env("FERRY_BACKUP_DEST_KEY_FILE", key);
        }
        cmd
    }

    /// Runs ferry to the end (off the async threads: the S3 server may be in-process).
    async fn run(&self, args: &[&str]) -> Run {
        let cmd = self.command(args);
        run_command(cmd).await
    }
}

async fn run_command(mut cmd: Command) -> Run {
    let description = format!("{cmd:?}");
    let child = cmd.spawn().unwrap();
    tokio::task::spawn_blocking(move || wait_with_deadline(child, DEFAULT_DEADLINE, description))
        .await
        .unwrap()
}

/// Backs `image` up into `repo`; returns the `--json` summary.
async fn back_up(env: Env<'_>, image: &Path, repo: &str) -> Value {
    let run = env
        .run(&[
            "backup",
            "create",
            "--no-progress",
            "--json",
            s(image),
            repo,
        ])
        .await;
    run.assert_success();
    json(&run)
}

async fn sync(env: Env<'_>, args: &[&str]) -> Value {
    let mut all = vec!["backup", "sync", "--json"];
    all.extend_from_slice(args);
    let run = env.run(&all).await;
    run.assert_success();
    json(&run)
}

/// Restores backup `id` of `repo` and compares it with `image`.
async fn restores_exact(env: Env<'_>, dir: &Path, repo: &str, id: &str, image: &Path) {
    let out = dir.join(format!("restored-{id}.img"));
    let _ = std::fs::remove_file(&out);
    env.run(&["backup", "restore", "--no-progress", repo, id, s(&out)])
        .await
        .assert_success();
    qemu_img_compare(image, &out);
    std::fs::remove_file(&out).unwrap();
}

async fn listed(env: Env<'_>, repo: &str) -> Vec<String> {
    let run = env.run(&["backup", "list", "--json", repo]).await;
    run.assert_success();
    json(&run)
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_str().unwrap().to_string())
        .collect()
}

/// Writes 8 KiB of `byte` into the first data chunk's range, to make the next backup
/// differ by one chunk.
fn change_one_chunk(path: &Path, chunk: u64, byte: u8) {
    use std::os::unix::fs::FileExt;
    let bytes = std::fs::read(path).unwrap();
    let at = bytes
        .chunks(chunk as usize)
        .position(|c| c.iter().any(|&b| b != 0))
        .unwrap() as u64
        * chunk;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&[byte; 8192], at).unwrap();
}

fn key_file(dir: &Path, name: &str, passphrase: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{passphrase}\n")).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_repository_syncs_into_s3_with_its_own_key() {
    let server = S3Server::start().await;
    server.create_bucket("offsite");
    let dir = scratch_dir();
    let key_a = key_file(dir.path(), "a", "source-passphrase");
    let key_b = key_file(dir.path(), "b", "destination-passphrase");
    let src = dir.path().join("src");
    let src = s(&src).to_string();
    let dst = "s3://offsite/copy";
    let on_src = Env {
        key: Some(&key_a),
        ..Env::default()
    };
    let both = Env {
        s3: Some(&server),
        key: Some(&key_a),
        dest_key: Some(&key_b),
        ..Env::default()
    };
    let on_dst = Env {
        s3: Some(&server),
        key: Some(&key_b),
        ..Env::default()
    };
    on_src
        .run(&["backup", "init", "--chunk-size", "256K", &src])
        .await
        .assert_success();
    on_dst
        .run(&["backup", "init", "--chunk-size", "256K", dst])
        .await
        .assert_success();

    let image = dir.path().join("disk.img");
    make(&image, Pattern::HalfData, 12 * MIB + 4096, 3).unwrap();
    let first_image = dir.path().join("first.img");
    std::fs::copy(&image, &first_image).unwrap();
    let first = back_up(on_src, &image, &src).await;
    change_one_chunk(&image, 256 << 10, 0xab);
    let second = back_up(on_src, &image, &src).await;
    assert_eq!(second["parent"], first["id"]);
    let ids = [
        first["id"].as_str().unwrap().to_string(),
        second["id"].as_str().unwrap().to_string(),
    ];

    let synced = sync(both, &[&src, dst]).await;
    assert_eq!(synced["backups_copied"], 2, "{synced}");
    assert_eq!(synced["same_keys"], false, "{synced}");
    let data_chunks = first["chunks_new"].as_u64().unwrap();
    // The second backup's one changed chunk is new; the rest came with the first.
    assert_eq!(
        synced["chunks_copied"].as_u64().unwrap(),
        data_chunks + 1,
        "{synced}"
    );
    assert_eq!(listed(on_dst, dst).await, ids.to_vec());
    restores_exact(on_dst, dir.path(), dst, &ids[0], &first_image).await;
    restores_exact(on_dst, dir.path(), dst, &ids[1], &image).await;

    // Nothing left to copy.
    let again = sync(both, &[&src, dst]).await;
    assert_eq!(again["backups_copied"], 0, "{again}");
    assert_eq!(again["chunks_copied"], 0, "{again}");
    assert_eq!(again["backups_present"], 2, "{again}");

    // An incremental backup in the destination builds on the copy: its block digests
    // came along, so only the changed chunk is new.
    change_one_chunk(&image, 256 << 10, 0xcd);
    let on_copy = back_up(on_dst, &image, dst).await;
    assert_eq!(on_copy["parent"], second["id"], "{on_copy}");
    assert!(on_copy["full_reason"].is_null(), "{on_copy}");
    assert_eq!(on_copy["chunks_new"], 1, "{on_copy}");

    // The source prunes its first backup; --remove-vanished removes its copy. The
    // destination's own backup is not in the source either, but it is protected: it stays.
    on_src
        .run(&["backup", "prune", "--keep-last", "1", &src])
        .await
        .assert_success();
    let own = on_copy["id"].as_str().unwrap().to_string();
    on_dst
        .run(&["backup", "protect", dst, &own])
        .await
        .assert_success();
    let pruned = sync(both, &["--remove-vanished", &src, dst]).await;
    assert_eq!(pruned["removed"], serde_json::json!([ids[0]]), "{pruned}");
    assert_eq!(listed(on_dst, dst).await, vec![ids[1].clone(), own]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_repository_syncs_into_a_directory_sharing_its_keys() {
    let server = S3Server::start().await;
    server.create_bucket("primary");
    let dir = scratch_dir();
    let key = key_file(dir.path(), "key", "shared-passphrase");
    let src = "s3://primary/vms";
    let dst = dir.path().join("copy");
    let dst = s(&dst).to_string();
    let env = Env {
        s3: Some(&server),
        key: Some(&key),
        ..Env::default()
    };
    env.run(&["backup", "init", "--chunk-size", "256K", src])
        .await
        .assert_success();
    let image = dir.path().join("disk.img");
    make(&image, Pattern::HalfData, 10 * MIB, 9).unwrap();
    let made = back_up(env, &image, src).await;
    let id = made["id"].as_str().unwrap().to_string();

    // init --from needs no key; the copy opens with the source's passphrase.
    let no_key = Env {
        s3: Some(&server),
        ..Env::default()
    };
    let init = no_key.run(&["backup", "init", &dst, "--from", src]).await;
    init.assert_success();
    assert!(init.stdout.contains("sharing the keys"), "{init}");
    let synced = sync(env, &[src, &dst]).await;
    assert_eq!(synced["backups_copied"], 1, "{synced}");
    assert_eq!(synced["same_keys"], true, "{synced}");
    assert_eq!(synced["chunks_copied"], made["chunks_new"], "{synced}");
    // Sent as stored: the chunk objects are byte for byte the source's.
    let stored = |root: &Path| {
        let mut files = Vec::new();
        for d in std::fs::read_dir(root.join("chunks")).unwrap() {
            for f in std::fs::read_dir(d.unwrap().path()).unwrap() {
                let p = f.unwrap().path();
                files.push((
                    p.file_name().unwrap().to_string_lossy().into_owned(),
                    std::fs::read(&p).unwrap(),
                ));
            }
        }
        files.sort();
        files
    };
    assert_eq!(
        stored(Path::new(&dst)),
        stored(&server.object_path("primary", "vms"))
    );
    restores_exact(env, dir.path(), &dst, &id, &image).await;
    let again = sync(env, &[src, &dst]).await;
    assert_eq!(again["backups_copied"], 0, "{again}");

    // A destination with another chunk size is refused before anything is written.
    let other = dir.path().join("other");
    env.run(&["backup", "init", "--chunk-size", "64K", s(&other)])
        .await
        .assert_success();
    let refused = env.run(&["backup", "sync", src, s(&other)]).await;
    let message = refused.assert_clean_failure();
    assert!(
        message.contains("chunk size") && message.contains("256 KiB"),
        "{message}"
    );
    assert!(listed(env, s(&other)).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_chunk_in_the_source_is_refused_not_copied() {
    let dir = scratch_dir();
    let src = dir.path().join("src");
    let dst = dir.path().join("dst");
    let env = Env::default();
    for repo in [&src, &dst] {
        env.run(&["backup", "init", "--chunk-size", "256K", s(repo)])
            .await
            .assert_success();
    }
    let image = dir.path().join("disk.img");
    make(&image, Pattern::HalfData, 8 * MIB, 4).unwrap();
    let id = back_up(env, &image, s(&src)).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Flip a byte in the middle of one stored chunk.
    let bucket = std::fs::read_dir(src.join("chunks"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let victim = std::fs::read_dir(&bucket)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&victim).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&victim, &bytes).unwrap();

    let run = env.run(&["backup", "sync", s(&src), s(&dst)]).await;
    let message = run.assert_clean_failure();
    assert!(message.contains(&id), "{message}");
    assert!(
        message.contains("damaged") || message.contains("does not match"),
        "{message}"
    );
    assert!(listed(env, s(&dst)).await.is_empty());
    let name = victim.file_name().unwrap();
    let copy = dst
        .join("chunks")
        .join(bucket.file_name().unwrap())
        .join(name);
    assert!(!copy.exists(), "the damaged chunk was copied");
}

/// Chunk objects under a directory repository.
fn chunk_files(repo: &Path) -> usize {
    let Ok(dirs) = std::fs::read_dir(repo.join("chunks")) else {
        return 0;
    };
    dirs.filter_map(|d| d.ok())
        .filter_map(|d| std::fs::read_dir(d.path()).ok())
        .flat_map(|f| f.filter_map(|e| e.ok()))
        .filter(|e| !e.file_name().to_string_lossy().starts_with(".tmp"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_killed_mid_way_resumes_and_completes() {
    let dir = scratch_dir();
    let src = dir.path().join("src");
    let dst = dir.path().join("dst");
    let env = Env::default();
    for repo in [&src, &dst] {
        env.run(&["backup", "init", "--chunk-size", "256K", s(repo)])
            .await
            .assert_success();
    }
    let image = dir.path().join("disk.img");
    make(&image, Pattern::HalfData, 32 * MIB, 17).unwrap();
    let made = back_up(env, &image, s(&src)).await;
    let id = made["id"].as_str().unwrap().to_string();
    let total = made["chunks_new"].as_u64().unwrap();

    // About 16 MiB to send at 2 MiB/s: killed once a quarter of the chunks are in.
    let mut cmd = env.command(&["backup", "sync", "--limit-rate", "2M", s(&src), s(&dst)]);
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while chunk_files(&dst) < (total / 4) as usize {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the sync ended before it was killed"
        );
        assert!(Instant::now() < deadline, "the sync sent too little");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let sent = chunk_files(&dst) as u64;
    assert!(sent < total, "all {total} chunks were sent before the kill");
    // The destination does not show the backup whose chunks are not all there.
    assert!(listed(env, s(&dst)).await.is_empty());

    let resumed = sync(env, &[s(&src), s(&dst)]).await;
    assert_eq!(resumed["backups_copied"], 1, "{resumed}");
    let copied = resumed["chunks_copied"].as_u64().unwrap();
    assert!(
        copied < total && copied + sent >= total,
        "resumed sent {copied} of {total} chunks, {sent} were in: {resumed}"
    );
    restores_exact(env, dir.path(), s(&dst), &id, &image).await;
    let verified = env.run(&["backup", "verify", s(&dst)]).await;
    verified.assert_success();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_immutable_destination_on_object_lock_takes_a_sync() {
    let moto = MotoServer::start();
    moto.create_locked_bucket("vault");
    let dir = scratch_dir();
    let src = dir.path().join("src");
    let dst = "s3://vault/copy";
    let env = Env {
        moto: Some((&moto, dir.path())),
        ..Env::default()
    };
    env.run(&["backup", "init", "--chunk-size", "256K", s(&src)])
        .await
        .assert_success();
    env.run(&[
        "backup",
        "init",
        dst,
        "--from",
        s(&src),
        "--immutable-days",
        "1",
    ])
    .await
    .assert_success();
    let image = dir.path().join("disk.img");
    make(&image, Pattern::HalfData, 6 * MIB, 2).unwrap();
    let id = back_up(env, &image, s(&src)).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let synced = sync(env, &[s(&src), dst]).await;
    assert_eq!(synced["backups_copied"], 1, "{synced}");
    restores_exact(env, dir.path(), dst, &id, &image).await;
    let again = sync(env, &[s(&src), dst]).await;
    assert_eq!(again["backups_copied"], 0, "{again}");
    assert_eq!(again["chunks_copied"], 0, "{again}");
    // What the sync wrote is retained: the copy's manifest version cannot be destroyed.
    let store = ferry_backup::S3Store::connect("vault", "copy", &moto.options()).await;
    let versions = store.list_versions("snapshots/").await.unwrap();
    let manifest = versions
        .iter()
        .find(|v| v.name.contains(&id) && !v.delete_marker)
        .unwrap_or_else(|| panic!("no version of the copy's manifest: {versions:?}"));
    let err = store
        .delete_version(&manifest.name, &manifest.version_id)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ferry_core::ErrorKind::PermissionDenied, "{err}");
    assert_eq!(listed(env, dst).await, vec![id]);
}
