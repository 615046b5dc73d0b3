//! Differencing VHD and VHDX images written by their specifications (Microsoft's VHD
//! Image Format Specification; MS-VHDX), for tests: no installed tool makes them
//! (qemu-img reads and writes VHD and VHDX, but never creates a differencing one).
//!
//! [`make_vhd_child`] and [`make_vhdx_child`] write a child over a parent (made by
//! qemu-img, or another child), holding the [`DiffSpec`]'s writes; [`apply`] makes the
//! image a reader must see, from the parent's raw bytes and the same writes, without
//! reading the child: the two are independent, so a test compares a copy of the child
//! with it.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write as _};
use std::os::unix::fs::FileExt;
use std::path::Path;

const MIB: u64 = 1 << 20;
/// The block size of the children made here (both formats).
pub const BLOCK: u64 = 2 * MIB;

/// Sectors a child holds: `len` bytes at `offset` (both multiples of 512), all `byte`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Write {
    pub offset: u64,
    pub len: u64,
    pub byte: u8,
}

/// What a child is.
#[derive(Debug, Clone)]
pub struct DiffSpec {
    /// The guest size.
    pub size: u64,
    /// The parent's name in the relative locator (`W2ru`, `relative_path`): `.\base.vhd`.
    pub parent_name: String,
    /// The parent's identity (VHD: its footer unique id; VHDX: its DataWriteGuid).
    pub parent_id: [u8; 16],
    /// The child's own identity (what its own children record).
    pub own_id: [u8; 16],
    pub writes: Vec<Write>,
    /// VHDX only: blocks in the zero state (they read as zeroes whatever the parent holds).
    pub zero_blocks: Vec<u64>,
}

/// A 16-byte id from a seed (distinct seeds, distinct ids).
pub fn id(seed: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = seed.wrapping_mul(31).wrapping_add(i as u8 * 7 + 1);
    }
    g
}

/// Which sectors of block `block` the writes cover, and their bytes (a block's data).
fn block_contents(writes: &[Write], block: u64) -> Option<(Vec<bool>, Vec<u8>)> {
    let sectors = (BLOCK / 512) as usize;
    let (mut present, mut data) = (vec![false; sectors], vec![0xeeu8; BLOCK as usize]);
    let start = block * BLOCK;
    let mut any = false;
    for w in writes {
        assert!(
            w.offset % 512 == 0 && w.len % 512 == 0,
            "{w:?} is not whole sectors"
        );
        let (from, to) = (w.offset.max(start), (w.offset + w.len).min(start + BLOCK));
        if from >= to {
            continue;
        }
        any = true;
        data[(from - start) as usize..(to - start) as usize].fill(w.byte);
        for s in (from - start) / 512..(to - start) / 512 {
            present[s as usize] = true;
        }
    }
    // Sectors the child does not hold keep 0xee: a reader that ignores the bitmap shows it.
    any.then_some((present, data))
}

