//! `ferry job backup|restore|repo-verify|prune|gc|snapshots` against a `ferry-e2e serve`
//! process: an encrypted directory repository whose key is a file on the server, two
//! backups (the second incremental), the listing, restores checked with `qemu-img
//! compare` and the block hash, a verify, a prune dry run and a real one, a GC that frees
//! what the pruned backup alone used, and bad input refused with one clear line and a
//! non-zero exit. Every `--json` output is parsed.

use std::path::{Path, PathBuf};

use ferry_tests::bin::Run;
use ferry_tests::check::{blkhash_file, qemu_img_compare};
use ferry_tests::images::{self, Pattern};
use ferry_tests::service_support::{make_image, ServeProcess};
use ferry_tests::{ferry, scratch_dir};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-e2e");
const MIB: u64 = 1024 * 1024;
const PASSPHRASE: &str = "correct horse battery staple";

struct Server {
    _dir: tempfile::TempDir,
    root: PathBuf,
    serve: ServeProcess,
}

fn server() -> Server {
    let dir = scratch_dir();
    let root = dir.path().join("images");
    let secrets = dir.path().join("secrets");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&secrets).unwrap();
    std::fs::write(secrets.join("repo-key"), format!("{PASSPHRASE}\n")).unwrap();
    let args: Vec<String> = [
        "--data-dir",
        &dir.path().join("data").display().to_string(),
        "--allow-root",
        &root.display().to_string(),
        "--secrets-dir",
        &secrets.display().to_string(),
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    let serve = ServeProcess::start(Path::new(BIN), &args, &[]);
    Server {
        _dir: dir,
        root,
        serve,
    }
}

impl Server {
    /// `ferry job --server ... ARGS`.
    fn job(&self, args: &[&str]) -> Run {
        let server = format!("http://{}", self.serve.grpc);
        let mut all = vec!["job", "--server", server.as_str()];
        all.extend_from_slice(args);
        ferry!().run(all)
    }

    /// Runs a job command with `--watch --json`; it must succeed. Returns the final job.
    fn watched(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["--watch", "--json"]);
        let run = self.job(&all);
        run.assert_success();
        let job = last_json(&run);
        assert_eq!(job["state"], "succeeded", "{run}");
        job
    }
}

/// The last line of a run's stdout, parsed (`--watch --json` prints a line per state).
fn last_json(run: &Run) -> Value {
    let line = run
        .stdout
        .lines()
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or_else(|| panic!("no output: {run}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {run}"))
}

fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn backup_list_restore_verify_prune_and_gc_through_ferry_job() {
    let srv = server();
    let repo_dir = s(&srv.root.join("repo"));
    let repo = repo_dir.as_str();
    // Random bytes: every chunk distinct, so what the GC may free is exactly known.
    let src = images::make(&srv.root.join("vm1.img"), Pattern::Random, 4 * MIB, 7)
        .unwrap()
        .path;
    let first_image = srv.root.join("vm1-first.img");
    std::fs::copy(&src, &first_image).unwrap();
    let key = ["--key-file", "repo-key"];

    // A full backup into a repository the job creates.
    let mut args = vec!["backup", src.to_str().unwrap(), repo];
    args.extend(key);
    args.extend([
        "--init-chunk-size",
        "256K",
        "--source-id",
        "vm1",
        "--tag",
        "vm=vm1",
    ]);
    let first = srv.watched(&args);
    assert_eq!(first["kind"], "backup", "{first}");
    let r = &first["result"];
    let first_id = r["snapshot_id"].as_str().unwrap().to_string();
    assert_eq!(r["source_id"], "vm1", "{r}");
    assert_eq!(r["size"], 4 * MIB, "{r}");
    assert_eq!(r["block_hash"], blkhash_file(&src), "{r}");
    assert_eq!(r["parent_id"], "", "{r}");

    // Change 4 KiB in one chunk: the second backup builds on the first and stores only it.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
        f.write_all_at(&[0xa5; 4096], MIB / 2).unwrap();
        f.sync_all().unwrap();
    }
    let mut args = vec!["backup", src.to_str().unwrap(), repo];
    args.extend(key);
    args.extend(["--source-id", "vm1"]);
    let second = srv.watched(&args);
    let r = &second["result"];
    let second_id = r["snapshot_id"].as_str().unwrap().to_string();
    assert_eq!(r["parent_id"], first_id.as_str(), "{r}");
    assert_eq!(r["chunks_new"], 1, "{r}");
    assert_eq!(r["block_hash"], blkhash_file(&src), "{r}");

    // The listing, as JSON and as a table.
    let mut args = vec!["snapshots", repo];
    args.extend(key);
    args.push("--json");
    let run = srv.job(&args);
    run.assert_success();
    let list: Value = serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {run}"));
    let listed: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [first_id.as_str(), second_id.as_str()], "{list}");
    assert_eq!(list[0]["tags"]["vm"], "vm1", "{list}");
    assert_eq!(list[1]["source_id"], "vm1", "{list}");
    assert_eq!(list[0]["block_hash"], first["result"]["block_hash"]);
    let mut args = vec!["snapshots", repo, "--tag", "vm=vm1"];
    args.extend(key);
    let run = srv.job(&args);
    run.assert_success();
    assert!(run.stdout.contains(&first_id), "{run}");
    assert!(!run.stdout.contains(&second_id), "{run}");

    // Both backups restored byte for byte, their block hashes checked by the job.
    for (id, image) in [(&first_id, &first_image), (&second_id, &src)] {
        let dst = srv.root.join(format!("restored-{id}.img"));
        let mut args = vec!["restore", repo, id.as_str(), dst.to_str().unwrap()];
        args.extend(key);
        let done = srv.watched(&args);
        let r = &done["result"];
        assert_eq!(r["snapshot_id"], id.as_str(), "{r}");
        assert_eq!(r["verified"], true, "{r}");
        assert_eq!(r["block_hash"], blkhash_file(image), "{r}");
        qemu_img_compare(image, &dst);
    }

    let mut args = vec!["repo-verify", repo];
    args.extend(key);
    let verified = srv.watched(&args);
    let r = &verified["result"];
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["chunks_bad"], 0, "{r}");
    // 16 chunks of the first backup, one of the second.
    assert_eq!(r["chunks_checked"], 17, "{r}");

    // Prune: the dry run decides and deletes nothing; the real one deletes the first.
    let mut args = vec!["prune", repo, "--keep-last", "1", "--dry-run"];
    args.extend(key);
    let dry = srv.watched(&args);
    let r = &dry["result"];
    assert_eq!(r["dry_run"], true, "{r}");
    assert_eq!(ids(&r["removed"]), [first_id.as_str()], "{r}");
    assert_eq!(ids(&r["kept"]), [second_id.as_str()], "{r}");
    let mut args = vec!["snapshots", repo, "--json"];
    args.extend(key);
    let run = srv.job(&args);
    run.assert_success();
    let list: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 2, "{list}");
    let mut args = vec!["prune", repo, "--keep-last", "1"];
    args.extend(key);
    let pruned = srv.watched(&args);
    let r = &pruned["result"];
    assert_eq!(r["dry_run"], false, "{r}");
    assert_eq!(ids(&r["removed"]), [first_id.as_str()], "{r}");
    let run = srv.job(&args_with(&["snapshots", repo, "--json"], &key));
    run.assert_success();
    let list: Value = serde_json::from_str(&run.stdout).unwrap();
    let left: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(left, [second_id.as_str()], "{list}");

    // GC without a grace period frees the chunk only the pruned backup used.
    let gc = srv.watched(&args_with(&["gc", repo, "--grace-seconds", "0"], &key));
    let r = &gc["result"];
    assert_eq!(r["chunks_removed"], 1, "{r}");
    assert!(r["bytes_removed"].as_u64().unwrap() > 0, "{r}");
    // What is left is whole: it verifies and restores.
    let verified = srv.watched(&args_with(&["repo-verify", repo], &key));
    assert_eq!(verified["result"]["ok"], true, "{verified}");
    let dst = srv.root.join("after-gc.img");
    srv.watched(&args_with(
        &[
            "restore",
            repo,
            second_id.as_str(),
            dst.to_str().unwrap(),
            "--cache",
            "none",
        ],
        &key,
    ));
    qemu_img_compare(&src, &dst);

    // Without --watch the job is printed as it starts; `ferry job get` shows its end.
    let run = srv.job(&args_with(&["repo-verify", repo, "--json"], &key));
    run.assert_success();
    let started = last_json(&run);
    assert_eq!(started["kind"], "repository_verify", "{started}");
    let id = started["id"].as_str().unwrap().to_string();
    let watched = srv.job(&["watch", id.as_str(), "--json"]);
    watched.assert_success();
    assert_eq!(last_json(&watched)["state"], "succeeded", "{watched}");
}

