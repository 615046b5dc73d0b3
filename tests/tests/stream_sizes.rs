//! Compressed streams whose size shows only at their end (gzip; zstd compressed from a
//! pipe; xz from a server without ranges, whose index cannot be read first), copied and
//! hashed without `--source-size` or `--prescan`, as `curl URL | gunzip > disk.img` would:
//! into new files (their length set at the end, sparse), an S3 object (a multipart upload
//! completed at the stream's length), a larger existing file and a fixed-size NBD export
//! (the bytes past the stream left as they were), a smaller NBD export (a clear failure),
//! truncated and corrupt streams (`corrupt`, nothing reported as copied), and `ferry
//! checksum` (the raw image's block hash). The images are made by the real tools and
//! served by nginx; copies are compared with `qemu-img compare`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ferry_tests::bin::{wait_with_deadline, Run, DEFAULT_DEADLINE};
use ferry_tests::check::{assert_allocated_about, blkhash_file, qemu_img_compare, require_tool};
use ferry_tests::http_server::Nginx;
use ferry_tests::nbd_servers::{NbdServer, QemuNbd};
use ferry_tests::s3_server::{S3Server, ACCESS_KEY, SECRET_KEY};
use ferry_tests::{ferry, scratch_dir};

const MIB: u64 = 1 << 20;
/// Not a multiple of any block size, and zeroes at the end: the target's length can only
/// come from the stream's end.
const SIZE: u64 = 40 * MIB + 1000;
/// The non-zero bytes [`make_raw`] writes.
const DATA: u64 = 3 * MIB + MIB;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs `sh -c script` after checking `program` (from Debian package `package`) is there.
fn shell(package: &str, program: &str, script: &str) {
    require_tool(program, package);
    let out = Command::new("sh").args(["-c", script]).output().unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A sparse raw image of [`SIZE`] bytes: data at 0 (3 MiB) and 20 MiB (1 MiB), 2 MiB of
/// zeroes written as data at 10 MiB, holes elsewhere (the last 19 MiB too).
fn make_raw(path: &Path) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::create(path).unwrap();
    f.set_len(SIZE).unwrap();
    let run = |seed: u32, len: u64| -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8 | 1)
            .collect()
    };
    f.write_all_at(&run(1, 3 * MIB), 0).unwrap();
    f.write_all_at(&run(2, MIB), 20 * MIB).unwrap();
    f.write_all_at(&vec![0u8; 2 * MIB as usize], 10 * MIB)
        .unwrap();
}

/// The raw image and its .gz, .zst (from a pipe: no size in the frame) and .xz, served by
/// nginx.
struct Served {
    nginx: Nginx,
    raw: PathBuf,
}

fn serve() -> Served {
    let nginx = Nginx::start();
    let root = nginx.root();
    let raw = root.join("disk.raw");
    make_raw(&raw);
    let r = s(&raw);
    shell("gzip", "gzip", &format!("gzip -1 -c {r} > {r}.gz"));
    shell("zstd", "zstd", &format!("zstd -q -3 -c < {r} > {r}.zst"));
    shell("xz-utils", "xz", &format!("xz -0 -T1 -c {r} > {r}.xz"));
    Served { nginx, raw }
}

fn json(run: &Run) -> serde_json::Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {run}"))
}

