//! Encoding of client messages and pure parsers of server messages.
//!
//! Nothing here does I/O, so every parser can be unit-tested and fuzzed on plain byte
//! slices. Every parser bounds what it reads by the slice it is given and returns a
//! `Protocol` error naming the field that was wrong; none panics on any input.

use crate::error::{Error, Result, ServerError};
use crate::proto::{self, *};

/// The largest option reply payload the client accepts. Strings are at most 4096 bytes
/// by the specification; the slack covers descriptions and future fields.
pub const MAX_OPTION_REPLY: u32 = 64 * 1024;
/// The largest error chunk payload the client accepts (u16 message length plus fields).
pub const MAX_ERROR_CHUNK: u64 = 65_535 + 14;
/// The most descriptors one block status chunk may carry (the specification asks servers
/// to stay below 2^20).
pub const MAX_STATUS_DESCRIPTORS: u64 = 1 << 20;
/// The largest block status chunk payload, extended form (the compact form is smaller).
pub const MAX_STATUS_CHUNK: u64 = 8 + 16 * MAX_STATUS_DESCRIPTORS;

pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// A server string: at most [`proto::MAX_STRING`] bytes, shown lossily if not UTF-8.
pub fn string(bytes: &[u8], what: &str) -> Result<String> {
    if bytes.len() > proto::MAX_STRING {
        return Err(Error::protocol(format!(
            "{what} is {} bytes long, more than the {} the protocol allows",
            bytes.len(),
            proto::MAX_STRING
        )));
    }
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

/// A human-readable message from the server, cut to a sane length for display.
fn message(bytes: &[u8]) -> Option<String> {
    if bytes.is_empty() {
        return None;
    }
    let shown = &bytes[..bytes.len().min(proto::MAX_STRING)];
    Some(String::from_utf8_lossy(shown).trim_end().to_string())
}

// ---------------------------------------------------------------------------------------
// Handshake

/// The server's greeting after `NBDMAGIC`: the second magic and handshake flags.
pub fn parse_greeting(bytes: &[u8; 18]) -> Result<u16> {
    let magic = be64(bytes, 0);
    if magic != NBDMAGIC {
        return Err(Error::protocol(format!(
            "not an NBD server: greeting starts with {magic:#018x}, expected NBDMAGIC"
        )));
    }
    match be64(bytes, 8) {
        IHAVEOPT => Ok(be16(bytes, 16)),
        CLISERV_MAGIC => Err(Error::Unsupported(
            "the server uses oldstyle negotiation, which this client does not support".into(),
        )),
        other => Err(Error::protocol(format!(
            "bad second handshake magic {other:#018x}, expected IHAVEOPT"
        ))),
    }
}

/// An option request: `IHAVEOPT`, option, length, data.
pub fn encode_option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + data.len());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Data of NBD_OPT_INFO / NBD_OPT_GO.
pub fn encode_go(export: &str, infos: &[u16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(6 + export.len() + 2 * infos.len());
    put_string(&mut out, export);
    out.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for info in infos {
        out.extend_from_slice(&info.to_be_bytes());
    }
    out
}

/// Data of NBD_OPT_SET_META_CONTEXT / NBD_OPT_LIST_META_CONTEXT.
pub fn encode_meta_context(export: &str, queries: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    put_string(&mut out, export);
    out.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        put_string(&mut out, q);
    }
    out
}

/// The fixed 20-byte header of an option reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply: u32,
    pub len: u32,
}

pub fn parse_option_reply_header(bytes: &[u8; 20]) -> Result<OptionReplyHeader> {
    let magic = be64(bytes, 0);
    if magic != REPLY_MAGIC {
        return Err(Error::protocol(format!(
            "bad option reply magic {magic:#018x}"
        )));
    }
    let header = OptionReplyHeader {
        option: be32(bytes, 8),
        reply: be32(bytes, 12),
        len: be32(bytes, 16),
    };
    if header.len > MAX_OPTION_REPLY {
        return Err(Error::protocol(format!(
            "option reply {} to {} is {} bytes long, more than the {MAX_OPTION_REPLY} allowed",
            proto::reply_name(header.reply),
            proto::option_name(header.option),
            header.len
        )));
    }
    Ok(header)
}

/// The message of an option error reply.
pub fn option_error_message(payload: &[u8]) -> Option<String> {
    message(payload)
}

/// One NBD_REP_INFO item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Info {
    Export {
        size: u64,
        flags: u16,
    },
    Name(String),
    Description(String),
    BlockSize {
        minimum: u32,
        preferred: u32,
        maximum: u32,
    },
    Unknown(u16),
}

