//! GoldenImages end to end on the API stand-in with the operator's real controllers and a
//! real nginx as the image server: the first poll imports (the version is nginx's ETag),
//! an unchanged file imports nothing, a changed file imports again, the newest two imports
//! are kept and the oldest claim deleted; a Transfer from `source: {goldenImage}` reads
//! the claim current when it started; a missing file is a PollFailed condition. A registry
//! image (a real docker-registry, anonymous, plain HTTP) is versioned by its tag's manifest
//! digest: an unchanged tag imports nothing, a new image under the tag imports once. The
//! movers' jobs are the fake link's (no bytes move: what is tested is the operator's side).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_operator::controller::{self, mover_ca, mover_selector, OperatorSettings};
use ferry_operator::metrics::OperatorMetrics;
use ferry_testkit::kube::{ChangeType, Cluster, Sim};
use ferry_tests::fake_mover::FakeMover;
use ferry_tests::http_server::Nginx;
use ferry_tests::registry_server::{Auth, Registry};
use serde_json::{json, Value};

const NS: &str = "vms";
const SERVICE_ACCOUNT: (&str, &str) = ("ferry-system", "ferry-operator");

fn cluster() -> Cluster {
    let c = Cluster::new();
    c.simulate(&Sim::ALL);
    c.add_namespace("ferry-system", &[], &[]);
    c.add_namespace(NS, &[], &[]);
    c.add_node("node-a", &[]);
    c.add_storage_class("ceph-rbd", "rbd.csi.ceph.com", false, true);
    c
}

/// The operator's controllers as its ServiceAccount, until the task is aborted.
fn start(cluster: &Cluster) -> tokio::task::JoinHandle<()> {
    let rbac =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/operator/10-rbac.yaml");
    let client = cluster.client_as(&rbac, SERVICE_ACCOUNT);
    let settings = OperatorSettings::new(ferry_tests::mover_pods::defaults(
        "ghcr.io/ferry-project/ferry:0.1.0",
    ));
    tokio::spawn(async move {
        let ca = mover_ca::load_or_create(&client, "ferry-system")
            .await
            .expect("the movers' CA");
        let link = FakeMover {
            run: Duration::from_millis(200),
            every: None,
        };
        controller::run(
            client,
            settings,
            Arc::new(link),
            Some(Arc::new(ca)),
            Arc::new(OperatorMetrics::new()),
        )
        .await
        .expect("the controllers run");
    })
}

