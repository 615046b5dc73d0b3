//! Seed inputs of every fuzz target, defined once: the smoke test starts from them, and the
//! `make-seeds` binary writes them as the libFuzzer seed corpora (`corpus/TARGET/seed-NAME`).
//!
//! The NBD session seeds are valid handshakes and reply streams for the requests
//! [`crate::nbd::session`] sends (cookies 1..=7: read 0+4096, read 1M-4096+4096, block
//! status 0+1M, write, write zeroes, trim, flush); the iSCSI session seeds answer what
//! [`crate::iscsi::session`] sends (tags 0x100..=0x103: READ, WRITE, NOP-Out, logout).
//! The NFS seeds are valid replies for each decoder [`crate::nfs`] drives.

use ferry_nbd::proto::*;
use ferry_nfs::v3::proto as nfs3;
use ferry_nfs::v4::ops;
use ferry_nfs::xdr::Encoder;

use crate::{iscsi, nbd};

/// One seed input of a target; written to `corpus/TARGET/seed-NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed {
    pub name: String,
    pub bytes: Vec<u8>,
}

fn seed(name: impl Into<String>, bytes: Vec<u8>) -> Seed {
    Seed {
        name: name.into(),
        bytes,
    }
}

/// Concatenates byte fields (a big-endian record is written as a list of `to_be_bytes`).
fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

// ---------------------------------------------------------------------------------------
// HTTP

/// One seed per header parser (the first byte picks it).
pub fn http_headers() -> Vec<Seed> {
    vec![
        seed("content-range", cat(&[&[0], b"bytes 0-1048575/4294967296"])),
        seed("content-range-star", cat(&[&[0], b"bytes 100-199/*"])),
        seed("unsatisfied", cat(&[&[1], b"bytes */4096"])),
        seed("content-length", cat(&[&[2], b"8388608, 8388608"])),
        seed("etag", cat(&[&[3], b"\"5f1c-66a0b2c3d4e5\""])),
    ]
}

/// Two delta replies (VARIABLE_LENGTH, then a resumed stream), and a FIXED_LENGTH one.
pub fn snapshot_metadata_replies() -> Vec<Seed> {
    use ferry_snapshot_metadata::proto::{BlockMetadata, GetMetadataDeltaResponse};
    use prost::Message;
    let reply = |style: i32, blocks: &[(i64, i64)]| {
        let body = GetMetadataDeltaResponse {
            block_metadata_type: style,
            volume_capacity_bytes: 1 << 30,
            block_metadata: blocks
                .iter()
                .map(|&(byte_offset, size_bytes)| BlockMetadata {
                    byte_offset,
                    size_bytes,
                })
                .collect(),
        }
        .encode_to_vec();
        cat(&[&(body.len() as u16).to_le_bytes(), &body])
    };
    vec![
        seed(
            "variable-resumed",
            cat(&[
                &reply(2, &[(0, 4096), (65536, 8192)]),
                &[0, 0],
                &reply(2, &[(70000, 100), (1 << 20, 4096)]),
            ]),
        ),
        seed(
            "fixed",
            reply(1, &[(0, 65536), (131072, 65536), (196608, 65536)]),
        ),
    ]
}

// ---------------------------------------------------------------------------------------
// NBD

/// The four reply streams: structured or extended headers (`ext`), and for structured
/// replies a variant whose last two replies are simple ones (`variant` false).
fn nbd_reply_bodies() -> Vec<(String, bool, Vec<u8>)> {
    let mut out = Vec::new();
    for ext in [false, true] {
        for variant in [false, true] {
            let name = format!("{}{}", u8::from(ext), u8::from(variant));
            out.push((name, ext, nbd_replies_body(ext, variant)));
        }
    }
    out
}

fn nbd_request_offset(cookie: u64) -> u64 {
    if cookie == 2 {
        (1 << 20) - 4096
    } else {
        0
    }
}

fn nbd_chunk(ext: bool, cookie: u64, flags: u16, kind: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = if ext {
        cat(&[
            &EXTENDED_REPLY_MAGIC.to_be_bytes(),
            &flags.to_be_bytes(),
            &kind.to_be_bytes(),
            &cookie.to_be_bytes(),
            &nbd_request_offset(cookie).to_be_bytes(),
            &(payload.len() as u64).to_be_bytes(),
        ])
    } else {
        cat(&[
            &STRUCTURED_REPLY_MAGIC.to_be_bytes(),
            &flags.to_be_bytes(),
            &kind.to_be_bytes(),
            &cookie.to_be_bytes(),
            &(payload.len() as u32).to_be_bytes(),
        ])
    };
    out.extend_from_slice(payload);
    out
}

fn nbd_simple_reply(cookie: u64) -> Vec<u8> {
    cat(&[
        &SIMPLE_REPLY_MAGIC.to_be_bytes(),
        &0u32.to_be_bytes(),
        &cookie.to_be_bytes(),
    ])
}

/// Replies to cookies 1..=7: data in two chunks out of order, a hole then NONE, block
/// status for context 1, an error with an offset, a plain error, two successes.
fn nbd_replies_body(ext: bool, variant: bool) -> Vec<u8> {
    let done = REPLY_FLAG_DONE;
    let mut out = Vec::new();
    let data = |offset: u64, fill: u8| cat(&[&offset.to_be_bytes(), &[fill; 2048]]);
    out.extend(nbd_chunk(
        ext,
        1,
        0,
        REPLY_TYPE_OFFSET_DATA,
        &data(2048, 0xab),
    ));
    out.extend(nbd_chunk(
        ext,
        1,
        done,
        REPLY_TYPE_OFFSET_DATA,
        &data(0, 0xcd),
    ));
    let hole = cat(&[&nbd_request_offset(2).to_be_bytes(), &4096u32.to_be_bytes()]);
    out.extend(nbd_chunk(ext, 2, 0, REPLY_TYPE_OFFSET_HOLE, &hole));
    out.extend(nbd_chunk(ext, 2, done, REPLY_TYPE_NONE, &[]));
    let status = if ext {
        let fields: [u64; 4] = [65536, 3, 1 << 20, 0];
        let mut s = cat(&[&1u32.to_be_bytes(), &2u32.to_be_bytes()]);
        fields.iter().for_each(|f| s.extend(f.to_be_bytes()));
        nbd_chunk(ext, 3, done, REPLY_TYPE_BLOCK_STATUS_EXT, &s)
    } else {
        let mut s = Vec::new();
        [1u32, 65536, 3, 1 << 20, 0]
            .iter()
            .for_each(|f| s.extend(f.to_be_bytes()));
        nbd_chunk(ext, 3, done, REPLY_TYPE_BLOCK_STATUS, &s)
    };
    out.extend(status);
    let msg = b"injected";
    let error = |errno: u32| cat(&[&errno.to_be_bytes(), &(msg.len() as u16).to_be_bytes(), msg]);
    let with_offset = cat(&[&error(5), &512u64.to_be_bytes()]);
    out.extend(nbd_chunk(
        ext,
        4,
        done,
        REPLY_TYPE_ERROR_OFFSET,
        &with_offset,
    ));
    out.extend(nbd_chunk(ext, 5, done, REPLY_TYPE_ERROR, &error(28)));
    if ext || variant {
        out.extend(nbd_chunk(ext, 6, done, REPLY_TYPE_NONE, &[]));
        out.extend(nbd_chunk(ext, 7, done, REPLY_TYPE_NONE, &[]));
    } else {
        out.extend(nbd_simple_reply(6));
        out.extend(nbd_simple_reply(7));
    }
    out
}

