//! Bad input: each mistake gives one clear `ferry: ...` line naming what was wrong, a
//! non-zero exit, no panic, nothing on stdout (no target reported done), and leaves an
//! existing target untouched where the copy never started.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use ferry_tests::images::{make, Pattern};
use ferry_tests::{ferry, scratch_dir};

const MIB: u64 = 1 << 20;

fn copy_fails(args: &[&str]) -> String {
    let mut all = vec!["copy"];
    all.extend_from_slice(args);
    ferry!().run(&all).assert_clean_failure().to_string()
}

fn source(dir: &Path) -> PathBuf {
    let path = dir.join("source.img");
    make(&path, Pattern::HalfData, 2 * MIB, 31).unwrap();
    path
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn missing_source() {
    let dir = scratch_dir();
    let missing = dir.path().join("no-such.img");
    let target = dir.path().join("t.img");
    let line = copy_fails(&[s(&missing), s(&target)]);
    assert!(line.contains(s(&missing)), "{line}");
    assert!(line.to_lowercase().contains("no such file"), "{line}");
    assert!(
        !target.exists(),
        "a target was created for a missing source"
    );
}

#[test]
fn directory_as_source() {
    let dir = scratch_dir();
    let target = dir.path().join("t.img");
    let line = copy_fails(&[s(dir.path()), s(&target)]);
    assert!(line.contains(s(dir.path())), "{line}");
    assert!(line.contains("directory"), "{line}");
    assert!(
        !target.exists(),
        "a target was created for a directory source"
    );
}

/// A file that cannot be read. Permission bits do not stop root (CAP_DAC_OVERRIDE), and
/// neither does a directory without search permission, so as root the test uses a sysfs
/// attribute that has no read method: the kernel refuses to open it for reading, for
/// everyone, with EACCES. Not root: a file with mode 000 does the same.
fn unreadable_file(dir: &Path) -> PathBuf {
    let candidate = if is_root() {
        find_write_only_sysfs_file().expect(
            "no write-only sysfs attribute found under /sys (is sysfs mounted?); \
             the unreadable-file test needs one when run as root",
        )
    } else {
        let path = dir.join("unreadable.img");
        fs::write(&path, vec![1u8; 4096]).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o000)).unwrap();
        path
    };
    let err = fs::File::open(&candidate).expect_err("the unreadable file opened for reading");
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    candidate
}

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .map(|status| {
            status
                .lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2))
                == Some("0")
        })
        .unwrap_or(false)
}

fn find_write_only_sysfs_file() -> Option<PathBuf> {
    let known = ["/sys/bus/pci/rescan", "/sys/kernel/mm/ksm/run"];
    if let Some(path) = known.iter().map(PathBuf::from).find(|p| is_write_only(p)) {
        return Some(path);
    }
    let mut stack: Vec<(PathBuf, usize)> = ["/sys/bus", "/sys/fs", "/sys/kernel", "/sys/module"]
        .iter()
        .map(|dir| (PathBuf::from(dir), 0))
        .collect();
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_file() && is_write_only(&path) {
                return Some(path);
            }
            if kind.is_dir() && depth < 3 {
                stack.push((path, depth + 1));
            }
        }
    }
    None
}

fn is_write_only(path: &Path) -> bool {
    fs::symlink_metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o777 == 0o200)
        .unwrap_or(false)
}

#[test]
fn unreadable_source() {
    let dir = scratch_dir();
    let unreadable = unreadable_file(dir.path());
    let target = dir.path().join("t.img");
    let line = copy_fails(&[s(&unreadable), s(&target)]);
    assert!(line.contains(s(&unreadable)), "{line}");
    assert!(line.to_lowercase().contains("permission denied"), "{line}");
    let line = ferry!()
        .run(["checksum", s(&unreadable)])
        .assert_clean_failure()
        .to_string();
    assert!(line.contains(s(&unreadable)), "{line}");
}

