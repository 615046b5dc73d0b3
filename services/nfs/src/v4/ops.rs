//! NFSv4.1/4.2 COMPOUND messages (RFC 8881, RFC 7862): the operations ferry sends, their
//! encoders, a bounded decoder for COMPOUND replies, and the status codes with their
//! meanings.
//!
//! Operations are encoded into an [`Ops`] list without the leading SEQUENCE, because the
//! session adds SEQUENCE with a slot chosen only when the request is sent (and again
//! when it is retried). Replies are read with [`Reply`], which checks each result's
//! operation number and status in turn; every length read from the wire is bounded.

use std::fmt;

use crate::error::ErrorKind;
use crate::v3::proto::Verifier;
use crate::xdr::{Decoder, Encoder, XdrError, XdrResult};

pub const NFS4_PROGRAM: u32 = 100_003;
pub const NFS4_VERSION: u32 = 4;
pub const NFSPROC4_COMPOUND: u32 = 1;
/// The standard NFSv4 port (no portmapper lookup for v4).
pub const NFS4_PORT: u16 = 2049;

pub const OP_CLOSE: u32 = 4;
pub const OP_COMMIT: u32 = 5;
pub const OP_DELEGRETURN: u32 = 8;
pub const OP_GETATTR: u32 = 9;
pub const OP_GETFH: u32 = 10;
pub const OP_LOOKUP: u32 = 15;
pub const OP_OPEN: u32 = 18;
pub const OP_PUTFH: u32 = 22;
pub const OP_PUTROOTFH: u32 = 24;
pub const OP_READ: u32 = 25;
pub const OP_SETATTR: u32 = 34;
pub const OP_WRITE: u32 = 38;
pub const OP_BIND_CONN_TO_SESSION: u32 = 41;
pub const OP_EXCHANGE_ID: u32 = 42;
pub const OP_CREATE_SESSION: u32 = 43;
pub const OP_DESTROY_SESSION: u32 = 44;
pub const OP_SEQUENCE: u32 = 53;
pub const OP_DESTROY_CLIENTID: u32 = 57;
pub const OP_RECLAIM_COMPLETE: u32 = 58;
pub const OP_DEALLOCATE: u32 = 62;
pub const OP_SEEK: u32 = 69;

/// Length of a SEQUENCE4resok: session id, sequence id, slot id, highest slot id, target
/// highest slot id, status flags.
pub const SEQUENCE_OK_LEN: usize = 16 + 5 * 4;
/// Results before the READ in a read compound: SEQUENCE and PUTFH.
pub const READ_PREFIX: &[(u32, usize)] = &[(OP_SEQUENCE, SEQUENCE_OK_LEN), (OP_PUTFH, 0)];

/// Largest NFSv4 file handle (NFS4_FHSIZE).
pub const NFS4_FHSIZE: usize = 128;
/// NFS4_OPAQUE_LIMIT: owners, tags, scopes.
pub const OPAQUE_LIMIT: usize = 1024;
/// Results accepted in one reply (ferry never sends more operations than this).
pub const MAX_RESULTS: usize = 64;
/// Words accepted in an attribute bitmap.
const MAX_BITMAP: usize = 8;
/// Bytes accepted in one attribute list.
const MAX_ATTRS: usize = 4096;

/// File types (nfs_ftype4).
pub const NF4REG: u32 = 1;
pub const NF4DIR: u32 = 2;

/// Attributes ferry reads.
pub const FATTR4_TYPE: u32 = 1;
pub const FATTR4_SIZE: u32 = 4;
pub const FATTR4_LEASE_TIME: u32 = 10;
pub const FATTR4_MAXREAD: u32 = 30;
pub const FATTR4_MAXWRITE: u32 = 31;
pub const FATTR4_MODE: u32 = 33;

pub const OPEN4_SHARE_ACCESS_READ: u32 = 1;
pub const OPEN4_SHARE_ACCESS_BOTH: u32 = 3;
/// Ask the server not to hand out a delegation (ferry has no callback channel).
pub const OPEN4_SHARE_ACCESS_WANT_NO_DELEG: u32 = 0x0400;

pub const UNSTABLE4: u32 = 0;
pub const FILE_SYNC4: u32 = 2;

pub const NFS4_CONTENT_DATA: u32 = 0;
pub const NFS4_CONTENT_HOLE: u32 = 1;

const EXCHGID4_FLAG_USE_NON_PNFS: u32 = 0x0001_0000;
const SP4_NONE: u32 = 0;
const CDFC4_FORE: u32 = 0x1;
/// OPEN arguments (RFC 8881 section 18.16).
const OPEN4_SHARE_DENY_NONE: u32 = 0;
const OPEN4_NOCREATE: u32 = 0;
const OPEN4_CREATE: u32 = 1;
const GUARDED4: u32 = 1;
const CLAIM_NULL: u32 = 0;
const CLAIM_PREVIOUS: u32 = 1;
const CLAIM_FH: u32 = 4;
const OPEN_DELEGATE_NONE: u32 = 0;
const OPEN_DELEGATE_READ: u32 = 1;
const OPEN_DELEGATE_WRITE: u32 = 2;
const OPEN_DELEGATE_NONE_EXT: u32 = 3;
/// nfs_space_limit4 kinds of a write delegation.
const NFS_LIMIT_SIZE: u32 = 1;
const NFS_LIMIT_BLOCKS: u32 = 2;
/// why_no_delegation4 values followed by a bool (WND4_CONTENTION, WND4_RESOURCE).
const WND4_CONTENTION: u32 = 7;
const WND4_RESOURCE: u32 = 8;
/// The back channel asked for in CREATE_SESSION: the smallest, ferry serves no callbacks.
const BACK_CHANNEL: ChannelAttrs = ChannelAttrs {
    header_pad: 0,
    max_request: 4096,
    max_response: 4096,
    max_response_cached: 0,
    max_ops: 2,
    max_requests: 1,
};
/// The callback program number sent (unused: no back channel is served).
const CALLBACK_PROGRAM: u32 = 0x4000_0000;
const AUTH_NONE: u32 = 0;
/// Words of a stateid4 on the wire: seqid and 12 bytes of `other`.
const STATEID_LEN: usize = 4 + 12;
/// Length of a session id (sessionid4).
const SESSION_ID_LEN: usize = 16;

