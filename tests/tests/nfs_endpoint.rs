//! The NFS endpoints against a real nfs-ganesha started here, each test run for NFSv3 and
//! NFSv4 (`name::v3`, `name::v4`) where both versions behave alike: a new target's size
//! and zeroes, and the errors a user meets (wrong export, missing file or directory, an
//! existing target too small, permission denied, a directory, nothing listening). Then
//! what only NFSv3 does: UNSTABLE writes committed at flush, a stale handle after a
//! restart. The conformance suite runs in conformance.rs, NFSv4's own tests in nfs_v4.rs.

use std::os::unix::fs::PermissionsExt;

use ferry_core::{ErrorKind, Source, Target};
use ferry_endpoints::nfs::{NfsOptions, NfsSource, NfsTarget};
use ferry_tests::copying::{source, target};
use ferry_tests::nfs_server::{nfs_spec as spec, Ganesha};
use ferry_tests::nfs_versions;

nfs_versions!(
    new_target_is_created_with_the_size_and_reads_as_zero,
    open_errors_are_clear,
    permission_denied_names_the_credentials,
);

async fn new_target_is_created_with_the_size_and_reads_as_zero(version: u8) {
    let server = Ganesha::start();
    let url = server.url_for(version, "new.img");
    let t = target(&url, 5_000_001).await.unwrap();
    assert!(t.is_zero());
    assert_eq!(t.size(), 5_000_001);
    t.finish().await.unwrap();
    let meta = std::fs::metadata(server.path("new.img")).unwrap();
    assert_eq!(meta.len(), 5_000_001);

    // Opened again it exists: not known to be zero, and its size stays.
    let t = target(&url, 4096).await.unwrap();
    assert!(!t.is_zero());
    assert_eq!(t.size(), 5_000_001);
}

async fn open_errors_are_clear(version: u8) {
    let server = Ganesha::start();
    std::fs::write(server.path("small.img"), vec![1u8; 4096]).unwrap();
    std::fs::create_dir(server.path("dir")).unwrap();
    let port = server.nfs_port;
    let port_opts = format!("nfsport={port}&mountport={}", server.mount_port);
    let export = server.export_dir().display().to_string();

    // An export that does not exist: NFSv3 lists the exports, NFSv4 names the pseudo path
    // it could not find.
    let url = match version {
        3 => format!("nfs://127.0.0.1/no/such/export/x.img?{port_opts}"),
        _ => format!("nfs://127.0.0.1/nosuch/x.img?version=4&nfsport={port}"),
    };
    let err = source(&url).await.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let text = err.to_string();
    if version == 3 {
        assert!(text.contains("export not found"), "{text}");
        assert!(text.contains(&export), "lists the exports: {text}");
    } else {
        assert!(
            text.contains("/nosuch") && text.contains("pseudo path"),
            "{text}"
        );
    }

    // A file that does not exist (NFSv4 names its pseudo path).
    let err = source(&server.url_for(version, "missing.img"))
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let named = if version == 3 {
        "missing.img"
    } else {
        "/export/missing.img"
    };
    assert!(err.to_string().contains(named), "{err}");

    // A directory that does not exist, for a target.
    let err = target(&server.url_for(version, "nodir/x.img"), 4096)
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let named = if version == 3 {
        "nodir"
    } else {
        "/export/nodir"
    };
    assert!(err.to_string().contains(named), "{err}");

    // A directory is not an image.
    let err = source(&server.url_for(version, "dir")).await.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("directory"), "{err}");

    // An existing target smaller than the image.
    let err = target(&server.url_for(version, "small.img"), 8192)
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    let text = err.to_string();
    assert!(text.contains("4096") && text.contains("8192"), "{text}");

    if version == 3 {
        // NFSv4 with the real path instead of the pseudo path: the NFSv4 endpoint says
        // which directory it could not find and that v4 URLs use pseudo paths.
        let err = source(&server.url_with("small.img", "version=4"))
            .await
            .err()
            .unwrap();
        assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
        assert!(err.to_string().contains("pseudo path"), "{err}");
    } else {
        // The NFSv3 endpoint opened directly with a version=4 URL says where v4 lives.
        let err = NfsSource::open(&spec(&server.url_v4("small.img")), &NfsOptions::default())
            .await
            .err()
            .unwrap();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        assert!(err.to_string().contains("Nfs4Source"), "{err}");
    }

    // The export path itself names no image.
    let url = match version {
        3 => format!("nfs://127.0.0.1{export}?{port_opts}"),
        _ => format!("nfs://127.0.0.1/export?version=4&nfsport={port}"),
    };
    let err = source(&url).await.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");

    // Nothing listens on the port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = match version {
        3 => format!("nfs://127.0.0.1{export}/small.img?nfsport={closed}&mountport={closed}"),
        _ => format!("nfs://127.0.0.1/export/small.img?version=4&nfsport={closed}"),
    };
    let started = std::time::Instant::now();
    let err = source(&url).await.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Disconnected, "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

