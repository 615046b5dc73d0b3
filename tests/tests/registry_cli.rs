//! The registry source end to end: a real `docker-registry` on loopback (TLS from a test
//! CA, htpasswd basic auth), containerDisk images built with buildah (`FROM scratch`, a
//! qcow2 under /disk/) and pushed with gzip and zstd layers, and a multi-arch
//! index. Each copy is compared with the disk by `qemu-img compare` and its sparseness
//! checked; `ferry info` shows the digest, platform, layer and disk file. Faults: a bad
//! password, an unknown digest, a blob whose bytes were changed or cut short in the
//! registry's storage: each one clear line, no panic, no target left as done.
//!
//! Beyond buildah's images: a registry that takes only bearer tokens (its `auth: token:`
//! configuration, a token service minting JWTs it trusts); a tag re-pushed while a
//! rate-limited copy reads it by ranges; a proxy that refuses ranges; and hand-built
//! layers pushed with the registry's HTTP API (uncompressed, a decompression bomb, tar
//! headers that lie about their entry's size).

use std::path::{Path, PathBuf};
use std::process::Command;

use ferry_tests::check::{assert_allocated_about, qemu_img_compare, require_tool};
use ferry_tests::registry_server::{gzip, tar_end, tar_entry, write_auth_file, Auth, Registry};
use ferry_tests::{ferry, scratch_dir};

const MIB: u64 = 1 << 20;