/// What `ferry info` and `ferry copy --json` say of a stream of unknown size, and the copy
/// into a new file: the raw image, its length, sparse.
#[test]
fn gz_zst_and_unranged_xz_over_http_copy_into_new_files_at_their_length() {
    let served = serve();
    let scratch = scratch_dir();
    let url = served.nginx.url("disk.raw.gz");
    let info = ferry!().run(["info", "--json", url.as_str()]);
    info.assert_success();
    let info = json(&info);
    assert!(info["virtual_size"].is_null(), "{info}");
    assert_eq!(info["format"], "gz", "{info}");

    for (i, path) in ["disk.raw.gz", "disk.raw.zst", "noranges/disk.raw.xz"]
        .iter()
        .enumerate()
    {
        let out = scratch.path().join(format!("out-{i}.raw"));
        let url = served.nginx.url(path);
        let run = ferry!().run(["copy", "--no-progress", "--json", url.as_str(), s(&out)]);
        run.assert_success();
        let summary = json(&run);
        assert_eq!(summary["size"], SIZE, "{path}: {summary}");
        assert_eq!(summary["size_learned"], true, "{path}: {summary}");
        assert!(summary["target_size"].is_null(), "{path}: {summary}");
        assert_eq!(std::fs::metadata(&out).unwrap().len(), SIZE, "{path}");
        qemu_img_compare(&served.raw, &out);
        assert_allocated_about(&out, DATA);
    }

    // An existing file shorter than the stream grows to it.
    let out = scratch.path().join("shorter.raw");
    std::fs::write(&out, vec![0x77u8; 8 * MIB as usize]).unwrap();
    ferry!()
        .run(["copy", "--no-progress", url.as_str(), s(&out)])
        .assert_success();
    assert_eq!(std::fs::metadata(&out).unwrap().len(), SIZE);
    qemu_img_compare(&served.raw, &out);

    // Verified: the stream's block hash is taken in the copy's one pass.
    let out = scratch.path().join("verified.raw");
    let run = ferry!().run([
        "copy",
        "--no-progress",
        "--verify",
        "--json",
        url.as_str(),
        s(&out),
    ]);
    run.assert_success();
    let summary = json(&run);
    assert_eq!(
        summary["digests"]["source"].as_str(),
        Some(blkhash_file(&served.raw).as_str()),
        "{summary}"
    );
    qemu_img_compare(&served.raw, &out);

    // The human summary says the size was learned at the end.
    let out = scratch.path().join("text.raw");
    let run = ferry!().run(["copy", "--no-progress", url.as_str(), s(&out)]);
    run.assert_success();
    assert!(
        run.stdout
            .contains(&format!("size was learned at its end: {SIZE} bytes")),
        "{run}"
    );

    // Several targets need the size first.
    let (a, b) = (scratch.path().join("a.raw"), scratch.path().join("b.raw"));
    let run = ferry!().run(["copy", "--no-progress", url.as_str(), s(&a), s(&b)]);
    let line = run.assert_clean_failure();
    assert!(line.contains("--prescan"), "{line}");
    assert!(!a.exists() && !b.exists(), "a refused copy created targets");
    ferry!()
        .run([
            "copy",
            "--no-progress",
            "--prescan",
            url.as_str(),
            s(&a),
            s(&b),
        ])
        .assert_success();
    qemu_img_compare(&served.raw, &a);
    qemu_img_compare(&served.raw, &b);
}

