//! ferry-nbd against real servers: qemu-nbd (raw, qcow2 with allocation depth and a
//! dirty bitmap, TLS, Unix socket) and nbdkit (file, memory, TLS), started here on
//! loopback with ports chosen at run time.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ferry_nbd::{proto, Address, Client, Config, Error, TlsConfig, ZeroFlags};
use ferry_tests::images::{self, Pattern};
use ferry_tests::nbd_servers::{require, NbdServer, Nbdkit, QemuNbd, TlsCerts};
use ferry_tests::scratch_dir;

const MIB: u64 = 1 << 20;

fn config(export: &str) -> Config {
    Config {
        export: export.into(),
        connect_timeout: Duration::from_secs(20),
        request_timeout: Some(Duration::from_secs(60)),
        ..Config::default()
    }
}

fn address(server: &NbdServer) -> Address {
    match (server.port(), server.socket()) {
        (Some(port), _) => Address::Tcp {
            host: "127.0.0.1".into(),
            port,
        },
        (None, Some(sock)) => Address::Unix(sock.to_path_buf()),
        _ => unreachable!("a server listens somewhere"),
    }
}

fn file_bytes(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let file = std::fs::File::open(path).unwrap();
    file.read_exact_at(&mut buf, offset).unwrap();
    buf
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Reads the whole export concurrently in 1 MiB requests and compares with the file.
async fn assert_reads_match(client: &Client, path: &Path) {
    let size = client.size();
    let mut tasks = Vec::new();
    let mut offset = 0;
    while offset < size {
        let len = (size - offset).min(MIB) as usize;
        let c = client.clone();
        tasks.push((
            offset,
            len,
            tokio::spawn(async move { c.read(offset, vec![0u8; len]).await }),
        ));
        offset += len as u64;
    }
    for (offset, len, task) in tasks {
        let got = task.await.unwrap().unwrap();
        assert!(
            got == file_bytes(path, offset, len),
            "bytes at {offset} differ from the file"
        );
    }
}

#[tokio::test]
async fn qemu_nbd_raw_negotiates_extended_headers_and_serves_every_command() {
    let dir = scratch_dir();
    let path = dir.path().join("disk.raw");
    let image = images::make(&path, Pattern::HalfData, 16 * MIB + 4096, 11).unwrap();
    let server = NbdServer::qemu_nbd(
        &path,
        &QemuNbd {
            export: "disk".into(),
            ..QemuNbd::default()
        },
    );
    let client = Client::connect(&address(&server), &config("disk"))
        .await
        .unwrap();
    let info = client.info().clone();
    assert_eq!(info.size, image.size);
    assert!(info.structured_replies);
    assert!(info.extended_headers, "qemu-nbd 10 offers extended headers");
    assert!(info.can_extents() && info.can_zero() && info.can_trim() && info.can_flush());
    assert!(info.can_multi_conn());

    assert_reads_match(&client, &path).await;

    // Block status: every range reported as zero reads as zeroes, and all data runs are
    // reported as data.
    let mut offset = 0;
    let mut data = 0;
    while offset < info.size {
        let status = client
            .block_status(offset, info.size - offset)
            .await
            .unwrap();
        let base = status.context(proto::CONTEXT_BASE_ALLOCATION).unwrap();
        assert_eq!(base[0].offset, offset);
        for e in base {
            if e.flags & proto::STATE_ZERO != 0 {
                let bytes = file_bytes(&path, e.offset, e.len as usize);
                assert!(bytes.iter().all(|&b| b == 0), "zero extent {e:?} has data");
            } else {
                data += e.len;
            }
            offset = e.end();
        }
    }
    assert!(
        data >= image.nonzero_block_bytes,
        "{data} < {}",
        image.nonzero_block_bytes
    );

    // Writes, zeroes (with and without NO_HOLE and FAST_ZERO), trim, flush.
    let pattern = vec![0x5au8; 256 * 1024];
    client.write(MIB, pattern.clone(), true).await.unwrap();
    client
        .write_zeroes(2 * MIB, MIB, ZeroFlags::default())
        .await
        .unwrap();
    client
        .write_zeroes(
            4 * MIB,
            MIB,
            ZeroFlags {
                no_hole: true,
                ..ZeroFlags::default()
            },
        )
        .await
        .unwrap();
    if info.can_fast_zero() {
        match client
            .write_zeroes(
                6 * MIB,
                MIB,
                ZeroFlags {
                    fast: true,
                    ..ZeroFlags::default()
                },
            )
            .await
        {
            Ok(()) => {}
            Err(e) => assert_eq!(e.server_error().map(|s| s.errno), Some(proto::ENOTSUP)),
        }
    }
    client.trim(8 * MIB, MIB, false).await.unwrap();
    client.flush().await.unwrap();
    assert_eq!(
        client.read(MIB, vec![0u8; pattern.len()]).await.unwrap(),
        pattern
    );
    assert!(client
        .read(2 * MIB, vec![1u8; MIB as usize])
        .await
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    client.disconnect().await.unwrap();
    assert!(matches!(
        client.read(0, vec![0u8; 512]).await,
        Err(Error::Closed)
    ));
    drop(server);
    assert_eq!(file_bytes(&path, MIB, pattern.len()), pattern);
    assert!(file_bytes(&path, 4 * MIB, MIB as usize)
        .iter()
        .all(|&b| b == 0));
}

#[tokio::test]
async fn many_requests_in_flight_on_one_connection() {
    let dir = scratch_dir();
    let path = dir.path().join("disk.raw");
    images::make(&path, Pattern::Random, 8 * MIB, 3).unwrap();
    let server = NbdServer::qemu_nbd(&path, &QemuNbd::default());
    let client = Client::connect(&address(&server), &config(""))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..256u64 {
        let offset = (i * 7919 * 4096) % (8 * MIB - 65536);
        let c = client.clone();
        tasks.push((
            offset,
            tokio::spawn(async move { c.read(offset, vec![0u8; 65536]).await }),
        ));
    }
    for (offset, t) in tasks {
        assert!(t.await.unwrap().unwrap() == file_bytes(&path, offset, 65536));
    }
}

#[tokio::test]
async fn qcow2_allocation_depth_and_dirty_bitmap_contexts() {
    require("qemu-img");
    let dir = scratch_dir();
    let base = dir.path().join("base.qcow2");
    let top = dir.path().join("top.qcow2");
    run(Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&base)
        .arg("8M"));
    run(Command::new("qemu-io")
        .args(["-f", "qcow2", "-c", "write -P 0x11 0 1M"])
        .arg(&base));
    run(Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
        .arg(&base)
        .arg(&top));
    run(Command::new("qemu-img")
        .args(["bitmap", "--add", "--enable", "-f", "qcow2"])
        .arg(&top)
        .arg("changes"));
    run(Command::new("qemu-io")
        .args(["-f", "qcow2", "-c", "write -P 0x22 2M 64k"])
        .arg(&top));
    let server = NbdServer::qemu_nbd(
        &top,
        &QemuNbd {
            format: Some("qcow2".into()),
            export: "top".into(),
            allocation_depth: true,
            bitmap: Some("changes".into()),
            read_only: true,
            ..QemuNbd::default()
        },
    );
    let depth = proto::CONTEXT_QEMU_ALLOCATION_DEPTH;
    let bitmap = format!("{}changes", proto::CONTEXT_QEMU_DIRTY_BITMAP_PREFIX);
    let config = Config {
        meta_contexts: vec![
            proto::CONTEXT_BASE_ALLOCATION.into(),
            depth.into(),
            bitmap.clone(),
        ],
        ..config("top")
    };
    let client = Client::connect(&address(&server), &config).await.unwrap();
    for name in [proto::CONTEXT_BASE_ALLOCATION, depth, bitmap.as_str()] {
        assert!(client.info().has_context(name), "{name} not negotiated");
    }
    assert!(client.info().read_only());
    let status = client.block_status(0, 8 * MIB).await.unwrap();
    let at = |name: &str, offset: u64| -> u64 {
        status
            .context(name)
            .unwrap()
            .iter()
            .find(|e| e.offset <= offset && offset < e.end())
            .unwrap_or_else(|| panic!("{name} does not cover {offset}"))
            .flags
    };
    // Depth: 2 in the backing file, 1 in the top layer, 0 unallocated.
    assert_eq!(at(depth, 0), 2);
    assert_eq!(at(depth, 2 * MIB), 1);
    assert_eq!(at(depth, 5 * MIB), 0);
    // Only the write made while the bitmap was enabled is dirty.
    assert_eq!(
        at(&bitmap, 2 * MIB) & proto::STATE_DIRTY,
        proto::STATE_DIRTY
    );
    assert_eq!(at(&bitmap, 0) & proto::STATE_DIRTY, 0);
    assert_eq!(at(&bitmap, 6 * MIB) & proto::STATE_DIRTY, 0);
    assert!(client
        .read(2 * MIB, vec![0u8; 65536])
        .await
        .unwrap()
        .iter()
        .all(|&b| b == 0x22));
    assert!(client
        .read(0, vec![0u8; 65536])
        .await
        .unwrap()
        .iter()
        .all(|&b| b == 0x11));
    let err = client.write(0, vec![0u8; 512], false).await.unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
}

#[tokio::test]
async fn missing_export_names_the_exports_the_server_has() {
    let dir = scratch_dir();
    let path = dir.path().join("disk.raw");
    images::make(&path, Pattern::Empty, MIB, 1).unwrap();
    let server = NbdServer::qemu_nbd(
        &path,
        &QemuNbd {
            export: "present".into(),
            ..QemuNbd::default()
        },
    );
    let err = Client::connect(&address(&server), &config("absent"))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "no such export 'absent'; the server has: 'present'"
    );
}

