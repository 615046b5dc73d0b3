//! Instant access to backups: `ferry backup serve` serves a backup's image read-only over
//! NBD, read by the clients people use (nbdcopy, two at once; nbdinfo --list and --map;
//! qemu-img compare against the original image), from a directory repository and from
//! an encrypted S3 repository (in-process s3s-fs), over TLS; a small cache (chunks
//! evicted and fetched again while two clients read); holes in the map where the image
//! has whole zero chunks; a wrong id or key is a clean failure; SIGTERM ends it with
//! exit 0. `ferry backup restore --while-serving` restores while the export serves.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ferry_tests::check::{assert_allocated_about, qemu_img_compare};
use ferry_tests::images::{make, Image, Pattern};
use ferry_tests::nbd_servers::{nbdinfo_map, require, TlsCerts};
use ferry_tests::process::Serving;
use ferry_tests::s3_server::S3Server;
use ferry_tests::{ferry, scratch_dir};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const CHUNK: u64 = 256 * KIB;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A running ferry process that prints lines on stdout (an export's URI first), stopped
/// with SIGTERM when dropped.
fn ok(tool: &str, args: &[&str]) -> String {
    require(tool);
    let out = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {tool}: {e}"));
    assert!(
        out.status.success(),
        "{tool} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The map a backup with `CHUNK`-sized chunks of `image` must show: a hole for each run
/// of whole zero chunks, data elsewhere, as `(offset, len, is_hole)`.
fn expected_map(image: &Image) -> Vec<(u64, u64, bool)> {
    let bytes = std::fs::read(&image.path).unwrap();
    let ranges = bytes
        .chunks(CHUNK as usize)
        .enumerate()
        .map(|(i, c)| (i as u64 * CHUNK, c.len() as u64, c.iter().all(|&b| b == 0)));
    merge(ranges)
}

/// `nbdinfo --map` of `uri` as `(offset, len, is_hole)`, adjacent ranges of a kind merged.
fn served_map(uri: &str) -> Vec<(u64, u64, bool)> {
    let map = nbdinfo_map(uri);
    for (_, _, what) in &map {
        assert!(what == "data" || what == "hole,zero", "{map:?}");
    }
    merge(map.into_iter().map(|(o, l, what)| (o, l, what != "data")))
}

fn merge(ranges: impl Iterator<Item = (u64, u64, bool)>) -> Vec<(u64, u64, bool)> {
    let mut out: Vec<(u64, u64, bool)> = Vec::new();
    for (offset, len, hole) in ranges {
        match out.last_mut() {
            Some(last) if last.2 == hole && last.0 + last.1 == offset => last.1 += len,
            _ => out.push((offset, len, hole)),
        }
    }
    out
}

/// nbdcopy of `uri` into a new file `out`, compared with `image` and checked sparse.
fn nbdcopy_and_compare(uri: &str, out: &Path, image: &Image) {
    ok("nbdcopy", &[uri, s(out)]);
    qemu_img_compare(&image.path, out);
    assert_allocated_about(out, image.nonzero_block_bytes);
}

/// Backs `source` up into the directory repository `repo` (made here with `CHUNK`-sized
/// chunks); returns the backup's id.
fn backup_into_directory(repo: &Path, source: &Path) -> String {
    ferry!()
        .run([
            "backup",
            "init",
            "--chunk-size",
            &CHUNK.to_string(),
            s(repo),
        ])
        .assert_success();
    let made = ferry!().run([
        "backup",
        "create",
        "--no-progress",
        "--json",
        s(source),
        s(repo),
    ]);
    made.assert_success();
    let made: serde_json::Value = serde_json::from_str(made.stdout.trim()).unwrap();
    made["id"].as_str().unwrap().to_string()
}

#[test]
fn a_qcow2_backup_is_served_to_real_clients_with_its_holes() {
    require("qemu-img");
    let dir = scratch_dir();
    let raw = dir.path().join("disk.raw");
    let image = make(&raw, Pattern::HalfData, 24 * MIB + 4 * KIB, 21).unwrap();
    let qcow2 = dir.path().join("disk.qcow2");
    ok(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "qcow2", s(&raw), s(&qcow2)],
    );
    let repo = dir.path().join("repo");
    let id = backup_into_directory(&repo, &qcow2);

    // A cache of 4 chunks: two clients reading 24 MiB evict and fetch chunks again.
    let mut cmd = ferry!().command(["backup", "serve", s(&repo), &id]);
    cmd.args([
        "--listen",
        "127.0.0.1:0",
        "--name",
        "vm1",
        "--cache-size",
        "1M",
    ]);
    let (mut served, uri) = Serving::start(cmd);
    assert!(
        uri.starts_with("nbd://127.0.0.1:") && uri.ends_with("/vm1"),
        "{uri}"
    );

    let list = ok("nbdinfo", &["--list", uri.trim_end_matches("vm1")]);
    assert!(list.contains("export=\"vm1\""), "{list}");
    assert!(list.contains(&format!("backup {id}")), "{list}");
    let info = ok("nbdinfo", &[&uri]);
    assert!(info.contains("is_read_only: true"), "{info}");
    assert!(
        info.contains(&format!("export-size: {}", image.size)),
        "{info}"
    );

    // Holes exactly where the image has whole zero chunks, and there are some.
    let map = served_map(&uri);
    assert_eq!(map, expected_map(&image));
    assert!(
        map.iter().any(|r| r.2) && map.iter().any(|r| !r.2),
        "{map:?}"
    );

    // Two nbdcopys at once, then qemu-img compare of the export with the original.
    let outs = [dir.path().join("a.raw"), dir.path().join("b.raw")];
    std::thread::scope(|scope| {
        for out in &outs {
            let (uri, image) = (&uri, &image);
            scope.spawn(move || nbdcopy_and_compare(uri, out, image));
        }
    });
    ok(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", s(&raw), &uri],
    );

    assert!(
        served.stop(),
        "ferry backup serve did not exit 0 on SIGTERM"
    );
    let out = Command::new("nbdinfo").arg(&uri).output().unwrap();
    assert!(!out.status.success(), "the export answers after SIGTERM");
}

/// `ferry` with the S3 server in the SDK's environment and `key` as the key file.
fn s3_command(server: &S3Server, key: &Path, args: &[&str]) -> Command {
    let mut cmd = ferry!().command(args);
    server.sdk_env(&mut cmd);
    cmd.env("FERRY_BACKUP_KEY_FILE", key);
    cmd
}

fn s3_run(server: &S3Server, key: &Path, args: &[&str]) -> std::process::Output {
    s3_command(server, key, args).output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_s3_backup_is_served_over_tls_and_bad_ids_and_keys_fail_cleanly() {
    let server = S3Server::start().await;
    server.create_bucket("backups");
    let dir = scratch_dir();
    let key = dir.path().join("key");
    std::fs::write(&key, "serve-me-passphrase\n").unwrap();
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "not-it\n").unwrap();
    let raw = dir.path().join("disk.raw");
    let image = make(&raw, Pattern::HalfData, 16 * MIB, 8).unwrap();
    let repo = "s3://backups/site-b";
    let init = s3_run(
        &server,
        &key,
        &["backup", "init", "--chunk-size", "256K", repo],
    );
    assert!(init.status.success(), "{init:?}");
    let made = s3_run(
        &server,
        &key,
        &["backup", "create", "--no-progress", "--json", s(&raw), repo],
    );
    assert!(made.status.success(), "{made:?}");
    let made: serde_json::Value = serde_json::from_slice(&made.stdout).unwrap();
    let id = made["id"].as_str().unwrap().to_string();

    let certs = TlsCerts::generate();
    let c = certs.dir().to_path_buf();
    let cmd = s3_command(
        &server,
        &key,
        &[
            "backup",
            "serve",
            repo,
            &id,
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            s(&c.join("server-cert.pem")),
            "--tls-key",
            s(&c.join("server-key.pem")),
            "--tls-ca",
            s(&c.join("ca-cert.pem")),
        ],
    );
    let (mut served, uri) = tokio::task::spawn_blocking(move || Serving::start(cmd))
        .await
        .unwrap();
    assert!(uri.starts_with("nbds://127.0.0.1:"), "{uri}");
    let tls_uri = format!("{uri}?tls-certificates={}", c.display());
    let check = {
        let (tls_uri, image, dir) = (tls_uri.clone(), image.clone(), dir.path().to_path_buf());
        tokio::task::spawn_blocking(move || {
            assert_eq!(served_map(&tls_uri), expected_map(&image));
            std::thread::scope(|scope| {
                for name in ["a.raw", "b.raw"] {
                    let (uri, image, out) = (&tls_uri, &image, dir.join(name));
                    scope.spawn(move || nbdcopy_and_compare(uri, &out, image));
                }
            });
        })
    };
    check.await.unwrap();
    // A client without TLS is refused.
    let plain = uri.replacen("nbds://", "nbd://", 1);
    let out = Command::new("nbdinfo").arg(&plain).output().unwrap();
    assert!(!out.status.success(), "a client without TLS was served");
    let stopped = tokio::task::spawn_blocking(move || served.stop())
        .await
        .unwrap();
    assert!(stopped, "ferry backup serve did not exit 0 on SIGTERM");

    // A backup that does not exist, a wrong key, no key: clean failures, nothing served.
    let missing = "20200101T000000Z-00000000";
    for (key, id, expect) in [
        (&key, missing, missing),
        (&wrong, id.as_str(), "passphrase"),
    ] {
        let out = s3_run(
            &server,
            key,
            &["backup", "serve", repo, id, "--listen", "127.0.0.1:0"],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(out.stdout.is_empty(), "a URI was printed: {out:?}");
        assert!(
            stderr.contains(expect) || stderr.contains("wrong key"),
            "{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn a_live_restore_serves_the_backup_while_the_target_fills() {
    let dir = scratch_dir();
    let raw = dir.path().join("disk.raw");
    let image = make(&raw, Pattern::HalfData, 32 * MIB, 13).unwrap();
    let repo = dir.path().join("repo");
    let id = backup_into_directory(&repo, &raw);
    let target = dir.path().join("restored.raw");
    let mut cmd = ferry!().command(["backup", "restore", "--no-progress", s(&repo), &id]);
    cmd.args([
        s(&target),
        "--while-serving",
        "127.0.0.1:0",
        "--workers",
        "1",
    ]);
    let (mut live, uri) = Serving::start(cmd);
    assert!(uri.starts_with("nbd://127.0.0.1:"), "{uri}");
    // The export serves the whole image, whatever the restore has written yet.
    nbdcopy_and_compare(&uri, &dir.path().join("served.raw"), &image);
    let summary = live.next_line(Duration::from_secs(120));
    assert!(summary.starts_with("restored backup"), "{summary}");
    // The restore is done; the export still serves until SIGTERM.
    ok(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", s(&raw), &uri],
    );
    assert!(live.stop(), "the live restore did not exit 0 on SIGTERM");
    qemu_img_compare(&raw, &target);
    assert_allocated_about(&target, image.nonzero_block_bytes);

    // Export options without --while-serving are refused.
    let run = ferry!().run([
        "backup",
        "restore",
        s(&repo),
        &id,
        s(&dir.path().join("x.raw")),
        "--cache-size",
        "8M",
    ]);
    let message = run.assert_clean_failure();
    assert!(message.contains("--while-serving"), "{message}");
}