async fn permission_denied_names_the_credentials(version: u8) {
    let server = Ganesha::start();
    // A root-owned directory only root may write into, and a file only root may read.
    let locked = server.path("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(server.path("secret.img"), vec![7u8; 8192]).unwrap();
    std::fs::set_permissions(
        server.path("secret.img"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let as_nobody = |name: &str| format!("{}&uid=65534&gid=65534", server.url_for(version, name));

    let err = target(&as_nobody("locked/x.img"), 4096)
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains("uid 65534"), "{err}");

    // NFSv3 checks access at READ, NFSv4 already at OPEN for reading.
    let err = match source(&as_nobody("secret.img")).await {
        Err(e) => e,
        Ok(s) => {
            assert_eq!(version, 3, "NFSv4 OPEN for reading checks access");
            s.read_at(0, ferry_core::IoBuf::new(4096))
                .await
                .expect_err("a read as uid 65534 of a 0600 root file must fail")
        }
    };
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains("65534"), "{err}");
}

#[tokio::test]
async fn unstable_writes_are_committed_by_flush() {
    let server = Ganesha::start();
    let t = NfsTarget::open(&spec(&server.url("c.img")), 1 << 20, &NfsOptions::default())
        .await
        .unwrap();
    let mut buf = ferry_core::IoBuf::new(65536);
    buf.fill(0x5a);
    t.write_at(65536, buf).await.unwrap();
    // ganesha answers UNSTABLE writes as UNSTABLE: they wait for COMMIT.
    assert_eq!(
        t.uncommitted_writes(),
        1,
        "the write was recorded until COMMIT"
    );
    t.flush().await.unwrap();
    assert_eq!(t.uncommitted_writes(), 0);
    let data = std::fs::read(server.path("c.img")).unwrap();
    assert!(data[65536..131072].iter().all(|b| *b == 0x5a));
    assert!(data[..65536].iter().all(|b| *b == 0));
}

/// A file removed while the server was down: its handle is stale after the restart.
#[tokio::test]
async fn a_removed_file_gives_a_stale_handle_error() {
    let mut server = Ganesha::start();
    std::fs::write(server.path("gone.img"), vec![3u8; 65536]).unwrap();
    let s = NfsSource::open(
        &spec(&server.url("gone.img")),
        &NfsOptions {
            reconnect_timeout: std::time::Duration::from_secs(30),
            ..NfsOptions::default()
        },
    )
    .await
    .unwrap();
    s.read_at(0, ferry_core::IoBuf::new(4096)).await.unwrap();
    server.stop();
    std::fs::remove_file(server.path("gone.img")).unwrap();
    server.restart();
    let err = s
        .read_at(0, ferry_core::IoBuf::new(4096))
        .await
        .expect_err("the file is gone");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("stale file handle"), "{err}");
}
