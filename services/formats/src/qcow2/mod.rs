//! qcow2 read as a [`Source`] over another [`Source`] that holds the image file's bytes.
//!
//! Guest ranges map through the L1 table (loaded at open, bounded by the header checks)
//! and L2 tables (an LRU cache bounded in bytes). A read becomes one read of the byte
//! source per contiguous host run, not one per cluster, so a qcow2 over the network
//! costs no more round trips than it must. Zero and unallocated clusters are reported
//! as zero extents so the engine skips them; unallocated ranges read from the backing
//! image when the opener gave one. Internal snapshots and refcounts are never read.

pub(crate) mod cache;
mod compressed;
pub mod header;
mod table;

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{merge_extents, Caps, Error, ErrorKind, Extent, IoBuf, Result, Source};

use cache::{L2Cache, Table};
pub use header::{Compression, Header};
use table::{corrupt, Place};

/// Tuning of the qcow2 reader.
#[derive(Debug, Clone)]
pub struct Qcow2Options {
    /// Bytes of L2 tables kept in memory (at least one table is always kept).
    pub l2_cache_bytes: usize,
}

impl Default for Qcow2Options {
    fn default() -> Self {
        // 32 MiB of L2 tables maps 256 GiB of image with 64 KiB clusters.
        Self {
            l2_cache_bytes: 32 * 1024 * 1024,
        }
    }
}

/// What is shared by every handle of one image: its metadata.
#[derive(Debug)]
struct Meta {
    header: Header,
    l1: Vec<u64>,
    cache: L2Cache,
    file_size: u64,
    backing_name: Option<String>,
}

/// A qcow2 image read through a byte [`Source`].
pub struct Qcow2Source {
    meta: Arc<Meta>,
    file: Arc<dyn Source>,
    backing: Option<Arc<dyn Source>>,
}

impl std::fmt::Debug for Qcow2Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qcow2Source")
            .field("file", &self.file.describe())
            .field("header", &self.meta.header)
            .finish_non_exhaustive()
    }
}

/// One guest range and where its bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    guest: u64,
    len: u64,
    place: Place,
}

/// Reads metadata (or a compressed cluster) at any offset: the read itself is widened to
/// the byte source's minimum block (an iSCSI LUN reads whole blocks only), and the
/// returned buffer views just the bytes asked for.
pub(crate) async fn read_bytes(file: &dyn Source, offset: u64, len: u64) -> Result<IoBuf> {
    read_bytes_into(file, offset, len, None).await
}

/// [`read_bytes`] into `spare` when it is large enough (a buffer kept from an earlier
/// read: reusing it spares the allocation and the page faults of a fresh one).
pub(crate) async fn read_bytes_into(
    file: &dyn Source,
    offset: u64,
    len: u64,
    spare: Option<IoBuf>,
) -> Result<IoBuf> {
    let block = u64::from(file.caps().block.minimum.max(1));
    let start = offset - offset % block;
    let end = offset
        .checked_add(len)
        .ok_or_else(|| corrupt("a metadata range overflows"))?;
    let end = end
        .div_ceil(block)
        .saturating_mul(block)
        .min(file.size())
        .max(end);
    let total =
        usize::try_from(end - start).map_err(|_| Error::internal("read length exceeds usize"))?;
    let buf = match spare {
        Some(mut b) if b.capacity() >= total => {
            b.set_len(total);
            b
        }
        _ => IoBuf::new(total),
    };
    let mut buf = file.read_at(start, buf).await?;
    buf.set_view((offset - start) as usize, len as usize);
    Ok(buf)
}

fn be_words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect()
}

