use std::time::Duration;

use ferry_nbd::Backend;

use super::*;
use crate::export::ExportListen;

const SIZE: u64 = 64 * 1024;

async fn relay(dir: &tempfile::TempDir, wait: Duration) -> (Relay, PathBuf) {
    relay_idle(dir, wait, Duration::ZERO).await
}

async fn relay_idle(dir: &tempfile::TempDir, wait: Duration, idle: Duration) -> (Relay, PathBuf) {
    let path = dir.path().join("backing.raw");
    std::fs::write(&path, vec![0u8; SIZE as usize]).unwrap();
    let options = RelayOptions {
        export: ExportOptions {
            listen: ExportListen::Tcp {
                host: "127.0.0.1".into(),
                port: 0,
            },
            name: "relay".into(),
            description: None,
            tls: None,
        },
        wait,
        linger: Duration::from_secs(1),
        idle,
    };
    (Relay::start(&path, SIZE, &options).await.unwrap(), path)
}

fn write(path: &Path, offset: u64, bytes: &[u8]) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, offset).unwrap();
}

#[tokio::test]
async fn a_read_waits_until_its_whole_range_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (relay, path) = relay(&dir, Duration::from_secs(10)).await;
    let backend = relay.server.backend();
    let written = relay.written();
    // Stale bytes in the file before the copy writes them.
    write(&path, 0, &[7u8; 8192]);
    let read = tokio::spawn({
        let server = relay.server.clone();
        async move { server.backend().read(0, 8192).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    write(&path, 0, &[1u8; 4096]);
    written.written(0, 4096, false);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !read.is_finished(),
        "half the range written: the read must wait"
    );
    write(&path, 4096, &[2u8; 4096]);
    written.written(4096, 8192, false);
    let bytes = read.await.unwrap().unwrap();
    assert_eq!(&bytes[..4096], &[1u8; 4096][..]);
    assert_eq!(&bytes[4096..], &[2u8; 4096][..]);
    // Zero ranges are holes in block status; the unknown rest is not reported.
    written.written(8192, 16384, true);
    let extents = backend.extents(0, SIZE).await.unwrap();
    assert_eq!(
        extents,
        vec![
            StatusExtent {
                offset: 0,
                len: 8192,
                flags: 0
            },
            StatusExtent {
                offset: 8192,
                len: 8192,
                flags: STATE_HOLE | STATE_ZERO
            },
        ]
    );
    relay.end().await;
}

#[tokio::test]
async fn a_read_not_written_in_time_fails_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let (relay, _) = relay(&dir, Duration::from_millis(200)).await;
    let e = relay.server.backend().read(4096, 4096).await.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    assert!(e.to_string().contains("--relay-wait"), "{e}");
    relay.end().await;
}

#[tokio::test]
async fn a_failed_copy_fails_waiting_and_later_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (relay, path) = relay(&dir, Duration::from_secs(30)).await;
    relay.written().written(0, 4096, false);
    let target = relay.wrap(Arc::new(
        crate::file::FileTarget::open(&path, SIZE, &crate::TargetOptions::default())
            .await
            .unwrap(),
    ));
    let waiting = tokio::spawn({
        let server = relay.server.clone();
        async move { server.backend().read(8192, 4096).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    target.abort().await.unwrap();
    let started = std::time::Instant::now();
    let e = waiting.await.unwrap().unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(e.to_string().contains("the relay's copy failed"), "{e}");
    // Even a range that was written is refused now.
    assert!(relay.server.backend().read(0, 4096).await.is_err());
    assert!(!relay.is_complete());
    relay.end().await;
}

#[tokio::test]
async fn a_finished_copy_serves_everything_and_ends_without_clients() {
    let dir = tempfile::tempdir().unwrap();
    let (relay, path) = relay(&dir, Duration::from_secs(30)).await;
    let target = relay.wrap(Arc::new(
        crate::file::FileTarget::open(&path, SIZE, &crate::TargetOptions::default())
            .await
            .unwrap(),
    ));
    relay.written().written(0, 4096, false);
    target.finish().await.unwrap();
    assert!(relay.is_complete());
    // What the copy never reported (zeroes left alone) reads as zero.
    let extents = relay
        .server
        .backend()
        .extents(4096, SIZE - 4096)
        .await
        .unwrap();
    assert_eq!(extents[0].flags, STATE_HOLE | STATE_ZERO);
    assert_eq!(extents[0].offset + extents[0].len, SIZE);
    let started = std::time::Instant::now();
    relay.end().await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "no client: no linger"
    );
}

#[tokio::test]
async fn a_finished_copy_waits_the_idle_time_for_late_clients() {
    let dir = tempfile::tempdir().unwrap();
    let idle = Duration::from_millis(700);
    let (relay, path) = relay_idle(&dir, Duration::from_secs(30), idle).await;
    let target = relay.wrap(Arc::new(
        crate::file::FileTarget::open(&path, SIZE, &crate::TargetOptions::default())
            .await
            .unwrap(),
    ));
    relay.written().written(0, SIZE, false);
    target.finish().await.unwrap();
    let address = relay
        .uri()
        .trim_start_matches("nbd://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let started = std::time::Instant::now();
    let ending = tokio::spawn(relay.end());
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A client that comes after the copy, within the idle time, still finds the relay.
    tokio::net::TcpStream::connect(&address)
        .await
        .expect("the relay still listens during its idle time");
    ending.await.unwrap();
    let took = started.elapsed();
    assert!(
        took >= idle && took < Duration::from_secs(1) + idle,
        "the relay ended after {took:?}, its idle time {idle:?} (linger 1 s)"
    );
}

/// Released (no client is still to come), a finished relay ends as soon as no client is
/// connected, not after its idle time; released before the copy finished, it still
/// serves until then.
#[tokio::test]
async fn a_released_relay_ends_without_its_idle_time() {
    let dir = tempfile::tempdir().unwrap();
    let (relay, path) = relay_idle(&dir, Duration::from_secs(30), Duration::from_secs(30)).await;
    let target = relay.wrap(Arc::new(
        crate::file::FileTarget::open(&path, SIZE, &crate::TargetOptions::default())
            .await
            .unwrap(),
    ));
    relay.release_handle().release();
    assert!(!relay.is_complete());
    relay.written().written(0, SIZE, false);
    target.finish().await.unwrap();
    let started = std::time::Instant::now();
    relay.end().await;
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "a released relay ended after {:?} (idle time 30 s)",
        started.elapsed()
    );
}

#[tokio::test]
async fn block_status_describes_what_is_written_without_waiting_for_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (relay, _) = relay(&dir, Duration::from_secs(30)).await;
    relay.written().written(0, 8192, true);
    relay.written().written(8192, 12288, false);
    let port: u16 = relay
        .uri()
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap();
    let config = ferry_nbd::Config {
        export: "relay".into(),
        ..ferry_nbd::Config::default()
    };
    let address = ferry_nbd::Address::Tcp {
        host: "127.0.0.1".into(),
        port,
    };
    let client = ferry_nbd::Client::connect(&address, &config).await.unwrap();
    let started = std::time::Instant::now();
    let status = client.block_status(0, SIZE).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "block status waited for unwritten ranges"
    );
    let base = status
        .context(ferry_nbd::proto::CONTEXT_BASE_ALLOCATION)
        .unwrap();
    let described: Vec<(u64, u64, u64)> = base.iter().map(|e| (e.offset, e.len, e.flags)).collect();
    assert_eq!(
        described,
        vec![(0, 8192, STATE_HOLE | STATE_ZERO), (8192, 4096, 0)]
    );
    relay.end().await;
}
