//! The client against a scripted fake server on an in-memory pipe: the happy paths the
//! real servers also cover, and every way a malicious or broken server can misbehave,
//! each of which must end in a clear error, never a panic or a hang.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use crate::proto::*;
use crate::{Client, Config, Error, ServerError, ZeroFlags};

/// Upper bound for any single test step: a hang fails the test instead of blocking CI.
const STEP: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy)]
struct Req {
    flags: u16,
    command: u16,
    cookie: u64,
    offset: u64,
    len: u64,
}

/// Options of the scripted handshake.
#[derive(Clone)]
struct Setup {
    size: u64,
    flags: u16,
    extended: bool,
    structured: bool,
    contexts: Vec<(u32, &'static str)>,
    block: Option<(u32, u32, u32)>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            size: 1 << 20,
            flags: FLAG_HAS_FLAGS
                | FLAG_SEND_FLUSH
                | FLAG_SEND_FUA
                | FLAG_SEND_TRIM
                | FLAG_SEND_WRITE_ZEROES
                | FLAG_SEND_FAST_ZERO
                | FLAG_CAN_MULTI_CONN,
            extended: false,
            structured: true,
            contexts: vec![(7, CONTEXT_BASE_ALLOCATION)],
            block: None,
        }
    }
}

struct Fake {
    s: DuplexStream,
    extended: bool,
}

impl Fake {
    async fn greet(s: &mut DuplexStream, flags: u16) -> u32 {
        s.write_all(&NBDMAGIC.to_be_bytes()).await.unwrap();
        s.write_all(&IHAVEOPT.to_be_bytes()).await.unwrap();
        s.write_all(&flags.to_be_bytes()).await.unwrap();
        s.read_u32().await.unwrap()
    }

    async fn read_option(&mut self) -> (u32, Vec<u8>) {
        assert_eq!(self.s.read_u64().await.unwrap(), IHAVEOPT);
        let opt = self.s.read_u32().await.unwrap();
        let len = self.s.read_u32().await.unwrap();
        let mut data = vec![0; len as usize];
        self.s.read_exact(&mut data).await.unwrap();
        (opt, data)
    }

    async fn reply(&mut self, opt: u32, rep: u32, data: &[u8]) {
        let mut out = REPLY_MAGIC.to_be_bytes().to_vec();
        out.extend_from_slice(&opt.to_be_bytes());
        out.extend_from_slice(&rep.to_be_bytes());
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
        self.s.write_all(&out).await.unwrap();
    }

    /// Greets and answers options until NBD_OPT_GO succeeds.
    async fn serve_handshake(s: DuplexStream, setup: &Setup) -> Fake {
        let mut fake = Fake { s, extended: false };
        Self::greet(&mut fake.s, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).await;
        loop {
            let (opt, data) = fake.read_option().await;
            match opt {
                OPT_EXTENDED_HEADERS if setup.extended => {
                    fake.extended = true;
                    fake.reply(opt, REP_ACK, &[]).await;
                }
                OPT_STRUCTURED_REPLY if setup.structured => fake.reply(opt, REP_ACK, &[]).await,
                OPT_SET_META_CONTEXT => {
                    for (id, name) in &setup.contexts {
                        let mut p = id.to_be_bytes().to_vec();
                        p.extend_from_slice(name.as_bytes());
                        fake.reply(opt, REP_META_CONTEXT, &p).await;
                    }
                    fake.reply(opt, REP_ACK, &[]).await;
                }
                OPT_GO => {
                    let name_len = u32::from_be_bytes(data[0..4].try_into().unwrap());
                    assert!(name_len as usize + 6 <= data.len());
                    let mut p = INFO_EXPORT.to_be_bytes().to_vec();
                    p.extend_from_slice(&setup.size.to_be_bytes());
                    p.extend_from_slice(&setup.flags.to_be_bytes());
                    fake.reply(opt, REP_INFO, &p).await;
                    if let Some((a, b, c)) = setup.block {
                        let mut p = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
                        for v in [a, b, c] {
                            p.extend_from_slice(&v.to_be_bytes());
                        }
                        fake.reply(opt, REP_INFO, &p).await;
                    }
                    fake.reply(opt, REP_ACK, &[]).await;
                    return fake;
                }
                _ => fake.reply(opt, REP_ERR_UNSUP, &[]).await,
            }
        }
    }

