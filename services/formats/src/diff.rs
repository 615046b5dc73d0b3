//! Differencing images (VHD and VHDX): a child that stores only the sectors written
//! since it was made, read over its parent.
//!
//! A block of the child is absent (all of it is the parent's), zero (VHDX only), fully
//! present, or partially present: then a sector bitmap says per sector whether the child
//! or the parent holds it. The two formats differ only in where blocks and bitmaps are
//! and in the bitmap's bit order, so each implements [`DiffMap`] and [`DiffSource`] does
//! the rest once: reads split into runs from the child's file and runs from the parent
//! (any image, itself perhaps differencing), and extents where the parent's ranges are
//! the parent's own extents, so a range no layer of the chain holds stays a zero extent
//! and targets stay sparse.
//!
//! The parent is named by the child (locators, paths written on another machine), so
//! the name is untrusted: [`plain_parent_name`] accepts only a file name beside the child,
//! and the caller checks the parent's identity before reading it.

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{merge_extents, Caps, Error, Extent, IoBuf, Result, Source};

use crate::composite::ZeroSource;
use crate::mapped::corrupt;

/// A block's sector bitmap.
#[derive(Debug, Clone)]
pub(crate) struct Bitmap {
    pub bytes: Arc<Vec<u8>>,
    /// VHD numbers a byte's sectors from its most significant bit, VHDX from its least.
    pub msb_first: bool,
}

impl Bitmap {
    /// The first sector after `first` (up to `last`) whose bit is not `mine`: whole
    /// bytes of equal bits are skipped at once.
    fn run_end(&self, first: u64, last: u64, mine: bool) -> u64 {
        let same = if mine { 0xff } else { 0 };
        let mut s = first + 1;
        while s < last {
            if s.is_multiple_of(8) && s + 8 <= last {
                let byte = usize::try_from(s / 8).ok().and_then(|i| self.bytes.get(i));
                if byte == Some(&same) || (!mine && byte.is_none()) {
                    s += 8;
                    continue;
                }
            }
            if self.child(s) != mine {
                break;
            }
            s += 1;
        }
        s
    }

    /// Whether the child holds sector `sector` of the block (bits past the bitmap: no).
    fn child(&self, sector: u64) -> bool {
        let Some(&byte) = usize::try_from(sector / 8)
            .ok()
            .and_then(|i| self.bytes.get(i))
        else {
            return false;
        };
        let bit = sector % 8;
        let mask = if self.msb_first {
            0x80 >> bit
        } else {
            1 << bit
        };
        byte & mask != 0
    }
}

/// Where one block of a differencing image is.
#[derive(Debug, Clone)]
pub(crate) enum DiffPlace {
    /// All of it is the parent's.
    Parent,
    /// It reads as zeroes, whatever the parent holds.
    Zero,
    /// All of it is in the child's file, from this offset.
    Data(u64),
    /// It is in the child's file from `host`, but only the sectors `bitmap` marks; the
    /// others are the parent's.
    Partial { host: u64, bitmap: Bitmap },
}

/// A differencing format's block table.
#[async_trait]
pub(crate) trait DiffMap: Send + Sync + std::fmt::Debug + 'static {
    /// Guest bytes per block.
    fn block_size(&self) -> u64;
    /// Guest bytes per bitmap bit.
    fn sector_size(&self) -> u64;
    /// Where block `index` is.
    async fn lookup(&self, file: &dyn Source, index: u64) -> Result<DiffPlace>;
}

/// Where a guest run's bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum From {
    /// The child's file, at this offset.
    Child(u64),
    Parent,
    Zero,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    guest: u64,
    len: u64,
    from: From,
}

/// Most blocks one `extents` call looks up.
const MAX_BLOCKS_PER_CALL: u64 = 1024;

/// What a differencing image says about its parent, before the parent is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentRef {
    /// The names the image gives its parent, most preferred first: (where, name), as
    /// `("W2ru locator", ".\\base.vhd")`.
    pub names: Vec<(&'static str, String)>,
    /// The identity the parent must have.
    pub identity: Identity,
}

impl ParentRef {
    /// The name shown for the parent: the most preferred one.
    pub fn display_name(&self) -> String {
        self.names
            .first()
            .map(|(_, n)| n.clone())
            .unwrap_or_default()
    }
}

/// How a parent is recognised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A VHD's footer unique id.
    VhdUniqueId([u8; 16]),
    /// One of a VHDX's DataWriteGuid values (`parent_linkage`, `parent_linkage2`).
    VhdxDataWriteGuid(Vec<[u8; 16]>),
}

