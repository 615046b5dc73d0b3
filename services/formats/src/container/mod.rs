//! Container layers: the tar (plain, gzip or zstd) of a KubeVirt containerDisk, holding
//! its disk as `/disk/<name>` (qcow2 or raw), read as that disk without extracting it.
//!
//! A plain tar over a source that reads at any offset (a registry that serves ranges) is
//! listed header by header ([`crate::tar::entries`]) and the disk read in place, by
//! ranges. Otherwise the tar is decompressed front to back ([`stream::TarStream`]): the
//! headers are parsed as they stream by, and the disk is the first regular file under
//! `disk/` (or, in other layouts, the first regular file, which must then be the only
//! one). Its bytes are a sequential source of the size its header gives; a qcow2 among
//! them is read in order, and one whose tables come after the data they map fails with a
//! clear error (no scratch space is used; see [`stream`]).
//!
//! [`Source::finish`] of the disk checks the rest of the layer: the remaining headers
//! (a second file where the layout promised one, a header that lies about its size), the
//! end of the archive (at most [`TRAILING_ZEROES`] of padding may follow it: more is a
//! decompression bomb), and then the layer's own digest, through the byte source's
//! `finish`.

pub(crate) mod stream;

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Caps, Error, ErrorKind, Extent, IoBuf, Result, Source};
use tokio::sync::Mutex;

use crate::composite::SliceSource;
use crate::detect::{Detected, SourceFormat};
use crate::open::{ImageInfo, OpenOptions};
use crate::tar;
use stream::TarStream;

/// Decompressed bytes allowed after the tar's end-of-archive blocks (tar pads its last
/// record; more than this is a stream that keeps going: a decompression bomb).
pub const TRAILING_ZEROES: u64 = 1 << 20;
/// Files outside `disk/` smaller than this are not taken for the disk.
pub const SMALL_FILE: u64 = 1 << 20;
/// Bytes of entries allowed after the disk (a layer that holds more is refused).
pub const MAX_AFTER_DISK: u64 = 64 << 20;

fn corrupt(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, message.into())
}

/// One parsed header block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Header {
    /// An all-zero block: the end of the archive.
    End,
    /// An entry: its type flag, name and data size.
    Entry { kind: u8, name: String, size: u64 },
}

/// Parses a 512-byte tar header block (checksum checked).
pub fn parse_header(h: &[u8]) -> Result<Header> {
    if h.len() < 512 {
        return Err(corrupt("a tar header block is cut short"));
    }
    if h[..512].iter().all(|&b| b == 0) {
        return Ok(Header::End);
    }
    // A header whose checksum field is not even a number is where the entry before it
    // said its data ends: that entry lies about its size (or the layer is damaged).
    let not_a_header = || {
        corrupt("a tar header is not where the entry before it ends: that entry lies about its size, or the layer is damaged")
    };
    if !tar::checksum_ok(h).map_err(|_| not_a_header())? {
        return Err(corrupt("a tar header has a wrong checksum"));
    }
    let size = tar::number(&h[124..136])?;
    let prefix = tar::text(&h[345..500]);
    let base = tar::text(&h[..100]);
    let name = if prefix.is_empty() || &h[257..263] != b"ustar\0" {
        base
    } else {
        format!("{prefix}/{base}")
    };
    Ok(Header::Entry {
        kind: h[156],
        name,
        size,
    })
}

/// A path as tar stores it (`./disk/x`, `/disk/x`, `disk/x`) without its leading `./`
/// and `/`.
fn clean(name: &str) -> &str {
    let mut n = name;
    loop {
        if let Some(r) = n.strip_prefix("./") {
            n = r;
        } else if let Some(r) = n.strip_prefix('/') {
            n = r;
        } else {
            return n;
        }
    }
}

fn is_disk(name: &str) -> bool {
    clean(name)
        .strip_prefix("disk/")
        .is_some_and(|f| !f.is_empty() && !f.contains('/'))
}

/// A regular file's entry in the tar stream.
#[derive(Debug, Clone)]
struct Found {
    name: String,
    /// Where its data starts in the decompressed tar.
    offset: u64,
    size: u64,
}

