//! [`RegistrySource`]: a layer blob as a byte [`Source`], by ranges or as one stream,
//! its digest checked either way (see the module documentation of [`super`]).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::{Buf, Bytes};
use ferry_core::{BlockSizes, Caps, Error, ErrorKind, IoBuf, RegistrySpec, Result, Source};
use ferry_registry::{BlobBody, Client, ClientOptions, Compression, Digest, Resolved, Verifier};
use tokio::sync::Mutex;

use super::hashing::{RangeHashing, FILL_MAX};
use super::{error, RegistryOptions};

/// Ranged GET size.
const REQUEST_SIZE: u32 = 8 << 20;

/// What opening the image found, for `ferry info` and job status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryInfo {
    /// `docker://host/repo@sha256:...`: the image pinned.
    pub pinned: String,
    /// The digest the tag resolved to (index or manifest).
    pub digest: String,
    /// The platform chosen from an index.
    pub platform: Option<String>,
    /// The image manifest read.
    pub manifest: String,
    pub layer: String,
    pub layer_size: u64,
    pub media_type: String,
    /// none, gzip or zstd.
    pub compression: &'static str,
    pub layers: usize,
    /// The layer is read by ranged GETs (else as one stream).
    pub ranges: bool,
}

/// A layer blob of a registry image.
#[derive(Clone)]
pub struct RegistrySource {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    digest: Digest,
    size: u64,
    info: RegistryInfo,
    /// The stream, when the blob is read front to back.
    stream: Option<Mutex<Stream>>,
    /// The digest of the ranged reads, when the blob is read by ranges.
    hashing: Option<RangeHashing>,
    /// What `finish` found (it runs once).
    finished: Mutex<Option<std::result::Result<(), (ErrorKind, String)>>>,
}

impl std::fmt::Debug for RegistrySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistrySource")
            .field("info", &self.inner.info)
            .finish_non_exhaustive()
    }
}

/// The one GET of a blob read front to back, hashed as it passes.
struct Stream {
    body: Option<BlobBody>,
    pos: u64,
    leftover: Bytes,
    verifier: Option<Verifier>,
    done: bool,
}

impl RegistrySource {
    /// Resolves `spec` and opens the layer that holds the disk.
    pub async fn open(spec: &RegistrySpec, options: &RegistryOptions) -> Result<Self> {
        let shown = ferry_core::EndpointSpec::Registry(spec.clone()).to_string();
        let ctx = |e: Error| e.with_operation("open").with_endpoint(shown.clone());
        let client_options = ClientOptions {
            credentials: options
                .auth
                .as_ref()
                .and_then(|a| a.credentials(&spec.host))
                .cloned(),
            ca_pem: options.ca_pem.clone(),
            insecure: options.insecure,
            ..ClientOptions::default()
        };
        let client = Client::new(&spec.host, &spec.repository, &client_options)
            .map_err(|e| ctx(error(e)))?;
        let resolved: Resolved = client
            .resolve(spec.reference(), options.platform.as_ref())
            .await
            .map_err(|e| ctx(error(e)))?;
        if let Some(expected) = &options.expect_digest {
            if *expected != resolved.digest.to_string() {
                return Err(ctx(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "the tag now names {} but the job started from {expected}: start a new job to copy the new image",
                        resolved.digest
                    ),
                )));
            }
        }
        let layer = &resolved.layer;
        let ranges = layer.compression == Compression::None
            && client
                .serves_ranges(&layer.digest)
                .await
                .map_err(|e| ctx(error(e)))?;
        let pinned = format!(
            "docker://{}/{}@{}",
            spec.host, spec.repository, resolved.digest
        );
        let info = RegistryInfo {
            pinned,
            digest: resolved.digest.to_string(),
            platform: resolved.platform.as_ref().map(ToString::to_string),
            manifest: resolved.manifest.to_string(),
            layer: layer.digest.to_string(),
            layer_size: layer.size,
            media_type: layer.media_type.clone(),
            compression: layer.compression.as_str(),
            layers: resolved.layers,
            ranges,
        };
        tracing::debug!(?info, "opened registry image");
        let stream = (!ranges).then(|| {
            Mutex::new(Stream {
                body: None,
                pos: 0,
                leftover: Bytes::new(),
                verifier: Some(Verifier::new(layer.digest.clone(), layer.size)),
                done: false,
            })
        });
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                digest: layer.digest.clone(),
                size: layer.size,
                info,
                hashing: ranges.then(|| RangeHashing::new(layer.digest.clone(), layer.size)),
                stream,
                finished: Mutex::new(None),
            }),
        })
    }

    pub fn info(&self) -> &RegistryInfo {
        &self.inner.info
    }
}

