//! The server against ferry's own client (in memory and over loopback TCP) and against
//! hand-written client bytes: reads, holes, block status, refusals of writes, TLS, many
//! clients at once, and clients that break the protocol, which lose their connection
//! without disturbing the others.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;
use crate::proto::*;
use crate::wire::{self as cwire, Request};
use crate::{Client, Config, Error, TlsConfig, ZeroFlags};

const SIZE: u64 = 4 << 20;
const STEP: Duration = Duration::from_secs(20);

async fn step<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(STEP, f).await.expect("the step hung")
}

/// An in-memory image: data in the first and third MiB, zeroes elsewhere (the second MiB
/// a hole, the fourth allocated zeroes), and counters of what the server asked.
struct Mem {
    data: Vec<u8>,
    extents: bool,
    reads: AtomicUsize,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    gate: Option<Arc<tokio::sync::Semaphore>>,
}

const MIB: u64 = 1 << 20;
/// Reads at this offset (inside data) fail.
const FAIL_AT: u64 = 3 * MIB - 512;

fn image() -> Vec<u8> {
    let mut data = vec![0u8; SIZE as usize];
    for (i, b) in data.iter_mut().enumerate() {
        let i = i as u64;
        if i < MIB || (2 * MIB..3 * MIB).contains(&i) {
            *b = (i * 7 % 251) as u8 + 1;
        }
    }
    data
}

impl Mem {
    fn new() -> Self {
        Self {
            data: image(),
            extents: true,
            reads: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
            gate: None,
        }
    }
}

impl Backend for Mem {
    type Buf = Vec<u8>;

    fn size(&self) -> u64 {
        SIZE
    }

    fn block_size(&self) -> BlockSize {
        BlockSize {
            minimum: 1,
            preferred: 64 * 1024,
            maximum: 1 << 30,
        }
    }

    fn can_extents(&self) -> bool {
        self.extents
    }

    async fn read(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        if let Some(gate) = &self.gate {
            let _ = gate.acquire().await;
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        if offset == FAIL_AT {
            return Err(std::io::Error::other("the disk caught fire"));
        }
        let at = offset as usize;
        Ok(self.data[at..at + len].to_vec())
    }

    async fn extents(&self, offset: u64, len: u64) -> std::io::Result<Vec<StatusExtent>> {
        // Reported in 512 KiB pieces so that callers must loop and merge.
        let mut out = Vec::new();
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let piece = (512 * 1024 - at % (512 * 1024)).min(end - at);
            let flags = match at / MIB {
                1 => STATE_HOLE | STATE_ZERO,
                3 => STATE_ZERO,
                _ => 0,
            };
            out.push(StatusExtent {
                offset: at,
                len: piece,
                flags,
            });
            at += piece;
            if out.len() == 3 {
                break;
            }
        }
        Ok(out)
    }
}

fn export(tls: Option<Arc<rustls::ServerConfig>>) -> ExportConfig {
    ExportConfig {
        name: "disk".into(),
        description: Some("a test disk".into()),
        tls,
        ..ExportConfig::default()
    }
}

/// A server of `backend` and a client connected to it through an in-memory pipe.
async fn pair(
    backend: Mem,
    config: ExportConfig,
    client: Config,
) -> (
    Result<Client, Error>,
    tokio::task::JoinHandle<Result<(), ExportError>>,
    Server<Mem>,
) {
    let server = Server::new(backend, config).unwrap();
    let (a, b) = tokio::io::duplex(1 << 20);
    let s = server.clone();
    let task = tokio::spawn(async move { s.serve_connection(a).await });
    let client = step(Client::handshake(b, &client)).await;
    (client, task, server)
}

fn client_config() -> Config {
    Config {
        export: "disk".into(),
        ..Config::default()
    }
}

