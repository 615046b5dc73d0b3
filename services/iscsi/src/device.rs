//! A logical unit as a block device: capacity, limits and provisioning learned once,
//! and the SBC commands a copy needs.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::scsi::{self, vpd, BlockLimits, Capacity, Inquiry, LbaExtent, Provisioning};
use crate::session::{Completion, DataBuf, Session, Transfer};

/// Allocation lengths of the small commands that learn the LUN: enough for the fields
/// we parse, and for a GET LBA STATUS answer of 255 descriptors.
const STANDARD_INQUIRY_LEN: u16 = 96;
const SUPPORTED_PAGES_LEN: u16 = 255;
const VPD_PAGE_LEN: u16 = 64;
const CAPACITY_LEN: u32 = 32;
const LBA_STATUS_LEN: u32 = 4096;

/// A LUN reached through a session.
#[derive(Debug)]
pub struct Device {
    session: Session,
    lun: u64,
    inquiry: Inquiry,
    capacity: Capacity,
    limits: BlockLimits,
    provisioning: Provisioning,
}

fn take<B: 'static>(c: Completion) -> Result<B> {
    c.buf
        .ok_or(Error::Closed)?
        .into_any()
        .downcast::<B>()
        .map(|b| *b)
        .map_err(|_| Error::Protocol("buffer type changed".into()))
}

impl Device {
    /// Logs in to `target` at `address` and reads the LUN's geometry and limits.
    pub async fn open(address: &str, target: &str, lun: u64, config: &Config) -> Result<Self> {
        let session = Session::connect(address, target, config).await?;
        Self::with_session(session, lun).await
    }

    /// Uses an established session for `lun`.
    pub async fn with_session(session: Session, lun: u64) -> Result<Self> {
        let inquiry = Inquiry::parse(
            &small(&session, lun, &scsi::inquiry(None, STANDARD_INQUIRY_LEN)).await?,
        )?;
        if inquiry.peripheral_type != scsi::PERIPHERAL_DISK {
            return Err(Error::InvalidRequest(format!(
                "LUN {lun} is not a block device (peripheral type {})",
                inquiry.peripheral_type
            )));
        }
        let capacity = match small(&session, lun, &scsi::read_capacity16(CAPACITY_LEN)).await {
            Ok(d) => Capacity::parse(&d)?,
            // A unit attention after login is reported once; ask again.
            Err(Error::CheckCondition(s)) if s.key == scsi::SENSE_KEY_UNIT_ATTENTION => {
                Capacity::parse(&small(&session, lun, &scsi::read_capacity16(CAPACITY_LEN)).await?)?
            }
            Err(e) => return Err(e),
        };
        let pages = small(
            &session,
            lun,
            &scsi::inquiry(Some(vpd::SUPPORTED_PAGES), SUPPORTED_PAGES_LEN),
        )
        .await
        .unwrap_or_default();
        let has = |p: u8| pages.len() > 4 && pages[4..].contains(&p);
        let limits = if has(vpd::BLOCK_LIMITS) {
            BlockLimits::parse(
                &small(
                    &session,
                    lun,
                    &scsi::inquiry(Some(vpd::BLOCK_LIMITS), VPD_PAGE_LEN),
                )
                .await?,
            )?
        } else {
            BlockLimits::default()
        };
        let provisioning = if has(vpd::LOGICAL_BLOCK_PROVISIONING) {
            Provisioning::parse(
                &small(
                    &session,
                    lun,
                    &scsi::inquiry(Some(vpd::LOGICAL_BLOCK_PROVISIONING), VPD_PAGE_LEN),
                )
                .await?,
            )?
        } else {
            Provisioning::default()
        };
        Ok(Self {
            session,
            lun,
            inquiry,
            capacity,
            limits,
            provisioning,
        })
    }

    pub fn session(&self) -> &Session {
        &self.session
    }
    pub fn inquiry(&self) -> &Inquiry {
        &self.inquiry
    }
    pub fn capacity(&self) -> Capacity {
        self.capacity
    }
    pub fn limits(&self) -> BlockLimits {
        self.limits
    }
    pub fn provisioning(&self) -> Provisioning {
        self.provisioning
    }
    pub fn block_size(&self) -> u32 {
        self.capacity.block_size
    }

    /// Thin provisioned with deallocated blocks reading as zeroes.
    pub fn thin(&self) -> bool {
        self.capacity.lbpme
    }

    /// Largest transfer of one READ/WRITE in blocks (the target's limit, else 64 MiB).
    pub fn max_transfer_blocks(&self) -> u32 {
        let default = (64 << 20) / self.block_size();
        match self.limits.max_transfer {
            0 => default,
            n => n.min(default),
        }
    }

    fn check_range(&self, lba: u64, blocks: u64) -> Result<()> {
        if lba
            .checked_add(blocks)
            .is_none_or(|e| e > self.capacity.blocks)
        {
            return Err(Error::InvalidRequest(format!(
                "blocks {lba}..+{blocks} are past the end ({} blocks)",
                self.capacity.blocks
            )));
        }
        Ok(())
    }

