//! Writing an object: a multipart upload assembled from the engine's writes, which arrive
//! at any offset, in any order, from several workers.
//!
//! Each part is assembled in a buffer until every byte of it has arrived (data copied in,
//! zero ranges filled with zeroes), then uploaded at once, in parallel with other parts and
//! in any order. A part that only ever received zeroes is uploaded from one shared zero
//! buffer and never gets a buffer of its own. Images no larger than one part are sent as a
//! single PUT from [`Target::finish`].
//!
//! A source of unknown size ([`UNKNOWN_SIZE`]: a compressed stream that does not record
//! it) is uploaded in parts of the part size asked for (16 MiB by default), so the object
//! can hold at most 10,000 of them (about 156 GiB by default); [`Target::set_end`] sends
//! the last, shorter part, and the upload completes with the parts up to it.
//!
//! Memory bound: part buffers come from a pool with a budget of one buffer per writer
//! handle plus one (the opening handle counts as a writer; every [`Target::connect`] adds
//! one), so at most `workers + 1` parts are assembled or uploading at once: `(workers + 1)
//! x part size` bytes, never more. A write that needs a new buffer waits until an upload
//! returns one.
//!
//! No stall, by construction: the last buffer of the budget is reserved for the lowest part
//! still being assembled. A writer can hold back bytes of other parts while it waits (the
//! engine commits a request's pieces one after another, and a zero run merged across
//! requests is written by whichever request completes it, after that request's own data),
//! but only bytes at higher offsets than the part it waits for: a write is applied in
//! offset order, the engine commits each request's pieces in offset order (a zero run it
//! closes at its head first, one at its tail last) and plans each worker's requests in
//! offset order. So the lowest part's missing bytes are never behind a waiting writer:
//! its writers either find its buffer, or take the reserved one, and it completes; its
//! upload returns the buffer, and the next lowest part moves up. Without the reservation
//! every buffer could go to higher parts whose missing bytes sit behind writers waiting
//! for a buffer for a lower one, and the upload would wait forever (the engine's work
//! units being whole parts does not prevent it: within a unit a worker assembles several
//! parts at once as its requests complete out of order).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    ChecksumAlgorithm, CompletedMultipartUpload, CompletedPart, MetadataDirective,
};
use aws_sdk_s3::Client;
use bytes::Bytes;
use ferry_core::spec::S3Spec;
use ferry_core::{
    BlockSizes, Caps, Error, ErrorKind, IoBuf, Result, Target, ZeroMode, UNKNOWN_SIZE,
};
use ferry_s3::{crc32c_header, sdk_error, S3Options};
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use super::metadata::is_block_hash;
use super::parts::{
    part_size_for, BufferPool, Layout, PartBuffer, RangeSet, Segment, MAX_OBJECT_SIZE, MAX_PARTS,
};
use super::sends::{Running, Sends};
use super::FerryMetadata;

/// Objects up to this size can have their metadata replaced with one CopyObject.
const MAX_COPY_OBJECT: u64 = 5 * 1024 * 1024 * 1024;
const DEFAULT_ABORT_TIMEOUT: Duration = Duration::from_secs(60);

/// Opens `s3://bucket/key` for writing an image of `size` bytes. For images larger than
/// one part this starts the multipart upload, so a missing bucket or bad credentials fail
/// here; the object appears only when [`Target::finish`] succeeds.
pub async fn open_target(spec: &S3Spec, size: u64, options: &S3Options) -> Result<Arc<dyn Target>> {
    Ok(Arc::new(S3Target::open(spec, size, options).await?))
}

/// An object being uploaded. Handles from [`Target::connect`] share one upload.
#[derive(Debug)]
pub struct S3Target {
    up: Arc<Upload>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Open,
    Finishing,
    Finished,
    Aborted,
}

/// What the upload tasks need; shared with them (the [`Upload`] itself is not, so that
/// dropping the last handle can abort an unfinished upload).
struct PartIo {
    client: Client,
    bucket: String,
    key: String,
    /// None for a single PUT.
    upload_id: Option<String>,
    checksums: bool,
    completed: Mutex<Vec<Option<CompletedPart>>>,
    failure: Mutex<Option<(ErrorKind, String)>>,
    /// One part of zeroes, shared by every all-zero part (calloc'd: costs no memory until
    /// written, and it never is).
    zero: Bytes,
    zero_crcs: Mutex<Vec<(usize, String)>>,
}

