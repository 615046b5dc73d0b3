//! Bad input: each refusal has the right kind and a message that names what was wrong.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::{scratch, source_options, MIB};
use ferry_core::{EndpointSpec, Error, ErrorKind};
use ferry_endpoints::file::FileSource;
use ferry_endpoints::{open_source, open_target, CacheMode, SourceOptions, TargetOptions};

async fn source_error(path: &Path) -> Error {
    open_source(
        &EndpointSpec::File(path.to_path_buf()),
        &SourceOptions::default(),
    )
    .await
    .err()
    .unwrap_or_else(|| panic!("opening {} as a source succeeded", path.display()))
}

async fn target_error(path: &Path, size: u64) -> Error {
    open_target(
        &EndpointSpec::File(path.to_path_buf()),
        size,
        &TargetOptions::default(),
    )
    .await
    .err()
    .unwrap_or_else(|| panic!("opening {} as a target succeeded", path.display()))
}

#[tokio::test]
async fn a_missing_source_is_not_found_and_named() {
    let dir = scratch();
    let path = dir.path().join("missing.img");
    let err = source_error(&path).await;
    assert_eq!(err.kind(), ErrorKind::NotFound);
    let text = err.to_string();
    assert!(text.contains(&*path.to_string_lossy()), "{text}");
    assert!(text.contains("does not exist"), "{text}");
    // The same through a file:// URL.
    let spec = EndpointSpec::parse(&format!("file://{}", path.display())).unwrap();
    let err = open_source(&spec, &SourceOptions::default())
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::NotFound);
}

#[tokio::test]
async fn a_directory_is_refused_as_source_and_target() {
    let dir = scratch();
    let err = source_error(dir.path()).await;
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("is a directory"), "{err}");
    assert!(
        err.to_string().contains(&*dir.path().to_string_lossy()),
        "{err}"
    );
    let err = target_error(dir.path(), MIB).await;
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("is a directory"), "{err}");
}

#[tokio::test]
async fn other_file_types_are_refused() {
    let err = source_error(Path::new("/dev/null")).await;
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(
        err.to_string()
            .contains("neither a regular file nor a block device"),
        "{err}"
    );
    let err = target_error(Path::new("/dev/null"), 1).await;
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}

#[test]
fn an_unreadable_source_is_permission_denied() {
    let dir = scratch();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("secret.img");
    std::fs::write(&path, [1u8; 4096]).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000)).unwrap();
    // Root reads anything; as root, open the file as nobody. setfsuid changes only this
    // thread's file system identity (and drops its DAC override capabilities).
    let result = std::thread::spawn(move || {
        // SAFETY: geteuid and setfsuid have no memory-safety preconditions.
        if unsafe { libc::geteuid() } == 0 {
            // SAFETY: setfsuid changes this thread's file system identity only.
            unsafe { libc::setfsuid(65534) };
        }
        FileSource::open_blocking(&path, &source_options(CacheMode::PageCache)).map(|_| ())
    })
    .join()
    .unwrap();
    let err = result.expect_err("an unreadable file was opened");
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains("secret.img"), "{err}");
    assert!(err.to_string().contains("cannot open for reading"), "{err}");
}

#[tokio::test]
async fn a_target_smaller_than_the_source_is_refused_with_both_sizes() {
    let dir = scratch();
    let path = dir.path().join("small.img");
    std::fs::write(&path, vec![1u8; 4096]).unwrap();
    let err = target_error(&path, 8192).await;
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let text = err.to_string();
    assert!(text.contains("4096 bytes"), "{text}");
    assert!(text.contains("8192 bytes"), "{text}");
    assert!(text.contains(&*path.to_string_lossy()), "{text}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        vec![1u8; 4096],
        "target changed"
    );
}

#[tokio::test]
async fn a_target_in_a_missing_directory_names_the_directory() {
    let dir = scratch();
    let parent = dir.path().join("no").join("such");
    let path = parent.join("dst.img");
    let err = target_error(&path, MIB).await;
    assert_eq!(err.kind(), ErrorKind::NotFound);
    let text = err.to_string();
    assert!(
        text.contains(&format!("directory {} does not exist", parent.display())),
        "{text}"
    );
}

#[tokio::test]
async fn a_target_under_a_file_is_refused() {
    let dir = scratch();
    let file = dir.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    let err = target_error(&file.join("dst.img"), MIB).await;
    assert_ne!(err.kind(), ErrorKind::Internal);
    assert!(err.to_string().contains("dst.img"), "{err}");
}