pub fn parse_info(payload: &[u8]) -> Result<Info> {
    if payload.len() < 2 {
        return Err(Error::protocol(format!(
            "NBD_REP_INFO of {} bytes has no information type",
            payload.len()
        )));
    }
    let kind = be16(payload, 0);
    let body = &payload[2..];
    let exact = |want: usize, name: &str| -> Result<()> {
        if body.len() == want {
            Ok(())
        } else {
            Err(Error::protocol(format!(
                "{name} has {} bytes, expected {}",
                payload.len(),
                want + 2
            )))
        }
    };
    match kind {
        INFO_EXPORT => {
            exact(10, "NBD_INFO_EXPORT")?;
            Ok(Info::Export {
                size: be64(body, 0),
                flags: be16(body, 8),
            })
        }
        INFO_NAME => Ok(Info::Name(string(body, "NBD_INFO_NAME")?)),
        INFO_DESCRIPTION => Ok(Info::Description(string(body, "NBD_INFO_DESCRIPTION")?)),
        INFO_BLOCK_SIZE => {
            exact(12, "NBD_INFO_BLOCK_SIZE")?;
            Ok(Info::BlockSize {
                minimum: be32(body, 0),
                preferred: be32(body, 4),
                maximum: be32(body, 8),
            })
        }
        other => Ok(Info::Unknown(other)),
    }
}

/// An NBD_REP_SERVER entry: the export name and its description.
pub fn parse_server(payload: &[u8]) -> Result<(String, Option<String>)> {
    if payload.len() < 4 {
        return Err(Error::protocol(format!(
            "NBD_REP_SERVER of {} bytes has no name length",
            payload.len()
        )));
    }
    let len = be32(payload, 0) as usize;
    let rest = &payload[4..];
    if len > rest.len() {
        return Err(Error::protocol(format!(
            "NBD_REP_SERVER names an export of {len} bytes in a {}-byte reply",
            payload.len()
        )));
    }
    let name = string(&rest[..len], "export name")?;
    let description = message(&rest[len..]);
    Ok((name, description))
}

/// An NBD_REP_META_CONTEXT entry: the context id and name.
pub fn parse_meta_context(payload: &[u8]) -> Result<(u32, String)> {
    if payload.len() < 4 {
        return Err(Error::protocol(format!(
            "NBD_REP_META_CONTEXT of {} bytes has no context id",
            payload.len()
        )));
    }
    let name = string(&payload[4..], "metadata context name")?;
    Ok((be32(payload, 0), name))
}

/// The 8-byte size and 2-byte flags that answer NBD_OPT_EXPORT_NAME.
pub fn parse_export_name_reply(bytes: &[u8; 10]) -> (u64, u16) {
    (be64(bytes, 0), be16(bytes, 8))
}

// ---------------------------------------------------------------------------------------
// Transmission

/// A request header, compact (28 bytes) or extended (32 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u64,
}

/// Encodes a request header; returns the buffer and how many bytes of it to send.
///
/// The compact form needs `len` to fit in 32 bits: callers check that first.
pub fn encode_request(req: &Request, extended: bool) -> ([u8; 32], usize) {
    let mut out = [0u8; 32];
    let mut flags = req.flags;
    if extended && req.command == CMD_WRITE {
        flags |= CMD_FLAG_PAYLOAD_LEN;
    }
    let magic = if extended {
        EXTENDED_REQUEST_MAGIC
    } else {
        REQUEST_MAGIC
    };
    out[0..4].copy_from_slice(&magic.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&req.command.to_be_bytes());
    out[8..16].copy_from_slice(&req.cookie.to_be_bytes());
    out[16..24].copy_from_slice(&req.offset.to_be_bytes());
    if extended {
        out[24..32].copy_from_slice(&req.len.to_be_bytes());
        (out, 32)
    } else {
        debug_assert!(req.len <= u64::from(u32::MAX));
        out[24..28].copy_from_slice(&(req.len as u32).to_be_bytes());
        (out, 28)
    }
}

/// Which reply headers the connection negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyMode {
    /// Simple replies only.
    Simple,
    /// Structured replies (simple replies still allowed for payload-less answers).
    Structured,
    /// Extended headers: every reply is an extended chunk.
    Extended,
}

