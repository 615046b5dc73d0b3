//! The uncompressed size of an .xz file, from the index at the end of each stream, read
//! back to front as `xz --list` does: footer, index, then the stream header it implies,
//! stream after stream (concatenated streams and stream padding included).
//!
//! Everything is checked (magic bytes, CRC32s, flags that must match, sizes that must
//! add up) so a garbage tail is an error, never a wrong size; the decoder checks the
//! index against the blocks again as it decompresses.

use ferry_core::{Error, ErrorKind, Result, Source};

use super::window::Window;

const HEADER_MAGIC: [u8; 6] = [0xfd, b'7', b'z', b'X', b'Z', 0];
const FOOTER_MAGIC: [u8; 2] = *b"YZ";
/// Stream header and footer size.
const EDGE: u64 = 12;
/// Largest index read (64 MiB holds millions of blocks).
pub(crate) const MAX_INDEX: u64 = 64 << 20;

/// What the indexes say about an .xz file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct XzLayout {
    /// Uncompressed bytes of all streams.
    pub size: u64,
    pub streams: u64,
    pub blocks: u64,
}

fn corrupt(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, format!("xz: {}", message.into()))
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = flate2::Crc::new();
    crc.update(bytes);
    crc.sum()
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// A stream footer: the index size and the stream flags.
pub fn parse_footer(footer: &[u8]) -> Result<(u64, [u8; 2])> {
    if footer.len() != EDGE as usize || footer[10..12] != FOOTER_MAGIC {
        return Err(corrupt(
            "no stream footer at the end (truncated, or not an .xz file)",
        ));
    }
    if crc32(&footer[4..10]) != le32(&footer[0..4]) {
        return Err(corrupt("the stream footer's CRC32 does not match"));
    }
    let flags = [footer[8], footer[9]];
    if flags[0] != 0 || flags[1] & 0xf0 != 0 {
        return Err(corrupt("unsupported stream flags"));
    }
    Ok(((u64::from(le32(&footer[4..8])) + 1) * 4, flags))
}

/// A stream header: its flags.
pub fn parse_header(header: &[u8]) -> Result<[u8; 2]> {
    if header.len() != EDGE as usize || header[..6] != HEADER_MAGIC {
        return Err(corrupt("the index does not lead back to a stream header"));
    }
    if crc32(&header[6..8]) != le32(&header[8..12]) {
        return Err(corrupt("the stream header's CRC32 does not match"));
    }
    Ok([header[6], header[7]])
}

/// Reads an xz variable-length integer at `*pos`.
fn varint(bytes: &[u8], pos: &mut usize) -> Result<u64> {
    let mut value = 0u64;
    for i in 0..9 {
        let b = *bytes
            .get(*pos)
            .ok_or_else(|| corrupt("the index ends inside a number"))?;
        *pos += 1;
        if i > 0 && b == 0 {
            return Err(corrupt("a number in the index is not minimally encoded"));
        }
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(corrupt("a number in the index is too long"))
}

/// What one index says: uncompressed bytes, the stream's block bytes (padded), blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexSummary {
    pub uncompressed: u64,
    pub blocks_size: u64,
    pub records: u64,
}

/// Parses one index (its whole `backward size` bytes).
pub fn parse_index(index: &[u8]) -> Result<IndexSummary> {
    if index.len() < 8 || !index.len().is_multiple_of(4) || index[0] != 0 {
        return Err(corrupt("the index does not start with an index indicator"));
    }
    let body = index.len() - 4;
    if crc32(&index[..body]) != le32(&index[body..]) {
        return Err(corrupt("the index's CRC32 does not match"));
    }
    let mut pos = 1;
    let records = varint(&index[..body], &mut pos)?;
    // A record takes at least two bytes: the count is bounded by the index itself.
    if records > (body as u64) / 2 {
        return Err(corrupt("the index counts more records than it holds"));
    }
    let mut summary = IndexSummary {
        uncompressed: 0,
        blocks_size: 0,
        records,
    };
    let overflow = || corrupt("the index's sizes overflow");
    for _ in 0..records {
        let unpadded = varint(&index[..body], &mut pos)?;
        let uncompressed = varint(&index[..body], &mut pos)?;
        if !(5..=(1 << 63) - 4).contains(&unpadded) {
            return Err(corrupt("a block's size in the index is impossible"));
        }
        let padded = unpadded.div_ceil(4) * 4;
        summary.blocks_size = summary
            .blocks_size
            .checked_add(padded)
            .ok_or_else(overflow)?;
        summary.uncompressed = summary
            .uncompressed
            .checked_add(uncompressed)
            .ok_or_else(overflow)?;
    }
    if index[pos..body].iter().any(|&b| b != 0) || body - pos >= 4 {
        return Err(corrupt("the index has bytes after its records"));
    }
    Ok(summary)
}

