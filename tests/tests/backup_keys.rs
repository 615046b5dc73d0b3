//! `ferry backup key ...` end to end through the binary, on a directory repository and on
//! the in-process S3 server: keys added, listed (`--json` shape), removed and rotated,
//! with every restore compared byte for byte before and after; the refusals (the key in
//! use, an unknown key, the passphrase in use as the new one, a new master key while
//! other keys exist); `rotate --master` (old backups still restore, new ones no longer
//! deduplicate against them); a repository written by ferry before key objects
//! (tests/fixtures/legacy-v2-encrypted) opening, restoring and migrating; and `kill -9`
//! at points spread over a whole rotation, after each of which the old or the new key
//! opens the repository and restores it exactly. No passphrase ever reaches the output.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use ferry_tests::bin::{wait_with_deadline, Run, DEFAULT_DEADLINE};
use ferry_tests::images::{self, Pattern};
use ferry_tests::s3_server::S3Server;
use ferry_tests::{ferry, scratch_dir};
use serde_json::Value;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn json(run: &Run) -> Value {
    serde_json::from_str(run.stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {run}"))
}

/// A repository under test: a directory, or a prefix on the S3 server.
struct Repo<'a> {
    url: String,
    server: Option<&'a S3Server>,
    /// Where its chunk objects are, on disk.
    chunks: PathBuf,
    /// Every run, to check that no passphrase was ever printed.
    runs: std::sync::Mutex<Vec<Run>>,
}

impl Repo<'_> {
    /// Runs ferry with `key` as FERRY_BACKUP_KEY_FILE.
    async fn run(&self, key: &Path, args: &[&str]) -> Run {
        let mut cmd = ferry!().command(args);
        if let Some(server) = self.server {
            server.sdk_env(&mut cmd);
        }
        cmd.env("FERRY_BACKUP_KEY_FILE", key).stdin(Stdio::null());
        let description = format!("{cmd:?}");
        let child = cmd.spawn().unwrap();
        let run = tokio::task::spawn_blocking(move || {
            wait_with_deadline(child, DEFAULT_DEADLINE, description)
        })
        .await
        .unwrap();
        self.runs.lock().unwrap().push(Run {
            description: run.description.clone(),
            status: run.status,
            elapsed: run.elapsed,
            stdout: run.stdout.clone(),
            stderr: run.stderr.clone(),
        });
        run
    }

    /// Restores `id` with `key` and checks it is byte for byte the image.
    async fn restore_exact(&self, key: &Path, id: &str, image: &Path, out: &Path) {
        let _ = std::fs::remove_file(out);
        self.run(
            key,
            &["backup", "restore", "--no-progress", &self.url, id, s(out)],
        )
        .await
        .assert_success();
        assert!(
            std::fs::read(image).unwrap() == std::fs::read(out).unwrap(),
            "backup {id} restored with {} differs from {}",
            key.display(),
            image.display()
        );
    }

    async fn backup(&self, key: &Path, image: &Path) -> Value {
        let run = self
            .run(
                key,
                &[
                    "backup",
                    "create",
                    "--no-progress",
                    "--json",
                    "--source-id",
                    "disk",
                    s(image),
                    &self.url,
                ],
            )
            .await;
        run.assert_success();
        json(&run)
    }

    async fn keys(&self, key: &Path) -> Vec<Value> {
        let run = self
            .run(key, &["backup", "key", "list", "--json", &self.url])
            .await;
        run.assert_success();
        json(&run).as_array().unwrap().clone()
    }

    /// The repository's chunk object names, sorted.
    fn chunk_names(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![self.chunks.clone()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if e.path().is_dir() {
                    stack.push(e.path());
                } else if name.len() == 64 {
                    out.push(name);
                }
            }
        }
        out.sort();
        out
    }
}

/// Writes a key file holding `passphrase`.
fn key_file(dir: &Path, name: &str, passphrase: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{passphrase}\n")).unwrap();
    path
}

fn assert_key_shape(key: &Value) {
    let id = key["id"].as_str().unwrap_or_else(|| panic!("{key}"));
    assert!(
        id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{key}"
    );
    assert!(
        key["created"].is_string() || key["created"].is_null(),
        "{key}"
    );
    assert_eq!(key["kdf"]["algorithm"], "argon2id", "{key}");
    assert!(key["kdf"]["memory_kib"].is_u64(), "{key}");
    assert!(key["current"].is_boolean(), "{key}");
    assert!(key["master_key"].is_string(), "{key}");
    assert!(key["master_keys"].is_array(), "{key}");
    let fields: Vec<&String> = key.as_object().unwrap().keys().collect();
    assert_eq!(
        fields,
        [
            "created",
            "current",
            "id",
            "kdf",
            "master_key",
            "master_keys"
        ],
        "{key}"
    );
}