#[derive(Debug)]
enum Slot {
    Filling(Filling),
    /// Single-PUT mode: complete, waiting for `finish`.
    Ready(Content),
    /// Handed to an upload task (or dropped by an abort).
    Sent,
}

#[derive(Debug, Default)]
struct Filling {
    covered: RangeSet,
    /// Zero ranges that arrived before the part had a buffer.
    zeros: Vec<(u64, u64)>,
    buf: Option<PartBuffer>,
}

/// What [`Upload::try_apply`] did.
enum Step {
    NeedBuffer,
    /// Applied, not completing the part.
    Applied,
    /// Applied and completed the part; its content when it must be uploaded now.
    Completed(Option<Content>),
}

#[derive(Debug)]
enum Content {
    Data(PartBuffer),
    Zero(usize),
}

#[derive(Debug)]
struct Upload {
    io: Arc<PartIo>,
    layout: Layout,
    single: bool,
    slots: Vec<Mutex<Slot>>,
    /// The lowest part still being assembled (`slots.len()` when none is).
    lowest: AtomicUsize,
    pool: Arc<BufferPool>,
    send_slots: Arc<Semaphore>,
    /// The upload tasks, kept to stop them on abort (waits use `sends`).
    tasks: Mutex<Vec<JoinHandle<()>>>,
    sends: Arc<Sends>,
    phase: Mutex<Phase>,
    /// The block hash, when someone tells us before the object is stored.
    block_hash: Mutex<Option<String>>,
    abort_timeout: Duration,
    /// Opened for a source of unknown size: `layout.size` is the most it takes, and
    /// `end` the length [`Target::set_end`] gave.
    open_ended: bool,
    end: Mutex<Option<u64>>,
}

/// A missing bucket or an unreachable store fails here, before the copy reads anything
/// (some stores accept CreateMultipartUpload into a missing bucket). HeadBucket needs list
/// permission, which a writer may lack: a refusal is left for the upload itself to explain.
async fn check_bucket(client: &Client, spec: &S3Spec, describe: &str) -> Result<()> {
    if let Err(e) = client.head_bucket().bucket(&spec.bucket).send().await {
        let e = sdk_error(e, &spec.bucket, "");
        if e.kind() != ErrorKind::PermissionDenied {
            return Err(e.with_operation("open").with_endpoint(describe.to_string()));
        }
    }
    Ok(())
}

/// Starts the multipart upload of an object of `size` bytes and returns its upload id.
async fn create_upload(
    client: &Client,
    spec: &S3Spec,
    size: Option<u64>,
    checksums: bool,
    describe: &str,
) -> Result<String> {
    let metadata = FerryMetadata {
        size,
        block_hash: None,
    };
    let mut create = client
        .create_multipart_upload()
        .bucket(&spec.bucket)
        .key(&spec.key);
    for (k, v) in metadata.to_pairs() {
        create = create.metadata(k, v);
    }
    if checksums {
        create = create.checksum_algorithm(ChecksumAlgorithm::Crc32C);
    }
    let out = create.send().await.map_err(|e| {
        sdk_error(e, &spec.bucket, &spec.key)
            .with_operation("open")
            .with_endpoint(describe.to_string())
    })?;
    let id = out.upload_id().filter(|id| !id.is_empty()).ok_or_else(|| {
        Error::protocol("CreateMultipartUpload answered without an upload id")
            .with_operation("open")
            .with_endpoint(describe.to_string())
    })?;
    Ok(id.to_string())
}

