//! The registry fuzz targets: `registry_manifest` drives every parser of what a registry
//! or its token service sends (manifests and indexes with platform picking, the
//! `WWW-Authenticate` challenge, the token reply) and of a docker config.json;
//! `container_layer` opens arbitrary bytes as a containerDisk layer (a plain or gzip tar
//! streamed, the disk found and read, the rest of the layer checked).

use std::sync::Arc;

use ferry_core::Source;
use ferry_formats::{open_image, Detected, OpenOptions};
use ferry_registry::{auth, manifest};
use ferry_testkit::MemSource;

use crate::formats::{exercise, runtime};

/// The first byte picks a parser; the rest is its input.
pub fn registry_manifest(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 | 1 => {
            let content_type = (which & 4 != 0).then_some(manifest::OCI_INDEX);
            if let Ok(manifest::Document::Index(entries)) = manifest::parse(rest, content_type) {
                assert!(entries.len() <= manifest::MAX_INDEX_ENTRIES);
                let _ = manifest::pick(&entries, &manifest::Platform::default());
            } else if let Ok(manifest::Document::Manifest(layers)) = manifest::parse(rest, None) {
                assert!(layers.len() <= manifest::MAX_LAYERS);
                let _ = manifest::disk_layer(&layers);
            }
        }
        2 => {
            let text = String::from_utf8_lossy(rest);
            let _ = auth::parse_challenge(&text);
            let _ = text.parse::<manifest::Platform>();
        }
        _ => {
            let _ = auth::parse_token_reply(rest);
            let _ = auth::DockerConfig::parse(rest);
        }
    }
}

/// The input after its first byte as a layer: bit 0 says gzip (streamed; else a plain
/// tar, listed by offsets).
pub fn container_layer(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let kind = if mode & 1 != 0 {
        Detected::Gzip
    } else {
        Detected::Raw
    };
    let Some(rt) = runtime() else { return };
    rt.block_on(async {
        let bytes: Arc<dyn Source> = Arc::new(MemSource::new(rest.to_vec()));
        let options = OpenOptions {
            container_layer: Some(kind),
            ..OpenOptions::default()
        };
        if let Ok((image, _)) = open_image(bytes, &options).await {
            exercise(image.as_ref()).await;
            let _ = image.finish().await;
        }
    });
}