/// `nbd_parsers`: the first byte picks the parser (see [`crate::nbd_parsers`]).
pub fn nbd_parsers() -> Vec<Seed> {
    let mut status = vec![8];
    [1u32, 65536, 3, 1 << 20, 0]
        .iter()
        .for_each(|f| status.extend(f.to_be_bytes()));
    let mut status_ext = cat(&[&[9], &1u32.to_be_bytes(), &1u32.to_be_bytes()]);
    status_ext.extend((1u64 << 20).to_be_bytes());
    status_ext.extend(3u64.to_be_bytes());
    let flags = FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES;
    let info = cat(&[
        &[2],
        &INFO_EXPORT.to_be_bytes(),
        &(1u64 << 20).to_be_bytes(),
        &0xffffu16.to_be_bytes(),
    ]);
    let simple = cat(&[&[5], &nbd_simple_reply(7)]);
    let error = cat(&[
        &[6],
        &1u16.to_be_bytes(),
        &5u32.to_be_bytes(),
        &2u16.to_be_bytes(),
        b"io",
    ]);
    let hole = cat(&[&[7], &4096u64.to_be_bytes(), &512u32.to_be_bytes()]);
    vec![
        seed("info", info),
        seed("status", status),
        seed(
            "greeting",
            cat(&[
                &[0],
                &NBDMAGIC.to_be_bytes(),
                &IHAVEOPT.to_be_bytes(),
                &flags.to_be_bytes(),
            ]),
        ),
        seed(
            "option-reply",
            cat(&[
                &[1],
                &REPLY_MAGIC.to_be_bytes(),
                &OPT_GO.to_be_bytes(),
                &REP_ACK.to_be_bytes(),
                &0u32.to_be_bytes(),
            ]),
        ),
        seed(
            "server",
            cat(&[&[3], &4u32.to_be_bytes(), b"disk", b"a disk"]),
        ),
        seed(
            "meta-context",
            cat(&[
                &[4],
                &1u32.to_be_bytes(),
                CONTEXT_BASE_ALLOCATION.as_bytes(),
            ]),
        ),
        seed("simple-reply", simple),
        seed("error", error),
        seed("hole", hole),
        seed("status-ext", status_ext),
    ]
}

/// `nbd_handshake`: a valid handshake, then a reply stream.
pub fn nbd_handshake() -> Vec<Seed> {
    let seeds = nbd_reply_bodies().into_iter();
    seeds
        .map(|(name, ext, body)| seed(name, cat(&[&nbd::handshake(ext), &body])))
        .collect()
}

/// `nbd_replies`: the header-mode byte, then a reply stream.
pub fn nbd_replies() -> Vec<Seed> {
    let seeds = nbd_reply_bodies().into_iter();
    seeds
        .map(|(name, ext, body)| seed(name, cat(&[&[u8::from(ext)], &body])))
        .collect()
}

fn nbd_request(command: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    cat(&[
        &REQUEST_MAGIC.to_be_bytes(),
        &flags.to_be_bytes(),
        &command.to_be_bytes(),
        &cookie.to_be_bytes(),
        &offset.to_be_bytes(),
        &len.to_be_bytes(),
    ])
}

/// Requests after a handshake: reads across data, holes and zeroes (one with DF), block
/// status (whole and REQ_ONE), a write with its payload, trim, write zeroes, flush, cache,
/// an unknown command, DISC.
fn nbd_server_requests() -> Vec<u8> {
    let mut out = Vec::new();
    out.extend(nbd_request(CMD_READ, 0, 1, 0, 4096));
    out.extend(nbd_request(CMD_READ, 0, 2, 60 * 1024, 200 * 1024));
    out.extend(nbd_request(CMD_READ, CMD_FLAG_DF, 3, 64 * 1024, 4096));
    out.extend(nbd_request(CMD_BLOCK_STATUS, 0, 4, 0, 1 << 20));
    out.extend(nbd_request(
        CMD_BLOCK_STATUS,
        CMD_FLAG_REQ_ONE,
        5,
        4096,
        8192,
    ));
    out.extend(nbd_request(CMD_WRITE, 0, 6, 0, 512));
    out.extend([0x55; 512]);
    out.extend(nbd_request(CMD_TRIM, 0, 7, 0, 512));
    out.extend(nbd_request(CMD_WRITE_ZEROES, 0, 8, 0, 512));
    out.extend(nbd_request(CMD_FLUSH, 0, 9, 0, 0));
    out.extend(nbd_request(CMD_CACHE, 0, 10, 0, 512));
    out.extend(nbd_request(CMD_READ, 0, 11, (1 << 20) - 100, 4096));
    out.extend(nbd_request(42, 0, 12, 0, 512));
    out.extend(nbd_request(CMD_DISC, 0, 13, 0, 0));
    out
}

/// `nbd_server`: the mode byte (odd: handshake prefixed), then client bytes.
pub fn nbd_server() -> Vec<Seed> {
    let requests = nbd_server_requests();
    let mut options = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    for (option, data) in [
        (OPT_LIST, Vec::new()),
        (OPT_STARTTLS, Vec::new()),
        (OPT_EXTENDED_HEADERS, Vec::new()),
        (OPT_STRUCTURED_REPLY, Vec::new()),
        (
            OPT_LIST_META_CONTEXT,
            ferry_nbd::wire::encode_meta_context("disk", &[]),
        ),
        (
            OPT_INFO,
            ferry_nbd::wire::encode_go("disk", &[INFO_NAME, INFO_DESCRIPTION]),
        ),
        (OPT_INFO, ferry_nbd::wire::encode_go("other", &[])),
    ] {
        options.extend(ferry_nbd::wire::encode_option(option, &data));
    }
    let mut export_name = options.clone();
    export_name.extend(ferry_nbd::wire::encode_option(OPT_EXPORT_NAME, b"disk"));
    export_name.extend(&requests);
    let mut abort = options;
    abort.extend(ferry_nbd::wire::encode_option(OPT_ABORT, &[]));
    vec![
        seed("requests", cat(&[&[1], &requests])),
        seed("options-export-name", cat(&[&[0], &export_name])),
        seed("options-abort", cat(&[&[0], &abort])),
        seed("handshake-only", cat(&[&[0], &nbd::client_handshake()])),
    ]
}

