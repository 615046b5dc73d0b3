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
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::JoinHandle;

use crate::bhs::{
    task_attr, tmf, DataOut, LogoutRequest, NopOut, ScsiCommand, TaskManagementRequest,
    COMMAND_COMPLETED, LOGOUT_CLOSE_SESSION, LOGOUT_SUCCESSFUL,
};
use crate::config::{Config, Params};
use crate::error::{Error, Result};
use crate::login::{self, DiscoveredTarget, Established};
use crate::pdu::{self, Bhs, Digests, RESERVED_TAG};
use crate::reader::reader_task;
use crate::scsi::{self, Sense};

/// The first ITT of a session's tasks; the ones below are left to login and discovery.
const FIRST_ITT: u32 = 0x100;
/// Buffer size of each direction of the connection.
const SOCKET_BUFFER: usize = 64 * 1024;
/// The longest an ABORT TASK waits for its answer.
const MAX_ABORT_WAIT: Duration = Duration::from_secs(10);
/// LUNs below this use SAM peripheral device addressing (one byte); the others use flat
/// space addressing: method 01b in the top bits and 14 bits of LUN.
const PERIPHERAL_LUNS: u64 = 256;
const FLAT_SPACE_ADDRESSING: u8 = 0x40;
const FLAT_SPACE_HIGH_BITS: u8 = 0x3f;
/// Half the serial number space (RFC 1982): b is after a when less than this ahead.
const SERIAL_HALF: u32 = 1 << 31;

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
pub(crate) fn sn_lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < SERIAL_HALF
}

pub(crate) fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

/// Encodes a LUN (SAM peripheral or flat addressing).
pub fn encode_lun(lun: u64) -> [u8; 8] {
    let mut l = [0u8; 8];
    if lun < PERIPHERAL_LUNS {
        l[1] = lun as u8;
    } else {
        l[0] = FLAT_SPACE_ADDRESSING | ((lun >> 8) as u8 & FLAT_SPACE_HIGH_BITS);
        l[1] = lun as u8;
    }
    l
}

#[derive(Debug)]
pub(crate) struct Sn {
    pub cmd_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub exp_stat_sn: u32,
    next_itt: u32,
}

/// What the reader tells a waiting task.
pub(crate) enum Event {
    R2t { ttt: u32, offset: u32, len: u32 },
    Done(Outcome),
}

/// How a task ended, as the target reported it.
#[derive(Default)]
pub(crate) struct Outcome {
    pub response: u8,
    pub status: u8,
    pub sense: Vec<u8>,
    pub underflow: u32,
    pub overflow: bool,
    pub rejected: Option<u8>,
}

pub(crate) struct Task {
    pub tx: mpsc::UnboundedSender<Event>,
    pub buf: Option<Box<dyn DataBuf>>,
}

#[derive(Default)]
pub(crate) struct Pending {
    pub tasks: HashMap<u32, Task>,
    pub closed: Option<String>,
}