async fn until(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn golden(c: &Cluster, name: &str) -> Value {
    c.get("ferry.dev", "goldenimages", NS, name)
        .expect("the GoldenImage")
}

/// Makes the next poll due now (as the next cron fire would).
fn fire(c: &Cluster, name: &str) {
    let mut g = golden(c, name);
    g["status"]["nextPollTime"] = json!("2000-01-01T00:00:00Z");
    c.put(g);
}

fn condition(g: &Value, type_: &str) -> (String, String, String) {
    let c = g["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .cloned()
        .unwrap_or_default();
    let text = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    (text("status"), text("reason"), text("message"))
}

fn current(c: &Cluster, name: &str) -> Option<String> {
    golden(c, name)["status"]["currentClaim"]
        .as_str()
        .map(String::from)
}

fn write_image(nginx: &Nginx, seed: u8) {
    let bytes: Vec<u8> = (0..(1u32 << 20)).map(|i| (i as u8) ^ seed).collect();
    std::fs::write(nginx.root().join("fedora.img"), bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_golden_image_imports_each_new_version_keeps_the_newest_and_transfers_read_it() {
    let nginx = Nginx::start();
    write_image(&nginx, 1);
    let c = cluster();
    let operator = start(&c);
    c.create(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "GoldenImage",
        "metadata": {"name": "fedora", "namespace": NS},
        "spec": {
            "source": {"url": nginx.url("fedora.img")},
            "trigger": {"schedule": "0 0 1 1 *"},
            "importsToKeep": 2,
            "claim": {"size": "4Mi", "volumeMode": "Block"},
        },
    }));

    // 1. The first poll imports; the import's Transfer is deleted, its claim kept.
    until(30, "the first import", || current(&c, "fedora").is_some()).await;
    let first = current(&c, "fedora").unwrap();
    let g = golden(&c, "fedora");
    let version = g["status"]["currentVersion"].as_str().unwrap().to_string();
    assert!(version.starts_with("etag:\""), "{version}");
    assert_eq!(condition(&g, "Ready").1, "UpToDate");
    assert!(first.starts_with("fedora-"), "{first}");
    until(10, "the import's Transfer to go", || {
        c.get("ferry.dev", "transfers", NS, &first).is_none()
    })
    .await;
    let claim = c.get("", "persistentvolumeclaims", NS, &first).unwrap();
    assert_eq!(claim["status"]["phase"], "Bound");
    assert!(g["status"]["nextPollTime"].as_str().unwrap() > "2026-");

    // 2. A Transfer from the GoldenImage reads its current claim.
    let mut movers = c.changes("", "pods", &mover_selector());
    c.create(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "vm-1", "namespace": NS},
        "spec": {"source": {"goldenImage": {"name": "fedora"}},
                 "targets": [{"pvcTemplate": {"name": "vm-1-disk", "size": "4Mi",
                                              "volumeMode": "Block"}}]},
    }));
    until(30, "the Transfer to succeed", || {
        c.get("ferry.dev", "transfers", NS, "vm-1")
            .is_some_and(|t| t["status"]["phase"] == "Succeeded")
    })
    .await;
    let t = c.get("ferry.dev", "transfers", NS, "vm-1").unwrap();
    assert_eq!(t["status"]["sourceClaim"], first.as_str());
    let mut mounted = Vec::new();
    while let Ok((kind, pod, _)) = movers.try_recv() {
        if kind == ChangeType::Added {
            for v in pod["spec"]["volumes"].as_array().into_iter().flatten() {
                if let Some(claim) = v["persistentVolumeClaim"]["claimName"].as_str() {
                    mounted.push(claim.to_string());
                }
            }
        }
    }
    assert!(mounted.contains(&first), "{mounted:?}");
    assert!(mounted.contains(&"vm-1-disk".to_string()), "{mounted:?}");

    // 3. The file unchanged: a poll imports nothing.
    let polled = golden(&c, "fedora")["status"]["lastPollTime"].clone();
    fire(&c, "fedora");
    until(10, "the next poll", || {
        golden(&c, "fedora")["status"]["lastPollTime"] != polled
            || golden(&c, "fedora")["status"]["nextPollTime"] != "2000-01-01T00:00:00Z"
    })
    .await;
    until(10, "the poll to settle", || {
        golden(&c, "fedora")["status"]["nextPollTime"] != "2000-01-01T00:00:00Z"
    })
    .await;
    let g = golden(&c, "fedora");
    assert_eq!(current(&c, "fedora").as_deref(), Some(first.as_str()));
    assert_eq!(g["status"]["imports"].as_array().unwrap().len(), 1);
    assert!(g["status"].get("importing").is_none(), "{}", g["status"]);

    // 4. Two new versions: each imported; the oldest claim goes (importsToKeep 2).
    let mut claims = vec![first.clone()];
    for seed in [2u8, 3] {
        // nginx's ETag is the file's mtime and size: a new second makes a new one.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        write_image(&nginx, seed);
        let before = current(&c, "fedora");
        fire(&c, "fedora");
        until(30, "a new import", || current(&c, "fedora") != before).await;
        claims.push(current(&c, "fedora").unwrap());
    }
    let g = golden(&c, "fedora");
    let kept: Vec<&str> = g["status"]["imports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["claim"].as_str().unwrap())
        .collect();
    assert_eq!(kept, [claims[2].as_str(), claims[1].as_str()]);
    assert_ne!(
        g["status"]["currentVersion"].as_str(),
        Some(version.as_str())
    );
    until(10, "the oldest import's claim to go", || {
        c.get("", "persistentvolumeclaims", NS, &claims[0])
            .is_none()
    })
    .await;
    for kept in &claims[1..] {
        assert!(
            c.get("", "persistentvolumeclaims", NS, kept).is_some(),
            "{kept}"
        );
    }
    // The Transfer that read the first import keeps what it recorded.
    let t = c.get("ferry.dev", "transfers", NS, "vm-1").unwrap();
    assert_eq!(t["status"]["sourceClaim"], first.as_str());

    // 5. A source that is not there: PollFailed, saying what the server answered.
    c.create(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "GoldenImage",
        "metadata": {"name": "missing", "namespace": NS},
        "spec": {
            "source": {"url": nginx.url("no-such.img")},
            "trigger": {"schedule": "0 0 1 1 *"},
            "claim": {"size": "4Mi"},
        },
    }));
    until(30, "the failed poll", || {
        condition(&golden(&c, "missing"), "Ready").1 == "PollFailed"
    })
    .await;
    let (status, _, message) = condition(&golden(&c, "missing"), "Ready");
    assert_eq!(status, "False");
    assert!(message.contains("404"), "{message}");
    assert!(message.contains("check the URL"), "{message}");
    assert!(current(&c, "missing").is_none());
    let denied = c.denied();
    assert!(
        denied.is_empty(),
        "the API server refused the operator: {denied:#?}"
    );
    operator.abort();
}

/// The digest a registry names for `repo:tag` (curl's HEAD of the manifest).
fn manifest_digest(registry: &Registry, repo: &str, tag: &str) -> String {
    let out = std::process::Command::new("curl")
        .args(["-sSfI", "-H"])
        .arg(
            "Accept: application/vnd.oci.image.index.v1+json, \
             application/vnd.docker.distribution.manifest.list.v2+json, \
             application/vnd.oci.image.manifest.v1+json, \
             application/vnd.docker.distribution.manifest.v2+json",
        )
        .arg(format!(
            "http://{}/v2/{repo}/manifests/{tag}",
            registry.host()
        ))
        .output()
        .expect("curl");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("docker-content-digest")
                .then(|| v.trim().to_string())
        })
        .expect("the registry names the manifest's digest")
}

