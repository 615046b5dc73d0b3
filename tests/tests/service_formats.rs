//! Image formats through the job service: a qcow2 image (with and without its backing
//! file allowed) and a .zst image transferred by jobs and compared with the originals by
//! `qemu-img compare`, a checksum job of a compressed image, and the format options
//! refused where they do not belong. A registry source's options and an OVA's disk both
//! on the wire and through `ferry job start`'s flags.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ferry_api::proto::{self, ImageFormat, JobState};
use ferry_tests::check::require_tool;
use ferry_tests::service_support::*;
use tonic::Code;

const LIMIT: Duration = Duration::from_secs(120);
const MIB: u64 = 1 << 20;

fn sh(package: &str, program: &str, args: &[&str]) -> Vec<u8> {
    require_tool(program, package);
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A 32 MiB qcow2 with data, a zero range and holes.
fn make_qcow2(path: &Path, backing: Option<&Path>) {
    let mut args = vec!["create", "-q", "-f", "qcow2"];
    if let Some(b) = backing {
        args.extend(["-b", s(b), "-F", "qcow2"]);
    }
    args.extend([s(path), "32M"]);
    sh("qemu-utils", "qemu-img", &args);
    for cmd in [
        "write -P 0x31 0 2M",
        "write -z 2M 1M",
        "write -P 0x32 20M 64k",
    ] {
        sh(
            "qemu-utils",
            "qemu-io",
            &["-f", "qcow2", "-c", cmd, s(path)],
        );
    }
}

fn compare(format: &str, image: &Path, raw: &Path) {
    sh(
        "qemu-utils",
        "qemu-img",
        &["compare", "-f", format, "-F", "raw", s(image), s(raw)],
    );
}

/// `ferry job --server ADDR ARGS` (the binary under test), run off the runtime's thread:
/// the service under test runs on it.
async fn ferry_job(addr: std::net::SocketAddr, args: &[&str]) -> ferry_tests::bin::Run {
    let server = format!("http://{addr}");
    let mut all = vec!["job", "--server", server.as_str()];
    all.extend_from_slice(args);
    let all: Vec<String> = all.iter().map(ToString::to_string).collect();
    tokio::task::spawn_blocking(move || ferry_tests::ferry!().run(all))
        .await
        .unwrap()
}

/// The final job of a `--watch --json` run (it prints a line per state).
fn last_job(run: &ferry_tests::bin::Run) -> serde_json::Value {
    let line = run
        .stdout
        .lines()
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or_else(|| panic!("no output: {run}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {run}"))
}

struct Env {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    service: ferry_server::server::RunningService,
    client: Client,
}

async fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("images");
    std::fs::create_dir(&root).unwrap();
    let service = start_in_process(test_config(&dir.path().join("data"), &root)).await;
    let client = connect(service.grpc_addr()).await;
    Env {
        _dir: dir,
        root,
        service,
        client,
    }
}

impl Env {
    /// Runs a transfer to its end.
    async fn run(&mut self, req: proto::StartTransferRequest) -> proto::Job {
        let job = self.client.start_transfer(req).await.unwrap().into_inner();
        wait_terminal(&mut self.client, &job.id, LIMIT).await
    }
}

fn with_source(
    mut req: proto::StartTransferRequest,
    edit: impl FnOnce(&mut proto::Endpoint),
) -> proto::StartTransferRequest {
    edit(req.source.as_mut().unwrap());
    req
}

