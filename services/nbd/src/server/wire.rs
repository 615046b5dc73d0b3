//! The server's half of the wire: pure parsers of what a client sends (option headers,
//! option data, request headers) and encoders of what a server sends (greeting, option
//! replies, simple replies and structured reply chunks).
//!
//! Nothing here does I/O, so the parsers can be unit-tested and fuzzed on plain byte
//! slices (the `nbd_server` fuzz target). Every parser bounds what it reads by the slice
//! it is given and returns [`Malformed`] naming the field that was wrong; none panics.
//! The numbers come from [`crate::proto`], and request headers decode into the client's
//! [`Request`] type.

use crate::proto::{self, *};
use crate::wire::{be16, be32, be64, Request};

/// The most option data the server reads: strings are at most 4096 bytes, and a
/// NBD_OPT_SET_META_CONTEXT with a few queries fits easily. Longer options end the
/// session (their bytes are never allocated).
pub const MAX_OPTION_DATA: u32 = 64 * 1024;
/// The most queries one NBD_OPT_SET/LIST_META_CONTEXT may carry.
pub const MAX_QUERIES: usize = 256;
/// Client flags this server understands.
pub const KNOWN_CLIENT_FLAGS: u32 = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;

/// What was wrong with a client message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn malformed(message: impl Into<String>) -> Malformed {
    Malformed(message.into())
}

type Parsed<T> = std::result::Result<T, Malformed>;

// ---------------------------------------------------------------------------------------
// Handshake

/// The 18-byte greeting of fixed newstyle negotiation (NO_ZEROES offered).
pub fn greeting() -> [u8; 18] {
    let mut out = [0u8; 18];
    out[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    out[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    out
}

/// The client's flags; unknown bits are refused, as the specification asks.
pub fn parse_client_flags(bytes: &[u8; 4]) -> Parsed<u32> {
    let flags = u32::from_be_bytes(*bytes);
    if flags & !KNOWN_CLIENT_FLAGS != 0 {
        return Err(malformed(format!(
            "unknown client flags {:#x}",
            flags & !KNOWN_CLIENT_FLAGS
        )));
    }
    Ok(flags)
}

/// The 16-byte header of an option: `IHAVEOPT`, option, data length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len: u32,
}

/// Parses an option header; a bad magic or data longer than [`MAX_OPTION_DATA`] is an
/// error (the session cannot go on).
pub fn parse_option_header(bytes: &[u8; 16]) -> Parsed<OptionHeader> {
    let magic = be64(bytes, 0);
    if magic != IHAVEOPT {
        return Err(malformed(format!(
            "option starts with {magic:#018x}, expected IHAVEOPT"
        )));
    }
    let header = OptionHeader {
        option: be32(bytes, 8),
        len: be32(bytes, 12),
    };
    if header.len > MAX_OPTION_DATA {
        return Err(malformed(format!(
            "{} carries {} bytes of data, more than the {MAX_OPTION_DATA} this server reads",
            proto::option_name(header.option),
            header.len
        )));
    }
    Ok(header)
}

/// Reads a 32-bit length and that many bytes of UTF-8 at `*at`.
fn take_string(data: &[u8], at: &mut usize, what: &str) -> Parsed<String> {
    if data.len() < *at + 4 {
        return Err(malformed(format!("{what} length is missing")));
    }
    let len = be32(data, *at) as usize;
    *at += 4;
    if len > proto::MAX_STRING {
        return Err(malformed(format!(
            "{what} of {len} bytes is longer than the {} the protocol allows",
            proto::MAX_STRING
        )));
    }
    if data.len() - *at < len {
        return Err(malformed(format!(
            "{what} of {len} bytes does not fit the option's {} bytes",
            data.len()
        )));
    }
    let text = std::str::from_utf8(&data[*at..*at + len])
        .map_err(|_| malformed(format!("{what} is not UTF-8")))?;
    *at += len;
    Ok(text.to_string())
}

/// The data of NBD_OPT_INFO and NBD_OPT_GO: an export name and information requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoRequest {
    pub name: String,
    pub infos: Vec<u16>,
}