/// Walks headers from `at` (a header's offset) until a regular file (returned with the
/// offset after its data) or the end of the archive (None). Long names and pax records
/// are applied; other entries are skipped. `budget` bounds the bytes walked.
async fn next_file(tar: &mut TarStream, mut at: u64, budget: u64) -> Result<Option<(Found, u64)>> {
    let start = at;
    let mut long_name: Option<String> = None;
    let mut pax_size: Option<u64> = None;
    let mut entries = 0usize;
    loop {
        if at - start > budget {
            return Err(corrupt(format!(
                "the layer holds more than {} MiB besides its disk",
                budget >> 20
            )));
        }
        entries += 1;
        if entries > tar::MAX_ENTRIES {
            return Err(corrupt(format!(
                "the layer's tar has more than {} entries",
                tar::MAX_ENTRIES
            )));
        }
        let mut block = [0u8; 512];
        match tar.read(at, &mut block).await {
            Ok(()) => {}
            // A tar that simply stops (no end blocks) ends the walk too.
            Err(_) if tar.ended() == Some(at) => return Ok(None),
            Err(e) => return Err(e),
        }
        let (kind, name, size) = match parse_header(&block)? {
            Header::End => return Ok(None),
            Header::Entry { kind, name, size } => (kind, name, pax_size.take().unwrap_or(size)),
        };
        let data = at + 512;
        let next = size
            .div_ceil(512)
            .checked_mul(512)
            .and_then(|n| data.checked_add(n))
            .ok_or_else(|| corrupt("a tar entry's size overflows"))?;
        match kind {
            b'L' | b'x' => {
                if size > tar::MAX_EXTENDED {
                    return Err(corrupt(format!("a tar extended header of {size} bytes")));
                }
                let mut body = vec![0u8; size as usize];
                tar.read(data, &mut body).await?;
                if kind == b'L' {
                    long_name = Some(tar::text(&body));
                } else {
                    let (path, psize) = tar::pax(&body);
                    long_name = path.or(long_name);
                    pax_size = psize;
                }
            }
            b'0' | 0 | b'7' => {
                let name = long_name.take().unwrap_or(name);
                return Ok(Some((
                    Found {
                        name,
                        offset: data,
                        size,
                    },
                    next,
                )));
            }
            _ => long_name = None,
        }
        at = next;
    }
}

/// The state of a streamed layer, shared by the disk's handles and its finish.
struct Streamed {
    tar: Mutex<TarStream>,
    disk: Found,
    /// The disk was not under `disk/`: it must be the only file.
    must_be_only: bool,
}

impl Streamed {
    /// Reads the rest of the tar after the disk: its headers, its end, and no more.
    async fn finish(&self) -> Result<()> {
        let mut tar = self.tar.lock().await;
        let after = (self.disk.offset + self.disk.size).div_ceil(512) * 512;
        let mut at = after;
        while let Some((file, next)) = next_file(&mut tar, at, MAX_AFTER_DISK).await? {
            if self.must_be_only {
                return Err(Error::invalid_input(format!(
                    "the layer holds no disk/ directory and more than one file ({} and {}): \
                     ferry cannot tell which is the disk (put it under /disk/)",
                    self.disk.name, file.name
                )));
            }
            // Skip the data without keeping it.
            let mut scratch = vec![0u8; 1 << 16];
            let mut pos = file.offset;
            let end = file.offset + file.size;
            while pos < end {
                let n = (end - pos).min(scratch.len() as u64) as usize;
                tar.read(pos, &mut scratch[..n]).await?;
                pos += n as u64;
            }
            at = next;
        }
        // Past the end-of-archive block: padding, then the stream must end.
        let limit = tar.end().max(at) + TRAILING_ZEROES;
        while tar.pull().await? {
            if tar.end() > limit {
                return Err(corrupt(format!(
                    "the layer decompresses to more than its tar archive holds (over {} MiB \
                     past the archive's end): a decompression bomb, refused",
                    TRAILING_ZEROES >> 20
                )));
            }
        }
        Ok(())
    }
}

/// The disk's bytes inside a streamed tar.
struct EntrySource {
    streamed: Arc<Streamed>,
    name: String,
}

#[async_trait]
impl Source for EntrySource {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn size(&self) -> u64 {
        self.streamed.disk.size
    }

    fn caps(&self) -> Caps {
        Caps {
            sequential_read: true,
            multi_conn: false,
            random_write: false,
            ..Caps::default()
        }
    }

    async fn read_at(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let disk = &self.streamed.disk;
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|e| e > disk.size)
        {
            return Err(Error::invalid_input(format!(
                "read of {} bytes at {offset} is past the end of {} ({} bytes)",
                buf.len(),
                self.name,
                disk.size
            )));
        }
        self.streamed
            .tar
            .lock()
            .await
            .read(disk.offset + offset, &mut buf)
            .await
            .map_err(|e| e.at("read layer", offset).with_endpoint(self.name.clone()))?;
        Ok(buf)
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(Self {
            streamed: self.streamed.clone(),
            name: self.name.clone(),
        }))
    }
}

/// The disk image of a layer: the image read, and what its finish checks.
pub(crate) struct LayerImage {
    image: Arc<dyn Source>,
    bytes: Arc<dyn Source>,
    streamed: Option<Arc<Streamed>>,
}

#[async_trait]
impl Source for LayerImage {
    fn describe(&self) -> String {
        self.image.describe()
    }

