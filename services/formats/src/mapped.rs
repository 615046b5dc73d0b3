//! [`MappedSource`]: a guest image cut into fixed-size blocks, each of which a format's
//! table maps to a place in the image file.
//!
//! VMDK (grains), VHD and VHDX (blocks) and VDI (blocks) all share this shape: a table
//! entry per block says "here in the file", "zeroes" or "compressed here". Only the
//! lookup differs, so each format implements [`BlockMap`] and this module does the rest
//! once: extents (unallocated and zero blocks as zero extents so targets stay sparse),
//! reads coalesced into one byte-source read per contiguous host run, bounds checks
//! against the file's end (a block past it is `corrupt`, never zeroes), and compressed
//! blocks decoded inline on the worker that asked for them.
//!
//! The image file's own extents (holes inside allocated blocks) are asked for the whole
//! file and kept ([`FileExtents`]), not once per run of allocated blocks: a local file
//! answers with lseek SEEK_HOLE, which walks the file's data up to its next hole, so per
//! run a file without holes cost O(file) each time (on tmpfs, page by page).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{merge_extents, Caps, Error, ErrorKind, Extent, IoBuf, Result, Source};
use parking_lot::Mutex;

/// Where one guest block's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// Stored as is, starting at this offset of the image file.
    Data(u64),
    /// Reads as zeroes (unallocated, or marked zero).
    Zero,
    /// Compressed, starting at this offset of the image file ([`BlockMap::decompress`]).
    Compressed(u64),
}

/// A format's block table.
#[async_trait]
pub(crate) trait BlockMap: Send + Sync + std::fmt::Debug + 'static {
    /// Guest bytes per block (a power of two or at least a multiple of 512).
    fn block_size(&self) -> u64;

    /// Where block `index` is.
    async fn lookup(&self, file: &dyn Source, index: u64) -> Result<Place>;

    /// Decompresses the block stored at `offset` into `out` (one block long).
    async fn decompress(&self, _file: &dyn Source, _offset: u64, _out: &mut [u8]) -> Result<()> {
        Err(Error::internal("this format has no compressed blocks"))
    }
}

/// The error of metadata or data outside the image file, or otherwise inconsistent.
pub(crate) fn corrupt(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, message)
}

/// Most blocks one `extents` call looks up.
const MAX_BLOCKS_PER_CALL: u64 = 4096;

/// Most of the image file's extents [`FileExtents`] keeps from one answer.
const MAX_FILE_EXTENTS: usize = 4096;

/// The image file's extents from its last answer (contiguous, at most
/// [`MAX_FILE_EXTENTS`]), shared by every handle of one image: runs of allocated blocks
/// stored inside them are answered without asking the file again.
#[derive(Debug, Default)]
struct FileExtents {
    known: Mutex<Vec<Extent>>,
    /// Whether the file was asked from its start yet (see [`MappedSource::file_extent`]).
    asked: AtomicBool,
}

impl FileExtents {
    /// The known extent holding file offset `at`, cut to start there.
    fn at(&self, at: u64) -> Option<Extent> {
        holding(&self.known.lock(), at)
    }

    /// Keeps `extents`, an answer from file offset `from`, in place of the last: its
    /// contiguous prefix starting at `from`, at most [`MAX_FILE_EXTENTS`]. Returns its
    /// extent holding `at`, as [`FileExtents::at`] does.
    fn keep(&self, from: u64, extents: Vec<Extent>, at: u64) -> Option<Extent> {
        let mut next = from;
        let prefix: Vec<Extent> = extents
            .into_iter()
            .take_while(|e| {
                let fits = e.offset == next && e.len > 0;
                next = e.end();
                fits
            })
            .take(MAX_FILE_EXTENTS)
            .collect();
        let found = holding(&prefix, at);
        if !prefix.is_empty() {
            *self.known.lock() = prefix;
        }
        found
    }
}

