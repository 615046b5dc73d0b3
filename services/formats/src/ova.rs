//! OVA: a tar holding an OVF descriptor and one or more disk images (usually
//! streamOptimized VMDKs). Ferry lists the disks (every regular file but the OVF, its
//! manifest and certificate), picks one (`--disk N`, or the only one) and opens it as an
//! image of its own, through a [`SliceSource`] of the archive: nothing is extracted.

use std::sync::Arc;

use ferry_core::{Error, Result, Source};

use crate::composite::SliceSource;
use crate::tar;

/// A disk in an OVA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OvaDisk {
    pub name: String,
    /// Bytes of the disk file in the archive.
    pub size: u64,
}

fn is_disk(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    ![".ovf", ".mf", ".cert", ".nvram"]
        .iter()
        .any(|ext| lower.ends_with(ext))
}

/// The OVA's disks, and the bytes of disk `choice` (the only one when `None`).
pub async fn open_ova(
    file: Arc<dyn Source>,
    choice: Option<usize>,
) -> Result<(Arc<dyn Source>, Vec<OvaDisk>, usize)> {
    let entries = tar::entries(file.as_ref()).await?;
    if !entries
        .iter()
        .any(|e| e.name.to_ascii_lowercase().ends_with(".ovf"))
    {
        return Err(Error::invalid_input(
            "the tar holds no .ovf descriptor: it is not an OVA (copy it with \
             --source-format raw to copy the tar itself)",
        ));
    }
    let disks: Vec<_> = entries.into_iter().filter(|e| is_disk(&e.name)).collect();
    let listed = disks
        .iter()
        .map(|e| OvaDisk {
            name: e.name.clone(),
            size: e.size,
        })
        .collect();
    let names = || {
        disks
            .iter()
            .enumerate()
            .map(|(i, d)| format!("{i}: {}", d.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let index = match (choice, disks.len()) {
        (_, 0) => return Err(Error::invalid_input("the OVA holds no disk")),
        (None, 1) => 0,
        (None, n) => {
            return Err(Error::invalid_input(format!(
                "the OVA holds {n} disks ({}); pick one with --disk N",
                names()
            )))
        }
        (Some(i), n) if i >= n => {
            return Err(Error::invalid_input(format!(
                "--disk {i}: the OVA holds {n} disks ({}), numbered from 0",
                names()
            )))
        }
        (Some(i), _) => i,
    };
    let disk = &disks[index];
    let name = format!("{} [{}]", file.describe(), disk.name);
    let bytes = SliceSource::new(file, disk.offset, disk.size, name);
    Ok((Arc::new(bytes), listed, index))
}