impl S3Target {
    /// Starts writing `size` bytes to `s3://bucket/key`.
    pub async fn open(spec: &S3Spec, size: u64, options: &S3Options) -> Result<Self> {
        let describe = format!("s3://{}/{}", spec.bucket, spec.key);
        let open_ended = size == UNKNOWN_SIZE;
        let part_size = part_size_for(if open_ended { 0 } else { size }, options.part_size)
            .map_err(|e| e.with_operation("open").with_endpoint(describe.clone()))?;
        // Of unknown size: as many whole parts as an upload may have.
        let size = if open_ended {
            (part_size * MAX_PARTS).min(MAX_OBJECT_SIZE)
        } else {
            size
        };
        let client = ferry_s3::client(options).await;
        let layout = Layout { size, part_size };
        let single = !open_ended && size <= part_size;
        let checksums = options.checksums.unwrap_or(true);
        check_bucket(&client, spec, &describe).await?;
        let upload_id = if single {
            None
        } else {
            let recorded = (!open_ended).then_some(size);
            Some(create_upload(&client, spec, recorded, checksums, &describe).await?)
        };
        let count = layout.count();
        let buffer_len = usize::try_from(part_size.min(size.max(1)))
            .map_err(|_| Error::invalid_input("part size exceeds this machine's address space"))?;
        tracing::debug!(endpoint = %describe, size, part_size, parts = count, single, "S3 upload opened");
        Ok(Self {
            up: Arc::new(Upload {
                io: Arc::new(PartIo {
                    client,
                    bucket: spec.bucket.clone(),
                    key: spec.key.clone(),
                    upload_id,
                    checksums,
                    completed: Mutex::new(vec![None; if single { 0 } else { count }]),
                    failure: Mutex::new(None),
                    zero: Bytes::from(vec![0u8; buffer_len]),
                    zero_crcs: Mutex::new(Vec::new()),
                }),
                layout,
                single,
                slots: (0..count)
                    .map(|_| Mutex::new(Slot::Filling(Filling::default())))
                    .collect(),
                lowest: AtomicUsize::new(0),
                pool: BufferPool::new(buffer_len, 2),
                send_slots: Arc::new(Semaphore::new(2)),
                tasks: Mutex::new(Vec::new()),
                sends: Arc::default(),
                phase: Mutex::new(Phase::Open),
                block_hash: Mutex::new(None),
                abort_timeout: options.abort_timeout.unwrap_or(DEFAULT_ABORT_TIMEOUT),
                open_ended,
                end: Mutex::new(None),
            }),
        })
    }

    /// The part size of this upload.
    pub fn part_size(&self) -> u64 {
        self.up.layout.part_size
    }

    /// The multipart upload id (None for a single PUT).
    pub fn upload_id(&self) -> Option<&str> {
        self.up.io.upload_id.as_deref()
    }

    /// Whether [`Target::abort`] was called (the abort may still be retrying).
    pub fn is_aborted(&self) -> bool {
        self.up.phase() == Phase::Aborted
    }

    /// Whether the object was stored ([`Target::finish`] succeeded).
    pub fn is_finished(&self) -> bool {
        self.up.phase() == Phase::Finished
    }

    /// Records the image's blksum-compatible block hash (hex) in the object's metadata
    /// (`x-amz-meta-ferry-blkhash`). Call before [`Target::finish`]. For a multipart upload
    /// the metadata can only change after completion, by copying the object onto itself,
    /// which `finish` does for objects up to 5 GiB; larger objects keep only their size.
    pub fn set_block_hash(&self, hex: &str) -> Result<()> {
        if !is_block_hash(hex) {
            return Err(Error::invalid_input(format!(
                "'{hex}' is not a block hash (64 hex digits)"
            )));
        }
        *self.up.block_hash.lock() = Some(hex.to_ascii_lowercase());
        Ok(())
    }

    fn describe_inner(&self) -> String {
        self.up.io.describe()
    }
}

