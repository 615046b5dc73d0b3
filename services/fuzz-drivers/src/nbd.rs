//! The NBD fuzz targets: `nbd_parsers` drives every pure parser of server messages,
//! `nbd_handshake` and `nbd_replies` the real client against a "server" whose every byte
//! comes from the input, checking that it ends (no hang) without panicking; `nbd_server`
//! drives the export server the same way against arbitrary client bytes.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use ferry_nbd::server::wire as server_wire;
use ferry_nbd::{
    proto::*, wire, Backend, Client, Config, ExportConfig, Server, StatusExtent, Transport,
    ZeroFlags,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Every pure parser of server messages on arbitrary bytes; the first byte picks one.
pub fn nbd_parsers(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 10 {
        0 => {
            if let Ok(b) = <&[u8; 18]>::try_from(rest) {
                let _ = wire::parse_greeting(b);
            }
        }
        1 => {
            if let Ok(b) = <&[u8; 20]>::try_from(rest) {
                let _ = wire::parse_option_reply_header(b);
            }
        }
        2 => {
            let _ = wire::parse_info(rest);
        }
        3 => {
            let _ = wire::parse_server(rest);
        }
        4 => {
            let _ = wire::parse_meta_context(rest);
        }
        5 => {
            if rest.len() >= 4 {
                let magic = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
                let _ = wire::parse_reply_header(magic, &rest[4..]);
                for mode in [
                    wire::ReplyMode::Simple,
                    wire::ReplyMode::Structured,
                    wire::ReplyMode::Extended,
                ] {
                    let _ = wire::reply_header_rest(magic, mode);
                }
            }
        }
        6 => {
            if rest.len() >= 2 {
                let kind = u16::from_be_bytes([rest[0], rest[1]]) | REPLY_TYPE_FLAG_ERROR;
                let _ = wire::parse_error_chunk(kind, &rest[2..]);
                let _ = wire::parse_error_chunk(REPLY_TYPE_ERROR, &rest[2..]);
                let _ = wire::parse_error_chunk(REPLY_TYPE_ERROR_OFFSET, &rest[2..]);
            }
        }
        7 => {
            let _ = wire::parse_hole(rest);
        }
        8 => {
            let _ = wire::parse_block_status(REPLY_TYPE_BLOCK_STATUS, rest);
        }
        _ => {
            let _ = wire::parse_block_status(REPLY_TYPE_BLOCK_STATUS_EXT, rest);
        }
    }
}

/// The whole client against arbitrary server bytes from the first byte on.
pub fn nbd_handshake(data: &[u8]) {
    session(data.to_vec());
}

/// Transmission-phase replies: a valid handshake (extended headers when the first byte is
/// odd, else structured replies), then arbitrary reply bytes.
pub fn nbd_replies(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = handshake(mode & 1 == 1);
    bytes.extend_from_slice(rest);
    session(bytes);
}

/// Serves fixed bytes, then end of file; swallows whatever the client writes.
#[derive(Debug)]
pub struct Scripted {
    data: Vec<u8>,
    at: usize,
}

impl Scripted {
    /// A stream that serves `data`.
    pub fn new(data: Vec<u8>) -> Self {
        Self { data, at: 0 }
    }
}

impl AsyncRead for Scripted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // Dribble out small reads so the client's buffering is exercised too.
        let n = (self.data.len() - self.at).min(buf.remaining()).min(97);
        let at = self.at;
        buf.put_slice(&self.data[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Scripted {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Ok(b.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl Transport for Scripted {}

fn option_reply(out: &mut Vec<u8>, option: u32, reply: u32, data: &[u8]) {
    out.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// A valid server handshake: extended headers (or structured replies when `extended`
/// is false), base:allocation as context 1, a 1 MiB export with every flag, block sizes.
pub fn handshake(extended: bool) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&NBDMAGIC.to_be_bytes());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    if extended {
        option_reply(&mut out, OPT_EXTENDED_HEADERS, REP_ACK, &[]);
    } else {
        option_reply(&mut out, OPT_EXTENDED_HEADERS, REP_ERR_UNSUP, &[]);
        option_reply(&mut out, OPT_STRUCTURED_REPLY, REP_ACK, &[]);
    }
    let mut ctx = 1u32.to_be_bytes().to_vec();
    ctx.extend_from_slice(CONTEXT_BASE_ALLOCATION.as_bytes());
    option_reply(&mut out, OPT_SET_META_CONTEXT, REP_META_CONTEXT, &ctx);
    option_reply(&mut out, OPT_SET_META_CONTEXT, REP_ACK, &[]);
    let mut info = INFO_EXPORT.to_be_bytes().to_vec();
    info.extend_from_slice(&(1u64 << 20).to_be_bytes());
    info.extend_from_slice(&0xffffu16.to_be_bytes());
    option_reply(&mut out, OPT_GO, REP_INFO, &info);
    let mut bs = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
    for v in [512u32, 4096, 1 << 20] {
        bs.extend_from_slice(&v.to_be_bytes());
    }
    option_reply(&mut out, OPT_GO, REP_INFO, &bs);
    option_reply(&mut out, OPT_GO, REP_ACK, &[]);
    out
}

/// Runs a client session over `server_bytes`: the handshake, then a batch of concurrent
/// requests (cookies 1.. in this order: read, read, block status, write, write zeroes,
/// trim, flush), then a disconnect. Panics only if the client hangs.
pub fn session(server_bytes: Vec<u8>) {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
    }
    RUNTIME.with(|rt| {
        rt.block_on(async move {
            let config = Config {
                connect_timeout: Duration::from_secs(30),
                request_timeout: Some(Duration::from_secs(30)),
                max_in_flight: 8,
                ..Config::default()
            };
            let run = async {
                let Ok(client) = Client::handshake(Scripted::new(server_bytes), &config).await
                else {
                    return;
                };
                let size = client.size();
                let min = u64::from(client.info().block_size.minimum).max(1);
                let len = (4096u64.min(size) / min * min) as usize;
                let c = &client;
                let _ = tokio::join!(
                    c.read(0, vec![0u8; len]),
                    c.read(size.saturating_sub(len as u64) / min * min, vec![0u8; len]),
                    c.block_status(0, size),
                    c.write(0, vec![1u8; len], false),
                    c.write_zeroes(0, len as u64, ZeroFlags::default()),
                    c.trim(0, len as u64, false),
                    c.flush(),
                );
                let _ = client.disconnect().await;
            };
            // Time is paused: only a client that waits on nothing at all can reach this.
            tokio::time::timeout(Duration::from_secs(3600), run)
                .await
                .expect("the client hung on a finished stream");
        })
    });
}

/// The export server against arbitrary client bytes: when the first byte is odd, a valid
/// client handshake (structured replies, `base:allocation`, NBD_OPT_GO) comes first and
/// the rest is requests; otherwise the rest is the whole client side from the client
/// flags on. The pure parsers of client messages run on the same bytes. The server must
/// end (the stream ends) without panicking.
pub fn nbd_server(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let _ = server_wire::parse_go(rest);
    let _ = server_wire::parse_meta_context_request(rest);
    if let Ok(b) = <&[u8; 28]>::try_from(rest.get(..28).unwrap_or_default()) {
        let _ = server_wire::parse_request(b);
    }
    if let Ok(b) = <&[u8; 16]>::try_from(rest.get(..16).unwrap_or_default()) {
        let _ = server_wire::parse_option_header(b);
    }
    let mut bytes = if mode & 1 == 1 {
        client_handshake()
    } else {
        Vec::new()
    };
    bytes.extend_from_slice(rest);
    serve(bytes);
}

/// A 1 MiB export whose bytes are a function of their offset, in 64 KiB extents that
/// alternate data, hole, allocated zeroes.
#[derive(Debug)]
pub struct FuzzDisk;

/// Size of [`FuzzDisk`].
pub const FUZZ_DISK_SIZE: u64 = 1 << 20;

impl Backend for FuzzDisk {
    type Buf = Vec<u8>;

    fn size(&self) -> u64 {
        FUZZ_DISK_SIZE
    }

    fn can_extents(&self) -> bool {
        true
    }

    async fn read(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        if offset % 3 == 2 {
            return Err(std::io::Error::other("a failing read"));
        }
        Ok((0..len as u64)
            .map(|i| ((offset + i) % 251) as u8)
            .collect())
    }

    async fn extents(&self, offset: u64, len: u64) -> std::io::Result<Vec<StatusExtent>> {
        let piece = 64 * 1024;
        let len = (piece - offset % piece).min(len);
        let flags = match (offset / piece) % 3 {
            0 => 0,
            1 => STATE_HOLE | STATE_ZERO,
            _ => STATE_ZERO,
        };
        Ok(vec![StatusExtent { offset, len, flags }])
    }
}

/// What a client sends to reach transmission: client flags, NBD_OPT_STRUCTURED_REPLY,
/// NBD_OPT_SET_META_CONTEXT `base:allocation`, NBD_OPT_GO for the default export.
pub fn client_handshake() -> Vec<u8> {
    let mut out = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    out.extend(wire::encode_option(OPT_STRUCTURED_REPLY, &[]));
    out.extend(wire::encode_option(
        OPT_SET_META_CONTEXT,
        &wire::encode_meta_context("", &[CONTEXT_BASE_ALLOCATION.to_string()]),
    ));
    out.extend(wire::encode_option(
        OPT_GO,
        &wire::encode_go("", &[INFO_BLOCK_SIZE]),
    ));
    out
}

/// Runs one server session over `client_bytes`. Panics only if the server hangs.
pub fn serve(client_bytes: Vec<u8>) {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
    }
    RUNTIME.with(|rt| {
        rt.block_on(async move {
            let config = ExportConfig {
                name: "disk".into(),
                max_in_flight: 4,
                ..ExportConfig::default()
            };
            let Ok(server) = Server::new(FuzzDisk, config) else {
                return;
            };
            let run = server.serve_connection(Scripted::new(client_bytes));
            // Time is paused: only a server that waits on nothing at all can reach this.
            let _ = tokio::time::timeout(Duration::from_secs(3600), run)
                .await
                .expect("the server hung on a finished stream");
        })
    });
}
