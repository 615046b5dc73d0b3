//! `http://` and `https://` sources against nginx (ranges, TLS with a test CA, basic
//! authentication, a location without ranges, redirects) and against a server that
//! misbehaves on purpose (tests/src/http_faults.rs: expiring redirect targets, weak or no
//! validators, changes, lies): every copy is checked byte for byte.

use std::path::{Path, PathBuf};
use std::process::Command;

use ferry_tests::check::{
    assert_allocated_about, blkhash_bytes, blkhash_file, qemu_img_compare, require_tool,
};
use ferry_tests::http_faults::{Fault, FaultServer, Renewal, LAST_MODIFIED};
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

/// Stands for a presigned URL's signature: it must never be printed.
const SIGNATURE: &str = "X-Signature=ferry-sig-5678";

/// Runs ferry off the runtime's threads (the fault server runs on them).
async fn run_async(args: Vec<String>) -> ferry_tests::bin::Run {
    run_async_with(args, None).await
}

/// [`run_async`] with `RUST_LOG=log` (None: the default, warnings and errors).
async fn run_async_with(args: Vec<String>, log: Option<&'static str>) -> ferry_tests::bin::Run {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut env = vec![("FERRY_HTTP_ATTEMPTS", "4")];
        env.extend(log.map(|l| ("RUST_LOG", l)));
        run(&args, &env)
    })
    .await
    .unwrap()
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
    copy_from_url(fault, None, None).await
}

/// [`copy_from`] with a query on the URL.
async fn copy_from_url(
    fault: Fault,
    query: Option<&str>,
    log: Option<&'static str>,
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
    let url = match query {
        Some(q) => format!("{}?{q}", server.url()),
        None => server.url(),
    };
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
    let run = run_async_with(args.to_vec(), log).await;
    (run, server, out, scratch, data)
}

/// `ferry info --json URL` as JSON; fails the test unless it succeeds.
async fn info_json(url: &str) -> (serde_json::Value, ferry_tests::bin::Run) {
    let r = run_async(vec!["info".into(), "--json".into(), url.into()]).await;
    r.assert_success();
    let json = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {r}"));
    (json, r)
}

