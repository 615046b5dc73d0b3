//! The relay (`ferry copy ... --relay-listen`): one seed copy reads the origin (nginx) and
//! serves what it has written over NBD while three downstream `ferry copy nbd://...`
//! processes, started while it copies, read from it; every target is byte-exact and
//! sparse and nginx's access log shows the image's bytes served about once. Faults: the
//! seed killed mid-copy fails the downstream copies cleanly; garbage and reads past the
//! end are refused without harming a running copy; TLS required when configured. The job
//! service's `Endpoint.relay` serves the same way.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use ferry_api::proto::{self, JobState};
use ferry_tests::bin::{wait_with_deadline, Run};
use ferry_tests::check::{assert_allocated_about, qemu_img_compare};
use ferry_tests::http_server::{Nginx, NginxOptions};
use ferry_tests::images::{make, Image, Pattern};
use ferry_tests::nbd_servers::{require, TlsCerts};
use ferry_tests::process::free_port;
use ferry_tests::service_support::*;
use ferry_tests::{ferry, scratch_dir};

const MIB: u64 = 1 << 20;
const DEADLINE: Duration = Duration::from_secs(240);

/// A running seed copy: `ferry copy SRC DST... --relay-listen ...`, its stderr read line
/// by line.
struct Seed {
    child: Option<Child>,
    lines: Receiver<String>,
    stderr: Vec<String>,
    uri: String,
}

