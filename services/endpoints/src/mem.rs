//! In-memory endpoints: a source over a byte vector that reports extents, and a target
//! that stores the bytes and records every operation.
//!
//! They exist for tests (engine, service, conformance) that need real endpoint behaviour
//! without files or servers: holes, block-size limits and an exact log of what a copy did.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use ferry_core::{merge_extents, Caps, Error, Extent, IoBuf, Result, Source, Target, ZeroMode};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn check_range(what: &'static str, offset: u64, len: u64, size: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::invalid_input(format!(
            "{len} bytes at {offset} reach past the end of a {size}-byte image"
        ))
        .at(what, offset)),
    }
}

/// A source over bytes in memory. Clones share the bytes.
#[derive(Debug, Clone)]
pub struct MemSource {
    data: Arc<Vec<u8>>,
    extents: Arc<Vec<Extent>>,
    caps: Caps,
}

impl MemSource {
    /// All data, as a source without extent information reports it.
    pub fn new(data: Vec<u8>) -> Self {
        let len = data.len() as u64;
        Self {
            data: Arc::new(data),
            extents: Arc::new(merge_extents([Extent::data(0, len)])),
            caps: Caps::default(),
        }
    }

    /// Reports every all-zero `block`-sized block as a zero extent, as a sparse file
    /// would (the last block may be short).
    pub fn sparse(data: Vec<u8>, block: usize) -> Self {
        let block = block.max(1);
        let extents = data.chunks(block).enumerate().map(|(i, chunk)| {
            let offset = (i * block) as u64;
            if chunk.iter().all(|&b| b == 0) {
                Extent::zero(offset, chunk.len() as u64)
            } else {
                Extent::data(offset, chunk.len() as u64)
            }
        });
        let extents = merge_extents(extents);
        let mut source = Self::new(data);
        source.extents = Arc::new(extents);
        source.caps.extents = true;
        source
    }

    /// Makes `[start, end)` ranges holes: their bytes become zeroes and they are reported
    /// as zero extents.
    pub fn with_holes(mut self, holes: &[(u64, u64)]) -> Result<Self> {
        let size = self.size();
        let data = Arc::make_mut(&mut self.data);
        let mut extents = Vec::new();
        let mut pos = 0;
        let mut sorted = holes.to_vec();
        sorted.sort_unstable();
        for (start, end) in sorted {
            if start < pos || end < start || end > size {
                return Err(Error::invalid_input(format!(
                    "hole {start}..{end} overlaps another or lies outside the {size}-byte image"
                )));
            }
            data[start as usize..end as usize].fill(0);
            extents.push(Extent::data(pos, start - pos));
            extents.push(Extent::zero(start, end - start));
            pos = end;
        }
        extents.push(Extent::data(pos, size - pos));
        self.extents = Arc::new(merge_extents(extents));
        self.caps.extents = true;
        Ok(self)
    }

    /// Sets the capabilities (block sizes, ...) the source reports.
    pub fn with_caps(mut self, caps: Caps) -> Self {
        self.caps = caps;
        self
    }

    pub fn data(&self) -> &[u8] {
        &self.data
    }
}

#[async_trait]
impl Source for MemSource {
    fn describe(&self) -> String {
        format!("memory ({} bytes)", self.data.len())
    }

    fn size(&self) -> u64 {
        self.data.len() as u64
    }

    fn caps(&self) -> Caps {
        self.caps
    }

    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        check_range("extents", offset, len, self.size())?;
        let end = offset + len;
        Ok(self
            .extents
            .iter()
            .filter(|e| e.end() > offset && e.offset < end)
            .map(|e| {
                let start = e.offset.max(offset);
                Extent {
                    offset: start,
                    len: e.end().min(end) - start,
                    kind: e.kind,
                }
            })
            .collect())
    }

    async fn read_at(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let len = buf.len() as u64;
        check_range("read", offset, len, self.size())?;
        buf.copy_from_slice(&self.data[offset as usize..(offset + len) as usize]);
        Ok(buf)
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(self.clone()))
    }
}

/// One operation a [`MemTarget`] received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemOp {
    Write {
        offset: u64,
        len: u64,
    },
    Zero {
        offset: u64,
        len: u64,
        mode: ZeroMode,
    },
    Flush,
}

#[derive(Debug, Default)]
struct TargetState {
    data: Mutex<Vec<u8>>,
    ops: Mutex<Vec<MemOp>>,
    finished: AtomicBool,
    aborted: AtomicBool,
}

/// A target that stores bytes in memory and records every operation. Clones (and
/// [`Target::connect`] handles) share the bytes and the log.
#[derive(Debug, Clone)]
pub struct MemTarget {
    size: u64,
    is_zero: bool,
    caps: Caps,
    state: Arc<TargetState>,
}

impl MemTarget {
    /// A zero-filled target of `size` bytes that says it reads as zeroes.
    pub fn new(size: u64) -> Result<Self> {
        let len = usize::try_from(size)
            .map_err(|_| Error::invalid_input(format!("{size} bytes do not fit in memory")))?;
        Ok(Self::with_data(vec![0; len]).known_zero())
    }