/// A containerDisk image `name` holding a 1 MiB disk made from `seed`, pushed as
/// `vms/fedora:41`.
fn push_disk(registry: &Registry, dir: &std::path::Path, name: &str, seed: u8) {
    let disk = dir.join(format!("{name}.img"));
    let bytes: Vec<u8> = (0..(1u32 << 20)).map(|i| (i as u8) ^ seed).collect();
    std::fs::write(&disk, bytes).unwrap();
    registry.build(name, &disk, "amd64");
    registry.push(name, "vms/fedora:41", "gzip");
}

/// A GoldenImage of a registry image (a public registry, asked anonymously over plain
/// HTTP with `registry.insecure`): its version is the digest of the manifest the tag
/// names; an unchanged tag imports nothing, a new image pushed to the tag imports once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_golden_image_is_versioned_by_its_tags_manifest_digest() {
    let dir = ferry_tests::scratch_dir();
    let registry = Registry::start_with(dir.path(), &Auth::AnonymousPlain);
    push_disk(&registry, dir.path(), "v1", 1);
    let first_digest = manifest_digest(&registry, "vms/fedora", "41");
    let c = cluster();
    let _operator = start(&c);
    c.create(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "GoldenImage",
        "metadata": {"name": "fedora", "namespace": NS},
        "spec": {
            "source": {"url": registry.url("vms/fedora:41"), "registry": {"insecure": true}},
            "trigger": {"schedule": "0 0 1 1 *"},
            "claim": {"size": "4Mi", "volumeMode": "Block"},
        },
    }));
    until(30, "the first import", || current(&c, "fedora").is_some()).await;
    let first = current(&c, "fedora").unwrap();
    let g = golden(&c, "fedora");
    assert_eq!(
        g["status"]["currentVersion"],
        format!("digest:{first_digest}").as_str()
    );

    // The tag unchanged: a poll imports nothing.
    fire(&c, "fedora");
    until(10, "the poll to settle", || {
        golden(&c, "fedora")["status"]["nextPollTime"] != "2000-01-01T00:00:00Z"
    })
    .await;
    let g = golden(&c, "fedora");
    assert_eq!(current(&c, "fedora").as_deref(), Some(first.as_str()));
    assert_eq!(g["status"]["imports"].as_array().unwrap().len(), 1);

    // A new image under the same tag: imported once, under its digest.
    push_disk(&registry, dir.path(), "v2", 2);
    let second_digest = manifest_digest(&registry, "vms/fedora", "41");
    assert_ne!(first_digest, second_digest);
    fire(&c, "fedora");
    until(30, "the new image's import", || {
        current(&c, "fedora").is_some_and(|claim| claim != first)
    })
    .await;
    let g = golden(&c, "fedora");
    assert_eq!(
        g["status"]["currentVersion"],
        format!("digest:{second_digest}").as_str()
    );
    assert_eq!(g["status"]["imports"].as_array().unwrap().len(), 2);
}

// ---- `ferry source version`: the version a probe pod reports, against real servers ----

/// A secrets directory laid out as a mover's `--secrets-dir` (`<secret>/<key>` files).
fn secrets_dir(dir: &std::path::Path, files: &[(&str, &str, &str)]) -> std::path::PathBuf {
    let root = dir.join("secrets");
    for (secret, key, value) in files {
        std::fs::create_dir_all(root.join(secret)).unwrap();
        std::fs::write(root.join(secret).join(key), value).unwrap();
    }
    root
}

/// `ferry source version ARGS`: its stdout's one line on success.
fn source_version(args: &[&str]) -> String {
    let mut all = vec!["source", "version"];
    all.extend(args);
    let run = ferry_tests::ferry!().run(&all);
    run.assert_success();
    run.stdout.trim().to_string()
}

/// The termination message a probe writes for ARGS (the run exits 0 either way).
fn reported(dir: &std::path::Path, args: &[&str]) -> ferry_operator::golden::report::Probed {
    let path = dir.join("termination-log");
    let _ = std::fs::remove_file(&path);
    let mut all = vec!["source", "version", "--termination-message-path"];
    all.push(path.to_str().unwrap());
    all.extend(args);
    let run = ferry_tests::ferry!().run(&all);
    run.assert_success();
    let text = std::fs::read_to_string(&path).expect("the termination message");
    assert!(text.len() <= ferry_operator::golden::report::MAX_MESSAGE);
    ferry_operator::golden::report::parse(&text)
}

