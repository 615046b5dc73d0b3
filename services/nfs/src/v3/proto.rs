//! NFSv3 (RFC 1813), MOUNT v3 and portmapper v2 messages: the procedures ferry uses, their
//! argument encoders and reply decoders, and the status codes with their meanings.

use std::fmt;

use crate::xdr::{Decoder, Encoder, XdrError, XdrResult};

pub const PMAP_PROGRAM: u32 = 100_000;
pub const PMAP_VERSION: u32 = 2;
pub const PMAP_PORT: u16 = 111;
pub const PMAPPROC_GETPORT: u32 = 3;
pub const IPPROTO_TCP: u32 = 6;

pub const MOUNT_PROGRAM: u32 = 100_005;
pub const MOUNT_VERSION: u32 = 3;
pub const MOUNTPROC_MNT: u32 = 1;
pub const MOUNTPROC_UMNT: u32 = 3;
pub const MOUNTPROC_EXPORT: u32 = 5;

pub const NFS_PROGRAM: u32 = 100_003;
pub const NFS_VERSION: u32 = 3;
pub const NFSPROC_GETATTR: u32 = 1;
pub const NFSPROC_SETATTR: u32 = 2;
pub const NFSPROC_LOOKUP: u32 = 3;
pub const NFSPROC_READ: u32 = 6;
pub const NFSPROC_WRITE: u32 = 7;
pub const NFSPROC_CREATE: u32 = 8;
pub const NFSPROC_FSINFO: u32 = 19;
pub const NFSPROC_COMMIT: u32 = 21;

/// Largest NFSv3 file handle (FHSIZE3).
pub const FHSIZE3: usize = 64;
/// Longest path or name ferry accepts in a reply.
pub const MAX_NAME: usize = 4096;
/// Exports listed at most, so a hostile EXPORT reply cannot grow without end.
pub const MAX_EXPORTS: usize = 1024;

/// Size of an encoded fattr3.
pub const FATTR3_LEN: usize = 84;
/// Size of an encoded wcc_attr.
const WCC_ATTR_LEN: usize = 24;

/// A write verifier (changes when the server restarts).
pub type Verifier = [u8; 8];

/// An NFSv3 file handle.
#[derive(Clone, PartialEq, Eq)]
pub struct FileHandle(pub Vec<u8>);

impl fmt::Debug for FileHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FileHandle({} bytes)", self.0.len())
    }
}

impl FileHandle {
    pub fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(Self(d.opaque(FHSIZE3, "file handle")?.to_vec()))
    }
}

/// nfsstat3 and mountstat3 share their values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NfsStat(pub u32);

impl NfsStat {
    pub const OK: Self = Self(0);
    pub const PERM: Self = Self(1);
    pub const NOENT: Self = Self(2);
    pub const ACCES: Self = Self(13);
    pub const EXIST: Self = Self(17);
    pub const NOTDIR: Self = Self(20);
    pub const ISDIR: Self = Self(21);
    pub const INVAL: Self = Self(22);
    pub const FBIG: Self = Self(27);
    pub const NOSPC: Self = Self(28);
    pub const ROFS: Self = Self(30);
    pub const DQUOT: Self = Self(69);
    pub const STALE: Self = Self(70);
    pub const BADHANDLE: Self = Self(10001);
    pub const NOTSUPP: Self = Self(10004);
    pub const JUKEBOX: Self = Self(10008);

    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "OK",
            1 => "PERM (not owner)",
            2 => "NOENT (no such file or directory)",
            5 => "IO (I/O error)",
            6 => "NXIO (no such device)",
            13 => "ACCES (permission denied)",
            17 => "EXIST (file exists)",
            18 => "XDEV",
            19 => "NODEV",
            20 => "NOTDIR (not a directory)",
            21 => "ISDIR (is a directory)",
            22 => "INVAL (invalid argument)",
            27 => "FBIG (file too large)",
            28 => "NOSPC (no space left on device)",
            30 => "ROFS (read-only file system)",
            31 => "MLINK",
            63 => "NAMETOOLONG",
            66 => "NOTEMPTY",
            69 => "DQUOT (quota exceeded)",
            70 => "STALE (stale file handle)",
            71 => "REMOTE",
            10001 => "BADHANDLE",
            10002 => "NOT_SYNC",
            10003 => "BAD_COOKIE",
            10004 => "NOTSUPP (not supported)",
            10005 => "TOOSMALL",
            10006 => "SERVERFAULT",
            10007 => "BADTYPE",
            10008 => "JUKEBOX (server busy, try later)",
            _ => "unknown status",
        }
    }
}

