//! The full-feature phase: one session on one connection, many commands in flight.
//!
//! A reader task owns the receive half: it routes Data-In straight into the waiting
//! command's buffer, delivers R2Ts and responses to the command's own channel, answers
//! the target's NOP-In pings and tracks ExpCmdSN/MaxCmdSN. Each command's future sends its
//! own PDUs (command, immediate and unsolicited data, Data-Out for each R2T) under a
//! writer lock, so write data never leaves the caller's buffer. A gate serialises CmdSN
//! assignment with sending so commands reach the target in CmdSN order.

use std::any::Any;
use std::collections::HashMap;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::JoinHandle;

use crate::config::{Config, Params};
use crate::error::{Error, Result};
use crate::login::{self, DiscoveredTarget, Established};
use crate::pdu::{self, op, Bhs, Digests, BHS_LEN, FINAL, IMMEDIATE, RESERVED_TAG};
use crate::scsi::{self, Sense};

/// A buffer a read command fills: any owned byte buffer.
pub trait DataBuf: Send + 'static {
    fn bytes_mut(&mut self) -> &mut [u8];
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

impl<T: AsMut<[u8]> + Send + 'static> DataBuf for T {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.as_mut()
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// Serial number arithmetic (RFC 1982) for 32-bit sequence numbers: a < b.
fn sn_lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < (1 << 31)
}

fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

/// Encodes a LUN (SAM peripheral or flat addressing).
pub fn encode_lun(lun: u64) -> [u8; 8] {
    let mut l = [0u8; 8];
    if lun < 256 {
        l[1] = lun as u8;
    } else {
        l[0] = 0x40 | ((lun >> 8) as u8 & 0x3f);
        l[1] = lun as u8;
    }
    l
}

#[derive(Debug)]
struct Sn {
    cmd_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    exp_stat_sn: u32,
    next_itt: u32,
}

enum Event {
    R2t { ttt: u32, offset: u32, len: u32 },
    Done(Outcome),
}

#[derive(Default)]
struct Outcome {
    response: u8,
    status: u8,
    sense: Vec<u8>,
    underflow: u32,
    overflow: bool,
    rejected: Option<u8>,
}

struct Task {
    tx: mpsc::UnboundedSender<Event>,
    buf: Option<Box<dyn DataBuf>>,
}

#[derive(Default)]
struct Pending {
    tasks: HashMap<u32, Task>,
    closed: Option<String>,
}

struct Inner {
    writer: tokio::sync::Mutex<BufWriter<OwnedWriteHalf>>,
    gate: tokio::sync::Mutex<()>,
    sn: Mutex<Sn>,
    window: Notify,
    pending: Mutex<Pending>,
    slots: Semaphore,
    params: Params,
    digests: Digests,
    config: Config,
}

/// Data moved by a command.
#[allow(missing_debug_implementations)]
pub enum Transfer<'a> {
    None,
    Read(Box<dyn DataBuf>),
    Write(&'a [u8]),
}

/// What a command returned.
pub struct Completion {
    pub buf: Option<Box<dyn DataBuf>>,
    /// Bytes the target did not transfer (underflow residual).
    pub residual: u32,
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("residual", &self.residual)
            .finish()
    }
}

