//! Seeded test images, made quickly.
//!
//! Copy and checksum tests need images whose bytes are known (to compare against) and whose
//! layout exercises the data path: holes, data runs that do not start on a run boundary,
//! zero blocks written inside data (allocated in the source, to be detected as zeroes),
//! random bytes that expose a block written at the wrong offset, and sizes that are not a
//! multiple of any block size. The same seed always gives the same image; the bytes come
//! from BLAKE3's extendable output keyed by the seed, addressed by offset, which is fast
//! enough to make a 1 GiB image in about a second even in a debug build.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Allocation granularity assumed when predicting how much of a sparse copy is allocated.
pub const BLOCK: u64 = 4096;
/// Length of a data run in [`Pattern::HalfData`] images.
pub const RUN: u64 = 1 << 20;
/// Every [`Pattern::HalfData`] slot of this length holds one data run.
const SLOT: u64 = 2 * RUN;
/// One in this many 4 KiB blocks of a data run is written as zeroes.
const ZERO_BLOCK_ONE_IN: u64 = 8;

/// What an image contains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Nothing allocated: reads as zeroes.
    Empty,
    /// Half data: each 2 MiB slot holds one 1 MiB run of random bytes at a seeded 4 KiB-aligned
    /// offset, with one in eight of its 4 KiB blocks written as zeroes; the rest is holes.
    /// The last run ends at the end of the image, so an unaligned tail is data.
    HalfData,
    /// Random bytes everywhere.
    Random,
}

impl FromStr for Pattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "empty" => Ok(Self::Empty),
            "half" | "half-data" => Ok(Self::HalfData),
            "random" => Ok(Self::Random),
            other => Err(format!(
                "unknown pattern '{other}': expected empty, half or random"
            )),
        }
    }
}

/// A generated image and what is known about it.
#[derive(Debug, Clone)]
pub struct Image {
    pub path: PathBuf,
    pub pattern: Pattern,
    pub size: u64,
    pub seed: u64,
    /// Bytes in 4 KiB blocks (counted whole, the last one too) that hold a non-zero byte:
    /// what a sparse copy must allocate, and about all it should.
    pub nonzero_block_bytes: u64,
    /// Bytes written to the file (data runs including their zero blocks).
    pub written_bytes: u64,
}

/// Makes an image at `path` (replacing any file there).
pub fn make(path: &Path, pattern: Pattern, size: u64, seed: u64) -> io::Result<Image> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    file.set_len(size)?;
    let mut writer = Writer::new(&file, seed);
    match pattern {
        Pattern::Empty => {}
        Pattern::Random => writer.random_run(0, size, false)?,
        Pattern::HalfData => {
            for (start, end) in half_data_runs(size, seed) {
                writer.random_run(start, end, true)?;
            }
        }
    }
    Ok(Image {
        path: path.to_path_buf(),
        pattern,
        size,
        seed,
        nonzero_block_bytes: writer.nonzero.bytes,
        written_bytes: writer.written,
    })
}

/// The data runs of a [`Pattern::HalfData`] image, as sorted `[start, end)` ranges.
pub fn half_data_runs(size: u64, seed: u64) -> Vec<(u64, u64)> {
    let mut runs = Vec::new();
    let mut slot = 0u64;
    while slot * SLOT < size {
        let slot_start = slot * SLOT;
        let slot_end = (slot_start + SLOT).min(size);
        let is_last = slot_end == size;
        let (start, end) = if is_last {
            (slot_end.saturating_sub(RUN).max(slot_start), slot_end)
        } else {
            let blocks = (SLOT - RUN) / BLOCK;
            let shift = mix(seed ^ slot.wrapping_mul(0x9e37_79b9)) % (blocks + 1);
            let start = slot_start + shift * BLOCK;
            (start, start + RUN)
        };
        runs.push((start, end));
        slot += 1;
    }
    runs
}

/// Whether the 4 KiB block at `offset` of a data run is written as zeroes.
fn is_zero_block(seed: u64, offset: u64) -> bool {
    mix(seed.rotate_left(17) ^ (offset / BLOCK)).is_multiple_of(ZERO_BLOCK_ONE_IN)
}

/// SplitMix64's finaliser: a cheap, well-spread hash of a u64.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The seeded byte stream: byte `o` of every image with this seed is `stream[o]`.
fn stream(seed: u64) -> blake3::OutputReader {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..24].copy_from_slice(b"ferry test image");
    blake3::Hasher::new_keyed(&key).finalize_xof()
}

struct Writer<'a> {
    file: &'a File,
    zero_blocks_seed: u64,
    stream: blake3::OutputReader,
    buf: Vec<u8>,
    written: u64,
    nonzero: NonzeroBlocks,
}

/// Counts the 4 KiB blocks that hold data.
#[derive(Default)]
struct NonzeroBlocks {
    bytes: u64,
    /// The last block counted, so that runs touching one block count it once.
    last: Option<u64>,
}

impl NonzeroBlocks {
    fn count(&mut self, block: u64) {
        if self.last != Some(block) {
            self.last = Some(block);
            self.bytes += BLOCK;
        }
    }
}

impl<'a> Writer<'a> {
    fn new(file: &'a File, seed: u64) -> Self {
        Self {
            file,
            zero_blocks_seed: seed,
            stream: stream(seed),
            buf: vec![0u8; RUN as usize],
            written: 0,
            nonzero: NonzeroBlocks::default(),
        }
    }

    /// Writes random bytes over `start..end`, with some blocks zeroed if asked.
    fn random_run(&mut self, start: u64, end: u64, with_zero_blocks: bool) -> io::Result<()> {
        let zero_blocks = self.zero_blocks_seed;
        let mut offset = start;
        while offset < end {
            let n = (end - offset).min(self.buf.len() as u64) as usize;
            let buf = &mut self.buf[..n];
            self.stream.set_position(offset);
            self.stream.fill(buf);
            // Walk the 4 KiB blocks of the file that this chunk touches.
            let mut pos = offset;
            while pos < offset + n as u64 {
                let block_end = ((pos / BLOCK) + 1) * BLOCK;
                let piece_end = block_end.min(offset + n as u64);
                let piece = &mut buf[(pos - offset) as usize..(piece_end - offset) as usize];
                if with_zero_blocks && is_zero_block(zero_blocks, pos) {
                    piece.fill(0);
                } else if piece.iter().any(|&b| b != 0) {
                    self.nonzero.count(pos / BLOCK);
                }
                pos = piece_end;
            }
            self.file.write_all_at(buf, offset)?;
            self.written += n as u64;
            offset += n as u64;
        }
        Ok(())
    }
}
