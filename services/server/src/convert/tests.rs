//! Tests of validation, typed options and the wire form of records.

use ferry_core::ErrorKind;
use ferry_endpoints::s3::S3Options;

use super::validation::MAX_TARGETS;
use super::*;
use crate::model::job::{DigestRecord, JobRecord, JobState, ResultRecord};
use crate::secrets::SecretResolver;
use crate::security::AllowRoots;
use ferry_api::proto;

fn validator(root: &std::path::Path) -> Validator {
    Validator {
        roots: AllowRoots::new(&[root.to_path_buf()]).unwrap(),
        secrets: SecretResolver::new(None),
    }
}

fn endpoint(url: &str) -> Option<proto::Endpoint> {
    Some(proto::Endpoint {
        url: url.into(),
        options: None,
        ..Default::default()
    })
}

#[test]
fn transfer_validation() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("a.img");
    std::fs::write(&src, b"x").unwrap();
    let v = validator(dir.path());
    let mut req = proto::StartTransferRequest {
        source: endpoint(src.to_str().unwrap()),
        target: endpoint(&format!("file://{}/b.img", dir.path().display())),
        ..Default::default()
    };
    req.labels.insert("team".into(), "a".into());
    let ok = v.transfer(&req).unwrap();
    assert_eq!(ok.plan.hosts, Vec::<String>::new());
    assert!(ok.plan.target_key.as_deref().unwrap().ends_with("/b.img"));
    assert_eq!(ok.fingerprint, v.transfer(&req).unwrap().fingerprint);

    let mut same = req.clone();
    same.target = same.source.clone();
    assert_eq!(
        v.transfer(&same).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );

    let mut outside = req.clone();
    outside.target = endpoint("/etc/ferry-nope.img");
    assert_eq!(
        v.transfer(&outside).unwrap_err().kind(),
        ErrorKind::PermissionDenied
    );

    let mut inline = req.clone();
    inline.source = endpoint("iscsi://u%pw@127.0.0.1/iqn.x:y/1");
    let err = v.transfer(&inline).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(!err.to_string().contains("pw@"), "{err}");

    let mut bad_opts = req.clone();
    bad_opts.options = Some(proto::TransferOptions {
        workers: 100_000,
        ..Default::default()
    });
    assert_eq!(
        v.transfer(&bad_opts).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );

    let mut bad_enum = req.clone();
    bad_enum.options = Some(proto::TransferOptions {
        order: 42,
        ..Default::default()
    });
    assert!(v.transfer(&bad_enum).is_err());

    let mut mismatched = req.clone();
    mismatched.source = Some(proto::Endpoint {
        url: src.to_str().unwrap().into(),
        options: Some(proto::endpoint::Options::S3(Default::default())),
        ..Default::default()
    });
    assert!(v.transfer(&mismatched).is_err());

    let mut missing = req.clone();
    missing.source = None;
    assert!(v
        .transfer(&missing)
        .unwrap_err()
        .to_string()
        .contains("source"));
}

fn secret_env(name: &str) -> Option<proto::SecretRef> {
    Some(proto::SecretRef {
        source: Some(proto::secret_ref::Source::Env(name.into())),
    })
}

fn secret_file(name: &str) -> Option<proto::SecretRef> {
    Some(proto::SecretRef {
        source: Some(proto::secret_ref::Source::File(name.into())),
    })
}

