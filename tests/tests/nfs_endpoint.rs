//! The NFS endpoint against a real nfs-ganesha started here: the conformance suite for
//! source and target, and the errors a user meets (wrong export, missing file or
//! directory, NFSv4, an existing target too small, permission denied, a directory).

use std::sync::Arc;

use std::future::Future;
use std::pin::Pin;

use ferry_core::{EndpointSpec, ErrorKind, Result, Source, Target};
use ferry_endpoints::conformance::{self, TargetFixture};
use ferry_endpoints::nfs::{NfsOptions, NfsSource, NfsTarget};
use ferry_tests::copying::{source, target};
use ferry_tests::nfs_server::Ganesha;

fn spec(url: &str) -> ferry_core::spec::NfsSpec {
    match EndpointSpec::parse(url).unwrap() {
        EndpointSpec::Nfs(s) => s,
        other => panic!("{url} parsed as {other:?}"),
    }
}

#[tokio::test]
async fn conformance_source() {
    let server = Ganesha::start();
    let size = 3 * 1024 * 1024 + 4097;
    let image = conformance::test_image(size, 7);
    std::fs::write(server.path("src.img"), &image.data).unwrap();
    let s = source(&server.url("src.img")).await.unwrap();
    let caps = s.caps();
    assert!(!caps.extents, "NFSv3 cannot report holes");
    assert!(caps.multi_conn);
    assert!(caps.block.maximum >= 64 * 1024, "{caps:?}");
    conformance::check_source(s, &image.data).await;
}

/// Each open makes a new file: ganesha caches directory entries, so a file removed behind
/// its back would still be found by name for a while.
struct Fixture<'a> {
    server: &'a Ganesha,
    opened: std::sync::atomic::AtomicUsize,
}

impl Fixture<'_> {
    fn name(&self) -> String {
        let n = self.opened.load(std::sync::atomic::Ordering::SeqCst);
        format!("dst-{n}.img")
    }
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

// Written out as async_trait expands it (this crate does not depend on async-trait).
impl TargetFixture for Fixture<'_> {
    fn open<'a, 'b>(&'a self, size: u64) -> BoxFuture<'b, Result<Arc<dyn Target>>>
    where
        'a: 'b,
        Self: 'b,
    {
        Box::pin(async move {
            self.opened
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            target(&self.server.url(&self.name()), size).await
        })
    }

    fn contents<'a, 'b>(&'a self, size: u64) -> BoxFuture<'b, Result<Vec<u8>>>
    where
        'a: 'b,
        Self: 'b,
    {
        Box::pin(async move {
            let mut data = std::fs::read(self.server.path(&self.name())).unwrap();
            data.truncate(size as usize);
            Ok(data)
        })
    }
}

#[tokio::test]
async fn conformance_target() {
    let server = Ganesha::start();
    conformance::check_target(
        &Fixture {
            server: &server,
            opened: Default::default(),
        },
        3 * 1024 * 1024 + 4097,
    )
    .await;
}

#[tokio::test]
async fn new_target_is_created_with_the_size_and_reads_as_zero() {
    let server = Ganesha::start();
    let t = NfsTarget::open(
        &spec(&server.url("new.img")),
        5_000_001,
        &NfsOptions::default(),
    )
    .await
    .unwrap();
    assert!(t.is_zero());
    assert_eq!(t.size(), 5_000_001);
    t.finish().await.unwrap();
    let meta = std::fs::metadata(server.path("new.img")).unwrap();
    assert_eq!(meta.len(), 5_000_001);

    // Opened again it exists: not known to be zero, and its size stays.
    let t = target(&server.url("new.img"), 4096).await.unwrap();
    assert!(!t.is_zero());
    assert_eq!(t.size(), 5_000_001);
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

#[tokio::test]
async fn open_errors_are_clear() {
    let server = Ganesha::start();
    std::fs::write(server.path("small.img"), vec![1u8; 4096]).unwrap();
    std::fs::create_dir(server.path("dir")).unwrap();
    let port_opts = format!(
        "nfsport={}&mountport={}",
        server.nfs_port, server.mount_port
    );

    // An export that does not exist.
    let err = source(&format!("nfs://127.0.0.1/no/such/export/x.img?{port_opts}"))
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let text = err.to_string();
    assert!(text.contains("export not found"), "{text}");
    assert!(
        text.contains(&server.export_dir().display().to_string()),
        "lists the exports: {text}"
    );

    // A file that does not exist.
    let err = source(&server.url("missing.img")).await.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("missing.img"), "{err}");

    // A directory that does not exist, for a target.
    let err = target(&server.url("nodir/x.img"), 4096)
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("nodir"), "{err}");

    // A directory is not an image.
    let err = source(&server.url("dir")).await.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("directory"), "{err}");

    // An existing target smaller than the image.
    let err = target(&server.url("small.img"), 8192).await.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    let text = err.to_string();
    assert!(text.contains("4096") && text.contains("8192"), "{text}");

    // NFSv4 with the real path instead of the pseudo path: the NFSv4 endpoint says
    // which directory it could not find and that v4 URLs use pseudo paths.
    let err = source(&server.url_with("small.img", "version=4"))
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("pseudo path"), "{err}");

    // The export path itself names no image.
    let err = source(&format!(
        "nfs://127.0.0.1{}?{port_opts}",
        server.export_dir().display()
    ))
    .await
    .err()
    .unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");

    // Nothing listens on the port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = std::time::Instant::now();
    let err = source(&format!(
        "nfs://127.0.0.1{}/small.img?nfsport={closed}&mountport={closed}",
        server.export_dir().display()
    ))
    .await
    .err()
    .unwrap();
    assert_eq!(err.kind(), ErrorKind::Disconnected, "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

#[tokio::test]
async fn permission_denied_names_the_credentials() {
    let server = Ganesha::start();
    // A root-owned directory only root may write into, and a file only root may read.
    let locked = server.path("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::write(server.path("secret.img"), vec![7u8; 8192]).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        server.path("secret.img"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();

    let err = target(
        &server.url_with("locked/x.img", "uid=65534&gid=65534"),
        4096,
    )
    .await
    .err()
    .unwrap();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains("uid 65534"), "{err}");

    // The server checks access at READ.
    let s = source(&server.url_with("secret.img", "uid=65534&gid=65534")).await;
    let err = match s {
        Err(e) => e,
        Ok(s) => s
            .read_at(0, ferry_core::IoBuf::new(4096))
            .await
            .expect_err("a read as uid 65534 of a 0600 root file must fail"),
    };
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains("65534"), "{err}");
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
