//! One source into many targets in one pass: [`FanOut`] is a target that writes every
//! request to each of its members, so the copy reads each extent once however many
//! volumes it fills (cluster template deployment: one golden image into many volumes).
//!
//! A request's buffer goes to the members one after another and is released when the
//! last one has written it, so memory stays that of a single copy; the copy's other
//! requests in flight keep every member busy meanwhile. A member that fails is dropped
//! from the copy (aborted at the end) and the others go on: the fan-out fails only when
//! no member is left. A failed write takes its buffer with it, so the buffer is read from
//! the source again, whole, for the members after it and for the caller (the only time
//! anything is read twice).
//! [`FanOut::outcomes`] says afterwards how each member ended.
//!
//! The fan-out's capabilities are what every member can do (zeroes are efficient only if
//! every member writes them efficiently, random writes only if all take them, ...), so
//! the engine's choices (order, zero handling, request sizes) suit all of them; each
//! member still handles its own zero writes and flushes.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{BlockSizes, Caps, Error, ErrorKind, IoBuf, Result, Source, Target, ZeroMode};
use parking_lot::Mutex;

/// How one member of a fan-out ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberOutcome {
    /// The member's `describe()`.
    pub target: String,
    /// `None` when it holds the whole image (finished); why it was dropped otherwise.
    pub error: Option<Failure>,
}

/// The error that dropped a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub kind: ErrorKind,
    pub message: String,
}

impl Failure {
    fn of(e: &Error) -> Self {
        Self {
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}

/// Writes to several targets at once (see the module docs).
pub struct FanOut {
    /// The members as opened: finish, abort and the outcome go to these.
    members: Arc<Members>,
    /// This handle's connection to each member (the opened ones for the first handle).
    handles: Vec<Arc<dyn Target>>,
}

struct Members {
    /// Read again only when a member's failed write took a request's buffer with it.
    source: Arc<dyn Source>,
    opened: Vec<Arc<dyn Target>>,
    names: Vec<String>,
    /// Why a member was dropped, by index.
    failed: Mutex<Vec<Option<Failure>>>,
    size: u64,
}

impl std::fmt::Debug for Members {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Members")
            .field("targets", &self.names)
            .field("failed", &self.failed.lock())
            .finish_non_exhaustive()
    }
}

impl Members {
    fn is_live(&self, i: usize) -> bool {
        self.failed.lock()[i].is_none()
    }

    fn drop_member(&self, i: usize, e: Error) {
        let mut failed = self.failed.lock();
        if failed[i].is_none() {
            failed[i] = Some(Failure::of(&e.with_endpoint(self.names[i].clone())));
        }
    }

    fn live_count(&self) -> usize {
        self.failed.lock().iter().filter(|f| f.is_none()).count()
    }

    /// The error when no member is left: the first member's, naming how many failed.
    fn none_left(&self) -> Error {
        let failed = self.failed.lock();
        match failed.iter().flatten().next() {
            Some(f) if failed.len() == 1 => Error::new(f.kind, f.message.clone()),
            Some(f) => Error::new(
                f.kind,
                format!(
                    "every one of the {} targets failed; the first: {}",
                    failed.len(),
                    f.message
                ),
            ),
            None => Error::internal("a fan-out with no targets"),
        }
    }
}

impl std::fmt::Debug for FanOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanOut")
            .field("members", &self.members)
            .finish_non_exhaustive()
    }
}

impl FanOut {
    /// A fan-out of `source` over `targets` (at least one), each at least as large as the
    /// source.
    pub fn new(source: Arc<dyn Source>, targets: Vec<Arc<dyn Target>>) -> Result<Self> {
        let size = source.size();
        if targets.is_empty() {
            return Err(Error::invalid_input("a fan-out needs at least one target"));
        }
        if !source.size_known() {
            return Err(Error::unsupported(
                "the source's size is not known before it is read (a compressed stream that \
                 does not record it), and a copy to several targets needs it: give it with \
                 --source-size, count it first with --prescan, or copy to one target",
            )
            .with_endpoint(source.describe()));
        }
        if let Some(small) = targets.iter().find(|t| t.size() < size) {
            return Err(Error::invalid_input(format!(
                "the target ({} bytes) is smaller than the source ({size} bytes)",
                small.size()
            ))
            .with_endpoint(small.describe()));
        }
        let names = targets.iter().map(|t| t.describe()).collect();
        Ok(Self {
            members: Arc::new(Members {
                source,
                failed: Mutex::new(vec![None; targets.len()]),
                names,
                size,
                opened: targets.clone(),
            }),
            handles: targets,
        })
    }