#[tokio::test]
async fn reads_holes_block_status_and_refused_writes_with_the_client() {
    let (client, task, server) = pair(Mem::new(), export(None), client_config()).await;
    let client = client.unwrap();
    let info = client.info().clone();
    assert_eq!(info.size, SIZE);
    assert!(info.read_only() && info.can_flush() && info.can_multi_conn());
    assert!(info.structured_replies && !info.extended_headers);
    assert!(info.has_context(CONTEXT_BASE_ALLOCATION));
    assert_eq!(info.block_size.preferred, 64 * 1024);
    assert_eq!(info.block_size.maximum, MAX_PAYLOAD);
    assert_eq!(info.canonical_name.as_deref(), Some("disk"));
    assert_eq!(info.description.as_deref(), Some("a test disk"));

    // The whole image, in reads that cross data, hole and zero ranges.
    let want = image();
    let mut got = Vec::new();
    for offset in (0..SIZE).step_by(768 * 1024) {
        let len = (768 * 1024).min(SIZE - offset) as usize;
        got.extend(step(client.read(offset, vec![0xeeu8; len])).await.unwrap());
    }
    assert!(got == want, "the bytes read differ from the image");
    // A read inside the hole costs no backend read (answered with OFFSET_HOLE).
    let before = server.backend().reads.load(Ordering::SeqCst);
    let hole = step(client.read(MIB + 4096, vec![0xeeu8; 65536]))
        .await
        .unwrap();
    assert!(hole.iter().all(|&b| b == 0));
    assert_eq!(server.backend().reads.load(Ordering::SeqCst), before);

    // Block status: merged across the backend's 512 KiB pieces, looping over its prefixes.
    let status = step(client.block_status(0, SIZE)).await.unwrap();
    let extents: Vec<(u64, u64, u64)> = status
        .context(CONTEXT_BASE_ALLOCATION)
        .unwrap()
        .iter()
        .map(|e| (e.offset, e.len, e.flags))
        .collect();
    assert_eq!(
        extents,
        vec![
            (0, MIB, 0),
            (MIB, MIB, 3),
            (2 * MIB, MIB, 0),
            (3 * MIB, MIB, 2)
        ]
    );

    // A backend error reaches the client as EIO with its message; the connection lives.
    let err = step(client.read(FAIL_AT, vec![0u8; 512]))
        .await
        .unwrap_err();
    let e = err.server_error().expect("a server error");
    assert_eq!(e.errno, EIO);
    assert!(
        e.message.as_deref().unwrap().contains("caught fire"),
        "{err}"
    );
    // Past the end: EINVAL (the client checks first, so go through the raw path below).
    step(client.flush()).await.unwrap();
    // Writes are refused by the client itself, which saw NBD_FLAG_READ_ONLY.
    assert!(step(client.write(0, vec![1u8; 512], false)).await.is_err());
    assert!(step(client.write_zeroes(0, 512, ZeroFlags::default()))
        .await
        .is_err());
    step(client.disconnect()).await.unwrap();
    step(task).await.unwrap().unwrap();
}

#[tokio::test]
async fn simple_replies_and_no_extents() {
    let mut mem = Mem::new();
    mem.extents = false;
    let config = Config {
        structured_replies: false,
        extended_headers: false,
        ..client_config()
    };
    let (client, task, _server) = pair(mem, export(None), config).await;
    let client = client.unwrap();
    assert!(!client.info().structured_replies);
    assert!(client.info().contexts.is_empty());
    let got = step(client.read(MIB - 100, vec![0u8; 300_000]))
        .await
        .unwrap();
    assert!(got[..] == image()[(MIB - 100) as usize..(MIB - 100) as usize + 300_000]);
    let err = step(client.read(FAIL_AT, vec![0u8; 512]))
        .await
        .unwrap_err();
    assert_eq!(err.server_error().unwrap().errno, EIO);
    step(client.disconnect()).await.unwrap();
    step(task).await.unwrap().unwrap();
}

#[tokio::test]
async fn the_default_export_and_an_unknown_one() {
    // "" is the default export, whatever its name.
    let (client, task, _s) = pair(Mem::new(), export(None), Config::default()).await;
    let client = client.unwrap();
    assert_eq!(client.size(), SIZE);
    drop(client);
    step(task).await.unwrap().unwrap();
    let (client, task, _s) = pair(
        Mem::new(),
        export(None),
        Config {
            export: "nope".into(),
            ..Config::default()
        },
    )
    .await;
    match client {
        Err(Error::ExportNotFound { export, available }) => {
            assert_eq!(export, "nope");
            assert_eq!(available, Some(vec!["disk".to_string()]));
        }
        other => panic!("expected ExportNotFound, got {:?}", other.map(|_| ())),
    }
    step(task).await.unwrap().unwrap();
}