impl Inner {
    fn shown(&self) -> &str {
        &self.info.pinned
    }

    /// One ranged GET into `buf`.
    async fn fetch(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset + buf.len() as u64;
        self.stream_range(offset, end, |at, chunk| {
            let i = (at - offset) as usize;
            buf[i..i + chunk.len()].copy_from_slice(chunk);
            Ok(())
        })
        .await
    }

    /// One ranged GET of `[start, end)`, each chunk handed to `each` with its offset.
    async fn stream_range(
        &self,
        start: u64,
        end: u64,
        mut each: impl FnMut(u64, &[u8]) -> ferry_registry::Result<()>,
    ) -> Result<()> {
        let mut body = self
            .client
            .blob(&self.digest, Some((start, end - 1)))
            .await
            .map_err(error)?;
        if !body.partial {
            return Err(Error::protocol(format!(
                "asked for bytes {start}-{} of the layer, the registry sent the whole blob (it stopped serving ranges)",
                end - 1
            )));
        }
        let mut at = start;
        while let Some(chunk) = body.next_chunk().await.map_err(error)? {
            if chunk.len() as u64 > end - at {
                return Err(Error::protocol(
                    "the registry sent more bytes than asked for",
                ));
            }
            each(at, &chunk).map_err(error)?;
            at += chunk.len() as u64;
        }
        if at != end {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "the layer blob ended after {} of the {} bytes asked at {start}: it is shorter than its descriptor's {} bytes",
                    at - start,
                    end - start,
                    self.size
                ),
            ));
        }
        Ok(())
    }

    /// One ranged read, offered to the digest; then the range the digest waits on, when
    /// this reader should fetch it (see [`super::hashing`]).
    async fn read_range(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len() as u64;
        if let Some(h) = &self.hashing {
            h.start(offset, len);
        }
        let mut attempt = 0;
        let result = loop {
            attempt += 1;
            match self.fetch(offset, buf).await {
                Err(e) if e.kind().is_transient() && attempt < 3 => continue,
                other => break other,
            }
        };
        let Some(h) = &self.hashing else {
            return result;
        };
        let gap = h
            .end(offset, len, result.as_ref().ok().map(|_| &*buf))
            .map_err(error)?;
        result?;
        if let Some((start, end)) = gap {
            // The copy's bytes are already read: a failed fill only leaves the range
            // to `finish`.
            let filled = self.stream_range(start, end, |at, b| h.fill(at, b)).await;
            h.fill_done();
            if let Err(e) = filled {
                tracing::debug!(error = %e, start, end, "fetching a range for the layer digest failed");
            }
        }
        Ok(())
    }

    /// Hashes what the ranged reads did not (ranged GETs of the gaps), then checks the
    /// digest.
    async fn hash_rest(&self) -> Result<()> {
        let taken = self.hashing.as_ref().and_then(RangeHashing::take);
        let Some((mut ordered, filled)) = taken else {
            return Err(Error::internal("the layer was verified twice"));
        };
        let mut fetched = 0;
        while let Some((start, end)) = ordered.next_gap() {
            let end = end.min(start + 8 * FILL_MAX);
            fetched += end - start;
            self.stream_range(start, end, |at, b| ordered.offer(at, b))
                .await?;
        }
        tracing::debug!(
            filled,
            fetched,
            dropped = ordered.dropped(),
            "layer digest: bytes fetched again"
        );
        ordered.check().map_err(error)
    }
}