    /// How each member ended, in the order given to [`FanOut::new`]. Meaningful once the
    /// copy has finished or failed.
    pub fn outcomes(&self) -> Vec<MemberOutcome> {
        let failed = self.members.failed.lock();
        self.members
            .names
            .iter()
            .zip(failed.iter())
            .map(|(name, error)| MemberOutcome {
                target: name.clone(),
                error: error.clone(),
            })
            .collect()
    }

    /// The buffer a failed member's write took with it, read again whole: the caller
    /// filled it from the source at the image offset of its first byte (`offset` minus the
    /// view's start) and may write other views of it after this one.
    async fn reread(&self, offset: u64, capacity: usize, view: Range<usize>) -> Result<IoBuf> {
        let source = &self.members.source;
        let base = offset
            .checked_sub(view.start as u64)
            .ok_or_else(|| Error::internal("a write view starts before the image"))?;
        let len = source.size().saturating_sub(base).min(capacity as u64) as usize;
        let mut b = IoBuf::new(capacity);
        b.set_view(0, len);
        let mut b = source
            .read_at(base, b)
            .await
            .map_err(|e| e.at("read", base).with_endpoint(source.describe()))?;
        b.set_view(view.start, view.len());
        Ok(b)
    }

    /// Runs `op` on every live member through this handle; a member whose `op` fails is
    /// dropped. Fails only when no member is left.
    async fn each<'a, F, Fut>(&'a self, mut op: F) -> Result<()>
    where
        F: FnMut(&'a Arc<dyn Target>) -> Fut,
        Fut: std::future::Future<Output = Result<()>> + 'a,
    {
        for (i, handle) in self.handles.iter().enumerate() {
            if !self.members.is_live(i) {
                continue;
            }
            if let Err(e) = op(handle).await {
                self.members.drop_member(i, e);
            }
        }
        self.alive()
    }

    fn alive(&self) -> Result<()> {
        if self.members.live_count() == 0 {
            return Err(self.members.none_left());
        }
        Ok(())
    }
}

/// What every member can do.
fn common_caps(members: &[Arc<dyn Target>]) -> Caps {
    let all = |f: fn(&Caps) -> bool| members.iter().all(|m| f(&m.caps()));
    let caps: Vec<Caps> = members.iter().map(|m| m.caps()).collect();
    Caps {
        extents: false,
        efficient_zero: all(|c| c.efficient_zero),
        trim: all(|c| c.trim),
        random_write: all(|c| c.random_write),
        rewrite: all(|c| c.rewrite),
        read_while_writing: all(|c| c.read_while_writing),
        multi_conn: all(|c| c.multi_conn),
        sequential_read: false,
        block: BlockSizes {
            minimum: caps.iter().map(|c| c.block.minimum).max().unwrap_or(1),
            preferred: caps.iter().map(|c| c.block.preferred).max().unwrap_or(1),
            maximum: caps
                .iter()
                .map(|c| c.block.maximum)
                .min()
                .unwrap_or(u32::MAX),
        },
        request_size: caps.iter().filter_map(|c| c.request_size).max(),
        work_unit: None,
    }
}

#[async_trait]
impl Target for FanOut {
    fn describe(&self) -> String {
        self.members.names.join(", ")
    }

    fn size(&self) -> u64 {
        self.members.size
    }

    fn caps(&self) -> Caps {
        common_caps(&self.members.opened)
    }

    fn is_zero(&self) -> bool {
        self.members.opened.iter().all(|m| m.is_zero())
    }