impl Seed {
    /// Starts the copy and waits for the line naming the relay's URI.
    fn start(args: &[&str]) -> Self {
        let mut cmd = ferry!().command(["copy"]);
        cmd.args(args);
        let mut child = cmd.spawn().expect("start the seed copy");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut seed = Self {
            child: Some(child),
            lines,
            stderr: Vec::new(),
            uri: String::new(),
        };
        let started = Instant::now();
        while seed.uri.is_empty() {
            let line = seed
                .lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("the seed named no relay URI: {:?}", seed.stderr));
            if let Some(rest) = line.strip_prefix("ferry: relaying ") {
                let uri = rest.split(" at ").nth(1).unwrap_or_default();
                seed.uri = uri
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_string();
            }
            seed.stderr.push(line);
            assert!(started.elapsed() < Duration::from_secs(60));
        }
        seed
    }

    /// Waits for the copy (and its linger) to end.
    fn wait(mut self) -> Run {
        let mut child = self.child.take().unwrap();
        child.stderr = None;
        let mut run = wait_with_deadline(child, DEADLINE, "the seed copy".into());
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(1)) {
            self.stderr.push(line);
        }
        run.stderr = self.stderr.join("\n");
        run
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Seed {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Starts a downstream `ferry copy --source-format raw SRC DSTS...` without waiting for
/// it (a relay serves raw bytes; format detection would wait for the image's last sector).
fn spawn_copy(source: &str, targets: &[PathBuf], extra: &[&str]) -> Child {
    let mut cmd = ferry!().command(["copy", "--source-format", "raw", source]);
    cmd.args(targets).args(extra);
    cmd.spawn().expect("start a downstream copy")
}

fn wait(child: Child, what: &str) -> Run {
    wait_with_deadline(child, DEADLINE, what.into())
}

/// Byte for byte the image (as qemu-img reads both), and as sparse as it.
fn holds(image: &Image, target: &Path) {
    qemu_img_compare(&image.path, target);
    assert_allocated_about(target, image.nonzero_block_bytes);
}

/// One seed into 2 targets from `url` while 3 downstream copies (2 targets each) read its
/// relay; returns nginx's body bytes over `origin_bytes`.
fn rollout(nginx: &Nginx, url: &str, image: &Image, origin_bytes: u64, tag: &str) -> f64 {
    let dir = scratch_dir();
    let port = free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    let seed_targets: Vec<PathBuf> = (0..2)
        .map(|i| dir.path().join(format!("{tag}-seed-{i}.raw")))
        .collect();
    let mut args = vec![url];
    args.extend(seed_targets.iter().map(|p| s(p)));
    // Slow enough that the downstream copies read while the seed writes.
    args.extend([
        "--relay-listen",
        &listen,
        "--relay-name",
        "golden",
        "--relay-linger",
        "60",
        "--rate-limit",
        "16M",
    ]);
    let seed = Seed::start(&args);
    assert_eq!(seed.uri, format!("nbd://127.0.0.1:{port}/golden"));
    let started = Instant::now();
    let downstream: Vec<(Vec<PathBuf>, Child)> = (0..3)
        .map(|d| {
            let targets: Vec<PathBuf> = (0..2)
                .map(|i| dir.path().join(format!("{tag}-down{d}-{i}.raw")))
                .collect();
            let child = spawn_copy(&seed.uri, &targets, &[]);
            (targets, child)
        })
        .collect();
    let mut all = seed_targets.clone();
    for (d, (targets, child)) in downstream.into_iter().enumerate() {
        let run = wait(child, &format!("downstream copy {d}"));
        run.assert_success();
        all.extend(targets);
    }
    let downstream_done = started.elapsed();
    let seed_run = seed.wait();
    seed_run.assert_success();
    // The seed ends once its clients have gone, not at the linger's end.
    assert!(
        seed_run.elapsed < Duration::from_secs(50),
        "the seed lingered after its clients had gone: {seed_run}"
    );
    eprintln!(
        "{tag}: downstream copies done after {downstream_done:?}, the seed after {:?}",
        started.elapsed()
    );
    assert_eq!(all.len(), 8);
    for target in &all {
        holds(image, target);
    }
    let (sent, requests) = nginx.body_bytes_sent();
    let ratio = sent as f64 / origin_bytes as f64;
    eprintln!(
        "{tag}: nginx sent {sent} body bytes in {requests} requests for an origin file of \
         {origin_bytes} bytes ({ratio:.4}x) into 8 targets"
    );
    ratio
}

#[test]
fn a_raw_image_is_read_from_the_origin_once_for_four_groups() {
    let nginx = Nginx::start_with(&NginxOptions {
        access_log: true,
        ..NginxOptions::default()
    });
    let image = make(
        &nginx.root().join("golden.raw"),
        Pattern::HalfData,
        48 * MIB,
        31,
    )
    .unwrap();
    let ratio = rollout(&nginx, &nginx.url("golden.raw"), &image, image.size, "raw");
    // HTTP says nothing of holes: the seed reads the whole file once, zeroes included.
    assert!(ratio <= 1.05, "the origin served {ratio:.3}x the image");
}

#[test]
fn a_qcow2_image_is_read_from_the_origin_once_for_four_groups() {
    require("qemu-img");
    let nginx = Nginx::start_with(&NginxOptions {
        access_log: true,
        ..NginxOptions::default()
    });
    let dir = scratch_dir();
    let image = make(
        &dir.path().join("golden.raw"),
        Pattern::HalfData,
        48 * MIB,
        32,
    )
    .unwrap();
    let qcow2 = nginx.root().join("golden.qcow2");
    let out = Command::new("qemu-img")
        .args(["convert", "-O", "qcow2", s(&image.path), s(&qcow2)])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let qcow2_size = std::fs::metadata(&qcow2).unwrap().len();
    let ratio = rollout(
        &nginx,
        &nginx.url("golden.qcow2"),
        &image,
        qcow2_size,
        "qcow2",
    );
    assert!(
        ratio <= 1.05,
        "the origin served {ratio:.3}x the qcow2 file"
    );
}

#[test]
fn a_seed_killed_mid_copy_fails_the_downstream_copies_cleanly() {
    let dir = scratch_dir();
    let src = dir.path().join("src.raw");
    make(&src, Pattern::HalfData, 64 * MIB, 33).unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let seed_target = dir.path().join("seed.raw");
    let mut seed = Seed::start(&[
        s(&src),
        s(&seed_target),
        "--relay-listen",
        &listen,
        "--rate-limit",
        "4M",
    ]);
    let down = [dir.path().join("down-0.raw"), dir.path().join("down-1.raw")];
    let child = spawn_copy(&seed.uri, &down, &[]);
    std::thread::sleep(Duration::from_millis(2500));
    seed.kill9();
    let run = wait(child, "the downstream copy");
    let message = run.assert_clean_failure();
    eprintln!(
        "downstream of a killed seed: {message} (after {:?})",
        run.elapsed
    );
    assert!(run.elapsed < Duration::from_secs(120), "{run}");
}

/// A raw NBD client: the fixed newstyle handshake with NBD_OPT_EXPORT_NAME, then a READ
/// of `len` bytes at `offset`; returns the reply's error value.
fn raw_read(addr: &str, offset: u64, len: u32) -> u32 {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut greeting = [0u8; 18];
    c.read_exact(&mut greeting).unwrap();
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    // Fixed newstyle, no zeroes.
    c.write_all(&3u32.to_be_bytes()).unwrap();
    let mut opt = b"IHAVEOPT".to_vec();
    opt.extend(1u32.to_be_bytes());
    opt.extend(0u32.to_be_bytes());
    c.write_all(&opt).unwrap();
    let mut export = [0u8; 10];
    c.read_exact(&mut export).unwrap();
    let mut req = 0x2560_9513u32.to_be_bytes().to_vec();
    req.extend(0u16.to_be_bytes());
    req.extend(0u16.to_be_bytes());
    req.extend(7u64.to_be_bytes());
    req.extend(offset.to_be_bytes());
    req.extend(len.to_be_bytes());
    c.write_all(&req).unwrap();
    let mut reply = [0u8; 16];
    c.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[..4], &0x6744_6698u32.to_be_bytes());
    u32::from_be_bytes(reply[4..8].try_into().unwrap())
}