/// A differencing image waiting for its parent.
pub struct Differencing {
    file: Arc<dyn Source>,
    map: Arc<dyn DiffMap>,
    size: u64,
    pub parent: ParentRef,
}

impl std::fmt::Debug for Differencing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Differencing")
            .field("file", &self.file.describe())
            .field("map", &self.map)
            .field("parent", &self.parent)
            .finish()
    }
}

/// A VHD or VHDX opened: the image, or a differencing image that needs its parent.
pub enum Opened {
    Image(Arc<dyn Source>),
    Differencing(Differencing),
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Image(image) => write!(f, "Image({})", image.describe()),
            Self::Differencing(diff) => diff.fmt(f),
        }
    }
}

impl Differencing {
    pub(crate) fn new(
        file: Arc<dyn Source>,
        map: Arc<dyn DiffMap>,
        size: u64,
        parent: ParentRef,
    ) -> Self {
        Self {
            file,
            map,
            size,
            parent,
        }
    }

    /// The guest size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The image read over `parent`.
    pub fn over(self, parent: Arc<dyn Source>) -> Arc<dyn Source> {
        Arc::new(DiffSource {
            file: self.file,
            map: self.map,
            parent,
            size: self.size,
        })
    }

    /// The image with the parent's sectors read as zeroes (`ferry info` without
    /// `--allow-backing`: the child's own allocation).
    pub fn alone(self) -> Arc<dyn Source> {
        let size = self.size;
        self.over(Arc::new(ZeroSource(size)))
    }
}

/// The guest image of a differencing child over its parent.
pub(crate) struct DiffSource {
    file: Arc<dyn Source>,
    map: Arc<dyn DiffMap>,
    parent: Arc<dyn Source>,
    size: u64,
}

impl std::fmt::Debug for DiffSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiffSource")
            .field("file", &self.file.describe())
            .field("parent", &self.parent.describe())
            .field("map", &self.map)
            .field("size", &self.size)
            .finish()
    }
}

impl DiffSource {
    /// Appends `piece`, joined to the last one when it continues it; the parent's
    /// ranges past its end read as zeroes.
    fn push(&self, out: &mut Vec<Piece>, piece: Piece) {
        if piece.from == From::Parent {
            let parent_end = self.parent.size();
            let end = piece.guest + piece.len;
            if end > parent_end {
                let cut = parent_end.max(piece.guest);
                if cut > piece.guest {
                    self.push(
                        out,
                        Piece {
                            len: cut - piece.guest,
                            ..piece
                        },
                    );
                }
                return self.push(
                    out,
                    Piece {
                        guest: cut,
                        len: end - cut,
                        from: From::Zero,
                    },
                );
            }
        }
        if let Some(last) = out.last_mut() {
            let joined = match (last.from, piece.from) {
                (From::Child(h), From::Child(n)) => h + last.len == n,
                (a, b) => a == b,
            };
            if joined && last.guest + last.len == piece.guest {
                last.len += piece.len;
                return;
            }
        }
        out.push(piece);
    }

    /// The pieces of `offset..end` (at most `max_blocks` blocks of it: the last piece
    /// says how far they reach), each child piece checked against the file's end.
    async fn pieces(&self, offset: u64, end: u64, max_blocks: u64) -> Result<Vec<Piece>> {
        let bs = self.map.block_size();
        let ss = self.map.sector_size();
        let mut out = Vec::new();
        let (mut pos, mut blocks) = (offset, 0);
        while pos < end && blocks < max_blocks {
            let index = pos / bs;
            let start = index * bs;
            let stop = (start + bs).min(end);
            match self.map.lookup(self.file.as_ref(), index).await? {
                DiffPlace::Parent => self.push(&mut out, piece(pos, stop, From::Parent)),
                DiffPlace::Zero => self.push(&mut out, piece(pos, stop, From::Zero)),
                DiffPlace::Data(host) => {
                    let at = host + (pos - start);
                    self.check_host(at, stop - pos)?;
                    self.push(&mut out, piece(pos, stop, From::Child(at)));
                }
                DiffPlace::Partial { host, bitmap } => {
                    let last = (stop - start).div_ceil(ss);
                    let mut p = pos;
                    while p < stop {
                        let first = (p - start) / ss;
                        let mine = bitmap.child(first);
                        let s = bitmap.run_end(first, last, mine);
                        let run_end = (start + s * ss).min(stop);
                        let from = if mine {
                            let at = host + (p - start);
                            self.check_host(at, run_end - p)?;
                            From::Child(at)
                        } else {
                            From::Parent
                        };
                        self.push(&mut out, piece(p, run_end, from));
                        p = run_end;
                    }
                }
            }
            pos = stop;
            blocks += 1;
        }
        Ok(out)
    }

