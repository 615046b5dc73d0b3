use super::*;
use crate::open::open_image;
use crate::tar::tests::archive;
use ferry_testkit::MemSource;
use std::io::Write;

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn layer_options(kind: Detected) -> OpenOptions {
    OpenOptions {
        container_layer: Some(kind),
        ..OpenOptions::default()
    }
}

async fn read_all(image: &dyn Source) -> Result<Vec<u8>> {
    let buf = image.read_at(0, IoBuf::new(image.size() as usize)).await?;
    Ok(buf.to_vec())
}

#[tokio::test]
async fn finds_the_disk_in_plain_and_gzip_layers() {
    let disk: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let tar = archive(&[("etc/hostname", b"x"), ("disk/disk.img", &disk)]);
    for (bytes, kind) in [(tar.clone(), Detected::Raw), (gzip(&tar), Detected::Gzip)] {
        let bytes: Vec<u8> = bytes;
        let (image, info) = open_image(Arc::new(MemSource::new(bytes)), &layer_options(kind))
            .await
            .unwrap();
        assert_eq!(info.layer_file.as_deref(), Some("disk/disk.img"));
        assert_eq!(info.format, Detected::Raw);
        assert_eq!(read_all(image.as_ref()).await.unwrap(), disk);
        image.finish().await.unwrap();
    }
}

#[tokio::test]
async fn a_lying_header_a_bomb_and_no_disk_fail_clearly() {
    let disk = vec![5u8; 4096];
    // The header says 8192 bytes, the stream holds 4096 and the end blocks.
    let mut tar = archive(&[("disk/disk.img", &disk)]);
    tar.truncate(512 + 4096);
    let mut h = crate::tar::tests::header("disk/disk.img", 8192);
    tar[..512].copy_from_slice(&h);
    let (image, _) = open_image(
        Arc::new(MemSource::new(gzip(&tar))),
        &layer_options(Detected::Gzip),
    )
    .await
    .unwrap();
    let err = read_all(image.as_ref()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");

    // Zeroes far past the archive's end: a bomb.
    let mut bomb = archive(&[("disk/disk.img", &disk)]);
    bomb.extend(vec![0u8; 3 << 20]);
    let (image, _) = open_image(
        Arc::new(MemSource::new(gzip(&bomb))),
        &layer_options(Detected::Gzip),
    )
    .await
    .unwrap();
    read_all(image.as_ref()).await.unwrap();
    let err = image.finish().await.unwrap_err();
    assert!(err.to_string().contains("decompression bomb"), "{err}");

    let none = archive(&[("etc/a", b"1"), ("etc/b", b"2")]);
    let err = open_image(
        Arc::new(MemSource::new(gzip(&none))),
        &layer_options(Detected::Gzip),
    )
    .await
    .err()
    .unwrap();
    assert!(err.to_string().contains("no disk"), "{err}");
    h[0] ^= 1;
    assert!(parse_header(&h).is_err());
}
