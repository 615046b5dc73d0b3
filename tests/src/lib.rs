//! End-to-end test support for ferry: seeded images ([`images`]), independent checks of
//! the results ([`check`]), and running the binary under test ([`bin`]).
//!
//! The integration tests in `tests/tests/` use these against the `ferry-e2e` binary, which
//! is the `ferry` command built by this package so that `cargo test` always runs fresh code.

pub mod bin;
pub mod check;
pub mod copying;
pub mod images;
pub mod iscsi_server;
pub mod nbd_servers;
pub mod nfs_server;

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
