//! VHD and VHDX differencing images through the binary: a parent made by `qemu-img
//! convert` from a raw image, children (and a grandchild) written by the specs in
//! `ferry_tests::diff_images` (no installed tool makes differencing images), the image
//! a reader must see computed independently from the parent's raw bytes and the writes.
//! `ferry copy --allow-backing` compared byte for byte with `qemu-img compare` and its
//! sparseness checked; `ferry info` showing the chain; and the refusals: no
//! `--allow-backing`, a parent named with a path, a parent with the wrong id, a loop, a
//! missing parent, each a one-line error and a non-zero exit.

use std::path::{Path, PathBuf};

use ferry_tests::check::{allocated_bytes, assert_allocated_about, qemu_img_compare};
use ferry_tests::diff_images::{
    apply, id, make_vhd_child, make_vhdx_child, vhd_unique_id, vhdx_data_write_guid, DiffSpec,
    Write,
};
use ferry_tests::{ferry, scratch_dir};

use super::vm_formats_cli::{make_raw, s, sh};

const MIB: u64 = 1 << 20;
const SIZE: u64 = 64 * MIB;

/// The two formats: (file extension, what qemu-img makes the parent with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Vhd,
    Vhdx,
}

impl Format {
    fn ext(self) -> &'static str {
        match self {
            Self::Vhd => "vhd",
            Self::Vhdx => "vhdx",
        }
    }

    /// The parent, by qemu-img from `raw` (a VHD of exactly the raw size).
    fn parent(self, dir: &Path, raw: &Path) -> PathBuf {
        let out = dir.join(format!("base.{}", self.ext()));
        let args: &[&str] = match self {
            Self::Vhd => &["-O", "vpc", "-o", "subformat=dynamic,force_size=on"],
            Self::Vhdx => &["-O", "vhdx"],
        };
        let mut all = vec!["convert", "-f", "raw"];
        all.extend(args);
        all.extend([s(raw), s(&out)]);
        sh("qemu-img", &all);
        out
    }

    fn id_of(self, image: &Path) -> [u8; 16] {
        match self {
            Self::Vhd => vhd_unique_id(image).unwrap(),
            Self::Vhdx => vhdx_data_write_guid(image).unwrap(),
        }
    }

    fn child(self, path: &Path, spec: &DiffSpec) {
        match self {
            Self::Vhd => make_vhd_child(path, spec).unwrap(),
            Self::Vhdx => make_vhdx_child(path, spec).unwrap(),
        }
    }
}

fn w(offset: u64, len: u64, byte: u8) -> Write {
    Write { offset, len, byte }
}

/// A child over `parent`: sectors inside parent data, a whole block, a run across two
/// blocks, data where the parent has a hole, the last sector; a VHDX also zeroes block
/// 30 (the parent's data at 60 MiB).
fn child_spec(format: Format, parent: &Path, parent_name: &str) -> DiffSpec {
    DiffSpec {
        size: SIZE,
        parent_name: parent_name.into(),
        parent_id: format.id_of(parent),
        own_id: id(10),
        writes: vec![
            w(4096, 8192, 0x51),
            w(MIB + 512, 512, 0x52),
            w(4 * MIB, 2 * MIB, 0x53),
            w(8 * MIB - 4096, 8192, 0x55),
            w(20 * MIB + 65536, 131_072, 0x54),
            w(SIZE - 512, 512, 0x56),
        ],
        zero_blocks: if format == Format::Vhdx {
            vec![30]
        } else {
            vec![]
        },
    }
}

fn copy(image: &Path, out: &Path, allow: bool) {
    let _ = std::fs::remove_file(out);
    let mut args = vec!["copy"];
    if allow {
        args.push("--allow-backing");
    }
    args.extend([s(image), s(out)]);
    ferry!().run(args).assert_success();
}

fn info_json(image: &Path, allow: bool) -> serde_json::Value {
    let mut args = vec!["info", "--json"];
    if allow {
        args.push("--allow-backing");
    }
    args.push(s(image));
    let run = ferry!().run(args);
    run.assert_success();
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {run}"))
}

fn copy_fails(image: &Path, allow: bool) -> String {
    let out = image.with_extension("fail.raw");
    let _ = std::fs::remove_file(&out);
    let mut args = vec!["copy"];
    if allow {
        args.push("--allow-backing");
    }
    args.extend([s(image), s(&out)]);
    let line = ferry!().run(args).assert_clean_failure().to_owned();
    eprintln!("{line}");
    assert!(!out.exists() || allocated_bytes(&out) == 0, "{line}");
    line
}