fn assert_no_signature(r: &ferry_tests::bin::Run) {
    for text in [&r.stdout, &r.stderr] {
        assert!(
            !text.contains("ferry-sig") && !text.contains("exp="),
            "a URL query shows: {r}"
        );
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_redirect_target_is_resolved_again() {
    // The origin redirects to /obj?exp=1, which expires after 4 ranged GETs (403); the
    // origin then redirects to /obj?exp=2. The copy follows the redirect anew and completes.
    let fault = Fault::ExpiringRedirect {
        after: 4,
        renewal: Renewal::Serves,
    };
    // Debug logs name every request and redirect: still without a query.
    let (r, server, out, _d, data) = copy_from_url(fault, Some(SIGNATURE), Some("debug")).await;
    r.assert_success();
    assert_eq!(std::fs::read(&out).unwrap(), data);
    assert_eq!(blkhash_file(&out), blkhash_bytes(&data));
    assert_no_signature(&r);
    assert!(
        r.stderr.contains("resolving the URL's redirects again"),
        "{r}"
    );
    let seen = server.seen();
    let expired = seen
        .iter()
        .filter(|q| q.target == "/obj?exp=1" && q.status == 403)
        .count();
    let resolved = seen
        .iter()
        .filter(|q| q.target.starts_with("/object.img") && q.method == "GET")
        .count();
    let renewed = seen
        .iter()
        .filter(|q| q.target == "/obj?exp=2" && q.status == 206)
        .count();
    assert!(expired >= 1, "{seen:#?}");
    assert_eq!(
        resolved, expired,
        "one new resolution per refusal: {seen:#?}"
    );
    assert!(renewed >= 8, "the rest came from the new target: {seen:#?}");
    // Every ranged GET, on every target, names the version the copy started from.
    for q in seen.iter().filter(|q| q.range.is_some()) {
        assert_eq!(q.if_match.as_deref(), Some("\"v1\""), "{q:?}");
    }

    // The new target refuses too: one clear error with the server's status, no loop.
    let fault = Fault::ExpiringRedirect {
        after: 4,
        renewal: Renewal::Expired,
    };
    let (r, server, _out, _d, _) = copy_from_url(fault, Some(SIGNATURE), None).await;
    let line = r.assert_clean_failure();
    assert!(line.contains("HTTP 403 Forbidden"), "{line}");
    assert!(line.contains("expired or not valid"), "{line}");
    assert_no_signature(&r);
    let seen = server.seen();
    let resolved = seen
        .iter()
        .filter(|q| q.target.starts_with("/object.img") && q.method == "GET")
        .count();
    let expired = seen
        .iter()
        .filter(|q| q.target == "/obj?exp=1" && q.status == 403)
        .count();
    let renewed = seen.iter().filter(|q| q.target == "/obj?exp=2").count();
    // At most 2 workers x 4 requests were in flight when the first target expired; each
    // refusal was resolved once (a request cancelled by the failure may stop earlier).
    assert!(renewed >= 1, "{seen:#?}");
    assert!(
        renewed <= resolved && resolved <= expired && expired <= 8,
        "{seen:#?}"
    );

    // The new target serves another version: the copy fails instead of mixing them.
    let fault = Fault::ExpiringRedirect {
        after: 4,
        renewal: Renewal::OtherVersion,
    };
    let (r, _server, _out, _d, _) = copy_from_url(fault, Some(SIGNATURE), None).await;
    let line = r.assert_clean_failure();
    assert!(line.contains("changed during the copy"), "{line}");
    assert_no_signature(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_validators_is_copied_with_a_warning() {
    let (r, server, out, _d, data) =
        copy_from_url(Fault::NoValidators, Some(SIGNATURE), None).await;
    r.assert_success();
    assert_eq!(std::fs::read(&out).unwrap(), data);
    assert_no_signature(&r);
    let warning = format!(
        "{}?*** sends no ETag or Last-Modified: a change during the copy would go unnoticed",
        server.url()
    );
    assert_eq!(r.stderr.matches(&warning).count(), 1, "{r}");
    assert!(r.stderr.contains("WARN"), "{r}");
    let seen = server.seen();
    assert!(
        seen.iter()
            .all(|q| q.if_match.is_none() && q.if_unmodified_since.is_none()),
        "{seen:#?}"
    );

    let (json, r) = info_json(&format!("{}?{SIGNATURE}", server.url())).await;
    assert_eq!(json["version_pinned"], false, "{r}");
    assert_eq!(json["version_warning"], warning.as_str(), "{r}");
    assert!(json["version"].is_null(), "{r}");
    assert_no_signature(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weak_etag_is_never_sent_in_if_match() {
    // A weak ETag and a Last-Modified: requests are pinned with If-Unmodified-Since (the
    // fault server answers 412 to any If-Match, as a weak tag never matches).
    let fault = Fault::WeakETag {
        last_modified: true,
        changes_after: None,
    };
    let (r, server, out, _d, data) = copy_from(fault).await;
    r.assert_success();
    assert_eq!(std::fs::read(&out).unwrap(), data);
    assert!(!r.stderr.contains("would go unnoticed"), "{r}");
    let gets: Vec<_> = server
        .seen()
        .into_iter()
        .filter(|q| q.method == "GET")
        .collect();
    assert!(gets.len() > 10, "{gets:#?}");
    for q in &gets {
        assert_eq!(q.if_match, None, "{q:?}");
        assert_eq!(
            q.if_unmodified_since.as_deref(),
            Some(LAST_MODIFIED[0]),
            "{q:?}"
        );
    }
    let (json, r) = info_json(&server.url()).await;
    assert_eq!(json["version_pinned"], true, "{r}");
    assert_eq!(
        json["version"],
        format!("Last-Modified {}", LAST_MODIFIED[0]).as_str(),
        "{r}"
    );

    // ... and a change during the copy is caught by If-Unmodified-Since.
    let fault = Fault::WeakETag {
        last_modified: true,
        changes_after: Some(5),
    };
    let (r, _server, _out, _d, _) = copy_from(fault).await;
    let line = r.assert_clean_failure();
    assert!(line.contains("changed during the copy"), "{line}");
    assert!(
        line.contains(&format!("Last-Modified {}", LAST_MODIFIED[0])),
        "{line}"
    );

    // A weak ETag alone pins nothing: the copy works and says that a change would go
    // unnoticed.
    let fault = Fault::WeakETag {
        last_modified: false,
        changes_after: None,
    };
    let (r, server, out, _d, data) = copy_from(fault).await;
    r.assert_success();
    assert_eq!(std::fs::read(&out).unwrap(), data);
    let warning = format!(
        "{} sends only a weak ETag (which If-Match cannot use) and no Last-Modified: a change during the copy would go unnoticed",
        server.url()
    );
    assert_eq!(r.stderr.matches(&warning).count(), 1, "{r}");
    assert!(
        server.seen().iter().all(|q| q.if_match.is_none()),
        "{:#?}",
        server.seen()
    );
    let (json, r) = info_json(&server.url()).await;
    assert_eq!(json["version_pinned"], false, "{r}");
    assert_eq!(json["version_warning"], warning.as_str(), "{r}");
}