// ---------------------------------------------------------------------------------------
// iSCSI

/// A PDU without digests: a basic header segment with `fields` (byte offset, big-endian
/// 32-bit value) set, then the data segment padded to 4 bytes.
fn iscsi_pdu_bytes(opcode: u8, flags: u8, data: &[u8], fields: &[(usize, u32)]) -> Vec<u8> {
    let mut bhs = [0u8; 48];
    bhs[0] = opcode;
    bhs[1] = flags;
    bhs[5..8].copy_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
    for &(at, value) in fields {
        bhs[at..at + 4].copy_from_slice(&value.to_be_bytes());
    }
    let mut out = cat(&[&bhs, data]);
    out.resize(out.len() + (4 - data.len() % 4) % 4, 0);
    out
}

const SEND_TARGETS_TEXT: &[u8] =
    b"TargetName=iqn.2026-01.test:disk\0TargetAddress=127.0.0.1:3260,1\0";

/// Fixed-format sense data: ILLEGAL REQUEST, LBA OUT OF RANGE.
const SENSE: [u8; 18] = [0x70, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x21, 0, 0, 0, 0, 0];

/// `iscsi_pdu`: the first byte picks the parser (see [`crate::iscsi_pdu`]).
pub fn iscsi_pdu() -> Vec<Seed> {
    let text_pdu = iscsi_pdu_bytes(0x24, 0x80, SEND_TARGETS_TEXT, &[(16, 1)]);
    let data_in = iscsi_pdu_bytes(0x25, 0x81, b"xxxxx", &[(16, 2)]);
    let mut vpd = vec![5, 0, 0xb0, 0, 0x3c];
    vpd.resize(vpd.len() + 60, 0);
    let mut capacity = cat(&[&[6], &2047u64.to_be_bytes(), &512u32.to_be_bytes()]);
    capacity.extend([0, 0, 0xc0, 0]);
    capacity.resize(capacity.len() + 16, 0);
    let descriptor = |lba: u64, blocks: u32, status: u8| {
        cat(&[
            &lba.to_be_bytes(),
            &blocks.to_be_bytes(),
            &[status, 0, 0, 0],
        ])
    };
    let lba = cat(&[
        &[7],
        &36u32.to_be_bytes(),
        &[0; 4],
        &descriptor(8, 16, 1),
        &descriptor(24, 8, 0),
    ]);
    vec![
        seed("pdu", cat(&[&[0], &text_pdu, &data_in])),
        seed("text", cat(&[&[2], SEND_TARGETS_TEXT])),
        seed("chap", cat(&[&[3], b"0x0102030405060708090a0b0c0d0e0f10"])),
        seed("chap64", cat(&[&[3], b"0bAQIDBAUGBwgJCgsMDQ4PEA=="])),
        seed("sense", cat(&[&[4], &SENSE])),
        seed("vpd", vpd),
        seed("capacity", capacity),
        seed("lba", lba),
    ]
}

/// CmdSN window fields every target PDU carries: ExpCmdSN 1, MaxCmdSN 64.
const WINDOW: [(usize, u32); 2] = [(28, 1), (32, 64)];

fn iscsi_target_pdu(opcode: u8, flags: u8, data: &[u8], fields: &[(usize, u32)]) -> Vec<u8> {
    iscsi_pdu_bytes(opcode, flags, data, &[fields, &WINDOW].concat())
}

/// The target's answers in a normal session: READ (tag 0x100) in two Data-In PDUs, the
/// last with status; WRITE (0x101) gets an R2T for its second half, then a SCSI response;
/// a target ping; the initiator's ping (0x102) a NOP-In; logout (0x103).
fn iscsi_full_feature() -> Vec<u8> {
    const NONE: u32 = 0xffff_ffff;
    let pdus = [
        iscsi_target_pdu(
            0x25,
            0x00,
            &[0x11; 2048],
            &[(16, 0x100), (20, NONE), (36, 0), (40, 0)],
        ),
        iscsi_target_pdu(
            0x25,
            0x81,
            &[0x22; 2048],
            &[(16, 0x100), (20, NONE), (24, 1), (36, 1), (40, 2048)],
        ),
        iscsi_target_pdu(
            0x31,
            0x80,
            &[],
            &[
                (16, 0x101),
                (20, 0x55),
                (24, 2),
                (36, 0),
                (40, 4096),
                (44, 4096),
            ],
        ),
        iscsi_target_pdu(0x20, 0x80, &[], &[(16, NONE), (20, 0x77), (24, 2)]),
        iscsi_target_pdu(0x21, 0x80, &[], &[(16, 0x101), (24, 2)]),
        iscsi_target_pdu(0x20, 0x80, &[], &[(16, 0x102), (20, NONE), (24, 3)]),
        iscsi_target_pdu(0x26, 0x80, &[], &[(16, 0x103), (24, 4)]),
    ];
    pdus.concat()
}

/// The READ fails with CHECK CONDITION and sense data; the WRITE is rejected.
fn iscsi_check_condition() -> Vec<u8> {
    let sense = cat(&[&18u16.to_be_bytes(), &SENSE]);
    let mut response = iscsi_target_pdu(0x21, 0x80, &sense, &[(16, 0x100), (24, 1)]);
    response[3] = 0x02;
    let rejected = iscsi_pdu_bytes(0x01, 0x80, &[], &[(16, 0x101)]);
    let reject = iscsi_target_pdu(0x3f, 0x80, &rejected[..48], &[(16, 0xffff_ffff), (24, 2)]);
    cat(&[&response, &reject])
}

/// A SendTargets answer in two Text Responses (the first with Continue), then logout.
fn iscsi_send_targets() -> Vec<u8> {
    let (first, rest) = SEND_TARGETS_TEXT.split_at(20);
    let pdus = [
        iscsi_target_pdu(0x24, 0x40, first, &[(16, 1), (20, 9), (24, 1)]),
        iscsi_target_pdu(0x24, 0x80, rest, &[(16, 1), (20, 0xffff_ffff), (24, 2)]),
        iscsi_target_pdu(0x26, 0x80, &[], &[(16, 2), (24, 3)]),
    ];
    pdus.concat()
}

/// `iscsi_session`: every combination of CHAP, raw and discovery (no digests: random bytes
/// never pass a CRC32C check), and a failing READ.
pub fn iscsi_session() -> Vec<Seed> {
    let mut seeds = Vec::new();
    for chap in [0u8, 0x04] {
        for raw in [0u8, 0x01] {
            for discovery in [0u8, 0x02] {
                let byte = chap | raw | discovery;
                let mode = iscsi::Mode::from_byte(byte);
                let body = if mode.discovery {
                    iscsi_send_targets()
                } else {
                    iscsi_full_feature()
                };
                let login = if mode.raw {
                    iscsi::login_prefix(mode)
                } else {
                    Vec::new()
                };
                seeds.push(seed(format!("{byte:02x}"), cat(&[&[byte], &login, &body])));
            }
        }
    }
    seeds.push(seed("check", cat(&[&[0], &iscsi_check_condition()])));
    seeds
}

