//! End-to-end test support for ferry: seeded images ([`images`]), differencing VHD and
//! VHDX images written by their specs ([`diff_images`]), independent checks of
//! the results ([`check`]), running the binary under test ([`bin`]) and the job service
//! ([`service_support`]), opening endpoints by URL ([`copying`]), and the real servers the
//! tests run against: NBD ([`nbd_servers`]), NFS ([`nfs_server`]), iSCSI
//! ([`iscsi_server`]), S3 ([`s3_server`]), HTTP(S) ([`http_server`], nginx) and a
//! misbehaving HTTP server ([`http_faults`]). In-memory endpoints and the conformance
//! suite are in ferry-testkit.
//!
//! The integration tests in `tests/tests/` use these against the `ferry-e2e` binary, which
//! is the `ferry` command built by this package so that `cargo test` always runs fresh code.

pub mod bin;
pub mod check;
pub mod copying;
pub mod diff_images;
pub mod fake_mover;
pub mod http_faults;
pub mod http_server;
pub mod images;
pub mod iscsi_server;
pub mod moto_server;
pub mod mover_pods;
pub mod nbd_servers;
pub mod nfs_server;
pub mod process;
pub mod registry_server;
pub mod s3_server;
pub mod service_support;

/// A scratch directory for one test's images, removed when dropped. Under `FERRY_TEST_DIR`
/// when set, else the system temporary directory (it must be a real filesystem that
/// supports holes, not a tmpfs without them).
pub fn scratch_dir() -> tempfile::TempDir {
    let mut builder = tempfile::Builder::new();
    builder.prefix("ferry-e2e-");
    match std::env::var_os("FERRY_TEST_DIR") {
        Some(dir) => builder.tempdir_in(dir),
        None => builder.tempdir(),
    }
    .expect("create a scratch directory")
}

/// One test per NFS version from one body: for each `async fn name(version: u8)` listed,
/// a module `name` with the tests `v3` and `v4` calling it with 3 and 4.
#[macro_export]
macro_rules! nfs_versions {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn v3() {
                super::$name(3).await;
            }

            #[tokio::test]
            async fn v4() {
                super::$name(4).await;
            }
        }
    )*};
}
