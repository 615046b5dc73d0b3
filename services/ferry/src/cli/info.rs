//! `ferry info URL [--json]`: what an image is, like `qemu-img info`: its format (and
//! subformat: a VMDK's createType, VHD fixed or dynamic, ...), virtual size, file size
//! (the compressed size of a .gz, .xz or .zst image), cluster size, allocated bytes (the
//! sum of its data extents), backing chain and compression type; for an OVA, its disks.
//!
//! Without `--allow-backing` the backing chain shows the name the image gives and the
//! allocated bytes are the image's own; with it, the whole chain is opened and counted.
//!
//! For an HTTP(S) source it also tells whether a copy can pin the object's version (the
//! server sends a strong ETag or a Last-Modified), and says so when it cannot.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use ferry_core::size::format_size;
use ferry_core::{EndpointSpec, ExtentKind, Result, Source};
use ferry_endpoints::http::HttpSource;
use ferry_endpoints::registry::RegistryInfo;
use ferry_endpoints::SourceOptions;
use ferry_formats::{Backing, ImageInfo, OpenOptions};

use super::image::{self, FormatArgs};

/// Arguments of `ferry info`.
#[derive(Debug, Clone, Args)]
#[command(after_help = super::HTTP_SOURCE_HELP)]
pub struct InfoArgs {
    /// The image: a path or URL.
    #[arg(value_name = "URL")]
    pub url: String,
    #[command(flatten)]
    pub format: FormatArgs,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Runs `ferry info`.
pub async fn run(args: InfoArgs) -> anyhow::Result<ExitCode> {
    super::init_tracing();
    let spec = EndpointSpec::parse(&args.url).map_err(|e| super::failed(e, "invalid image"))?;
    let name = spec.to_string();
    let mut source_options = super::source_options_from_env()?;
    args.format
        .apply_platform(&mut source_options)
        .map_err(|e| super::failed(e, "invalid --platform"))?;
    let mut options = args.format.open_options(&source_options);
    if !args.format.allow_backing {
        options.backing = Backing::NameOnly;
    }
    let (image, info, version, registry) = open(&spec, &source_options, &options)
        .await
        .map_err(|e| super::named(e, &name, "cannot open the image"))?;
    let allocated = allocated_bytes(image.as_ref())
        .await
        .map_err(|e| super::named(e, &name, "cannot map the image"));
    let _ = image.close().await;
    let allocated = allocated?;
    // A stream whose size shows only at its end has no extents to count before it is read.
    let allocated = info.size_known().then_some(allocated);
    if args.json {
        let mut json = to_json(&name, &info, allocated, version.as_ref());
        if let Some(r) = &registry {
            add_registry_json(&mut json, r, &info);
        }
        println!("{json}");
    } else {
        let mut text = to_text(&name, &info, allocated, version.as_ref());
        if let Some(r) = &registry {
            text += &registry_text(r, &info);
        }
        print!("{text}");
    }
    Ok(ExitCode::SUCCESS)
}

/// What an HTTP(S) source says about the object's version.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HttpVersion {
    /// The validator requests are pinned with ("ETag \"abc\""), if any.
    pinned: Option<String>,
    /// Why a change during a copy would go unnoticed, when nothing pins the version.
    warning: Option<String>,
}

/// What `open` found: the image, its info, an HTTP source's version, a registry image's
/// digest and layer.
type Opened = (
    Arc<dyn Source>,
    ImageInfo,
    Option<HttpVersion>,
    Option<RegistryInfo>,
);

/// Opens the image; an HTTP(S) source also tells how its version is pinned, a registry
/// image its digest, platform and layer.
async fn open(
    spec: &EndpointSpec,
    source: &SourceOptions,
    options: &OpenOptions,
) -> Result<Opened> {
    if let EndpointSpec::Registry(registry) = spec {
        let (image, info, found) = image::open_registry(registry, source, options).await?;
        return Ok((image, info, None, Some(found)));
    }
    let EndpointSpec::Http(http) = spec else {
        let (image, info) = image::open(spec, source, options).await?;
        return Ok((image, info, None, None));
    };
    let bytes = HttpSource::open(http, &source.http).await?;
    let version = HttpVersion {
        pinned: bytes.validator().map(ToString::to_string),
        warning: bytes.version_warning(),
    };
    let (image, info) = ferry_formats::open_image(Arc::new(bytes), options).await?;
    Ok((image, info, Some(version), None))
}

/// The registry lines of `ferry info`: what was pinned and read.
fn registry_text(r: &RegistryInfo, info: &ImageInfo) -> String {
    let mut out = format!(
        "digest: {}
",
        r.digest
    );
    if let Some(p) = &r.platform {
        out += &format!(
            "platform: {p} (manifest {})
",
            r.manifest
        );
    }
    out += &format!(
        "layer: {} ({}, {} bytes, {} of {} layers)
",
        r.layer,
        r.compression,
        r.layer_size,
        if r.ranges {
            "read by ranges"
        } else {
            "streamed"
        },
        r.layers
    );
    if let Some(file) = &info.layer_file {
        out += &format!(
            "disk file: {file} ({})
",
            info.format
        );
    }
    out += &format!(
        "pinned: {}
",
        r.pinned
    );
    out
}

