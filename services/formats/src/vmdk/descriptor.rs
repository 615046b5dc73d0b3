//! The VMDK text descriptor: `createType` and the extent lines that say which files hold
//! the disk.
//!
//! A descriptor is untrusted text: it is bounded ([`MAX_DESCRIPTOR`], [`MAX_EXTENTS`]),
//! and an extent's file name must be a plain name beside the descriptor (no `/`, no
//! `..`), so a descriptor cannot make ferry read files elsewhere.

use ferry_core::{Error, Result};

use crate::mapped::corrupt;

/// Longest descriptor read.
pub const MAX_DESCRIPTOR: u64 = 1 << 20;
/// Most extents accepted (a 2 TiB twoGbMaxExtent disk has about 1000).
pub const MAX_EXTENTS: usize = 4096;

/// How an extent stores its sectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentKind {
    /// Raw sectors at an offset of the file.
    Flat,
    /// A hosted sparse extent (its own KDMV header).
    Sparse,
    /// No file: reads as zeroes.
    Zero,
}

/// One extent line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtentLine {
    pub sectors: u64,
    pub kind: ExtentKind,
    pub file: Option<String>,
    /// Sectors into the file (flat extents).
    pub offset: u64,
}

/// A parsed descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub create_type: String,
    pub extents: Vec<ExtentLine>,
}

/// Whether `head` starts like a descriptor file.
pub fn looks_like_descriptor(head: &[u8]) -> bool {
    head.starts_with(b"# Disk DescriptorFile")
}

/// Checks that an extent file name names a file beside the descriptor.
pub fn check_extent_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.contains('/')
        || name.contains('\\')
        || name.contains('\0')
        || name == "."
        || name.contains("..")
    {
        return Err(Error::invalid_input(format!(
            "the VMDK descriptor names the extent file {name:?}: only files beside the \
             descriptor are read (no '/', no '..')"
        )));
    }
    Ok(())
}

/// What a sparse extent's embedded descriptor says: its createType, and refuses a
/// parent (a snapshot delta read alone would silently lack its parent's data).
pub fn embedded(text: &[u8]) -> Result<Option<String>> {
    let text = String::from_utf8_lossy(text);
    let mut create_type = None;
    for line in text.trim_end_matches('\0').lines().map(str::trim) {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim().trim_matches('"');
        match key.trim() {
            "createType" => create_type = Some(value.to_owned()),
            "parentCID" if !value.eq_ignore_ascii_case("ffffffff") => {
                return Err(parent_error());
            }
            _ => {}
        }
    }
    Ok(create_type)
}

fn parent_error() -> Error {
    Error::unsupported(
        "the VMDK has a parent (parentCID): VMDK snapshot chains are not supported; \
         convert the chain to one image first (qemu-img convert)",
    )
}

/// Parses descriptor text.
pub fn parse(text: &[u8]) -> Result<Descriptor> {
    let text = std::str::from_utf8(text)
        .map_err(|_| corrupt("the VMDK descriptor is not text"))?
        .trim_end_matches('\0');
    let mut create_type = None;
    let mut extents = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            let value = value.trim().trim_matches('"');
            match key.trim() {
                "createType" => create_type = Some(value.to_owned()),
                "parentCID" if !value.eq_ignore_ascii_case("ffffffff") => {
                    return Err(parent_error())
                }
                _ => {}
            }
            continue;
        }
        let access = line.split_whitespace().next().unwrap_or("");
        if !matches!(access, "RW" | "RDONLY" | "NOACCESS") {
            continue;
        }
        if extents.len() >= MAX_EXTENTS {
            return Err(corrupt(format!(
                "the VMDK descriptor has more than {MAX_EXTENTS} extents"
            )));
        }
        extents.push(parse_extent(line)?);
    }
    let create_type =
        create_type.ok_or_else(|| corrupt("the VMDK descriptor has no createType"))?;
    if extents.is_empty() {
        return Err(corrupt("the VMDK descriptor names no extent"));
    }
    Ok(Descriptor {
        create_type,
        extents,
    })
}