impl fmt::Display for NfsStat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NFS3ERR_{} ({})", self.name(), self.0)
    }
}

/// File types of fattr3.
pub const NF3REG: u32 = 1;
pub const NF3DIR: u32 = 2;

/// The attributes ferry uses from fattr3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ftype: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub used: u64,
}

impl Attr {
    pub fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        let ftype = d.u32()?;
        let mode = d.u32()?;
        let _nlink = d.u32()?;
        let uid = d.u32()?;
        let gid = d.u32()?;
        let size = d.u64()?;
        let used = d.u64()?;
        // rdev, fsid, fileid, atime, mtime, ctime
        d.skip(FATTR3_LEN - 36)?;
        Ok(Self {
            ftype,
            mode,
            uid,
            gid,
            size,
            used,
        })
    }

    pub fn type_name(&self) -> &'static str {
        match self.ftype {
            1 => "a regular file",
            2 => "a directory",
            3 => "a block device",
            4 => "a character device",
            5 => "a symbolic link",
            6 => "a socket",
            7 => "a FIFO",
            _ => "an unknown file type",
        }
    }
}

pub fn post_op_attr(d: &mut Decoder<'_>) -> XdrResult<Option<Attr>> {
    if d.bool()? {
        Attr::decode(d).map(Some)
    } else {
        Ok(None)
    }
}

pub fn skip_wcc_data(d: &mut Decoder<'_>) -> XdrResult<()> {
    if d.bool()? {
        d.skip(WCC_ATTR_LEN)?;
    }
    post_op_attr(d).map(|_| ())
}

// ---- argument encoders ----

pub fn fh_args(fh: &FileHandle) -> Encoder {
    let mut e = Encoder::with_capacity(4 + FHSIZE3);
    e.opaque(&fh.0);
    e
}

pub fn lookup_args(dir: &FileHandle, name: &str) -> Encoder {
    let mut e = fh_args(dir);
    e.string(name);
    e
}

pub fn read_args(fh: &FileHandle, offset: u64, count: u32) -> Encoder {
    let mut e = fh_args(fh);
    e.u64(offset).u32(count);
    e
}

/// Stability of a WRITE.
pub const UNSTABLE: u32 = 0;
pub const FILE_SYNC: u32 = 2;

/// WRITE3args up to the data's length word; the data and its padding follow on the wire.
pub fn write_args_head(fh: &FileHandle, offset: u64, len: u32, stable: u32) -> Encoder {
    let mut e = fh_args(fh);
    e.u64(offset).u32(len).u32(stable).u32(len);
    e
}

pub fn commit_args(fh: &FileHandle, offset: u64, count: u32) -> Encoder {
    let mut e = fh_args(fh);
    e.u64(offset).u32(count);
    e
}

/// sattr3 setting only the size.
fn sattr_size(e: &mut Encoder, size: Option<u64>, mode: Option<u32>) {
    match mode {
        Some(m) => e.bool(true).u32(m),
        None => e.bool(false),
    };
    e.bool(false).bool(false); // uid, gid
    match size {
        Some(s) => e.bool(true).u64(s),
        None => e.bool(false),
    };
    e.u32(0).u32(0); // atime, mtime: DONT_CHANGE
}

pub fn setattr_size_args(fh: &FileHandle, size: u64) -> Encoder {
    let mut e = fh_args(fh);
    sattr_size(&mut e, Some(size), None);
    e.bool(false); // no guard
    e
}

/// CREATE GUARDED with a mode (the size is set with SETATTR after).
pub fn create_args(dir: &FileHandle, name: &str, mode: u32) -> Encoder {
    let mut e = lookup_args(dir, name);
    e.u32(1); // GUARDED
    sattr_size(&mut e, None, Some(mode));
    e
}

pub fn pmap_getport_args(program: u32, version: u32) -> Encoder {
    let mut e = Encoder::new();
    e.u32(program).u32(version).u32(IPPROTO_TCP).u32(0);
    e
}

pub fn mount_args(path: &str) -> Encoder {
    let mut e = Encoder::new();
    e.string(path);
    e
}

// ---- reply decoders (after a successful status) ----

/// LOOKUP3resok: the object's handle and attributes.
pub fn lookup_ok(d: &mut Decoder<'_>) -> XdrResult<(FileHandle, Option<Attr>)> {
    let fh = FileHandle::decode(d)?;
    let attr = post_op_attr(d)?;
    Ok((fh, attr))
}

/// CREATE3resok: the new file's handle (servers may omit it) and attributes.
pub fn create_ok(d: &mut Decoder<'_>) -> XdrResult<(Option<FileHandle>, Option<Attr>)> {
    let fh = if d.bool()? {
        Some(FileHandle::decode(d)?)
    } else {
        None
    };
    let attr = post_op_attr(d)?;
    Ok((fh, attr))
}