impl PartIo {
    fn describe(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.key)
    }

    fn fail(&self, e: &Error) {
        let mut failure = self.failure.lock();
        if failure.is_none() {
            *failure = Some((e.kind(), e.to_string()));
        }
    }

    fn check(&self) -> Result<()> {
        match &*self.failure.lock() {
            None => Ok(()),
            Some((kind, message)) => Err(Error::new(
                *kind,
                format!("an earlier part upload failed: {message}"),
            )),
        }
    }

    fn zero_crc(&self, len: usize) -> String {
        let mut cache = self.zero_crcs.lock();
        if let Some((_, c)) = cache.iter().find(|(n, _)| *n == len) {
            return c.clone();
        }
        let c = crc32c_header(&self.zero[..len]);
        cache.push((len, c.clone()));
        c
    }

    /// The body and checksum of a part.
    fn body(&self, content: Content) -> (Bytes, Option<String>) {
        match content {
            Content::Data(buf) => {
                let crc = self.checksums.then(|| crc32c_header(buf.as_ref()));
                (Bytes::from_owner(buf), crc)
            }
            Content::Zero(len) => (
                self.zero.slice(..len),
                self.checksums.then(|| self.zero_crc(len)),
            ),
        }
    }

    async fn upload_part(&self, part: usize, content: Content) -> Result<CompletedPart> {
        let number = i32::try_from(part + 1).map_err(|_| Error::internal("part number"))?;
        let upload_id = self
            .upload_id
            .as_deref()
            .ok_or_else(|| Error::internal("upload_part without an upload"))?;
        let (body, crc) = self.body(content);
        let mut request = self
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(upload_id)
            .part_number(number)
            .content_length(body.len() as i64)
            .body(ByteStream::from(body));
        if let Some(crc) = &crc {
            request = request
                .checksum_algorithm(ChecksumAlgorithm::Crc32C)
                .checksum_crc32_c(crc);
        }
        let out = request
            .customize()
            .disable_payload_signing()
            .send()
            .await
            .map_err(|e| sdk_error(e, &self.bucket, &self.key))?;
        let etag = out.e_tag().ok_or_else(|| {
            Error::protocol(format!("UploadPart {number} answered without an ETag"))
        })?;
        Ok(CompletedPart::builder()
            .part_number(number)
            .e_tag(etag)
            .set_checksum_crc32_c(crc)
            .build())
    }

    async fn put_single(&self, content: Content, metadata: &FerryMetadata) -> Result<()> {
        let (body, crc) = self.body(content);
        let mut request = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(&self.key)
            .content_length(body.len() as i64)
            .body(ByteStream::from(body));
        for (k, v) in metadata.to_pairs() {
            request = request.metadata(k, v);
        }
        if let Some(crc) = &crc {
            request = request
                .checksum_algorithm(ChecksumAlgorithm::Crc32C)
                .checksum_crc32_c(crc);
        }
        request
            .customize()
            .disable_payload_signing()
            .send()
            .await
            .map_err(|e| sdk_error(e, &self.bucket, &self.key))?;
        Ok(())
    }

    async fn complete(&self) -> Result<()> {
        let upload_id = self
            .upload_id
            .as_deref()
            .ok_or_else(|| Error::internal("complete without an upload"))?;
        let parts = self
            .completed
            .lock()
            .iter()
            .enumerate()
            .map(|(i, p)| {
                p.clone()
                    .ok_or_else(|| Error::internal(format!("part {} was never uploaded", i + 1)))
            })
            .collect::<Result<Vec<_>>>()?;
        self.client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| sdk_error(e, &self.bucket, &self.key))?;
        Ok(())
    }

    /// Replaces the metadata of the stored object by copying it onto itself.
    async fn rewrite_metadata(&self, metadata: &FerryMetadata) -> Result<()> {
        let source = format!(
            "{}/{}",
            self.bucket,
            percent_encoding::utf8_percent_encode(&self.key, COPY_SOURCE)
        );
        let mut request = self
            .client
            .copy_object()
            .bucket(&self.bucket)
            .key(&self.key)
            .copy_source(source)
            .metadata_directive(MetadataDirective::Replace);
        for (k, v) in metadata.to_pairs() {
            request = request.metadata(k, v);
        }
        request
            .send()
            .await
            .map_err(|e| sdk_error(e, &self.bucket, &self.key))?;
        Ok(())
    }

    /// Aborts the multipart upload, retrying while the store is unreachable until
    /// `timeout`, then checks that no part landed after the abort.
    async fn abort_upload(&self, timeout: Duration) -> Result<()> {
        let Some(upload_id) = self.upload_id.as_deref() else {
            return Ok(());
        };
        let deadline = Instant::now() + timeout;
        let mut attempt = 0u32;
        let mut aborts = 0;
        loop {
            let result = self
                .client
                .abort_multipart_upload()
                .bucket(&self.bucket)
                .key(&self.key)
                .upload_id(upload_id)
                .send()
                .await;
            let err = match result {
                Ok(_) => {
                    aborts += 1;
                    // A part that was still arriving can land after the abort: S3 says to
                    // abort again until no parts remain.
                    let leftover = self
                        .client
                        .list_parts()
                        .bucket(&self.bucket)
                        .key(&self.key)
                        .upload_id(upload_id)
                        .send()
                        .await
                        .map(|out| !out.parts().is_empty())
                        .unwrap_or(false);
                    if leftover && aborts < 3 {
                        continue;
                    }
                    tracing::debug!(endpoint = %self.describe(), "multipart upload aborted");
                    return Ok(());
                }
                Err(e) => sdk_error(e, &self.bucket, &self.key),
            };
            if err.kind() == ErrorKind::NotFound && aborts > 0 {
                return Ok(());
            }
            if err.kind().is_transient() && Instant::now() < deadline {
                attempt += 1;
                let pause = Duration::from_millis(250u64 << attempt.min(4));
                tracing::debug!(endpoint = %self.describe(), error = %err, "retrying the abort of the multipart upload");
                tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now())))
                    .await;
                continue;
            }
            if err.kind() == ErrorKind::NotFound {
                // Already gone (aborted by someone else, or expired by a lifecycle rule).
                return Ok(());
            }
            return Err(Error::new(
                err.kind(),
                format!(
                    "could not abort multipart upload {upload_id} of {}: {err}; remove it with \
                     `aws s3api abort-multipart-upload --bucket {} --key {} --upload-id {upload_id}` \
                     or a lifecycle rule (AbortIncompleteMultipartUpload)",
                    self.describe(),
                    self.bucket,
                    self.key
                ),
            ));
        }
    }
}