/// An HTTP answer without Content-Length (chunked, no ranges) is a stream of unknown size:
/// raw and gz copy into new files at their length, the checksum is the raw image's, and
/// an image read by its tables (qcow2) is refused clearly.
#[test]
fn chunked_http_answers_without_a_length_are_streams_of_unknown_size() {
    let served = serve();
    let scratch = scratch_dir();
    let raw_url = served.nginx.url("chunked/disk.raw");
    let probe = Command::new("curl")
        .args(["-sS", "-D", "-", "-o", "/dev/null", raw_url.as_str()])
        .output()
        .unwrap();
    let headers = String::from_utf8_lossy(&probe.stdout).to_ascii_lowercase();
    assert!(
        headers.contains("transfer-encoding: chunked") && !headers.contains("content-length"),
        "nginx's /chunked/ answer is not chunked: {headers}"
    );

    let info = ferry!().run(["info", "--json", raw_url.as_str()]);
    info.assert_success();
    let info = json(&info);
    assert_eq!(info["format"], "raw", "{info}");
    assert!(info["virtual_size"].is_null(), "{info}");
    assert!(info["file_size"].is_null(), "{info}");

    for (i, path) in ["chunked/disk.raw", "chunked/disk.raw.gz"]
        .iter()
        .enumerate()
    {
        let out = scratch.path().join(format!("chunked-{i}.raw"));
        let url = served.nginx.url(path);
        let run = ferry!().run(["copy", "--no-progress", "--json", url.as_str(), s(&out)]);
        run.assert_success();
        let summary = json(&run);
        assert_eq!(summary["size"], SIZE, "{path}: {summary}");
        assert_eq!(summary["size_learned"], true, "{path}: {summary}");
        assert_eq!(std::fs::metadata(&out).unwrap().len(), SIZE, "{path}");
        qemu_img_compare(&served.raw, &out);
        assert_allocated_about(&out, DATA);
    }

    let run = ferry!().run(["checksum", "--no-progress", raw_url.as_str()]);
    run.assert_success();
    let want = blkhash_file(&served.raw);
    assert!(run.stdout.starts_with(&want), "{run}");

    let qcow2 = served.nginx.root().join("disk.qcow2");
    shell(
        "qemu-utils",
        "qemu-img",
        &format!(
            "qemu-img convert -f raw -O qcow2 {} {}",
            s(&served.raw),
            s(&qcow2)
        ),
    );
    let url = served.nginx.url("chunked/disk.qcow2");
    let out = scratch.path().join("chunked.qcow2.raw");
    let refused = ferry!().run(["copy", "--no-progress", url.as_str(), s(&out)]);
    // Before the refusal, the source's warning that it names no version (nginx sends no
    // ETag for a chunked answer) may come: the refusal is the last line.
    assert!(
        refused.status.code().is_some_and(|c| c != 0) && !refused.panicked(),
        "{refused}"
    );
    assert!(refused.stdout.trim().is_empty(), "{refused}");
    let line = refused.stderr.lines().last().unwrap_or_default();
    assert!(
        line.starts_with("ferry: ") && line.contains("qcow2") && line.contains("size is not known"),
        "{refused}"
    );
    assert!(!out.exists(), "a refused copy created its target");
}

/// `ferry checksum` of the streams is the raw image's block hash (and SHA-256).
#[test]
fn checksums_of_streams_of_unknown_size_are_the_raw_images() {
    let served = serve();
    let want = blkhash_file(&served.raw);
    for path in ["disk.raw.gz", "disk.raw.zst", "noranges/disk.raw.xz"] {
        let url = served.nginx.url(path);
        let run = ferry!().run(["checksum", "--no-progress", url.as_str()]);
        run.assert_success();
        assert!(run.stdout.starts_with(&want), "{path}: {run}");
    }
    let url = served.nginx.url("disk.raw.gz");
    let run = ferry!().run([
        "checksum",
        "--no-progress",
        "--algorithm",
        "sha256",
        url.as_str(),
    ]);
    run.assert_success();
    let sha = ferry_tests::check::sha256_file(&served.raw);
    assert!(run.stdout.starts_with(&sha), "{run}");
}