/// An NFSv4 status (nfsstat4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status(pub u32);

impl Status {
    pub const OK: Self = Self(0);
    pub const PERM: Self = Self(1);
    pub const NOENT: Self = Self(2);
    pub const NXIO: Self = Self(6);
    pub const ACCESS: Self = Self(13);
    pub const EXIST: Self = Self(17);
    pub const NOTDIR: Self = Self(20);
    pub const ISDIR: Self = Self(21);
    pub const INVAL: Self = Self(22);
    pub const FBIG: Self = Self(27);
    pub const NOSPC: Self = Self(28);
    pub const ROFS: Self = Self(30);
    pub const NAMETOOLONG: Self = Self(63);
    pub const DQUOT: Self = Self(69);
    pub const STALE: Self = Self(70);
    pub const BADHANDLE: Self = Self(10001);
    pub const NOTSUPP: Self = Self(10004);
    pub const BADTYPE: Self = Self(10007);
    pub const DELAY: Self = Self(10008);
    pub const EXPIRED: Self = Self(10011);
    pub const GRACE: Self = Self(10013);
    pub const FHEXPIRED: Self = Self(10014);
    pub const SHARE_DENIED: Self = Self(10015);
    pub const WRONGSEC: Self = Self(10016);
    pub const MINOR_VERS_MISMATCH: Self = Self(10021);
    pub const STALE_CLIENTID: Self = Self(10022);
    pub const STALE_STATEID: Self = Self(10023);
    pub const BAD_STATEID: Self = Self(10025);
    pub const SYMLINK: Self = Self(10029);
    pub const OPENMODE: Self = Self(10038);
    pub const OP_ILLEGAL: Self = Self(10044);
    pub const ADMIN_REVOKED: Self = Self(10047);
    pub const BADSESSION: Self = Self(10052);
    pub const COMPLETE_ALREADY: Self = Self(10054);
    pub const SEQ_MISORDERED: Self = Self(10063);
    pub const DEADSESSION: Self = Self(10078);
    pub const WRONG_TYPE: Self = Self(10083);
    pub const DELEG_REVOKED: Self = Self(10087);
    pub const UNION_NOTSUPP: Self = Self(10090);

    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "OK",
            1 => "PERM (not owner)",
            2 => "NOENT (no such file or directory)",
            5 => "IO (I/O error)",
            6 => "NXIO (no data at or after the offset)",
            13 => "ACCESS (permission denied)",
            17 => "EXIST (file exists)",
            18 => "XDEV",
            20 => "NOTDIR (not a directory)",
            21 => "ISDIR (is a directory)",
            22 => "INVAL (invalid argument)",
            27 => "FBIG (file too large)",
            28 => "NOSPC (no space left on device)",
            30 => "ROFS (read-only file system)",
            63 => "NAMETOOLONG",
            69 => "DQUOT (quota exceeded)",
            70 => "STALE (stale file handle)",
            10001 => "BADHANDLE",
            10004 => "NOTSUPP (not supported)",
            10005 => "TOOSMALL",
            10006 => "SERVERFAULT",
            10007 => "BADTYPE",
            10008 => "DELAY (server busy, try later)",
            10010 => "DENIED",
            10011 => "EXPIRED (lease expired)",
            10013 => "GRACE (server in grace period)",
            10014 => "FHEXPIRED",
            10015 => "SHARE_DENIED",
            10016 => "WRONGSEC (security flavor not allowed)",
            10018 => "RESOURCE",
            10020 => "NOFILEHANDLE",
            10021 => "MINOR_VERS_MISMATCH",
            10022 => "STALE_CLIENTID",
            10023 => "STALE_STATEID",
            10024 => "OLD_STATEID",
            10025 => "BAD_STATEID",
            10029 => "SYMLINK",
            10036 => "BADXDR",
            10038 => "OPENMODE",
            10041 => "BADNAME",
            10044 => "OP_ILLEGAL",
            10047 => "ADMIN_REVOKED",
            10052 => "BADSESSION",
            10053 => "BADSLOT",
            10054 => "COMPLETE_ALREADY",
            10055 => "CONN_NOT_BOUND_TO_SESSION",
            10063 => "SEQ_MISORDERED",
            10064 => "SEQUENCE_POS",
            10065 => "REQ_TOO_BIG",
            10066 => "REP_TOO_BIG",
            10070 => "TOO_MANY_OPS",
            10071 => "OP_NOT_IN_SESSION",
            10074 => "CLIENTID_BUSY",
            10077 => "BAD_HIGH_SLOT",
            10078 => "DEADSESSION",
            10081 => "NOT_ONLY_OP",
            10082 => "WRONG_CRED",
            10083 => "WRONG_TYPE",
            10087 => "DELEG_REVOKED",
            10090 => "UNION_NOTSUPP",
            _ => "unknown status",
        }
    }

    /// The server lost our client id or session (typically it restarted).
    pub fn is_session_loss(self) -> bool {
        matches!(
            self,
            Self::BADSESSION
                | Self::DEADSESSION
                | Self::STALE_CLIENTID
                | Self::EXPIRED
                | Self::STALE_STATEID
                | Self::BAD_STATEID
                | Self::ADMIN_REVOKED
                | Self::DELEG_REVOKED
        )
    }

    /// The kind of failure this status is.
    pub fn kind(self) -> ErrorKind {
        match self {
            Self::PERM | Self::ACCESS | Self::ROFS | Self::WRONGSEC => ErrorKind::PermissionDenied,
            Self::NOENT | Self::STALE | Self::BADHANDLE | Self::FHEXPIRED => ErrorKind::NotFound,
            Self::NOSPC | Self::DQUOT => ErrorKind::NoSpace,
            Self::INVAL
            | Self::FBIG
            | Self::ISDIR
            | Self::NOTDIR
            | Self::SYMLINK
            | Self::WRONG_TYPE
            | Self::BADTYPE
            | Self::NAMETOOLONG
            | Self::SHARE_DENIED
            | Self::OPENMODE => ErrorKind::InvalidInput,
            Self::NOTSUPP | Self::OP_ILLEGAL | Self::UNION_NOTSUPP | Self::MINOR_VERS_MISMATCH => {
                ErrorKind::Unsupported
            }
            Self::DELAY | Self::GRACE => ErrorKind::Timeout,
            s if s.is_session_loss() => ErrorKind::Disconnected,
            _ => ErrorKind::Io,
        }
    }

    /// The operation is not implemented by this server.
    pub fn is_unsupported(self) -> bool {
        matches!(self, Self::NOTSUPP | Self::OP_ILLEGAL | Self::UNION_NOTSUPP)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NFS4ERR_{} ({})", self.name(), self.0)
    }
}