    fn check_host(&self, host: u64, len: u64) -> Result<()> {
        if host
            .checked_add(len)
            .is_none_or(|end| end > self.file.size())
        {
            return Err(corrupt(format!(
                "data at file offset {host} ({len} bytes) is past the end of the \
                 differencing image file ({} bytes): the image is truncated or its block \
                 table is damaged",
                self.file.size()
            )));
        }
        Ok(())
    }

    async fn read_into(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let view = buf.view();
        let total = view.len() as u64;
        let end = offset
            .checked_add(total)
            .filter(|&end| end <= self.size)
            .ok_or_else(|| {
                Error::invalid_input(format!(
                    "read of {total} bytes at {offset} is past the image's virtual size {}",
                    self.size
                ))
            })?;
        let mut pos = offset;
        while pos < end {
            for p in self.pieces(pos, end, u64::MAX).await? {
                buf.set_view(view.start + (p.guest - offset) as usize, p.len as usize);
                buf = match p.from {
                    From::Zero => {
                        buf.fill(0);
                        buf
                    }
                    From::Child(host) => read_exact(self.file.as_ref(), host, buf).await?,
                    From::Parent => read_exact(self.parent.as_ref(), p.guest, buf).await?,
                };
                pos = p.guest + p.len;
            }
        }
        buf.set_view(view.start, view.len());
        Ok(buf)
    }

    fn context(&self, e: Error, operation: &'static str, offset: u64) -> Error {
        e.at(operation, offset).with_endpoint(self.file.describe())
    }
}

fn piece(start: u64, stop: u64, from: From) -> Piece {
    Piece {
        guest: start,
        len: stop - start,
        from,
    }
}

/// Reads `buf`'s view from `source` at `at`, widening to the source's blocks when the
/// range is not on them.
async fn read_exact(source: &dyn Source, at: u64, mut buf: IoBuf) -> Result<IoBuf> {
    let len = buf.view().len() as u64;
    let block = u64::from(source.caps().block.minimum.max(1));
    if at.is_multiple_of(block) && len.is_multiple_of(block) {
        return source.read_at(at, buf).await;
    }
    let bytes = crate::qcow2::read_bytes(source, at, len).await?;
    buf.copy_from_slice(&bytes);
    Ok(buf)
}

#[async_trait]
impl Source for DiffSource {
    fn describe(&self) -> String {
        self.file.describe()
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        crate::widened_caps(self.file.caps(), true)
    }

    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let end = offset.saturating_add(len).min(self.size);
        let pieces = self
            .pieces(offset, end, MAX_BLOCKS_PER_CALL)
            .await
            .map_err(|e| self.context(e, "extents", offset))?;
        let mut out = Vec::new();
        for p in pieces {
            match p.from {
                From::Zero => out.push(Extent::zero(p.guest, p.len)),
                From::Child(_) => out.push(Extent::data(p.guest, p.len)),
                From::Parent => out.extend(
                    crate::qcow2::extents_over(self.parent.as_ref(), p.guest, p.len).await?,
                ),
            }
        }
        Ok(merge_extents(out))
    }

    async fn read_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        self.read_into(offset, buf)
            .await
            .map_err(|e| self.context(e, "read", offset))
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(Self {
            file: self.file.connect().await?,
            map: self.map.clone(),
            parent: self.parent.connect().await?,
            size: self.size,
        }))
    }

    async fn close(&self) -> Result<()> {
        let child = self.file.close().await;
        self.parent.close().await?;
        child
    }
}

/// The name of the parent to open: the most preferred of `parent.names` that is a plain
/// file name (`.\` in front is allowed: "this directory"), refused when none is.
pub fn plain_parent_name(parent: &ParentRef, format: &str) -> Result<String> {
    for (_, name) in &parent.names {
        let plain = name
            .strip_prefix(".\\")
            .or_else(|| name.strip_prefix("./"))
            .unwrap_or(name);
        if is_plain(plain) {
            return Ok(plain.to_owned());
        }
    }
    let named = parent
        .names
        .iter()
        .map(|(what, name)| format!("{} ({what})", quote(name)))
        .collect::<Vec<_>>()
        .join(", ");
    Err(Error::invalid_input(if named.is_empty() {
        format!("the differencing {format} does not name its parent")
    } else {
        format!(
            "the differencing {format} names its parent {named}: only a parent beside the \
             image, named by a plain file name (no '/', '\\' or '..'), is read; put the \
             parent beside it"
        )
    }))
}