/// A child and a grandchild copy as the merged images, sparse, and `ferry info` names
/// the chain.
fn chain_copies(format: Format) {
    let dir = scratch_dir();
    let dir = dir.path().canonicalize().unwrap();
    let ext = format.ext();
    let raw = make_raw(&dir);
    let parent = format.parent(&dir, &raw);
    let child = dir.join(format!("child.{ext}"));
    let spec = child_spec(format, &parent, &format!(".\\base.{ext}"));
    format.child(&child, &spec);
    let want = dir.join("want-child.raw");
    apply(&raw, &spec, &want).unwrap();
    let out = dir.join("out.raw");
    copy(&child, &out, true);
    qemu_img_compare(&want, &out);
    assert_allocated_about(&out, allocated_bytes(&want));

    let grand = dir.join(format!("grand.{ext}"));
    let grand_spec = DiffSpec {
        parent_name: format!("child.{ext}"),
        parent_id: spec.own_id,
        own_id: id(11),
        writes: vec![
            w(8192, 512, 0x61),
            w(2 * MIB, 512, 0x63),
            w(30 * MIB, 4096, 0x62),
        ],
        zero_blocks: vec![],
        ..spec.clone()
    };
    format.child(&grand, &grand_spec);
    let want_grand = dir.join("want-grand.raw");
    apply(&want, &grand_spec, &want_grand).unwrap();
    copy(&grand, &out, true);
    qemu_img_compare(&want_grand, &out);
    assert_allocated_about(&out, allocated_bytes(&want_grand));

    let json = info_json(&grand, true);
    assert_eq!(json["format"], ext, "{json}");
    assert_eq!(json["subformat"], "differencing", "{json}");
    assert_eq!(json["virtual_size"], SIZE, "{json}");
    assert_eq!(
        json["backing_chain"],
        serde_json::json!([format!("child.{ext}"), format!("base.{ext}")]),
        "{json}"
    );
    // Without --allow-backing: the parent's name, and only the image's own allocation.
    let json = info_json(&child, false);
    assert_eq!(
        json["backing_chain"],
        serde_json::json!([format!("base.{ext}")]),
        "{json}"
    );
    let own = json["allocated_bytes"].as_u64().unwrap();
    assert!(own > 0 && own < 8 * MIB, "{json}");
    let run = ferry!().run(["info", s(&grand), "--allow-backing"]);
    run.assert_success();
    assert!(
        run.stdout
            .contains(&format!("backing chain: child.{ext} -> base.{ext}")),
        "{run}"
    );
}

#[test]
fn a_differencing_vhd_chain_copies_as_the_merged_image() {
    chain_copies(Format::Vhd);
}

#[test]
fn a_differencing_vhdx_chain_copies_as_the_merged_image() {
    chain_copies(Format::Vhdx);
}

/// Every refusal: each a one-line error naming what is wrong.
fn refusals(format: Format) {
    let dir = scratch_dir();
    let dir = dir.path().canonicalize().unwrap();
    let ext = format.ext();
    let raw = make_raw(&dir);
    let parent = format.parent(&dir, &raw);
    let good = child_spec(format, &parent, &format!("base.{ext}"));
    let make = |name: &str, spec: DiffSpec| {
        let path = dir.join(format!("{name}.{ext}"));
        format.child(&path, &spec);
        path
    };

    let child = make("child", good.clone());
    let line = copy_fails(&child, false);
    assert!(
        line.contains("--allow-backing") && line.contains(&format!("base.{ext}")),
        "{line}"
    );

    let pathy = make(
        "pathy",
        DiffSpec {
            parent_name: format!("..\\disks\\base.{ext}"),
            ..good.clone()
        },
    );
    let line = copy_fails(&pathy, true);
    assert!(line.contains("beside") && line.contains("disks"), "{line}");

    let wrong = make(
        "wrong",
        DiffSpec {
            parent_id: id(99),
            ..good.clone()
        },
    );
    let line = copy_fails(&wrong, true);
    assert!(
        line.contains("is not the image this differencing") && line.contains("base."),
        "{line}"
    );

    let missing = make(
        "missing",
        DiffSpec {
            parent_name: format!("gone.{ext}"),
            ..good.clone()
        },
    );
    let line = copy_fails(&missing, true);
    assert!(line.contains(&format!("gone.{ext}")), "{line}");

    // a -> b -> a.
    let a = make(
        "a",
        DiffSpec {
            parent_name: format!("b.{ext}"),
            parent_id: id(2),
            own_id: id(1),
            ..good.clone()
        },
    );
    make(
        "b",
        DiffSpec {
            parent_name: format!("a.{ext}"),
            parent_id: id(1),
            own_id: id(2),
            ..good.clone()
        },
    );
    let line = copy_fails(&a, true);
    assert!(line.contains("loops back"), "{line}");

    // The good child still copies: the refusals were the images', not the setup's.
    let out = dir.join("out.raw");
    copy(&child, &out, true);
    let want = dir.join("want.raw");
    apply(&raw, &good, &want).unwrap();
    qemu_img_compare(&want, &out);
}

#[test]
fn differencing_vhd_refusals_are_clear() {
    refusals(Format::Vhd);
}

#[test]
fn differencing_vhdx_refusals_are_clear() {
    refusals(Format::Vhdx);
}
