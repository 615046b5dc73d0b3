//! ferry-iscsi against a real tgtd on loopback: login (None, CHAP, mutual CHAP, digests),
//! discovery (also with CHAP and mutual CHAP), READ/WRITE with many commands in flight, WRITE SAME/UNMAP/GET LBA STATUS on
//! a thin LUN, check conditions, logout.

use std::path::{Path, PathBuf};

use ferry_iscsi::scsi::LbaStatus;
use ferry_iscsi::{Chap, Config, Device, Error};
use ferry_tests::iscsi_server::{allocated_bytes, Lun, Tgtd};

const MIB: u64 = 1024 * 1024;
const IQN: &str = "iqn.2024-01.io.ferry:test";

fn backing(dir: &Path, name: &str, size: u64) -> PathBuf {
    let p = dir.join(name);
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(size).unwrap();
    p
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

/// tgtd with target 1 (IQN) exporting `backing` as a thick LUN 1.
fn one_thick_target(backing: PathBuf) -> Tgtd {
    let mut tgt = Tgtd::start();
    tgt.add_target(
        1,
        IQN,
        &[Lun {
            backing,
            thin: false,
        }],
    );
    tgt
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_discovery_and_thin_commands() {
    let dir = ferry_tests::scratch_dir();
    let thick = backing(dir.path(), "thick.img", 16 * MIB);
    let thin = backing(dir.path(), "thin.img", 16 * MIB);
    let mut tgt = Tgtd::start();
    tgt.add_target(
        1,
        IQN,
        &[
            Lun {
                backing: thick.clone(),
                thin: false,
            },
            Lun {
                backing: thin.clone(),
                thin: true,
            },
        ],
    );
    let config = Config::default();

    let found = ferry_iscsi::discover(&tgt.portal(), &config).await.unwrap();
    assert!(found.iter().any(|t| t.name == IQN), "{found:?}");

    let dev = Device::open(&tgt.portal(), IQN, 1, &config).await.unwrap();
    assert_eq!(dev.capacity().bytes(), Some(16 * MIB));
    assert!(!dev.thin());
    dev.session().ping().await.unwrap();

    // Many writes and reads in flight at once, larger than every segment and burst limit.
    let data = pattern(4 * MIB as usize, 3);
    let bs = dev.block_size() as u64;
    let chunk = 512 * 1024;
    let writes = data.chunks(chunk).enumerate().map(|(i, c)| {
        let dev = &dev;
        async move { dev.write((i * chunk) as u64 / bs, c).await }
    });
    for r in futures_util::future::join_all(writes).await {
        r.unwrap();
    }
    dev.sync().await.unwrap();
    let reads = (0..data.len() / chunk).map(|i| {
        let dev = &dev;
        async move { dev.read((i * chunk) as u64 / bs, vec![0u8; chunk]).await }
    });
    let back: Vec<u8> = futures_util::future::join_all(reads)
        .await
        .into_iter()
        .flat_map(|r| r.unwrap())
        .collect();
    assert!(back == data, "read back differs");
    let on_disk = std::fs::read(&thick).unwrap();
    assert!(on_disk[..data.len()] == data[..], "backing file differs");

    // Past the end: a clear check condition (ILLEGAL REQUEST, LBA out of range).
    let last = dev.capacity().blocks;
    let err = dev
        .session()
        .execute(
            1,
            &ferry_iscsi::scsi::read16(last, 1),
            ferry_iscsi::Transfer::Read(Box::new(vec![0u8; 512])),
        )
        .await
        .err()
        .unwrap();
    let text = err.to_string();
    assert!(
        text.contains("ILLEGAL REQUEST") && text.contains("ASC/ASCQ 0x21/0x00"),
        "{text}"
    );
    dev.close().await.unwrap();

    // Thin LUN: provisioning, WRITE SAME with UNMAP, UNMAP, GET LBA STATUS.
    let dev = Device::open(&tgt.portal(), IQN, 2, &config).await.unwrap();
    assert!(dev.thin() && dev.capacity().lbprz, "{:?}", dev.capacity());
    let blocks_per_mib = (MIB / bs) as u32;
    dev.write(0, &pattern(4 * MIB as usize, 9)).await.unwrap();
    dev.sync().await.unwrap();
    let before = allocated_bytes(&thin);
    assert!(before >= 4 * MIB, "{before}");
    dev.write_same_zero(u64::from(blocks_per_mib), blocks_per_mib, true)
        .await
        .unwrap();
    dev.unmap(&[(2 * u64::from(blocks_per_mib), blocks_per_mib)])
        .await
        .unwrap();
    dev.sync().await.unwrap();
    let after = allocated_bytes(&thin);
    assert!(after <= before - 2 * MIB, "{before} -> {after}");
    let zero = dev
        .read(u64::from(blocks_per_mib), vec![1u8; MIB as usize])
        .await
        .unwrap();
    assert!(zero.iter().all(|b| *b == 0));
    let st = dev.lba_status(0).await.unwrap();
    assert_eq!(st[0].status, LbaStatus::Mapped, "{st:?}");
    assert_eq!(st[0].blocks, blocks_per_mib, "{st:?}");
    let st = dev.lba_status(u64::from(blocks_per_mib)).await.unwrap();
    assert_eq!(st[0].status, LbaStatus::Deallocated, "{st:?}");
    assert!(st[0].blocks >= 2 * blocks_per_mib, "{st:?}");
    dev.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chap_mutual_chap_and_digests() {
    let dir = ferry_tests::scratch_dir();
    let img = backing(dir.path(), "chap.img", 8 * MIB);
    let tgt = one_thick_target(img);
    tgt.add_chap(1, "alice", "alice-secret-12", false);
    tgt.set_param(1, "HeaderDigest", "CRC32C,None");
    tgt.set_param(1, "DataDigest", "CRC32C,None");

    let chap = |u: &str, p: &str| {
        Some(Chap {
            user: u.into(),
            secret: p.into(),
        })
    };
    // No credentials, and wrong credentials: clear authentication failures.
    let err = Device::open(&tgt.portal(), IQN, 1, &Config::default())
        .await
        .err()
        .unwrap();
    assert!(matches!(err, Error::AuthFailed(_)), "{err}");
    assert!(
        err.to_string().contains("requires CHAP") && err.to_string().contains("the target"),
        "{err}"
    );
    let bad = Config {
        chap: chap("alice", "wrong-secret-12"),
        ..Config::default()
    };
    let err = Device::open(&tgt.portal(), IQN, 1, &bad)
        .await
        .err()
        .unwrap();
    assert!(matches!(err, Error::AuthFailed(_)), "{err}");
    assert!(
        !format!("{err} {err:?} {bad:?}").contains("wrong-secret"),
        "secret leaked"
    );

    // Right credentials, with CRC32C header and data digests.
    let good = Config {
        chap: chap("alice", "alice-secret-12"),
        header_digest: true,
        data_digest: true,
        ..Config::default()
    };
    let dev = Device::open(&tgt.portal(), IQN, 1, &good).await.unwrap();
    assert!(dev.session().params().header_digest && dev.session().params().data_digest);
    let data = pattern(MIB as usize, 5);
    dev.write(8, &data).await.unwrap();
    assert!(dev.read(8, vec![0u8; data.len()]).await.unwrap() == data);
    dev.close().await.unwrap();

    // Mutual CHAP: the target proves its own secret.
    tgt.add_chap(1, "target-user", "target-secret-1", true);
    let mutual = Config {
        mutual_chap: chap("target-user", "target-secret-1"),
        ..good.clone()
    };
    let dev = Device::open(&tgt.portal(), IQN, 1, &mutual).await.unwrap();
    assert!(dev.read(8, vec![0u8; data.len()]).await.unwrap() == data);
    dev.close().await.unwrap();
    let wrong = Config {
        mutual_chap: chap("target-user", "not-the-secret"),
        ..good
    };
    let err = Device::open(&tgt.portal(), IQN, 1, &wrong)
        .await
        .err()
        .unwrap();
    assert!(matches!(err, Error::AuthFailed(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_target_and_disconnect_are_clear_errors() {
    let dir = ferry_tests::scratch_dir();
    let img = backing(dir.path(), "d.img", 8 * MIB);
    let mut tgt = one_thick_target(img);
    let err = Device::open(
        &tgt.portal(),
        "iqn.2024-01.io.ferry:nope",
        1,
        &Config::default(),
    )
    .await
    .err()
    .unwrap();
    assert!(matches!(err, Error::TargetNotFound(_)), "{err}");

    let dev = Device::open(&tgt.portal(), IQN, 1, &Config::default())
        .await
        .unwrap();
    tgt.stop();
    let err = dev.read(0, vec![0u8; 4096]).await.err().unwrap();
    assert!(
        matches!(
            err,
            Error::Disconnected(_) | Error::Closed | Error::Io { .. }
        ),
        "{err}"
    );
}

/// Small segments and bursts on both sides, with every combination of immediate and
/// unsolicited data: writes cross many Data-Out PDUs and R2Ts, reads many Data-In PDUs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negotiated_limits_are_honoured() {
    let dir = ferry_tests::scratch_dir();
    let img = backing(dir.path(), "neg.img", 8 * MIB);
    let mut tgt = Tgtd::start();
    tgt.add_target(
        1,
        IQN,
        &[Lun {
            backing: img.clone(),
            thin: false,
        }],
    );
    tgt.set_param(1, "MaxRecvDataSegmentLength", "4096");
    tgt.set_param(1, "MaxBurstLength", "16384");
    tgt.set_param(1, "FirstBurstLength", "8192");
    let cases = [
        // (target InitialR2T, target ImmediateData, ours immediate, ours initial R2T)
        ("No", "Yes", true, false),
        ("No", "No", true, false),
        ("Yes", "Yes", true, false),
        ("Yes", "No", false, true),
    ];
    for (i, (initial_r2t, immediate, our_immediate, our_r2t)) in cases.into_iter().enumerate() {
        tgt.set_param(1, "InitialR2T", initial_r2t);
        tgt.set_param(1, "ImmediateData", immediate);
        let config = Config {
            max_recv_data_segment_length: 4096,
            immediate_data: our_immediate,
            initial_r2t: our_r2t,
            ..Config::default()
        };
        let dev = Device::open(&tgt.portal(), IQN, 1, &config).await.unwrap();
        let p = dev.session().params();
        assert_eq!(p.max_xmit_data_segment_length, 4096, "{p:?}");
        assert_eq!(p.max_burst_length, 16384, "{p:?}");
        assert_eq!(p.first_burst_length, 8192, "{p:?}");
        assert_eq!(p.initial_r2t, initial_r2t == "Yes" || our_r2t, "{p:?}");
        assert_eq!(
            p.immediate_data,
            immediate == "Yes" && our_immediate,
            "{p:?}"
        );
        let data = pattern(MIB as usize + 3 * 512, i as u8);
        let lba = 8 * i as u64 + 1;
        let (a, b) = data.split_at(512 * 1000);
        let (w1, w2) =
            futures_util::future::join(dev.write(lba, a), dev.write(lba + 1000, b)).await;
        w1.unwrap();
        w2.unwrap();
        let back = dev.read(lba, vec![0u8; data.len()]).await.unwrap();
        assert!(back == data, "case {i}: read back differs");
        let on_disk = std::fs::read(&img).unwrap();
        let at = (lba * 512) as usize;
        assert!(
            on_disk[at..at + data.len()] == data[..],
            "case {i}: backing file differs"
        );
        dev.close().await.unwrap();
    }
}

/// tgtd pings an idle session with NOP-In and drops it when unanswered: answered pings
/// keep it alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_pings_are_answered() {
    let dir = ferry_tests::scratch_dir();
    let img = backing(dir.path(), "nop.img", 4 * MIB);
    let tgt = one_thick_target(img);
    tgt.set_param(1, "nop_interval", "1");
    tgt.set_param(1, "nop_count", "2");
    let dev = Device::open(&tgt.portal(), IQN, 1, &Config::default())
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(4500)).await;
    let data = pattern(64 * 1024, 1);
    dev.write(0, &data).await.unwrap();
    assert!(dev.read(0, vec![0u8; data.len()]).await.unwrap() == data);
    dev.close().await.unwrap();
}

/// Check conditions name the sense key and additional sense code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_conditions_are_named() {
    let dir = ferry_tests::scratch_dir();
    let img = backing(dir.path(), "ro.img", 4 * MIB);
    let tgt = one_thick_target(img);
    tgt.tgtadm(&[
        "--mode",
        "logicalunit",
        "--op",
        "update",
        "--tid",
        "1",
        "--lun",
        "1",
        "--params",
        "readonly=1",
    ]);
    let dev = Device::open(&tgt.portal(), IQN, 1, &Config::default())
        .await
        .unwrap();
    let err = dev.write(0, &pattern(4096, 2)).await.err().unwrap();
    let sense = err.sense().cloned().unwrap_or_else(|| panic!("{err}"));
    assert_eq!(sense.key, 0x7, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("DATA PROTECT") && text.contains("write protected"),
        "{text}"
    );
    // An operation code tgt does not know.
    let mut cdb = [0u8; 16];
    cdb[0] = 0xc5;
    let err = dev
        .session()
        .execute(1, &cdb, ferry_iscsi::Transfer::None)
        .await
        .err()
        .unwrap();
    let text = err.to_string();
    assert!(
        text.contains("ILLEGAL REQUEST") && text.contains("invalid command operation code"),
        "{text}"
    );
    // The session survives check conditions.
    assert_eq!(dev.read(0, vec![1u8; 4096]).await.unwrap(), vec![0u8; 4096]);
    dev.close().await.unwrap();
}

/// A target that stops answering (tgtd stopped with SIGSTOP): the command times out
/// after the request timeout (plus the bounded ABORT TASK attempt), and the session works
/// again once the target answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_target_times_out() {
    let dir = ferry_tests::scratch_dir();
    let img = backing(dir.path(), "hang.img", 4 * MIB);
    let tgt = one_thick_target(img);
    let config = Config {
        request_timeout: Some(std::time::Duration::from_secs(1)),
        ..Config::default()
    };
    let dev = Device::open(&tgt.portal(), IQN, 1, &config).await.unwrap();
    let pid = tgt.pid().expect("tgtd runs");
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let started = std::time::Instant::now();
    let result = dev.read(0, vec![0u8; 64 * 1024]).await;
    let waited = started.elapsed();
    signal("-CONT");
    let err = result.expect_err("a stopped target cannot answer");
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(
        waited < std::time::Duration::from_secs(5),
        "timed out only after {waited:?}"
    );
    // Once tgtd runs again, the session answers again.
    let data = pattern(64 * 1024, 4);
    dev.write(0, &data).await.unwrap();
    assert!(dev.read(0, vec![0u8; data.len()]).await.unwrap() == data);
    dev.close().await.unwrap();
}

/// SendTargets discovery on a portal that requires CHAP for discovery (tgtd's discovery
/// accounts, apart from any target's): the right secret lists the target, a wrong one and
/// none at all are clear authentication failures, mutual CHAP checks the portal's own
/// secret, and no secret ever shows in an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_with_chap_and_mutual_chap() {
    const SECRET: &str = "disc-secret-123";
    const WRONG: &str = "wrong-secret-99";
    const PORTAL_SECRET: &str = "portal-secret-77";
    let dir = ferry_tests::scratch_dir();
    let img = backing(dir.path(), "disc.img", 4 * MIB);
    let tgt = one_thick_target(img);
    let chap = |u: &str, p: &str| {
        Some(Chap {
            user: u.into(),
            secret: p.into(),
        })
    };
    let with = |user: &str, secret: &str| Config {
        chap: chap(user, secret),
        ..Config::default()
    };
    let lists_the_target = |found: Vec<ferry_iscsi::DiscoveredTarget>| {
        let t = found
            .iter()
            .find(|t| t.name == IQN)
            .unwrap_or_else(|| panic!("{IQN} not listed: {found:?}"));
        assert!(
            t.addresses
                .iter()
                .any(|a| a.starts_with(&format!("127.0.0.1:{},", tgt.port()))),
            "{t:?}"
        );
    };
    let no_secret_in = |err: &Error| {
        let text = format!("{err} {err:?}");
        for s in [SECRET, WRONG, PORTAL_SECRET] {
            assert!(!text.contains(s), "a secret leaked: {text}");
        }
    };

    // No discovery account yet: no credentials are needed, and offered ones do no harm.
    lists_the_target(
        ferry_iscsi::discover(&tgt.portal(), &Config::default())
            .await
            .unwrap(),
    );
    lists_the_target(
        ferry_iscsi::discover(&tgt.portal(), &with("dave", SECRET))
            .await
            .unwrap(),
    );

    tgt.add_discovery_chap("dave", SECRET, false);
    lists_the_target(
        ferry_iscsi::discover(&tgt.portal(), &with("dave", SECRET))
            .await
            .unwrap(),
    );

    let err = ferry_iscsi::discover(&tgt.portal(), &Config::default())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AuthFailed(_)), "{err}");
    assert!(err.to_string().contains("requires CHAP"), "{err}");
    assert!(err.to_string().contains("discovery"), "{err}");

    for (user, secret) in [("dave", WRONG), ("eve", SECRET)] {
        let err = ferry_iscsi::discover(&tgt.portal(), &with(user, secret))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::AuthFailed(_)), "{err}");
        assert!(
            err.to_string().contains("refused the CHAP credentials"),
            "{err}"
        );
        assert!(err.to_string().contains(user), "names the user: {err}");
        no_secret_in(&err);
    }

    // Discovery accounts do not guard the targets: a normal login needs none.
    let dev = Device::open(&tgt.portal(), IQN, 1, &Config::default())
        .await
        .unwrap();
    dev.close().await.unwrap();

    // Mutual CHAP: the portal proves its own discovery secret.
    tgt.add_discovery_chap("portal", PORTAL_SECRET, true);
    let mutual = |secret: &str| Config {
        mutual_chap: chap("portal", secret),
        ..with("dave", SECRET)
    };
    lists_the_target(
        ferry_iscsi::discover(&tgt.portal(), &mutual(PORTAL_SECRET))
            .await
            .unwrap(),
    );
    let err = ferry_iscsi::discover(&tgt.portal(), &mutual(WRONG))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AuthFailed(_)), "{err}");
    assert!(err.to_string().contains("mutual CHAP"), "{err}");
    no_secret_in(&err);
    // Mutual CHAP without our own credentials is refused before anything is sent.
    let err = ferry_iscsi::discover(
        &tgt.portal(),
        &Config {
            mutual_chap: chap("portal", PORTAL_SECRET),
            ..Config::default()
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::InvalidRequest(_)), "{err}");
    no_secret_in(&err);
}
