//! A fan-out's relay as the operator wires it, with real movers: the requests the operator
//! builds for a serving group and a reading group (`spec.relay`), sent to two job
//! services, each confined like its pod to its own root, with each mover's certificate
//! from the operator's CA laid out as the pod mounts it (`/var/run/ferry/relay-tls`).
//! The serving group reads a qcow2 image from nginx and relays it; the reading group
//! reads it from the relay over mutual TLS, checking the serving mover's name. Every
//! target is byte-exact, both groups report the same source digest, and nginx served the
//! qcow2 file about once. A mover whose certificate another CA signed is refused.
//!
//! The paths are the pod's with a per-mover directory in front, and the relay listens on
//! a loopback port instead of 0.0.0.0:10810: what a cluster adds (pod IPs, the
//! NetworkPolicy, nodes) is the operator's stand-in tests' and render's part.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ferry_api::proto::{self, JobState};
use ferry_operator::crd::{GroupRelay, Transfer, VolumeMode};
use ferry_operator::fanout::relay::{decide, with_relay, Decision};
use ferry_operator::mover::tls::MoverCa;
use ferry_operator::mover::{transfer_request, ResolvedPvc};
use ferry_tests::check::qemu_img_compare;
use ferry_tests::http_server::{Nginx, NginxOptions};
use ferry_tests::images::{make, Pattern};
use ferry_tests::nbd_servers::require;
use ferry_tests::process::free_port;
use ferry_tests::scratch_dir;
use ferry_tests::service_support::*;
use serde_json::json;

const MIB: u64 = 1 << 20;
const NS: &str = "vms";
const SEED_POD: &str = "fleet-g0-ft-1";
const READER_POD: &str = "fleet-g1-ft-1";

/// One mover's filesystem: the pod's paths under `root`.
struct Mover {
    root: PathBuf,
}

impl Mover {
    /// Its directories, with `ca` and the pod's certificate from `issuer` where the pod
    /// mounts them.
    fn new(dir: &Path, pod: &str, issuer: &MoverCa, ca: &MoverCa, claims: &[&str]) -> Self {
        let root = dir.join(pod);
        let tls = root.join("var/run/ferry/relay-tls");
        std::fs::create_dir_all(&tls).unwrap();
        let issued = issuer.issue_mover(pod, NS).unwrap();
        std::fs::write(tls.join("ca-cert.pem"), ca.cert_pem()).unwrap();
        std::fs::write(tls.join("client-cert.pem"), &issued.cert_pem).unwrap();
        std::fs::write(tls.join("client-key.pem"), &issued.key_pem).unwrap();
        for claim in claims {
            std::fs::create_dir_all(root.join("var/run/ferry/volumes").join(claim)).unwrap();
        }
        Self { root }
    }

    /// A pod path as this mover's.
    fn path(&self, pod_path: &str) -> String {
        if pod_path.starts_with("/var/run/ferry/") {
            format!("{}{pod_path}", self.root.display())
        } else {
            pod_path.to_string()
        }
    }

    fn localize(&self, e: &mut proto::Endpoint) {
        e.url = self.path(&e.url);
        if let Some(proto::endpoint::Options::Nbd(nbd)) = &mut e.options {
            nbd.tls_certificates_dir = self.path(&nbd.tls_certificates_dir);
        }
        if let Some(r) = &mut e.relay {
            r.tls_cert = self.path(&r.tls_cert);
            r.tls_key = self.path(&r.tls_key);
            r.tls_ca = self.path(&r.tls_ca);
        }
    }

    /// The request as this mover's job service, confined to its root, takes it.
    fn localize_request(&self, r: &mut proto::StartTransferRequest) {
        for e in r
            .source
            .iter_mut()
            .chain(&mut r.target)
            .chain(&mut r.more_targets)
        {
            self.localize(e);
        }
    }

    fn disk(&self, claim: &str) -> PathBuf {
        self.root
            .join("var/run/ferry/volumes")
            .join(claim)
            .join("disk.img")
    }
}