/// The extent of sorted, contiguous `extents` holding `at`, cut to start there.
fn holding(extents: &[Extent], at: u64) -> Option<Extent> {
    let e = extents.get(extents.partition_point(|e| e.end() <= at))?;
    (e.offset <= at).then(|| Extent {
        offset: at,
        len: e.end() - at,
        kind: e.kind,
    })
}

/// A guest image read through a [`BlockMap`] over the image file's bytes.
pub(crate) struct MappedSource {
    file: Arc<dyn Source>,
    map: Arc<dyn BlockMap>,
    size: u64,
    file_extents: Arc<FileExtents>,
}

impl std::fmt::Debug for MappedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedSource")
            .field("file", &self.file.describe())
            .field("map", &self.map)
            .field("size", &self.size)
            .finish()
    }
}

impl MappedSource {
    pub(crate) fn new(file: Arc<dyn Source>, map: Arc<dyn BlockMap>, size: u64) -> Self {
        Self {
            file,
            map,
            size,
            file_extents: Arc::default(),
        }
    }

    /// Checks that `len` bytes at file offset `host` lie inside the image file.
    fn check_host(&self, host: u64, len: u64) -> Result<()> {
        if host
            .checked_add(len)
            .is_none_or(|end| end > self.file.size())
        {
            return Err(corrupt(format!(
                "data at file offset {host} ({len} bytes) is past the end of the image file \
                 ({} bytes): the image is truncated or its block table is damaged",
                self.file.size()
            )));
        }
        Ok(())
    }

    async fn read_into(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let view = buf.view();
        let total = view.len() as u64;
        if offset.checked_add(total).is_none_or(|end| end > self.size) {
            return Err(Error::invalid_input(format!(
                "read of {total} bytes at {offset} is past the image's virtual size {}",
                self.size
            )));
        }
        let bs = self.map.block_size();
        // A run of data blocks contiguous in the file: (guest start, host start, len).
        let mut pending: Option<(u64, u64, u64)> = None;
        let mut pos = offset;
        let end = offset + total;
        while pos < end {
            let index = pos / bs;
            let within = pos % bs;
            let len = (bs - within).min(end - pos);
            let place = self.map.lookup(self.file.as_ref(), index).await?;
            if let Place::Data(host) = place {
                let host = host + within;
                self.check_host(host, len)?;
                match &mut pending {
                    Some((_, h, l)) if *h + *l == host => *l += len,
                    _ => {
                        if let Some(run) = pending.take() {
                            buf = self.read_run(buf, view.start, offset, run).await?;
                        }
                        pending = Some((pos, host, len));
                    }
                }
            } else {
                if let Some(run) = pending.take() {
                    buf = self.read_run(buf, view.start, offset, run).await?;
                }
                let at = view.start + (pos - offset) as usize;
                buf.set_view(at, len as usize);
                match place {
                    Place::Zero => buf.fill(0),
                    // A whole block decompresses straight into the caller's buffer.
                    Place::Compressed(host) if within == 0 && len == bs => {
                        self.map
                            .decompress(self.file.as_ref(), host, &mut buf)
                            .await?;
                    }
                    Place::Compressed(host) => {
                        let mut block = vec![0u8; bs as usize];
                        self.map
                            .decompress(self.file.as_ref(), host, &mut block)
                            .await?;
                        buf.copy_from_slice(&block[within as usize..(within + len) as usize]);
                    }
                    Place::Data(_) => unreachable!("handled above"),
                }
            }
            pos += len;
        }
        if let Some(run) = pending.take() {
            buf = self.read_run(buf, view.start, offset, run).await?;
        }
        buf.set_view(view.start, view.len());
        Ok(buf)
    }