#[tokio::test]
async fn nbdkit_memory_structured_replies_and_multi_conn() {
    let server = NbdServer::nbdkit(&["memory", "64M"], &Nbdkit::default());
    let a = Client::connect(&address(&server), &config(""))
        .await
        .unwrap();
    let info = a.info().clone();
    assert_eq!(info.size, 64 * MIB);
    assert!(info.structured_replies);
    assert!(info.can_multi_conn(), "the memory plugin allows multi-conn");
    assert!(info.can_extents());
    let b = Client::connect(&address(&server), &config(""))
        .await
        .unwrap();
    let data: Vec<u8> = (0..MIB as usize).map(|i| (i % 251) as u8).collect();
    a.write(3 * MIB, data.clone(), false).await.unwrap();
    a.flush().await.unwrap();
    assert_eq!(
        b.read(3 * MIB, vec![0u8; MIB as usize]).await.unwrap(),
        data
    );
    let status = b.block_status(0, 64 * MIB).await.unwrap();
    let base = status.context(proto::CONTEXT_BASE_ALLOCATION).unwrap();
    let zero_at = |o: u64| {
        base.iter()
            .find(|e| e.offset <= o && o < e.end())
            .map(|e| e.flags & proto::STATE_ZERO != 0)
            .unwrap()
    };
    assert!(zero_at(0));
    assert!(!zero_at(3 * MIB));
    a.disconnect().await.unwrap();
    b.disconnect().await.unwrap();
}

