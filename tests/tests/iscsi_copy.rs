//! The iSCSI endpoint with the real engine, against a tgtd started here (the conformance
//! suite runs in conformance.rs): copies file->iscsi, iscsi->file,
//! iscsi->nbd and nbd->iscsi committed in order and out of order with unaligned image
//! sizes, reads and writes ending inside a block, a sparse source keeping a thin LUN thin,
//! tgtd killed mid-copy, and `ferry copy --verify` with an iscsi:// URL whose CHAP secret
//! comes from the environment.
//!
//! Every copy is checked with `qemu-img compare` against the file behind the LUN and with
//! the block hash, and thin LUNs for sparseness by their backing file's allocated blocks.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferry_core::{ErrorKind, Result};
use ferry_engine::{copy, CancellationToken, CommitOrder, CopyOptions, CopyReport, Progress};
use ferry_tests::check::{allocated_bytes, assert_allocated_about, blkhash_file, qemu_img_compare};
use ferry_tests::copying::{blkhash_of, copy_urls, source, target};
use ferry_tests::images::{self, Image, Pattern};
use ferry_tests::iscsi_server::{Lun, Tgtd};
use ferry_tests::nbd_servers::{NbdServer, QemuNbd};
use ferry_tests::{ferry, scratch_dir};

async fn run_copy(src: &str, dst: &str, order: CommitOrder) -> Result<CopyReport> {
    copy_urls(src, dst, &options(order)).await
}

const MIB: u64 = 1 << 20;
/// File images: 12 data runs of 1 MiB in 24 MiB and a tail that is no multiple of 512.
const SIZE: u64 = 24 * MIB + 12_345;
/// LUNs hold whole 512-byte blocks: SIZE rounded up.
const LUN_SIZE: u64 = SIZE.div_ceil(512) * 512;
/// A source LUN: whole blocks, but no multiple of the 4 KiB zero-detection block.
const SRC_LUN_SIZE: u64 = 24 * MIB + 4608;
const IQN: &str = "iqn.2024-01.io.ferry:copy";
const ORDERS: [CommitOrder; 2] = [CommitOrder::InOrder, CommitOrder::OutOfOrder];

fn url(tgt: &Tgtd, iqn: &str, lun: u32) -> String {
    format!("iscsi://127.0.0.1:{}/{iqn}/{lun}", tgt.port())
}

/// A sparse file of `size` bytes to back a LUN.
fn empty(path: &Path, size: u64) -> PathBuf {
    std::fs::File::create(path).unwrap().set_len(size).unwrap();
    path.to_path_buf()
}

fn thin(backing: &Path) -> Lun {
    Lun {
        backing: backing.to_path_buf(),
        thin: true,
    }
}

fn thick(backing: &Path) -> Lun {
    Lun {
        backing: backing.to_path_buf(),
        thin: false,
    }
}

fn options(order: CommitOrder) -> CopyOptions {
    CopyOptions {
        order,
        ..CopyOptions::default()
    }
}

fn half_data(path: &Path, size: u64, seed: u64) -> Image {
    images::make(path, Pattern::HalfData, size, seed).unwrap()
}