impl Stream {
    async fn refill(&mut self, inner: &Inner) -> Result<()> {
        while self.leftover.is_empty() {
            if self.body.is_none() {
                let body = inner
                    .client
                    .blob(&inner.digest, None)
                    .await
                    .map_err(error)?;
                self.body = Some(body);
            }
            let body = self
                .body
                .as_mut()
                .ok_or_else(|| Error::internal("no body"))?;
            match body.next_chunk().await.map_err(error)? {
                Some(chunk) => {
                    if let Some(v) = self.verifier.as_mut() {
                        v.update(&chunk).map_err(error)?;
                    }
                    self.leftover = chunk;
                }
                None => {
                    let seen = self.verifier.as_ref().map_or(0, Verifier::seen);
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!(
                            "the layer blob ended after {seen} of the {} bytes its descriptor gives (cut short)",
                            inner.size
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    async fn read(&mut self, inner: &Inner, offset: u64, buf: &mut [u8]) -> Result<()> {
        if self.done {
            return Err(Error::internal(
                "the layer stream was read after it was finished",
            ));
        }
        if offset < self.pos {
            return Err(Error::unsupported(format!(
                "a read at {offset} is behind the layer stream's position {}: the layer can only be read front to back",
                self.pos
            )));
        }
        while self.pos < offset {
            self.refill(inner).await?;
            let n = (self.leftover.len() as u64).min(offset - self.pos) as usize;
            self.leftover.advance(n);
            self.pos += n as u64;
        }
        let mut filled = 0;
        while filled < buf.len() {
            self.refill(inner).await?;
            let n = self.leftover.len().min(buf.len() - filled);
            self.leftover.copy_to_slice(&mut buf[filled..filled + n]);
            filled += n;
            self.pos += n as u64;
        }
        Ok(())
    }

    /// Reads and hashes the rest of the blob, then checks its size and digest.
    async fn finish(&mut self, inner: &Inner) -> Result<()> {
        self.done = true;
        if self.body.is_none() {
            self.body = Some(
                inner
                    .client
                    .blob(&inner.digest, None)
                    .await
                    .map_err(error)?,
            );
        }
        let body = self
            .body
            .as_mut()
            .ok_or_else(|| Error::internal("no body"))?;
        let mut verifier = self
            .verifier
            .take()
            .ok_or_else(|| Error::internal("the layer was verified twice"))?;
        while let Some(chunk) = body.next_chunk().await.map_err(error)? {
            verifier.update(&chunk).map_err(error)?;
        }
        self.body = None;
        verifier.check().map_err(error)
    }
}

#[async_trait]
impl Source for RegistrySource {
    fn describe(&self) -> String {
        self.inner.shown().to_string()
    }

    fn size(&self) -> u64 {
        self.inner.size
    }

    fn caps(&self) -> Caps {
        let ranges = self.inner.stream.is_none();
        Caps {
            random_write: false,
            multi_conn: ranges,
            sequential_read: !ranges,
            block: BlockSizes {
                minimum: 1,
                preferred: REQUEST_SIZE,
                maximum: 1 << 30,
            },
            request_size: Some(REQUEST_SIZE),
            // Readers a unit apart stay within the digest's buffer (see `hashing`).
            work_unit: ranges.then_some(u64::from(REQUEST_SIZE)),
            ..Caps::default()
        }
    }

    async fn read_at(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let inner = &*self.inner;
        let len = buf.len() as u64;
        if offset.checked_add(len).is_none_or(|end| end > inner.size) {
            return Err(Error::invalid_input(format!(
                "read of {len} bytes at {offset} is beyond the layer's {} bytes",
                inner.size
            ))
            .at("read", offset)
            .with_endpoint(self.describe()));
        }
        if len == 0 {
            return Ok(buf);
        }
        let result = match &inner.stream {
            Some(stream) => stream.lock().await.read(inner, offset, &mut buf).await,
            None => inner.read_range(offset, &mut buf).await,
        };
        result.map_err(|e| e.at("read", offset).with_endpoint(self.describe()))?;
        Ok(buf)
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(self.clone()))
    }

    fn version(&self) -> Option<String> {
        Some(self.inner.info.digest.clone())
    }

    /// Checks the blob's digest (once; later calls repeat the answer).
    async fn finish(&self) -> Result<()> {
        let inner = &*self.inner;
        let mut finished = inner.finished.lock().await;
        if finished.is_none() {
            let result = match &inner.stream {
                Some(stream) => stream.lock().await.finish(inner).await,
                None => inner.hash_rest().await,
            };
            *finished = Some(result.map_err(|e| (e.kind(), e.message().to_string())));
        }
        match finished.as_ref() {
            Some(Err((kind, message))) => Err(Error::new(*kind, message.clone())
                .with_operation("verify layer digest")
                .with_endpoint(self.describe())),
            _ => Ok(()),
        }
    }
}