/// nginx: the version is its ETag, the same the operator asks anonymously; a changed
/// file has another one; credentials from `--endpoint-json` reach `/private/`; a wrong
/// password and a missing file are errors that show no secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_version_command_names_an_http_objects_etag_with_its_credentials() {
    use ferry_operator::golden::report::Probed;
    let nginx = Nginx::start();
    write_image(&nginx, 1);
    let url = nginx.url("fedora.img");
    let first = source_version(&[&url]);
    assert!(
        first.starts_with("etag:\"") && first.ends_with('"'),
        "{first}"
    );
    let endpoint: ferry_operator::crd::Endpoint =
        serde_json::from_value(json!({"url": url})).unwrap();
    let operator = ferry_operator::golden::probe::version_of(&endpoint)
        .await
        .unwrap();
    assert_eq!(operator.as_deref(), Some(first.as_str()));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    write_image(&nginx, 2);
    let second = source_version(&[&url]);
    assert_ne!(first, second);

    // Basic authentication from a Secret file, as in a probe pod.
    let dir = ferry_tests::scratch_dir();
    std::fs::copy(
        nginx.root().join("fedora.img"),
        nginx.root().join("private/fedora.img"),
    )
    .unwrap();
    let private = json!({"url": nginx.url("private/fedora.img"),
        "http": {"user": ferry_tests::http_server::USER, "password": {"name": "web", "key": "password"}}})
    .to_string();
    let good = secrets_dir(
        &dir.path().join("good"),
        &[("web", "password", ferry_tests::http_server::PASSWORD)],
    );
    let version = source_version(&[
        "--endpoint-json",
        &private,
        "--secrets-dir",
        good.to_str().unwrap(),
    ]);
    assert!(version.starts_with("etag:\""), "{version}");
    assert_eq!(
        reported(
            dir.path(),
            &[
                "--endpoint-json",
                &private,
                "--secrets-dir",
                good.to_str().unwrap()
            ]
        ),
        Probed::Version(Some(version))
    );
    let bad = secrets_dir(
        &dir.path().join("bad"),
        &[("web", "password", "wrong-password-value")],
    );
    let Probed::Failed(why) = reported(
        dir.path(),
        &[
            "--endpoint-json",
            &private,
            "--secrets-dir",
            bad.to_str().unwrap(),
        ],
    ) else {
        panic!("a wrong password gave a version")
    };
    assert!(why.contains("401"), "{why}");
    assert!(!why.contains("wrong-password-value"), "{why}");
    let run = ferry_tests::ferry!().run([
        "source",
        "version",
        "--endpoint-json",
        &private,
        "--secrets-dir",
        bad.to_str().unwrap(),
    ]);
    let line = run.assert_clean_failure();
    assert!(!line.contains("wrong-password-value"), "{line}");
    let Probed::Failed(why) = reported(dir.path(), &[&nginx.url("no-such.img")]) else {
        panic!("a missing file gave a version")
    };
    assert!(why.contains("404") || why.contains("not found"), "{why}");
    let line = ferry_tests::ferry!()
        .run(["source", "version", "nbd://127.0.0.1:1/x"])
        .assert_clean_failure()
        .to_string();
    assert!(line.contains("have a version to ask"), "{line}");
}

/// S3 with credentials (s3s-fs): the version is the object's ETag; the operator's
/// anonymous HEAD is refused (the pod asks then); a wrong key is an error without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_version_command_names_an_s3_objects_etag_with_its_credentials() {
    use ferry_operator::golden::report::Probed;
    use ferry_tests::s3_server::{S3Server, ACCESS_KEY, SECRET_KEY};
    let server = S3Server::start().await;
    server.create_bucket("images");
    let client = ferry_s3::client(&server.options()).await;
    let put = |body: &'static [u8]| {
        client
            .put_object()
            .bucket("images")
            .key("fedora/disk.raw")
            .body(body.to_vec().into())
            .send()
    };
    put(b"version one").await.unwrap();
    let dir = ferry_tests::scratch_dir();
    let source = json!({"url": "s3://images/fedora/disk.raw", "s3": {
        "endpointUrl": server.endpoint_url(), "forcePathStyle": true,
        "accessKeyId": {"name": "s3", "key": "id"},
        "secretAccessKey": {"name": "s3", "key": "secret"}}});
    let json = source.to_string();
    let good = secrets_dir(
        &dir.path().join("good"),
        &[("s3", "id", ACCESS_KEY), ("s3", "secret", SECRET_KEY)],
    );
    let args = |secrets: &std::path::Path| {
        vec![
            "--endpoint-json".to_string(),
            json.clone(),
            "--secrets-dir".to_string(),
            secrets.to_str().unwrap().to_string(),
        ]
    };
    let good_args = args(&good);
    let good_args: Vec<&str> = good_args.iter().map(String::as_str).collect();
    let first = source_version(&good_args);
    let head = client
        .head_object()
        .bucket("images")
        .key("fedora/disk.raw")
        .send()
        .await
        .unwrap();
    assert_eq!(first, format!("etag:{}", head.e_tag().unwrap()));
    assert_eq!(
        source_version(&good_args),
        first,
        "asked twice, one version"
    );
    put(b"version two").await.unwrap();
    let second = source_version(&good_args);
    assert_ne!(first, second);
    assert_eq!(
        reported(dir.path(), &good_args),
        Probed::Version(Some(second))
    );

    // The operator's anonymous HEAD: refused, so the GoldenImage asks by a pod.
    let mut anonymous = source.clone();
    anonymous["s3"] = json!({"endpointUrl": server.endpoint_url(), "forcePathStyle": true});
    let endpoint: ferry_operator::crd::Endpoint = serde_json::from_value(anonymous).unwrap();
    let e = ferry_operator::golden::probe::version_of(&endpoint)
        .await
        .unwrap_err();
    assert!(e.denied(), "{e}");

    let bad = secrets_dir(
        &dir.path().join("bad"),
        &[
            ("s3", "id", ACCESS_KEY),
            ("s3", "secret", "not-the-secret-key-9876"),
        ],
    );
    let bad_args = args(&bad);
    let bad_args: Vec<&str> = bad_args.iter().map(String::as_str).collect();
    let Probed::Failed(why) = reported(dir.path(), &bad_args) else {
        panic!("a wrong key gave a version")
    };
    assert!(!why.contains("not-the-secret-key-9876"), "{why}");
    let mut missing = source.clone();
    missing["url"] = json!("s3://images/no-such.raw");
    let missing = missing.to_string();
    let Probed::Failed(why) = reported(
        dir.path(),
        &[
            "--endpoint-json",
            &missing,
            "--secrets-dir",
            good.to_str().unwrap(),
        ],
    ) else {
        panic!("a missing object gave a version")
    };
    assert!(why.contains("no-such.raw"), "{why}");
}