/// Reads, writes and zero writes that end inside a block (the image end of a copy whose
/// source is not whole blocks, and `--verify` reading the LUN back through the source's
/// size): reads return the part of the block inside the request, writes keep the rest of
/// the block; a request starting inside a block is a clear error.
#[tokio::test]
async fn requests_ending_inside_a_block() {
    let dir = scratch_dir();
    let lun = images::make(
        &dir.path().join("lun.img"),
        Pattern::Random,
        SRC_LUN_SIZE,
        8,
    )
    .unwrap();
    let mut tgt = Tgtd::start();
    tgt.add_target(1, IQN, &[thick(&lun.path)]);
    let u = url(&tgt, IQN, 1);
    let s = source(&u).await.unwrap();
    assert_eq!(s.size(), SRC_LUN_SIZE);
    let last = SRC_LUN_SIZE - 512;
    // (offset, length, where the view starts in the buffer)
    let reads = [
        (0, 100, 0),
        (1536, 2 * 512 + 1, 0),
        (4096, 3 * MIB + 4095, 512),
        (last, 511, 7),
        (last - 4096, 4096 + 1, 0),
    ];
    let file = std::fs::read(&lun.path).unwrap();
    for (offset, len, start) in reads {
        let mut buf = ferry_core::IoBuf::new(start + len as usize);
        buf.set_view(start, len as usize);
        buf.fill(0xee);
        let buf = s.read_at(offset, buf).await.unwrap();
        assert_eq!(buf.len(), len as usize);
        let want = &file[offset as usize..(offset + len) as usize];
        assert!(&buf[..] == want, "read of {len} at {offset} differs");
    }
    let mut buf = ferry_core::IoBuf::new(512);
    buf.set_len(100);
    let err = s.read_at(100, buf).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("do not start on"), "{err}");
    s.close().await.unwrap();

    let t = target(&u, SRC_LUN_SIZE).await.unwrap();
    let mut expect = file;
    let data: Vec<u8> = (0..MIB as usize + 700)
        .map(|i| (i % 251) as u8 | 1)
        .collect();
    let mut buf = ferry_core::IoBuf::new(data.len());
    buf.copy_from_slice(&data);
    t.write_at(8192, buf).await.unwrap();
    expect[8192..8192 + data.len()].copy_from_slice(&data);
    let zero_at = 4 * MIB;
    t.write_zeroes(zero_at, 3 * 512 + 33, ferry_core::ZeroMode::MayDeallocate)
        .await
        .unwrap();
    expect[zero_at as usize..zero_at as usize + 3 * 512 + 33].fill(0);
    let mut buf = ferry_core::IoBuf::new(300);
    buf.fill(0x5a);
    t.write_at(last, buf).await.unwrap();
    expect[last as usize..last as usize + 300].fill(0x5a);
    t.flush().await.unwrap();
    let after = std::fs::read(&lun.path).unwrap();
    assert!(after == expect, "the LUN differs from the expected image");
}

/// file -> thin LUN in both orders: exact, and the LUN stays thin (the source's holes and
/// zero blocks are deallocated on the LUN, never written).
#[tokio::test]
async fn file_to_thin_lun_is_exact_and_stays_thin() {
    let dir = scratch_dir();
    let image = half_data(&dir.path().join("src.raw"), SIZE, 1);
    let luns: Vec<PathBuf> = (0..2)
        .map(|i| empty(&dir.path().join(format!("lun{i}.img")), LUN_SIZE))
        .collect();
    let mut tgt = Tgtd::start();
    tgt.add_target(1, IQN, &[thin(&luns[0]), thin(&luns[1])]);
    for (i, order) in ORDERS.into_iter().enumerate() {
        let u = url(&tgt, IQN, i as u32 + 1);
        let report = run_copy(image.path.to_str().unwrap(), &u, order)
            .await
            .unwrap();
        assert_eq!(report.size, SIZE, "{order:?}");
        qemu_img_compare(&image.path, &luns[i]);
        assert_allocated_about(&luns[i], image.nonzero_block_bytes);
        assert_eq!(blkhash_of(&u).await, blkhash_file(&luns[i]), "{order:?}");
    }
}

/// Thin and thick LUNs -> file in both orders: exact and sparse (extents from GET LBA
/// STATUS on the thin LUN, zero detection on both).
#[tokio::test]
async fn lun_to_file_is_exact_and_sparse() {
    let dir = scratch_dir();
    let a = half_data(&dir.path().join("thin.img"), SRC_LUN_SIZE, 2);
    let b = half_data(&dir.path().join("thick.img"), SRC_LUN_SIZE, 2);
    let mut tgt = Tgtd::start();
    tgt.add_target(1, IQN, &[thin(&a.path), thick(&b.path)]);
    for lun in [1, 2] {
        let u = url(&tgt, IQN, lun);
        assert_eq!(blkhash_of(&u).await, blkhash_file(&a.path), "LUN {lun}");
        for order in ORDERS {
            let out = dir.path().join(format!("out-{lun}-{order:?}.raw"));
            let report = run_copy(&u, out.to_str().unwrap(), order).await.unwrap();
            assert_eq!(report.size, SRC_LUN_SIZE);
            assert!(
                report.zero_bytes >= SRC_LUN_SIZE / 3,
                "LUN {lun} {order:?}: zeroes were found: {report:?}"
            );
            qemu_img_compare(&a.path, &out);
            assert_allocated_about(&out, a.nonzero_block_bytes);
            assert_eq!(blkhash_file(&out), blkhash_file(&a.path));
        }
    }
}