fn args_with<'a>(args: &[&'a str], more: &[&'a str]) -> Vec<&'a str> {
    let mut all = args.to_vec();
    all.extend_from_slice(more);
    all
}

#[test]
fn bad_input_to_ferry_job_fails_with_one_clear_line() {
    let srv = server();
    let repo_dir = s(&srv.root.join("repo"));
    let repo = repo_dir.as_str();
    let src = make_image(&srv.root.join("src.img"), MIB, 3);
    let dst_file = s(&srv.root.join("dst.img"));
    let dst = dst_file.as_str();
    srv.watched(&[
        "backup",
        src.to_str().unwrap(),
        repo,
        "--init-chunk-size",
        "256K",
    ]);

    // A backup the repository does not hold.
    let unknown = "20200101T000000Z-0a1b2c3d";
    let run = srv.job(&["restore", repo, unknown, dst]);
    let line = run.assert_clean_failure();
    assert!(line.contains(unknown), "{line}");
    assert!(line.contains(repo), "{line}");
    assert!(line.contains("NotFound"), "{line}");
    assert!(
        !Path::new(dst).exists(),
        "a refused restore created its target"
    );
    // Not a backup id at all.
    let run = srv.job(&["restore", repo, "yesterday", dst]);
    let line = run.assert_clean_failure();
    assert!(line.contains("snapshot_id"), "{line}");
    // `latest` of no source.
    let run = srv.job(&["restore", repo, "latest", dst]);
    let line = run.assert_clean_failure();
    assert!(line.contains("ID latest needs --source-id"), "{line}");

    // Repositories that are not: a URL of another kind, a directory outside the roots, a
    // directory with no repository.
    let run = srv.job(&["snapshots", "ftp://example.com/repo"]);
    let line = run.assert_clean_failure();
    assert!(line.contains("repository.url"), "{line}");
    assert!(line.contains("InvalidArgument"), "{line}");
    let run = srv.job(&["backup", src.to_str().unwrap(), "ftp://example.com/repo"]);
    let line = run.assert_clean_failure();
    assert!(line.contains("repository.url"), "{line}");
    let run = srv.job(&["gc", "/var/tmp/ferry-not-allowed"]);
    let line = run.assert_clean_failure();
    assert!(line.contains("PermissionDenied"), "{line}");
    let empty_dir = s(&srv.root.join("empty"));
    let empty = empty_dir.as_str();
    let run = srv.job(&["snapshots", empty, "--json"]);
    let line = run.assert_clean_failure();
    assert!(line.contains("NotFound") && line.contains(empty), "{line}");

    // A prune with no rule is refused before anything is sent.
    let run = srv.job(&["prune", repo]);
    let line = run.assert_clean_failure();
    assert!(line.contains("--keep-"), "{line}");
    let run = srv.job(&["prune", repo, "--keep-last", "many"]);
    assert!(!run.status.success(), "{run}");
    assert!(run.stderr.contains("--keep-last"), "{run}");

    // A job that fails when it runs: the watch exits non-zero and says why.
    let run = srv.job(&["backup", src.to_str().unwrap(), empty, "--watch", "--json"]);
    assert!(!run.status.success(), "{run}");
    assert!(!run.panicked(), "{run}");
    let job = last_json(&run);
    assert_eq!(job["state"], "failed", "{run}");
    assert_eq!(job["error"]["kind"], "not_found", "{run}");
    assert!(
        job["error"]["message"]
            .as_str()
            .unwrap()
            .contains("init_if_missing"),
        "{run}"
    );
}
