//! The receive side of a session: one task reads every PDU the target sends.
//!
//! Data-In goes straight from the socket into the waiting command's buffer (no copy);
//! every other PDU's data segment is read into one reused scratch buffer, then the PDU is
//! dispatched to its handler: responses complete tasks, R2Ts go to the command that sends
//! the data, NOP-In pings are answered, and every answer moves the CmdSN window.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::mpsc;

use crate::bhs::{
    async_event, op, AsyncMessage, DataIn, LogoutResponse, NopIn, NopOut, R2t, Reject,
    ScsiResponse, TaskManagementResponse, TextResponse,
};
use crate::error::{Error, Result};
use crate::pdu::{self, Bhs, Digests, MAX_DATA_TAIL, RESERVED_TAG};
use crate::session::{send_pdu, sn_le, sn_lt, DataBuf, Event, Inner, Outcome};

/// Length of the SenseLength field before the sense data of a SCSI Response.
const SENSE_LENGTH_LEN: usize = 2;

type Reader = BufReader<OwnedReadHalf>;

/// Runs the reader until the connection fails, then fails every waiting task.
pub(crate) async fn reader_task(inner: Arc<Inner>, mut rd: Reader) {
    let reason = match read_loop(&inner, &mut rd).await {
        Ok(()) => "the session ended".to_string(),
        Err(e) => e.to_string(),
    };
    tracing::debug!(%reason, "iSCSI reader stops");
    let mut p = inner.pending.lock();
    p.closed = Some(reason);
    // Dropping the senders wakes every waiting command.
    for t in p.tasks.values_mut() {
        let (tx, _) = mpsc::unbounded_channel();
        t.tx = tx;
    }
    drop(p);
    inner.window.notify_waiters();
}

async fn read_loop(inner: &Arc<Inner>, rd: &mut Reader) -> Result<()> {
    let mut scratch = Vec::new();
    loop {
        let bhs = read_header(inner, rd, &mut scratch).await?;
        if bhs.opcode() == op::DATA_IN {
            read_data_in(inner, rd, &bhs, &mut scratch).await?;
        } else {
            let data = read_segment(inner.digests, rd, &bhs, &mut scratch).await?;
            dispatch(inner, &bhs, data)?;
        }
    }
}

async fn read_exact(rd: &mut Reader, buf: &mut [u8]) -> Result<()> {
    rd.read_exact(buf)
        .await
        .map(|_| ())
        .map_err(|e| Error::io("reading from the target", e))
}

/// Reads a header, checks it against our limits, and reads past its AHS and header digest.
async fn read_header(inner: &Inner, rd: &mut Reader, scratch: &mut Vec<u8>) -> Result<Bhs> {
    let digests = inner.digests;
    let mut bhs = Bhs::default();
    read_exact(rd, &mut bhs.0).await?;
    pdu::check_header(&bhs, inner.params.max_recv_data_segment_length as usize)?;
    let ahs = bhs.ahs_len();
    let extra = ahs + digests.header_len();
    if extra > 0 {
        scratch.resize(extra, 0);
        read_exact(rd, &mut scratch[..extra]).await?;
        if digests.header && pdu::digest(&[&bhs.0, &scratch[..ahs]]) != scratch[ahs..extra] {
            return Err(Error::Protocol("header digest mismatch".into()));
        }
    }
    Ok(bhs)
}

/// Reads the padding and data digest after a data segment (`dst`, already read) and
/// checks the digest.
async fn read_data_tail(digests: Digests, rd: &mut Reader, dst: &[u8]) -> Result<()> {
    let dl = dst.len();
    let pad = pdu::pad(dl);
    let tail = pad + digests.data_len(dl);
    let mut t = [0u8; MAX_DATA_TAIL];
    read_exact(rd, &mut t[..tail]).await?;
    if digests.data && dl > 0 && pdu::digest(&[dst, &t[..pad]]) != t[pad..tail] {
        return Err(Error::Protocol("data digest mismatch".into()));
    }
    Ok(())
}

