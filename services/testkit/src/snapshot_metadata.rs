//! A stand-in for the external-snapshot-metadata sidecar (feature `snapshot-metadata`):
//! the upstream `SnapshotMetadata` gRPC service over TLS with a test CA, answering from
//! real snapshot files.
//!
//! It checks each request as the sidecar does before it asks the driver: the token must
//! be one it knows (the sidecar's TokenReview) and be for its audience, the namespace and
//! the snapshots must exist. Allocated ranges come from the snapshot file's SEEK_DATA /
//! SEEK_HOLE; the delta from comparing the base and target files where either holds data.
//! Replies are FIXED_LENGTH (one extent per block) or VARIABLE_LENGTH (joined runs),
//! respect `starting_offset` and `max_results`, and can be made to break ([`Fault`]):
//! a stream that stops mid-way, extents out of order, overlapping, past the capacity,
//! or millions of tiny ones.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use ferry_snapshot_metadata::proto::snapshot_metadata_server::{
    SnapshotMetadata, SnapshotMetadataServer,
};
use ferry_snapshot_metadata::proto::{
    BlockMetadata, BlockMetadataType, GetMetadataAllocatedRequest, GetMetadataAllocatedResponse,
    GetMetadataDeltaRequest, GetMetadataDeltaResponse,
};
use futures::Stream;
use parking_lot::Mutex;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

/// A VolumeSnapshot the server knows: its name, its CSI handle (what `base_snapshot_id`
/// names) and the file holding its bytes.
#[derive(Debug, Clone)]
pub struct MetadataSnapshot {
    pub name: String,
    pub handle: String,
    pub path: PathBuf,
}

/// A delta the server does not compute but reads from a file of `OFFSET LENGTH` lines,
/// as a driver that tracks its writes knows them (the benchmark's changes, where comparing
/// two 4 GiB files would time the stand-in rather than ferry).
#[derive(Debug, Clone)]
pub struct KnownDelta {
    pub base_handle: String,
    pub target: String,
    pub ranges: PathBuf,
}

/// How replies cut their ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// FIXED_LENGTH with blocks of this size.
    Fixed(u64),
    /// VARIABLE_LENGTH, compared in 4 KiB blocks and joined.
    Variable,
}

/// A way for a reply to go wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    /// The next `times` streams end with UNAVAILABLE after `messages` messages.
    StopAfter {
        messages: usize,
        times: u32,
    },
    /// The last two extents swapped.
    OutOfOrder,
    /// An extent that starts inside the one before it.
    Overlapping,
    /// A last extent past the volume's capacity.
    PastCapacity,
    /// `count` one-byte extents, one every two bytes, instead of the real ones.
    TinyExtents {
        count: u64,
    },
}

/// The server's configuration.
#[derive(Debug, Clone)]
pub struct MetadataServerConfig {
    /// The audience the sidecar's tokens must be for.
    pub audience: String,
    /// The tokens it accepts, each with the audience it was minted for.
    pub tokens: BTreeMap<String, String>,
    pub namespace: String,
    pub snapshots: Vec<MetadataSnapshot>,
    pub deltas: Vec<KnownDelta>,
    pub style: Style,
    /// Extents per message when the request's `max_results` is 0.
    pub max_results: usize,
    pub fault: Fault,
}

impl MetadataServerConfig {
    /// A server for `audience` accepting `token` (minted for it) in `namespace`.
    pub fn new(audience: &str, token: &str, namespace: &str) -> Self {
        Self {
            audience: audience.into(),
            tokens: BTreeMap::from([(token.to_string(), audience.to_string())]),
            namespace: namespace.into(),
            snapshots: Vec::new(),
            deltas: Vec::new(),
            style: Style::Variable,
            max_results: 64,
            fault: Fault::None,
        }
    }

    pub fn with_snapshot(mut self, name: &str, handle: &str, path: impl Into<PathBuf>) -> Self {
        self.snapshots.push(MetadataSnapshot {
            name: name.into(),
            handle: handle.into(),
            path: path.into(),
        });
        self
    }