    /// A target holding `data` already (not known to be zero).
    pub fn with_data(data: Vec<u8>) -> Self {
        Self {
            size: data.len() as u64,
            is_zero: false,
            caps: Caps {
                efficient_zero: true,
                trim: true,
                ..Caps::default()
            },
            state: Arc::new(TargetState {
                data: Mutex::new(data),
                ..TargetState::default()
            }),
        }
    }

    fn known_zero(mut self) -> Self {
        self.is_zero = true;
        self
    }

    /// Sets the capabilities (block sizes, random writes, ...) the target reports.
    pub fn with_caps(mut self, caps: Caps) -> Self {
        self.caps = caps;
        self
    }

    /// The bytes written so far.
    pub fn data(&self) -> Vec<u8> {
        lock(&self.state.data).clone()
    }

    /// Every operation, in the order received.
    pub fn ops(&self) -> Vec<MemOp> {
        lock(&self.state.ops).clone()
    }

    /// Whether [`Target::finish`] was called (and succeeded).
    pub fn is_finished(&self) -> bool {
        self.state.finished.load(Ordering::SeqCst)
    }

    /// Whether [`Target::abort`] was called.
    pub fn is_aborted(&self) -> bool {
        self.state.aborted.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Target for MemTarget {
    fn describe(&self) -> String {
        format!("memory ({} bytes)", self.size)
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        self.caps
    }

    fn is_zero(&self) -> bool {
        self.is_zero
    }

    async fn write_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        let len = buf.len() as u64;
        check_range("write", offset, len, self.size)?;
        lock(&self.state.data)[offset as usize..(offset + len) as usize].copy_from_slice(&buf);
        lock(&self.state.ops).push(MemOp::Write { offset, len });
        Ok(buf)
    }

    async fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        check_range("write_zeroes", offset, len, self.size)?;
        lock(&self.state.data)[offset as usize..(offset + len) as usize].fill(0);
        lock(&self.state.ops).push(MemOp::Zero { offset, len, mode });
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        lock(&self.state.ops).push(MemOp::Flush);
        Ok(())
    }

    async fn connect(&self) -> Result<Arc<dyn Target>> {
        Ok(Arc::new(self.clone()))
    }

    async fn finish(&self) -> Result<()> {
        self.flush().await?;
        self.state.finished.store(true, Ordering::SeqCst);
        Ok(())
    }

    async fn abort(&self) -> Result<()> {
        self.state.aborted.store(true, Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn source_reports_holes_and_reads_bytes() {
        let src = MemSource::new((1..=100u8).collect())
            .with_holes(&[(10, 20), (50, 100)])
            .unwrap();
        assert_eq!(
            src.extents(0, 100).await.unwrap(),
            vec![
                Extent::data(0, 10),
                Extent::zero(10, 10),
                Extent::data(20, 30),
                Extent::zero(50, 50)
            ]
        );
        assert_eq!(
            src.extents(15, 10).await.unwrap(),
            vec![Extent::zero(15, 5), Extent::data(20, 5)]
        );
        let mut buf = IoBuf::new(8);
        buf.set_len(8);
        let buf = src.read_at(6, buf).await.unwrap();
        assert_eq!(&buf[..], &[7, 8, 9, 10, 0, 0, 0, 0]);
        assert!(src.read_at(95, IoBuf::new(8)).await.is_err());
        assert!(MemSource::new(vec![0; 10]).with_holes(&[(5, 11)]).is_err());
    }

    #[tokio::test]
    async fn sparse_source_finds_zero_blocks() {
        let mut data = vec![0u8; 10];
        data[4] = 1;
        let src = MemSource::sparse(data, 4);
        assert_eq!(
            src.extents(0, 10).await.unwrap(),
            vec![Extent::zero(0, 4), Extent::data(4, 4), Extent::zero(8, 2)]
        );
    }

    #[tokio::test]
    async fn target_stores_and_records() {
        let tgt = MemTarget::new(16).unwrap();
        assert!(tgt.is_zero());
        let handle = tgt.connect().await.unwrap();
        let mut buf = IoBuf::new(4);
        buf.copy_from_slice(&[1, 2, 3, 4]);
        handle.write_at(2, buf).await.unwrap();
        handle
            .write_zeroes(3, 1, ZeroMode::MayDeallocate)
            .await
            .unwrap();
        handle.finish().await.unwrap();
        assert_eq!(&tgt.data()[..8], &[0, 0, 1, 0, 3, 4, 0, 0]);
        assert_eq!(
            tgt.ops(),
            vec![
                MemOp::Write { offset: 2, len: 4 },
                MemOp::Zero {
                    offset: 3,
                    len: 1,
                    mode: ZeroMode::MayDeallocate
                },
                MemOp::Flush
            ]
        );
        assert!(tgt.is_finished() && !tgt.is_aborted());
        let err = tgt.write_at(14, IoBuf::new(4)).await.unwrap_err();
        assert_eq!(err.context().operation, Some("write"));
        assert!(!MemTarget::with_data(vec![1]).is_zero());
    }
}