/// A CA, a server certificate for localhost and a client certificate, PEM files in the
/// layout libnbd uses.
fn certificates() -> tempfile::TempDir {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let dir = tempfile::tempdir().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    std::fs::write(dir.path().join("ca-cert.pem"), ca_cert.pem()).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    for (who, names) in [
        ("server", vec!["localhost".to_string()]),
        ("client", vec!["client.test".to_string()]),
    ] {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        std::fs::write(dir.path().join(format!("{who}-cert.pem")), cert.pem()).unwrap();
        std::fs::write(
            dir.path().join(format!("{who}-key.pem")),
            key.serialize_pem(),
        )
        .unwrap();
    }
    dir
}

#[tokio::test]
async fn tls_is_served_and_required() {
    let certs = certificates();
    let d = certs.path();
    let tls = server_tls_config(
        &d.join("server-cert.pem"),
        &d.join("server-key.pem"),
        Some(&d.join("ca-cert.pem")),
    )
    .unwrap();
    let with_tls = Config {
        tls: Some(TlsConfig {
            certificates: Some(d.to_path_buf()),
            verify_peer: true,
            hostname: Some("localhost".into()),
        }),
        ..client_config()
    };
    let (client, task, _s) = pair(Mem::new(), export(Some(tls.clone())), with_tls).await;
    let client = client.unwrap();
    assert!(client.info().tls);
    let got = step(client.read(0, vec![0u8; 100_000])).await.unwrap();
    assert!(got[..] == image()[..100_000]);
    let status = step(client.block_status(0, SIZE)).await.unwrap();
    assert_eq!(status.context(CONTEXT_BASE_ALLOCATION).unwrap().len(), 4);
    step(client.disconnect()).await.unwrap();
    step(task).await.unwrap().unwrap();

    // Without TLS every option is refused with NBD_REP_ERR_TLS_REQD.
    let (client, task, _s) = pair(Mem::new(), export(Some(tls.clone())), client_config()).await;
    assert!(
        matches!(client, Err(Error::TlsRequired(_))),
        "{:?}",
        client.map(|_| ())
    );
    let _ = step(task).await.unwrap();

    // A client without a certificate from the CA is turned away.
    let nocert = tempfile::tempdir().unwrap();
    std::fs::copy(d.join("ca-cert.pem"), nocert.path().join("ca-cert.pem")).unwrap();
    let anonymous = Config {
        tls: Some(TlsConfig {
            certificates: Some(nocert.path().to_path_buf()),
            verify_peer: true,
            hostname: Some("localhost".into()),
        }),
        ..client_config()
    };
    let (client, task, _s) = pair(Mem::new(), export(Some(tls)), anonymous).await;
    let client_failed = match client {
        Err(_) => true,
        // TLS 1.3 reports the refused certificate on the first read.
        Ok(c) => step(c.read(0, vec![0u8; 512])).await.is_err(),
    };
    assert!(client_failed);
    assert!(matches!(
        step(task).await.unwrap(),
        Err(ExportError::Tls(_))
    ));

    // A server without TLS refuses STARTTLS politely.
    let with_tls = Config {
        tls: Some(TlsConfig {
            certificates: Some(d.to_path_buf()),
            verify_peer: true,
            hostname: Some("localhost".into()),
        }),
        ..client_config()
    };
    let (client, _task, _s) = pair(Mem::new(), export(None), with_tls).await;
    let Err(err) = client else {
        panic!("TLS against a plain server succeeded");
    };
    assert!(err.to_string().contains("does not offer TLS"), "{err}");
}

/// A raw session: handshake with structured replies and base:allocation, then GO.
async fn raw(
    server: &Server<Mem>,
) -> (
    DuplexStream,
    tokio::task::JoinHandle<Result<(), ExportError>>,
) {
    let (a, mut b) = tokio::io::duplex(1 << 20);
    let s = server.clone();
    let task = tokio::spawn(async move { s.serve_connection(a).await });
    let mut greeting = [0u8; 18];
    b.read_exact(&mut greeting).await.unwrap();
    b.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .await
        .unwrap();
    b.write_all(&cwire::encode_option(OPT_STRUCTURED_REPLY, &[]))
        .await
        .unwrap();
    expect_reply(&mut b, OPT_STRUCTURED_REPLY, REP_ACK).await;
    b.write_all(&cwire::encode_option(OPT_GO, &cwire::encode_go("", &[])))
        .await
        .unwrap();
    loop {
        let (reply, _) = option_reply(&mut b).await;
        if reply == REP_ACK {
            break;
        }
        assert_eq!(reply, REP_INFO);
    }
    (b, task)
}