    pub fn with_style(mut self, style: Style) -> Self {
        self.style = style;
        self
    }
}

/// A request the server was sent (tokens left out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRequest {
    /// `allocated` or `delta`.
    pub rpc: &'static str,
    pub starting_offset: i64,
}

struct State {
    config: Mutex<MetadataServerConfig>,
    seen: Mutex<Vec<SeenRequest>>,
}

/// A running server on 127.0.0.1; stopped when dropped.
#[derive(Debug)]
pub struct MetadataServer {
    addr: SocketAddr,
    ca_pem: String,
    state: Arc<StateHandle>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// The shared state, `Debug` without the tokens.
struct StateHandle(State);

impl std::fmt::Debug for StateHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotMetadata state")
    }
}

impl MetadataServer {
    /// Starts the server on a free loopback port with a fresh test CA (on the current
    /// tokio runtime).
    pub async fn start(config: MetadataServerConfig) -> std::io::Result<Self> {
        let (ca_pem, cert_pem, key_pem) = test_ca();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(StateHandle(State {
            config: Mutex::new(config),
            seen: Mutex::new(Vec::new()),
        }));
        let service = Service(state.clone());
        let server = Server::builder()
            .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(cert_pem, key_pem)))
            .map_err(std::io::Error::other)?
            .add_service(SnapshotMetadataServer::new(service));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(async move {
            let _ = server
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Self {
            addr,
            ca_pem,
            state,
            stop: Some(stop),
        })
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    /// The test CA's certificate (PEM), which signed the server's.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Changes how the next replies go wrong.
    pub fn set_fault(&self, fault: Fault) {
        self.state.0.config.lock().fault = fault;
    }

    pub fn set_style(&self, style: Style) {
        self.state.0.config.lock().style = style;
    }

    /// Adds a snapshot.
    pub fn add_snapshot(&self, name: &str, handle: &str, path: impl Into<PathBuf>) {
        self.state.0.config.lock().snapshots.push(MetadataSnapshot {
            name: name.into(),
            handle: handle.into(),
            path: path.into(),
        });
    }

    /// The requests served so far, in order.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.state.0.seen.lock().clone()
    }
}

impl Drop for MetadataServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A CA, and a server certificate for 127.0.0.1 and localhost signed by it (PEM): CA,
/// certificate, key.
fn test_ca() -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "ferry snapshot-metadata test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().expect("CA key");
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca, ca_key);
    let mut params = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("server parameters");
    params
        .distinguished_name
        .push(DnType::CommonName, "snapshot-metadata.ferry.test");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().expect("server key");
    let cert = params.signed_by(&key, &issuer).expect("server certificate");
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

#[derive(Clone)]
struct Service(Arc<StateHandle>);

type Replies<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// One reply's fields, before they become the RPC's message type.
type Message = (i32, i64, Vec<BlockMetadata>);

impl Service {
    /// The sidecar's checks: a known token for the audience, the namespace.
    fn authenticate(&self, token: &str, namespace: &str) -> Result<MetadataServerConfig, Status> {
        let config = self.0 .0.config.lock().clone();
        if token.is_empty() {
            return Err(Status::invalid_argument("security_token is required"));
        }
        match config.tokens.get(token) {
            None => return Err(Status::unauthenticated("the token is not valid")),
            Some(audience) if *audience != config.audience => {
                return Err(Status::unauthenticated(format!(
                    "the token is for audience {audience}, not {}",
                    config.audience
                )))
            }
            Some(_) => {}
        }
        if namespace.is_empty() {
            return Err(Status::invalid_argument("namespace is required"));
        }
        if namespace != config.namespace {
            return Err(Status::not_found(format!("no namespace {namespace}")));
        }
        Ok(config)
    }

    fn record(&self, rpc: &'static str, starting_offset: i64) {
        self.0 .0.seen.lock().push(SeenRequest {
            rpc,
            starting_offset,
        });
    }