    async fn read_run(
        &self,
        mut buf: IoBuf,
        base: usize,
        offset: u64,
        (guest, host, len): (u64, u64, u64),
    ) -> Result<IoBuf> {
        buf.set_view(base + (guest - offset) as usize, len as usize);
        let block = u64::from(self.file.caps().block.minimum.max(1));
        if host.is_multiple_of(block) && len.is_multiple_of(block) {
            return self.file.read_at(host, buf).await;
        }
        // A byte source that reads whole blocks only (an iSCSI LUN) and a run that does
        // not start or end on one (VHD blocks are 512-byte aligned): widen and copy.
        let bytes = crate::qcow2::read_bytes(self.file.as_ref(), host, len).await?;
        buf.copy_from_slice(&bytes);
        Ok(buf)
    }

    /// The extents of a run of allocated blocks stored contiguously at `host`: data,
    /// except where the image file itself has holes (a VHDX or VMDK block allocated
    /// whole but written only in part), which read as zeroes and need no read.
    async fn data_run(
        &self,
        out: &mut Vec<Extent>,
        (guest, host, len): (u64, u64, u64),
    ) -> Result<()> {
        if !self.file.caps().extents {
            out.push(Extent::data(guest, len));
            return Ok(());
        }
        let mut done = 0;
        while done < len {
            let Some(e) = self.file_extent(host + done, guest + done).await? else {
                // The file said nothing usable: the rest is data.
                out.push(Extent::data(guest + done, len - done));
                break;
            };
            let piece = e.len.min(len - done);
            out.push(Extent {
                offset: guest + done,
                len: piece,
                kind: e.kind,
            });
            done += piece;
        }
        Ok(())
    }

    /// The image file's extent holding file offset `at` (guest offset `guest`), cut to
    /// start there: from [`FileExtents`], else asked for the rest of the file and kept.
    /// The first time, the file is asked from its start: a file of few extents (one,
    /// without holes) is then known whole, whatever order its blocks are stored in. A
    /// file of more extents than one answer holds is asked again on a miss; walking it
    /// costs little, since only long data runs make SEEK_HOLE slow.
    async fn file_extent(&self, at: u64, guest: u64) -> Result<Option<Extent>> {
        if let Some(e) = self.file_extents.at(at) {
            return Ok(Some(e));
        }
        let mut from = if self.file_extents.asked.swap(true, Ordering::Relaxed) {
            at
        } else {
            0
        };
        loop {
            let found = self
                .file
                .extents(from, self.file.size() - from)
                .await
                .map_err(|e| self.context(e, "extents", guest))?;
            if let Some(e) = self.file_extents.keep(from, found, at) {
                return Ok(Some(e));
            }
            if from == at {
                return Ok(None);
            }
            from = at;
        }
    }

    fn context(&self, e: Error, operation: &'static str, offset: u64) -> Error {
        e.at(operation, offset).with_endpoint(self.file.describe())
    }
}

#[async_trait]
impl Source for MappedSource {
    fn describe(&self) -> String {
        self.file.describe()
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        // Runs off the file's blocks are widened in `read_run`: any guest range reads.
        crate::widened_caps(self.file.caps(), true)
    }

    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let end = offset.saturating_add(len).min(self.size);
        let bs = self.map.block_size();
        let mut out = Vec::new();
        // Data blocks contiguous in the guest and in the file: (guest, host, len).
        let mut run: Option<(u64, u64, u64)> = None;
        let mut pos = offset;
        let mut blocks = 0;
        while pos < end && blocks < MAX_BLOCKS_PER_CALL {
            let index = pos / bs;
            let piece = (bs - pos % bs).min(end - pos);
            let place = self
                .map
                .lookup(self.file.as_ref(), index)
                .await
                .map_err(|e| self.context(e, "extents", pos))?;
            if let Place::Data(host) = place {
                let host = host + pos % bs;
                self.check_host(host, piece)
                    .map_err(|e| self.context(e, "extents", pos))?;
                match &mut run {
                    Some((_, h, l)) if *h + *l == host => *l += piece,
                    _ => {
                        if let Some(r) = run.take() {
                            self.data_run(&mut out, r).await?;
                        }
                        run = Some((pos, host, piece));
                    }
                }
            } else {
                if let Some(r) = run.take() {
                    self.data_run(&mut out, r).await?;
                }
                out.push(match place {
                    Place::Compressed(host) => {
                        self.check_host(host, 1)
                            .map_err(|e| self.context(e, "extents", pos))?;
                        Extent::data(pos, piece)
                    }
                    _ => Extent::zero(pos, piece),
                });
            }
            pos += piece;
            blocks += 1;
        }
        if let Some(r) = run.take() {
            self.data_run(&mut out, r).await?;
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
            size: self.size,
            file_extents: Arc::clone(&self.file_extents),
        }))
    }

    async fn close(&self) -> Result<()> {
        self.file.close().await
    }
}