/// thin LUN -> qemu-nbd over a file full of garbage (zeroes must be written), both orders.
#[tokio::test]
async fn lun_to_nbd_both_orders() {
    let dir = scratch_dir();
    let image = half_data(&dir.path().join("src.img"), SRC_LUN_SIZE, 3);
    let mut tgt = Tgtd::start();
    tgt.add_target(1, IQN, &[thin(&image.path)]);
    for (i, order) in ORDERS.into_iter().enumerate() {
        let mid = images::make(
            &dir.path().join(format!("mid{i}.raw")),
            Pattern::Random,
            SRC_LUN_SIZE,
            9 + i as u64,
        )
        .unwrap();
        let mut nbd = NbdServer::qemu_nbd(
            &mid.path,
            &QemuNbd {
                export: "disk".into(),
                ..QemuNbd::default()
            },
        );
        run_copy(&url(&tgt, IQN, 1), &nbd.uri(), order)
            .await
            .unwrap();
        nbd.stop();
        qemu_img_compare(&image.path, &mid.path);
        assert_eq!(blkhash_file(&mid.path), blkhash_file(&image.path));
    }
}

/// qemu-nbd (an unaligned image, served as whole sectors) -> LUNs full of garbage, both
/// orders: a thick LUN (zeroes written with WRITE SAME) and a thin one (WRITE SAME with
/// UNMAP, so the garbage's blocks are deallocated).
#[tokio::test]
async fn nbd_to_lun_both_orders() {
    let dir = scratch_dir();
    let image = half_data(&dir.path().join("src.raw"), SIZE, 4);
    let luns: Vec<Image> = (0..2)
        .map(|i| {
            images::make(
                &dir.path().join(format!("lun{i}.img")),
                Pattern::Random,
                LUN_SIZE,
                20 + i,
            )
            .unwrap()
        })
        .collect();
    let mut tgt = Tgtd::start();
    tgt.add_target(1, IQN, &[thick(&luns[0].path), thin(&luns[1].path)]);
    let mut nbd = NbdServer::qemu_nbd(
        &image.path,
        &QemuNbd {
            export: "disk".into(),
            read_only: true,
            ..QemuNbd::default()
        },
    );
    for (i, order) in ORDERS.into_iter().enumerate() {
        let u = url(&tgt, IQN, i as u32 + 1);
        run_copy(&nbd.uri(), &u, order).await.unwrap();
        // The image plus the zeroed tail of its last sector.
        qemu_img_compare(&image.path, &luns[i].path);
        assert_eq!(blkhash_of(&u).await, blkhash_file(&luns[i].path));
    }
    nbd.stop();
    assert!(
        allocated_bytes(&luns[0].path) >= LUN_SIZE,
        "the thick LUN stays allocated"
    );
    assert_allocated_about(&luns[1].path, image.nonzero_block_bytes);
}

