//! The entries of a tar archive (ustar, GNU long names, pax `path`/`size` records), read
//! header by header through a byte [`Source`] without reading the entries' contents.
//!
//! An OVA is such a tar. Every header is checksummed, every size bounded by the archive's
//! end (an entry that claims more bytes than the file holds is `corrupt`), and the number
//! of entries and the length of long names and pax records are capped.

use ferry_core::{Result, Source};

use crate::mapped::{corrupt, read_meta};

/// Most entries listed.
pub const MAX_ENTRIES: usize = 4096;
/// Longest GNU long name or pax record block read.
pub(crate) const MAX_EXTENDED: u64 = 64 << 10;

/// A regular file in the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    /// Where its bytes start in the archive.
    pub offset: u64,
    pub size: u64,
}

/// Whether `head` (at least 512 bytes) is a ustar or GNU tar header.
pub fn looks_like_tar(head: &[u8]) -> bool {
    head.len() >= 263 && &head[257..262] == b"ustar"
}

/// Whether `head` (the first 512 bytes) starts an OVA: a tar whose first file is the OVF
/// descriptor, as the OVF specification requires (or whose first header is a GNU long
/// name or pax record, which the listing resolves). Any other tar is left raw.
pub fn looks_like_ova(head: &[u8]) -> bool {
    if !looks_like_tar(head) {
        return false;
    }
    let name = text(&head[..100]).to_ascii_lowercase();
    name.ends_with(".ovf") || matches!(head[156], b'L' | b'x')
}

/// An octal (or GNU base-256) number field.
pub(crate) fn number(field: &[u8]) -> Result<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        let mut n: u64 = u64::from(field[0] & 0x7f);
        for &b in &field[1..] {
            n = n
                .checked_mul(256)
                .and_then(|n| n.checked_add(u64::from(b)))
                .ok_or_else(|| corrupt("a tar size field overflows"))?;
        }
        return Ok(n);
    }
    let text: String = field
        .iter()
        .take_while(|&&b| b != 0)
        .map(|&b| b as char)
        .collect();
    let text = text.trim();
    if text.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(text, 8)
        .map_err(|_| corrupt(format!("tar number field {text:?} is not octal")))
}

pub(crate) fn text(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// Checks a header block's checksum (the checksum field read as spaces).
pub(crate) fn checksum_ok(h: &[u8]) -> Result<bool> {
    let stored = number(&h[148..156])?;
    let sum: u64 = h[..512]
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u64::from(b)
            }
        })
        .sum();
    Ok(sum == stored)
}

/// The `path` and `size` of a pax extended header's records.
pub(crate) fn pax(records: &[u8]) -> (Option<String>, Option<u64>) {
    let (mut path, mut size) = (None, None);
    let mut rest = records;
    while let Some(space) = rest.iter().position(|&b| b == b' ') {
        let Ok(len) = std::str::from_utf8(&rest[..space])
            .unwrap_or("x")
            .parse::<usize>()
        else {
            break;
        };
        if len <= space || len > rest.len() {
            break;
        }
        let record = &rest[space + 1..len];
        let record = record.strip_suffix(b"\n").unwrap_or(record);
        if let Some(v) = record.strip_prefix(b"path=") {
            path = Some(String::from_utf8_lossy(v).into_owned());
        } else if let Some(v) = record.strip_prefix(b"size=") {
            size = std::str::from_utf8(v).ok().and_then(|s| s.parse().ok());
        }
        rest = &rest[len..];
    }
    (path, size)
}

