//! Numbers of the NBD protocol (doc/proto.md of the NetworkBlockDevice project, and the
//! EXTENDED_HEADERS extension), named as the specification names them.
//!
//! Kept in one place so the wire code reads like the specification and nothing else
//! hard-codes a magic number.

/// `NBDMAGIC`, the first 8 bytes a server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: newstyle negotiation, also the magic of every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// The oldstyle negotiation's second magic (`cliserv_magic`); not supported.
pub const CLISERV_MAGIC: u64 = 0x00_4202_8186_1253;
/// Magic of every fixed-newstyle option reply.
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const EXTENDED_REQUEST_MAGIC: u32 = 0x21e4_1c71;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
pub const EXTENDED_REPLY_MAGIC: u32 = 0x6e8a_278c;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;
pub const FLAG_BLOCK_STATUS_PAYLOAD: u16 = 1 << 12;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// Option replies.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_FLAG_ERROR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR | 1;
pub const REP_ERR_POLICY: u32 = REP_FLAG_ERROR | 2;
pub const REP_ERR_INVALID: u32 = REP_FLAG_ERROR | 3;
pub const REP_ERR_PLATFORM: u32 = REP_FLAG_ERROR | 4;
pub const REP_ERR_TLS_REQD: u32 = REP_FLAG_ERROR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_FLAG_ERROR | 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_FLAG_ERROR | 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_FLAG_ERROR | 8;
pub const REP_ERR_TOO_BIG: u32 = REP_FLAG_ERROR | 9;
pub const REP_ERR_EXT_HEADER_REQD: u32 = REP_FLAG_ERROR | 10;

// Information types of NBD_REP_INFO.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
pub const CMD_FLAG_PAYLOAD_LEN: u16 = 1 << 5;

// Structured reply flags and chunk types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_BLOCK_STATUS_EXT: u16 = 6;
pub const REPLY_TYPE_FLAG_ERROR: u16 = 1 << 15;
pub const REPLY_TYPE_ERROR: u16 = REPLY_TYPE_FLAG_ERROR | 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = REPLY_TYPE_FLAG_ERROR | 2;

// base:allocation flags.
pub const STATE_HOLE: u64 = 1 << 0;
pub const STATE_ZERO: u64 = 1 << 1;
/// qemu:dirty-bitmap:NAME flag.
pub const STATE_DIRTY: u64 = 1 << 0;

// Error values.
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// The metadata context that reports holes and zeroes.
pub const CONTEXT_BASE_ALLOCATION: &str = "base:allocation";
/// QEMU's context reporting how deep in a backing chain a range is allocated.
pub const CONTEXT_QEMU_ALLOCATION_DEPTH: &str = "qemu:allocation-depth";
/// Prefix of QEMU's dirty bitmap contexts (`qemu:dirty-bitmap:NAME`).
pub const CONTEXT_QEMU_DIRTY_BITMAP_PREFIX: &str = "qemu:dirty-bitmap:";

/// The longest string the specification allows (export names, messages, context names).
pub const MAX_STRING: usize = 4096;

/// Name of an NBD error value, for messages.
pub fn errno_name(errno: u32) -> &'static str {
    match errno {
        EPERM => "EPERM",
        EIO => "EIO",
        ENOMEM => "ENOMEM",
        EINVAL => "EINVAL",
        ENOSPC => "ENOSPC",
        EOVERFLOW => "EOVERFLOW",
        ENOTSUP => "ENOTSUP",
        ESHUTDOWN => "ESHUTDOWN",
        _ => "unknown error",
    }
}

/// Name of an option, for messages.
pub fn option_name(option: u32) -> &'static str {
    match option {
        OPT_EXPORT_NAME => "NBD_OPT_EXPORT_NAME",
        OPT_ABORT => "NBD_OPT_ABORT",
        OPT_LIST => "NBD_OPT_LIST",
        OPT_STARTTLS => "NBD_OPT_STARTTLS",
        OPT_INFO => "NBD_OPT_INFO",
        OPT_GO => "NBD_OPT_GO",
        OPT_STRUCTURED_REPLY => "NBD_OPT_STRUCTURED_REPLY",
        OPT_LIST_META_CONTEXT => "NBD_OPT_LIST_META_CONTEXT",
        OPT_SET_META_CONTEXT => "NBD_OPT_SET_META_CONTEXT",
        OPT_EXTENDED_HEADERS => "NBD_OPT_EXTENDED_HEADERS",
        _ => "unknown option",
    }
}

/// Name of an option reply type, for messages.
pub fn reply_name(reply: u32) -> &'static str {
    match reply {
        REP_ACK => "NBD_REP_ACK",
        REP_SERVER => "NBD_REP_SERVER",
        REP_INFO => "NBD_REP_INFO",
        REP_META_CONTEXT => "NBD_REP_META_CONTEXT",
        REP_ERR_UNSUP => "NBD_REP_ERR_UNSUP",
        REP_ERR_POLICY => "NBD_REP_ERR_POLICY",
        REP_ERR_INVALID => "NBD_REP_ERR_INVALID",
        REP_ERR_PLATFORM => "NBD_REP_ERR_PLATFORM",
        REP_ERR_TLS_REQD => "NBD_REP_ERR_TLS_REQD",
        REP_ERR_UNKNOWN => "NBD_REP_ERR_UNKNOWN",
        REP_ERR_SHUTDOWN => "NBD_REP_ERR_SHUTDOWN",
        REP_ERR_BLOCK_SIZE_REQD => "NBD_REP_ERR_BLOCK_SIZE_REQD",
        REP_ERR_TOO_BIG => "NBD_REP_ERR_TOO_BIG",
        REP_ERR_EXT_HEADER_REQD => "NBD_REP_ERR_EXT_HEADER_REQD",
        _ if reply & REP_FLAG_ERROR != 0 => "unknown error reply",
        _ => "unknown reply",
    }
}

/// Name of a command, for messages.
pub fn command_name(command: u16) -> &'static str {
    match command {
        CMD_READ => "NBD_CMD_READ",
        CMD_WRITE => "NBD_CMD_WRITE",
        CMD_DISC => "NBD_CMD_DISC",
        CMD_FLUSH => "NBD_CMD_FLUSH",
        CMD_TRIM => "NBD_CMD_TRIM",
        CMD_CACHE => "NBD_CMD_CACHE",
        CMD_WRITE_ZEROES => "NBD_CMD_WRITE_ZEROES",
        CMD_BLOCK_STATUS => "NBD_CMD_BLOCK_STATUS",
        _ => "unknown command",
    }
}

/// Name of a structured reply chunk type, for messages.
pub fn chunk_name(kind: u16) -> &'static str {
    match kind {
        REPLY_TYPE_NONE => "NBD_REPLY_TYPE_NONE",
        REPLY_TYPE_OFFSET_DATA => "NBD_REPLY_TYPE_OFFSET_DATA",
        REPLY_TYPE_OFFSET_HOLE => "NBD_REPLY_TYPE_OFFSET_HOLE",
        REPLY_TYPE_BLOCK_STATUS => "NBD_REPLY_TYPE_BLOCK_STATUS",
        REPLY_TYPE_BLOCK_STATUS_EXT => "NBD_REPLY_TYPE_BLOCK_STATUS_EXT",
        REPLY_TYPE_ERROR => "NBD_REPLY_TYPE_ERROR",
        REPLY_TYPE_ERROR_OFFSET => "NBD_REPLY_TYPE_ERROR_OFFSET",
        _ if kind & REPLY_TYPE_FLAG_ERROR != 0 => "unknown error chunk",
        _ => "unknown chunk",
    }
}