pub fn op_name(op: u32) -> &'static str {
    match op {
        OP_CLOSE => "CLOSE",
        OP_COMMIT => "COMMIT",
        OP_DELEGRETURN => "DELEGRETURN",
        OP_GETATTR => "GETATTR",
        OP_GETFH => "GETFH",
        OP_LOOKUP => "LOOKUP",
        OP_OPEN => "OPEN",
        OP_PUTFH => "PUTFH",
        OP_PUTROOTFH => "PUTROOTFH",
        OP_READ => "READ",
        OP_SETATTR => "SETATTR",
        OP_WRITE => "WRITE",
        OP_BIND_CONN_TO_SESSION => "BIND_CONN_TO_SESSION",
        OP_EXCHANGE_ID => "EXCHANGE_ID",
        OP_CREATE_SESSION => "CREATE_SESSION",
        OP_DESTROY_SESSION => "DESTROY_SESSION",
        OP_SEQUENCE => "SEQUENCE",
        OP_DESTROY_CLIENTID => "DESTROY_CLIENTID",
        OP_RECLAIM_COMPLETE => "RECLAIM_COMPLETE",
        OP_DEALLOCATE => "DEALLOCATE",
        OP_SEEK => "SEEK",
        _ => "operation",
    }
}

/// A session id (sessionid4).
pub type SessionId = [u8; SESSION_ID_LEN];

/// An NFSv4 file handle.
#[derive(Clone, PartialEq, Eq)]
pub struct Fh(pub Vec<u8>);

impl fmt::Debug for Fh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fh({} bytes)", self.0.len())
    }
}

/// A state id (stateid4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateId {
    pub seqid: u32,
    pub other: [u8; 12],
}

impl StateId {
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        let seqid = d.u32()?;
        let mut other = [0u8; 12];
        other.copy_from_slice(d.fixed(12)?);
        Ok(Self { seqid, other })
    }

    fn encode(&self, e: &mut Encoder) {
        e.u32(self.seqid).fixed(&self.other);
    }
}

/// Attributes ferry reads (each present when the server returned it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attrs {
    pub ftype: Option<u32>,
    pub size: Option<u64>,
    pub lease_time: Option<u32>,
    pub maxread: Option<u64>,
    pub maxwrite: Option<u64>,
}

impl Attrs {
    pub fn type_name(&self) -> &'static str {
        match self.ftype {
            Some(1) => "a regular file",
            Some(2) => "a directory",
            Some(3) => "a block device",
            Some(4) => "a character device",
            Some(5) => "a symbolic link",
            Some(6) => "a socket",
            Some(7) => "a FIFO",
            Some(8) => "a named attribute directory",
            _ => "of an unknown type",
        }
    }
}

/// The attributes of `attrs` as a bitmap4.
fn bitmap(attrs: &[u32]) -> Vec<u32> {
    let words = attrs.iter().map(|a| a / 32 + 1).max().unwrap_or(0) as usize;
    let mut map = vec![0u32; words];
    for a in attrs {
        map[(a / 32) as usize] |= 1 << (a % 32);
    }
    map
}

fn encode_bitmap(e: &mut Encoder, attrs: &[u32]) {
    let map = bitmap(attrs);
    e.u32(map.len() as u32);
    for w in map {
        e.u32(w);
    }
}

/// A list of operations to send after SEQUENCE (or alone, for the session-less ones).
#[derive(Debug, Default)]
pub struct Ops {
    enc: Encoder,
    ops: Vec<u32>,
    /// Where the file's open state id was encoded: [`compound`] writes the session's
    /// current one there, so a request prepared before a recovery is sent with the
    /// state id the recovery obtained.
    open_state: Vec<usize>,
}

impl Ops {
    pub fn new() -> Self {
        Self::default()
    }