#[test]
fn garbage_and_reads_past_the_end_are_refused_while_a_copy_goes_on() {
    let dir = scratch_dir();
    let src = dir.path().join("src.raw");
    let image = make(&src, Pattern::HalfData, 32 * MIB, 34).unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let seed = Seed::start(&[
        s(&src),
        s(&dir.path().join("seed.raw")),
        "--relay-listen",
        &listen,
        "--rate-limit",
        "8M",
    ]);
    let down = dir.path().join("down.raw");
    let child = spawn_copy(&seed.uri, std::slice::from_ref(&down), &[]);
    // Other NBD clients read the relay too.
    require("nbdcopy");
    let by_nbdcopy = dir.path().join("nbdcopy.raw");
    let nbdcopy = Command::new("nbdcopy")
        .args([&seed.uri, s(&by_nbdcopy)])
        .spawn()
        .unwrap();
    // Garbage instead of the client's flags: the connection is dropped.
    let mut garbage = TcpStream::connect(&listen).unwrap();
    garbage
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut greeting = [0u8; 18];
    garbage.read_exact(&mut greeting).unwrap();
    let _ = garbage.write_all(&[0xff; 64]);
    let mut rest = Vec::new();
    if let Err(e) = garbage.read_to_end(&mut rest) {
        // Closed (reset) is fine; still open after 30 s is not.
        assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the server kept a garbage client: {e}"
        );
    }
    // A read past the end: EINVAL (22), not a wait for bytes that never come.
    assert_eq!(raw_read(&listen, image.size, 4096), 22);
    assert_eq!(raw_read(&listen, image.size - 4096, 8192), 22);
    wait(child, "the downstream copy").assert_success();
    holds(&image, &down);
    let status = nbdcopy.wait_with_output().unwrap().status;
    assert!(status.success(), "nbdcopy from the relay failed: {status}");
    holds(&image, &by_nbdcopy);
    seed.wait().assert_success();
}

