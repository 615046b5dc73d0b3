//! What only NFSv4.2 (`version=4` URLs) does, against nfs-ganesha started here: SEEK
//! proven used (the source's extents match the file's real layout, a copy to a file reads
//! only the data, and a mostly-hole image is copied reading little more than its data),
//! DEALLOCATE proven to punch holes that read back as zeroes, COMMIT at flush,
//! multi-connection handles bound to one session, the fallback to NFSv4.1, a first
//! connection reset; and a server restart: the session and open are recovered or
//! reclaimed in a grace period, a file gone after the restart fails clearly, an idle open
//! outlives its leases. A stream of unknown size written over NFSv4 (and NFSv3) at its
//! length. Tests NFSv4 shares with NFSv3 run for both in nfs_copy.rs and
//! nfs_endpoint.rs, the conformance suite in conformance.rs.
//!
//! Every copy is checked with `qemu-img compare` against the file behind the export and
//! with the block hash.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{ErrorKind, Extent, ExtentKind, IoBuf, Source, Target, ZeroMode, UNKNOWN_SIZE};
use ferry_endpoints::nfs::{Nfs4Source, Nfs4Target, NfsOptions};
use ferry_engine::{CopyOptions, CopyReport};
use ferry_tests::check::{allocated_bytes, assert_allocated_about, blkhash_file, qemu_img_compare};
use ferry_tests::copying::{self, blkhash_of, copy_urls, source, target};
use ferry_tests::images::{self, Image, Pattern};
use ferry_tests::nfs_server::{nfs_spec as spec, Ganesha};
use ferry_tests::scratch_dir;

/// A copy with the default options.
async fn run_copy(src: &str, dst: &str) -> ferry_core::Result<CopyReport> {
    copy_urls(src, dst, &CopyOptions::default()).await
}

/// A copy between endpoints already open, with the default options.
async fn run(s: Arc<dyn Source>, t: Arc<dyn Target>) -> ferry_core::Result<CopyReport> {
    copying::run(s, t, &CopyOptions::default()).await
}

const MIB: u64 = 1 << 20;
/// 12 data runs of 1 MiB in 24 MiB, and a tail that is not a multiple of any block size.
const SIZE: u64 = 24 * MIB + 12_345;

fn half_data(path: &Path, seed: u64) -> Image {
    images::make(path, Pattern::HalfData, SIZE, seed).unwrap()
}

/// A local file's data and hole extents as lseek(SEEK_DATA/SEEK_HOLE) reports them.
fn local_layout(path: &Path) -> Vec<Extent> {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    let size = f.metadata().unwrap().len() as i64;
    let fd = f.as_raw_fd();
    let mut out = Vec::new();
    let mut pos = 0i64;
    while pos < size {
        // SAFETY: lseek on a file descriptor this function owns.
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        let data = if data < 0 { size } else { data };
        if data > pos {
            out.push(Extent::zero(pos as u64, (data - pos) as u64));
            pos = data;
            continue;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, pos, libc::SEEK_HOLE) };
        out.push(Extent::data(pos as u64, (hole - pos) as u64));
        pos = hole;
    }
    out
}

/// All extents of `s`, asked for in pieces as the engine does.
async fn all_extents(s: &dyn Source) -> Vec<Extent> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < s.size() {
        let got = s.extents(pos, s.size() - pos).await.unwrap();
        assert!(!got.is_empty());
        assert_eq!(got[0].offset, pos, "extents are contiguous");
        pos = got.last().unwrap().end();
        out.extend(got);
    }
    ferry_core::merge_extents(out)
}

