//! Images made of pieces: [`SliceSource`] (a byte range of another source: a flat VMDK
//! extent, a disk inside an OVA's tar) and [`ConcatSource`] (sources one after another: a
//! VMDK split into extents).

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Caps, Error, Extent, IoBuf, Result, Source};

/// `len` bytes of `inner` starting at `start`, as a source of its own.
pub struct SliceSource {
    inner: Arc<dyn Source>,
    start: u64,
    len: u64,
    name: String,
}

impl SliceSource {
    /// The caller has checked that `start + len` lies inside `inner`.
    pub fn new(inner: Arc<dyn Source>, start: u64, len: u64, name: String) -> Self {
        Self {
            inner,
            start,
            len,
            name,
        }
    }
}

#[async_trait]
impl Source for SliceSource {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn size(&self) -> u64 {
        self.len
    }

    fn caps(&self) -> Caps {
        // Reads off the inner source's blocks are widened (see `read_at`).
        crate::widened_caps(self.inner.caps(), false)
    }

    async fn read_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        let len = buf.view().len() as u64;
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(Error::invalid_input(format!(
                "read of {len} bytes at {offset} is past the end of {} ({} bytes)",
                self.name, self.len
            )));
        }
        let block = u64::from(self.inner.caps().block.minimum.max(1));
        let at = self.start + offset;
        if at.is_multiple_of(block) && len.is_multiple_of(block) {
            return self.inner.read_at(at, buf).await;
        }
        // The slice starts inside a block of a source that reads whole blocks only.
        let mut buf = buf;
        let bytes = crate::qcow2::read_bytes(self.inner.as_ref(), at, len).await?;
        buf.copy_from_slice(&bytes);
        Ok(buf)
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(Self {
            inner: self.inner.connect().await?,
            start: self.start,
            len: self.len,
            name: self.name.clone(),
        }))
    }

    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}

/// A source that is all zeroes (a VMDK ZERO extent).
pub struct ZeroSource(pub u64);

#[async_trait]
impl Source for ZeroSource {
    fn describe(&self) -> String {
        "zero extent".into()
    }

    fn size(&self) -> u64 {
        self.0
    }

    fn caps(&self) -> Caps {
        Caps {
            extents: true,
            ..Caps::default()
        }
    }

    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        Ok(vec![Extent::zero(
            offset,
            len.min(self.0.saturating_sub(offset)),
        )])
    }

    async fn read_at(&self, _offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        buf.fill(0);
        Ok(buf)
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(Self(self.0)))
    }
}

/// Sources one after another.
pub struct ConcatSource {
    /// (guest start, part), in order, contiguous.
    parts: Vec<(u64, Arc<dyn Source>)>,
    size: u64,
    name: String,
}

impl ConcatSource {
    pub fn new(parts: Vec<Arc<dyn Source>>, name: String) -> Self {
        let mut at = 0;
        let parts = parts
            .into_iter()
            .map(|p| {
                let start = at;
                at += p.size();
                (start, p)
            })
            .collect();
        Self {
            parts,
            size: at,
            name,
        }
    }

    /// The part holding guest offset `offset` (which is below the size).
    fn part(&self, offset: u64) -> &(u64, Arc<dyn Source>) {
        let i = self.parts.partition_point(|(start, _)| *start <= offset);
        &self.parts[i - 1]
    }
}

#[async_trait]
impl Source for ConcatSource {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        let first = self
            .parts
            .first()
            .map(|(_, p)| p.caps())
            .unwrap_or_default();
        Caps {
            extents: true,
            block: ferry_core::BlockSizes {
                minimum: 1,
                ..first.block
            },
            ..first
        }
    }

    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let end = offset.saturating_add(len).min(self.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let (start, part) = self.part(offset);
        let within = (end - offset).min(start + part.size() - offset);
        let mut out = part.extents(offset - start, within).await?;
        for e in &mut out {
            e.offset += start;
        }
        Ok(out)
    }

    async fn read_at(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let view = buf.view();
        let total = view.len() as u64;
        if offset.checked_add(total).is_none_or(|end| end > self.size) {
            return Err(Error::invalid_input(format!(
                "read of {total} bytes at {offset} is past the image's size {}",
                self.size
            )));
        }
        let mut done = 0;
        while done < total {
            let pos = offset + done;
            let (start, part) = self.part(pos);
            let n = (total - done).min(start + part.size() - pos);
            buf.set_view(view.start + done as usize, n as usize);
            buf = part.read_at(pos - start, buf).await?;
            done += n;
        }
        buf.set_view(view.start, view.len());
        Ok(buf)
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        let mut parts = Vec::with_capacity(self.parts.len());
        for (start, part) in &self.parts {
            parts.push((*start, part.connect().await?));
        }
        Ok(Arc::new(Self {
            parts,
            size: self.size,
            name: self.name.clone(),
        }))
    }

    async fn close(&self) -> Result<()> {
        for (_, part) in &self.parts {
            part.close().await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_testkit::MemSource;

    #[tokio::test]
    async fn slices_and_concatenations_read_across_parts() {
        let file: Arc<dyn Source> = Arc::new(MemSource::new((0..100u8).collect()));
        let a: Arc<dyn Source> = Arc::new(SliceSource::new(file.clone(), 10, 5, "a".into()));
        let z: Arc<dyn Source> = Arc::new(ZeroSource(3));
        let b: Arc<dyn Source> = Arc::new(SliceSource::new(file, 50, 4, "b".into()));
        let c = ConcatSource::new(vec![a, z, b], "c".into());
        assert_eq!(c.size(), 12);
        let buf = c.read_at(3, IoBuf::new(8)).await.unwrap();
        assert_eq!(&buf[..], &[13, 14, 0, 0, 0, 50, 51, 52]);
        let e = c.extents(6, 6).await.unwrap();
        assert_eq!(e, vec![Extent::zero(6, 2)]);
        assert!(c.read_at(10, IoBuf::new(3)).await.is_err());
    }
}