/// moto with a versioned bucket: the version names the object's version id, so the same
/// bytes written again are a new version; the operator's anonymous HEAD of the object
/// (public-read) names the same version as the credentialed command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_versioned_buckets_object_version_names_its_version_id() {
    use ferry_tests::moto_server::MotoServer;
    let moto = MotoServer::start();
    moto.create_locked_bucket("versioned");
    let client = ferry_s3::client(&moto.options()).await;
    let put = || {
        client
            .put_object()
            .bucket("versioned")
            .key("disk.raw")
            .acl(aws_sdk_s3::types::ObjectCannedAcl::PublicRead)
            .body(b"same bytes".to_vec().into())
            .send()
    };
    let first_id = put().await.unwrap().version_id().unwrap().to_string();
    let dir = ferry_tests::scratch_dir();
    let ask = || {
        let mut cmd =
            ferry_tests::ferry!().command(["source", "version", "s3://versioned/disk.raw"]);
        moto.sdk_env(&mut cmd, dir.path());
        let run = ferry_tests::bin::wait_with_deadline(
            cmd.spawn().unwrap(),
            Duration::from_secs(60),
            "ferry source version".into(),
        );
        run.assert_success();
        run.stdout.trim().to_string()
    };
    let first = ask();
    assert!(first.starts_with("etag:\""), "{first}");
    assert!(
        first.ends_with(&format!(" version-id:{first_id}")),
        "{first}"
    );
    let second_id = put().await.unwrap().version_id().unwrap().to_string();
    assert_ne!(first_id, second_id);
    let second = ask();
    assert_eq!(
        second,
        format!(
            "{} version-id:{second_id}",
            first.split(' ').next().unwrap()
        ),
        "the same bytes again: the same ETag, another version"
    );
    let endpoint: ferry_operator::crd::Endpoint = serde_json::from_value(json!({
        "url": "s3://versioned/disk.raw",
        "s3": {"endpointUrl": moto.endpoint_url(), "forcePathStyle": true}}))
    .unwrap();
    let anonymous = ferry_operator::golden::probe::version_of(&endpoint)
        .await
        .unwrap();
    assert_eq!(anonymous.as_deref(), Some(second.as_str()));
}

/// A registry with basic authentication over TLS (its own CA): the version is the
/// digest of the manifest the tag names, asked with the credentials the mover gets; a
/// new image under the tag is another version; a wrong password is an error.
#[test]
fn the_version_command_names_a_private_registry_images_digest() {
    use ferry_tests::registry_server::{write_auth_file, PASSWORD, USER};
    let dir = ferry_tests::scratch_dir();
    let registry = Registry::start(dir.path());
    push_disk(&registry, dir.path(), "v1", 1);
    let digest = |reg: &Registry| {
        let out = std::process::Command::new("curl")
            .args(["-sSfI", "--cacert"])
            .arg(reg.ca_file())
            .args(["-u", &format!("{USER}:{PASSWORD}"), "-H"])
            .arg("Accept: application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json")
            .arg(format!("https://{}/v2/vms/fedora/manifests/41", reg.host()))
            .output()
            .expect("curl");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("docker-content-digest")
                    .then(|| v.trim().to_string())
            })
            .unwrap()
    };
    let ask = |auth: &std::path::Path| {
        let mut cmd = ferry_tests::ferry!().command([
            "source".to_string(),
            "version".to_string(),
            registry.url("vms/fedora:41"),
        ]);
        cmd.env("FERRY_REGISTRY_AUTH_FILE", auth)
            .env("FERRY_REGISTRY_CA_FILE", registry.ca_file());
        ferry_tests::bin::wait_with_deadline(
            cmd.spawn().unwrap(),
            Duration::from_secs(60),
            "ferry source version".into(),
        )
    };
    let run = ask(&registry.auth_file());
    run.assert_success();
    assert_eq!(run.stdout.trim(), format!("digest:{}", digest(&registry)));
    push_disk(&registry, dir.path(), "v2", 2);
    let run = ask(&registry.auth_file());
    run.assert_success();
    assert_eq!(run.stdout.trim(), format!("digest:{}", digest(&registry)));
    let wrong = dir.path().join("wrong-auth.json");
    write_auth_file(&wrong, &registry.host(), "not-the-registry-pw");
    let run = ask(&wrong);
    let line = run.assert_clean_failure();
    assert!(!line.contains("not-the-registry-pw"), "{line}");
}

// ---- On the API stand-in: credentialed sources probed by pods, imports kept as snapshots ----