/// tgtd killed during a slow copy: the copy fails soon with an error naming the LUN and the
/// lost connection, whether the LUN is the target or the source.
#[tokio::test]
async fn tgtd_killed_mid_copy_fails_clearly() {
    let dir = scratch_dir();
    // All data, so the rate limit makes the copy take seconds.
    let image = images::make(&dir.path().join("src.raw"), Pattern::Random, SIZE, 5).unwrap();
    for lun_is_target in [true, false] {
        let lun = dir.path().join(format!("lun-{lun_is_target}.img"));
        if lun_is_target {
            empty(&lun, LUN_SIZE);
        } else {
            images::make(&lun, Pattern::Random, LUN_SIZE, 6).unwrap();
        }
        let mut tgt = Tgtd::start();
        tgt.add_target(1, IQN, &[thin(&lun)]);
        let u = url(&tgt, IQN, 1);
        let out = dir.path().join("out.raw");
        let (s, t) = if lun_is_target {
            let s = source(image.path.to_str().unwrap()).await.unwrap();
            (s, target(&u, SIZE).await.unwrap())
        } else {
            let s = source(&u).await.unwrap();
            let t = target(out.to_str().unwrap(), s.size()).await.unwrap();
            (s, t)
        };
        let slow = CopyOptions {
            rate_limit: Some(4 * MIB),
            ..CopyOptions::default()
        };
        let copying = tokio::spawn(async move {
            copy(s, t, &slow, &Progress::new(), &CancellationToken::new()).await
        });
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(
            !copying.is_finished(),
            "the copy must still run when tgtd dies"
        );
        let killed = Instant::now();
        tgt.kill();
        let err = tokio::time::timeout(Duration::from_secs(30), copying)
            .await
            .expect("the copy must fail, not hang")
            .unwrap()
            .expect_err("a copy through a killed tgtd cannot succeed");
        let waited = killed.elapsed();
        assert!(
            waited < Duration::from_secs(10),
            "failed only after {waited:?}"
        );
        assert_eq!(err.kind(), ErrorKind::Disconnected, "{err}");
        let text = err.to_string();
        assert!(text.contains(&u), "names the LUN: {text}");
        assert!(
            text.contains("closed the connection"),
            "says the connection was lost: {text}"
        );
    }
}