    /// Consumes one stop of a `StopAfter` fault: the messages before the stop.
    fn take_stop(&self) -> Option<usize> {
        let mut config = self.0 .0.config.lock();
        match config.fault {
            Fault::StopAfter { messages, times } if times > 0 => {
                config.fault = if times > 1 {
                    Fault::StopAfter {
                        messages,
                        times: times - 1,
                    }
                } else {
                    Fault::None
                };
                Some(messages)
            }
            _ => None,
        }
    }

    /// The reply stream for `ranges` of a volume of `capacity` bytes.
    fn reply<T: Send + 'static>(
        &self,
        config: &MetadataServerConfig,
        capacity: u64,
        ranges: Vec<(u64, u64)>,
        starting_offset: i64,
        max_results: i32,
        make: fn(Message) -> T,
    ) -> Result<Response<Replies<T>>, Status> {
        if starting_offset < 0 {
            return Err(Status::invalid_argument("starting_offset is negative"));
        }
        let per_message = if max_results > 0 {
            max_results as usize
        } else {
            config.max_results.max(1)
        };
        if let Style::Fixed(size) = config.style {
            if size == 0 || !capacity.is_multiple_of(size) {
                return Err(Status::internal(format!(
                    "the capacity {capacity} is not a multiple of the fixed block size {size}"
                )));
            }
        }
        let style = match config.style {
            Style::Fixed(_) => BlockMetadataType::FixedLength,
            Style::Variable => BlockMetadataType::VariableLength,
        } as i32;
        let blocks: Box<dyn Iterator<Item = BlockMetadata> + Send> = match config.fault {
            Fault::TinyExtents { count } => Box::new((0..count).map(|i| block(i * 2, 1))),
            _ => {
                let mut blocks = extents(config.style, capacity, &ranges);
                blocks.retain(|b| (b.byte_offset + b.size_bytes) as u64 > starting_offset as u64);
                break_blocks(config.fault, capacity, &mut blocks);
                Box::new(blocks.into_iter())
            }
        };
        let stop = self.take_stop();
        let capacity = capacity as i64;
        let mut blocks = blocks.peekable();
        let mut sent = 0usize;
        let mut first = true;
        let messages = std::iter::from_fn(move || {
            if stop == Some(sent) {
                sent += 1;
                return Some(Err(Status::unavailable(
                    "the snapshot metadata stream was cut (fault injection)",
                )));
            }
            if stop.is_some_and(|s| sent > s) {
                return None;
            }
            let chunk: Vec<BlockMetadata> = blocks.by_ref().take(per_message).collect();
            if chunk.is_empty() && !first {
                return None;
            }
            first = false;
            sent += 1;
            Some(Ok(make((style, capacity, chunk))))
        });
        Ok(Response::new(Box::pin(futures::stream::iter(messages))))
    }
}

fn block(offset: u64, size: u64) -> BlockMetadata {
    BlockMetadata {
        byte_offset: offset as i64,
        size_bytes: size as i64,
    }
}

/// The extents of `ranges` in `style`: one per fixed block touched, or the runs.
fn extents(style: Style, capacity: u64, ranges: &[(u64, u64)]) -> Vec<BlockMetadata> {
    match style {
        Style::Variable => ranges.iter().map(|&(s, e)| block(s, e - s)).collect(),
        Style::Fixed(size) => {
            let mut out: Vec<BlockMetadata> = Vec::new();
            for &(s, e) in ranges {
                let mut at = s / size * size;
                if out
                    .last()
                    .is_some_and(|b| (b.byte_offset + b.size_bytes) as u64 > at)
                {
                    at += size;
                }
                while at < e && at + size <= capacity {
                    out.push(block(at, size));
                    at += size;
                }
            }
            out
        }
    }
}

