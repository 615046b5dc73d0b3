//! The iSCSI fuzz targets: `iscsi_pdu` drives ferry-iscsi's pure parsers, `iscsi_session`
//! the real initiator (login with or without CHAP, SendTargets discovery, a full-feature
//! session with commands in flight) against a loopback "target" whose every byte comes
//! from the input, checking that it ends (no hang) without panicking.
//!
//! ferry-iscsi talks to a `TcpStream`, so the scripted target is a real loopback socket:
//! it writes the scripted bytes, closes its sending side and swallows whatever the
//! initiator sends. The initiator therefore always sees end of file after the script, and
//! anything that then still waits (for a timer, a window that never opens) is a bug.

use std::time::Duration;

use ferry_iscsi::pdu::{Digests, Pdu};
use ferry_iscsi::{discover, scsi, text, Chap, Config, Session, Transfer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The target name a session logs in to.
pub const TARGET: &str = "iqn.2026-01.io.ferry:fuzz";

/// ferry-iscsi's pure parsers on arbitrary bytes: PDU framing (with and without digests,
/// bounded segment length), text keys, CHAP binary values, sense data, VPD pages,
/// READ CAPACITY(16) and GET LBA STATUS data. The first byte picks one.
pub fn iscsi_pdu(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 8 {
        0 | 1 => {
            let digests = Digests {
                header: which & 0x10 != 0,
                data: which & 0x20 != 0,
            };
            let mut buf = rest;
            while let Ok(Some((pdu, used))) = Pdu::parse(buf, digests, 8192) {
                assert!(pdu.data.len() <= 8192);
                assert!(used > 0 && used <= buf.len());
                buf = &buf[used..];
            }
        }
        2 => {
            if let Ok(pairs) = text::decode(rest) {
                let _ = ferry_iscsi::parse_send_targets(&pairs);
                assert_eq!(text::decode(&text::encode(&pairs)).ok(), Some(pairs));
            }
        }
        3 => {
            if let Ok(s) = std::str::from_utf8(rest) {
                let _ = text::decode_binary(s);
            }
        }
        4 => {
            if let Some(s) = scsi::Sense::parse(rest) {
                let _ = s.to_string();
            }
        }
        5 => {
            let _ = scsi::BlockLimits::parse(rest);
            let _ = scsi::Provisioning::parse(rest);
            let _ = scsi::Inquiry::parse(rest);
        }
        6 => {
            let _ = scsi::Capacity::parse(rest).map(|c| c.bytes());
        }
        _ => {
            let _ = scsi::parse_lba_status(rest);
        }
    }
}

/// The whole initiator against arbitrary target bytes: the first byte picks the [`Mode`];
/// unless it asks for raw bytes, a valid login comes first and the rest of the input is
/// the full-feature phase (or the SendTargets answer).
pub fn iscsi_session(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let mode = Mode::from_byte(first);
    let mut script = if mode.raw {
        Vec::new()
    } else {
        login_prefix(mode)
    };
    script.extend_from_slice(rest);
    session(mode, script);
}

/// What the first byte of an input selects.
#[derive(Debug, Clone, Copy)]
pub struct Mode {
    /// The fuzzer's bytes start at the first login response (else a valid login comes first).
    pub raw: bool,
    /// SendTargets discovery instead of a normal session.
    pub discovery: bool,
    /// Offer CHAP credentials (the valid login then runs the CHAP exchange).
    pub chap: bool,
    pub header_digest: bool,
    pub data_digest: bool,
}

impl Mode {
    /// Bit 0: raw, 1: discovery, 2: CHAP, 3: header digest, 4: data digest.
    pub fn from_byte(b: u8) -> Self {
        Self {
            raw: b & 0x01 != 0,
            discovery: b & 0x02 != 0,
            chap: b & 0x04 != 0,
            header_digest: b & 0x08 != 0,
            data_digest: b & 0x10 != 0,
        }
    }
}

fn login_response(out: &mut Vec<u8>, flags: u8, stat_sn: u32, text: &[u8]) {
    let mut bhs = [0u8; 48];
    bhs[0] = 0x23;
    bhs[1] = flags;
    bhs[5..8].copy_from_slice(&(text.len() as u32).to_be_bytes()[1..]);
    bhs[8] = 0x80;
    bhs[14..16].copy_from_slice(&1u16.to_be_bytes());
    bhs[24..28].copy_from_slice(&stat_sn.to_be_bytes());
    bhs[28..32].copy_from_slice(&1u32.to_be_bytes());
    bhs[32..36].copy_from_slice(&64u32.to_be_bytes());
    out.extend_from_slice(&bhs);
    out.extend_from_slice(text);
    out.resize(out.len() + (4 - text.len() % 4) % 4, 0);
}

/// A valid target side of the login: security (None, or CHAP with MD5), then operational
/// negotiation accepting what [`config`] offers (with the digests `mode` asks for).
pub fn login_prefix(mode: Mode) -> Vec<u8> {
    let mut out = Vec::new();
    let mut sn = 0;
    if mode.chap {
        login_response(&mut out, 0x00, sn, b"AuthMethod=CHAP\0");
        sn += 1;
        login_response(
            &mut out,
            0x00,
            sn,
            b"CHAP_A=5\0CHAP_I=7\0CHAP_C=0x0102030405060708090a0b0c0d0e0f10\0",
        );
        sn += 1;
        login_response(&mut out, 0x81, sn, b"");
    } else {
        login_response(&mut out, 0x81, sn, b"AuthMethod=None\0");
    }
    sn += 1;
    let dg = |b: bool| if b { "CRC32C" } else { "None" };
    let mut keys = format!(
        "HeaderDigest={}\0DataDigest={}\0MaxRecvDataSegmentLength=65536\0",
        dg(mode.header_digest),
        dg(mode.data_digest)
    );
    if !mode.discovery {
        keys.push_str(
            "InitialR2T=No\0ImmediateData=Yes\0MaxBurstLength=262144\0FirstBurstLength=4096\0",
        );
    }
    login_response(&mut out, 0x87, sn, keys.as_bytes());
    out
}

/// The initiator's settings: small segments, short timeouts (a wait for one is a finding).
pub fn config(mode: Mode) -> Config {
    Config {
        initiator_name: "iqn.2026-01.io.ferry:fuzzer".into(),
        chap: mode.chap.then(|| Chap {
            user: "fuzz".into(),
            secret: "fuzz-secret-1234".into(),
        }),
        mutual_chap: None,
        header_digest: mode.header_digest,
        data_digest: mode.data_digest,
        max_recv_data_segment_length: 8192,
        max_burst_length: 262_144,
        first_burst_length: 4096,
        immediate_data: true,
        initial_r2t: false,
        max_outstanding_r2t: 1,
        connect_timeout: Duration::from_secs(10),
        request_timeout: Some(Duration::from_secs(10)),
        max_in_flight: 8,
    }
}

/// Runs the initiator against `script`. A normal session issues, in this order (so with
/// initiator task tags 0x100..), a 4096-byte READ(16), an 8192-byte WRITE(16) (4096
/// bytes immediate, the rest on R2T) and a NOP-Out ping, all in flight together, then a
/// logout (tag 0x103). Panics only if the initiator hangs.
pub fn session(mode: Mode, script: Vec<u8>) {
    thread_local! {
        static RUNTIME: (tokio::runtime::Runtime, TcpListener) = {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let listener = rt
                .block_on(TcpListener::bind("127.0.0.1:0"))
                .expect("bind a loopback port");
            (rt, listener)
        };
    }
    RUNTIME.with(|(rt, listener)| {
        rt.block_on(async {
            let address = listener.local_addr().expect("address").to_string();
            let target = async {
                let (mut socket, _) = listener.accept().await.expect("accept");
                let (mut rd, mut wr) = socket.split();
                let send = async {
                    let _ = wr.write_all(&script).await;
                    let _ = wr.shutdown().await;
                };
                let swallow = async {
                    let mut sink = vec![0u8; 64 * 1024];
                    while let Ok(n) = rd.read(&mut sink).await {
                        if n == 0 {
                            break;
                        }
                    }
                };
                tokio::join!(send, swallow);
            };
            let initiator = async {
                let config = config(mode);
                if mode.discovery {
                    let _ = discover(&address, &config).await;
                    return;
                }
                let Ok(session) = Session::connect(&address, TARGET, &config).await else {
                    return;
                };
                let data = vec![0xa5u8; 8192];
                let (read, write) = (scsi::read16(0, 8), scsi::write16(0, 16));
                let _ = tokio::join!(
                    session.execute(0, &read, Transfer::Read(Box::new(vec![0u8; 4096]))),
                    session.execute(0, &write, Transfer::Write(&data)),
                    session.ping(),
                );
                let _ = session.logout().await;
            };
            tokio::time::timeout(Duration::from_secs(60), async {
                tokio::join!(target, initiator)
            })
            .await
            .expect("the initiator hung on a finished stream");
        })
    });
}