    fn blocks_of(&self, len: usize) -> Result<u32> {
        let bs = self.block_size() as usize;
        if !len.is_multiple_of(bs) {
            return Err(Error::InvalidRequest(format!(
                "{len} bytes is not a multiple of the {bs}-byte block size"
            )));
        }
        u32::try_from(len / bs).map_err(|_| Error::InvalidRequest("transfer too large".into()))
    }

    /// READ(16) filling all of `buf`.
    pub async fn read<B: DataBuf>(&self, lba: u64, mut buf: B) -> Result<B> {
        let blocks = self.blocks_of(buf.bytes_mut().len())?;
        self.check_range(lba, u64::from(blocks))?;
        if blocks == 0 {
            return Ok(buf);
        }
        let c = self
            .session
            .execute(
                self.lun,
                &scsi::read16(lba, blocks),
                Transfer::Read(Box::new(buf)),
            )
            .await?;
        if c.residual != 0 {
            return Err(Error::Protocol(format!(
                "READ(16) came back {} bytes short",
                c.residual
            )));
        }
        take(c)
    }

    /// WRITE(16) of all of `data`.
    pub async fn write(&self, lba: u64, data: &[u8]) -> Result<()> {
        let blocks = self.blocks_of(data.len())?;
        self.check_range(lba, u64::from(blocks))?;
        if blocks == 0 {
            return Ok(());
        }
        let c = self
            .session
            .execute(self.lun, &scsi::write16(lba, blocks), Transfer::Write(data))
            .await?;
        if c.residual != 0 {
            return Err(Error::Protocol(format!(
                "WRITE(16) left {} bytes unwritten",
                c.residual
            )));
        }
        Ok(())
    }

    /// Largest WRITE SAME in blocks.
    pub fn max_write_same_blocks(&self) -> u32 {
        let cap = match self.limits.max_write_same {
            0 => u64::from(self.max_transfer_blocks()),
            n => n,
        };
        cap.min(u64::from(u32::MAX)) as u32
    }

    /// WRITE SAME(16) of zeroes over `blocks` blocks from `lba` (one command: callers split
    /// by [`Device::max_write_same_blocks`]); `unmap` lets the target deallocate.
    pub async fn write_same_zero(&self, lba: u64, blocks: u32, unmap: bool) -> Result<()> {
        self.check_range(lba, u64::from(blocks))?;
        if blocks == 0 {
            return Ok(());
        }
        let zero = vec![0u8; self.block_size() as usize];
        self.session
            .execute(
                self.lun,
                &scsi::write_same16(lba, blocks, unmap),
                Transfer::Write(&zero),
            )
            .await
            .map(|_| ())
    }

    /// UNMAP of (lba, blocks) ranges.
    pub async fn unmap(&self, ranges: &[(u64, u32)]) -> Result<()> {
        for (lba, n) in ranges {
            self.check_range(*lba, u64::from(*n))?;
        }
        let (cdb, params) = scsi::unmap(ranges);
        let mut cdb16 = [0u8; 16];
        cdb16[..10].copy_from_slice(&cdb[..10]);
        self.session
            .execute(self.lun, &cdb16, Transfer::Write(&params))
            .await
            .map(|_| ())
    }

    /// GET LBA STATUS from `lba`: descriptors starting at `lba`.
    pub async fn lba_status(&self, lba: u64) -> Result<Vec<LbaExtent>> {
        self.check_range(lba, 1)?;
        let d = small(
            &self.session,
            self.lun,
            &scsi::get_lba_status(lba, LBA_STATUS_LEN),
        )
        .await?;
        scsi::parse_lba_status(&d)
    }

    /// SYNCHRONIZE CACHE(16) of the whole LUN.
    pub async fn sync(&self) -> Result<()> {
        self.session
            .execute(self.lun, &scsi::sync_cache16(0, 0), Transfer::None)
            .await
            .map(|_| ())
    }

    /// Logs out.
    pub async fn close(&self) -> Result<()> {
        self.session.logout().await
    }
}

/// A command returning a few bytes of data (allocation length from the CDB).
async fn small(session: &Session, lun: u64, cdb: &[u8; 16]) -> Result<Vec<u8>> {
    let alloc = match cdb[0] {
        scsi::opcode::INQUIRY => usize::from(u16::from_be_bytes([cdb[3], cdb[4]])),
        _ => u32::from_be_bytes([cdb[10], cdb[11], cdb[12], cdb[13]]) as usize,
    };
    let c = session
        .execute(lun, cdb, Transfer::Read(Box::new(vec![0u8; alloc])))
        .await?;
    let residual = c.residual as usize;
    let mut v: Vec<u8> = take(c)?;
    v.truncate(alloc.saturating_sub(residual));
    Ok(v)
}