// ---------------------------------------------------------------------------------------
// NFS

/// An NFSv3 `fattr3` of a regular file of `size` bytes.
fn nfs_fattr3(size: u64) -> Encoder {
    let mut e = Encoder::new();
    e.u32(nfs3::NF3REG).u32(0o644).u32(1).u32(0).u32(0);
    e.u64(size).u64(size).u32(0).u32(0).u64(1).u64(2);
    for _ in 0..6 {
        e.u32(0);
    }
    e
}

/// An RPC reply record (one fragment): `xid`, accepted with `stat`, then `body`.
fn nfs_rpc_record(xid: u32, accepted: bool, stat: u32, body: &[u8]) -> Vec<u8> {
    let mut e = Encoder::new();
    e.u32(xid).u32(1).u32(u32::from(!accepted));
    if accepted {
        e.u32(0).u32(0).u32(stat);
    } else {
        e.u32(stat).u32(5);
    }
    e.fixed(body);
    let msg = e.into_vec();
    cat(&[&(0x8000_0000u32 | msg.len() as u32).to_be_bytes(), &msg])
}

fn nfs_read3_reply(data: &[u8]) -> Vec<u8> {
    let mut e = Encoder::new();
    e.u32(0).bool(true).fixed(nfs_fattr3(9).as_slice());
    e.u32(data.len() as u32).bool(true).opaque(data);
    nfs_rpc_record(7, true, 0, e.as_slice())
}

fn nfs_compound_header(e: &mut Encoder, status: u32, count: u32) {
    e.u32(status).opaque(b"").u32(count);
}

fn nfs_sequence_ok(e: &mut Encoder) {
    e.u32(ops::OP_SEQUENCE).u32(0).fixed(&[1; 16]);
    e.u32(7).u32(0).u32(3).u32(15).u32(0);
}

/// The reply to a read COMPOUND (SEQUENCE, PUTFH, READ) carrying `data`.
fn nfs_read4_body(data: &[u8]) -> Vec<u8> {
    let mut e = Encoder::new();
    nfs_compound_header(&mut e, 0, 3);
    nfs_sequence_ok(&mut e);
    e.u32(ops::OP_PUTFH).u32(0);
    e.u32(ops::OP_READ).u32(0).bool(false).opaque(data);
    e.into_vec()
}

/// A COMPOUND reply holding one result of every decoder ferry uses, in the order
/// `sequence, PUTFH, getfh, getattr, open, setattr, write, commit, seek, exchange_id,
/// create_session, bind_conn`.
fn nfs_compound_all() -> Vec<u8> {
    let mut e = Encoder::new();
    nfs_compound_header(&mut e, 0, 12);
    nfs_sequence_ok(&mut e);
    e.u32(ops::OP_PUTFH).u32(0);
    e.u32(ops::OP_GETFH).u32(0).opaque(&[5; 20]);
    let mut vals = Encoder::new();
    vals.u32(ops::NF4REG).u64(12345);
    e.u32(ops::OP_GETATTR).u32(0).u32(1).u32(0b10010);
    e.opaque(vals.as_slice());
    e.u32(ops::OP_OPEN).u32(0).u32(1).fixed(&[3; 12]);
    e.bool(true).u64(1).u64(2).u32(0).u32(0).u32(0);
    e.u32(ops::OP_SETATTR).u32(0).u32(0);
    e.u32(ops::OP_WRITE).u32(0).u32(4096).u32(0).fixed(&[9; 8]);
    e.u32(ops::OP_COMMIT).u32(0).fixed(&[9; 8]);
    e.u32(ops::OP_SEEK).u32(0).bool(false).u64(8192);
    e.u32(ops::OP_EXCHANGE_ID).u32(0).u64(77).u32(1);
    e.u32(ops::OP_CREATE_SESSION).u32(0).fixed(&[2; 16]);
    e.u32(1).u32(0);
    for _ in 0..2 {
        e.u32(0).u32(1 << 20).u32(1 << 20).u32(4096);
        e.u32(8).u32(16).u32(0);
    }
    e.u32(ops::OP_BIND_CONN_TO_SESSION).u32(0).fixed(&[2; 16]);
    e.u32(1).bool(false);
    e.into_vec()
}

/// `nfs_xdr`: a walk over every primitive (pick, then its value), and one valid reply
/// body per NFSv3 and MOUNT decoder.
pub fn nfs_xdr() -> Vec<Seed> {
    let mut walk = Encoder::new();
    walk.u32(0).u32(7).u32(1).u64(1 << 40).u32(2).bool(true);
    walk.u32(3).opaque(b"abcde").u32(4).string("name");
    // The driver takes a pick `% 7` and a length `(pick >> 3) % 64`: 54 is `fixed(6)`,
    // 34 is `skip(4)`.
    walk.u32(54).fixed(&[1; 6]).u32(34).u32(0);
    let mut lookup = Encoder::new();
    lookup.opaque(&[1; 32]).bool(true);
    lookup.fixed(nfs_fattr3(5).as_slice());
    let mut create = Encoder::new();
    create.bool(true).opaque(&[1; 32]).bool(false);
    let mut fsinfo = Encoder::new();
    fsinfo.bool(false).u32(1 << 20).u32(1 << 20).u32(1);
    fsinfo
        .u32(1 << 20)
        .u32(1 << 20)
        .u32(1)
        .u32(4096)
        .u64(1 << 40);
    let mut write = Encoder::new();
    write
        .bool(false)
        .bool(false)
        .u32(4096)
        .u32(0)
        .fixed(&[1; 8]);
    let mut mount = Encoder::new();
    mount.opaque(&[1; 32]);
    let mut exports = Encoder::new();
    exports.bool(true).string("/export").bool(true).string("*");
    exports.bool(false).bool(false);
    vec![
        seed("walk", walk.into_vec()),
        seed("attr", nfs_fattr3(4096).into_vec()),
        seed("lookup", lookup.into_vec()),
        seed("create", create.into_vec()),
        seed("fsinfo", fsinfo.into_vec()),
        seed("write", write.into_vec()),
        seed("mount", mount.into_vec()),
        seed("exports", exports.into_vec()),
    ]
}

/// `nfs_rpc_reply`: an NFSv3 READ reply, an NFSv4 read COMPOUND reply, a denied call.
pub fn nfs_rpc_reply() -> Vec<Seed> {
    let read4 = nfs_read4_body(b"hello, world");
    vec![
        seed("read3", nfs_read3_reply(b"hello")),
        seed("read4", nfs_rpc_record(9, true, 0, &read4)),
        seed("denied", nfs_rpc_record(3, false, 1, &[])),
    ]
}