fn utf16le(text: &str) -> Vec<u8> {
    text.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

/// The VHD checksum: the ones' complement of the byte sum.
fn vhd_checksum(b: &[u8]) -> u32 {
    !b.iter().fold(0u32, |a, &x| a.wrapping_add(u32::from(x)))
}

/// The footer of the VHD at `path` (the copy at its start, else its last sector).
pub fn vhd_footer(path: &Path) -> io::Result<Vec<u8>> {
    let f = File::open(path)?;
    let mut b = vec![0u8; 512];
    f.read_exact_at(&mut b, 0)?;
    if &b[..8] != b"conectix" {
        let len = f.metadata()?.len();
        f.read_exact_at(&mut b, len - 512)?;
    }
    Ok(b)
}

/// A VHD's unique id (what its children record as their parent's).
pub fn vhd_unique_id(path: &Path) -> io::Result<[u8; 16]> {
    let f = vhd_footer(path)?;
    Ok(f[68..84].try_into().expect("16 bytes"))
}

fn be32(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

/// Writes a differencing VHD at `path` (blocks of [`BLOCK`], creator `win `: its size is
/// the footer's current size).
pub fn make_vhd_child(path: &Path, spec: &DiffSpec) -> io::Result<()> {
    let blocks = spec.size.div_ceil(BLOCK);
    let mut footer = vec![0u8; 512];
    footer[..8].copy_from_slice(b"conectix");
    footer[8..12].copy_from_slice(&be32(2));
    footer[12..16].copy_from_slice(&be32(0x0001_0000));
    footer[16..24].copy_from_slice(&512u64.to_be_bytes());
    footer[28..32].copy_from_slice(b"win ");
    footer[32..36].copy_from_slice(&be32(0x0006_0001));
    footer[36..40].copy_from_slice(b"Wi2k");
    footer[40..48].copy_from_slice(&spec.size.to_be_bytes());
    footer[48..56].copy_from_slice(&spec.size.to_be_bytes());
    footer[56..58].copy_from_slice(&65535u16.to_be_bytes());
    footer[58] = 16;
    footer[59] = 255;
    footer[60..64].copy_from_slice(&be32(4));
    footer[68..84].copy_from_slice(&spec.own_id);
    let sum = vhd_checksum(&footer);
    footer[64..68].copy_from_slice(&be32(sum));

    // The relative locator at 1536, the absolute one at 2048, the BAT at 2560.
    let relative = utf16le(&spec.parent_name);
    let file_name = spec
        .parent_name
        .rsplit(['\\', '/'])
        .next()
        .unwrap_or_default();
    let absolute = utf16le(&format!("C:\\Hyper-V\\Disks\\{file_name}"));
    let bat_at = 2560u64;
    let bat_bytes = (blocks * 4).div_ceil(512) * 512;
    let mut dh = vec![0u8; 1024];
    dh[..8].copy_from_slice(b"cxsparse");
    dh[8..16].copy_from_slice(&u64::MAX.to_be_bytes());
    dh[16..24].copy_from_slice(&bat_at.to_be_bytes());
    dh[24..28].copy_from_slice(&be32(0x0001_0000));
    dh[28..32].copy_from_slice(&be32(blocks as u32));
    dh[32..36].copy_from_slice(&be32(BLOCK as u32));
    dh[40..56].copy_from_slice(&spec.parent_id);
    let name_be: Vec<u8> = file_name
        .encode_utf16()
        .flat_map(u16::to_be_bytes)
        .collect();
    dh[64..64 + name_be.len().min(512)].copy_from_slice(&name_be[..name_be.len().min(512)]);
    for (i, (code, text, at)) in [(b"W2ru", &relative, 1536u64), (b"W2ku", &absolute, 2048)]
        .into_iter()
        .enumerate()
    {
        let e = &mut dh[576 + i * 24..600 + i * 24];
        e[..4].copy_from_slice(code);
        e[4..8].copy_from_slice(&be32(512));
        e[8..12].copy_from_slice(&be32(text.len() as u32));
        e[16..24].copy_from_slice(&at.to_be_bytes());
    }
    let sum = vhd_checksum(&dh);
    dh[36..40].copy_from_slice(&be32(sum));

    let mut file = vec![0u8; (bat_at + bat_bytes) as usize];
    file[..512].copy_from_slice(&footer);
    file[512..1536].copy_from_slice(&dh);
    file[1536..1536 + relative.len()].copy_from_slice(&relative);
    file[2048..2048 + absolute.len()].copy_from_slice(&absolute);
    for b in 0..blocks {
        let entry = bat_at as usize + b as usize * 4;
        let Some((present, data)) = block_contents(&spec.writes, b) else {
            file[entry..entry + 4].copy_from_slice(&[0xff; 4]);
            continue;
        };
        let sector = file.len() as u64 / 512;
        file[entry..entry + 4].copy_from_slice(&be32(sector as u32));
        // The sector bitmap (sector 0 in the most significant bit), padded to a sector.
        let mut bitmap = vec![0u8; (BLOCK / 512 / 8).div_ceil(512) as usize * 512];
        for (s, _) in present.iter().enumerate().filter(|(_, p)| **p) {
            bitmap[s / 8] |= 0x80 >> (s % 8);
        }
        file.extend(bitmap);
        file.extend(data);
    }
    file.extend(&footer);
    std::fs::write(path, file)
}

/// The DataWriteGuid of the VHDX at `path` (from its current header).
pub fn vhdx_data_write_guid(path: &Path) -> io::Result<[u8; 16]> {
    let f = File::open(path)?;
    let mut best: Option<(u64, [u8; 16])> = None;
    for at in [64 << 10, 128 << 10] {
        let mut h = vec![0u8; 4096];
        f.read_exact_at(&mut h, at)?;
        let crc = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes"));
        h[4..8].fill(0);
        if &h[..4] != b"head" || crc32c::crc32c(&h) != crc {
            continue;
        }
        let seq = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
        if best.is_none_or(|(s, _)| seq > s) {
            best = Some((seq, h[32..48].try_into().expect("16 bytes")));
        }
    }
    best.map(|(_, g)| g)
        .ok_or_else(|| io::Error::other(format!("{}: no valid VHDX header", path.display())))
}

/// A GUID's bytes (as VHDX stores them) as Windows writes it: `{XXXXXXXX-...}`.
fn guid_text(g: &[u8; 16]) -> String {
    let hex = |r: &[u8]| r.iter().map(|b| format!("{b:02X}")).collect::<String>();
    let rev = |r: &[u8]| {
        r.iter()
            .rev()
            .map(|b| format!("{b:02X}"))
            .collect::<String>()
    };
    format!(
        "{{{}-{}-{}-{}-{}}}",
        rev(&g[..4]),
        rev(&g[4..6]),
        rev(&g[6..8]),
        hex(&g[8..10]),
        hex(&g[10..])
    )
}

/// A GUID from its text (no braces), stored mixed-endian.
fn guid(text: &str) -> [u8; 16] {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).expect("hex");
    }
    g[..4].reverse();
    g[4..6].reverse();
    g[6..8].reverse();
    g
}