/// Reads every stream's index, from the end of `bytes`.
pub async fn layout(bytes: &dyn Source) -> Result<XzLayout> {
    let mut window = Window::new(bytes);
    let mut end = window.size();
    let mut layout = XzLayout::default();
    while end > 0 {
        end = skip_padding(&mut window, end).await?;
        if end < 2 * EDGE {
            return Err(corrupt(format!(
                "{end} bytes before the last stream: too short for a stream"
            )));
        }
        let footer = window.get(end - EDGE, EDGE as usize, true).await?;
        let (index_size, flags) = parse_footer(footer)?;
        if index_size > MAX_INDEX {
            return Err(corrupt(format!(
                "the index is {index_size} bytes: more than the {MAX_INDEX} read"
            )));
        }
        let index_start = (end - EDGE)
            .checked_sub(index_size)
            .ok_or_else(|| corrupt("the index reaches before the file's start"))?;
        let index = window.get(index_start, index_size as usize, true).await?;
        let summary = parse_index(index)?;
        let start = index_start
            .checked_sub(summary.blocks_size)
            .and_then(|s| s.checked_sub(EDGE))
            .ok_or_else(|| corrupt("the blocks reach before the file's start"))?;
        let header = window.get(start, EDGE as usize, true).await?;
        if parse_header(header)? != flags {
            return Err(corrupt("the stream header and footer disagree"));
        }
        layout.size = layout
            .size
            .checked_add(summary.uncompressed)
            .ok_or_else(|| corrupt("the streams' sizes overflow"))?;
        layout.streams += 1;
        layout.blocks += summary.records;
        end = start;
    }
    if layout.streams == 0 {
        return Err(corrupt("no stream"));
    }
    Ok(layout)
}

/// Skips stream padding (zero bytes in groups of four) before `end`.
async fn skip_padding(window: &mut Window<'_>, mut end: u64) -> Result<u64> {
    while end >= 4 {
        let len = end.min(4096) as usize;
        let tail = window.get(end - len as u64, len, true).await?;
        let zeros = tail.iter().rev().take_while(|&&b| b == 0).count();
        let whole = zeros - zeros % 4;
        end -= whole as u64;
        if whole < len {
            if zeros % 4 != 0 {
                return Err(corrupt("stream padding is not a multiple of four bytes"));
            }
            break;
        }
    }
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_their_limits() {
        let mut pos = 0;
        assert_eq!(varint(&[0x7f], &mut pos).unwrap(), 127);
        let mut pos = 0;
        assert_eq!(varint(&[0x80, 0x01], &mut pos).unwrap(), 128);
        assert_eq!(pos, 2);
        let mut pos = 0;
        assert!(varint(&[0x80, 0x00], &mut pos).is_err());
        let mut pos = 0;
        assert!(varint(&[0xff; 10], &mut pos).is_err());
        let mut pos = 0;
        assert!(varint(&[0x80], &mut pos).is_err());
    }

    fn index_of(records: &[(u64, u64)]) -> Vec<u8> {
        fn put(out: &mut Vec<u8>, mut v: u64) {
            while v >= 0x80 {
                out.push((v as u8) | 0x80);
                v >>= 7;
            }
            out.push(v as u8);
        }
        let mut out = vec![0u8];
        put(&mut out, records.len() as u64);
        for &(unpadded, size) in records {
            put(&mut out, unpadded);
            put(&mut out, size);
        }
        while out.len() % 4 != 0 {
            out.push(0);
        }
        let crc = crc32(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    #[test]
    fn an_index_sums_its_records() {
        let index = index_of(&[(1000, 1 << 20), (13, 5)]);
        let s = parse_index(&index).unwrap();
        assert_eq!(s.uncompressed, (1 << 20) + 5);
        assert_eq!(s.blocks_size, 1000 + 16);
        assert_eq!(s.records, 2);
        let mut bad = index.clone();
        bad[2] ^= 1;
        assert!(parse_index(&bad).is_err());
        assert!(parse_index(&index_of(&[(4, 1)])).is_err());
        assert!(parse_index(&[0, 0, 0, 0]).is_err());
    }

    #[test]
    fn a_footer_checks_magic_and_crc() {
        let mut footer = vec![0u8; 12];
        footer[4..8].copy_from_slice(&1u32.to_le_bytes());
        footer[9] = 1;
        footer[10..12].copy_from_slice(b"YZ");
        let crc = crc32(&footer[4..10]);
        footer[0..4].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(parse_footer(&footer).unwrap(), (8, [0, 1]));
        footer[5] = 1;
        assert!(parse_footer(&footer).is_err());
        assert!(parse_footer(&[0u8; 12]).is_err());
    }
}