    fn size(&self) -> u64 {
        self.image.size()
    }

    fn caps(&self) -> Caps {
        self.image.caps()
    }

    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.image.extents(offset, len).await
    }

    async fn read_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        self.image.read_at(offset, buf).await
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(Self {
            image: self.image.connect().await?,
            bytes: self.bytes.clone(),
            streamed: self.streamed.clone(),
        }))
    }

    fn version(&self) -> Option<String> {
        self.bytes.version()
    }

    async fn finish(&self) -> Result<()> {
        if let Some(s) = &self.streamed {
            s.finish().await.map_err(|e| {
                e.with_operation("check layer")
                    .with_endpoint(self.bytes.describe())
            })?;
        }
        self.image.finish().await?;
        self.bytes.finish().await
    }

    async fn close(&self) -> Result<()> {
        self.bytes.close().await
    }
}

/// Opens the disk in the layer whose bytes are `bytes`, compressed as `compression`
/// says (raw: a plain tar).
pub(crate) async fn open_container_layer(
    bytes: Arc<dyn Source>,
    compression: Detected,
    options: &OpenOptions,
    seen: &mut Vec<String>,
) -> Result<(Arc<dyn Source>, ImageInfo)> {
    let inner_options = OpenOptions {
        container_layer: None,
        ..options.clone()
    };
    let format = match options.format {
        SourceFormat::Raw => SourceFormat::Raw,
        SourceFormat::Qcow2 => SourceFormat::Qcow2,
        SourceFormat::Auto => SourceFormat::Auto,
        other => {
            return Err(Error::invalid_input(format!(
                "--source-format {}: a containerDisk's disk is read as qcow2 or raw",
                other.as_str()
            )))
        }
    };
    let (disk_bytes, name, streamed): (Arc<dyn Source>, String, Option<Arc<Streamed>>) =
        if compression == Detected::Raw && !bytes.caps().sequential_read {
            let entries = tar::entries(bytes.as_ref()).await?;
            let chosen = entries
                .iter()
                .find(|e| is_disk(&e.name))
                .or(match entries.as_slice() {
                    [only] => Some(only),
                    _ => None,
                })
                .ok_or_else(|| no_disk(entries.iter().map(|e| e.name.as_str())))?;
            let name = format!("{} [{}]", bytes.describe(), clean(&chosen.name));
            let slice = SliceSource::new(bytes.clone(), chosen.offset, chosen.size, name.clone());
            (Arc::new(slice), clean(&chosen.name).to_string(), None)
        } else {
            let mut tar = TarStream::start(&bytes, compression)?;
            let mut at = 0u64;
            let mut skipped = Vec::new();
            let (found, must_be_only) = loop {
                let Some((file, next)) = next_file(&mut tar, at, MAX_AFTER_DISK).await? else {
                    return Err(no_disk(skipped.iter().map(String::as_str)));
                };
                if is_disk(&file.name) {
                    break (file, false);
                }
                if file.size >= SMALL_FILE {
                    // Other layouts: the first large file, which finish checks is the only one.
                    break (file, true);
                }
                skipped.push(file.name);
                at = next;
            };
            let name = format!("{} [{}]", bytes.describe(), clean(&found.name));
            let clean_name = clean(&found.name).to_string();
            let streamed = Arc::new(Streamed {
                tar: Mutex::new(tar),
                disk: found,
                must_be_only,
            });
            let entry = EntrySource {
                streamed: streamed.clone(),
                name: name.clone(),
            };
            (Arc::new(entry), clean_name, Some(streamed))
        };
    let (image, mut info) = Box::pin(crate::open::open_layer(
        disk_bytes,
        format,
        &inner_options,
        seen,
    ))
    .await?;
    if !matches!(info.format, Detected::Raw | Detected::Qcow2) {
        return Err(Error::unsupported(format!(
            "the layer's disk {name} is a {} image: a containerDisk's disk is read as qcow2 or raw",
            info.format
        )));
    }
    info.layer_file = Some(name);
    info.layer_compression = Some(compression_name(compression));
    let image = LayerImage {
        image,
        bytes,
        streamed,
    };
    Ok((Arc::new(image), info))
}

fn compression_name(kind: Detected) -> &'static str {
    match kind {
        Detected::Gzip => "gzip",
        Detected::Zstd => "zstd",
        _ => "none",
    }
}

fn no_disk<'a>(names: impl Iterator<Item = &'a str>) -> Error {
    let names: Vec<&str> = names.take(8).collect();
    Error::invalid_input(format!(
        "the layer holds no disk: no file under /disk/ and not a single file (it holds {})",
        if names.is_empty() {
            "no files".to_string()
        } else {
            names.join(", ")
        }
    ))
}

#[cfg(test)]
mod tests;