fn put(file: &mut [u8], at: u64, bytes: &[u8]) {
    file[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
}

/// Stores the CRC-32C of `len` bytes at `at` (its field at `at + 4` read as zero).
fn seal(file: &mut [u8], at: u64, len: usize) {
    let at = at as usize;
    file[at + 4..at + 8].fill(0);
    let crc = crc32c::crc32c(&file[at..at + len]);
    file[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
}

const BAT_REGION: &str = "2DC27766-F623-4200-9D64-115E9BFD4A08";
const METADATA_REGION: &str = "8B7CA206-4790-4B9A-B8FE-575F050F886E";

/// Writes a differencing VHDX at `path`: identifier, two headers, two region tables, an
/// empty log, the metadata (file parameters with the has-parent bit, sizes, page 83
/// data, the parent locator), the BAT with a sector bitmap entry per chunk, then the
/// sector bitmap block and payload blocks of [`BLOCK`] bytes.
pub fn make_vhdx_child(path: &Path, spec: &DiffSpec) -> io::Result<()> {
    let (log_at, meta_at, bat_at, sb_at) = (MIB, 2 * MIB, 3 * MIB, 4 * MIB);
    let chunk_ratio = (1u64 << 23) * 512 / BLOCK;
    let blocks = spec.size.div_ceil(BLOCK);
    let chunks = blocks.div_ceil(chunk_ratio);
    assert!(chunks == 1, "the generator writes one sector bitmap block");
    let bat_entries = chunks * (chunk_ratio + 1);
    let mut file = vec![0u8; (5 * MIB) as usize];
    put(&mut file, 0, b"vhdxfile");
    put(&mut file, 8, &utf16le("ferry-tests diff_images"));
    for (i, at) in [64u64 << 10, 128 << 10].into_iter().enumerate() {
        put(&mut file, at, b"head");
        put(&mut file, at + 8, &(i as u64 + 1).to_le_bytes());
        put(&mut file, at + 16, &spec.own_id);
        put(&mut file, at + 32, &spec.own_id);
        put(&mut file, at + 66, &1u16.to_le_bytes());
        put(&mut file, at + 68, &(MIB as u32).to_le_bytes());
        put(&mut file, at + 72, &log_at.to_le_bytes());
        seal(&mut file, at, 4096);
    }
    for at in [192u64 << 10, 256 << 10] {
        put(&mut file, at, b"regi");
        put(&mut file, at + 8, &2u32.to_le_bytes());
        for (i, (g, offset)) in [(BAT_REGION, bat_at), (METADATA_REGION, meta_at)]
            .into_iter()
            .enumerate()
        {
            let e = at + 16 + i as u64 * 32;
            put(&mut file, e, &guid(g));
            put(&mut file, e + 16, &offset.to_le_bytes());
            put(&mut file, e + 24, &(MIB as u32).to_le_bytes());
            put(&mut file, e + 28, &1u32.to_le_bytes());
        }
        seal(&mut file, at, 64 << 10);
    }

    // The parent locator: its header, entries, then UTF-16LE keys and values.
    let relative = spec.parent_name.clone();
    let file_name = relative.rsplit(['\\', '/']).next().unwrap_or_default();
    let pairs = [
        ("parent_linkage", guid_text(&spec.parent_id)),
        ("relative_path", relative.clone()),
        (
            "absolute_win32_path",
            format!("C:\\Hyper-V\\Disks\\{file_name}"),
        ),
    ];
    let mut locator = vec![0u8; 20 + pairs.len() * 12];
    locator[..16].copy_from_slice(&guid("B04AEFB7-D19E-4A81-B789-25B8E9445913"));
    locator[18..20].copy_from_slice(&(pairs.len() as u16).to_le_bytes());
    for (i, (k, v)) in pairs.iter().enumerate() {
        let (k, v) = (utf16le(k), utf16le(v));
        let e = 20 + i * 12;
        let key_at = locator.len() as u32;
        locator.extend(&k);
        let value_at = locator.len() as u32;
        locator.extend(&v);
        locator[e..e + 4].copy_from_slice(&key_at.to_le_bytes());
        locator[e + 4..e + 8].copy_from_slice(&value_at.to_le_bytes());
        locator[e + 8..e + 10].copy_from_slice(&(k.len() as u16).to_le_bytes());
        locator[e + 10..e + 12].copy_from_slice(&(v.len() as u16).to_le_bytes());
    }
    let mut params = (BLOCK as u32).to_le_bytes().to_vec();
    params.extend(2u32.to_le_bytes()); // HasParent
    let items: [(&str, Vec<u8>, u32); 6] = [
        ("CAA16737-FA36-4D43-B3B6-33F0AA44E76B", params, 4),
        (
            "2FA54224-CD1B-4876-B211-5DBED83BF4B8",
            spec.size.to_le_bytes().to_vec(),
            6,
        ),
        (
            "8141BF1D-A96F-4709-BA47-F233A8FAAB5F",
            512u32.to_le_bytes().to_vec(),
            6,
        ),
        (
            "CDA348C7-445D-4471-9CC9-E9885251C556",
            4096u32.to_le_bytes().to_vec(),
            6,
        ),
        (
            "BECA12AB-B2E6-4523-93EF-C309E000C746",
            spec.own_id.to_vec(),
            6,
        ),
        ("A8D35F2D-B30B-454D-ABF7-D3D84834AB0C", locator, 4),
    ];
    put(&mut file, meta_at, b"metadata");
    put(&mut file, meta_at + 10, &(items.len() as u16).to_le_bytes());
    let mut item_at = 64u64 << 10;
    for (i, (g, data, flags)) in items.iter().enumerate() {
        let e = meta_at + 32 + i as u64 * 32;
        put(&mut file, e, &guid(g));
        put(&mut file, e + 16, &(item_at as u32).to_le_bytes());
        put(&mut file, e + 20, &(data.len() as u32).to_le_bytes());
        put(&mut file, e + 24, &flags.to_le_bytes());
        put(&mut file, meta_at + item_at, data);
        item_at += (data.len() as u64).div_ceil(4096) * 4096;
    }

    // The BAT: payload entries, the chunk's sector bitmap entry after them.
    let mut bat = vec![0u64; bat_entries as usize];
    bat[chunk_ratio as usize] = sb_at | 6; // SB_BLOCK_PRESENT
    let sectors = BLOCK / 512;
    for b in 0..blocks {
        if spec.zero_blocks.contains(&b) {
            bat[b as usize] = 2; // PAYLOAD_BLOCK_ZERO
            continue;
        }
        let Some((present, data)) = block_contents(&spec.writes, b) else {
            continue; // PAYLOAD_BLOCK_NOT_PRESENT
        };
        let at = file.len() as u64;
        let full = present.iter().all(|p| *p);
        bat[b as usize] = at | if full { 6 } else { 7 };
        // One bit per sector, the block's bits after the earlier blocks' of the chunk,
        // least significant bit first.
        for (s, _) in present.iter().enumerate().filter(|(_, p)| **p) {
            let bit = b * sectors + s as u64;
            file[(sb_at + bit / 8) as usize] |= 1 << (bit % 8);
        }
        file.extend(data);
    }
    for (i, e) in bat.iter().enumerate() {
        put(&mut file, bat_at + i as u64 * 8, &e.to_le_bytes());
    }
    std::fs::write(path, file)
}

/// The image a reader of the child must see: `parent_raw`'s bytes (copied sparsely),
/// then the writes and zero blocks applied, written to `out`.
pub fn apply(parent_raw: &Path, spec: &DiffSpec, out: &Path) -> io::Result<()> {
    let status = std::process::Command::new("cp")
        .arg("--sparse=always")
        .arg(parent_raw)
        .arg(out)
        .status()?;
    if !status.success() {
        return Err(io::Error::other("cp failed"));
    }
    let mut f = OpenOptions::new().read(true).write(true).open(out)?;
    let len = f.seek(SeekFrom::End(0))?;
    if len < spec.size {
        f.set_len(spec.size)?;
    }
    for &b in &spec.zero_blocks {
        let start = b * BLOCK;
        let len = (start + BLOCK).min(spec.size) - start;
        // A hole, as a sparse copy leaves zeroes.
        let status = std::process::Command::new("fallocate")
            .args(["--punch-hole", "--offset", &start.to_string(), "--length"])
            .arg(len.to_string())
            .arg(out)
            .status()?;
        if !status.success() {
            return Err(io::Error::other("fallocate --punch-hole failed"));
        }
    }
    for w in &spec.writes {
        f.write_all_at(&vec![w.byte; w.len as usize], w.offset)?;
    }
    f.flush()
}
