//! Reading guest bytes: one byte-source read per contiguous host run, straight into the
//! caller's buffer (its view moved over each run's part), zero fill for zero ranges.

use ferry_core::{IoBuf, Result};

use super::compressed::decompress;
use super::table::{corrupt, Place};
use super::{beyond_end, read_bytes, Qcow2Source, Run};

impl Qcow2Source {
    pub(super) async fn read_into(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let view = buf.view();
        let total = view.len() as u64;
        if offset
            .checked_add(total)
            .is_none_or(|end| end > self.meta.header.size)
        {
            return Err(beyond_end(offset, view.len(), self.meta.header.size));
        }
        let mut done = 0u64;
        while done < total {
            let runs = self.runs(offset + done, total - done).await?;
            if runs.is_empty() {
                return Err(corrupt("no mapping for an in-bounds range"));
            }
            for run in runs {
                buf.set_view(view.start + (run.guest - offset) as usize, run.len as usize);
                buf = self.read_run(run, buf).await?;
                done += run.len;
            }
        }
        buf.set_view(view.start, view.len());
        Ok(buf)
    }

    /// Fills the buffer's view with the bytes of `run`.
    async fn read_run(&self, run: Run, mut buf: IoBuf) -> Result<IoBuf> {
        match run.place {
            Place::Host(host) => {
                if host
                    .checked_add(run.len)
                    .is_none_or(|end| end > self.meta.file_size)
                {
                    return Err(corrupt(format!(
                        "data at host offset {host} ({} bytes) is past the end of the image file",
                        run.len
                    )));
                }
                self.file.read_at(host, buf).await
            }
            Place::Zero => {
                buf.fill(0);
                Ok(buf)
            }
            Place::Unallocated => self.read_backing(run, buf).await,
            Place::Compressed { offset, len } => {
                let cluster_size = self.meta.header.cluster_size();
                let len = len.min(self.meta.file_size - offset);
                let input = read_bytes(self.file.as_ref(), offset, len).await?;
                let mut cluster = vec![0u8; cluster_size as usize];
                let kind = self.meta.header.compression;
                decompress(kind, &input, &mut cluster)?;
                let at = (run.guest % cluster_size) as usize;
                buf.copy_from_slice(&cluster[at..at + run.len as usize]);
                Ok(buf)
            }
        }
    }

    /// Fills the view with the backing image's bytes, zeroes past its end or without one.
    async fn read_backing(&self, run: Run, mut buf: IoBuf) -> Result<IoBuf> {
        let Some(backing) = &self.backing else {
            buf.fill(0);
            return Ok(buf);
        };
        let backed = backing.size().saturating_sub(run.guest).min(run.len) as usize;
        let view = buf.view();
        if backed > 0 {
            buf.set_view(view.start, backed);
            buf = backing.read_at(run.guest, buf).await?;
        }
        if backed < view.len() {
            buf.set_view(view.start + backed, view.len() - backed);
            buf.fill(0);
        }
        buf.set_view(view.start, view.len());
        Ok(buf)
    }
}