/// The kubelet of version probe pods: runs each new probe pod's command with the real
/// binary (its Secret keys written where the pod projects them) and ends the pod with
/// what the command wrote as its termination message. Stops when the flag is set.
fn run_probe_pods(
    c: &Cluster,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<usize> {
    use base64::Engine as _;
    let mut pods = c.changes("", "pods", "app.kubernetes.io/component=version-probe");
    let c = c.clone();
    std::thread::spawn(move || {
        let mut ran = 0;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let Ok((kind, pod, _)) = pods.try_recv() else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            if kind != ChangeType::Added {
                continue;
            }
            let name = pod["metadata"]["name"].as_str().unwrap().to_string();
            let ns = pod["metadata"]["namespace"].as_str().unwrap().to_string();
            let dir = ferry_tests::scratch_dir();
            let secrets = dir.path().join("secrets");
            for volume in pod["spec"]["volumes"].as_array().unwrap() {
                for source in volume["projected"]["sources"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    let secret = &source["secret"];
                    let Some(secret_name) = secret["name"].as_str() else {
                        continue;
                    };
                    let Some(stored) = c.get("", "secrets", &ns, secret_name) else {
                        continue; // a missing Secret: the kubelet would not start the pod
                    };
                    for item in secret["items"].as_array().unwrap() {
                        let value = base64::engine::general_purpose::STANDARD
                            .decode(
                                stored["data"][item["key"].as_str().unwrap()]
                                    .as_str()
                                    .unwrap(),
                            )
                            .unwrap();
                        let path = secrets.join(item["path"].as_str().unwrap());
                        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                        std::fs::write(path, value).unwrap();
                    }
                }
            }
            let message = dir.path().join("termination-log");
            let args: Vec<String> = pod["spec"]["containers"][0]["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect();
            let mut local = Vec::new();
            let mut it = args.iter();
            while let Some(a) = it.next() {
                local.push(a.clone());
                match a.as_str() {
                    "--secrets-dir" => {
                        assert_eq!(it.next().unwrap(), "/var/run/ferry/secrets");
                        local.push(secrets.display().to_string());
                    }
                    "--termination-message-path" => {
                        assert_eq!(it.next().unwrap(), "/dev/termination-log");
                        local.push(message.display().to_string());
                    }
                    _ => {}
                }
            }
            let run = ferry_tests::ferry!().run(&local);
            let text = std::fs::read_to_string(&message).unwrap_or_default();
            let code = run.status.code().unwrap_or(1);
            c.exit_pod_with(&ns, &name, code, None, Some(&text));
            ran += 1;
        }
        ran
    })
}

fn secret(c: &Cluster, name: &str, key: &str, value: &str) {
    use base64::Engine as _;
    c.create(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "data": {key: base64::engine::general_purpose::STANDARD.encode(value)},
    }));
}