/// How many more header bytes follow a reply's 4-byte magic.
pub fn reply_header_rest(magic: u32, mode: ReplyMode) -> Result<usize> {
    match (magic, mode) {
        (SIMPLE_REPLY_MAGIC, ReplyMode::Simple | ReplyMode::Structured) => Ok(12),
        (STRUCTURED_REPLY_MAGIC, ReplyMode::Structured) => Ok(16),
        (EXTENDED_REPLY_MAGIC, ReplyMode::Extended) => Ok(28),
        (SIMPLE_REPLY_MAGIC, ReplyMode::Extended) => Err(Error::protocol(
            "simple reply received although extended headers were negotiated",
        )),
        (STRUCTURED_REPLY_MAGIC, _) => Err(Error::protocol(
            "structured reply received although it was not negotiated",
        )),
        (EXTENDED_REPLY_MAGIC, _) => Err(Error::protocol(
            "extended reply received although extended headers were not negotiated",
        )),
        (other, _) => Err(Error::protocol(format!(
            "bad reply magic {other:#010x}: the stream is garbled"
        ))),
    }
}

/// A reply header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyHeader {
    Simple {
        error: u32,
        cookie: u64,
    },
    Chunk {
        flags: u16,
        kind: u16,
        cookie: u64,
        /// Extended replies repeat the request's offset.
        offset: Option<u64>,
        len: u64,
    },
}

impl ReplyHeader {
    pub fn cookie(&self) -> u64 {
        match *self {
            Self::Simple { cookie, .. } | Self::Chunk { cookie, .. } => cookie,
        }
    }
}

/// Parses the header bytes after the magic (as many as [`reply_header_rest`] said).
pub fn parse_reply_header(magic: u32, rest: &[u8]) -> Result<ReplyHeader> {
    let need = match magic {
        SIMPLE_REPLY_MAGIC => 12,
        STRUCTURED_REPLY_MAGIC => 16,
        EXTENDED_REPLY_MAGIC => 28,
        other => {
            return Err(Error::protocol(format!("bad reply magic {other:#010x}")));
        }
    };
    if rest.len() != need {
        return Err(Error::protocol(format!(
            "reply header has {} bytes after the magic, expected {need}",
            rest.len()
        )));
    }
    Ok(match magic {
        SIMPLE_REPLY_MAGIC => ReplyHeader::Simple {
            error: be32(rest, 0),
            cookie: be64(rest, 4),
        },
        STRUCTURED_REPLY_MAGIC => ReplyHeader::Chunk {
            flags: be16(rest, 0),
            kind: be16(rest, 2),
            cookie: be64(rest, 4),
            offset: None,
            len: u64::from(be32(rest, 12)),
        },
        _ => ReplyHeader::Chunk {
            flags: be16(rest, 0),
            kind: be16(rest, 2),
            cookie: be64(rest, 4),
            offset: Some(be64(rest, 12)),
            len: be64(rest, 20),
        },
    })
}

/// Parses an error chunk (NBD_REPLY_TYPE_ERROR, _ERROR_OFFSET, or an unknown type with
/// the error bit set, whose trailing fields are ignored).
pub fn parse_error_chunk(kind: u16, payload: &[u8]) -> Result<ServerError> {
    let name = proto::chunk_name(kind);
    if payload.len() < 6 {
        return Err(Error::protocol(format!(
            "{name} of {} bytes is shorter than its 6-byte minimum",
            payload.len()
        )));
    }
    let errno = be32(payload, 0);
    let msg_len = usize::from(be16(payload, 4));
    let after = 6 + msg_len;
    let tail = if kind == REPLY_TYPE_ERROR_OFFSET {
        8
    } else {
        0
    };
    if after + tail > payload.len() || (kind == REPLY_TYPE_ERROR && after != payload.len()) {
        return Err(Error::protocol(format!(
            "{name} says its message has {msg_len} bytes, which does not fit its {}-byte payload",
            payload.len()
        )));
    }
    if kind == REPLY_TYPE_ERROR_OFFSET && after + 8 != payload.len() {
        return Err(Error::protocol(format!(
            "{name} of {} bytes does not end with the offset after a {msg_len}-byte message",
            payload.len()
        )));
    }
    if errno == 0 {
        return Err(Error::protocol(format!("{name} carries error value 0")));
    }
    let offset = (kind == REPLY_TYPE_ERROR_OFFSET).then(|| be64(payload, after));
    Ok(ServerError {
        errno,
        message: message(&payload[6..after]),
        offset,
    })
}