/// `name` in double quotes, control characters escaped (Windows paths keep their single
/// backslashes).
pub fn quote(name: &str) -> String {
    let mut out = String::from("\"");
    for c in name.chars() {
        if c.is_control() || c == '"' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.push('"');
    out
}

/// A file name with no path in it.
fn is_plain(name: &str) -> bool {
    !(name.is_empty()
        || name.contains('/')
        || name.contains('\\')
        || name.contains(':')
        || name.contains('\0')
        || name == "."
        || name.contains(".."))
}

/// A GUID as text (`{8-4-4-4-12}` hex, as Windows writes it), its bytes as VHD and VHDX
/// store them (the first three fields little-endian).
pub fn format_guid(g: &[u8; 16]) -> String {
    format!(
        "{{{:02X}{:02X}{:02X}{:02X}-{:02X}{:02X}-{:02X}{:02X}-{:02X}{:02X}-{}}}",
        g[3],
        g[2],
        g[1],
        g[0],
        g[5],
        g[4],
        g[7],
        g[6],
        g[8],
        g[9],
        g[10..]
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect::<String>()
    )
}

/// Reads a GUID written as text (braces optional), strictly; `None` when it is not one.
pub fn parse_guid(text: &str) -> Option<[u8; 16]> {
    let text = text.trim().trim_start_matches('{').trim_end_matches('}');
    let groups: Vec<&str> = text.split('-').collect();
    if groups.iter().map(|g| g.len()).collect::<Vec<_>>() != [8, 4, 4, 4, 12] {
        return None;
    }
    let hex: String = groups.concat();
    let mut b = [0u8; 16];
    for (i, out) in b.iter_mut().enumerate() {
        *out = u8::from_str_radix(hex.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    b[..4].reverse();
    b[4..6].reverse();
    b[6..8].reverse();
    Some(b)
}

/// UTF-16 text of `b` (little- or big-endian), up to its first NUL.
pub(crate) fn utf16(b: &[u8], big_endian: bool) -> String {
    let units: Vec<u16> = b
        .chunks_exact(2)
        .map(|c| {
            if big_endian {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from_le_bytes([c[0], c[1]])
            }
        })
        .take_while(|&u| u != 0)
        .collect();
    String::from_utf16_lossy(&units)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::ExtentKind;
    use ferry_testkit::MemSource;

    /// Blocks of 4 sectors of 4 bytes: block 0 partial (sectors 1 and 2 the child's),
    /// block 1 the parent's, block 2 zero, block 3 all the child's.
    #[derive(Debug)]
    struct Map;

    #[async_trait]
    impl DiffMap for Map {
        fn block_size(&self) -> u64 {
            16
        }
        fn sector_size(&self) -> u64 {
            4
        }
        async fn lookup(&self, _file: &dyn Source, index: u64) -> Result<DiffPlace> {
            Ok(match index {
                0 => DiffPlace::Partial {
                    host: 0,
                    bitmap: Bitmap {
                        bytes: Arc::new(vec![0b0110_0000]),
                        msb_first: true,
                    },
                },
                1 => DiffPlace::Parent,
                2 => DiffPlace::Zero,
                _ => DiffPlace::Data(16),
            })
        }
    }

    fn image(parent: Vec<u8>) -> Arc<dyn Source> {
        let child = b"aaaabbbbccccddddeeeeffffgggghhhh".to_vec();
        let file: Arc<dyn Source> = Arc::new(MemSource::new(child));
        let named = ParentRef {
            names: vec![],
            identity: Identity::VhdUniqueId([0; 16]),
        };
        Differencing::new(file, Arc::new(Map), 64, named).over(Arc::new(MemSource::new(parent)))
    }

    #[tokio::test]
    async fn sectors_come_from_the_child_or_the_parent_as_the_bitmap_says() {
        let parent: Vec<u8> = (0..64u8).map(|i| b'A' + i % 26).collect();
        let img = image(parent.clone());
        let buf = img.read_at(0, IoBuf::new(64)).await.unwrap();
        let mut want = parent.clone();
        want[4..12].copy_from_slice(b"bbbbcccc");
        want[32..48].fill(0);
        want[48..64].copy_from_slice(b"eeeeffffgggghhhh");
        assert_eq!(&buf[..], &want[..]);
        let buf = img.read_at(6, IoBuf::new(3)).await.unwrap();
        assert_eq!(&buf[..], &want[6..9]);
    }

    #[tokio::test]
    async fn only_ranges_no_layer_holds_are_zero_extents() {
        // A parent shorter than the child, its tail past its end reading as zeroes.
        let img = image(vec![7u8; 20]);
        let extents = img.extents(0, 64).await.unwrap();
        assert_eq!(
            extents,
            vec![
                Extent::data(0, 20),
                Extent::zero(20, 28),
                Extent::data(48, 16)
            ]
        );
        let buf = img.read_at(16, IoBuf::new(8)).await.unwrap();
        assert_eq!(&buf[..], &[7, 7, 7, 7, 0, 0, 0, 0]);
        let alone = Differencing::new(
            Arc::new(MemSource::new(vec![1u8; 32])),
            Arc::new(Map),
            64,
            ParentRef {
                names: vec![],
                identity: Identity::VhdUniqueId([0; 16]),
            },
        )
        .alone();
        let kinds: Vec<_> = alone.extents(0, 64).await.unwrap();
        assert_eq!(kinds[0], Extent::zero(0, 4));
        assert_eq!(kinds[1].kind, ExtentKind::Data);
    }

    #[tokio::test]
    async fn child_data_past_the_file_is_corrupt() {
        let file: Arc<dyn Source> = Arc::new(MemSource::new(vec![0u8; 20]));
        let parent = ParentRef {
            names: vec![],
            identity: Identity::VhdUniqueId([0; 16]),
        };
        let img = Differencing::new(file, Arc::new(Map), 64, parent).alone();
        let err = img.read_at(48, IoBuf::new(16)).await.unwrap_err();
        assert_eq!(err.kind(), ferry_core::ErrorKind::Corrupt, "{err}");
    }

    #[test]
    fn runs_of_bits_end_where_the_bit_changes() {
        for msb_first in [true, false] {
            let b = Bitmap {
                bytes: Arc::new(vec![0xff, 0xff, 0x00, 0x00, 0xff]),
                msb_first,
            };
            assert_eq!(b.run_end(0, 40, true), 16);
            assert_eq!(b.run_end(3, 12, true), 12);
            assert_eq!(b.run_end(16, 40, false), 32);
            assert_eq!(b.run_end(32, 64, true), 40, "past the bitmap: the parent's");
            assert_eq!(b.run_end(40, 64, false), 64);
        }
        let mixed = Bitmap {
            bytes: Arc::new(vec![0b1110_0000]),
            msb_first: true,
        };
        assert_eq!(mixed.run_end(0, 8, true), 3);
        assert_eq!(mixed.run_end(3, 8, false), 8);
    }

    #[test]
    fn only_plain_names_beside_the_child_are_opened() {
        let named = |names: &[&str]| ParentRef {
            names: names.iter().map(|n| ("locator", (*n).to_owned())).collect(),
            identity: Identity::VhdUniqueId([0; 16]),
        };
        assert_eq!(
            plain_parent_name(&named(&[".\\base.vhd"]), "VHD").unwrap(),
            "base.vhd"
        );
        assert_eq!(
            plain_parent_name(&named(&["C:\\vms\\x.vhd", "base.vhd"]), "VHD").unwrap(),
            "base.vhd"
        );
        for bad in [
            "..\\base.vhd",
            "/etc/base.vhd",
            "C:\\vms\\base.vhd",
            "sub/base.vhd",
            "",
        ] {
            let err = plain_parent_name(&named(&[bad]), "VHD").unwrap_err();
            assert_eq!(err.kind(), ferry_core::ErrorKind::InvalidInput, "{bad}");
        }
        assert!(plain_parent_name(&named(&[]), "VHD").is_err());
    }

    #[test]
    fn guids_round_trip_through_text() {
        let g = parse_guid("{83F9AB2B-11C5-4B9A-8F8E-0123456789AB}").unwrap();
        assert_eq!(&g[..4], &[0x2b, 0xab, 0xf9, 0x83]);
        assert_eq!(format_guid(&g), "{83F9AB2B-11C5-4B9A-8F8E-0123456789AB}");
        assert!(parse_guid("{83F9AB2B-11C5-4B9A-8F8E}").is_none());
        assert!(parse_guid("{83F9AB2B-11C5-4B9A-8F8E-0123456789AZ}").is_none());
    }
}