/// FSINFO3resok, the fields ferry uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsInfo {
    pub rtmax: u32,
    pub rtpref: u32,
    pub wtmax: u32,
    pub wtpref: u32,
    pub maxfilesize: u64,
}

pub fn fsinfo_ok(d: &mut Decoder<'_>) -> XdrResult<FsInfo> {
    post_op_attr(d)?;
    let rtmax = d.u32()?;
    let rtpref = d.u32()?;
    let _rtmult = d.u32()?;
    let wtmax = d.u32()?;
    let wtpref = d.u32()?;
    let _wtmult = d.u32()?;
    let _dtpref = d.u32()?;
    let maxfilesize = d.u64()?;
    Ok(FsInfo {
        rtmax,
        rtpref,
        wtmax,
        wtpref,
        maxfilesize,
    })
}

/// WRITE3resok: bytes written, how stable, the verifier.
pub fn write_ok(d: &mut Decoder<'_>) -> XdrResult<(u32, u32, Verifier)> {
    skip_wcc_data(d)?;
    let count = d.u32()?;
    let committed = d.u32()?;
    let verf = verifier(d)?;
    Ok((count, committed, verf))
}

pub fn commit_ok(d: &mut Decoder<'_>) -> XdrResult<Verifier> {
    skip_wcc_data(d)?;
    verifier(d)
}

fn verifier(d: &mut Decoder<'_>) -> XdrResult<Verifier> {
    let mut v = [0u8; 8];
    v.copy_from_slice(d.fixed(8)?);
    Ok(v)
}

/// mountres3_ok: the root handle (auth flavors are not needed: ferry speaks AUTH_SYS).
pub fn mount_ok(d: &mut Decoder<'_>) -> XdrResult<FileHandle> {
    FileHandle::decode(d)
}

/// The exports list (paths only), at most [`MAX_EXPORTS`].
pub fn exports(d: &mut Decoder<'_>) -> XdrResult<Vec<String>> {
    let mut out = Vec::new();
    while d.bool()? {
        if out.len() >= MAX_EXPORTS {
            return Err(XdrError(format!("more than {MAX_EXPORTS} exports")));
        }
        out.push(d.string(MAX_NAME, "export path")?);
        let mut groups = 0;
        while d.bool()? {
            groups += 1;
            if groups > MAX_EXPORTS {
                return Err(XdrError(format!("more than {MAX_EXPORTS} export groups")));
            }
            d.string(MAX_NAME, "export group")?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fattr(size: u64) -> Encoder {
        let mut e = Encoder::new();
        e.u32(NF3REG)
            .u32(0o644)
            .u32(1)
            .u32(0)
            .u32(0)
            .u64(size)
            .u64(size);
        e.u32(0).u32(0).u64(1).u64(2);
        for _ in 0..6 {
            e.u32(0);
        }
        e
    }

    #[test]
    fn fattr3_is_84_bytes_and_decodes() {
        let e = fattr(12345);
        assert_eq!(e.len(), FATTR3_LEN);
        let a = Attr::decode(&mut Decoder::new(e.as_slice())).unwrap();
        assert_eq!(a.size, 12345);
        assert_eq!(a.ftype, NF3REG);
    }

    #[test]
    fn write_reply_with_wcc_data() {
        let mut e = Encoder::new();
        e.bool(true).u64(1).u64(0).u64(0); // pre-op attributes
        e.bool(true).fixed(fattr(9).as_slice());
        e.u32(4096).u32(UNSTABLE).fixed(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let bytes = e.into_vec();
        let mut d = Decoder::new(&bytes);
        assert_eq!(
            write_ok(&mut d).unwrap(),
            (4096, UNSTABLE, [1, 2, 3, 4, 5, 6, 7, 8])
        );
        assert_eq!(d.remaining(), 0);
    }

    #[test]
    fn exports_list() {
        let mut e = Encoder::new();
        e.bool(true).string("/a").bool(true).string("*").bool(false);
        e.bool(true).string("/b/c").bool(false);
        e.bool(false);
        let bytes = e.into_vec();
        assert_eq!(exports(&mut Decoder::new(&bytes)).unwrap(), ["/a", "/b/c"]);
    }

    #[test]
    fn oversized_handle_is_refused() {
        let mut e = Encoder::new();
        e.opaque(&[0u8; 65]);
        assert!(FileHandle::decode(&mut Decoder::new(e.as_slice())).is_err());
    }
}