/// A GoldenImage of a file behind basic authentication on nginx: each poll is a probe pod
/// (run here by the real binary with the projected Secret) whose version decides; an
/// unchanged file imports nothing, a changed one imports once; a wrong password is
/// PollFailed saying 401, without the password; the probe pods go once read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credentialed_golden_image_is_versioned_by_probe_pods() {
    let nginx = Nginx::start();
    let write_private = |seed: u8| {
        let bytes: Vec<u8> = (0..(1u32 << 20)).map(|i| (i as u8) ^ seed).collect();
        std::fs::write(nginx.root().join("private/fedora.img"), bytes).unwrap();
    };
    write_private(1);
    let c = cluster();
    secret(&c, "web", "password", ferry_tests::http_server::PASSWORD);
    secret(&c, "web-wrong", "password", "not-the-http-password");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let kubelet = run_probe_pods(&c, stop.clone());
    let _operator = start(&c);
    let spec = |secret: &str| {
        json!({
            "source": {"url": nginx.url("private/fedora.img"),
                       "http": {"user": ferry_tests::http_server::USER,
                                "password": {"name": secret, "key": "password"}}},
            "trigger": {"schedule": "0 0 1 1 *"},
            "claim": {"size": "4Mi", "volumeMode": "Block"},
        })
    };
    c.create(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "GoldenImage",
        "metadata": {"name": "fedora", "namespace": NS}, "spec": spec("web"),
    }));
    until(60, "the first import", || current(&c, "fedora").is_some()).await;
    let first = current(&c, "fedora").unwrap();
    let version = golden(&c, "fedora")["status"]["currentVersion"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(version.starts_with("etag:\""), "{version}");
    until(10, "the probe pod to go", || {
        c.get("", "pods", NS, "fedora-version").is_none()
    })
    .await;

    // Unchanged: nothing imports.
    fire(&c, "fedora");
    until(30, "the poll to settle", || {
        golden(&c, "fedora")["status"]["nextPollTime"] != "2000-01-01T00:00:00Z"
    })
    .await;
    let g = golden(&c, "fedora");
    assert_eq!(current(&c, "fedora").as_deref(), Some(first.as_str()));
    assert_eq!(g["status"]["imports"].as_array().unwrap().len(), 1);
    assert!(g["status"].get("importing").is_none(), "{}", g["status"]);

    // Changed: one import, of the new version.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    write_private(2);
    fire(&c, "fedora");
    until(60, "the new version's import", || {
        current(&c, "fedora").is_some_and(|claim| claim != first)
    })
    .await;
    let g = golden(&c, "fedora");
    assert_eq!(g["status"]["imports"].as_array().unwrap().len(), 2);
    assert_ne!(
        g["status"]["currentVersion"].as_str(),
        Some(version.as_str())
    );

    // A wrong password: PollFailed, what the server said, no secret.
    c.create(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "GoldenImage",
        "metadata": {"name": "denied", "namespace": NS}, "spec": spec("web-wrong"),
    }));
    until(60, "the failed poll", || {
        condition(&golden(&c, "denied"), "Ready").1 == "PollFailed"
    })
    .await;
    let (_, _, message) = condition(&golden(&c, "denied"), "Ready");
    assert!(message.contains("401"), "{message}");
    assert!(!message.contains("not-the-http-password"), "{message}");
    assert!(current(&c, "denied").is_none());
    until(10, "the failed probe pod to go", || {
        c.get("", "pods", NS, "denied-version").is_none()
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(kubelet.join().unwrap() >= 4);
    let denied = c.denied();
    assert!(
        denied.is_empty(),
        "the API server refused the operator: {denied:#?}"
    );
}

/// `keepAs: Snapshot`: the import's claim is snapshotted, deleted once the snapshot is
/// ready (made ready here, as a snapshot controller would), the snapshot is current; a
/// Transfer from the GoldenImage restores it into its own claim and copies from that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_golden_image_kept_as_snapshots_serves_transfers_from_a_restored_claim() {
    let nginx = Nginx::start();
    write_image(&nginx, 1);
    let c = cluster();
    let _operator = start(&c);
    c.create(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "GoldenImage",
        "metadata": {"name": "fedora", "namespace": NS},
        "spec": {
            "source": {"url": nginx.url("fedora.img")},
            "trigger": {"schedule": "0 0 1 1 *"},
            "claim": {"size": "4Mi", "volumeMode": "Block", "storageClassName": "ceph-rbd"},
            "keepAs": "Snapshot",
        },
    }));
    until(30, "the import's snapshot", || {
        golden(&c, "fedora")["status"]["importing"]["snapshot"].is_string()
    })
    .await;
    let name = golden(&c, "fedora")["status"]["importing"]["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    let mut snapshot = c
        .get("snapshot.storage.k8s.io", "volumesnapshots", NS, &name)
        .expect("the VolumeSnapshot");
    assert_eq!(
        snapshot["spec"]["source"]["persistentVolumeClaimName"],
        name.as_str()
    );
    assert!(c.get("", "persistentvolumeclaims", NS, &name).is_some());
    snapshot["status"] = json!({"readyToUse": true, "restoreSize": "4Mi"});
    c.put(snapshot);
    until(30, "the snapshot to be current", || {
        golden(&c, "fedora")["status"]["currentSnapshot"] == name.as_str()
    })
    .await;
    assert!(current(&c, "fedora").is_none());
    until(10, "the import's claim to go", || {
        c.get("", "persistentvolumeclaims", NS, &name).is_none()
    })
    .await;

    let mut movers = c.changes("", "pods", &mover_selector());
    c.create(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "vm-1", "namespace": NS},
        "spec": {"source": {"goldenImage": {"name": "fedora"}},
                 "targets": [{"pvcTemplate": {"name": "vm-1-disk", "size": "4Mi",
                                              "volumeMode": "Block"}}]},
    }));
    until(60, "the Transfer to succeed", || {
        c.get("ferry.dev", "transfers", NS, "vm-1")
            .is_some_and(|t| t["status"]["phase"] == "Succeeded")
    })
    .await;
    let t = c.get("ferry.dev", "transfers", NS, "vm-1").unwrap();
    assert_eq!(t["status"]["sourceClaim"], "vm-1-golden");
    let restored = c
        .get("", "persistentvolumeclaims", NS, "vm-1-golden")
        .expect("the restored claim");
    assert_eq!(restored["spec"]["dataSource"]["kind"], "VolumeSnapshot");
    assert_eq!(restored["spec"]["dataSource"]["name"], name.as_str());
    assert_eq!(restored["metadata"]["ownerReferences"][0]["name"], "vm-1");
    let mut mounted = Vec::new();
    while let Ok((kind, pod, _)) = movers.try_recv() {
        if kind == ChangeType::Added {
            for v in pod["spec"]["volumes"].as_array().into_iter().flatten() {
                if let Some(claim) = v["persistentVolumeClaim"]["claimName"].as_str() {
                    mounted.push(claim.to_string());
                }
            }
        }
    }
    assert!(mounted.contains(&"vm-1-golden".to_string()), "{mounted:?}");
    let denied = c.denied();
    assert!(
        denied.is_empty(),
        "the API server refused the operator: {denied:#?}"
    );
}