async fn option_reply(b: &mut DuplexStream) -> (u32, Vec<u8>) {
    let mut h = [0u8; 20];
    step(b.read_exact(&mut h)).await.unwrap();
    let h = cwire::parse_option_reply_header(&h).unwrap();
    let mut data = vec![0u8; h.len as usize];
    b.read_exact(&mut data).await.unwrap();
    (h.reply, data)
}

async fn expect_reply(b: &mut DuplexStream, option: u32, want: u32) -> Vec<u8> {
    let (reply, data) = option_reply(b).await;
    assert_eq!(reply, want, "reply to {}", option_name(option));
    data
}

async fn request(b: &mut DuplexStream, command: u16, cookie: u64, offset: u64, len: u64) {
    let (h, n) = cwire::encode_request(
        &Request {
            flags: 0,
            command,
            cookie,
            offset,
            len,
        },
        false,
    );
    b.write_all(&h[..n]).await.unwrap();
}

/// Reads one structured chunk: (flags, type, cookie, payload).
async fn chunk(b: &mut DuplexStream) -> (u16, u16, u64, Vec<u8>) {
    let mut h = [0u8; 20];
    step(b.read_exact(&mut h)).await.unwrap();
    let cwire::ReplyHeader::Chunk {
        flags,
        kind,
        cookie,
        len,
        ..
    } = cwire::parse_reply_header(u32::from_be_bytes(h[..4].try_into().unwrap()), &h[4..]).unwrap()
    else {
        panic!("not a chunk");
    };
    let mut payload = vec![0u8; len as usize];
    b.read_exact(&mut payload).await.unwrap();
    (flags, kind, cookie, payload)
}

#[tokio::test]
async fn raw_writes_are_refused_with_eperm_and_bad_requests_with_einval() {
    let server = Server::new(Mem::new(), export(None)).unwrap();
    let (mut b, task) = raw(&server).await;
    // A write: its payload is consumed, the answer is EPERM, the session goes on.
    request(&mut b, CMD_WRITE, 1, 0, 4096).await;
    b.write_all(&[0x55; 4096]).await.unwrap();
    for (cookie, command) in [(2, CMD_TRIM), (3, CMD_WRITE_ZEROES)] {
        request(&mut b, command, cookie, 0, 4096).await;
    }
    let mut refused = Vec::new();
    for _ in 0..3 {
        let (flags, kind, cookie, payload) = chunk(&mut b).await;
        assert_eq!((flags, kind), (REPLY_FLAG_DONE, REPLY_TYPE_ERROR));
        let e = cwire::parse_error_chunk(kind, &payload).unwrap();
        assert_eq!(e.errno, EPERM);
        assert!(e.message.unwrap().contains("read-only"));
        refused.push(cookie);
    }
    refused.sort();
    assert_eq!(refused, vec![1, 2, 3]);
    // Past the end, length 0, too long, unknown command, status without a context: EINVAL.
    for (cookie, command, offset, len) in [
        (4, CMD_READ, SIZE - 100, 200),
        (5, CMD_READ, 0, 0),
        (6, CMD_READ, 0, u64::from(MAX_PAYLOAD) + 1),
        (7, 99, 0, 512),
        (8, CMD_BLOCK_STATUS, 0, 512),
        (9, CMD_CACHE, 0, 512),
    ] {
        request(&mut b, command, cookie, offset, len).await;
        let (_, kind, got, payload) = chunk(&mut b).await;
        assert_eq!((kind, got), (REPLY_TYPE_ERROR, cookie));
        assert_eq!(
            cwire::parse_error_chunk(kind, &payload).unwrap().errno,
            EINVAL,
            "cookie {cookie}"
        );
    }
    // Data still flows, as one OFFSET_DATA chunk.
    request(&mut b, CMD_READ, 10, 100, 1000).await;
    let (flags, kind, _, payload) = chunk(&mut b).await;
    assert_eq!((flags, kind), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA));
    assert_eq!(u64::from_be_bytes(payload[..8].try_into().unwrap()), 100);
    assert!(payload[8..] == image()[100..1100]);
    // A read across data and hole: a data chunk, then a hole chunk.
    request(&mut b, CMD_READ, 11, MIB - 512, 1024).await;
    let (flags, kind, _, payload) = chunk(&mut b).await;
    assert_eq!(
        (flags, kind, payload.len()),
        (0, REPLY_TYPE_OFFSET_DATA, 8 + 512)
    );
    let (flags, kind, _, payload) = chunk(&mut b).await;
    assert_eq!((flags, kind), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_HOLE));
    assert_eq!(cwire::parse_hole(&payload).unwrap(), (MIB, 512));
    // FLUSH, then DISC ends the session cleanly.
    request(&mut b, CMD_FLUSH, 12, 0, 0).await;
    let (flags, kind, cookie, _) = chunk(&mut b).await;
    assert_eq!(
        (flags, kind, cookie),
        (REPLY_FLAG_DONE, REPLY_TYPE_NONE, 12)
    );
    request(&mut b, CMD_DISC, 13, 0, 0).await;
    step(task).await.unwrap().unwrap();
}