#[tokio::test]
async fn unix_sockets_for_both_servers() {
    let dir = scratch_dir();
    let path = dir.path().join("disk.raw");
    images::make(&path, Pattern::Random, 2 * MIB, 5).unwrap();
    let qemu = NbdServer::qemu_nbd(
        &path,
        &QemuNbd {
            unix: true,
            read_only: true,
            ..QemuNbd::default()
        },
    );
    let client = Client::connect(&address(&qemu), &config("")).await.unwrap();
    assert_reads_match(&client, &path).await;
    drop(client);
    drop(qemu);
    let kit = NbdServer::nbdkit(
        &["file", path.to_str().unwrap()],
        &Nbdkit {
            unix: true,
            ..Nbdkit::default()
        },
    );
    let client = Client::connect(&address(&kit), &config("")).await.unwrap();
    assert_reads_match(&client, &path).await;
}

fn tls_config(export: &str, certs: &Path) -> Config {
    Config {
        tls: Some(TlsConfig {
            certificates: Some(certs.to_path_buf()),
            verify_peer: true,
            hostname: None,
        }),
        ..config(export)
    }
}

#[tokio::test]
async fn tls_with_qemu_nbd_and_nbdkit() {
    let certs = TlsCerts::generate();
    let dir = scratch_dir();
    let path = dir.path().join("disk.raw");
    images::make(&path, Pattern::HalfData, 4 * MIB, 9).unwrap();

    let qemu = NbdServer::qemu_nbd(
        &path,
        &QemuNbd {
            export: "secure".into(),
            tls: Some(certs.dir().to_path_buf()),
            ..QemuNbd::default()
        },
    );
    let client = Client::connect(&address(&qemu), &tls_config("secure", certs.dir()))
        .await
        .unwrap();
    assert!(client.info().tls);
    assert_reads_match(&client, &path).await;
    client.write(0, vec![7u8; 4096], false).await.unwrap();
    client.flush().await.unwrap();
    client.disconnect().await.unwrap();

    // Without TLS the server refuses, and says so.
    let err = Client::connect(&address(&qemu), &config("secure"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TlsRequired(_)), "{err:?}");

    // A CA that did not sign the server's certificate is refused.
    let other = TlsCerts::generate();
    let err = Client::connect(&address(&qemu), &tls_config("secure", other.dir()))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Tls(_)), "{err:?}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
    drop(qemu);

    let kit = NbdServer::nbdkit(
        &["file", path.to_str().unwrap()],
        &Nbdkit {
            tls: Some(certs.dir().to_path_buf()),
            ..Nbdkit::default()
        },
    );
    let client = Client::connect(&address(&kit), &tls_config("", certs.dir()))
        .await
        .unwrap();
    assert!(client.info().tls);
    assert_reads_match(&client, &path).await;
    client.disconnect().await.unwrap();
}