// Not derived: the SDK client's Debug shows the access key id.
impl std::fmt::Debug for PartIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartIo")
            .field("bucket", &self.bucket)
            .field("key", &self.key)
            .field("upload_id", &self.upload_id)
            .finish_non_exhaustive()
    }
}

/// Moved into a part's upload task: records the task's end, however it ends; a panic
/// fails the upload.
struct TaskEnd {
    io: Arc<PartIo>,
    _running: Running,
}

impl Drop for TaskEnd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.io
                .fail(&Error::internal("a part upload task panicked"));
        }
    }
}

/// Characters kept as they are in a CopySource key (everything else is percent-encoded).
const COPY_SOURCE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'/')
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

impl Upload {
    fn phase(&self) -> Phase {
        *self.phase.lock()
    }

    fn ensure_open(&self) -> Result<()> {
        match self.phase() {
            Phase::Open => self.io.check(),
            Phase::Aborted => Err(Error::new(ErrorKind::Cancelled, "the upload was aborted")),
            Phase::Finishing | Phase::Finished => {
                Err(Error::internal("write after the upload was finished"))
            }
        }
    }

    /// Writes `len` bytes at `offset`: `data` or, when None, zeroes.
    async fn write(&self, offset: u64, len: u64, data: Option<&[u8]>) -> Result<()> {
        self.ensure_open()?;
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.layout.size)
        {
            return Err(Error::invalid_input(format!(
                "write of {len} bytes at {offset} is beyond the image's {} bytes",
                self.layout.size
            )));
        }
        for seg in self.layout.segments(offset, len) {
            if let Some(content) = self.apply(seg, data).await? {
                self.send(seg.part, content).await?;
            }
        }
        Ok(())
    }

    /// Puts one segment into its part; returns the part's content when it is complete
    /// and must be uploaded now.
    async fn apply(&self, seg: Segment, data: Option<&[u8]>) -> Result<Option<Content>> {
        let mut spare: Option<PartBuffer> = None;
        loop {
            match self.try_apply(seg, data, &mut spare)? {
                Step::NeedBuffer => spare = Some(self.wait_for_buffer(seg.part).await?),
                Step::Applied => return Ok(None),
                Step::Completed(content) => {
                    self.advance_lowest();
                    return Ok(content);
                }
            }
        }
    }

    fn is_lowest(&self, part: usize) -> bool {
        self.lowest.load(Ordering::Acquire) == part
    }

    /// Moves the lowest part past the parts no longer being assembled and lets the
    /// writers waiting for a buffer check again. Called without a slot locked.
    fn advance_lowest(&self) {
        let mut low = self.lowest.load(Ordering::Acquire);
        while low < self.slots.len() && !matches!(*self.slots[low].lock(), Slot::Filling(_)) {
            low = match self.lowest.compare_exchange(
                low,
                low + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => low + 1,
                Err(now) => now,
            };
        }
        self.pool.wake();
    }

    /// [`Upload::apply`] without waiting: asks for a buffer when the part needs one and
    /// neither `spare` nor the pool has one.
    fn try_apply(
        &self,
        seg: Segment,
        data: Option<&[u8]>,
        spare: &mut Option<PartBuffer>,
    ) -> Result<Step> {
        let part_len = self.layout.part_len(seg.part);
        let mut slot = self.slots[seg.part].lock();
        let Slot::Filling(filling) = &mut *slot else {
            return Err(Error::invalid_input(format!(
                "write to part {} (bytes {}..{}) after that part was already complete: \
                 an S3 target takes every byte once",
                seg.part + 1,
                self.layout.part_start(seg.part),
                self.layout.part_start(seg.part) + part_len
            )));
        };
        if data.is_some() && filling.buf.is_none() {
            let lowest = self.is_lowest(seg.part);
            let Some(mut buf) = spare.take().or_else(|| self.pool.try_take(lowest)) else {
                return Ok(Step::NeedBuffer);
            };
            buf.truncate(part_len as usize);
            for (s, e) in filling.zeros.drain(..) {
                buf.as_mut_slice()[s as usize..e as usize].fill(0);
            }
            filling.buf = Some(buf);
        }
        let range = seg.start as usize..(seg.start + seg.len) as usize;
        match (data, filling.buf.as_mut()) {
            (Some(data), Some(buf)) => {
                let from = seg.request_offset as usize;
                buf.as_mut_slice()[range].copy_from_slice(&data[from..from + seg.len as usize]);
            }
            (None, Some(buf)) => buf.as_mut_slice()[range].fill(0),
            (_, None) => filling.zeros.push((seg.start, seg.start + seg.len)),
        }
        filling.covered.insert(seg.start, seg.start + seg.len);
        if filling.covered.total() < part_len {
            return Ok(Step::Applied);
        }
        let content = match filling.buf.take() {
            Some(buf) => Content::Data(buf),
            None => Content::Zero(part_len as usize),
        };
        if self.single {
            *slot = Slot::Ready(content);
            return Ok(Step::Completed(None));
        }
        *slot = Slot::Sent;
        Ok(Step::Completed(Some(content)))
    }

    /// The image's size: the layout's, or where a source of unknown size ended.
    fn image_size(&self) -> u64 {
        self.end.lock().unwrap_or(self.layout.size)
    }

    /// Ends an upload of unknown size after `end` bytes, all written: sends the part
    /// holding the last bytes (shorter than the others) and drops the parts after it.
    async fn set_end(&self, end: u64) -> Result<()> {
        if !self.open_ended {
            return Ok(());
        }
        self.ensure_open()?;
        if end > self.layout.size {
            return Err(Error::internal(format!(
                "end {end} is past the {} bytes this upload takes",
                self.layout.size
            )));
        }
        let parts = end.div_ceil(self.layout.part_size) as usize;
        *self.end.lock() = Some(end);
        self.io.completed.lock().truncate(parts);
        for slot in &self.slots[parts..] {
            *slot.lock() = Slot::Sent;
        }
        let last = parts.checked_sub(1);
        let tail = last.and_then(|part| {
            let len = end - self.layout.part_start(part);
            let mut slot = self.slots[part].lock();
            let Slot::Filling(filling) = &mut *slot else {
                return None;
            };
            // The part is short: it is complete once its first `len` bytes are.
            if filling.covered.first_gap() < len {
                return None;
            }
            let content = match filling.buf.take() {
                Some(mut buf) => {
                    buf.truncate(len as usize);
                    Content::Data(buf)
                }
                None => Content::Zero(len as usize),
            };
            *slot = Slot::Sent;
            Some((part, content))
        });
        self.advance_lowest();
        if let Some((part, content)) = tail {
            self.send(part, content).await?;
        }
        Ok(())
    }

    /// Waits for a buffer for `part` (the reserved one too when it is the lowest part).
    async fn wait_for_buffer(&self, part: usize) -> Result<PartBuffer> {
        self.pool
            .take(|| {
                self.ensure_open()?;
                Ok(self.is_lowest(part))
            })
            .await
    }

    /// Starts the upload of a complete part once an upload slot is free.
    async fn send(&self, part: usize, content: Content) -> Result<()> {
        let permit: OwnedSemaphorePermit = Arc::clone(&self.send_slots)
            .acquire_owned()
            .await
            .map_err(|_| Error::internal("send slots closed"))?;
        self.ensure_open()?;
        let io = Arc::clone(&self.io);
        let pool = Arc::clone(&self.pool);
        let offset = self.layout.part_start(part);
        let end = TaskEnd {
            io: Arc::clone(&self.io),
            _running: self.sends.start(),
        };
        let handle = tokio::spawn(async move {
            let _permit = permit;
            let _end = end;
            match io.upload_part(part, content).await {
                Ok(done) => {
                    io.completed.lock()[part] = Some(done);
                }
                Err(e) => {
                    let e = e.at("upload_part", offset).with_endpoint(io.describe());
                    tracing::debug!(error = %e, part = part + 1, "S3 part upload failed");
                    io.fail(&e);
                    // Writers waiting for a buffer see the failure now.
                    pool.wake();
                }
            }
        });
        let mut tasks = self.tasks.lock();
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle);
        Ok(())
    }

    /// Waits for every upload started so far (cancel-safe: see [`Sends`]).
    async fn drain(&self) -> Result<()> {
        self.sends.wait_for_earlier().await;
        self.io.check()
    }

    /// The first byte no write has covered, if any.
    fn first_missing(&self) -> Option<u64> {
        self.slots
            .iter()
            .enumerate()
            .find_map(|(i, slot)| match &*slot.lock() {
                Slot::Filling(f) => Some(self.layout.part_start(i) + f.covered.first_gap()),
                _ => None,
            })
    }

    async fn finish(&self) -> Result<()> {
        {
            let mut phase = self.phase.lock();
            match *phase {
                Phase::Open => *phase = Phase::Finishing,
                Phase::Finished => return Ok(()),
                Phase::Aborted => {
                    return Err(Error::new(ErrorKind::Cancelled, "the upload was aborted"))
                }
                Phase::Finishing => return Err(Error::internal("finish called twice at once")),
            }
        }
        let result = self.finish_inner().await;
        *self.phase.lock() = match result {
            Ok(()) => Phase::Finished,
            Err(_) => Phase::Open,
        };
        result
    }

    async fn finish_inner(&self) -> Result<()> {
        self.io.check()?;
        if self.open_ended && self.end.lock().is_none() {
            return Err(Error::internal(
                "an upload of unknown size was finished before its end was set",
            ));
        }
        if let Some(at) = self.first_missing() {
            return Err(Error::internal(format!(
                "the copy never wrote byte {at} of {}: the object was not stored \
                 (an S3 upload cannot resume from a checkpoint)",
                self.image_size()
            )));
        }
        let size = self.image_size();
        let block_hash = self.block_hash.lock().clone();
        let metadata = FerryMetadata {
            size: Some(size),
            block_hash: block_hash.clone(),
        };
        if self.open_ended && size == 0 {
            // An empty stream: no upload of no parts; an empty object instead.
            self.io.abort_upload(self.abort_timeout).await?;
            return self.io.put_single(Content::Zero(0), &metadata).await;
        }
        if self.single {
            let content = match self.slots.first() {
                None => Content::Zero(0),
                Some(slot) => match std::mem::replace(&mut *slot.lock(), Slot::Sent) {
                    Slot::Ready(content) => content,
                    _ => return Err(Error::internal("single part not ready")),
                },
            };
            return self.io.put_single(content, &metadata).await;
        }
        self.drain().await?;
        self.io.complete().await?;
        if block_hash.is_some() {
            if size <= MAX_COPY_OBJECT {
                self.io.rewrite_metadata(&metadata).await?;
            } else {
                tracing::warn!(
                    endpoint = %self.io.describe(),
                    "objects above 5 GiB keep only their size in the metadata: the block hash is not recorded"
                );
            }
        }
        Ok(())
    }

    async fn abort(&self) -> Result<()> {
        {
            let mut phase = self.phase.lock();
            if *phase == Phase::Finished {
                return Ok(());
            }
            *phase = Phase::Aborted;
        }
        let tasks: Vec<_> = std::mem::take(&mut *self.tasks.lock());
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
        for slot in &self.slots {
            *slot.lock() = Slot::Sent;
        }
        self.advance_lowest();
        self.io.abort_upload(self.abort_timeout).await
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        let phase = *self.phase.get_mut();
        if matches!(phase, Phase::Finished | Phase::Aborted) || self.io.upload_id.is_none() {
            return;
        }
        for task in self.tasks.get_mut().drain(..) {
            task.abort();
        }
        let io = Arc::clone(&self.io);
        let timeout = self.abort_timeout;
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if let Err(e) = io.abort_upload(timeout).await {
                        tracing::warn!(error = %e, "unfinished S3 upload could not be aborted");
                    }
                });
            }
            Err(_) => tracing::warn!(
                endpoint = %io.describe(),
                upload_id = io.upload_id.as_deref().unwrap_or_default(),
                "unfinished S3 multipart upload dropped outside a runtime: it was not aborted"
            ),
        }
    }
}

