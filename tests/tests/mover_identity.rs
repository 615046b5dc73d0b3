//! A mover reads what the volumes of its users hold, under the identity its pod spec
//! gives it: the operator-built Checksum pod of a Filesystem claim, run as the kernel
//! would run its container (its runAsUser, runAsGroup and supplemental groups, no
//! capabilities, via setpriv), reads a KubeVirt/CDI `disk.img` (0660, owned by 107:107,
//! on a read-only mount where kubelet applies no fsGroup); without the supplemental
//! group, the same process is refused.

use std::os::unix::fs::{chown, PermissionsExt};
use std::path::Path;
use std::process::Command;

use ferry_tests::check::{blkhash_file, require_tool};
use ferry_tests::scratch_dir;

/// The pod security context of the mover of a Checksum of a Filesystem claim.
fn checksum_identity() -> (i64, i64, Vec<i64>) {
    use ferry_operator::crd::VolumeMode;

    let (_, _, pod) = ferry_tests::mover_pods::checksum_mover(
        "vm-disk",
        VolumeMode::Filesystem,
        "localhost/ferry-test:latest",
    );
    let context = pod.spec.unwrap().security_context.unwrap();
    (
        context.run_as_user.unwrap(),
        context.run_as_group.unwrap(),
        context.supplemental_groups.unwrap_or_default(),
    )
}

/// `ferry checksum` of `disk` as user `uid`, group `gid` and these supplemental groups,
/// with no capabilities (a restricted container's process).
fn checksum_as(disk: &Path, uid: i64, gid: i64, groups: &[i64]) -> std::process::Output {
    let groups = if groups.is_empty() {
        "--clear-groups".to_string()
    } else {
        let list: Vec<String> = groups.iter().map(i64::to_string).collect();
        format!("--groups={}", list.join(","))
    };
    Command::new("setpriv")
        .args([
            format!("--reuid={uid}"),
            format!("--regid={gid}"),
            groups,
            "--inh-caps=-all".into(),
            "--bounding-set=-all".into(),
            "--".into(),
            env!("CARGO_BIN_EXE_ferry-e2e").into(),
            "checksum".into(),
        ])
        .arg(disk)
        .output()
        .expect("run setpriv")
}

#[test]
fn a_mover_reads_a_kubevirt_disk_through_the_disk_images_group() {
    require_tool("setpriv", "util-linux");
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "this test sets file owners and switches users: run the suite as root (CI does)"
    );
    let dir = scratch_dir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The claim's root as kubelet leaves a read-only mount: not ours, group 107.
    let volume = dir.path().join("vm-disk");
    std::fs::create_dir(&volume).unwrap();
    let disk = volume.join("disk.img");
    let bytes: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 253) as u8).collect();
    std::fs::write(&disk, &bytes).unwrap();
    chown(&volume, Some(107), Some(107)).unwrap();
    chown(&disk, Some(107), Some(107)).unwrap();
    std::fs::set_permissions(&volume, std::fs::Permissions::from_mode(0o2775)).unwrap();
    std::fs::set_permissions(&disk, std::fs::Permissions::from_mode(0o660)).unwrap();

    let (uid, gid, groups) = checksum_identity();
    assert_eq!((uid, gid), (65532, 65532));
    assert!(groups.contains(&107), "{groups:?}");
    let read = checksum_as(&disk, uid, gid, &groups);
    let stdout = String::from_utf8_lossy(&read.stdout);
    assert!(
        read.status.success(),
        "{}{stdout}",
        String::from_utf8_lossy(&read.stderr)
    );
    let digest = stdout.split_whitespace().next().unwrap_or_default();
    assert_eq!(digest, blkhash_file(&disk), "{stdout}");

    // The defect this guards: the pod's user and group alone cannot open the image.
    let refused = checksum_as(&disk, uid, gid, &[]);
    assert!(!refused.status.success(), "read without the group");
    let stderr = String::from_utf8_lossy(&refused.stderr).to_lowercase();
    assert!(stderr.contains("permission denied"), "{stderr}");
}