/// `nfs4_compound_reply`: a read COMPOUND reply, and one result of every decoder.
pub fn nfs4_compound_reply() -> Vec<Seed> {
    vec![
        seed("read", nfs_read4_body(b"data")),
        seed("all", nfs_compound_all()),
    ]
}

/// qcow2 images made by qemu-img (512-byte clusters, so each is a few KiB): data and zero
/// clusters, deflate and zstd compressed clusters, a backing file name.
pub fn qcow2_image() -> Vec<Seed> {
    vec![
        seed(
            "plain",
            include_bytes!("../../../fuzz/seeds/formats/plain.qcow2").to_vec(),
        ),
        seed(
            "deflate",
            include_bytes!("../../../fuzz/seeds/formats/deflate.qcow2").to_vec(),
        ),
        seed(
            "zstd",
            include_bytes!("../../../fuzz/seeds/formats/zstd.qcow2").to_vec(),
        ),
        seed(
            "backed",
            include_bytes!("../../../fuzz/seeds/formats/backed.qcow2").to_vec(),
        ),
    ]
}

/// A small image's bytes: text, zeroes and a counter.
fn stream_payload() -> Vec<u8> {
    let mut data = b"ferry compressed stream seed ".repeat(64);
    data.extend_from_slice(&[0u8; 8192]);
    data.extend((0..4096u32).map(|i| (i % 251) as u8));
    data
}

/// Compressed streams as the tools write them, each with the mode byte
/// [`crate::compressed_stream`] reads: gzip (two members), xz (single and two streams),
/// zstd (one frame, and two frames behind pzstd's skippable size hints), and one given a
/// size.
pub fn compressed_stream() -> Vec<Seed> {
    use std::io::Write;
    let data = stream_payload();
    let gzip = |d: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(d).expect("in-memory gzip");
        e.finish().expect("in-memory gzip")
    };
    let xz = |d: &[u8]| {
        let mut e = liblzma::write::XzEncoder::new(Vec::new(), 1);
        e.write_all(d).expect("in-memory xz");
        e.finish().expect("in-memory xz")
    };
    let zst = |d: &[u8]| zstd::bulk::compress(d, 3).expect("in-memory zstd");
    let (a, b) = data.split_at(data.len() / 2);
    let mut pzstd = Vec::new();
    for part in [a, b] {
        let frame = zst(part);
        pzstd.extend_from_slice(&0x184d_2a50u32.to_le_bytes());
        pzstd.extend_from_slice(&4u32.to_le_bytes());
        pzstd.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        pzstd.extend_from_slice(&frame);
    }
    let sized = (data.len() as u16 / 16).to_le_bytes();
    vec![
        seed("gzip", cat(&[&[0], &gzip(&data)])),
        seed("gzip-members", cat(&[&[4], &sized, &gzip(a), &gzip(b)])),
        seed("xz", cat(&[&[1], &xz(&data)])),
        seed("xz-streams", cat(&[&[3], &xz(a), &[0; 4], &xz(b)])),
        seed("zstd", cat(&[&[2], &zst(&data)])),
        seed("zstd-frames", cat(&[&[2], &pzstd])),
    ]
}

// ---------------------------------------------------------------------------------------
// VMDK, VHD, VHDX, VDI, OVA: tiny valid images built here (the producers' smallest
// images are megabytes: 64 KiB of VMDK metadata, 1-2 MiB blocks).