#[tokio::test]
async fn nfs4_to_file_is_exact_and_sparse_and_reads_only_data() {
    let server = Ganesha::start();
    let dir = scratch_dir();
    let image = half_data(&server.path("src.raw"), 2);
    let s = Arc::new(
        Nfs4Source::open(&spec(&server.url_v4("src.raw")), &NfsOptions::default())
            .await
            .unwrap(),
    );
    assert_eq!(s.minor_version(), 2, "ganesha speaks NFSv4.2");
    assert!(s.uses_seek(), "SEEK works on ganesha's VFS backend");
    assert!(s.caps().extents);
    // SEEK reports exactly the layout the file system has.
    assert_eq!(all_extents(&*s).await, local_layout(&image.path));

    let out = dir.path().join("dst.raw");
    let t = target(out.to_str().unwrap(), SIZE).await.unwrap();
    let report = run(s.clone(), t).await.unwrap();
    assert_eq!(report.size, SIZE);
    qemu_img_compare(&image.path, &out);
    assert_allocated_about(&out, image.nonzero_block_bytes);
    assert_eq!(blkhash_file(&out), blkhash_file(&image.path));
    // Holes were never read: READ moved the data runs only.
    let read = s.bytes_read();
    assert!(
        read <= image.written_bytes + MIB && read >= image.nonzero_block_bytes,
        "read {read} bytes of a {SIZE}-byte image holding {} bytes of data",
        image.written_bytes
    );
}

/// A stream of unknown size (as a gzip stream is) into NFSv4 and NFSv3 targets: a new file
/// ends exactly at the stream's length and stays sparse, an existing longer file keeps
/// its tail, a shorter one grows to the stream.
#[tokio::test]
async fn a_stream_of_unknown_size_is_written_at_its_length() {
    let server = Ganesha::start();
    let image = half_data(&server.path("src.raw"), 5);
    let data = std::fs::read(&image.path).unwrap();
    let stream = || -> Arc<dyn Source> {
        Arc::new(ferry_testkit::MemSource::new(data.clone()).with_unknown_size())
    };
    for version in [4u8, 3] {
        let name = format!("new-v{version}.raw");
        let t = target(&server.url_for(version, &name), UNKNOWN_SIZE)
            .await
            .unwrap();
        assert!(t.can_grow(), "NFSv{version}");
        let report = run(stream(), t).await.unwrap();
        assert!(report.size_learned, "NFSv{version}");
        assert_eq!(report.size, SIZE, "NFSv{version}");
        let out = server.path(&name);
        assert_eq!(
            std::fs::metadata(&out).unwrap().len(),
            SIZE,
            "NFSv{version}"
        );
        qemu_img_compare(&image.path, &out);
        assert_allocated_about(&out, image.nonzero_block_bytes);

        let name = format!("longer-v{version}.raw");
        let longer = server.path(&name);
        std::fs::write(&longer, vec![0x5au8; (SIZE + MIB) as usize]).unwrap();
        let t = target(&server.url_for(version, &name), UNKNOWN_SIZE)
            .await
            .unwrap();
        run(stream(), t).await.unwrap();
        let got = std::fs::read(&longer).unwrap();
        assert_eq!(got.len() as u64, SIZE + MIB, "NFSv{version}: never shrunk");
        assert!(
            got[..SIZE as usize] == data[..],
            "NFSv{version}: the stream's bytes"
        );
        assert!(
            got[SIZE as usize..].iter().all(|&b| b == 0x5a),
            "NFSv{version}: the tail past the stream is kept"
        );

        let name = format!("shorter-v{version}.raw");
        let shorter = server.path(&name);
        std::fs::write(&shorter, vec![0x5au8; MIB as usize]).unwrap();
        let t = target(&server.url_for(version, &name), UNKNOWN_SIZE)
            .await
            .unwrap();
        run(stream(), t).await.unwrap();
        assert_eq!(
            std::fs::metadata(&shorter).unwrap().len(),
            SIZE,
            "NFSv{version}"
        );
        qemu_img_compare(&image.path, &shorter);
    }
}

/// A 1 GiB image with one MiB of data: SEEK makes the copy read about one MiB.
#[tokio::test]
async fn a_mostly_hole_source_is_copied_without_reading_its_holes() {
    let server = Ganesha::start();
    let dir = scratch_dir();
    let size = 1 << 30;
    let src = server.path("holes.raw");
    let f = std::fs::File::create(&src).unwrap();
    f.set_len(size).unwrap();
    let data: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8 + 1).collect();
    f.write_all_at(&data, 300 * MIB).unwrap();
    f.write_all_at(&data[..4096], size - 4096).unwrap();
    drop(f);
    let s = Arc::new(
        Nfs4Source::open(&spec(&server.url_v4("holes.raw")), &NfsOptions::default())
            .await
            .unwrap(),
    );
    let out = dir.path().join("holes.out");
    let t = target(out.to_str().unwrap(), size).await.unwrap();
    let report = run(s.clone(), t).await.unwrap();
    assert!(report.zero_bytes >= size - 2 * MIB, "{report:?}");
    let read = s.bytes_read();
    assert!(
        (MIB + 4096..=2 * MIB).contains(&read),
        "read {read} bytes for 1 MiB + 4 KiB of data"
    );
    qemu_img_compare(&src, &out);
    assert_eq!(blkhash_file(&out), blkhash_file(&src));
}