/// Lists the regular files of the tar in `file`.
pub async fn entries(file: &dyn Source) -> Result<Vec<Entry>> {
    let end = file.size();
    let mut out = Vec::new();
    let mut at = 0u64;
    let (mut long_name, mut pax_size): (Option<String>, Option<u64>) = (None, None);
    while at + 512 <= end {
        let h = read_meta(file, at, 512, "tar header").await?;
        if h.iter().all(|&b| b == 0) {
            break;
        }
        // A checksum field that is no number: no header where the entry before said its
        // data ends.
        let not_a_header = |_| {
            corrupt(format!(
                "no tar header at offset {at}, where the entry before it ends: that entry lies about its size, or the tar is damaged"
            ))
        };
        if !checksum_ok(&h).map_err(not_a_header)? {
            return Err(corrupt(format!(
                "the tar header at offset {at} has a wrong checksum"
            )));
        }
        let size = pax_size.take().map_or_else(|| number(&h[124..136]), Ok)?;
        let data = at + 512;
        if data.checked_add(size).is_none_or(|e| e > end) {
            return Err(corrupt(format!(
                "the tar entry at offset {at} says it holds {size} bytes, past the end of the \
                 archive ({end} bytes): the archive is truncated or lies about its size"
            )));
        }
        let kind = h[156];
        match kind {
            b'L' | b'x' => {
                if size > MAX_EXTENDED {
                    return Err(corrupt(format!("a tar extended header of {size} bytes")));
                }
                let body = read_meta(file, data, size, "tar extended header").await?;
                if kind == b'L' {
                    long_name = Some(text(&body));
                } else {
                    let (path, psize) = pax(&body);
                    long_name = path.or(long_name);
                    pax_size = psize;
                }
            }
            b'0' | 0 | b'7' => {
                if out.len() >= MAX_ENTRIES {
                    return Err(corrupt(format!(
                        "the tar has more than {MAX_ENTRIES} files"
                    )));
                }
                let name = long_name.take().unwrap_or_else(|| {
                    let prefix = text(&h[345..500]);
                    let name = text(&h[..100]);
                    if prefix.is_empty() || &h[257..263] != b"ustar\0" {
                        name
                    } else {
                        format!("{prefix}/{name}")
                    }
                });
                out.push(Entry {
                    name,
                    offset: data,
                    size,
                });
            }
            _ => long_name = None,
        }
        at = data + size.div_ceil(512) * 512;
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ferry_testkit::MemSource;

    pub(crate) fn header(name: &str, size: u64) -> Vec<u8> {
        let mut h = vec![0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..107].copy_from_slice(b"0000644");
        h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
        h[156] = b'0';
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].fill(b' ');
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        h
    }

    pub(crate) fn archive(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, data) in files {
            out.extend(header(name, data.len() as u64));
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
        out.extend([0u8; 1024]);
        out
    }

    #[tokio::test]
    async fn lists_files_with_their_places() {
        let tar = archive(&[("vm.ovf", b"<Envelope/>"), ("disk1.vmdk", &[7u8; 1000])]);
        assert!(looks_like_tar(&tar) && looks_like_ova(&tar));
        assert!(!looks_like_ova(&archive(&[("notes.txt", b"x")])));
        let list = entries(&MemSource::new(tar)).await.unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[1].name, "disk1.vmdk");
        assert_eq!((list[1].offset, list[1].size), (1536, 1000));
    }

    #[tokio::test]
    async fn a_size_past_the_end_or_a_bad_checksum_is_corrupt() {
        let mut tar = archive(&[("disk.vmdk", &[7u8; 1000])]);
        tar.truncate(1024);
        let err = entries(&MemSource::new(tar)).await.unwrap_err();
        assert_eq!(err.kind(), ferry_core::ErrorKind::Corrupt, "{err}");
        let mut tar = archive(&[("disk.vmdk", &[7u8; 10])]);
        tar[0] = b'X';
        assert!(entries(&MemSource::new(tar)).await.is_err());
    }

    #[test]
    fn pax_records() {
        let (p, s) = pax(b"20 path=a/long.vmdk\n15 size=123456\n");
        assert_eq!(p.as_deref(), Some("a/long.vmdk"));
        assert_eq!(s, Some(123456));
    }
}