    fn op(&mut self, op: u32) -> &mut Encoder {
        self.ops.push(op);
        self.enc.u32(op);
        &mut self.enc
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Encodes the open state id `stateid`, remembering where.
    fn open_stateid(&mut self, stateid: &StateId) -> &mut Encoder {
        self.open_state.push(self.enc.as_slice().len());
        stateid.encode(&mut self.enc);
        &mut self.enc
    }

    /// Reclaim of the open of the current file handle the client had before the server
    /// restarted (CLAIM_PREVIOUS, RFC 8881 section 8.4.2.1), in the server's grace period.
    pub fn open_previous(&mut self, clientid: u64, owner: &[u8], access: u32) -> &mut Self {
        self.open_head(clientid, owner, access)
            .u32(OPEN4_NOCREATE)
            .u32(CLAIM_PREVIOUS)
            .u32(OPEN_DELEGATE_NONE); // the delegation held before: none
        self
    }

    /// OPEN up to its openflag4: the share access and the open owner.
    fn open_head(&mut self, clientid: u64, owner: &[u8], access: u32) -> &mut Encoder {
        self.op(OP_OPEN)
            .u32(0) // seqid, ignored in 4.1
            .u32(access | OPEN4_SHARE_ACCESS_WANT_NO_DELEG)
            .u32(OPEN4_SHARE_DENY_NONE)
            .u64(clientid)
            .opaque(owner)
    }

    /// OPEN of the current file handle without a name (CLAIM_FH, RFC 8881 section
    /// 18.16.3): the new open after the server lost the old one.
    pub fn open_fh(&mut self, clientid: u64, owner: &[u8], access: u32) -> &mut Self {
        self.open_head(clientid, owner, access)
            .u32(OPEN4_NOCREATE)
            .u32(CLAIM_FH);
        self
    }

    #[cfg(test)]
    pub fn opcodes(&self) -> &[u32] {
        &self.ops
    }

    pub fn putrootfh(&mut self) -> &mut Self {
        self.op(OP_PUTROOTFH);
        self
    }

    pub fn putfh(&mut self, fh: &Fh) -> &mut Self {
        self.op(OP_PUTFH).opaque(&fh.0);
        self
    }

    pub fn lookup(&mut self, name: &str) -> &mut Self {
        self.op(OP_LOOKUP).string(name);
        self
    }

    pub fn getfh(&mut self) -> &mut Self {
        self.op(OP_GETFH);
        self
    }

    pub fn getattr(&mut self, attrs: &[u32]) -> &mut Self {
        let e = self.op(OP_GETATTR);
        encode_bitmap(e, attrs);
        self
    }

    /// OPEN by name in the current directory (CLAIM_NULL). `create`: create with `mode`
    /// when missing, failing with EXIST when present (GUARDED4).
    pub fn open(
        &mut self,
        clientid: u64,
        owner: &[u8],
        access: u32,
        name: &str,
        create: Option<u32>,
    ) -> &mut Self {
        let e = self.open_head(clientid, owner, access);
        match create {
            None => {
                e.u32(OPEN4_NOCREATE);
            }
            Some(mode) => {
                e.u32(OPEN4_CREATE).u32(GUARDED4);
                encode_bitmap(e, &[FATTR4_MODE]);
                e.opaque(&mode.to_be_bytes());
            }
        }
        e.u32(CLAIM_NULL).string(name);
        self
    }

    pub fn close(&mut self, stateid: &StateId) -> &mut Self {
        self.op(OP_CLOSE).u32(0);
        self.open_stateid(stateid);
        self
    }

    pub fn delegreturn(&mut self, stateid: &StateId) -> &mut Self {
        let e = self.op(OP_DELEGRETURN);
        stateid.encode(e);
        self
    }

    pub fn setattr_size(&mut self, stateid: &StateId, size: u64) -> &mut Self {
        self.op(OP_SETATTR);
        let e = self.open_stateid(stateid);
        encode_bitmap(e, &[FATTR4_SIZE]);
        e.opaque(&size.to_be_bytes());
        self
    }

    pub fn read(&mut self, stateid: &StateId, offset: u64, count: u32) -> &mut Self {
        self.op(OP_READ);
        self.open_stateid(stateid).u64(offset).u32(count);
        self
    }

    /// WRITE whose `len` bytes of data follow the encoded operations on the wire, so it
    /// must be the last operation.
    pub fn write_head(
        &mut self,
        stateid: &StateId,
        offset: u64,
        stable: u32,
        len: u32,
    ) -> &mut Self {
        self.op(OP_WRITE);
        self.open_stateid(stateid).u64(offset).u32(stable).u32(len);
        self
    }

    pub fn commit(&mut self, offset: u64, count: u32) -> &mut Self {
        self.op(OP_COMMIT).u64(offset).u32(count);
        self
    }

    pub fn seek(&mut self, stateid: &StateId, offset: u64, what: u32) -> &mut Self {
        self.op(OP_SEEK);
        self.open_stateid(stateid).u64(offset).u32(what);
        self
    }

    pub fn deallocate(&mut self, stateid: &StateId, offset: u64, len: u64) -> &mut Self {
        self.op(OP_DEALLOCATE);
        self.open_stateid(stateid).u64(offset).u64(len);
        self
    }

    pub fn reclaim_complete(&mut self) -> &mut Self {
        self.op(OP_RECLAIM_COMPLETE).bool(false);
        self
    }

    pub fn exchange_id(&mut self, verifier: &Verifier, owner: &[u8]) -> &mut Self {
        let e = self.op(OP_EXCHANGE_ID);
        e.fixed(verifier)
            .opaque(owner)
            .u32(EXCHGID4_FLAG_USE_NON_PNFS)
            .u32(SP4_NONE)
            .u32(0); // no implementation id
        self
    }

    pub fn create_session(
        &mut self,
        clientid: u64,
        sequence: u32,
        fore: &ChannelAttrs,
    ) -> &mut Self {
        let e = self.op(OP_CREATE_SESSION);
        e.u64(clientid).u32(sequence).u32(0); // no flags: no back channel
        fore.encode(e);
        BACK_CHANNEL.encode(e);
        e.u32(CALLBACK_PROGRAM).u32(1).u32(AUTH_NONE); // one security parameter
        self
    }

    pub fn bind_conn(&mut self, session: &SessionId) -> &mut Self {
        self.op(OP_BIND_CONN_TO_SESSION)
            .fixed(session)
            .u32(CDFC4_FORE)
            .bool(false);
        self
    }

    pub fn destroy_session(&mut self, session: &SessionId) -> &mut Self {
        self.op(OP_DESTROY_SESSION).fixed(session);
        self
    }

    pub fn destroy_clientid(&mut self, clientid: u64) -> &mut Self {
        self.op(OP_DESTROY_CLIENTID).u64(clientid);
        self
    }
}

/// A whole COMPOUND4args: header, an optional SEQUENCE, then `ops`.
/// The COMPOUND of `ops` after `sequence`; `stateid`, when given, replaces every open
/// state id in `ops`.
pub fn compound(
    minor: u32,
    sequence: Option<&Sequence>,
    ops: &Ops,
    stateid: Option<&StateId>,
) -> Vec<u8> {
    let count = ops.len() + usize::from(sequence.is_some());
    let mut e = Encoder::with_capacity(64 + ops.enc.as_slice().len());
    e.opaque(&[]).u32(minor).u32(count as u32);
    if let Some(s) = sequence {
        e.u32(OP_SEQUENCE)
            .fixed(&s.session)
            .u32(s.seqid)
            .u32(s.slot)
            .u32(s.highest_slot)
            .bool(false);
    }
    let mut out = e.into_vec();
    let base = out.len();
    out.extend_from_slice(ops.enc.as_slice());
    if let Some(id) = stateid {
        for at in &ops.open_state {
            let at = base + at;
            out[at..at + 4].copy_from_slice(&id.seqid.to_be_bytes());
            out[at + 4..at + STATEID_LEN].copy_from_slice(&id.other);
        }
    }
    out
}

/// SEQUENCE arguments.
#[derive(Debug, Clone, Copy)]
pub struct Sequence {
    pub session: SessionId,
    pub seqid: u32,
    pub slot: u32,
    pub highest_slot: u32,
}

/// A SEQUENCE4resok.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceOk {
    pub session: SessionId,
    pub seqid: u32,
    pub slot: u32,
    pub highest_slot: u32,
    pub target_highest_slot: u32,
    pub status_flags: u32,
}