/// Parses an NBD_REPLY_TYPE_OFFSET_HOLE payload: offset and length.
pub fn parse_hole(payload: &[u8]) -> Result<(u64, u64)> {
    if payload.len() != 12 {
        return Err(Error::protocol(format!(
            "NBD_REPLY_TYPE_OFFSET_HOLE has {} bytes, expected 12",
            payload.len()
        )));
    }
    let len = u64::from(be32(payload, 8));
    if len == 0 {
        return Err(Error::protocol("NBD_REPLY_TYPE_OFFSET_HOLE of length 0"));
    }
    Ok((be64(payload, 0), len))
}

/// The offset that starts an NBD_REPLY_TYPE_OFFSET_DATA payload.
pub fn parse_data_offset(bytes: &[u8; 8]) -> u64 {
    u64::from_be_bytes(*bytes)
}

/// One block status descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    pub len: u64,
    pub flags: u64,
}

/// Parses a block status chunk (compact or extended) into its context id and descriptors.
pub fn parse_block_status(kind: u16, payload: &[u8]) -> Result<(u32, Vec<Descriptor>)> {
    let name = proto::chunk_name(kind);
    let (head, size) = match kind {
        REPLY_TYPE_BLOCK_STATUS => (4, 8),
        REPLY_TYPE_BLOCK_STATUS_EXT => (8, 16),
        _ => {
            return Err(Error::protocol(format!(
                "{name} is not a block status chunk"
            )))
        }
    };
    if payload.len() < head + size || !(payload.len() - head).is_multiple_of(size) {
        return Err(Error::protocol(format!(
            "{name} of {} bytes is not {head} bytes plus a positive multiple of {size}",
            payload.len()
        )));
    }
    let count = (payload.len() - head) / size;
    if count as u64 > MAX_STATUS_DESCRIPTORS {
        return Err(Error::protocol(format!(
            "{name} carries {count} descriptors, more than the {MAX_STATUS_DESCRIPTORS} allowed"
        )));
    }
    if kind == REPLY_TYPE_BLOCK_STATUS_EXT {
        let said = be32(payload, 4) as usize;
        if said != count {
            return Err(Error::protocol(format!(
                "{name} says it has {said} descriptors but carries {count}"
            )));
        }
    }
    let id = be32(payload, 0);
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let at = head + i * size;
        let d = if kind == REPLY_TYPE_BLOCK_STATUS {
            Descriptor {
                len: u64::from(be32(payload, at)),
                flags: u64::from(be32(payload, at + 4)),
            }
        } else {
            Descriptor {
                len: be64(payload, at),
                flags: be64(payload, at + 8),
            }
        };
        if d.len == 0 {
            return Err(Error::protocol(format!(
                "{name} descriptor {i} has length 0"
            )));
        }
        out.push(d);
    }
    Ok((id, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_encoding() {
        let req = Request {
            flags: CMD_FLAG_FUA,
            command: CMD_WRITE,
            cookie: 0x0102030405060708,
            offset: 4096,
            len: 512,
        };
        let (b, n) = encode_request(&req, false);
        assert_eq!(n, 28);
        assert_eq!(&b[0..4], &REQUEST_MAGIC.to_be_bytes());
        assert_eq!(&b[4..6], &[0, 1]);
        assert_eq!(&b[6..8], &[0, 1]);
        assert_eq!(&b[24..28], &512u32.to_be_bytes());
        let (b, n) = encode_request(&req, true);
        assert_eq!(n, 32);
        assert_eq!(&b[0..4], &EXTENDED_REQUEST_MAGIC.to_be_bytes());
        assert_eq!(be16(&b, 4), CMD_FLAG_FUA | CMD_FLAG_PAYLOAD_LEN);
        assert_eq!(be64(&b, 24), 512);
    }

    #[test]
    fn error_chunks() {
        let mut p = Vec::new();
        p.extend_from_slice(&EIO.to_be_bytes());
        p.extend_from_slice(&3u16.to_be_bytes());
        p.extend_from_slice(b"bad");
        let e = parse_error_chunk(REPLY_TYPE_ERROR, &p).unwrap();
        assert_eq!(e.errno, EIO);
        assert_eq!(e.message.as_deref(), Some("bad"));
        assert_eq!(e.offset, None);
        // ERROR_OFFSET needs the offset after the message.
        assert!(parse_error_chunk(REPLY_TYPE_ERROR_OFFSET, &p).is_err());
        p.extend_from_slice(&77u64.to_be_bytes());
        let e = parse_error_chunk(REPLY_TYPE_ERROR_OFFSET, &p).unwrap();
        assert_eq!(e.offset, Some(77));
        // A message length past the payload.
        let mut bad = p.clone();
        bad[4..6].copy_from_slice(&1000u16.to_be_bytes());
        assert!(parse_error_chunk(REPLY_TYPE_ERROR_OFFSET, &bad).is_err());
        // Unknown error types keep errno and message, ignore the rest.
        let e = parse_error_chunk(REPLY_TYPE_FLAG_ERROR | 9, &p).unwrap();
        assert_eq!(e.errno, EIO);
        assert!(parse_error_chunk(REPLY_TYPE_ERROR, &[0; 3]).is_err());
        assert!(parse_error_chunk(REPLY_TYPE_ERROR, &[0; 6]).is_err());
    }

    #[test]
    fn block_status_chunks() {
        let mut p = 7u32.to_be_bytes().to_vec();
        for (len, flags) in [(4096u32, 3u32), (512, 0)] {
            p.extend_from_slice(&len.to_be_bytes());
            p.extend_from_slice(&flags.to_be_bytes());
        }
        let (id, d) = parse_block_status(REPLY_TYPE_BLOCK_STATUS, &p).unwrap();
        assert_eq!(id, 7);
        assert_eq!(
            d,
            vec![
                Descriptor {
                    len: 4096,
                    flags: 3
                },
                Descriptor { len: 512, flags: 0 }
            ]
        );
        assert!(parse_block_status(REPLY_TYPE_BLOCK_STATUS, &p[..11]).is_err());
        assert!(parse_block_status(REPLY_TYPE_BLOCK_STATUS, &p[..4]).is_err());

        let mut e = 7u32.to_be_bytes().to_vec();
        e.extend_from_slice(&2u32.to_be_bytes());
        e.extend_from_slice(&(1u64 << 33).to_be_bytes());
        e.extend_from_slice(&2u64.to_be_bytes());
        e.extend_from_slice(&9u64.to_be_bytes());
        e.extend_from_slice(&0u64.to_be_bytes());
        let (_, d) = parse_block_status(REPLY_TYPE_BLOCK_STATUS_EXT, &e).unwrap();
        assert_eq!(d[0].len, 1 << 33);
        e[4..8].copy_from_slice(&3u32.to_be_bytes());
        assert!(parse_block_status(REPLY_TYPE_BLOCK_STATUS_EXT, &e).is_err());
        let mut zero = p.clone();
        zero[4..8].copy_from_slice(&0u32.to_be_bytes());
        assert!(parse_block_status(REPLY_TYPE_BLOCK_STATUS, &zero).is_err());
    }

    #[test]
    fn infos_and_servers() {
        let mut p = INFO_EXPORT.to_be_bytes().to_vec();
        p.extend_from_slice(&(1u64 << 30).to_be_bytes());
        p.extend_from_slice(&0x1234u16.to_be_bytes());
        assert_eq!(
            parse_info(&p).unwrap(),
            Info::Export {
                size: 1 << 30,
                flags: 0x1234
            }
        );
        assert!(parse_info(&p[..11]).is_err());
        assert!(parse_info(&[0]).is_err());
        assert_eq!(parse_info(&[0, 99, 1]).unwrap(), Info::Unknown(99));

        let mut s = 3u32.to_be_bytes().to_vec();
        s.extend_from_slice(b"abcdesc");
        assert_eq!(
            parse_server(&s).unwrap(),
            ("abc".to_string(), Some("desc".to_string()))
        );
        s[0..4].copy_from_slice(&100u32.to_be_bytes());
        assert!(parse_server(&s).is_err());
        assert!(parse_meta_context(&[0, 0]).is_err());
    }

    #[test]
    fn headers() {
        assert!(reply_header_rest(0xdead_beef, ReplyMode::Structured).is_err());
        assert!(reply_header_rest(SIMPLE_REPLY_MAGIC, ReplyMode::Extended).is_err());
        assert!(reply_header_rest(EXTENDED_REPLY_MAGIC, ReplyMode::Structured).is_err());
        assert_eq!(
            reply_header_rest(STRUCTURED_REPLY_MAGIC, ReplyMode::Structured).unwrap(),
            16
        );
        let mut h = [0u8; 20];
        h[0..8].copy_from_slice(&REPLY_MAGIC.to_be_bytes());
        h[16..20].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_option_reply_header(&h).is_err());
        assert!(parse_reply_header(SIMPLE_REPLY_MAGIC, &[0; 11]).is_err());
    }
}