#[test]
fn tls_is_required_when_the_relay_has_a_certificate() {
    let dir = scratch_dir();
    let src = dir.path().join("src.raw");
    let image = make(&src, Pattern::HalfData, 16 * MIB, 35).unwrap();
    let certs = TlsCerts::generate();
    let c = certs.dir();
    let listen = format!("127.0.0.1:{}", free_port());
    let seed = Seed::start(&[
        s(&src),
        s(&dir.path().join("seed.raw")),
        "--relay-listen",
        &listen,
        "--relay-tls-cert",
        s(&c.join("server-cert.pem")),
        "--relay-tls-key",
        s(&c.join("server-key.pem")),
        "--relay-tls-ca",
        s(&c.join("ca-cert.pem")),
        "--rate-limit",
        "8M",
    ]);
    assert!(seed.uri.starts_with("nbds://"), "{}", seed.uri);
    let plain = seed.uri.replacen("nbds://", "nbd://", 1);
    let refused = wait(
        spawn_copy(&plain, &[dir.path().join("plain.raw")], &[]),
        "a copy without TLS",
    );
    let message = refused.assert_clean_failure();
    assert!(message.contains("requires TLS"), "{message}");
    let down = dir.path().join("tls.raw");
    let uri = format!("{}?tls-certificates={}", seed.uri, c.display());
    wait(
        spawn_copy(&uri, std::slice::from_ref(&down), &[]),
        "a copy over TLS",
    )
    .assert_success();
    holds(&image, &down);
    seed.wait().assert_success();
}