#[tokio::test]
async fn options_are_answered_and_checked() {
    let server = Server::new(Mem::new(), export(None)).unwrap();
    let (a, mut b) = tokio::io::duplex(1 << 20);
    let s = server.clone();
    let task = tokio::spawn(async move { s.serve_connection(a).await });
    let mut greeting = [0u8; 18];
    b.read_exact(&mut greeting).await.unwrap();
    b.write_all(&FLAG_C_FIXED_NEWSTYLE.to_be_bytes())
        .await
        .unwrap();
    // LIST names the export with its description.
    b.write_all(&cwire::encode_option(OPT_LIST, &[]))
        .await
        .unwrap();
    let entry = expect_reply(&mut b, OPT_LIST, REP_SERVER).await;
    assert_eq!(
        cwire::parse_server(&entry).unwrap(),
        ("disk".into(), Some("a test disk".into()))
    );
    expect_reply(&mut b, OPT_LIST, REP_ACK).await;
    // SET_META_CONTEXT before STRUCTURED_REPLY is invalid; LIST_META_CONTEXT lists.
    let meta = cwire::encode_meta_context("disk", &[CONTEXT_BASE_ALLOCATION.into()]);
    b.write_all(&cwire::encode_option(OPT_SET_META_CONTEXT, &meta))
        .await
        .unwrap();
    expect_reply(&mut b, OPT_SET_META_CONTEXT, REP_ERR_INVALID).await;
    b.write_all(&cwire::encode_option(
        OPT_LIST_META_CONTEXT,
        &cwire::encode_meta_context("disk", &[]),
    ))
    .await
    .unwrap();
    let ctx = expect_reply(&mut b, OPT_LIST_META_CONTEXT, REP_META_CONTEXT).await;
    assert_eq!(
        cwire::parse_meta_context(&ctx).unwrap().1,
        CONTEXT_BASE_ALLOCATION
    );
    expect_reply(&mut b, OPT_LIST_META_CONTEXT, REP_ACK).await;
    // Unknown context names select nothing; unknown exports and options are refused.
    b.write_all(&cwire::encode_option(OPT_STRUCTURED_REPLY, &[]))
        .await
        .unwrap();
    expect_reply(&mut b, OPT_STRUCTURED_REPLY, REP_ACK).await;
    let meta = cwire::encode_meta_context("disk", &["qemu:dirty-bitmap:x".into()]);
    b.write_all(&cwire::encode_option(OPT_SET_META_CONTEXT, &meta))
        .await
        .unwrap();
    expect_reply(&mut b, OPT_SET_META_CONTEXT, REP_ACK).await;
    b.write_all(&cwire::encode_option(
        OPT_INFO,
        &cwire::encode_go("other", &[]),
    ))
    .await
    .unwrap();
    let m = expect_reply(&mut b, OPT_INFO, REP_ERR_UNKNOWN).await;
    assert!(String::from_utf8_lossy(&m).contains("'disk'"));
    for option in [OPT_EXTENDED_HEADERS, 77] {
        b.write_all(&cwire::encode_option(option, &[]))
            .await
            .unwrap();
        expect_reply(&mut b, option, REP_ERR_UNSUP).await;
    }
    b.write_all(&cwire::encode_option(OPT_STARTTLS, &[]))
        .await
        .unwrap();
    expect_reply(&mut b, OPT_STARTTLS, REP_ERR_POLICY).await;
    // Malformed option data is refused without ending the session.
    b.write_all(&cwire::encode_option(OPT_GO, &[0, 0, 0, 9, b'x']))
        .await
        .unwrap();
    expect_reply(&mut b, OPT_GO, REP_ERR_INVALID).await;
    // INFO answers size and flags (read-only, flush, multi-conn, DF).
    b.write_all(&cwire::encode_option(
        OPT_INFO,
        &cwire::encode_go("disk", &[INFO_NAME]),
    ))
    .await
    .unwrap();
    let mut seen = Vec::new();
    loop {
        let (reply, data) = option_reply(&mut b).await;
        if reply == REP_ACK {
            break;
        }
        seen.push(cwire::parse_info(&data).unwrap());
    }
    let flags =
        FLAG_HAS_FLAGS | FLAG_READ_ONLY | FLAG_SEND_FLUSH | FLAG_CAN_MULTI_CONN | FLAG_SEND_DF;
    assert!(
        seen.contains(&cwire::Info::Export { size: SIZE, flags }),
        "{seen:?}"
    );
    assert!(seen.contains(&cwire::Info::Name("disk".into())));
    // The old way in: NBD_OPT_EXPORT_NAME, then a simple-reply read.
    b.write_all(&cwire::encode_option(OPT_EXPORT_NAME, b"disk"))
        .await
        .unwrap();
    let mut answer = [0u8; 134];
    b.read_exact(&mut answer).await.unwrap();
    let (size, flags) = cwire::parse_export_name_reply(answer[..10].try_into().unwrap());
    assert_eq!(size, SIZE);
    assert_eq!(flags & FLAG_SEND_DF, 0);
    request(&mut b, CMD_READ, 1, 0, 16).await;
    let mut simple = [0u8; 16 + 16];
    b.read_exact(&mut simple).await.unwrap();
    assert_eq!(&simple[..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
    assert_eq!(&simple[16..], &image()[..16]);
    drop(b);
    step(task).await.unwrap().unwrap();
}

/// Feeds `bytes` after the greeting and returns how the session ended.
async fn session_on(bytes: Vec<u8>) -> Result<(), ExportError> {
    let server = Server::new(Mem::new(), export(None)).unwrap();
    let (a, mut b) = tokio::io::duplex(1 << 16);
    let task = tokio::spawn(async move { server.serve_connection(a).await });
    let mut greeting = [0u8; 18];
    b.read_exact(&mut greeting).await.unwrap();
    let _ = b.write_all(&bytes).await;
    // Drain what the server says until it hangs up.
    let mut sink = Vec::new();
    let _ = step(b.read_to_end(&mut sink)).await;
    step(task).await.unwrap()
}

#[tokio::test]
async fn clients_that_break_the_protocol_are_dropped() {
    let flags = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("unknown client flags", vec![0, 0, 1, 0]),
        ("bad option magic", [flags.clone(), vec![0; 16]].concat()),
        ("huge option", {
            let mut o = flags.clone();
            o.extend(IHAVEOPT.to_be_bytes());
            o.extend(OPT_GO.to_be_bytes());
            o.extend(u32::MAX.to_be_bytes());
            o
        }),
        (
            "unknown export by name",
            [
                flags.clone(),
                cwire::encode_option(OPT_EXPORT_NAME, b"nope"),
            ]
            .concat(),
        ),
    ];
    for (what, bytes) in cases {
        match session_on(bytes).await {
            Err(ExportError::Client(m)) => eprintln!("{what}: {m}"),
            other => panic!("{what}: expected a protocol error, got {other:?}"),
        }
    }
    // In transmission: garbage, a write too big to read, a request cut short.
    let server = Server::new(Mem::new(), export(None)).unwrap();
    for (what, tail) in [
        ("garbage", vec![0xff; 28]),
        ("huge write", {
            let (h, n) = cwire::encode_request(
                &Request {
                    flags: 0,
                    command: CMD_WRITE,
                    cookie: 1,
                    offset: 0,
                    len: u64::from(u32::MAX),
                },
                false,
            );
            h[..n].to_vec()
        }),
    ] {
        let (mut b, task) = raw(&server).await;
        b.write_all(&tail).await.unwrap();
        let result = step(task).await.unwrap();
        assert!(
            matches!(result, Err(ExportError::Client(_))),
            "{what}: {result:?}"
        );
    }
    let (mut b, task) = raw(&server).await;
    b.write_all(&[0x25, 0x60]).await.unwrap();
    drop(b);
    assert!(step(task).await.unwrap().unwrap_err().is_client_gone());
}

#[tokio::test]
async fn requests_in_flight_are_bounded() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut mem = Mem::new();
    mem.gate = Some(gate.clone());
    let config = ExportConfig {
        max_in_flight: 4,
        ..export(None)
    };
    let (client, task, server) = pair(mem, config, client_config()).await;
    let client = client.unwrap();
    let reads: Vec<_> = (0..32u64)
        .map(|i| {
            let c = client.clone();
            tokio::spawn(async move { c.read(i * 4096, vec![0u8; 4096]).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.backend().in_flight.load(Ordering::SeqCst), 4);
    gate.add_permits(1000);
    let want = image();
    for (i, r) in reads.into_iter().enumerate() {
        let got = step(r).await.unwrap().unwrap();
        assert!(got[..] == want[i * 4096..(i + 1) * 4096]);
    }
    assert_eq!(server.backend().most_in_flight.load(Ordering::SeqCst), 4);
    drop(client);
    step(task).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_silent_client_is_dropped_after_the_handshake_timeout() {
    let server = Server::new(
        Mem::new(),
        ExportConfig {
            handshake_timeout: Duration::from_millis(200),
            ..export(None)
        },
    )
    .unwrap();
    let (a, _b) = tokio::io::duplex(1 << 16);
    let result = server.serve_connection(a).await;
    assert!(
        matches!(result, Err(ExportError::HandshakeTimeout(_))),
        "{result:?}"
    );
}

#[tokio::test]
async fn many_clients_at_once_over_tcp_while_one_misbehaves() {
    let server = Server::new(Mem::new(), export(None)).unwrap();
    let listener = Listener::bind(&Address::Tcp {
        host: "127.0.0.1".into(),
        port: 0,
    })
    .await
    .unwrap();
    let address = listener.local_address().unwrap();
    let errors = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let seen = errors.clone();
    let s = server.clone();
    let serving = tokio::spawn(async move {
        s.serve(
            listener,
            async {
                let _ = stopped.await;
            },
            move |e| seen.lock().push(e.to_string()),
        )
        .await;
    });
    // A client that sends garbage right after the greeting.
    let Address::Tcp { port, .. } = address.clone() else {
        unreachable!()
    };
    let mut bad = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut greeting = [0u8; 18];
    bad.read_exact(&mut greeting).await.unwrap();
    bad.write_all(&[&[0u8, 0, 0, 1][..], &[0xde; 16]].concat())
        .await
        .unwrap();
    let want = image();
    let clients: Vec<_> = (0..8u64)
        .map(|i| {
            let address = address.clone();
            tokio::spawn(async move {
                let client = Client::connect(&address, &client_config()).await.unwrap();
                let mut got = Vec::new();
                for offset in (0..SIZE).step_by(1 << 20) {
                    let off = (offset + i * 4096) % SIZE;
                    let len = (1u64 << 20).min(SIZE - off) as usize;
                    got.push((off, client.read(off, vec![0u8; len]).await.unwrap()));
                }
                client.disconnect().await.unwrap();
                got
            })
        })
        .collect();
    for c in clients {
        for (off, bytes) in step(c).await.unwrap() {
            assert!(bytes[..] == want[off as usize..off as usize + bytes.len()]);
        }
    }
    let mut rest = Vec::new();
    let _ = step(bad.read_to_end(&mut rest)).await;
    let _ = stop.send(());
    step(serving).await.unwrap();
    let errors = errors.lock();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("IHAVEOPT"), "{errors:?}");
}
