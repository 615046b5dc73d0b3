//! Manifests and image indexes (OCI and Docker v2 schema 2), parsed with bounds: the
//! document's size, the number of index entries and of layers, and every descriptor's
//! digest and size are checked before anything is fetched with them.

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;

use crate::{Digest, Error, ErrorKind, Result};

/// Largest manifest or index read (the distribution spec's registries accept 4 MiB).
pub const MAX_MANIFEST: usize = 4 << 20;
/// Most entries in an index.
pub const MAX_INDEX_ENTRIES: usize = 1024;
/// Most layers in a manifest.
pub const MAX_LAYERS: usize = 256;

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// The Accept header of a manifest request: every kind this client reads.
pub const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// An image's platform: `os/architecture[/variant]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl Default for Platform {
    /// linux/amd64, as CDI and kubelet pick on x86.
    fn default() -> Self {
        Self {
            os: "linux".into(),
            architecture: "amd64".into(),
            variant: None,
        }
    }
}

impl FromStr for Platform {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let parts: Vec<&str> = text.split('/').collect();
        let ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 32
                && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        };
        match parts.as_slice() {
            [os, arch] if ok(os) && ok(arch) => Ok(Self {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: None,
            }),
            [os, arch, variant] if ok(os) && ok(arch) && ok(variant) => Ok(Self {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: Some(variant.to_string()),
            }),
            _ => Err(Error::invalid(format!(
                "platform {:?}: expected OS/ARCHITECTURE[/VARIANT], as linux/amd64 or linux/arm64/v8",
                crate::digest::clip(text)
            ))),
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// How a layer's tar is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Gzip => "gzip",
            Self::Zstd => "zstd",
        }
    }

    fn of_media_type(media_type: &str) -> Option<Self> {
        match media_type {
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar"
            | "application/vnd.docker.image.rootfs.diff.tar" => Some(Self::None),
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Some(Self::Gzip),
            "application/vnd.oci.image.layer.v1.tar+zstd"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => Some(Self::Zstd),
            _ => None,
        }
    }
}

/// A layer to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    pub digest: Digest,
    pub size: u64,
    pub media_type: String,
    pub compression: Compression,
}

/// One platform's manifest in an index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub digest: Digest,
    pub size: u64,
    pub platform: Option<Platform>,
}

/// A parsed manifest document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Document {
    Index(Vec<IndexEntry>),
    Manifest(Vec<Layer>),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDoc {
    #[serde(default)]
    schema_version: Option<u32>,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<Vec<RawDescriptor>>,
    #[serde(default)]
    layers: Option<Vec<RawDescriptor>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDescriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    size: i64,
    #[serde(default)]
    platform: Option<RawPlatform>,
}

#[derive(Deserialize)]
struct RawPlatform {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    variant: Option<String>,
}

fn size_of(d: &RawDescriptor) -> Result<u64> {
    u64::try_from(d.size).map_err(|_| {
        Error::protocol(format!(
            "descriptor {} has a negative size",
            crate::digest::clip(&d.digest)
        ))
    })
}

/// Parses a manifest or an index. `content_type` is the response's Content-Type (used
/// when the document names no mediaType).
pub fn parse(body: &[u8], content_type: Option<&str>) -> Result<Document> {
    if body.len() > MAX_MANIFEST {
        return Err(Error::protocol(format!(
            "the manifest is larger than {MAX_MANIFEST} bytes"
        )));
    }
    let raw: RawDoc = serde_json::from_slice(body)
        .map_err(|e| Error::protocol(format!("the manifest is not valid JSON: {e}")))?;
    if raw.schema_version.is_some_and(|v| v != 2) {
        return Err(Error::new(
            ErrorKind::Unsupported,
            "the manifest is not schema version 2 (Docker v2 schema 1 images are not read)",
        ));
    }
    let media_type = raw
        .media_type
        .as_deref()
        .or(content_type.map(|c| c.split(';').next().unwrap_or(c).trim()))
        .unwrap_or("");
    let is_index = match media_type {
        OCI_INDEX | DOCKER_LIST => true,
        OCI_MANIFEST | DOCKER_MANIFEST => false,
        _ => raw.manifests.is_some() && raw.layers.is_none(),
    };
    if is_index {
        let entries = raw
            .manifests
            .ok_or_else(|| Error::protocol("the image index has no manifests"))?;
        if entries.len() > MAX_INDEX_ENTRIES {
            return Err(Error::protocol(format!(
                "the image index has more than {MAX_INDEX_ENTRIES} manifests"
            )));
        }
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let size = size_of(&e)?;
            if size > MAX_MANIFEST as u64 {
                continue;
            }
            out.push(IndexEntry {
                digest: Digest::parse(&e.digest)?,
                size,
                platform: e.platform.map(|p| Platform {
                    os: p.os,
                    architecture: p.architecture,
                    variant: p.variant.filter(|v| !v.is_empty()),
                }),
            });
        }
        return Ok(Document::Index(out));
    }
    let layers = raw
        .layers
        .ok_or_else(|| Error::protocol("the manifest has no layers"))?;
    if layers.len() > MAX_LAYERS {
        return Err(Error::protocol(format!(
            "the manifest has more than {MAX_LAYERS} layers"
        )));
    }
    let mut out = Vec::with_capacity(layers.len());
    for l in layers {
        let compression = Compression::of_media_type(&l.media_type).ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                format!(
                    "layer media type {:?} is not a tar (plain, gzip or zstd)",
                    crate::digest::clip(&l.media_type)
                ),
            )
        })?;
        out.push(Layer {
            size: size_of(&l)?,
            digest: Digest::parse(&l.digest)?,
            media_type: l.media_type,
            compression,
        });
    }
    Ok(Document::Manifest(out))
}