/// channel_attrs4 (without RDMA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelAttrs {
    pub header_pad: u32,
    pub max_request: u32,
    pub max_response: u32,
    pub max_response_cached: u32,
    pub max_ops: u32,
    pub max_requests: u32,
}

impl ChannelAttrs {
    fn encode(&self, e: &mut Encoder) {
        e.u32(self.header_pad)
            .u32(self.max_request)
            .u32(self.max_response)
            .u32(self.max_response_cached)
            .u32(self.max_ops)
            .u32(self.max_requests)
            .u32(0); // no RDMA
    }

    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        let attrs = Self {
            header_pad: d.u32()?,
            max_request: d.u32()?,
            max_response: d.u32()?,
            max_response_cached: d.u32()?,
            max_ops: d.u32()?,
            max_requests: d.u32()?,
        };
        let rdma = d.u32()?;
        if rdma > 1 {
            return Err(XdrError(format!(
                "{rdma} RDMA values in channel attributes"
            )));
        }
        if rdma == 1 {
            d.u32()?;
        }
        Ok(attrs)
    }
}

/// Why a COMPOUND's reply is not what was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyError {
    /// Operation `op` (the `index`-th of the compound) failed with `status`.
    Status {
        op: u32,
        index: usize,
        status: Status,
    },
    /// The reply does not decode.
    Malformed(String),
}

impl From<XdrError> for ReplyError {
    fn from(e: XdrError) -> Self {
        Self::Malformed(e.0)
    }
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Status { op, status, .. } => write!(f, "{} failed: {status}", op_name(*op)),
            Self::Malformed(m) => write!(f, "malformed reply: {m}"),
        }
    }
}

pub type ReplyResult<T> = Result<T, ReplyError>;

/// Reads a COMPOUND4res result by result.
#[derive(Debug)]
pub struct Reply<'a> {
    pub status: Status,
    d: Decoder<'a>,
    left: usize,
    index: usize,
}

impl<'a> Reply<'a> {
    pub fn parse(body: &'a [u8]) -> ReplyResult<Self> {
        let mut d = Decoder::new(body);
        let status = Status(d.u32()?);
        d.opaque(OPAQUE_LIMIT, "COMPOUND tag")?;
        let left = d.u32()? as usize;
        if left > MAX_RESULTS {
            return Err(ReplyError::Malformed(format!(
                "{left} results in one reply (at most {MAX_RESULTS} expected)"
            )));
        }
        Ok(Self {
            status,
            d,
            left,
            index: 0,
        })
    }

    /// Whether another result follows.
    pub fn has_more(&self) -> bool {
        self.left > 0
    }

    /// Starts the next result, which must be `op`'s; fails with its status unless OK.
    /// A reply that ends early carries the COMPOUND's own status.
    pub fn next(&mut self, op: u32) -> ReplyResult<()> {
        if self.left == 0 {
            if self.status != Status::OK {
                return Err(ReplyError::Status {
                    op,
                    index: self.index,
                    status: self.status,
                });
            }
            return Err(ReplyError::Malformed(format!(
                "the reply ends before the result of {}",
                op_name(op)
            )));
        }
        self.left -= 1;
        let index = self.index;
        self.index += 1;
        let got = self.d.u32()?;
        if got != op {
            return Err(ReplyError::Malformed(format!(
                "result of operation {got} where {} was expected",
                op_name(op)
            )));
        }
        let status = Status(self.d.u32()?);
        if status != Status::OK {
            return Err(ReplyError::Status { op, index, status });
        }
        Ok(())
    }

    /// The next result, which must be `op`'s and carry nothing after its status.
    pub fn simple(&mut self, op: u32) -> ReplyResult<()> {
        self.next(op)
    }

    pub fn sequence(&mut self) -> ReplyResult<SequenceOk> {
        self.next(OP_SEQUENCE)?;
        let d = &mut self.d;
        let mut session = [0u8; SESSION_ID_LEN];
        session.copy_from_slice(d.fixed(SESSION_ID_LEN)?);
        Ok(SequenceOk {
            session,
            seqid: d.u32()?,
            slot: d.u32()?,
            highest_slot: d.u32()?,
            target_highest_slot: d.u32()?,
            status_flags: d.u32()?,
        })
    }