/// Per-job S3 settings pass validation only in a sound form with references that
/// resolve; the job then gets them with the credentials read from the references, and
/// no error or formatted option shows a secret.
#[test]
fn s3_options_are_checked_then_resolved_for_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let secrets = dir.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    std::fs::write(secrets.join("s3-secret"), "file-s3cret-value\n").unwrap();
    std::env::set_var("FERRY_TEST_CONVERT_KEY_ID", "env-key-id-value");
    let v = Validator {
        roots: AllowRoots::new(&[dir.path().to_path_buf()]).unwrap(),
        secrets: SecretResolver::new(Some(secrets.clone())),
    };
    let s3 = proto::S3Options {
        endpoint_url: "http://127.0.0.1:9000".into(),
        region: "eu-west-3".into(),
        access_key_id: secret_env("FERRY_TEST_CONVERT_KEY_ID"),
        secret_access_key: secret_file("s3-secret"),
        session_token: None,
        force_path_style: true,
    };
    let req = |s3: proto::S3Options| proto::StartChecksumRequest {
        source: Some(proto::Endpoint {
            url: "s3://bucket/disk.img".into(),
            options: Some(proto::endpoint::Options::S3(s3)),
            ..Default::default()
        }),
        ..Default::default()
    };
    let ok = v.checksum(&req(s3.clone())).unwrap();
    assert_eq!(ok.plan.hosts, ["s3:bucket@http://127.0.0.1:9000"]);
    // The same object on another store is another image; on the same store it is not.
    let copy = |target_store: &str| proto::StartTransferRequest {
        source: req(s3.clone()).source,
        target: req(proto::S3Options {
            endpoint_url: target_store.into(),
            ..s3.clone()
        })
        .source,
        ..Default::default()
    };
    let between = v.transfer(&copy("https://other-store.example")).unwrap();
    assert_eq!(
        between.plan.target_key.as_deref(),
        Some("s3://bucket/disk.img at https://other-store.example")
    );
    let err = v.transfer(&copy("http://127.0.0.1:9000")).unwrap_err();
    assert!(err.to_string().contains("same image"), "{err}");
    let request = req(s3.clone());
    let (spec, settings) = open_spec(
        &ok.plan.source,
        request.source.as_ref(),
        &v.secrets,
        "source",
    )
    .unwrap();
    let options = settings.s3;
    assert_eq!(spec.to_string(), "s3://bucket/disk.img");
    assert_eq!(
        options.endpoint_url.as_deref(),
        Some("http://127.0.0.1:9000")
    );
    assert_eq!(options.region.as_deref(), Some("eu-west-3"));
    assert_eq!(options.force_path_style, Some(true));
    assert_eq!(
        options.access_key_id.as_ref().unwrap().expose(),
        "env-key-id-value"
    );
    assert_eq!(
        options.secret_access_key.as_ref().unwrap().expose(),
        "file-s3cret-value"
    );
    assert!(options.session_token.is_none());
    let shown = format!("{options:?} {ok:?}");
    assert!(
        !shown.contains("env-key-id-value") && !shown.contains("file-s3cret"),
        "{shown}"
    );

    // No settings: the SDK's standard chain alone.
    let bare = proto::S3Options::default();
    let (_, options) = open_spec(
        &ok.plan.source,
        req(bare).source.as_ref(),
        &v.secrets,
        "source",
    )
    .unwrap();
    assert_eq!(options.s3, S3Options::new());

    let bad = [
        (
            proto::S3Options {
                secret_access_key: secret_env("FERRY_TEST_CONVERT_UNSET"),
                ..s3.clone()
            },
            "source.s3.secret_access_key: environment variable FERRY_TEST_CONVERT_UNSET",
        ),
        (
            proto::S3Options {
                access_key_id: secret_file("missing"),
                ..s3.clone()
            },
            "source.s3.access_key_id: secret file 'missing'",
        ),
        (
            proto::S3Options {
                secret_access_key: None,
                ..s3.clone()
            },
            "go together",
        ),
        (
            proto::S3Options {
                access_key_id: None,
                secret_access_key: None,
                session_token: secret_env("FERRY_TEST_CONVERT_KEY_ID"),
                ..s3.clone()
            },
            "session_token needs",
        ),
        (
            proto::S3Options {
                endpoint_url: "ftp://store".into(),
                ..s3.clone()
            },
            "endpoint_url is not an http",
        ),
        (
            proto::S3Options {
                endpoint_url: "http://user:pw@store".into(),
                ..s3.clone()
            },
            "carries a password",
        ),
        (
            proto::S3Options {
                region: "us east".into(),
                ..s3.clone()
            },
            "source.s3.region",
        ),
    ];
    for (o, expected) in bad {
        let err = v.checksum(&req(o)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        let text = err.to_string();
        assert!(text.contains(expected), "{text}");
        for value in ["env-key-id-value", "file-s3cret-value", "pw@"] {
            assert!(!text.contains(value), "{text}");
        }
    }
}