fn put32le(f: &mut [u8], at: usize, v: u32) {
    f[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64le(f: &mut [u8], at: usize, v: u64) {
    f[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// A dynamic VDI of 4 blocks of 512 bytes: stored, unallocated, stored, discarded.
pub fn vdi_bytes() -> Vec<u8> {
    let mut f = vec![0u8; 0x200];
    f[..40].copy_from_slice(b"<<< Oracle VM VirtualBox Disk Image >>>\n");
    put32le(&mut f, 0x40, ferry_formats::vdi::SIGNATURE);
    put32le(&mut f, 0x44, 0x0001_0001);
    put32le(&mut f, 0x48, 0x190);
    put32le(&mut f, 0x4c, 1);
    put32le(&mut f, 0x154, 0x200);
    put32le(&mut f, 0x158, 0x400);
    put32le(&mut f, 0x168, 512);
    put64le(&mut f, 0x170, 2048);
    put32le(&mut f, 0x178, 512);
    put32le(&mut f, 0x180, 4);
    put32le(&mut f, 0x184, 2);
    let mut map = vec![0u8; 0x200];
    for (i, e) in [1u32, 0xffff_ffff, 0, 0xffff_fffe].iter().enumerate() {
        put32le(&mut map, i * 4, *e);
    }
    f.extend(map);
    f.extend([0xbb; 512]);
    f.extend((0..512u32).map(|i| (i % 251) as u8));
    f
}

pub fn vdi_image() -> Vec<Seed> {
    vec![seed("dynamic", vdi_bytes())]
}

fn vhd_footer(disk_type: u32, creator: &[u8; 4], size: u64) -> Vec<u8> {
    let mut f = vec![0u8; 512];
    f[..8].copy_from_slice(b"conectix");
    f[8..12].copy_from_slice(&2u32.to_be_bytes());
    f[12..16].copy_from_slice(&0x0001_0000u32.to_be_bytes());
    let data_offset: u64 = if disk_type == 2 { u64::MAX } else { 512 };
    f[16..24].copy_from_slice(&data_offset.to_be_bytes());
    f[28..32].copy_from_slice(creator);
    f[40..48].copy_from_slice(&size.to_be_bytes());
    f[48..56].copy_from_slice(&size.to_be_bytes());
    f[56..58].copy_from_slice(&1u16.to_be_bytes());
    f[58] = 1;
    f[59] = (size / 512) as u8;
    f[60..64].copy_from_slice(&disk_type.to_be_bytes());
    let sum = f.iter().fold(0u32, |a, &x| a.wrapping_add(u32::from(x)));
    f[64..68].copy_from_slice(&(!sum).to_be_bytes());
    f
}

/// A VHD dynamic header: the BAT at 1536, two blocks of 4 KiB.
fn vhd_dynamic_header() -> Vec<u8> {
    let mut dh = vec![0u8; 1024];
    dh[..8].copy_from_slice(b"cxsparse");
    dh[8..16].copy_from_slice(&u64::MAX.to_be_bytes());
    dh[16..24].copy_from_slice(&1536u64.to_be_bytes());
    dh[24..28].copy_from_slice(&0x0001_0000u32.to_be_bytes());
    dh[28..32].copy_from_slice(&2u32.to_be_bytes());
    dh[32..36].copy_from_slice(&4096u32.to_be_bytes());
    dh
}

/// A dynamic VHD of two 4 KiB blocks (the second stored) and a fixed one of 8 KiB.
pub fn vhd_image() -> Vec<Seed> {
    let mut dynamic = vhd_footer(3, b"qemu", 8192);
    let dh = vhd_dynamic_header();
    dynamic.extend(dh);
    let mut bat = vec![0xffu8; 512];
    bat[4..8].copy_from_slice(&4u32.to_be_bytes());
    dynamic.extend(bat);
    dynamic.extend([0xffu8; 512]);
    dynamic.extend((0..4096u32).map(|i| (i % 253) as u8));
    dynamic.extend(vhd_footer(3, b"qemu", 8192));
    let mut fixed: Vec<u8> = (0..8192u32).map(|i| (i % 7) as u8).collect();
    fixed.extend(vhd_footer(2, b"win ", 8192));
    vec![
        seed("dynamic", dynamic),
        seed("fixed", fixed),
        seed("differencing", vhd_differencing()),
    ]
}

/// A differencing VHD of two 4 KiB blocks: block 1 stored, its bitmap marking sectors 0
/// and 2 (0x5a), the rest its parent's; the parent named by a `W2ru` locator.
pub fn vhd_differencing() -> Vec<u8> {
    let mut f = vhd_footer(4, b"win ", 8192);
    let mut dh = vhd_dynamic_header();
    dh[40..56].fill(7);
    let name: Vec<u8> = "base.vhd"
        .encode_utf16()
        .flat_map(u16::to_be_bytes)
        .collect();
    dh[64..64 + name.len()].copy_from_slice(&name);
    let locator: Vec<u8> = ".\\base.vhd"
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    dh[576..580].copy_from_slice(b"W2ru");
    dh[580..584].copy_from_slice(&512u32.to_be_bytes());
    dh[584..588].copy_from_slice(&(locator.len() as u32).to_be_bytes());
    dh[592..600].copy_from_slice(&2048u64.to_be_bytes());
    f.extend(dh);
    let mut bat = vec![0xffu8; 512];
    bat[4..8].copy_from_slice(&5u32.to_be_bytes());
    f.extend(bat);
    let mut loc = vec![0u8; 512];
    loc[..locator.len()].copy_from_slice(&locator);
    f.extend(loc);
    let mut bitmap = vec![0u8; 512];
    bitmap[0] = 0b1010_0000;
    f.extend(bitmap);
    f.extend([0x5au8; 4096]);
    f.extend(vhd_footer(4, b"win ", 8192));
    f
}

fn zlib(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).expect("in-memory zlib");
    e.finish().expect("in-memory zlib")
}

/// A VMDK sparse header: `sectors` of capacity, 1-sector grains, 4 entries per table.
fn vmdk_header(flags: u32, gd: u64, rgd: u64) -> Vec<u8> {
    let mut h = vec![0u8; 512];
    put32le(&mut h, 0, ferry_formats::vmdk::sparse::MAGIC);
    put32le(&mut h, 4, if flags & (1 << 16) != 0 { 3 } else { 1 });
    put32le(&mut h, 8, flags);
    put64le(&mut h, 12, 8);
    put64le(&mut h, 20, 1);
    put32le(&mut h, 44, 4);
    put64le(&mut h, 48, rgd);
    put64le(&mut h, 56, gd);
    put64le(&mut h, 64, 1);
    h[73..77].copy_from_slice(b"\n \r\n");
    if flags & (1 << 16) != 0 {
        h[77] = 1;
    }
    h
}

/// The VMDK seeds: a monolithicSparse extent (GD, redundant GD, tables, a zero grain),
/// a streamOptimized one (compressed grains with markers, GD at the end, footer), and
/// monolithicFlat and twoGbMaxExtentSparse descriptors.
pub fn vmdk_image() -> Vec<Seed> {
    // Sparse: GD sector 1, RGD 2, GTs 3-4 (redundant 5-6), grains at 7 and 8.
    let mut sparse = vmdk_header(0b11, 1, 2);
    sparse.resize(9 * 512, 0);
    for (gd, gts) in [(1usize, [3u32, 4]), (2, [5, 6])] {
        put32le(&mut sparse, gd * 512, gts[0]);
        put32le(&mut sparse, gd * 512 + 4, gts[1]);
        put32le(&mut sparse, gts[0] as usize * 512, 7);
        put32le(&mut sparse, gts[0] as usize * 512 + 4, 1);
        put32le(&mut sparse, gts[1] as usize * 512 + 8, 8);
    }
    sparse[7 * 512..8 * 512].fill(0x71);
    sparse[8 * 512..].fill(0x83);
    // streamOptimized: header (GD at end), an empty sector, two compressed grains, GT,
    // GD, footer, EOS.
    let flags = 1 | (1 << 16) | (1 << 17);
    let mut stream = vmdk_header(flags, u64::MAX, 0);
    // The embedded descriptor's sector (a grain table entry of 1 means "zero grain").
    stream.resize(1024, 0);
    let mut grains = Vec::new();
    for (lba, fill) in [(0u64, 0x5au8), (5, 0xa5)] {
        grains.push((stream.len() / 512) as u32);
        let z = zlib(&[fill; 512]);
        let mut marker = vec![0u8; 12];
        put64le(&mut marker, 0, lba);
        put32le(&mut marker, 8, z.len() as u32);
        stream.extend(marker);
        stream.extend(z);
        stream.resize(stream.len().div_ceil(512) * 512, 0);
    }
    let gts: Vec<u32> = (0..2).map(|i| (stream.len() / 512) as u32 + i).collect();
    let mut tables = vec![0u8; 1024];
    put32le(&mut tables, 0, grains[0]);
    put32le(&mut tables, 512 + 4, grains[1]);
    stream.extend(tables);
    let gd_sector = (stream.len() / 512) as u64;
    let mut gd = vec![0u8; 512];
    put32le(&mut gd, 0, gts[0]);
    put32le(&mut gd, 4, gts[1]);
    stream.extend(gd);
    let mut footer_marker = vec![0u8; 512];
    put64le(&mut footer_marker, 0, 1);
    put32le(&mut footer_marker, 12, 3);
    stream.extend(footer_marker);
    stream.extend(vmdk_header(flags, gd_sector, 0));
    stream.extend([0u8; 512]);
    let with_mode = |mode: u8, body: &[u8]| [&[mode][..], body].concat();
    let flat = b"# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\n\
        createType=\"monolithicFlat\"\n\n# Extent description\nRW 1 FLAT \"d-flat.vmdk\" 0\n\
        RW 2 ZERO\n\n# The Disk Data Base\nddb.adapterType = \"ide\"\n";
    let split = b"# Disk DescriptorFile\nversion=1\ncreateType=\"twoGbMaxExtentSparse\"\n\
        RW 8 SPARSE \"d-s001.vmdk\"\nRW 8 SPARSE \"d-s002.vmdk\"\n";
    vec![
        seed("sparse", with_mode(0, &sparse)),
        seed("stream", with_mode(0, &stream)),
        seed("flat", with_mode(1, flat)),
        seed("split", with_mode(1, split)),
    ]
}

/// A ustar archive of `files`.
pub fn tar_bytes(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in files {
        let mut h = vec![0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..107].copy_from_slice(b"0000644");
        h[108..115].copy_from_slice(b"0000000");
        h[116..123].copy_from_slice(b"0000000");
        h[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
        h[136..147].copy_from_slice(b"00000000000");
        h[156] = b'0';
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].fill(b' ');
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        out.extend(h);
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend([0u8; 1024]);
    out
}

/// OVAs holding the VDI seed, and two disks (the first byte picks disk 1).
pub fn ova_image() -> Vec<Seed> {
    let ovf = b"<?xml version=\"1.0\"?>\n<Envelope><References><File ovf:href=\"d.vdi\"/></References></Envelope>\n";
    let vdi = vdi_bytes();
    let one = tar_bytes(&[("vm.ovf", ovf), ("d.vdi", &vdi)]);
    let two = tar_bytes(&[("vm.ovf", ovf), ("a.vdi", &vdi), ("b.raw", &[7u8; 1024])]);
    vec![
        seed("one", [&[0u8][..], &one].concat()),
        seed("two", [&[1u8][..], &two].concat()),
    ]
}

/// A GUID as VHDX stores it.
fn vhdx_guid(text: &str) -> [u8; 16] {
    ferry_formats::vhdx::header::guid(text)
}

/// A dynamic VHDX of 2 MiB in 1 MiB blocks (block 0 zero, block 1 not present), laid
/// out for [`crate::formats::vhdx_layout`]: two headers, two region tables (metadata at
/// 512 KiB, BAT 4 KiB later), then the metadata and the BAT. The first byte asks the
/// driver to fix the checksums (they are also right here).
pub fn vhdx_image() -> Vec<Seed> {
    use crate::formats::{vhdx_layout, VHDX_REST};
    let mut pieces = vec![0u8; 4 * 4096];
    for (i, seq) in [(0usize, 1u64), (1, 2)] {
        let h = &mut pieces[i * 4096..(i + 1) * 4096];
        h[..4].copy_from_slice(b"head");
        put64le(h, 8, seq);
        h[66..68].copy_from_slice(&1u16.to_le_bytes());
        put32le(h, 68, 1 << 20);
        put64le(h, 72, 1 << 20);
    }
    for i in 2..4 {
        let r = &mut pieces[i * 4096..(i + 1) * 4096];
        r[..4].copy_from_slice(b"regi");
        put32le(r, 8, 2);
        r[16..32].copy_from_slice(&vhdx_guid("2DC27766-F623-4200-9D64-115E9BFD4A08"));
        put64le(r, 32, (VHDX_REST + 4096) as u64);
        put32le(r, 40, 4096);
        put32le(r, 44, 1);
        r[48..64].copy_from_slice(&vhdx_guid("8B7CA206-4790-4B9A-B8FE-575F050F886E"));
        put64le(r, 64, VHDX_REST as u64);
        put32le(r, 72, 4096);
        put32le(r, 76, 1);
    }
    let mut meta = vec![0u8; 4096];
    meta[..8].copy_from_slice(b"metadata");
    meta[10..12].copy_from_slice(&3u16.to_le_bytes());
    let items = [
        ("CAA16737-FA36-4D43-B3B6-33F0AA44E76B", 1024u32, 8u32),
        ("2FA54224-CD1B-4876-B211-5DBED83BF4B8", 1032, 8),
        ("8141BF1D-A96F-4709-BA47-F233A8FAAB5F", 1040, 4),
    ];
    for (i, (id, offset, len)) in items.iter().enumerate() {
        let e = 32 + i * 32;
        meta[e..e + 16].copy_from_slice(&vhdx_guid(id));
        put32le(&mut meta, e + 16, *offset);
        put32le(&mut meta, e + 20, *len);
        put32le(&mut meta, e + 24, 4);
    }
    put32le(&mut meta, 1024, 1 << 20);
    put64le(&mut meta, 1032, 2 << 20);
    put32le(&mut meta, 1040, 512);
    let mut bat = vec![0u8; 64];
    put64le(&mut bat, 0, 2);
    let mut input = vec![1u8];
    input.extend(&pieces);
    input.extend(meta);
    input.extend(bat);
    // The checksums right in the seed too, so the unfixed mode starts valid.
    let file = vhdx_layout(&input[1..], true);
    let mut unfixed = vec![0u8];
    for &(at, _) in &crate::formats::VHDX_PIECES {
        unfixed.extend_from_slice(&file[at..at + 4096]);
    }
    unfixed.extend_from_slice(&input[1 + 4 * 4096..]);
    let mut differencing = input.clone();
    differencing.resize(differencing.len() + 128, 0);
    vhdx_make_differencing(&mut differencing[1 + 4 * 4096..]);
    vec![
        seed("fixed-crc", input),
        seed("dynamic", unfixed),
        seed("differencing", differencing),
    ]
}

/// Turns [`vhdx_image`]'s metadata and BAT (`rest`) into a differencing VHDX's: the
/// has-parent bit, 256 MiB blocks (16 per chunk, so the BAT of 512 MiB is 17 entries:
/// block 0 zero, block 1 the parent's, the chunk's sector bitmap entry), and a parent
/// locator naming `.\base.vhdx` and its DataWriteGuid.
fn vhdx_make_differencing(rest: &mut [u8]) {
    let meta = &mut rest[..4096];
    meta[10..12].copy_from_slice(&4u16.to_le_bytes());
    put32le(meta, 1024, 256 << 20);
    put32le(meta, 1028, 2);
    put64le(meta, 1032, 512 << 20);
    let e = 32 + 3 * 32;
    meta[e..e + 16].copy_from_slice(&vhdx_guid("A8D35F2D-B30B-454D-ABF7-D3D84834AB0C"));
    put32le(meta, e + 16, 1100);
    put32le(meta, e + 24, 4);
    let utf16 = |t: &str| -> Vec<u8> { t.encode_utf16().flat_map(u16::to_le_bytes).collect() };
    let pairs = [
        ("parent_linkage", "{83ED0EC3-24C8-49A6-A959-5E4BF1288BFB}"),
        ("relative_path", ".\\base.vhdx"),
    ];
    let mut locator = vec![0u8; 20 + pairs.len() * 12];
    locator[..16].copy_from_slice(&vhdx_guid("B04AEFB7-D19E-4A81-B789-25B8E9445913"));
    locator[18..20].copy_from_slice(&(pairs.len() as u16).to_le_bytes());
    for (i, (k, v)) in pairs.iter().enumerate() {
        let (k, v) = (utf16(k), utf16(v));
        let at = 20 + i * 12;
        let key_at = locator.len() as u32;
        locator.extend(&k);
        let value_at = locator.len() as u32;
        locator.extend(&v);
        put32le(&mut locator, at, key_at);
        put32le(&mut locator, at + 4, value_at);
        locator[at + 8..at + 10].copy_from_slice(&(k.len() as u16).to_le_bytes());
        locator[at + 10..at + 12].copy_from_slice(&(v.len() as u16).to_le_bytes());
    }
    put32le(meta, e + 20, locator.len() as u32);
    meta[1100..1100 + locator.len()].copy_from_slice(&locator);
    let bat = &mut rest[4096..];
    bat.fill(0);
    put64le(bat, 0, 2);
}

// ---------------------------------------------------------------------------------------
// Registry

/// A manifest, an index, a challenge, a token reply (each after its selector byte).
pub fn registry_manifest() -> Vec<Seed> {
    let d = |c: char| format!("sha256:{}", c.to_string().repeat(64));
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{}","size":1234}}]}}"#,
        d('a')
    );
    let index = format!(
        r#"{{"schemaVersion":2,"manifests":[{{"digest":"{}","size":500,"platform":{{"os":"linux","architecture":"amd64"}}}},{{"digest":"{}","size":500,"platform":{{"os":"linux","architecture":"arm64","variant":"v8"}}}}]}}"#,
        d('b'),
        d('c')
    );
    vec![
        seed("manifest", cat(&[&[0], manifest.as_bytes()])),
        seed("index", cat(&[&[5], index.as_bytes()])),
        seed(
            "challenge",
            cat(&[
                &[2],
                br#"Bearer realm="https://auth.io/token",service="reg",scope="repository:a:pull""#,
            ]),
        ),
        seed(
            "token",
            cat(&[&[3], br#"{"token":"abc","expires_in":300}"#]),
        ),
        seed(
            "config",
            cat(&[&[3], br#"{"auths":{"reg.io":{"auth":"dTpw"}}}"#]),
        ),
    ]
}

/// Layers: a plain tar and a gzip tar holding disk/disk.img.
pub fn container_layer() -> Vec<Seed> {
    use std::io::Write;
    let tar = tar_bytes(&[("disk/disk.img", &[7u8; 3000])]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).expect("gzip in memory");
    let gz = gz.finish().expect("gzip in memory");
    vec![
        seed("plain", cat(&[&[0], &tar])),
        seed("gzip", cat(&[&[1], &gz])),
    ]
}

#[cfg(test)]
mod tests {
    use ferry_nfs::rpc::{decode_reply, ReadShape, RpcError};
    use ferry_nfs::v4::ops::{self, Reply};
    use ferry_nfs::xdr::Decoder;

    use super::*;

    fn bytes(seeds: &[Seed], name: &str) -> Vec<u8> {
        let found = seeds.iter().find(|s| s.name == name);
        found.map(|s| s.bytes.clone()).unwrap_or_default()
    }

    // Each NFS seed is the valid reply its name says, so mutations start from deep paths.

    #[test]
    fn nfs_xdr_seeds_decode_as_intended() {
        let xdr = nfs_xdr();
        let whole = |name| bytes(&xdr, name);
        let walk = whole("walk");
        let mut d = Decoder::new(&walk);
        assert_eq!(
            (d.u32(), d.u32(), d.u32(), d.u64()),
            (Ok(0), Ok(7), Ok(1), Ok(1 << 40))
        );
        assert_eq!((d.u32(), d.bool(), d.u32()), (Ok(2), Ok(true), Ok(3)));
        assert_eq!(d.opaque(1024, "opaque"), Ok(&b"abcde"[..]));
        assert_eq!(
            (d.u32(), d.string(255, "string").as_deref()),
            (Ok(4), Ok("name"))
        );
        assert_eq!((d.u32(), d.fixed(6)), (Ok(54), Ok(&[1; 6][..])));
        assert_eq!((d.u32(), d.skip(4), d.remaining()), (Ok(34), Ok(()), 0));
        assert_eq!(
            nfs3::Attr::decode(&mut Decoder::new(&whole("attr"))).map(|a| a.size),
            Ok(4096)
        );
        assert!(nfs3::lookup_ok(&mut Decoder::new(&whole("lookup"))).is_ok());
        assert!(nfs3::create_ok(&mut Decoder::new(&whole("create"))).is_ok());
        assert!(nfs3::fsinfo_ok(&mut Decoder::new(&whole("fsinfo"))).is_ok());
        assert!(nfs3::write_ok(&mut Decoder::new(&whole("write"))).is_ok());
        assert!(nfs3::mount_ok(&mut Decoder::new(&whole("mount"))).is_ok());
        let exports = nfs3::exports(&mut Decoder::new(&whole("exports")));
        assert_eq!(exports, Ok(vec!["/export".to_string()]));
    }

    #[test]
    fn nfs_rpc_reply_seeds_decode_as_intended() {
        let rpc = nfs_rpc_reply();
        let (xid, out) = decode_reply(&bytes(&rpc, "read3"), Some(vec![0u8; 8]), ReadShape::Read3)
            .expect("a good READ reply");
        assert_eq!((xid, out.result.is_ok()), (7, true));
        assert_eq!(&out.sink.unwrap_or_default()[..5], b"hello");
        let compound = ReadShape::Compound4 {
            before: ops::READ_PREFIX,
            read_op: ops::OP_READ,
        };
        let (xid, out) = decode_reply(&bytes(&rpc, "read4"), Some(vec![0u8; 12]), compound)
            .expect("a good read COMPOUND reply");
        assert_eq!((xid, out.result.is_ok()), (9, true));
        assert_eq!(out.sink.unwrap_or_default(), b"hello, world");
        let (_, out) = decode_reply::<Vec<u8>>(&bytes(&rpc, "denied"), None, ReadShape::Read3)
            .expect("a denied call is a reply");
        assert!(matches!(out.result, Err(RpcError::Auth { .. })), "{out:?}");
    }

    #[test]
    fn nfs4_compound_reply_seeds_decode_as_intended() {
        let v4 = nfs4_compound_reply();
        let all = bytes(&v4, "all");
        let mut r = Reply::parse(&all).expect("a COMPOUND reply");
        r.sequence().expect("SEQUENCE");
        r.simple(ops::OP_PUTFH).expect("PUTFH");
        assert_eq!(r.getfh().map(|fh| fh.0), Ok(vec![5; 20]));
        assert_eq!(r.getattr().map(|a| a.size), Ok(Some(12345)));
        assert!(r.open().is_ok() && r.setattr().is_ok());
        assert_eq!(r.write().map(|w| w.0), Ok(4096));
        assert!(r.commit().is_ok());
        assert_eq!(r.seek(), Ok((false, 8192)));
        assert_eq!(r.exchange_id(), Ok((77, 1)));
        assert_eq!(r.create_session().map(|s| s.1.max_requests), Ok(16));
        assert!(r.bind_conn().is_ok() && !r.has_more());
        let read = bytes(&v4, "read");
        let mut r = Reply::parse(&read).expect("a read COMPOUND reply");
        r.sequence().expect("SEQUENCE");
        r.simple(ops::OP_PUTFH).expect("PUTFH");
        assert!(r.read_into_sink().is_ok());
    }
}