const PASSPHRASES: [&str; 5] = [
    "first-passphrase-A1",
    "second-passphrase-B2",
    "third-passphrase-C3",
    "fourth-passphrase-D4",
    "fifth-passphrase-E5",
];

/// The whole life of a repository's keys, on `repo`.
async fn key_lifecycle(repo: &Repo<'_>, dir: &Path) {
    let [a, b, c, d, e] = PASSPHRASES.map(|p| key_file(dir, &p[..6], p));
    let image = images::make(&dir.join("disk.img"), Pattern::HalfData, 4 << 20, 21).unwrap();
    let out = dir.join("restored.img");
    repo.run(&a, &["backup", "init", "--chunk-size", "256K", &repo.url])
        .await
        .assert_success();
    let first = repo.backup(&a, &image.path).await;
    let first_id = first["id"].as_str().unwrap().to_string();
    repo.restore_exact(&a, &first_id, &image.path, &out).await;
    let keys = repo.keys(&a).await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_key_shape(&keys[0]);
    assert_eq!(keys[0]["current"], true);
    let a_id = keys[0]["id"].as_str().unwrap().to_string();

    // add: both keys open the repository and restore the same bytes.
    let added = repo
        .run(
            &a,
            &[
                "backup",
                "key",
                "add",
                "--json",
                "--new-key-file",
                s(&b),
                &repo.url,
            ],
        )
        .await;
    added.assert_success();
    let added = json(&added);
    assert_key_shape(&added);
    assert_eq!(added["current"], false);
    let b_id = added["id"].as_str().unwrap().to_string();
    repo.restore_exact(&b, &first_id, &image.path, &out).await;
    let keys = repo.keys(&b).await;
    assert_eq!(keys.len(), 2, "{keys:?}");
    keys.iter().for_each(assert_key_shape);
    let current: Vec<&str> = keys
        .iter()
        .filter(|k| k["current"] == true)
        .map(|k| k["id"].as_str().unwrap())
        .collect();
    assert_eq!(current, [b_id.as_str()]);

    // remove: refused for the key in use and for an unknown key, then removes A.
    let line = repo
        .run(&b, &["backup", "key", "remove", &repo.url, &b_id])
        .await
        .assert_clean_failure()
        .to_string();
    assert!(line.contains("cannot remove itself"), "{line}");
    let line = repo
        .run(
            &b,
            &["backup", "key", "remove", &repo.url, "0123456789abcdef"],
        )
        .await
        .assert_clean_failure()
        .to_string();
    assert!(line.contains("has no key 0123456789abcdef"), "{line}");
    let removed = repo
        .run(&b, &["backup", "key", "remove", "--json", &repo.url, &a_id])
        .await;
    removed.assert_success();
    assert_eq!(
        json(&removed),
        serde_json::json!({"removed": a_id, "keys": 1})
    );
    let line = repo
        .run(&a, &["backup", "list", &repo.url])
        .await
        .assert_clean_failure()
        .to_string();
    assert!(line.contains("wrong passphrase"), "{line}");
    repo.restore_exact(&b, &first_id, &image.path, &out).await;

    // rotate: B replaced by C, no chunk rewritten, dedup continues.
    let chunks = repo.chunk_names();
    let line = repo
        .run(
            &b,
            &[
                "backup",
                "key",
                "rotate",
                "--new-key-file",
                s(&b),
                &repo.url,
            ],
        )
        .await
        .assert_clean_failure()
        .to_string();
    assert!(line.contains("the one in use"), "{line}");
    let rotated = repo
        .run(
            &b,
            &[
                "backup",
                "key",
                "rotate",
                "--json",
                "--new-key-file",
                s(&c),
                &repo.url,
            ],
        )
        .await;
    rotated.assert_success();
    let rotated = json(&rotated);
    assert_eq!(rotated["removed"], b_id.as_str());
    assert_key_shape(&rotated["added"]);
    assert!(rotated["new_master_key"].is_null(), "{rotated}");
    assert_eq!(repo.chunk_names(), chunks, "a rotation rewrote chunks");
    repo.run(&b, &["backup", "list", &repo.url])
        .await
        .assert_clean_failure();
    repo.restore_exact(&c, &first_id, &image.path, &out).await;
    let second = repo.backup(&c, &image.path).await;
    assert_eq!(second["chunks_new"], 0, "{second}");
    assert_eq!(second["parent"], first_id.as_str(), "{second}");

    // rotate --master: refused while another key exists.
    let other = repo
        .run(
            &c,
            &[
                "backup",
                "key",
                "add",
                "--json",
                "--new-key-file",
                s(&e),
                &repo.url,
            ],
        )
        .await;
    other.assert_success();
    let e_id = json(&other)["id"].as_str().unwrap().to_string();
    let line = repo
        .run(
            &c,
            &[
                "backup",
                "key",
                "rotate",
                "--master",
                "--new-key-file",
                s(&d),
                &repo.url,
            ],
        )
        .await
        .assert_clean_failure()
        .to_string();
    assert!(
        line.contains(&e_id) && line.contains("remove them first"),
        "{line}"
    );
    repo.run(&c, &["backup", "key", "remove", &repo.url, &e_id])
        .await
        .assert_success();
    let rotated = repo
        .run(
            &c,
            &[
                "backup",
                "key",
                "rotate",
                "--master",
                "--json",
                "--new-key-file",
                s(&d),
                &repo.url,
            ],
        )
        .await;
    rotated.assert_success();
    let rotated = json(&rotated);
    let new_master = rotated["new_master_key"].as_str().unwrap().to_string();
    assert_eq!(rotated["added"]["master_key"], new_master.as_str());
    assert_eq!(rotated["added"]["master_keys"].as_array().unwrap().len(), 2);
    assert_eq!(
        repo.chunk_names(),
        chunks,
        "a new master key rewrote chunks"
    );
    // New data: encrypted with the new master key, not deduplicated against the old.
    let third = repo.backup(&d, &image.path).await;
    assert!(
        third["full_reason"]
            .as_str()
            .unwrap()
            .contains("earlier master key"),
        "{third}"
    );
    assert_eq!(third["chunks_new"], first["chunks_new"], "{third}");
    let third_id = third["id"].as_str().unwrap().to_string();
    for id in [&first_id, second["id"].as_str().unwrap(), &third_id] {
        repo.restore_exact(&d, id, &image.path, &out).await;
    }
    // The next backup deduplicates against the new master key's chunks again.
    let fourth = repo.backup(&d, &image.path).await;
    assert_eq!(fourth["chunks_new"], 0, "{fourth}");
    assert_eq!(fourth["parent"], third_id.as_str(), "{fourth}");
    for key in [&a, &b, &c] {
        repo.run(key, &["backup", "list", &repo.url])
            .await
            .assert_clean_failure();
    }

    for run in repo.runs.lock().unwrap().iter() {
        for p in PASSPHRASES {
            assert!(
                !run.stdout.contains(p) && !run.stderr.contains(p),
                "a passphrase was printed: {run}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_on_a_directory_repository() {
    let dir = scratch_dir();
    let path = dir.path().join("repo");
    let repo = Repo {
        url: s(&path).to_string(),
        server: None,
        chunks: path.join("chunks"),
        runs: Default::default(),
    };
    key_lifecycle(&repo, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_on_an_s3_repository() {
    let server = S3Server::start().await;
    server.create_bucket("backups");
    let dir = scratch_dir();
    let repo = Repo {
        url: "s3://backups/site-a".to_string(),
        server: Some(&server),
        chunks: server.object_path("backups", "site-a/chunks"),
        runs: Default::default(),
    };
    key_lifecycle(&repo, dir.path()).await;
    // Nothing stored holds a passphrase.
    let mut stack = vec![server.object_path("backups", "site-a")];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else {
            let bytes = std::fs::read(&p).unwrap();
            for pass in PASSPHRASES {
                assert!(
                    !bytes.windows(pass.len()).any(|w| w == pass.as_bytes()),
                    "{}",
                    p.display()
                );
            }
        }
    }
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/legacy-v2-encrypted")
}

/// The image the fixture's backup holds: `seq 1 30000`, cut or padded to 256 KiB.
fn fixture_image(path: &Path) {
    let mut data: Vec<u8> = (1..=30000)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect();
    data.resize(256 << 10, 0);
    std::fs::write(path, data).unwrap();
}

const FIXTURE_BACKUP: &str = "20261205T184126Z-1824382e";

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.path().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

fn config_version(repo: &Path) -> u64 {
    let config: Value =
        serde_json::from_slice(&std::fs::read(repo.join("config")).unwrap()).unwrap();
    config["format_version"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_a_repository_written_before_key_objects() {
    let dir = scratch_dir();
    let path = dir.path().join("repo");
    copy_dir(&fixture().join("repo"), &path);
    let old = fixture().join("key");
    let new = key_file(dir.path(), "new", "a-key-added-later");
    let image = dir.path().join("img.raw");
    fixture_image(&image);
    let out = dir.path().join("out.img");
    let repo = Repo {
        url: s(&path).to_string(),
        server: None,
        chunks: path.join("chunks"),
        runs: Default::default(),
    };
    assert_eq!(config_version(&path), 2);
    // It opens and restores as it is; listing its key changes nothing.
    repo.restore_exact(&old, FIXTURE_BACKUP, &image, &out).await;
    let keys = repo.keys(&old).await;
    assert_eq!(keys.len(), 1);
    assert_key_shape(&keys[0]);
    assert!(keys[0]["created"].is_null());
    let old_id = keys[0]["id"].as_str().unwrap().to_string();
    assert_eq!(config_version(&path), 2);
    // Its first key change moves it to key objects; the old key keeps its id.
    repo.run(
        &old,
        &["backup", "key", "add", "--new-key-file", s(&new), &repo.url],
    )
    .await
    .assert_success();
    assert_eq!(config_version(&path), 3);
    for key in [&old, &new] {
        repo.restore_exact(key, FIXTURE_BACKUP, &image, &out).await;
        let ids: Vec<String> = repo
            .keys(key)
            .await
            .iter()
            .map(|k| k["id"].as_str().unwrap().to_string())
            .collect();
        assert!(ids.contains(&old_id), "{ids:?}");
    }
    // A backup made now deduplicates against the old backup's chunks (same master key).
    let made = repo.backup(&new, &image).await;
    assert_eq!(made["chunks_new"], 0, "{made}");
}

/// Whether `key` opens the repository at `url`; if so, the backup restores exactly.
fn opens_and_restores(url: &str, key: &Path, image: &Path, out: &Path) -> bool {
    let list = ferry!()
        .command(["backup", "list", url])
        .env("FERRY_BACKUP_KEY_FILE", key)
        .output()
        .unwrap();
    if !list.status.success() {
        let err = String::from_utf8_lossy(&list.stderr);
        assert!(err.contains("wrong passphrase"), "{err}");
        return false;
    }
    let _ = std::fs::remove_file(out);
    let restored = ferry!()
        .command([
            "backup",
            "restore",
            "--no-progress",
            url,
            FIXTURE_BACKUP,
            s(out),
        ])
        .env("FERRY_BACKUP_KEY_FILE", key)
        .output()
        .unwrap();
    assert!(restored.status.success(), "{restored:?}");
    assert!(std::fs::read(image).unwrap() == std::fs::read(out).unwrap());
    true
}

/// `kill -9` of `key rotate` (with a migration of the fixture's format 2 repository
/// first, and with and without --master) at points spread over the whole run, until a
/// run finishes before its kill: the old or the new key always opens the repository, and
/// it restores exactly. (The unit tests of ferry-backup's key_admin stop a rotation at
/// each of its writes, before and after it, deterministically.)
#[test]
fn kill_9_at_every_point_of_a_rotation_leaves_a_repository_the_old_or_new_key_opens() {
    let dir = scratch_dir();
    let old = fixture().join("key");
    let new = key_file(dir.path(), "new", "the-new-passphrase");
    let image = dir.path().join("img.raw");
    fixture_image(&image);
    let out = dir.path().join("out.img");
    for master in [false, true] {
        let rotate = |path: &Path| {
            let mut args = vec!["backup", "key", "rotate", "--new-key-file", s(&new)];
            if master {
                args.push("--master");
            }
            let mut cmd = ferry!().command(args.iter().chain([&s(path)]));
            cmd.env("FERRY_BACKUP_KEY_FILE", &old);
            cmd
        };
        // How long a whole rotation takes here.
        let path = dir.path().join("whole");
        let _ = std::fs::remove_dir_all(&path);
        copy_dir(&fixture().join("repo"), &path);
        let started = Instant::now();
        let whole = rotate(&path).output().unwrap();
        assert!(whole.status.success(), "{whole:?}");
        let total = started.elapsed();
        // Kill points a tenth of a whole run apart, later and later, until a run ends
        // before its kill: on a loaded machine a run may take longer than the first.
        let (mut old_only, mut new_only, mut both) = (0, 0, 0);
        let mut finished = false;
        for step in 0..100u32 {
            let path = dir.path().join(format!("r{step}"));
            let _ = std::fs::remove_dir_all(&path);
            copy_dir(&fixture().join("repo"), &path);
            let mut child = rotate(&path)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let delay = total * step / 10;
            std::thread::sleep(delay);
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "--master {master}: the rotation failed");
                finished = true;
            } else {
                let _ = child.kill(); // SIGKILL
                let _ = child.wait();
            }
            let with_old = opens_and_restores(s(&path), &old, &image, &out);
            let with_new = opens_and_restores(s(&path), &new, &image, &out);
            assert!(
                with_old || with_new,
                "--master {master}: killed after {delay:?} (a whole run took {total:?}): neither key opens"
            );
            match (with_old, with_new) {
                (true, false) => old_only += 1,
                (false, true) => new_only += 1,
                _ => both += 1,
            }
            if finished {
                assert!(
                    with_new && !with_old,
                    "--master {master}: a finished rotation"
                );
                break;
            }
        }
        assert!(finished, "--master {master}: no rotation finished");
        // The first kill, at once, lands before anything was written.
        assert!(old_only > 0, "old {old_only}, new {new_only}, both {both}");
    }
}