fn add_registry_json(json: &mut serde_json::Value, r: &RegistryInfo, info: &ImageInfo) {
    json["registry"] = serde_json::json!({
        "digest": r.digest,
        "pinned": r.pinned,
        "platform": r.platform,
        "manifest": r.manifest,
        "layer": r.layer,
        "layer_size": r.layer_size,
        "layer_media_type": r.media_type,
        "layer_compression": r.compression,
        "layers": r.layers,
        "ranges": r.ranges,
        "disk_file": info.layer_file,
    });
}

/// The sum of the image's data extents.
async fn allocated_bytes(image: &dyn Source) -> Result<u64> {
    let (mut offset, mut data) = (0u64, 0u64);
    if !image.size_known() {
        return Ok(0);
    }
    while offset < image.size() {
        let extents = image.extents(offset, image.size() - offset).await?;
        let before = offset;
        for e in extents {
            if e.offset != offset {
                break;
            }
            if e.kind == ExtentKind::Data {
                data += e.len;
            }
            offset = e.end();
        }
        if offset == before {
            return Err(ferry_core::Error::internal("the image reported no extent"));
        }
    }
    Ok(data)
}

fn to_text(
    name: &str,
    info: &ImageInfo,
    allocated: Option<u64>,
    http: Option<&HttpVersion>,
) -> String {
    let sized = |n: u64| format!("{} ({n} bytes)", format_size(n));
    let mut out = format!("image: {name}\nfile format: {}\n", info.format);
    if info.size_known() {
        out += &format!("virtual size: {}\n", sized(info.virtual_size));
    } else {
        out += "virtual size: not known until the stream is read (the stream does not record \
                it; a copy learns it at the end, --prescan counts it first)\n";
    }
    if info.file_size == ferry_core::UNKNOWN_SIZE {
        out += "file size: not known (the server does not tell it)\n";
    } else {
        out += &format!("file size: {}\n", sized(info.file_size));
    }
    if let Some(allocated) = allocated {
        out += &format!("allocated: {}\n", sized(allocated));
    }
    if let Some(subformat) = &info.subformat {
        out += &format!("subformat: {subformat}\n");
    }
    for (i, disk) in info.disks.iter().enumerate() {
        let chosen = if info.disk == Some(i) { " (read)" } else { "" };
        out += &format!("disk {i}: {} ({}){chosen}\n", disk.name, sized(disk.size));
    }
    if let Some(cluster) = info.cluster_size {
        out += &format!("cluster_size: {cluster}\n");
    }
    if let Some(version) = info.version {
        out += &format!("qcow2 version: {version}\n");
        out += &format!("extended l2: {}\n", info.extended_l2);
    }
    if let Some(compression) = info.compression {
        out += &format!("compression type: {compression}\n");
    }
    if let Some(frames) = info.parallel_frames {
        out += &format!("independent frames: {frames} (decompressed in parallel)\n");
    }
    if let Some(first) = info.backing_chain.first() {
        out += &format!("backing file: {first}\n");
        out += &format!("backing chain: {}\n", info.backing_chain.join(" -> "));
    }
    if let Some(http) = http {
        match (&http.pinned, &http.warning) {
            (Some(pinned), _) => out += &format!("version pinned: yes ({pinned})\n"),
            (None, Some(warning)) => out += &format!("version pinned: no ({warning})\n"),
            (None, None) => out += "version pinned: no\n",
        }
    }
    out
}