#[test]
fn record_round_trip_to_proto() {
    let dir = tempfile::tempdir().unwrap();
    let v = validator(dir.path());
    let req = proto::StartChecksumRequest {
        source: endpoint(dir.path().join("x.img").to_str().unwrap()),
        ..Default::default()
    };
    let acc = v.checksum(&req).unwrap();
    let rec = JobRecord {
        id: "j".into(),
        seq: 1,
        kind: acc.kind,
        state: JobState::Succeeded,
        idempotency_key: String::new(),
        fingerprint: acc.fingerprint,
        labels: Default::default(),
        priority: 0,
        created_ms: 1500,
        started_ms: Some(2000),
        ended_ms: Some(4000),
        request: acc.request,
        plan: acc.plan,
        attempt: 1,
        progress: Default::default(),
        result: Some(ResultRecord::Checksum {
            digest: DigestRecord {
                algorithm: "sha256".into(),
                hex: "ab".into(),
            },
            size: 100,
            seconds: 2.0,
        }),
        error: None,
        message: String::new(),
        checkpoint: None,
        targets: Vec::new(),
        source_version: None,
    };
    let job = job_to_proto(&rec);
    assert_eq!(job.state, proto::JobState::Succeeded as i32);
    assert_eq!(job.create_time.unwrap().nanos, 500_000_000);
    let Some(proto::job::Request::Checksum(echo)) = job.request else {
        panic!("no request echo")
    };
    assert_eq!(echo, req);
    let Some(proto::job::Result::ChecksumResult(r)) = job.result else {
        panic!()
    };
    assert_eq!(r.throughput_bytes_per_second, 50.0);
    assert_eq!(
        r.digest.unwrap().algorithm,
        proto::HashAlgorithm::Sha256 as i32
    );
}

/// An NBD Unix socket is a path on the server's host: like a file, it must be under an
/// allowed root (a symlink out of one does not count), else PERMISSION_DENIED.
#[test]
fn nbd_unix_sockets_are_confined_to_the_allowed_roots() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let v = validator(dir.path());
    let target = endpoint(&format!("file://{}/b.img", dir.path().display()));
    let request = |socket: &std::path::Path| proto::StartTransferRequest {
        source: endpoint(&format!("nbd+unix:///disk?socket={}", socket.display())),
        target: target.clone(),
        ..Default::default()
    };
    let inside = dir.path().join("nbd.sock");
    let ok = v.transfer(&request(&inside)).unwrap();
    assert_eq!(ok.plan.source_kind, "nbd");
    std::os::unix::fs::symlink(outside.path(), dir.path().join("out")).unwrap();
    for bad in [
        std::path::PathBuf::from("/run/some.sock"),
        outside.path().join("nbd.sock"),
        dir.path().join("out/nbd.sock"),
        dir.path().join("sub/../nbd.sock"),
    ] {
        let err = v.transfer(&request(&bad)).unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::PermissionDenied,
            "{}: {err}",
            bad.display()
        );
        assert!(err.to_string().contains("source: NBD socket"), "{err}");
    }
    let checksum = proto::StartChecksumRequest {
        source: endpoint("nbd+unix:///?socket=/run/some.sock"),
        ..Default::default()
    };
    assert_eq!(
        v.checksum(&checksum).unwrap_err().kind(),
        ErrorKind::PermissionDenied
    );
    // No roots at all: no sockets either.
    let none = Validator {
        roots: AllowRoots::default(),
        secrets: SecretResolver::new(None),
    };
    assert_eq!(
        none.transfer(&request(&inside)).unwrap_err().kind(),
        ErrorKind::PermissionDenied
    );
}

/// The typed options of an accepted request are what a stored record decodes to again
/// (a restarted server takes over the job with them).
#[test]
fn typed_options_survive_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("a.img");
    std::fs::write(&src, b"x").unwrap();
    let v = validator(dir.path());
    let req = proto::StartTransferRequest {
        source: endpoint(src.to_str().unwrap()),
        target: endpoint(dir.path().join("b.img").to_str().unwrap()),
        options: Some(proto::TransferOptions {
            workers: 3,
            order: proto::CommitOrder::InOrder as i32,
            preallocation: proto::Preallocation::Full as i32,
            cache: proto::CacheMode::None as i32,
            verify: true,
            verify_algorithm: proto::HashAlgorithm::Sha256 as i32,
            ..Default::default()
        }),
        ..Default::default()
    };
    let acc = v.transfer(&req).unwrap();
    let JobSpec::Transfer(t) = acc.spec.as_ref() else {
        panic!("not a transfer: {:?}", acc.spec)
    };
    assert_eq!(t.copy.workers, 3);
    assert_eq!(t.copy.order, ferry_engine::CommitOrder::InOrder);
    assert_eq!(t.copy.zero_mode, ferry_core::ZeroMode::Allocate);
    assert_eq!(t.cache, ferry_endpoints::CacheMode::Direct);
    assert_eq!(t.preallocation, ferry_endpoints::Preallocation::Full);
    let verify = t.verify.as_ref().unwrap();
    assert_eq!(verify.algorithm, ferry_engine::HashAlgorithm::Sha256);
    assert_eq!(verify.workers, 3);
    let record = JobRecord {
        id: "j".into(),
        seq: 1,
        kind: acc.kind,
        state: JobState::Queued,
        idempotency_key: String::new(),
        fingerprint: acc.fingerprint.clone(),
        labels: Default::default(),
        priority: 0,
        created_ms: 0,
        started_ms: None,
        ended_ms: None,
        request: acc.request.clone(),
        plan: acc.plan.clone(),
        attempt: 0,
        progress: Default::default(),
        result: None,
        error: None,
        message: String::new(),
        checkpoint: None,
        targets: Vec::new(),
        source_version: None,
    };
    let stored = serde_json::to_string(&record).unwrap();
    let loaded: JobRecord = serde_json::from_str(&stored).unwrap();
    let JobSpec::Transfer(again) = JobSpec::from_record(&loaded).unwrap() else {
        panic!("not a transfer")
    };
    assert_eq!(format!("{again:?}"), format!("{t:?}"));
    let broken = JobRecord {
        request: vec![0xff, 0xff, 0xff],
        ..loaded
    };
    assert_eq!(
        JobSpec::from_record(&broken).unwrap_err().kind(),
        ErrorKind::Internal
    );
}