pub fn parse_go(data: &[u8]) -> Parsed<GoRequest> {
    let mut at = 0;
    let name = take_string(data, &mut at, "export name")?;
    if data.len() < at + 2 {
        return Err(malformed("the number of information requests is missing"));
    }
    let count = usize::from(be16(data, at));
    at += 2;
    if data.len() - at != 2 * count {
        return Err(malformed(format!(
            "{count} information requests need {} bytes, the option has {}",
            2 * count,
            data.len() - at
        )));
    }
    let infos = (0..count).map(|i| be16(data, at + 2 * i)).collect();
    Ok(GoRequest { name, infos })
}

/// The data of NBD_OPT_SET_META_CONTEXT and NBD_OPT_LIST_META_CONTEXT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub name: String,
    pub queries: Vec<String>,
}

pub fn parse_meta_context_request(data: &[u8]) -> Parsed<MetaContextRequest> {
    let mut at = 0;
    let name = take_string(data, &mut at, "export name")?;
    if data.len() < at + 4 {
        return Err(malformed("the number of queries is missing"));
    }
    let count = be32(data, at) as usize;
    at += 4;
    if count > MAX_QUERIES {
        return Err(malformed(format!(
            "{count} queries, more than the {MAX_QUERIES} this server takes"
        )));
    }
    let mut queries = Vec::with_capacity(count);
    for _ in 0..count {
        queries.push(take_string(data, &mut at, "metadata context query")?);
    }
    if at != data.len() {
        return Err(malformed(format!(
            "{} bytes follow the last query",
            data.len() - at
        )));
    }
    Ok(MetaContextRequest { name, queries })
}

/// An option reply: magic, option, reply type, data.
pub fn option_reply(option: u32, reply: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + data.len());
    out.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// NBD_INFO_EXPORT.
pub fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut out = INFO_EXPORT.to_be_bytes().to_vec();
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out
}

/// NBD_INFO_BLOCK_SIZE.
pub fn info_block_size(minimum: u32, preferred: u32, maximum: u32) -> Vec<u8> {
    let mut out = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
    for v in [minimum, preferred, maximum] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    out
}

/// NBD_INFO_NAME or NBD_INFO_DESCRIPTION.
pub fn info_text(kind: u16, text: &str) -> Vec<u8> {
    let mut out = kind.to_be_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out
}

/// The data of NBD_REP_SERVER: the name's length, the name, an optional description.
pub fn server_entry(name: &str, description: Option<&str>) -> Vec<u8> {
    let mut out = (name.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(description.unwrap_or_default().as_bytes());
    out
}

/// The data of NBD_REP_META_CONTEXT.
pub fn meta_context_entry(id: u32, name: &str) -> Vec<u8> {
    let mut out = id.to_be_bytes().to_vec();
    out.extend_from_slice(name.as_bytes());
    out
}

/// The answer to NBD_OPT_EXPORT_NAME: size, flags and, unless NO_ZEROES, 124 zeroes.
pub fn export_name_reply(size: u64, flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut out = size.to_be_bytes().to_vec();
    out.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        out.extend_from_slice(&[0u8; 124]);
    }
    out
}

// ---------------------------------------------------------------------------------------
// Transmission

/// Parses a compact (28-byte) request header. Extended headers are never negotiated by
/// this server, so their magic is an error like any other.
pub fn parse_request(bytes: &[u8; 28]) -> Parsed<Request> {
    let magic = be32(bytes, 0);
    if magic != REQUEST_MAGIC {
        return Err(malformed(format!(
            "bad request magic {magic:#010x}: the stream is garbled"
        )));
    }
    Ok(Request {
        flags: be16(bytes, 4),
        command: be16(bytes, 6),
        cookie: be64(bytes, 8),
        offset: be64(bytes, 16),
        len: u64::from(be32(bytes, 24)),
    })
}

/// A simple reply header (data, if any, follows).
pub fn simple_reply(cookie: u64, errno: u32) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&errno.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out
}

/// A structured reply chunk header for a payload of `len` bytes.
pub fn chunk_header(cookie: u64, flags: u16, kind: u16, len: u32) -> [u8; 20] {
    let mut out = [0u8; 20];
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&kind.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out[16..20].copy_from_slice(&len.to_be_bytes());
    out
}