    pub fn getfh(&mut self) -> ReplyResult<Fh> {
        self.next(OP_GETFH)?;
        Ok(Fh(self.d.opaque(NFS4_FHSIZE, "file handle")?.to_vec()))
    }

    pub fn getattr(&mut self) -> ReplyResult<Attrs> {
        self.next(OP_GETATTR)?;
        decode_fattr(&mut self.d)
    }

    /// OPEN4resok: the open state id, and a delegation's state id when the server gave
    /// one anyway.
    pub fn open(&mut self) -> ReplyResult<(StateId, Option<StateId>)> {
        self.next(OP_OPEN)?;
        let d = &mut self.d;
        let stateid = StateId::decode(d)?;
        d.bool()?; // change_info4: atomic, before, after
        d.u64()?;
        d.u64()?;
        d.u32()?; // rflags
        skip_bitmap(d)?; // attrset
        let deleg = match d.u32()? {
            OPEN_DELEGATE_NONE => None,
            kind @ (OPEN_DELEGATE_READ | OPEN_DELEGATE_WRITE) => {
                let id = StateId::decode(d)?;
                d.bool()?; // recall
                if kind == OPEN_DELEGATE_WRITE {
                    match d.u32()? {
                        NFS_LIMIT_SIZE => {
                            d.u64()?;
                        }
                        NFS_LIMIT_BLOCKS => {
                            d.u32()?;
                            d.u32()?;
                        }
                        other => {
                            return Err(ReplyError::Malformed(format!(
                                "unknown space limit kind {other}"
                            )))
                        }
                    }
                }
                d.u32()?; // nfsace4: type, flag, mask, who
                d.u32()?;
                d.u32()?;
                d.opaque(OPAQUE_LIMIT, "ACE principal")?;
                Some(id)
            }
            OPEN_DELEGATE_NONE_EXT => {
                // Why there is none, and a bool for two of the reasons.
                if matches!(d.u32()?, WND4_CONTENTION | WND4_RESOURCE) {
                    d.bool()?;
                }
                None
            }
            other => {
                return Err(ReplyError::Malformed(format!(
                    "unknown delegation type {other}"
                )))
            }
        };
        Ok((stateid, deleg))
    }

    /// SETATTR4res carries the attributes set even when it fails: read them first.
    pub fn setattr(&mut self) -> ReplyResult<()> {
        match self.next(OP_SETATTR) {
            Ok(()) => skip_bitmap(&mut self.d).map_err(Into::into),
            Err(e) => Err(e),
        }
    }

    /// READ4resok as delivered with a sink: eof and the data's length, the data itself
    /// having gone to the caller's buffer.
    pub fn read_into_sink(&mut self) -> ReplyResult<(bool, u32)> {
        self.next(OP_READ)?;
        let eof = self.d.bool()?;
        let len = self.d.u32()?;
        Ok((eof, len))
    }

    /// WRITE4resok: bytes written, how stable, the write verifier.
    pub fn write(&mut self) -> ReplyResult<(u32, u32, Verifier)> {
        self.next(OP_WRITE)?;
        let count = self.d.u32()?;
        let committed = self.d.u32()?;
        let mut verf = [0u8; 8];
        verf.copy_from_slice(self.d.fixed(8)?);
        Ok((count, committed, verf))
    }

    pub fn commit(&mut self) -> ReplyResult<Verifier> {
        self.next(OP_COMMIT)?;
        let mut verf = [0u8; 8];
        verf.copy_from_slice(self.d.fixed(8)?);
        Ok(verf)
    }

    /// SEEK4resok: end of file reached, and the offset found.
    pub fn seek(&mut self) -> ReplyResult<(bool, u64)> {
        self.next(OP_SEEK)?;
        Ok((self.d.bool()?, self.d.u64()?))
    }

    /// EXCHANGE_ID4resok: client id and the sequence id for CREATE_SESSION (the rest of
    /// the result is not needed).
    pub fn exchange_id(&mut self) -> ReplyResult<(u64, u32)> {
        self.next(OP_EXCHANGE_ID)?;
        Ok((self.d.u64()?, self.d.u32()?))
    }

    /// CREATE_SESSION4resok: the session id and the fore channel's attributes.
    pub fn create_session(&mut self) -> ReplyResult<(SessionId, ChannelAttrs)> {
        self.next(OP_CREATE_SESSION)?;
        let mut id = [0u8; SESSION_ID_LEN];
        id.copy_from_slice(self.d.fixed(SESSION_ID_LEN)?);
        self.d.u32()?; // sequence
        self.d.u32()?; // flags
        let fore = ChannelAttrs::decode(&mut self.d)?;
        ChannelAttrs::decode(&mut self.d)?;
        Ok((id, fore))
    }

    pub fn bind_conn(&mut self) -> ReplyResult<()> {
        self.next(OP_BIND_CONN_TO_SESSION)?;
        self.d.fixed(SESSION_ID_LEN)?;
        self.d.u32()?;
        self.d.bool()?;
        Ok(())
    }
}

fn skip_bitmap(d: &mut Decoder<'_>) -> XdrResult<()> {
    let words = d.u32()? as usize;
    if words > MAX_BITMAP {
        return Err(XdrError(format!(
            "attribute bitmap of {words} words exceeds {MAX_BITMAP}"
        )));
    }
    d.skip(words * 4)
}

