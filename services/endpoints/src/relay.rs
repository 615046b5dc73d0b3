//! A relay: a copy that serves the image it is writing over NBD, so other movers read it
//! from this one instead of from the origin (the origin is read once however many groups
//! of targets a rollout has).
//!
//! The copy's first local target (a file or block device) is the relay's backing. The
//! copy reports every range as soon as it is on that target ([`WrittenRanges`], data or
//! zero); a client's read of a range not yet written waits until it is (at most
//! [`RelayOptions::wait`]), so it never sees stale or mixed bytes, and block status
//! reports the written zero ranges as holes (downstream targets stay sparse) and only the
//! known prefix of a range otherwise. [`Relay::wrap`] watches the backing target: a write
//! that fails there, or the copy's abort (failure, cancellation), fails every waiting and
//! later read with EIO. After the copy, the finished image is served until every client
//! has disconnected and none has come for the idle time (for clients that start late), or
//! the linger time has passed ([`Relay::end`]); a [`RelayRelease`] (the caller knows no
//! client is still to come) skips the idle time.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferry_core::{Caps, Error, IoBuf, Result, Target, WrittenRanges, ZeroMode};
use ferry_nbd::proto::{STATE_HOLE, STATE_ZERO};
use ferry_nbd::{Backend, BlockSize, Server, StatusExtent, MAX_PAYLOAD};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::export::{Export, ExportOptions};

/// Extents in one block status answer at most (a client asks again for the rest).
const MAX_EXTENTS: usize = 1024;
/// How long a failed relay keeps its socket open, so waiting reads get their EIO replies
/// before the connections close.
const FAIL_GRACE: Duration = Duration::from_secs(1);
/// How often the linger checks whether the last client has gone.
const LINGER_POLL: Duration = Duration::from_millis(100);

/// How to relay a copy.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// Where and how to serve (address, export name, TLS).
    pub export: ExportOptions,
    /// How long a read of a range the copy has not written yet waits for it.
    pub wait: Duration,
    /// How long the finished image is served at most while clients are still connected.
    pub linger: Duration,
    /// How long the finished image is still served with no client connected, for clients
    /// that have not come yet (zero: it closes as soon as none is connected). Bounded by
    /// `linger`.
    pub idle: Duration,
}

/// Default of [`RelayOptions::wait`].
pub const DEFAULT_WAIT: Duration = Duration::from_secs(60);
/// Default of [`RelayOptions::linger`].
pub const DEFAULT_LINGER: Duration = Duration::from_secs(300);

/// How a relay's copy ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    Running,
    Complete,
    Failed(String),
}

/// Merged `[start, end)` ranges.
#[derive(Debug, Default)]
struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        if let Some((&s, &e)) = self.0.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.0.remove(&s);
            }
        }
        while let Some((&s, &e)) = self.0.range(start..).next() {
            if s > end {
                break;
            }
            end = end.max(e);
            self.0.remove(&s);
        }
        self.0.insert(start, end);
    }

    /// The end of the range holding `at`.
    fn end_of(&self, at: u64) -> Option<u64> {
        self.0
            .range(..=at)
            .next_back()
            .map(|(_, &e)| e)
            .filter(|&e| e > at)
    }

    /// The start of the first range after `at`.
    fn next_after(&self, at: u64) -> Option<u64> {
        self.0.range(at..).next().map(|(&s, _)| s)
    }
}

/// What the copy has written so far.
#[derive(Debug)]
struct Known {
    size: u64,
    data: Ranges,
    zero: Ranges,
    end: End,
}

impl Known {
    /// The known range at `at`: its end and whether it reads as zeroes.
    fn at(&self, at: u64) -> Option<(u64, bool)> {
        if let Some(e) = self.data.end_of(at) {
            return Some((e, false));
        }
        if let Some(e) = self.zero.end_of(at) {
            return Some((e, true));
        }
        // A finished copy reported every range; whatever it did not is zero.
        (self.end == End::Complete).then(|| {
            let next = [self.data.next_after(at), self.zero.next_after(at)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(self.size);
            (next.max(at + 1), true)
        })
    }

    fn covers(&self, start: u64, end: u64) -> bool {
        let mut at = start;
        while at < end {
            match self.at(at) {
                Some((e, _)) => at = e,
                None => return false,
            }
        }
        true
    }
}

/// The relay's shared state: what is written, whether the copy ended, and whether more
/// clients are to be waited for.
#[derive(Debug)]
struct State {
    wait: Duration,
    known: Mutex<Known>,
    changed: Notify,
    released: std::sync::atomic::AtomicBool,
}

/// Says a relay that no client is still to come: once its copy finished it serves the
/// clients connected and ends when the last one has gone, without the idle time.
#[derive(Debug, Clone)]
pub struct RelayRelease(Arc<State>);

impl RelayRelease {
    /// No client is still to come.
    pub fn release(&self) {
        self.0
            .released
            .store(true, std::sync::atomic::Ordering::Release);
    }
}

impl State {
    fn end(&self, end: End) {
        {
            let mut known = self.known.lock();
            // The first end wins: a failure is not undone by a later finish.
            if known.end != End::Running {
                return;
            }
            known.end = end;
        }
        self.changed.notify_waiters();
    }