#[tokio::test]
async fn qcow2_and_zst_sources_are_transferred_as_their_images() {
    let mut e = env().await;
    let base = e.root.join("base.qcow2");
    make_qcow2(&base, None);
    let top = e.root.join("top.qcow2");
    sh(
        "qemu-utils",
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-b",
            "base.qcow2",
            "-F",
            "qcow2",
            s(&top),
            "32M",
        ],
    );
    sh(
        "qemu-utils",
        "qemu-io",
        &["-f", "qcow2", "-c", "write -P 0x44 1M 512k", s(&top)],
    );

    // qcow2, detected by magic: the guest's disk, not the file.
    let out = e.root.join("base.raw");
    let mut req = transfer(&base, &out);
    req.options.as_mut().unwrap().verify = true;
    let done = e.run(req).await;
    assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
    compare("qcow2", &base, &out);

    // A backing file is refused unless allowed, then followed (under the allowed root).
    let out = e.root.join("top.raw");
    let done = e.run(transfer(&top, &out)).await;
    assert_eq!(state(&done), JobState::Failed);
    let error = done.error.unwrap();
    assert_eq!(error.kind, "unsupported");
    assert!(error.message.contains("allow"), "{}", error.message);
    let _ = std::fs::remove_file(&out);
    let done = e
        .run(with_source(transfer(&top, &out), |s| {
            s.allow_backing = true
        }))
        .await;
    assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
    compare("qcow2", &top, &out);

    // format RAW copies the qcow2 file itself.
    let out = e.root.join("file.bin");
    let req = with_source(transfer(&base, &out), |s| {
        s.format = ImageFormat::Raw as i32
    });
    let done = e.run(req).await;
    assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
    assert!(std::fs::read(&base).unwrap() == std::fs::read(&out).unwrap());

    // A .zst of the raw image, named explicitly and detected.
    let raw = e.root.join("base.raw");
    let zst = e.root.join("base.raw.zst");
    std::fs::write(&zst, sh("zstd", "zstd", &["-q", "-c", s(&raw)])).unwrap();
    let out = e.root.join("from-zst.raw");
    let req = with_source(transfer(&zst, &out), |s| s.format = ImageFormat::Zst as i32);
    let done = e.run(req).await;
    assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
    compare("raw", &raw, &out);
    let Some(proto::job::Result::TransferResult(r)) = &done.result else {
        panic!("no transfer result: {done:?}")
    };
    assert_eq!(r.size, 32 * MIB);
    assert!(
        r.zero_bytes > 0,
        "the zeroes of the stream were skipped: {r:?}"
    );

    // A checksum job reads the image the stream holds.
    let ck = e
        .client
        .start_checksum(checksum(&zst))
        .await
        .unwrap()
        .into_inner();
    let ck = wait_terminal(&mut e.client, &ck.id, LIMIT).await;
    let ck_raw = e
        .client
        .start_checksum(checksum(&raw))
        .await
        .unwrap()
        .into_inner();
    let ck_raw = wait_terminal(&mut e.client, &ck_raw.id, LIMIT).await;
    let digest = |j: &proto::Job| match &j.result {
        Some(proto::job::Result::ChecksumResult(c)) => c.digest.clone().unwrap().hex,
        other => panic!("no checksum result: {other:?} {:?}", j.error),
    };
    assert_eq!(digest(&ck), digest(&ck_raw));

    // A gzip stream does not record its size: the job learns it at the stream's end (the
    // target file is sized to it then), verified, and its progress has the total at the end.
    let gz = e.root.join("base.raw.gz");
    std::fs::write(&gz, sh("gzip", "gzip", &["-1", "-c", s(&raw)])).unwrap();
    let out = e.root.join("from-gz.raw");
    let mut req = transfer(&gz, &out);
    req.options.as_mut().unwrap().verify = true;
    let done = e.run(req).await;
    assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
    compare("raw", &raw, &out);
    assert_eq!(std::fs::metadata(&out).unwrap().len(), 32 * MIB);
    let Some(proto::job::Result::TransferResult(r)) = &done.result else {
        panic!("no transfer result: {done:?}")
    };
    assert_eq!(r.size, 32 * MIB);
    assert_eq!(
        r.source_digest.as_ref().map(|d| d.hex.clone()),
        Some(digest(&ck_raw)),
        "{r:?}"
    );
    let progress = done.progress.unwrap();
    assert_eq!(progress.total_bytes, 32 * MIB, "{progress:?}");
    // A checksum job of the stream: the raw image's digest and size.
    let ck_gz = e
        .client
        .start_checksum(checksum(&gz))
        .await
        .unwrap()
        .into_inner();
    let ck_gz = wait_terminal(&mut e.client, &ck_gz.id, LIMIT).await;
    assert_eq!(digest(&ck_gz), digest(&ck_raw));
    match &ck_gz.result {
        Some(proto::job::Result::ChecksumResult(c)) => assert_eq!(c.size, 32 * MIB),
        other => panic!("no checksum result: {other:?}"),
    }
    // A truncated stream fails the job as corrupt.
    let gz_bytes = std::fs::read(&gz).unwrap();
    let cut = e.root.join("cut.raw.gz");
    std::fs::write(&cut, &gz_bytes[..gz_bytes.len() / 2]).unwrap();
    let done = e.run(transfer(&cut, &e.root.join("from-cut.raw"))).await;
    assert_eq!(state(&done), JobState::Failed);
    let error = done.error.unwrap();
    assert_eq!(error.kind, "corrupt", "{}", error.message);
    assert!(error.message.contains("truncated"), "{}", error.message);
    // With the size given, as before.
    let out = e.root.join("from-gz-sized.raw");
    let req = with_source(transfer(&gz, &out), |s| s.image_size = Some(32 * MIB));
    let done = e.run(req).await;
    assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
    compare("raw", &raw, &out);

    // A wrong format fails the job with the reason.
    let out = e.root.join("wrong.raw");
    let req = with_source(transfer(&zst, &out), |s| s.format = ImageFormat::Xz as i32);
    let done = e.run(req).await;
    assert_eq!(state(&done), JobState::Failed);
    let error = done.error.unwrap();
    assert_eq!(error.kind, "invalid_input");
    assert!(error.message.contains("not xz"), "{}", error.message);

    // The service counts image bytes by the format it read (and the scheme).
    let text = scrape_metrics(e.service.metrics_addr().unwrap()).await;
    let metrics = parse_metrics(&text);
    for format in ["qcow2", "raw", "zst", "gz"] {
        let labels = [("format", format), ("endpoint", "file")];
        let read = sample(&metrics, "ferry_image_read_bytes_total", &labels)
            .unwrap_or_else(|| panic!("no {format} image bytes in\n{text}"));
        assert!(read >= MIB as f64, "{format}: {read}");
    }
    e.service.shutdown().await;
}