/// `ferry copy` both ways with the CHAP user in the URL and the secret in the environment;
/// the secret never shows, and a wrong one is a clean authentication failure.
#[test]
fn cli_copy_with_chap_secret_from_the_environment() {
    const SECRET: &str = "cli-chap-secret-42";
    let dir = scratch_dir();
    let image = half_data(&dir.path().join("src.raw"), SIZE, 6);
    let lun = empty(&dir.path().join("lun.img"), LUN_SIZE);
    let mut tgt = Tgtd::start();
    tgt.add_target(1, IQN, &[thin(&lun)]);
    tgt.add_chap(1, "carol", SECRET, false);
    let u = format!("iscsi://carol@127.0.0.1:{}/{IQN}/1", tgt.port());
    let ferry = ferry!();
    // Runs ferry with `env`; no output may hold `secret`.
    let run = |args: &[&std::ffi::OsStr], env: &[(&str, &std::ffi::OsStr)], secret: &str| {
        let mut cmd = ferry.command(args);
        cmd.env_remove("FERRY_ISCSI_PASSWORD")
            .env_remove("FERRY_ISCSI_PASSWORD_FILE");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start ferry");
        let run = ferry_tests::bin::wait_with_deadline(
            child,
            Duration::from_secs(120),
            format!("ferry {args:?}"),
        );
        assert!(
            !run.stdout.contains(secret) && !run.stderr.contains(secret),
            "the secret leaked: {run}"
        );
        run
    };
    // With --verify: the target is read back through the source's size, which ends inside
    // the LUN's last block.
    let copied = run(
        &[
            "copy".as_ref(),
            "--verify".as_ref(),
            image.path.as_os_str(),
            u.as_ref(),
        ],
        &[("FERRY_ISCSI_PASSWORD", SECRET.as_ref())],
        SECRET,
    );
    copied.assert_success();
    assert!(
        copied.stdout.contains(&blkhash_file(&image.path)),
        "{copied}"
    );
    qemu_img_compare(&image.path, &lun);
    assert_allocated_about(&lun, image.nonzero_block_bytes);

    // Back, with the secret in a file.
    let secret_file = dir.path().join("chap-secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let out = dir.path().join("out.raw");
    run(
        &[
            "copy".as_ref(),
            "--in-order".as_ref(),
            u.as_ref(),
            out.as_os_str(),
        ],
        &[("FERRY_ISCSI_PASSWORD_FILE", secret_file.as_os_str())],
        SECRET,
    )
    .assert_success();
    qemu_img_compare(&lun, &out);
    assert_eq!(blkhash_file(&out), blkhash_file(&lun));

    // A wrong secret, from the environment and in the URL: a clean failure naming the LUN.
    const WRONG: &str = "not-the-secret-99";
    let wrong = run(
        &["copy".as_ref(), u.as_ref(), out.as_os_str()],
        &[("FERRY_ISCSI_PASSWORD", WRONG.as_ref())],
        WRONG,
    );
    let line = wrong.assert_clean_failure();
    assert!(
        line.contains("authentication") || line.contains("CHAP"),
        "{line}"
    );
    assert!(line.contains("iscsi://carol@127.0.0.1"), "{line}");
    let in_url = u.replace("carol@", &format!("carol%{WRONG}@"));
    let wrong = run(
        &["copy".as_ref(), in_url.as_ref(), out.as_os_str()],
        &[],
        WRONG,
    );
    let line = wrong.assert_clean_failure();
    assert!(
        line.contains("authentication") || line.contains("CHAP"),
        "{line}"
    );
}

/// A thin LUN whose blocks under the image are all deallocated reads as zeroes, so the copy
/// skips zero ranges; a mapped block under the image, or a thick LUN, makes the target
/// unknown, and the copy then overwrites what the LUN held.
#[tokio::test]
async fn deallocated_thin_lun_is_known_zero_and_a_mapped_block_is_not() {
    use std::os::unix::fs::FileExt;
    let dir = scratch_dir();
    let image = half_data(&dir.path().join("src.raw"), SIZE, 7);
    // Whole MiBs, so the data past the image shares no file system block with it.
    let big = LUN_SIZE.div_ceil(MIB) * MIB + MIB;
    let fresh = empty(&dir.path().join("fresh.img"), LUN_SIZE);
    let dirty = empty(&dir.path().join("dirty.img"), LUN_SIZE);
    let tail = empty(&dir.path().join("tail.img"), big);
    let thick_lun = empty(&dir.path().join("thick.img"), LUN_SIZE);
    let junk = vec![0x5au8; 2 * MIB as usize];
    std::fs::File::options()
        .write(true)
        .open(&dirty)
        .unwrap()
        .write_all_at(&junk, 20 * MIB)
        .unwrap();
    // Data only past the image's end.
    std::fs::File::options()
        .write(true)
        .open(&tail)
        .unwrap()
        .write_all_at(&junk[..MIB as usize], big - MIB)
        .unwrap();
    let mut tgt = Tgtd::start();
    tgt.add_target(
        1,
        IQN,
        &[thin(&fresh), thin(&dirty), thin(&tail), thick(&thick_lun)],
    );
    let known = |lun: u32, size: u64| {
        let u = url(&tgt, IQN, lun);
        async move { target(&u, size).await.unwrap().is_zero() }
    };
    assert!(known(1, SIZE).await, "a fresh thin LUN reads as zeroes");
    assert!(!known(2, SIZE).await, "mapped blocks under the image");
    assert!(known(3, SIZE).await, "mapped blocks only past the image");
    assert!(!known(3, big).await, "mapped blocks under a larger image");
    assert!(!known(4, SIZE).await, "a thick LUN is never known zero");
    for lun in [1, 2] {
        let u = url(&tgt, IQN, lun);
        run_copy(image.path.to_str().unwrap(), &u, CommitOrder::OutOfOrder)
            .await
            .unwrap();
        let backing = if lun == 1 { &fresh } else { &dirty };
        qemu_img_compare(&image.path, backing);
        assert_eq!(blkhash_of(&u).await, blkhash_file(backing), "LUN {lun}");
        assert_allocated_about(backing, image.nonzero_block_bytes);
    }
}