/// A fan-out's targets are checked one by one: none twice, none the source, options
/// that belong to each one's URL; each is planned for the one-writer rule and the
/// per-host limit, and the job runs with all of them.
#[test]
fn fan_out_validation() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("a.img");
    std::fs::write(&src, b"x").unwrap();
    let v = validator(dir.path());
    let path = |name: &str| dir.path().join(name).display().to_string();
    let mut req = proto::StartTransferRequest {
        source: endpoint(src.to_str().unwrap()),
        target: endpoint(&path("b.img")),
        more_targets: vec![
            endpoint(&path("c.img")).unwrap(),
            endpoint("nbd://127.0.0.1:10809/disk").unwrap(),
        ],
        ..Default::default()
    };
    let ok = v.transfer(&req).unwrap();
    let keys = ok.plan.target_keys();
    assert_eq!(keys.len(), 3);
    assert!(keys[1].ends_with("/c.img"), "{keys:?}");
    assert_eq!(ok.plan.hosts, vec!["127.0.0.1:10809".to_string()]);
    assert!(ok.plan.writes(&keys[2]));
    let JobSpec::Transfer(spec) = ok.spec.as_ref() else {
        panic!("not a transfer")
    };
    let names: Vec<String> = spec.targets().map(|t| t.name()).collect();
    assert_eq!(names[2], "nbd://127.0.0.1:10809/disk");

    let mut twice = req.clone();
    twice.more_targets[1] = endpoint(&format!("file://{}", path("b.img"))).unwrap();
    let err = v.transfer(&twice).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(
        err.message()
            .contains("more_targets[1] and target are the same image"),
        "{err}"
    );

    let mut source = req.clone();
    source.more_targets[0] = req.source.clone().unwrap();
    let err = v.transfer(&source).unwrap_err();
    assert!(
        err.message().contains("more_targets[0] is the source"),
        "{err}"
    );

    let mut options = req.clone();
    options.more_targets[0].options = Some(proto::endpoint::Options::Iscsi(proto::IscsiOptions {
        user: "u".into(),
        password: None,
    }));
    let err = v.transfer(&options).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.message().contains("more_targets[0]"), "{err}");

    let mut outside = req.clone();
    outside.more_targets[0] = endpoint("/etc/ferry-nope.img").unwrap();
    assert_eq!(
        v.transfer(&outside).unwrap_err().kind(),
        ErrorKind::PermissionDenied
    );

    req.more_targets = (0..MAX_TARGETS)
        .map(|i| endpoint(&path(&format!("t{i}.img"))).unwrap())
        .collect();
    let err = v.transfer(&req).unwrap_err();
    assert!(err.message().contains("at most 64"), "{err}");
}

/// Clients name kinds and states by ferry-api's names; the records name themselves the same
/// way (in the store, the metric labels and the JSON).
#[test]
fn records_and_clients_name_kinds_and_states_alike() {
    use ferry_api::names::{job_kind_name, job_state_name};
    let mut kinds = 0;
    for v in 0..32 {
        if let Ok(Some(kind)) = kind_from_proto(v) {
            assert_eq!(job_kind_name(v), kind.as_str());
            kinds += 1;
        }
    }
    assert_eq!(kinds, 8, "every JobKind has a record kind");
    for state in JobState::ALL {
        assert_eq!(job_state_name(output::state(state) as i32), state.as_str());
    }
}