/// The session state the command futures and the reader share.
pub(crate) struct Inner {
    pub writer: tokio::sync::Mutex<BufWriter<OwnedWriteHalf>>,
    gate: tokio::sync::Mutex<()>,
    pub sn: Mutex<Sn>,
    pub window: Notify,
    pub pending: Mutex<Pending>,
    slots: Semaphore,
    pub params: Params,
    pub digests: Digests,
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
            writer: tokio::sync::Mutex::new(BufWriter::with_capacity(SOCKET_BUFFER, wr)),
            gate: tokio::sync::Mutex::new(()),
            sn: Mutex::new(Sn {
                cmd_sn: est.cmd_sn,
                exp_cmd_sn: est.cmd_sn,
                max_cmd_sn: est.max_cmd_sn,
                exp_stat_sn: est.exp_stat_sn,
                next_itt: FIRST_ITT,
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
            BufReader::with_capacity(SOCKET_BUFFER, rd),
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
            let mut sn = self.inner.sn.lock();
            let itt = sn.next_itt;
            sn.next_itt = sn.next_itt.wrapping_add(1);
            if sn.next_itt == RESERVED_TAG {
                sn.next_itt = FIRST_ITT;
            }
            itt
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let mut p = self.inner.pending.lock();
        if let Some(reason) = &p.closed {
            return Err(Error::Disconnected(reason.clone()));
        }
        p.tasks.insert(itt, Task { tx, buf });
        Ok((itt, rx))
    }

    fn attach(&self, itt: u32, buf: Box<dyn DataBuf>) {
        let mut p = self.inner.pending.lock();
        if let Some(t) = p.tasks.get_mut(&itt) {
            t.buf = Some(buf);
        }
    }

    fn unregister(&self, itt: u32) -> Option<Box<dyn DataBuf>> {
        let mut p = self.inner.pending.lock();
        p.tasks.remove(&itt).and_then(|t| t.buf)
    }

    fn closed_error(&self) -> Error {
        let p = self.inner.pending.lock();
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
                let sn = self.inner.sn.lock();
                if sn_le(sn.cmd_sn, sn.max_cmd_sn) {
                    return Ok(gate);
                }
            }
            if self.inner.pending.lock().closed.is_some() {
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
        let lun_bytes = encode_lun(lun);
        let write_len = write.map_or(0, <[u8]>::len);
        let expected = read_len.max(write_len);
        let expected = u32::try_from(expected).map_err(|_| {
            Error::InvalidRequest(format!("transfer of {expected} bytes is too large"))
        })?;
        let command = Command {
            itt,
            lun: lun_bytes,
            cdb,
            read: read_len > 0,
            expected,
            write,
        };
        let cmd_sn = self.send_command(&command).await?;
        let wait = self.await_outcome(&command, rx);
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
        check_outcome(outcome)
    }

    /// How many bytes of `write` go as immediate data in the command PDU, and how many
    /// as unsolicited data in all (immediate included), within FirstBurstLength.
    fn unsolicited(&self, write: Option<&[u8]>) -> (usize, usize) {
        let p = self.inner.params;
        let xmit = p.max_xmit_data_segment_length as usize;
        match write {
            Some(d) => {
                let first = (p.first_burst_length as usize).min(d.len());
                let imm = if p.immediate_data { first.min(xmit) } else { 0 };
                let unsol = if p.initial_r2t { imm } else { first };
                (imm, unsol)
            }
            None => (0, 0),
        }
    }

    /// Sends the command PDU and its unsolicited data in CmdSN order; returns its CmdSN.
    async fn send_command(&self, c: &Command<'_>) -> Result<u32> {
        let (immediate, unsolicited) = self.unsolicited(c.write);
        let _gate = self.wait_window().await?;
        let mut w = self.inner.writer.lock().await;
        let (cmd_sn, exp_stat_sn) = {
            let mut sn = self.inner.sn.lock();
            let cmd_sn = sn.cmd_sn;
            sn.cmd_sn = sn.cmd_sn.wrapping_add(1);
            (cmd_sn, sn.exp_stat_sn)
        };
        let bhs = ScsiCommand {
            final_: unsolicited <= immediate,
            read: c.read,
            write: c.write.is_some(),
            task_attr: task_attr::SIMPLE,
            lun: c.lun,
            itt: c.itt,
            expected_data_transfer_length: c.expected,
            cmd_sn,
            exp_stat_sn,
            cdb: *c.cdb,
            ..ScsiCommand::default()
        }
        .to_bhs();
        let data = c.write.map_or(&[][..], |d| &d[..immediate]);
        self.send(&mut w, &bhs, data).await?;
        if let Some(d) = c.write {
            let burst = Burst {
                itt: c.itt,
                ttt: RESERVED_TAG,
                lun: c.lun,
                offset: immediate,
                len: unsolicited - immediate,
            };
            self.send_data_out(&mut w, &burst, d).await?;
        }
        w.flush()
            .await
            .map_err(|e| Error::io("sending a command", e))?;
        Ok(cmd_sn)
    }

    /// Answers the command's R2Ts until its status arrives.
    async fn await_outcome(
        &self,
        c: &Command<'_>,
        rx: &mut mpsc::UnboundedReceiver<Event>,
    ) -> Result<Outcome> {
        loop {
            match rx.recv().await {
                None => return Err(self.closed_error()),
                Some(Event::R2t { ttt, offset, len }) => {
                    let d = c.write.ok_or_else(|| {
                        Error::Protocol("R2T for a command without data-out".into())
                    })?;
                    let (o, l) = (offset as usize, len as usize);
                    if o.checked_add(l).is_none_or(|e| e > d.len()) || l == 0 {
                        return Err(Error::Protocol(format!(
                            "R2T for {l} bytes at {o} outside the {} bytes of the command",
                            d.len()
                        )));
                    }
                    let burst = Burst {
                        itt: c.itt,
                        ttt,
                        lun: c.lun,
                        offset: o,
                        len: l,
                    };
                    let mut w = self.inner.writer.lock().await;
                    self.send_data_out(&mut w, &burst, d).await?;
                    w.flush().await.map_err(|e| Error::io("sending data", e))?;
                }
                Some(Event::Done(o)) => return Ok(o),
            }
        }
    }

    /// Sends the `burst.len` bytes of `data` from `burst.offset` as Data-Out PDUs of at
    /// most MaxXmitDataSegmentLength.
    async fn send_data_out(
        &self,
        w: &mut BufWriter<OwnedWriteHalf>,
        burst: &Burst,
        data: &[u8],
    ) -> Result<()> {
        let xmit = self.inner.params.max_xmit_data_segment_length as usize;
        let (offset, len) = (burst.offset, burst.len);
        let mut done = 0;
        let mut data_sn = 0u32;
        while done < len {
            let n = (len - done).min(xmit);
            let exp_stat_sn = self.inner.sn.lock().exp_stat_sn;
            let bhs = DataOut {
                final_: done + n == len,
                lun: burst.lun,
                itt: burst.itt,
                ttt: burst.ttt,
                exp_stat_sn,
                data_sn,
                buffer_offset: (offset + done) as u32,
            }
            .to_bhs();
            self.send(w, &bhs, &data[offset + done..offset + done + n])
                .await?;
            done += n;
            data_sn += 1;
        }
        Ok(())
    }

    /// Sends an immediate non-SCSI request, built by `request` from the task tag and
    /// sequence numbers it is sent with, and waits for its answer.
    async fn immediate(
        &self,
        request: impl FnOnce(RequestTags) -> Bhs,
        timeout: Duration,
    ) -> Result<Outcome> {
        let (itt, mut rx) = self.register(None)?;
        let r = async {
            {
                let mut w = self.inner.writer.lock().await;
                let tags = {
                    let sn = self.inner.sn.lock();
                    RequestTags {
                        itt,
                        cmd_sn: sn.cmd_sn,
                        exp_stat_sn: sn.exp_stat_sn,
                    }
                };
                self.send(&mut w, &request(tags), &[]).await?;
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
        let request = |t: RequestTags| {
            TaskManagementRequest {
                immediate: true,
                final_: true,
                function: tmf::ABORT_TASK,
                lun: encode_lun(lun),
                itt: t.itt,
                referenced_task_tag: itt,
                cmd_sn: t.cmd_sn,
                exp_stat_sn: t.exp_stat_sn,
                ref_cmd_sn: cmd_sn,
                ..TaskManagementRequest::default()
            }
            .to_bhs()
        };
        // A target that does not answer the command may not answer this either: wait no
        // longer than for the command itself.
        let wait = self
            .inner
            .config
            .request_timeout
            .unwrap_or(MAX_ABORT_WAIT)
            .min(MAX_ABORT_WAIT);
        match self.immediate(request, wait).await {
            Ok(o) => tracing::debug!(itt, response = o.response, "ABORT TASK answered"),
            Err(e) => tracing::debug!(itt, error = %e, "ABORT TASK failed"),
        }
    }

    /// NOP-Out ping: proves the target answers.
    pub async fn ping(&self) -> Result<()> {
        let request = |t: RequestTags| {
            NopOut {
                immediate: true,
                final_: true,
                itt: t.itt,
                ttt: RESERVED_TAG,
                cmd_sn: t.cmd_sn,
                exp_stat_sn: t.exp_stat_sn,
                ..NopOut::default()
            }
            .to_bhs()
        };
        self.immediate(request, self.inner.config.connect_timeout)
            .await
            .map(|_| ())
    }

    /// Logs out (closes the session) and ends the reader.
    pub async fn logout(&self) -> Result<()> {
        let request = |t: RequestTags| {
            LogoutRequest {
                immediate: true,
                final_: true,
                reason_code: LOGOUT_CLOSE_SESSION,
                itt: t.itt,
                cmd_sn: t.cmd_sn,
                exp_stat_sn: t.exp_stat_sn,
                ..LogoutRequest::default()
            }
            .to_bhs()
        };
        let o = self
            .immediate(request, self.inner.config.connect_timeout)
            .await?;
        self.reader.abort();
        let mut w = self.inner.writer.lock().await;
        let _ = w.shutdown().await;
        if o.response != LOGOUT_SUCCESSFUL {
            return Err(Error::Protocol(format!(
                "logout answered with response {}",
                o.response
            )));
        }
        Ok(())
    }
}

/// A SCSI command being sent: what [`Session::run`] hands its steps.
struct Command<'a> {
    itt: u32,
    lun: [u8; 8],
    cdb: &'a [u8; 16],
    read: bool,
    /// Expected Data Transfer Length.
    expected: u32,
    write: Option<&'a [u8]>,
}

/// One sequence of Data-Out PDUs: unsolicited data, or the answer to one R2T.
struct Burst {
    itt: u32,
    ttt: u32,
    lun: [u8; 8],
    offset: usize,
    len: usize,
}

/// The task tag and sequence numbers an immediate request is sent with.
#[derive(Clone, Copy)]
struct RequestTags {
    itt: u32,
    cmd_sn: u32,
    exp_stat_sn: u32,
}

/// A command's result from its outcome: the underflow residual, or the error its
/// response, status or residual flags stand for.
fn check_outcome(outcome: Outcome) -> Result<u32> {
    if let Some(reason) = outcome.rejected {
        return Err(Error::Rejected(reason));
    }
    if outcome.response != COMMAND_COMPLETED {
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

pub(crate) async fn send_pdu(
    w: &mut BufWriter<OwnedWriteHalf>,
    bhs: &Bhs,
    data: &[u8],
    digests: Digests,
) -> Result<()> {
    let mut bhs = *bhs;
    bhs.clear_ahs_len();
    bhs.set_data_len(data.len());
    let io = |e| Error::io("sending a PDU", e);
    w.write_all(&bhs.0).await.map_err(io)?;
    if digests.header {
        w.write_all(&pdu::digest(&[&bhs.0])).await.map_err(io)?;
    }
    if !data.is_empty() {
        w.write_all(data).await.map_err(io)?;
        let p = pdu::padding(data.len());
        w.write_all(p).await.map_err(io)?;
        if digests.data {
            w.write_all(&pdu::digest(&[data, p])).await.map_err(io)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bhs::{stage, LoginResponse};
    use crate::pdu::BHS_LEN;
    use tokio::io::AsyncReadExt;

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
        let stages = [
            (
                stage::SECURITY,
                stage::OPERATIONAL,
                &b"AuthMethod=None\0"[..],
            ),
            (stage::OPERATIONAL, stage::FULL_FEATURE, keys),
        ];
        for (current_stage, next_stage, text) in stages {
            let mut req = [0u8; BHS_LEN];
            s.read_exact(&mut req).await.unwrap();
            let len = Bhs(req).data_len();
            let mut data = vec![0u8; len + pdu::pad(len)];
            s.read_exact(&mut data).await.unwrap();
            let bhs = LoginResponse {
                transit: true,
                current_stage,
                next_stage,
                max_cmd_sn: 8,
                ..LoginResponse::default()
            }
            .to_bhs();
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