/// Into a larger existing file and a larger NBD export the stream is written up to its
/// end and the rest is left as it was; into a smaller export the copy fails and says so.
#[test]
fn fixed_size_targets_take_what_fits_and_refuse_a_longer_stream() {
    let served = serve();
    let scratch = scratch_dir();
    let url = served.nginx.url("disk.raw.gz");
    let raw = std::fs::read(&served.raw).unwrap();
    let larger = 48 * MIB;
    let filled = |path: &Path, len: u64| {
        std::fs::write(path, vec![0x77u8; len as usize]).unwrap();
    };
    let check_prefix = |path: &Path, len: u64| {
        let got = std::fs::read(path).unwrap();
        assert_eq!(got.len() as u64, len, "{}", path.display());
        assert!(got[..SIZE as usize] == raw[..], "the stream's bytes differ");
        assert!(
            got[SIZE as usize..].iter().all(|&b| b == 0x77),
            "the bytes past the stream were changed"
        );
    };

    // An existing larger file keeps its size and its bytes past the stream.
    let file = scratch.path().join("existing.raw");
    filled(&file, larger);
    let run = ferry!().run(["copy", "--no-progress", "--json", url.as_str(), s(&file)]);
    run.assert_success();
    assert_eq!(json(&run)["size"], SIZE, "{run}");
    check_prefix(&file, larger);

    // A larger NBD export: written up to the stream's end; the summary says how long.
    let export = scratch.path().join("export.raw");
    filled(&export, larger);
    let nbd = NbdServer::qemu_nbd(
        &export,
        &QemuNbd {
            export: "big".into(),
            ..QemuNbd::default()
        },
    );
    let run = ferry!().run([
        "copy",
        "--no-progress",
        "--json",
        url.as_str(),
        nbd.uri().as_str(),
    ]);
    run.assert_success();
    let summary = json(&run);
    assert_eq!(summary["size"], SIZE, "{summary}");
    assert_eq!(summary["target_size"], larger, "{summary}");
    let run = ferry!().run(["copy", "--no-progress", url.as_str(), nbd.uri().as_str()]);
    run.assert_success();
    assert!(
        run.stdout.contains(&format!(
            "the target's other {} bytes (of {larger}) were left as they were",
            larger - SIZE
        )),
        "{run}"
    );
    drop(nbd);
    check_prefix(&export, larger);

    // A smaller export: the copy fails, naming the target's size.
    let small = scratch.path().join("small.raw");
    filled(&small, 32 * MIB);
    let nbd = NbdServer::qemu_nbd(
        &small,
        &QemuNbd {
            export: "small".into(),
            ..QemuNbd::default()
        },
    );
    let run = ferry!().run([
        "copy",
        "--no-progress",
        "--json",
        url.as_str(),
        nbd.uri().as_str(),
    ]);
    let line = run.assert_clean_failure();
    assert!(
        line.contains(&format!(
            "the source is longer than the target's {} bytes",
            32 * MIB
        )),
        "{line}"
    );
    assert!(
        run.stdout.is_empty(),
        "a failed copy printed a summary: {run}"
    );
}

/// A truncated and a corrupt gzip stream fail clearly (the job service reports them with
/// kind `corrupt`: service_formats.rs), with no summary and a non-zero exit.
#[test]
fn truncated_and_corrupt_streams_fail_as_corrupt() {
    let served = serve();
    let root = served.nginx.root();
    let gz = std::fs::read(root.join("disk.raw.gz")).unwrap();
    std::fs::write(root.join("cut.raw.gz"), &gz[..gz.len() * 2 / 3]).unwrap();
    // A flipped byte of the CRC-32 in the trailer: every byte decompresses, and the
    // stream still does not match its checksum (a flip in the deflate data may decode to
    // the same bytes, which gzip -t accepts too).
    let mut bad = gz.clone();
    let at = bad.len() - 6;
    bad[at] ^= 0xff;
    std::fs::write(root.join("bad.raw.gz"), &bad).unwrap();
    let scratch = scratch_dir();
    for name in ["cut.raw.gz", "bad.raw.gz"] {
        let url = served.nginx.url(name);
        let out = scratch.path().join(format!("{name}.out"));
        let run = ferry!().run(["copy", "--no-progress", "--json", url.as_str(), s(&out)]);
        let line = run.assert_clean_failure().to_string();
        assert!(
            line.contains("gz stream does not decompress"),
            "{name}: {line}"
        );
        if name.starts_with("cut") {
            assert!(line.contains("truncated"), "{name}: {line}");
        }
        assert!(
            run.stdout.is_empty(),
            "{name}: a summary was printed: {run}"
        );
        let run = ferry!().run(["checksum", "--no-progress", url.as_str()]);
        let line = run.assert_clean_failure().to_string();
        assert!(
            line.contains("gz stream does not decompress"),
            "{name}: {line}"
        );
    }
}

/// Runs ferry with the S3 server's settings in the SDK's standard environment.
async fn s3_ferry(server: &S3Server, args: &[&str]) -> Run {
    let empty = server.root().join("empty-aws-config");
    std::fs::write(&empty, "").unwrap();
    let mut cmd = ferry!().command(args);
    cmd.env("AWS_ENDPOINT_URL", server.endpoint_url())
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_CONFIG_FILE", &empty)
        .env("AWS_SHARED_CREDENTIALS_FILE", &empty)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_SESSION_TOKEN")
        .stdin(Stdio::null());
    let description = format!("{cmd:?}");
    let child = cmd.spawn().unwrap();
    tokio::task::spawn_blocking(move || wait_with_deadline(child, DEFAULT_DEADLINE, description))
        .await
        .unwrap()
}

