//! Seed inputs of every fuzz target, defined once: the smoke test starts from them, and the
//! `make-seeds` binary writes them as the libFuzzer seed corpora (`corpus/TARGET/seed-NAME`).
//!
//! The NBD session seeds are valid handshakes and reply streams for the requests
//! [`crate::nbd::session`] sends (cookies 1..=7: read 0+4096, read 1M-4096+4096, block
//! status 0+1M, write, write zeroes, trim, flush); the iSCSI session seeds answer what
//! [`crate::iscsi::session`] sends (tags 0x100..=0x103: READ, WRITE, NOP-Out, logout).

use ferry_nbd::proto::*;

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
