//! The frames of a .zst file, walked from the front: each frame's place in the file and,
//! when its header records it, its content size.
//!
//! Frames are independent, so a file of several frames that all record their size (pzstd
//! writes them, each behind a skippable frame giving its compressed length) can be
//! decompressed frame by frame in parallel. A frame without that hint is walked block by
//! block (three-byte headers, read through a 1 MiB window), which costs about one read of
//! the compressed file.

use ferry_core::{Error, ErrorKind, Result, Source};

use super::window::Window;

const FRAME_MAGIC: u32 = 0xfd2f_b528;
const SKIPPABLE_MASK: u32 = 0xffff_fff0;
const SKIPPABLE_MAGIC: u32 = 0x184d_2a50;
/// The largest block a frame may hold.
const MAX_BLOCK: u64 = 128 << 10;

fn corrupt(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, format!("zstd: {}", message.into()))
}

/// One data frame: where it is in the file and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// Offset and length of the whole frame in the compressed file.
    pub offset: u64,
    pub len: u64,
    /// Decompressed bytes, when the header records them.
    pub content_size: Option<u64>,
}

/// What a frame header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub header_len: u64,
    pub content_size: Option<u64>,
    pub checksum: bool,
}

/// The bytes a frame header needs at most.
pub const MAX_HEADER: usize = 18;

/// Parses a data frame header (magic included) from the start of `b` (at least the
/// header's bytes, up to [`MAX_HEADER`]).
pub fn parse_frame_header(b: &[u8]) -> Result<FrameHeader> {
    if b.len() < 5 || u32::from_le_bytes([b[0], b[1], b[2], b[3]]) != FRAME_MAGIC {
        return Err(corrupt("not a zstd frame"));
    }
    let fhd = b[4];
    if fhd & 0x08 != 0 {
        return Err(corrupt("a frame header sets a reserved bit"));
    }
    let single_segment = fhd & 0x20 != 0;
    let fcs_len = match fhd >> 6 {
        0 if single_segment => 1,
        0 => 0,
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let dict_len = [0, 1, 2, 4][usize::from(fhd & 3)];
    let window_len = usize::from(!single_segment);
    let header_len = 5 + window_len + dict_len + fcs_len;
    let field = b
        .get(header_len - fcs_len..header_len)
        .ok_or_else(|| corrupt("a frame header is cut short"))?;
    let mut value = [0u8; 8];
    value[..fcs_len].copy_from_slice(field);
    let raw = u64::from_le_bytes(value);
    let content_size = match fcs_len {
        0 => None,
        2 => Some(raw + 256),
        _ => Some(raw),
    };
    Ok(FrameHeader {
        header_len: header_len as u64,
        content_size,
        checksum: fhd & 0x04 != 0,
    })
}

/// Every data frame of the file, in order; skippable frames are stepped over (and a
/// pzstd size hint in one is used to find the end of the next frame).
pub async fn frames(bytes: &dyn Source) -> Result<Vec<Frame>> {
    let mut window = Window::new(bytes);
    let size = window.size();
    let mut frames = Vec::new();
    let mut offset = 0u64;
    let mut hint: Option<u64> = None;
    while offset < size {
        let magic_bytes = window
            .get(offset, 8usize.min((size - offset) as usize), false)
            .await?;
        if magic_bytes.len() < 8 {
            return Err(corrupt(format!(
                "{} stray bytes at the end",
                magic_bytes.len()
            )));
        }
        let magic = u32::from_le_bytes([
            magic_bytes[0],
            magic_bytes[1],
            magic_bytes[2],
            magic_bytes[3],
        ]);
        if magic & SKIPPABLE_MASK == SKIPPABLE_MAGIC {
            let len = u64::from(u32::from_le_bytes([
                magic_bytes[4],
                magic_bytes[5],
                magic_bytes[6],
                magic_bytes[7],
            ]));
            let data = offset + 8;
            if data.checked_add(len).is_none_or(|end| end > size) {
                return Err(corrupt("a skippable frame reaches past the end"));
            }
            hint = if magic == SKIPPABLE_MAGIC && len == 4 {
                let b = window.get(data, 4, false).await?;
                Some(u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            } else {
                None
            };
            offset = data + len;
            continue;
        }
        let head_len = MAX_HEADER.min((size - offset) as usize);
        let header = parse_frame_header(window.get(offset, head_len, false).await?)?;
        let len = match hint.take() {
            Some(len) if len >= header.header_len + 3 && offset.saturating_add(len) <= size => len,
            _ => walk_blocks(&mut window, offset, header).await?,
        };
        frames.push(Frame {
            offset,
            len,
            content_size: header.content_size,
        });
        offset += len;
    }
    if frames.is_empty() {
        return Err(corrupt("no data frame"));
    }
    tracing::debug!(
        frames = frames.len(),
        reads = window.reads,
        "zstd frames walked"
    );
    Ok(frames)
}

/// The length of the frame at `start`, from its blocks' headers.
async fn walk_blocks(window: &mut Window<'_>, start: u64, header: FrameHeader) -> Result<u64> {
    let mut pos = start + header.header_len;
    loop {
        let b = window.get(pos, 3, false).await?;
        let block = u32::from_le_bytes([b[0], b[1], b[2], 0]);
        let last = block & 1 != 0;
        let kind = (block >> 1) & 3;
        let size = u64::from(block >> 3);
        let payload = match kind {
            0 | 2 => size,
            1 => 1,
            _ => return Err(corrupt(format!("a block at {pos} has the reserved type"))),
        };
        if size > MAX_BLOCK {
            return Err(corrupt(format!("a block at {pos} is larger than 128 KiB")));
        }
        pos += 3 + payload;
        if last {
            break;
        }
    }
    if header.checksum {
        pos += 4;
    }
    if pos > window.size() {
        return Err(corrupt("the last frame is truncated"));
    }
    Ok(pos - start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_headers_give_their_content_size() {
        let with = zstd::bulk::compress(&[5u8; 300_000], 3).unwrap();
        let h = parse_frame_header(&with[..MAX_HEADER.min(with.len())]).unwrap();
        assert_eq!(h.content_size, Some(300_000));
        assert!(parse_frame_header(b"\x28\xb5\x2f\xfd").is_err());
        assert!(parse_frame_header(b"garbage!").is_err());
        let mut reserved = with.clone();
        reserved[4] |= 0x08;
        assert!(parse_frame_header(&reserved).is_err());
    }
}