    async fn write_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        let (capacity, view) = (buf.capacity(), buf.view());
        let mut buf = Some(buf);
        for (i, handle) in self.handles.iter().enumerate() {
            if !self.members.is_live(i) {
                continue;
            }
            let b = match buf.take() {
                Some(b) => b,
                None => self.reread(offset, capacity, view.clone()).await?,
            };
            match handle.write_at(offset, b).await {
                Ok(b) => buf = Some(b),
                Err(e) => self.members.drop_member(i, e),
            }
        }
        self.alive()?;
        match buf {
            Some(b) => Ok(b),
            // The caller may write other views of this buffer next: give it back whole.
            None => self.reread(offset, capacity, view).await,
        }
    }

    async fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        self.each(|h| h.write_zeroes(offset, len, mode)).await
    }

    async fn flush(&self) -> Result<()> {
        self.each(|h| h.flush()).await
    }

    async fn connect(&self) -> Result<Arc<dyn Target>> {
        let mut handles = Vec::with_capacity(self.handles.len());
        for (i, handle) in self.handles.iter().enumerate() {
            if !self.members.is_live(i) {
                handles.push(Arc::clone(handle));
                continue;
            }
            match handle.connect().await {
                Ok(h) => handles.push(h),
                Err(e) => {
                    self.members.drop_member(i, e);
                    handles.push(Arc::clone(handle));
                }
            }
        }
        self.alive()?;
        Ok(Arc::new(Self {
            members: Arc::clone(&self.members),
            handles,
        }))
    }

    /// Finishes every live member and aborts the dropped ones; fails only when none holds
    /// the image.
    async fn finish(&self) -> Result<()> {
        for (i, member) in self.members.opened.iter().enumerate() {
            if self.members.is_live(i) {
                if let Err(e) = member.finish().await {
                    self.members.drop_member(i, e);
                    let _ = member.abort().await;
                }
            } else {
                let _ = member.abort().await;
            }
        }
        self.alive()
    }

    async fn abort(&self) -> Result<()> {
        let mut first = None;
        for member in &self.members.opened {
            if let Err(e) = member.abort().await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use ferry_testkit::{MemSource, RecordingTarget};

    use super::*;
    use crate::{copy, CancellationToken, CopyOptions, Progress};

    const MIB: u64 = 1024 * 1024;

    /// Data with a zero 4 KiB block in every 64 KiB (so the engine writes several views
    /// of each read buffer) and two holes.
    fn image(size: u64) -> MemSource {
        let data: Vec<u8> = (0..size)
            .map(|i| {
                if i % (64 * 1024) < 4096 {
                    0
                } else {
                    (i % 251) as u8 + 1
                }
            })
            .collect();
        MemSource::new(data).with_holes(&[(MIB, 3 * MIB), (7 * MIB, 8 * MIB)])
    }

    async fn fan_out(source: &MemSource, targets: &[RecordingTarget]) -> (Result<()>, FanOut) {
        let members: Vec<Arc<dyn Target>> = targets
            .iter()
            .map(|t| Arc::new(t.clone()) as Arc<dyn Target>)
            .collect();
        let fan = Arc::new(FanOut::new(Arc::new(source.clone()), members).unwrap());
        let options = CopyOptions {
            workers: 3,
            request_size: Some(256 * 1024),
            ..CopyOptions::default()
        };
        let result = copy(
            Arc::new(source.clone()),
            fan.clone(),
            &options,
            &Progress::new(),
            &CancellationToken::new(),
        )
        .await
        .map(|_| ());
        let fan = Arc::try_unwrap(fan).expect("the copy let go of the fan-out");
        (result, fan)
    }

    #[tokio::test]
    async fn every_target_gets_the_image_from_one_read_of_each_byte() {
        let source = image(10 * MIB);
        let targets: Vec<_> = (0..3).map(|_| RecordingTarget::new(10 * MIB)).collect();
        let (result, fan) = fan_out(&source, &targets).await;
        result.unwrap();
        for t in &targets {
            assert_eq!(t.data(), source.data(), "every target holds the image");
            assert!(t.is_finished());
        }
        let read: usize = source.stats.reads().iter().map(|(_, n)| n).sum();
        assert_eq!(
            read as u64,
            10 * MIB - 3 * MIB,
            "each data byte read once, holes not at all"
        );
        assert!(fan.outcomes().iter().all(|o| o.error.is_none()));
    }

    #[tokio::test]
    async fn a_failing_target_is_dropped_and_the_others_go_on() {
        let source = image(10 * MIB);
        let targets = vec![
            RecordingTarget::new(10 * MIB),
            RecordingTarget::new(10 * MIB).fail_write_at(5 * MIB + 8192),
            RecordingTarget::new(10 * MIB),
        ];
        let (result, fan) = fan_out(&source, &targets).await;
        result.unwrap();
        assert_eq!(targets[0].data(), source.data());
        assert_eq!(
            targets[2].data(),
            source.data(),
            "the member after the failed one"
        );
        assert!(targets[0].is_finished() && targets[2].is_finished());
        assert!(targets[1].is_aborted() && !targets[1].is_finished());
        let outcomes = fan.outcomes();
        let error = outcomes[1]
            .error
            .as_ref()
            .expect("the failed member's error");
        assert!(
            error.message.contains("injected write failure"),
            "{error:?}"
        );
        assert!(outcomes[0].error.is_none() && outcomes[2].error.is_none());
        let read: usize = source.stats.reads().iter().map(|(_, n)| n).sum();
        assert!(
            read as u64 > 7 * MIB,
            "the request the failed write took was read again for the member after it"
        );
    }

    #[tokio::test]
    async fn the_last_target_failing_leaves_the_buffer_whole_for_the_rest_of_the_request() {
        let source = image(10 * MIB);
        let targets = vec![
            RecordingTarget::new(10 * MIB),
            RecordingTarget::new(10 * MIB).fail_write_at(4 * MIB + 8192),
        ];
        let (result, fan) = fan_out(&source, &targets).await;
        result.unwrap();
        assert_eq!(targets[0].data(), source.data());
        assert!(targets[1].is_aborted());
        assert!(fan.outcomes()[1].error.is_some());
    }

    #[tokio::test]
    async fn the_copy_fails_when_no_target_is_left() {
        let source = image(10 * MIB);
        let targets = vec![
            RecordingTarget::new(10 * MIB).fail_write_at(0),
            RecordingTarget::new(10 * MIB).fail_write_at(9 * MIB),
        ];
        let (result, fan) = fan_out(&source, &targets).await;
        let error = result.expect_err("no target holds the image");
        assert!(
            error
                .to_string()
                .contains("every one of the 2 targets failed"),
            "{error}"
        );
        assert!(targets.iter().all(|t| t.is_aborted() && !t.is_finished()));
        assert!(fan.outcomes().iter().all(|o| o.error.is_some()));
    }

    #[test]
    fn caps_are_what_every_member_can_do_and_sizes_are_checked() {
        let source: Arc<dyn Source> = Arc::new(image(10 * MIB));
        let streaming = Caps {
            random_write: false,
            ..Caps::default()
        };
        let members: Vec<Arc<dyn Target>> = vec![
            Arc::new(RecordingTarget::new(10 * MIB)),
            Arc::new(RecordingTarget::new(12 * MIB).with_caps(streaming)),
        ];
        let fan = FanOut::new(source.clone(), members).unwrap();
        assert!(!fan.caps().random_write);
        assert_eq!(fan.size(), 10 * MIB);
        let small: Vec<Arc<dyn Target>> = vec![
            Arc::new(RecordingTarget::new(10 * MIB)),
            Arc::new(RecordingTarget::new(MIB)),
        ];
        let error = FanOut::new(source.clone(), small).expect_err("a target too small");
        assert!(
            error.to_string().contains("smaller than the source"),
            "{error}"
        );
        assert!(FanOut::new(source, Vec::new()).is_err());
    }
}