/// An existing target full of random bytes: zero ranges must become zeroes (DEALLOCATE
/// punches holes on ganesha's VFS backend), data is written, flush commits.
#[tokio::test]
async fn existing_target_with_zero_ranges_is_exact_and_holes_are_punched() {
    let server = Ganesha::start();
    let dir = scratch_dir();
    let image = half_data(&dir.path().join("src.raw"), 3);
    let garbage = images::make(&server.path("old.raw"), Pattern::Random, SIZE, 4).unwrap();
    assert!(allocated_bytes(&garbage.path) >= SIZE - MIB);
    let t = Arc::new(
        Nfs4Target::open(
            &spec(&server.url_v4("old.raw")),
            SIZE,
            &NfsOptions::default(),
        )
        .await
        .unwrap(),
    );
    assert!(!t.is_zero(), "an existing target is not known to be zero");
    assert!(t.deallocates(), "ganesha's VFS backend supports DEALLOCATE");
    assert!(t.caps().efficient_zero);
    let s = source(image.path.to_str().unwrap()).await.unwrap();
    let report = run(s, t.clone()).await.unwrap();
    assert_eq!(report.size, SIZE);
    assert_eq!(t.uncommitted_writes(), 0, "the copy's flush committed");
    qemu_img_compare(&image.path, &garbage.path);
    assert_eq!(blkhash_file(&garbage.path), blkhash_file(&image.path));
    // The zero ranges (and the zero blocks inside data) are holes now, not written zeroes.
    assert_allocated_about(&garbage.path, image.nonzero_block_bytes);

    // Zero buffers (ZeroMode::Allocate) keep the range allocated and read as zeroes.
    t.write_zeroes(0, MIB, ZeroMode::Allocate).await.unwrap();
    t.flush().await.unwrap();
    let mut head = vec![1u8; MIB as usize];
    std::fs::File::open(&garbage.path)
        .unwrap()
        .read_exact_at(&mut head, 0)
        .unwrap();
    assert!(head.iter().all(|b| *b == 0));
}

#[tokio::test]
async fn writes_are_unstable_until_flush_and_handles_share_one_session() {
    let server = Ganesha::start();
    let t = Nfs4Target::open(
        &spec(&server.url_v4("c.img")),
        4 * MIB,
        &NfsOptions::default(),
    )
    .await
    .unwrap();
    assert!(t.is_zero(), "a created target reads as zeroes");
    assert_eq!(t.minor_version(), 2);
    // Four handles, each on its own connection bound to the one session.
    let mut handles = vec![];
    for _ in 0..4 {
        handles.push(t.connect().await.unwrap());
    }
    let writes = handles.iter().enumerate().map(|(i, h)| {
        let mut buf = IoBuf::new(MIB as usize);
        buf.fill(i as u8 + 1);
        h.write_at(i as u64 * MIB, buf)
    });
    for r in futures_util::future::join_all(writes).await {
        r.unwrap();
    }
    assert!(t.uncommitted_writes() > 0, "writes are UNSTABLE");
    handles[2].flush().await.unwrap();
    assert_eq!(
        t.uncommitted_writes(),
        0,
        "one flush commits every handle's writes"
    );
    drop(handles);
    let data = std::fs::read(server.path("c.img")).unwrap();
    assert_eq!(data.len() as u64, 4 * MIB);
    for i in 0..4usize {
        let chunk = &data[i * MIB as usize..(i + 1) * MIB as usize];
        assert!(chunk.iter().all(|b| *b == i as u8 + 1), "chunk {i}");
    }
    // Reads through several handles of a source see the same bytes.
    let s = Nfs4Source::open(&spec(&server.url_v4("c.img")), &NfsOptions::default())
        .await
        .unwrap();
    let other = s.connect().await.unwrap();
    let buf = other.read_at(3 * MIB - 10, IoBuf::new(20)).await.unwrap();
    assert_eq!(&buf[..10], &[3u8; 10]);
    assert_eq!(&buf[10..], &[4u8; 10]);
}