    async fn read_request(&mut self) -> (Req, Vec<u8>) {
        let magic = self.s.read_u32().await.unwrap();
        let flags = self.s.read_u16().await.unwrap();
        let command = self.s.read_u16().await.unwrap();
        let cookie = self.s.read_u64().await.unwrap();
        let offset = self.s.read_u64().await.unwrap();
        let len = if magic == EXTENDED_REQUEST_MAGIC {
            self.s.read_u64().await.unwrap()
        } else {
            assert_eq!(magic, REQUEST_MAGIC);
            u64::from(self.s.read_u32().await.unwrap())
        };
        let mut payload = Vec::new();
        if command == CMD_WRITE {
            payload.resize(len as usize, 0);
            self.s.read_exact(&mut payload).await.unwrap();
        }
        (
            Req {
                flags,
                command,
                cookie,
                offset,
                len,
            },
            payload,
        )
    }

    async fn simple(&mut self, cookie: u64, error: u32, data: &[u8]) {
        let mut out = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
        out.extend_from_slice(&error.to_be_bytes());
        out.extend_from_slice(&cookie.to_be_bytes());
        out.extend_from_slice(data);
        self.s.write_all(&out).await.unwrap();
    }

    async fn chunk(&mut self, req: &Req, flags: u16, kind: u16, payload: &[u8]) {
        let mut out = Vec::new();
        if self.extended {
            out.extend_from_slice(&EXTENDED_REPLY_MAGIC.to_be_bytes());
            out.extend_from_slice(&flags.to_be_bytes());
            out.extend_from_slice(&kind.to_be_bytes());
            out.extend_from_slice(&req.cookie.to_be_bytes());
            out.extend_from_slice(&req.offset.to_be_bytes());
            out.extend_from_slice(&(payload.len() as u64).to_be_bytes());
        } else {
            out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
            out.extend_from_slice(&flags.to_be_bytes());
            out.extend_from_slice(&kind.to_be_bytes());
            out.extend_from_slice(&req.cookie.to_be_bytes());
            out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        }
        out.extend_from_slice(payload);
        self.s.write_all(&out).await.unwrap();
    }

    async fn data(&mut self, req: &Req, done: bool, offset: u64, bytes: &[u8]) {
        let mut p = offset.to_be_bytes().to_vec();
        p.extend_from_slice(bytes);
        let flags = if done { REPLY_FLAG_DONE } else { 0 };
        self.chunk(req, flags, REPLY_TYPE_OFFSET_DATA, &p).await;
    }

    async fn hole(&mut self, req: &Req, done: bool, offset: u64, len: u32) {
        let mut p = offset.to_be_bytes().to_vec();
        p.extend_from_slice(&len.to_be_bytes());
        let flags = if done { REPLY_FLAG_DONE } else { 0 };
        self.chunk(req, flags, REPLY_TYPE_OFFSET_HOLE, &p).await;
    }

    async fn done(&mut self, req: &Req) {
        self.chunk(req, REPLY_FLAG_DONE, REPLY_TYPE_NONE, &[]).await;
    }

    async fn error(&mut self, req: &Req, errno: u32, msg: &str, offset: Option<u64>) {
        let mut p = errno.to_be_bytes().to_vec();
        p.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        p.extend_from_slice(msg.as_bytes());
        let kind = match offset {
            Some(o) => {
                p.extend_from_slice(&o.to_be_bytes());
                REPLY_TYPE_ERROR_OFFSET
            }
            None => REPLY_TYPE_ERROR,
        };
        self.chunk(req, REPLY_FLAG_DONE, kind, &p).await;
    }

    async fn status(&mut self, req: &Req, id: u32, extents: &[(u64, u64)]) {
        let mut p = id.to_be_bytes().to_vec();
        let kind = if self.extended {
            p.extend_from_slice(&(extents.len() as u32).to_be_bytes());
            for (len, flags) in extents {
                p.extend_from_slice(&len.to_be_bytes());
                p.extend_from_slice(&flags.to_be_bytes());
            }
            REPLY_TYPE_BLOCK_STATUS_EXT
        } else {
            for (len, flags) in extents {
                p.extend_from_slice(&(*len as u32).to_be_bytes());
                p.extend_from_slice(&(*flags as u32).to_be_bytes());
            }
            REPLY_TYPE_BLOCK_STATUS
        };
        self.chunk(req, REPLY_FLAG_DONE, kind, &p).await;
    }
}