impl Qcow2Source {
    /// Parses the header and loads the L1 table of the qcow2 image in `file`. A backing
    /// file the header names is not opened: see [`Self::backing_name`] and
    /// [`Self::with_backing`].
    pub async fn open(file: Arc<dyn Source>, options: &Qcow2Options) -> Result<Self> {
        let ctx = |e: Error| e.with_endpoint(file.describe());
        let file_size = file.size();
        let head_len = file_size.min(header::HEAD_LEN as u64);
        let head = read_bytes(file.as_ref(), 0, head_len).await.map_err(ctx)?;
        let header = Header::parse(&head, file_size).map_err(ctx)?;
        let backing_name = match header.backing {
            Some((offset, len)) => {
                let bytes = read_bytes(file.as_ref(), offset, u64::from(len))
                    .await
                    .map_err(ctx)?;
                Some(String::from_utf8(bytes.to_vec()).map_err(|_| {
                    ctx(corrupt("the backing file name is not UTF-8").with_operation("open qcow2"))
                })?)
            }
            None => None,
        };
        let l1_bytes = u64::from(header.l1_size) * 8;
        let l1 = if l1_bytes == 0 {
            Vec::new()
        } else {
            be_words(
                &read_bytes(file.as_ref(), header.l1_offset, l1_bytes)
                    .await
                    .map_err(ctx)?,
            )
        };
        let table_bytes = header.cluster_size() as usize;
        let meta = Meta {
            cache: L2Cache::new(table_bytes, options.l2_cache_bytes),
            header,
            l1,
            file_size,
            backing_name,
        };
        Ok(Self {
            meta: Arc::new(meta),
            file,
            backing: None,
        })
    }

    pub fn header(&self) -> &Header {
        &self.meta.header
    }

    /// The backing file name the image names (untrusted: the caller resolves it).
    pub fn backing_name(&self) -> Option<&str> {
        self.meta.backing_name.as_deref()
    }

    /// Reads unallocated ranges from `backing` instead of as zeroes.
    pub fn with_backing(mut self, backing: Arc<dyn Source>) -> Self {
        self.backing = Some(backing);
        self
    }

    async fn l2_table(&self, offset: u64) -> Result<Table> {
        if let Some(table) = self.meta.cache.get(offset) {
            return Ok(table);
        }
        let bytes = read_bytes(self.file.as_ref(), offset, self.meta.header.cluster_size()).await?;
        let table: Table = Arc::new(be_words(&bytes));
        self.meta.cache.insert(offset, table.clone());
        Ok(table)
    }

    /// Where the bytes of a prefix of `offset..offset + len` are, within one L2 table.
    async fn runs(&self, offset: u64, len: u64) -> Result<Vec<Run>> {
        let h = &self.meta.header;
        let coverage = h.l2_coverage();
        let end = (offset + len)
            .min(h.size)
            .min((offset / coverage + 1) * coverage);
        if offset >= end {
            return Ok(Vec::new());
        }
        let l1_index = (offset / coverage) as usize;
        let l1_entry = self.meta.l1.get(l1_index).copied().unwrap_or(0);
        let cluster_size = h.cluster_size();
        let Some(l2_offset) = table::l1_entry(l1_entry, cluster_size, self.meta.file_size)? else {
            return Ok(vec![Run {
                guest: offset,
                len: end - offset,
                place: Place::Unallocated,
            }]);
        };
        let table = self.l2_table(l2_offset).await?;
        let granule = if h.extended_l2 {
            cluster_size / table::SUBCLUSTERS
        } else {
            cluster_size
        };
        let mut runs: Vec<Run> = Vec::new();
        let mut pos = offset;
        while pos < end {
            let start = pos - pos % granule;
            let place = self.place(
                &table,
                pos % coverage / cluster_size,
                start % cluster_size / granule,
            )?;
            let place = match place {
                Place::Host(host) => Place::Host(host + (pos - start)),
                other => other,
            };
            let piece = Run {
                guest: pos,
                len: (start + granule).min(end) - pos,
                place,
            };
            push_run(&mut runs, piece, cluster_size);
            pos += piece.len;
        }
        Ok(runs)
    }

