//! Incremental backups driven by a QEMU dirty bitmap over qemu-nbd: a full backup of a
//! qcow2 disk, then writes tracked by bitmap `b0`, then a backup that reads only the
//! chunks the bitmap marks dirty (counted through a wrapper of the NBD source) and still
//! produces the whole image's block hash; the restore is compared with the disk.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ferry_backup::{InitOptions, LocalStore, Repository};
use ferry_core::{EndpointSpec, Source};
use ferry_engine::{CancellationToken, Progress};
use ferry_image_backup::{backup, restore, BackupOptions, NbdDirtyBitmap, RestoreOptions};
use ferry_testkit::CountingSource;
use ferry_tests::check::{blkhash_file, qemu_img_compare, require_tool};
use ferry_tests::copying;
use ferry_tests::nbd_servers::{NbdServer, QemuNbd};
use ferry_tests::scratch_dir;

const CHUNK: u32 = 256 * 1024;

fn sh(program: &str, args: &[&str]) {
    require_tool(program, "qemu-utils");
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn export(disk: &Path, bitmap: Option<&str>) -> NbdServer {
    NbdServer::qemu_nbd(
        disk,
        &QemuNbd {
            format: Some("qcow2".into()),
            export: "disk".into(),
            bitmap: bitmap.map(Into::into),
            read_only: true,
            ..QemuNbd::default()
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dirty_bitmap_backup_reads_only_dirty_chunks() {
    let dir = scratch_dir();
    let disk = dir.path().join("disk.qcow2");
    sh(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", s(&disk), "32M"],
    );
    for cmd in [
        "write -P 0x11 0 3M",
        "write -P 0x22 10M 2M",
        "write -P 0x33 30M 64k",
    ] {
        sh("qemu-io", &["-f", "qcow2", "-c", cmd, s(&disk)]);
    }
    let repo = Repository::init(
        Arc::new(LocalStore::new(dir.path().join("repo"))),
        InitOptions::new().with_chunk_size(CHUNK),
    )
    .await
    .unwrap();
    let (progress, cancel) = (Progress::new(), CancellationToken::new());

    let first = {
        let server = export(&disk, None);
        let source = copying::source(&server.uri()).await.unwrap();
        backup(
            &repo,
            source,
            &BackupOptions::new("vm/disk"),
            &progress,
            &cancel,
        )
        .await
        .unwrap()
    };

    // Writes after the first backup, tracked by b0: chunks 4, 80 and 81 (256 KiB each).
    sh("qemu-img", &["bitmap", "--add", s(&disk), "b0"]);
    for cmd in ["write -P 0x55 1M 64k", "write -P 0x66 20M 300k"] {
        sh("qemu-io", &["-f", "qcow2", "-c", cmd, s(&disk)]);
    }
    let reference = dir.path().join("reference.raw");
    sh(
        "qemu-img",
        &[
            "convert",
            "-f",
            "qcow2",
            "-O",
            "raw",
            s(&disk),
            s(&reference),
        ],
    );

    let server = export(&disk, Some("b0"));
    let EndpointSpec::Nbd(spec) = EndpointSpec::parse(&server.uri()).unwrap() else {
        panic!("not an NBD URI: {}", server.uri());
    };
    let bitmap = NbdDirtyBitmap::open(&spec, "b0").await.unwrap();
    let (source, read) = CountingSource::wrap(bitmap.source());
    let source: Arc<dyn Source> = source;
    let options = BackupOptions::new("vm/disk").with_changed(Arc::new(bitmap));
    let second = backup(&repo, source, &options, &progress, &cancel)
        .await
        .unwrap();

    assert!(second.full_reason.is_none(), "{:?}", second.full_reason);
    assert_eq!(second.manifest.parent.as_ref(), Some(&first.manifest.id));
    assert_eq!(second.chunks_read, 3, "{second:?}");
    assert_eq!(second.chunks_unread, 128 - 3, "{second:?}");
    let bytes = read.load(Ordering::Relaxed);
    assert!(
        bytes > 0 && bytes <= 3 * u64::from(CHUNK),
        "read {bytes} bytes"
    );
    assert_eq!(second.manifest.chunks_new, 3);
    // The block hash of the whole image, computed without reading the clean chunks.
    assert_eq!(second.manifest.block_hash, Some(blkhash_file(&reference)));

    let out = dir.path().join("restored.raw");
    let target = copying::target(s(&out), second.manifest.image_size)
        .await
        .unwrap();
    restore(
        &repo,
        &second.manifest.id,
        target,
        &RestoreOptions::new(),
        &progress,
        &cancel,
    )
    .await
    .unwrap();
    qemu_img_compare(&reference, &out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bitmap_the_server_does_not_export_is_a_clear_error() {
    let dir = scratch_dir();
    let disk = dir.path().join("disk.qcow2");
    sh("qemu-img", &["create", "-q", "-f", "qcow2", s(&disk), "4M"]);
    let server = export(&disk, None);
    let EndpointSpec::Nbd(spec) = EndpointSpec::parse(&server.uri()).unwrap() else {
        panic!("not an NBD URI");
    };
    let err = NbdDirtyBitmap::open(&spec, "nope").await.unwrap_err();
    assert!(err.to_string().contains("dirty bitmap 'nope'"), "{err}");
}