/// An iSCSI session (one connection) in the full-feature phase.
pub struct Session {
    inner: Arc<Inner>,
    reader: JoinHandle<()>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("params", &self.inner.params)
            .finish()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

async fn connect_tcp(address: &str, config: &Config) -> Result<TcpStream> {
    let stream = tokio::time::timeout(config.connect_timeout, TcpStream::connect(address))
        .await
        .map_err(|_| Error::Timeout {
            operation: "connect",
            seconds: config.connect_timeout.as_secs(),
        })?
        .map_err(|source| Error::Connect {
            address: address.to_string(),
            source,
        })?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Lists the targets a portal offers (SendTargets=All on a discovery session).
pub async fn discover(address: &str, config: &Config) -> Result<Vec<DiscoveredTarget>> {
    let mut stream = connect_tcp(address, config).await?;
    let est = tokio::time::timeout(
        config.connect_timeout,
        login::login(&mut stream, config, None),
    )
    .await
    .map_err(|_| Error::Timeout {
        operation: "login",
        seconds: config.connect_timeout.as_secs(),
    })??;
    // A target that logs in and then never answers (or keeps continuing its text) must
    // not hang discovery: the exchange gets the request timeout, or the connect one.
    let limit = config.request_timeout.unwrap_or(config.connect_timeout);
    tokio::time::timeout(limit, login::send_targets(&mut stream, est))
        .await
        .map_err(|_| Error::Timeout {
            operation: "SendTargets",
            seconds: limit.as_secs(),
        })?
}

impl Session {
    /// Connects to `address` (host:port) and logs in to `target`.
    pub async fn connect(address: &str, target: &str, config: &Config) -> Result<Self> {
        let mut stream = connect_tcp(address, config).await?;
        let est: Established = tokio::time::timeout(
            config.connect_timeout,
            login::login(&mut stream, config, Some(target)),
        )
        .await
        .map_err(|_| Error::Timeout {
            operation: "login",
            seconds: config.connect_timeout.as_secs(),
        })??;
        let (rd, wr) = stream.into_split();
        let digests = Digests {
            header: est.params.header_digest,
            data: est.params.data_digest,
        };
        let inner = Arc::new(Inner {
            writer: tokio::sync::Mutex::new(BufWriter::with_capacity(64 * 1024, wr)),
            gate: tokio::sync::Mutex::new(()),
            sn: Mutex::new(Sn {
                cmd_sn: est.cmd_sn,
                exp_cmd_sn: est.cmd_sn,
                max_cmd_sn: est.max_cmd_sn,
                exp_stat_sn: est.exp_stat_sn,
                next_itt: 0x100,
            }),
            window: Notify::new(),
            pending: Mutex::new(Pending::default()),
            slots: Semaphore::new(config.max_in_flight.max(1)),
            params: est.params,
            digests,
            config: config.clone(),
        });
        let reader = tokio::spawn(reader_task(
            Arc::clone(&inner),
            BufReader::with_capacity(64 * 1024, rd),
        ));
        Ok(Self { inner, reader })
    }

    /// The negotiated operational parameters.
    pub fn params(&self) -> Params {
        self.inner.params
    }

    /// Runs one SCSI command on `lun` and waits for its status.
    pub async fn execute(
        &self,
        lun: u64,
        cdb: &[u8; 16],
        transfer: Transfer<'_>,
    ) -> Result<Completion> {
        let _slot = self
            .inner
            .slots
            .acquire()
            .await
            .map_err(|_| Error::Closed)?;
        let (itt, mut rx) = self.register(None)?;
        let (read_len, write) = match transfer {
            Transfer::None => (0, None),
            Transfer::Read(mut b) => {
                let n = b.bytes_mut().len();
                self.attach(itt, b);
                (n, None)
            }
            Transfer::Write(d) => (0, Some(d)),
        };
        let result = self.run(itt, lun, cdb, read_len, write, &mut rx).await;
        let buf = self.unregister(itt);
        let residual = result?;
        Ok(Completion { buf, residual })
    }

    fn register(
        &self,
        buf: Option<Box<dyn DataBuf>>,
    ) -> Result<(u32, mpsc::UnboundedReceiver<Event>)> {
        let itt = {
            let mut sn = self.inner.sn.lock().unwrap_or_else(|e| e.into_inner());
            let itt = sn.next_itt;
            sn.next_itt = sn.next_itt.wrapping_add(1);
            if sn.next_itt == RESERVED_TAG {
                sn.next_itt = 0x100;
            }
            itt
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let mut p = self.inner.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(reason) = &p.closed {
            return Err(Error::Disconnected(reason.clone()));
        }
        p.tasks.insert(itt, Task { tx, buf });
        Ok((itt, rx))
    }

    fn attach(&self, itt: u32, buf: Box<dyn DataBuf>) {
        let mut p = self.inner.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = p.tasks.get_mut(&itt) {
            t.buf = Some(buf);
        }
    }

    fn unregister(&self, itt: u32) -> Option<Box<dyn DataBuf>> {
        let mut p = self.inner.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.tasks.remove(&itt).and_then(|t| t.buf)
    }

    fn closed_error(&self) -> Error {
        let p = self.inner.pending.lock().unwrap_or_else(|e| e.into_inner());
        match &p.closed {
            Some(r) => Error::Disconnected(r.clone()),
            None => Error::Closed,
        }
    }

    /// Waits for room in the CmdSN window; returns with the gate held.
    async fn wait_window(&self) -> Result<tokio::sync::MutexGuard<'_, ()>> {
        let gate = self.inner.gate.lock().await;
        loop {
            let mut notified = pin!(self.inner.window.notified());
            notified.as_mut().enable();
            {
                let sn = self.inner.sn.lock().unwrap_or_else(|e| e.into_inner());
                if sn_le(sn.cmd_sn, sn.max_cmd_sn) {
                    return Ok(gate);
                }
            }
            if self
                .inner
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .closed
                .is_some()
            {
                return Err(self.closed_error());
            }
            notified.await;
        }
    }

    async fn send(&self, w: &mut BufWriter<OwnedWriteHalf>, bhs: &Bhs, data: &[u8]) -> Result<()> {
        send_pdu(w, bhs, data, self.inner.digests).await
    }

    async fn run(
        &self,
        itt: u32,
        lun: u64,
        cdb: &[u8; 16],
        read_len: usize,
        write: Option<&[u8]>,
        rx: &mut mpsc::UnboundedReceiver<Event>,
    ) -> Result<u32> {
        let p = self.inner.params;
        let lun_bytes = encode_lun(lun);
        let write_len = write.map_or(0, <[u8]>::len);
        let expected = read_len.max(write_len);
        let expected32 = u32::try_from(expected).map_err(|_| {
            Error::InvalidRequest(format!("transfer of {expected} bytes is too large"))
        })?;
        let xmit = p.max_xmit_data_segment_length as usize;
        let (immediate, unsolicited) = match write {
            Some(d) => {
                let first = (p.first_burst_length as usize).min(d.len());
                let imm = if p.immediate_data { first.min(xmit) } else { 0 };
                let unsol = if p.initial_r2t { imm } else { first };
                (imm, unsol)
            }
            None => (0, 0),
        };
        let cmd_sn;
        {
            let _gate = self.wait_window().await?;
            let mut w = self.inner.writer.lock().await;
            let exp_stat_sn;
            {
                let mut sn = self.inner.sn.lock().unwrap_or_else(|e| e.into_inner());
                cmd_sn = sn.cmd_sn;
                sn.cmd_sn = sn.cmd_sn.wrapping_add(1);
                exp_stat_sn = sn.exp_stat_sn;
            }
            let mut flags = 0x01; // simple task attribute
            if unsolicited <= immediate {
                flags |= FINAL;
            }
            if read_len > 0 {
                flags |= 0x40;
            }
            if write.is_some() {
                flags |= 0x20;
            }
            let mut bhs = Bhs::new(op::SCSI_CMD, flags);
            bhs.set_lun(lun_bytes);
            bhs.set_itt(itt);
            bhs.set_u32(20, expected32);
            bhs.set_u32(24, cmd_sn);
            bhs.set_u32(28, exp_stat_sn);
            bhs.0[32..48].copy_from_slice(cdb);
            let data = write.map_or(&[][..], |d| &d[..immediate]);
            self.send(&mut w, &bhs, data).await?;
            if let Some(d) = write {
                self.send_data_out(
                    &mut w,
                    itt,
                    RESERVED_TAG,
                    lun_bytes,
                    d,
                    immediate,
                    unsolicited - immediate,
                )
                .await?;
            }
            w.flush()
                .await
                .map_err(|e| Error::io("sending a command", e))?;
        }
        let wait = async {
            loop {
                match rx.recv().await {
                    None => return Err(self.closed_error()),
                    Some(Event::R2t { ttt, offset, len }) => {
                        let d = write.ok_or_else(|| {
                            Error::Protocol("R2T for a command without data-out".into())
                        })?;
                        let (o, l) = (offset as usize, len as usize);
                        if o.checked_add(l).is_none_or(|e| e > d.len()) || l == 0 {
                            return Err(Error::Protocol(format!(
                                "R2T for {l} bytes at {o} outside the {} bytes of the command",
                                d.len()
                            )));
                        }
                        let mut w = self.inner.writer.lock().await;
                        self.send_data_out(&mut w, itt, ttt, lun_bytes, d, o, l)
                            .await?;
                        w.flush().await.map_err(|e| Error::io("sending data", e))?;
                    }
                    Some(Event::Done(o)) => return Ok(o),
                }
            }
        };
        let outcome = match self.inner.config.request_timeout {
            None => wait.await?,
            Some(t) => match tokio::time::timeout(t, wait).await {
                Ok(r) => r?,
                Err(_) => {
                    self.abort_task(itt, cmd_sn, lun).await;
                    return Err(Error::Timeout {
                        operation: "SCSI command",
                        seconds: t.as_secs(),
                    });
                }
            },
        };
        if let Some(reason) = outcome.rejected {
            return Err(Error::Rejected(reason));
        }
        if outcome.response != 0 {
            return Err(Error::TargetFailure(outcome.response));
        }
        match outcome.status {
            scsi::STATUS_GOOD => {}
            scsi::STATUS_CHECK_CONDITION => {
                return Err(match Sense::parse(&outcome.sense) {
                    Some(s) => Error::CheckCondition(s),
                    None => Error::Status {
                        status: outcome.status,
                        name: "CHECK CONDITION without sense data",
                    },
                })
            }
            s => {
                return Err(Error::Status {
                    status: s,
                    name: scsi::status_name(s),
                })
            }
        }
        if outcome.overflow {
            return Err(Error::Protocol(
                "the target reported a residual overflow".into(),
            ));
        }
        Ok(outcome.underflow)
    }

    /// Sends `len` bytes of `data` from `offset` as Data-Out PDUs of at most
    /// MaxXmitDataSegmentLength.
    #[allow(clippy::too_many_arguments)]
    async fn send_data_out(
        &self,
        w: &mut BufWriter<OwnedWriteHalf>,
        itt: u32,
        ttt: u32,
        lun: [u8; 8],
        data: &[u8],
        offset: usize,
        len: usize,
    ) -> Result<()> {
        let xmit = self.inner.params.max_xmit_data_segment_length as usize;
        let mut done = 0;
        let mut data_sn = 0u32;
        while done < len {
            let n = (len - done).min(xmit);
            let exp_stat_sn = self
                .inner
                .sn
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .exp_stat_sn;
            let mut bhs = Bhs::new(op::DATA_OUT, if done + n == len { FINAL } else { 0 });
            bhs.set_lun(lun);
            bhs.set_itt(itt);
            bhs.set_u32(20, ttt);
            bhs.set_u32(28, exp_stat_sn);
            bhs.set_u32(36, data_sn);
            bhs.set_u32(40, (offset + done) as u32);
            self.send(w, &bhs, &data[offset + done..offset + done + n])
                .await?;
            done += n;
            data_sn += 1;
        }
        Ok(())
    }

    /// Sends an immediate non-SCSI request and waits for its answer.
    async fn immediate(&self, mut bhs: Bhs, timeout: Duration) -> Result<Outcome> {
        let (itt, mut rx) = self.register(None)?;
        bhs.set_itt(itt);
        let r = async {
            {
                let mut w = self.inner.writer.lock().await;
                {
                    let sn = self.inner.sn.lock().unwrap_or_else(|e| e.into_inner());
                    bhs.set_u32(24, sn.cmd_sn);
                    bhs.set_u32(28, sn.exp_stat_sn);
                }
                self.send(&mut w, &bhs, &[]).await?;
                w.flush()
                    .await
                    .map_err(|e| Error::io("sending a request", e))?;
            }
            loop {
                match rx.recv().await {
                    Some(Event::Done(o)) => return Ok(o),
                    Some(Event::R2t { .. }) => {}
                    None => return Err(self.closed_error()),
                }
            }
        };
        let r = tokio::time::timeout(timeout, r).await;
        self.unregister(itt);
        r.map_err(|_| Error::Timeout {
            operation: "iSCSI request",
            seconds: timeout.as_secs(),
        })?
    }

    /// ABORT TASK through task management (best effort: the command fails anyway).
    async fn abort_task(&self, itt: u32, cmd_sn: u32, lun: u64) {
        let mut bhs = Bhs::new(op::TMF_REQ | IMMEDIATE, FINAL | 0x01);
        bhs.set_lun(encode_lun(lun));
        bhs.set_u32(20, itt);
        bhs.set_u32(32, cmd_sn);
        // A target that does not answer the command may not answer this either: wait no
        // longer than for the command itself.
        let wait = self
            .inner
            .config
            .request_timeout
            .unwrap_or(Duration::from_secs(10))
            .min(Duration::from_secs(10));
        match self.immediate(bhs, wait).await {
            Ok(o) => tracing::debug!(itt, response = o.response, "ABORT TASK answered"),
            Err(e) => tracing::debug!(itt, error = %e, "ABORT TASK failed"),
        }
    }

    /// NOP-Out ping: proves the target answers.
    pub async fn ping(&self) -> Result<()> {
        let mut bhs = Bhs::new(op::NOP_OUT | IMMEDIATE, FINAL);
        bhs.set_u32(20, RESERVED_TAG);
        self.immediate(bhs, self.inner.config.connect_timeout)
            .await
            .map(|_| ())
    }

    /// Logs out (closes the session) and ends the reader.
    pub async fn logout(&self) -> Result<()> {
        let bhs = Bhs::new(op::LOGOUT_REQ | IMMEDIATE, FINAL);
        let o = self
            .immediate(bhs, self.inner.config.connect_timeout)
            .await?;
        self.reader.abort();
        let mut w = self.inner.writer.lock().await;
        let _ = w.shutdown().await;
        if o.response != 0 {
            return Err(Error::Protocol(format!(
                "logout answered with response {}",
                o.response
            )));
        }
        Ok(())
    }
}

async fn send_pdu(
    w: &mut BufWriter<OwnedWriteHalf>,
    bhs: &Bhs,
    data: &[u8],
    digests: Digests,
) -> Result<()> {
    let mut bhs = *bhs;
    bhs.0[4] = 0;
    bhs.set_data_len(data.len());
    let io = |e| Error::io("sending a PDU", e);
    w.write_all(&bhs.0).await.map_err(io)?;
    if digests.header {
        w.write_all(&pdu::digest(&[&bhs.0])).await.map_err(io)?;
    }
    if !data.is_empty() {
        w.write_all(data).await.map_err(io)?;
        let p = &[0u8; 3][..pdu::pad(data.len())];
        w.write_all(p).await.map_err(io)?;
        if digests.data {
            w.write_all(&pdu::digest(&[data, p])).await.map_err(io)?;
        }
    }
    Ok(())
}

async fn reader_task(inner: Arc<Inner>, mut rd: BufReader<OwnedReadHalf>) {
    let reason = match read_loop(&inner, &mut rd).await {
        Ok(()) => "the session ended".to_string(),
        Err(e) => e.to_string(),
    };
    tracing::debug!(%reason, "iSCSI reader stops");
    let mut p = inner.pending.lock().unwrap_or_else(|e| e.into_inner());
    p.closed = Some(reason);
    // Dropping the senders wakes every waiting command.
    for t in p.tasks.values_mut() {
        let (tx, _) = mpsc::unbounded_channel();
        t.tx = tx;
    }
    drop(p);
    inner.window.notify_waiters();
}

fn update_window(inner: &Inner, bhs: &Bhs, advances_stat_sn: bool) {
    let mut sn = inner.sn.lock().unwrap_or_else(|e| e.into_inner());
    let (exp, max) = (bhs.u32_at(28), bhs.u32_at(32));
    // MaxCmdSN may only move forward, and must not fall more than one below ExpCmdSN.
    if sn_le(exp.wrapping_sub(1), max) {
        if sn_lt(sn.exp_cmd_sn, exp) {
            sn.exp_cmd_sn = exp;
        }
        if sn_lt(sn.max_cmd_sn, max) {
            sn.max_cmd_sn = max;
            inner.window.notify_waiters();
        }
    }
    if advances_stat_sn {
        let next = bhs.u32_at(24).wrapping_add(1);
        if sn_lt(sn.exp_stat_sn, next) {
            sn.exp_stat_sn = next;
        }
    }
}

fn complete(inner: &Inner, itt: u32, outcome: Outcome) {
    let p = inner.pending.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(t) = p.tasks.get(&itt) {
        let _ = t.tx.send(Event::Done(outcome));
    }
}

async fn read_exact(rd: &mut BufReader<OwnedReadHalf>, buf: &mut [u8]) -> Result<()> {
    rd.read_exact(buf)
        .await
        .map(|_| ())
        .map_err(|e| Error::io("reading from the target", e))
}

async fn read_loop(inner: &Arc<Inner>, rd: &mut BufReader<OwnedReadHalf>) -> Result<()> {
    let digests = inner.digests;
    let max = inner.params.max_recv_data_segment_length as usize;
    let mut scratch = Vec::new();
    loop {
        let mut bhs = Bhs::default();
        read_exact(rd, &mut bhs.0).await?;
        pdu::check_header(&bhs, max)?;
        let ahs = bhs.ahs_len();
        if ahs > 0 || digests.header {
            let mut extra = vec![0u8; ahs + if digests.header { 4 } else { 0 }];
            read_exact(rd, &mut extra).await?;
            if digests.header {
                let mut covered = bhs.0.to_vec();
                covered.extend_from_slice(&extra[..ahs]);
                if pdu::digest(&[&covered]) != extra[ahs..] {
                    return Err(Error::Protocol("header digest mismatch".into()));
                }
            }
        }
        let dl = bhs.data_len();
        let tail = pdu::pad(dl) + if digests.data && dl > 0 { 4 } else { 0 };
        let itt = bhs.itt();
        if bhs.opcode() == op::DATA_IN {
            update_window(inner, &bhs, bhs.flags() & 0x01 != 0);
            let offset = bhs.u32_at(40) as usize;
            let buf = {
                let mut p = inner.pending.lock().unwrap_or_else(|e| e.into_inner());
                p.tasks.get_mut(&itt).and_then(|t| t.buf.take())
            };
            let mut buf = match buf {
                Some(b) => b,
                None if dl == 0 => Box::new(Vec::<u8>::new()) as Box<dyn DataBuf>,
                None => {
                    // A task we gave up on (aborted): drain its data.
                    scratch.resize(dl + tail, 0);
                    read_exact(rd, &mut scratch).await?;
                    continue;
                }
            };
            let bytes = buf.bytes_mut();
            if offset.checked_add(dl).is_none_or(|e| e > bytes.len()) {
                return Err(Error::Protocol(format!(
                    "Data-In of {dl} bytes at offset {offset} overruns the {}-byte buffer",
                    bytes.len()
                )));
            }
            let dst = &mut bytes[offset..offset + dl];
            read_exact(rd, dst).await?;
            let mut t = [0u8; 7];
            read_exact(rd, &mut t[..tail]).await?;
            if digests.data && dl > 0 {
                let p = pdu::pad(dl);
                if pdu::digest(&[dst, &t[..p]]) != t[p..p + 4] {
                    return Err(Error::Protocol("data digest mismatch".into()));
                }
            }
            {
                let mut p = inner.pending.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(task) = p.tasks.get_mut(&itt) {
                    task.buf = Some(buf);
                }
            }
            if bhs.flags() & 0x01 != 0 {
                complete(
                    inner,
                    itt,
                    Outcome {
                        status: bhs.u8_at(3),
                        underflow: if bhs.flags() & 0x02 != 0 {
                            bhs.u32_at(44)
                        } else {
                            0
                        },
                        overflow: bhs.flags() & 0x04 != 0,
                        ..Outcome::default()
                    },
                );
            }
            continue;
        }
        scratch.resize(dl + tail, 0);
        read_exact(rd, &mut scratch).await?;
        if digests.data && dl > 0 {
            let p = pdu::pad(dl);
            if pdu::digest(&[&scratch[..dl + p]]) != scratch[dl + p..dl + p + 4] {
                return Err(Error::Protocol("data digest mismatch".into()));
            }
        }
        let data = &scratch[..dl];
        match bhs.opcode() {
            op::SCSI_RSP => {
                update_window(inner, &bhs, true);
                let sense = if data.len() >= 2 {
                    let n = usize::from(u16::from_be_bytes([data[0], data[1]])).min(data.len() - 2);
                    data[2..2 + n].to_vec()
                } else {
                    Vec::new()
                };
                complete(
                    inner,
                    itt,
                    Outcome {
                        response: bhs.u8_at(2),
                        status: bhs.u8_at(3),
                        sense,
                        underflow: if bhs.flags() & 0x02 != 0 {
                            bhs.u32_at(44)
                        } else {
                            0
                        },
                        overflow: bhs.flags() & 0x04 != 0,
                        rejected: None,
                    },
                );
            }
            op::R2T => {
                update_window(inner, &bhs, false);
                let p = inner.pending.lock().unwrap_or_else(|e| e.into_inner());
                match p.tasks.get(&itt) {
                    Some(t) => {
                        let _ = t.tx.send(Event::R2t {
                            ttt: bhs.u32_at(20),
                            offset: bhs.u32_at(40),
                            len: bhs.u32_at(44),
                        });
                    }
                    None => tracing::debug!(itt, "R2T for an unknown task"),
                }
            }
            op::NOP_IN => {
                let ttt = bhs.u32_at(20);
                update_window(inner, &bhs, itt != RESERVED_TAG);
                if itt != RESERVED_TAG {
                    complete(inner, itt, Outcome::default());
                } else if ttt != RESERVED_TAG {
                    // The target pings us: answer from another task so the reader never
                    // waits for the writer.
                    let inner = Arc::clone(inner);
                    let lun = bhs.lun();
                    tokio::spawn(async move {
                        let mut out = Bhs::new(op::NOP_OUT | IMMEDIATE, FINAL);
                        out.set_lun(lun);
                        out.set_itt(RESERVED_TAG);
                        out.set_u32(20, ttt);
                        {
                            let sn = inner.sn.lock().unwrap_or_else(|e| e.into_inner());
                            out.set_u32(24, sn.cmd_sn);
                            out.set_u32(28, sn.exp_stat_sn);
                        }
                        let mut w = inner.writer.lock().await;
                        if send_pdu(&mut w, &out, &[], inner.digests).await.is_ok() {
                            let _ = w.flush().await;
                        }
                    });
                }
            }
            op::TMF_RSP | op::LOGOUT_RSP => {
                update_window(inner, &bhs, true);
                complete(
                    inner,
                    itt,
                    Outcome {
                        response: bhs.u8_at(2),
                        ..Outcome::default()
                    },
                );
            }
            op::REJECT => {
                update_window(inner, &bhs, true);
                let reason = bhs.u8_at(2);
                if data.len() >= BHS_LEN {
                    let rejected = u32::from_be_bytes([data[16], data[17], data[18], data[19]]);
                    complete(
                        inner,
                        rejected,
                        Outcome {
                            rejected: Some(reason),
                            ..Outcome::default()
                        },
                    );
                } else {
                    return Err(Error::Rejected(reason));
                }
            }
            op::ASYNC => {
                update_window(inner, &bhs, true);
                let event = bhs.u8_at(36);
                tracing::debug!(event, "asynchronous message");
                if matches!(event, 1..=3) {
                    return Err(Error::Disconnected(format!(
                        "the target asked to end the session (asynchronous event {event})"
                    )));
                }
            }
            op::TEXT_RSP => update_window(inner, &bhs, true),
            other => {
                return Err(Error::Protocol(format!(
                    "unexpected opcode 0x{other:02x} from the target"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_numbers_wrap() {
        assert!(sn_lt(1, 2));
        assert!(sn_lt(u32::MAX, 0));
        assert!(!sn_lt(0, u32::MAX));
        assert!(sn_le(5, 5));
    }

    /// A target that completes a login (answering operational negotiation with `keys`),
    /// then stays silent.
    async fn silent_after_login(listener: tokio::net::TcpListener, keys: &[u8]) -> TcpStream {
        let (mut s, _) = listener.accept().await.unwrap();
        for (flags, text) in [(0x81u8, &b"AuthMethod=None\0"[..]), (0x87, keys)] {
            let mut req = [0u8; BHS_LEN];
            s.read_exact(&mut req).await.unwrap();
            let len = Bhs(req).data_len();
            let mut data = vec![0u8; len + pdu::pad(len)];
            s.read_exact(&mut data).await.unwrap();
            let mut bhs = Bhs::new(op::LOGIN_RSP, flags);
            bhs.set_u32(32, 8);
            let p = pdu::Pdu::new(bhs, text.to_vec());
            s.write_all(&p.encode(Digests::default())).await.unwrap();
        }
        s
    }

    #[tokio::test]
    async fn send_targets_of_a_silent_target_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let target = tokio::spawn(silent_after_login(
            listener,
            b"HeaderDigest=None\0DataDigest=None\0MaxRecvDataSegmentLength=8192\0",
        ));
        let config = Config {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Some(Duration::from_secs(1)),
            ..Config::default()
        };
        let started = std::time::Instant::now();
        let err = discover(&address, &config).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::Timeout {
                    operation: "SendTargets",
                    ..
                }
            ),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(4));
        drop(target.await.unwrap());
    }

    #[tokio::test]
    async fn burst_limits_below_the_minimum_do_not_panic() {
        // clamp(512, max) panicked when the caller configured a burst length below 512.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let target = tokio::spawn(silent_after_login(
            listener,
            b"HeaderDigest=None\0DataDigest=None\0MaxRecvDataSegmentLength=8192\0\
              MaxBurstLength=262144\0FirstBurstLength=65536\0",
        ));
        let config = Config {
            max_burst_length: 100,
            first_burst_length: 0,
            connect_timeout: Duration::from_secs(5),
            ..Config::default()
        };
        let session = Session::connect(&address, "iqn.test:t", &config)
            .await
            .unwrap();
        assert_eq!(session.params().max_burst_length, 512);
        assert_eq!(session.params().first_burst_length, 512);
        drop(session);
        drop(target.await.unwrap());
    }

    #[test]
    fn lun_encoding() {
        assert_eq!(encode_lun(1), [0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(encode_lun(300), [0x41, 44, 0, 0, 0, 0, 0, 0]);
    }
}