fn sh(program: &str, args: &[&str]) {
    require_tool(program, "qemu-utils");
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A 64 MiB raw disk with 5 MiB of data marked by `mark` (each image distinct, so
/// buildah reuses no blob across compressions), and its qcow2.
fn make_disk(dir: &Path, mark: u8) -> (PathBuf, PathBuf) {
    let raw = dir.join(format!("disk-{mark}.raw"));
    sh("qemu-img", &["create", "-q", "-f", "raw", s(&raw), "64M"]);
    for cmd in [
        format!("write -P {mark} 1M 3M"),
        format!("write -P {} 40M 1M", mark.wrapping_add(1)),
        format!("write -P {} 63M 1M", mark.wrapping_add(2)),
    ] {
        sh("qemu-io", &["-f", "raw", "-c", &cmd, s(&raw)]);
    }
    let qcow2 = dir.join(format!("disk-{mark}.qcow2"));
    sh(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "qcow2", s(&raw), s(&qcow2)],
    );
    (raw, qcow2)
}

fn env_ferry(reg: &Registry, args: &[&str]) -> ferry_tests::bin::Run {
    ferry_with_auth(reg, &reg.auth_file(), args)
}

/// `ferry ARGS` with the registry's CA and the credentials in `auth`.
fn ferry_with_auth(reg: &Registry, auth: &Path, args: &[&str]) -> ferry_tests::bin::Run {
    let f = ferry!();
    let mut cmd = f.command(args);
    cmd.env("FERRY_REGISTRY_AUTH_FILE", auth)
        .env("FERRY_REGISTRY_CA_FILE", reg.ca_file());
    let description = format!("{cmd:?}");
    ferry_tests::bin::wait_with_deadline(
        cmd.spawn().unwrap(),
        ferry_tests::bin::DEFAULT_DEADLINE,
        description,
    )
}

fn info_json(reg: &Registry, url: &str) -> serde_json::Value {
    let run = env_ferry(reg, &["info", "--json", url]);
    run.assert_success();
    serde_json::from_str(&run.stdout).unwrap()
}

#[test]
fn containerdisks_in_gzip_zstd_and_plain_layers_copy_exactly() {
    let dir = scratch_dir();
    let reg = Registry::start(dir.path());
    // Plain (uncompressed, read by ranges) layers are covered by ferry-formats' container
    // tests: buildah 1.28's `push --disable-compression` still pushes gzip here.
    for (i, compression) in ["gzip", "zstd"].iter().enumerate() {
        let (raw, qcow2) = make_disk(dir.path(), 0x40 + 8 * i as u8);
        let name = format!("cd-{compression}");
        reg.build(&name, &qcow2, "amd64");
        reg.push(&name, &format!("disks/fedora:{compression}"), compression);
        let url = format!("{}:{compression}", reg.url("disks/fedora"));
        let info = info_json(&reg, &url);
        assert_eq!(info["format"], "qcow2", "{info}");
        assert_eq!(info["virtual_size"], 64 * MIB, "{info}");
        let r = &info["registry"];
        assert_eq!(
            r["disk_file"],
            "disk/".to_string() + qcow2.file_name().unwrap().to_str().unwrap(),
            "{info}"
        );
        assert_eq!(r["layer_compression"], *compression, "{info}");
        assert_eq!(r["ranges"], false, "{info}");
        let digest = r["digest"].as_str().unwrap().to_string();
        assert!(digest.starts_with("sha256:"), "{info}");

        let out = dir.path().join(format!("out-{compression}.raw"));
        env_ferry(&reg, &["copy", &url, s(&out)]).assert_success();
        qemu_img_compare(&raw, &out);
        assert_allocated_about(&out, 5 * MIB);

        // The same image by its digest.
        let out2 = dir.path().join(format!("out-{compression}-digest.raw"));
        let pinned = format!("{}@{digest}", reg.url("disks/fedora"));
        env_ferry(&reg, &["copy", &pinned, s(&out2)]).assert_success();
        qemu_img_compare(&raw, &out2);
    }
}

#[test]
fn a_multi_arch_index_reads_amd64_or_the_platform_asked() {
    let dir = scratch_dir();
    let reg = Registry::start(dir.path());
    let (raw_amd, qcow2_amd) = make_disk(dir.path(), 0x61);
    let (raw_arm, qcow2_arm) = make_disk(dir.path(), 0x71);
    reg.build("cd-amd64", &qcow2_amd, "amd64");
    reg.build("cd-arm64", &qcow2_arm, "arm64");
    reg.push_index("cd-list", &["cd-amd64", "cd-arm64"], "disks/multi:1");
    let url = format!("{}:1", reg.url("disks/multi"));
    let info = info_json(&reg, &url);
    assert_eq!(info["registry"]["platform"], "linux/amd64", "{info}");
    let text = env_ferry(&reg, &["info", &url]);
    text.assert_success();
    for line in [
        "digest: sha256:",
        "platform: linux/amd64",
        "layer: sha256:",
        "disk file: disk/",
    ] {
        assert!(text.stdout.contains(line), "{line} in {}", text.stdout);
    }
    let out = dir.path().join("amd.raw");
    env_ferry(&reg, &["copy", &url, s(&out)]).assert_success();
    qemu_img_compare(&raw_amd, &out);
    let out = dir.path().join("arm.raw");
    env_ferry(&reg, &["copy", "--platform", "linux/arm64", &url, s(&out)]).assert_success();
    qemu_img_compare(&raw_arm, &out);
    let line = env_ferry(
        &reg,
        &[
            "copy",
            "--platform",
            "linux/s390x",
            &url,
            s(&dir.path().join("x.raw")),
        ],
    )
    .assert_clean_failure()
    .to_string();
    assert!(line.contains("no linux/s390x image"), "{line}");
}

#[test]
fn registry_faults_fail_clearly() {
    let dir = scratch_dir();
    let reg = Registry::start(dir.path());
    let (_, qcow2) = make_disk(dir.path(), 0x11);
    reg.build("cd-fault", &qcow2, "amd64");
    reg.push("cd-fault", "disks/fault:gz", "gzip");
    let url = format!("{}:gz", reg.url("disks/fault"));
    let out = dir.path().join("out.raw");

    // A bad password: permission denied, and the password never printed.
    let bad = dir.path().join("bad-auth.json");
    std::fs::write(
        &bad,
        format!(
            "{{\"auths\":{{\"{}\":{{\"username\":\"ferry\",\"password\":\"wrong-pw-123\"}}}}}}",
            reg.host()
        ),
    )
    .unwrap();
    let f = ferry!();
    let mut cmd = f.command(["copy", &url, s(&out)]);
    cmd.env("FERRY_REGISTRY_AUTH_FILE", &bad)
        .env("FERRY_REGISTRY_CA_FILE", reg.ca_file());
    let run = ferry_tests::bin::wait_with_deadline(
        cmd.spawn().unwrap(),
        ferry_tests::bin::DEFAULT_DEADLINE,
        "bad password".into(),
    );
    let line = run.assert_clean_failure().to_string();
    assert!(
        line.contains("refused") && !line.contains("wrong-pw-123"),
        "{line}"
    );

    // No CA given: a TLS error naming the setting.
    let run = ferry!().run(["copy", &url, s(&out)]);
    let line = run.assert_clean_failure().to_string();
    assert!(line.contains("FERRY_REGISTRY_CA_FILE"), "{line}");

    // An unknown digest.
    let missing = format!("{}@sha256:{}", reg.url("disks/fault"), "0".repeat(64));
    let line = env_ferry(&reg, &["copy", &missing, s(&out)])
        .assert_clean_failure()
        .to_string();
    assert!(line.contains("no manifest"), "{line}");

    // The layer's bytes changed in the registry's storage: corrupt, no finished target.
    let info = info_json(&reg, &url);
    let layer = info["registry"]["layer"].as_str().unwrap().to_string();
    let blob = reg.blob_file(&layer);
    let original = std::fs::read(&blob).unwrap();
    let mut changed = original.clone();
    let at = changed.len() - 10;
    changed[at] ^= 0xff;
    std::fs::write(&blob, &changed).unwrap();
    let line = env_ferry(&reg, &["copy", &url, s(&dir.path().join("c1.raw"))])
        .assert_clean_failure()
        .to_string();
    assert!(
        line.contains("does not match its digest") || line.contains("does not decompress"),
        "{line}"
    );

    // The layer cut short.
    std::fs::write(&blob, &original[..original.len() / 2]).unwrap();
    let line = env_ferry(&reg, &["copy", &url, s(&dir.path().join("c2.raw"))])
        .assert_clean_failure()
        .to_string();
    assert!(
        line.contains("cut short") || line.contains("truncated") || line.contains("ended"),
        "{line}"
    );
    std::fs::write(&blob, &original).unwrap();
    env_ferry(&reg, &["copy", &url, s(&dir.path().join("c3.raw"))]).assert_success();
}

/// A registry that trusts only bearer tokens (`auth: token:`): ferry answers its
/// `WWW-Authenticate: Bearer realm=...` challenge by asking the token service with the
/// config.json credentials, and copies with the token; a bad password or none is
/// `permission denied`, the password nowhere in the line.
#[test]
fn a_bearer_token_registry_grants_the_pull_and_refuses_a_bad_password() {
    let dir = scratch_dir();
    let reg = Registry::start_with(
        dir.path(),
        &Auth::Token {
            repositories: vec!["disks/token".into()],
        },
    );
    let (raw, qcow2) = make_disk(dir.path(), 0x21);
    reg.build("cd-token", &qcow2, "amd64");
    reg.push("cd-token", "disks/token:1", "gzip");
    let url = format!("{}:1", reg.url("disks/token"));
    let pushed = reg.token_log();

    let out = dir.path().join("out.raw");
    env_ferry(&reg, &["copy", &url, s(&out)]).assert_success();
    qemu_img_compare(&raw, &out);
    // ferry went to the token service (the registry takes no basic credentials).
    let log = reg.token_log();
    let asked = &log[pushed.len()..];
    assert!(
        asked.contains("GET /token?") && asked.contains("scope=repository%3Adisks%2Ftoken%3Apull"),
        "no token request from ferry in the token service's log: {asked}"
    );

    let bad = dir.path().join("bad-auth.json");
    write_auth_file(&bad, &reg.host(), "wrong-token-pw-456");
    let line = ferry_with_auth(&reg, &bad, &["copy", &url, s(&dir.path().join("bad.raw"))])
        .assert_clean_failure()
        .to_string();
    assert!(
        line.contains("permission denied") && line.contains("token service"),
        "{line}"
    );
    for secret in [
        "wrong-token-pw-456",
        "d3Jvbmct",
        ferry_tests::registry_server::PASSWORD,
    ] {
        assert!(!line.contains(secret), "{secret} in {line}");
    }

    // No credentials at all: the token service refuses too.
    let none = dir.path().join("none.json");
    std::fs::write(&none, r#"{"auths":{}}"#).unwrap();
    let line = ferry_with_auth(
        &reg,
        &none,
        &["copy", &url, s(&dir.path().join("none.raw"))],
    )
    .assert_clean_failure()
    .to_string();
    assert!(line.contains("permission denied"), "{line}");
}

const PLAIN_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
const GZIP_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// A plain tar holding `disk` as `disk/NAME`.
fn plain_tar(disk: &Path) -> Vec<u8> {
    let data = std::fs::read(disk).unwrap();
    let name = format!("disk/{}", disk.file_name().unwrap().to_str().unwrap());
    let mut tar = tar_entry(&name, data.len() as u64, &data);
    tar.extend(tar_end());
    tar
}

/// A tag re-pushed with another image while a copy of it runs (slowed by a rate limit,
/// its uncompressed layer read by ranged GETs all through the copy): the copy keeps
/// reading the digest it pinned at the start and its bytes are the first image's.
#[test]
fn a_tag_re_pushed_mid_copy_does_not_change_what_the_copy_reads() {
    let dir = scratch_dir();
    let reg = Registry::start(dir.path());
    // 24 MiB of data: the rate limit's burst is one 8 MiB request.
    let raw_a = dir.path().join("a.raw");
    sh("qemu-img", &["create", "-q", "-f", "raw", s(&raw_a), "64M"]);
    sh(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0x31 8M 24M", s(&raw_a)],
    );
    let qcow2_a = dir.path().join("a.qcow2");
    sh(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "qcow2",
            s(&raw_a),
            s(&qcow2_a),
        ],
    );
    let (raw_b, qcow2_b) = make_disk(dir.path(), 0x39);
    let tar_a = plain_tar(&qcow2_a);
    let first = reg.push_image("disks/moving", "latest", &tar_a, &tar_a, PLAIN_LAYER);
    let url = format!("{}:latest", reg.url("disks/moving"));
    let info = info_json(&reg, &url);
    assert_eq!(info["registry"]["digest"], first, "{info}");
    assert_eq!(info["registry"]["ranges"], true, "{info}");

    // 24 MiB at 4 MiB/s after an 8 MiB burst: about four seconds of ranged GETs.
    let out = dir.path().join("out.raw");
    let f = ferry!();
    let mut cmd = f.command(["copy", "--rate-limit", "4M", &url, s(&out)]);
    cmd.env("FERRY_REGISTRY_AUTH_FILE", reg.auth_file())
        .env("FERRY_REGISTRY_CA_FILE", reg.ca_file());
    let description = format!("{cmd:?}");
    let mut child = cmd.spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let tar_b = plain_tar(&qcow2_b);
    let second = reg.push_image("disks/moving", "latest", &tar_b, &tar_b, PLAIN_LAYER);
    assert_ne!(first, second);
    assert!(
        child.try_wait().unwrap().is_none(),
        "the copy ended before the tag moved: slow it down more"
    );
    ferry_tests::bin::wait_with_deadline(child, ferry_tests::bin::DEFAULT_DEADLINE, description)
        .assert_success();
    qemu_img_compare(&raw_a, &out);

    // The tag did move: a new copy reads the second image.
    assert_eq!(info_json(&reg, &url)["registry"]["digest"], second);
    let out_b = dir.path().join("out-b.raw");
    env_ferry(&reg, &["copy", &url, s(&out_b)]).assert_success();
    qemu_img_compare(&raw_b, &out_b);
}

/// A registry behind a proxy that refuses ranges (Range stripped, every blob 200 and
/// whole): the uncompressed layer that is read by ranges directly is streamed instead,
/// and the copy is exact.
#[test]
fn a_registry_that_refuses_ranges_is_streamed() {
    let dir = scratch_dir();
    let reg = Registry::start(dir.path());
    let (raw, qcow2) = make_disk(dir.path(), 0x51);
    let tar = plain_tar(&qcow2);
    reg.push_image("disks/plain", "1", &tar, &tar, PLAIN_LAYER);
    let direct = format!("{}:1", reg.url("disks/plain"));
    let info = info_json(&reg, &direct);
    assert_eq!(info["registry"]["ranges"], true, "{info}");
    assert_eq!(info["registry"]["layer_compression"], "none", "{info}");
    let layer = info["registry"]["layer"].as_str().unwrap().to_string();

    let proxy = reg.range_refusing_proxy();
    // The proxy answers a range request with the whole blob.
    let code = reg.curl(&[
        "-o",
        "/dev/null",
        "-H",
        "Range: bytes=0-0",
        "-w",
        "%{http_code} %{size_download}",
        &format!("https://{}/v2/disks/plain/blobs/{layer}", proxy.host()),
    ]);
    assert_eq!(
        code,
        format!("200 {}", tar.len()),
        "the proxy still serves ranges"
    );

    let auth = dir.path().join("proxy-auth.json");
    write_auth_file(&auth, &proxy.host(), ferry_tests::registry_server::PASSWORD);
    let url = format!("docker://{}/disks/plain:1", proxy.host());
    let run = ferry_with_auth(&reg, &auth, &["info", "--json", &url]);
    run.assert_success();
    let info: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(info["registry"]["ranges"], false, "{info}");
    assert_eq!(info["format"], "qcow2", "{info}");
    let out = dir.path().join("out.raw");
    ferry_with_auth(&reg, &auth, &["copy", &url, s(&out)]).assert_success();
    qemu_img_compare(&raw, &out);
    assert_allocated_about(&out, 5 * MIB);
}

/// Hand-built layers that lie: a gzip layer whose tar is followed by 64 MiB of zeroes
/// (a decompression bomb), and tar entries whose headers claim more or fewer bytes than
/// they hold, compressed and plain. Each fails with one clear line and no success.
#[test]
fn a_decompression_bomb_and_lying_tar_headers_fail_clearly() {
    let dir = scratch_dir();
    let reg = Registry::start(dir.path());
    let data = vec![0x5a_u8; MIB as usize];
    let fail = |repo: &str, tar: &[u8], compressed: bool| -> String {
        let (layer, media) = if compressed {
            (gzip(tar), GZIP_LAYER)
        } else {
            (tar.to_vec(), PLAIN_LAYER)
        };
        reg.push_image(repo, "1", tar, &layer, media);
        let url = format!("{}:1", reg.url(repo));
        let out = dir.path().join(format!("{}.raw", repo.replace('/', "-")));
        env_ferry(&reg, &["copy", &url, s(&out)])
            .assert_clean_failure()
            .to_string()
    };

    let mut bomb = tar_entry("disk/disk.img", MIB, &data);
    bomb.extend(tar_end());
    bomb.resize(bomb.len() + (64 * MIB) as usize, 0);
    let line = fail("disks/bomb", &bomb, true);
    assert!(line.contains("decompression bomb"), "{line}");

    // Says 4 MiB, holds 1 MiB.
    let mut long = tar_entry("disk/disk.img", 4 * MIB, &data);
    long.extend(tar_end());
    let line = fail("disks/long-gz", &long, true);
    assert!(line.contains("lies about its size"), "{line}");
    let line = fail("disks/long-plain", &long, false);
    assert!(line.contains("tar") && line.contains("4194304"), "{line}");

    // Says 512 KiB, holds 1 MiB: the rest is no tar header.
    let mut short = tar_entry("disk/disk.img", MIB / 2, &data);
    short.extend(tar_end());
    for (name, gzip) in [("disks/short-gz", true), ("disks/short-plain", false)] {
        let line = fail(name, &short, gzip);
        assert!(line.contains("lies about its size"), "{name}: {line}");
    }
}

/// An uncompressed layer read by ranged GETs is downloaded once: the ranges the copy
/// reads are hashed for the layer's digest as they arrive (only what no read covered is
/// fetched again), counted by a proxy in front of the registry, for a raw disk and a
/// qcow2; and a byte changed in the registry's storage, in the middle of the disk or at
/// the layer's end, still fails the copy as corrupt.
#[test]
fn a_ranged_layer_is_downloaded_once_and_still_verified() {
    let dir = scratch_dir();
    let reg = Registry::start(dir.path());
    let proxy = reg.counting_proxy();
    let auth = dir.path().join("proxy-auth.json");
    write_auth_file(&auth, &proxy.host(), ferry_tests::registry_server::PASSWORD);
    let raw = dir.path().join("big.raw");
    sh("qemu-img", &["create", "-q", "-f", "raw", s(&raw), "48M"]);
    for cmd in ["write -P 0x61 0 20M", "write -P 0x62 30M 17M"] {
        sh("qemu-io", &["-f", "raw", "-c", cmd, s(&raw)]);
    }
    let (small_raw, qcow2) = make_disk(dir.path(), 0x71);
    for (tag, disk, want) in [("raw", &raw, &raw), ("qcow2", &qcow2, &small_raw)] {
        let tar = plain_tar(disk);
        reg.push_image("disks/once", tag, &tar, &tar, PLAIN_LAYER);
        let url = format!("docker://{}/disks/once:{tag}", proxy.host());
        let run = ferry_with_auth(&reg, &auth, &["info", "--json", &url]);
        run.assert_success();
        let info: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
        assert_eq!(info["registry"]["ranges"], true, "{info}");
        let layer = info["registry"]["layer"].as_str().unwrap().to_string();
        let (before, _) = proxy.blob_bytes_served(&layer);
        let out = dir.path().join(format!("once-{tag}.raw"));
        ferry_with_auth(&reg, &auth, &["copy", &url, s(&out)]).assert_success();
        qemu_img_compare(want, &out);
        let (after, gets) = proxy.blob_bytes_served(&layer);
        let served = after - before;
        let size = tar.len() as u64;
        println!("{tag}: {served} bytes of the {size}-byte layer served in {gets} GETs");
        // Every byte at least once (the digest needs them all); a second download of
        // the whole layer would be twice its size.
        assert!(
            served >= size && served <= size + size / 10 + MIB,
            "{tag}: {served} bytes of the {size}-byte layer served in {gets} GETs"
        );
    }

    // Changed bytes in the registry's storage: in the disk's data (read by ranges) and
    // in the layer's last byte (the tar's end, fetched only for the digest).
    let info: serde_json::Value = serde_json::from_str(
        &ferry_with_auth(
            &reg,
            &auth,
            &[
                "info",
                "--json",
                &format!("docker://{}/disks/once:raw", proxy.host()),
            ],
        )
        .assert_success()
        .stdout,
    )
    .unwrap();
    let layer = info["registry"]["layer"].as_str().unwrap().to_string();
    let blob = reg.blob_file(&layer);
    let original = std::fs::read(&blob).unwrap();
    let url = format!("docker://{}/disks/once:raw", proxy.host());
    for at in [(25 << 20) + 12345, original.len() - 1] {
        let mut changed = original.clone();
        changed[at] ^= 0x5a;
        std::fs::write(&blob, &changed).unwrap();
        let out = dir.path().join(format!("changed-{at}.raw"));
        let run = ferry_with_auth(&reg, &auth, &["copy", &url, s(&out)]);
        let line = run.assert_clean_failure().to_string();
        assert!(
            line.contains("does not match its digest") || line.contains("tar"),
            "byte {at}: {line}"
        );
    }
    std::fs::write(&blob, &original).unwrap();
}