/// A fattr4 holding at most the attributes ferry asks for.
fn decode_fattr(d: &mut Decoder<'_>) -> ReplyResult<Attrs> {
    let words = d.u32()? as usize;
    if words > MAX_BITMAP {
        return Err(ReplyError::Malformed(format!(
            "attribute bitmap of {words} words exceeds {MAX_BITMAP}"
        )));
    }
    let mut map = [0u32; MAX_BITMAP];
    for w in map.iter_mut().take(words) {
        *w = d.u32()?;
    }
    let vals = d.opaque(MAX_ATTRS, "attribute values")?;
    let mut v = Decoder::new(vals);
    let mut attrs = Attrs::default();
    for (i, word) in map.iter().enumerate().take(words) {
        for bit in 0..32 {
            if word & (1 << bit) == 0 {
                continue;
            }
            match (i as u32) * 32 + bit {
                FATTR4_TYPE => attrs.ftype = Some(v.u32()?),
                FATTR4_SIZE => attrs.size = Some(v.u64()?),
                FATTR4_LEASE_TIME => attrs.lease_time = Some(v.u32()?),
                FATTR4_MAXREAD => attrs.maxread = Some(v.u64()?),
                FATTR4_MAXWRITE => attrs.maxwrite = Some(v.u64()?),
                other => {
                    return Err(ReplyError::Malformed(format!(
                        "attribute {other} returned but not asked for"
                    )))
                }
            }
        }
    }
    Ok(attrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply_header(e: &mut Encoder, status: u32, count: u32) {
        e.u32(status).opaque(b"").u32(count);
    }

    #[test]
    fn compound_layout() {
        let mut ops = Ops::new();
        ops.putfh(&Fh(vec![1, 2, 3])).read(
            &StateId {
                seqid: 1,
                other: [7; 12],
            },
            4096,
            512,
        );
        let seq = Sequence {
            session: [9; 16],
            seqid: 5,
            slot: 2,
            highest_slot: 3,
        };
        let bytes = compound(2, Some(&seq), &ops, None);
        let mut d = Decoder::new(&bytes);
        assert_eq!(d.opaque(8, "tag").unwrap(), b"");
        assert_eq!(d.u32().unwrap(), 2, "minor version");
        assert_eq!(d.u32().unwrap(), 3, "SEQUENCE + 2 operations");
        assert_eq!(d.u32().unwrap(), OP_SEQUENCE);
        assert_eq!(d.fixed(16).unwrap(), &[9; 16]);
        assert_eq!(
            (d.u32().unwrap(), d.u32().unwrap(), d.u32().unwrap()),
            (5, 2, 3)
        );
        assert!(!d.bool().unwrap());
        assert_eq!(d.u32().unwrap(), OP_PUTFH);
        assert_eq!(d.opaque(128, "fh").unwrap(), &[1, 2, 3]);
        assert_eq!(d.u32().unwrap(), OP_READ);
        assert_eq!(d.u32().unwrap(), 1);
        assert_eq!(d.fixed(12).unwrap(), &[7; 12]);
        assert_eq!((d.u64().unwrap(), d.u32().unwrap()), (4096, 512));
        assert_eq!(d.remaining(), 0);
        assert_eq!(ops.opcodes(), [OP_PUTFH, OP_READ]);
    }

    #[test]
    fn compound_writes_the_current_open_stateid_over_the_old_one() {
        let old = StateId {
            seqid: 1,
            other: [7; 12],
        };
        let new = StateId {
            seqid: 2,
            other: [8; 12],
        };
        let deleg = StateId {
            seqid: 3,
            other: [9; 12],
        };
        let mut ops = Ops::new();
        ops.putfh(&Fh(vec![1, 2, 3]))
            .read(&old, 4096, 512)
            .delegreturn(&deleg)
            .close(&old);
        let bytes = compound(2, None, &ops, Some(&new));
        let mut d = Decoder::new(&bytes);
        d.opaque(8, "tag").unwrap();
        assert_eq!((d.u32().unwrap(), d.u32().unwrap()), (2, 4));
        assert_eq!(d.u32().unwrap(), OP_PUTFH);
        d.opaque(128, "fh").unwrap();
        assert_eq!(d.u32().unwrap(), OP_READ);
        assert_eq!(StateId::decode(&mut d).unwrap(), new);
        assert_eq!((d.u64().unwrap(), d.u32().unwrap()), (4096, 512));
        assert_eq!(d.u32().unwrap(), OP_DELEGRETURN);
        assert_eq!(
            StateId::decode(&mut d).unwrap(),
            deleg,
            "not an open state id"
        );
        assert_eq!((d.u32().unwrap(), d.u32().unwrap()), (OP_CLOSE, 0));
        assert_eq!(StateId::decode(&mut d).unwrap(), new);
        assert_eq!(d.remaining(), 0);
        // Without a replacement the ids are the ones given.
        let bytes = compound(2, None, &ops, None);
        assert!(bytes.windows(12).any(|w| w == [7; 12]));
    }

    #[test]
    fn bitmaps_span_words() {
        assert_eq!(bitmap(&[FATTR4_TYPE, FATTR4_SIZE]), [0b10010]);
        assert_eq!(bitmap(&[FATTR4_MODE]), [0, 2]);
        assert_eq!(bitmap(&[FATTR4_MAXREAD, FATTR4_MAXWRITE]), [0xc000_0000]);
    }

    #[test]
    fn a_good_reply_decodes() {
        let mut e = Encoder::new();
        reply_header(&mut e, 0, 4);
        e.u32(OP_SEQUENCE).u32(0).fixed(&[1; 16]);
        e.u32(7).u32(0).u32(3).u32(15).u32(0);
        e.u32(OP_PUTROOTFH).u32(0);
        e.u32(OP_GETFH).u32(0).opaque(&[5; 20]);
        let mut vals = Encoder::new();
        vals.u32(NF4REG).u64(12345);
        e.u32(OP_GETATTR)
            .u32(0)
            .u32(1)
            .u32(0b10010)
            .opaque(vals.as_slice());
        let body = e.into_vec();
        let mut r = Reply::parse(&body).unwrap();
        let seq = r.sequence().unwrap();
        assert_eq!(
            (seq.seqid, seq.highest_slot, seq.target_highest_slot),
            (7, 3, 15)
        );
        r.simple(OP_PUTROOTFH).unwrap();
        assert_eq!(r.getfh().unwrap(), Fh(vec![5; 20]));
        let attrs = r.getattr().unwrap();
        assert_eq!(attrs.ftype, Some(NF4REG));
        assert_eq!(attrs.size, Some(12345));
        assert!(!r.has_more());
    }

    #[test]
    fn a_failed_operation_names_itself_and_its_position() {
        let mut e = Encoder::new();
        reply_header(&mut e, Status::NOENT.0, 3);
        e.u32(OP_SEQUENCE).u32(0).fixed(&[1; 16]);
        e.u32(7).u32(0).u32(3).u32(15).u32(0);
        e.u32(OP_PUTROOTFH).u32(0);
        e.u32(OP_LOOKUP).u32(Status::NOENT.0);
        let body = e.into_vec();
        let mut r = Reply::parse(&body).unwrap();
        r.sequence().unwrap();
        r.simple(OP_PUTROOTFH).unwrap();
        let err = r.simple(OP_LOOKUP).unwrap_err();
        assert_eq!(
            err,
            ReplyError::Status {
                op: OP_LOOKUP,
                index: 2,
                status: Status::NOENT
            }
        );
        assert!(
            err.to_string().contains("LOOKUP failed: NFS4ERR_NOENT"),
            "{err}"
        );
        // A reply with no results (minor version mismatch) carries the status alone.
        let mut e = Encoder::new();
        reply_header(&mut e, Status::MINOR_VERS_MISMATCH.0, 0);
        let body = e.into_vec();
        let mut r = Reply::parse(&body).unwrap();
        match r.exchange_id() {
            Err(ReplyError::Status { status, .. }) => {
                assert_eq!(status, Status::MINOR_VERS_MISMATCH)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_and_oversized_replies_are_errors_not_panics() {
        // Truncated at every length.
        let mut e = Encoder::new();
        reply_header(&mut e, 0, 2);
        e.u32(OP_SEQUENCE).u32(0).fixed(&[1; 16]);
        e.u32(7).u32(0).u32(3).u32(15).u32(0);
        e.u32(OP_GETFH).u32(0).opaque(&[5; 20]);
        let body = e.into_vec();
        for cut in 0..body.len() {
            let result = Reply::parse(&body[..cut]).and_then(|mut r| {
                r.sequence()?;
                r.getfh()
            });
            assert!(
                matches!(result, Err(ReplyError::Malformed(_))),
                "cut {cut}: {result:?}"
            );
        }
        // Too many results, a huge tag, a huge handle, a huge bitmap, a wrong operation.
        let mut e = Encoder::new();
        e.u32(0).opaque(b"").u32(1_000_000);
        assert!(Reply::parse(e.as_slice()).is_err());
        let mut e = Encoder::new();
        e.u32(0).u32(u32::MAX);
        assert!(Reply::parse(e.as_slice()).is_err());
        let mut e = Encoder::new();
        reply_header(&mut e, 0, 1);
        e.u32(OP_GETFH).u32(0).u32(4096).fixed(&[0; 4096]);
        let err = Reply::parse(e.as_slice()).unwrap().getfh().unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
        let mut e = Encoder::new();
        reply_header(&mut e, 0, 1);
        e.u32(OP_GETATTR).u32(0).u32(u32::MAX);
        assert!(Reply::parse(e.as_slice()).unwrap().getattr().is_err());
        let mut e = Encoder::new();
        reply_header(&mut e, 0, 1);
        e.u32(OP_GETATTR).u32(0).u32(1).u32(1 << 3).opaque(&[0; 8]);
        let err = Reply::parse(e.as_slice()).unwrap().getattr().unwrap_err();
        assert!(err.to_string().contains("not asked for"), "{err}");
        let mut e = Encoder::new();
        reply_header(&mut e, 0, 1);
        e.u32(OP_WRITE).u32(0);
        let err = Reply::parse(e.as_slice())
            .unwrap()
            .read_into_sink()
            .unwrap_err();
        assert!(err.to_string().contains("was expected"), "{err}");
        // A delegation of an unknown type.
        let mut e = Encoder::new();
        reply_header(&mut e, 0, 1);
        e.u32(OP_OPEN).u32(0).u32(1).fixed(&[0; 12]);
        e.bool(true).u64(1).u64(2).u32(0).u32(0).u32(99);
        let err = Reply::parse(e.as_slice()).unwrap().open().unwrap_err();
        assert!(err.to_string().contains("delegation"), "{err}");
    }

    #[test]
    fn open_results_with_and_without_delegation() {
        let mut e = Encoder::new();
        reply_header(&mut e, 0, 2);
        e.u32(OP_OPEN).u32(0).u32(1).fixed(&[3; 12]);
        e.bool(true).u64(1).u64(2).u32(0).u32(0);
        e.u32(3).u32(0); // NONE_EXT, WND4_NOT_WANTED
        e.u32(OP_OPEN).u32(0).u32(2).fixed(&[4; 12]);
        e.bool(true).u64(1).u64(2).u32(0).u32(1).u32(0);
        e.u32(1).u32(9).fixed(&[5; 12]).bool(false); // read delegation
        e.u32(0).u32(0).u32(0).string("OWNER@");
        let body = e.into_vec();
        let mut r = Reply::parse(&body).unwrap();
        let (id, deleg) = r.open().unwrap();
        assert_eq!((id.seqid, id.other, deleg), (1, [3; 12], None));
        let (id, deleg) = r.open().unwrap();
        assert_eq!(id.other, [4; 12]);
        assert_eq!(deleg.unwrap().other, [5; 12]);
    }
}
