//! `ferry export`: images served read-only over NBD, read by the clients people use
//! (nbdcopy, nbdinfo, qemu-img, qemu-io) and by ferry's own NBD client (`ferry copy`,
//! `ferry checksum` and the source conformance suite), over TCP, Unix sockets and TLS;
//! raw, qcow2 and HTTP sources; several clients at once; writes refused; SIGTERM ends it.

use std::path::Path;
use std::process::Command;

use ferry_tests::check::{assert_allocated_about, blkhash_file, qemu_img_compare};
use ferry_tests::http_server::Nginx;
use ferry_tests::images::{make, Image, Pattern};
use ferry_tests::nbd_servers::{nbdinfo_map, require, NbdServer, QemuNbd, TlsCerts};
use ferry_tests::process::Serving;
use ferry_tests::{ferry, scratch_dir};

const MIB: u64 = 1 << 20;

/// A running `ferry export`, stopped with SIGTERM when dropped.
struct Exported {
    server: Serving,
    uri: String,
}

impl Exported {
    /// Starts `ferry export SRC ARGS...` and waits for the URI it prints.
    fn start(source: &str, args: &[&str]) -> Self {
        let mut cmd = ferry!().command(["export", source]);
        cmd.args(args);
        let (server, uri) = Serving::start(cmd);
        assert!(
            !uri.is_empty(),
            "ferry export {source} {args:?} printed no URI"
        );
        Self { server, uri }
    }

    /// The URI with `query` parameters appended.
    fn uri_with(&self, query: &str) -> String {
        let sep = if self.uri.contains('?') { '&' } else { '?' };
        format!("{}{sep}{query}", self.uri)
    }

    /// SIGTERM; returns whether it exited 0 within 10 s.
    fn stop(&mut self) -> bool {
        self.server.stop()
    }
}

fn run(tool: &str, args: &[&str]) -> std::process::Output {
    require(tool);
    Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {tool}: {e}"))
}