/// Reads `len` bytes of metadata at `offset` of the image file, failing as `corrupt`
/// when they reach past its end.
pub(crate) async fn read_meta(
    file: &dyn Source,
    offset: u64,
    len: u64,
    what: &str,
) -> Result<IoBuf> {
    read_meta_into(file, offset, len, what, None).await
}

/// [`read_meta`] into `spare` when it is large enough (see
/// [`crate::qcow2::read_bytes_into`]).
pub(crate) async fn read_meta_into(
    file: &dyn Source,
    offset: u64,
    len: u64,
    what: &str,
    spare: Option<IoBuf>,
) -> Result<IoBuf> {
    if offset.checked_add(len).is_none_or(|end| end > file.size()) {
        return Err(corrupt(format!(
            "the {what} ({len} bytes at offset {offset}) is past the end of the image file \
             ({} bytes): the image is truncated or damaged",
            file.size()
        )));
    }
    crate::qcow2::read_bytes_into(file, offset, len, spare).await
}

pub(crate) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(crate) fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_testkit::MemSource;

    /// Block 0 data at file 0, block 1 zero, block 2 data at file 4 (contiguous with 0
    /// only by file order 2 -> 1), block 3 past the end.
    #[derive(Debug)]
    struct Map;

    #[async_trait]
    impl BlockMap for Map {
        fn block_size(&self) -> u64 {
            4
        }
        async fn lookup(&self, _file: &dyn Source, index: u64) -> Result<Place> {
            Ok(match index {
                0 => Place::Data(0),
                1 => Place::Zero,
                2 => Place::Data(4),
                _ => Place::Data(100),
            })
        }
    }

    fn source() -> MappedSource {
        let file: Arc<dyn Source> = Arc::new(MemSource::new(b"abcdefgh".to_vec()));
        MappedSource::new(file, Arc::new(Map), 16)
    }

    #[tokio::test]
    async fn reads_data_and_zero_blocks_and_reports_extents() {
        let s = source();
        let buf = s.read_at(1, IoBuf::new(10)).await.unwrap();
        assert_eq!(&buf[..], b"bcd\0\0\0\0efg");
        let extents = s.extents(0, 12).await.unwrap();
        assert_eq!(
            extents,
            vec![Extent::data(0, 4), Extent::zero(4, 4), Extent::data(8, 4)]
        );
    }

    /// Holes of the image file inside allocated blocks are zero extents: nothing to read.
    #[tokio::test]
    async fn holes_of_the_file_inside_allocated_blocks_are_zero_extents() {
        let file: Arc<dyn Source> = Arc::new(MemSource::sparse(b"ab\0\0\0\0\0\0".to_vec(), 2));
        let s = MappedSource::new(file, Arc::new(Map), 16);
        let extents = s.extents(0, 12).await.unwrap();
        assert_eq!(
            extents,
            vec![Extent::data(0, 2), Extent::zero(2, 10)],
            "block 0's second half and block 2 are holes of the file"
        );
        let buf = s.read_at(0, IoBuf::new(12)).await.unwrap();
        assert_eq!(&buf[..], b"ab\0\0\0\0\0\0\0\0\0\0");
    }

    const FILE_BLOCKS: u64 = 1000;

    /// Guest blocks of 512 bytes, every other one allocated, stored in the file one after
    /// another (or in reverse): each allocated block is a run of its own.
    #[derive(Debug)]
    struct Scattered {
        reverse: bool,
    }

    impl Scattered {
        /// The file block holding allocated guest block `2 * n`.
        fn stored(&self, n: u64) -> u64 {
            if self.reverse {
                FILE_BLOCKS - 1 - n
            } else {
                n
            }
        }
    }

    #[async_trait]
    impl BlockMap for Scattered {
        fn block_size(&self) -> u64 {
            512
        }
        async fn lookup(&self, _file: &dyn Source, index: u64) -> Result<Place> {
            Ok(if index.is_multiple_of(2) {
                Place::Data(self.stored(index / 2) * 512)
            } else {
                Place::Zero
            })
        }
    }

    /// The file's extents are asked once per answer the file gives, not once per run of
    /// allocated blocks (a local file answers with SEEK_HOLE, which walks to the next
    /// hole: per run, a file without holes cost O(file) each time), in whatever order
    /// the blocks are stored when one answer holds the file's layout. Holes of the file
    /// still come out as zero extents, through every handle.
    #[tokio::test]
    async fn the_file_is_asked_its_extents_per_answer_not_per_run() {
        let hole = |j: u64| j % 7 == 3;
        let data: Vec<u8> = (0..FILE_BLOCKS)
            .flat_map(|j| [if hole(j) { 0 } else { (j % 251 + 1) as u8 }; 512])
            .collect();
        let guest_size = 2 * FILE_BLOCKS * 512;
        let file_extents = MemSource::sparse(data.clone(), 512)
            .extents(0, data.len() as u64)
            .await
            .unwrap()
            .len() as u64;
        assert!(
            file_extents > 200,
            "{file_extents} extents: the test's layout"
        );

        // (stored in reverse, extents per answer of the file)
        for (reverse, limit) in [(false, usize::MAX), (true, usize::MAX), (false, 50)] {
            let map = Scattered { reverse };
            let expected = merge_extents((0..2 * FILE_BLOCKS).map(|i| {
                if i.is_multiple_of(2) && !hole(map.stored(i / 2)) {
                    Extent::data(i * 512, 512)
                } else {
                    Extent::zero(i * 512, 512)
                }
            }));
            let file = MemSource::sparse(data.clone(), 512).with_extent_limit(limit);
            let stats = Arc::clone(&file.stats);
            let s = MappedSource::new(Arc::new(file), Arc::new(map), guest_size);
            assert_eq!(s.extents(0, guest_size).await.unwrap(), expected);
            let answers = file_extents.div_ceil(limit.min(file_extents as usize) as u64);
            let calls = stats.extent_calls();
            assert!(
                calls as u64 <= answers + 1,
                "{calls} extents calls for {FILE_BLOCKS} runs at {limit} extents per answer \
                 (reverse: {reverse})"
            );
            // Another handle of the same image reuses what the first learnt: with one
            // answer for the whole file, it asks nothing.
            let other = s.connect().await.unwrap();
            let tail = guest_size / 2;
            let again = other.extents(tail, guest_size - tail).await.unwrap();
            assert_eq!(again.first().map(|e| e.offset), Some(tail));
            let more = stats.extent_calls() - calls;
            let most = if limit == usize::MAX { 0 } else { answers + 1 };
            assert!(
                more as u64 <= most,
                "{more} more calls through a second handle"
            );
        }
    }

    #[tokio::test]
    async fn a_block_past_the_file_end_is_corrupt() {
        let s = source();
        let err = s.read_at(12, IoBuf::new(4)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
        let err = s.extents(12, 4).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
        let err = s.read_at(14, IoBuf::new(4)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    }
}