/// Makes a correct list of extents wrong the way `fault` says.
fn break_blocks(fault: Fault, capacity: u64, blocks: &mut Vec<BlockMetadata>) {
    let size = blocks.first().map_or(4096, |b| b.size_bytes);
    match fault {
        Fault::OutOfOrder => {
            if blocks.len() < 2 {
                blocks.push(block(capacity - size as u64, size as u64));
                blocks.push(block(0, size as u64));
            } else {
                let n = blocks.len();
                blocks.swap(n - 2, n - 1);
            }
        }
        Fault::Overlapping => {
            let at = blocks.len() / 2;
            match blocks.get(at).cloned() {
                Some(b) => blocks.insert(
                    at + 1,
                    BlockMetadata {
                        byte_offset: b.byte_offset + (b.size_bytes / 2).max(1) - 1,
                        size_bytes: b.size_bytes,
                    },
                ),
                None => {
                    blocks.push(block(0, size as u64));
                    blocks.push(block(size as u64 / 2, size as u64));
                }
            }
        }
        Fault::PastCapacity => blocks.push(block(capacity, size as u64)),
        Fault::None | Fault::StopAfter { .. } | Fault::TinyExtents { .. } => {}
    }
}

impl Service {
    fn snapshot_named<'a>(
        config: &'a MetadataServerConfig,
        name: &str,
        field: &str,
    ) -> Result<&'a MetadataSnapshot, Status> {
        if name.is_empty() {
            return Err(Status::invalid_argument(format!("{field} is required")));
        }
        config
            .snapshots
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| Status::not_found(format!("no VolumeSnapshot {name}")))
    }
}

#[tonic::async_trait]
impl SnapshotMetadata for Service {
    type GetMetadataAllocatedStream = Replies<GetMetadataAllocatedResponse>;
    type GetMetadataDeltaStream = Replies<GetMetadataDeltaResponse>;