    /// The place of granule `sub` of cluster `index` of an L2 table.
    fn place(&self, table: &[u64], index: u64, sub: u64) -> Result<Place> {
        let h = &self.meta.header;
        let size = self.meta.file_size;
        if h.extended_l2 {
            let i = (index * 2) as usize;
            let (entry, bitmap) = (table[i], table[i + 1]);
            table::extended_l2_entry(entry, bitmap, sub, h.cluster_bits, size)
        } else {
            table::l2_entry(table[index as usize], h.cluster_bits, size)
        }
    }

    /// What the backing image says about `offset..offset + len` (zeroes past its end).
    async fn backing_extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let Some(backing) = &self.backing else {
            return Ok(vec![Extent::zero(offset, len)]);
        };
        extents_over(backing.as_ref(), offset, len).await
    }
}

/// What `backing` (a backing file, a differencing image's parent) says about all of
/// `offset..offset + len`, zeroes past its end.
pub(crate) async fn extents_over(
    backing: &dyn Source,
    offset: u64,
    len: u64,
) -> Result<Vec<Extent>> {
    let end = offset + len;
    let backed_end = end.min(backing.size()).max(offset);
    let mut out = Vec::new();
    let mut pos = offset;
    while pos < backed_end {
        let extents = backing.extents(pos, backed_end - pos).await?;
        let before = pos;
        for e in extents {
            let e_end = e.end().min(backed_end);
            if e.offset != pos || e_end <= pos {
                break;
            }
            out.push(Extent {
                offset: pos,
                len: e_end - pos,
                kind: e.kind,
            });
            pos = e_end;
        }
        if pos == before {
            return Err(Error::internal("the backing image reported no extent"));
        }
    }
    if pos < end {
        out.push(Extent::zero(pos, end - pos));
    }
    Ok(out)
}

/// Appends `piece`, merging it into the last run when both continue one another.
fn push_run(runs: &mut Vec<Run>, piece: Run, cluster_size: u64) {
    if let Some(last) = runs.last_mut() {
        let mergeable = match (last.place, piece.place) {
            (Place::Host(a), Place::Host(b)) => a + last.len == b,
            (Place::Zero, Place::Zero) | (Place::Unallocated, Place::Unallocated) => true,
            // A compressed run never leaves its cluster: reads index the cluster with it.
            (a @ Place::Compressed { .. }, b) => {
                a == b && last.guest / cluster_size == piece.guest / cluster_size
            }
            _ => false,
        };
        if mergeable && last.guest + last.len == piece.guest {
            last.len += piece.len;
            return;
        }
    }
    runs.push(piece);
}

mod read;

#[async_trait]
impl Source for Qcow2Source {
    fn describe(&self) -> String {
        self.file.describe()
    }

    fn size(&self) -> u64 {
        self.meta.header.size
    }

    fn caps(&self) -> Caps {
        let file = self.file.caps();
        Caps {
            extents: true,
            ..file
        }
    }

    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let mut out = Vec::new();
        for run in self
            .runs(offset, len)
            .await
            .map_err(|e| self.context(e, "extents", offset))?
        {
            match run.place {
                Place::Host(_) | Place::Compressed { .. } => {
                    out.push(Extent::data(run.guest, run.len))
                }
                Place::Zero => out.push(Extent::zero(run.guest, run.len)),
                Place::Unallocated => out.extend(self.backing_extents(run.guest, run.len).await?),
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
        let backing = match &self.backing {
            Some(b) => Some(b.connect().await?),
            None => None,
        };
        Ok(Arc::new(Self {
            meta: self.meta.clone(),
            file: self.file.connect().await?,
            backing,
        }))
    }

    async fn close(&self) -> Result<()> {
        if let Some(backing) = &self.backing {
            backing.close().await?;
        }
        self.file.close().await
    }
}

impl Qcow2Source {
    fn context(&self, e: Error, operation: &'static str, offset: u64) -> Error {
        e.at(operation, offset).with_endpoint(self.file.describe())
    }
}

/// The error of a guest range past the virtual size.
fn beyond_end(offset: u64, len: usize, size: u64) -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        format!("read of {len} bytes at {offset} is past the image's virtual size {size}"),
    )
}