/// Group `name` of the fan-out `fleet` from `url` into the created claims `claims`.
fn group(name: &str, url: &str, claims: &[&str], relay: GroupRelay) -> Transfer {
    let targets: Vec<_> = claims
        .iter()
        .map(|c| json!({"pvcTemplate": {"name": c, "size": "1Gi"}}))
        .collect();
    let mut t: Transfer = serde_json::from_value(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"),
                     "labels": {"ferry.dev/fan-out-of": "uid-fleet"}},
        "spec": {"source": {"url": url}, "targets": targets, "cloneStrategy": "copy",
                 "options": {"verify": true}},
    }))
    .unwrap();
    t.spec.relay = Some(relay);
    t
}

fn claims(names: &[&str]) -> Vec<ResolvedPvc> {
    names
        .iter()
        .map(|n| ResolvedPvc::new(*n, VolumeMode::Filesystem))
        .collect()
}

/// The reading group's relay URL, as the operator decides it for the serving group's
/// running pod (at 127.0.0.1), with the test's port.
fn relay_url(port: u16) -> String {
    let seed: Transfer = serde_json::from_value(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "fleet-g0", "namespace": NS},
        "spec": {"source": {"url": "http://x/y"}, "targets": [{"url": "nbd://h/e"}]},
        "status": {"phase": "Running", "moverPod": SEED_POD,
                   "conditions": [{"type": "Running", "status": "True", "reason": "MoverRunning",
                                   "message": "", "lastTransitionTime": "2026-12-06T08:00:00Z"}]},
    }))
    .unwrap();
    let pod = serde_json::from_value(json!({
        "metadata": {"name": SEED_POD, "namespace": NS},
        "status": {"phase": "Running", "podIP": "127.0.0.1",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .unwrap();
    match decide("fleet-g0", Some(&seed), Some(&pod)) {
        Decision::Relay(url) => url.replacen(":10810/", &format!(":{port}/"), 1),
        other => panic!("a running seed is read through its relay: {other:?}"),
    }
}

/// The request of `reader` once its status records `url` as its relay.
fn reader_request(
    reader: &Transfer,
    url: &str,
    pvcs: &[ResolvedPvc],
) -> proto::StartTransferRequest {
    let mut reader = reader.clone();
    reader.status = Some(serde_json::from_value(json!({"sourceRelay": url})).unwrap());
    let indexes: Vec<usize> = (0..pvcs.len()).collect();
    transfer_request(&with_relay(&reader), pvcs, &indexes, None).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_reads_the_origin_once_through_its_serving_group() {
    require("qemu-img");
    let nginx = Nginx::start_with(&NginxOptions {
        access_log: true,
        ..NginxOptions::default()
    });
    let dir = scratch_dir();
    let image = make(
        &dir.path().join("golden.raw"),
        Pattern::HalfData,
        32 * MIB,
        41,
    )
    .unwrap();
    let qcow2 = nginx.root().join("golden.qcow2");
    let out = Command::new("qemu-img")
        .args(["convert", "-O", "qcow2"])
        .arg(&image.path)
        .arg(&qcow2)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let qcow2_size = std::fs::metadata(&qcow2).unwrap().len();
    let url = nginx.url("golden.qcow2");

    let ca = MoverCa::generate().unwrap();
    let stranger_ca = MoverCa::generate().unwrap();
    let seed_mover = Mover::new(dir.path(), SEED_POD, &ca, &ca, &["vm-0"]);
    let reader_mover = Mover::new(dir.path(), READER_POD, &ca, &ca, &["vm-1", "vm-2"]);
    let stranger = Mover::new(dir.path(), "stranger-ft-1", &stranger_ca, &ca, &["vm-9"]);
    let service = |m: &Mover, tag: &str| {
        let data = dir.path().join(format!("data-{tag}"));
        start_in_process(test_config(&data, &m.root))
    };
    let seed_service = service(&seed_mover, "seed").await;
    let reader_service = service(&reader_mover, "reader").await;
    let stranger_service = service(&stranger, "stranger").await;

    // The serving group: its request relays its first claim.
    let seed = group(
        "fleet-g0",
        &url,
        &["vm-0"],
        GroupRelay {
            serve: true,
            from: None,
        },
    );
    let mut request = transfer_request(&seed, &claims(&["vm-0"]), &[0], None).unwrap();
    seed_mover.localize_request(&mut request);
    let port = free_port();
    let relay = request.target.as_mut().unwrap().relay.as_mut().unwrap();
    assert_eq!(relay.listen, "0.0.0.0:10810");
    relay.listen = format!("127.0.0.1:{port}");
    relay.idle_seconds = 1;
    // Slow enough that the reading group starts while the seed copies.
    request
        .options
        .get_or_insert_with(Default::default)
        .rate_limit = 16 * MIB;
    let mut seed_client = connect(seed_service.grpc_addr()).await;
    let seed_id = seed_client
        .start_transfer(request)
        .await
        .unwrap()
        .into_inner()
        .id;
    let running = watch_until(&mut seed_client, &seed_id, |j| {
        j.message.contains("relaying") || is_terminal(j)
    })
    .await;
    assert!(running.message.contains("relaying"), "{running:?}");

    // A mover of another CA is refused by the relay.
    let url_now = relay_url(port);
    let stranger_group = group(
        "fleet-g9",
        &url,
        &["vm-9"],
        GroupRelay {
            serve: false,
            from: Some("fleet-g0".into()),
        },
    );
    let mut request = reader_request(&stranger_group, &url_now, &claims(&["vm-9"]));
    stranger.localize_request(&mut request);
    let mut stranger_client = connect(stranger_service.grpc_addr()).await;
    let stranger_id = stranger_client
        .start_transfer(request)
        .await
        .unwrap()
        .into_inner()
        .id;

    // The reading group: through the relay, raw, with its own certificate.
    let reader = group(
        "fleet-g1",
        &url,
        &["vm-1", "vm-2"],
        GroupRelay {
            serve: false,
            from: Some("fleet-g0".into()),
        },
    );
    let mut request = reader_request(&reader, &url_now, &claims(&["vm-1", "vm-2"]));
    let source = request.source.as_ref().unwrap();
    assert_eq!(source.format, proto::ImageFormat::Raw as i32);
    assert!(
        source.url.starts_with(&format!(
            "nbds://127.0.0.1:{port}/?tls-hostname={SEED_POD}.{NS}."
        )),
        "{}",
        source.url
    );
    reader_mover.localize_request(&mut request);
    let mut reader_client = connect(reader_service.grpc_addr()).await;
    let reader_id = reader_client
        .start_transfer(request)
        .await
        .unwrap()
        .into_inner()
        .id;

    let limit = Duration::from_secs(180);
    let read = wait_terminal(&mut reader_client, &reader_id, limit).await;
    assert_eq!(state(&read), JobState::Succeeded, "{read:?}");
    let seeded = wait_terminal(&mut seed_client, &seed_id, limit).await;
    assert_eq!(state(&seeded), JobState::Succeeded, "{seeded:?}");
    let refused = wait_terminal(&mut stranger_client, &stranger_id, limit).await;
    assert_eq!(state(&refused), JobState::Failed, "{refused:?}");
    let why = refused.error.map(|e| e.message).unwrap_or_default();
    // The relay checks the client's certificate against the movers' CA and refuses the
    // handshake (a certificate of another CA of the same name fails its signature check).
    assert!(
        why.contains("fatal alert") || why.to_lowercase().contains("certificate"),
        "{why}"
    );

    for disk in [
        seed_mover.disk("vm-0"),
        reader_mover.disk("vm-1"),
        reader_mover.disk("vm-2"),
    ] {
        qemu_img_compare(&image.path, &disk);
    }
    let digest = |j: &proto::Job| match &j.result {
        Some(proto::job::Result::TransferResult(r)) => {
            r.source_digest.as_ref().map(|d| d.hex.clone())
        }
        _ => None,
    };
    assert!(digest(&seeded).is_some_and(|d| !d.is_empty()), "{seeded:?}");
    assert_eq!(digest(&seeded), digest(&read), "both groups read one image");
    let (served, requests) = nginx.body_bytes_sent();
    let ratio = served as f64 / qcow2_size as f64;
    eprintln!("nginx served {served} bytes in {requests} requests for a {qcow2_size}-byte qcow2 into 3 targets in 2 groups: {ratio:.3}x");
    assert!(
        ratio <= 1.05,
        "nginx served {served} bytes in {requests} requests for a {qcow2_size}-byte qcow2 ({ratio:.3}x): the reading group went to the origin"
    );
}