    async fn get_metadata_allocated(
        &self,
        request: Request<GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let r = request.into_inner();
        let config = self.authenticate(&r.security_token, &r.namespace)?;
        self.record("allocated", r.starting_offset);
        let snapshot = Self::snapshot_named(&config, &r.snapshot_name, "snapshot_name")?;
        let path = snapshot.path.clone();
        let (capacity, ranges) = tokio::task::spawn_blocking(move || allocated(&path))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| Status::internal(format!("reading the snapshot: {e}")))?;
        self.reply(
            &config,
            capacity,
            ranges,
            r.starting_offset,
            r.max_results,
            |(t, c, b)| GetMetadataAllocatedResponse {
                block_metadata_type: t,
                volume_capacity_bytes: c,
                block_metadata: b,
            },
        )
    }

    async fn get_metadata_delta(
        &self,
        request: Request<GetMetadataDeltaRequest>,
    ) -> Result<Response<Self::GetMetadataDeltaStream>, Status> {
        let r = request.into_inner();
        let config = self.authenticate(&r.security_token, &r.namespace)?;
        self.record("delta", r.starting_offset);
        let target =
            Self::snapshot_named(&config, &r.target_snapshot_name, "target_snapshot_name")?;
        if r.base_snapshot_id.is_empty() {
            return Err(Status::invalid_argument("base_snapshot_id is required"));
        }
        let base = config
            .snapshots
            .iter()
            .find(|s| s.handle == r.base_snapshot_id)
            .ok_or_else(|| {
                Status::not_found(format!("no snapshot with handle {}", r.base_snapshot_id))
            })?;
        let known = config
            .deltas
            .iter()
            .find(|d| d.base_handle == base.handle && d.target == target.name)
            .map(|d| d.ranges.clone());
        let (base, target) = (base.path.clone(), target.path.clone());
        let block = match config.style {
            Style::Fixed(size) => size,
            Style::Variable => 4096,
        };
        let (capacity, ranges) = tokio::task::spawn_blocking(move || -> std::io::Result<_> {
            match known {
                Some(list) => Ok((std::fs::metadata(&target)?.len(), read_ranges(&list)?)),
                None => delta(&base, &target, block),
            }
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(|e| Status::internal(format!("comparing the snapshots: {e}")))?;
        self.reply(
            &config,
            capacity,
            ranges,
            r.starting_offset,
            r.max_results,
            |(t, c, b)| GetMetadataDeltaResponse {
                block_metadata_type: t,
                volume_capacity_bytes: c,
                block_metadata: b,
            },
        )
    }
}

/// A file's size and its data ranges, from SEEK_DATA and SEEK_HOLE.
pub fn allocated(path: &Path) -> std::io::Result<(u64, Vec<(u64, u64)>)> {
    let file = File::open(path)?;
    let size = file.metadata()?.len();
    let fd = file.as_raw_fd();
    let seek = |offset: u64, whence: libc::c_int| -> std::io::Result<Option<u64>> {
        // SAFETY: lseek on a file descriptor `file` keeps open; no memory is passed.
        let r = unsafe { libc::lseek(fd, offset as libc::off_t, whence) };
        if r >= 0 {
            return Ok(Some(r as u64));
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(err),
        }
    };
    let mut ranges = Vec::new();
    let mut at = 0;
    while at < size {
        let Some(start) = seek(at, libc::SEEK_DATA)? else {
            break;
        };
        let end = seek(start, libc::SEEK_HOLE)?.unwrap_or(size).min(size);
        if end > start {
            ranges.push((start, end));
        }
        at = end;
    }
    Ok((size, ranges))
}

/// The target's size and the `block`-aligned ranges where it differs from the base,
/// comparing only where either file holds data.
pub fn delta(base: &Path, target: &Path, block: u64) -> std::io::Result<(u64, Vec<(u64, u64)>)> {
    let (size, mut data) = allocated(target)?;
    let (base_size, base_data) = allocated(base)?;
    if base_size != size {
        return Err(std::io::Error::other(format!(
            "the base snapshot has {base_size} bytes, the target {size}"
        )));
    }
    data.extend(base_data);
    data.sort_unstable();
    let (b, t) = (File::open(base)?, File::open(target)?);
    const BUF: u64 = 1 << 20;
    let block = block.max(1);
    let step = (BUF / block).max(1) * block;
    let (mut bb, mut tb) = (vec![0u8; step as usize], vec![0u8; step as usize]);
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut done = 0u64;
    for (s, e) in data {
        let mut at = (s / block * block).max(done);
        let e = e.div_ceil(block) * block;
        while at < e.min(size) {
            let n = step.min(size - at) as usize;
            read_full(&b, &mut bb[..n], at)?;
            read_full(&t, &mut tb[..n], at)?;
            for (i, (x, y)) in bb[..n]
                .chunks(block as usize)
                .zip(tb[..n].chunks(block as usize))
                .enumerate()
            {
                if x != y {
                    let start = at + i as u64 * block;
                    let end = (start + block).min(size);
                    match out.last_mut() {
                        Some((_, last)) if *last == start => *last = end,
                        _ => out.push((start, end)),
                    }
                }
            }
            at += n as u64;
        }
        done = done.max(at);
    }
    Ok((size, out))
}

/// `OFFSET LENGTH` lines, sorted and joined.
fn read_ranges(path: &Path) -> std::io::Result<Vec<(u64, u64)>> {
    let mut ranges = Vec::new();
    for line in std::fs::read_to_string(path)?.lines() {
        let mut words = line.split_whitespace();
        let (Some(offset), Some(len)) = (words.next(), words.next()) else {
            continue;
        };
        let parse = |w: &str| {
            w.parse::<u64>()
                .map_err(|e| std::io::Error::other(format!("{}: {w}: {e}", path.display())))
        };
        let (offset, len) = (parse(offset)?, parse(len)?);
        ranges.push((offset, offset + len));
    }
    ranges.sort_unstable();
    let mut joined: Vec<(u64, u64)> = Vec::new();
    for (s, e) in ranges {
        match joined.last_mut() {
            Some((_, last)) if *last >= s => *last = (*last).max(e),
            _ => joined.push((s, e)),
        }
    }
    Ok(joined)
}

fn read_full(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    file.read_exact_at(buf, offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_extents_cover_each_block_touched_once() {
        let got = extents(Style::Fixed(10), 100, &[(5, 12), (15, 31), (95, 100)]);
        let offsets: Vec<i64> = got.iter().map(|b| b.byte_offset).collect();
        assert_eq!(offsets, vec![0, 10, 20, 30, 90]);
        assert!(got.iter().all(|b| b.size_bytes == 10));
    }
}