#[test]
fn a_relay_needs_a_local_target() {
    let dir = scratch_dir();
    let src = dir.path().join("src.raw");
    make(&src, Pattern::HalfData, 4 * MIB, 36).unwrap();
    let run = ferry!().run([
        "copy",
        s(&src),
        "nbd://127.0.0.1:1/x",
        "--relay-listen",
        "127.0.0.1:0",
    ]);
    let message = run.assert_clean_failure();
    assert!(message.contains("local target"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_job_relays_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("images");
    std::fs::create_dir(&root).unwrap();
    let service = start_in_process(test_config(&dir.path().join("data"), &root)).await;
    let mut client = connect(service.grpc_addr()).await;
    let image = make(&root.join("golden.img"), Pattern::HalfData, 32 * MIB, 37).unwrap();
    let port = free_port();
    let relayed = |listen: String| proto::Endpoint {
        relay: Some(proto::RelayOptions {
            listen,
            name: "golden".into(),
            ..proto::RelayOptions::default()
        }),
        ..endpoint(root.join("seed.raw").display().to_string()).unwrap()
    };
    // Only a target is relayed, and only a file's.
    let mut bad = transfer(&image.path, &root.join("x.raw"));
    bad.source = Some(relayed(format!("127.0.0.1:{port}")));
    let e = client.start_transfer(bad).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("relay"), "{e:?}");
    let mut bad = transfer(&image.path, &root.join("x.raw"));
    let mut outside = relayed(format!("127.0.0.1:{port}"));
    outside.relay.as_mut().unwrap().tls_cert = "/etc/passwd".into();
    outside.relay.as_mut().unwrap().tls_key = "/etc/passwd".into();
    bad.target = Some(outside);
    let e = client.start_transfer(bad).await.unwrap_err();
    assert!(
        matches!(
            e.code(),
            tonic::Code::InvalidArgument | tonic::Code::PermissionDenied
        ),
        "{e:?}"
    );

    let mut req = transfer(&image.path, &root.join("seed.raw"));
    req.target = Some(relayed(format!("127.0.0.1:{port}")));
    req.more_targets = vec![endpoint(root.join("seed-2.raw").display().to_string()).unwrap()];
    req.options = Some(proto::TransferOptions {
        rate_limit: 8 * MIB,
        ..proto::TransferOptions::default()
    });
    let id = client.start_transfer(req).await.unwrap().into_inner().id;
    let running = watch_until(&mut client, &id, |j| {
        j.message.contains("relaying") || is_terminal(j)
    })
    .await;
    assert!(
        running
            .message
            .contains(&format!("nbd://127.0.0.1:{port}/golden")),
        "{running:?}"
    );
    let down = root.join("down.raw");
    let uri = format!("nbd://127.0.0.1:{port}/golden");
    let child = spawn_copy(&uri, std::slice::from_ref(&down), &[]);
    let run = tokio::task::spawn_blocking(move || wait(child, "the downstream copy"))
        .await
        .unwrap();
    run.assert_success();
    let job = wait_terminal(&mut client, &id, DEADLINE).await;
    assert_eq!(state(&job), JobState::Succeeded, "{job:?}");
    for target in [root.join("seed.raw"), root.join("seed-2.raw"), down] {
        holds(&image, &target);
    }
}

/// EndRelay: a relay waiting its idle time for late clients ends as soon as it is told
/// none is still to come (a rollout's last reader is done); a job that relays nothing is
/// FAILED_PRECONDITION, an unknown one NOT_FOUND.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_relay_ends_a_relay_waiting_for_late_clients() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("images");
    std::fs::create_dir(&root).unwrap();
    let service = start_in_process(test_config(&dir.path().join("data"), &root)).await;
    let mut client = connect(service.grpc_addr()).await;
    let image = make(&root.join("golden.img"), Pattern::HalfData, 8 * MIB, 41).unwrap();
    let port = free_port();
    let mut req = transfer(&image.path, &root.join("seed.raw"));
    req.target = Some(proto::Endpoint {
        relay: Some(proto::RelayOptions {
            listen: format!("127.0.0.1:{port}"),
            name: "golden".into(),
            idle_seconds: 300,
            ..proto::RelayOptions::default()
        }),
        ..endpoint(root.join("seed.raw").display().to_string()).unwrap()
    });
    let id = client.start_transfer(req).await.unwrap().into_inner().id;
    watch_until(&mut client, &id, |j| {
        j.message.contains("relaying") || is_terminal(j)
    })
    .await;
    let down = root.join("down.raw");
    let uri = format!("nbd://127.0.0.1:{port}/golden");
    let child = spawn_copy(&uri, std::slice::from_ref(&down), &[]);
    let run = tokio::task::spawn_blocking(move || wait(child, "the downstream copy"))
        .await
        .unwrap();
    run.assert_success();
    holds(&image, &down);
    // The copy is done and its reader gone: the relay waits for late clients.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let job = client
        .get_job(proto::GetJobRequest { id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&job), JobState::Running, "{job:?}");
    let asked = std::time::Instant::now();
    client
        .end_relay(proto::EndRelayRequest { id: id.clone() })
        .await
        .unwrap();
    let job = wait_terminal(&mut client, &id, Duration::from_secs(10)).await;
    assert_eq!(state(&job), JobState::Succeeded, "{job:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "the relay ended {:?} after EndRelay (idle time 300 s)",
        asked.elapsed()
    );
    holds(&image, &root.join("seed.raw"));
    // Ended: returned as it is.
    let again = client
        .end_relay(proto::EndRelayRequest { id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&again), JobState::Succeeded);

    // A slow copy that relays nothing: still running when asked.
    let mut slow = transfer(&image.path, &root.join("plain.raw"));
    slow.options = Some(proto::TransferOptions {
        rate_limit: MIB,
        ..proto::TransferOptions::default()
    });
    let plain = client.start_transfer(slow).await.unwrap().into_inner().id;
    let e = client
        .end_relay(proto::EndRelayRequest { id: plain.clone() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("does not relay"), "{e:?}");
    client
        .cancel_job(proto::CancelJobRequest { id: plain })
        .await
        .unwrap();
    let e = client
        .end_relay(proto::EndRelayRequest {
            id: "no-such-job".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
}