#[test]
fn existing_target_too_small() {
    let dir = scratch_dir();
    let source = source(dir.path());
    let target = dir.path().join("small.img");
    make(&target, Pattern::Random, MIB, 32).unwrap();
    let before = fs::read(&target).unwrap();
    let line = copy_fails(&[s(&source), s(&target)]);
    assert!(line.contains(s(&target)), "{line}");
    assert!(
        line.contains("small") || line.contains("smaller"),
        "should say the target is too small: {line}"
    );
    assert_eq!(fs::metadata(&target).unwrap().len(), MIB, "target resized");
    assert!(fs::read(&target).unwrap() == before, "target changed");
}

#[test]
fn target_in_a_missing_directory() {
    let dir = scratch_dir();
    let source = source(dir.path());
    let target = dir.path().join("no-such-dir").join("t.img");
    let line = copy_fails(&[s(&source), s(&target)]);
    assert!(line.contains(s(&target)), "{line}");
}

#[test]
fn invalid_sizes_and_counts() {
    let dir = scratch_dir();
    let source = source(dir.path());
    let target = dir.path().join("t.img");
    for (option, value, says) in [
        ("--request-size", "1X", "1X"),
        ("--request-size", "-4K", "-4K"),
        ("--request-size", "0", "request size"),
        (
            "--request-size",
            "99999999999999999999",
            "99999999999999999999",
        ),
        ("--sparse-size", "3000", "power of two"),
        ("--sparse-size", "1.5K", "1.5K"),
        ("--rate-limit", "0", "rate limit"),
        ("--rate-limit", "fast", "fast"),
        ("--workers", "0", "0"),
        ("--workers", "many", "many"),
        ("--preallocation", "sometimes", "sometimes"),
        ("--preallocation", "grow=big", "big"),
        ("--cache", "maybe", "maybe"),
    ] {
        let line = copy_fails(&[option, value, s(&source), s(&target)]);
        assert!(line.contains(option), "{option} {value}: {line}");
        assert!(line.contains(says), "{option} {value}: {line}");
        assert!(!target.exists(), "{option} {value}: a target was created");
    }
    let line = ferry!()
        .run(["checksum", "--algorithm", "md5", s(&source)])
        .assert_clean_failure()
        .to_string();
    assert!(line.contains("md5"), "{line}");
}

#[test]
fn unknown_scheme() {
    let dir = scratch_dir();
    let source = source(dir.path());
    let line = copy_fails(&["foo://host/disk", s(&dir.path().join("t.img"))]);
    assert!(line.contains("unknown scheme 'foo'"), "{line}");
    let line = copy_fails(&[s(&source), "gopher://host/disk"]);
    assert!(line.contains("unknown scheme 'gopher'"), "{line}");
}

/// A scheme ferry parses but (at the time of writing) has no endpoint for, pointed at a
/// closed port: whether the endpoint exists yet or not, the user gets one clear line that
/// names the URL, quickly. The assertion does not depend on the endpoint being missing.
#[test]
fn scheme_without_a_reachable_endpoint() {
    let dir = scratch_dir();
    let source = source(dir.path());
    let url = "iscsi://127.0.0.1:1/iqn.2024-01.org.example:target/1";
    for args in [[url, s(&dir.path().join("t.img"))], [s(&source), url]] {
        let run = ferry!().run(["copy", args[0], args[1]]);
        let line = run.assert_clean_failure();
        assert!(line.contains("iscsi://127.0.0.1:1/"), "{line}");
        assert!(run.elapsed < std::time::Duration::from_secs(60), "{run}");
    }
}

#[test]
fn unknown_option_and_missing_arguments() {
    let dir = scratch_dir();
    let source = source(dir.path());
    let target = dir.path().join("t.img");
    let line = copy_fails(&["--frobnicate", s(&source), s(&target)]);
    assert!(line.contains("--frobnicate"), "{line}");
    let line = copy_fails(&[s(&source)]);
    assert!(line.contains("DST"), "{line}");
    let line = ferry!()
        .run(["transmogrify"])
        .assert_clean_failure()
        .to_string();
    assert!(line.contains("transmogrify"), "{line}");
    assert!(!target.exists());
}