/// The probe pod the operator builds for a GoldenImage behind basic authentication, run in
/// the image (a scratch image of the binary this suite built, see container_image.rs) as
/// a container runtime runs it: its command and arguments as given, its user and group;
/// each volumeMount a bind mount filled as kubelet fills it (the projected Secret key
/// owned by root and the pod's `fsGroup`, mode 0440), the termination message a file of
/// the host (bound outside the read-only /dev of buildah's chroot isolation). What it
/// writes there is the version nginx names for the file.
#[test]
fn the_probe_pod_runs_in_the_image_and_reports_the_version() {
    use crate::container_image::{context, require_buildah, Buildah};
    use ferry_operator::golden::report::{parse, Probed};
    use std::os::unix::fs::{chown, PermissionsExt};

    require_buildah();
    let nginx = Nginx::start();
    let bytes: Vec<u8> = (0..(1u32 << 20)).map(|i| i as u8).collect();
    std::fs::write(nginx.root().join("private/fedora.img"), bytes).unwrap();
    let expected = source_version(&[
        "--endpoint-json",
        &json!({"url": nginx.url("private/fedora.img"), "http": {"user": ferry_tests::http_server::USER,
            "password": {"name": "web", "key": "password"}}})
        .to_string(),
        "--secrets-dir",
        secrets_dir(
            &ferry_tests::scratch_dir().path().join("s"),
            &[("web", "password", ferry_tests::http_server::PASSWORD)],
        )
        .to_str()
        .unwrap(),
    ]);

    let tmp = ferry_tests::scratch_dir();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let buildah = Buildah {
        root: tmp.path().join("buildah"),
    };
    let ctx = tmp.path().join("context");
    context(&ctx);
    let image = "localhost/ferry-probe-test:latest";
    buildah.run(&[
        "bud",
        "--isolation",
        "chroot",
        "--layers=false",
        "-t",
        image,
        ctx.to_str().unwrap(),
    ]);
    let container = String::from_utf8(buildah.run(&["from", image]).stdout).unwrap();
    let container = container.trim().to_string();

    let golden: ferry_operator::crd::GoldenImage = serde_json::from_value(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "GoldenImage",
        "metadata": {"name": "fedora", "namespace": NS, "uid": "gi-1"},
        "spec": {
            "source": {"url": nginx.url("private/fedora.img"),
                       "http": {"user": ferry_tests::http_server::USER,
                                "password": {"name": "web", "key": "password"}}},
            "trigger": {"schedule": "@daily"},
            "claim": {"size": "4Mi"},
        },
    }))
    .unwrap();
    let pod = ferry_operator::golden::probe_pod::pod(
        &golden,
        &ferry_tests::mover_pods::defaults(image),
        false,
    )
    .unwrap();
    let spec = pod.spec.clone().unwrap();
    let security = spec.security_context.clone().unwrap();
    let (uid, gid) = (
        security.run_as_user.unwrap() as u32,
        security.run_as_group.unwrap() as u32,
    );
    let fs_group = security.fs_group.map_or(0, |g| g as u32);
    let c = &spec.containers[0];
    let mut mounts = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == m.name)
            .unwrap_or_else(|| panic!("no volume {}", m.name));
        let dir = tmp.path().join("volumes").join(&m.name);
        std::fs::create_dir_all(&dir).unwrap();
        if let Some(projected) = &volume.projected {
            for source in projected.sources.iter().flatten() {
                let secret = source.secret.as_ref().expect("only Secret keys");
                assert_eq!(secret.name, "web");
                for item in secret.items.iter().flatten() {
                    let file = dir.join(&item.path);
                    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
                    std::fs::write(&file, ferry_tests::http_server::PASSWORD).unwrap();
                    chown(&file, Some(0), Some(fs_group)).unwrap();
                    let mode = projected.default_mode.unwrap_or(0o644) as u32;
                    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
                    chown(file.parent().unwrap(), Some(0), Some(fs_group)).unwrap();
                }
            }
        }
        chown(&dir, Some(0), Some(fs_group)).unwrap();
        let mode = if volume.empty_dir.is_some() {
            0o1777
        } else {
            0o755
        };
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        let ro = if m.read_only == Some(true) { ":ro" } else { "" };
        mounts.push(format!("{}:{}{ro}", dir.display(), m.mount_path));
    }
    // kubelet's termination message file, writable by the container. buildah's chroot
    // isolation keeps /dev read-only, binds into it included, so the file is bound at
    // /var/run/termination-log and that one argument names it there.
    let log = tmp.path().join("termination-log");
    std::fs::write(&log, "").unwrap();
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o666)).unwrap();
    mounts.push(format!("{}:/var/run/termination-log", log.display()));
    let mut args = c.args.clone().unwrap();
    let at = args
        .iter()
        .position(|a| a == "--termination-message-path")
        .unwrap();
    assert_eq!(args[at + 1], "/dev/termination-log");
    args[at + 1] = "/var/run/termination-log".into();

    let user = format!("{uid}:{gid}");
    let mut run = buildah.cmd();
    run.args(["run", "--isolation", "chroot", "--user", &user]);
    for m in &mounts {
        run.args(["-v", m]);
    }
    run.arg(&container).arg("--");
    run.args(c.command.clone().unwrap());
    run.args(args);
    let out = run.output().expect("run the probe");
    assert!(out.status.success(), "the probe failed: {out:?}");
    let message = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        parse(&message),
        Probed::Version(Some(expected)),
        "{message}"
    );
    buildah.run(&["rm", &container]);
    buildah.run(&["rmi", image]);
}