/// The extents of a source without data at all, and of one that is all data.
#[tokio::test]
async fn extents_of_empty_and_full_files() {
    let server = Ganesha::start();
    let f = std::fs::File::create(server.path("empty.raw")).unwrap();
    f.set_len(8 * MIB).unwrap();
    drop(f);
    images::make(&server.path("full.raw"), Pattern::Random, 2 * MIB + 1, 7).unwrap();
    let s = source(&server.url_v4("empty.raw")).await.unwrap();
    assert_eq!(
        s.extents(MIB, 2 * MIB).await.unwrap(),
        [Extent::zero(MIB, 2 * MIB)]
    );
    let s = source(&server.url_v4("full.raw")).await.unwrap();
    let e = s.extents(0, 2 * MIB + 1).await.unwrap();
    assert_eq!(e, [Extent::data(0, 2 * MIB + 1)]);
    assert!(matches!(e[0].kind, ExtentKind::Data));
    let err = s.extents(0, 3 * MIB).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
}

/// A server without NFSv4.2: the session falls back to NFSv4.1, the source reports no
/// extents (no SEEK), zero ranges are written as zero buffers, and copies stay exact.
#[tokio::test]
async fn a_server_without_nfs42_is_spoken_to_in_nfs41() {
    let server = Ganesha::start_with_nfsv4("Minor_Versions = 0, 1;");
    let dir = scratch_dir();
    let image = half_data(&server.path("src.raw"), 8);
    let s = Nfs4Source::open(&spec(&server.url_v4("src.raw")), &NfsOptions::default())
        .await
        .unwrap();
    assert_eq!(s.minor_version(), 1);
    assert!(!s.uses_seek());
    assert!(!s.caps().extents);
    assert_eq!(s.extents(0, SIZE).await.unwrap(), [Extent::data(0, SIZE)]);
    drop(s);
    let out = dir.path().join("dst.raw");
    run_copy(&server.url_v4("src.raw"), out.to_str().unwrap())
        .await
        .unwrap();
    qemu_img_compare(&image.path, &out);

    // An existing target: zero ranges are written as zeroes.
    images::make(&server.path("old.raw"), Pattern::Random, SIZE, 9).unwrap();
    let t = Nfs4Target::open(
        &spec(&server.url_v4("old.raw")),
        SIZE,
        &NfsOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(t.minor_version(), 1);
    assert!(!t.deallocates());
    assert!(!t.caps().efficient_zero);
    let s = source(image.path.to_str().unwrap()).await.unwrap();
    run(s, Arc::new(t)).await.unwrap();
    qemu_img_compare(&image.path, &server.path("old.raw"));
    assert_eq!(
        blkhash_file(&server.path("old.raw")),
        blkhash_file(&image.path)
    );
}

/// Short timeouts for the fault tests, with a reconnect window that covers a restart.
fn fault_options() -> NfsOptions {
    NfsOptions {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
        reconnect_timeout: Duration::from_secs(30),
        privileged_port: None,
    }
}

/// A restarted server has forgotten the session and the open: the next request
/// recovers them (new client id, session and OPEN by file handle) and is sent again.
#[tokio::test]
async fn a_restarted_server_is_recovered_from() {
    let mut server = Ganesha::start();
    std::fs::write(server.path("r.img"), vec![3u8; 65536]).unwrap();
    let s = Nfs4Source::open(&spec(&server.url_v4("r.img")), &fault_options())
        .await
        .unwrap();
    let h = s.connect().await.unwrap();
    let buf = s.read_at(0, IoBuf::new(4096)).await.unwrap();
    assert!(buf.iter().all(|b| *b == 3));
    server.restart();
    // Both handles at once: one recovers, the other waits for it.
    let (a, b) = tokio::join!(
        s.read_at(0, IoBuf::new(4096)),
        h.read_at(61440, IoBuf::new(4096))
    );
    assert!(a.unwrap().iter().all(|b| *b == 3));
    assert!(b.unwrap().iter().all(|b| *b == 3));
    // The recovered session serves later requests too, on both handles.
    let buf = h.read_at(4096, IoBuf::new(4096)).await.unwrap();
    assert!(buf.iter().all(|b| *b == 3));
    // Recovered once, for both handles; with no grace period, by a new OPEN.
    assert_eq!(s.recoveries(), (0, 1));
}

/// A server restarted into a grace period lets the open be reclaimed (CLAIM_PREVIOUS)
/// instead of waiting for the grace period to end for a new OPEN.
#[tokio::test]
async fn a_restart_with_a_grace_period_reclaims_the_open() {
    let mut server =
        Ganesha::start_with_nfsv4("Graceless = false; Lease_Lifetime = 10; Grace_Period = 30;");
    std::fs::write(server.path("g.img"), vec![4u8; 65536]).unwrap();
    let s = Nfs4Source::open(&spec(&server.url_v4("g.img")), &fault_options())
        .await
        .unwrap();
    s.read_at(0, IoBuf::new(4096)).await.unwrap();
    server.restart();
    let started = Instant::now();
    let buf = s.read_at(0, IoBuf::new(4096)).await.unwrap();
    assert!(buf.iter().all(|b| *b == 4));
    assert_eq!(s.recoveries(), (1, 0), "reclaimed, not opened anew");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "reclaimed in the grace period, not waited out: {:?}",
        started.elapsed()
    );
}