#[tokio::test]
async fn format_options_are_refused_on_targets_and_out_of_range() {
    let mut e = env().await;
    let src = make_image(&e.root.join("src.img"), 4 * MIB, 3);
    let dst = e.root.join("dst.img");
    let mut req = transfer(&src, &dst);
    req.target.as_mut().unwrap().format = ImageFormat::Qcow2 as i32;
    let status = e.client.start_transfer(req).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("sources only"), "{status:?}");
    let req = with_source(transfer(&src, &dst), |s| s.format = 99);
    let status = e.client.start_transfer(req).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    e.service.shutdown().await;
}

/// A 64 MiB raw disk with 5 MiB of data, and its qcow2 (a containerDisk's disk).
fn make_disk(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let raw = dir.join("disk.raw");
    sh(
        "qemu-utils",
        "qemu-img",
        &["create", "-q", "-f", "raw", s(&raw), "64M"],
    );
    for cmd in ["write -P 0x51 1M 3M", "write -P 0x52 40M 2M"] {
        sh("qemu-utils", "qemu-io", &["-f", "raw", "-c", cmd, s(&raw)]);
    }
    let qcow2 = dir.join("disk.qcow2");
    sh(
        "qemu-utils",
        "qemu-img",
        &["convert", "-f", "raw", "-O", "qcow2", s(&raw), s(&qcow2)],
    );
    (raw, qcow2)
}