    fn fail(&self, why: String) {
        self.end(End::Failed(why));
    }

    fn ended(&self) -> Option<End> {
        let known = self.known.lock();
        (known.end != End::Running).then(|| known.end.clone())
    }

    /// Waits until `[start, end)` is written; EIO once the copy failed, or when it is not
    /// written within the wait.
    async fn wait_for(&self, start: u64, end: u64) -> std::io::Result<()> {
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let known = self.known.lock();
                if let End::Failed(why) = &known.end {
                    return Err(std::io::Error::other(format!(
                        "the relay's copy failed: {why}"
                    )));
                }
                if known.covers(start, end) {
                    return Ok(());
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "bytes {start}..{end} were not written by the relay's copy within \
                         {:?} (its --relay-wait)",
                        self.wait
                    ),
                ));
            }
        }
    }

    async fn ended_wait(&self) -> End {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(end) = self.ended() {
                return end;
            }
            changed.await;
        }
    }
}

impl WrittenRanges for State {
    fn written(&self, start: u64, end: u64, zero: bool) {
        {
            let mut known = self.known.lock();
            if zero {
                known.zero.insert(start, end);
            } else {
                known.data.insert(start, end);
            }
        }
        self.changed.notify_waiters();
    }
}

/// The relay's NBD backend: the backing file's bytes, once the copy has written them.
pub struct RelayBackend {
    state: Arc<State>,
    file: Arc<std::fs::File>,
    path: PathBuf,
    size: u64,
}

impl std::fmt::Debug for RelayBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayBackend")
            .field("path", &self.path)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl Backend for RelayBackend {
    type Buf = Vec<u8>;

    fn size(&self) -> u64 {
        self.size
    }

    fn block_size(&self) -> BlockSize {
        BlockSize {
            minimum: 1,
            preferred: 4096,
            maximum: MAX_PAYLOAD,
        }
    }

    fn can_extents(&self) -> bool {
        true
    }

    fn extents_ready(&self, offset: u64) -> bool {
        let known = self.state.known.lock();
        matches!(known.end, End::Failed(_)) || known.at(offset).is_some()
    }

    async fn read(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        self.state.wait_for(offset, offset + len as u64).await?;
        let file = self.file.clone();
        let bytes = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; len];
            let mut done = 0;
            while done < len {
                match file.read_at(&mut buf[done..], offset + done as u64) {
                    // Past the end of a file the copy grows: zeroes it skipped.
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(buf)
        })
        .await
        .map_err(|e| std::io::Error::other(format!("a relay read stopped: {e}")))??;
        // The copy may have failed while the bytes were read: never serve them then.
        self.state.wait_for(offset, offset + len as u64).await?;
        Ok(bytes)
    }

    async fn extents(&self, offset: u64, len: u64) -> std::io::Result<Vec<StatusExtent>> {
        self.state.wait_for(offset, offset + 1).await?;
        let end = offset + len;
        let known = self.state.known.lock();
        let mut out: Vec<StatusExtent> = Vec::new();
        let mut at = offset;
        while at < end && out.len() < MAX_EXTENTS {
            let Some((e, zero)) = known.at(at) else { break };
            let e = e.min(end);
            let flags = if zero { STATE_HOLE | STATE_ZERO } else { 0 };
            match out.last_mut() {
                Some(last) if last.flags == flags => last.len += e - at,
                _ => out.push(StatusExtent {
                    offset: at,
                    len: e - at,
                    flags,
                }),
            }
            at = e;
        }
        Ok(out)
    }
}

/// A relay serving while its copy runs (see the module docs).
#[derive(Debug)]
pub struct Relay {
    state: Arc<State>,
    server: Server<RelayBackend>,
    uri: String,
    linger: Duration,
    /// Taken by [`Relay::end`].
    task: Option<JoinHandle<()>>,
}