/// `ACCESS SECTORS TYPE ["FILE" [OFFSET]]`.
fn parse_extent(line: &str) -> Result<ExtentLine> {
    let bad = || corrupt(format!("the VMDK extent line {line:?} cannot be parsed"));
    let mut words = line.splitn(3, char::is_whitespace);
    let _access = words.next().ok_or_else(bad)?;
    let sectors: u64 = words.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    let rest = words.next().ok_or_else(bad)?.trim_start();
    let (kind_word, rest) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let kind = match kind_word {
        "FLAT" | "VMFS" => ExtentKind::Flat,
        "SPARSE" | "VMFSSPARSE" => ExtentKind::Sparse,
        "ZERO" => ExtentKind::Zero,
        other => {
            return Err(Error::unsupported(format!(
                "VMDK extents of type {other} are not supported"
            )))
        }
    };
    if sectors > (u64::MAX >> 10) {
        return Err(bad());
    }
    if kind == ExtentKind::Zero {
        return Ok(ExtentLine {
            sectors,
            kind,
            file: None,
            offset: 0,
        });
    }
    let rest = rest.trim_start();
    let rest = rest.strip_prefix('"').ok_or_else(bad)?;
    let (file, tail) = rest.split_once('"').ok_or_else(bad)?;
    let offset = match tail.trim() {
        "" => 0,
        n => n.parse().map_err(|_| bad())?,
    };
    if offset > (u64::MAX >> 10) {
        return Err(bad());
    }
    check_extent_name(file)?;
    Ok(ExtentLine {
        sectors,
        kind,
        file: Some(file.to_owned()),
        offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_flat_and_sparse_extents() {
        let text = b"# Disk DescriptorFile\nversion=1\nCID=1234\nparentCID=ffffffff\n\
            createType=\"twoGbMaxExtentFlat\"\n\n# Extent description\n\
            RW 4192256 FLAT \"d-f001.vmdk\" 0\nRW 100 SPARSE \"d s002.vmdk\"\nRW 8 ZERO\n\
            ddb.virtualHWVersion = \"4\"\n";
        let d = parse(text).unwrap();
        assert_eq!(d.create_type, "twoGbMaxExtentFlat");
        assert_eq!(d.extents.len(), 3);
        assert_eq!(d.extents[0].file.as_deref(), Some("d-f001.vmdk"));
        assert_eq!(d.extents[0].sectors, 4192256);
        assert_eq!(d.extents[1].file.as_deref(), Some("d s002.vmdk"));
        assert_eq!(d.extents[1].kind, ExtentKind::Sparse);
        assert_eq!(d.extents[2].kind, ExtentKind::Zero);
    }

    #[test]
    fn an_embedded_descriptor_names_its_type_and_refuses_a_parent() {
        let text = b"# Disk DescriptorFile\nCID=1\nparentCID=ffffffff\ncreateType=\"streamOptimized\"\n\0\0";
        assert_eq!(embedded(text).unwrap().as_deref(), Some("streamOptimized"));
        assert_eq!(embedded(b"\0\0\0").unwrap(), None);
        let err = embedded(b"parentCID=8c1d2e3f\ncreateType=\"monolithicSparse\"\n").unwrap_err();
        assert_eq!(err.kind(), ferry_core::ErrorKind::Unsupported);
    }

    #[test]
    fn refuses_paths_parents_and_garbage() {
        let with = |extent: &str| {
            format!("# Disk DescriptorFile\ncreateType=\"monolithicFlat\"\n{extent}\n")
        };
        for name in ["../etc/passwd", "/etc/passwd", "a/b.vmdk", "..", ""] {
            let err = parse(with(&format!("RW 8 FLAT \"{name}\" 0")).as_bytes()).unwrap_err();
            assert_eq!(
                err.kind(),
                ferry_core::ErrorKind::InvalidInput,
                "{name}: {err}"
            );
        }
        let err =
            parse(b"# Disk DescriptorFile\nparentCID=12345678\ncreateType=\"x\"\nRW 8 ZERO\n")
                .unwrap_err();
        assert_eq!(err.kind(), ferry_core::ErrorKind::Unsupported);
        assert!(parse(with("RW x FLAT \"a\" 0").as_bytes()).is_err());
        assert!(parse(b"# Disk DescriptorFile\ncreateType=\"x\"\n").is_err());
    }
}