/// Into S3: a multipart upload of 16 MiB parts whose last, short part is sent at the
/// stream's end; the object is the raw image, and no upload is left behind. An empty
/// stream makes an empty object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_unknown_size_is_uploaded_to_s3_at_its_length() {
    let server = S3Server::start().await;
    server.create_bucket("images");
    let scratch = scratch_dir();
    let raw = scratch.path().join("disk.raw");
    make_raw(&raw);
    let r = s(&raw);
    shell("gzip", "gzip", &format!("gzip -1 -c {r} > {r}.gz"));
    let gz = format!("{r}.gz");
    let run = s3_ferry(
        &server,
        &[
            "copy",
            "--no-progress",
            "--json",
            "--verify",
            &gz,
            "s3://images/disk.raw",
        ],
    )
    .await;
    run.assert_success();
    assert_eq!(json(&run)["size"], SIZE, "{run}");
    let object = server.object_path("images", "disk.raw");
    assert_eq!(std::fs::metadata(&object).unwrap().len(), SIZE);
    qemu_img_compare(&raw, &object);
    assert!(server.pending_uploads().is_empty(), "an upload was left");

    let empty = scratch.path().join("empty.raw");
    std::fs::write(&empty, b"").unwrap();
    shell("gzip", "gzip", &format!("gzip -c {0} > {0}.gz", s(&empty)));
    let run = s3_ferry(
        &server,
        &[
            "copy",
            "--no-progress",
            &format!("{}.gz", s(&empty)),
            "s3://images/empty.raw",
        ],
    )
    .await;
    run.assert_success();
    assert_eq!(
        std::fs::metadata(server.object_path("images", "empty.raw"))
            .unwrap()
            .len(),
        0
    );
    assert!(server.pending_uploads().is_empty(), "an upload was left");
}

/// A containerDisk whose gzip layer holds a raw disk: the tar header gives the disk's
/// size, so the size is known before the copy (no `--source-size`, nothing learned at
/// the end), and the copy and checksum are the raw image's.
#[test]
fn a_raw_disk_in_a_gzip_registry_layer_has_its_size_from_the_tar_header() {
    use ferry_tests::registry_server::{gzip, tar_end, tar_entry, Registry};
    let scratch = scratch_dir();
    let reg = Registry::start(scratch.path());
    let raw = scratch.path().join("disk.img");
    make_raw(&raw);
    let data = std::fs::read(&raw).unwrap();
    let mut tar = tar_entry("disk/disk.img", data.len() as u64, &data);
    tar.extend(tar_end());
    reg.push_image(
        "disks/raw",
        "gz",
        &tar,
        &gzip(&tar),
        "application/vnd.oci.image.layer.v1.tar+gzip",
    );
    let url = format!("{}:gz", reg.url("disks/raw"));
    let with_registry = |args: &[&str]| {
        let mut cmd = ferry!().command(args);
        cmd.env("FERRY_REGISTRY_AUTH_FILE", reg.auth_file())
            .env("FERRY_REGISTRY_CA_FILE", reg.ca_file());
        let description = format!("{cmd:?}");
        wait_with_deadline(cmd.spawn().unwrap(), DEFAULT_DEADLINE, description)
    };
    let info = with_registry(&["info", "--json", &url]);
    info.assert_success();
    let info = json(&info);
    assert_eq!(info["format"], "raw", "{info}");
    assert_eq!(info["virtual_size"], SIZE, "{info}");
    assert_eq!(info["registry"]["layer_compression"], "gzip", "{info}");
    let out = scratch.path().join("out.raw");
    let run = with_registry(&["copy", "--no-progress", "--json", &url, s(&out)]);
    run.assert_success();
    let summary = json(&run);
    assert_eq!(summary["size"], SIZE, "{summary}");
    assert!(summary["size_learned"].is_null(), "{summary}");
    qemu_img_compare(&raw, &out);
    assert_allocated_about(&out, DATA);
    let run = with_registry(&["checksum", "--no-progress", &url]);
    run.assert_success();
    assert!(run.stdout.starts_with(&blkhash_file(&raw)), "{run}");
}