/// The header and offset of an NBD_REPLY_TYPE_OFFSET_DATA chunk; `data_len` bytes of
/// data follow.
pub fn data_chunk_header(cookie: u64, flags: u16, offset: u64, data_len: u32) -> [u8; 28] {
    let mut out = [0u8; 28];
    out[0..20].copy_from_slice(&chunk_header(
        cookie,
        flags,
        REPLY_TYPE_OFFSET_DATA,
        data_len.saturating_add(8),
    ));
    out[20..28].copy_from_slice(&offset.to_be_bytes());
    out
}

/// An NBD_REPLY_TYPE_OFFSET_HOLE chunk.
pub fn hole_chunk(cookie: u64, flags: u16, offset: u64, len: u32) -> Vec<u8> {
    let mut out = chunk_header(cookie, flags, REPLY_TYPE_OFFSET_HOLE, 12).to_vec();
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    out
}

/// An NBD_REPLY_TYPE_NONE chunk (flags usually DONE).
pub fn none_chunk(cookie: u64, flags: u16) -> [u8; 20] {
    chunk_header(cookie, flags, REPLY_TYPE_NONE, 0)
}

/// An NBD_REPLY_TYPE_ERROR chunk; the message is cut to fit its 16-bit length.
pub fn error_chunk(cookie: u64, flags: u16, errno: u32, message: &str) -> Vec<u8> {
    let mut end = message.len().min(proto::MAX_STRING);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let message = &message.as_bytes()[..end];
    let mut out = chunk_header(cookie, flags, REPLY_TYPE_ERROR, 6 + message.len() as u32).to_vec();
    out.extend_from_slice(&errno.to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// An NBD_REPLY_TYPE_BLOCK_STATUS chunk for one context: `(length, flags)` descriptors.
pub fn block_status_chunk(
    cookie: u64,
    flags: u16,
    context: u32,
    extents: &[(u32, u32)],
) -> Vec<u8> {
    let len = 4 + 8 * extents.len() as u32;
    let mut out = chunk_header(cookie, flags, REPLY_TYPE_BLOCK_STATUS, len).to_vec();
    out.extend_from_slice(&context.to_be_bytes());
    for (l, f) in extents {
        out.extend_from_slice(&l.to_be_bytes());
        out.extend_from_slice(&f.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire;

    fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
        wire::encode_go(name, infos)
    }

    #[test]
    fn client_messages_round_trip_through_the_client_encoders() {
        let go = parse_go(&go_data("disk", &[INFO_BLOCK_SIZE, INFO_NAME])).unwrap();
        assert_eq!(go.name, "disk");
        assert_eq!(go.infos, vec![INFO_BLOCK_SIZE, INFO_NAME]);
        let meta = wire::encode_meta_context("", &["base:allocation".into(), "qemu:".into()]);
        let meta = parse_meta_context_request(&meta).unwrap();
        assert_eq!(meta.name, "");
        assert_eq!(meta.queries, vec!["base:allocation", "qemu:"]);
        let opt = wire::encode_option(OPT_LIST, &[]);
        let header = parse_option_header(opt[..16].try_into().unwrap()).unwrap();
        assert_eq!(
            header,
            OptionHeader {
                option: OPT_LIST,
                len: 0
            }
        );
        let req = Request {
            flags: CMD_FLAG_DF,
            command: CMD_READ,
            cookie: 9,
            offset: 1 << 40,
            len: 4096,
        };
        let (bytes, n) = wire::encode_request(&req, false);
        assert_eq!(n, 28);
        assert_eq!(parse_request(bytes[..28].try_into().unwrap()).unwrap(), req);
    }

    #[test]
    fn malformed_client_messages_are_named() {
        // A name length past the data, a count that disagrees with the bytes, non-UTF-8.
        let mut go = go_data("disk", &[INFO_NAME]);
        go[3] = 200;
        assert!(parse_go(&go).unwrap_err().0.contains("does not fit"));
        let mut go = go_data("disk", &[INFO_NAME]);
        go.push(0);
        assert!(parse_go(&go)
            .unwrap_err()
            .0
            .contains("information requests"));
        assert!(parse_go(&[0, 0, 0, 1, 0xff, 0, 0])
            .unwrap_err()
            .0
            .contains("UTF-8"));
        assert!(parse_go(&[0, 0]).is_err());
        let long = (proto::MAX_STRING as u32 + 1).to_be_bytes();
        assert!(parse_go(&long).unwrap_err().0.contains("longer than"));
        let mut meta = wire::encode_meta_context("", &["base:allocation".into()]);
        meta.push(7);
        assert!(parse_meta_context_request(&meta)
            .unwrap_err()
            .0
            .contains("follow"));
        let mut many = 0u32.to_be_bytes().to_vec();
        many.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_meta_context_request(&many)
            .unwrap_err()
            .0
            .contains("queries"));
        let mut opt = [0u8; 16];
        opt[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        opt[12..16].copy_from_slice(&(MAX_OPTION_DATA + 1).to_be_bytes());
        assert!(parse_option_header(&opt)
            .unwrap_err()
            .0
            .contains("more than"));
        opt[0] = 0;
        assert!(parse_option_header(&opt)
            .unwrap_err()
            .0
            .contains("IHAVEOPT"));
        assert!(parse_client_flags(&[0, 0, 0, 4]).is_err());
        assert_eq!(parse_client_flags(&[0, 0, 0, 3]).unwrap(), 3);
        let mut req = [0u8; 28];
        req[0..4].copy_from_slice(&EXTENDED_REQUEST_MAGIC.to_be_bytes());
        assert!(parse_request(&req).unwrap_err().0.contains("magic"));
    }

    #[test]
    fn server_messages_parse_with_the_client_parsers() {
        let g = greeting();
        assert_eq!(
            wire::parse_greeting(&g).unwrap(),
            FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES
        );
        let r = option_reply(OPT_GO, REP_INFO, &info_export(1 << 30, 3));
        let h = wire::parse_option_reply_header(r[..20].try_into().unwrap()).unwrap();
        assert_eq!((h.option, h.reply, h.len), (OPT_GO, REP_INFO, 12));
        assert_eq!(
            wire::parse_info(&r[20..]).unwrap(),
            wire::Info::Export {
                size: 1 << 30,
                flags: 3
            }
        );
        assert_eq!(
            wire::parse_info(&info_block_size(1, 4096, 1 << 25)).unwrap(),
            wire::Info::BlockSize {
                minimum: 1,
                preferred: 4096,
                maximum: 1 << 25
            }
        );
        assert_eq!(
            wire::parse_server(&server_entry("disk", Some("a disk"))).unwrap(),
            ("disk".to_string(), Some("a disk".to_string()))
        );
        assert_eq!(
            wire::parse_meta_context(&meta_context_entry(1, CONTEXT_BASE_ALLOCATION)).unwrap(),
            (1, CONTEXT_BASE_ALLOCATION.to_string())
        );
        let e = error_chunk(5, REPLY_FLAG_DONE, EPERM, "read-only");
        let header = wire::parse_reply_header(STRUCTURED_REPLY_MAGIC, &e[4..20]).unwrap();
        assert_eq!(
            header,
            wire::ReplyHeader::Chunk {
                flags: REPLY_FLAG_DONE,
                kind: REPLY_TYPE_ERROR,
                cookie: 5,
                offset: None,
                len: 15
            }
        );
        let parsed = wire::parse_error_chunk(REPLY_TYPE_ERROR, &e[20..]).unwrap();
        assert_eq!(
            (parsed.errno, parsed.message.as_deref()),
            (EPERM, Some("read-only"))
        );
        let long = "é".repeat(5000);
        let e = error_chunk(5, 0, EIO, &long);
        assert!(wire::parse_error_chunk(REPLY_TYPE_ERROR, &e[20..]).is_ok());
        let h = hole_chunk(1, 0, 4096, 512);
        assert_eq!(wire::parse_hole(&h[20..]).unwrap(), (4096, 512));
        let s = block_status_chunk(1, 0, 1, &[(4096, 3), (512, 0)]);
        let (id, d) = wire::parse_block_status(REPLY_TYPE_BLOCK_STATUS, &s[20..]).unwrap();
        assert_eq!((id, d.len(), d[0].flags, d[1].len), (1, 2, 3, 512));
        let d = data_chunk_header(1, 0, 77, 100);
        assert_eq!(be32(&d, 16), 108);
        assert_eq!(be64(&d, 20), 77);
        assert_eq!(export_name_reply(5, 1, false).len(), 134);
        assert_eq!(export_name_reply(5, 1, true).len(), 10);
    }
}