fn ok(tool: &str, args: &[&str]) -> String {
    let out = run(tool, args);
    assert!(
        out.status.success(),
        "{tool} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// nbdcopy of `uri` into a new file `out`, compared with `image` and checked sparse.
fn nbdcopy_and_compare(uri: &str, out: &Path, image: &Image) {
    ok("nbdcopy", &[uri, s(out)]);
    qemu_img_compare(&image.path, out);
    assert_allocated_about(out, image.nonzero_block_bytes);
}

#[test]
fn real_clients_read_the_export_byte_exact_and_sparse() {
    let dir = scratch_dir();
    let src = dir.path().join("src.raw");
    let image = make(&src, Pattern::HalfData, 40 * MIB, 7).unwrap();
    let mut export = Exported::start(s(&src), &["--listen", "127.0.0.1:0", "--name", "disk"]);
    let uri = export.uri.clone();
    assert!(
        uri.starts_with("nbd://127.0.0.1:") && uri.ends_with("/disk"),
        "{uri}"
    );

    // nbdinfo --list names the export; nbdinfo shows it read-only with multi-conn.
    let base = uri.trim_end_matches("disk");
    let list = ok("nbdinfo", &["--list", base]);
    assert!(list.contains("export=\"disk\""), "{list}");
    let info = ok("nbdinfo", &[&uri]);
    assert!(info.contains("is_read_only: true"), "{info}");
    assert!(info.contains("can_multi_conn: true"), "{info}");
    assert!(
        info.contains(&format!("export-size: {}", 40 * MIB)),
        "{info}"
    );

    // The allocation map is the source's: the same as qemu-nbd's of the same file.
    let ours = nbdinfo_map(&uri);
    let qemu = NbdServer::qemu_nbd(
        &src,
        &QemuNbd {
            export: "disk".into(),
            read_only: true,
            ..QemuNbd::default()
        },
    );
    let theirs = nbdinfo_map(&qemu.uri());
    drop(qemu);
    assert_eq!(ours, theirs);
    assert!(ours.iter().any(|e| e.2.contains("hole")), "{ours:?}");

    // nbdcopy keeps the target sparse; qemu-img converts and compares over nbd://.
    nbdcopy_and_compare(&uri, &dir.path().join("nbdcopy.raw"), &image);
    let converted = dir.path().join("qemu.raw");
    ok(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", &uri, s(&converted)],
    );
    qemu_img_compare(&src, &converted);
    ok(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", s(&src), &uri],
    );

    // ferry's own NBD client: copy and checksum.
    let copied = dir.path().join("ferry.raw");
    ferry!().run(["copy", &uri, s(&copied)]).assert_success();
    qemu_img_compare(&src, &copied);
    let sum = ferry!().run(["checksum", &uri]);
    sum.assert_success();
    assert_eq!(
        sum.stdout.split_whitespace().next(),
        Some(blkhash_file(&src).as_str())
    );

    // Four nbdcopys at once (each with its own connections).
    let outs: Vec<_> = (0..4)
        .map(|i| dir.path().join(format!("many-{i}.raw")))
        .collect();
    std::thread::scope(|scope| {
        for out in &outs {
            let uri = &uri;
            let image = &image;
            scope.spawn(move || nbdcopy_and_compare(uri, out, image));
        }
    });

    // Writes are refused: ferry's client sees a read-only export, qemu-io's write fails.
    let write = ferry!().run(["copy", s(&src), &uri]);
    let message = write.assert_clean_failure();
    assert!(message.contains("read-only"), "{message}");
    let out = run("qemu-io", &["-f", "raw", "-c", "write -P 0x55 0 64k", &uri]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success()
            || text.contains("not permitted")
            || text.contains("read-only")
            || text.contains("read only"),
        "qemu-io wrote to a read-only export: {text}"
    );
    // The source is unchanged by any of it.
    qemu_img_compare(&src, &copied);

    // SIGTERM stops the server cleanly and the port closes.
    assert!(export.stop(), "ferry export did not exit 0 on SIGTERM");
    let out = run("nbdinfo", &[&uri]);
    assert!(
        !out.status.success(),
        "the export still answers after SIGTERM"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferrys_own_client_conforms_over_the_export() {
    let dir = scratch_dir();
    let src = dir.path().join("src.raw");
    let image = ferry_testkit::conformance::test_image(8 * MIB + 512, 3);
    ferry_testkit::files::write_sparse(&src, &image);
    let export = Exported::start(s(&src), &["--listen", "127.0.0.1:0"]);
    let source = ferry_tests::copying::source(&export.uri).await.unwrap();
    assert!(
        source.caps().extents && source.caps().multi_conn,
        "{:?}",
        source.caps()
    );
    ferry_testkit::conformance::check_source(source, &image.data).await;
}

#[test]
fn tls_is_required_and_served_to_nbdinfo_and_nbdcopy() {
    let dir = scratch_dir();
    let src = dir.path().join("src.raw");
    let image = make(&src, Pattern::HalfData, 12 * MIB, 11).unwrap();
    let certs = TlsCerts::generate();
    let c = certs.dir();
    let export = Exported::start(
        s(&src),
        &[
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
    assert!(export.uri.starts_with("nbds://"), "{}", export.uri);
    let tls_uri = export.uri_with(&format!("tls-certificates={}", c.display()));
    let info = ok("nbdinfo", &[&tls_uri]);
    assert!(info.contains("is_read_only: true"), "{info}");
    nbdcopy_and_compare(&tls_uri, &dir.path().join("tls.raw"), &image);
    // Without TLS the client is refused.
    let plain = export.uri.replacen("nbds://", "nbd://", 1);
    let out = run("nbdinfo", &[&plain]);
    assert!(!out.status.success(), "a client without TLS was served");
    let err = String::from_utf8_lossy(&out.stderr);
    // libnbd reports the server's NBD_REP_ERR_TLS_REQD as ENOTSUP ("Operation not
    // supported"), without the server's message.
    assert!(
        err.contains("TLS") || err.contains("tls") || err.contains("Operation not supported"),
        "{err}"
    );
    // ferry's client says why (NBD_REP_ERR_TLS_REQD; libnbd only reports the refusal).
    let refused = ferry!().run(["checksum", &plain]);
    let message = refused.assert_clean_failure();
    assert!(message.contains("requires TLS"), "{message}");
    // Without a client certificate signed by the CA, too.
    let anonymous = tempfile::tempdir().unwrap();
    std::fs::copy(c.join("ca-cert.pem"), anonymous.path().join("ca-cert.pem")).unwrap();
    let out = run(
        "nbdinfo",
        &[&export.uri_with(&format!("tls-certificates={}", anonymous.path().display()))],
    );
    assert!(
        !out.status.success(),
        "a client without a certificate was served"
    );
}

#[test]
fn qcow2_http_and_unix_socket_sources_are_served_decoded() {
    require("qemu-img");
    let dir = scratch_dir();
    let raw = dir.path().join("src.raw");
    let image = make(&raw, Pattern::HalfData, 20 * MIB + 4096, 5).unwrap();
    // A qcow2 is served as the disk it holds, over a Unix socket.
    let qcow2 = dir.path().join("src.qcow2");
    ok(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "qcow2", s(&raw), s(&qcow2)],
    );
    let sock = dir.path().join("export.sock");
    let export = Exported::start(
        s(&qcow2),
        &["--listen", &format!("unix:{}", sock.display())],
    );
    assert!(
        export.uri.starts_with("nbd+unix:///?socket="),
        "{}",
        export.uri
    );
    nbdcopy_and_compare(&export.uri, &dir.path().join("from-qcow2.raw"), &image);
    let map = nbdinfo_map(&export.uri);
    assert!(map.iter().any(|e| e.2.contains("hole")), "{map:?}");
    drop(export);
    assert!(!sock.exists(), "the Unix socket outlived the export");

    // An HTTP source (nginx) read back byte-exact.
    let nginx = Nginx::start();
    std::fs::copy(&raw, nginx.root().join("disk.raw")).unwrap();
    let export = Exported::start(&nginx.url("disk.raw"), &["--listen", "127.0.0.1:0"]);
    let out = dir.path().join("from-http.raw");
    ok("nbdcopy", &[&export.uri, s(&out)]);
    qemu_img_compare(&raw, &out);
    ok(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", s(&raw), &export.uri],
    );
}

#[test]
fn a_bad_listen_address_or_source_is_a_clean_failure() {
    let run = ferry!().run(["export", "/nonexistent/disk.raw", "--listen", "127.0.0.1:0"]);
    let message = run.assert_clean_failure();
    assert!(message.contains("/nonexistent/disk.raw"), "{message}");
    let dir = scratch_dir();
    let src = dir.path().join("src.raw");
    make(&src, Pattern::HalfData, MIB, 1).unwrap();
    let run = ferry!().run(["export", s(&src), "--listen", "nowhere"]);
    let message = run.assert_clean_failure();
    assert!(message.contains("HOST:PORT"), "{message}");
    // A port already taken.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let run = ferry!().run(["export", s(&src), "--listen", &format!("127.0.0.1:{port}")]);
    let message = run.assert_clean_failure();
    assert!(message.contains("cannot listen"), "{message}");
}