impl Relay {
    /// Opens `backing` (the copy's first local target, already created) for reading,
    /// binds the socket and starts serving the `size`-byte image as the copy writes it.
    pub async fn start(backing: &Path, size: u64, options: &RelayOptions) -> Result<Self> {
        let file = std::fs::File::open(backing).map_err(|e| {
            Error::io(
                format!("cannot open the relay's backing {}", backing.display()),
                e,
            )
        })?;
        let state = Arc::new(State {
            wait: options.wait,
            known: Mutex::new(Known {
                size,
                data: Ranges::default(),
                zero: Ranges::default(),
                end: End::Running,
            }),
            changed: Notify::new(),
            released: std::sync::atomic::AtomicBool::new(false),
        });
        let backend = RelayBackend {
            state: state.clone(),
            file: Arc::new(file),
            path: backing.to_path_buf(),
            size,
        };
        let export = Export::bind_backend(backend, &options.export).await?;
        let uri = export.uri().to_string();
        let server = export.server();
        let (linger, idle) = (options.linger, options.idle);
        let shutdown = {
            let (state, server) = (state.clone(), server.clone());
            async move {
                if let End::Failed(_) = state.ended_wait().await {
                    tokio::time::sleep(FAIL_GRACE).await;
                    return;
                }
                let deadline = tokio::time::Instant::now() + linger;
                let mut last_seen = tokio::time::Instant::now();
                loop {
                    let now = tokio::time::Instant::now();
                    let released = state.released.load(std::sync::atomic::Ordering::Acquire);
                    if server.connections() > 0 {
                        last_seen = now;
                    } else if released || now >= last_seen + idle {
                        break;
                    }
                    if now >= deadline {
                        break;
                    }
                    tokio::time::sleep(LINGER_POLL).await;
                }
            }
        };
        let task = tokio::spawn(export.serve(shutdown));
        Ok(Self {
            state,
            server,
            uri,
            linger,
            task: Some(task),
        })
    }

    /// The NBD URI downstream movers read.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// A handle that tells the relay no client is still to come.
    pub fn release_handle(&self) -> RelayRelease {
        RelayRelease(self.state.clone())
    }

    /// Clients connected now.
    pub fn clients(&self) -> usize {
        self.server.connections()
    }

    /// How long the finished image is served at most.
    pub fn linger(&self) -> Duration {
        self.linger
    }

    /// What the copy reports its written ranges to (its Progress's observer).
    pub fn written(&self) -> Arc<dyn WrittenRanges> {
        self.state.clone()
    }

    /// The copy's backing target, watched: its failure or the copy's abort fails the relay,
    /// its finish completes it.
    pub fn wrap(&self, target: Arc<dyn Target>) -> Arc<dyn Target> {
        Arc::new(RelayTarget {
            inner: target,
            state: self.state.clone(),
        })
    }

    /// Whether the copy finished the backing target (the image is whole).
    pub fn is_complete(&self) -> bool {
        self.state.ended() == Some(End::Complete)
    }

    /// After the copy: fails the relay if the image is not complete, then serves until
    /// the last client has gone or the linger has passed (at once after a failure, once
    /// waiting reads got their errors).
    pub async fn end(mut self) {
        self.state
            .fail("the copy ended before the image was complete".into());
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Relay {
    /// A relay dropped without [`Relay::end`] (its copy's caller returned early) fails its
    /// reads and closes, or lingers on its own when the copy had finished.
    fn drop(&mut self) {
        self.state
            .fail("the copy ended before the image was complete".into());
    }
}

/// The relay's backing target: every call goes through, failures end the relay.
struct RelayTarget {
    inner: Arc<dyn Target>,
    state: Arc<State>,
}

impl std::fmt::Debug for RelayTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayTarget")
            .field("target", &self.inner.describe())
            .finish_non_exhaustive()
    }
}

impl RelayTarget {
    fn check<T>(&self, what: &str, result: Result<T>) -> Result<T> {
        if let Err(e) = &result {
            self.state.fail(format!(
                "{what} the relay's backing {} failed: {e}",
                self.inner.describe()
            ));
        }
        result
    }
}

#[async_trait]
impl Target for RelayTarget {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    fn can_grow(&self) -> bool {
        self.inner.can_grow()
    }

    async fn set_end(&self, end: u64) -> Result<()> {
        let r = self.inner.set_end(end).await;
        self.check("sizing", r)
    }

    fn is_zero(&self) -> bool {
        self.inner.is_zero()
    }

    async fn write_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        let r = self.inner.write_at(offset, buf).await;
        self.check("writing", r)
    }

    async fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        let r = self.inner.write_zeroes(offset, len, mode).await;
        self.check("zeroing", r)
    }

    async fn flush(&self) -> Result<()> {
        let r = self.inner.flush().await;
        self.check("flushing", r)
    }

    async fn connect(&self) -> Result<Arc<dyn Target>> {
        let r = self.inner.connect().await;
        let inner = self.check("connecting to", r)?;
        Ok(Arc::new(Self {
            inner,
            state: self.state.clone(),
        }))
    }

    async fn finish(&self) -> Result<()> {
        let r = self.inner.finish().await;
        let r = self.check("finishing", r);
        if r.is_ok() {
            self.state.end(End::Complete);
        }
        r
    }

    async fn abort(&self) -> Result<()> {
        self.state
            .fail("the copy was stopped before the image was complete".into());
        self.inner.abort().await
    }
}

#[cfg(test)]
mod tests;