/// The index entry for `want`: an exact match, or for a variant-less request the entry
/// of that os/architecture (arm64's `v8` variant is the default one).
pub fn pick<'a>(entries: &'a [IndexEntry], want: &Platform) -> Result<&'a IndexEntry> {
    let matches = |e: &&IndexEntry, exact: bool| {
        e.platform.as_ref().is_some_and(|p| {
            p.os == want.os
                && p.architecture == want.architecture
                && (if exact {
                    p.variant == want.variant
                } else {
                    want.variant.is_none()
                })
        })
    };
    entries
        .iter()
        .find(|e| matches(e, true))
        .or_else(|| entries.iter().find(|e| matches(e, false)))
        .ok_or_else(|| {
            let have: Vec<String> = entries
                .iter()
                .filter_map(|e| e.platform.as_ref().map(ToString::to_string))
                .collect();
            Error::new(
                ErrorKind::NotFound,
                format!(
                    "the image index has no {want} image (it has {}); choose one with --platform",
                    if have.is_empty() {
                        "none with a platform".to_string()
                    } else {
                        have.join(", ")
                    }
                ),
            )
        })
}

/// The layer that holds the disk: the only one, or the largest (a containerDisk's disk
/// dwarfs anything a base layer adds).
pub fn disk_layer(layers: &[Layer]) -> Result<&Layer> {
    layers
        .iter()
        .max_by_key(|l| l.size)
        .ok_or_else(|| Error::protocol("the manifest has no layers"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    #[test]
    fn manifests_and_indexes() {
        let m = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"x","digest":"{}","size":2}},
            "layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+zstd","digest":"{}","size":100}}]}}"#,
            d('a'),
            d('b')
        );
        let Document::Manifest(layers) = parse(m.as_bytes(), None).unwrap() else {
            panic!()
        };
        assert_eq!(disk_layer(&layers).unwrap().compression, Compression::Zstd);
        let i = format!(
            r#"{{"schemaVersion":2,"manifests":[
            {{"mediaType":"{OCI_MANIFEST}","digest":"{}","size":500,"platform":{{"os":"linux","architecture":"arm64","variant":"v8"}}}},
            {{"mediaType":"{OCI_MANIFEST}","digest":"{}","size":500,"platform":{{"os":"linux","architecture":"amd64"}}}}]}}"#,
            d('c'),
            d('e')
        );
        let Document::Index(entries) = parse(i.as_bytes(), Some(OCI_INDEX)).unwrap() else {
            panic!()
        };
        assert_eq!(
            pick(&entries, &Platform::default())
                .unwrap()
                .digest
                .to_string(),
            d('e')
        );
        let arm: Platform = "linux/arm64".parse().unwrap();
        assert_eq!(pick(&entries, &arm).unwrap().digest.to_string(), d('c'));
        let err = pick(&entries, &"linux/s390x".parse().unwrap()).unwrap_err();
        assert!(
            err.message().contains("linux/arm64/v8, linux/amd64"),
            "{err}"
        );
        assert!("linux".parse::<Platform>().is_err());
        assert!(parse(br#"{"schemaVersion":1}"#, None).is_err());
        assert!(parse(b"[", None).is_err());
        let bad = format!(
            r#"{{"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{}","size":-1}}]}}"#,
            d('a')
        );
        assert!(parse(bad.as_bytes(), None).is_err());
    }
}