#[async_trait]
impl Target for S3Target {
    fn describe(&self) -> String {
        self.describe_inner()
    }

    fn size(&self) -> u64 {
        self.up.layout.size
    }

    fn can_grow(&self) -> bool {
        self.up.open_ended
    }

    async fn set_end(&self, end: u64) -> Result<()> {
        self.up
            .set_end(end)
            .await
            .map_err(|e| e.with_operation("set_end").with_endpoint(self.describe()))
    }

    fn caps(&self) -> Caps {
        let part = u32::try_from(self.up.layout.part_size).unwrap_or(u32::MAX);
        Caps {
            extents: false,
            efficient_zero: false,
            trim: false,
            random_write: true,
            rewrite: false,
            read_while_writing: false,
            multi_conn: true,
            sequential_read: false,
            block: BlockSizes {
                minimum: 1,
                preferred: part,
                maximum: part.max(32 * 1024 * 1024),
            },
            request_size: None,
            work_unit: None,
        }
    }

    async fn write_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        self.up
            .write(offset, buf.len() as u64, Some(&buf))
            .await
            .map_err(|e| e.at("write", offset).with_endpoint(self.describe()))?;
        Ok(buf)
    }

    async fn write_zeroes(&self, offset: u64, len: u64, _mode: ZeroMode) -> Result<()> {
        self.up
            .write(offset, len, None)
            .await
            .map_err(|e| e.at("write_zeroes", offset).with_endpoint(self.describe()))
    }

    /// Waits until every complete part is uploaded. Parts still being assembled are only in
    /// memory until the upload completes: an S3 target cannot resume.
    async fn flush(&self) -> Result<()> {
        self.up
            .drain()
            .await
            .map_err(|e| e.with_operation("flush").with_endpoint(self.describe()))
    }

    async fn connect(&self) -> Result<Arc<dyn Target>> {
        self.up.pool.add_budget(1);
        self.up.send_slots.add_permits(1);
        Ok(Arc::new(S3Target {
            up: Arc::clone(&self.up),
        }))
    }

    /// Uploads the last parts and completes the upload (or sends the single PUT).
    async fn finish(&self) -> Result<()> {
        self.up
            .finish()
            .await
            .map_err(|e| e.with_operation("finish").with_endpoint(self.describe()))
    }

    /// Stops the part uploads and aborts the multipart upload, so no parts remain stored.
    async fn abort(&self) -> Result<()> {
        self.up
            .abort()
            .await
            .map_err(|e| e.with_operation("abort").with_endpoint(self.describe()))
    }
}