fn to_json(
    name: &str,
    info: &ImageInfo,
    allocated: Option<u64>,
    http: Option<&HttpVersion>,
) -> serde_json::Value {
    serde_json::json!({
        "image": name,
        "format": info.format.as_str(),
        // null for a stream whose size shows only at its end.
        "virtual_size": info.size_known().then_some(info.virtual_size),
        "file_size": (info.file_size != ferry_core::UNKNOWN_SIZE).then_some(info.file_size),
        "allocated_bytes": allocated,
        "cluster_size": info.cluster_size,
        "qcow2_version": info.version,
        "extended_l2": info.extended_l2,
        "compression_type": info.compression,
        "backing_chain": info.backing_chain,
        "parallel_frames": info.parallel_frames,
        "subformat": info.subformat,
        // OVA only: its disks and the one read.
        "disks": info.disks.iter().map(|d| serde_json::json!({"name": d.name, "file_size": d.size})).collect::<Vec<_>>(),
        "disk": info.disk,
        // HTTP(S) sources only (null otherwise).
        "version_pinned": http.map(|h| h.pinned.is_some()),
        "version": http.and_then(|h| h.pinned.clone()),
        "version_warning": http.and_then(|h| h.warning.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_formats::Detected;

    fn qcow2_info() -> ImageInfo {
        ImageInfo {
            cluster_size: Some(65536),
            version: Some(3),
            compression: Some("zlib"),
            backing_chain: vec!["base.qcow2".into(), "root.raw".into()],
            ..ImageInfo::plain(Detected::Qcow2, 1 << 30, 200_704)
        }
    }

    #[test]
    fn a_compressed_image_shows_its_format_and_both_sizes() {
        let info = ImageInfo {
            parallel_frames: Some(128),
            ..ImageInfo::plain(Detected::Zstd, 1 << 30, 1 << 20)
        };
        let text = to_text("/i/disk.raw.zst", &info, Some(1 << 30), None);
        assert!(text.contains("file format: zst\n"), "{text}");
        assert!(
            text.contains("virtual size: 1.00 GiB (1073741824 bytes)\n"),
            "{text}"
        );
        assert!(
            text.contains("file size: 1.00 MiB (1048576 bytes)\n"),
            "{text}"
        );
        assert!(text.contains("independent frames: 128"), "{text}");
        let json = to_json("/i/disk.raw.zst", &info, Some(1 << 30), None);
        assert_eq!(json["format"], "zst");
        assert_eq!(json["file_size"], 1u64 << 20);
        assert_eq!(json["parallel_frames"], 128);
    }

    #[test]
    fn text_names_each_field() {
        let text = to_text("/i/top.qcow2", &qcow2_info(), Some(65536), None);
        assert!(text.contains("file format: qcow2\n"), "{text}");
        assert!(
            text.contains("virtual size: 1.00 GiB (1073741824 bytes)\n"),
            "{text}"
        );
        assert!(
            text.contains("allocated: 64.00 KiB (65536 bytes)\n"),
            "{text}"
        );
        assert!(text.contains("cluster_size: 65536\n"), "{text}");
        assert!(text.contains("compression type: zlib\n"), "{text}");
        assert!(
            text.contains("backing chain: base.qcow2 -> root.raw\n"),
            "{text}"
        );
    }

    #[test]
    fn json_has_every_field() {
        let json = to_json("/i/top.qcow2", &qcow2_info(), Some(65536), None);
        assert_eq!(json["format"], "qcow2");
        assert_eq!(json["virtual_size"], 1u64 << 30);
        assert_eq!(json["allocated_bytes"], 65536);
        assert_eq!(json["cluster_size"], 65536);
        assert_eq!(json["compression_type"], "zlib");
        assert_eq!(json["backing_chain"][1], "root.raw");
        assert!(json["version_pinned"].is_null());
    }

    #[test]
    fn an_ova_lists_its_disks() {
        let info = ImageInfo {
            subformat: Some("vmdk streamOptimized".into()),
            disks: vec![
                ferry_formats::OvaDisk {
                    name: "a.vmdk".into(),
                    size: 1024,
                },
                ferry_formats::OvaDisk {
                    name: "b.vmdk".into(),
                    size: 2048,
                },
            ],
            disk: Some(1),
            ..ImageInfo::plain(Detected::Ova, 1 << 20, 4096)
        };
        let text = to_text("/i/vm.ova", &info, Some(0), None);
        assert!(text.contains("file format: ova\n"), "{text}");
        assert!(text.contains("subformat: vmdk streamOptimized\n"), "{text}");
        assert!(
            text.contains("disk 1: b.vmdk (2.00 KiB (2048 bytes)) (read)\n"),
            "{text}"
        );
        let json = to_json("/i/vm.ova", &info, Some(0), None);
        assert_eq!(json["format"], "ova");
        assert_eq!(json["disks"][0]["name"], "a.vmdk");
        assert_eq!(json["disk"], 1);
    }

    #[test]
    fn an_http_source_tells_whether_its_version_is_pinned() {
        let raw = ImageInfo::plain(Detected::Raw, 4096, 4096);
        let pinned = HttpVersion {
            pinned: Some("ETag \"v1\"".into()),
            warning: None,
        };
        let json = to_json("http://h/d.img", &raw, Some(4096), Some(&pinned));
        assert_eq!(json["version_pinned"], true);
        assert_eq!(json["version"], "ETag \"v1\"");
        let text = to_text("http://h/d.img", &raw, Some(4096), Some(&pinned));
        assert!(
            text.contains("version pinned: yes (ETag \"v1\")\n"),
            "{text}"
        );
        let loose = HttpVersion {
            pinned: None,
            warning: Some("http://h/d.img sends no ETag or Last-Modified: ...".into()),
        };
        let json = to_json("http://h/d.img", &raw, Some(4096), Some(&loose));
        assert_eq!(json["version_pinned"], false);
        assert!(json["version_warning"]
            .as_str()
            .unwrap()
            .contains("no ETag"));
        let text = to_text("http://h/d.img", &raw, Some(4096), Some(&loose));
        assert!(
            text.contains("version pinned: no (http://h/d.img sends no ETag"),
            "{text}"
        );
    }
}