#[tokio::test]
async fn client_certificates_are_presented_when_the_server_asks() {
    let certs = TlsCerts::generate();
    let dir = scratch_dir();
    let path = dir.path().join("disk.raw");
    images::make(&path, Pattern::Random, MIB, 12).unwrap();
    let server = NbdServer::qemu_nbd(
        &path,
        &QemuNbd {
            tls: Some(certs.dir().to_path_buf()),
            tls_verify_client: true,
            read_only: true,
            ..QemuNbd::default()
        },
    );
    let client = Client::connect(&address(&server), &tls_config("", certs.dir()))
        .await
        .unwrap();
    assert_reads_match(&client, &path).await;
    client.disconnect().await.unwrap();
}

/// Extended headers carry 64-bit lengths: one block status request describes an export
/// larger than 4 GiB.
#[tokio::test]
async fn block_status_beyond_four_gib_in_one_request() {
    let dir = scratch_dir();
    let path = dir.path().join("big.raw");
    let size = 6 * 1024 * MIB;
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(size).unwrap();
    file.write_all_at(&[1u8; 4096], 5 * 1024 * MIB).unwrap();
    drop(file);
    let server = NbdServer::qemu_nbd(&path, &QemuNbd::default());
    let client = Client::connect(&address(&server), &config(""))
        .await
        .unwrap();
    assert!(client.info().extended_headers);
    let status = client.block_status(0, size).await.unwrap();
    let base = status.context(proto::CONTEXT_BASE_ALLOCATION).unwrap();
    assert_eq!(base[0].offset, 0);
    assert!(
        base[0].len > u64::from(u32::MAX),
        "the first hole is described in one extent: {:?}",
        base[0]
    );
    assert!(base.iter().any(|e| e.flags & proto::STATE_ZERO == 0
        && e.offset <= 5 * 1024 * MIB
        && 5 * 1024 * MIB < e.end()));
}