fn config() -> Config {
    Config {
        connect_timeout: Duration::from_secs(5),
        request_timeout: Some(Duration::from_secs(5)),
        ..Config::default()
    }
}

/// A connected client and the fake server's end, after the scripted handshake.
async fn pair(setup: Setup, config: Config) -> (Client, Fake) {
    let (c, s) = tokio::io::duplex(1 << 20);
    let server = tokio::spawn(async move { Fake::serve_handshake(s, &setup).await });
    let client = tokio::time::timeout(STEP, Client::handshake(c, &config))
        .await
        .expect("handshake hung")
        .expect("handshake failed");
    (client, server.await.unwrap())
}

async fn step<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(STEP, f).await.expect("step hung")
}

fn protocol_message(err: &Error) -> &str {
    match err {
        Error::Protocol(m) => m,
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

#[tokio::test]
async fn happy_path_reads_holes_writes_and_status() {
    let (client, mut fake) = pair(Setup::default(), config()).await;
    assert_eq!(client.size(), 1 << 20);
    assert!(client.info().structured_replies);
    assert!(!client.info().extended_headers);
    assert!(client.info().can_extents());

    let read = tokio::spawn({
        let c = client.clone();
        async move { c.read(4096, vec![0xffu8; 8192]).await }
    });
    let (req, _) = step(fake.read_request()).await;
    assert_eq!((req.command, req.offset, req.len), (CMD_READ, 4096, 8192));
    // Out of order: the second half first, then a hole for the first half.
    fake.data(&req, false, 8192, &[0xab; 4096]).await;
    fake.hole(&req, false, 4096, 4096).await;
    fake.done(&req).await;
    let buf = step(read).await.unwrap().unwrap();
    assert!(buf[..4096].iter().all(|&b| b == 0), "hole must be zeroed");
    assert!(buf[4096..].iter().all(|&b| b == 0xab));

    let write = tokio::spawn({
        let c = client.clone();
        async move { c.write(0, vec![1u8; 512], true).await }
    });
    let (req, payload) = step(fake.read_request()).await;
    assert_eq!(req.command, CMD_WRITE);
    assert_eq!(req.flags, CMD_FLAG_FUA);
    assert_eq!(payload, vec![1u8; 512]);
    fake.simple(req.cookie, 0, &[]).await;
    step(write).await.unwrap().unwrap();

    let zero = tokio::spawn({
        let c = client.clone();
        async move {
            c.write_zeroes(
                0,
                65536,
                ZeroFlags {
                    no_hole: true,
                    fast: true,
                    fua: false,
                },
            )
            .await
        }
    });
    let (req, _) = step(fake.read_request()).await;
    assert_eq!(req.command, CMD_WRITE_ZEROES);
    assert_eq!(req.flags, CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO);
    fake.done(&req).await;
    step(zero).await.unwrap().unwrap();

    let status = tokio::spawn({
        let c = client.clone();
        async move { c.block_status(0, 1 << 20).await }
    });
    let (req, _) = step(fake.read_request()).await;
    assert_eq!(req.command, CMD_BLOCK_STATUS);
    fake.status(&req, 7, &[(65536, 3), (1 << 20, 0)]).await;
    let status = step(status).await.unwrap().unwrap();
    let base = status.context(CONTEXT_BASE_ALLOCATION).unwrap();
    assert_eq!(base.len(), 2);
    assert_eq!((base[0].offset, base[0].len, base[0].flags), (0, 65536, 3));
    assert_eq!(
        (base[1].offset, base[1].len, base[1].flags),
        (65536, (1 << 20) - 65536, 0)
    );

    let flush = tokio::spawn({
        let c = client.clone();
        async move { c.flush().await }
    });
    let (req, _) = step(fake.read_request()).await;
    assert_eq!(req.command, CMD_FLUSH);
    fake.done(&req).await;
    step(flush).await.unwrap().unwrap();

    let disc = tokio::spawn({
        let c = client.clone();
        async move { c.disconnect().await }
    });
    let (req, _) = step(fake.read_request()).await;
    assert_eq!(req.command, CMD_DISC);
    drop(fake);
    step(disc).await.unwrap().unwrap();
    assert!(matches!(
        step(client.read(0, vec![0u8; 512])).await,
        Err(Error::Closed)
    ));
}

#[tokio::test]
async fn many_requests_in_flight_answered_in_reverse() {
    let (client, mut fake) = pair(Setup::default(), config()).await;
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let c = client.clone();
        tasks.push(tokio::spawn(async move {
            c.read(i * 4096, vec![0u8; 4096]).await
        }));
    }
    let mut reqs = Vec::new();
    for _ in 0..16 {
        reqs.push(step(fake.read_request()).await.0);
    }
    for req in reqs.iter().rev() {
        let fill = (req.offset / 4096) as u8;
        fake.data(req, true, req.offset, &vec![fill; 4096]).await;
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let buf = step(t).await.unwrap().unwrap();
        assert!(buf.iter().all(|&b| b == i as u8), "request {i}");
    }
}

#[tokio::test]
async fn in_flight_is_bounded() {
    let config = Config {
        max_in_flight: 2,
        ..config()
    };
    let (client, mut fake) = pair(Setup::default(), config).await;
    let mut tasks = Vec::new();
    for i in 0..3u64 {
        let c = client.clone();
        tasks.push(tokio::spawn(async move {
            c.read(i * 512, vec![0u8; 512]).await
        }));
    }
    let a = step(fake.read_request()).await.0;
    let b = step(fake.read_request()).await.0;
    // The third request must wait for a slot.
    let third = tokio::time::timeout(Duration::from_millis(200), fake.read_request()).await;
    assert!(third.is_err(), "a third request was sent with 2 allowed");
    fake.data(&a, true, a.offset, &[1; 512]).await;
    let c = step(fake.read_request()).await.0;
    fake.data(&b, true, b.offset, &[1; 512]).await;
    fake.data(&c, true, c.offset, &[1; 512]).await;
    for t in tasks {
        step(t).await.unwrap().unwrap();
    }
}

/// Runs one read against a server that answers with `misbehave`, and returns the error.
async fn read_error<F, Fut>(setup: Setup, misbehave: F) -> (Error, Client)
where
    F: FnOnce(Fake, Req) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Fake> + Send,
{
    let (client, mut fake) = pair(setup, config()).await;
    let c = client.clone();
    let read = tokio::spawn(async move { c.read(4096, vec![0u8; 4096]).await });
    let (req, _) = step(fake.read_request()).await;
    let server = tokio::spawn(async move {
        let fake = misbehave(fake, req).await;
        // Keep the stream open: the client must not need EOF to notice.
        tokio::time::sleep(STEP).await;
        drop(fake);
    });
    let err = step(read).await.unwrap().unwrap_err();
    server.abort();
    (err, client)
}

#[tokio::test]
async fn unknown_cookie_is_a_protocol_error_and_fails_the_connection() {
    let (err, client) = read_error(Setup::default(), |mut f, req| async move {
        let wrong = Req {
            cookie: req.cookie + 1000,
            ..req
        };
        f.data(&wrong, true, req.offset, &[0; 4096]).await;
        f
    })
    .await;
    assert!(protocol_message(&err).contains("cookie"), "{err}");
    // Later requests fail with the same cause, immediately.
    let later = step(client.read(0, vec![0u8; 512])).await.unwrap_err();
    assert!(protocol_message(&later).contains("cookie"), "{later}");
}

#[tokio::test]
async fn chunk_outside_the_request_is_rejected() {
    let (err, _) = read_error(Setup::default(), |mut f, req| async move {
        f.data(&req, true, req.offset + 4000, &[0; 200]).await;
        f
    })
    .await;
    assert!(protocol_message(&err).contains("outside"), "{err}");
    let (err, _) = read_error(Setup::default(), |mut f, req| async move {
        f.hole(&req, true, 0, 4096).await;
        f
    })
    .await;
    assert!(protocol_message(&err).contains("outside"), "{err}");
}

#[tokio::test]
async fn oversized_lengths_are_rejected_before_allocation() {
    let (err, _) = read_error(Setup::default(), |mut f, req| async move {
        // Announce a 2 GiB data chunk without sending it.
        let mut out = STRUCTURED_REPLY_MAGIC.to_be_bytes().to_vec();
        out.extend_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
        out.extend_from_slice(&REPLY_TYPE_OFFSET_DATA.to_be_bytes());
        out.extend_from_slice(&req.cookie.to_be_bytes());
        out.extend_from_slice(&(1u32 << 31).to_be_bytes());
        f.s.write_all(&out).await.unwrap();
        f
    })
    .await;
    assert!(protocol_message(&err).contains("larger than"), "{err}");

    let (err, _) = read_error(Setup::default(), |mut f, req| async move {
        let mut out = STRUCTURED_REPLY_MAGIC.to_be_bytes().to_vec();
        out.extend_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
        out.extend_from_slice(&REPLY_TYPE_ERROR.to_be_bytes());
        out.extend_from_slice(&req.cookie.to_be_bytes());
        out.extend_from_slice(&u32::MAX.to_be_bytes());
        f.s.write_all(&out).await.unwrap();
        f
    })
    .await;
    assert!(protocol_message(&err).contains("error chunk"), "{err}");

    // Extended headers: a 64-bit length.
    let setup = Setup {
        extended: true,
        ..Setup::default()
    };
    let (err, _) = read_error(setup, |mut f, req| async move {
        let mut out = EXTENDED_REPLY_MAGIC.to_be_bytes().to_vec();
        out.extend_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
        out.extend_from_slice(&REPLY_TYPE_OFFSET_DATA.to_be_bytes());
        out.extend_from_slice(&req.cookie.to_be_bytes());
        out.extend_from_slice(&req.offset.to_be_bytes());
        out.extend_from_slice(&u64::MAX.to_be_bytes());
        f.s.write_all(&out).await.unwrap();
        f
    })
    .await;
    assert!(protocol_message(&err).contains("larger than"), "{err}");
}

#[tokio::test]
async fn garbage_is_a_protocol_error() {
    let (err, _) = read_error(Setup::default(), |mut f, _| async move {
        f.s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            .await
            .unwrap();
        f
    })
    .await;
    assert!(protocol_message(&err).contains("bad reply magic"), "{err}");
}

#[tokio::test]
async fn disconnect_mid_reply_and_between_replies() {
    let (err, _) = read_error(Setup::default(), |mut f, req| async move {
        let mut p = req.offset.to_be_bytes().to_vec();
        p.extend_from_slice(&[0; 4096]);
        let mut out = STRUCTURED_REPLY_MAGIC.to_be_bytes().to_vec();
        out.extend_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
        out.extend_from_slice(&REPLY_TYPE_OFFSET_DATA.to_be_bytes());
        out.extend_from_slice(&req.cookie.to_be_bytes());
        out.extend_from_slice(&(p.len() as u32).to_be_bytes());
        out.extend_from_slice(&p[..100]);
        f.s.write_all(&out).await.unwrap();
        // Close the connection half way through the chunk.
        let (c, _) = tokio::io::duplex(1);
        Fake {
            s: c,
            extended: false,
        }
    })
    .await;
    assert!(
        matches!(&err, Error::Disconnected(m) if m.contains("middle")),
        "{err:?}"
    );

    let (client, mut fake) = pair(Setup::default(), config()).await;
    let c = client.clone();
    let read = tokio::spawn(async move { c.read(0, vec![0u8; 512]).await });
    step(fake.read_request()).await;
    drop(fake);
    let err = step(read).await.unwrap().unwrap_err();
    assert!(
        matches!(&err, Error::Disconnected(m) if m.contains("waiting")),
        "{err:?}"
    );
}

#[tokio::test]
async fn server_errors_name_errno_message_and_offset_and_keep_the_connection() {
    let (client, mut fake) = pair(Setup::default(), config()).await;
    let c = client.clone();
    let write = tokio::spawn(async move { c.write(8192, vec![0u8; 4096], false).await });
    let (req, _) = step(fake.read_request()).await;
    fake.error(&req, EIO, "disk on fire", Some(10240)).await;
    let err = step(write).await.unwrap().unwrap_err();
    assert_eq!(
        err.server_error(),
        Some(&ServerError {
            errno: EIO,
            message: Some("disk on fire".into()),
            offset: Some(10240)
        })
    );
    assert!(err.to_string().contains("EIO"), "{err}");

    // A simple error reply too.
    let c = client.clone();
    let write = tokio::spawn(async move { c.write(0, vec![0u8; 512], false).await });
    let (req, _) = step(fake.read_request()).await;
    fake.simple(req.cookie, ENOSPC, &[]).await;
    let err = step(write).await.unwrap().unwrap_err();
    assert_eq!(err.server_error().map(|e| e.errno), Some(ENOSPC));

    // The connection is still good.
    let c = client.clone();
    let flush = tokio::spawn(async move { c.flush().await });
    let (req, _) = step(fake.read_request()).await;
    fake.done(&req).await;
    step(flush).await.unwrap().unwrap();
}

#[tokio::test]
async fn short_and_overlapping_reads_are_protocol_errors() {
    let (err, _) = read_error(Setup::default(), |mut f, req| async move {
        f.data(&req, true, req.offset, &[0; 100]).await;
        f
    })
    .await;
    assert!(protocol_message(&err).contains("only 100 bytes"), "{err}");
    let (err, _) = read_error(Setup::default(), |mut f, req| async move {
        f.data(&req, false, req.offset, &[0; 2048]).await;
        f.data(&req, true, req.offset + 1024, &[0; 3072]).await;
        f
    })
    .await;
    assert!(protocol_message(&err).contains("overlaps"), "{err}");
}

#[tokio::test]
async fn unexpected_chunks_are_protocol_errors() {
    let (err, _) = read_error(Setup::default(), |mut f, req| async move {
        f.status(&req, 7, &[(4096, 0)]).await;
        f
    })
    .await;
    assert!(protocol_message(&err).contains("unexpected chunk"), "{err}");
    let (err, _) = read_error(Setup::default(), |mut f, req| async move {
        f.chunk(&req, REPLY_FLAG_DONE, 99, &[]).await;
        f
    })
    .await;
    assert!(protocol_message(&err).contains("unknown chunk"), "{err}");
    let (err, _) = read_error(Setup::default(), |mut f, req| async move {
        f.simple(req.cookie, 0, &[0; 4096]).await;
        f
    })
    .await;
    assert!(protocol_message(&err).contains("simple"), "{err}");
}

#[tokio::test]
async fn extended_headers_block_status_and_offset_check() {
    let setup = Setup {
        extended: true,
        size: 1 << 40,
        ..Setup::default()
    };
    let (client, mut fake) = pair(setup.clone(), config()).await;
    assert!(client.info().extended_headers);
    let c = client.clone();
    // A 64-bit effect length goes out in one request.
    let status = tokio::spawn(async move { c.block_status(0, 1 << 40).await });
    let (req, _) = step(fake.read_request()).await;
    assert_eq!(req.len, 1 << 40);
    fake.status(&req, 7, &[(1 << 36, 3), (1 << 40, 0)]).await;
    let status = step(status).await.unwrap().unwrap();
    let base = status.context(CONTEXT_BASE_ALLOCATION).unwrap();
    assert_eq!(base[0].len, 1 << 36);
    assert_eq!(base[1].end(), 1 << 40);

    let (err, _) = read_error(setup, |mut f, req| async move {
        let moved = Req {
            offset: req.offset + 512,
            ..req
        };
        f.chunk(&moved, REPLY_FLAG_DONE, REPLY_TYPE_NONE, &[]).await;
        f
    })
    .await;
    assert!(protocol_message(&err).contains("names offset"), "{err}");
}

#[tokio::test]
async fn block_status_for_an_unselected_context_is_rejected() {
    let (client, mut fake) = pair(Setup::default(), config()).await;
    let c = client.clone();
    let status = tokio::spawn(async move { c.block_status(0, 4096).await });
    let (req, _) = step(fake.read_request()).await;
    fake.status(&req, 8, &[(4096, 0)]).await;
    let err = step(status).await.unwrap().unwrap_err();
    assert!(protocol_message(&err).contains("not selected"), "{err}");
}

#[tokio::test]
async fn simple_replies_only() {
    let setup = Setup {
        structured: false,
        ..Setup::default()
    };
    let (client, mut fake) = pair(setup, config()).await;
    assert!(!client.info().structured_replies);
    assert!(client.info().contexts.is_empty());
    let c = client.clone();
    let read = tokio::spawn(async move { c.read(512, vec![0u8; 1024]).await });
    let (req, _) = step(fake.read_request()).await;
    fake.simple(req.cookie, 0, &[9u8; 1024]).await;
    assert_eq!(step(read).await.unwrap().unwrap(), vec![9u8; 1024]);
    assert!(matches!(
        client.block_status(0, 512).await,
        Err(Error::Unsupported(_))
    ));
}

#[tokio::test]
async fn block_size_constraints_are_enforced_locally() {
    let setup = Setup {
        block: Some((4096, 65536, 65536)),
        ..Setup::default()
    };
    let (client, _fake) = pair(setup, config()).await;
    assert_eq!(client.info().block_size.minimum, 4096);
    for (offset, len) in [(512u64, 4096usize), (0, 1000), (0, 131072)] {
        let err = step(client.read(offset, vec![0u8; len])).await.unwrap_err();
        assert!(matches!(err, Error::InvalidRequest(_)), "{err:?}");
    }
    let err = step(client.read(1 << 20, vec![0u8; 4096]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("past the end"), "{err}");
}

#[tokio::test]
async fn request_timeout_fails_the_connection() {
    let config = Config {
        request_timeout: Some(Duration::from_millis(300)),
        ..config()
    };
    let (client, mut fake) = pair(Setup::default(), config).await;
    let c = client.clone();
    let read = tokio::spawn(async move { c.read(0, vec![0u8; 512]).await });
    step(fake.read_request()).await;
    let err = step(read).await.unwrap().unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert!(err.to_string().contains("NBD_CMD_READ"), "{err}");
    assert!(matches!(client.failure(), Some(Error::Timeout { .. })));
}

#[tokio::test]
async fn a_cancelled_read_does_not_disturb_the_connection() {
    let (client, mut fake) = pair(Setup::default(), config()).await;
    let c = client.clone();
    let read = tokio::spawn(async move { c.read(0, vec![0u8; 4096]).await });
    let (req, _) = step(fake.read_request()).await;
    read.abort();
    let _ = read.await;
    fake.data(&req, true, 0, &[5; 4096]).await;
    let c = client.clone();
    let again = tokio::spawn(async move { c.read(0, vec![0u8; 512]).await });
    let (req, _) = step(fake.read_request()).await;
    fake.data(&req, true, 0, &[6; 512]).await;
    assert_eq!(step(again).await.unwrap().unwrap(), vec![6u8; 512]);
}

async fn handshake_error(script: impl FnOnce(Fake) -> tokio::task::JoinHandle<()>) -> Error {
    let (c, s) = tokio::io::duplex(1 << 16);
    let server = script(Fake { s, extended: false });
    let err = step(Client::handshake(c, &config())).await.unwrap_err();
    server.abort();
    err
}

#[tokio::test]
async fn missing_export_lists_what_the_server_has() {
    let err = handshake_error(|mut f| {
        tokio::spawn(async move {
            Fake::greet(&mut f.s, FLAG_FIXED_NEWSTYLE).await;
            loop {
                let (opt, _) = f.read_option().await;
                match opt {
                    OPT_GO => f.reply(opt, REP_ERR_UNKNOWN, b"no such export").await,
                    OPT_LIST => {
                        for name in ["alpha", "beta"] {
                            let mut p = (name.len() as u32).to_be_bytes().to_vec();
                            p.extend_from_slice(name.as_bytes());
                            f.reply(opt, REP_SERVER, &p).await;
                        }
                        f.reply(opt, REP_ACK, &[]).await;
                    }
                    OPT_ABORT => return,
                    OPT_STRUCTURED_REPLY => f.reply(opt, REP_ACK, &[]).await,
                    _ => f.reply(opt, REP_ERR_UNSUP, &[]).await,
                }
            }
        })
    })
    .await;
    assert_eq!(
        err.to_string(),
        "no such export ''; the server has: 'alpha', 'beta'"
    );
}

#[tokio::test]
async fn tls_required_is_explained() {
    let err = handshake_error(|mut f| {
        tokio::spawn(async move {
            Fake::greet(&mut f.s, FLAG_FIXED_NEWSTYLE).await;
            loop {
                let (opt, _) = f.read_option().await;
                if opt == OPT_ABORT {
                    return;
                }
                f.reply(opt, REP_ERR_TLS_REQD, b"TLS first").await;
            }
        })
    })
    .await;
    assert!(matches!(err, Error::TlsRequired(_)), "{err:?}");
    assert!(err.to_string().contains("nbds://"), "{err}");
}

#[tokio::test]
async fn handshake_garbage_and_oversized_option_replies() {
    let err = handshake_error(|mut f| {
        tokio::spawn(async move {
            f.s.write_all(b"SSH-2.0-OpenSSH_9.2\r\n").await.unwrap();
            tokio::time::sleep(STEP).await;
        })
    })
    .await;
    assert!(
        protocol_message(&err).contains("not an NBD server"),
        "{err}"
    );

    let err = handshake_error(|mut f| {
        tokio::spawn(async move {
            Fake::greet(&mut f.s, FLAG_FIXED_NEWSTYLE).await;
            let (opt, _) = f.read_option().await;
            let mut out = REPLY_MAGIC.to_be_bytes().to_vec();
            out.extend_from_slice(&opt.to_be_bytes());
            out.extend_from_slice(&REP_INFO.to_be_bytes());
            out.extend_from_slice(&(1u32 << 30).to_be_bytes());
            f.s.write_all(&out).await.unwrap();
            tokio::time::sleep(STEP).await;
        })
    })
    .await;
    assert!(protocol_message(&err).contains("more than"), "{err}");

    let err = handshake_error(|mut f| {
        tokio::spawn(async move {
            Fake::greet(&mut f.s, FLAG_FIXED_NEWSTYLE).await;
            let (opt, _) = f.read_option().await;
            f.reply(opt + 1, REP_ACK, &[]).await;
            tokio::time::sleep(STEP).await;
        })
    })
    .await;
    assert!(protocol_message(&err).contains("while"), "{err}");

    let err = handshake_error(|mut f| {
        tokio::spawn(async move {
            Fake::greet(&mut f.s, 0).await;
        })
    })
    .await;
    assert!(matches!(err, Error::Unsupported(_)), "{err:?}");
}

#[tokio::test]
async fn silent_server_times_out_the_handshake() {
    let (c, _s) = tokio::io::duplex(1 << 16);
    let config = Config {
        connect_timeout: Duration::from_millis(200),
        ..config()
    };
    let err = step(Client::handshake(c, &config)).await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
}

#[tokio::test]
async fn export_name_fallback_when_go_is_unsupported() {
    let (c, s) = tokio::io::duplex(1 << 16);
    let server = tokio::spawn(async move {
        let mut f = Fake { s, extended: false };
        Fake::greet(&mut f.s, FLAG_FIXED_NEWSTYLE).await;
        loop {
            let (opt, data) = f.read_option().await;
            if opt == OPT_EXPORT_NAME {
                assert_eq!(data, b"old");
                f.s.write_all(&(8192u64).to_be_bytes()).await.unwrap();
                f.s.write_all(&(FLAG_HAS_FLAGS | FLAG_READ_ONLY).to_be_bytes())
                    .await
                    .unwrap();
                f.s.write_all(&[0u8; 124]).await.unwrap();
                return f;
            }
            f.reply(opt, REP_ERR_UNSUP, &[]).await;
        }
    });
    let config = Config {
        export: "old".into(),
        ..config()
    };
    let client = step(Client::handshake(c, &config)).await.unwrap();
    let _f = server.await.unwrap();
    assert_eq!(client.size(), 8192);
    assert!(client.info().read_only());
    let err = client.write(0, vec![0u8; 512], false).await.unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
}

#[tokio::test]
async fn dropping_the_client_disconnects_politely() {
    let (client, mut fake) = pair(Setup::default(), config()).await;
    drop(client);
    let (req, _) = step(fake.read_request()).await;
    assert_eq!(req.command, CMD_DISC, "an idle client says goodbye");
    let mut byte = [0u8; 1];
    let n = step(fake.s.read(&mut byte)).await.unwrap();
    assert_eq!(n, 0, "the server must see EOF");

    // With a request in flight there is no NBD_CMD_DISC, only the closed socket.
    let (client, mut fake) = pair(Setup::default(), config()).await;
    let c = client.clone();
    let read = tokio::spawn(async move { c.read(0, vec![0u8; 512]).await });
    let (req, _) = step(fake.read_request()).await;
    assert_eq!(req.command, CMD_READ);
    read.abort();
    let _ = read.await;
    drop(client);
    let n = step(fake.s.read(&mut byte)).await.unwrap();
    assert_eq!(n, 0, "the server must see EOF");
}
