//! Makes a seeded test image: `ferry-mkimage PATTERN SIZE PATH [SEED]`, where PATTERN is
//! empty, half (50% data in scattered 1 MiB runs with zero 4 KiB blocks inside) or random.
//! The benchmark harness uses it so that benchmarks and tests share one image generator.
//!
//! `ferry-mkimage differencing vhd|vhdx PARENT CHILD STEP LEN` writes a differencing child
//! of PARENT (named beside it by its file name) holding LEN bytes every STEP bytes
//! (`ferry_tests::diff_images`: no installed tool makes differencing images).

use std::path::PathBuf;
use std::process::ExitCode;

use ferry_core::size::parse_size;
use ferry_tests::images::{make, Pattern};

const USAGE: &str = "usage: ferry-mkimage empty|half|random SIZE PATH [SEED]\n       \
    ferry-mkimage differencing vhd|vhdx PARENT CHILD STEP LEN";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("ferry-mkimage: {message}");
            ExitCode::FAILURE
        }
    }
}

fn differencing(args: &[String]) -> Result<(), String> {
    use ferry_tests::diff_images::{self, DiffSpec, Write};
    let [format, parent, child, step, len] = args else {
        return Err(USAGE.to_string());
    };
    let size_of = |t: &str| parse_size(t).map_err(|e| e.to_string());
    let (parent, child) = (PathBuf::from(parent), PathBuf::from(child));
    let (step, len) = (size_of(step)?, size_of(len)?);
    let err = |e: std::io::Error| format!("{}: {e}", parent.display());
    let parent_id = match format.as_str() {
        "vhd" => diff_images::vhd_unique_id(&parent).map_err(err)?,
        "vhdx" => diff_images::vhdx_data_write_guid(&parent).map_err(err)?,
        other => {
            return Err(format!(
                "unknown differencing format {other:?}: vhd or vhdx"
            ))
        }
    };
    if step == 0 || len > step || step % 512 != 0 || len % 512 != 0 {
        return Err("STEP and LEN must be multiples of 512, LEN at most STEP".into());
    }
    let size = virtual_size(&parent)?;
    let spec = DiffSpec {
        size,
        parent_name: parent
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or("the parent needs a file name")?
            .to_owned(),
        parent_id,
        own_id: diff_images::id(1),
        writes: (0..size / step)
            .map(|i| Write {
                offset: i * step,
                len,
                byte: (i % 251) as u8 + 1,
            })
            .collect(),
        zero_blocks: Vec::new(),
    };
    let made = match format.as_str() {
        "vhd" => diff_images::make_vhd_child(&child, &spec),
        _ => diff_images::make_vhdx_child(&child, &spec),
    };
    made.map_err(|e| format!("{}: {e}", child.display()))?;
    println!(
        "{} differencing {format} size={size} written={}",
        child.display(),
        spec.writes.len() as u64 * len
    );
    Ok(())
}

/// An image's virtual size, as `qemu-img info` tells it.
fn virtual_size(path: &std::path::Path) -> Result<u64, String> {
    let out = std::process::Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(path)
        .output()
        .map_err(|e| format!("qemu-img: {e}"))?;
    let info: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("qemu-img info: {e}"))?;
    info["virtual-size"]
        .as_u64()
        .ok_or_else(|| "qemu-img info gave no virtual-size".to_string())
}

fn run(args: Vec<String>) -> Result<(), String> {
    if args.first().map(String::as_str) == Some("differencing") {
        return differencing(&args[1..]);
    }
    let [pattern, size, path, rest @ ..] = args.as_slice() else {
        return Err(USAGE.to_string());
    };
    let pattern: Pattern = pattern.parse()?;
    let size = parse_size(size).map_err(|e| e.to_string())?;
    let seed = match rest {
        [] => 1,
        [seed] => seed
            .parse()
            .map_err(|_| format!("invalid seed '{seed}': expected a number"))?,
        _ => return Err(USAGE.to_string()),
    };
    let path = PathBuf::from(path);
    let image = make(&path, pattern, size, seed).map_err(|e| format!("{}: {e}", path.display()))?;
    println!(
        "{} {:?} size={} nonzero_block_bytes={} written={}",
        path.display(),
        pattern,
        image.size,
        image.nonzero_block_bytes,
        image.written_bytes
    );
    Ok(())
}