/// A file removed while the server was down cannot be opened again: the recovery fails
/// with a clear stale-handle error instead of reading something else.
#[tokio::test]
async fn a_file_gone_after_a_restart_fails_clearly() {
    let mut server = Ganesha::start();
    std::fs::write(server.path("gone.img"), vec![3u8; 65536]).unwrap();
    let s = Nfs4Source::open(&spec(&server.url_v4("gone.img")), &fault_options())
        .await
        .unwrap();
    s.read_at(0, IoBuf::new(4096)).await.unwrap();
    std::fs::remove_file(server.path("gone.img")).unwrap();
    server.restart();
    let started = Instant::now();
    let err = s
        .read_at(0, IoBuf::new(4096))
        .await
        .expect_err("the file is gone");
    let text = format!("{err} {:?}", std::error::Error::source(&err));
    assert!(text.contains("stale file handle"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(40));
    // Later requests fail the same way, without trying again.
    s.read_at(0, IoBuf::new(4096))
        .await
        .expect_err("the session stays lost");
}

/// An open left idle for several leases stays valid: the session renews its lease.
#[tokio::test]
async fn an_idle_open_outlives_several_leases() {
    let server = Ganesha::start_with_nfsv4("Minor_Versions = 0, 1, 2; Lease_Lifetime = 3;");
    std::fs::write(server.path("idle.img"), vec![5u8; 65536]).unwrap();
    let s = Nfs4Source::open(&spec(&server.url_v4("idle.img")), &NfsOptions::default())
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(12)).await;
    let buf = s.read_at(0, IoBuf::new(4096)).await.unwrap();
    assert!(buf.iter().all(|b| *b == 5));
}

/// A server that resets the first connection it accepts (as a server only just started
/// may): the session is started again over a new connection and the copy is exact.
#[tokio::test]
async fn a_reset_first_connection_is_retried() {
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};
    let server = Ganesha::start();
    let dir = scratch_dir();
    let image = half_data(&dir.path().join("src.raw"), 9);
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = proxy.local_addr().unwrap().port();
    let upstream = ("127.0.0.1", server.nfs_port);
    let resets = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&resets);
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut client, _)) = proxy.accept().await {
            if std::mem::take(&mut first) {
                let mut head = [0u8; 4];
                let _ = client.read_exact(&mut head).await;
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // Dropped with the request unread: the kernel resets the connection.
                continue;
            }
            let mut to = TcpStream::connect(upstream).await.unwrap();
            tokio::spawn(async move {
                let _ = tokio::io::copy_bidirectional(&mut client, &mut to).await;
            });
        }
    });
    let url = format!("nfs://127.0.0.1/export/dst.raw?nfsport={port}&version=4");
    run_copy(image.path.to_str().unwrap(), &url).await.unwrap();
    assert_eq!(resets.load(std::sync::atomic::Ordering::SeqCst), 1);
    qemu_img_compare(&image.path, &server.path("dst.raw"));
    assert_eq!(blkhash_of(&url).await, blkhash_file(&image.path));
}