/// A containerDisk in the local docker-registry (TLS from a test CA, basic auth) read by
/// jobs: the registry options on the wire (credentials and CA files under the allowed
/// roots), the digest pinned as the job's source version, a checksum job; refused: an
/// auth file outside the allowed roots, registry options on a file source, a registry
/// target; a wrong password fails the job as `permission_denied` without the password.
#[tokio::test]
async fn registry_sources_are_read_with_their_options_on_the_wire() {
    use ferry_tests::registry_server::{write_auth_file, Registry};
    let mut e = env().await;
    let scratch = tempfile::tempdir().unwrap();
    let reg = Registry::start(scratch.path());
    let (raw, qcow2) = make_disk(scratch.path());
    reg.build("svc-disk", &qcow2, "amd64");
    reg.push("svc-disk", "disks/svc:v1", "gzip");
    let url = format!("{}:v1", reg.url("disks/svc"));
    let auth = e.root.join("auth.json");
    let ca = e.root.join("ca.pem");
    std::fs::copy(reg.auth_file(), &auth).unwrap();
    std::fs::copy(reg.ca_file(), &ca).unwrap();
    let registry = |auth: &Path| proto::RegistryOptions {
        auth_file: s(auth).into(),
        ca_file: s(&ca).into(),
        insecure: false,
        platform: "linux/amd64".into(),
    };
    let request = |out: &Path, options: proto::RegistryOptions| {
        with_source(transfer(out, out), |src| {
            src.url = url.clone();
            src.options = Some(proto::endpoint::Options::Registry(options));
        })
    };

    let out = e.root.join("registry.raw");
    let mut req = request(&out, registry(&auth));
    req.options.as_mut().unwrap().verify = true;
    let done = e.run(req).await;
    assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
    compare("raw", &raw, &out);

    // A checksum job of the image: the raw disk's block hash.
    let mut sum = checksum(&out);
    sum.source = Some(proto::Endpoint {
        url: url.clone(),
        options: Some(proto::endpoint::Options::Registry(registry(&auth))),
        ..Default::default()
    });
    let job = e.client.start_checksum(sum).await.unwrap().into_inner();
    let done = wait_terminal(&mut e.client, &job.id, LIMIT).await;
    assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
    let want = ferry_tests::check::blkhash_file(&raw);
    match &done.result {
        Some(proto::job::Result::ChecksumResult(c)) => {
            assert_eq!(c.digest.clone().unwrap().hex, want)
        }
        other => panic!("no checksum result: {other:?}"),
    }

    // Refused at the request: an auth file outside the allowed roots, registry options
    // on a file source, a registry URL as a target.
    let outside = scratch.path().join("auth-outside.json");
    std::fs::copy(reg.auth_file(), &outside).unwrap();
    let status = e
        .client
        .start_transfer(request(&e.root.join("x.raw"), registry(&outside)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("auth_file"), "{status:?}");
    let img = e.root.join("plain.raw");
    std::fs::write(&img, vec![1u8; 4096]).unwrap();
    let mut req = transfer(&img, &e.root.join("y.raw"));
    req.source.as_mut().unwrap().options =
        Some(proto::endpoint::Options::Registry(registry(&auth)));
    let status = e.client.start_transfer(req).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let mut req = transfer(&img, &img);
    req.target.as_mut().unwrap().url = url.clone();
    let status = e.client.start_transfer(req).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    // The same through `ferry job start`'s flags: the copy, compared; the platform
    // checked by the server; the flags refused on a file source before any request.
    let addr = e.service.grpc_addr();
    let out = e.root.join("cli.raw");
    let run = ferry_job(
        addr,
        &[
            "start",
            &url,
            s(&out),
            "--registry-auth-file",
            s(&auth),
            "--registry-ca-file",
            s(&ca),
            "--platform",
            "linux/amd64",
            "--verify",
            "--watch",
            "--json",
        ],
    )
    .await;
    run.assert_success();
    assert_eq!(last_job(&run)["state"], "succeeded", "{run}");
    compare("raw", &raw, &out);
    // Without the CA file the registry's certificate is not trusted: the flag is what
    // made the copy above work.
    let run = ferry_job(
        addr,
        &[
            "start",
            &url,
            s(&e.root.join("no-ca.raw")),
            "--registry-auth-file",
            s(&auth),
            "--watch",
            "--json",
        ],
    )
    .await;
    assert!(!run.status.success(), "{run}");
    assert_eq!(last_job(&run)["state"], "failed", "{run}");
    let run = ferry_job(
        addr,
        &[
            "start",
            &url,
            s(&e.root.join("arm.raw")),
            "--registry-auth-file",
            s(&auth),
            "--registry-ca-file",
            s(&ca),
            "--platform",
            "linux",
        ],
    )
    .await;
    let line = run.assert_clean_failure();
    assert!(line.contains("registry.platform"), "{run}");
    let run = ferry_job(
        addr,
        &[
            "start",
            s(&img),
            s(&e.root.join("w.raw")),
            "--registry-insecure",
        ],
    )
    .await;
    let line = run.assert_clean_failure();
    assert!(line.contains("docker://"), "{run}");

    // A wrong password: the job fails as permission denied, the password nowhere.
    let bad = e.root.join("bad-auth.json");
    write_auth_file(&bad, &reg.host(), "not-the-password-9431");
    let done = e
        .run(request(&e.root.join("bad.raw"), registry(&bad)))
        .await;
    assert_eq!(state(&done), JobState::Failed);
    let error = done.error.unwrap();
    assert_eq!(error.kind, "permission_denied", "{error:?}");
    assert!(!format!("{error:?}").contains("not-the-password-9431"));
}

/// An OVA with two disks: a job without `disk` fails naming it; `disk: 1` reads the
/// second; `disk` on a target is refused.
#[tokio::test]
async fn an_ova_disk_is_chosen_on_the_wire() {
    let mut e = env().await;
    let (raw, _) = make_disk(&e.root);
    let mut refs = String::new();
    for (i, d) in ["a.vmdk", "b.vmdk"].iter().enumerate() {
        refs += &format!("    <File ovf:href=\"{d}\" ovf:id=\"file{i}\"/>\n");
        sh(
            "qemu-utils",
            "qemu-img",
            &[
                "convert",
                "-f",
                "raw",
                "-O",
                "vmdk",
                "-o",
                "subformat=streamOptimized",
                s(&raw),
                s(&e.root.join(d)),
            ],
        );
    }
    std::fs::write(
        e.root.join("vm.ovf"),
        format!(
            "<?xml version=\"1.0\"?>\n<Envelope xmlns:ovf=\"http://schemas.dmtf.org/ovf/envelope/1\">\n  <References>\n{refs}  </References>\n</Envelope>\n"
        ),
    )
    .unwrap();
    let ova = e.root.join("vm.ova");
    sh(
        "tar",
        "tar",
        &[
            "-C",
            s(&e.root),
            "-cf",
            s(&ova),
            "vm.ovf",
            "a.vmdk",
            "b.vmdk",
        ],
    );

    let out = e.root.join("ova.raw");
    let done = e.run(transfer(&ova, &out)).await;
    assert_eq!(state(&done), JobState::Failed);
    let error = done.error.unwrap();
    assert!(error.message.contains("disk"), "{error:?}");

    let done = e
        .run(with_source(transfer(&ova, &out), |src| src.disk = Some(1)))
        .await;
    assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
    compare("raw", &raw, &out);

    // `ferry job start --disk`: the first disk now (the wire's `disk: 0`), compared; a
    // disk the OVA does not have fails the job naming it.
    let addr = e.service.grpc_addr();
    let out = e.root.join("cli-ova.raw");
    let run = ferry_job(
        addr,
        &[
            "start",
            s(&ova),
            s(&out),
            "--disk",
            "0",
            "--watch",
            "--json",
        ],
    )
    .await;
    run.assert_success();
    assert_eq!(last_job(&run)["state"], "succeeded", "{run}");
    compare("raw", &raw, &out);
    let run = ferry_job(
        addr,
        &[
            "start",
            s(&ova),
            s(&e.root.join("cli-ova-7.raw")),
            "--disk",
            "7",
            "--watch",
            "--json",
        ],
    )
    .await;
    assert!(!run.status.success(), "{run}");
    let job = last_job(&run);
    assert_eq!(job["state"], "failed", "{run}");
    assert!(
        job["error"]["message"].to_string().contains("--disk 7"),
        "{run}"
    );

    let mut req = transfer(&ova, &e.root.join("z.raw"));
    req.target.as_mut().unwrap().disk = Some(0);
    let status = e.client.start_transfer(req).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
}
