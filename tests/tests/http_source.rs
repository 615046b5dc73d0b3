//! `http://` and `https://` sources against nginx (ranges, TLS with a test CA, basic
//! authentication, a location without ranges, redirects) and against a server that
//! misbehaves on purpose (tests/src/http_faults.rs): every copy is checked byte for byte.

use std::path::{Path, PathBuf};
use std::process::Command;

use ferry_tests::check::{assert_allocated_about, blkhash_file, qemu_img_compare, require_tool};
use ferry_tests::http_faults::{Fault, FaultServer};
use ferry_tests::http_server::{Nginx, PASSWORD, USER};
use ferry_tests::images::{self, Image, Pattern};
use ferry_tests::{ferry, scratch_dir};

const MIB: u64 = 1024 * 1024;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

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

/// Runs ferry with `env` set (and no FERRY_HTTP_* from the caller's environment).
fn run(args: &[&str], env: &[(&str, &str)]) -> ferry_tests::bin::Run {
    let mut cmd = ferry!().command(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("FERRY_HTTP_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let description = format!("{cmd:?}");
    let child = cmd.spawn().expect("start ferry");
    ferry_tests::bin::wait_with_deadline(child, ferry_tests::bin::DEFAULT_DEADLINE, description)
}

/// A half-data image served by `nginx` as `name` (and kept under `scratch`).
fn serve_image(nginx: &Nginx, name: &str, size: u64) -> Image {
    let path = nginx.root().join(name);
    images::make(&path, Pattern::HalfData, size, 7).unwrap()
}

#[test]
fn copies_a_sparse_image_with_parallel_ranges() {
    let nginx = Nginx::start();
    let img = serve_image(&nginx, "disk.img", 64 * MIB + 4096);
    let scratch = scratch_dir();
    let out = scratch.path().join("out.img");
    run(
        &["copy", "--no-progress", &nginx.url("disk.img"), s(&out)],
        &[],
    )
    .assert_success();
    qemu_img_compare(&img.path, &out);
    assert_allocated_about(&out, img.nonzero_block_bytes);

    // Small requests: many ranged GETs in parallel, the same bytes.
    let small = scratch.path().join("small.img");
    run(
        &[
            "copy",
            "--no-progress",
            "--request-size",
            "64K",
            &nginx.url("disk.img"),
            s(&small),
        ],
        &[],
    )
    .assert_success();
    qemu_img_compare(&img.path, &small);

    let out = run(&["info", "--json", &nginx.url("disk.img")], &[]);
    out.assert_success();
    assert!(out.stdout.contains(&(64 * MIB + 4096).to_string()), "{out}");
}

#[test]
fn https_needs_the_ca() {
    let nginx = Nginx::start();
    let img = serve_image(&nginx, "tls.img", 8 * MIB);
    let scratch = scratch_dir();
    let out = scratch.path().join("out.img");
    let url = nginx.https_url("tls.img");
    let ca = nginx.ca_file();
    run(
        &["copy", "--no-progress", &url, s(&out)],
        &[("FERRY_HTTP_CA_FILE", s(&ca))],
    )
    .assert_success();
    qemu_img_compare(&img.path, &out);

    let failed = run(
        &[
            "copy",
            "--no-progress",
            &url,
            s(&scratch.path().join("no.img")),
        ],
        &[],
    );
    let line = failed.assert_clean_failure();
    assert!(line.contains("TLS with localhost"), "{line}");
    assert!(line.contains("certificate"), "{line}");
    assert!(line.contains("FERRY_HTTP_CA_FILE"), "{line}");
}

#[test]
fn basic_authentication() {
    let nginx = Nginx::start();
    let img = serve_image(&nginx, "private/auth.img", 4 * MIB);
    let scratch = scratch_dir();
    let pw = scratch.path().join("pw");
    std::fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    let wrong = scratch.path().join("wrong");
    std::fs::write(&wrong, "not-the-password-42\n").unwrap();
    let url = nginx.url("private/auth.img");
    let out = scratch.path().join("out.img");
    run(
        &["copy", "--no-progress", &url, s(&out)],
        &[
            ("FERRY_HTTP_USER", USER),
            ("FERRY_HTTP_PASSWORD_FILE", s(&pw)),
        ],
    )
    .assert_success();
    qemu_img_compare(&img.path, &out);

    let failed = run(
        &[
            "copy",
            "--no-progress",
            &url,
            s(&scratch.path().join("x.img")),
        ],
        &[
            ("FERRY_HTTP_USER", USER),
            ("FERRY_HTTP_PASSWORD_FILE", s(&wrong)),
        ],
    );
    let line = failed.assert_clean_failure();
    assert!(line.contains("refused the credentials"), "{line}");
    assert!(line.contains("401"), "{line}");
    assert!(!failed.stderr.contains("not-the-password-42"), "{failed}");

    let inline = format!("http://{USER}:{PASSWORD}@{}", &url["http://".len()..]);
    let failed = run(
        &[
            "copy",
            "--no-progress",
            &inline,
            s(&scratch.path().join("y.img")),
        ],
        &[],
    );
    let line = failed.assert_clean_failure();
    assert!(line.contains("user information"), "{line}");
    assert!(!line.contains(PASSWORD), "{line}");

    let missing = run(
        &["checksum", "--no-progress", &nginx.url("nothing.img")],
        &[],
    );
    assert!(!missing.status.success(), "{missing}");
    assert!(missing.stderr.contains("no object at"), "{missing}");
}

#[test]
fn a_server_without_ranges_is_read_as_one_stream() {
    let nginx = Nginx::start();
    let img = serve_image(&nginx, "stream.img", 24 * MIB + 512);
    let scratch = scratch_dir();
    let out = scratch.path().join("out.img");
    run(
        &[
            "copy",
            "--no-progress",
            &nginx.url("noranges/stream.img"),
            s(&out),
        ],
        &[],
    )
    .assert_success();
    qemu_img_compare(&img.path, &out);
    assert_allocated_about(&out, img.nonzero_block_bytes);
    let sum = run(
        &[
            "checksum",
            "--no-progress",
            &nginx.url("noranges/stream.img"),
        ],
        &[],
    );
    sum.assert_success();
    assert!(sum.stdout.contains(&blkhash_file(&img.path)), "{sum}");
}

#[test]
fn redirects_are_followed_within_limits() {
    let nginx = Nginx::start();
    let img = serve_image(&nginx, "moved.img", 4 * MIB);
    let scratch = scratch_dir();
    let out = scratch.path().join("out.img");
    run(
        &[
            "copy",
            "--no-progress",
            &nginx.url("redirect/moved.img"),
            s(&out),
        ],
        &[],
    )
    .assert_success();
    qemu_img_compare(&img.path, &out);

    let looped = run(
        &[
            "copy",
            "--no-progress",
            &nginx.url("loop/moved.img"),
            s(&scratch.path().join("l.img")),
        ],
        &[],
    );
    let line = looped.assert_clean_failure();
    assert!(line.contains("more than 10 redirects"), "{line}");

    let ca = nginx.ca_file();
    let down = run(
        &[
            "copy",
            "--no-progress",
            &nginx.https_url("to-http/moved.img"),
            s(&scratch.path().join("d.img")),
        ],
        &[("FERRY_HTTP_CA_FILE", s(&ca))],
    );
    let line = down.assert_clean_failure();
    assert!(line.contains("from https to plain http"), "{line}");
}

#[test]
fn qcow2_and_compressed_images_over_http() {
    let nginx = Nginx::start();
    let raw = serve_image(&nginx, "disk.raw", 32 * MIB);
    let root = nginx.root();
    let qcow2 = root.join("disk.qcow2");
    sh(
        "qemu-utils",
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "qcow2",
            s(&raw.path),
            s(&qcow2),
        ],
    );
    std::fs::write(
        root.join("disk.raw.xz"),
        sh("xz-utils", "xz", &["-T2", "-c", s(&raw.path)]),
    )
    .unwrap();
    std::fs::write(
        root.join("disk.raw.gz"),
        sh("gzip", "gzip", &["-c", s(&raw.path)]),
    )
    .unwrap();
    let scratch = scratch_dir();
    for name in ["disk.qcow2", "disk.raw.xz", "disk.raw.gz"] {
        let out = scratch.path().join(format!("{name}.out"));
        let mut args = vec!["copy", "--no-progress"];
        if name.ends_with(".gz") {
            // gzip does not record the size: a first pass over the stream counts it.
            args.push("--prescan");
        }
        let url = nginx.url(name);
        args.extend([url.as_str(), s(&out)]);
        run(&args, &[]).assert_success();
        qemu_img_compare(&raw.path, &out);
        assert_allocated_about(&out, raw.nonzero_block_bytes);
    }
    // xz from a server without ranges: its index (at the end) cannot be read first, so the
    // size is given, and the stream is decompressed front to back.
    let out = scratch.path().join("noranges.out");
    let size = (32 * MIB).to_string();
    run(
        &[
            "copy",
            "--no-progress",
            "--source-size",
            &size,
            &nginx.url("noranges/disk.raw.xz"),
            s(&out),
        ],
        &[],
    )
    .assert_success();
    qemu_img_compare(&raw.path, &out);
}

#[test]
fn checksum_and_fan_out_from_http() {
    let nginx = Nginx::start();
    let img = serve_image(&nginx, "fan.img", 16 * MIB + 1000);
    let url = nginx.url("fan.img");
    let sum = run(&["checksum", "--no-progress", &url], &[]);
    sum.assert_success();
    assert!(sum.stdout.contains(&blkhash_file(&img.path)), "{sum}");
    let scratch = scratch_dir();
    let a = scratch.path().join("a.img");
    let b = scratch.path().join("b.img");
    run(&["copy", "--no-progress", &url, s(&a), s(&b)], &[]).assert_success();
    qemu_img_compare(&img.path, &a);
    qemu_img_compare(&img.path, &b);
}

fn object(len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect()
}

/// Copies from a fault server in 256 KiB requests; returns the run and the target.
async fn copy_from(
    fault: Fault,
) -> (
    ferry_tests::bin::Run,
    FaultServer,
    PathBuf,
    tempfile::TempDir,
    Vec<u8>,
) {
    let data = object(3 * MIB as usize + 100);
    let server = FaultServer::start(data.clone(), fault).await;
    let scratch = scratch_dir();
    let out = scratch.path().join("out.img");
    let url = server.url();
    let args = [
        "copy",
        "--no-progress",
        "--request-size",
        "256K",
        "--workers",
        "2",
        &url,
        s(&out),
    ]
    .map(String::from);
    let run = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&args, &[("FERRY_HTTP_ATTEMPTS", "4")])
    })
    .await
    .unwrap();
    (run, server, out, scratch, data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_server_cases() {
    // Behaving: the bytes arrive.
    let (r, _s, out, _d, data) = copy_from(Fault::None).await;
    r.assert_success();
    assert_eq!(std::fs::read(&out).unwrap(), data);

    // Transient 503s are retried.
    let (r, s, out, _d, data) = copy_from(Fault::UnavailableFirst { count: 3 }).await;
    r.assert_success();
    assert_eq!(std::fs::read(&out).unwrap(), data);
    assert!(s.requests() > 3 + 2, "{}", s.requests());

    // Always 500: a clear failure after the attempts.
    let (r, _s, _out, _d, _) = copy_from(Fault::AlwaysFails).await;
    let line = r.assert_clean_failure();
    assert!(line.contains("HTTP 500"), "{line}");
    assert!(line.contains("after 4 attempts"), "{line}");

    // The object changes mid-copy: the copy fails instead of mixing versions.
    for fault in [
        Fault::ChangesAfter { after: 5 },
        Fault::ChangesIgnoringIfMatch { after: 5 },
    ] {
        let (r, _s, _out, _d, _) = copy_from(fault).await;
        let line = r.assert_clean_failure();
        assert!(
            line.contains("changed during the copy"),
            "{fault:?}: {line}"
        );
        if matches!(fault, Fault::ChangesIgnoringIfMatch { .. }) {
            assert!(line.contains("ETag \"v1\" -> \"v2\""), "{line}");
        }
    }

    // Sizes that do not add up, more bytes than asked, a wrong Content-Range.
    let (r, _s, _out, _d, _) = copy_from(Fault::LiesAboutSize { extra: 4096 }).await;
    let line = r.assert_clean_failure();
    assert!(line.contains("HEAD says the object has"), "{line}");
    let (r, _s, _out, _d, _) = copy_from(Fault::SendsMore { extra: 1000 }).await;
    let line = r.assert_clean_failure();
    assert!(line.contains("the server sent more"), "{line}");
    let (r, _s, _out, _d, _) = copy_from(Fault::WrongContentRange).await;
    let line = r.assert_clean_failure();
    assert!(line.contains("the server answered bytes"), "{line}");
}