/// Reads a data segment with its padding and digest into `scratch`; returns the data.
async fn read_segment<'s>(
    digests: Digests,
    rd: &mut Reader,
    bhs: &Bhs,
    scratch: &'s mut Vec<u8>,
) -> Result<&'s [u8]> {
    let dl = bhs.data_len();
    let padded = dl + pdu::pad(dl);
    let total = padded + digests.data_len(dl);
    scratch.resize(total, 0);
    read_exact(rd, scratch).await?;
    if digests.data && dl > 0 && pdu::digest(&[&scratch[..padded]]) != scratch[padded..total] {
        return Err(Error::Protocol("data digest mismatch".into()));
    }
    Ok(&scratch[..dl])
}

/// Data-In: its data goes straight into the command's buffer at its buffer offset; with
/// the S bit it also carries the command's status.
async fn read_data_in(
    inner: &Inner,
    rd: &mut Reader,
    bhs: &Bhs,
    scratch: &mut Vec<u8>,
) -> Result<()> {
    let d = DataIn::from_bhs(bhs);
    let stat_sn = d.status_present.then_some(d.stat_sn);
    update_window(inner, d.exp_cmd_sn, d.max_cmd_sn, stat_sn);
    let dl = bhs.data_len();
    let offset = d.buffer_offset as usize;
    let taken = inner
        .pending
        .lock()
        .tasks
        .get_mut(&d.itt)
        .and_then(|t| t.buf.take());
    let mut buf = match taken {
        Some(b) => b,
        None if dl == 0 => Box::new(Vec::<u8>::new()) as Box<dyn DataBuf>,
        None => {
            // A task we gave up on (aborted): drain its data, digest unchecked.
            let tail = pdu::pad(dl) + inner.digests.data_len(dl);
            scratch.resize(dl + tail, 0);
            return read_exact(rd, scratch).await;
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
    read_data_tail(inner.digests, rd, dst).await?;
    if let Some(task) = inner.pending.lock().tasks.get_mut(&d.itt) {
        task.buf = Some(buf);
    }
    if d.status_present {
        let outcome = Outcome {
            status: d.status,
            underflow: if d.residual_underflow {
                d.residual_count
            } else {
                0
            },
            overflow: d.residual_overflow,
            ..Outcome::default()
        };
        complete(inner, d.itt, outcome);
    }
    Ok(())
}

/// Handles a PDU other than Data-In whose data segment is `data`.
fn dispatch(inner: &Arc<Inner>, bhs: &Bhs, data: &[u8]) -> Result<()> {
    match bhs.opcode() {
        op::SCSI_RSP => on_scsi_response(inner, &ScsiResponse::from_bhs(bhs), data),
        op::R2T => on_r2t(inner, &R2t::from_bhs(bhs)),
        op::NOP_IN => on_nop_in(inner, &NopIn::from_bhs(bhs)),
        op::TMF_RSP => {
            let r = TaskManagementResponse::from_bhs(bhs);
            update_window(inner, r.exp_cmd_sn, r.max_cmd_sn, Some(r.stat_sn));
            complete_with_response(inner, r.itt, r.response);
        }
        op::LOGOUT_RSP => {
            let r = LogoutResponse::from_bhs(bhs);
            update_window(inner, r.exp_cmd_sn, r.max_cmd_sn, Some(r.stat_sn));
            complete_with_response(inner, r.itt, r.response);
        }
        op::REJECT => return on_reject(inner, &Reject::from_bhs(bhs), data),
        op::ASYNC => return on_async_message(inner, &AsyncMessage::from_bhs(bhs)),
        op::TEXT_RSP => {
            let r = TextResponse::from_bhs(bhs);
            update_window(inner, r.exp_cmd_sn, r.max_cmd_sn, Some(r.stat_sn));
        }
        other => {
            return Err(Error::Protocol(format!(
                "unexpected opcode 0x{other:02x} from the target"
            )))
        }
    }
    Ok(())
}

fn on_scsi_response(inner: &Inner, r: &ScsiResponse, data: &[u8]) {
    update_window(inner, r.exp_cmd_sn, r.max_cmd_sn, Some(r.stat_sn));
    // The data segment is SenseLength (2 bytes) then the sense data.
    let sense = match data.split_first_chunk::<SENSE_LENGTH_LEN>() {
        Some((len, rest)) => {
            let n = usize::from(u16::from_be_bytes(*len)).min(rest.len());
            rest[..n].to_vec()
        }
        None => Vec::new(),
    };
    let outcome = Outcome {
        response: r.response,
        status: r.status,
        sense,
        underflow: if r.residual_underflow {
            r.residual_count
        } else {
            0
        },
        overflow: r.residual_overflow,
        rejected: None,
    };
    complete(inner, r.itt, outcome);
}

fn on_r2t(inner: &Inner, r: &R2t) {
    update_window(inner, r.exp_cmd_sn, r.max_cmd_sn, None);
    let p = inner.pending.lock();
    match p.tasks.get(&r.itt) {
        Some(t) => {
            let _ = t.tx.send(Event::R2t {
                ttt: r.ttt,
                offset: r.buffer_offset,
                len: r.desired_data_transfer_length,
            });
        }
        None => tracing::debug!(itt = r.itt, "R2T for an unknown task"),
    }
}

/// NOP-In: the answer to our ping, or the target's own ping to answer.
fn on_nop_in(inner: &Arc<Inner>, n: &NopIn) {
    let answers_ours = n.itt != RESERVED_TAG;
    let stat_sn = answers_ours.then_some(n.stat_sn);
    update_window(inner, n.exp_cmd_sn, n.max_cmd_sn, stat_sn);
    if answers_ours {
        complete(inner, n.itt, Outcome::default());
    } else if n.ttt != RESERVED_TAG {
        // The target pings us: answer from another task so the reader never waits for
        // the writer.
        let inner = Arc::clone(inner);
        let (lun, ttt) = (n.lun, n.ttt);
        tokio::spawn(async move {
            let (cmd_sn, exp_stat_sn) = {
                let sn = inner.sn.lock();
                (sn.cmd_sn, sn.exp_stat_sn)
            };
            let out = NopOut {
                immediate: true,
                final_: true,
                lun,
                itt: RESERVED_TAG,
                ttt,
                cmd_sn,
                exp_stat_sn,
            }
            .to_bhs();
            let mut w = inner.writer.lock().await;
            if send_pdu(&mut w, &out, &[], inner.digests).await.is_ok() {
                let _ = w.flush().await;
            }
        });
    }
}

/// Reject: fails the task whose header the data segment quotes, or the session when the
/// rejected header is missing.
fn on_reject(inner: &Inner, r: &Reject, data: &[u8]) -> Result<()> {
    update_window(inner, r.exp_cmd_sn, r.max_cmd_sn, Some(r.stat_sn));
    match Bhs::from_prefix(data) {
        Some(rejected) => {
            let outcome = Outcome {
                rejected: Some(r.reason),
                ..Outcome::default()
            };
            complete(inner, rejected.itt(), outcome);
            Ok(())
        }
        None => Err(Error::Rejected(r.reason)),
    }
}

/// Asynchronous Message: the events that end the session end the reader.
fn on_async_message(inner: &Inner, m: &AsyncMessage) -> Result<()> {
    update_window(inner, m.exp_cmd_sn, m.max_cmd_sn, Some(m.stat_sn));
    let event = m.async_event;
    tracing::debug!(event, "asynchronous message");
    if matches!(
        event,
        async_event::LOGOUT_REQUESTED
            | async_event::CONNECTION_DROPPED
            | async_event::SESSION_DROPPED
    ) {
        return Err(Error::Disconnected(format!(
            "the target asked to end the session (asynchronous event {event})"
        )));
    }
    Ok(())
}

/// Takes the CmdSN window a target PDU reports, and its StatSN when it advances it.
fn update_window(inner: &Inner, exp: u32, max: u32, stat_sn: Option<u32>) {
    let mut sn = inner.sn.lock();
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
    if let Some(stat_sn) = stat_sn {
        let next = stat_sn.wrapping_add(1);
        if sn_lt(sn.exp_stat_sn, next) {
            sn.exp_stat_sn = next;
        }
    }
}

fn complete(inner: &Inner, itt: u32, outcome: Outcome) {
    let p = inner.pending.lock();
    if let Some(t) = p.tasks.get(&itt) {
        let _ = t.tx.send(Event::Done(outcome));
    }
}

fn complete_with_response(inner: &Inner, itt: u32, response: u8) {
    let outcome = Outcome {
        response,
        ..Outcome::default()
    };
    complete(inner, itt, outcome);
}
